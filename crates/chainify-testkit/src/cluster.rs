//! N organizations in one process, each with its own database (any engine), its own [`Node`]
//! (ExecutionServer + CommitServer) and its own orderer client, talking over a
//! [`LocalNetwork`]. Used by the end-to-end tests, the demo and the benchmarks.
//!
//! Fault hooks: change an organization's database behind chainify's back ([`Cluster::tamper`]),
//! crash or stop and restart an organization ([`Cluster::crash`], [`Cluster::stop`],
//! [`Cluster::restart`]), cut it off from the votes ([`Cluster::partition`]); a misbehaving
//! orderer comes from the [`OrdererFactory`] (for instance a `FaultyOrderer`).
//!
//! Clients are stood in for by [`Cluster::submit`]: it signs a proposal as the network's client
//! and has the first organization admit it through the same [`Admission`] a ChainifyServer runs
//! (checks, nonce window, ledger lookup, endorsement rounds), its endorsers reached in process.
//! Each organization's admission stays up while its node is crashed or stopped, as a
//! ChainifyServer deployed as its own component does.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chainify_core::config::{ConfigError, NetworkBuilder, NetworkConfig, PortPlan, all_grants};
use chainify_core::crypto::SigningKey;
use chainify_core::tx::LedgerEntry;
use chainify_core::tx::{
    ChainedTransaction, EarlyAbortResponse, Proposal, ProposalBody, Transaction, TxOutcome, Verdict,
};
use chainify_core::verify::Verifier;
use chainify_core::votes::{VoteContext, verify_ledger};
use chainify_core::{BlockNumber, ClientId, OrgId, TxId, Value};
use chainify_orderer::{Orderer, OrdererError, Resume};
use chainify_storage::{
    AnyBackend, Backend, Conn, ExecMode, StorageError, Store, StoreOptions, ddl,
};
use futures_util::StreamExt;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use chainify_node::admission::{
    Admission, AdmissionSettings, LocalEndorser, LocalEndorsing, Refusal,
};
use chainify_node::feed::CommitFeed;
use chainify_node::ledger::{self, TxLookup};
use chainify_node::transport::LocalNetwork;
use chainify_node::{
    ExecutionError, ExecutionServer, Node, NodeError, NodeParts, NodeSettings, NodeStatus,
    resume_point,
};

/// Why a cluster operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// An organization's database.
    #[error("organization {org}: {source}")]
    Storage {
        /// The organization.
        org: OrgId,
        /// The error.
        source: StorageError,
    },
    /// An organization's node could not start or stopped with an error.
    #[error("organization {org}: {source}")]
    Node {
        /// The organization.
        org: OrgId,
        /// The error.
        source: NodeError,
    },
    /// The orderer.
    #[error(transparent)]
    Orderer(#[from] OrdererError),
    /// The generated network configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Waiting took too long.
    #[error("timed out after {after:?} waiting for {what}; status: {status}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        after: Duration,
        /// Every organization's status then.
        status: String,
    },
    /// A consistency check failed.
    #[error("{0}")]
    Mismatch(String),
    /// No such organization in the cluster.
    #[error("organization {0} is not in the cluster")]
    UnknownOrg(OrgId),
    /// Keys could not be generated.
    #[error("generating keys: {0}")]
    Keys(String),
    /// Admission refused a transaction.
    #[error("refused: {0}")]
    Refused(#[from] Refusal),
    /// The serial replay of the agreed blocks failed.
    #[error("serial replay: {0}")]
    Replay(#[from] ExecutionError),
}

/// One organization of a cluster.
#[derive(Clone, Debug)]
pub struct OrgSpec {
    /// Its id in the network.
    pub id: OrgId,
    /// Its signing key.
    pub key: Arc<SigningKey>,
    /// Its database (`postgres://`, `mysql://`, `sqlite://`), with the shared tables created.
    pub database_url: String,
}

/// What a cluster runs.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// The network configuration every organization shares.
    pub network: Arc<NetworkConfig>,
    /// The organizations.
    pub orgs: Vec<OrgSpec>,
    /// The client that [`Cluster::submit`] signs as.
    pub client: ClientId,
    /// Its key.
    pub client_key: Arc<SigningKey>,
    /// The shared tables, registered on every organization's database at start.
    pub shared_tables: Vec<String>,
    /// How every node runs.
    pub settings: NodeSettings,
    /// Database connection settings.
    pub store_options: StoreOptions,
}

