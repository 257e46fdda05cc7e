//! Checkpoints (docs/design/overview.md §2.5, docs/design/digest.md): SQL-level snapshots of the
//! shared tables at an applied block, restore, replay and pruning.
//!
//! A checkpoint copies only the tables changed since their last snapshot (`INSERT … SELECT` into
//! `chainify_cp_<t>`, tagged with the block); `chainify_checkpoint_tables` records which
//! snapshot holds each table for each checkpoint. [`Store::restore`] compares with the snapshot
//! only the keys recorded as changed since the checkpoint (the dirty-key tables) and deletes,
//! updates and inserts only the rows that differ; [`Store::restore_full`] compares every row,
//! after checking that the snapshots hold the agreed state digest. Either runs in one database
//! transaction and then clears the changes the triggers recorded for it, so the restore itself
//! never reaches a digest.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chainify_core::state::{RowHash, StateHash};
use chainify_core::{BlockNumber, Digest, Value};

use crate::backend::{Backend, Conn};
use crate::catalog::CatalogTable;
use crate::ddl::{self, ReadType};
use crate::error::StorageError;
use crate::exec::{BlockOutcome, ExecBlock, ExecMode};
use crate::store::{Store, parents_first};

/// Keys repaired per restore statement.
const RESTORE_CHUNK: usize = 256;

/// What a checkpoint or restore did.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CheckpointInfo {
    /// The checkpoint's block.
    pub block: BlockNumber,
    /// Tables copied (snapshot) or compared and repaired (restore).
    pub tables: Vec<String>,
    /// Rows copied (snapshot) or deleted, updated and inserted (restore).
    pub rows: u64,
    /// Wall time.
    pub elapsed: Duration,
}

fn int(b: BlockNumber) -> Result<Value, StorageError> {
    i64::try_from(b.0)
        .map(Value::Int)
        .map_err(|_| StorageError::Checkpoint(format!("block {b} does not fit a BIGINT")))
}

impl<B: Backend> Store<B> {
    /// Takes a checkpoint of the shared tables as of `block`, which must be the last applied
    /// block with no changes from outside chainify pending (they belong to the next block's
    /// digest; a snapshot must not capture them).
    pub async fn checkpoint(&self, block: BlockNumber) -> Result<CheckpointInfo, StorageError> {
        let started = Instant::now();
        let last = self.last_applied_block().await?;
        if last != Some(block) {
            return Err(StorageError::Checkpoint(format!(
                "block {block} is not the last applied block ({})",
                last.map_or_else(|| "none".to_owned(), |b| b.to_string())
            )));
        }
        let dialect = self.backend.dialect();
        let p = |n| ddl::placeholder(dialect, n);
        let b = int(block)?;
        let during = format!("taking the checkpoint at block {block}");
        let tables = self.tables();
        let mut conn = self.acquire(&during).await?;
        self.db(conn.begin_snapshot().await, &during)?;
        let result = async {
            for t in tables.values() {
                let rows = self.db(
                    conn.query(
                        &format!("SELECT COUNT(*) FROM {}", ddl::digest_table(&t.name)),
                        &[],
                        &[ReadType::Int],
                    )
                    .await,
                    &during,
                )?;
                if !matches!(rows.first().and_then(|r| r.first()), Some(Value::Int(0))) {
                    return Err(StorageError::Checkpoint(format!(
                        "table {} has changes made outside chainify since block {block}; they go into the next block's digest first",
                        t.name
                    )));
                }
            }
            let exists = self.db(
                conn.query(
                    &format!("SELECT COUNT(*) FROM chainify_checkpoints WHERE block = {}", p(1)),
                    &[&b],
                    &[ReadType::Int],
                )
                .await,
                &during,
            )?;
            if !matches!(exists.first().and_then(|r| r.first()), Some(Value::Int(0))) {
                return Err(StorageError::Checkpoint(format!(
                    "a checkpoint at block {block} already exists"
                )));
            }
            let state = self.db(
                conn.query(
                    "SELECT table_name, last_changed_block, last_snapshot_block FROM chainify_shared_tables",
                    &[],
                    &[ReadType::Text, ReadType::Int, ReadType::Int],
                )
                .await,
                &during,
            )?;
            let mut copied = Vec::new();
            let mut holders = Vec::new();
            let mut rows = 0;
            for row in state {
                let (Value::Text(name), Value::Int(changed), Value::Int(snapshot)) =
                    (&row[0], &row[1], &row[2])
                else {
                    continue;
                };
                let Some(t) = tables.get(name) else { continue };
                let holder = if *snapshot < 0 || changed > snapshot {
                    rows += self.db(
                        conn.execute(&ddl::snapshot(dialect, t), &[&b], false).await,
                        &during,
                    )?;
                    self.db(
                        conn.execute(
                            &format!(
                                "UPDATE chainify_shared_tables SET last_snapshot_block = {} WHERE table_name = {}",
                                p(1),
                                p(2)
                            ),
                            &[&b, &Value::Text(name.clone())],
                            false,
                        )
                        .await,
                        &during,
                    )?;
                    copied.push(name.clone());
                    b.clone()
                } else {
                    Value::Int(*snapshot)
                };
                holders.push((name.clone(), holder));
            }
            self.register_checkpoint(&mut conn, &b, &holders, &during)
                .await?;
            Ok((copied, rows))
        }
        .await;
        match result {
            Ok((tables, rows)) => {
                self.db(conn.commit().await, &during)?;
                Ok(CheckpointInfo {
                    block,
                    tables,
                    rows,
                    elapsed: started.elapsed(),
                })
            }
            Err(e) => {
                let _ = conn.rollback().await;
                Err(e)
            }
        }
    }

