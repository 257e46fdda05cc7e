//! The block executor (docs/design/overview.md §2.3 steps 4–5): runs a validated, analysed block on
//! the engine, as the dependency graph releases transactions, then digests the block's effects.
//!
//! Engines with concurrent writers (PostgreSQL, MySQL) run the block on k *lanes*, pooled
//! connections at READ COMMITTED, each holding one open database transaction across several
//! block transactions (block-level group commit, planned by [`chainify_sched::LanePlan`]): a
//! chain of dependent transactions runs on one lane, and a lane commits when it has nothing to
//! run, when a transaction needs what it holds on another lane, or when it holds [`LANE_CAP`].
//! The graph already orders every conflicting pair, so the engine's isolation has nothing left
//! to order. Every committed transaction leaves a marker row in its database transaction, so a
//! block that fails half-way (the database went away) is re-run by skipping what already
//! committed: nothing is lost or applied twice. [`ExecMode::Serial`] stays the independent
//! reference: block order, a database commit per transaction. SQLite runs the block serially in
//! one database transaction with a savepoint per transaction; a failure rolls the whole block
//! back.
//!
//! Abort semantics: a statement error or an `expect_rows` mismatch flags the transaction
//! unsuccessful (deterministic, the same on every honest engine) and undoes it: the lane rolls
//! its database transaction back and runs the transactions it held again (no savepoint round
//! trips for the common case that nothing aborts). A guard that fails before its transaction
//! changed a row (a SELECT's count, a guarded write matching no row: Smallbank's overdraft
//! checks) has nothing to undo, and its lane goes on. Deadlocks, serialization failures and lock
//! timeouts are retried the same way and never flagged.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chainify_core::canonical::{pack_bits, unpack_bits};
use chainify_core::config::StatementKind;
use chainify_core::effect::{RowEffect, block_digest};
use chainify_core::state::RowHash;
use chainify_core::tx::Transaction;
use chainify_core::{BlockNumber, Digest, TxId, Value};
use chainify_sched::{DependencyGraph, LanePlan, Step, TxExecutor, run_serial};
use chainify_sql::render::Dialect;
use chainify_sql::{AnalysisError, Analyzer, TxAnalysis};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::backend::{Backend, Conn};
use crate::ddl::{self, ReadType};
use crate::error::{DbError, DbErrorKind, StorageError};
use crate::state::{first_changes, state_digest};
use crate::store::Store;

/// Recorded keys deleted per statement after digesting.
const CONSUME_CHUNK: usize = 256;

/// Splits `values`, rows of `width` values each, into the chunks of a multi-row statement: full
/// chunks of [`CONSUME_CHUNK`] rows, then, on MySQL, the rest by powers of two (300 rows: 256,
/// 32, 8, 4). A statement's text depends on its row count; on MySQL this keeps the texts to a few
/// that recur and stay in each connection's prepared-statement cache, because there each
/// eviction stalls the connection (`mysql.rs`). PostgreSQL closes an evicted statement in one
/// round trip and SQLite has no network, so they take the rest in one statement.
pub(crate) fn row_chunks<T>(
    values: &[T],
    width: usize,
    dialect: Dialect,
) -> impl Iterator<Item = &[T]> {
    split_rows(values, width, move |rows| {
        if rows >= CONSUME_CHUNK {
            CONSUME_CHUNK
        } else if dialect == Dialect::MySql {
            1 << rows.ilog2()
        } else {
            rows
        }
    })
}

/// Like [`row_chunks`], for statements where a row given twice acts once (`IN` lists, MySQL's
/// upserts): on MySQL and PostgreSQL the rest after the full chunks goes in one statement,
/// padded to a power of two by repeating its last row (300 rows: 256, then 44 padded to 64).
/// The same few texts as [`row_chunks`], in one round trip instead of one per set bit. On
/// PostgreSQL every new text is a statement prepared on each connection: padded, a lookup of
/// any length reuses one of nine instead of preparing one per length (no throughput change
/// measured; it keeps each connection's statement cache from churning).
pub(crate) fn padded_chunks<T>(
    values: &[T],
    width: usize,
    dialect: Dialect,
) -> impl Iterator<Item = Vec<&T>> {
    let width = width.max(1);
    split_rows(values, width, |rows| rows.min(CONSUME_CHUNK)).map(move |chunk| {
        let mut padded: Vec<&T> = chunk.iter().collect();
        if dialect != Dialect::Sqlite {
            let rows = chunk.len() / width;
            let last = &chunk[chunk.len() - width..];
            for _ in rows..rows.next_power_of_two() {
                padded.extend(last);
            }
        }
        padded
    })
}

/// Consecutive chunks of whole rows of `width` values, `take(rows left)` rows each.
fn split_rows<T>(
    values: &[T],
    width: usize,
    take: impl Fn(usize) -> usize,
) -> impl Iterator<Item = &[T]> {
    let width = width.max(1);
    debug_assert_eq!(values.len() % width, 0, "whole rows only");
    let mut rest = values;
    std::iter::from_fn(move || {
        let rows = rest.len() / width;
        if rows == 0 {
            return None;
        }
        let (chunk, tail) = rest.split_at(take(rows) * width);
        rest = tail;
        Some(chunk)
    })
}

/// The most block transactions a lane holds uncommitted: bounds what a retry or an abort runs
/// again, and the locks one database transaction holds.
pub(crate) const LANE_CAP: usize = 32;

/// A transaction ready to execute: its statements and their analysis.
#[derive(Debug, Clone)]
pub struct ExecTx {
    /// The statements with their parameters.
    pub transaction: Transaction,
    /// Read/write set and statement plans from the analyser.
    pub analysis: TxAnalysis,
}

