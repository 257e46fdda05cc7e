//! State transfer on the engine (`docs/design/digest.md`, "State transfer"): the key-range trees
//! of the live tables and of a checkpoint, the rows of chosen ranges of a checkpoint (what an
//! organization serves), and adopting a transferred state (what the receiving organization does).
//!
//! Adopting writes the state as a checkpoint first: the live tables copied, the differing ranges
//! replaced by the transferred rows. The full restore of that checkpoint then checks it against
//! the agreed state digest before it changes any shared table, and in the same database
//! transaction records the block as applied and appends the ledger entries that lead to it.
//! So the organization keeps a checkpoint of the state it adopted, and nothing that does not
//! match the agreed digest reaches its tables or its ledger.

use std::collections::{BTreeMap, BTreeSet};

use chainify_core::ranges::{LEAVES, RangeTree, leaf_of};
use chainify_core::{BlockNumber, Digest, Value};

use crate::backend::{Backend, Conn};
use crate::catalog::CatalogTable;
use crate::checkpoint::CheckpointInfo;
use crate::ddl::{self, ReadType};
use crate::error::StorageError;
use crate::store::Store;

/// Most parameters per statement when writing transferred rows (SQLite allows 32 766).
const PARAMS_PER_STATEMENT: usize = 30_000;

/// Most bytes of values one insert of transferred rows carries: MariaDB refuses a statement past
/// its packet (16 MiB at least, checked at start), and a thousand rows of a few hundred KiB each
/// would have failed every transfer of their table there.
const BATCH_BYTES: usize = 4 << 20;

/// `rows` in consecutive batches of at most `per` rows and, past the first row of a batch, at
/// most [`BATCH_BYTES`] of values.
fn row_batches(rows: &[Vec<Value>], per: usize) -> impl Iterator<Item = &[Vec<Value>]> {
    let size = |row: &Vec<Value>| -> usize { row.iter().map(Value::payload_bytes).sum() };
    let mut rest = rows;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut n = 0;
        let mut bytes = 0;
        while n < rest.len() && n < per.max(1) {
            let b = size(&rest[n]);
            if n > 0 && bytes + b > BATCH_BYTES {
                break;
            }
            bytes += b;
            n += 1;
        }
        let (batch, after) = rest.split_at(n);
        rest = after;
        Some(batch)
    })
}

/// A ledger block a state transfer appends. The caller decodes it (the storage layer keeps
/// ledger entries as opaque bytes) and has verified its certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdoptedBlock {
    /// Block number.
    pub number: BlockNumber,
    /// Its LedgerBlock hash.
    pub hash: Digest,
    /// The hash it chains to.
    pub previous: Digest,
    /// The ledger entry as stored.
    pub entry: Vec<u8>,
    /// Its transactions' ids (for replay detection).
    pub tx_ids: Vec<Digest>,
}

/// The rows of some key ranges of one table, from an organization that agrees on the state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangePatch {
    /// The ranges replaced.
    pub ranges: BTreeSet<u32>,
    /// Every row in them (all columns, in column order).
    pub rows: Vec<Vec<Value>>,
}

/// A state to adopt: the tables as of agreed block `block`, made of the local rows outside the
/// patched ranges and the transferred rows inside them.
#[derive(Clone, Debug)]
pub struct Adoption {
    /// The agreed block.
    pub block: BlockNumber,
    /// Its agreed state digest.
    pub state: Digest,
    /// Its hash digest and outcome (what `chainify_applied_blocks` records).
    pub hash_digest: Digest,
    /// Whether each of its transactions committed.
    pub success: Vec<bool>,
    /// Per table, the ranges replaced.
    pub patches: BTreeMap<String, RangePatch>,
    /// The ledger entries after the local ledger's last block through `block` (empty when the
    /// ledger already holds `block`).
    pub ledger: Vec<AdoptedBlock>,
}

fn refuse(problem: String) -> StorageError {
    StorageError::Transfer(problem)
}

/// Whether `v` is a value a column read as `ty` can hold (what a row must look like before it
/// is written).
fn fits(ty: ReadType, v: &Value) -> bool {
    matches!(
        (ty, v),
        (_, Value::Null)
            | (ReadType::Int, Value::Int(_))
            | (ReadType::Decimal(_), Value::Decimal(_))
            | (ReadType::Text, Value::Text(_))
            | (ReadType::Bool, Value::Bool(_))
            | (ReadType::Bytes, Value::Bytes(_))
    )
}

