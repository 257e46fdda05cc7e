//! `chainify node` (one organization's components) and `chainify orderer` (the solo orderer):
//! long-running servers that stop gracefully on SIGINT or SIGTERM.

use std::path::{Path, PathBuf};

use anyhow::Context;
use chainify_core::config::{NetworkConfig, OrgConfig};
use chainify_net::{
    Component, ConnectionLimits, OrgRuntime, SoloServer, Tls, bind, incoming_within, run_org,
    server_builder,
};
use chainify_orderer::LocalOrderer;
use chainify_proto::pb::orderer_service_server::OrdererServiceServer;

#[derive(Debug, clap::Args)]
pub(crate) struct NodeArgs {
    /// The organization's configuration file (org.toml).
    #[arg(long)]
    config: PathBuf,
    /// Run one component in this process: `execution` (ExecutionService on listen.execution),
    /// `commit` (the node: orderer stream, votes, ledger, recovery; CommitService, and
    /// AdminService with QueryService on listen.admin) or `chainify` (ChainifyService and
    /// EndorsementService); start them in that order. Default: all three in one process.
    #[arg(long, default_value = "all", value_parser = clap::value_parser!(String))]
    component: String,
}

#[derive(Debug, clap::Args)]
pub(crate) struct OrdererArgs {
    /// The network file; the orderer listens on its `orderer.solo_endpoint`.
    #[arg(long)]
    network: PathBuf,
    /// Listen here instead.
    #[arg(long)]
    listen: Option<String>,
    /// TLS certificate (default: tls/orderer.pem beside the network file, when it uses TLS).
    #[arg(long)]
    cert: Option<PathBuf>,
    /// TLS key (default: tls/orderer.key beside the network file).
    #[arg(long)]
    key: Option<PathBuf>,
}

pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CHAINIFY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Completes on SIGINT or SIGTERM.
pub(crate) async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub(crate) fn node(args: &NodeArgs) -> anyhow::Result<()> {
    init_logging();
    let component: Component = args
        .component
        .parse()
        .map_err(|e| anyhow::anyhow!("--component: {e}"))?;
    let config = OrgConfig::load(&args.config)?;
    runtime()?.block_on(async {
        run_org(config, OrgRuntime::default(), component, stop_signal())
            .await
            .with_context(|| format!("organization of {}", args.config.display()))
    })
}

fn beside(network: &Path, file: &str) -> PathBuf {
    network.parent().unwrap_or(Path::new(".")).join(file)
}

pub(crate) fn orderer(args: &OrdererArgs) -> anyhow::Result<()> {
    init_logging();
    let network = NetworkConfig::load(&args.network)?;
    let listen = match (&args.listen, &network.orderer.solo_endpoint) {
        (Some(l), _) | (None, Some(l)) => l.clone(),
        (None, None) => anyhow::bail!(
            "{}: no orderer.solo_endpoint; give --listen",
            args.network.display()
        ),
    };
    let tls = match &network.tls_ca {
        Some(ca) => {
            let cert = args
                .cert
                .clone()
                .unwrap_or_else(|| beside(&args.network, "tls/orderer.pem"));
            let key = args
                .key
                .clone()
                .unwrap_or_else(|| beside(&args.network, "tls/orderer.key"));
            Some(Tls::server(ca, &cert, &key)?)
        }
        None => None,
    };
    runtime()?.block_on(async {
        let listener = bind("--listen", &listen).await?;
        // Every organization is the orderer's peer: clients cannot lock them out.
        let limits = ConnectionLimits::for_network(&network, None).await;
        let orderer = LocalOrderer::start(
            network.network_id.clone(),
            network.max_block_txs,
            network.batch_timeout,
        );
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status(
                "chainify.v1.OrdererService",
                tonic_health::ServingStatus::Serving,
            )
            .await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(chainify_proto::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        tracing::info!(%listen, network = %network.network_id, "solo orderer listening");
        let (closing_tx, closing) = tokio::sync::watch::channel(false);
        let mut stop = closing.clone();
        server_builder(tls.as_ref())?
            .add_service(health)
            .add_service(reflection)
            .add_service(
                OrdererServiceServer::new(SoloServer::new(orderer, closing))
                    .max_decoding_message_size(64 * 1024 * 1024)
                    .max_encoding_message_size(256 * 1024 * 1024),
            )
            .serve_with_incoming_shutdown(incoming_within(listener, limits), async move {
                tokio::select! {
                    () = stop_signal() => {}
                    _ = stop.wait_for(|c| *c) => {}
                }
                closing_tx.send_replace(true);
            })
            .await
            .context("serving the solo orderer")?;
        tracing::info!("solo orderer stopped");
        Ok(())
    })
}
