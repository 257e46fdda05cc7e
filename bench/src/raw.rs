//! The raw-database baseline of `chainify bench --raw`: the same transaction streams, run by the
//! same number of clients straight on an engine, each client on its own connection, without
//! chainify (no ordering, no votes, no digest triggers: the tables are not registered). A
//! transaction runs as the layer runs it: its statements in one database transaction, rolled
//! back when a statement fails or an `expect_rows` guard does not hold, retried when the engine
//! reports a deadlock, a lock timeout or a busy database.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use chainify_core::tx::Transaction;
use chainify_sql::{Analyzer, Schema};
use chainify_storage::{AnyBackend, Backend, Conn, DbError, DbErrorKind, StoreOptions};

use crate::drive::Generator;

/// What the raw clients did in the measured window.
#[derive(Debug, Clone, Copy)]
pub struct RawResult {
    /// Transactions that committed.
    pub succeeded: u64,
    /// Transactions rolled back by a failed statement or guard.
    pub aborted: u64,
    /// Retries after transient errors.
    pub retries: u64,
    /// Seconds measured.
    pub seconds: f64,
}

impl RawResult {
    /// Committed transactions per second.
    pub fn tps(&self) -> f64 {
        self.succeeded as f64 / self.seconds
    }
}

#[derive(Default)]
struct Tally {
    succeeded: u64,
    aborted: u64,
    retries: u64,
}

enum Outcome {
    Committed,
    Aborted,
}

/// Runs `tx` on `conn` in one database transaction, as the layer renders it for this engine;
/// `Err` for a transient or connection error (rolled back).
async fn run_tx(
    conn: &mut chainify_storage::AnyConn,
    tx: &Transaction,
    analyzer: &Analyzer,
    dialect: chainify_sql::render::Dialect,
) -> anyhow::Result<Result<Outcome, DbError>> {
    let analysis = analyzer
        .analyze(tx)
        .map_err(|e| anyhow::anyhow!("the workload's transaction is refused: {e}"))?;
    if let Err(e) = conn.begin().await {
        return Ok(Err(e));
    }
    for ((st, plan), typed) in tx
        .statements
        .iter()
        .zip(&analysis.plans)
        .zip(&analysis.typed)
    {
        let r = typed.rendered(dialect);
        let params: Vec<_> = r
            .bind_order
            .iter()
            .filter_map(|i| st.params.get(*i))
            .collect();
        let returns_rows = plan.kind == chainify_core::config::StatementKind::Select;
        match conn.execute(&r.sql, &params, returns_rows).await {
            Ok(rows) if st.expect_rows.is_none_or(|e| e == rows) => {}
            Ok(_) => {
                let _ = conn.rollback().await;
                return Ok(Ok(Outcome::Aborted));
            }
            Err(e) if e.kind == DbErrorKind::Statement => {
                let _ = conn.rollback().await;
                return Ok(Ok(Outcome::Aborted));
            }
            Err(e) => {
                let _ = conn.rollback().await;
                return Ok(Err(e));
            }
        }
    }
    Ok(match conn.commit().await {
        Ok(()) => Ok(Outcome::Committed),
        Err(e) => Err(e),
    })
}

async fn client(
    backend: Arc<AnyBackend>,
    analyzer: Arc<Analyzer>,
    mut generator: Generator,
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Tally> {
    let mut conn = backend
        .acquire()
        .await
        .map_err(|e| anyhow::anyhow!("connecting: {e}"))?;
    let dialect = backend.dialect();
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let tx = generator.next_tx();
        let mut delay = Duration::from_millis(1);
        loop {
            match run_tx(&mut conn, &tx, &analyzer, dialect).await? {
                Ok(outcome) => {
                    if measuring.load(Ordering::Relaxed) {
                        match outcome {
                            Outcome::Committed => tally.succeeded += 1,
                            Outcome::Aborted => tally.aborted += 1,
                        }
                    }
                    break;
                }
                Err(e) if e.kind == DbErrorKind::Transient => {
                    tally.retries += 1;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(50));
                }
                Err(e) => anyhow::bail!("the database failed: {e}"),
            }
        }
    }
    Ok(tally)
}

/// Runs `generators` (one client each) on the prepared database at `url` for `warmup`, then
/// measures for `duration`.
pub async fn run(
    url: &str,
    schema: &str,
    generators: Vec<Generator>,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<RawResult> {
    let options = StoreOptions {
        max_connections: u32::try_from(generators.len() + 1).unwrap_or(u32::MAX),
        ..StoreOptions::default()
    };
    let backend = Arc::new(
        AnyBackend::connect(url, &options)
            .await
            .with_context(|| format!("connecting to {url}"))?,
    );
    let analyzer = Arc::new(Analyzer::new(
        Schema::from_sql(schema).context("reading the workload's schema")?,
    ));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = generators
        .into_iter()
        .map(|g| {
            tokio::spawn(client(
                backend.clone(),
                analyzer.clone(),
                g,
                measuring.clone(),
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    measuring.store(false, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut total = Tally::default();
    for c in clients {
        let t = c.await??;
        total.succeeded += t.succeeded;
        total.aborted += t.aborted;
        total.retries += t.retries;
    }
    backend.close().await;
    Ok(RawResult {
        succeeded: total.succeeded,
        aborted: total.aborted,
        retries: total.retries,
        seconds,
    })
}
