//! The organization's ledger, typed: every read and write of `chainify_ledger` outside the
//! store goes through here, as [`LedgerEntry`]s encoded by `chainify_proto::ledger`. The store
//! keeps the hash chain (it refuses an entry that does not follow the last one).

use std::sync::Arc;

use chainify_core::tx::{LedgerBlock, LedgerEntry};
use chainify_core::{BlockNumber, TxId};
use chainify_storage::{Backend, StorageError, Store};
use tokio::sync::{mpsc, oneshot};

/// Why a ledger entry cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The database failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The block is not in the ledger.
    #[error("ledger block {0}: not in the ledger")]
    Missing(BlockNumber),
    /// The stored entry does not decode.
    #[error("ledger block {block}: {problem}")]
    Undecodable {
        /// The block.
        block: BlockNumber,
        /// What is wrong with it.
        problem: String,
    },
}

/// The entry of `block`; an error when it is missing or does not decode.
pub async fn entry<B: Backend>(
    store: &Store<B>,
    block: BlockNumber,
) -> Result<LedgerEntry, LedgerError> {
    let bytes = store
        .ledger_entry(block)
        .await?
        .ok_or(LedgerError::Missing(block))?;
    chainify_proto::ledger::decode(&bytes).map_err(|e| LedgerError::Undecodable {
        block,
        problem: e.to_string(),
    })
}

/// The agreed LedgerBlock of `block`.
pub async fn block<B: Backend>(
    store: &Store<B>,
    block: BlockNumber,
) -> Result<LedgerBlock, LedgerError> {
    Ok(entry(store, block).await?.block)
}

/// The entries from `from` to the end of the ledger.
pub async fn entries_from<B: Backend>(
    store: &Store<B>,
    from: BlockNumber,
) -> Result<Vec<LedgerEntry>, LedgerError> {
    let Some((last, _)) = store.ledger_tail().await? else {
        return Ok(Vec::new());
    };
    let mut entries = Vec::new();
    for b in from.0.max(1)..=last.0 {
        entries.push(entry(store, BlockNumber(b)).await?);
    }
    Ok(entries)
}

/// Appends `entry`, which must follow the ledger's last block.
pub async fn append<B: Backend>(store: &Store<B>, entry: &LedgerEntry) -> Result<(), StorageError> {
    let block = &entry.block;
    store
        .append_ledger(
            block.number,
            block.hash(),
            block.hash_previous,
            &chainify_proto::ledger::encode(entry),
        )
        .await
}

/// Why a [`TxLookup`] has no answer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LookupError {
    /// The database failed (every lookup of the batch gets the same error).
    #[error(transparent)]
    Storage(Arc<StorageError>),
    /// The database did not answer in time (every lookup of the batch gets it).
    #[error("looking up transaction ids: no answer within {0:?}")]
    TimedOut(std::time::Duration),
    /// The lookup task is gone (the runtime is shutting down).
    #[error("the ledger lookup stopped")]
    Stopped,
}

/// Most ids one lookup query carries.
const LOOKUP_BATCH: usize = 1024;

/// How long one lookup query may take: the lookups queued behind a stuck query are refused as
/// unavailable rather than held (with their submission slots and nonces).
const LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether transactions are in the ledger, for many concurrent askers with one query per batch.
///
/// Admission looks every proposal up, at its origin and at each endorser; one query each
/// would cost a database round trip (and, on SQLite, a hop to its worker thread) per proposal.
/// The lookups that arrive while a query runs go together into the next one.
#[derive(Clone, Debug)]
pub struct TxLookup {
    queue: mpsc::UnboundedSender<(TxId, oneshot::Sender<Result<bool, LookupError>>)>,
}

impl TxLookup {
    /// Starts the lookup task over `store`; it ends when the last clone is dropped. Must be
    /// called inside a tokio runtime.
    pub fn spawn<B: Backend>(store: Arc<Store<B>>) -> TxLookup {
        let (queue, mut asked) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut batch: Vec<(TxId, oneshot::Sender<_>)> = Vec::new();
            while asked.recv_many(&mut batch, LOOKUP_BATCH).await > 0 {
                let ids: Vec<TxId> = batch.iter().map(|(id, _)| *id).collect();
                let known = tokio::time::timeout(
                    LOOKUP_TIMEOUT,
                    store.known_transactions(BlockNumber(u64::MAX), &ids),
                )
                .await
                .map_err(|_| LookupError::TimedOut(LOOKUP_TIMEOUT))
                .and_then(|r| r.map_err(|e| LookupError::Storage(Arc::new(e))));
                for (id, reply) in batch.drain(..) {
                    let _ = reply.send(
                        known
                            .as_ref()
                            .map(|k| k.contains(&id))
                            .map_err(Clone::clone),
                    );
                }
            }
        });
        TxLookup { queue }
    }

    /// Whether `id` is in an agreed block of the ledger.
    pub async fn contains(&self, id: TxId) -> Result<bool, LookupError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send((id, reply))
            .map_err(|_| LookupError::Stopped)?;
        answer.await.map_err(|_| LookupError::Stopped)?
    }
}
