//! `chainify demo`: the whole system in one process, with nothing to set up. Organizations on
//! SQLite files, the in-process orderer, Smallbank driven by closed-loop clients, one
//! organization's database tampered with midway and repaired from its checkpoint, and a closing
//! summary. Exit code 0 when every organization agrees at the end.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chainify_core::{OrgId, TxId};
use chainify_node::cluster::{Cluster, ClusterSpec, Shared};
use chainify_node::{NodeSettings, NodeStatus, RecoveryReport};
use chainify_orderer::LocalOrderer;
use chainify_workload::{KeyDistribution, Smallbank};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::sync::{broadcast, oneshot};

/// The Smallbank tables every organization shares.
const TABLES: [&str; 3] = ["accounts", "savings", "checking"];
/// The organization whose commits the clients observe (latency is submit → appended there).
const OBSERVER: OrgId = OrgId(1);
/// The organization whose database is tampered with.
const TAMPERED: OrgId = OrgId(2);
/// How long the end of the run may take to settle (in-flight blocks, a late recovery).
const SETTLE: Duration = Duration::from_secs(60);
/// Lines of progress when stderr is not a terminal (no bar): one per this interval.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(5);

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
    let (dir, temporary) = match &args.dir {
        Some(dir) => (std::path::absolute(dir)?, false),
        None => (
            std::env::temp_dir().join(format!("chainify-demo-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
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

/// Where progress lines and events go: above the bar on a terminal, plain lines otherwise.
struct Screen {
    bar: Option<ProgressBar>,
}

impl Screen {
    fn new(total: Duration) -> Screen {
        if !std::io::stderr().is_terminal() {
            return Screen { bar: None };
        }
        let bar = ProgressBar::new(total.as_millis() as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:30.cyan/blue} {elapsed:>3} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Screen { bar: Some(bar) }
    }

    fn say(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn progress(&self, elapsed: Duration, line: &str, plain_due: &mut Instant) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(elapsed.as_millis() as u64);
                bar.set_message(line.to_owned());
            }
            None if Instant::now() >= *plain_due => {
                eprintln!("  {:>5.1} s  {line}", elapsed.as_secs_f64());
                *plain_due = Instant::now() + PLAIN_PROGRESS_EVERY;
            }
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// A transaction a client waits for: when it was submitted, and whom to tell.
type Pending = Arc<Mutex<HashMap<TxId, (Instant, oneshot::Sender<bool>)>>>;

#[derive(Default)]
struct Counters {
    committed: AtomicU64,
    succeeded: AtomicU64,
    latencies_us: Mutex<Vec<u64>>,
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
        crate::devnet::smallbank_database(&url, args.accounts)
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
        &TABLES,
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
             it, so the network would stop and wait for an operator (DESIGN §2.5); choose a policy \
             they meet alone (any-2) or add --no-tamper",
            args.policy
        );
    }
    spec.settings = NodeSettings {
        checkpoint_interval: args.checkpoint_interval,
        ..NodeSettings::default()
    };
    let orderer = LocalOrderer::start(
        spec.network.network_id.clone(),
        spec.network.max_block_txs,
        spec.network.batch_timeout,
    );
    let cluster = Arc::new(Cluster::start(spec, Shared(Arc::new(orderer))).await?);
    eprintln!(
        "  {} organizations loaded and running in {:.1} s",
        args.orgs,
        started.elapsed().as_secs_f64()
    );

    let pending: Pending = Arc::default();
    let counters = Arc::new(Counters::default());
    let commits = cluster
        .commits(OBSERVER)
        .context("the observing organization is not running")?;
    let listener = tokio::spawn(listen(commits, pending.clone(), counters.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..args.clients)
        .map(|i| {
            let workload = Smallbank::new(
                args.accounts,
                &KeyDistribution::Zipf { s: 1.1, v: 0.0 },
                args.seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
            );
            tokio::spawn(client(
                cluster.clone(),
                workload,
                pending.clone(),
                stop.clone(),
            ))
        })
        .collect();

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
            let sql = "UPDATE checking SET bal = bal + 1000 WHERE custid = 1";
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
    stop.store(true, Ordering::Relaxed);
    screen.say("▸ load stopped; waiting for the last transactions and for every organization");
    for c in clients {
        c.await??;
    }
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
    let target = cluster.statuses()[&OBSERVER].next_block;
    cluster
        .wait_until("every organization at the same height", SETTLE, |s| {
            s.values().all(|s| s.next_block >= target)
        })
        .await?;
    screen.finish();
    listener.abort();

    let statuses = cluster.statuses();
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

fn heights(statuses: &BTreeMap<OrgId, NodeStatus>) -> String {
    statuses
        .iter()
        .map(|(org, s)| format!("{org} {}", s.next_block.0.saturating_sub(1)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn percentile(sorted: &[u64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1] as f64 / 1e3)
}

/// Tells each waiting client when its transaction is appended at the observing organization.
async fn listen(
    mut commits: broadcast::Receiver<Arc<chainify_node::Committed>>,
    pending: Pending,
    counters: Arc<Counters>,
) {
    loop {
        let committed = match commits.recv().await {
            Ok(c) => c,
            // Missed blocks: their clients find their outcome by polling (see `client`).
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let now = Instant::now();
        let block = &committed.block;
        let mut waiting = pending.lock().unwrap_or_else(PoisonError::into_inner);
        for (index, id) in block.tx_ids.iter().enumerate() {
            let success = block.success.get(index).copied().unwrap_or(false);
            if let Some((submitted, tell)) = waiting.remove(id) {
                counters.committed.fetch_add(1, Ordering::Relaxed);
                if success {
                    counters.succeeded.fetch_add(1, Ordering::Relaxed);
                }
                counters
                    .latencies_us
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(now.duration_since(submitted).as_micros() as u64);
                let _ = tell.send(success);
            }
        }
    }
}

/// Submits one transaction at a time until told to stop, each after the previous is appended.
async fn client(
    cluster: Arc<Cluster<Shared<LocalOrderer>>>,
    mut workload: Smallbank,
    pending: Pending,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    while !stop.load(Ordering::Relaxed) {
        let tx = cluster.endorse(workload.next_tx().1);
        let id = tx.proposal.tx_id();
        let (tell, mut told) = oneshot::channel();
        pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, (Instant::now(), tell));
        cluster.submit_raw(tx).await?;
        let deadline = Instant::now() + SETTLE;
        loop {
            match tokio::time::timeout(Duration::from_secs(1), &mut told).await {
                Ok(_) => break,
                // The listener lagged past this block: the collector's record says it landed.
                Err(_) if cluster.outcome(OBSERVER, &id).is_some() => {
                    pending
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&id);
                    break;
                }
                Err(_) if Instant::now() >= deadline => {
                    bail!("transaction {id} was not appended within {SETTLE:?}")
                }
                Err(_) => {}
            }
        }
    }
    Ok(())
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
