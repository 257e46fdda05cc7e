//! One ordered feed of appended blocks for every consumer: the ChainifyServer's CommitStream and
//! outcome waiters, the in-process cluster's outcome index, a component following the ledger
//! from another process, and the benchmarks' listeners.
//!
//! [`CommitFeed::subscribe`]`(from)` yields every block from `from` on, in order and without a
//! gap: first the history from the organization's ledger, then the node's live commit stream,
//! and after a lag (a slow subscriber missed events) the missed blocks from the ledger again.
//! Nothing falls between history and live: the subscription listens to the live stream before
//! it reads the ledger, and the node appends a block before it announces it. Blocks read from
//! the ledger carry no failure reasons (they stay with the node that executed them).

use std::sync::Arc;
use std::time::Duration;

use chainify_core::BlockNumber;
use chainify_storage::{Backend, Store};
use tokio::sync::broadcast::{self, error::RecvError};

use crate::ledger::{self, LedgerError};
use crate::node::Committed;

/// Appended blocks of one organization, from any height.
#[derive(Debug)]
pub struct CommitFeed<B: Backend> {
    store: Arc<Store<B>>,
    /// A receiver of the node's commit stream, kept only to subscribe more.
    live: Option<broadcast::Receiver<Arc<Committed>>>,
    poll: Duration,
}

impl<B: Backend> Clone for CommitFeed<B> {
    fn clone(&self) -> Self {
        CommitFeed {
            store: self.store.clone(),
            live: self.live.as_ref().map(broadcast::Receiver::resubscribe),
            poll: self.poll,
        }
    }
}

impl<B: Backend> CommitFeed<B> {
    /// Over the node's commit stream (`Node::commits`) and the ledger in `store`.
    pub fn new(store: Arc<Store<B>>, live: broadcast::Receiver<Arc<Committed>>) -> Self {
        CommitFeed {
            store,
            live: Some(live),
            poll: Duration::ZERO,
        }
    }

    /// Over the ledger alone, read again every `interval` once caught up: for a component in
    /// another process than the node that appends.
    pub fn polling(store: Arc<Store<B>>, interval: Duration) -> Self {
        CommitFeed {
            store,
            live: None,
            poll: interval,
        }
    }

    /// Every block appended from `from` on, in order.
    pub fn subscribe(&self, from: BlockNumber) -> Subscription<B> {
        Subscription {
            store: self.store.clone(),
            live: self.live.as_ref().map(broadcast::Receiver::resubscribe),
            poll: self.poll,
            next: BlockNumber(from.0.max(1)),
            tail: 0,
            history: true,
        }
    }
}

/// A reader of a [`CommitFeed`].
#[derive(Debug)]
pub struct Subscription<B: Backend> {
    store: Arc<Store<B>>,
    live: Option<broadcast::Receiver<Arc<Committed>>>,
    poll: Duration,
    next: BlockNumber,
    /// The ledger's last block when last read.
    tail: u64,
    /// Reading the ledger (at the start, after a lag) rather than the live stream.
    history: bool,
}

impl<B: Backend> Subscription<B> {
    /// The block [`Subscription::next`] returns next.
    pub fn next_block(&self) -> BlockNumber {
        self.next
    }

    /// The next appended block. `None` when the node stopped (its commit stream closed). An
    /// error says the ledger could not be read; calling again retries the same block.
    pub async fn next(&mut self) -> Option<Result<Arc<Committed>, LedgerError>> {
        loop {
            if self.history {
                if self.next.0 > self.tail {
                    match self.store.ledger_tail().await {
                        Ok(tail) => self.tail = tail.map_or(0, |(b, _)| b.0),
                        Err(e) => return Some(Err(e.into())),
                    }
                }
                if self.next.0 <= self.tail {
                    let entry = match ledger::entry(&self.store, self.next).await {
                        Ok(entry) => entry,
                        Err(e) => return Some(Err(e)),
                    };
                    self.next = BlockNumber(self.next.0 + 1);
                    return Some(Ok(Arc::new(Committed {
                        block: entry.block,
                        certificate: entry.certificate,
                        reasons: Vec::new(),
                    })));
                }
                if self.live.is_none() {
                    tokio::time::sleep(self.poll).await;
                    continue;
                }
                self.history = false;
            }
            let live = self.live.as_mut()?;
            match live.recv().await {
                // Already read from the ledger.
                Ok(c) if c.block.number < self.next => {}
                Ok(c) if c.block.number == self.next => {
                    self.next = BlockNumber(self.next.0 + 1);
                    return Some(Ok(c));
                }
                // Missed events, or blocks appended before the stream was joined: the ledger
                // has them.
                Ok(_) | Err(RecvError::Lagged(_)) => self.history = true,
                Err(RecvError::Closed) => return None,
            }
        }
    }
}
