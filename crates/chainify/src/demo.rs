//! `chainify demo`: the whole system in one process, with nothing to set up. Organizations on
//! SQLite files, the in-process orderer, Smallbank driven by closed-loop clients, one
//! organization's database tampered with midway and repaired from its checkpoint, and a closing
//! summary. Exit code 0 when every organization agrees at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chainify_core::OrgId;
use chainify_node::{NodeSettings, NodeStatus, RecoveryReport};
use chainify_orderer::{Cut, LocalOrderer};
use chainify_testkit::cluster::{Cluster, ClusterSpec, OrdererFactory, SharedOrderer};
use chainify_workload::{KeyDistribution, YcsbRecord};
use serde::Serialize;

use chainify_bench::drive::{
    Load, PLAIN_PROGRESS_EVERY, SETTLE, Screen, Workload, heights, percentile,
};

/// The organization whose commits the clients observe (latency is submit → appended there).
const OBSERVER: OrgId = OrgId(1);
/// The organization whose database is tampered with.
const TAMPERED: OrgId = OrgId(2);

#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// How long to drive the load, in seconds.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Organizations (each with its own SQLite database).
    #[arg(long, default_value_t = 3)]
    orgs: u32,
    /// Agreement policy: `any-N`, `all`, or `majority`.
    #[arg(long, default_value = "any-2")]
    policy: String,
    /// Smallbank accounts.
    #[arg(long, default_value_t = 10_000)]
    accounts: u64,
    /// Concurrent closed-loop clients (each waits for its transaction before the next).
    #[arg(long, default_value_t = 128)]
    clients: usize,
    /// Largest block the orderer cuts.
    #[arg(long, default_value_t = 128)]
    block_txs: usize,
    /// How long the orderer waits to fill a block, in milliseconds.
    #[arg(long, default_value_t = 10)]
    batch_timeout_ms: u64,
    /// Blocks between checkpoints.
    #[arg(long, default_value_t = 20)]
    checkpoint_interval: u64,
    /// Do not tamper with an organization midway.
    #[arg(long)]
    no_tamper: bool,
    /// Where the SQLite files go (kept afterwards); default: a temporary directory, removed.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seed of the workload's random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the summary as JSON on stdout (progress and events still go to stderr).
    #[arg(long)]
    json: bool,
}

impl DemoArgs {
    fn check(&self) -> anyhow::Result<()> {
        if !(self.duration.is_finite() && self.duration > 0.0 && self.duration <= 86_400.0) {
            bail!(
                "--duration {}: must be more than 0 and at most 86400 seconds",
                self.duration
            );
        }
        if !(2..=16).contains(&self.orgs) {
            bail!("--orgs {}: a demo runs 2 to 16 organizations", self.orgs);
        }
        if self.accounts < 10 {
            bail!("--accounts {}: Smallbank needs at least 10", self.accounts);
        }
        if !(1..=10_000).contains(&self.clients) {
            bail!("--clients {}: must be 1 to 10000", self.clients);
        }
        if self.block_txs == 0 {
            bail!("--block-txs 0: a block holds at least one transaction");
        }
        if self.checkpoint_interval == 0 {
            bail!("--checkpoint-interval 0: must be at least 1 block");
        }
        Ok(())
    }
}

