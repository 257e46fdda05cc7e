//! chainify-orderer: ordering is untrusted (DESIGN §2.2). Every implementation hands out the same
//! [`TransactionBlock`]s to every consumer because blocks are cut by one deterministic rule
//! ([`BlockCutter`]) from one ordered log; nothing downstream trusts them anyway.
//!
//! - [`Orderer`]: broadcast a transaction, deliver blocks from a number on;
//! - [`LocalOrderer`]: in-process, the embedded default (tests, the demo);
//! - [`FaultyOrderer`]: reorders, drops, duplicates, forges or equivocates, for fault tests;
//! - [`conformance`]: the suite every orderer passes.

mod cutter;
mod faulty;
mod local;

pub mod conformance;

use std::future::Future;
use std::pin::Pin;

use chainify_core::BlockNumber;
use chainify_core::tx::{ChainedTransaction, TransactionBlock};
use futures_util::Stream;

pub use cutter::{BlockCutter, LogEntry};
pub use faulty::{Fault, FaultyOrderer, apply as apply_fault};
pub use local::LocalOrderer;

/// Blocks in order, without gaps, from the requested number on.
pub type BlockStream = Pin<Box<dyn Stream<Item = Result<TransactionBlock, OrdererError>> + Send>>;

/// Why the orderer cannot serve a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrdererError {
    /// The orderer was shut down.
    #[error("the orderer is shut down")]
    Closed,
    /// The orderer cannot be reached or refused the request; retrying later may work.
    #[error("orderer unavailable: {0}")]
    Unavailable(String),
    /// Blocks before this number are no longer kept.
    #[error("block {requested} is no longer available; the oldest kept is {oldest}")]
    Pruned {
        /// The block asked for.
        requested: BlockNumber,
        /// The oldest block the orderer still has.
        oldest: BlockNumber,
    },
}

/// An ordering service.
pub trait Orderer: Send + Sync {
    /// Appends a transaction to the ordered log; returns once the orderer has it.
    fn broadcast(
        &self,
        tx: ChainedTransaction,
    ) -> impl Future<Output = Result<(), OrdererError>> + Send;

    /// The blocks from `from` on, as they are cut; the stream ends only when the orderer does.
    fn deliver(
        &self,
        from: BlockNumber,
    ) -> impl Future<Output = Result<BlockStream, OrdererError>> + Send;
}
