//! Recovery benchmark (issue #4): three organizations in one process under a steady Smallbank
//! load; one organization's database is changed directly (`UPDATE checking …`); measured is the
//! time until it agrees again: from the tampering to the append of the block that exposed it
//! (wall), and from the disagreement to that append (the node's own recovery report).
//!
//! ```text
//! cargo run --release -p chainify-bench --bin recovery-bench -- \
//!     [--engines postgres,postgres,postgres] [--accounts 100000] [--block 256] \
//!     [--checkpoint-interval 10] [--rounds 3]
//! ```
//! Server URLs: `CHAINIFY_TEST_POSTGRES_URL`, `CHAINIFY_TEST_MYSQL_URL` (databases named
//! `chainify_rb_<n>` are created next to the ones named there); SQLite files go to the
//! system's temporary directory.

#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chainify_core::OrgId;
use chainify_node::NodeSettings;
use chainify_node::cluster::{Cluster, ClusterSpec, Shared};
use chainify_orderer::LocalOrderer;
use chainify_storage::{AnyBackend, Backend, Conn, StoreOptions, database_on, recreate_database};
use chainify_workload::{KeyDistribution, SMALLBANK_SCHEMA, Smallbank, smallbank_load_sql};

struct Args {
    engines: Vec<String>,
    accounts: u64,
    block: usize,
    checkpoint_interval: u64,
    rounds: usize,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        engines: vec!["postgres".into(); 3],
        accounts: 100_000,
        block: 256,
        checkpoint_interval: 10,
        rounds: 3,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--engines" => a.engines = value.split(',').map(str::to_owned).collect(),
            "--accounts" => a.accounts = value.parse()?,
            "--block" => a.block = value.parse()?,
            "--checkpoint-interval" => a.checkpoint_interval = value.parse()?,
            "--rounds" => a.rounds = value.parse()?,
            other => bail!("unknown flag {other}"),
        }
    }
    if a.engines.len() != 3 {
        bail!("--engines needs three engines (one per organization)");
    }
    Ok(a)
}

fn url(engine: &str, name: &str) -> Result<String> {
    let server = |var: &str| -> Result<String> {
        let base = std::env::var(var).with_context(|| {
            format!("{var} is not set; start the servers: cargo xtask services start; eval \"$(cargo xtask services env)\"")
        })?;
        Ok(database_on(&base, name)?)
    };
    match engine {
        "postgres" => server("CHAINIFY_TEST_POSTGRES_URL"),
        "mariadb" | "mysql" => server("CHAINIFY_TEST_MYSQL_URL"),
        "sqlite" => Ok(format!(
            "sqlite://{}",
            std::env::temp_dir().join(format!("{name}.db")).display()
        )),
        other => bail!("unknown engine {other}"),
    }
}

async fn smallbank_db(url: &str, accounts: u64) -> Result<()> {
    recreate_database(url).await?;
    let backend = AnyBackend::connect(url, &StoreOptions::default()).await?;
    let mut conn = backend.acquire().await?;
    for ddl in SMALLBANK_SCHEMA.split(';').filter(|s| !s.trim().is_empty()) {
        conn.batch(ddl).await?;
    }
    for insert in smallbank_load_sql(accounts, 1000) {
        conn.batch(&insert).await?;
    }
    drop(conn);
    backend.close().await;
    Ok(())
}

/// Submits one block of transactions and waits until organization 1 appended a new block.
async fn one_block(
    cluster: &Cluster<Shared<LocalOrderer>>,
    workload: &mut Smallbank,
    block: usize,
) -> Result<()> {
    let before = cluster.status(OrgId(1))?.next_block;
    for _ in 0..block {
        cluster.submit(workload.next_tx().1).await?;
    }
    cluster
        .wait_until("a block", Duration::from_secs(120), |s| {
            s[&OrgId(1)].next_block > before
        })
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse()?;
    let mut urls = Vec::new();
    let started = Instant::now();
    for (i, engine) in args.engines.iter().enumerate() {
        let url = url(engine, &format!("chainify_rb_{}", i + 1))?;
        smallbank_db(&url, args.accounts).await?;
        urls.push(url);
    }
    println!(
        "loaded {} accounts into {} in {:.1} s",
        args.accounts,
        args.engines.join(", "),
        started.elapsed().as_secs_f64()
    );
    let mut spec = ClusterSpec::generate(
        "recovery",
        "any-2",
        args.block,
        Duration::from_millis(200),
        &urls,
        &["accounts", "savings", "checking"],
    )?;
    spec.settings = NodeSettings {
        checkpoint_interval: args.checkpoint_interval,
        checkpoints_kept: 2,
        ..NodeSettings::default()
    };
    let orderer = Shared(std::sync::Arc::new(LocalOrderer::start(
        spec.network.network_id.clone(),
        args.block,
        Duration::from_millis(200),
    )));
    let cluster = Cluster::start(spec, orderer).await?;
    let mut workload = Smallbank::new(args.accounts, &KeyDistribution::Uniform, 42);
    let tampered = OrgId(2);
    println!(
        "any-2, blocks of {} transactions, checkpoint every {} blocks; tampering with organization {} ({})",
        args.block, args.checkpoint_interval, tampered, args.engines[1]
    );
    println!(
        "round | block | checkpoint | replayed blocks | restore | replay | disagreement → agreed | tamper → agreed"
    );
    for round in 1..=args.rounds {
        // Warm up past a checkpoint so that a recovery has something to restore.
        for _ in 0..args.checkpoint_interval / 2 + 2 {
            one_block(&cluster, &mut workload, args.block).await?;
        }
        let before = cluster.status(tampered)?.recoveries.len();
        let t0 = Instant::now();
        cluster
            .tamper(
                tampered,
                &format!(
                    "UPDATE checking SET bal = bal + 1 WHERE custid = {}",
                    round % 100
                ),
            )
            .await?;
        while cluster.status(tampered)?.recoveries.len() == before {
            one_block(&cluster, &mut workload, args.block).await?;
            if t0.elapsed() > Duration::from_secs(600) {
                bail!("no recovery after 10 minutes: {:?}", cluster.statuses());
            }
        }
        let wall = t0.elapsed();
        let status = cluster.status(tampered)?;
        let report = status.recoveries.last().context("a recovery")?;
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
        println!(
            "{round} | {} | {} | {} | {} | {} | {} | {}",
            report.block,
            report
                .checkpoint
                .map_or_else(|| "-".into(), |c| c.to_string()),
            report.replayed,
            ms(report.restore),
            ms(report.replay),
            ms(report.elapsed),
            ms(wall)
        );
    }
    let orgs = cluster.orgs();
    let last = cluster.status(OrgId(1))?.next_block;
    cluster
        .wait_until(
            "every organization at the same block",
            Duration::from_secs(300),
            |s| s.values().all(|s| s.next_block >= last),
        )
        .await?;
    let blocks = cluster.check_consistent(&orgs).await?;
    println!("all three ledgers identical ({blocks} blocks), shared tables identical");
    cluster.shutdown().await?;
    Ok(())
}
