//! Driving an in-process network with closed-loop clients, for `demo` and `bench`: workloads,
//! loading the databases, the clients and the listener that times them, progress on screen.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chainify_core::tx::Transaction;
use chainify_core::{OrgId, TxId};
use chainify_node::NodeStatus;
use chainify_orderer::LocalOrderer;
use chainify_storage::{AnyBackend, Backend, Conn, StoreOptions, recreate_database};
use chainify_testkit::cluster::{Cluster, ClusterClient, SharedOrderer};
use chainify_workload::{
    KeyDistribution, SMALLBANK_SCHEMA, Smallbank, SmallbankKind, Ycsb, YcsbRecord, YcsbWorkload,
    smallbank_load_sql, ycsb_load_sql, ycsb_schema,
};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a client waits for its transaction before it gives up on the run.
pub const SETTLE: Duration = Duration::from_secs(60);
/// Lines of progress when stderr is not a terminal (no bar): one per this interval.
pub const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The server URL of `flag`, else of the environment variable `var` (`cargo xtask services
/// env` sets it).
pub fn server_url(given: &Option<String>, var: &str, flag: &str) -> anyhow::Result<String> {
    given
        .clone()
        .or_else(|| std::env::var(var).ok())
        .with_context(|| {
            format!("give {flag} (or set {var}; `cargo xtask services env` prints it)")
        })
}

/// Where an organization's database lives on `engine`: the SQLite file `sqlite`, or database
/// `name` on the PostgreSQL or MariaDB server.
pub fn engine_url(
    engine: &str,
    sqlite: &std::path::Path,
    name: &str,
    postgres: &Option<String>,
    mysql: &Option<String>,
) -> anyhow::Result<String> {
    Ok(match engine {
        "sqlite" => format!("sqlite://{}", sqlite.display()),
        "postgres" => chainify_storage::database_on(
            &server_url(postgres, "CHAINIFY_TEST_POSTGRES_URL", "--postgres-url")?,
            name,
        )?,
        "mariadb" | "mysql" => chainify_storage::database_on(
            &server_url(mysql, "CHAINIFY_TEST_MYSQL_URL", "--mysql-url")?,
            name,
        )?,
        other => bail!("--engines: {other:?} is not sqlite, postgres or mariadb"),
    })
}