/// The positions of `t`'s key columns among its columns.
pub(crate) fn key_positions(t: &CatalogTable) -> Vec<usize> {
    t.primary_key
        .iter()
        .filter_map(|k| t.columns.iter().position(|c| &c.name == k))
        .collect()
}

impl<B: Backend> Store<B> {
    fn shared(&self, table: &str) -> Result<CatalogTable, StorageError> {
        self.tables()
            .get(table)
            .cloned()
            .ok_or_else(|| refuse(format!("{table} is not a shared table here")))
    }

    /// The key-range tree of `table`: of its rows as they are (`checkpoint` `None`), or of its
    /// snapshot in the checkpoint at that block.
    pub async fn range_tree(
        &self,
        table: &str,
        checkpoint: Option<BlockNumber>,
    ) -> Result<RangeTree, StorageError> {
        self.off_runtime(async {
            let t = self.shared(table)?;
            let rows = self.read_rows(&t, checkpoint).await?;
            let mut tree = RangeTree::new(&t.name, key_positions(&t));
            for row in &rows {
                tree.add(row);
            }
            Ok(tree)
        })
        .await
    }

    /// The rows of `table` in the checkpoint at `block` whose keys fall in `ranges`.
    pub async fn checkpoint_rows(
        &self,
        block: BlockNumber,
        table: &str,
        ranges: &BTreeSet<u32>,
    ) -> Result<Vec<Vec<Value>>, StorageError> {
        self.off_runtime(async {
            let t = self.shared(table)?;
            let tree = RangeTree::new(&t.name, key_positions(&t));
            let rows = self.read_rows(&t, Some(block)).await?;
            Ok(rows
                .into_iter()
                .filter(|r| ranges.contains(&tree.leaf_of_row(r)))
                .collect())
        })
        .await
    }

    /// The state digest the snapshots of the checkpoint at `block` hold.
    pub async fn checkpoint_state_digest(
        &self,
        block: BlockNumber,
    ) -> Result<Digest, StorageError> {
        self.off_runtime(async {
            Ok(crate::state::state_digest(
                &self.snapshot_state(block).await?,
            ))
        })
        .await
    }

    async fn read_rows(
        &self,
        t: &CatalogTable,
        checkpoint: Option<BlockNumber>,
    ) -> Result<Vec<Vec<Value>>, StorageError> {
        let dialect = self.backend().dialect();
        match checkpoint {
            None => {
                let (sql, types) = ddl::scan(dialect, t);
                self.query(&format!("reading table {}", t.name), &sql, &[], &types)
                    .await
            }
            Some(block) => {
                let during = format!("reading {} in the checkpoint at block {block}", t.name);
                let holder = self.snapshot_holder(block, &t.name, &during).await?;
                let (sql, types) = ddl::snapshot_rows(dialect, t);
                let params = holder.params();
                let params: Vec<&Value> = params.iter().collect();
                self.query(&during, &sql, &params, &types).await
            }
        }
    }

