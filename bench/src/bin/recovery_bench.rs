//! Recovery benchmark (issues #4 and #15): three organizations in one process under a steady
//! Smallbank load.
//!
//! - `--scenario tamper` (default, issue #4): one organization's database is changed directly
//!   (`UPDATE checking …`); measured is the time until it agrees again: from the tampering to
//!   the append of the block that exposed it (wall), and from the disagreement to that append
//!   (the node's own recovery report).
//! - `--scenario bypass` (issue #15): organization 2's `checking` table is changed behind the
//!   digest triggers (PostgreSQL: triggers disabled for one transaction and re-enabled as they
//!   were; MariaDB/SQLite: the update trigger dropped, the node reinstalls it). Only a full scan
//!   (every `--state-check-interval` blocks, or at once after a broken trigger) finds it; measured
//!   is the time from the change until organization 2 repaired its tables (`repairs_total`) and
//!   appended the others' height again.
//! - `--scenario fast-join` (issue #15): after `--warmup` blocks organization 3 is stopped, its
//!   database recreated from scratch (schema and initial load) and the organization restarted;
//!   measured is the time until it has appended the others' height, once with fast join (it
//!   adopts another organization's newest verified checkpoint) and once without (it replays every
//!   block from block 1). The load goes on one block at a time meanwhile.
//!
//! ```text
//! cargo run --release -p chainify-bench --bin recovery-bench -- \
//!     [--scenario tamper|bypass|fast-join] [--engines postgres,postgres,postgres] \
//!     [--accounts 100000] [--block 256] [--checkpoint-interval 10] [--rounds 3] \
//!     [--state-check-interval 5] [--warmup 30]
//! ```
//! Server URLs: `CHAINIFY_TEST_POSTGRES_URL`, `CHAINIFY_TEST_MYSQL_URL` (databases named
//! `chainify_rb_<n>` are created next to the ones named there); SQLite files go to the
//! system's temporary directory.

#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chainify_core::OrgId;
use chainify_node::NodeSettings;
use chainify_orderer::LocalOrderer;
use chainify_storage::{AnyBackend, Backend, Conn, StoreOptions, database_on, recreate_database};
use chainify_testkit::cluster::{Cluster, ClusterClient, ClusterSpec, SharedOrderer};
use chainify_workload::{KeyDistribution, SMALLBANK_SCHEMA, Smallbank, smallbank_load_sql};
use tokio::task::JoinHandle;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scenario {
    Tamper,
    Bypass,
    FastJoin,
}