    /// Records the checkpoint of block `b`: which snapshot holds each table, and when it was
    /// taken.
    pub(crate) async fn register_checkpoint(
        &self,
        conn: &mut B::Conn,
        b: &Value,
        holders: &[(String, Value)],
        during: &str,
    ) -> Result<(), StorageError> {
        for (table, holder) in holders {
            self.insert_row(
                conn,
                "chainify_checkpoint_tables (block, table_name, snapshot_block)",
                &[b, &Value::Text(table.clone()), holder],
                during,
            )
            .await?;
        }
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.insert_row(
            conn,
            "chainify_checkpoints (block, created_unix_ms)",
            &[b, &Value::Int(now_ms)],
            during,
        )
        .await
    }

    /// The blocks that have checkpoints, oldest first.
    pub async fn checkpoints(&self) -> Result<Vec<BlockNumber>, StorageError> {
        let rows = self
            .query(
                "listing checkpoints",
                "SELECT block FROM chainify_checkpoints ORDER BY block",
                &[],
                &[ReadType::Int],
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| match r.first() {
                Some(Value::Int(b)) => u64::try_from(*b).ok().map(BlockNumber),
                _ => None,
            })
            .collect())
    }

    /// Restores the shared tables to checkpoint `block`. Afterwards the last applied block is
    /// `block`; applied blocks and checkpoints after it are forgotten (they belong to the state
    /// being discarded), and nothing the restore changed is recorded for a digest. Only keys
    /// recorded as changed since the checkpoint are compared: a change that bypassed the
    /// triggers needs [`Store::restore_full`].
    pub async fn restore(&self, block: BlockNumber) -> Result<CheckpointInfo, StorageError> {
        self.restore_scope(block, None, None).await
    }

    /// Restores checkpoint `block` comparing every row, after checking that its snapshots hold
    /// exactly the state `agreed` (the ledger's state digest of `block`): the repair of changes
    /// no trigger recorded. Nothing is changed when the snapshots do not match.
    pub async fn restore_full(
        &self,
        block: BlockNumber,
        agreed: Digest,
    ) -> Result<CheckpointInfo, StorageError> {
        let states = self.snapshot_state(block).await?;
        let found = crate::state::state_digest(&states);
        if found != agreed {
            return Err(StorageError::Checkpoint(format!(
                "the checkpoint at block {block} holds state {found}, not the agreed {agreed}: it cannot repair the tables"
            )));
        }
        // The recorded accumulators of the checkpoint are replaced by the verified ones: a
        // wrong one would otherwise survive every repair.
        self.restore_scope(block, Some(&states), None).await
    }

    /// [`Store::restore_full`] of an adopted state's checkpoint, recording the adoption (applied
    /// block, transaction ids, ledger entries) in the same transaction.
    pub(crate) async fn restore_adopting(
        &self,
        a: &crate::transfer::Adoption,
    ) -> Result<CheckpointInfo, StorageError> {
        let states = self.snapshot_state(a.block).await?;
        let found = crate::state::state_digest(&states);
        if found != a.state {
            return Err(StorageError::Transfer(format!(
                "the transferred rows make state {found}, not the agreed {} of block {}; nothing was applied",
                a.state, a.block
            )));
        }
        self.restore_scope(a.block, Some(&states), Some(a)).await
    }

    /// The block of the snapshot that holds `table` in the checkpoint at `block`.
    pub(crate) async fn snapshot_holder(
        &self,
        block: BlockNumber,
        table: &str,
        during: &str,
    ) -> Result<i64, StorageError> {
        self.snapshot_holders(block, during)
            .await?
            .get(table)
            .copied()
            .ok_or_else(|| {
                StorageError::Checkpoint(format!(
                    "there is no checkpoint of table {table} at block {block}"
                ))
            })
    }

    /// Each table's state accumulator over the snapshots that make up checkpoint `block`.
    pub(crate) async fn snapshot_state(
        &self,
        block: BlockNumber,
    ) -> Result<crate::state::TableStates, StorageError> {
        let during = format!("reading the snapshots of the checkpoint at block {block}");
        let dialect = self.backend.dialect();
        let holders = self.snapshot_holders(block, &during).await?;
        let mut states = crate::state::TableStates::new();
        let mut conn = self.acquire(&during).await?;
        for t in self.tables().values() {
            let s = holders.get(&t.name).copied().ok_or_else(|| {
                StorageError::Checkpoint(format!(
                    "table {} was registered after the checkpoint at block {block}",
                    t.name
                ))
            })?;
            let (sql, types) = ddl::snapshot_rows(dialect, t);
            let rows = self.db(conn.query(&sql, &[&Value::Int(s)], &types).await, &during)?;
            let mut sum = StateHash::empty();
            for row in &rows {
                sum.add(&RowHash::of(&t.name, row));
            }
            states.insert(t.name.clone(), sum);
        }
        Ok(states)
    }

    async fn snapshot_holders(
        &self,
        block: BlockNumber,
        during: &str,
    ) -> Result<std::collections::BTreeMap<String, i64>, StorageError> {
        let rows = self
            .query(
                during,
                &format!(
                    "SELECT table_name, snapshot_block FROM chainify_checkpoint_tables WHERE block = {}",
                    ddl::placeholder(self.backend.dialect(), 1)
                ),
                &[&int(block)?],
                &[ReadType::Text, ReadType::Int],
            )
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| match (&r[0], &r[1]) {
                (Value::Text(n), Value::Int(s)) => Some((n.clone(), *s)),
                _ => None,
            })
            .collect())
    }

    /// `verified`: restore every row, and record these accumulators as the checkpoint's.
    async fn restore_scope(
        &self,
        block: BlockNumber,
        verified: Option<&crate::state::TableStates>,
        adopting: Option<&crate::transfer::Adoption>,
    ) -> Result<CheckpointInfo, StorageError> {
        let full = verified.is_some();
        let started = Instant::now();
        let referenced = self.referenced_snapshots().await?;
        let dialect = self.backend.dialect();
        let p = |n| ddl::placeholder(dialect, n);
        let b = int(block)?;
        let during = format!("restoring the checkpoint at block {block}");
        let tables = self.tables();
        let order = parents_first(&tables);
        let holders = self
            .query(
                &during,
                &format!(
                    "SELECT table_name, snapshot_block FROM chainify_checkpoint_tables WHERE block = {}",
                    p(1)
                ),
                &[&b],
                &[ReadType::Text, ReadType::Int],
            )
            .await?;
        if holders.is_empty() {
            return Err(StorageError::Checkpoint(format!(
                "there is no checkpoint at block {block}"
            )));
        }
        let holder = |name: &str| {
            holders.iter().find_map(|r| match (&r[0], &r[1]) {
                (Value::Text(n), Value::Int(s)) if n == name => Some(*s),
                _ => None,
            })
        };
        // Every shared table must be in the checkpoint (a table registered after it cannot be
        // restored to that point).
        for t in &order {
            if holder(&t.name).is_none() {
                return Err(StorageError::Checkpoint(format!(
                    "table {} was registered after the checkpoint at block {block}",
                    t.name
                )));
            }
        }
        // Rows are repaired table by table in one transaction; foreign-key checks would fail
        // midway on engines that check them row by row.
        let fk = self.backend.foreign_keys_deferred();
        let mut conn = self.acquire(&during).await?;
        for sql in fk.before_begin {
            self.db(conn.batch(sql).await, &during)?;
        }
        self.db(conn.begin().await, &during)?;
        let result = async {
            for sql in fk.in_transaction {
                self.db(conn.batch(sql).await, &during)?;
            }
            let snapshot_of = |t: &CatalogTable| Value::Int(holder(&t.name).unwrap_or(-1));
            // Only keys changed since the checkpoint can differ from it; a full restore (a
            // change bypassed the triggers) compares every row, set by set.
            let mut dirty = Vec::with_capacity(order.len());
            for t in &order {
                if full {
                    dirty.push(Vec::new());
                    continue;
                }
                let (sql, types) = ddl::dirty_keys(dialect, t);
                let keys = self.db(conn.query(&sql, &[&b], &types).await, &during)?;
                dirty.push(keys.into_iter().flatten().collect::<Vec<Value>>());
            }
            let chunks = |t: &CatalogTable, keys: &'_ [Value]| -> Vec<(usize, Vec<Value>)> {
                let width = t.primary_key.len();
                keys.chunks(RESTORE_CHUNK * width)
                    .map(|c| {
                        let mut params = vec![snapshot_of(t)];
                        params.extend(c.iter().cloned());
                        (c.len() / width, params)
                    })
                    .collect()
            };
            let mut rows = 0;
            if full {
                for t in order.iter().rev() {
                    let (delete, _, _) = ddl::restore_all(dialect, t);
                    rows += self.db(
                        conn.execute(&delete, &[&snapshot_of(t)], false).await,
                        &during,
                    )?;
                }
                for t in &order {
                    let (_, update, insert) = ddl::restore_all(dialect, t);
                    let s = snapshot_of(t);
                    if let Some(update) = update {
                        rows += self.db(conn.execute(&update, &[&s], false).await, &during)?;
                    }
                    rows += self.db(conn.execute(&insert, &[&s], false).await, &during)?;
                }
            }
            for (t, keys) in order.iter().zip(&dirty).rev() {
                for (n, params) in chunks(t, keys) {
                    let (delete, _, _) = ddl::restore(dialect, t, n);
                    let params: Vec<&Value> = params.iter().collect();
                    rows += self.db(conn.execute(&delete, &params, false).await, &during)?;
                }
            }
            for (t, keys) in order.iter().zip(&dirty) {
                let s = snapshot_of(t);
                for (n, params) in chunks(t, keys) {
                    let (_, update, insert) = ddl::restore(dialect, t, n);
                    let params: Vec<&Value> = params.iter().collect();
                    if let Some(update) = update {
                        rows += self.db(conn.execute(&update, &params, false).await, &during)?;
                    }
                    rows += self.db(conn.execute(&insert, &params, false).await, &during)?;
                }
                self.db(
                    conn.execute(&ddl::fold_dirty(dialect, t), &[&b, &b], false)
                        .await,
                    &during,
                )?;
                self.db(
                    conn.execute(
                        &format!(
                            "UPDATE chainify_shared_tables SET last_changed_block = {}, last_snapshot_block = {} WHERE table_name = {}",
                            p(1),
                            p(2),
                            p(3)
                        ),
                        &[&s, &s, &Value::Text(t.name.clone())],
                        false,
                    )
                    .await,
                    &during,
                )?;
            }
            for t in &order {
                self.db(
                    conn.batch(&format!("DELETE FROM {}", ddl::digest_table(&t.name)))
                        .await,
                    &during,
                )?;
            }
            for sql in [
                format!("DELETE FROM chainify_applied_blocks WHERE block > {}", p(1)),
                format!("DELETE FROM chainify_state WHERE block {} {}", if full { ">=" } else { ">" }, p(1)),
                format!("DELETE FROM chainify_applied_txs WHERE block > {}", p(1)),
                format!("DELETE FROM chainify_tx_index WHERE block > {}", p(1)),
                format!("DELETE FROM chainify_checkpoint_tables WHERE block > {}", p(1)),
                format!("DELETE FROM chainify_checkpoints WHERE block > {}", p(1)),
            ] {
                self.db(conn.execute(&sql, &[&b], false).await, &during)?;
            }
            if let Some(states) = verified {
                self.write_state_rows(&mut conn, block, states, &during)
                    .await?;
            }
            if let Some(a) = adopting {
                self.record_adoption(&mut conn, a, &during).await?;
            }
            Ok(rows)
        }
        .await;
        let outcome = match result {
            Ok(rows) => self.db(conn.commit().await, &during).map(|()| rows),
            Err(e) => {
                let _ = conn.rollback().await;
                Err(e)
            }
        };
        for sql in fk.after_end {
            self.db(conn.batch(sql).await, &during)?;
        }
        let rows = outcome?;
        // Snapshots taken after the checkpoint are unreferenced now.
        self.drop_unreferenced_snapshots(referenced).await?;
        Ok(CheckpointInfo {
            block,
            tables: order.iter().map(|t| t.name.clone()).collect(),
            rows,
            elapsed: started.elapsed(),
        })
    }

    /// Applies `blocks` in order on top of the current state (after a restore).
    pub async fn replay(
        &self,
        blocks: &[ExecBlock],
        mode: ExecMode,
    ) -> Result<Vec<BlockOutcome>, StorageError> {
        let mut outcomes = Vec::with_capacity(blocks.len());
        for b in blocks {
            outcomes.push(self.execute_block(b, mode).await?);
        }
        Ok(outcomes)
    }

    /// Keeps the newest `keep` checkpoints and drops older ones with the snapshots only they
    /// used. Returns the dropped checkpoint blocks.
    pub async fn prune_checkpoints(&self, keep: usize) -> Result<Vec<BlockNumber>, StorageError> {
        let all = self.checkpoints().await?;
        let drop_count = all.len().saturating_sub(keep);
        let dropped: Vec<BlockNumber> = all[..drop_count].to_vec();
        let Some(newest_dropped) = dropped.last() else {
            return Ok(dropped);
        };
        let referenced = self.referenced_snapshots().await?;
        let p = |n| ddl::placeholder(self.backend.dialect(), n);
        let b = int(*newest_dropped)?;
        let during = "pruning checkpoints";
        let mut conn = self.acquire(during).await?;
        self.db(conn.begin().await, during)?;
        let result = async {
            for sql in [
                format!(
                    "DELETE FROM chainify_checkpoint_tables WHERE block <= {}",
                    p(1)
                ),
                format!("DELETE FROM chainify_checkpoints WHERE block <= {}", p(1)),
            ] {
                self.db(conn.execute(&sql, &[&b], false).await, during)?;
            }
            // Restores to the kept checkpoints need only keys changed after the oldest one.
            if let Some(oldest) = all.get(drop_count) {
                let oldest = int(*oldest)?;
                for t in self.tables().values() {
                    let sql = ddl::prune_dirty(self.backend.dialect(), t);
                    self.db(conn.execute(&sql, &[&oldest], false).await, during)?;
                }
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => self.db(conn.commit().await, during)?,
            Err(e) => {
                let _ = conn.rollback().await;
                return Err(e);
            }
        }
        drop(conn);
        self.drop_unreferenced_snapshots(referenced).await?;
        Ok(dropped)
    }

    /// The snapshots checkpoints refer to: (table, snapshot block).
    pub(crate) async fn referenced_snapshots(
        &self,
    ) -> Result<BTreeSet<(String, i64)>, StorageError> {
        let rows = self
            .query(
                "listing snapshots",
                "SELECT DISTINCT table_name, snapshot_block FROM chainify_checkpoint_tables",
                &[],
                &[ReadType::Text, ReadType::Int],
            )
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| match (&r[0], &r[1]) {
                (Value::Text(t), Value::Int(b)) => Some((t.clone(), *b)),
                _ => None,
            })
            .collect())
    }

    /// Deletes the snapshots that were referenced (`before`) and no longer are, by their key
    /// prefix (no scan of the snapshot tables).
    pub(crate) async fn drop_unreferenced_snapshots(
        &self,
        before: BTreeSet<(String, i64)>,
    ) -> Result<(), StorageError> {
        let after = self.referenced_snapshots().await?;
        let during = "dropping unreferenced snapshots";
        let mut conn = self.acquire(during).await?;
        for (table, block) in before.difference(&after) {
            let sql = ddl::drop_snapshot(self.backend.dialect(), table);
            self.db(
                conn.execute(&sql, &[&Value::Int(*block)], false).await,
                during,
            )?;
        }
        Ok(())
    }
}
