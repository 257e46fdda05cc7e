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
use tokio::sync::watch;

use crate::ledger::{self, LedgerError};
use crate::node::Committed;

/// Appended blocks of one organization, from any height.
#[derive(Debug)]
pub struct CommitFeed<B: Backend> {
    store: Arc<Store<B>>,
    source: Source,
}

#[derive(Debug, Clone)]
enum Source {
    /// The node's commit stream. Weak: the feed neither keeps the stream open nor holds the
    /// blocks it carries.
    Live(broadcast::WeakSender<Arc<Committed>>),
    /// The ledger alone, read again every so often, and whenever the hint (the height the
    /// appending process announces) changes.
    Polling(Duration, Option<watch::Receiver<BlockNumber>>),
}

impl<B: Backend> Clone for CommitFeed<B> {
    fn clone(&self) -> Self {
        CommitFeed {
            store: self.store.clone(),
            source: self.source.clone(),
        }
    }
}

impl<B: Backend> CommitFeed<B> {
    /// Over the node's commit stream and the ledger in `store`.
    pub fn new(store: Arc<Store<B>>, live: broadcast::WeakSender<Arc<Committed>>) -> Self {
        CommitFeed {
            store,
            source: Source::Live(live),
        }
    }

    /// Over the ledger alone, read again every `interval` once caught up: for a component in
    /// another process than the node that appends.
    pub fn polling(store: Arc<Store<B>>, interval: Duration) -> Self {
        CommitFeed {
            store,
            source: Source::Polling(interval, None),
        }
    }

    /// As [`CommitFeed::polling`], and read again as soon as `hint` changes: the appending
    /// process announces its height there, so a block is seen when it is appended and the
    /// interval only covers a hint that is late or gone. A hint is only a reason to read: the
    /// blocks always come from the ledger.
    pub fn hinted(
        store: Arc<Store<B>>,
        interval: Duration,
        hint: watch::Receiver<BlockNumber>,
    ) -> Self {
        CommitFeed {
            store,
            source: Source::Polling(interval, Some(hint)),
        }
    }

    /// Every block appended from `from` on, in order. When the node has stopped, the
    /// subscription plays the ledger from `from` and ends.
    pub fn subscribe(&self, from: BlockNumber) -> Subscription<B> {
        let after_history = match &self.source {
            Source::Live(weak) => match weak.upgrade() {
                Some(sender) => AfterHistory::Live(sender.subscribe()),
                None => AfterHistory::End,
            },
            Source::Polling(interval, hint) => AfterHistory::Poll(*interval, hint.clone()),
        };
        Subscription {
            store: self.store.clone(),
            after_history,
            next: BlockNumber(from.0.max(1)),
            tail: 0,
            history: true,
        }
    }
}

/// What a subscription does once it has read the ledger's end.
#[derive(Debug)]
enum AfterHistory {
    /// Follow the node's commit stream.
    Live(broadcast::Receiver<Arc<Committed>>),
    /// Read the ledger again after this long, or when the hint changes.
    Poll(Duration, Option<watch::Receiver<BlockNumber>>),
    /// End: the node had stopped when subscribing.
    End,
}

/// A reader of a [`CommitFeed`].
#[derive(Debug)]
pub struct Subscription<B: Backend> {
    store: Arc<Store<B>>,
    after_history: AfterHistory,
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
                match &mut self.after_history {
                    AfterHistory::Live(_) => self.history = false,
                    AfterHistory::Poll(interval, hint) => {
                        let sleep = tokio::time::sleep(*interval);
                        match hint {
                            Some(h) => tokio::select! {
                                () = sleep => {}
                                changed = h.changed() => {
                                    // Its sender gone: the interval alone from now on.
                                    if changed.is_err() {
                                        *hint = None;
                                    }
                                }
                            },
                            None => sleep.await,
                        }
                        continue;
                    }
                    // Caught up with a node that had stopped.
                    AfterHistory::End => return None,
                }
            }
            let AfterHistory::Live(live) = &mut self.after_history else {
                unreachable!("only a live subscription leaves the history")
            };
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
