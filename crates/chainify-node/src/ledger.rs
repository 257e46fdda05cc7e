//! The organization's ledger, typed: every read and write of `chainify_ledger` outside the
//! store goes through here, as [`LedgerEntry`]s encoded by `chainify_proto::ledger`. The store
//! keeps the hash chain (it refuses an entry that does not follow the last one).

use chainify_core::BlockNumber;
use chainify_core::tx::{LedgerBlock, LedgerEntry};
use chainify_storage::{Backend, StorageError, Store};

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
