//! Checkpoints (docs/design/overview.md §2.5, docs/design/digest.md): SQL-level snapshots of the
//! shared tables at an applied block, restore, replay and pruning.
//!
//! A checkpoint copies only the tables changed since the previous checkpoint, and of those only
//! the keys the blocks since changed (a delta layer in `chainify_cp_<t>`, tagged with the block;
//! see [`crate::layers`]); the first snapshot of a table copies it whole (a base layer).
//! `chainify_checkpoint_tables` records which layer holds each table for each checkpoint, and
//! `chainify_snapshot_layers` each layer's base. Pruning folds deltas into their base once no
//! kept checkpoint needs the base alone, so a checkpoint costs the keys changed since the
//! previous one, not the table. [`Store::restore`] compares with the snapshot
//! only the keys recorded as changed since the checkpoint (the dirty-key tables) and deletes,
//! updates and inserts only the rows that differ; [`Store::restore_full`] compares every row,
//! after checking that the snapshots hold the agreed state digest. Either runs in one database
//! transaction and then clears the changes the triggers recorded for it, so the restore itself
//! never reaches a digest.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chainify_core::{BlockNumber, Digest, Value};

use crate::backend::{Backend, Conn};
use crate::catalog::CatalogTable;
use crate::ddl::{self, ReadType};
use crate::error::StorageError;
use crate::exec::{BlockOutcome, ExecBlock, ExecMode};
use crate::layers::{self, Layer, Step};
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
    tag(b).map(Value::Int)
}

fn tag(b: BlockNumber) -> Result<i64, StorageError> {
    i64::try_from(b.0)
        .map_err(|_| StorageError::Checkpoint(format!("block {b} does not fit a BIGINT")))
}

