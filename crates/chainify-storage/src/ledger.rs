//! The organization's copy of the ledger (`chainify_ledger`): agreed blocks in a hash chain, each
//! stored with its encoded entry (LedgerBlock and certificate, encoded by the caller). The store
//! checks the chain on every append, so a block that does not follow the last one is refused
//! whatever the caller believes.

use chainify_core::{BlockNumber, Digest, Value};

use crate::backend::Backend;
use crate::ddl::{self, ReadType};
use crate::error::StorageError;
use crate::store::Store;

impl<B: Backend> Store<B> {
    /// The last block of the ledger and its hash.
    pub async fn ledger_tail(&self) -> Result<Option<(BlockNumber, Digest)>, StorageError> {
        let rows = self
            .query(
                "reading the ledger",
                "SELECT block, hash FROM chainify_ledger WHERE block = (SELECT MAX(block) FROM chainify_ledger)",
                &[],
                &[ReadType::Int, ReadType::Bytes],
            )
            .await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        match (&row[0], &row[1]) {
            (Value::Int(b), Value::Bytes(h)) => Ok(Some((
                BlockNumber(u64::try_from(*b).unwrap_or(0)),
                Digest::try_from(h.as_slice()).map_err(|_| corrupt("hash"))?,
            ))),
            _ => Err(corrupt("row")),
        }
    }

    /// Appends an agreed block: `block` must follow the ledger's last block (any number for the
    /// first) and `previous` must be that block's hash ([`Digest::ZERO`] for the first).
    pub async fn append_ledger(
        &self,
        block: BlockNumber,
        hash: Digest,
        previous: Digest,
        entry: &[u8],
    ) -> Result<(), StorageError> {
        let tail = self.ledger_tail().await?;
        let refuse = |problem: String| StorageError::BadBlock { block, problem };
        match tail {
            Some((last, last_hash)) => {
                if block.0 != last.0 + 1 {
                    return Err(refuse(format!(
                        "the ledger ends at block {last}; only the next block can be appended"
                    )));
                }
                if previous != last_hash {
                    return Err(refuse(format!(
                        "its previous hash {previous} is not the hash {last_hash} of block {last}"
                    )));
                }
            }
            None if previous != Digest::ZERO => {
                return Err(refuse(
                    "the first block of a ledger must have the zero previous hash".into(),
                ));
            }
            None => {}
        }
        if i64::try_from(block.0).is_err() {
            return Err(refuse("block number too large".into()));
        }
        let during = format!("appending block {block} to the ledger");
        let mut conn = self.acquire(&during).await?;
        self.insert_ledger_row(&mut conn, block, hash, previous, entry, &during)
            .await
    }

    /// Inserts one ledger row (the caller checked that it follows the ledger).
    pub(crate) async fn insert_ledger_row(
        &self,
        conn: &mut B::Conn,
        block: BlockNumber,
        hash: Digest,
        previous: Digest,
        entry: &[u8],
        during: &str,
    ) -> Result<(), StorageError> {
        self.insert_row(
            conn,
            "chainify_ledger (block, hash, previous_hash, entry)",
            &[
                &Value::Int(i64::try_from(block.0).unwrap_or(i64::MAX)),
                &Value::Bytes(hash.as_bytes().to_vec()),
                &Value::Bytes(previous.as_bytes().to_vec()),
                &Value::Bytes(entry.to_vec()),
            ],
            during,
        )
        .await
    }

    /// The stored entry of a ledger block.
    pub async fn ledger_entry(&self, block: BlockNumber) -> Result<Option<Vec<u8>>, StorageError> {
        let b = Value::Int(i64::try_from(block.0).unwrap_or(i64::MAX));
        let rows = self
            .query(
                "reading the ledger",
                &format!(
                    "SELECT entry FROM chainify_ledger WHERE block = {}",
                    ddl::placeholder(self.backend.dialect(), 1)
                ),
                &[&b],
                &[ReadType::Bytes],
            )
            .await?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|r| match r.into_iter().next() {
                Some(Value::Bytes(e)) => Some(e),
                _ => None,
            }))
    }
}

fn corrupt(what: &str) -> StorageError {
    StorageError::Corrupt(format!("chainify_ledger holds a malformed {what}"))
}
