//! The in-process orderer: one log, one cutter, blocks kept in memory for every consumer. A
//! background task appends a time-to-cut marker when the oldest transaction of the block being
//! filled has waited the batch timeout. Cutting [`Cut::OnDemand`], a consumer that asks for the
//! block being filled also appends one at once: no block waits on the timer while a consumer
//! is idle, and under load a block holds what arrived while the consumers executed the last.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chainify_core::NetworkId;
use chainify_core::tx::{ChainedTransaction, TransactionBlock};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::{BlockCutter, BlockStream, Cut, Demand, LogEntry, Orderer, OrdererError, Resume};

#[derive(Debug)]
struct State {
    cutter: BlockCutter,
    /// Every block cut so far; block n at index n.
    blocks: Vec<TransactionBlock>,
    log_len: u64,
    /// When the oldest transaction of the block being filled arrived.
    oldest_pending: Option<Instant>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    /// The number of blocks cut so far, for consumers waiting on new ones (also signalled, on
    /// demand, when the block being filled receives its first transaction).
    cut: watch::Sender<usize>,
    batch_timeout: Duration,
    mode: Cut,
}

/// An in-process orderer. Cloning shares it.
#[derive(Debug, Clone)]
pub struct LocalOrderer {
    inner: Arc<Inner>,
}

impl LocalOrderer {
    /// An orderer whose first block is block 1, cutting after `max_block_txs` transactions or
    /// when the oldest waited `batch_timeout`. Must be called inside a tokio runtime (it spawns
    /// the timeout task, which ends when the last clone is dropped).
    pub fn start(network: NetworkId, max_block_txs: usize, batch_timeout: Duration) -> Self {
        LocalOrderer::start_cutting(network, max_block_txs, batch_timeout, Cut::Timeout)
    }

    /// As [`LocalOrderer::start`], cutting partial blocks as `mode` says.
    pub fn start_cutting(
        network: NetworkId,
        max_block_txs: usize,
        batch_timeout: Duration,
        mode: Cut,
    ) -> Self {
        let (cut, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                cutter: BlockCutter::new(network, max_block_txs, Resume::START.block),
                blocks: Vec::new(),
                log_len: 0,
                oldest_pending: None,
            }),
            cut,
            batch_timeout,
            mode,
        });
        tokio::spawn(timeouts(Arc::downgrade(&inner)));
        LocalOrderer { inner }
    }
}

impl LocalOrderer {
    /// Entries (transactions and markers) appended to the log so far.
    pub fn log_len(&self) -> u64 {
        self.inner.lock().log_len
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends an entry to the log under the lock and publishes a block it completes.
    fn append(&self, state: &mut State, entry: LogEntry) {
        let first = matches!(entry, LogEntry::Tx(_)) && state.cutter.pending() == 0;
        if first {
            state.oldest_pending = Some(Instant::now());
        }
        state.log_len += 1;
        if let Some(block) = state.cutter.push(entry, state.log_len) {
            state.blocks.push(block);
            state.oldest_pending = None;
            self.cut.send_replace(state.blocks.len());
        } else if first && self.mode == Cut::OnDemand {
            // Wake the consumers waiting for this block: they may cut it now.
            self.cut.send_replace(state.blocks.len());
        }
    }

    /// On demand, the consumer that wants block `index` (counting from the first) cuts it when
    /// it is the block being filled and holds a transaction.
    fn cut_on_demand(&self, state: &mut State, index: usize) {
        if self.mode == Cut::OnDemand && index == state.blocks.len() && state.cutter.pending() > 0 {
            let marker = LogEntry::TimeToCut(state.cutter.next_block());
            self.append(state, marker);
        }
    }
}

/// Appends a time-to-cut marker whenever the block being filled is older than the timeout.
async fn timeouts(inner: Weak<Inner>) {
    loop {
        let wait = {
            let Some(inner) = inner.upgrade() else { return };
            let mut state = inner.lock();
            match state.oldest_pending {
                Some(since) if since.elapsed() >= inner.batch_timeout => {
                    let marker = LogEntry::TimeToCut(state.cutter.next_block());
                    inner.append(&mut state, marker);
                    Duration::ZERO
                }
                Some(since) => inner.batch_timeout.saturating_sub(since.elapsed()),
                None => inner.batch_timeout,
            }
        };
        tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
    }
}

impl Orderer for LocalOrderer {
    async fn broadcast(&self, tx: ChainedTransaction) -> Result<(), OrdererError> {
        let mut state = self.inner.lock();
        self.inner.append(&mut state, LogEntry::Tx(tx));
        Ok(())
    }

    async fn deliver(&self, from: Resume) -> Result<BlockStream, OrdererError> {
        self.deliver_on(from, Demand::always()).await
    }

    async fn deliver_on(&self, from: Resume, demand: Demand) -> Result<BlockStream, OrdererError> {
        // Blocks are kept by number here; the position matters to log-based orderers.
        let start = usize::try_from(from.block.0.saturating_sub(Resume::START.block.0))
            .unwrap_or(usize::MAX);
        let inner = Arc::downgrade(&self.inner);
        let rx = self.inner.cut.subscribe();
        let stream = futures_util::stream::unfold(
            (inner, rx, demand, start),
            |(inner, mut rx, mut demand, i)| async move {
                loop {
                    {
                        let strong = inner.upgrade()?;
                        let mut state = strong.lock();
                        if demand.wanted() {
                            strong.cut_on_demand(&mut state, i);
                        }
                        if let Some(block) = state.blocks.get(i) {
                            let block = block.clone();
                            drop(state);
                            drop(strong);
                            return Some((Ok(block), (inner, rx, demand, i + 1)));
                        }
                    }
                    tokio::select! {
                        changed = rx.changed() => if changed.is_err() {
                            return None;
                        },
                        () = demand.changed() => {}
                    }
                }
            },
        );
        Ok(Box::pin(stream))
    }
}