/// A block ready to execute: `None` marks a transaction that validation or analysis rejected;
/// it keeps its slot (and a 0 in the success bitmap) but never touches the database.
#[derive(Debug, Clone)]
pub struct ExecBlock {
    /// The block number.
    pub number: BlockNumber,
    /// The transactions in block order.
    pub txs: Vec<Option<ExecTx>>,
    /// Ids of the block's validated transactions, recorded with the block so that a replay of
    /// one is recognized ([`Store::known_transactions`]).
    pub tx_ids: Vec<TxId>,
}

impl ExecBlock {
    /// Analyses valid transactions; those the analyser rejects become `None`, with the reason.
    pub fn analyze(
        number: BlockNumber,
        txs: Vec<Option<Transaction>>,
        analyzer: &Analyzer,
    ) -> (ExecBlock, Vec<(usize, AnalysisError)>) {
        let mut rejected = Vec::new();
        let txs = txs
            .into_iter()
            .enumerate()
            .map(|(i, tx)| {
                let tx = tx?;
                match analyzer.analyze(&tx) {
                    Ok(analysis) => Some(ExecTx {
                        transaction: tx,
                        analysis,
                    }),
                    Err(e) => {
                        rejected.push((i, e));
                        None
                    }
                }
            })
            .collect();
        (
            ExecBlock {
                number,
                txs,
                tx_ids: Vec::new(),
            },
            rejected,
        )
    }

    /// The dependency graph of the block's transactions.
    pub fn graph(&self) -> DependencyGraph {
        let sets: Vec<_> = self
            .txs
            .iter()
            .map(|t| t.as_ref().map(|t| &t.analysis.rwset))
            .collect();
        DependencyGraph::build(&sets)
    }
}

/// How to run a block.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ExecMode {
    /// Up to k transactions at once as the dependency graph allows (SQLite: serial anyway).
    Parallel(usize),
    /// One at a time in block order: the reference, and the benchmark baseline.
    Serial,
}

/// Why a transaction was flagged unsuccessful.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TxFailure {
    /// Index in the block.
    pub index: usize,
    /// The failing statement and the engine's message, or the guard that did not hold.
    pub reason: String,
}

/// The result of executing a block.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BlockOutcome {
    /// The block.
    pub block: BlockNumber,
    /// One flag per transaction: committed (true) or rolled back / not executed (false).
    pub success: Vec<bool>,
    /// Digest of the block's effects on the shared tables (`LedgerBlock::hash_digest`).
    pub digest: Digest,
    /// Digest of the shared tables' whole content after the block (`LedgerBlock::state_digest`).
    pub state: Digest,
    /// Keys whose change the digest covers.
    pub changed_rows: usize,
    /// Why transactions failed in this run (empty when the outcome was already stored).
    pub failures: Vec<TxFailure>,
    /// Transient errors retried in this run.
    pub retries: u64,
    /// Transactions found already committed by an earlier, interrupted run of the block.
    pub resumed: usize,
    /// Database commits that made the block's transactions durable (the digest's own commit
    /// not counted; zero when the outcome was already stored).
    pub commits: usize,
    /// Time spent running the transactions (zero when the outcome was already stored).
    pub execute_time: Duration,
    /// Time spent reading back, hashing and consuming the recorded changes.
    pub digest_time: Duration,
    /// Transactions the dependency graph ordered after every one before them and before every
    /// one after them, because their accesses cost more than their share of the graph's work
    /// budget (`chainify_sched::DependencyGraph::barriers`).
    pub barriers: Vec<usize>,
}

enum Failure {
    /// The transaction aborts deterministically (flagged unsuccessful). `touched`: whether it
    /// may have changed rows before it did: if not, the database transaction holding it has
    /// nothing of it to undo.
    Abort {
        reason: String,
        touched: bool,
    },
    Db(DbError),
}

/// Block `b` as the engines' BIGINT.
fn block_int(b: BlockNumber) -> Result<i64, StorageError> {
    i64::try_from(b.0).map_err(|_| StorageError::BadBlock {
        block: b,
        problem: "block numbers above 2^63-1 do not fit the engines' BIGINT".into(),
    })
}

fn block_param(b: BlockNumber) -> Result<Value, StorageError> {
    block_int(b).map(Value::Int)
}

fn index_param(i: usize) -> Value {
    Value::Int(i64::try_from(i).unwrap_or(i64::MAX))
}

/// Per-block state shared by the transactions running in parallel.
struct Run<'a, B: Backend> {
    store: &'a Store<B>,
    block: &'a ExecBlock,
    block_value: Value,
    /// The block's number as the engines' BIGINT.
    block_literal: i64,
    /// Outcomes of transactions an earlier run already committed.
    prior: Vec<Option<bool>>,
    success: Mutex<Vec<bool>>,
    failures: Mutex<Vec<TxFailure>>,
    retries: AtomicU64,
    /// Database commits that made block transactions durable.
    commits: AtomicU64,
    /// Set once the block has failed: steps still in flight stop retrying.
    failed: AtomicBool,
    /// The statement that records a committed (or aborted) transaction.
    marker: String,
    /// Connections kept for the block's duration: taking one from the pool costs a liveness
    /// round trip, which would otherwise be paid per transaction.
    idle: Mutex<Vec<B::Conn>>,
}

/// A lane: its connection, and the block transactions its open database transaction holds, in
/// the order they ran, with their outcome.
struct Lane<C> {
    conn: Option<C>,
    open: bool,
    held: Vec<(usize, bool)>,
}

