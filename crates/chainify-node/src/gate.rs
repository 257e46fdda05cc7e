//! Reads at an agreed height.
//!
//! Between blocks a node's database holds exactly the agreed blocks; while a block executes, or
//! while executed blocks wait for their vote (pipelining), it holds more. The node keeps a
//! write lock on the gate from the moment it starts executing until it is back at such a
//! clean point; a query holds a read lock, so it sees the effect of every agreed block and of
//! nothing else. A waiting reader makes the node stop starting blocks until it is clean, so
//! reads are not starved by load; the lock is fair, so the node is not starved by reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use chainify_core::BlockNumber;
use tokio::sync::{Notify, OwnedRwLockReadGuard, RwLock, watch};

use crate::NodeStatus;

/// The node's side of the gate.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gate {
    pub(crate) lock: Arc<RwLock<()>>,
    pub(crate) waiting: Arc<AtomicUsize>,
    /// Wakes the node when a reader arrives.
    pub(crate) arrived: Arc<Notify>,
}

impl Gate {
    /// Whether a reader waits for the node to reach a clean point.
    pub(crate) fn readers_waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }
}

/// Lets readers in between blocks.
#[derive(Debug, Clone)]
pub struct ReadGate {
    gate: Gate,
    status: watch::Receiver<NodeStatus>,
}

/// A read lock on the database at an agreed height; the node executes nothing while it lives.
#[derive(Debug)]
pub struct ReadGuard {
    _guard: OwnedRwLockReadGuard<()>,
    /// The newest agreed block the database reflects (`None` before the first).
    pub height: Option<BlockNumber>,
}

impl ReadGate {
    pub(crate) fn new(gate: Gate, status: watch::Receiver<NodeStatus>) -> ReadGate {
        ReadGate { gate, status }
    }

    /// Waits until the database holds exactly the agreed blocks and keeps it so.
    pub async fn read(&self) -> ReadGuard {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.gate.waiting.fetch_add(1, Ordering::AcqRel);
        let waiting = Waiting(&self.gate.waiting);
        self.gate.arrived.notify_one();
        let guard = self.gate.lock.clone().read_owned().await;
        drop(waiting);
        let next = self.status.borrow().next_block;
        ReadGuard {
            _guard: guard,
            height: next.0.checked_sub(1).filter(|b| *b > 0).map(BlockNumber),
        }
    }
}