impl<B: Backend> Store<B> {
    /// Takes a checkpoint of the shared tables as of `block`, which must be the last applied
    /// block with no changes from outside chainify pending (they belong to the next block's
    /// digest; a snapshot must not capture them).
    pub async fn checkpoint(&self, block: BlockNumber) -> Result<CheckpointInfo, StorageError> {
        self.off_runtime(async {
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
                // One query answers both: whether this block has a checkpoint already, and the
                // previous one. A table changed since that one is copied as a delta of the keys
                // changed after it on top of its layers (the dirty-key tables keep every key changed
                // after the oldest kept checkpoint).
                let newest = self.db(
                    conn.query(
                        &format!("SELECT MAX(block) FROM chainify_checkpoints WHERE block <= {}", p(1)),
                        &[&b],
                        &[ReadType::Int],
                    )
                    .await,
                    &during,
                )?;
                let previous = match newest.first().and_then(|r| r.first()) {
                    Some(Value::Int(n)) if Value::Int(*n) == b => {
                        return Err(StorageError::Checkpoint(format!(
                            "a checkpoint at block {block} already exists"
                        )));
                    }
                    Some(Value::Int(n)) => Some(*n),
                    _ => None,
                };
                let before = match previous {
                    Some(p) => self.layers_in(&mut conn, p, &during).await?,
                    None => BTreeMap::new(),
                };
                let changed = self.db(
                    conn.query(
                        "SELECT table_name, last_changed_block, last_snapshot_block FROM chainify_shared_tables",
                        &[],
                        &[ReadType::Text, ReadType::Int, ReadType::Int],
                    )
                    .await,
                    &during,
                )?;
                let changed: BTreeMap<String, (i64, i64)> = changed
                    .into_iter()
                    .filter_map(|r| match (&r[0], &r[1], &r[2]) {
                        (Value::Text(n), Value::Int(c), Value::Int(s)) => Some((n.clone(), (*c, *s))),
                        _ => None,
                    })
                    .collect();
                let mut copied = Vec::new();
                let mut holders = Vec::new();
                let mut rows = 0;
                for t in tables.values() {
                    let name = Value::Text(t.name.clone());
                    let (last_change, last_snapshot) =
                        changed.get(&t.name).copied().unwrap_or((i64::MAX, -1));
                    // The tables hold the previous checkpoint's layer (plus the recorded changes)
                    // only when it is the table's last snapshot: a transferred state written as a
                    // checkpoint but never adopted (a crash, a refusal) sets it to -1, and the next
                    // checkpoint copies the table whole.
                    let before = previous
                        .zip(before.get(&t.name).filter(|l| l.tag == last_snapshot).copied());
                    if let Some((prev, layer)) = before
                        && last_change <= prev
                    {
                        holders.push((t.name.clone(), Value::Int(layer.tag)));
                        continue;
                    }
                    // Layers after the one this builds on belong to a state a restore discarded
                    // and a crash kept from being dropped.
                    let after = before.map_or(b.clone(), |(_, l)| Value::Int(l.tag + 1));
                    let stale = format!(
                        "DELETE FROM {} WHERE chainify_cp_block >= {}",
                        ddl::snapshot_table(&t.name),
                        p(1)
                    );
                    self.db(conn.execute(&stale, &[&after], false).await, &during)?;
                    let stale = format!(
                        "DELETE FROM chainify_snapshot_layers WHERE block >= {} AND table_name = {}",
                        p(1),
                        p(2)
                    );
                    self.db(
                        conn.execute(&stale, &[&after, &name], false).await,
                        &during,
                    )?;
                    let layer = match before {
                        Some((prev, before)) => {
                            let since = Value::Int(prev);
                            for sql in ddl::snapshot_delta(dialect, t) {
                                rows += self.db(
                                    conn.execute(&sql, &[&b, &since], false).await,
                                    &during,
                                )?;
                            }
                            Layer {
                                tag: tag(block)?,
                                base: before.base,
                            }
                        }
                        None => {
                            rows += self.db(
                                conn.execute(&ddl::snapshot(dialect, t), &[&b], false).await,
                                &during,
                            )?;
                            Layer::base(tag(block)?)
                        }
                    };
                    self.insert_row(
                        &mut conn,
                        "chainify_snapshot_layers (table_name, block, base_block)",
                        &[&name, &b, &Value::Int(layer.base)],
                        &during,
                    )
                    .await?;
                    self.db(
                        conn.execute(
                            &format!(
                                "UPDATE chainify_shared_tables SET last_snapshot_block = {} WHERE table_name = {}",
                                p(1),
                                p(2)
                            ),
                            &[&b, &name],
                            false,
                        )
                        .await,
                        &during,
                    )?;
                    copied.push(t.name.clone());
                    holders.push((t.name.clone(), Value::Int(layer.tag)));
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
        })
        .await
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
        self.off_runtime(async { self.restore_scope(block, None, None).await })
            .await
    }

    /// Restores checkpoint `block` comparing every row, after checking that its snapshots hold
    /// exactly the state `agreed` (the ledger's state digest of `block`): the repair of changes
    /// no trigger recorded. Nothing is changed when the snapshots do not match.
    pub async fn restore_full(
        &self,
        block: BlockNumber,
        agreed: Digest,
    ) -> Result<CheckpointInfo, StorageError> {
        self.off_runtime(async {
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
        })
        .await
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
    ) -> Result<Layer, StorageError> {
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
            let params = s.params();
            let params: Vec<&Value> = params.iter().collect();
            let rows = self.db(conn.query(&sql, &params, &types).await, &during)?;
            states.insert(
                t.name.clone(),
                crate::state::hash_rows(&t.name, rows).await?,
            );
        }
        Ok(states)
    }

    async fn snapshot_holders(
        &self,
        block: BlockNumber,
        during: &str,
    ) -> Result<BTreeMap<String, Layer>, StorageError> {
        let mut conn = self.acquire(during).await?;
        self.layers_in(&mut conn, tag(block)?, during).await
    }