    /// Checks a transferred state before anything is written: known tables, rows of the right
    /// shape, each in a patched range, no key twice, and a ledger that chains to `block`.
    /// Pure: the receiver runs it on what a peer sent before adopting it.
    pub fn check_adoption(&self, a: &Adoption) -> Result<(), StorageError> {
        for (name, patch) in &a.patches {
            let t = self.shared(name)?;
            let types: Vec<ReadType> = t.columns.iter().map(|c| ReadType::of(&c.ty)).collect();
            let positions = key_positions(&t);
            let tree = RangeTree::new(&t.name, positions.clone());
            if let Some(r) = patch.ranges.iter().find(|r| **r >= LEAVES) {
                return Err(refuse(format!("table {name}: there is no key range {r}")));
            }
            let mut keys = BTreeSet::new();
            for (i, row) in patch.rows.iter().enumerate() {
                if row.len() != types.len() {
                    return Err(refuse(format!(
                        "table {name} row {i}: {} values for {} columns",
                        row.len(),
                        types.len()
                    )));
                }
                for ((c, ty), v) in t.columns.iter().zip(&types).zip(row) {
                    if !fits(*ty, v) {
                        return Err(refuse(format!(
                            "table {name} row {i} column {}: {v:?} does not fit {ty:?}",
                            c.name
                        )));
                    }
                }
                let key: Vec<&Value> = positions.iter().map(|p| &row[*p]).collect();
                if key.iter().any(|v| matches!(v, Value::Null)) {
                    return Err(refuse(format!("table {name} row {i}: a NULL key")));
                }
                let range = tree.leaf_of_row(row);
                if !patch.ranges.contains(&range) {
                    return Err(refuse(format!(
                        "table {name} row {i}: its key is in range {range}, which was not asked for"
                    )));
                }
                if !keys.insert(format!("{key:?}")) {
                    return Err(refuse(format!("table {name}: key {key:?} appears twice")));
                }
            }
        }
        let mut expected = a.ledger.first().map(|b| b.number);
        let mut previous = a.ledger.first().map(|b| b.previous);
        for b in &a.ledger {
            if Some(b.number) != expected || Some(b.previous) != previous {
                return Err(refuse(format!(
                    "ledger block {} does not follow the one before it",
                    b.number
                )));
            }
            expected = Some(BlockNumber(b.number.0 + 1));
            previous = Some(b.hash);
        }
        if let Some(last) = a.ledger.last()
            && last.number != a.block
        {
            return Err(refuse(format!(
                "the ledger entries end at block {}, not at the adopted block {}",
                last.number, a.block
            )));
        }
        Ok(())
    }

    /// Adopts a transferred state (see the module docs): checks it, writes it as the checkpoint
    /// of `a.block` and restores that checkpoint fully, verified against `a.state`. On an error
    /// no shared table, applied block or ledger entry has changed.
    pub async fn adopt(&self, a: &Adoption) -> Result<CheckpointInfo, StorageError> {
        self.off_runtime(async {
            self.check_adoption(a)?;
            self.import_checkpoint(a).await?;
            match self.restore_adopting(a).await {
                Ok(info) => Ok(info),
                Err(e) => {
                    // The refused state must not stay behind as a checkpoint a later restore trusts.
                    // A cleanup that fails is this database's fault, not the sender's: not
                    // `Transfer`, which would blame the peer.
                    match self.forget_checkpoint(a.block).await {
                        Ok(()) => Err(e),
                        Err(cleanup) => Err(StorageError::Checkpoint(format!(
                            "{e}; removing the refused checkpoint failed too: {cleanup}"
                        ))),
                    }
                }
            }
        })
        .await
    }

    /// Removes the checkpoint at `block` and its snapshots.
    async fn forget_checkpoint(&self, block: BlockNumber) -> Result<(), StorageError> {
        let dialect = self.backend().dialect();
        let p = |n| ddl::placeholder(dialect, n);
        let b = Value::Int(i64::try_from(block.0).unwrap_or(i64::MAX));
        let during = format!("removing the checkpoint at block {block}");
        let mut conn = self.acquire(&during).await?;
        self.db(conn.begin().await, &during)?;
        let mut statements = vec![
            format!(
                "DELETE FROM chainify_checkpoint_tables WHERE block = {}",
                p(1)
            ),
            format!("DELETE FROM chainify_checkpoints WHERE block = {}", p(1)),
            format!(
                "DELETE FROM chainify_snapshot_layers WHERE block = {}",
                p(1)
            ),
        ];
        for t in self.tables().values() {
            statements.push(format!(
                "DELETE FROM {} WHERE chainify_cp_block = {}",
                ddl::snapshot_table(&t.name),
                p(1)
            ));
        }
        for sql in statements {
            if let Err(e) = self.db(conn.execute(&sql, &[&b], false).await, &during) {
                let _ = conn.rollback().await;
                return Err(e);
            }
        }
        self.db(conn.commit().await, &during)
    }

