//! One organization as a process: its store, node, transports and gRPC servers, assembled from
//! its configuration (`chainify node`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chainify_core::OrgId;
use chainify_core::config::{NetworkConfig, OrdererKind, OrgConfig};
use chainify_core::crypto::SigningKey;
use chainify_core::tx::ChainedTransaction;
use chainify_core::verify::Verifier;
use chainify_node::metrics::{Metrics, family, render_status};
use chainify_node::{
    CommitFeed, ExecutionServer, Inbox, LocalExecution, Node, NodeParts, NodeSettings, NodeStatus,
    ReadGate, StateServer, resume_point,
};
use chainify_orderer::{
    BlockStream, Demand, KafkaOrderer, KafkaSettings, Orderer, OrdererError, Resume,
};
use chainify_proto::FILE_DESCRIPTOR_SET;
use chainify_proto::pb::admin_service_client::AdminServiceClient;
use chainify_proto::pb::admin_service_server::AdminServiceServer;
use chainify_proto::pb::chainify_service_server::ChainifyServiceServer;
use chainify_proto::pb::commit_service_server::CommitServiceServer;
use chainify_proto::pb::endorsement_service_server::EndorsementServiceServer;
use chainify_proto::pb::execution_service_server::ExecutionServiceServer;
use chainify_proto::pb::query_service_server::QueryServiceServer;
use chainify_storage::{AnyBackend, Backend, ExecMode, StorageError, Store, StoreOptions};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::Server;
use tonic::transport::server::Router;
use tracing::{info, warn};

use crate::NetError;
use crate::admin::AdminServer;
use crate::chainify::{ChainifyParts, ChainifyServer, ChainifySettings};
use crate::conns::{ConnectionLimits, incoming_within};
use crate::exec::{ExecutionGrpc, RemoteExecution};
use crate::follow::follow_ledger;
use crate::metrics::{Render, serve_metrics};
use crate::peer::{CommitServer, GrpcTransport};
use crate::query::{QueryAccess, QueryServer};
use crate::solo::RemoteOrderer;
use crate::state::GrpcStatePeers;
use crate::tls::Tls;
use crate::tls::channel;

/// The orderer an organization process uses.
#[derive(Debug, Clone)]
pub enum AnyOrderer {
    /// The solo orderer over gRPC.
    Solo(RemoteOrderer),
    /// Apache Kafka.
    Kafka(KafkaOrderer),
}

impl Orderer for AnyOrderer {
    async fn broadcast(&self, tx: ChainedTransaction) -> Result<(), OrdererError> {
        match self {
            AnyOrderer::Solo(o) => o.broadcast(tx).await,
            AnyOrderer::Kafka(o) => o.broadcast(tx).await,
        }
    }

    async fn deliver(&self, from: Resume) -> Result<BlockStream, OrdererError> {
        match self {
            AnyOrderer::Solo(o) => o.deliver(from).await,
            AnyOrderer::Kafka(o) => o.deliver(from).await,
        }
    }

    async fn deliver_on(&self, from: Resume, demand: Demand) -> Result<BlockStream, OrdererError> {
        match self {
            AnyOrderer::Solo(o) => o.deliver_on(from, demand).await,
            AnyOrderer::Kafka(o) => o.deliver_on(from, demand).await,
        }
    }
}

/// The TLS material of an organization's servers, when its network uses TLS.
pub fn org_tls(config: &OrgConfig) -> Result<Option<Tls>, NetError> {
    match (&config.network.tls_ca, &config.tls) {
        (Some(ca), Some(t)) => Ok(Some(Tls::server(ca, &t.cert, &t.key)?)),
        _ => Ok(None),
    }
}

/// Binds a listen address, naming it when that fails.
pub async fn bind(what: &str, addr: &str) -> Result<TcpListener, NetError> {
    TcpListener::bind(addr).await.map_err(|e| NetError::Listen {
        what: what.to_owned(),
        addr: addr.to_owned(),
        problem: e.to_string(),
    })
}

