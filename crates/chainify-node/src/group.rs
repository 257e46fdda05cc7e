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

    /// Queues `job`, and starts `drain` when no task is doing the group yet.
    fn join<F>(&self, job: J, drain: impl FnOnce() -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let start = {
            let mut q = self.queue();
            q.0.push(job);
            !std::mem::replace(&mut q.1, true)
        };
        if start {
            let drain = drain();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                drain.await;
            });
        }
    }

    /// The jobs that wait, or `None` (and the group open for a new task) when none does.
    fn next(&self) -> Option<Vec<J>> {
        let mut q = self.queue();
        if q.0.is_empty() {
            q.1 = false;
            return None;
        }
        Some(std::mem::take(&mut q.0))
    }
}

/// Clears the queue if a drain unwinds or is dropped before it is done (a runtime shutting
/// down), so that later jobs start a new one: the waiting ones see their reply dropped and
/// do their work alone.
struct Draining<'a, J: Send + 'static>(&'a Group<J>, bool);

impl<'a, J: Send + 'static> Draining<'a, J> {
    fn new(group: &'a Group<J>) -> Self {
        Draining(group, false)
    }

    fn next(&mut self) -> Option<Vec<J>> {
        let next = self.0.next();
        self.1 = next.is_none();
        next
    }
}

impl<J: Send + 'static> Drop for Draining<'_, J> {
    fn drop(&mut self) {
        if !self.1 {
            let mut q = self.0.queue();
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
    group: Group<Answer>,
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
    /// signatures).
    pub(crate) fn new(me: OrgId, key: Arc<SigningKey>, verifier: Arc<Verifier>) -> GroupSigner {
        GroupSigner {
            me,
            key,
            verifier,
            group: Group::default(),
        }
    }

    /// This organization's verdict on `id`, signed alone (no group).
    pub(crate) fn sign_alone(&self, id: TxId, verdict: Verdict) -> EarlyAbortResponse {
        EarlyAbortResponse::new_with(id, self.me, verdict, |bytes| {
            self.verifier.sign(&self.key, bytes)
        })
    }

    /// `answers` signed as one batch.
    pub(crate) fn sign_batch(&self, answers: Vec<(TxId, Verdict)>) -> Vec<EarlyAbortResponse> {
        EarlyAbortResponse::sign_batch(self.me, answers, |bytes| {
            self.verifier.sign(&self.key, bytes)
        })
    }

    /// This organization's verdict on `id`, signed with the group it joins.
    pub(crate) async fn sign(self: &Arc<Self>, id: TxId, verdict: Verdict) -> EarlyAbortResponse {
        let (reply, signed) = oneshot::channel();
        self.group.join((id, verdict.clone(), reply), || {
            let this = self.clone();
            async move { this.drain() }
        });
        match signed.await {
            Ok(response) => response,
            // The drain failed (or the runtime is going away): sign it here.
            Err(_) => self.sign_alone(id, verdict),
        }
    }

    /// Signs what waits, group by group, until nothing does.
    fn drain(&self) {
        let mut draining = Draining::new(&self.group);
        while let Some(group) = draining.next() {
            let (answers, replies): (Vec<_>, Vec<_>) = group
                .into_iter()
                .map(|(id, verdict, reply)| ((id, verdict), reply))
                .unzip();
            for (response, reply) in self.sign_batch(answers).into_iter().zip(replies) {
                // A caller that went away needs no answer.
                let _ = reply.send(response);
            }
        }
    }
}

/// Checks clients' signatures in groups, ahead of the single checks (module docs).
pub(crate) struct GroupChecker {
    verifier: Arc<Verifier>,
    group: Group<(SignedBytes, oneshot::Sender<()>)>,
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
            group: Group::default(),
        }
    }

    /// Checks `item` with the group it joins and returns once that group is checked: if it
    /// verifies, `verifier` remembers it, and the caller's own check finds it there. Whatever
    /// the outcome, the caller's own check decides.
    pub(crate) async fn warm(self: &Arc<Self>, item: SignedBytes) {
        if self.verifier.remembers_all(std::slice::from_ref(&item)) {
            return;
        }
        let (reply, checked) = oneshot::channel();
        self.group.join((item, reply), || {
            let this = self.clone();
            async move { this.drain().await }
        });
        let _ = checked.await;
    }

    async fn drain(&self) {
        let mut draining = Draining::new(&self.group);
        while let Some(group) = draining.next() {
            let (items, replies): (Vec<_>, Vec<_>) = group.into_iter().unzip();
            if items.len() > 1 {
                let verifier = self.verifier.clone();
                // Checked off the async workers: a group of a thousand takes milliseconds. A
                // failure here leaves the checks to the callers.
                let _ = tokio::task::spawn_blocking(move || verifier.check_all(&items)).await;
            }
            for reply in replies {
                let _ = reply.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::Digest;
    use chainify_core::crypto::Signatures;

    fn signer() -> (Arc<GroupSigner>, Arc<SigningKey>) {
        let key = Arc::new(SigningKey::from_seed(&[7; 32]));
        let verifier = Arc::new(Verifier::new(Signatures::Ed25519Zip215));
        (
            Arc::new(GroupSigner::new(OrgId(2), key.clone(), verifier)),
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
    async fn signatures_checked_together_are_remembered_and_a_forgery_among_them_is_not() {
        let verifier = Arc::new(Verifier::new(Signatures::Ed25519Zip215));
        let checker = Arc::new(GroupChecker::new(verifier.clone()));
        let mut items: Vec<SignedBytes> = (0..40).map(client_signed).collect();
        items[17].message.push(b'!');
        let warmed = items.iter().cloned().map(|item| {
            let checker = checker.clone();
            tokio::spawn(async move { checker.warm(item).await })
        });
        for task in warmed.collect::<Vec<_>>() {
            task.await.unwrap();
        }
        for (i, item) in items.iter().enumerate() {
            assert_eq!(
                verifier.remembers_all(std::slice::from_ref(item)),
                i != 17,
                "item {i}"
            );
        }
        // The forgery is still refused by the caller's own check.
        assert!(verifier.check(&items[17]).is_err());
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
