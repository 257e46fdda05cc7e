//! `chainify bench`: a measured run of an in-process network (organizations on SQLite,
//! PostgreSQL or MariaDB, the in-process orderer) under closed-loop clients, after a warm-up.
//! Writes `result.json` and `result.svg` (throughput over time, latency percentiles, each
//! organization's commit timeline, time per phase) into `--out`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chainify_core::OrgId;
use chainify_core::crypto::Signatures;
use chainify_core::policy::{AgreementPolicy, PolicySpec};
use chainify_node::NodeSettings;
use chainify_node::metrics::{Metrics, Phase};
use chainify_orderer::{Cut, LocalOrderer};
use chainify_storage::ExecMode;
use chainify_testkit::cluster::{Cluster, ClusterSpec, SharedOrderer};
use chainify_workload::{KeyDistribution, YcsbRecord};
use serde_json::json;

use crate::drive::Counters;
use crate::drive::{
    Load, PLAIN_PROGRESS_EVERY, SETTLE, Screen, Workload, engine_url, percentile, scratch_dir,
};
use crate::faults::Fault;
use crate::remote::{Devnet, RemoteLoad};
use crate::svg::{Panel, render};

/// Where latency is measured (submitted → appended there) and throughput counted.
const OBSERVER: OrgId = OrgId(1);
/// How often throughput and heights are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other}: expected on or off")),
    }
}

#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// Drive the network of processes in this directory (`chainify devnet up`) with SDK clients
    /// over gRPC, instead of an in-process network; its engines, policy, block size and
    /// execution are the network's own, and its Smallbank accounts are the keys.
    #[arg(long, conflicts_with_all = [
        "engines", "policy", "block_txs", "batch_timeout_ms", "cut", "keys", "execution", "crypto",
        "parallelism", "pipeline_depth", "look_ahead", "checkpoint_interval", "state_check_interval", "raw", "tamper", "fail", "dir",
        "postgres_url", "mysql_url",
    ])]
    devnet: Option<PathBuf>,
    /// Engine of each organization, comma-separated: sqlite, postgres or mariadb.
    #[arg(long, value_delimiter = ',', default_value = "sqlite,sqlite,sqlite")]
    engines: Vec<String>,
    /// PostgreSQL server URL (default: $CHAINIFY_TEST_POSTGRES_URL).
    #[arg(long)]
    postgres_url: Option<String>,
    /// MariaDB server URL (default: $CHAINIFY_TEST_MYSQL_URL).
    #[arg(long)]
    mysql_url: Option<String>,
    /// Agreement policy.
    #[arg(long, default_value = "any-2")]
    policy: String,
    /// Concurrent closed-loop clients.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Largest block the orderer cuts.
    #[arg(long, default_value_t = 256)]
    block_txs: usize,
    /// How long the orderer waits to fill a block, in milliseconds.
    #[arg(long, default_value_t = 10)]
    batch_timeout_ms: u64,
    /// When a partial block is cut: on-demand (as soon as an organization asks for it, so no
    /// block waits on the timeout while an organization is idle) or timeout (only after the
    /// batch timeout, as the solo and Kafka orderers do).
    #[arg(long, default_value = "on-demand")]
    cut: String,
    /// smallbank, smallbank-full, ycsb-a, ycsb-b or ycsb-c.
    #[arg(long, default_value = "smallbank")]
    workload: String,
    /// Smallbank accounts or YCSB records.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Key distribution: uniform, zipf, zipf:S or zipf:S:V.
    #[arg(long, default_value = "zipf")]
    distribution: String,
    /// YCSB: fields per record.
    #[arg(long, default_value_t = 10)]
    fields: usize,
    /// YCSB: characters per field.
    #[arg(long, default_value_t = 100)]
    field_length: usize,
    /// Seconds of load before measuring.
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    /// Seconds measured.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// Or measure until this many transactions are agreed after the warm-up (the duration then
    /// only bounds the run).
    #[arg(long)]
    transactions: Option<u64>,
    /// parallel (dependency-graph scheduling) or serial execution.
    #[arg(long, default_value = "parallel")]
    execution: String,
    /// on: every proposal, early-abort response and vote signed (Ed25519) and checked by ZIP 215
    /// (blocks in batches); rfc8032: checked one by one by RFC 8032 (networks made before ZIP
    /// 215); off: none (the network trusts everyone), to measure what signatures cost.
    #[arg(long, default_value = "on")]
    crypto: String,
    /// Transactions executing at once per organization, when parallel.
    #[arg(long, default_value_t = 8)]
    parallelism: usize,
    /// Blocks executed ahead of agreement.
    #[arg(long, default_value_t = 1)]
    pipeline_depth: u64,
    /// Validate and analyse a block the orderer already cut while the one before executes:
    /// on, or off (to measure what it saves).
    #[arg(long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    look_ahead: bool,
    /// Blocks between checkpoints.
    #[arg(long, default_value_t = 100)]
    checkpoint_interval: u64,
    /// Blocks between full scans of the tables against the state digest (in the background).
    #[arg(long, default_value_t = 100)]
    state_check_interval: u64,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for result.json and result.svg (created).
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// Where SQLite files go (kept, and the run's PostgreSQL and MariaDB databases too);
    /// default: a temporary directory, removed, and the server databases dropped.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Change an organization's database behind chainify's back, `ORG@SECONDS` (repeatable):
    /// it disagrees, restores its checkpoint and replays (the paper's Fig. 8).
    #[arg(long)]
    tamper: Vec<String>,
    /// Crash an organization's node, `ORG@SECONDS[+DOWN]` (repeatable; down 5 s unless given):
    /// it starts again and catches up.
    #[arg(long)]
    fail: Vec<String>,
    /// Then run the same transaction streams straight on each organization's engine (same
    /// clients, warm-up and duration, no chainify) and report the layer ÷ raw ratio.
    #[arg(long)]
    raw: bool,
}