/// A server with this organization's TLS, and health (`names` and the whole server serving) and
/// reflection services, ready for the component's own services.
async fn router(tls: Option<&Tls>, names: &[&str]) -> Result<Router, NetError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in names.iter().chain(&[""]) {
        reporter
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| NetError::Internal(format!("reflection: {e}")))?;
    Ok(server_builder(tls)?
        .add_service(health)
        .add_service(reflection))
}

/// How often a server pings a connection's peer over HTTP/2, and how long it waits for the
/// answer before it closes the connection.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// See [`KEEPALIVE_INTERVAL`].
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a client may take to finish its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A tonic server builder with this organization's TLS. Serve it on [`incoming`]: the
/// builder's own socket options apply only to addresses it binds itself.
pub fn server_builder(tls: Option<&Tls>) -> Result<Server, NetError> {
    let mut builder = Server::builder()
        .concurrency_limit_per_connection(1024)
        // A peer that went away without closing (a partition, a crash of its host) is
        // noticed and its connection closed, rather than kept until the process ends.
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
    if let Some(config) = tls.and_then(Tls::server_config) {
        builder = builder
            // A client that opens a connection and never finishes its handshake holds a
            // task and a descriptor; it is closed after this.
            .tls_config(config.timeout(TLS_HANDSHAKE_TIMEOUT))
            .map_err(|e| NetError::Tls(format!("server TLS: {e}")))?;
    }
    Ok(builder)
}

fn local(listener: &TcpListener) -> Option<SocketAddr> {
    listener.local_addr().ok()
}

/// How an organization process runs beyond its configuration file.
#[derive(Clone, Debug, Default)]
pub struct OrgRuntime {
    /// Node settings; by default from the configuration (parallelism, checkpoints).
    pub node: Option<NodeSettings>,
    /// The ChainifyServer's sizes and time limits.
    pub chainify: ChainifySettings,
}

/// Which of an organization's components a process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// All three in one process (the default).
    All,
    /// ChainifyService and EndorsementService; follows the ledger in the database and forwards
    /// queries to the commit component's QueryService.
    Chainify,
    /// ExecutionService: executes blocks, takes and restores checkpoints, driven by the commit
    /// component.
    Execution,
    /// The node (orderer stream, votes, ledger, recovery) with CommitService for peers and
    /// AdminService and QueryService on the admin address; executes through the execution
    /// component.
    Commit,
}

impl Component {
    /// The name `--component` takes.
    pub fn name(self) -> &'static str {
        match self {
            Component::All => "all",
            Component::Chainify => "chainify",
            Component::Execution => "execution",
            Component::Commit => "commit",
        }
    }
}

impl std::str::FromStr for Component {
    type Err = String;

    fn from_str(s: &str) -> Result<Component, String> {
        match s {
            "all" => Ok(Component::All),
            "chainify" => Ok(Component::Chainify),
            "execution" => Ok(Component::Execution),
            "commit" => Ok(Component::Commit),
            other => Err(format!(
                "{other:?} is not a component: choose chainify, execution, commit or all"
            )),
        }
    }
}

type Serving = Pin<Box<dyn Future<Output = Result<(), NetError>> + Send>>;

/// Serves `router` on `listener` until `until` completes.
fn serve(
    org: OrgId,
    name: &'static str,
    router: Router,
    (listener, limits): (TcpListener, ConnectionLimits),
    until: impl Future<Output = ()> + Send + 'static,
) -> Serving {
    info!(%org, addr = ?local(&listener), "{name} listening");
    let fut = router.serve_with_incoming_shutdown(incoming_within(listener, limits), until);
    Box::pin(async move {
        fut.await
            .map_err(|e| NetError::Serve(format!("{name}: {e}")))
    })
}

