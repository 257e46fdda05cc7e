//! chainify-node: the components of one organization, and N organizations in one process.
//!
//! - [`admission`]: whether a proposal may be ordered and every reason it may not (the checks,
//!   the nonce window, endorsement rounds over an [`Endorser`]), with no transport.
//! - [`ExecutionServer`]: turns an ordered [`TransactionBlock`] into the organization's
//!   [`LedgerBlock`]: validate every transaction deterministically (signatures, endorsement,
//!   replays), analyse and check grants, execute on the local engine, digest, chain.
//! - [`pipeline`]: what the node does next, without I/O: the execution schedule, the chain
//!   hash, the commit engine, recovery, repair and fast join (events in, commands out).
//! - [`Node`]: the runtime of an organization: feeds the pipeline (blocks from the orderer,
//!   execution results, peers' votes, the clock) and carries its commands out (executions,
//!   ledger appends, restores, replays, state transfers); status and a commit stream.
//! - [`feed`]: appended blocks from any height (ledger history, then live) for every consumer.
//! - [`ledger`]: the one typed reader and writer of the organization's ledger.
//! - [`transfer`]: state transfer from an agreeing organization.
//! - [`transport`]: how CommitServers exchange votes and certificates; [`LocalNetwork`] within
//!   one process.
//!
//! Where it sits: the I/O runtime of an organization (tokio, its database through
//! `chainify-storage`) above `chainify-sql`, `chainify-commit` and `chainify-orderer`, with no
//! network transport of its own: peers are reached through [`Transport`], [`Endorser`] and
//! [`StatePeers`], orderers through `chainify_orderer::Orderer`. `chainify-net` serves it over
//! gRPC; `chainify-testkit`'s cluster runs N of them in one process (tests, the demo,
//! benchmarks).

pub mod admission;
mod execution;
pub mod fair;
mod fault;
pub mod feed;
mod gate;
mod group;
pub mod ledger;
pub mod metrics;
mod node;
mod offload;
pub mod pipeline;
mod port;
pub mod transfer;
pub mod transport;

pub use admission::{
    Admission, AdmissionSettings, ClientSignature, Endorser, Refusal, Replay, Unauthenticated,
    check_proposal, check_proposal_cached,
};
pub use execution::{Executed, ExecutionError, ExecutionServer};
pub use fault::LocalFault;
pub use feed::{CommitFeed, Subscription};
pub use gate::{ReadGate, ReadGuard};
pub use node::{
    Committed, Node, NodeError, NodeParts, NodeSettings, NodeStatus, RecoveryReport,
    TransferReport, resume_point,
};
pub use offload::{Offload, OffloadError};
pub use port::{BlockJob, Checkpoint, ExecutionPort, LocalExecution, PortExecuted, PortFuture};
pub use transfer::{
    LocalPeer, NoPeers, OfferedTable, PeerError, PeerFuture, ServeError, StateOffer, StatePeer,
    StatePeers, StateServer, TransferError,
};
pub use transport::{Inbox, LocalNetwork, PeerMessage, Transport};

#[doc(no_inline)]
pub use chainify_core::tx::{LedgerBlock, TransactionBlock};
