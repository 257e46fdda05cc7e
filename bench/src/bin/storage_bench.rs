//! Storage benchmark on real engines (issue #3): parallel vs serial execution of Smallbank
//! blocks, and checkpoint snapshot/restore times. Uses the test servers of
//! `cargo xtask services start` (or any server given by URL).
//!
//! ```text
//! cargo run --release -p chainify-bench --bin storage-bench -- \
//!     [--accounts 100000] [--block 4096] [--blocks 2] [--parallelism 8] \
//!     [--engines postgres,mariadb,sqlite] [--checkpoint-accounts 100000,1000000]
//! ```
//! Server URLs: `CHAINIFY_TEST_POSTGRES_URL`, `CHAINIFY_TEST_MYSQL_URL` (a database named
//! `chainify_bench` is created next to the one named there).

#![allow(clippy::print_stdout)]

use std::time::Instant;

use anyhow::{Context, Result, bail};
use chainify_core::BlockNumber;
use chainify_sql::Analyzer;
use chainify_storage::{
    Backend, Conn, ExecBlock, ExecMode, MySql, Postgres, Sqlite, Store, StoreOptions,
};
use chainify_workload::{KeyDistribution, SMALLBANK_SCHEMA, Smallbank, smallbank_load_sql};
use sqlx::{AssertSqlSafe, Connection, Executor};

