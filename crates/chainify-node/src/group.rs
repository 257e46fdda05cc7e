//! An organization's signature work in groups, formed without a timer: work asked for while a
//! group waits joins it. The first job of a group starts a task that lets the tasks already
//! runnable go first ([`tokio::task::yield_now`]): the submissions that one block's outcomes
//! woke together, or the admissions that one batched ledger lookup resumed, reach their
//! signature work then and join the group. A job asked for alone is done alone.
//!
//! - [`GroupSigner`]: the organization's early-abort responses get one signature a group
//!   ([`EarlyAbortResponse::sign_batch`]), which every organization then checks once.
//! - [`GroupChecker`]: the clients' signatures of submitted proposals are checked as batches
//!   ([`Verifier::check_all`]), on the blocking pool, and remembered for the single checks that
//!   follow; a bad one fails only its own proposal.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chainify_core::OrgId;
use chainify_core::TxId;
use chainify_core::crypto::SigningKey;
use chainify_core::tx::{EarlyAbortResponse, Verdict};
use chainify_core::verify::{SignedBytes, Verifier};
use tokio::sync::oneshot;

/// Most jobs waiting for one group: past it a job is done alone (what a waiting job holds stays
/// bounded, and no group takes longer than a thousand jobs' work).
pub(crate) const MAX_GROUP: usize = 1024;

/// Jobs waiting for the task that does them, as a group.
struct Group<J> {
    /// The waiting jobs, and whether a task is doing the group (or about to).
    queue: Mutex<(Vec<J>, bool)>,
}

impl<J> Default for Group<J> {
    fn default() -> Self {
        Group {
            queue: Mutex::new((Vec::new(), false)),
        }
    }
}

impl<J: Send + 'static> Group<J> {
    fn queue(&self) -> MutexGuard<'_, (Vec<J>, bool)> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job`, and starts `drain` on a task of its own when no task is doing the group
    /// yet. Gives the job back when the group is full or there is no runtime to start a task
    /// on: the caller does it alone.
    fn join<F>(self: &Arc<Self>, job: J, drain: impl FnOnce(Draining<J>) -> F) -> Result<(), J>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(job);
        };
        let start = {
            let mut q = self.queue();
            if q.0.len() >= MAX_GROUP {
                return Err(job);
            }
            q.0.push(job);
            !std::mem::replace(&mut q.1, true)
        };
        if start {
            // Made here and moved into the task: a task dropped before it first runs (its
            // runtime going away) still reopens the group.
            let drain = drain(Draining {
                group: self.clone(),
                done: false,
            });
            runtime.spawn(async move {
                tokio::task::yield_now().await;
                drain.await;
            });
        }
        Ok(())
    }
}

/// The task doing a group's jobs. Dropped before it is done (a panic, its runtime going away,
/// dropped before it first ran), it clears the queue and reopens the group: the waiting jobs
/// see their reply dropped and are done by their callers alone.
struct Draining<J: Send + 'static> {
    group: Arc<Group<J>>,
    /// The queue was found empty and the group reopened.
    done: bool,
}

impl<J: Send + 'static> Draining<J> {
    /// The jobs that wait, or `None` (and the group open for a new task) when none does.
    fn next(&mut self) -> Option<Vec<J>> {
        let mut q = self.group.queue();
        if q.0.is_empty() {
            q.1 = false;
            self.done = true;
            return None;
        }
        Some(std::mem::take(&mut q.0))
    }
}

impl<J: Send + 'static> Drop for Draining<J> {
    fn drop(&mut self) {
        if !self.done {
            let mut q = self.group.queue();
            q.0.clear();
            q.1 = false;
        }
    }
}

type Answer = (TxId, Verdict, oneshot::Sender<EarlyAbortResponse>);

/// Signs one organization's responses, in groups (module docs).
pub(crate) struct GroupSigner {
    me: OrgId,
    key: Arc<SigningKey>,
    verifier: Arc<Verifier>,
    /// Whether the blocks to come count responses signed as a batch; if not, each is signed
    /// alone ([`Admission::set_height`](crate::admission::Admission::set_height)).
    batches: std::sync::atomic::AtomicBool,
    group: Arc<Group<Answer>>,
}

