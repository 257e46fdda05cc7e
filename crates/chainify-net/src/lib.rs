//! chainify-net: an organization's components as gRPC services (docs/design/overview.md §2, §5).
//!
//! - [`ChainifyServer`]: `ChainifyService` for clients (authenticate, check grants and the
//!   determinism rules, batched early abort with the other organizations, order, report
//!   outcomes, queries at an agreed height) and `EndorsementService` for peers;
//! - [`CommitServer`] and [`GrpcTransport`]: votes and certificates between CommitServers;
//! - [`SoloServer`] and [`RemoteOrderer`]: the solo orderer over gRPC;
//! - [`AdminServer`]: status, checkpoints, ledger verification;
//! - [`run_org`]: one organization assembled from its configuration, with health and
//!   reflection on every server and a graceful shutdown;
//! - [`tls`]: the network's certificate authority and rustls configuration.
//!
//! Every queue is bounded and named; a full queue refuses (RESOURCE_EXHAUSTED) or, for the
//! loss-tolerant vote traffic, drops.
//!
//! Where it sits: the only crate with gRPC servers (tonic, rustls), on top of `chainify-node`,
//! `chainify-storage` and `chainify-orderer`; it uses `chainify-client`'s channel setup to reach
//! peers. Only the binary depends on it (`node`, `orderer`, and `init` for the certificates).

mod admin;
mod chainify;
mod conns;
mod exec;
mod follow;
mod metrics;
mod org;
mod peer;
mod query;
mod solo;
pub mod state;
mod status;
pub mod tls;

pub use admin::{AdminServer, recovery_state};
pub use chainify::{
    ChainifyParts, ChainifyServer, ChainifySettings, LOOKUPS_WAITING, LOOKUPS_WAITING_PER_ADDRESS,
};
pub use conns::{CONNECTION_IDLE, Conn, ConnectionLimits, Incoming, incoming, incoming_within};
pub use exec::{EXECUTE_TIMEOUT, ExecutionGrpc, RemoteExecution};
pub use follow::{FOLLOW_INTERVAL, follow_ledger};
pub use metrics::{Render, serve_metrics};
pub use org::{
    AnyOrderer, Component, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, OrgRuntime, REGISTRATION_WAIT,
    TLS_HANDSHAKE_TIMEOUT, bind, org_tls, run_org, server_builder,
};
pub use peer::{
    CommitServer, GrpcTransport, MAX_LEDGER_STREAM, MAX_VOTE_BATCH, PEER_CALL_TIMEOUT, PEER_QUEUE,
};
pub use query::{QUERIES_WAITING, QUERIES_WAITING_PER_CLIENT, QueryAccess, QueryServer};
pub use solo::{BROADCAST_QUEUE, MAX_BROADCAST_BATCH, RemoteOrderer, SoloServer};
pub use state::{GrpcStatePeers, STATE_CALL_TIMEOUT};
pub use tls::Tls;

use chainify_storage::StorageError;

/// Why a service cannot start or run.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// An endpoint cannot be used.
    #[error("endpoint {endpoint:?}: {problem}")]
    Endpoint {
        /// The endpoint as configured.
        endpoint: String,
        /// What is wrong.
        problem: String,
    },
    /// A listen address cannot be bound.
    #[error("{what} = {addr:?}: cannot listen: {problem}")]
    Listen {
        /// The configuration key.
        what: String,
        /// The address.
        addr: String,
        /// Why.
        problem: String,
    },
    /// TLS material is missing or unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// The configuration cannot be used.
    #[error("configuration: {0}")]
    Config(String),
    /// The database failed.
    #[error(transparent)]
    Storage(StorageError),
    /// The orderer cannot be reached.
    #[error("orderer: {0}")]
    Orderer(String),
    /// A server failed.
    #[error("serving {0}")]
    Serve(String),
    /// The organization's node cannot start or stopped: it cannot go on without an operator.
    #[error(transparent)]
    Node(#[from] chainify_node::NodeError),
    /// The ExecutionServer cannot be built (the shared tables' schema cannot be read).
    #[error(transparent)]
    Execution(#[from] chainify_node::ExecutionError),
    /// A bug.
    #[error("{0}")]
    Internal(String),
}