async fn connect_orderer(
    network: &NetworkConfig,
    resume: Resume,
    tls: Option<&Tls>,
) -> Result<AnyOrderer, NetError> {
    Ok(match network.orderer.kind {
        OrdererKind::Solo => {
            let endpoint = network.orderer.solo_endpoint.clone().unwrap_or_default();
            AnyOrderer::Solo(RemoteOrderer::new(&endpoint, tls, network.max_block_txs)?)
        }
        OrdererKind::Kafka => AnyOrderer::Kafka(
            KafkaOrderer::connect(KafkaSettings {
                brokers: network.orderer.kafka_brokers.clone().unwrap_or_default(),
                topic: network
                    .orderer
                    .kafka_topic
                    .clone()
                    .unwrap_or_else(|| network.network_id.to_string()),
                network: network.network_id.clone(),
                max_block_txs: network.max_block_txs,
                batch_timeout: network.batch_timeout,
                cut: network.cut,
                replication: i32::from(network.orderer.kafka_replication),
                markers_from: resume,
            })
            .await
            .map_err(|e| NetError::Orderer(e.to_string()))?,
        ),
        OrdererKind::Local => {
            return Err(NetError::Config(
                "orderer.kind = \"local\" runs only inside one process (chainify demo); \
                 a network of processes needs \"solo\" or \"kafka\""
                    .into(),
            ));
        }
    })
}

fn execution_addr(config: &OrgConfig) -> Result<String, NetError> {
    config.listen.execution.clone().ok_or_else(|| {
        NetError::Config(
            "listen.execution is not set: the execution component needs its own address when \
             it runs as its own process"
                .into(),
        )
    })
}

/// How long a chainify or commit component waits for its execution component to register the
/// shared tables.
pub const REGISTRATION_WAIT: Duration = Duration::from_secs(60);

