//! The state digest on the engine (`docs/design/digest.md`, "State digest"): each shared table's
//! LtHash accumulator after every block in `chainify_state`, maintained by the digest step from
//! the recorded before- and after-images, and the full scan that recomputes it from the rows.

use std::collections::BTreeMap;

use chainify_core::state::{RowHash, StateHash};
use chainify_core::{BlockNumber, Digest, Value};

use crate::backend::{Backend, Conn};
use crate::catalog::CatalogTable;
use crate::ddl::{self, ReadType};
use crate::error::StorageError;
use crate::store::Store;

/// Accumulators of blocks older than this many blocks before the newest are deleted unless a
/// checkpoint needs them ([`REGISTERED`], the state at registration, is kept).
const KEEP_RECENT: i64 = 256;

/// After block `block`, accumulators of the blocks below this one may go (unless a checkpoint
/// needs them).
pub(crate) fn forget_states_below(block: i64) -> i64 {
    block - KEEP_RECENT
}

/// The `block` of the state recorded at registration, before any block.
const REGISTERED: i64 = -1;

/// Each registered table's accumulator.
pub(crate) type TableStates = BTreeMap<String, StateHash>;

/// The state digest of per-table accumulators: the digest of their sum.
pub fn state_digest(tables: &TableStates) -> Digest {
    let mut sum = StateHash::empty();
    for s in tables.values() {
        sum.combine(s);
    }
    sum.digest()
}

/// The outcome of comparing the tables' rows with the state the ledger records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateCheck {
    /// The newest applied block; `None` before the first.
    pub block: Option<BlockNumber>,
    /// The digest the applied blocks lead to (with changes recorded since, not digested yet).
    pub expected: Digest,
    /// The digest of the rows as they are.
    pub actual: Digest,
    /// Tables whose rows differ from their recorded state.
    pub differing: Vec<String>,
    /// Recorded changes not digested yet: a block in progress, or changes made outside
    /// chainify (which an auditor must not take back on the audited database's word).
    pub pending: u64,
    /// Rows scanned.
    pub rows: u64,
    /// Shared tables whose definition changed since registration: they may hold the agreed
    /// rows and still compute otherwise ([`Store::check_definitions`]).
    pub changed_definitions: Vec<crate::store::DefinitionChange>,
    /// Blocks past the newest applied one that `chainify_state` holds accumulators for: chainify
    /// never writes those (a DBA planting a state for the scan to trust would).
    pub stray_states: Vec<BlockNumber>,
    /// The ledger's newest block at or before the newest applied one (`None`: no ledger yet).
    pub ledger_block: Option<BlockNumber>,
    /// The state digest that `ledger_block`'s recorded accumulators give, for the caller to
    /// hold against the agreed (certified) state digest of that block: what the scan trusts is
    /// then tied to what the organizations signed. `None`: no ledger block, or its
    /// accumulators are gone (which the caller reports).
    pub ledger_state: Option<Digest>,
}

impl StateCheck {
    /// Whether the tables hold what the recorded state says, under the definitions registered
    /// (the caller holds [`StateCheck::ledger_state`] against the ledger).
    pub fn agrees(&self) -> bool {
        self.differing.is_empty()
            && self.changed_definitions.is_empty()
            && self.stray_states.is_empty()
    }
}

fn corrupt(block: Option<BlockNumber>, what: String) -> StorageError {
    StorageError::Damaged {
        block: block.unwrap_or(BlockNumber(0)),
        problem: format!("chainify_state holds {what}"),
    }
}

impl<B: Backend> Store<B> {
    /// Reads the per-table accumulators of the newest state before block `before` (`None`:
    /// newest overall). Returns the block they belong to (`None`: the state at registration)
    /// and the states.
    pub(crate) async fn read_states(
        &self,
        conn: &mut B::Conn,
        before: Option<BlockNumber>,
        during: &str,
    ) -> Result<(Option<BlockNumber>, TableStates), StorageError> {
        let dialect = self.backend().dialect();
        let (filter, params) = match before {
            Some(b) => (
                format!(" WHERE block < {}", ddl::placeholder(dialect, 1)),
                vec![Value::Int(i64::try_from(b.0).unwrap_or(i64::MAX))],
            ),
            None => (String::new(), Vec::new()),
        };
        let refs: Vec<&Value> = params.iter().collect();
        let rows = self.db(
            conn.query(&states_query(&filter), &refs, &STATE_TYPES)
                .await,
            during,
        )?;
        self.parse_states(before, rows)
    }