struct Args {
    scenario: Scenario,
    engines: Vec<String>,
    accounts: u64,
    block: usize,
    checkpoint_interval: u64,
    rounds: usize,
    state_check_interval: u64,
    warmup: usize,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        scenario: Scenario::Tamper,
        engines: vec!["postgres".into(); 3],
        accounts: 100_000,
        block: 256,
        checkpoint_interval: 10,
        rounds: 3,
        state_check_interval: 5,
        warmup: 30,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--scenario" => {
                a.scenario = match value.as_str() {
                    "tamper" => Scenario::Tamper,
                    "bypass" => Scenario::Bypass,
                    "fast-join" => Scenario::FastJoin,
                    other => bail!("unknown scenario {other} (tamper, bypass, fast-join)"),
                }
            }
            "--engines" => a.engines = value.split(',').map(str::to_owned).collect(),
            "--accounts" => a.accounts = value.parse()?,
            "--block" => a.block = value.parse()?,
            "--checkpoint-interval" => a.checkpoint_interval = value.parse()?,
            "--rounds" => a.rounds = value.parse()?,
            "--state-check-interval" => a.state_check_interval = value.parse()?,
            "--warmup" => a.warmup = value.parse()?,
            other => bail!("unknown flag {other}"),
        }
    }
    if a.engines.len() != 3 {
        bail!("--engines needs three engines (one per organization)");
    }
    if a.state_check_interval == 0 {
        bail!("--state-check-interval must be at least 1");
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

type Bench = Cluster<SharedOrderer<LocalOrderer>>;

/// Submits one block of transactions and waits until organization 1 appended a new block.
async fn one_block(cluster: &Bench, workload: &mut Smallbank, block: usize) -> Result<()> {
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

/// The load running in the background while the main task watches the statuses (and stops,
/// recreates and restarts organizations): one block of transactions at a time, each submitted
/// once the previous one is in organization 1's ledger.
struct Load {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Result<(Smallbank, u64)>>,
}

impl Load {
    fn start(client: ClusterClient<LocalOrderer>, mut workload: Smallbank, block: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let task = tokio::spawn(async move {
            let mut blocks = 0;
            while !stopping.load(Ordering::Relaxed) {
                let mut last = None;
                for _ in 0..block {
                    let tx = client.endorse(workload.next_tx().1).await?;
                    last = Some(tx.proposal.tx_id());
                    client.submit_raw(tx).await?;
                }
                let last = last.context("an empty block")?;
                let deadline = Instant::now() + Duration::from_secs(300);
                while client.outcome(&last).is_none() {
                    if Instant::now() > deadline {
                        bail!("{} appended no block for 5 minutes", client.observer());
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                blocks += 1;
            }
            Ok((workload, blocks))
        });
        Load { stop, task }
    }

    /// Stops after the block in flight; returns the generator and the blocks submitted.
    async fn finish(self) -> Result<(Smallbank, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// Waits until every organization has appended the same height (nothing is in flight then: the
/// load submits nothing meanwhile).
async fn settle(cluster: &Bench) -> Result<()> {
    cluster
        .wait_until(
            "every organization at the same block",
            Duration::from_secs(300),
            |s| {
                let top = s.values().map(|s| s.next_block).max();
                s.values().all(|s| Some(s.next_block) == top)
            },
        )
        .await?;
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Creates the three databases with the initial Smallbank load and starts the cluster on them.
async fn start(args: &Args, urls: &[String], settings: NodeSettings) -> Result<Bench> {
    let started = Instant::now();
    for url in urls {
        smallbank_db(url, args.accounts).await?;
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
        urls,
        &["accounts", "savings", "checking"],
    )?;
    spec.settings = settings;
    let orderer = SharedOrderer(Arc::new(LocalOrderer::start(
        spec.network.network_id.clone(),
        args.block,
        Duration::from_millis(200),
    )));
    Ok(Cluster::start(spec, orderer).await?)
}

/// Waits until every organization has appended organization 1's height, checks that the
/// ledgers and the shared tables are identical, and shuts the cluster down.
async fn check_and_stop(cluster: Bench) -> Result<()> {
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

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse()?;
    let urls = args
        .engines
        .iter()
        .enumerate()
        .map(|(i, engine)| url(engine, &format!("chainify_rb_{}", i + 1)))
        .collect::<Result<Vec<_>>>()?;
    let mut settings = NodeSettings {
        checkpoint_interval: args.checkpoint_interval,
        checkpoints_kept: 2,
        ..NodeSettings::default()
    };
    let workload = || Smallbank::new(args.accounts, &KeyDistribution::Uniform, 42);
    match args.scenario {
        Scenario::Tamper => {
            let cluster = start(&args, &urls, settings).await?;
            tamper(&cluster, &args, workload()).await?;
            check_and_stop(cluster).await?;
        }
        Scenario::Bypass => {
            settings.state_check_interval = args.state_check_interval;
            let cluster = start(&args, &urls, settings).await?;
            bypass(&cluster, &args, workload()).await?;
            check_and_stop(cluster).await?;
        }
        Scenario::FastJoin => {
            // The same run twice from scratch (same initial state, same load, same ledger length
            // when organization 3 starts over); only `fast_join` differs.
            let mut times = Vec::new();
            for fast in [true, false] {
                let mut cluster = start(
                    &args,
                    &urls,
                    NodeSettings {
                        fast_join: fast,
                        ..settings.clone()
                    },
                )
                .await?;
                times.push(fast_join(&mut cluster, &args, &urls[2], fast, workload()).await?);
                check_and_stop(cluster).await?;
            }
            if let [with, without] = times[..] {
                println!(
                    "caught up with the others: fast join {}, replay from block 1 {}; replay / fast join = {:.2}",
                    secs(with),
                    secs(without),
                    without.as_secs_f64() / with.as_secs_f64().max(1e-9)
                );
            }
        }
    }
    Ok(())
}

/// Issue #4: a change through the triggers, found by the next block's state digest.
async fn tamper(cluster: &Bench, args: &Args, mut workload: Smallbank) -> Result<()> {
    let tampered = OrgId(2);
    println!(
        "any-2, blocks of {} transactions, checkpoint every {} blocks; tampering with {} ({})",
        args.block, args.checkpoint_interval, tampered, args.engines[1]
    );
    println!(
        "round | block | checkpoint | replayed blocks | restore | replay | disagreement → agreed | tamper → agreed"
    );
    for round in 1..=args.rounds {
        // Warm up past a checkpoint so that a recovery has something to restore.
        for _ in 0..args.checkpoint_interval / 2 + 2 {
            one_block(cluster, &mut workload, args.block).await?;
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
            one_block(cluster, &mut workload, args.block).await?;
            if t0.elapsed() > Duration::from_secs(600) {
                bail!("no recovery after 10 minutes: {:?}", cluster.statuses());
            }
        }
        let wall = t0.elapsed();
        let status = cluster.status(tampered)?;
        let report = status.recoveries.last().context("a recovery")?;
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
    Ok(())
}

/// The statements that change organization 2's `checking` behind the digest triggers.
fn bypass_sql(engine: &str, custid: usize) -> Vec<String> {
    let update = format!("UPDATE checking SET bal = bal + 1 WHERE custid = {custid}");
    match engine {
        // One transaction: the node's own writes never see the triggers disabled, and the
        // triggers are back as they were (`ENABLE ALWAYS`: a plain `ENABLE TRIGGER USER` would
        // leave them in origin mode, which the trigger check before every block reports and
        // repairs — then no full scan would be needed to find the change).
        "postgres" => vec![format!(
            "BEGIN; ALTER TABLE checking DISABLE TRIGGER USER; {update}; \
             ALTER TABLE checking ENABLE ALWAYS TRIGGER chainify_dg_checking, \
             ENABLE ALWAYS TRIGGER chainify_dg_checking_truncate; COMMIT"
        )],
        // The node reinstalls the dropped trigger before its next block.
        _ => vec!["DROP TRIGGER chainify_dg_checking_au".to_owned(), update],
    }
}

/// Issue #15: a change behind the digest triggers, found by a full scan and repaired.
async fn bypass(cluster: &Bench, args: &Args, mut workload: Smallbank) -> Result<()> {
    let changed = OrgId(2);
    let engine = args.engines[1].as_str();
    println!(
        "any-2, blocks of {} transactions, checkpoint every {} blocks, full scan every {} blocks; changing {} ({}) behind the digest triggers",
        args.block, args.checkpoint_interval, args.state_check_interval, changed, engine
    );
    println!(
        "round | changed after block | alarm | repaired (repairs_total +1) | agreed again at block | change → agreed | blocks of load until repaired"
    );
    let mut walls = Vec::new();
    for round in 1..=args.rounds {
        // Warm up past a checkpoint so that a repair has something to restore.
        for _ in 0..args.checkpoint_interval / 2 + 2 {
            one_block(cluster, &mut workload, args.block).await?;
        }
        // Change the table at a quiet point: no block in flight anywhere.
        settle(cluster).await?;
        let before = cluster.status(changed)?;
        let at = before.next_block.0.saturating_sub(1);
        let t0 = Instant::now();
        for sql in bypass_sql(engine, round % 100 + 1) {
            cluster.tamper(changed, &sql).await?;
        }
        let mut load = Some(Load::start(cluster.client(OrgId(1))?, workload, args.block));
        let mut blocks = 0;
        let mut generator = None;
        let mut alarm = None;
        let mut repaired = None;
        let agreed = loop {
            let statuses = cluster.statuses();
            let s = &statuses[&changed];
            if alarm.is_none() && s.alarms_total > before.alarms_total {
                alarm = Some(t0.elapsed());
            }
            if repaired.is_none() && s.repairs_total > before.repairs_total {
                repaired = Some(t0.elapsed());
                // The load stops once the repair is done (after the block in flight): with
                // any-2 the two other organizations do not wait for this one, which would
                // otherwise chase a moving target (a slower engine never catches up).
                if let Some(load) = load.take() {
                    let (g, n) = load.finish().await?;
                    generator = Some(g);
                    blocks = n;
                }
                continue;
            }
            let top = statuses
                .iter()
                .filter(|(o, _)| **o != changed)
                .map(|(_, s)| s.next_block)
                .max()
                .context("other organizations")?;
            if repaired.is_some() && s.next_block >= top {
                break (t0.elapsed(), s.next_block);
            }
            if t0.elapsed() > Duration::from_secs(600) {
                bail!("no repair after 10 minutes: {:?}", cluster.statuses());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        if let Some(load) = load.take() {
            let (g, n) = load.finish().await?;
            generator = Some(g);
            blocks = n;
        }
        workload = generator.context("the load's generator")?;
        let (wall, height) = agreed;
        walls.push(wall);
        let after = cluster.status(changed)?;
        if after.recoveries_total > before.recoveries_total {
            println!(
                "   ({changed} also recovered {} time(s): the change reached a state digest)",
                after.recoveries_total - before.recoveries_total
            );
        }
        println!(
            "{round} | {at} | {} | {} | {} | {} | {blocks}",
            alarm.map_or_else(|| "-".into(), ms),
            repaired.map_or_else(|| "-".into(), ms),
            height.0.saturating_sub(1),
            ms(wall)
        );
        if let Some(last) = after.alarms.last() {
            println!("   last alarm: {last}");
        }
    }
    walls.sort();
    if let (Some(min), Some(max)) = (walls.first(), walls.last()) {
        println!(
            "change → agreed: min {}, median {}, max {}",
            ms(*min),
            ms(walls[walls.len() / 2]),
            ms(*max)
        );
    }
    Ok(())
}

/// Issue #15: after the warm-up, organization 3 starts over on an empty database (with or
/// without fast join, as the cluster's settings say). Returns the time from its restart until
/// it has appended the others' height.
async fn fast_join(
    cluster: &mut Bench,
    args: &Args,
    url: &str,
    fast: bool,
    mut workload: Smallbank,
) -> Result<Duration> {
    let joining = OrgId(3);
    let mode = if fast {
        "fast join"
    } else {
        "replay from block 1"
    };
    println!(
        "{mode}: any-2, blocks of {} transactions, checkpoint every {} blocks; warming up {} blocks, then {} ({}) starts over on an empty database",
        args.block, args.checkpoint_interval, args.warmup, joining, args.engines[2]
    );
    let warm = Instant::now();
    for _ in 0..args.warmup {
        one_block(cluster, &mut workload, args.block).await?;
    }
    settle(cluster).await?;
    println!(
        "warm-up: {} blocks in {}",
        args.warmup,
        secs(warm.elapsed())
    );
    cluster.stop(joining).await?;
    // The pool must be closed before the database can be dropped (PostgreSQL, MariaDB); the
    // restart opens a fresh one.
    cluster.store(joining)?.close().await;
    let recreating = Instant::now();
    smallbank_db(url, args.accounts).await?;
    let recreated = recreating.elapsed();
    let height = cluster.status(OrgId(1))?.next_block;
    let load = Load::start(cluster.client(OrgId(1))?, workload, args.block);
    let t0 = Instant::now();
    cluster.restart(joining).await?;
    let restarted = t0.elapsed();
    let mut at_restart_height = None;
    let result = loop {
        let statuses = cluster.statuses();
        let s = &statuses[&joining];
        if at_restart_height.is_none() && s.next_block >= height {
            at_restart_height = Some(t0.elapsed());
        }
        let top = statuses
            .iter()
            .filter(|(o, _)| **o != joining)
            .map(|(_, s)| s.next_block)
            .max()
            .context("other organizations")?;
        if s.next_block >= top {
            break Ok((t0.elapsed(), s.clone()));
        }
        if t0.elapsed() > Duration::from_secs(1200) {
            break Err(anyhow::anyhow!(
                "{joining} did not catch up in 20 minutes ({mode}): {:?}",
                cluster.statuses()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (_, blocks) = load.finish().await?;
    let (wall, status) = result?;
    println!(
        "{mode}: database recreated in {} (not counted); ledger at block {} when stopped; restart (open, register) {}; back at that height after {}; caught up with the others at block {} after {} ({blocks} blocks of load meanwhile)",
        secs(recreated),
        height.0.saturating_sub(1),
        ms(restarted),
        at_restart_height.map_or_else(|| "-".into(), secs),
        status.next_block.0.saturating_sub(1),
        secs(wall)
    );
    match &status.last_transfer {
        Some(t) => println!(
            "   state transfer from {}: checkpoint block {}, {} ledger entries, {} key ranges, {} rows, {}",
            t.from,
            t.block,
            t.ledger_entries,
            t.ranges,
            t.rows,
            ms(t.elapsed)
        ),
        None if fast => println!("   no state transfer happened (it replayed)"),
        None => {}
    }
    Ok(wall)
}
