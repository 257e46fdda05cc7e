//! What one client's SELECT costs an organization's memory (THREATS.md: a client must not
//! "crash, stall or exhaust a process").
//!
//! 1. A SELECT inside a transaction is run only to count its rows. Its outputs may be any
//!    portable expression (REPLACE up to 4 MiB each, a TEXT column up to 1 MiB), as many as
//!    make a row of at most `MAX_ROW_BYTES` (16 MiB), over up to 10 001 rows: counted while
//!    they arrive, one row is held at a time, so an organization's memory does not grow with
//!    the rows (before, PostgreSQL and MariaDB held every row at once: 837 MiB for 400 rows of
//!    ~2 MiB, ~21 GB for 10 000).
//! 2. A client query's answer is read one row at a time and counted in bytes; past
//!    `MAX_ANSWER_BYTES` it is refused, holding at most that and one row.
//!
//! Each test measures how far the process's resident set rises at its peak while the engine
//! answers (VmHWM after resetting it through /proc/self/clear_refs), in a process of its own
//! ([`in_own_process`]): memory an earlier test freed stays with the allocator and would hide
//! a later test's peak.

use std::future::Future;
use std::time::Duration;

use chainify_core::tx::{Statement, Transaction};
use chainify_core::{BlockNumber, Value};
use chainify_sql::Analyzer;
use chainify_storage::{
    Backend, ExecBlock, ExecMode, MAX_ANSWER_BYTES, StorageError, Store, StoreOptions,
};
use chainify_testkit::conformance::storage::{Fixture, setup};
use chainify_testkit::engines::{MySqlFixture, PgFixture, SqliteFixture};

/// Set in the process a test runs in by itself.
const ALONE: &str = "CHAINIFY_MEMORY_TEST_ALONE";

/// Runs `body` in a process of its own: this test binary again, asked for `test` alone (the
/// process that does so waits for it and fails when it fails).
fn in_own_process(test: &str, body: impl Future<Output = ()>) {
    if std::env::var_os(ALONE).is_some() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(body);
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE, "1")
        .output()
        .expect("the test in a process of its own");
    eprint!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{test}, run alone: {}", out.status);
}

/// A field of /proc/self/status in bytes.
fn status(field: &str) -> usize {
    let text = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .expect("the field")
        * 1024
}

/// Runs `f` and returns its result with how far the resident set rose above its start at its
/// peak (the peak is reset first through /proc/self/clear_refs).
async fn peak_during<T>(f: impl std::future::Future<Output = T>) -> (T, usize) {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak resident set");
    let start = status("VmRSS:");
    let out = f.await;
    (out, status("VmHWM:").saturating_sub(start))
}

const MIB: usize = 1 << 20;

/// What an organization may hold for a query beyond its answer and not call it exhaustion:
/// far above one row of the query below (~6 MB).
const BOUND: usize = 64 * MIB;

fn block<B: Backend>(store: &Store<B>, number: u64, txs: Vec<Vec<Statement>>) -> ExecBlock {
    let analyzer = Analyzer::new(store.schema().expect("schema"));
    let txs = txs
        .into_iter()
        .map(|statements| Some(Transaction { statements }))
        .collect();
    let (block, rejected) = ExecBlock::analyze(BlockNumber(number), txs, &analyzer);
    assert!(rejected.is_empty(), "analysis rejected {rejected:?}");
    block
}

/// Fills `awkward` with 32 rows whose TEXT column `note` holds 1 MiB of `c` (as much as
/// chainify stores there), through ordinary INSERTs.
async fn notes_of_a_mib<B: Backend>(store: &Store<B>) {
    let note = Value::Text("c".repeat(1 << 20));
    let inserts = (1..=32)
        .map(|sub| {
            vec![Statement::new(
                "INSERT INTO awkward (id, sub, note) VALUES ($1, $2, $3)",
                vec![Value::Int(1), Value::Int(sub), note.clone()],
            )]
        })
        .collect();
    let b0 = block(store, 0, inserts);
    let o0 = store
        .execute_block(&b0, ExecMode::Parallel(4))
        .await
        .expect("inserts");
    assert!(o0.success.iter().all(|s| *s), "{o0:?}");
}