struct Args {
    accounts: u64,
    block: usize,
    blocks: usize,
    parallelism: usize,
    engines: Vec<String>,
    checkpoint_accounts: Vec<u64>,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        accounts: 100_000,
        block: 4096,
        blocks: 2,
        parallelism: 8,
        engines: vec!["postgres".into(), "mariadb".into(), "sqlite".into()],
        checkpoint_accounts: vec![100_000, 1_000_000],
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--accounts" => a.accounts = value.parse()?,
            "--block" => a.block = value.parse()?,
            "--blocks" => a.blocks = value.parse()?,
            "--parallelism" => a.parallelism = value.parse()?,
            "--engines" => a.engines = value.split(',').map(str::to_owned).collect(),
            "--checkpoint-accounts" => {
                a.checkpoint_accounts = value
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
            }
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

fn server_url(var: &str, db: &str) -> Result<String> {
    let base = std::env::var(var).with_context(|| {
        format!("{var} is not set; start the servers: cargo xtask services start; eval \"$(cargo xtask services env)\"")
    })?;
    Ok(chainify_storage::database_on(&base, db)?)
}

fn options(parallelism: usize) -> StoreOptions {
    StoreOptions {
        max_connections: u32::try_from(parallelism + 1).unwrap_or(9),
        ..StoreOptions::default()
    }
}

/// A fresh, empty database of `engine` named `name`.
async fn fresh(engine: &str, name: &str, parallelism: usize) -> Result<Engine> {
    Ok(match engine {
        "postgres" => {
            let mut admin =
                sqlx::PgConnection::connect(&server_url("CHAINIFY_TEST_POSTGRES_URL", "postgres")?)
                    .await?;
            admin
                .execute(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .await?;
            admin
                .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .await?;
            let url = server_url("CHAINIFY_TEST_POSTGRES_URL", name)?;
            Engine::Pg(Postgres::connect(&url, &options(parallelism)).await?)
        }
        "mariadb" => {
            let mut admin =
                sqlx::MySqlConnection::connect(&server_url("CHAINIFY_TEST_MYSQL_URL", "mysql")?)
                    .await?;
            admin
                .execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
                .await?;
            admin
                .execute(AssertSqlSafe(format!(
                    "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
                )))
                .await?;
            let url = server_url("CHAINIFY_TEST_MYSQL_URL", name)?;
            Engine::My(MySql::connect(&url, &options(parallelism)).await?)
        }
        "sqlite" => {
            let dir = std::path::Path::new("target/bench");
            std::fs::create_dir_all(dir)?;
            let path = dir.join(format!("{name}.db"));
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            let url = format!("sqlite://{}", path.display());
            Engine::Lite(Sqlite::connect(&url, &options(parallelism)).await?)
        }
        other => bail!("unknown engine {other}; engines: postgres, mariadb, sqlite"),
    })
}

enum Engine {
    Pg(Postgres),
    My(MySql),
    Lite(Sqlite),
}

/// Creates and loads Smallbank with `accounts` accounts, registers it, returns the store.
async fn smallbank<B: Backend>(backend: B, accounts: u64, parallelism: usize) -> Result<Store<B>> {
    let started = Instant::now();
    let mut conn = backend.acquire().await?;
    for ddl in SMALLBANK_SCHEMA.split(';').filter(|s| !s.trim().is_empty()) {
        conn.batch(ddl).await?;
    }
    conn.begin().await?;
    for insert in smallbank_load_sql(accounts, 2000) {
        conn.batch(&insert).await?;
    }
    conn.commit().await?;
    drop(conn);
    let store = Store::open(backend, options(parallelism)).await?;
    store.register(&["accounts", "savings", "checking"]).await?;
    eprintln!(
        "  loaded {accounts} accounts in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(store)
}

async fn execution<B: Backend>(
    engine: &str,
    store: &Store<B>,
    args: &Args,
    modes: &[ExecMode],
    out: &mut Vec<String>,
) -> Result<()> {
    let analyzer = Analyzer::new(store.schema()?);
    let mut number = 0u64;
    for (dist_name, dist) in [
        ("zipf 1.1", KeyDistribution::Zipf { s: 1.1, v: 0.0 }),
        ("uniform", KeyDistribution::Uniform),
    ] {
        let mut workload = Smallbank::new(args.accounts, &dist, 42);
        let blocks: Vec<Vec<_>> = (0..args.blocks * modes.len())
            .map(|_| workload.block(args.block).into_iter().map(Some).collect())
            .collect();
        let mut blocks = blocks.into_iter();
        for mode in modes {
            let mut total = 0.0;
            let mut digest = 0.0;
            let mut committed = 0usize;
            for _ in 0..args.blocks {
                let txs = blocks.next().context("blocks")?;
                let (block, _) = ExecBlock::analyze(BlockNumber(number), txs, &analyzer);
                number += 1;
                let started = Instant::now();
                let outcome = store.execute_block(&block, *mode).await?;
                total += started.elapsed().as_secs_f64();
                digest += outcome.digest_time.as_secs_f64();
                committed += outcome.success.iter().filter(|s| **s).count();
            }
            let txs = (args.blocks * args.block) as f64;
            let line = format!(
                "| {engine} | {dist_name} | {} | {:.0} | {:.0} | {:.0} | {:.1} % |",
                match mode {
                    ExecMode::Serial => "serial".to_owned(),
                    ExecMode::Parallel(k) => format!("parallel k={k}"),
                },
                total / args.blocks as f64 * 1000.0,
                digest / args.blocks as f64 * 1000.0,
                txs / total,
                100.0 * committed as f64 / txs,
            );
            eprintln!("  {line}");
            out.push(line);
        }
    }
    Ok(())
}

async fn checkpoints<B: Backend>(
    engine: &str,
    store: &Store<B>,
    accounts: u64,
    out: &mut Vec<String>,
) -> Result<()> {
    let analyzer = Analyzer::new(store.schema()?);
    let mut workload = Smallbank::new(accounts, &KeyDistribution::Uniform, 1);
    let mut run = |number: u64, txs: usize| {
        let txs = workload.block(txs).into_iter().map(Some).collect();
        ExecBlock::analyze(BlockNumber(number), txs, &analyzer).0
    };
    store.execute_block(&run(0, 64), ExecMode::Serial).await?;
    // The first checkpoint copies every table whole (a base layer).
    let base = store.checkpoint(BlockNumber(0)).await?;
    // A checkpoint interval's worth of transactions, then a delta of the keys they changed.
    for n in 1..=4 {
        store.execute_block(&run(n, 1024), ExecMode::Serial).await?;
    }
    let delta = store.checkpoint(BlockNumber(4)).await?;
    // Pruning the first checkpoint folds the delta into the base.
    let folding = std::time::Instant::now();
    store.prune_checkpoints(1).await?;
    let fold = folding.elapsed();
    store.execute_block(&run(5, 64), ExecMode::Serial).await?;
    let restore = store.restore(BlockNumber(4)).await?;
    // The state digest recomputed by a full scan, and the verified full restore (a repair).
    let scanning = std::time::Instant::now();
    let check = store.check_state().await?;
    let scan = scanning.elapsed();
    anyhow::ensure!(check.agrees(), "the full scan differs: {check:?}");
    store.execute_block(&run(5, 64), ExecMode::Serial).await?;
    let agreed = store.state_digest_at(BlockNumber(4)).await?;
    let full = store.restore_full(BlockNumber(4), agreed).await?;
    let line = format!(
        "| {engine} | {accounts} | {} | {:.2} | {} | {:.3} | {:.3} | {:.3} | {:.2} ({} rows) | {:.2} |",
        base.rows,
        base.elapsed.as_secs_f64(),
        delta.rows,
        delta.elapsed.as_secs_f64(),
        fold.as_secs_f64(),
        restore.elapsed.as_secs_f64(),
        scan.as_secs_f64(),
        check.rows,
        full.elapsed.as_secs_f64()
    );
    eprintln!("  {line}");
    out.push(line);
    Ok(())
}

async fn run_engine(
    engine: &str,
    args: &Args,
    exec: &mut Vec<String>,
    cps: &mut Vec<String>,
) -> Result<()> {
    eprintln!("{engine}: execution, {} accounts", args.accounts);
    macro_rules! with_store {
        ($e:expr, $accounts:expr, |$s:ident| $body:expr) => {
            match $e {
                Engine::Pg(b) => {
                    let $s = smallbank(b, $accounts, args.parallelism).await?;
                    $body
                }
                Engine::My(b) => {
                    let $s = smallbank(b, $accounts, args.parallelism).await?;
                    $body
                }
                Engine::Lite(b) => {
                    let $s = smallbank(b, $accounts, args.parallelism).await?;
                    $body
                }
            }
        };
    }
    let modes: Vec<ExecMode> = if engine == "sqlite" {
        vec![ExecMode::Serial]
    } else {
        vec![ExecMode::Serial, ExecMode::Parallel(args.parallelism)]
    };
    let e = fresh(engine, "chainify_bench", args.parallelism).await?;
    with_store!(e, args.accounts, |s| execution(
        engine, &s, args, &modes, exec
    )
    .await?);
    for &accounts in &args.checkpoint_accounts {
        eprintln!("{engine}: checkpoints, {accounts} accounts");
        let e = fresh(engine, "chainify_bench_cp", args.parallelism).await?;
        with_store!(e, accounts, |s| checkpoints(engine, &s, accounts, cps)
            .await?);
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let args = parse()?;
    let (mut exec, mut cps) = (Vec::new(), Vec::new());
    for engine in &args.engines {
        run_engine(engine, &args, &mut exec, &mut cps).await?;
    }
    println!(
        "Smallbank blocks of {} transactions, {} accounts, {} blocks per row\n",
        args.block, args.accounts, args.blocks
    );
    println!("| engine | keys | mode | ms per block | of which digest ms | tx/s | committed |");
    println!("|---|---|---|---|---|---|---|");
    for line in exec {
        println!("{line}");
    }
    println!(
        "\nCheckpoint of the three Smallbank tables (3 rows per account), restore, full scan of the state digest, verified full restore\n"
    );
    println!(
        "| engine | accounts | base rows | base s | delta rows (4 096 txs) | delta s | fold s | restore s | full scan s | verified full restore s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for line in cps {
        println!("{line}");
    }
    Ok(())
}