    /// The layer that holds each table in the checkpoint at `block`, with its base.
    pub(crate) async fn layers_in(
        &self,
        conn: &mut B::Conn,
        block: i64,
        during: &str,
    ) -> Result<BTreeMap<String, Layer>, StorageError> {
        let rows = self.db(
            conn.query(
                &format!(
                    "SELECT c.table_name, c.snapshot_block, l.base_block FROM chainify_checkpoint_tables c \
                     LEFT JOIN chainify_snapshot_layers l ON l.table_name = c.table_name AND l.block = c.snapshot_block \
                     WHERE c.block = {}",
                    ddl::placeholder(self.backend.dialect(), 1)
                ),
                &[&Value::Int(block)],
                &[ReadType::Text, ReadType::Int, ReadType::Int],
            )
            .await,
            during,
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|r| match (&r[0], &r[1], &r[2]) {
                (Value::Text(n), Value::Int(tag), Value::Int(base)) => Some((
                    n.clone(),
                    Layer {
                        tag: *tag,
                        base: *base,
                    },
                )),
                // A layer without a record is a base layer.
                (Value::Text(n), Value::Int(tag), _) => Some((n.clone(), Layer::base(*tag))),
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
        let dialect = self.backend.dialect();
        let p = |n| ddl::placeholder(dialect, n);
        let b = int(block)?;
        let during = format!("restoring the checkpoint at block {block}");
        self.require_definitions(&during).await?;
        let tables = self.tables();
        let order = parents_first(&tables);
        let holders = self.snapshot_holders(block, &during).await?;
        if holders.is_empty() {
            return Err(StorageError::Checkpoint(format!(
                "there is no checkpoint at block {block}"
            )));
        }
        let holder = |name: &str| holders.get(name).copied();
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
            let snapshot_of = |t: &CatalogTable| {
                holder(&t.name)
                    .unwrap_or(Layer::base(-1))
                    .params()
                    .to_vec()
            };
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
                        let mut params = snapshot_of(t);
                        params.extend(c.iter().cloned());
                        (c.len() / width, params)
                    })
                    .collect()
            };
            let mut rows = 0;
            if full {
                for t in order.iter().rev() {
                    let (delete, _, _) = ddl::restore_all(dialect, t);
                    let s = snapshot_of(t);
                    let s: Vec<&Value> = s.iter().collect();
                    rows += self.db(conn.execute(&delete, &s, false).await, &during)?;
                }
                for t in &order {
                    let (_, update, insert) = ddl::restore_all(dialect, t);
                    let s = snapshot_of(t);
                    let s: Vec<&Value> = s.iter().collect();
                    if let Some(update) = update {
                        rows += self.db(conn.execute(&update, &s, false).await, &during)?;
                    }
                    rows += self.db(conn.execute(&insert, &s, false).await, &during)?;
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
                let s = Value::Int(holder(&t.name).map_or(-1, |l| l.tag));
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
        // Snapshots taken after the checkpoint are unreferenced now. The restore has
        // committed: a failure here must not report it failed (an adoption would be undone);
        // what is left is settled at the next prune or start.
        let _ = self.settle_layers().await;
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
        self.off_runtime(async {
            let all = self.checkpoints().await?;
            let drop_count = all.len().saturating_sub(keep);
            let dropped: Vec<BlockNumber> = all[..drop_count].to_vec();
            let Some(newest_dropped) = dropped.last() else {
                return Ok(dropped);
            };
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
            self.settle_layers().await?;
            Ok(dropped)
        })
        .await
    }

    /// Leaves exactly the snapshot layers the checkpoints need ([`layers::plan`]): drops the
    /// others and folds deltas into bases no checkpoint needs alone, in one transaction. Run
    /// after checkpoints are dropped; a run a crash cut short is finished by the next.
    pub(crate) async fn settle_layers(&self) -> Result<(), StorageError> {
        let during = "dropping and folding snapshot layers";
        let dialect = self.backend.dialect();
        let p = |n| ddl::placeholder(dialect, n);
        let mut conn = self.acquire(during).await?;
        let referenced = self.db(
            conn.query(
                "SELECT DISTINCT table_name, snapshot_block FROM chainify_checkpoint_tables",
                &[],
                &[ReadType::Text, ReadType::Int],
            )
            .await,
            during,
        )?;
        let referenced: BTreeSet<(String, i64)> = referenced
            .into_iter()
            .filter_map(|r| match (&r[0], &r[1]) {
                (Value::Text(t), Value::Int(b)) => Some((t.clone(), *b)),
                _ => None,
            })
            .collect();
        let recorded = self.db(
            conn.query(
                "SELECT table_name, block, base_block FROM chainify_snapshot_layers",
                &[],
                &[ReadType::Text, ReadType::Int, ReadType::Int],
            )
            .await,
            during,
        )?;
        let recorded: BTreeMap<(String, i64), i64> = recorded
            .into_iter()
            .filter_map(|r| match (&r[0], &r[1], &r[2]) {
                (Value::Text(t), Value::Int(b), Value::Int(base)) => Some(((t.clone(), *b), *base)),
                _ => None,
            })
            .collect();
        let steps = layers::plan(&recorded, &referenced);
        if steps.is_empty() {
            return Ok(());
        }
        let tables = self.tables();
        self.db(conn.begin().await, during)?;
        let result = async {
            for step in &steps {
                let (table, gone) = match step {
                    Step::Drop { table, tag } => {
                        if tables.contains_key(table) {
                            let sql = ddl::drop_snapshot(dialect, table);
                            self.db(conn.execute(&sql, &[&Value::Int(*tag)], false).await, during)?;
                        }
                        (table, *tag)
                    }
                    Step::Fold {
                        table,
                        base: b0,
                        delta: d0,
                    } => {
                        let (base, delta) = (Value::Int(*b0), Value::Int(*d0));
                        if let Some(t) = tables.get(table) {
                            // The base's rows of the delta's keys go first, found by key.
                            let (sql, types) = ddl::snapshot_keys(dialect, t);
                            let keys = self.db(conn.query(&sql, &[&delta], &types).await, during)?;
                            let keys: Vec<Value> = keys.into_iter().flatten().collect();
                            let width = t.primary_key.len().max(1);
                            for chunk in keys.chunks(RESTORE_CHUNK * width) {
                                let sql = ddl::delete_snapshot_keys(dialect, t, chunk.len() / width);
                                let mut params: Vec<&Value> = vec![&base];
                                params.extend(chunk.iter());
                                self.db(conn.execute(&sql, &params, false).await, during)?;
                            }
                            let [moved, rest] = ddl::fold_layer(dialect, t);
                            self.db(conn.execute(&moved, &[&base, &delta], false).await, during)?;
                            self.db(conn.execute(&rest, &[&delta], false).await, during)?;
                        }
                        let name = Value::Text(table.clone());
                        for sql in [
                            format!(
                                "UPDATE chainify_checkpoint_tables SET snapshot_block = {} WHERE snapshot_block = {} AND table_name = {}",
                                p(1),
                                p(2),
                                p(3)
                            ),
                            format!(
                                "UPDATE chainify_shared_tables SET last_snapshot_block = {} WHERE last_snapshot_block = {} AND table_name = {}",
                                p(1),
                                p(2),
                                p(3)
                            ),
                        ] {
                            self.db(
                                conn.execute(&sql, &[&base, &delta, &name], false).await,
                                during,
                            )?;
                        }
                        (table, *d0)
                    }
                };
                self.db(
                    conn.execute(
                        &format!(
                            "DELETE FROM chainify_snapshot_layers WHERE block = {} AND table_name = {}",
                            p(1),
                            p(2)
                        ),
                        &[&Value::Int(gone), &Value::Text(table.clone())],
                        false,
                    )
                    .await,
                    during,
                )?;
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => self.db(conn.commit().await, during),
            Err(e) => {
                let _ = conn.rollback().await;
                Err(e)
            }
        }
    }
}