/// A working directory: `given` (kept), or a fresh temporary one the caller removes (`true`).
pub fn scratch_dir(
    given: &Option<std::path::PathBuf>,
    what: &str,
) -> anyhow::Result<(std::path::PathBuf, bool)> {
    let (dir, temporary) = match given {
        Some(dir) => (std::path::absolute(dir)?, false),
        None => (
            std::env::temp_dir().join(format!("chainify-{what}-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok((dir, temporary))
}

/// Which transactions the clients send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Smallbank, the evaluation's four kinds.
    Smallbank,
    /// Smallbank with Amalgamate and Balance.
    SmallbankFull,
    /// YCSB A, B or C.
    Ycsb(YcsbWorkload),
}

impl std::str::FromStr for Workload {
    type Err = String;

    fn from_str(text: &str) -> Result<Workload, String> {
        match text {
            "smallbank" => Ok(Workload::Smallbank),
            "smallbank-full" => Ok(Workload::SmallbankFull),
            _ => match text.strip_prefix("ycsb-") {
                Some(w) => Ok(Workload::Ycsb(w.parse()?)),
                None => Err(format!(
                    "{text:?}: choose smallbank, smallbank-full, ycsb-a, ycsb-b or ycsb-c"
                )),
            },
        }
    }
}

impl Workload {
    /// The shared tables it uses.
    pub fn tables(self) -> &'static [&'static str] {
        match self {
            Workload::Smallbank | Workload::SmallbankFull => &["accounts", "savings", "checking"],
            Workload::Ycsb(_) => &["usertable"],
        }
    }

    /// A change behind chainify's back that makes an organization's digest differ from the
    /// others' on its next block. It must outlive that block: the digest covers the rows'
    /// state, so a change the next block overwrites (YCSB's hot key rewritten) heals unseen.
    pub fn tamper_sql(self) -> &'static str {
        match self {
            Workload::Smallbank | Workload::SmallbankFull => {
                "UPDATE checking SET bal = bal + 1000 WHERE custid = 1"
            }
            Workload::Ycsb(_) => "DELETE FROM usertable WHERE ycsb_key = 1",
        }
    }

    /// A generator for one client.
    pub fn generator(
        self,
        keys: u64,
        dist: &KeyDistribution,
        record: YcsbRecord,
        seed: u64,
    ) -> Generator {
        match self {
            Workload::Smallbank => Generator::Smallbank(Smallbank::new(keys, dist, seed)),
            Workload::SmallbankFull => Generator::Smallbank(
                Smallbank::new(keys, dist, seed).with_mix(&SmallbankKind::FULL),
            ),
            Workload::Ycsb(w) => Generator::Ycsb(Ycsb::new(keys, dist, w, record, seed)),
        }
    }

    /// The workload's tables as portable `CREATE TABLE` statements.
    pub fn schema_sql(self, record: YcsbRecord) -> String {
        match self {
            Workload::Smallbank | Workload::SmallbankFull => SMALLBANK_SCHEMA.to_owned(),
            Workload::Ycsb(_) => ycsb_schema(record),
        }
    }

    /// Creates the database at `url` afresh with the workload's tables and `keys` rows (accounts
    /// or records).
    pub async fn prepare(self, url: &str, keys: u64, record: YcsbRecord) -> anyhow::Result<()> {
        let schema = self.schema_sql(record);
        let load = match self {
            Workload::Smallbank | Workload::SmallbankFull => smallbank_load_sql(keys, 500),
            Workload::Ycsb(_) => ycsb_load_sql(keys, record, 100, 1),
        };
        recreate_database(url).await?;
        let backend = AnyBackend::connect(url, &StoreOptions::default()).await?;
        let mut conn = backend.acquire().await?;
        for ddl in schema.split(';').filter(|s| !s.trim().is_empty()) {
            conn.batch(ddl).await?;
        }
        for insert in load {
            conn.batch(&insert).await?;
        }
        drop(conn);
        backend.close().await;
        Ok(())
    }
}

/// One client's transaction stream.
#[derive(Clone, Debug)]
pub enum Generator {
    Smallbank(Smallbank),
    Ycsb(Ycsb),
}

impl Generator {
    /// The next transaction.
    pub fn next_tx(&mut self) -> Transaction {
        match self {
            Generator::Smallbank(g) => g.next_tx().1,
            Generator::Ycsb(g) => g.next_tx().1,
        }
    }
}

/// Closed-loop clients submitting to an in-process network, timed at the observing
/// organization.
#[allow(missing_debug_implementations)] // holds tasks and connections
pub struct Load {
    pub counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    clients: Vec<JoinHandle<anyhow::Result<()>>>,
    listener: JoinHandle<()>,
}

impl Load {
    /// Starts one client per generator.
    pub fn start(
        cluster: &Cluster<SharedOrderer<LocalOrderer>>,
        observer: OrgId,
        generators: Vec<Generator>,
    ) -> anyhow::Result<Load> {
        let submitter = cluster.client(observer)?;
        let pending: Pending = Arc::default();
        let counters = Arc::new(Counters::default());
        let (Some(feed), Some(status)) =
            (cluster.feed(observer), cluster.statuses().remove(&observer))
        else {
            bail!("the observing organization {observer} is not running");
        };
        let blocks = feed.subscribe(status.next_block);
        let listener = tokio::spawn(listen(blocks, pending.clone(), counters.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let clients = generators
            .into_iter()
            .map(|g| tokio::spawn(client(submitter.clone(), g, pending.clone(), stop.clone())))
            .collect();
        Ok(Load {
            counters,
            stop,
            clients,
            listener,
        })
    }

    /// Stops the clients after their transaction under way is appended.
    pub async fn stop(self) -> anyhow::Result<Arc<Counters>> {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.await??;
        }
        self.listener.abort();
        Ok(self.counters)
    }
}

/// Where progress lines and events go: above the bar on a terminal, plain lines otherwise.
#[allow(missing_debug_implementations)] // holds tasks and connections
pub struct Screen {
    bar: Option<ProgressBar>,
}

impl Screen {
    pub fn new(total: Duration) -> Screen {
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

    pub fn say(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub fn progress(&self, elapsed: Duration, line: &str, plain_due: &mut Instant) {
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

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// A transaction a client waits for: when it was submitted, how long its admission took, and
/// whom to tell.
type Pending = Arc<Mutex<HashMap<TxId, (Instant, Duration, oneshot::Sender<bool>)>>>;

/// What the clients saw: transactions appended at the observer, of those committed, and each
/// one's latency from submission to append.
#[derive(Default, Debug)]
pub struct Counters {
    pub committed: AtomicU64,
    pub succeeded: AtomicU64,
    pub latencies_us: Mutex<Vec<u64>>,
    /// In process: each transaction's admission (signing, checks, endorsements) before it was
    /// submitted, in the order of `latencies_us` (remote latencies include admission).
    pub admissions_us: Mutex<Vec<u64>>,
}

pub fn heights(statuses: &BTreeMap<OrgId, NodeStatus>) -> String {
    statuses
        .iter()
        .map(|(org, s)| format!("{org} {}", s.next_block.0.saturating_sub(1)))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn percentile(sorted: &[u64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1] as f64 / 1e3)
}

/// Tells each waiting client when its transaction is appended at the observing organization.
async fn listen(
    mut blocks: chainify_node::Subscription<AnyBackend>,
    pending: Pending,
    counters: Arc<Counters>,
) {
    while let Some(next) = blocks.next().await {
        let committed = match next {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "reading the observer's ledger failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let now = Instant::now();
        let block = &committed.block;
        let mut waiting = pending.lock().unwrap_or_else(PoisonError::into_inner);
        for (index, id) in block.tx_ids.iter().enumerate() {
            // An invalid copy (a replay) is not the transaction's outcome.
            if !block.valid.get(index).copied().unwrap_or(false) {
                continue;
            }
            let success = block.success.get(index).copied().unwrap_or(false);
            if let Some((submitted, admission, tell)) = waiting.remove(id) {
                counters.committed.fetch_add(1, Ordering::Relaxed);
                if success {
                    counters.succeeded.fetch_add(1, Ordering::Relaxed);
                }
                counters
                    .latencies_us
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(now.duration_since(submitted).as_micros() as u64);
                counters
                    .admissions_us
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(admission.as_micros() as u64);
                let _ = tell.send(success);
            }
        }
    }
}

/// Submits one transaction at a time until told to stop, each after the previous is appended.
async fn client(
    cluster: ClusterClient<LocalOrderer>,
    mut workload: Generator,
    pending: Pending,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let tx = cluster.endorse(workload.next_tx()).await?;
        let admission = started.elapsed();
        let id = tx.proposal.tx_id();
        let (tell, mut told) = oneshot::channel();
        pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, (Instant::now(), admission, tell));
        cluster.submit_raw(tx).await?;
        let deadline = Instant::now() + SETTLE;
        loop {
            match tokio::time::timeout(Duration::from_secs(1), &mut told).await {
                Ok(_) => break,
                // The listener lagged past this block: the collector's record says it landed.
                Err(_) if cluster.outcome(&id).is_some() => {
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
