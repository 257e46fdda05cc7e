//! chainify-orderer: ordering is untrusted (docs/design/overview.md §2.2). Every implementation
//! hands out the same [`TransactionBlock`]s to every consumer because blocks are cut by one
//! deterministic rule ([`BlockCutter`]) from one ordered log; nothing downstream trusts them
//! anyway.
//!
//! - [`Orderer`]: broadcast a transaction, deliver blocks from a number on;
//! - [`LocalOrderer`]: in-process, the embedded default (tests, the demo);
//! - [`KafkaOrderer`]: a single-partition Kafka topic per network (production).
//!
//! The suite every orderer passes and a misbehaving orderer for fault tests are in
//! `chainify-testkit`.
//!
//! Where it sits: above `chainify-core` and `chainify-proto` (the encoding of Kafka log entries).
//! [`BlockCutter`] is pure; the orderers do I/O (tokio, rdkafka). Used by `chainify-node` (the
//! block stream), `chainify-net` (the solo orderer serves a [`LocalOrderer`] over gRPC), the
//! binary and the benchmarks.

mod cutter;
mod kafka;
mod local;

use std::future::Future;
use std::pin::Pin;

use chainify_core::BlockNumber;
use chainify_core::tx::{ChainedTransaction, TransactionBlock};
use futures_util::Stream;

pub use cutter::{BlockCutter, LogEntry};
pub use kafka::{KafkaOrderer, KafkaSettings, decode_entry, encode_entry, ordered_len};
pub use local::LocalOrderer;

/// When a block that has not filled up is cut: the network file's `block.cut`, one type from
/// the configuration to the orderers. Cutting on demand, any number of consumers may race: a
/// marker for a block already cut is ignored by every cutter alike.
pub use chainify_core::config::CutRule as Cut;

/// Blocks in order, without gaps, from the requested number on.
pub type BlockStream = Pin<Box<dyn Stream<Item = Result<TransactionBlock, OrdererError>> + Send>>;

/// Why the orderer cannot serve a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrdererError {
    /// The orderer cannot be reached or refused the request; retrying later may work.
    #[error("orderer unavailable: {0}")]
    Unavailable(String),
}

/// Where a consumer starts: the next block it needs and the log position where the block before
/// it ended (its `orderer_position`; 0 for the first block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resume {
    /// The first block to deliver.
    pub block: BlockNumber,
    /// The log position where that block starts.
    pub position: u64,
}

impl Resume {
    /// From the first block of the log.
    pub const START: Resume = Resume {
        block: BlockNumber(1),
        position: 0,
    };

    /// The block after `block`, which a consumer has (for instance the last in its ledger).
    pub fn after(block: &TransactionBlock) -> Resume {
        Resume {
            block: BlockNumber(block.number.0 + 1),
            position: block.orderer_position,
        }
    }
}

/// Whether a block stream's reader wants the block being filled cut now ([`Cut::OnDemand`]).
///
/// A reader busy with the block before clears it to look ahead: its stream then delivers only
/// blocks cut without it (full, timed out, or asked for by another reader), so looking ahead
/// never makes a block smaller. Setting it again asks at once.
#[derive(Debug, Clone)]
pub struct Demand(tokio::sync::watch::Receiver<bool>);

impl Demand {
    /// A reader that always wants the block being filled (what [`Orderer::deliver`] gives).
    pub fn always() -> Demand {
        Demand(tokio::sync::watch::channel(true).1)
    }

    /// A demand the reader sets and clears through the sender, starting at `wanted`.
    pub fn channel(wanted: bool) -> (tokio::sync::watch::Sender<bool>, Demand) {
        let (tx, rx) = tokio::sync::watch::channel(wanted);
        (tx, Demand(rx))
    }

    /// Whether the reader wants the block being filled now.
    pub fn wanted(&self) -> bool {
        *self.0.borrow()
    }

    /// Returns when the demand may have changed; never once its sender is gone (it stays as it
    /// was).
    pub async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
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
        from: Resume,
    ) -> impl Future<Output = Result<BlockStream, OrdererError>> + Send;

    /// As [`Orderer::deliver`], cutting a partial block on demand only while `demand` says the
    /// reader wants it. An orderer that cannot tell (it cuts for its readers elsewhere, as the
    /// solo orderer's server does) delivers as [`Orderer::deliver`].
    fn deliver_on(
        &self,
        from: Resume,
        demand: Demand,
    ) -> impl Future<Output = Result<BlockStream, OrdererError>> + Send {
        let _ = demand;
        self.deliver(from)
    }
}
