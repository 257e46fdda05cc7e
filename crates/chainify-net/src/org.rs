//! One organization as a process: its store, node, transports and gRPC servers, assembled from
//! its configuration (`chainify node`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use chainify_core::config::{OrdererKind, OrgConfig};
use chainify_core::crypto::SigningKey;
use chainify_core::tx::ChainedTransaction;
use chainify_node::{Node, NodeSettings, resume_point};
use chainify_orderer::{BlockStream, KafkaOrderer, KafkaSettings, Orderer, OrdererError, Resume};
use chainify_proto::FILE_DESCRIPTOR_SET;
use chainify_proto::pb::admin_service_server::AdminServiceServer;
use chainify_proto::pb::chainify_service_server::ChainifyServiceServer;
use chainify_proto::pb::commit_service_server::CommitServiceServer;
use chainify_proto::pb::endorsement_service_server::EndorsementServiceServer;
use chainify_storage::{AnyBackend, ExecMode, Store, StoreOptions};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::Server;
use tracing::{info, warn};

use crate::NetError;
use crate::admin::AdminServer;
use crate::chainify::{ChainifyParts, ChainifyServer, ChainifySettings};
use crate::peer::{CommitServer, GrpcTransport};
use crate::solo::RemoteOrderer;
use crate::tls::Tls;

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

/// Health and reflection services for a server offering `names`.
async fn support(
    names: &[&str],
) -> Result<
    (
        tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
    ),
    NetError,
> {
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in names {
        reporter
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| NetError::Internal(format!("reflection: {e}")))?;
    Ok((health, reflection))
}

/// A tonic server builder with this organization's TLS.
pub fn server_builder(tls: Option<&Tls>) -> Result<Server, NetError> {
    let mut builder = Server::builder()
        .tcp_nodelay(true)
        .concurrency_limit_per_connection(1024);
    if let Some(config) = tls.and_then(Tls::server_config) {
        builder = builder
            .tls_config(config)
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

/// Runs organization `config` until `shutdown` completes: then the servers stop accepting and
/// finish the calls under way, and the node finishes the block in flight.
pub async fn run_org(
    config: OrgConfig,
    runtime: OrgRuntime,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), NetError> {
    let me = config.org_id;
    let network = Arc::new(config.network.clone());
    let key = Arc::new(
        SigningKey::load(&config.signing_key)
            .map_err(|e| NetError::Config(format!("signing key: {e}")))?,
    );
    let tls = org_tls(&config)?;
    // Bind first: a busy port is reported before anything else starts.
    let chainify_listener = bind("listen.chainify", &config.listen.chainify).await?;
    let commit_listener = bind("listen.commit", &config.listen.commit).await?;
    let admin_listener = bind("listen.admin", &config.listen.admin).await?;

    let parallelism = config.execution.parallelism;
    let options = StoreOptions {
        max_connections: u32::try_from(parallelism + 2).unwrap_or(u32::MAX),
        ..StoreOptions::default()
    };
    let backend = AnyBackend::connect(&config.database_url, &options)
        .await
        .map_err(NetError::Storage)?;
    let store = Arc::new(
        Store::open(backend, options)
            .await
            .map_err(NetError::Storage)?,
    );
    if network.tables.is_empty() {
        warn!(org = %me, "the network file lists no shared tables");
    }
    let tables: Vec<&str> = network.tables.iter().map(String::as_str).collect();
    store.register(&tables).await.map_err(NetError::Storage)?;

    let (resume, _) = resume_point(&store)
        .await
        .map_err(|e| NetError::Internal(e.to_string()))?;
    let orderer = Arc::new(match network.orderer.kind {
        OrdererKind::Solo => {
            let endpoint = network.orderer.solo_endpoint.clone().unwrap_or_default();
            AnyOrderer::Solo(RemoteOrderer::new(&endpoint, tls.as_ref())?)
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
                replication: 1,
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
    });
    let transport = Arc::new(GrpcTransport::new(&network, me, tls.as_ref())?);
    let settings = runtime.node.unwrap_or_else(|| NodeSettings {
        mode: if parallelism <= 1 {
            ExecMode::Serial
        } else {
            ExecMode::Parallel(parallelism)
        },
        checkpoint_interval: config.checkpoint.interval_blocks,
        checkpoints_kept: config.checkpoint.kept,
        ..NodeSettings::default()
    });
    let node = Node::start(
        store.clone(),
        network.clone(),
        me,
        key.clone(),
        orderer.clone(),
        transport.clone(),
        settings,
    )
    .await
    .map_err(|e| NetError::Internal(e.to_string()))?;
    transport.attach(node.inbox());

    let chainify = ChainifyServer::new(
        ChainifyParts {
            me,
            key,
            network: network.clone(),
            store: store.clone(),
            orderer,
            status: node.status(),
            commits: node.commits(),
            gate: node.read_gate(),
        },
        tls.as_ref(),
        runtime.chainify,
    )?;
    let commit = CommitServer::new(node.inbox(), store.clone(), node.status());
    let admin = AdminServer::new(
        network.clone(),
        store.clone(),
        node.status(),
        node.read_gate(),
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let max = 64 * 1024 * 1024;

    let (health, reflection) = support(&[
        "chainify.v1.ChainifyService",
        "chainify.v1.EndorsementService",
        "",
    ])
    .await?;
    info!(org = %me, addr = ?local(&chainify_listener), "ChainifyService listening");
    let chainify_server = server_builder(tls.as_ref())?
        .add_service(health)
        .add_service(reflection)
        .add_service(
            ChainifyServiceServer::new(chainify.clone())
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .add_service(
            EndorsementServiceServer::new(chainify)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(chainify_listener),
            stopped(stop_rx.clone()),
        );

    let (health, reflection) = support(&["chainify.v1.CommitService", ""]).await?;
    info!(org = %me, addr = ?local(&commit_listener), "CommitService listening");
    let commit_server = server_builder(tls.as_ref())?
        .add_service(health)
        .add_service(reflection)
        .add_service(
            CommitServiceServer::new(commit)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(commit_listener),
            stopped(stop_rx.clone()),
        );

    let (health, reflection) = support(&["chainify.v1.AdminService", ""]).await?;
    info!(org = %me, addr = ?local(&admin_listener), "AdminService listening");
    let admin_server = server_builder(tls.as_ref())?
        .add_service(health)
        .add_service(reflection)
        .add_service(AdminServiceServer::new(admin))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(admin_listener),
            stopped(stop_rx.clone()),
        );

    let node_run = node.run(stopped(stop_rx.clone()));
    // A node that fails stops the servers too.
    let stop = stop_tx.clone();
    let node_run = async move {
        let result = node_run.await;
        let _ = stop.send(true);
        result
    };
    let signal = async move {
        tokio::select! {
            () = shutdown => {
                info!(org = %me, "shutting down: no new calls, finishing the block in flight");
            }
            () = stopped(stop_rx) => {}
        }
        let _ = stop_tx.send(true);
    };
    let (_, a, b, c, n) = tokio::join!(
        signal,
        chainify_server,
        commit_server,
        admin_server,
        node_run
    );
    a.map_err(|e| NetError::Serve(format!("ChainifyService: {e}")))?;
    b.map_err(|e| NetError::Serve(format!("CommitService: {e}")))?;
    c.map_err(|e| NetError::Serve(format!("AdminService: {e}")))?;
    n.map_err(|e| NetError::Internal(e.to_string()))?;
    store.close().await;
    info!(org = %me, "stopped");
    Ok(())
}