    /// The accumulators in `rows` of [`states_query`], every shared table's present.
    pub(crate) fn parse_states(
        &self,
        before: Option<BlockNumber>,
        rows: Vec<Vec<Value>>,
    ) -> Result<(Option<BlockNumber>, TableStates), StorageError> {
        let mut block = None;
        let mut states = TableStates::new();
        for row in rows {
            let (Some(Value::Int(b)), Some(Value::Text(table)), Some(Value::Bytes(lanes))) =
                (row.first(), row.get(1), row.get(2))
            else {
                return Err(corrupt(before, "a malformed row".into()));
            };
            block = u64::try_from(*b).ok().map(BlockNumber);
            let state = StateHash::from_bytes(lanes)
                .map_err(|e| corrupt(before, format!("a bad accumulator of {table}: {e}")))?;
            states.insert(table.clone(), state);
        }
        for name in self.tables().keys() {
            if !states.contains_key(name) {
                return Err(corrupt(
                    before,
                    format!("no accumulator for shared table {name}"),
                ));
            }
        }
        Ok((block, states))
    }

    /// Inserts the accumulators of `block` (none may be recorded for it yet).
    pub(crate) async fn write_state_rows(
        &self,
        conn: &mut B::Conn,
        block: BlockNumber,
        states: &TableStates,
        during: &str,
    ) -> Result<(), StorageError> {
        let b = i64::try_from(block.0).unwrap_or(i64::MAX);
        for (table, state) in states {
            self.insert_state(conn, b, table, state, during).await?;
        }
        Ok(())
    }

    /// Inserts one table's accumulator of `block` (−1: the state at registration).
    async fn insert_state(
        &self,
        conn: &mut B::Conn,
        block: i64,
        table: &str,
        state: &StateHash,
        during: &str,
    ) -> Result<(), StorageError> {
        self.insert_row(
            conn,
            "chainify_state (block, table_name, lanes)",
            &[
                &Value::Int(block),
                &Value::Text(table.to_owned()),
                &Value::Bytes(state.to_bytes()),
            ],
            during,
        )
        .await
    }

    /// The accumulator of `t`'s rows as they are, and how many there are.
    pub(crate) async fn scan_table(
        &self,
        conn: &mut B::Conn,
        t: &CatalogTable,
        during: &str,
    ) -> Result<(StateHash, u64), StorageError> {
        let (sql, types) = ddl::scan(self.backend().dialect(), t);
        let rows = self.db(conn.query(&sql, &[], &types).await, during)?;
        let n = rows.len() as u64;
        Ok((hash_rows(&t.name, rows).await?, n))
    }

    /// Records the content of a newly registered table as its state at the newest block (or as
    /// the state at registration), inside the registration's database transaction.
    pub(crate) async fn record_registered_state(
        &self,
        conn: &mut B::Conn,
        t: &CatalogTable,
    ) -> Result<(), StorageError> {
        let during = format!("recording the state of table {}", t.name);
        // The newest applied block's, not the newest row's: a row planted for a later block
        // would leave the table out of the accumulators the next digest reads.
        let rows = self.db(
            conn.query(
                &format!(
                    "SELECT MAX(block) FROM chainify_state WHERE block <= COALESCE(({NEWEST_APPLIED}), -1)"
                ),
                &[],
                &[ReadType::Int],
            )
            .await,
            &during,
        )?;
        let block = match rows.first().and_then(|r| r.first()) {
            Some(Value::Int(b)) => *b,
            _ => REGISTERED,
        };
        let (state, _) = self.scan_table(conn, t, &during).await?;
        self.insert_state(conn, block, &t.name, &state, &during)
            .await
    }

    /// The state digest after applied block `block`.
    pub async fn state_digest_at(&self, block: BlockNumber) -> Result<Digest, StorageError> {
        self.off_runtime(async {
            let during = format!("reading the state digest of block {block}");
            let mut conn = self.acquire(&during).await?;
            let (found, states) = self
                .read_states(
                    &mut conn,
                    Some(BlockNumber(block.0.saturating_add(1))),
                    &during,
                )
                .await?;
            if found != Some(block) {
                return Err(corrupt(
                    Some(block),
                    format!("no accumulator for block {block} (it was forgotten or never applied)"),
                ));
            }
            Ok(state_digest(&states))
        })
        .await
    }

    /// Recomputes every shared table's accumulator from its rows and compares it with the
    /// recorded state of the newest applied block, adjusted by the changes recorded since and
    /// not digested yet (what the next block's digest step will fold in). Reads in one snapshot:
    /// the recorded changes of a block in progress are in it together with their rows, so the
    /// check may run beside the executor.
    pub async fn check_state(&self) -> Result<StateCheck, StorageError> {
        self.check_state_with(true).await
    }

