//! An organization's early-abort responses, signed in groups: responses asked for while a group
//! waits to be signed join it, and the group gets one signature
//! ([`EarlyAbortResponse::sign_batch`]), which every organization then checks once.
//!
//! Nothing waits on a timer. The first response of a group starts a task that lets the tasks
//! already runnable go first ([`tokio::task::yield_now`]): the admissions that one batched
//! ledger lookup woke together reach their signing then and join the group. A response asked
//! for alone is signed alone, as without groups.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chainify_core::OrgId;
use chainify_core::TxId;
use chainify_core::crypto::SigningKey;
use chainify_core::tx::{EarlyAbortResponse, Verdict};
use chainify_core::verify::Verifier;
use tokio::sync::oneshot;

type Waiting = Vec<(TxId, Verdict, oneshot::Sender<EarlyAbortResponse>)>;

#[derive(Default)]
struct Queue {
    waiting: Waiting,
    /// A task is signing the queue (or about to).
    draining: bool,
}

/// Signs one organization's responses, in groups (module docs).
pub(crate) struct GroupSigner {
    me: OrgId,
    key: Arc<SigningKey>,
    verifier: Arc<Verifier>,
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for GroupSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupSigner")
            .field("org", &self.me)
            .finish_non_exhaustive()
    }
}

/// Clears the queue if a drain unwinds, so that later responses start a new one: the waiting
/// ones see their sender dropped and sign alone.
struct Draining<'a>(&'a GroupSigner);

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut q = self.0.queue();
            q.waiting.clear();
            q.draining = false;
        }
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
            queue: Mutex::new(Queue::default()),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
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
        let start = {
            let mut q = self.queue();
            q.waiting.push((id, verdict.clone(), reply));
            !std::mem::replace(&mut q.draining, true)
        };
        if start {
            let this = self.clone();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                this.drain();
            });
        }
        match signed.await {
            Ok(response) => response,
            // The drain failed (or the runtime is going away): sign it here.
            Err(_) => self.sign_alone(id, verdict),
        }
    }

    /// Signs what waits, group by group, until nothing does.
    fn drain(&self) {
        let _unwinding = Draining(self);
        loop {
            let group = {
                let mut q = self.queue();
                if q.waiting.is_empty() {
                    q.draining = false;
                    return;
                }
                std::mem::take(&mut q.waiting)
            };
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