/// Opens the organization's store. The process that executes registers the shared tables (DDL
/// from two processes at once conflicts on PostgreSQL); the others wait until it has. Migrations
/// that race another component starting at the same time are retried.
async fn open_store(
    config: &OrgConfig,
    network: &NetworkConfig,
    options: StoreOptions,
    component: Component,
) -> Result<Store<AnyBackend>, NetError> {
    let tables: Vec<&str> = network.tables.iter().map(String::as_str).collect();
    let deadline = tokio::time::Instant::now() + REGISTRATION_WAIT;
    loop {
        let backend = AnyBackend::connect(&config.database_url, &options)
            .await
            .map_err(NetError::Storage)?;
        let store = match Store::open(backend, options.clone()).await {
            Ok(store) => store,
            // Another component of the organization is applying the same migrations right
            // now (they start together): once it is done, opening succeeds.
            Err(e @ StorageError::Migration { .. }) if tokio::time::Instant::now() < deadline => {
                warn!(org = %config.org_id, error = %e, "migrating raced another component; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => return Err(NetError::Storage(e)),
        };
        if matches!(component, Component::All | Component::Execution) {
            store.register(&tables).await.map_err(NetError::Storage)?;
            return Ok(store);
        }
        let registered = store.tables();
        let missing: Vec<&str> = tables
            .iter()
            .copied()
            .filter(|t| !registered.contains_key(*t))
            .collect();
        if missing.is_empty() {
            return Ok(store);
        }
        store.close().await;
        if tokio::time::Instant::now() >= deadline {
            return Err(NetError::Config(format!(
                "the shared tables {missing:?} are not registered in {}'s database after \
                 {REGISTRATION_WAIT:?}: start the organization's execution component first",
                config.org_id
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `component` of organization `config` until `shutdown` completes: then the servers stop
/// accepting and finish the calls under way, and the node finishes the block in flight.
///
/// The steps, in order: bind every listener the component needs (a taken port fails before
/// anything starts); open the store; serve the ExecutionService (execution component); connect
/// the orderer and start the node (commit component); serve the ChainifyService and
/// EndorsementService, the CommitService, AdminService and QueryService, and the metrics; run
/// the node; then wait for the shutdown or for any server or the node to stop.
pub async fn run_org(
    config: OrgConfig,
    runtime: OrgRuntime,
    component: Component,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), NetError> {
    let me = config.org_id;
    let network = Arc::new(config.network.clone());
    if network.signatures == chainify_core::crypto::Signatures::Off {
        warn!(org = %me, "signatures = \"off\": nothing is signed or checked, every client, \
            organization and orderer is trusted (for benchmarks only)");
    }
    let key = Arc::new(
        SigningKey::load(&config.signing_key)
            .map_err(|e| NetError::Config(format!("signing key: {e}")))?,
    );
    let tls = org_tls(&config)?;
    let listeners = Listeners::bind(&config, component).await?;
    let parallelism = config.execution.parallelism;
    // A block's lanes, the digest and the ledger, and the queries' own.
    let options = StoreOptions {
        max_connections: u32::try_from(parallelism + 2 + runtime.chainify.max_queries)
            .unwrap_or(u32::MAX),
        ..StoreOptions::default()
    };
    if network.tables.is_empty() {
        warn!(org = %me, "the network file lists no shared tables");
    }
    let store = Arc::new(open_store(&config, &network, options, component).await?);
    let mode = if parallelism <= 1 {
        ExecMode::Serial
    } else {
        ExecMode::Parallel(parallelism)
    };
    let org = Org {
        me,
        component,
        limits: ConnectionLimits::for_network(&network, Some(me)).await,
        verifier: Arc::new(Verifier::new(network.signatures)),
        network,
        key,
        tls,
        store,
        stop: watch::channel(false),
    };
    let mut servers: Vec<Serving> = Vec::new();
    let mut metrics = Arc::new(Metrics::default());
    if let Some(listener) = listeners.execution {
        servers.push(org.serve_execution(listener, mode, metrics.clone()).await?);
    }
    let orderer = match component {
        Component::Execution => None,
        _ => {
            let (resume, _) = resume_point(&org.store).await?;
            Some(Arc::new(
                connect_orderer(&org.network, resume, org.tls.as_ref()).await?,
            ))
        }
    };
    let node = match (component, &orderer) {
        (Component::All | Component::Commit, Some(orderer)) => {
            let node = org.start_node(&config, &runtime, mode, orderer).await?;
            metrics = node.metrics();
            Some(node)
        }
        _ => None,
    };
    // What the servers need of the node, taken before any await (the node is not Sync).
    let handles = node.as_ref().map(NodeHandles::of);
    let mut chainify_server = None;
    if let (Some(listener), Some(orderer)) = (listeners.chainify, orderer) {
        let (server, serving) = org
            .serve_chainify(
                listener,
                orderer,
                handles.as_ref(),
                &config,
                &runtime,
                metrics.clone(),
            )
            .await?;
        chainify_server = Some(server);
        servers.push(serving);
    }
    if let (Some(handles), Some(commit), Some(admin)) =
        (&handles, listeners.commit, listeners.admin)
    {
        servers.extend(
            org.serve_commit_and_admin(handles, commit, admin, &runtime)
                .await?,
        );
    }
    if let Some(listener) = listeners.metrics {
        servers.push(org.serve_metrics(listener, node.as_ref(), chainify_server, metrics));
    }
    if let Some(node) = node {
        servers.push(org.run_node(node));
    }
    org.until_stopped(shutdown, servers).await
}

/// The listeners a component binds, all before anything starts.
struct Listeners {
    chainify: Option<TcpListener>,
    commit: Option<TcpListener>,
    admin: Option<TcpListener>,
    execution: Option<TcpListener>,
    metrics: Option<TcpListener>,
}

impl Listeners {
    async fn bind(config: &OrgConfig, component: Component) -> Result<Listeners, NetError> {
        use Component::{All, Chainify, Commit, Execution};
        let chainify = match component {
            All | Chainify => Some(bind("listen.chainify", &config.listen.chainify).await?),
            _ => None,
        };
        let (commit, admin) = match component {
            All | Commit => (
                Some(bind("listen.commit", &config.listen.commit).await?),
                Some(bind("listen.admin", &config.listen.admin).await?),
            ),
            _ => (None, None),
        };
        let execution = match component {
            Execution => Some(bind("listen.execution", &execution_addr(config)?).await?),
            _ => None,
        };
        let metrics = match (component, &config.listen) {
            (All | Commit, l) => Some(bind("listen.metrics", &l.metrics).await?),
            (Execution, l) => match &l.metrics_execution {
                Some(addr) => Some(bind("listen.metrics_execution", addr).await?),
                None => None,
            },
            (Chainify, l) => match &l.metrics_chainify {
                Some(addr) => Some(bind("listen.metrics_chainify", addr).await?),
                None => None,
            },
        };
        if metrics.is_none() {
            warn!(org = %config.org_id, ?component, "no metrics address for this component: not serving metrics");
        }
        Ok(Listeners {
            chainify,
            commit,
            admin,
            execution,
            metrics,
        })
    }
}

/// What the servers need of a running node, taken before it runs.
struct NodeHandles {
    inbox: Inbox,
    status: watch::Receiver<NodeStatus>,
    feed: CommitFeed<AnyBackend>,
    gate: ReadGate,
    state_server: Arc<StateServer<AnyBackend>>,
}

impl NodeHandles {
    fn of(node: &OrgNode) -> NodeHandles {
        NodeHandles {
            inbox: node.inbox(),
            status: node.status(),
            feed: node.commit_feed(),
            gate: node.read_gate(),
            state_server: node.state_server(),
        }
    }
}

type OrgNode = Node<AnyBackend, AnyOrderer>;

/// Largest gRPC message a server takes or sends.
pub(crate) const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// One organization's component while it starts: what every step shares.
struct Org {
    me: OrgId,
    component: Component,
    network: Arc<NetworkConfig>,
    key: Arc<SigningKey>,
    /// The signature checks its admission and its execution share.
    verifier: Arc<Verifier>,
    tls: Option<Tls>,
    store: Arc<Store<AnyBackend>>,
    /// Its servers' connection limits, the other organizations' addresses among them.
    limits: ConnectionLimits,
    /// Set when the component stops (a shutdown, or a server or the node that ended).
    stop: (watch::Sender<bool>, watch::Receiver<bool>),
}

impl Org {
    /// Completes once the component stops.
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.1.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    async fn serve_execution(
        &self,
        listener: TcpListener,
        mode: ExecMode,
        metrics: Arc<Metrics>,
    ) -> Result<Serving, NetError> {
        // The node passes the hash to chain to with every block.
        let exec = ExecutionServer::new(
            self.store.clone(),
            self.network.clone(),
            mode,
            self.verifier.clone(),
        )?;
        let port = Arc::new(LocalExecution::new(self.store.clone(), exec, metrics));
        let block_limit = crate::exec::execute_message_limit(self.network.max_block_txs);
        Ok(serve(
            self.me,
            "ExecutionService",
            router(self.tls.as_ref(), &["chainify.v1.ExecutionService"])
                .await?
                .add_service(
                    ExecutionServiceServer::new(ExecutionGrpc::new(port))
                        .max_decoding_message_size(block_limit)
                        .max_encoding_message_size(block_limit),
                ),
            (listener, self.limits.clone()),
            self.stopped(),
        ))
    }

    /// Starts the node (the commit component), executing here or through the execution
    /// process, with votes over gRPC and state transfers from the other organizations.
    async fn start_node(
        &self,
        config: &OrgConfig,
        runtime: &OrgRuntime,
        mode: ExecMode,
        orderer: &Arc<AnyOrderer>,
    ) -> Result<OrgNode, NetError> {
        let (me, tls) = (self.me, self.tls.as_ref());
        let transport = Arc::new(GrpcTransport::new(
            &self.network,
            me,
            self.key.clone(),
            tls,
        )?);
        let settings = runtime.node.clone().unwrap_or_else(|| NodeSettings {
            mode,
            checkpoint_interval: config.checkpoint.interval_blocks,
            checkpoints_kept: config.checkpoint.kept,
            state_check_interval: config.checkpoint.state_check_interval,
            ..NodeSettings::default()
        });
        let parts = NodeParts {
            store: self.store.clone(),
            network: self.network.clone(),
            me,
            key: self.key.clone(),
            verifier: self.verifier.clone(),
            orderer: orderer.clone(),
            transport: transport.clone(),
            settings,
        };
        let mut node = if self.component == Component::Commit {
            let channel = channel(&execution_addr(config)?, tls, &config.org_id.tls_name())?;
            let remote = Arc::new(RemoteExecution::new(channel, self.network.max_block_txs));
            Node::start_with(parts, remote, Arc::new(Metrics::default())).await
        } else {
            Node::start(parts).await
        }?;
        transport.attach(node.inbox());
        node.set_state_peers(Arc::new(GrpcStatePeers::new(
            &self.network,
            me,
            self.key.clone(),
            tls,
            config.checkpoint.transfer_max_bytes,
        )?));
        Ok(node)
    }

    /// The ChainifyService and EndorsementService: over the node's status, commit feed and
    /// read gate, or (the chainify component alone) over the ledger followed in the database,
    /// with queries forwarded to the commit component.
    async fn serve_chainify(
        &self,
        listener: TcpListener,
        orderer: Arc<AnyOrderer>,
        node: Option<&NodeHandles>,
        config: &OrgConfig,
        runtime: &OrgRuntime,
        metrics: Arc<Metrics>,
    ) -> Result<(ChainifyServer<AnyBackend, AnyOrderer>, Serving), NetError> {
        let tls = self.tls.as_ref();
        let (status, commits, queries) = match node {
            Some(n) => (
                n.status.clone(),
                n.feed.clone(),
                QueryAccess::Gate(n.gate.clone()),
            ),
            None => {
                let admin = channel(&config.listen.admin, tls, &config.org_id.tls_name())?;
                let (status, commits, _follower) = follow_ledger(
                    self.store.clone(),
                    self.me,
                    runtime.chainify.commit_stream_buffer,
                    Some(AdminServiceClient::new(admin.clone())),
                    self.stop.1.clone(),
                )
                .await
                .map_err(NetError::Storage)?;
                let queries = QueryAccess::Forward(admin);
                (status, commits, queries)
            }
        };
        let server = ChainifyServer::new(
            ChainifyParts {
                me: self.me,
                key: self.key.clone(),
                verifier: self.verifier.clone(),
                network: self.network.clone(),
                store: self.store.clone(),
                orderer,
                status,
                commits,
                queries,
                metrics,
            },
            tls,
            runtime.chainify.clone(),
        )?;
        let serving = serve(
            self.me,
            "ChainifyService and EndorsementService",
            router(
                tls,
                &[
                    "chainify.v1.ChainifyService",
                    "chainify.v1.EndorsementService",
                ],
            )
            .await?
            .add_service(
                ChainifyServiceServer::new(server.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .add_service(
                EndorsementServiceServer::new(server.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            ),
            (listener, self.limits.clone()),
            self.stopped(),
        );
        Ok((server, serving))
    }

    /// The CommitService (votes, certificates, ledger, state transfer) and the AdminService
    /// and QueryService.
    async fn serve_commit_and_admin(
        &self,
        node: &NodeHandles,
        commit_listener: TcpListener,
        admin_listener: TcpListener,
        runtime: &OrgRuntime,
    ) -> Result<[Serving; 2], NetError> {
        let tls = self.tls.as_ref();
        let commit = CommitServer::new(
            &self.network,
            self.me,
            node.inbox.clone(),
            self.store.clone(),
            node.status.clone(),
        )
        .with_state(node.state_server.clone());
        let commit = serve(
            self.me,
            "CommitService",
            router(tls, &["chainify.v1.CommitService"])
                .await?
                .add_service(
                    CommitServiceServer::new(commit)
                        .max_decoding_message_size(MAX_MESSAGE)
                        .max_encoding_message_size(MAX_MESSAGE),
                ),
            (commit_listener, self.limits.clone()),
            self.stopped(),
        );
        let admin = AdminServer::new(
            self.network.clone(),
            self.store.clone(),
            node.status.clone(),
            node.gate.clone(),
        );
        let queries = QueryServer::new(
            self.me,
            self.key.clone(),
            self.network.clone(),
            self.store.clone(),
            node.gate.clone(),
            &runtime.chainify,
        )?;
        let admin = serve(
            self.me,
            "AdminService and QueryService",
            router(
                tls,
                &["chainify.v1.AdminService", "chainify.v1.QueryService"],
            )
            .await?
            .add_service(AdminServiceServer::new(admin))
            .add_service(
                QueryServiceServer::new(queries)
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            ),
            (admin_listener, self.limits.clone()),
            self.stopped(),
        );
        Ok([commit, admin])
    }

    /// Prometheus metrics: the phases recorded here, the node's status, queue depths and the
    /// database pool.
    fn serve_metrics(
        &self,
        listener: TcpListener,
        node: Option<&OrgNode>,
        chainify_server: Option<ChainifyServer<AnyBackend, AnyOrderer>>,
        metrics: Arc<Metrics>,
    ) -> Serving {
        let status = node.map(Node::status);
        let inbox = node.map(Node::inbox);
        let store = self.store.clone();
        let label = format!(
            "org=\"{}\",component=\"{}\"",
            self.me.0,
            self.component.name()
        );
        let render: Render = Arc::new(move || {
            let mut out = String::new();
            family(
                &mut out,
                "chainify_info",
                "gauge",
                "The organization and component this process runs.",
                &[(label.clone(), 1.0)],
            );
            metrics.render(&mut out);
            if let Some(status) = &status {
                render_status(&mut out, &status.borrow());
            }
            let mut queues = Vec::new();
            if let Some(inbox) = &inbox {
                queues.push(("queue=\"node_inbox\"".to_owned(), inbox.depth() as f64));
            }
            if let Some(server) = &chainify_server {
                queues.push((
                    "queue=\"chainify_in_flight\"".to_owned(),
                    server.in_flight() as f64,
                ));
            }
            family(
                &mut out,
                "chainify_queue_depth",
                "gauge",
                "Items waiting or under way in the component's bounded queues.",
                &queues,
            );
            let pool = store.backend().pool_use();
            family(
                &mut out,
                "chainify_db_connections",
                "gauge",
                "The database connection pool: connections open, idle, and the most it opens.",
                &[
                    ("state=\"open\"".to_owned(), f64::from(pool.open)),
                    ("state=\"idle\"".to_owned(), f64::from(pool.idle)),
                    ("state=\"max\"".to_owned(), f64::from(pool.max)),
                ],
            );
            out
        });
        info!(org = %self.me, addr = ?local(&listener), "metrics listening at /metrics");
        let until = self.stopped();
        Box::pin(async move {
            serve_metrics(listener, render, until).await;
            Ok(())
        })
    }

    /// Runs the node until the component stops; a node that stops on its own stops the
    /// component.
    fn run_node(&self, node: OrgNode) -> Serving {
        // Boxed: the node's future is deep, and the compiler's layout queries of the server
        // set would overflow their depth limit in release builds.
        let node_run = Box::pin(node.run(self.stopped()));
        let stop = self.stop.0.clone();
        Box::pin(async move {
            let result = node_run.await;
            let _ = stop.send(true);
            result.map_err(NetError::from)
        })
    }

    /// Waits for `shutdown` or for anything to stop the component, then for every server and
    /// the node to finish; the first error wins.
    async fn until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send,
        servers: Vec<Serving>,
    ) -> Result<(), NetError> {
        let (me, component) = (self.me, self.component);
        let stopped = self.stopped();
        let stop = self.stop.0.clone();
        let signal = async move {
            tokio::select! {
                () = shutdown => {
                    info!(org = %me, ?component, "shutting down: no new calls, finishing the block in flight");
                }
                () = stopped => {}
            }
            let _ = stop.send(true);
        };
        let (_, results) = tokio::join!(signal, futures_util::future::join_all(servers));
        for result in results {
            result?;
        }
        self.store.close().await;
        info!(org = %me, ?component, "stopped");
        Ok(())
    }
}