impl ClusterSpec {
    /// A network `network_id` of one organization per database URL (ids 1, 2, …, fresh keys)
    /// with agreement policy `policy` (`any-2`, `all`, …), and one client, `client`, granted
    /// everything on every table.
    pub fn generate(
        network_id: &str,
        policy: &str,
        max_block_txs: usize,
        batch_timeout: Duration,
        database_urls: &[String],
        shared_tables: &[&str],
    ) -> Result<ClusterSpec, ClusterError> {
        let keys: Vec<Arc<SigningKey>> = database_urls
            .iter()
            .map(|_| SigningKey::generate().map(|(k, _)| Arc::new(k)))
            .collect::<Result<_, _>>()
            .map_err(|e| ClusterError::Keys(e.to_string()))?;
        let (client_key, _) =
            SigningKey::generate().map_err(|e| ClusterError::Keys(e.to_string()))?;
        // The endpoints are never listened on: the organizations talk in process.
        let mut builder = NetworkBuilder::new(network_id, policy, PortPlan { base: 7010 }).block(
            max_block_txs,
            u64::try_from(batch_timeout.as_millis()).unwrap_or(u64::MAX),
        );
        for key in &keys {
            builder.org(&key.public_key(), "127.0.0.1");
        }
        builder.client("client", &client_key.public_key(), all_grants());
        let network = builder.config("cluster network")?;
        Ok(ClusterSpec {
            network: Arc::new(network),
            orgs: keys
                .into_iter()
                .zip(database_urls)
                .enumerate()
                .map(|(i, (key, url))| OrgSpec {
                    id: OrgId(i as u32 + 1),
                    key,
                    database_url: url.clone(),
                })
                .collect(),
            client: ClientId::new("client").map_err(|e| ClusterError::Mismatch(e.to_string()))?,
            client_key: Arc::new(client_key),
            shared_tables: shared_tables.iter().map(|t| (*t).to_owned()).collect(),
            settings: NodeSettings::default(),
            store_options: StoreOptions::default(),
        })
    }
}

/// Gives each organization its orderer client, resuming where its ledger ends.
pub trait OrdererFactory: Send + Sync + 'static {
    /// The orderer type.
    type Orderer: Orderer + 'static;

    /// The orderer client of `org` (`None`: the one clients submit through), whose node
    /// resumes at `from`.
    fn orderer(
        &self,
        org: Option<OrgId>,
        from: Resume,
    ) -> impl Future<Output = Result<Arc<Self::Orderer>, OrdererError>> + Send;
}

/// One orderer shared by every organization (the in-process orderer, possibly wrapped).
#[derive(Debug)]
pub struct SharedOrderer<O>(pub Arc<O>);

impl<O: Orderer + 'static> OrdererFactory for SharedOrderer<O> {
    type Orderer = O;

    async fn orderer(&self, _: Option<OrgId>, _: Resume) -> Result<Arc<O>, OrdererError> {
        Ok(self.0.clone())
    }
}

type Outcomes = Arc<Mutex<BTreeMap<TxId, TxOutcome>>>;

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), NodeError>>,
    collector: JoinHandle<()>,
    feed: CommitFeed<AnyBackend>,
    metrics: Arc<chainify_node::metrics::Metrics>,
    gate: chainify_node::ReadGate,
}

struct OrgRun {
    spec: OrgSpec,
    store: Arc<Store<AnyBackend>>,
    status: watch::Receiver<NodeStatus>,
    outcomes: Outcomes,
    running: Option<Running>,
}

/// N organizations in one process.
pub struct Cluster<F: OrdererFactory> {
    spec: ClusterSpec,
    factory: F,
    client_orderer: Arc<F::Orderer>,
    net: LocalNetwork,
    orgs: BTreeMap<OrgId, OrgRun>,
    nonce: Arc<AtomicU64>,
    admissions: Arc<Admissions>,
}

/// Every organization's admission and store in the process: what their endorsers reach.
#[derive(Debug, Default)]
struct Admissions {
    orgs: BTreeMap<OrgId, Arc<Admission>>,
    lookups: Mutex<BTreeMap<OrgId, TxLookup>>,
}

