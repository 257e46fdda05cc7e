//! Where a node's blocks are executed: the [`ExecutionServer`] in the same process
//! ([`LocalExecution`]) or in the organization's execution process (`chainify node --component
//! execution`, reached over gRPC by `chainify-net`).
//!
//! Everything that changes the shared tables goes through the port (executing a block, taking,
//! restoring and pruning checkpoints), one operation at a time, so a restore never overlaps an
//! execution even when the node gave up waiting for one. The node passes the hash each
//! LedgerBlock chains to, so an execution process keeps no chain state of its own and may
//! restart at any time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use chainify_core::tx::TransactionBlock;
use chainify_core::{BlockNumber, Digest};
use chainify_storage::{Backend, Store};
use tokio::sync::Mutex;

use crate::execution::{Executed, ExecutionError, ExecutionServer};
use crate::metrics::{Metrics, Phase};

/// A boxed future of the port (the trait is used as `Arc<dyn ExecutionPort>`).
pub type PortFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ExecutionError>> + Send + 'a>>;

/// An executed block, and whether the checkpoint asked for was taken.
#[derive(Debug, Clone)]
pub struct PortExecuted {
    /// The block as executed.
    pub executed: Executed,
    /// `None`: no checkpoint was asked for; `Some(Err(why))`: it failed (the block stands).
    pub checkpoint: Option<Result<(), String>>,
}

/// Executes blocks and manages checkpoints on the organization's database.
pub trait ExecutionPort: Send + Sync + std::fmt::Debug + 'static {
    /// Executes `block` with its LedgerBlock chained to `previous`; takes a checkpoint of the
    /// resulting state when `checkpoint`. Running a block again returns its stored outcome.
    fn execute(
        &self,
        block: TransactionBlock,
        previous: Digest,
        checkpoint: bool,
    ) -> PortFuture<'_, PortExecuted>;

    /// Restores the database to checkpoint `block`.
    fn restore(&self, block: BlockNumber) -> PortFuture<'_, ()>;

    /// Keeps the newest `keep` checkpoints.
    fn prune_checkpoints(&self, keep: usize) -> PortFuture<'_, ()>;
}

/// The ExecutionServer in this process.
#[derive(Debug)]
pub struct LocalExecution<B: Backend> {
    store: Arc<Store<B>>,
    server: Arc<Mutex<ExecutionServer<B>>>,
    metrics: Arc<Metrics>,
}

impl<B: Backend> LocalExecution<B> {
    /// A port over `server`, which executes on `store`, recording its phases in `metrics`.
    pub fn new(
        store: Arc<Store<B>>,
        server: ExecutionServer<B>,
        metrics: Arc<Metrics>,
    ) -> LocalExecution<B> {
        LocalExecution {
            store,
            server: Arc::new(Mutex::new(server)),
            metrics,
        }
    }
}

impl<B: Backend> ExecutionPort for LocalExecution<B> {
    fn execute(
        &self,
        block: TransactionBlock,
        previous: Digest,
        checkpoint: bool,
    ) -> PortFuture<'_, PortExecuted> {
        Box::pin(async move {
            // Dropping this future cuts the block short as a crash would; the store resumes it.
            let mut server = self.server.lock().await;
            server.set_previous(previous);
            let executed = server.execute(&block).await?;
            let outcome = &executed.outcome;
            let m = &self.metrics;
            m.observe(Phase::Validate, executed.validate_time);
            m.observe(Phase::Analyse, executed.analyse_time);
            // A block run again returns its stored outcome: nothing was executed or digested.
            if !(outcome.execute_time.is_zero() && outcome.digest_time.is_zero()) {
                m.observe(Phase::Execute, outcome.execute_time);
                m.observe(Phase::Digest, outcome.digest_time);
            }
            let checkpoint = if checkpoint {
                let taking = Instant::now();
                let taken = self
                    .store
                    .checkpoint(block.number)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                m.observe(Phase::Checkpoint, taking.elapsed());
                Some(taken)
            } else {
                None
            };
            Ok(PortExecuted {
                executed,
                checkpoint,
            })
        })
    }

    fn restore(&self, block: BlockNumber) -> PortFuture<'_, ()> {
        Box::pin(async move {
            let _busy = self.server.lock().await;
            self.store.restore(block).await?;
            Ok(())
        })
    }

    fn prune_checkpoints(&self, keep: usize) -> PortFuture<'_, ()> {
        Box::pin(async move {
            let _busy = self.server.lock().await;
            self.store.prune_checkpoints(keep).await?;
            Ok(())
        })
    }
}