    /// [`Store::check_state`], reading the shared tables' definitions again only with
    /// `definitions` (a dozen catalog queries a table: a node does it less often than it scans
    /// the rows).
    pub async fn check_state_with(&self, definitions: bool) -> Result<StateCheck, StorageError> {
        self.off_runtime(async {
            let during = "checking the state digest by a full scan";
            let mut conn = self.acquire(during).await?;
            self.db(conn.begin_read_snapshot().await, during)?;
            let result = self.check_state_in(&mut conn, during).await;
            let _ = conn.rollback().await;
            // The catalog is read on connections of its own: release this one first.
            drop(conn);
            let mut check = result?;
            if definitions {
                check.changed_definitions = self.check_definitions().await?;
            }
            Ok(check)
        })
        .await
    }

    async fn check_state_in(
        &self,
        conn: &mut B::Conn,
        during: &str,
    ) -> Result<StateCheck, StorageError> {
        // The accumulators of the newest applied block, not of whatever block `chainify_state`
        // holds the most recent rows for.
        let applied = self.newest_applied(conn, during).await?;
        let before = applied.map_or(BlockNumber(0), |b| BlockNumber(b.0.saturating_add(1)));
        let (block, mut expected) = self.read_states(conn, Some(before), during).await?;
        if applied.is_some() && block != applied {
            return Err(corrupt(
                applied,
                format!(
                    "no accumulators for the newest applied block (the newest before it: {})",
                    block.map_or("the registration".into(), |b| b.to_string())
                ),
            ));
        }
        let stray_states = self
            .db(
                conn.query(
                    &format!(
                        "SELECT DISTINCT block FROM chainify_state WHERE block > {} ORDER BY block",
                        ddl::placeholder(self.backend().dialect(), 1)
                    ),
                    &[&Value::Int(applied.map_or(REGISTERED, |b| {
                        i64::try_from(b.0).unwrap_or(i64::MAX)
                    }))],
                    &[ReadType::Int],
                )
                .await,
                during,
            )?
            .into_iter()
            .filter_map(|r| match r.first() {
                Some(Value::Int(b)) => u64::try_from(*b).ok().map(BlockNumber),
                _ => None,
            })
            .collect();
        let (ledger_block, ledger_state) = self.ledger_state(conn, applied, during).await?;
        let mut actual = TableStates::new();
        let mut rows = 0;
        let mut pending_total = 0;
        for t in self.tables().values() {
            let pending = self.read_pending(conn, t, during).await?;
            pending_total += pending.len() as u64;
            // What the pending changes do to the state: the next digest step adds it.
            let mut delta = StateHash::empty();
            for (before, after) in pending {
                if let Some(before) = before {
                    delta.remove(&RowHash::of(&t.name, &before));
                }
                if let Some(after) = after {
                    delta.add(&RowHash::of(&t.name, &after));
                }
            }
            if let Some(state) = expected.get_mut(&t.name) {
                state.combine(&delta);
            }
            let (state, n) = self.scan_table(conn, t, during).await?;
            rows += n;
            actual.insert(t.name.clone(), state);
        }
        let differing = actual
            .iter()
            .filter(|(name, s)| expected.get(*name) != Some(s))
            .map(|(name, _)| name.clone())
            .collect();
        Ok(StateCheck {
            block,
            expected: state_digest(&expected),
            actual: state_digest(&actual),
            differing,
            pending: pending_total,
            rows,
            changed_definitions: Vec::new(),
            stray_states,
            ledger_block,
            ledger_state,
        })
    }

    /// The newest applied block ([`NEWEST_APPLIED`]; in a snapshot, its first read fixes it).
    pub(crate) async fn newest_applied(
        &self,
        conn: &mut B::Conn,
        during: &str,
    ) -> Result<Option<BlockNumber>, StorageError> {
        let rows = self.db(
            conn.query(NEWEST_APPLIED, &[], &[ReadType::Int]).await,
            during,
        )?;
        Ok(block_of(&rows))
    }

    /// The ledger's newest block at or before `applied` and the state digest of its recorded
    /// accumulators ([`StateCheck::ledger_state`]).
    async fn ledger_state(
        &self,
        conn: &mut B::Conn,
        applied: Option<BlockNumber>,
        during: &str,
    ) -> Result<(Option<BlockNumber>, Option<Digest>), StorageError> {
        let Some(applied) = applied else {
            return Ok((None, None));
        };
        let rows = self.db(
            conn.query(
                &format!(
                    "SELECT MAX(block) FROM chainify_ledger WHERE block <= {}",
                    ddl::placeholder(self.backend().dialect(), 1)
                ),
                &[&Value::Int(i64::try_from(applied.0).unwrap_or(i64::MAX))],
                &[ReadType::Int],
            )
            .await,
            during,
        )?;
        let Some(last) = block_of(&rows) else {
            return Ok((None, None));
        };
        let (found, states) = self
            .read_states(conn, Some(BlockNumber(last.0.saturating_add(1))), during)
            .await?;
        Ok((
            Some(last),
            (found == Some(last)).then(|| state_digest(&states)),
        ))
    }

