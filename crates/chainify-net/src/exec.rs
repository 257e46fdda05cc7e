//! The execution component as its own process: [`ExecutionGrpc`] serves an organization's
//! [`ExecutionPort`] (its ExecutionServer over its database) as `ExecutionService`, and
//! [`RemoteExecution`] is the port the commit component's node drives it through.

use std::sync::Arc;
use std::time::Duration;

use chainify_core::tx::{LedgerBlock, TransactionBlock};
use chainify_core::{BlockNumber, Digest};
use chainify_node::{
    BlockJob, Checkpoint, Executed, ExecutionError, ExecutionPort, PortExecuted, PortFuture,
};
use chainify_proto::pb;
use chainify_proto::pb::execution_service_client::ExecutionServiceClient;
use chainify_storage::{BlockOutcome, TxFailure};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::status;

/// How long the node waits for one execution call: a block of the largest size on a slow
/// database, with room to spare. A call that times out is retried (the block resumes).
pub const EXECUTE_TIMEOUT: Duration = Duration::from_secs(600);

/// `ExecutionService` over an organization's execution port.
#[derive(Debug, Clone)]
pub struct ExecutionGrpc {
    port: Arc<dyn ExecutionPort>,
}

impl ExecutionGrpc {
    /// Serves `port` (a [`chainify_node::LocalExecution`] over the organization's database).
    pub fn new(port: Arc<dyn ExecutionPort>) -> ExecutionGrpc {
        ExecutionGrpc { port }
    }
}

fn reasons(list: &[(usize, String)]) -> Vec<pb::TxReason> {
    list.iter()
        .map(|(index, reason)| pb::TxReason {
            index: u32::try_from(*index).unwrap_or(u32::MAX),
            reason: reason.clone(),
        })
        .collect()
}

/// DATA_LOSS for a damaged record of applied blocks (the node repairs it instead of running
/// the block again); UNAVAILABLE for the rest (the node tries again).
fn failed(e: ExecutionError) -> Status {
    match e.damage() {
        Some(damage) => Status::data_loss(damage),
        None => status::failed(e),
    }
}

#[tonic::async_trait]
impl pb::execution_service_server::ExecutionService for ExecutionGrpc {
    async fn execute(
        &self,
        request: Request<pb::ExecuteRequest>,
    ) -> Result<Response<pb::ExecuteResponse>, Status> {
        let request = request.into_inner();
        let block =
            TransactionBlock::try_from(request.block.ok_or_else(|| status::missing("block"))?)
                .map_err(|e| status::malformed("block", &e))?;
        let previous = Digest::try_from(request.previous.as_slice())
            .map_err(|_| status::wrong_length("previous", 32, request.previous.len()))?;
        let done = self
            .port
            .execute(BlockJob {
                block,
                previous,
                checkpoint: request.checkpoint,
                state_check: request.state_check,
            })
            .await
            .map_err(failed)?;
        let executed = &done.executed;
        let failures: Vec<(usize, String)> = executed
            .outcome
            .failures
            .iter()
            .map(|f| (f.index, f.reason.clone()))
            .collect();
        Ok(Response::new(pb::ExecuteResponse {
            ledger: Some(pb::LedgerBlock::from(&executed.ledger)),
            invalid: reasons(&executed.invalid),
            failures: reasons(&failures),
            integrity: done.integrity.clone(),
            repair_needed: done.repair_needed,
            checkpoint_asked: done.checkpoint != Checkpoint::NotAsked,
            checkpoint_error: match &done.checkpoint {
                Checkpoint::Skipped { reason } => reason.clone(),
                _ => String::new(),
            },
        }))
    }

    async fn restore(
        &self,
        request: Request<pb::RestoreRequest>,
    ) -> Result<Response<pb::RestoreResponse>, Status> {
        let request = request.into_inner();
        let full = if request.full_agreed_state.is_empty() {
            None
        } else {
            Some(
                Digest::try_from(request.full_agreed_state.as_slice()).map_err(|_| {
                    status::wrong_length("full_agreed_state", 32, request.full_agreed_state.len())
                })?,
            )
        };
        self.port
            .restore(BlockNumber(request.checkpoint), full)
            .await
            .map_err(failed)?;
        Ok(Response::new(pb::RestoreResponse {}))
    }

    async fn prune_checkpoints(
        &self,
        request: Request<pb::PruneCheckpointsRequest>,
    ) -> Result<Response<pb::PruneCheckpointsResponse>, Status> {
        let keep = usize::try_from(request.into_inner().keep).unwrap_or(usize::MAX);
        self.port.prune_checkpoints(keep).await.map_err(failed)?;
        Ok(Response::new(pb::PruneCheckpointsResponse {}))
    }
}

/// The organization's execution process, as the node's execution port.
#[derive(Debug, Clone)]
pub struct RemoteExecution {
    client: ExecutionServiceClient<Channel>,
}