impl<B: Backend> Run<'_, B> {
    async fn connection(&self, during: &str) -> Result<B::Conn, StorageError> {
        let kept = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match kept {
            Some(conn) => Ok(conn),
            None => self.store.acquire(during).await,
        }
    }

    fn keep(&self, conn: B::Conn) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(conn);
    }

    fn record(&self, index: usize, ok: bool, reason: Option<String>) {
        self.success.lock().unwrap_or_else(|e| e.into_inner())[index] = ok;
        if let Some(reason) = reason {
            self.failures
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(TxFailure { index, reason });
        }
    }

    /// Runs transaction `index` in its own database transaction, retrying transient errors.
    async fn run_committing(&self, index: usize) -> Result<(), StorageError> {
        if let Some(ok) = self.prior[index] {
            self.record(index, ok, None);
            return Ok(());
        }
        let Some(tx) = &self.block.txs[index] else {
            self.record(index, false, None);
            return Ok(());
        };
        let store = self.store;
        let during = format!("executing block {} transaction {index}", self.block.number);
        let marker = &self.marker;
        let idx = index_param(index);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut conn = self.connection(&during).await?;
            let verdict: Result<Option<String>, DbError> = async {
                conn.begin().await?;
                match store.run_statements(&mut conn, tx).await {
                    Ok(()) => {
                        // Apart from the COMMIT: only its error may be the transaction's (a
                        // deferred constraint), not the marker's.
                        conn.execute(marker, &[&self.block_value, &idx, &Value::Int(1)], false)
                            .await?;
                        match conn.commit().await {
                            Ok(()) => Ok(None),
                            // A deferred constraint failing at commit is a statement error.
                            Err(e) if e.kind == DbErrorKind::Statement => {
                                Ok(Some(format!("commit: {e}")))
                            }
                            Err(e) => Err(e),
                        }
                    }
                    Err(Failure::Abort { reason, .. }) => Ok(Some(reason)),
                    Err(Failure::Db(e)) => Err(e),
                }
            }
            .await;
            match verdict {
                Ok(None) => {
                    self.commits.fetch_add(1, Ordering::Relaxed);
                    self.keep(conn);
                    self.record(index, true, None);
                    return Ok(());
                }
                Ok(Some(reason)) => {
                    store.db(conn.rollback().await, &during)?;
                    store.db(
                        conn.execute(marker, &[&self.block_value, &idx, &Value::Int(0)], false)
                            .await,
                        &during,
                    )?;
                    self.commits.fetch_add(1, Ordering::Relaxed);
                    self.keep(conn);
                    self.record(index, false, Some(reason));
                    return Ok(());
                }
                Err(e) => {
                    let _ = conn.rollback().await;
                    drop(conn);
                    self.transient_or_fail(e, attempt, &format!("transaction {index}"), &during)
                        .await?;
                }
            }
        }
    }
}

impl<B: Backend> TxExecutor for Run<'_, B> {
    type Error = StorageError;

    fn execute(
        &self,
        index: usize,
    ) -> impl std::future::Future<Output = Result<(), StorageError>> + Send {
        self.run_committing(index)
    }
}