/// Counts the 32 rows of `SELECT {outputs} FROM awkward a WHERE a.id = 1`, each ~15 MiB (as
/// wide as `MAX_ROW_BYTES` lets a row be), ~480 MiB in all, and checks the peak.
async fn count_rows_of<B: Backend>(store: &Store<B>, test: &str, outputs: &str) {
    let sql = format!("SELECT {outputs} FROM awkward a WHERE a.id = $1");
    let b1 = block(
        store,
        1,
        vec![vec![
            Statement::new(&sql, vec![Value::Int(1)]).expect_rows(32),
        ]],
    );
    let (outcome, peak) = peak_during(store.execute_block(&b1, ExecMode::Parallel(4))).await;
    let outcome = outcome.expect("the block runs");
    eprintln!(
        "{test}: success {:?}, peak {} MiB for 32 rows of ~15 MiB",
        outcome.success,
        peak / MIB
    );
    assert_eq!(
        outcome.success,
        vec![true],
        "32 rows counted: {:?}",
        outcome.failures
    );
    assert!(
        peak < TEXT_BOUND,
        "{test}: counting the rows of one SELECT held {} MiB at once (32 rows of ~15 MiB)",
        peak / MIB
    );
}

/// Rows of computed text: three concatenations of a 1 MiB note that make 4 MiB each, and the
/// note three times (the widest computed row the analysis accepts), 32 rows of ~15 MiB. (Not
/// REPLACE: MariaDB's is quadratic in its matches, minutes for a MiB of them.)
async fn wide_rows_are_counted_one_at_a_time<F: Fixture>(f: &F, test: &str) {
    let store = setup(f, test, StoreOptions::default()).await;
    notes_of_a_mib(&store).await;
    let mut outputs = vec!["a.note || a.note || a.note || a.note"; 3];
    outputs.extend(["a.note"; 3]);
    count_rows_of(&store, test, &outputs.join(", ")).await;
}

/// What an organization may hold while it counts rows of ~15 MiB: a few rows (a driver holds
/// one row up to about five times while it reads it: 86 to 146 MiB measured for rows of
/// ~26 MB on PostgreSQL and MariaDB, 32 rows or 96 alike), far below the ~480 MiB of the 32
/// rows below.
const TEXT_BOUND: usize = 256 * MIB;

/// A TEXT column the client fills through ordinary INSERTs (1 MiB each), read 15 times a row
/// by a SELECT in a transaction (the most TEXT outputs `MAX_ROW_BYTES` accepts): 32 rows of
/// ~15 MiB.
async fn text_rows_are_counted_one_at_a_time<F: Fixture>(f: &F, test: &str) {
    let store = setup(f, test, StoreOptions::default()).await;
    notes_of_a_mib(&store).await;
    count_rows_of(&store, test, &vec!["a.note"; 15].join(", ")).await;
}