    /// Writes the adopted state as the checkpoint of `a.block`, replacing every checkpoint at or
    /// after it and every checkpoint of a block not in the local ledger yet: they belong to a
    /// state being given up (a checkpoint taken after a divergent execution must not become a
    /// checkpoint of the block once the transfer makes that block agreed).
    async fn import_checkpoint(&self, a: &Adoption) -> Result<(), StorageError> {
        let dialect = self.backend().dialect();
        let p = |n| ddl::placeholder(dialect, n);
        let block = i64::try_from(a.block.0)
            .map_err(|_| refuse(format!("block {} does not fit a BIGINT", a.block)))?;
        let b = Value::Int(block);
        let unagreed = self.ledger_tail().await?.map_or(1, |(last, _)| last.0 + 1);
        let forget = Value::Int(block.min(i64::try_from(unagreed).unwrap_or(i64::MAX)));
        let during = format!("writing the transferred state of block {}", a.block);
        let tables = self.tables();
        let mut conn = self.acquire(&during).await?;
        self.db(conn.begin().await, &during)?;
        let result = async {
            for sql in [
                format!(
                    "DELETE FROM chainify_checkpoint_tables WHERE block >= {}",
                    p(1)
                ),
                format!("DELETE FROM chainify_checkpoints WHERE block >= {}", p(1)),
                format!(
                    "DELETE FROM chainify_snapshot_layers WHERE block >= {}",
                    p(1)
                ),
            ] {
                self.db(conn.execute(&sql, &[&forget], false).await, &during)?;
            }
            for t in tables.values() {
                let cp = ddl::snapshot_table(&t.name);
                self.db(
                    conn.execute(
                        &format!("DELETE FROM {cp} WHERE chainify_cp_block >= {}", p(1)),
                        &[&forget],
                        false,
                    )
                    .await,
                    &during,
                )?;
                self.db(
                    conn.execute(&ddl::snapshot(dialect, t), &[&b], false).await,
                    &during,
                )?;
                if let Some(patch) = a.patches.get(&t.name) {
                    self.patch_snapshot(&mut conn, t, &b, patch, &during)
                        .await?;
                }
                self.insert_row(
                    &mut conn,
                    "chainify_snapshot_layers (table_name, block, base_block)",
                    &[&Value::Text(t.name.clone()), &b, &b],
                    &during,
                )
                .await?;
            }
            // A checkpoint before the restore must copy the tables again: the snapshots hold the
            // adopted rows, the tables do not yet.
            self.db(
                conn.batch("UPDATE chainify_shared_tables SET last_snapshot_block = -1")
                    .await,
                &during,
            )?;
            let holders: Vec<(String, Value)> = tables
                .keys()
                .map(|name| (name.clone(), b.clone()))
                .collect();
            self.register_checkpoint(&mut conn, &b, &holders, &during)
                .await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => self.db(conn.commit().await, &during)?,
            Err(e) => {
                let _ = conn.rollback().await;
                return Err(e);
            }
        }
        drop(conn);
        // Committed: leftovers are settled at the next prune or start.
        let _ = self.settle_layers().await;
        Ok(())
    }

    /// Replaces the rows of `patch.ranges` in `t`'s snapshot of block `b` by `patch.rows`.
    async fn patch_snapshot(
        &self,
        conn: &mut B::Conn,
        t: &CatalogTable,
        b: &Value,
        patch: &RangePatch,
        during: &str,
    ) -> Result<(), StorageError> {
        let dialect = self.backend().dialect();
        let (sql, types) = ddl::snapshot_keys(dialect, t);
        let keys = self.db(conn.query(&sql, &[b], &types).await, during)?;
        let width = t.primary_key.len().max(1);
        let stale: Vec<Value> = keys
            .into_iter()
            .filter(|key| patch.ranges.contains(&leaf_of(&t.name, key)))
            .flatten()
            .collect();
        let per = (PARAMS_PER_STATEMENT / width).clamp(1, 1000);
        for chunk in stale.chunks(per * width) {
            let sql = ddl::delete_snapshot_keys(dialect, t, chunk.len() / width);
            let mut params: Vec<&Value> = vec![b];
            params.extend(chunk.iter());
            self.db(conn.execute(&sql, &params, false).await, during)?;
        }
        let columns = t.columns.len() + 1;
        let per = (PARAMS_PER_STATEMENT / columns).clamp(1, 1000);
        for chunk in row_batches(&patch.rows, per) {
            let sql = ddl::insert_snapshot_rows(dialect, t, chunk.len());
            let mut params: Vec<&Value> = Vec::with_capacity(chunk.len() * columns);
            for row in chunk {
                params.push(b);
                params.extend(row.iter());
            }
            self.db(conn.execute(&sql, &params, false).await, during)?;
        }
        Ok(())
    }

