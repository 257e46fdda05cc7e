//! `AdminService`: an operator's view and controls of one organization.

use std::pin::Pin;
use std::sync::Arc;

use chainify_commit::State;
use chainify_core::BlockNumber;
use chainify_core::config::NetworkConfig;
use chainify_core::votes::{VoteContext, verify_ledger};
use chainify_node::{NodeStatus, ReadGate, ledger};
use chainify_proto::pb;
use chainify_proto::pb::admin_service_server::AdminService;
use chainify_storage::{Backend, Store};
use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::status;

/// An organization's AdminService.
#[derive(Debug)]
pub struct AdminServer<B: Backend> {
    network: Arc<NetworkConfig>,
    store: Arc<Store<B>>,
    status: watch::Receiver<NodeStatus>,
    gate: ReadGate,
}

impl<B: Backend> AdminServer<B> {
    /// Serves the node with this store, status and read gate.
    pub fn new(
        network: Arc<NetworkConfig>,
        store: Arc<Store<B>>,
        status: watch::Receiver<NodeStatus>,
        gate: ReadGate,
    ) -> AdminServer<B> {
        AdminServer {
            network,
            store,
            status,
            gate,
        }
    }
}

/// The ledger heights `WatchLedger` streams.
pub(crate) type Heights = Pin<Box<dyn Stream<Item = Result<pb::LedgerHeight, Status>> + Send>>;

/// The node's ledger height now, then each new one; ends with the node. The node publishes its
/// status after the appends a step carried out, so every height sent is in the ledger.
fn heights(status: watch::Receiver<NodeStatus>) -> Heights {
    Box::pin(futures_util::stream::unfold(
        (status, None),
        |(mut status, last)| async move {
            loop {
                let next = status.borrow_and_update().next_block.0;
                if last != Some(next) {
                    let height = pb::LedgerHeight { next_block: next };
                    return Some((Ok(height), (status, Some(next))));
                }
                status.changed().await.ok()?;
            }
        },
    ))
}

/// The recovery state of a node in words.
pub fn recovery_state(status: &NodeStatus) -> String {
    match &status.state {
        State::Running => match status.recoveries.last() {
            Some(r) => format!(
                "none (last: block {} from checkpoint {} in {:.2} s)",
                r.block,
                r.checkpoint.map_or("-".into(), |c| c.to_string()),
                r.elapsed.as_secs_f64()
            ),
            None => "none".into(),
        },
        other => match status.alarms.last() {
            Some(alarm) => format!("{other:?}; alarm: {alarm}"),
            None => format!("{other:?}"),
        },
    }
}

#[tonic::async_trait]
impl<B: Backend + 'static> AdminService for AdminServer<B> {
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let s = self.status.borrow().clone();
        let agreed = s.next_block.0.saturating_sub(1);
        let executed = s.executed.map_or(0, |b| b.0);
        let recovery = recovery_state(&s);
        Ok(Response::new(pb::StatusResponse {
            org_id: s.org.0,
            network_id: self.network.network_id.to_string(),
            agreed_height: agreed,
            components: vec![
                pb::ComponentStatus {
                    component: "execution".into(),
                    height: executed,
                    lag: agreed.saturating_sub(executed),
                    recovery: match (s.execution_errors, &s.last_error) {
                        (0, _) | (_, None) => recovery.clone(),
                        (n, Some(last)) => {
                            format!("{recovery}; {n} failed executions (retried), last: {last}")
                        }
                    },
                },
                pb::ComponentStatus {
                    component: "commit".into(),
                    height: agreed,
                    // Blocks executed here and waiting for their vote.
                    lag: executed.saturating_sub(agreed),
                    recovery,
                },
                pb::ComponentStatus {
                    component: "chainify".into(),
                    height: agreed,
                    lag: 0,
                    recovery: format!(
                        "invalid transactions {}, rejected votes {}, dropped messages {}",
                        s.invalid_transactions, s.rejected_votes, s.dropped_messages
                    ),
                },
            ],
            pending_votes: s
                .pending_votes
                .iter()
                .map(|(org, hash)| (org.0, hash.as_bytes().to_vec()))
                .collect(),
        }))
    }

    async fn checkpoint_now(
        &self,
        _request: Request<pb::CheckpointNowRequest>,
    ) -> Result<Response<pb::CheckpointNowResponse>, Status> {
        // Between blocks the database is at the agreed height: that is what is saved.
        let guard = self.gate.read().await;
        let Some(height) = guard.height else {
            return Err(status::precondition(
                "no block is agreed yet: nothing to checkpoint",
            ));
        };
        self.store
            .checkpoint(height)
            .await
            .map_err(|e| status::unavailable(format_args!("checkpoint at block {height}"), e))?;
        Ok(Response::new(pb::CheckpointNowResponse {
            block_number: height.0,
        }))
    }

    async fn verify(
        &self,
        _request: Request<pb::VerifyRequest>,
    ) -> Result<Response<pb::VerifyResponse>, Status> {
        let tail = self
            .store
            .ledger_tail()
            .await
            .map_err(|e| status::unavailable("reading the ledger", e))?;
        let last = tail.map_or(0, |(b, _)| b.0);
        let mut entries = Vec::with_capacity(usize::try_from(last).unwrap_or(0));
        for b in 1..=last {
            match ledger::entry(&self.store, BlockNumber(b)).await {
                Ok(e) => entries.push(e),
                Err(e) => {
                    return Ok(Response::new(pb::VerifyResponse {
                        ok: false,
                        blocks_checked: b - 1,
                        first_bad_block: b,
                        problem: e.to_string(),
                    }));
                }
            }
        }
        let ctx = VoteContext::of(&self.network);
        let response = match verify_ledger(entries.iter().map(|e| (&e.block, &e.certificate)), &ctx)
        {
            Ok(n) => pb::VerifyResponse {
                ok: true,
                blocks_checked: n,
                first_bad_block: 0,
                problem: String::new(),
            },
            Err(fault) => pb::VerifyResponse {
                ok: false,
                blocks_checked: fault.block.0.saturating_sub(1),
                first_bad_block: fault.block.0,
                problem: fault.problem,
            },
        };
        Ok(Response::new(response))
    }

    type WatchLedgerStream = Heights;

    async fn watch_ledger(
        &self,
        _request: Request<pb::WatchLedgerRequest>,
    ) -> Result<Response<Heights>, Status> {
        Ok(Response::new(heights(self.status.clone())))
    }
}