impl RemoteExecution {
    /// A port reaching the execution process over `channel` (connected lazily: the process
    /// may start later, and calls fail until it is up, which the node retries), for blocks of
    /// at most `max_block_txs` transactions.
    pub fn new(channel: Channel, max_block_txs: usize) -> RemoteExecution {
        let limit = execute_message_limit(max_block_txs);
        RemoteExecution {
            client: ExecutionServiceClient::new(channel)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
        }
    }
}

fn remote(what: &str, status: &Status) -> ExecutionError {
    if status.code() == tonic::Code::DataLoss {
        return ExecutionError::Damaged(format!("{what}: {}", status.message()));
    }
    ExecutionError::Remote(format!("{what}: {:?}: {}", status.code(), status.message()))
}

fn from_reasons(list: Vec<pb::TxReason>) -> Vec<(usize, String)> {
    list.into_iter()
        .map(|r| (r.index as usize, r.reason))
        .collect()
}

fn decode(response: pb::ExecuteResponse) -> Result<PortExecuted, ExecutionError> {
    let bad = |why: String| ExecutionError::Remote(format!("execute: a malformed answer: {why}"));
    let ledger = LedgerBlock::try_from(
        response
            .ledger
            .ok_or_else(|| bad("no ledger block".into()))?,
    )
    .map_err(|e| bad(e.to_string()))?;
    let failures = from_reasons(response.failures)
        .into_iter()
        .map(|(index, reason)| TxFailure { index, reason })
        .collect();
    // Only the failures travel: the node needs the reasons, not the executor's timings.
    let outcome = BlockOutcome {
        block: ledger.number,
        success: ledger.success.clone(),
        digest: ledger.hash_digest,
        state: ledger.state_digest,
        changed_rows: 0,
        failures,
        retries: 0,
        resumed: 0,
        commits: 0,
        execute_time: Duration::ZERO,
        digest_time: Duration::ZERO,
        barriers: Vec::new(),
    };
    Ok(PortExecuted {
        executed: Executed {
            ledger,
            outcome,
            invalid: from_reasons(response.invalid),
            validate_time: Duration::ZERO,
            analyse_time: Duration::ZERO,
            analysed_ahead: 0,
        },
        checkpoint: match (response.checkpoint_asked, response.checkpoint_error) {
            (false, _) => Checkpoint::NotAsked,
            (true, e) if e.is_empty() => Checkpoint::Taken,
            (true, reason) => Checkpoint::Skipped { reason },
        },
        integrity: response.integrity,
        repair_needed: response.repair_needed,
    })
}

impl ExecutionPort for RemoteExecution {
    fn execute(&self, job: BlockJob) -> PortFuture<'_, PortExecuted> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let block = job.block.number;
            let mut request = Request::new(pb::ExecuteRequest {
                block: Some(pb::TransactionBlock::from(&job.block)),
                previous: job.previous.as_bytes().to_vec(),
                checkpoint: job.checkpoint,
                state_check: job.state_check,
            });
            request.set_timeout(EXECUTE_TIMEOUT);
            let response = client
                .execute(request)
                .await
                .map_err(|s| remote(&format!("executing block {block}"), &s))?;
            decode(response.into_inner())
        })
    }

    fn restore(&self, block: BlockNumber, full: Option<Digest>) -> PortFuture<'_, ()> {
        let mut client = self.client.clone();
        Box::pin(async move {
            client
                .restore(pb::RestoreRequest {
                    checkpoint: block.0,
                    full_agreed_state: full.map_or_else(Vec::new, |d| d.as_bytes().to_vec()),
                })
                .await
                .map_err(|s| remote(&format!("restoring checkpoint {block}"), &s))?;
            Ok(())
        })
    }

    fn prune_checkpoints(&self, keep: usize) -> PortFuture<'_, ()> {
        let mut client = self.client.clone();
        Box::pin(async move {
            client
                .prune_checkpoints(pb::PruneCheckpointsRequest { keep: keep as u64 })
                .await
                .map_err(|s| remote("pruning checkpoints", &s))?;
            Ok(())
        })
    }

    /// The execution process runs one operation at a time: once a call that keeps every
    /// checkpoint (a no-op) returns, everything before it has finished.
    fn settle(&self) -> PortFuture<'_, ()> {
        let mut client = self.client.clone();
        Box::pin(async move {
            client
                .prune_checkpoints(pb::PruneCheckpointsRequest { keep: u64::MAX })
                .await
                .map_err(|s| remote("waiting for the execution process", &s))?;
            Ok(())
        })
    }
}