pub(crate) fn run(args: &DemoArgs) -> anyhow::Result<std::process::ExitCode> {
    args.check()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (dir, temporary) = chainify_bench::drive::scratch_dir(&args.dir, "demo")?;
    let result = runtime.block_on(demo(args, &dir));
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let summary = result?;
    let text = if args.json {
        serde_json::to_string_pretty(&summary)? + "\n"
    } else {
        summary.render()
    };
    std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes())?;
    Ok(if summary.all_agree {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

async fn demo(args: &DemoArgs, dir: &Path) -> anyhow::Result<Summary> {
    let duration = Duration::from_secs_f64(args.duration);
    let tamper = !args.no_tamper;
    eprintln!(
        "chainify demo: {} organizations on SQLite ({}), in-process orderer, policy {}, \
         Smallbank with {} accounts, {} clients, {:.0} s{}",
        args.orgs,
        dir.display(),
        args.policy,
        args.accounts,
        args.clients,
        args.duration,
        if tamper {
            format!(", {TAMPERED} tampered with midway")
        } else {
            String::new()
        }
    );
    let started = Instant::now();
    let mut urls = Vec::new();
    for n in 1..=args.orgs {
        let url = format!("sqlite://{}", dir.join(format!("org{n}.db")).display());
        Workload::Smallbank
            .prepare(&url, args.accounts, YcsbRecord::default())
            .await
            .with_context(|| format!("loading Smallbank into org{n}'s database {url}"))?;
        urls.push(url);
    }
    let mut spec = ClusterSpec::generate(
        "demo",
        &args.policy,
        args.block_txs,
        Duration::from_millis(args.batch_timeout_ms),
        &urls,
        Workload::Smallbank.tables(),
    )
    .context("the demo network")?;
    let others: std::collections::BTreeSet<OrgId> = spec
        .network
        .agreement
        .orgs()
        .iter()
        .copied()
        .filter(|o| *o != TAMPERED)
        .collect();
    if tamper && !spec.network.agreement.is_satisfied_by(&others) {
        bail!(
            "--policy {}: the organizations other than the tampered {TAMPERED} cannot agree without \
             it, so the network would stop and wait for an operator (docs/design/overview.md \
             §2.5); choose a policy they meet alone (any-2) or add --no-tamper",
            args.policy
        );
    }
    spec.settings = NodeSettings {
        checkpoint_interval: args.checkpoint_interval,
        ..NodeSettings::default()
    };
    // In one process the organizations' demand cuts blocks: none waits on the timeout.
    let orderer = LocalOrderer::start_cutting(
        spec.network.network_id.clone(),
        spec.network.max_block_txs,
        spec.network.batch_timeout,
        Cut::OnDemand,
    );
    let cluster = Arc::new(Cluster::start(spec, SharedOrderer(Arc::new(orderer))).await?);
    eprintln!(
        "  {} organizations loaded and running in {:.1} s",
        args.orgs,
        started.elapsed().as_secs_f64()
    );

    let generators = (0..args.clients)
        .map(|i| {
            Workload::Smallbank.generator(
                args.accounts,
                &KeyDistribution::Zipf { s: 1.1, v: 0.0 },
                YcsbRecord::default(),
                args.seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
            )
        })
        .collect();
    let load = Load::start(&cluster, OBSERVER, generators)?;
    let counters = load.counters.clone();

    let screen = Screen::new(duration);
    let begin = Instant::now();
    let mut tampered_at: Option<Instant> = None;
    let mut reported: BTreeMap<OrgId, usize> = BTreeMap::new();
    let mut recoveries: Vec<(OrgId, RecoveryReport, Option<Duration>)> = Vec::new();
    let mut plain_due = Instant::now() + PLAIN_PROGRESS_EVERY;
    let mut last = (Instant::now(), 0u64);
    let mut rate = 0.0;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let elapsed = begin.elapsed();
        if tamper && tampered_at.is_none() && elapsed >= duration / 2 {
            let sql = Workload::Smallbank.tamper_sql();
            cluster.tamper(TAMPERED, sql).await?;
            tampered_at = Some(Instant::now());
            screen.say(&format!(
                "▸ {:>5.1} s  tampered with {TAMPERED}'s database behind chainify's back: {sql}",
                elapsed.as_secs_f64()
            ));
        }
        let statuses = cluster.statuses();
        for (org, status) in &statuses {
            let seen = reported.entry(*org).or_insert(0);
            for report in status.recoveries.iter().skip(*seen) {
                let since_tamper = tampered_at.map(|t| t.elapsed());
                screen.say(&format!(
                    "▸ {:>5.1} s  {org} disagreed at block {}: restored checkpoint {}, replayed {} \
                     blocks, agreed again in {:.0} ms",
                    begin.elapsed().as_secs_f64(),
                    report.block,
                    report
                        .checkpoint
                        .map_or("none (from the start)".into(), |c| c.to_string()),
                    report.replayed,
                    report.elapsed.as_secs_f64() * 1e3,
                ));
                recoveries.push((*org, report.clone(), since_tamper));
            }
            *seen = status.recoveries.len();
        }
        let committed = counters.committed.load(Ordering::Relaxed);
        if last.0.elapsed() >= Duration::from_secs(1) {
            rate = (committed - last.1) as f64 / last.0.elapsed().as_secs_f64();
            last = (Instant::now(), committed);
        }
        screen.progress(
            elapsed.min(duration),
            &format!(
                "{committed} tx · {rate:.0} tx/s · blocks {}",
                heights(&statuses)
            ),
            &mut plain_due,
        );
        if elapsed >= duration {
            break;
        }
    }
    let measured = begin.elapsed();
    let committed_in_time = counters.committed.load(Ordering::Relaxed);
    let succeeded_in_time = counters.succeeded.load(Ordering::Relaxed);
    screen.say("▸ load stopped; waiting for the last transactions and for every organization");
    load.stop().await?;
    if tamper && recoveries.iter().all(|(org, _, _)| *org != TAMPERED) {
        cluster
            .wait_until("the tampered organization's recovery", SETTLE, |s| {
                s.get(&TAMPERED).is_some_and(|s| !s.recoveries.is_empty())
            })
            .await?;
        if let Some(status) = cluster.statuses().get(&TAMPERED) {
            for report in &status.recoveries {
                recoveries.push((TAMPERED, report.clone(), tampered_at.map(|t| t.elapsed())));
            }
        }
    }
    let orgs = cluster.orgs();
    let statuses = settled(&cluster).await?;
    screen.finish();

    let agreement = cluster.check_consistent(&orgs).await;
    let mut per_org = Vec::new();
    for org in &orgs {
        let agrees = match &agreement {
            Ok(_) => true,
            Err(_) => *org == OBSERVER || cluster.check_consistent(&[OBSERVER, *org]).await.is_ok(),
        };
        let status = &statuses[org];
        per_org.push(OrgSummary {
            org: format!("{org}"),
            blocks: status.next_block.0.saturating_sub(1),
            recoveries: status.recoveries.len(),
            alarms: status.alarms.len(),
            agrees,
        });
    }
    let mut latencies = std::mem::take(
        &mut *counters
            .latencies_us
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    latencies.sort_unstable();
    let cluster = Arc::into_inner(cluster).context("a client still holds the cluster")?;
    cluster.shutdown().await?;
    Ok(Summary {
        organizations: args.orgs,
        policy: args.policy.clone(),
        clients: args.clients,
        seconds: measured.as_secs_f64(),
        committed: committed_in_time,
        succeeded: succeeded_in_time,
        successful_tps: succeeded_in_time as f64 / measured.as_secs_f64(),
        latency_p50_ms: percentile(&latencies, 0.50),
        latency_p99_ms: percentile(&latencies, 0.99),
        blocks: per_org.iter().map(|o| o.blocks).max().unwrap_or(0),
        orgs: per_org,
        recoveries: recoveries
            .into_iter()
            .map(|(org, r, since_tamper)| RecoverySummary {
                org: format!("{org}"),
                block: r.block.0,
                checkpoint: r.checkpoint.map(|c| c.0),
                replayed_blocks: r.replayed,
                restore_ms: r.restore.as_secs_f64() * 1e3,
                replay_ms: r.replay.as_secs_f64() * 1e3,
                recovery_ms: r.elapsed.as_secs_f64() * 1e3,
                since_tamper_ms: since_tamper.map(|d| d.as_secs_f64() * 1e3),
            })
            .collect(),
        tampered: tamper.then(|| format!("{TAMPERED}")),
        all_agree: agreement.is_ok(),
        disagreement: agreement.err().map(|e| e.to_string()),
    })
}

/// Every organization's status once all stand at one height, at least the highest any stood at
/// when asked: an organization one block behind the others is still appending, not behind.
async fn settled<F: OrdererFactory>(
    cluster: &Cluster<F>,
) -> anyhow::Result<BTreeMap<OrgId, NodeStatus>> {
    let lowest = |s: &BTreeMap<OrgId, NodeStatus>| s.values().map(|s| s.next_block).min();
    let highest = |s: &BTreeMap<OrgId, NodeStatus>| s.values().map(|s| s.next_block).max();
    let target = highest(&cluster.statuses());
    // The statuses the wait saw: one view, so a block landing after it cannot split them.
    Ok(cluster
        .wait_until("every organization at the same height", SETTLE, |s| {
            lowest(s) == highest(s) && lowest(s) >= target
        })
        .await?)
}

#[derive(Debug, Serialize)]
struct OrgSummary {
    org: String,
    blocks: u64,
    recoveries: usize,
    alarms: usize,
    agrees: bool,
}

#[derive(Debug, Serialize)]
struct RecoverySummary {
    org: String,
    block: u64,
    checkpoint: Option<u64>,
    replayed_blocks: u64,
    restore_ms: f64,
    replay_ms: f64,
    recovery_ms: f64,
    since_tamper_ms: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Summary {
    organizations: u32,
    policy: String,
    clients: usize,
    seconds: f64,
    /// Transactions appended at the observing organization during the run.
    committed: u64,
    /// Of those, the ones that committed (the rest were rolled back by their own guards).
    succeeded: u64,
    successful_tps: f64,
    latency_p50_ms: Option<f64>,
    latency_p99_ms: Option<f64>,
    blocks: u64,
    orgs: Vec<OrgSummary>,
    tampered: Option<String>,
    recoveries: Vec<RecoverySummary>,
    all_agree: bool,
    disagreement: Option<String>,
}

impl Summary {
    fn render(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} ms"));
        let mut out = String::new();
        out.push_str("\nSummary\n");
        out.push_str(&format!(
            "  load               {:.1} s, {} clients, policy {}\n",
            self.seconds, self.clients, self.policy
        ));
        out.push_str(&format!(
            "  transactions       {} appended, {} succeeded, {} rolled back by their own checks\n",
            self.committed,
            self.succeeded,
            self.committed - self.succeeded
        ));
        out.push_str(&format!(
            "  successful TPS     {:.0}\n",
            self.successful_tps
        ));
        out.push_str(&format!(
            "  latency            p50 {}, p99 {} (submitted → appended at {OBSERVER})\n",
            ms(self.latency_p50_ms),
            ms(self.latency_p99_ms)
        ));
        out.push_str(&format!("  blocks             {}\n", self.blocks));
        for o in &self.orgs {
            out.push_str(&format!(
                "  {:<18} {} blocks, {} recover{}, {} alarm{}: {}\n",
                o.org,
                o.blocks,
                o.recoveries,
                if o.recoveries == 1 { "y" } else { "ies" },
                o.alarms,
                if o.alarms == 1 { "" } else { "s" },
                if o.agrees { "agrees" } else { "DISAGREES" }
            ));
        }
        for r in &self.recoveries {
            out.push_str(&format!(
                "  recovery           {} at block {}: checkpoint {}, {} blocks replayed, restore {:.0} ms + replay {:.0} ms, {:.0} ms from disagreement to agreement\n",
                r.org,
                r.block,
                r.checkpoint.map_or("none".into(), |c| c.to_string()),
                r.replayed_blocks,
                r.restore_ms,
                r.replay_ms,
                r.recovery_ms
            ));
        }
        if self.all_agree {
            out.push_str(
                "  every organization agrees: identical ledgers (hash chain and certificates verified) and identical tables\n",
            );
        } else {
            out.push_str(&format!(
                "  THE ORGANIZATIONS DISAGREE: {}\n",
                self.disagreement.as_deref().unwrap_or("?")
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let sorted: Vec<u64> = (1..=100).map(|v| v * 1000).collect();
        assert_eq!(percentile(&sorted, 0.50), Some(50.0));
        assert_eq!(percentile(&sorted, 0.99), Some(99.0));
        assert_eq!(percentile(&sorted[..1], 0.99), Some(1.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