impl LocalEndorsing for Admissions {
    fn admission(&self, org: OrgId) -> Option<Arc<Admission>> {
        self.orgs.get(&org).cloned()
    }

    fn in_ledger<'a>(
        &'a self,
        org: OrgId,
        id: TxId,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<bool, String>> + Send + 'a>> {
        let lookup = self
            .lookups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&org)
            .cloned();
        Box::pin(async move {
            let lookup = lookup.ok_or_else(|| format!("{org} is not in the cluster"))?;
            lookup
                .contains(id)
                .await
                .map_err(|e| format!("looking up transaction ids: {e}"))
        })
    }
}

/// A client of a cluster that needs no access to the cluster itself (which stays free to crash
/// and restart organizations): endorses as every organization, submits to the orderer, and
/// reads where its transactions landed at one organization. Clones share the nonce sequence.
pub struct ClusterClient<O> {
    spec: Arc<ClusterSpec>,
    nonce: Arc<AtomicU64>,
    admissions: Arc<Admissions>,
    orderer: Arc<O>,
    observer: OrgId,
    outcomes: Outcomes,
}

impl<O> std::fmt::Debug for ClusterClient<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClient")
            .field("network", &self.spec.network.network_id)
            .field("observer", &self.observer)
            .finish_non_exhaustive()
    }
}

impl<O> Clone for ClusterClient<O> {
    fn clone(&self) -> Self {
        ClusterClient {
            spec: self.spec.clone(),
            nonce: self.nonce.clone(),
            admissions: self.admissions.clone(),
            orderer: self.orderer.clone(),
            observer: self.observer,
            outcomes: self.outcomes.clone(),
        }
    }
}

impl<O: Orderer> ClusterClient<O> {
    /// Signs `transaction` as the client and has the first organization admit it: the
    /// endorsed transaction [`ClusterClient::submit_raw`] sends.
    pub async fn endorse(
        &self,
        transaction: Transaction,
    ) -> Result<ChainedTransaction, ClusterError> {
        endorse(&self.spec, &self.nonce, &self.admissions, transaction).await
    }

    /// Submits an already built transaction as is.
    pub async fn submit_raw(&self, tx: ChainedTransaction) -> Result<(), ClusterError> {
        Ok(self.orderer.broadcast(tx).await?)
    }