impl std::fmt::Debug for GroupSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupSigner")
            .field("org", &self.me)
            .finish_non_exhaustive()
    }
}

impl GroupSigner {
    /// Signs as `me` with `key`, through `verifier` (which then never checks its own
    /// signatures); in groups when the network counts batches (`batches`).
    pub(crate) fn new(
        me: OrgId,
        key: Arc<SigningKey>,
        verifier: Arc<Verifier>,
        batches: bool,
    ) -> GroupSigner {
        GroupSigner {
            me,
            key,
            verifier,
            batches: std::sync::atomic::AtomicBool::new(batches),
            group: Arc::default(),
        }
    }

    /// This organization's verdict on `id`, signed alone (no group).
    pub(crate) fn sign_alone(&self, id: TxId, verdict: Verdict) -> EarlyAbortResponse {
        EarlyAbortResponse::new_with(id, self.me, verdict, |bytes| {
            self.verifier.sign(&self.key, bytes)
        })
    }

    /// Whether responses are signed in batches from now on.
    pub(crate) fn set_batches(&self, on: bool) {
        self.batches.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn batches(&self) -> bool {
        self.batches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `answers` signed as one batch, or each alone while batches do not count.
    pub(crate) fn sign_batch(&self, answers: Vec<(TxId, Verdict)>) -> Vec<EarlyAbortResponse> {
        if !self.batches() {
            return answers
                .into_iter()
                .map(|(id, verdict)| self.sign_alone(id, verdict))
                .collect();
        }
        EarlyAbortResponse::sign_batch(self.me, answers, |bytes| {
            self.verifier.sign(&self.key, bytes)
        })
    }

    /// This organization's verdict on `id`, signed with the group it joins.
    pub(crate) async fn sign(self: &Arc<Self>, id: TxId, verdict: Verdict) -> EarlyAbortResponse {
        if !self.batches() {
            return self.sign_alone(id, verdict);
        }
        let (reply, signed) = oneshot::channel();
        let joined = self.group.join((id, verdict.clone(), reply), |draining| {
            let this = self.clone();
            async move { this.drain(draining).await }
        });
        if joined.is_err() {
            return self.sign_alone(id, verdict);
        }
        match signed.await {
            Ok(response) => response,
            // The drain failed (or the runtime is going away): sign it here.
            Err(_) => self.sign_alone(id, verdict),
        }
    }

    /// Signs what waits, group by group, until nothing does.
    async fn drain(&self, mut draining: Draining<Answer>) {
        while let Some(group) = draining.next() {
            // A caller that went away needs no signature.
            let (answers, replies): (Vec<_>, Vec<_>) = group
                .into_iter()
                .filter(|(_, _, reply)| !reply.is_closed())
                .map(|(id, verdict, reply)| ((id, verdict), reply))
                .unzip();
            for (response, reply) in self.sign_batch(answers).into_iter().zip(replies) {
                // A caller that went away needs no answer.
                let _ = reply.send(response);
            }
            // The callers just answered run before the next group is signed.
            tokio::task::yield_now().await;
        }
    }
}

/// Checks clients' signatures in groups, ahead of the single checks (module docs).
pub(crate) struct GroupChecker {
    verifier: Arc<Verifier>,
    group: Arc<Group<Warming>>,
}

impl std::fmt::Debug for GroupChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupChecker").finish_non_exhaustive()
    }
}

impl GroupChecker {
    /// Checks through `verifier`, which remembers what verified.
    pub(crate) fn new(verifier: Arc<Verifier>) -> GroupChecker {
        GroupChecker {
            verifier,
            group: Arc::default(),
        }
    }

    /// Checks `item` with the group it joins and returns once that group is checked: if it
    /// verifies, `verifier` remembers it, and the caller's own check finds it there. Whatever
    /// the outcome, the caller's own check decides. Messages over [`MAX_GROUPED_BYTES`], and
    /// items past a full group, are left to that check alone. Gives `item` back for that check
    /// (the caller encodes the message once), or `None` if the group's task failed.
    pub(crate) async fn warm(self: &Arc<Self>, item: SignedBytes) -> Option<SignedBytes> {
        if item.message.len() > MAX_GROUPED_BYTES
            || self.verifier.remembers_all(std::slice::from_ref(&item))
        {
            return Some(item);
        }
        let (reply, checked) = oneshot::channel();
        let joined = self.group.join((item, reply), |draining| {
            let this = self.clone();
            async move { this.drain(draining).await }
        });
        match joined {
            Ok(()) => checked.await.ok(),
            Err((item, _)) => Some(item),
        }
    }