    /// The recorded, not yet digested changes of `t`: (before-image, current image) per key.
    pub(crate) async fn read_pending(
        &self,
        conn: &mut B::Conn,
        t: &CatalogTable,
        during: &str,
    ) -> Result<Vec<BeforeAndNow>, StorageError> {
        let (sql, types) = ddl::read_changes(self.backend().dialect(), t);
        let rows = self.db(conn.query(&sql, &[], &types).await, during)?;
        Ok(first_changes(t, rows).map(|(_, change)| change).collect())
    }
}

/// The columns of [`states_query`].
pub(crate) const STATE_TYPES: [ReadType; 3] = [ReadType::Int, ReadType::Text, ReadType::Bytes];

/// The newest accumulators among the rows of `chainify_state` that `filter` (a WHERE clause,
/// or empty) leaves.
/// The block a one-value answer (`SELECT MAX(block) …`) names; `None` for NULL.
fn block_of(rows: &[Vec<Value>]) -> Option<BlockNumber> {
    match rows.first().and_then(|r| r.first()) {
        Some(Value::Int(b)) => u64::try_from(*b).ok().map(BlockNumber),
        _ => None,
    }
}

/// The newest applied block: the newest in `chainify_applied_blocks` with accumulators. A
/// block's digest records it applied and writes its accumulators in one transaction (only the
/// newest block's are sure to be kept), so a row without them can only have been planted; it
/// would have every later block refused as out of order, or taken as applied with no state.
/// The next digest clears it.
pub(crate) const NEWEST_APPLIED: &str = "SELECT a.block FROM chainify_applied_blocks a \
     WHERE EXISTS (SELECT 1 FROM chainify_state s WHERE s.block = a.block) \
     ORDER BY a.block DESC LIMIT 1";

pub(crate) fn states_query(filter: &str) -> String {
    format!(
        "SELECT block, table_name, lanes FROM chainify_state WHERE block = (SELECT MAX(block) FROM chainify_state{filter})"
    )
}

/// Rows at or above this many are hashed on the blocking pool.
const HASH_OFF_REACTOR: usize = 256;

/// The accumulator of `rows` of `table`. Expanding a row costs microseconds, so a whole table
/// hashed on the reactor would hold one of its threads for milliseconds to seconds. (The 60 ms
/// stalls of the background scan on SQLite were its writer lock, not this: moving the hashing
/// off the reactor alone did not change them.)
pub(crate) async fn hash_rows(
    table: &str,
    rows: Vec<Vec<Value>>,
) -> Result<StateHash, StorageError> {
    let sum = |table: &str, rows: &[Vec<Value>]| {
        let mut state = StateHash::empty();
        for row in rows {
            state.add(&RowHash::of(table, row));
        }
        state
    };
    if rows.len() < HASH_OFF_REACTOR {
        return Ok(sum(table, &rows));
    }
    let name = table.to_string();
    match tokio::task::spawn_blocking(move || sum(&name, &rows)).await {
        Ok(state) => Ok(state),
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Only a runtime shutting down cancels it; nothing waits for the answer then.
            Err(e) => Err(StorageError::Query(format!(
                "hashing the rows of table {table}: {e}"
            ))),
        },
    }
}

/// Each changed key of `t` once, from the rows of [`ddl::read_changes`] (a record a change, in
/// the order the changes happened): its key and its first record's before-image with its row
/// now.
pub(crate) fn first_changes(
    t: &CatalogTable,
    rows: Vec<Vec<Value>>,
) -> impl Iterator<Item = (Vec<Value>, BeforeAndNow)> + '_ {
    let mut seen = std::collections::HashSet::new();
    rows.into_iter()
        .map(move |row| split_change(t, row))
        .filter(move |(key, _)| seen.insert(key.clone()))
}

/// A changed key's row before the block and now (`None`: absent).
pub(crate) type BeforeAndNow = (Option<Vec<Value>>, Option<Vec<Value>>);

/// Splits a row of [`ddl::read_changes`] into key and (before-image, current image).
fn split_change(t: &CatalogTable, mut row: Vec<Value>) -> (Vec<Value>, BeforeAndNow) {
    let key_len = t.primary_key.len();
    let width = t.columns.len();
    let first_key = t
        .columns
        .iter()
        .position(|c| c.name == t.primary_key[0])
        .unwrap_or(0);
    let mut image = row.split_off(key_len);
    let mut was = image.split_off(width.min(image.len()));
    let before_image = if was.is_empty() {
        Vec::new()
    } else {
        was.split_off(1)
    };
    let existed = matches!(was.first(), Some(Value::Int(1)));
    let present = !matches!(image.get(first_key), None | Some(Value::Null));
    (
        row,
        (existed.then_some(before_image), present.then_some(image)),
    )
}