/// The largest message between a node and its execution process: a whole block, never
/// refused for its size (a refused block would be retried, and fail, for good).
pub(crate) fn execute_message_limit(max_block_txs: usize) -> usize {
    chainify_core::tx::max_block_bytes(max_block_txs).max(256 * 1024 * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::execution_service_server::ExecutionService;

    /// A port that must not be reached: malformed requests are refused before.
    #[derive(Debug)]
    struct Unreachable;

    impl ExecutionPort for Unreachable {
        fn execute(&self, _: BlockJob) -> PortFuture<'_, PortExecuted> {
            Box::pin(async { panic!("executed a malformed request") })
        }
        fn restore(&self, _: BlockNumber, _: Option<Digest>) -> PortFuture<'_, ()> {
            Box::pin(async { panic!("restored on a malformed request") })
        }
        fn prune_checkpoints(&self, _: usize) -> PortFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
        fn settle(&self) -> PortFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
    }

    #[tokio::test]
    async fn malformed_execute_requests_are_refused_by_field() {
        let server = ExecutionGrpc::new(Arc::new(Unreachable));
        let missing = server
            .execute(Request::new(pb::ExecuteRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(missing.code(), tonic::Code::InvalidArgument);
        assert!(missing.message().contains("block: missing"), "{missing}");
        let block = pb::TransactionBlock {
            network_id: "net".into(),
            number: 1,
            ..Default::default()
        };
        let short = server
            .execute(Request::new(pb::ExecuteRequest {
                block: Some(block),
                previous: vec![1, 2, 3],
                checkpoint: false,
                state_check: false,
            }))
            .await
            .unwrap_err();
        assert_eq!(short.code(), tonic::Code::InvalidArgument);
        assert!(
            short
                .message()
                .contains("previous: expected 32 bytes, got 3"),
            "{short}"
        );
    }

    /// A port whose blocks fail with `error`.
    #[derive(Debug)]
    struct Failing(fn() -> ExecutionError);

    impl ExecutionPort for Failing {
        fn execute(&self, _: BlockJob) -> PortFuture<'_, PortExecuted> {
            let e = (self.0)();
            Box::pin(async move { Err(e) })
        }
        fn restore(&self, _: BlockNumber, _: Option<Digest>) -> PortFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
        fn prune_checkpoints(&self, _: usize) -> PortFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
        fn settle(&self) -> PortFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
    }

    #[tokio::test]
    async fn a_damaged_record_of_applied_blocks_stays_damage_over_the_wire() {
        let request = || {
            Request::new(pb::ExecuteRequest {
                block: Some(pb::TransactionBlock {
                    network_id: "net".into(),
                    number: 7,
                    ..Default::default()
                }),
                previous: vec![0; 32],
                checkpoint: false,
                state_check: false,
            })
        };
        let damaged = ExecutionGrpc::new(Arc::new(Failing(|| {
            ExecutionError::Storage(chainify_storage::StorageError::Damaged {
                block: BlockNumber(7),
                problem: "chainify_state holds a bad accumulator of t".into(),
            })
        })))
        .execute(request())
        .await
        .unwrap_err();
        assert_eq!(damaged.code(), tonic::Code::DataLoss);
        let e = remote("executing block 7", &damaged);
        assert!(
            e.damage().is_some_and(
                |d| d.contains("block #7: chainify_state holds a bad accumulator of t")
            ),
            "{e:?}"
        );
        // Anything else is worth another attempt, as before.
        let busy = ExecutionGrpc::new(Arc::new(Failing(|| {
            ExecutionError::Remote("the database is busy".into())
        })))
        .execute(request())
        .await
        .unwrap_err();
        assert_eq!(busy.code(), tonic::Code::Unavailable);
        assert_eq!(remote("executing block 7", &busy).damage(), None);
    }

    #[test]
    fn an_answer_without_its_ledger_block_is_an_error_not_a_vote() {
        let e = decode(pb::ExecuteResponse::default()).unwrap_err();
        assert!(e.to_string().contains("no ledger block"), "{e}");
    }

    #[test]
    fn reasons_and_the_checkpoint_result_survive_the_wire() {
        let ledger = LedgerBlock {
            network: chainify_core::NetworkId::new("net").unwrap(),
            number: BlockNumber(4),
            tx_ids: vec![chainify_core::TxId(Digest::of(b"a")); 2],
            success: vec![false, true],
            valid: vec![false, true],
            hash_digest: Digest::of(b"d"),
            state_digest: Digest::of(b"state"),
            hash_previous: Digest::ZERO,
            orderer_position: 9,
        };
        let done = decode(pb::ExecuteResponse {
            ledger: Some(pb::LedgerBlock::from(&ledger)),
            invalid: reasons(&[(0, "bad signature".into())]),
            failures: reasons(&[(1, "statement 1: expected 1 rows, got 0".into())]),
            checkpoint_asked: true,
            checkpoint_error: "disk full".into(),
            integrity: vec!["digest trigger chainify_dg_t_au on t is missing".into()],
            repair_needed: true,
        })
        .unwrap();
        assert_eq!(
            done.integrity,
            ["digest trigger chainify_dg_t_au on t is missing"],
            "integrity findings reach the node"
        );
        assert!(done.repair_needed);
        assert_eq!(done.executed.ledger, ledger);
        assert_eq!(done.executed.invalid, [(0, "bad signature".to_owned())]);
        assert_eq!(done.executed.outcome.failures[0].index, 1);
        assert_eq!(
            done.checkpoint,
            Checkpoint::Skipped {
                reason: "disk full".to_owned()
            }
        );
    }
}