struct Setup {
    faults: Vec<Fault>,
    cut: Cut,
    signatures: Signatures,
    workload: Workload,
    dist: KeyDistribution,
    record: YcsbRecord,
    mode: ExecMode,
}

impl BenchArgs {
    fn check(&self) -> anyhow::Result<Setup> {
        let workload: Workload = self
            .workload
            .parse()
            .map_err(|e| anyhow::anyhow!("--workload {e}"))?;
        let dist: KeyDistribution = self
            .distribution
            .parse()
            .map_err(|e| anyhow::anyhow!("--distribution {e}"))?;
        let record = YcsbRecord {
            fields: self.fields,
            field_length: self.field_length,
        };
        record
            .check()
            .map_err(|e| anyhow::anyhow!("--fields/--field-length: {e}"))?;
        let mode = match self.execution.as_str() {
            "parallel" if self.parallelism >= 1 => ExecMode::Parallel(self.parallelism),
            // A devnet's organizations execute as their configurations say.
            "as configured" if self.devnet.is_some() => ExecMode::Serial,
            "parallel" => bail!("--parallelism 0: at least 1"),
            "serial" => ExecMode::Serial,
            other => bail!("--execution {other:?}: parallel or serial"),
        };
        let signatures = match self.crypto.as_str() {
            "on" => Signatures::Ed25519Zip215,
            "rfc8032" => Signatures::Ed25519,
            "off" => Signatures::Off,
            other => {
                bail!("--crypto {other:?}: on (ZIP 215, batched), rfc8032 (one by one) or off")
            }
        };
        let cut: Cut = self.cut.parse().map_err(|e| anyhow::anyhow!("--cut {e}"))?;
        if self.engines.is_empty() || self.engines.len() > 16 {
            bail!("--engines: name 1 to 16 organizations' engines");
        }
        for (name, v, max) in [
            ("--warmup", self.warmup, 3600.0),
            ("--duration", self.duration, 86_400.0),
        ] {
            if !(v.is_finite() && v >= 0.0 && v <= max) {
                bail!("{name} {v}: 0 to {max} seconds");
            }
        }
        if self.duration <= 0.0 {
            bail!(
                "--duration {}: measure for more than 0 seconds",
                self.duration
            );
        }
        if self.transactions == Some(0) {
            bail!("--transactions 0: measure at least 1 transaction");
        }
        if !(1..=10_000).contains(&self.clients) {
            bail!("--clients {}: 1 to 10000", self.clients);
        }
        if self.keys < 10 {
            bail!("--keys {}: at least 10", self.keys);
        }
        if self.block_txs == 0 || self.checkpoint_interval == 0 || self.state_check_interval == 0 {
            bail!(
                "--block-txs, --checkpoint-interval and --state-check-interval must be at least 1"
            );
        }
        let mut faults = Vec::new();
        for (flag, texts) in [("--tamper", &self.tamper), ("--fail", &self.fail)] {
            for text in texts {
                let fault =
                    Fault::parse(flag, text, self.engines.len()).map_err(anyhow::Error::msg)?;
                if fault.at() >= self.warmup + self.duration {
                    bail!(
                        "{flag} {text:?}: the run ends at {} s",
                        self.warmup + self.duration
                    );
                }
                if flag == "--fail" && fault.org() == OBSERVER {
                    bail!(
                        "{flag} {text:?}: {OBSERVER} observes the latency; fail another organization"
                    );
                }
                faults.push(fault);
            }
        }
        faults.sort_by(|a, b| a.at().total_cmp(&b.at()));
        let orgs: BTreeSet<OrgId> = (1..=self.engines.len() as u32).map(OrgId).collect();
        let policy = self
            .policy
            .parse::<PolicySpec>()
            .and_then(|p| AgreementPolicy::new(&p, &orgs).map_err(|e| e.to_string()))
            .map_err(|e| anyhow::anyhow!("--policy {:?}: {e}", self.policy))?;
        for fault in &faults {
            // Organizations down at the same time (a tampered one repairs itself in a moment).
            let mut down: BTreeSet<OrgId> = faults
                .iter()
                .filter(|other| fault.overlaps(other))
                .map(Fault::org)
                .collect();
            down.insert(fault.org());
            let others: BTreeSet<OrgId> = orgs.difference(&down).copied().collect();
            if !policy.is_satisfied_by(&others) {
                bail!(
                    "--policy {}: the organizations other than {} cannot agree while {} \
                     tampered with or down; choose faults or a policy the others meet alone",
                    self.policy,
                    down.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(" and "),
                    if down.len() == 1 { "it is" } else { "they are" }
                );
            }
        }
        Ok(Setup {
            faults,
            cut,
            signatures,
            workload,
            dist,
            record,
            mode,
        })
    }
}

impl BenchArgs {
    /// The run's configuration in a line, for the progress and the picture.
    fn describe(&self, engines: &[String]) -> String {
        let (target, clients) = match &self.devnet {
            Some(dir) => (format!("devnet {}: ", dir.display()), "clients over gRPC"),
            None => (String::new(), "clients"),
        };
        format!(
            "{target}{} organizations ({}), policy {}, {} with {} keys ({}), {} {clients}, blocks of at most {} (cut {}), {} execution, crypto {}",
            engines.len(),
            engines.join(","),
            self.policy,
            self.workload,
            self.keys,
            self.distribution,
            self.clients,
            self.block_txs,
            self.cut,
            self.execution,
            self.crypto
        )
    }
}