    /// Where `id` is in the observing organization's ledger, once appended there.
    pub fn outcome(&self, id: &TxId) -> Option<TxOutcome> {
        self.outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// The organization whose outcomes [`ClusterClient::outcome`] reads.
    pub fn observer(&self) -> OrgId {
        self.observer
    }
}

/// `transaction` signed as the cluster's client with its next nonce.
fn propose(spec: &ClusterSpec, nonce: &AtomicU64, transaction: Transaction) -> Proposal {
    ProposalBody {
        client: spec.client.clone(),
        nonce: nonce.fetch_add(1, Ordering::Relaxed) + 1,
        network: spec.network.network_id.clone(),
        transaction,
    }
    .sign_as(&spec.client_key, spec.network.signatures)
}

/// Signs `transaction` as the cluster's client and has the first organization admit it, as its
/// ChainifyServer would: checked, its nonce claimed, looked up in the ledger and endorsed by the
/// organizations the endorsement policy needs, each running its own admission.
async fn endorse(
    spec: &ClusterSpec,
    nonce: &AtomicU64,
    admissions: &Arc<Admissions>,
    transaction: Transaction,
) -> Result<ChainedTransaction, ClusterError> {
    let origin = spec
        .orgs
        .first()
        .map(|o| o.id)
        .ok_or_else(|| ClusterError::Mismatch("the cluster has no organization".into()))?;
    let admission = admissions
        .admission(origin)
        .ok_or(ClusterError::UnknownOrg(origin))?;
    let proposal = propose(spec, nonce, transaction);
    let id = proposal.tx_id();
    let in_ledger = async {
        admissions
            .in_ledger(origin, id)
            .await
            .map_err(|e| Refusal::unavailable(format!("{origin}"), e))
    };
    let endorser = LocalEndorser::new(origin, admissions.clone());
    let responses = admission.admit(&proposal, in_ledger, &endorser).await?;
    Ok(ChainedTransaction {
        proposal,
        responses,
    })
}

impl<F: OrdererFactory> std::fmt::Debug for Cluster<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("network", &self.spec.network.network_id)
            .field("orgs", &self.orgs.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

async fn open_store(spec: &ClusterSpec, org: &OrgSpec) -> Result<Store<AnyBackend>, ClusterError> {
    let storage = |source| ClusterError::Storage {
        org: org.id,
        source,
    };
    let backend = AnyBackend::connect(&org.database_url, &spec.store_options)
        .await
        .map_err(storage)?;
    let store = Store::open(backend, spec.store_options.clone())
        .await
        .map_err(storage)?;
    let tables: Vec<&str> = spec.shared_tables.iter().map(String::as_str).collect();
    store.register(&tables).await.map_err(storage)?;
    Ok(store)
}

impl<F: OrdererFactory> Cluster<F> {
    /// Opens every organization's database (registering the shared tables) and starts its node.
    pub async fn start(spec: ClusterSpec, factory: F) -> Result<Cluster<F>, ClusterError> {
        let client_orderer = factory.orderer(None, Resume::START).await?;
        let mut stores = BTreeMap::new();
        let mut admissions = Admissions::default();
        for org in &spec.orgs {
            let store = Arc::new(open_store(&spec, org).await?);
            let schema = store.schema().map_err(|source| ClusterError::Storage {
                org: org.id,
                source,
            })?;
            admissions.orgs.insert(
                org.id,
                Arc::new(Admission::new(
                    org.id,
                    org.key.clone(),
                    spec.network.clone(),
                    chainify_sql::Analyzer::new(schema),
                    // Every closed-loop client of a benchmark signs as the cluster's one client.
                    AdmissionSettings {
                        max_in_flight_per_client: usize::MAX,
                        ..AdmissionSettings::default()
                    },
                    Arc::new(Verifier::new(spec.network.signatures)),
                )),
            );
            stores.insert(org.id, store);
        }
        admissions.lookups = Mutex::new(
            stores
                .iter()
                .map(|(org, store)| (*org, TxLookup::spawn(store.clone())))
                .collect(),
        );
        let mut cluster = Cluster {
            spec,
            factory,
            client_orderer,
            net: LocalNetwork::new(),
            orgs: BTreeMap::new(),
            nonce: Arc::default(),
            admissions: Arc::new(admissions),
        };
        for org in cluster.spec.orgs.clone() {
            let store = stores[&org.id].clone();
            let (_, status) = watch::channel(NodeStatus::new(org.id, Resume::START.block));
            cluster.orgs.insert(
                org.id,
                OrgRun {
                    spec: org.clone(),
                    store,
                    status,
                    outcomes: Arc::default(),
                    running: None,
                },
            );
            cluster.launch(org.id).await?;
        }
        Ok(cluster)
    }

    /// The network configuration.
    pub fn network(&self) -> &Arc<NetworkConfig> {
        &self.spec.network
    }

    /// The organizations' ids.
    pub fn orgs(&self) -> Vec<OrgId> {
        self.orgs.keys().copied().collect()
    }

    /// An organization's signature checks: its admission's, shared with every node it runs.
    fn verifier(&self, org: OrgId) -> Result<Arc<Verifier>, ClusterError> {
        self.admissions
            .orgs
            .get(&org)
            .map(|a| a.verifier().clone())
            .ok_or(ClusterError::UnknownOrg(org))
    }

    fn org(&self, org: OrgId) -> Result<&OrgRun, ClusterError> {
        self.orgs.get(&org).ok_or(ClusterError::UnknownOrg(org))
    }

    /// An organization's store (for direct inspection).
    pub fn store(&self, org: OrgId) -> Result<Arc<Store<AnyBackend>>, ClusterError> {
        Ok(self.org(org)?.store.clone())
    }

    async fn launch(&mut self, id: OrgId) -> Result<(), ClusterError> {
        let run = self.orgs.get(&id).ok_or(ClusterError::UnknownOrg(id))?;
        let (from, _) = resume_point(&run.store)
            .await
            .map_err(|source| ClusterError::Node { org: id, source })?;
        let orderer = self.factory.orderer(Some(id), from).await?;
        let node = Node::start(NodeParts {
            store: run.store.clone(),
            network: self.spec.network.clone(),
            me: id,
            key: run.spec.key.clone(),
            verifier: self.verifier(id)?,
            orderer,
            transport: self.net.transport(id),
            settings: self.spec.settings.clone(),
        })
        .await
        .map_err(|source| ClusterError::Node { org: id, source })?;
        let mut node = node;
        node.set_state_peers(self.net.state_peers(id));
        self.net.serve_state(
            id,
            Arc::new(chainify_node::transfer::LocalPeer::new(
                id,
                node.state_server(),
            )),
        );
        self.net.join(id, node.inbox());
        let status = node.status();
        let feed = node.commit_feed();
        let metrics = node.metrics();
        let gate = node.read_gate();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(node.run(async {
            let _ = stopped.await;
        }));
        let collector = tokio::spawn(collect(id, feed.clone(), run.outcomes.clone()));
        let run = self.orgs.get_mut(&id).ok_or(ClusterError::UnknownOrg(id))?;
        run.status = status;
        run.running = Some(Running {
            stop,
            task,
            collector,
            feed,
            metrics,
            gate,
        });
        Ok(())
    }

    /// Signs `transaction` as the client, has the first organization admit it (endorsed as
    /// the policy needs), and submits it to the orderer. Returns its id.
    pub async fn submit(&self, transaction: Transaction) -> Result<TxId, ClusterError> {
        let tx = self.endorse(transaction).await?;
        let id = tx.proposal.tx_id();
        self.client_orderer.broadcast(tx).await?;
        Ok(id)
    }

    /// The signed, admitted and endorsed transaction [`Cluster::submit`] sends.
    pub async fn endorse(
        &self,
        transaction: Transaction,
    ) -> Result<ChainedTransaction, ClusterError> {
        endorse(&self.spec, &self.nonce, &self.admissions, transaction).await
    }

    /// What a Byzantine origin colluding with every organization's key could order: the
    /// transaction signed as the client and accepted by every organization without any check.
    /// Execution must flag whatever admission would have refused (fault tests).
    pub fn forge(&self, transaction: Transaction) -> ChainedTransaction {
        let signatures = self.spec.network.signatures;
        let proposal = propose(&self.spec, &self.nonce, transaction);
        let id = proposal.tx_id();
        let responses = self
            .spec
            .orgs
            .iter()
            .map(|o| EarlyAbortResponse::new_as(id, o.id, Verdict::Accept, &o.key, signatures))
            .collect();
        ChainedTransaction {
            proposal,
            responses,
        }
    }

    /// A client whose transactions' outcomes are read at `observer`.
    pub fn client(&self, observer: OrgId) -> Result<ClusterClient<F::Orderer>, ClusterError> {
        Ok(ClusterClient {
            spec: Arc::new(self.spec.clone()),
            nonce: self.nonce.clone(),
            admissions: self.admissions.clone(),
            orderer: self.client_orderer.clone(),
            observer,
            outcomes: self.org(observer)?.outcomes.clone(),
        })
    }

    /// Submits an already built transaction (forged, replayed, …) as is.
    pub async fn submit_raw(&self, tx: ChainedTransaction) -> Result<(), ClusterError> {
        Ok(self.client_orderer.broadcast(tx).await?)
    }

    /// Every organization's current status.
    pub fn statuses(&self) -> BTreeMap<OrgId, NodeStatus> {
        self.orgs
            .iter()
            .map(|(id, run)| (*id, run.status.borrow().clone()))
            .collect()
    }

    /// One organization's current status.
    pub fn status(&self, org: OrgId) -> Result<NodeStatus, ClusterError> {
        Ok(self.org(org)?.status.borrow().clone())
    }

    /// Whether the organization's node is running.
    pub fn is_running(&self, org: OrgId) -> bool {
        self.orgs
            .get(&org)
            .and_then(|r| r.running.as_ref())
            .is_some_and(|r| !r.task.is_finished())
    }

    /// The metrics `org`'s running node records (`None` while it is stopped).
    pub fn metrics(&self, org: OrgId) -> Option<Arc<chainify_node::metrics::Metrics>> {
        Some(self.orgs.get(&org)?.running.as_ref()?.metrics.clone())
    }

    /// The blocks `org`'s running node appends, from any height (`None` while it is
    /// stopped).
    pub fn feed(&self, org: OrgId) -> Option<CommitFeed<AnyBackend>> {
        Some(self.orgs.get(&org)?.running.as_ref()?.feed.clone())
    }

    /// Reads at an agreed height on `org`'s database, as its query service does (`None` while
    /// it is stopped).
    pub fn read_gate(&self, org: OrgId) -> Option<chainify_node::ReadGate> {
        Some(self.orgs.get(&org)?.running.as_ref()?.gate.clone())
    }

    /// Waits until `done` holds for the statuses, checking whenever one changes; returns the
    /// statuses it held for.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&BTreeMap<OrgId, NodeStatus>) -> bool,
    ) -> Result<BTreeMap<OrgId, NodeStatus>, ClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            let statuses = self.statuses();
            if done(&statuses) {
                return Ok(statuses);
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Timeout {
                    what: what.to_owned(),
                    after: timeout,
                    status: describe(&statuses),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Where `id` is in `org`'s ledger, once appended there: its valid copy, or while there is
    /// none an invalid one (`TxOutcome::valid`).
    pub fn outcome(&self, org: OrgId, id: &TxId) -> Option<TxOutcome> {
        let run = self.orgs.get(&org)?;
        run.outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// Waits until every transaction of `ids` is in the ledger of every organization of `orgs`,
    /// as a valid copy (an invalid copy, such as one an orderer stripped of its endorsements,
    /// is not the transaction's outcome: the valid one may still follow).
    pub async fn wait_committed(
        &self,
        orgs: &[OrgId],
        ids: &[TxId],
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut missing = 0;
            for org in orgs {
                let run = self.org(*org)?;
                let outcomes = run.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
                missing += ids
                    .iter()
                    .filter(|id| !outcomes.get(id).is_some_and(|o| o.valid))
                    .count();
            }
            if missing == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Timeout {
                    what: format!(
                        "{} transactions in the ledgers of {orgs:?} ({missing} missing)",
                        ids.len()
                    ),
                    after: timeout,
                    status: describe(&self.statuses()),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// An organization's ledger, read from its database.
    pub async fn ledger(&self, org: OrgId) -> Result<Vec<LedgerEntry>, ClusterError> {
        let store = &self.org(org)?.store;
        read_ledger(store, org, Resume::START.block).await
    }

    /// A shared table's rows in key order on an organization's database.
    pub async fn dump(&self, org: OrgId, table: &str) -> Result<Vec<Vec<Value>>, ClusterError> {
        dump(&self.org(org)?.store, org, table).await
    }

    /// Runs SQL on an organization's database behind chainify's back.
    pub async fn tamper(&self, org: OrgId, sql: &str) -> Result<(), ClusterError> {
        let store = &self.org(org)?.store;
        let storage = |e: chainify_storage::DbError| {
            ClusterError::Mismatch(format!("organization {org}: running {sql:?}: {e}"))
        };
        let mut conn = store.backend().acquire().await.map_err(storage)?;
        conn.batch(sql).await.map_err(storage)
    }

    /// Cuts the organization off from every vote and certificate.
    pub fn partition(&self, org: OrgId) {
        self.net.partition(org);
    }

    /// Ends the organization's partition.
    pub fn heal(&self, org: OrgId) {
        self.net.heal(org);
    }

    /// What the organization serves to the others' state transfers.
    pub fn state_peer(&self, org: OrgId) -> Option<Arc<dyn chainify_node::transfer::StatePeer>> {
        self.net.state_of(org)
    }

    /// Replaces what the organization serves to the others' state transfers (a Byzantine
    /// organization), until it restarts.
    pub fn serve_state(&self, org: OrgId, state: Arc<dyn chainify_node::transfer::StatePeer>) {
        self.net.serve_state(org, state);
    }

    /// Disconnects the organization and hands over its running node, if any.
    fn take_running(&mut self, org: OrgId) -> Result<Option<Running>, ClusterError> {
        self.net.leave(org);
        let run = self
            .orgs
            .get_mut(&org)
            .ok_or(ClusterError::UnknownOrg(org))?;
        Ok(run.running.take())
    }

    /// Kills the organization's node where it stands (mid-block, mid-vote): its database
    /// connections are dropped, in-flight database transactions roll back.
    pub async fn crash(&mut self, org: OrgId) -> Result<(), ClusterError> {
        if let Some(running) = self.take_running(org)? {
            running.task.abort();
            running.collector.abort();
            let _ = running.task.await;
            let _ = running.collector.await;
        }
        Ok(())
    }

    /// Stops the organization's node gracefully (it finishes the block in flight).
    pub async fn stop(&mut self, org: OrgId) -> Result<(), ClusterError> {
        if let Some(running) = self.take_running(org)? {
            let _ = running.stop.send(());
            let result = running.task.await;
            running.collector.abort();
            let _ = running.collector.await;
            match result {
                Ok(Ok(())) => {}
                Ok(Err(source)) => return Err(ClusterError::Node { org, source }),
                Err(e) => return Err(ClusterError::Mismatch(format!("organization {org}: {e}"))),
            }
        }
        Ok(())
    }

    /// Starts a stopped or crashed organization again on a fresh connection pool, as a new
    /// process would.
    pub async fn restart(&mut self, org: OrgId) -> Result<(), ClusterError> {
        if self.is_running(org) {
            return Ok(());
        }
        let spec = self.org(org)?.spec.clone();
        let store = Arc::new(open_store(&self.spec, &spec).await?);
        let run = self
            .orgs
            .get_mut(&org)
            .ok_or(ClusterError::UnknownOrg(org))?;
        self.admissions
            .lookups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(org, TxLookup::spawn(store.clone()));
        let old = std::mem::replace(&mut run.store, store);
        old.close().await;
        self.launch(org).await
    }

    /// The node's error, if it stopped by itself.
    pub async fn failure(&mut self, org: OrgId) -> Option<String> {
        let run = self.orgs.get_mut(&org)?;
        if !run.running.as_ref().is_some_and(|r| r.task.is_finished()) {
            return None;
        }
        let running = run.running.take()?;
        match running.task.await {
            Ok(Ok(())) => Some("stopped".into()),
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Checks that every organization's ledger verifies offline (hash chain, certificates against
    /// the network's keys and agreement policy), that the ledgers agree with each other on every
    /// block, and that the shared tables are identical. Returns the common ledger length.
    pub async fn check_consistent(&self, orgs: &[OrgId]) -> Result<usize, ClusterError> {
        let ctx = VoteContext::of(&self.spec.network);
        let mut ledgers = Vec::new();
        for org in orgs {
            let ledger = self.ledger(*org).await?;
            verify_ledger(ledger.iter().map(|e| (&e.block, &e.certificate)), &ctx).map_err(
                |fault| ClusterError::Mismatch(format!("organization {org}'s ledger: {fault}")),
            )?;
            ledgers.push((*org, ledger));
        }
        let Some((first_org, first)) = ledgers.first() else {
            return Ok(0);
        };
        for (org, ledger) in &ledgers {
            for (a, b) in first.iter().zip(ledger) {
                if a.block.hash() != b.block.hash() {
                    return Err(ClusterError::Mismatch(format!(
                        "block {}: organization {first_org} has {}, organization {org} has {}",
                        a.block.number,
                        a.block.hash(),
                        b.block.hash()
                    )));
                }
            }
            if ledger.len() != first.len() {
                return Err(ClusterError::Mismatch(format!(
                    "organization {first_org} has {} blocks, organization {org} has {}",
                    first.len(),
                    ledger.len()
                )));
            }
        }
        for table in &self.spec.shared_tables {
            let reference = self.dump(*first_org, table).await?;
            for org in &orgs[1..] {
                if self.dump(*org, table).await? != reference {
                    return Err(ClusterError::Mismatch(format!(
                        "table {table} differs between organization {first_org} and organization {org}"
                    )));
                }
            }
        }
        Ok(first.len())
    }

    /// Replays the agreed blocks of `org`'s ledger serially on a fresh database at `url`
    /// (prepared with the same initial state) from the orderer, and checks that every replayed
    /// LedgerBlock and the final shared tables equal `org`'s: nothing was lost or applied
    /// twice.
    pub async fn check_against_serial(&self, org: OrgId, url: &str) -> Result<(), ClusterError> {
        let ledger = self.ledger(org).await?;
        let oracle = OrgSpec {
            id: org,
            key: self.org(org)?.spec.key.clone(),
            database_url: url.to_owned(),
        };
        let store = Arc::new(open_store(&self.spec, &oracle).await?);
        // The oracle checks every signature afresh.
        let mut exec = ExecutionServer::new(
            store.clone(),
            self.spec.network.clone(),
            ExecMode::Serial,
            Arc::new(Verifier::new(self.spec.network.signatures)),
        )?;
        let mut previous = chainify_core::Digest::ZERO;
        let mut blocks = self.client_orderer.deliver(Resume::START).await?;
        for entry in &ledger {
            let block = tokio::time::timeout(Duration::from_secs(30), blocks.next())
                .await
                .map_err(|_| {
                    ClusterError::Mismatch(format!(
                        "the orderer did not deliver block {}",
                        entry.block.number
                    ))
                })?
                .ok_or_else(|| ClusterError::Mismatch("the orderer ended".into()))??;
            let done = exec.execute(&block, previous).await?;
            previous = done.ledger.hash();
            if done.ledger.hash() != entry.block.hash() {
                return Err(ClusterError::Mismatch(format!(
                    "block {}: serial replay gives {:?}, organization {org}'s ledger has {:?}",
                    block.number, done.ledger, entry.block
                )));
            }
        }
        for table in &self.spec.shared_tables {
            if dump(&store, org, table).await? != self.dump(org, table).await? {
                return Err(ClusterError::Mismatch(format!(
                    "table {table} of organization {org} differs from the serial replay of its {} agreed blocks",
                    ledger.len()
                )));
            }
        }
        store.close().await;
        Ok(())
    }

    /// Stops every node gracefully and closes the databases.
    pub async fn shutdown(mut self) -> Result<(), ClusterError> {
        let mut first_error = None;
        for org in self.orgs() {
            if let Err(e) = self.stop(org).await {
                first_error.get_or_insert(e);
            }
        }
        for run in self.orgs.values() {
            run.store.close().await;
        }
        first_error.map_or(Ok(()), Err)
    }
}

fn describe(statuses: &BTreeMap<OrgId, NodeStatus>) -> String {
    statuses
        .values()
        .map(|s| {
            format!(
                "org {}: next block {}, executed {:?}, {:?}, alarms {:?}, last error {:?}",
                s.org, s.next_block, s.executed, s.state, s.alarms, s.last_error
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

async fn read_ledger(
    store: &Store<AnyBackend>,
    org: OrgId,
    from: BlockNumber,
) -> Result<Vec<LedgerEntry>, ClusterError> {
    ledger::entries_from(store, from)
        .await
        .map_err(|source| ClusterError::Node {
            org,
            source: source.into(),
        })
}

async fn dump(
    store: &Store<AnyBackend>,
    org: OrgId,
    table: &str,
) -> Result<Vec<Vec<Value>>, ClusterError> {
    let tables = store.tables();
    let t = tables
        .get(table)
        .ok_or_else(|| ClusterError::Mismatch(format!("{table} is not a shared table")))?;
    let (sql, types) = ddl::select_all(store.backend().dialect(), t);
    let failed = |e: chainify_storage::DbError| {
        ClusterError::Mismatch(format!("organization {org}: reading {table}: {e}"))
    };
    let mut conn = store.backend().acquire().await.map_err(failed)?;
    conn.query(&sql, &[], &types).await.map_err(failed)
}

/// Records where each appended transaction is, from the organization's commit feed.
async fn collect(org: OrgId, feed: CommitFeed<AnyBackend>, outcomes: Outcomes) {
    // Everything before the first unrecorded block is recorded (after a restart the feed
    // plays the blocks appended meanwhile from the ledger: a crash can fall between an append
    // and its commit event).
    let recorded = outcomes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .values()
        .map(|o| o.block.0 + 1)
        .max();
    let mut blocks = feed.subscribe(BlockNumber(recorded.unwrap_or(Resume::START.block.0)));
    while let Some(next) = blocks.next().await {
        match next {
            Ok(committed) => {
                let mut map = outcomes.lock().unwrap_or_else(PoisonError::into_inner);
                for outcome in committed.block.outcomes(&[]) {
                    // A valid copy's outcome replaces an invalid copy's, never the reverse.
                    match map.entry(outcome.tx_id) {
                        Entry::Vacant(e) => {
                            e.insert(outcome);
                        }
                        Entry::Occupied(mut e) if outcome.valid && !e.get().valid => {
                            e.insert(outcome);
                        }
                        Entry::Occupied(_) => {}
                    }
                }
            }
            Err(e) => {
                tracing::warn!(%org, error = %e, "reading the ledger for outcomes failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