impl<B: Backend> Run<'_, B> {
    /// Runs the block on `k` lanes as [`LanePlan`] says.
    async fn run_lanes(&self, graph: &DependencyGraph, k: usize) -> Result<(), StorageError> {
        let len = self.block.txs.len();
        let mut no_work = vec![false; len];
        for (index, slot) in no_work.iter_mut().enumerate() {
            if let Some(ok) = self.prior[index] {
                self.record(index, ok, None);
                *slot = true;
            } else if self.block.txs[index].is_none() {
                self.record(index, false, None);
                *slot = true;
            }
        }
        let mut plan = LanePlan::new(graph, k, LANE_CAP, &no_work);
        let mut lanes: Vec<Option<Lane<B::Conn>>> = (0..k.max(1))
            .map(|_| {
                Some(Lane {
                    conn: None,
                    open: false,
                    held: Vec::new(),
                })
            })
            .collect();
        let mut running = FuturesUnordered::new();
        let mut failure = None;
        loop {
            if failure.is_none() {
                for step in plan.steps() {
                    let (Step::Run { lane: at, .. } | Step::Commit { lane: at }) = step;
                    let Some(mut lane) = lanes[at].take() else {
                        failure = Some(self.broken("two steps on one lane"));
                        break;
                    };
                    running.push(async move {
                        let result = match step {
                            Step::Run { tx, .. } => self.lane_run(&mut lane, tx).await,
                            Step::Commit { .. } => self.lane_commit(&mut lane).await,
                        };
                        (step, lane, result)
                    });
                }
            }
            let Some((step, lane, result)) = running.next().await else {
                break;
            };
            let (Step::Run { lane: at, .. } | Step::Commit { lane: at }) = step;
            lanes[at] = Some(lane);
            match (result, step) {
                (Ok(()), Step::Run { lane, tx }) => plan.ran(lane, tx),
                (Ok(()), Step::Commit { lane }) => plan.committed(lane),
                (Err(e), _) => {
                    // Steps in flight stop retrying; open lanes close their connections when
                    // dropped, and the engine rolls them back.
                    self.failed.store(true, Ordering::Relaxed);
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None if plan.is_finished() => Ok(()),
            None => Err(self.broken("the lane plan stopped before the block was done")),
        }
    }

    fn broken(&self, problem: &str) -> StorageError {
        StorageError::BadBlock {
            block: self.block.number,
            problem: format!("executing on lanes: {problem}"),
        }
    }

    /// Rolls the lane's database transaction back; a connection that cannot roll back is
    /// dropped (closed, so the engine rolls it back) rather than reused: a BEGIN on it could
    /// commit what it held.
    async fn lane_rollback(&self, lane: &mut Lane<B::Conn>) {
        if let Some(conn) = lane.conn.as_mut()
            && conn.rollback().await.is_err()
        {
            lane.conn = None;
        }
        lane.open = false;
    }

    /// Opens the lane's database transaction and runs again the transactions it held that
    /// succeeded (after a rollback). `attempt` counts the caller's tries.
    async fn lane_reopen(
        &self,
        lane: &mut Lane<B::Conn>,
        attempt: &mut u32,
        during: &str,
    ) -> Result<(), StorageError> {
        loop {
            if lane.conn.is_none() {
                lane.conn = Some(self.connection(during).await?);
            }
            let conn = lane.conn.as_mut().expect("just taken");
            let mut result = conn.begin().await;
            lane.open = result.is_ok();
            if result.is_ok() {
                for &(index, ok) in &lane.held {
                    let Some(tx) = self.block.txs[index].as_ref().filter(|_| ok) else {
                        continue;
                    };
                    match self.store.run_statements(conn, tx).await {
                        Ok(()) => {}
                        // It succeeded on the same state before: the engine is not behaving
                        // deterministically, and no outcome of this block can be trusted.
                        Err(Failure::Abort { reason, .. }) => {
                            return Err(self.broken(&format!(
                                "transaction {index} succeeded, then failed when run again on the same state: {reason}"
                            )));
                        }
                        Err(Failure::Db(e)) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
            }
            match result {
                Ok(()) => return Ok(()),
                Err(e) => {
                    self.lane_rollback(lane).await;
                    *attempt += 1;
                    self.transient_or_fail(e, *attempt, "a lane's transactions", during)
                        .await?;
                }
            }
        }
    }

    /// Retries a transient error after a backoff (Ok), or fails with it; once the block has
    /// failed, nothing is retried.
    async fn transient_or_fail(
        &self,
        e: DbError,
        attempt: u32,
        what: &str,
        during: &str,
    ) -> Result<(), StorageError> {
        let failed = self.failed.load(Ordering::Relaxed);
        match e.kind {
            DbErrorKind::Transient if attempt < self.store.options.max_attempts && !failed => {
                self.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(backoff(attempt)).await;
                Ok(())
            }
            DbErrorKind::Transient => Err(StorageError::RetriesExhausted {
                block: self.block.number,
                what: what.to_owned(),
                attempts: attempt,
                last: e,
            }),
            _ => self.store.db(Err(e), during),
        }
    }

    /// Runs transaction `index` inside the lane's database transaction. An abort that changed a
    /// row rolls the lane back and commits what it held right away, so one abort costs at most
    /// one replay of the lane (a stream of aborting transactions cannot make the organization
    /// run each good one many times); one that changed none leaves the lane as it is.
    async fn lane_run(&self, lane: &mut Lane<B::Conn>, index: usize) -> Result<(), StorageError> {
        let Some(tx) = &self.block.txs[index] else {
            return Err(self.broken("a transaction without work was given a lane"));
        };
        let during = format!("executing block {} transaction {index}", self.block.number);
        let mut attempt = 1;
        loop {
            if !lane.open {
                self.lane_reopen(lane, &mut attempt, &during).await?;
            }
            let conn = lane.conn.as_mut().expect("an open lane has a connection");
            match self.store.run_statements(conn, tx).await {
                Ok(()) => {
                    lane.held.push((index, true));
                    self.record(index, true, None);
                    return Ok(());
                }
                // It changed nothing: the lane goes on, with nothing to undo or run again.
                Err(Failure::Abort {
                    reason,
                    touched: false,
                }) => {
                    lane.held.push((index, false));
                    self.record(index, false, Some(reason));
                    return Ok(());
                }
                // Undo this transaction: the whole database transaction goes (PostgreSQL
                // refuses anything after an error), and what the lane held runs again.
                Err(Failure::Abort {
                    reason,
                    touched: true,
                }) => {
                    self.lane_rollback(lane).await;
                    lane.held.push((index, false));
                    self.record(index, false, Some(reason));
                    return self.lane_commit(lane).await;
                }
                Err(Failure::Db(e)) => {
                    self.lane_rollback(lane).await;
                    self.transient_or_fail(e, attempt, &format!("transaction {index}"), &during)
                        .await?;
                    attempt += 1;
                }
            }
        }
    }

    /// Commits what the lane holds, with a marker row for each of its transactions.
    async fn lane_commit(&self, lane: &mut Lane<B::Conn>) -> Result<(), StorageError> {
        if lane.held.is_empty() {
            return Ok(());
        }
        let during = format!("committing a lane of block {}", self.block.number);
        let mut attempt = 1;
        loop {
            if !lane.open {
                self.lane_reopen(lane, &mut attempt, &during).await?;
            }
            let conn = lane.conn.as_mut().expect("an open lane has a connection");
            // The markers go with the COMMIT: one round trip.
            let markers = ddl::markers_literal(self.block_literal, &lane.held);
            match conn.commit_after(&markers).await {
                Ok(()) => {
                    self.commits.fetch_add(1, Ordering::Relaxed);
                    lane.open = false;
                    lane.held.clear();
                    return Ok(());
                }
                // A constraint checked at commit (registration refuses deferrable ones, so
                // only an engine's own surprise): which transaction broke it is only known by
                // running them again one by one in their order, each committing as the serial
                // path does.
                Err(e) if e.kind == DbErrorKind::Statement => {
                    self.lane_rollback(lane).await;
                    let held = std::mem::take(&mut lane.held);
                    if let Some(conn) = lane.conn.take() {
                        self.keep(conn);
                    }
                    // Their outcomes are decided again: a failure recorded in the lane would
                    // otherwise be listed twice.
                    self.failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .retain(|f| !held.iter().any(|&(index, _)| index == f.index));
                    for (index, _) in held {
                        self.run_committing(index).await?;
                    }
                    return Ok(());
                }
                Err(e) => {
                    self.lane_rollback(lane).await;
                    self.transient_or_fail(e, attempt, "a lane's commit", &during)
                        .await?;
                    attempt += 1;
                }
            }
        }
    }
}

/// 1, 2, 4 … 64 ms: transient conflicts clear quickly once the other transaction commits.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(1 << attempt.min(6))
}

impl<B: Backend> Store<B> {
    /// Executes `block` and digests its effects. The block must follow the last applied block
    /// (any number for the first). Running a block that is already applied returns the stored
    /// outcome; running a block whose earlier run failed half-way resumes it.
    pub async fn execute_block(
        &self,
        block: &ExecBlock,
        mode: ExecMode,
    ) -> Result<BlockOutcome, StorageError> {
        self.off_runtime(async {
            let number = block.number;
            let block_value = block_param(number)?;
            // One cheap query on the usual path, the block after the newest applied row; any
            // other block is judged by the blocks with accumulators (a row without them can
            // only have been planted). A block at or below the last applied one is either
            // applied (run again after a crash: its stored outcome) or out of order.
            let mut last = self.newest_applied_row().await?;
            if last.is_some_and(|l| number.0 != l.0 + 1) {
                last = self.last_applied_block().await?;
            }
            if let Some(last) = last
                && number <= last
                && let Some(done) = self.applied_outcome(number).await?
            {
                return Ok(done);
            }
            if let Some(last) = last
                && number.0 != last.0 + 1
            {
                // The node runs the blocks after its ledger in order: the record of applied
                // blocks was changed behind chainify (a planted or deleted row, an old backup).
                return Err(StorageError::Damaged {
                    block: number,
                    problem: format!(
                        "the last applied block is {last}; blocks must be applied in order"
                    ),
                });
            }
            if !self.backend.concurrent_writers() {
                return self.execute_in_one_transaction(block).await;
            }
            let p = |n| ddl::placeholder(self.backend.dialect(), n);
            let mut prior = vec![None; block.txs.len()];
            let found = self
                .query(
                    "reading the transactions of an interrupted block",
                    &format!(
                        "SELECT tx_index, success FROM chainify_applied_txs WHERE block = {}",
                        p(1)
                    ),
                    &[&block_value],
                    &[ReadType::Int, ReadType::Int],
                )
                .await?;
            // Any marker of this block number, even one no transaction of this block claims, is
            // cleared with the digest.
            let stale = !found.is_empty();
            for row in found {
                if let (Value::Int(i), Value::Int(s)) = (&row[0], &row[1])
                    && let Some(slot) = usize::try_from(*i).ok().and_then(|i| prior.get_mut(i))
                {
                    *slot = Some(*s != 0);
                }
            }
            let resumed = prior.iter().filter(|p| p.is_some()).count();
            let started = Instant::now();
            let run = Run {
                store: self,
                block,
                block_value,
                block_literal: block_int(number)?,
                prior,
                success: Mutex::new(vec![false; block.txs.len()]),
                failures: Mutex::new(Vec::new()),
                retries: AtomicU64::new(0),
                commits: AtomicU64::new(0),
                failed: AtomicBool::new(false),
                marker: ddl::insert_markers(self.backend.dialect(), 1),
                idle: Mutex::new(Vec::new()),
            };
            let mut barriers = Vec::new();
            match mode {
                ExecMode::Parallel(k) => {
                    let graph = block.graph();
                    barriers = graph.barriers().to_vec();
                    run.run_lanes(&graph, k).await?
                }
                // The reference: block order, a database commit per transaction.
                ExecMode::Serial => run_serial(block.txs.len(), &run).await?,
            }
            let commits =
                usize::try_from(run.commits.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
            let success = run.success.into_inner().unwrap_or_else(|e| e.into_inner());
            let mut failures = run.failures.into_inner().unwrap_or_else(|e| e.into_inner());
            failures.sort_by_key(|f| f.index);
            let execute_time = started.elapsed();
            let started = Instant::now();
            let during = format!("digesting block {number}");
            let mut conn = self.acquire(&during).await?;
            // Every marker is written by a commit counted here, or was there before (`stale`).
            let markers = commits > 0 || stale;
            let digested = self
                .finalize_and_commit(&mut conn, true, number, &success, &block.tx_ids, markers)
                .await;
            let (digest, state, changed_rows) = match digested {
                Ok(d) => d,
                Err(e) => {
                    let _ = conn.rollback().await;
                    return Err(e);
                }
            };
            Ok(BlockOutcome {
                block: number,
                success,
                digest,
                state,
                changed_rows,
                failures,
                retries: run.retries.into_inner(),
                resumed,
                commits,
                execute_time,
                digest_time: started.elapsed(),
                barriers,
            })
        })
        .await
    }

    /// SQLite: the whole block in one database transaction, a savepoint per transaction.
    async fn execute_in_one_transaction(
        &self,
        block: &ExecBlock,
    ) -> Result<BlockOutcome, StorageError> {
        let number = block.number;
        let during = format!("executing block {number}");
        let mut conn = self.acquire(&during).await?;
        let mut retries = 0;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match conn.begin().await {
                Ok(()) => break,
                Err(e)
                    if e.kind == DbErrorKind::Transient && attempt < self.options.max_attempts =>
                {
                    retries += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(e) if e.kind == DbErrorKind::Transient => {
                    return Err(StorageError::RetriesExhausted {
                        block: number,
                        what: "database transaction".into(),
                        attempts: attempt,
                        last: e,
                    });
                }
                Err(e) => return self.db(Err(e), &during),
            }
        }
        let started = Instant::now();
        let result = async {
            let mut success = vec![false; block.txs.len()];
            let mut failures = Vec::new();
            // A transaction's savepoint is released with the next one's opening: one round
            // trip per transaction instead of two.
            let mut unreleased = false;
            for (index, tx) in block.txs.iter().enumerate() {
                let Some(tx) = tx else { continue };
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    let open = if std::mem::take(&mut unreleased) {
                        "RELEASE chainify_tx; SAVEPOINT chainify_tx"
                    } else {
                        "SAVEPOINT chainify_tx"
                    };
                    self.db(conn.batch(open).await, &during)?;
                    match self.run_statements(&mut conn, tx).await {
                        Ok(()) => {
                            unreleased = true;
                            success[index] = true;
                            break;
                        }
                        Err(failure) => {
                            self.db(
                                conn.batch("ROLLBACK TO chainify_tx; RELEASE chainify_tx")
                                    .await,
                                &during,
                            )?;
                            match failure {
                                Failure::Abort { reason, .. } => {
                                    failures.push(TxFailure { index, reason });
                                    break;
                                }
                                Failure::Db(e)
                                    if e.kind == DbErrorKind::Transient
                                        && attempt < self.options.max_attempts =>
                                {
                                    retries += 1;
                                    tokio::time::sleep(backoff(attempt)).await;
                                }
                                Failure::Db(e) if e.kind == DbErrorKind::Transient => {
                                    return Err(StorageError::RetriesExhausted {
                                        block: number,
                                        what: format!("transaction {index}"),
                                        attempts: attempt,
                                        last: e,
                                    });
                                }
                                Failure::Db(e) => return self.db(Err(e), &during),
                            }
                        }
                    }
                }
            }
            if unreleased {
                self.db(conn.batch("RELEASE chainify_tx").await, &during)?;
            }
            let execute_time = started.elapsed();
            let digest_started = Instant::now();
            let (digest, state, changed_rows) = self
                .finalize_and_commit(&mut conn, false, number, &success, &block.tx_ids, false)
                .await?;
            Ok(BlockOutcome {
                block: number,
                success,
                digest,
                state,
                changed_rows,
                failures,
                retries,
                resumed: 0,
                commits: 1,
                execute_time,
                digest_time: digest_started.elapsed(),
                barriers: Vec::new(),
            })
        }
        .await;
        if result.is_err() {
            let _ = conn.rollback().await;
        }
        result
    }

    /// Runs a transaction's statements on `conn` inside an open database transaction.
    async fn run_statements(&self, conn: &mut B::Conn, tx: &ExecTx) -> Result<(), Failure> {
        let statements = &tx.transaction.statements;
        let analysis = &tx.analysis;
        // Whether a statement so far may have changed something. A write that matched no row
        // changes nothing: shared tables carry no trigger but chainify's row triggers, which
        // fire on the rows a statement matches, and every engine reports matched rows (sqlx
        // asks MySQL for them with CLIENT_FOUND_ROWS; counting changed rows instead, an UPDATE
        // setting a value onto itself would report 0 while MariaDB's trigger still records the
        // row). A SELECT never changes anything (WITH is refused, so none hides a write).
        let mut touched = false;
        for (i, ((st, plan), typed)) in statements
            .iter()
            .zip(&analysis.plans)
            .zip(&analysis.typed)
            .enumerate()
        {
            let n = i + 1;
            let rendered = typed.rendered(self.backend.dialect());
            let mut params = Vec::with_capacity(rendered.bind_order.len());
            for &p in &rendered.bind_order {
                params.push(st.params.get(p).ok_or_else(|| Failure::Abort {
                    reason: format!(
                        "statement {n}: uses ${} but has {} parameters",
                        p + 1,
                        st.params.len()
                    ),
                    touched,
                })?);
            }
            let select = plan.kind == StatementKind::Select;
            let rows = conn
                .execute(&rendered.sql, &params, select)
                .await
                .map_err(|e| match e.kind {
                    // Part of the statement may have been applied (and PostgreSQL refuses
                    // anything more in this database transaction).
                    DbErrorKind::Statement => Failure::Abort {
                        reason: format!("statement {n}: {e}"),
                        touched: true,
                    },
                    _ => Failure::Db(e),
                })?;
            touched |= !select && rows > 0;
            if select && rows > chainify_sql::MAX_QUERY_ROWS as u64 {
                return Err(Failure::Abort {
                    reason: format!(
                        "statement {n}: returns more than {} rows",
                        chainify_sql::MAX_QUERY_ROWS
                    ),
                    touched,
                });
            }
            if let Some(expected) = st.expect_rows
                && rows != expected
            {
                return Err(Failure::Abort {
                    reason: format!("statement {n}: expected {expected} rows, got {rows}"),
                    touched,
                });
            }
        }
        Ok(())
    }

    /// Records `block` as applied with its hash digest and outcome (`chainify_applied_blocks`).
    pub(crate) async fn record_applied(
        &self,
        conn: &mut B::Conn,
        block: BlockNumber,
        digest: &Digest,
        success: &[bool],
        during: &str,
    ) -> Result<(), StorageError> {
        self.insert_row(
            conn,
            "chainify_applied_blocks (block, digest, success, tx_count)",
            &[
                &block_param(block)?,
                &Value::Bytes(digest.as_bytes().to_vec()),
                &Value::Bytes(pack_bits(success)),
                &index_param(success.len()),
            ],
            during,
        )
        .await
    }

    /// Records the ids of `block`'s transactions that passed validation, against replays
    /// (`chainify_tx_index`).
    pub(crate) async fn index_transactions(
        &self,
        conn: &mut B::Conn,
        block: BlockNumber,
        ids: &[Digest],
        during: &str,
    ) -> Result<(), StorageError> {
        let p = |n| ddl::placeholder(self.backend.dialect(), n);
        let block_value = block_param(block)?;
        for chunk in row_chunks(ids, 1, self.backend.dialect()) {
            let rows: Vec<String> = (0..chunk.len())
                .map(|i| format!("({}, {})", p(2 * i + 1), p(2 * i + 2)))
                .collect();
            let values: Vec<Value> = chunk
                .iter()
                .flat_map(|id| [Value::Bytes(id.as_bytes().to_vec()), block_value.clone()])
                .collect();
            let params: Vec<&Value> = values.iter().collect();
            self.db(
                conn.execute(
                    &format!(
                        "INSERT INTO chainify_tx_index (tx_id, block) VALUES {}",
                        rows.join(", ")
                    ),
                    &params,
                    false,
                )
                .await,
                during,
            )?;
        }
        Ok(())
    }

    /// The digest of block `number`, in a database transaction of its own (`begin`, opened by
    /// [`ddl::begin_digest`]) or the block's own (SQLite): reads the accumulators and every
    /// recorded change with the row's current image, in one round trip with the opening, and
    /// hashes them; then, in one more, consumes the records, marks the block applied (clearing
    /// its per-transaction markers when it may have any) and commits. On an error the
    /// transaction is still open, to be rolled back.
    async fn finalize_and_commit(
        &self,
        conn: &mut B::Conn,
        begin: bool,
        number: BlockNumber,
        success: &[bool],
        tx_ids: &[TxId],
        markers: bool,
    ) -> Result<(Digest, Digest, usize), StorageError> {
        let dialect = self.backend.dialect();
        let during = format!("digesting block {number}");
        let block = block_int(number)?;
        let tables = self.tables();
        let mut reads = vec![(
            crate::state::states_query(&format!(" WHERE block < {block}")),
            crate::state::STATE_TYPES.to_vec(),
        )];
        reads.extend(tables.values().map(|t| ddl::read_changes(dialect, t)));
        let reads: Vec<(&str, &[ReadType])> = reads
            .iter()
            .map(|(sql, types)| (sql.as_str(), types.as_slice()))
            .collect();
        let mut rows = if begin {
            let opening = ddl::begin_digest(dialect, tables.keys().map(String::as_str));
            let opening: Vec<&str> = opening.iter().map(String::as_str).collect();
            self.db(conn.begin_with(&opening, &reads).await, &during)?
        } else {
            self.db(conn.query_many(&reads).await, &during)?
        }
        .into_iter();
        let (_, mut states) = self.parse_states(Some(number), rows.next().unwrap_or_default())?;
        let mut effects = Vec::new();
        let mut changed = Vec::new();
        for (t, rows) in tables.values().zip(rows) {
            if rows.is_empty() {
                continue;
            }
            let state = states.entry(t.name.clone()).or_default();
            for (key, (before, image)) in first_changes(t, rows) {
                // The state digest: the row as it was leaves, the row as it is enters.
                if before != image {
                    if let Some(before) = &before {
                        state.remove(&RowHash::of(&t.name, before));
                    }
                    if let Some(image) = &image {
                        state.add(&RowHash::of(&t.name, image));
                    }
                }
                effects.push(RowEffect {
                    table: t.name.clone(),
                    key,
                    image,
                });
            }
            changed.push(t);
        }
        let digest = block_digest(&effects);
        let success_bits = pack_bits(success);
        let writes = ddl::digest_writes(
            dialect,
            &ddl::DigestWrites {
                block,
                changed,
                states: states
                    .iter()
                    .map(|(t, s)| (t.as_str(), s.to_bytes()))
                    .collect(),
                forget_states_below: crate::state::forget_states_below(block),
                digest: digest.as_bytes(),
                success: &success_bits,
                tx_count: i64::try_from(success.len()).unwrap_or(i64::MAX),
                tx_ids: tx_ids.iter().map(|id| id.0.as_bytes().as_slice()).collect(),
                markers,
            },
        );
        if ddl::binds_digest_writes(dialect) {
            for w in &writes {
                let params: Vec<&Value> = w.params.iter().collect();
                self.db(conn.execute(&w.sql, &params, false).await, &during)?;
            }
            self.db(conn.commit().await, &during)?;
        } else {
            let text: Vec<&str> = writes.iter().map(|w| w.sql.as_str()).collect();
            self.db(conn.commit_after(&text.join("; ")).await, &during)?;
        }
        Ok((digest, state_digest(&states), effects.len()))
    }

    /// The stored outcome of an applied block.
    pub async fn applied_outcome(
        &self,
        number: BlockNumber,
    ) -> Result<Option<BlockOutcome>, StorageError> {
        let block_value = block_param(number)?;
        let rows = self
            .query(
                "reading an applied block",
                &format!(
                    "SELECT digest, success, tx_count FROM chainify_applied_blocks WHERE block = {}",
                    ddl::placeholder(self.backend.dialect(), 1)
                ),
                &[&block_value],
                &[ReadType::Bytes, ReadType::Bytes, ReadType::Int],
            )
            .await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let corrupt = |what: &str| StorageError::Damaged {
            block: number,
            problem: format!("chainify_applied_blocks holds a malformed {what}"),
        };
        let (Value::Bytes(d), Value::Bytes(bits), Value::Int(count)) = (&row[0], &row[1], &row[2])
        else {
            return Err(corrupt("row"));
        };
        let digest = Digest::try_from(d.as_slice()).map_err(|_| corrupt("digest"))?;
        let count = usize::try_from(*count).map_err(|_| corrupt("count"))?;
        let success = unpack_bits(bits, count).ok_or_else(|| corrupt("success bitmap"))?;
        let state = self.state_digest_at(number).await?;
        Ok(Some(BlockOutcome {
            block: number,
            success,
            digest,
            state,
            changed_rows: 0,
            failures: Vec::new(),
            retries: 0,
            resumed: 0,
            commits: 0,
            execute_time: Duration::ZERO,
            digest_time: Duration::ZERO,
            barriers: Vec::new(),
        }))
    }

    /// Which of `ids` belong to applied blocks before `before`. (A block that is executed again
    /// after a crash finds its own transactions indexed; they are not replays of themselves.)
    pub async fn known_transactions(
        &self,
        before: BlockNumber,
        ids: &[TxId],
    ) -> Result<std::collections::BTreeSet<TxId>, StorageError> {
        let mut known = std::collections::BTreeSet::new();
        let limit = Value::Int(i64::try_from(before.0).unwrap_or(i64::MAX));
        let values: Vec<Value> = ids
            .iter()
            .map(|id| Value::Bytes(id.0.as_bytes().to_vec()))
            .collect();
        for chunk in padded_chunks(&values, 1, self.backend.dialect()) {
            let list: Vec<String> = (2..=chunk.len() + 1)
                .map(|n| ddl::placeholder(self.backend.dialect(), n))
                .collect();
            let params: Vec<&Value> = std::iter::once(&limit).chain(chunk).collect();
            let rows = self
                .query(
                    "looking up transaction ids",
                    &format!(
                        "SELECT tx_id FROM chainify_tx_index WHERE block < {} AND tx_id IN ({})",
                        ddl::placeholder(self.backend.dialect(), 1),
                        list.join(", ")
                    ),
                    &params,
                    &[ReadType::Bytes],
                )
                .await?;
            for row in rows {
                if let Some(Value::Bytes(b)) = row.first()
                    && let Ok(d) = Digest::try_from(b.as_slice())
                {
                    known.insert(TxId(d));
                }
            }
        }
        Ok(known)
    }

    /// The highest applied block, if any ([`crate::state::NEWEST_APPLIED`]).
    pub async fn last_applied_block(&self) -> Result<Option<BlockNumber>, StorageError> {
        // Without shared tables no block has accumulators (found by a review).
        if self.tables().is_empty() {
            return self.newest_applied_row().await;
        }
        self.applied_block(crate::state::NEWEST_APPLIED).await
    }

    /// The newest row of `chainify_applied_blocks`, planted or not.
    async fn newest_applied_row(&self) -> Result<Option<BlockNumber>, StorageError> {
        self.applied_block("SELECT MAX(block) FROM chainify_applied_blocks")
            .await
    }

    /// The block the one-value query `sql` names.
    async fn applied_block(&self, sql: &str) -> Result<Option<BlockNumber>, StorageError> {
        let rows = self
            .query("reading the last applied block", sql, &[], &[ReadType::Int])
            .await?;
        Ok(match rows.first().and_then(|r| r.first()) {
            Some(Value::Int(b)) => u64::try_from(*b).ok().map(BlockNumber),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_chunks_give_every_row_and_repeat_only_a_chunks_last_row() {
        for dialect in [Dialect::MySql, Dialect::Postgres, Dialect::Sqlite] {
            for width in [1, 2, 3] {
                for rows in 0..=3 * CONSUME_CHUNK + 7 {
                    let values: Vec<usize> = (0..rows * width).collect();
                    let chunks: Vec<Vec<&usize>> = padded_chunks(&values, width, dialect).collect();
                    assert_eq!(chunks.len(), rows.div_ceil(CONSUME_CHUNK), "{rows} rows");
                    let mut given = Vec::new();
                    for chunk in &chunks {
                        assert_eq!(chunk.len() % width, 0);
                        let n = chunk.len() / width;
                        assert!(n > 0 && n <= CONSUME_CHUNK, "{n} rows");
                        let mut real: Vec<usize> = Vec::new();
                        for row in chunk.chunks(width) {
                            let row: Vec<usize> = row.iter().map(|v| **v).collect();
                            // Rows are whole rows of the input, in order; a repeat is the last.
                            assert_eq!(row[0] % width, 0);
                            assert_eq!(row, (row[0]..row[0] + width).collect::<Vec<_>>());
                            if real.last().is_some_and(|l| *l >= row[0]) {
                                assert_eq!(*real.last().unwrap(), row[0], "only the last repeats");
                            } else {
                                real.push(row[0]);
                            }
                        }
                        if dialect == Dialect::Sqlite {
                            assert_eq!(n, real.len(), "no padding on SQLite");
                        } else {
                            assert_eq!(n, real.len().next_power_of_two(), "padded no further");
                        }
                        // Repeats come only after the chunk's last distinct row.
                        let last = *real.last().unwrap();
                        assert!(
                            chunk[real.len() * width..]
                                .iter()
                                .all(|v| **v / width * width == last)
                        );
                        given.extend(real);
                    }
                    let starts: Vec<usize> = (0..rows).map(|r| r * width).collect();
                    assert_eq!(given, starts, "{rows} rows of {width}: each once, in order");
                }
            }
        }
    }

    #[test]
    fn row_chunks_cover_every_row_once_in_few_recurring_sizes() {
        for dialect in [Dialect::MySql, Dialect::Postgres, Dialect::Sqlite] {
            for width in [1, 2, 3] {
                for rows in 0..=3 * CONSUME_CHUNK + 7 {
                    let values: Vec<usize> = (0..rows * width).collect();
                    let chunks: Vec<&[usize]> = row_chunks(&values, width, dialect).collect();
                    assert_eq!(chunks.concat(), values, "{rows} rows of {width}");
                    let rest = rows % CONSUME_CHUNK;
                    for chunk in &chunks {
                        let n = chunk.len() / width;
                        assert_eq!(chunk.len() % width, 0);
                        assert!(n <= CONSUME_CHUNK && n > 0);
                        if dialect == Dialect::MySql {
                            assert!(n.is_power_of_two(), "{n} rows");
                        }
                    }
                    // Beyond the full chunks: one statement per set bit of the rest on MySQL,
                    // one statement elsewhere.
                    let tail = if dialect == Dialect::MySql {
                        rest.count_ones() as usize
                    } else {
                        usize::from(rest > 0)
                    };
                    assert_eq!(chunks.len(), rows / CONSUME_CHUNK + tail);
                }
            }
        }
        assert_eq!(
            padded_chunks(&[0u8; 300], 1, Dialect::MySql)
                .map(|c| c.len())
                .collect::<Vec<_>>(),
            vec![256, 64]
        );
        assert_eq!(
            row_chunks(&[0u8; 300], 1, Dialect::MySql)
                .map(<[u8]>::len)
                .collect::<Vec<_>>(),
            vec![256, 32, 8, 4]
        );
    }
}