    async fn drain(&self, mut draining: Draining<Warming>) {
        while let Some(group) = draining.next() {
            // A caller that went away needs no check.
            let (items, replies): (Vec<_>, Vec<_>) = group
                .into_iter()
                .filter(|(_, reply)| !reply.is_closed())
                .unzip();
            // Off the async workers (a group of a thousand takes milliseconds), in batches of
            // `WARM_BATCH` remembered when they verify and otherwise left to the callers: a
            // forgery costs its batch once, never a search for it. A group of one is left to
            // its caller without the hop to the blocking pool.
            let checked = if items.len() > 1 {
                let verifier = self.verifier.clone();
                tokio::task::spawn_blocking(move || {
                    for batch in items.chunks(WARM_BATCH) {
                        verifier.warm(batch);
                    }
                    items
                })
                .await
                .ok()
            } else {
                Some(items)
            };
            // A failed check drops the replies: the callers encode their messages again.
            for (item, reply) in checked.into_iter().flatten().zip(replies) {
                let _ = reply.send(item);
            }
        }
    }
}

/// A signature waiting for its group's check, and where to give it back.
type Warming = (SignedBytes, oneshot::Sender<SignedBytes>);

/// Largest proposal encoding checked in a group: larger ones are checked alone (the time is in
/// hashing the message then, which batching does not save).
pub(crate) const MAX_GROUPED_BYTES: usize = 16 * 1024;