/// A client query of 16 rows of 15 × 400 KB (~96 MB, a cross join of four rows with
/// themselves) is refused past `MAX_ANSWER_BYTES` (32 MiB) having held about that much.
async fn a_query_answer_stops_at_its_bound<F: Fixture>(f: &F, test: &str) {
    let store = setup(f, test, StoreOptions::default()).await;
    let note = Value::Text("c".repeat(400_000));
    let inserts = (1..=4)
        .map(|sub| {
            vec![Statement::new(
                "INSERT INTO awkward (id, sub, note) VALUES ($1, $2, $3)",
                vec![Value::Int(1), Value::Int(sub), note.clone()],
            )]
        })
        .collect();
    let b0 = block(&store, 0, inserts);
    let o0 = store
        .execute_block(&b0, ExecMode::Parallel(4))
        .await
        .expect("inserts");
    assert!(o0.success.iter().all(|s| *s), "{o0:?}");
    let analyzer = Analyzer::new(store.schema().expect("schema"));
    let sql = format!(
        "SELECT {} FROM awkward a, awkward b",
        vec!["a.note"; 15].join(", ")
    );
    let plan = analyzer.query(&sql, &[]).expect("the query is accepted");
    let (answer, peak) = peak_during(async {
        store
            .read_snapshot(Duration::from_secs(30))
            .await
            .expect("snapshot")
            .query_rows(&plan, &[])
            .await
    })
    .await;
    eprintln!("{test}: peak {} MiB", peak / MIB);
    let err = answer.expect_err("~100 MB is past the bound");
    assert!(
        matches!(err, StorageError::QueryTooLarge { limit } if limit == MAX_ANSWER_BYTES),
        "{err}"
    );
    assert!(
        peak < MAX_ANSWER_BYTES + BOUND,
        "{test}: a refused answer held {} MiB at once (the bound is {} MiB)",
        peak / MIB,
        MAX_ANSWER_BYTES / MIB
    );
}

#[test]
fn postgres_wide_rows_of_a_transaction_select_are_counted_one_at_a_time() {
    in_own_process(
        "postgres_wide_rows_of_a_transaction_select_are_counted_one_at_a_time",
        wide_rows_are_counted_one_at_a_time(&PgFixture, "memory_pg_wide"),
    );
}

#[test]
fn mariadb_wide_rows_of_a_transaction_select_are_counted_one_at_a_time() {
    in_own_process(
        "mariadb_wide_rows_of_a_transaction_select_are_counted_one_at_a_time",
        wide_rows_are_counted_one_at_a_time(&MySqlFixture, "memory_my_wide"),
    );
}

#[test]
fn sqlite_wide_rows_of_a_transaction_select_are_counted_one_at_a_time() {
    in_own_process(
        "sqlite_wide_rows_of_a_transaction_select_are_counted_one_at_a_time",
        wide_rows_are_counted_one_at_a_time(&SqliteFixture, "memory_lite_wide"),
    );
}

#[test]
fn postgres_text_rows_of_a_transaction_select_are_counted_one_at_a_time() {
    in_own_process(
        "postgres_text_rows_of_a_transaction_select_are_counted_one_at_a_time",
        text_rows_are_counted_one_at_a_time(&PgFixture, "memory_pg_text"),
    );
}

#[test]
fn mariadb_text_rows_of_a_transaction_select_are_counted_one_at_a_time() {
    in_own_process(
        "mariadb_text_rows_of_a_transaction_select_are_counted_one_at_a_time",
        text_rows_are_counted_one_at_a_time(&MySqlFixture, "memory_my_text"),
    );
}

#[test]
fn sqlite_text_rows_of_a_transaction_select_are_counted_one_at_a_time() {
    in_own_process(
        "sqlite_text_rows_of_a_transaction_select_are_counted_one_at_a_time",
        text_rows_are_counted_one_at_a_time(&SqliteFixture, "memory_lite_text"),
    );
}

#[test]
fn postgres_a_query_answer_stops_at_its_bound() {
    in_own_process(
        "postgres_a_query_answer_stops_at_its_bound",
        a_query_answer_stops_at_its_bound(&PgFixture, "memory_pg_query"),
    );
}

#[test]
fn mariadb_a_query_answer_stops_at_its_bound() {
    in_own_process(
        "mariadb_a_query_answer_stops_at_its_bound",
        a_query_answer_stops_at_its_bound(&MySqlFixture, "memory_my_query"),
    );
}

#[test]
fn sqlite_a_query_answer_stops_at_its_bound() {
    in_own_process(
        "sqlite_a_query_answer_stops_at_its_bound",
        a_query_answer_stops_at_its_bound(&SqliteFixture, "memory_lite_query"),
    );
}
