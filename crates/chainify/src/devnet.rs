//! `chainify devnet up|down|status|start|stop`: a development network of separate processes on
//! loopback, everything under one directory.
//!
//! `up` creates one database per organization on the chosen engine (a fresh SQLite file, or a
//! fresh database on the PostgreSQL / MariaDB server given), loads Smallbank into it, writes
//! keys, certificates and configuration with `init`, and starts the solo orderer (unless Kafka
//! is used) and one `chainify node` per organization, each detached, with its log and pid file:
//! `DIR/orderer.{log,pid}`, `DIR/orgN/node.{log,pid}`. `down` stops them (SIGTERM, then
//! SIGKILL after a grace period). The database servers and Kafka are not started here: `just
//! devnet` starts throw-away ones with `cargo xtask services` first.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chainify_core::config::{CutRule, OrgConfig};
use chainify_workload::YcsbRecord;
use serde_json::json;

use crate::init::InitArgs;
use crate::serve::runtime;
use chainify_bench::devnet::{ACCOUNTS_FILE, pid_file, processes, read_pid};
use chainify_bench::drive::{Workload, engine_url, server_url};
use chainify_client::operator;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum DevnetCommand {
    /// Create and start a network.
    Up(UpArgs),
    /// Stop every process of the network (the databases are kept).
    Down(DirArg),
    /// The status of every organization.
    Status(DirArg),
    /// Start one organization's processes (or one of its components) again.
    Start(OrgArg),
    /// Stop one organization's processes (or one component), gracefully or with --kill as a
    /// crash.
    Stop(OrgArg),
}

#[derive(Debug, clap::Args)]
pub(crate) struct DirArg {
    /// The network's directory.
    #[arg(long)]
    dir: PathBuf,
}

#[derive(Debug, clap::Args)]
pub(crate) struct OrgArg {
    /// The network's directory.
    #[arg(long)]
    dir: PathBuf,
    /// The organization.
    #[arg(long)]
    org: u32,
    /// SIGKILL instead of SIGTERM (stop only).
    #[arg(long)]
    kill: bool,
    /// Only this component (execution, commit or chainify) of a network started with --split.
    #[arg(long)]
    component: Option<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct UpArgs {
    /// Directory for configuration, keys, logs and SQLite files (must not hold a network).
    #[arg(long)]
    dir: PathBuf,
    /// Engine of each organization, comma-separated: postgres, mariadb or sqlite.
    #[arg(long, value_delimiter = ',', default_value = "sqlite,sqlite,sqlite")]
    engines: Vec<String>,
    /// Agreement policy.
    #[arg(long, default_value = "any-2")]
    policy: String,
    /// solo or kafka.
    #[arg(long, default_value = "solo")]
    orderer: String,
    /// Kafka bootstrap servers (default: $CHAINIFY_TEST_KAFKA_BROKERS).
    #[arg(long)]
    kafka_brokers: Option<String>,
    /// PostgreSQL server URL (default: $CHAINIFY_TEST_POSTGRES_URL).
    #[arg(long)]
    postgres_url: Option<String>,
    /// MariaDB server URL (default: $CHAINIFY_TEST_MYSQL_URL).
    #[arg(long)]
    mysql_url: Option<String>,
    /// Smallbank accounts loaded into every database.
    #[arg(long, default_value_t = 1000)]
    accounts: u64,
    /// First port (see `init`).
    #[arg(long, default_value_t = 17100)]
    base_port: u16,
    /// Block size.
    #[arg(long, default_value_t = 256)]
    block_txs: usize,
    /// Time-to-cut.
    #[arg(long, default_value_t = 50)]
    batch_timeout_ms: u64,
    /// `on-demand` (an organization waiting for the block cuts it; Kafka) or `timeout`.
    #[arg(long, default_value = "on-demand")]
    cut: CutRule,
    /// Checkpoint interval in blocks.
    #[arg(long, default_value_t = 20)]
    checkpoint_interval: u64,
    /// Clients (client1 …).
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// Restricted grants (see `init --grant`).
    #[arg(long = "grant")]
    grants: Vec<String>,
    /// Plaintext gRPC.
    #[arg(long)]
    no_tls: bool,
    /// No signatures (see `init --unsigned`): to measure what they cost.
    #[arg(long)]
    unsigned: bool,
    /// Run each organization's components as three processes (execution, commit, chainify)
    /// instead of one.
    #[arg(long)]
    split: bool,
}

pub(crate) fn run(command: &DevnetCommand) -> anyhow::Result<()> {
    match command {
        DevnetCommand::Up(args) => up(args),
        DevnetCommand::Down(d) => down(&d.dir),
        DevnetCommand::Status(d) => status(&d.dir),
        DevnetCommand::Start(o) => {
            for process in selected(&o.dir, o.component.as_deref())? {
                start_process(&o.dir, o.org, process)?;
            }
            Ok(())
        }
        DevnetCommand::Stop(o) => {
            for process in selected(&o.dir, o.component.as_deref())?.into_iter().rev() {
                stop_pid(&pid_file(&o.dir, o.org, process), o.kill)?;
            }
            Ok(())
        }
    }
}

/// The processes `component` names (all of the organization's when `None`).
fn selected(dir: &Path, component: Option<&str>) -> anyhow::Result<Vec<&'static str>> {
    let all = processes(dir);
    match component {
        None => Ok(all),
        Some(c) => match all.iter().find(|p| **p == c) {
            Some(p) => Ok(vec![*p]),
            None => bail!(
                "--component {c:?}: this network's processes per organization are {}",
                all.join(", ")
            ),
        },
    }
}