pub fn run(args: &BenchArgs) -> anyhow::Result<std::process::ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Clients' channels are made (connecting lazily) on the runtime.
    let _entered = runtime.enter();
    let mut args = args.clone();
    let devnet = args.devnet.as_deref().map(Devnet::open).transpose()?;
    if let Some(devnet) = &devnet {
        // The network decides these; the report says what they were.
        if !args.workload.starts_with("smallbank") {
            bail!(
                "--workload {}: a devnet holds Smallbank's tables (smallbank or smallbank-full)",
                args.workload
            );
        }
        args.keys = devnet.accounts()?;
        args.engines = devnet.engines();
        args.block_txs = devnet.network.max_block_txs;
        args.batch_timeout_ms = u64::try_from(devnet.network.batch_timeout.as_millis())?;
        args.policy = devnet.policy();
        args.crypto = match devnet.network.signatures {
            Signatures::Ed25519Zip215 => "on",
            Signatures::Ed25519 => "rfc8032",
            Signatures::Off => "off",
        }
        .into();
        args.execution = "as configured".into();
    }
    let args = &args;
    let setup = args.check()?;
    let (dir, temporary) = scratch_dir(&args.dir, "bench")?;
    let local = devnet.is_none();
    let result = runtime.block_on(bench(args, &setup, &dir, devnet));
    if temporary {
        if local {
            runtime.block_on(drop_server_databases(args, &dir));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (report, agree) = result?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let json_path = args.out.join("result.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&report.json)? + "\n",
    )?;
    let svg_path = args.out.join("result.svg");
    std::fs::write(&svg_path, &report.svg)?;
    let text = format!(
        "{}  wrote {} and {}\n",
        report.text,
        json_path.display(),
        svg_path.display()
    );
    std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes())?;
    Ok(if agree {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

struct Report {
    json: serde_json::Value,
    svg: String,
    text: String,
}

/// Sums and counts of every phase of every running organization at one moment, with the
/// metrics they come from (a restarted node counts afresh).
type PhaseSnapshot = BTreeMap<OrgId, (Source, Vec<(f64, u64)>)>;

/// Whose histograms a snapshot read: a restarted node or process counts afresh, so the window's
/// figures must not subtract the old one's.
#[derive(Clone, Debug)]
enum Source {
    /// An in-process node's metrics (held, so that the allocation cannot be reused by the
    /// node that replaces it).
    Node(Arc<Metrics>),
    /// A devnet organization's processes, by the sum of their pids.
    Processes(u64),
}

impl PartialEq for Source {
    fn eq(&self, other: &Source) -> bool {
        match (self, other) {
            (Source::Node(a), Source::Node(b)) => Arc::ptr_eq(a, b),
            (Source::Processes(a), Source::Processes(b)) => a == b,
            _ => false,
        }
    }
}

fn phase_snapshot(cluster: &Cluster<SharedOrderer<LocalOrderer>>) -> PhaseSnapshot {
    cluster
        .orgs()
        .into_iter()
        .filter_map(|org| {
            let m: Arc<Metrics> = cluster.metrics(org)?;
            let sums = Phase::ALL
                .iter()
                .map(|p| (m.phase(*p).sum(), m.phase(*p).count()))
                .collect();
            Some((org, (Source::Node(m), sums)))
        })
        .collect()
}

/// What the injected faults did, as the run saw it.
#[derive(Default)]
struct FaultLog {
    /// (seconds, what happened), for the JSON and the markers.
    events: Vec<(f64, String)>,
    /// Crashed organizations and when to start them again.
    down: Vec<(OrgId, f64)>,
    /// Restarted organizations: when, the height to reach, when reached.
    catch_ups: Vec<(OrgId, f64, u64, Option<f64>)>,
    /// When each organization was last tampered with.
    tampered: BTreeMap<OrgId, f64>,
    /// Recovery reports seen per organization.
    reported: BTreeMap<OrgId, usize>,
    recoveries: Vec<serde_json::Value>,
}

impl FaultLog {
    /// Injects what is due at `t`, restarts what is due, and notes recoveries and catch-ups.
    async fn tick(
        &mut self,
        t: f64,
        due: &mut std::collections::VecDeque<Fault>,
        cluster: &mut Cluster<SharedOrderer<LocalOrderer>>,
        tamper_sql: &str,
        screen: &Screen,
    ) -> anyhow::Result<()> {
        while due.front().is_some_and(|f| f.at() <= t) {
            let Some(fault) = due.pop_front() else { break };
            let event = match fault {
                Fault::Tamper { org, .. } => {
                    cluster.tamper(org, tamper_sql).await?;
                    self.tampered.insert(org, t);
                    format!("{org} tampered")
                }
                Fault::Crash { org, down, .. } => {
                    cluster.crash(org).await?;
                    self.down.push((org, t + down));
                    format!("{org} crashed")
                }
            };
            screen.say(&format!("▸ {t:>5.1} s  {event}"));
            self.events.push((t, event));
        }
        let mut i = 0;
        while i < self.down.len() {
            let (org, when) = self.down[i];
            if when <= t {
                self.down.remove(i);
                self.restart(t, org, cluster, screen).await?;
            } else {
                i += 1;
            }
        }
        let statuses = cluster.statuses();
        for (org, started, target, caught) in &mut self.catch_ups {
            let next = statuses.get(org).map_or(0, |s| s.next_block.0);
            if caught.is_none() && next >= *target {
                *caught = Some(t);
                screen.say(&format!(
                    "▸ {t:>5.1} s  {org} caught up (block {}) {:.2} s after its restart",
                    next.saturating_sub(1),
                    t - *started
                ));
            }
        }
        for (org, status) in &statuses {
            let seen = self.reported.entry(*org).or_insert(0);
            if status.recoveries.len() < *seen {
                *seen = 0; // a restarted node reports afresh
            }
            for r in status.recoveries.iter().skip(*seen) {
                let since = self.tampered.get(org).map(|at| t - at);
                screen.say(&format!(
                    "▸ {t:>5.1} s  {org} disagreed at block {}: restored checkpoint {}, replayed {} blocks, agreed again in {:.0} ms",
                    r.block,
                    r.checkpoint.map_or("none".into(), |c| c.to_string()),
                    r.replayed,
                    r.elapsed.as_secs_f64() * 1e3
                ));
                self.recoveries.push(json!({
                    "org": org.to_string(), "seen_at_s": t, "block": r.block.0,
                    "checkpoint": r.checkpoint.map(|c| c.0), "replayed": r.replayed,
                    "restore_ms": r.restore.as_secs_f64() * 1e3,
                    "replay_ms": r.replay.as_secs_f64() * 1e3,
                    "disagreement_to_agreed_ms": r.elapsed.as_secs_f64() * 1e3,
                    "tamper_to_seen_s": since,
                }));
            }
            *seen = status.recoveries.len();
        }
        Ok(())
    }

    async fn restart(
        &mut self,
        t: f64,
        org: OrgId,
        cluster: &mut Cluster<SharedOrderer<LocalOrderer>>,
        screen: &Screen,
    ) -> anyhow::Result<()> {
        cluster.restart(org).await?;
        let target = cluster.status(OBSERVER)?.next_block.0;
        self.catch_ups.push((org, t, target, None));
        let event = format!("{org} restarted");
        screen.say(&format!("▸ {t:>5.1} s  {event}"));
        self.events.push((t, event));
        Ok(())
    }

    /// Starts every organization still down (the run ended first).
    async fn restart_all(
        &mut self,
        t: f64,
        cluster: &mut Cluster<SharedOrderer<LocalOrderer>>,
        screen: &Screen,
    ) -> anyhow::Result<()> {
        for (org, _) in std::mem::take(&mut self.down) {
            self.restart(t, org, cluster, screen).await?;
        }
        Ok(())
    }
}

/// One generator per client, seeded per client, identical for the layer and the raw runs.
fn generators_for(args: &BenchArgs, setup: &Setup) -> Vec<crate::drive::Generator> {
    (0..args.clients)
        .map(|i| {
            setup.workload.generator(
                args.keys,
                &setup.dist,
                setup.record,
                args.seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
            )
        })
        .collect()
}

/// What a run drives: an in-process network, or a devnet of processes.
enum Net {
    Local(Box<Cluster<SharedOrderer<LocalOrderer>>>),
    Devnet(Box<Devnet>),
}

impl Net {
    /// Every organization's newest agreed block.
    async fn heights(&self) -> anyhow::Result<BTreeMap<OrgId, u64>> {
        match self {
            Net::Local(cluster) => Ok(cluster
                .statuses()
                .iter()
                .map(|(org, s)| (*org, s.next_block.0.saturating_sub(1)))
                .collect()),
            Net::Devnet(devnet) => devnet.heights().await,
        }
    }

    async fn phases(&self) -> PhaseSnapshot {
        match self {
            Net::Local(cluster) => phase_snapshot(cluster),
            Net::Devnet(devnet) => devnet
                .phases()
                .await
                .into_iter()
                .map(|(org, (pids, sums))| (org, (Source::Processes(pids), sums)))
                .collect(),
        }
    }
}

/// What the sampling loop saw.
struct Measured {
    committed_series: Vec<(f64, u64)>,
    heights_series: BTreeMap<OrgId, Vec<(f64, f64)>>,
    /// At the end of the warm-up: time, committed, succeeded, latencies recorded, phases.
    t0: Duration,
    committed0: u64,
    succeeded0: u64,
    latency0: usize,
    phases0: PhaseSnapshot,
    end: Duration,
    committed_end: u64,
    succeeded_end: u64,
    phases_end: PhaseSnapshot,
    /// Blocks the observing organization agreed during the measured window.
    blocks_measured: u64,
    faults: FaultLog,
}

/// Samples throughput, heights and phases every [`SAMPLE_EVERY`] until warm-up and duration
/// have passed, injecting the faults of an in-process network on schedule.
async fn measure(
    args: &BenchArgs,
    setup: &Setup,
    net: &mut Net,
    counters: &Counters,
    (screen, begin): (&Screen, Instant),
) -> anyhow::Result<Measured> {
    let warmup = Duration::from_secs_f64(args.warmup);
    let total = warmup + Duration::from_secs_f64(args.duration);
    let mut plain_due = Instant::now() + PLAIN_PROGRESS_EVERY;
    let mut committed_series: Vec<(f64, u64)> = vec![(0.0, 0)];
    let mut heights_series: BTreeMap<OrgId, Vec<(f64, f64)>> = BTreeMap::new();
    let mut at_warmup = None;
    let mut last_heights: BTreeMap<OrgId, u64> = BTreeMap::new();
    let mut blocks_end;
    let mut skipped = 0u64;
    let mut due: std::collections::VecDeque<Fault> = setup.faults.iter().cloned().collect();
    let mut faults = FaultLog::default();
    let succeeded = || counters.succeeded.load(Ordering::Relaxed);
    loop {
        tokio::time::sleep(SAMPLE_EVERY).await;
        if let Net::Local(cluster) = net {
            let t = begin.elapsed().as_secs_f64();
            let sql = setup.workload.tamper_sql();
            faults.tick(t, &mut due, cluster, sql, screen).await?;
        }
        let t = begin.elapsed();
        let committed = counters.committed.load(Ordering::Relaxed);
        committed_series.push((t.as_secs_f64(), committed));
        // A status call that misses its deadline on busy cores costs one sample, not the run.
        let heights = match net.heights().await {
            Ok(heights) => {
                for (org, h) in &heights {
                    heights_series
                        .entry(*org)
                        .or_default()
                        .push((t.as_secs_f64(), *h as f64));
                }
                last_heights = heights.clone();
                heights
            }
            Err(e) => {
                skipped += 1;
                if skipped == 1 {
                    screen.say(&format!("▸ heights not read, sample skipped: {e:#}"));
                }
                last_heights.clone()
            }
        };
        let observer_height = heights.get(&OBSERVER).copied().unwrap_or(0);
        if at_warmup.is_none() && t >= warmup {
            let latencies = counters
                .latencies_us
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len();
            at_warmup = Some((
                t,
                committed,
                succeeded(),
                latencies,
                net.phases().await,
                observer_height,
            ));
        }
        screen.progress(
            t.min(total),
            &format!(
                "{} {committed} tx · blocks {}",
                if t < warmup { "warm-up" } else { "measuring" },
                heights
                    .iter()
                    .map(|(org, h)| format!("{org} {h}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            &mut plain_due,
        );
        let counted = match (args.transactions, &at_warmup) {
            (Some(n), Some((_, committed0, ..))) => committed - committed0 >= n,
            _ => false,
        };
        blocks_end = observer_height;
        if t >= total || counted {
            break;
        }
    }
    let end = begin.elapsed();
    let (committed_end, succeeded_end) = (counters.committed.load(Ordering::Relaxed), succeeded());
    let phases_end = net.phases().await;
    if let Net::Local(cluster) = net {
        faults
            .restart_all(begin.elapsed().as_secs_f64(), cluster, screen)
            .await?;
    }
    let Some((t0, committed0, succeeded0, latency0, phases0, blocks0)) = at_warmup else {
        bail!("the run ended before the warm-up did");
    };
    if skipped > 0 {
        eprintln!("chainify bench: {skipped} height samples skipped (status calls failed)");
    }
    Ok(Measured {
        committed_series,
        heights_series,
        t0,
        committed0,
        succeeded0,
        latency0,
        phases0,
        end,
        committed_end,
        succeeded_end,
        phases_end,
        blocks_measured: blocks_end.saturating_sub(blocks0),
        faults,
    })
}

/// Waits until every organization has agreed on `target`, as long as the slowest one makes
/// progress: an engine that fell behind under the load (the agreement policy goes on without
/// it) catches up at its own pace, and only `SETTLE` without progress fails.
async fn settle(net: &Net, target: u64) -> anyhow::Result<()> {
    let mut progress = Progress::new(Instant::now());
    loop {
        let heights = net.heights().await;
        if heights
            .as_ref()
            .is_ok_and(|h| h.values().all(|h| *h >= target))
        {
            return Ok(());
        }
        let lowest = heights
            .as_ref()
            .ok()
            .and_then(|h| h.values().min().copied());
        if !progress.goes_on(lowest, Instant::now()) {
            bail!(
                "the organizations did not all reach block {target}: no progress for {SETTLE:?}: {:?}",
                heights.map_err(|e| format!("{e:#}"))
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The slowest organization's height while settling, and until when it may stay there.
#[derive(Debug)]
struct Progress {
    slowest: u64,
    deadline: Instant,
}

impl Progress {
    fn new(now: Instant) -> Progress {
        Progress {
            slowest: 0,
            deadline: now + SETTLE,
        }
    }

    /// Whether to wait on, given the slowest height now (`None`: unknown, no progress).
    fn goes_on(&mut self, lowest: Option<u64>, now: Instant) -> bool {
        if let Some(lowest) = lowest
            && lowest > self.slowest
        {
            self.slowest = lowest;
            self.deadline = now + SETTLE;
        }
        now < self.deadline
    }
}

/// What names this run's databases on the servers.
fn run_tag() -> String {
    format!("bench_{}", std::process::id())
}

/// Drops the databases this run made on the PostgreSQL and MariaDB servers (the organizations'
/// and the raw baseline's), whether or not it got as far as making them. A database that cannot
/// be dropped is named on stderr: the results stand.
async fn drop_server_databases(args: &BenchArgs, dir: &std::path::Path) {
    let tag = run_tag();
    for (i, engine) in args.engines.iter().enumerate() {
        if engine == "sqlite" {
            continue;
        }
        let org = i + 1;
        for name in [format!("{tag}_org{org}"), format!("{tag}_raw_org{org}")] {
            let dropped = match engine_url(engine, dir, &name, &args.postgres_url, &args.mysql_url)
            {
                Ok(url) => chainify_storage::drop_database(&url)
                    .await
                    .map_err(anyhow::Error::from),
                Err(e) => Err(e),
            };
            if let Err(e) = dropped {
                eprintln!("chainify bench: database {name} was left on the {engine} server: {e}");
            }
        }
    }
}

async fn bench(
    args: &BenchArgs,
    setup: &Setup,
    dir: &std::path::Path,
    devnet: Option<Devnet>,
) -> anyhow::Result<(Report, bool)> {
    let tag = run_tag();
    let mut net = match devnet {
        Some(devnet) => {
            eprintln!(
                "chainify bench: the devnet in {} ({}), {} clients over gRPC, {:.0} s warm-up + {:.0} s",
                devnet.dir.display(),
                devnet.engines().join(","),
                args.clients,
                args.warmup,
                args.duration
            );
            Net::Devnet(Box::new(devnet))
        }
        None => Net::Local(Box::new(start_local(args, setup, dir, &tag).await?)),
    };
    let generators = generators_for(args, setup);
    let (local_load, remote_load, counters) = match &net {
        Net::Local(cluster) => {
            let load = Load::start(cluster, OBSERVER, generators)?;
            let counters = load.counters.clone();
            (Some(load), None, counters)
        }
        Net::Devnet(devnet) => {
            let load = RemoteLoad::start(devnet, generators).await?;
            let counters = load.counters.clone();
            (None, Some(load), counters)
        }
    };
    let total = Duration::from_secs_f64(args.warmup + args.duration);
    let (screen, begin) = (Screen::new(total), Instant::now());
    let measured = measure(args, setup, &mut net, &counters, (&screen, begin)).await?;
    let mut refused = None;
    if let Some(load) = local_load {
        load.stop().await?;
    }
    if let Some(load) = remote_load {
        refused = Some(load.refused.load(Ordering::Relaxed));
        load.stop().await?;
    }
    let heights = net.heights().await?;
    let target = heights.values().copied().max().unwrap_or(0);
    settle(&net, target).await?;
    let mut faults = measured.faults;
    let (agreement, engines, orgs) = match &mut net {
        Net::Local(cluster) => {
            // Catch-ups and recoveries that completed while settling, at the time they are seen.
            let mut none = std::collections::VecDeque::new();
            let sql = setup.workload.tamper_sql();
            let t = begin.elapsed().as_secs_f64();
            faults.tick(t, &mut none, cluster, sql, &screen).await?;
            let orgs = cluster.orgs();
            let agreement = cluster
                .check_consistent(&orgs)
                .await
                .map_err(|e| e.to_string());
            (agreement, args.engines.clone(), orgs.len())
        }
        Net::Devnet(devnet) => (
            devnet.ledgers_agree().await?,
            devnet.engines(),
            devnet.network.orgs.len(),
        ),
    };
    screen.finish();
    let measured = Measured { faults, ..measured };
    let mut report = report(
        args, &engines, orgs, &measured, &counters, &agreement, target, refused,
    );
    if let Net::Local(cluster) = net {
        cluster.shutdown().await?;
        if args.raw {
            raw(args, setup, dir, &tag, &mut report).await?;
        }
    }
    let all_agree = agreement.is_ok();
    Ok((
        Report {
            json: report.json,
            svg: report.svg,
            text: report.text,
        },
        all_agree,
    ))
}

/// Prepares the organizations' databases and starts an in-process network on them.
async fn start_local(
    args: &BenchArgs,
    setup: &Setup,
    dir: &std::path::Path,
    tag: &str,
) -> anyhow::Result<Cluster<SharedOrderer<LocalOrderer>>> {
    let mut urls = Vec::new();
    for (i, engine) in args.engines.iter().enumerate() {
        let name = format!("{tag}_org{}", i + 1);
        urls.push(engine_url(
            engine,
            &dir.join(format!("org{}.db", i + 1)),
            &name,
            &args.postgres_url,
            &args.mysql_url,
        )?);
    }
    eprintln!(
        "chainify bench: {}, {:.0} s warm-up + {:.0} s",
        args.describe(&args.engines),
        args.warmup,
        args.duration
    );
    for (i, url) in urls.iter().enumerate() {
        setup
            .workload
            .prepare(url, args.keys, setup.record)
            .await
            .with_context(|| format!("preparing org{}'s database", i + 1))?;
    }
    let mut spec = ClusterSpec::generate(
        "bench",
        &args.policy,
        args.block_txs,
        Duration::from_millis(args.batch_timeout_ms),
        &urls,
        setup.workload.tables(),
    )
    .context("the bench network")?;
    std::sync::Arc::make_mut(&mut spec.network).signatures = setup.signatures;
    spec.settings = NodeSettings {
        mode: setup.mode,
        checkpoint_interval: args.checkpoint_interval,
        state_check_interval: args.state_check_interval,
        pipeline_depth: args.pipeline_depth,
        look_ahead: args.look_ahead,
        ..NodeSettings::default()
    };
    spec.store_options.max_connections = u32::try_from(args.parallelism + 2).unwrap_or(u32::MAX);
    let orderer = LocalOrderer::start_cutting(
        spec.network.network_id.clone(),
        spec.network.max_block_txs,
        spec.network.batch_timeout,
        setup.cut,
    );
    Ok(Cluster::start(spec, SharedOrderer(Arc::new(orderer))).await?)
}

/// A report being assembled: the layer's figures, then possibly the raw baseline's.
struct Draft {
    tps: f64,
    heading: String,
    detail: String,
    panels: Vec<Panel>,
    json: serde_json::Value,
    svg: String,
    text: String,
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &BenchArgs,
    engines: &[String],
    orgs: usize,
    m: &Measured,
    counters: &Counters,
    agreement: &Result<usize, String>,
    blocks: u64,
    refused: Option<u64>,
) -> Draft {
    let measured = (m.end - m.t0).as_secs_f64();
    // What was recorded in the measured window, sorted for percentiles.
    let measured_window = |recorded: &Mutex<Vec<u64>>| {
        let mut window: Vec<u64> = recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(m.latency0..)
            .map(<[u64]>::to_vec)
            .unwrap_or_default();
        window.sort_unstable();
        window
    };
    let latencies = measured_window(&counters.latencies_us);
    let admissions = measured_window(&counters.admissions_us);
    let committed = m.committed_end - m.committed0;
    let succeeded = m.succeeded_end - m.succeeded0;
    let tps = succeeded as f64 / measured;
    let quantiles = [("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p999", 0.999)];
    let latency: Vec<(String, f64)> = quantiles
        .iter()
        .filter_map(|(n, q)| Some(((*n).to_owned(), percentile(&latencies, *q)?)))
        .collect();
    let admission: Vec<(String, f64)> = quantiles[..2]
        .iter()
        .filter_map(|(n, q)| Some(((*n).to_owned(), percentile(&admissions, *q)?)))
        .collect();
    // Mean time per observation of each phase during the measured window, per organization.
    let mut phases = serde_json::Map::new();
    let mut phase_bars = Vec::new();
    for (i, phase) in Phase::ALL.iter().enumerate() {
        let mut per_org = serde_json::Map::new();
        let mut means = Vec::new();
        for (org, (token, end)) in &m.phases_end {
            let (s0, c0) = m
                .phases0
                .get(org)
                .filter(|(t, _)| t == token)
                .and_then(|(_, v)| v.get(i).copied())
                .unwrap_or((0.0, 0));
            let (s1, c1) = end[i];
            if c1 > c0 {
                let mean_ms = (s1 - s0) / (c1 - c0) as f64 * 1e3;
                per_org.insert(
                    org.to_string(),
                    json!({ "mean_ms": mean_ms, "count": c1 - c0 }),
                );
                means.push(mean_ms);
            }
        }
        if !means.is_empty() {
            phase_bars.push((
                phase.name().to_owned(),
                means.iter().sum::<f64>() / means.len() as f64,
            ));
        }
        phases.insert(phase.name().to_owned(), serde_json::Value::Object(per_org));
    }
    let throughput: Vec<(f64, f64)> = m
        .committed_series
        .windows(2)
        .map(|w| (w[1].0, (w[1].1 - w[0].1) as f64 / (w[1].0 - w[0].0)))
        .collect();
    let heading = format!("chainify bench: {tps:.0} successful transactions per second");
    let t0 = m.t0.as_secs_f64();
    let detail = format!(
        "{}, {measured:.0} s measured after {t0:.0} s warm-up",
        args.describe(engines)
    );
    let mut markers = vec![(t0, "measured from here".to_owned())];
    markers.extend(m.faults.events.iter().cloned());
    let where_appended = if args.devnet.is_some() {
        "agreed at the clients' organizations"
    } else {
        "appended at org1"
    };
    let panels = vec![
        Panel::Lines {
            title: "Throughput (transactions agreed per second)".into(),
            x_label: "seconds since start".into(),
            y_label: "tx/s".into(),
            series: vec![(where_appended.into(), throughput.clone())],
            markers: markers.clone(),
        },
        Panel::Bars {
            title: "Latency, submitted → agreed (measured window)".into(),
            unit: "ms".into(),
            bars: latency.clone(),
        },
        Panel::Lines {
            title: "Commit timeline per organization".into(),
            x_label: "seconds since start".into(),
            y_label: "agreed block".into(),
            series: m
                .heights_series
                .iter()
                .map(|(org, s)| (org.to_string(), s.clone()))
                .collect(),
            markers,
        },
        Panel::Bars {
            title: "Mean time per phase and block".into(),
            unit: "ms".into(),
            bars: phase_bars.clone(),
        },
    ];
    let svg = render(&heading, &detail, &panels);
    let faults = &m.faults;
    let json = json!({
        "config": {
            "target": args.devnet.as_ref().map_or("in-process".into(), |d| format!("devnet {}", d.display())),
            "orgs": orgs,
            "engines": engines, "policy": args.policy, "clients": args.clients,
            "block_txs": args.block_txs, "batch_timeout_ms": args.batch_timeout_ms,
            "workload": args.workload, "keys": args.keys, "distribution": args.distribution,
            "fields": args.fields, "field_length": args.field_length,
            "warmup_s": args.warmup, "duration_s": args.duration, "transactions": args.transactions,
            "execution": args.execution,
            "crypto": args.crypto, "parallelism": args.parallelism, "pipeline_depth": args.pipeline_depth,
            "look_ahead": if args.look_ahead { "on" } else { "off" },
            "checkpoint_interval": args.checkpoint_interval,
            "state_check_interval": args.state_check_interval, "seed": args.seed,
        },
        "measured_s": measured,
        "committed": committed,
        "succeeded": succeeded,
        "failed_submissions": refused,
        "successful_tps": tps,
        "latency_ms": latency
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect::<serde_json::Map<_, _>>(),
        "admission_ms": admission
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect::<serde_json::Map<_, _>>(),
        "blocks": blocks,
        "blocks_measured": m.blocks_measured,
        "transactions_reached": args.transactions.map(|n| committed >= n),
        "phases": phases,
        "throughput_series": throughput,
        "heights_series": m.heights_series.iter().map(|(o, s)| (o.to_string(), json!(s))).collect::<serde_json::Map<_, _>>(),
        "faults": faults.events.iter().map(|(t, e)| json!({ "at_s": t, "event": e })).collect::<Vec<_>>(),
        "recoveries": faults.recoveries,
        "catch_ups": faults.catch_ups.iter().map(|(org, at, target, caught)| json!({
            "org": org.to_string(), "restarted_at_s": at, "target_block": target.saturating_sub(1),
            "caught_up_after_s": caught.map(|c| c - at),
        })).collect::<Vec<_>>(),
        "all_agree": agreement.is_ok(),
        "disagreement": agreement.as_ref().err(),
    });
    let mut text = format!(
        "\nchainify bench ({measured:.1} s measured after {t0:.1} s warm-up)\n  successful TPS     {tps:.0} ({succeeded} of {committed} agreed{})\n  latency            {}{}\n  blocks             {blocks} ({} in the measured window)\n  phases (mean ms)   {}\n  agreement          {}\n",
        refused.map_or(String::new(), |r| format!(
            "; {r} submissions failed and were skipped"
        )),
        latency
            .iter()
            .map(|(n, v)| format!("{n} {v:.1} ms"))
            .collect::<Vec<_>>()
            .join(", "),
        if admission.is_empty() {
            String::new()
        } else {
            format!(
                " after admission ({})",
                admission
                    .iter()
                    .map(|(n, v)| format!("{n} {v:.1} ms"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        m.blocks_measured,
        phase_bars
            .iter()
            .map(|(n, v)| format!("{n} {v:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        match agreement {
            Ok(n) => format!("every organization agrees on {n} blocks"),
            Err(e) => format!("DISAGREEMENT: {e}"),
        }
    );
    if let Some(n) = args.transactions.filter(|n| committed < *n) {
        text.push_str(&format!(
            "  NOTE               --duration ended the run before --transactions {n} were agreed\n"
        ));
    }
    for r in &faults.recoveries {
        text.push_str(&format!(
            "  recovery           {} at block {}: restore {:.0} ms + replay of {} blocks {:.0} ms, disagreement → agreed {:.0} ms\n",
            r["org"].as_str().unwrap_or("?"),
            r["block"],
            r["restore_ms"].as_f64().unwrap_or(0.0),
            r["replayed"],
            r["replay_ms"].as_f64().unwrap_or(0.0),
            r["disagreement_to_agreed_ms"].as_f64().unwrap_or(0.0),
        ));
    }
    for (org, at, _, caught) in &faults.catch_ups {
        text.push_str(&match caught {
            Some(c) => format!(
                "  catch-up           {org} {:.2} s after its restart\n",
                c - at
            ),
            None => format!("  catch-up           {org} had not caught up when the run ended\n"),
        });
    }
    Draft {
        tps,
        heading,
        detail,
        panels,
        json,
        svg,
        text,
    }
}

/// The same transaction streams straight on each organization's engine, beside the layer.
async fn raw(
    args: &BenchArgs,
    setup: &Setup,
    dir: &std::path::Path,
    tag: &str,
    draft: &mut Draft,
) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut bars = vec![("chainify".to_owned(), draft.tps)];
    for (i, engine) in args.engines.iter().enumerate() {
        let org = i + 1;
        let url = engine_url(
            engine,
            &dir.join(format!("raw_org{org}.db")),
            &format!("{tag}_raw_org{org}"),
            &args.postgres_url,
            &args.mysql_url,
        )?;
        setup
            .workload
            .prepare(&url, args.keys, setup.record)
            .await
            .with_context(|| format!("preparing the raw database of org{org}"))?;
        eprintln!(
            "▸ raw baseline on org{org}'s engine ({engine}): {} clients, no chainify",
            args.clients
        );
        let result = crate::raw::run(
            &url,
            &setup.workload.schema_sql(setup.record),
            generators_for(args, setup),
            Duration::from_secs_f64(args.warmup),
            Duration::from_secs_f64(args.duration),
        )
        .await
        .with_context(|| format!("raw baseline on {engine}"))?;
        let ratio = draft.tps / result.tps().max(f64::MIN_POSITIVE);
        rows.push(json!({
            "org": format!("org{org}"), "engine": engine,
            "successful_tps": result.tps(), "aborted": result.aborted,
            "retries": result.retries, "seconds": result.seconds,
            "layer_over_raw": ratio,
        }));
        draft.text.push_str(&format!(
            "  raw org{org} {engine:<9} {:.0} successful tx/s ({} aborted, {} retries); chainify ÷ raw = {ratio:.2}\n",
            result.tps(),
            result.aborted,
            result.retries
        ));
        bars.push((format!("raw org{org} ({engine})"), result.tps()));
    }
    draft.json["raw"] = serde_json::Value::Array(rows);
    draft.panels.push(Panel::Bars {
        title: "Successful TPS: chainify vs each engine raw".into(),
        unit: "tx/s".into(),
        bars,
    });
    draft.svg = render(&draft.heading, &draft.detail, &draft.panels);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settling_waits_while_the_slowest_organization_advances_and_not_after() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        assert!(p.goes_on(Some(10), t0));
        // Slow but advancing: well past one SETTLE from the start, still waiting.
        assert!(p.goes_on(Some(11), t0 + SETTLE - Duration::from_secs(1)));
        assert!(p.goes_on(Some(12), t0 + 2 * SETTLE - Duration::from_secs(2)));
        // Stuck (or unknown heights): a full SETTLE after the last advance, it gives up.
        assert!(p.goes_on(Some(12), t0 + 3 * SETTLE - Duration::from_secs(3)));
        assert!(p.goes_on(None, t0 + 3 * SETTLE - Duration::from_secs(3)));
        assert!(!p.goes_on(Some(12), t0 + 3 * SETTLE - Duration::from_secs(2)));
        // Going back (a restarted organization reports less) is not progress.
        let mut q = Progress::new(t0);
        assert!(q.goes_on(Some(5), t0));
        assert!(!q.goes_on(Some(3), t0 + SETTLE));
    }
}
