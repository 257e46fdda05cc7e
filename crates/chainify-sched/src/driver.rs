//! Runtime-agnostic async drivers: run a block's transactions through an executor.

use std::future::Future;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::{DependencyGraph, Scheduler};

/// Runs single transactions of a block (on a database connection, in memory, …).
pub trait TxExecutor: Sync {
    /// Why the block cannot go on.
    type Error: Send;

    /// Runs transaction `index` of the block; Err means the whole block cannot go on (e.g. the
    /// database went away), not that the transaction aborted. An aborted transaction is a normal
    /// outcome that the executor records itself (success bitmap) and reports as `Ok`.
    ///
    /// Called for every index of the block, including transactions that analysis rejected (they
    /// have no edges, so they may run at any time): the executor must not touch the database for
    /// those, only record them as not executed.
    fn execute(&self, index: usize) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// Runs every transaction of the block, each as soon as all its predecessors in `graph` have
/// finished, with at most `parallelism` in flight (0 is taken as 1).
///
/// On the first `Err` it starts nothing new, waits for the transactions already in flight (so no
/// execution outlives the call), and returns that first error. Transactions are started lowest
/// ready index first.
///
/// Everything runs inside the returned future (no tasks are spawned; an executor may spawn its
/// own). Dropping that future drops, and so cancels, the transactions in flight.
pub async fn run_block<E: TxExecutor>(
    graph: &DependencyGraph,
    executor: &E,
    parallelism: usize,
) -> Result<(), E::Error> {
    let parallelism = parallelism.max(1);
    let mut scheduler = Scheduler::new(graph);
    let mut running = FuturesUnordered::new();
    let mut failure = None;
    loop {
        if failure.is_none() {
            while running.len() < parallelism {
                let Some(index) = scheduler.pop_ready() else {
                    break;
                };
                running.push(async move { (index, executor.execute(index).await) });
            }
        }
        let Some((index, outcome)) = running.next().await else {
            break;
        };
        match outcome {
            Ok(()) => {
                let completed = scheduler.complete(index);
                debug_assert!(completed.is_ok(), "{completed:?}");
            }
            Err(error) => {
                if failure.is_none() {
                    failure = Some(error);
                }
            }
        }
    }
    match failure {
        Some(error) => Err(error),
        None => {
            debug_assert!(scheduler.is_finished(), "a DAG always drains");
            Ok(())
        }
    }
}

/// The serial reference: runs transactions `0..len` one at a time in block order, stopping at the
/// first `Err`. What SQLite's single writer does, and the oracle that [`run_block`] must match.
pub async fn run_serial<E: TxExecutor>(len: usize, executor: &E) -> Result<(), E::Error> {
    for index in 0..len {
        executor.execute(index).await?;
    }
    Ok(())
}