    /// In the full restore's transaction: records `a.block` as the applied block, with the
    /// transaction ids and ledger entries that lead to it.
    pub(crate) async fn record_adoption(
        &self,
        conn: &mut B::Conn,
        a: &Adoption,
        during: &str,
    ) -> Result<(), StorageError> {
        let dialect = self.backend().dialect();
        let p = |n| ddl::placeholder(dialect, n);
        let int = |n: BlockNumber| Value::Int(i64::try_from(n.0).unwrap_or(i64::MAX));
        let tail = self.db(
            conn.query(
                "SELECT block, hash FROM chainify_ledger WHERE block = (SELECT MAX(block) FROM chainify_ledger)",
                &[],
                &[ReadType::Int, ReadType::Bytes],
            )
            .await,
            during,
        )?;
        let tail = match tail.first().map(Vec::as_slice) {
            Some([Value::Int(n), Value::Bytes(h)]) => Some((
                u64::try_from(*n).unwrap_or(0),
                Digest::try_from(h.as_slice())
                    .map_err(|_| StorageError::Corrupt("a ledger hash is not 32 bytes".into()))?,
            )),
            _ => None,
        };
        match (a.ledger.first(), tail) {
            (None, Some((last, _))) if last >= a.block.0 => {}
            (None, _) => {
                return Err(refuse(format!(
                    "the ledger does not hold block {} and no entries lead to it",
                    a.block
                )));
            }
            (Some(first), tail) => {
                let (after, hash) = tail.unwrap_or((0, Digest::ZERO));
                if first.number.0 != after + 1 || first.previous != hash {
                    return Err(refuse(format!(
                        "the ledger entries start at block {} but the ledger ends at block {after}",
                        first.number
                    )));
                }
            }
        }
        // Outcomes from the first adopted block (or the adopted one) on are replaced; the
        // index keeps the ids of blocks the ledger held already.
        let first = a.ledger.first().map_or(a.block, |b| b.number).min(a.block);
        let indexed = a
            .ledger
            .first()
            .map_or(BlockNumber(a.block.0 + 1), |b| b.number);
        for (sql, from) in [
            ("DELETE FROM chainify_applied_blocks WHERE block >= ", first),
            ("DELETE FROM chainify_applied_txs WHERE block >= ", first),
            ("DELETE FROM chainify_tx_index WHERE block >= ", indexed),
        ] {
            self.db(
                conn.execute(&format!("{sql}{}", p(1)), &[&int(from)], false)
                    .await,
                during,
            )?;
        }
        // Ledger entries and the validated ids of every adopted block (ids of blocks the ledger
        // held already are in the index).
        for block in &a.ledger {
            self.insert_ledger_row(
                conn,
                block.number,
                block.hash,
                block.previous,
                &block.entry,
                during,
            )
            .await?;
            self.index_transactions(conn, block.number, &block.tx_ids, during)
                .await?;
        }
        self.record_applied(conn, a.block, &a.hash_digest, &a.success, during)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Transferred rows go in batches bounded by count and by bytes, in order, every row once; a
    /// row larger than the bound goes alone.
    #[test]
    fn transferred_rows_are_batched_by_count_and_bytes() {
        let row = |bytes: usize| vec![Value::Int(1), Value::Text("x".repeat(bytes))];
        let rows: Vec<Vec<Value>> = [
            10,
            BATCH_BYTES / 2,
            BATCH_BYTES / 2,
            10,
            BATCH_BYTES * 2,
            10,
            10,
            10,
        ]
        .iter()
        .map(|b| row(*b))
        .collect();
        let sizes: Vec<usize> = row_batches(&rows, 1000).map(<[_]>::len).collect();
        // 10 + half + half passes the bound at the third row; the oversized row goes alone.
        assert_eq!(sizes, [2, 2, 1, 3]);
        let by_count: Vec<usize> = row_batches(&rows[5..], 2).map(<[_]>::len).collect();
        assert_eq!(by_count, [2, 1]);
        let flat: Vec<&Vec<Value>> = row_batches(&rows, 1000).flatten().collect();
        assert_eq!(flat, rows.iter().collect::<Vec<_>>());
        assert_eq!(row_batches(&[], 10).count(), 0);
    }
}