fn log_file(dir: &Path, org: u32, process: &str) -> PathBuf {
    dir.join(format!("org{org}/{process}.log"))
}

/// A name unique to this network, for databases and the Kafka topic.
fn tag(dir: &Path) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let base: String = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    format!("devnet_{base}_{}", millis % 1_000_000_000)
}

fn up(args: &UpArgs) -> anyhow::Result<()> {
    let dir = std::path::absolute(&args.dir)?;
    if dir.join("network.toml").exists() {
        bail!(
            "{} already holds a network; `devnet down` it and choose another --dir",
            dir.display()
        );
    }
    let orgs = u32::try_from(args.engines.len()).context("--engines: too many")?;
    if orgs == 0 {
        bail!("--engines: name at least one engine");
    }
    let tag = tag(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut urls = Vec::new();
    for (i, engine) in args.engines.iter().enumerate() {
        let name = format!("{tag}_org{}", i + 1);
        let org_dir = dir.join(format!("org{}", i + 1));
        if engine == "sqlite" {
            std::fs::create_dir_all(&org_dir)?;
        }
        urls.push(engine_url(
            engine,
            &org_dir.join("state.db"),
            &name,
            &args.postgres_url,
            &args.mysql_url,
        )?);
    }
    let kafka_brokers = match args.orderer.as_str() {
        "kafka" => Some(server_url(
            &args.kafka_brokers,
            "CHAINIFY_TEST_KAFKA_BROKERS",
            "--kafka-brokers",
        )?),
        "solo" => None,
        other => bail!("--orderer {other:?}: choose solo or kafka"),
    };
    runtime()?.block_on(async {
        for (i, url) in urls.iter().enumerate() {
            Workload::Smallbank
                .prepare(url, args.accounts, YcsbRecord::default())
                .await
                .with_context(|| format!("database of org{}", i + 1))?;
        }
        anyhow::Ok(())
    })?;
    crate::init::run(&InitArgs {
        orgs,
        clients: args.clients,
        grants: args.grants.clone(),
        out: dir.clone(),
        policy: args.policy.clone(),
        network_id: "devnet".into(),
        base_port: args.base_port,
        orderer: args.orderer.clone(),
        kafka_brokers,
        kafka_topic: Some(tag.replace('_', "-")),
        kafka_replication: 1,
        hosts: Vec::new(),
        databases: urls,
        tables: vec!["accounts".into(), "savings".into(), "checking".into()],
        block_txs: args.block_txs,
        batch_timeout_ms: args.batch_timeout_ms,
        cut: args.cut,
        checkpoint_interval: args.checkpoint_interval,
        no_tls: args.no_tls,
        unsigned: args.unsigned,
    })?;
    std::fs::write(dir.join("layout"), if args.split { "split" } else { "all" })?;
    // `chainify bench --devnet` draws keys from the accounts that exist.
    std::fs::write(dir.join(ACCOUNTS_FILE), format!("{}\n", args.accounts))?;
    if args.orderer == "solo" {
        spawn(
            &dir,
            &[
                "orderer",
                "--network",
                &dir.join("network.toml").to_string_lossy(),
            ],
            &dir.join("orderer.log"),
            &dir.join("orderer.pid"),
        )?;
    }
    for org in 1..=orgs {
        for process in processes(&dir) {
            start_process(&dir, org, process)?;
        }
    }
    wait_ready(&dir, orgs)?;
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    writeln!(
        out,
        "{:#}",
        json!({
            "dir": dir.display().to_string(),
            "network": dir.join("network.toml").display().to_string(),
            "orgs": (1..=orgs).map(|o| json!({
                "org": o,
                "engine": args.engines[o as usize - 1],
                "config": dir.join(format!("org{o}/org.toml")).display().to_string(),
                "logs": processes(&dir).iter().map(|p| log_file(&dir, o, p).display().to_string()).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    )?;
    Ok(())
}

/// Starts `chainify ARGS` detached, logging to `log`, its pid in `pid`.
fn spawn(dir: &Path, args: &[&str], log: &Path, pid: &Path) -> anyhow::Result<u32> {
    use std::os::unix::process::CommandExt;
    if let Some(running) = read_pid(pid)
        && alive(running)
    {
        bail!("{} is already running (pid {running})", pid.display());
    }
    let exe = std::env::current_exe().context("cannot find the chainify executable")?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let child = Command::new(exe)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start chainify {}", args.join(" ")))?;
    std::fs::write(pid, child.id().to_string())?;
    Ok(child.id())
}

/// Starts one process of organization `org`: `node` (all components) or one component. The
/// commit component needs the execution component up (it may replay blocks at start), so an
/// execution process is waited for until it listens.
fn start_process(dir: &Path, org: u32, process: &str) -> anyhow::Result<u32> {
    let config = dir.join(format!("org{org}/org.toml"));
    if !config.exists() {
        bail!(
            "{} does not exist: no organization {org} here",
            config.display()
        );
    }
    let config_arg = config.to_string_lossy();
    let mut args = vec!["node", "--config", &config_arg];
    if process != "node" {
        args.extend(["--component", process]);
    }
    let pid = spawn(
        dir,
        &args,
        &log_file(dir, org, process),
        &pid_file(dir, org, process),
    )?;
    if process == "execution" {
        let addr = OrgConfig::load(&config)?
            .listen
            .execution
            .context("listen.execution is not set")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(&addr).is_err() {
            if !alive(pid) || Instant::now() > deadline {
                bail!(
                    "org{org}'s execution component did not start listening on {addr}; see {}",
                    log_file(dir, org, process).display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(pid)
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Stops the process of a pid file: SIGTERM and up to 30 s to finish, then SIGKILL.
fn stop_pid(path: &Path, kill: bool) -> anyhow::Result<()> {
    let Some(pid) = read_pid(path) else {
        return Ok(());
    };
    if alive(pid) {
        signal(pid, if kill { "-KILL" } else { "-TERM" });
        let deadline = Instant::now() + Duration::from_secs(30);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if alive(pid) {
            signal(pid, "-KILL");
            while alive(pid) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    std::fs::remove_file(path).with_context(|| format!("cannot remove {}", path.display()))
}

fn org_count(dir: &Path) -> anyhow::Result<u32> {
    let network = chainify_core::config::NetworkConfig::load(&dir.join("network.toml"))?;
    Ok(u32::try_from(network.orgs.len())?)
}

fn down(dir: &Path) -> anyhow::Result<()> {
    let orgs = org_count(dir)?;
    for org in 1..=orgs {
        for process in processes(dir).into_iter().rev() {
            stop_pid(&pid_file(dir, org, process), false)?;
        }
    }
    stop_pid(&dir.join("orderer.pid"), false)
}

fn wait_ready(dir: &Path, orgs: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let configs: Vec<OrgConfig> = (1..=orgs)
        .map(|o| OrgConfig::load(&dir.join(format!("org{o}/org.toml"))))
        .collect::<Result<_, _>>()?;
    runtime()?.block_on(async {
        for (i, cfg) in configs.iter().enumerate() {
            let org = u32::try_from(i + 1)?;
            loop {
                for process in processes(dir) {
                    if read_pid(&pid_file(dir, org, process)).is_none_or(|p| !alive(p)) {
                        bail!(
                            "org{org}'s {process} process exited during start; see {}",
                            log_file(dir, org, process).display()
                        );
                    }
                }
                if admin_status(cfg).await.is_ok()
                    && tokio::net::TcpStream::connect(&cfg.listen.chainify)
                        .await
                        .is_ok()
                {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("org{} did not answer within 90 s", i + 1);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    })
}

/// The organization's status over its AdminService; any failure (no CA, no channel, no
/// answer) is the answer's error, so callers retry or report it per organization.
async fn admin_status(
    cfg: &OrgConfig,
) -> Result<chainify_proto::pb::StatusResponse, chainify_client::ClientError> {
    operator::status(&mut operator::admin_client(cfg)?).await
}

fn status(dir: &Path) -> anyhow::Result<()> {
    let orgs = org_count(dir)?;
    let configs: Vec<OrgConfig> = (1..=orgs)
        .map(|o| OrgConfig::load(&dir.join(format!("org{o}/org.toml"))))
        .collect::<Result<_, _>>()?;
    let report = runtime()?.block_on(async {
        let mut report = Vec::new();
        for (i, cfg) in configs.iter().enumerate() {
            let org = u32::try_from(i + 1)?;
            let pids: serde_json::Map<String, serde_json::Value> = processes(dir)
                .iter()
                .map(|p| {
                    let pid = read_pid(&pid_file(dir, org, p));
                    (
                        (*p).to_owned(),
                        json!({ "pid": pid, "running": pid.is_some_and(alive) }),
                    )
                })
                .collect();
            let running = pids.values().all(|p| p["running"] == json!(true));
            let status = if running {
                match admin_status(cfg).await {
                    Ok(s) => json!({
                        "agreed_height": s.agreed_height,
                        "components": s.components.iter().map(|c| json!({
                            "component": c.component, "height": c.height, "lag": c.lag,
                            "recovery": c.recovery,
                        })).collect::<Vec<_>>(),
                    }),
                    Err(e) => json!({ "error": e.to_string() }),
                }
            } else {
                json!(null)
            };
            report.push(
                json!({ "org": org, "processes": pids, "running": running, "status": status }),
            );
        }
        anyhow::Ok(report)
    })?;
    let orderer = read_pid(&dir.join("orderer.pid"));
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    writeln!(
        out,
        "{:#}",
        json!({ "orderer_pid": orderer, "orderer_running": orderer.is_some_and(alive), "orgs": report })
    )?;
    Ok(())
}