/// Signatures per batch of a group's check: a forgery spoils its own batch only.
const WARM_BATCH: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::Digest;
    use chainify_core::crypto::Signatures;
    use futures_util::FutureExt;

    fn signer() -> (Arc<GroupSigner>, Arc<SigningKey>) {
        let key = Arc::new(SigningKey::from_seed(&[7; 32]));
        let verifier = Arc::new(Verifier::new(Signatures::Ed25519Zip215));
        (
            Arc::new(GroupSigner::new(OrgId(2), key.clone(), verifier, true)),
            key,
        )
    }

    fn id(n: u32) -> TxId {
        TxId(Digest::of(&n.to_le_bytes()))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn responses_asked_for_together_share_one_signature_and_each_verifies() {
        let (signer, key) = signer();
        let asked = (0..10).map(|n| {
            let signer = signer.clone();
            let verdict = if n == 4 {
                Verdict::Reject("no".into())
            } else {
                Verdict::Accept
            };
            tokio::spawn(async move { (n, verdict.clone(), signer.sign(id(n), verdict).await) })
        });
        let mut signatures = std::collections::HashSet::new();
        for task in asked.collect::<Vec<_>>() {
            let (n, verdict, response) = task.await.unwrap();
            assert_eq!(
                (response.tx_id, response.org, &response.verdict),
                (id(n), OrgId(2), &verdict)
            );
            response.verify(&key.public_key()).unwrap();
            signatures.insert(response.signature.0);
        }
        // All ten were runnable together: one group, one signature.
        assert_eq!(signatures.len(), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_response_asked_for_alone_is_signed_alone() {
        let (signer, key) = signer();
        for n in 0..3 {
            let response = signer.sign(id(n), Verdict::Accept).await;
            assert_eq!(response.batch, None);
            assert_eq!(response, signer.sign_alone(id(n), Verdict::Accept));
            response.verify(&key.public_key()).unwrap();
        }
    }

    fn client_signed(n: u32) -> SignedBytes {
        let key = SigningKey::from_seed(&[n as u8; 32]);
        let message = format!("proposal {n}").into_bytes();
        SignedBytes {
            key: key.public_key(),
            signature: key.sign(&message),
            message,
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn signatures_checked_together_are_remembered_and_a_forgery_spoils_only_its_batch() {
        let verifier = Arc::new(Verifier::new(Signatures::Ed25519Zip215));
        let checker = Arc::new(GroupChecker::new(verifier.clone()));
        let mut items: Vec<SignedBytes> = (0..2 * WARM_BATCH as u32).map(client_signed).collect();
        items[17].message.push(b'!');
        let warmed = items.iter().cloned().map(|item| {
            let checker = checker.clone();
            tokio::spawn(async move { checker.warm(item).await })
        });
        for task in warmed.collect::<Vec<_>>() {
            task.await.unwrap();
        }
        // The forgery's batch is left to the single checks; the other batch is remembered.
        for (i, item) in items.iter().enumerate() {
            assert_eq!(
                verifier.remembers_all(std::slice::from_ref(item)),
                i >= WARM_BATCH,
                "item {i}"
            );
        }
        assert!(verifier.check(&items[17]).is_err());
        verifier.check(&items[16]).unwrap();
    }

    #[test]
    fn a_drain_dropped_before_it_ran_reopens_the_group() {
        let (signer, key) = signer();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        // The caller gives up at once, before the drain task it started first runs; then the
        // runtime goes away with the task.
        let gave_up =
            runtime.block_on(async { signer.sign(id(1), Verdict::Accept).now_or_never() });
        assert!(gave_up.is_none());
        drop(runtime);
        assert_eq!(signer.group.queue().0.len(), 0);
        assert!(!signer.group.queue().1, "the group stayed closed");
        let later = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async {
                tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    signer.sign(id(2), Verdict::Accept),
                )
                .await
            })
            .expect("a later response was signed");
        later.verify(&key.public_key()).unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn callers_that_give_up_leave_a_bounded_queue_and_are_not_checked() {
        let verifier = Arc::new(Verifier::new(Signatures::Ed25519Zip215));
        let checker = Arc::new(GroupChecker::new(verifier.clone()));
        let items: Vec<SignedBytes> = (0..(MAX_GROUP + 500) as u32).map(client_signed).collect();
        // Every caller polled once, then dropped, before the drain runs; past a full group
        // the callers are left to check alone at once.
        for (i, item) in items.iter().enumerate() {
            let gave_up = checker.warm(item.clone()).now_or_never().is_none();
            assert_eq!(gave_up, i < MAX_GROUP, "caller {i}");
        }
        assert_eq!(checker.group.queue().0.len(), MAX_GROUP);
        // The drain checks none of them: nobody waits for the answer.
        while checker.group.queue().1 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(checker.group.queue().0.is_empty());
        assert!(
            items
                .iter()
                .all(|i| !verifier.remembers_all(std::slice::from_ref(i)))
        );
        // A large message is left to the caller's own check.
        let key = SigningKey::from_seed(&[3; 32]);
        let message = vec![7u8; MAX_GROUPED_BYTES + 1];
        let large = SignedBytes {
            key: key.public_key(),
            signature: key.sign(&message),
            message,
        };
        checker.warm(large.clone()).await;
        assert!(!verifier.remembers_all(&[large]));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_signature_checked_alone_is_left_to_the_caller() {
        let verifier = Arc::new(Verifier::new(Signatures::Ed25519Zip215));
        let checker = Arc::new(GroupChecker::new(verifier.clone()));
        let item = client_signed(1);
        checker.warm(item.clone()).await;
        // Nothing gained by a group of one: the caller checks it, as without groups.
        assert!(!verifier.remembers_all(std::slice::from_ref(&item)));
        verifier.check(&item).unwrap();
        // Remembered now: warming it again returns at once.
        checker.warm(item.clone()).await;
        assert!(verifier.remembers_all(&[item]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_that_go_away_do_not_stop_the_others() {
        let (signer, key) = signer();
        // Half the callers are dropped before their group is signed.
        let mut kept = Vec::new();
        for n in 0..200 {
            let signer = signer.clone();
            let task = tokio::spawn(async move { signer.sign(id(n), Verdict::Accept).await });
            if n % 2 == 0 {
                task.abort();
            } else {
                kept.push((n, task));
            }
        }
        for (n, task) in kept {
            let response = task.await.unwrap();
            assert_eq!(response.tx_id, id(n));
            response.verify(&key.public_key()).unwrap();
        }
        // And the queue is open for later groups.
        let late = signer.sign(id(1000), Verdict::Accept).await;
        late.verify(&key.public_key()).unwrap();
    }
}
