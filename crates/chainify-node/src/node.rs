//! The runtime of one organization (docs/design/overview.md §2.3–2.5): blocks from the orderer
//! go through the [`ExecutionServer`], votes and certificates through a [`Transport`], agreed
//! blocks into the ledger in the organization's database; status and a commit stream are
//! published.
//!
//! What to do is decided by the sans-IO [`Pipeline`] (which holds the commit engine, the chain
//! hash, the execution schedule and recovery); this runtime feeds it events and carries out its
//! commands, nothing more.
//!
//! One task owns everything; the block being executed is a future polled beside the inbox and
//! the clock, so votes keep flowing while a block runs, and with `pipeline_depth` > 0 the next
//! blocks execute while earlier ones are still being voted on. Their effects are undone through
//! the same recovery path if an earlier block disagrees.
//!
//! Checkpoints are taken right after a block executes (before it is agreed), because with
//! pipelining the database moves on before the vote ends. Recovery of block b only uses
//! checkpoints before b, which are all of agreed blocks, and a restore forgets later ones.
//!
//! A restart goes through [`Node::start`]: the ledger decides the next block; blocks executed but
//! not appended before the crash are re-delivered and their stored outcome is voted again; a
//! block cut short is resumed by the executor; a database restored behind its own ledger (a
//! crash during recovery) is replayed and checked against the ledger first.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chainify_commit::{self as commit, CommitEngine, State, Timing};
use chainify_core::config::NetworkConfig;
use chainify_core::crypto::SigningKey;
use chainify_core::tx::LedgerEntry;
use chainify_core::tx::{Certificate, LedgerBlock, TransactionBlock};
use chainify_core::verify::Verifier;
use chainify_core::votes::VoteContext;
use chainify_core::{BlockNumber, Digest, OrgId};
use chainify_orderer::{BlockStream, Demand, Orderer, OrdererError, Resume};
use chainify_storage::{Backend, ExecMode, Store};
use futures_util::StreamExt;
use tokio::sync::{OwnedRwLockWriteGuard, broadcast, mpsc, watch};
use tracing::{Instrument, error, info, info_span, warn};

use crate::LocalFault;
use crate::execution::{Executed, ExecutionError, ExecutionServer};
use crate::feed::CommitFeed;
use crate::gate::{Gate, ReadGate};
use crate::ledger;
use crate::metrics::{Metrics, Phase};
use crate::pipeline::{Command, Event, Notice, Pipeline, RecoveryError, Repaired, Schedule};
use crate::port::{BlockJob, Checkpoint, ExecutionPort, LocalExecution, PortExecuted};
use crate::transfer::{
    NoPeers, OFFER_TIMEOUT, PeerError, StatePeers, StateServer, TransferError, check_offer, fetch,
};
use crate::transport::{Inbox, PeerMessage, Transport};

/// A peer whose state transfer failed is tried after the others for this long.
const FAILED_PEER_PENALTY: Duration = Duration::from_secs(600);

/// How a node runs.
#[derive(Clone, Debug)]
pub struct NodeSettings {
    /// Parallel or serial execution.
    pub mode: ExecMode,
    /// Take a checkpoint after the first block and after every block whose number is a
    /// multiple of this.
    pub checkpoint_interval: u64,
    /// Keep this many checkpoints of agreed blocks.
    pub checkpoints_kept: usize,
    /// Compare the shared tables with the state digest by a full scan (in the background) with
    /// the first block after start and every block whose number is a multiple of this (a
    /// periodic scan first rests for four times the previous one's length).
    pub state_check_interval: u64,
    /// How many blocks may execute beyond the next block to append (0: none; the paper's
    /// behaviour).
    pub pipeline_depth: u64,
    /// When to re-send votes and fetch certificates.
    pub timing: Timing,
    /// The engine's clock resolution.
    pub tick: Duration,
    /// Messages from peers waiting to be handled; more are dropped (peers re-send).
    pub inbox_capacity: usize,
    /// Commit events a slow subscriber may lag behind before it misses some.
    pub commit_stream_capacity: usize,
    /// How long a replay waits for the orderer to deliver a block.
    pub replay_timeout: Duration,
    /// Start an empty ledger from another organization's verified checkpoint instead of
    /// replaying every block (fast join).
    pub fast_join: bool,
    /// How long a recovery keeps trying state transfers (peers may not have a checkpoint at or
    /// after the block yet) before it gives up and halts.
    pub transfer_timeout: Duration,
    /// How long one peer may take to serve a state transfer before the next one is tried.
    pub peer_transfer_timeout: Duration,
    /// Take a block the orderer cut without this node asking (full, timed out, or cut for
    /// another organization) while the block before executes, and validate and analyse it
    /// meanwhile. Off only to measure what it saves.
    pub look_ahead: bool,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings {
            mode: ExecMode::Parallel(8),
            checkpoint_interval: 100,
            checkpoints_kept: 3,
            state_check_interval: 100,
            pipeline_depth: 1,
            timing: Timing::default(),
            tick: Duration::from_millis(50),
            inbox_capacity: 4096,
            commit_stream_capacity: 1024,
            replay_timeout: Duration::from_secs(30),
            fast_join: true,
            transfer_timeout: Duration::from_secs(300),
            peer_transfer_timeout: Duration::from_secs(120),
            look_ahead: true,
        }
    }
}

/// Why a node could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The organization's database failed in a way retrying does not fix, its ledger cannot be
    /// read, or its ExecutionServer could not be built.
    #[error(transparent)]
    Local(#[from] LocalFault),
    /// The database is behind its own ledger (a crash during a recovery) and replaying the
    /// agreed blocks it misses failed.
    #[error("ledger block {through}: {source}")]
    CatchUp {
        /// The last block of the ledger.
        through: BlockNumber,
        /// Why the replay failed.
        source: RecoveryError,
    },
    /// A setting is out of range.
    #[error("node settings: {0}")]
    Settings(String),
    /// A bug: the task executing a block panicked.
    #[error("internal error: executing a block: {0}")]
    Panicked(#[from] tokio::task::JoinError),
}

crate::fault::from_local_faults!(NodeError);

/// An appended block, for the commit stream.
#[derive(Clone, Debug)]
pub struct Committed {
    /// The agreed block.
    pub block: LedgerBlock,
    /// Its certificate.
    pub certificate: Certificate,
    /// Why transactions failed: index in the block and reason (invalid, or rolled back).
    pub reasons: Vec<(usize, String)>,
}

/// One recovery, from the disagreement to the block's append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The block that disagreed.
    pub block: BlockNumber,
    /// The checkpoint that repaired it.
    pub checkpoint: Option<BlockNumber>,
    /// Checkpoints tried.
    pub attempts: u32,
    /// Blocks re-executed by the last attempt (checkpoint + 1 through the block).
    pub replayed: u64,
    /// Time spent restoring checkpoints.
    pub restore: Duration,
    /// Time spent replaying.
    pub replay: Duration,
    /// From the disagreement to the append.
    pub elapsed: Duration,
}

/// What a node reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    /// The organization.
    pub org: OrgId,
    /// The next block to append: every block before it is in the ledger.
    pub next_block: BlockNumber,
    /// The last block executed locally.
    pub executed: Option<BlockNumber>,
    /// The voting engine's state.
    pub state: State,
    /// Alarms raised, oldest first (the last 64).
    pub alarms: Vec<String>,
    /// Recoveries that ended in an append (the last 64).
    pub recoveries: Vec<RecoveryReport>,
    /// Votes not counted (forged, misdirected, equivocating, duplicate).
    pub rejected_votes: u64,
    /// Certificates not accepted.
    pub rejected_certificates: u64,
    /// Transactions flagged invalid by validation.
    pub invalid_transactions: u64,
    /// Failed attempts to execute a block (it is retried).
    pub execution_errors: u64,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// Messages from peers dropped because the inbox was full.
    pub dropped_messages: u64,
    /// Votes counted for the next block to append: organization → the LedgerBlock hash it
    /// voted for.
    pub pending_votes: BTreeMap<OrgId, Digest>,
    /// Recoveries since the node started (the list above keeps the last 64).
    pub recoveries_total: u64,
    /// Alarms since the node started.
    pub alarms_total: u64,
    /// Repairs of tables that differed from the agreed state (a full scan found them), by a
    /// verified full restore of a checkpoint and a replay.
    pub repairs_total: u64,
    /// States adopted from another organization (a repair or recovery no checkpoint could do,
    /// or a fast join).
    pub state_transfers_total: u64,
    /// The last state transfer.
    pub last_transfer: Option<TransferReport>,
}

/// One state transfer from another organization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferReport {
    /// Who served it.
    pub from: OrgId,
    /// The agreed block adopted.
    pub block: BlockNumber,
    /// Ledger entries appended with it.
    pub ledger_entries: u64,
    /// Key ranges that differed, and rows fetched for them.
    pub ranges: u64,
    /// Rows fetched.
    pub rows: u64,
    /// From the offer to the adopted state.
    pub elapsed: Duration,
}

impl NodeStatus {
    /// The status of a node of `org` that starts at `next_block` and has done nothing yet.
    pub fn new(org: OrgId, next_block: BlockNumber) -> NodeStatus {
        NodeStatus {
            org,
            next_block,
            executed: None,
            state: State::Running,
            alarms: Vec::new(),
            recoveries: Vec::new(),
            rejected_votes: 0,
            rejected_certificates: 0,
            invalid_transactions: 0,
            execution_errors: 0,
            last_error: None,
            dropped_messages: 0,
            pending_votes: BTreeMap::new(),
            recoveries_total: 0,
            repairs_total: 0,
            state_transfers_total: 0,
            last_transfer: None,
            alarms_total: 0,
        }
    }
}

/// What the runtime is woken by.
enum Wake {
    Stop,
    Message(PeerMessage),
    Executed(Box<Flight>),
    Block(Option<Result<TransactionBlock, OrdererError>>),
    /// The node may change the database again (readers are out).
    Gate(OwnedRwLockWriteGuard<()>),
    /// A reader waits for a clean point.
    Reader,
    Tick,
}

/// A finished execution: the block and its result.
struct Flight {
    block: TransactionBlock,
    result: Result<PortExecuted, ExecutionError>,
}

/// The task executing a block. It runs on its own, so that the loop can append the previous
/// block meanwhile (SQLite's single writer would otherwise wait on a block nobody polls), and
/// it dies with the node.
struct InFlight(tokio::task::JoinHandle<Flight>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Future for InFlight {
    type Output = Result<Flight, NodeError>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.map_err(NodeError::from))
    }
}

const KEEP_REPORTS: usize = 64;
const KEEP_CERTIFICATES: usize = 256;

/// A replayed range: its last block, the stream after it, and whether a full scan finished
/// meanwhile found the tables differ from the state digest.
struct Replayed {
    last: Executed,
    stream: Blocks,
    repair_needed: bool,
}

/// The orderer's block stream as the node reads it: whether it wants the block being filled
/// cut, and what the stream delivered while the node looked ahead.
struct Blocks {
    stream: BlockStream,
    /// Set while the pipeline takes blocks; cleared while it only looks ahead, so looking
    /// ahead never cuts a block early.
    demand: watch::Sender<bool>,
    /// A block (or the stream's end or failure) taken while looking ahead, for the pipeline
    /// when it wants the next block. Dropped with the stream when it is closed or replaced.
    ahead: Option<Option<Result<TransactionBlock, OrdererError>>>,
}

impl Blocks {
    /// The stream from `from`, wanting blocks until told otherwise.
    async fn open<O: Orderer>(orderer: &O, from: Resume) -> Result<Blocks, OrdererError> {
        let (demand, wants) = Demand::channel(true);
        Ok(Blocks {
            stream: orderer.deliver_on(from, wants).await?,
            demand,
            ahead: None,
        })
    }

    /// Says whether the node wants the block being filled cut now.
    fn want(&self, wanted: bool) {
        self.demand
            .send_if_modified(|d| std::mem::replace(d, wanted) != wanted);
    }
}

/// Time spent by the recovery under way, for its report.
struct RecoveryClock {
    block: BlockNumber,
    since: Instant,
    restore: Duration,
    replay: Duration,
}

/// One organization's ExecutionServer and CommitServer.
pub struct Node<B: Backend, O: Orderer> {
    me: OrgId,
    store: Arc<Store<B>>,
    orderer: Arc<O>,
    transport: Arc<dyn Transport>,
    settings: NodeSettings,
    /// What to do next: the commit engine, the chain hash, the schedule, recovery.
    pipeline: Pipeline,
    /// Where blocks execute (this process, or the organization's execution process).
    port: Arc<dyn ExecutionPort>,
    inbox: Inbox,
    inbox_rx: mpsc::Receiver<PeerMessage>,
    status: watch::Sender<NodeStatus>,
    commits: broadcast::Sender<Arc<Committed>>,
    blocks: Option<Blocks>,
    in_flight: Option<InFlight>,
    /// Executed blocks not yet appended, for the failure reasons of their commit event.
    executed: BTreeMap<BlockNumber, Executed>,
    certificates: BTreeMap<BlockNumber, Certificate>,
    recovery: Option<RecoveryClock>,
    repair_started: Option<Instant>,
    started: Instant,
    /// Keeps readers out while the database holds more than the agreed blocks.
    gate: Gate,
    metrics: Arc<Metrics>,
    /// When each block not yet appended finished executing (for the vote phase).
    executed_at: BTreeMap<BlockNumber, Instant>,
    writing: Option<OwnedRwLockWriteGuard<()>>,
    /// Where states are transferred from, and what this node serves to others.
    peers: Arc<dyn StatePeers>,
    state_server: Arc<StateServer<B>>,
    ctx: VoteContext,
    /// Peers whose state transfer failed, and when.
    failed_peers: BTreeMap<OrgId, Instant>,
}

type GateWait = Pin<Box<dyn Future<Output = OwnedRwLockWriteGuard<()>> + Send>>;

/// What an organization's node is made of.
pub struct NodeParts<B: Backend, O> {
    /// The organization's opened store, shared tables registered.
    pub store: Arc<Store<B>>,
    /// The network it belongs to.
    pub network: Arc<NetworkConfig>,
    /// Its id.
    pub me: OrgId,
    /// Its signing key (votes, endorsements, state-transfer requests).
    pub key: Arc<SigningKey>,
    /// Its signature checks, shared with its admission (none is checked twice); used when it
    /// executes in this process ([`Node::start`]).
    pub verifier: Arc<Verifier>,
    /// Where its blocks come from.
    pub orderer: Arc<O>,
    /// How its votes and certificates reach the other organizations.
    pub transport: Arc<dyn Transport>,
    /// How it runs.
    pub settings: NodeSettings,
}

impl<B: Backend, O> fmt::Debug for NodeParts<B, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeParts")
            .field("me", &self.me)
            .field("network", &self.network.network_id)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<B: Backend, O: Orderer + 'static> Node<B, O> {
    /// Prepares the organization over its parts, executing in this process: reads where its
    /// ledger ends and brings its database back to the ledger if a recovery was cut short.
    pub async fn start(parts: NodeParts<B, O>) -> Result<Self, NodeError> {
        let exec = ExecutionServer::new(
            parts.store.clone(),
            parts.network.clone(),
            parts.settings.mode,
            parts.verifier.clone(),
        )?;
        let metrics = Arc::new(Metrics::default());
        let port = Arc::new(LocalExecution::new(
            parts.store.clone(),
            exec,
            metrics.clone(),
        ));
        Self::start_with(parts, port, metrics).await
    }

    /// [`Node::start`] with blocks executed through `port` (the organization's execution
    /// process). The store is the same database: the node reads and appends the ledger there.
    pub async fn start_with(
        parts: NodeParts<B, O>,
        port: Arc<dyn ExecutionPort>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, NodeError> {
        let NodeParts {
            store,
            network,
            me,
            key,
            verifier: _,
            orderer,
            transport,
            settings,
        } = parts;
        if settings.checkpoint_interval == 0 || settings.checkpoints_kept == 0 {
            return Err(NodeError::Settings(format!(
                "checkpoint_interval ({}) and checkpoints_kept ({}) must be at least 1",
                settings.checkpoint_interval, settings.checkpoints_kept
            )));
        }
        if settings.state_check_interval == 0 {
            return Err(NodeError::Settings(
                "state_check_interval must be at least 1 (blocks between full scans)".into(),
            ));
        }
        if !network.orgs.contains_key(&me) {
            return Err(NodeError::Settings(format!(
                "organization {me} is not in network {}",
                network.network_id
            )));
        }
        let (resume, previous) = resume_point(&store).await?;
        let next = resume.block;
        let ctx = VoteContext::of(&network);
        let engine = CommitEngine::new(me, key, ctx.clone(), settings.timing, next);
        let schedule = Schedule {
            checkpoint_interval: settings.checkpoint_interval,
            state_check_interval: settings.state_check_interval,
            pipeline_depth: settings.pipeline_depth,
            fast_join: settings.fast_join,
            transfer_timeout_ms: millis(settings.transfer_timeout),
        };
        let pipeline = Pipeline::new(engine, schedule, resume, previous);
        let (inbox, inbox_rx) = Inbox::new(settings.inbox_capacity);
        let (status, _) = watch::channel(NodeStatus {
            executed: store.last_applied_block().await?,
            ..NodeStatus::new(me, next)
        });
        let (commits, _) = broadcast::channel(settings.commit_stream_capacity.max(1));
        let state_server = Arc::new(StateServer::new(store.clone(), status.subscribe()));
        let gate = Gate::default();
        // Nobody else has the gate yet; the catch-up below runs behind it.
        let writing = gate.lock.clone().try_write_owned().ok();
        let mut node = Node {
            me,
            store,
            orderer,
            transport,
            settings,
            pipeline,
            port,
            inbox,
            inbox_rx,
            status,
            commits,
            blocks: None,
            in_flight: None,
            executed: BTreeMap::new(),
            certificates: BTreeMap::new(),
            recovery: None,
            repair_started: None,
            started: Instant::now(),
            gate,
            writing,
            metrics,
            executed_at: BTreeMap::new(),
            peers: Arc::new(NoPeers),
            state_server,
            ctx,
            failed_peers: BTreeMap::new(),
        };
        if next > Resume::START.block {
            node.catch_up(BlockNumber(next.0 - 1)).await?;
        }
        Ok(node)
    }

    /// Where state transfers come from (none by default).
    pub fn set_state_peers(&mut self, peers: Arc<dyn StatePeers>) {
        self.peers = peers;
        self.pipeline.set_peers(!self.peers.peers().is_empty());
    }

    /// What this organization serves to others' state transfers.
    pub fn state_server(&self) -> Arc<StateServer<B>> {
        self.state_server.clone()
    }

    /// Where peers' messages for this node go.
    pub fn inbox(&self) -> Inbox {
        self.inbox.clone()
    }

    /// The node's status, updated as it changes.
    pub fn status(&self) -> watch::Receiver<NodeStatus> {
        self.status.subscribe()
    }

    /// Appended blocks from any height: the ledger, then the commit stream.
    pub fn commit_feed(&self) -> CommitFeed<B> {
        CommitFeed::new(self.store.clone(), self.commits.downgrade())
    }

    /// The metrics the node (and its local execution) records.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Read access to the database at the agreed height, for queries.
    pub fn read_gate(&self) -> ReadGate {
        ReadGate::new(self.gate.clone(), self.status.subscribe())
    }

    /// Runs until `shutdown` completes, then finishes the block in flight and returns. An error
    /// means the organization cannot go on without an operator (the database refuses the
    /// ledger).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), NodeError> {
        // Everything the node logs carries its organization.
        let span = info_span!("node", org = %self.me);
        self.run_loop(shutdown).instrument(span).await
    }

    async fn run_loop(mut self, shutdown: impl Future<Output = ()>) -> Result<(), NodeError> {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(self.settings.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut gate_wait: Option<GateWait> = None;
        loop {
            // Hand the database to waiting readers at the first clean point.
            if self.writing.is_some() && self.pipeline.is_clean() && self.gate.readers_waiting() {
                self.writing = None;
            }
            let flying = self.in_flight.is_some();
            let wants_block = self.pipeline.wants_block() && self.blocks.is_some();
            let take_block = wants_block && self.writing.is_some() && !self.gate.readers_waiting();
            if wants_block && self.writing.is_none() && gate_wait.is_none() {
                gate_wait = Some(Box::pin(self.gate.lock.clone().write_owned()));
            }
            // What the stream delivered while the node looked ahead goes first.
            if take_block && let Some(held) = self.blocks.as_mut().and_then(|b| b.ahead.take()) {
                self.on_block(held).await?;
                continue;
            }
            let look_ahead = !take_block
                && self.settings.look_ahead
                && self.blocks.as_ref().is_some_and(|b| b.ahead.is_none());
            if let Some(b) = &self.blocks {
                b.want(take_block);
            }
            let gating = gate_wait.is_some();
            let arrived = self.gate.arrived.clone();
            let (in_flight, blocks, inbox) =
                (&mut self.in_flight, &mut self.blocks, &mut self.inbox_rx);
            let wake = tokio::select! {
                biased;
                () = &mut shutdown => Wake::Stop,
                Some(message) = inbox.recv() => Wake::Message(message),
                Some(flight) = async { match in_flight.as_mut() {
                    Some(f) => Some(f.await),
                    None => None,
                } }, if flying => Wake::Executed(Box::new(flight?)),
                Some(block) = async { match blocks.as_mut() {
                    Some(b) => Some(b.stream.next().await),
                    None => None,
                } }, if take_block || look_ahead => Wake::Block(block),
                guard = async { match gate_wait.as_mut() {
                    Some(wait) => wait.await,
                    None => std::future::pending().await,
                } }, if gating => Wake::Gate(guard),
                () = arrived.notified() => Wake::Reader,
                _ = ticker.tick() => Wake::Tick,
            };
            match wake {
                Wake::Stop => break,
                Wake::Message(message) => self.on_message(message).await?,
                Wake::Executed(flight) => {
                    self.in_flight = None;
                    self.on_executed(*flight).await?;
                }
                Wake::Block(block) if take_block => self.on_block(block).await?,
                Wake::Block(block) => self.hold_ahead(block),
                Wake::Gate(guard) => {
                    gate_wait = None;
                    self.writing = Some(guard);
                }
                Wake::Reader => {}
                Wake::Tick => self.on_tick().await?,
            }
        }
        if let Some(flight) = self.in_flight.take() {
            flight.await?;
        }
        info!(org = %self.me, next = %self.pipeline.next_block(), "node stopped");
        Ok(())
    }

    /// Milliseconds since the node started, the pipeline's clock.
    fn now_ms(&self) -> u64 {
        millis(self.started.elapsed())
    }

    /// Takes the gate from readers before the database changes outside a block in flight.
    async fn hold_gate(&mut self) {
        if self.writing.is_none() {
            self.writing = Some(self.gate.lock.clone().write_owned().await);
        }
    }

    /// Keeps what the stream delivered while the node looked ahead, and validates and analyses
    /// a block meanwhile (the port keeps what it found for the block's execution).
    fn hold_ahead(&mut self, block: Option<Result<TransactionBlock, OrdererError>>) {
        let Some(held) = self.blocks.as_mut() else {
            return;
        };
        if let Some(Ok(b)) = &block {
            self.port.prepare_ahead(b);
        }
        held.ahead = Some(block);
    }

    async fn on_block(
        &mut self,
        block: Option<Result<TransactionBlock, OrdererError>>,
    ) -> Result<(), NodeError> {
        let event = match block {
            Some(Ok(block)) => Event::Ordered(block),
            Some(Err(e)) => {
                warn!(org = %self.me, error = %e, "block stream failed; reconnecting");
                self.blocks = None;
                Event::StreamBroken
            }
            None => {
                warn!(org = %self.me, "the orderer ended the block stream; reconnecting");
                self.blocks = None;
                Event::StreamBroken
            }
        };
        self.feed(event).await
    }

    async fn on_executed(&mut self, flight: Flight) -> Result<(), NodeError> {
        match flight.result {
            Ok(PortExecuted {
                executed,
                checkpoint,
                integrity,
                repair_needed,
            }) => {
                for finding in integrity {
                    self.alarm(finding);
                }
                let number = flight.block.number;
                if let Checkpoint::Skipped { reason } = &checkpoint {
                    warn!(org = %self.me, block = %number, error = %reason, "checkpoint skipped");
                }
                let ledger = executed.ledger.clone();
                // A block executed on a state a recovery discards counts for nothing.
                if !self.pipeline.discards_flight() {
                    let invalid = executed.invalid.len() as u64;
                    self.metrics.observe_block(ledger.tx_ids.len());
                    self.executed_at.insert(number, Instant::now());
                    self.executed.insert(number, executed);
                    self.status.send_modify(|s| {
                        s.executed = Some(number);
                        s.invalid_transactions += invalid;
                    });
                }
                self.feed(Event::Executed {
                    ledger,
                    checkpointed: checkpoint == Checkpoint::Taken,
                    repair_needed,
                })
                .await
            }
            Err(e) => {
                if !self.pipeline.discards_flight() {
                    let attempts = self.pipeline.failed_attempts() + 1;
                    warn!(org = %self.me, block = %flight.block.number, error = %e, attempts,
                        "executing the block failed; retrying");
                    self.status.send_modify(|s| {
                        s.execution_errors += 1;
                        s.last_error = Some(format!("block {}: {e}", flight.block.number));
                    });
                }
                self.feed(Event::ExecutionFailed {
                    block: flight.block,
                    damage: e.damage(),
                })
                .await
            }
        }
    }

    async fn on_message(&mut self, message: PeerMessage) -> Result<(), NodeError> {
        match message {
            PeerMessage::Vote(vote) => self.feed(Event::Vote(vote)).await,
            PeerMessage::Certificate(cert) => self.feed(Event::Certificate(cert)).await,
            PeerMessage::CertificateRequest { from, block } => {
                if from != self.me
                    && let Some(cert) = self.certificate(block).await
                {
                    self.transport.send_certificate(from, &cert);
                }
                Ok(())
            }
        }
    }

    async fn on_tick(&mut self) -> Result<(), NodeError> {
        self.pipeline.set_peers(!self.peers.peers().is_empty());
        let dropped = self.inbox.dropped();
        self.status.send_if_modified(|s| {
            let changed = s.dropped_messages != dropped;
            s.dropped_messages = dropped;
            changed
        });
        self.feed(Event::Tick).await
    }

    /// Feeds an event to the pipeline and carries out its commands in order; a command's
    /// result is fed back at once, and what it asks for is done before the next command.
    async fn feed(&mut self, event: Event) -> Result<(), NodeError> {
        let mut todo = VecDeque::from(self.pipeline.handle(self.now_ms(), event));
        while let Some(command) = todo.pop_front() {
            if let Some(result) = self.carry_out(command).await? {
                let more = self.pipeline.handle(self.now_ms(), result);
                for command in more.into_iter().rev() {
                    todo.push_front(command);
                }
            }
        }
        let engine = self.pipeline.engine();
        let (next, state, votes) = (
            engine.next_block(),
            engine.state().clone(),
            engine.pending_votes(),
        );
        self.status.send_if_modified(|s| {
            let changed = s.next_block != next || s.state != state || s.pending_votes != votes;
            s.next_block = next;
            s.state = state;
            s.pending_votes = votes;
            changed
        });
        Ok(())
    }

    /// Carries out one command; returns the event that reports its result, if it has one.
    async fn carry_out(&mut self, command: Command) -> Result<Option<Event>, NodeError> {
        Ok(match command {
            Command::Commit(command) => {
                self.carry_out_commit(command).await?;
                None
            }
            Command::OpenStream(resume) => match Blocks::open(&*self.orderer, resume).await {
                Ok(stream) => {
                    self.blocks = Some(stream);
                    Some(Event::StreamOpened)
                }
                Err(e) => {
                    warn!(org = %self.me, error = %e, "cannot reach the orderer");
                    Some(Event::StreamFailed)
                }
            },
            Command::CloseStream => {
                self.blocks = None;
                None
            }
            Command::Execute {
                block,
                previous,
                checkpoint,
                state_check,
            } => {
                let port = self.port.clone();
                let span = info_span!("block", org = %self.me, block = %block.number);
                self.in_flight = Some(InFlight(tokio::spawn(
                    async move {
                        let job = BlockJob {
                            block: block.clone(),
                            previous,
                            checkpoint,
                            state_check,
                        };
                        let result = port.execute(job).await;
                        Flight { block, result }
                    }
                    .instrument(span),
                )));
                None
            }
            Command::Prune { agreed_before } => {
                self.prune_checkpoints(agreed_before).await;
                None
            }
            Command::ListCheckpoints { before } => Some(Event::Checkpoints(
                checkpoints_before(&self.store, before).await,
            )),
            Command::Restore { checkpoint, full } => {
                self.hold_gate().await;
                let restoring = Instant::now();
                let restored = self.restore(checkpoint, full).await;
                if let Some(clock) = self.recovery.as_mut() {
                    clock.restore += restoring.elapsed();
                }
                Some(match restored {
                    Ok(base) => Event::Restored { checkpoint, base },
                    Err(error) => Event::RestoreFailed { checkpoint, error },
                })
            }
            Command::Replay {
                from,
                through,
                previous,
                agreed_before,
            } => {
                self.hold_gate().await;
                let replaying = Instant::now();
                let span = info_span!("replay", from = %from.block, %through);
                let replayed = self
                    .replay(from, through, previous, agreed_before)
                    .instrument(span)
                    .await;
                if let Some(clock) = self.recovery.as_mut() {
                    clock.replay += replaying.elapsed();
                }
                Some(match replayed {
                    Ok(Replayed {
                        last,
                        stream,
                        repair_needed,
                    }) => {
                        self.blocks = Some(stream);
                        let ledger = last.ledger.clone();
                        self.executed.insert(ledger.number, last);
                        Event::Replayed {
                            last: ledger,
                            repair_needed,
                        }
                    }
                    Err(e) => Event::ReplayFailed(e),
                })
            }
            Command::TransferState => Some(
                match self.transfer().instrument(info_span!("transfer")).await {
                    Ok(block) => Event::Transferred(block),
                    Err(e) => Event::TransferFailed(RecoveryError::Transfer(e)),
                },
            ),
            Command::Notice(notice) => {
                self.notice(notice);
                None
            }
        })
    }

    async fn carry_out_commit(&mut self, command: commit::Command) -> Result<(), NodeError> {
        match command {
            commit::Command::SendVote(vote) => self.transport.send_vote(&vote),
            commit::Command::Append { block, certificate } => {
                self.append(block, certificate).await?
            }
            // Clients learn outcomes from the commit stream, fed by the append.
            commit::Command::Notify(_) => {}
            commit::Command::FetchCertificate(block) => self.transport.request_certificate(block),
            commit::Command::SendCertificate { to, block } => {
                if let Some(cert) = self.certificate(block).await {
                    self.transport.send_certificate(to, &cert);
                }
            }
            // The pipeline carries recoveries out itself.
            commit::Command::StartRecovery { .. } => {}
            commit::Command::RejectVote(rejection) => {
                warn!(org = %self.me, %rejection, "vote not counted");
                self.status.send_modify(|s| s.rejected_votes += 1);
            }
            commit::Command::RejectCertificate(problem) => {
                warn!(org = %self.me, %problem, "certificate not accepted");
                self.status.send_modify(|s| s.rejected_certificates += 1);
            }
            commit::Command::Alarm(alarm) => self.alarm(alarm),
        }
        Ok(())
    }

    /// Logs and counts what the pipeline reports.
    fn notice(&mut self, notice: Notice) {
        let me = self.me;
        match notice {
            Notice::UnexpectedBlock { got, expected } => {
                warn!(org = %me, %got, %expected, "the orderer delivered an unexpected block; reconnecting")
            }
            Notice::Recovering { block, attempt } => {
                info!(org = %me, %block, attempt, "recovering");
                if self.recovery.as_ref().is_none_or(|c| c.block != block) {
                    self.recovery = Some(RecoveryClock {
                        block,
                        since: Instant::now(),
                        restore: Duration::ZERO,
                        replay: Duration::ZERO,
                    });
                }
            }
            Notice::CheckpointsFailed { block, reason } => {
                warn!(org = %me, %block, %reason, "recovering from a checkpoint failed")
            }
            Notice::TransferRetry { block, reason } => {
                warn!(org = %me, %block, error = %reason, "no state transfer recovers the block yet; trying again")
            }
            Notice::RecoveryEnded(summary) => {
                let clock = self.recovery.take();
                let report = RecoveryReport {
                    block: summary.block,
                    checkpoint: summary.checkpoint,
                    attempts: summary.attempts,
                    replayed: summary.replayed,
                    restore: clock.as_ref().map_or(Duration::ZERO, |c| c.restore),
                    replay: clock.as_ref().map_or(Duration::ZERO, |c| c.replay),
                    elapsed: clock.map_or(Duration::ZERO, |c| c.since.elapsed()),
                };
                info!(org = %me, ?report, "recovered and agreed");
                self.status.send_modify(|s| {
                    s.recoveries.push(report);
                    s.recoveries_total += 1;
                    trim(&mut s.recoveries);
                });
            }
            Notice::Repairing { agreed } => {
                info!(org = %me, %agreed, "repairing tables that differ from the agreed state");
                self.repair_started = Some(Instant::now());
            }
            Notice::NoCheckpointRepairs { reason } => {
                warn!(org = %me, problem = %reason, "no checkpoint repairs the tables; transferring the state from another organization")
            }
            Notice::Repaired(how) => {
                let elapsed = self.repair_started.take().map(|t| t.elapsed());
                match how {
                    Repaired::Checkpoint(checkpoint) => {
                        info!(org = %me, %checkpoint, ?elapsed, "tables repaired")
                    }
                    Repaired::Transfer(block) => {
                        info!(org = %me, %block, ?elapsed, "tables repaired by a state transfer")
                    }
                }
                self.status.send_modify(|s| s.repairs_total += 1);
            }
            Notice::Joined(block) => {
                info!(org = %me, %block, "joined from another organization's state")
            }
            Notice::NoJoin(reason) => {
                info!(org = %me, %reason, "no fast join; replaying from block 1")
            }
        }
    }

    /// Keeps the configured number of agreed checkpoints (and every newer one: their blocks
    /// are not agreed yet).
    async fn prune_checkpoints(&mut self, next: BlockNumber) {
        let result = async {
            let all = self.store.checkpoints().await?;
            let unagreed = all.iter().filter(|c| **c >= next).count();
            // A checkpoint another organization is transferring stays.
            let pinned = self
                .state_server
                .pinned()
                .map_or(0, |p| all.iter().filter(|c| **c >= p).count());
            self.port
                .prune_checkpoints((self.settings.checkpoints_kept + unagreed).max(pinned))
                .await
        }
        .await;
        if let Err(e) = result {
            warn!(org = %self.me, error = %e, "pruning checkpoints failed");
        }
    }

    /// Raises an operator alarm: log, status and the alarm counter.
    fn alarm(&self, alarm: String) {
        error!(org = %self.me, %alarm, "alarm");
        self.status.send_modify(|s| {
            s.alarms.push(alarm);
            s.alarms_total += 1;
            trim(&mut s.alarms);
        });
    }

    /// Appends an agreed block, retrying while the database is unreachable: nothing can go on
    /// before it is in the ledger.
    async fn append(
        &mut self,
        block: LedgerBlock,
        certificate: Certificate,
    ) -> Result<(), NodeError> {
        let entry = LedgerEntry {
            block: block.clone(),
            certificate: certificate.clone(),
        };
        let appending = Instant::now();
        let mut delay = Duration::from_millis(100);
        loop {
            match ledger::append(&self.store, &entry).await {
                Ok(()) => break,
                // Unreachable, or busy (SQLite's single writer is executing the next block).
                Err(e) if e.is_transient() => {
                    warn!(org = %self.me, block = %block.number, error = %e, "appending to the ledger failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let number = block.number;
        self.metrics.observe(Phase::Append, appending.elapsed());
        if let Some(at) = self.executed_at.remove(&number) {
            self.metrics.observe(Phase::Vote, at.elapsed());
        }
        self.executed_at.retain(|b, _| *b > number);
        self.certificates.insert(number, certificate.clone());
        while self.certificates.len() > KEEP_CERTIFICATES {
            self.certificates.pop_first();
        }
        let reasons = self
            .executed
            .remove(&number)
            .map(|e| {
                let mut reasons = e.invalid;
                reasons.extend(e.outcome.failures.into_iter().map(|f| (f.index, f.reason)));
                reasons.sort();
                reasons
            })
            .unwrap_or_default();
        self.executed.retain(|b, _| *b > number);
        // Nobody listening is fine.
        let _ = self.commits.send(Arc::new(Committed {
            block,
            certificate,
            reasons,
        }));
        Ok(())
    }

    /// The certificate of an appended block.
    async fn certificate(&mut self, block: BlockNumber) -> Option<Certificate> {
        if let Some(cert) = self.certificates.get(&block) {
            return Some(cert.clone());
        }
        if block >= self.pipeline.next_block() {
            return None;
        }
        match ledger::entry(&self.store, block).await {
            Ok(entry) => Some(entry.certificate),
            Err(e) => {
                warn!(org = %self.me, %block, error = %e, "cannot read a certificate");
                None
            }
        }
    }

    /// Restores `checkpoint` (every row, verified against its agreed state digest, when
    /// `full`), retrying while the execution component is unreachable; returns its agreed
    /// LedgerBlock.
    async fn restore(
        &mut self,
        checkpoint: BlockNumber,
        full: bool,
    ) -> Result<LedgerBlock, RecoveryError> {
        let base = ledger::block(&self.store, checkpoint).await?;
        let agreed_state = full.then_some(base.state_digest);
        let port = self.port.clone();
        patiently(self.settings.replay_timeout, || {
            port.restore(checkpoint, agreed_state)
        })
        .await?;
        Ok(base)
    }

    /// Adopts the agreed state of another organization's newest verified checkpoint (see
    /// [`crate::transfer`]), trying every peer, newest offer first; returns the adopted block.
    async fn transfer(&mut self) -> Result<LedgerBlock, TransferError> {
        self.hold_gate().await;
        let started = Instant::now();
        let mut problems = Vec::new();
        let mut offers = Vec::new();
        // Every peer at once, each within its time: a peer that stalls delays nobody.
        let asked =
            futures_util::future::join_all(self.peers.peers().into_iter().map(|peer| async {
                let answer = tokio::time::timeout(OFFER_TIMEOUT, peer.offer())
                    .await
                    .unwrap_or(Err(PeerError::OfferTimeout(OFFER_TIMEOUT)));
                (peer, answer)
            }))
            .await;
        for (peer, answer) in asked {
            match answer {
                Ok(Some(offer)) => match check_offer(&offer, &self.store, &self.ctx) {
                    Ok(()) => offers.push((peer, offer)),
                    Err(e) => problems.push((peer.org(), e)),
                },
                Ok(None) => problems.push((peer.org(), PeerError::NoOffer)),
                Err(e) => problems.push((peer.org(), e)),
            }
        }
        // Newest first, but a peer whose transfer failed lately goes last: any organization can
        // offer the newest block and then serve nothing useful.
        self.failed_peers
            .retain(|_, at| at.elapsed() < FAILED_PEER_PENALTY);
        offers.sort_by_key(|(p, o)| {
            (
                self.failed_peers.contains_key(&p.org()),
                std::cmp::Reverse(o.entry.block.number),
            )
        });
        for (peer, offer) in offers {
            let result = async {
                // Nothing else may change the database from here to the adoption.
                let port = self.port.clone();
                patiently(self.settings.replay_timeout, || port.settle()).await?;
                // A peer that stalls must not hold the recovery: the next one is tried.
                let fetched = tokio::time::timeout(
                    self.settings.peer_transfer_timeout,
                    fetch(&self.store, &self.ctx, peer.as_ref(), &offer),
                )
                .await
                .map_err(|_| PeerError::TransferTimeout(self.settings.peer_transfer_timeout))??;
                self.store.adopt(&fetched.adoption).await?;
                Ok::<_, PeerError>(fetched)
            }
            .await;
            match result {
                Ok(fetched) => {
                    let block = fetched.block.clone();
                    let report = TransferReport {
                        from: peer.org(),
                        block: block.number,
                        ledger_entries: fetched.entries.len() as u64,
                        ranges: fetched.ranges as u64,
                        rows: fetched.rows as u64,
                        elapsed: started.elapsed(),
                    };
                    info!(org = %self.me, ?report, "state transferred");
                    self.adopted(&block, fetched.entries, report);
                    return Ok(block);
                }
                Err(e) => {
                    warn!(org = %self.me, peer = %peer.org(), error = %e, "state transfer failed");
                    if e.is_peers_fault() {
                        self.failed_peers.insert(peer.org(), Instant::now());
                    }
                    problems.push((peer.org(), e));
                }
            }
        }
        Err(if problems.is_empty() {
            TransferError::NoPeers
        } else {
            TransferError::Failed(problems)
        })
    }

    /// After adopting `block`'s state: what was executed is void; the ledger entries it
    /// brought reach the commit stream. (The pipeline goes on from the block.)
    fn adopted(&mut self, block: &LedgerBlock, entries: Vec<LedgerEntry>, report: TransferReport) {
        self.blocks = None;
        self.executed.clear();
        self.executed_at.clear();
        self.status.send_modify(|s| {
            s.executed = Some(block.number);
            s.state_transfers_total += 1;
            s.last_transfer = Some(report);
        });
        for e in entries {
            self.certificates
                .insert(e.block.number, e.certificate.clone());
            let _ = self.commits.send(Arc::new(Committed {
                block: e.block,
                certificate: e.certificate,
                reasons: Vec::new(),
            }));
        }
        while self.certificates.len() > KEEP_CERTIFICATES {
            self.certificates.pop_first();
        }
    }

    /// Executes the blocks `from` through `through` again, the first chained to `previous`,
    /// checking each block before `agreed_before` against the ledger. Integrity findings that
    /// come back meanwhile raise alarms.
    async fn replay(
        &mut self,
        from: Resume,
        through: BlockNumber,
        previous: Digest,
        agreed_before: BlockNumber,
    ) -> Result<Replayed, RecoveryError> {
        let mut stream = Blocks::open(&*self.orderer, from).await?;
        let mut previous = previous;
        let mut last = None;
        let mut repair_needed = false;
        for n in from.block.0..=through.0 {
            let number = BlockNumber(n);
            let block = tokio::time::timeout(self.settings.replay_timeout, stream.stream.next())
                .await
                .map_err(|_| RecoveryError::NotDelivered(number))?
                .ok_or(RecoveryError::StreamEnded(number))??;
            if block.number != number {
                return Err(RecoveryError::OutOfOrder {
                    got: block.number,
                    expected: number,
                });
            }
            let port = self.port.clone();
            let done = patiently(self.settings.replay_timeout, || {
                port.execute(BlockJob {
                    block: block.clone(),
                    previous,
                    checkpoint: false,
                    state_check: false,
                })
            })
            .await?;
            for finding in done.integrity {
                self.alarm(finding);
            }
            repair_needed |= done.repair_needed;
            let done = done.executed;
            previous = done.ledger.hash();
            if number < agreed_before {
                let agreed = ledger::block(&self.store, number).await?;
                if agreed.hash() != previous {
                    return Err(RecoveryError::Diverged {
                        block: number,
                        got: previous,
                        agreed: agreed.hash(),
                    });
                }
            }
            self.status.send_modify(|s| s.executed = Some(number));
            last = Some(done);
        }
        Ok(Replayed {
            last: last.ok_or(RecoveryError::NothingToReplay)?,
            stream,
            repair_needed,
        })
    }

    /// After a crash during a recovery the database may be behind its own ledger: replay the
    /// agreed blocks it misses, checked against the ledger.
    async fn catch_up(&mut self, last: BlockNumber) -> Result<(), NodeError> {
        let applied = self.store.last_applied_block().await?;
        if applied.is_some_and(|a| a >= last) {
            return Ok(());
        }
        let (from, previous) = match applied {
            None => (Resume::START, Digest::ZERO),
            Some(a) => {
                let base = ledger::block(&self.store, a).await?;
                (
                    Resume {
                        block: BlockNumber(a.0 + 1),
                        position: base.orderer_position,
                    },
                    base.hash(),
                )
            }
        };
        info!(org = %self.me, from = %from.block, through = %last, "the database is behind the ledger; replaying");
        // The pipeline opens its own stream from the ledger's end, and scans the tables with
        // its first block.
        let _replayed = self
            .replay(from, last, previous, BlockNumber(last.0 + 1))
            .await
            .map_err(|source| NodeError::CatchUp {
                through: last,
                source,
            })?;
        Ok(())
    }
}

impl<B: Backend, O: Orderer> std::fmt::Debug for Node<B, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let engine = self.pipeline.engine();
        f.debug_struct("Node")
            .field("org", &self.me)
            .field("next_block", &engine.next_block())
            .field("state", engine.state())
            .finish_non_exhaustive()
    }
}

/// A duration in whole milliseconds (saturating).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs a port call during a recovery, retrying while the execution process cannot be reached
/// (it may be restarting) or could not analyse a block's transactions, for at most `budget`.
async fn patiently<'a, T>(
    budget: Duration,
    mut call: impl FnMut() -> crate::port::PortFuture<'a, T>,
) -> Result<T, ExecutionError> {
    let deadline = Instant::now() + budget;
    let mut delay = Duration::from_millis(100);
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e @ (ExecutionError::Remote(_) | ExecutionError::Unavailable { .. }))
                if Instant::now() + delay < deadline =>
            {
                warn!(error = %e, "the execution component is unreachable or short of resources during a recovery; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The checkpoints before `block`, newest first.
async fn checkpoints_before<B: Backend>(
    store: &Store<B>,
    block: BlockNumber,
) -> Result<Vec<BlockNumber>, RecoveryError> {
    Ok(store
        .checkpoints()
        .await?
        .into_iter()
        .filter(|c| *c < block)
        .rev()
        .collect())
}

/// Keeps the newest reports.
fn trim<T>(list: &mut Vec<T>) {
    if list.len() > KEEP_REPORTS {
        list.drain(..list.len() - KEEP_REPORTS);
    }
}

/// Where an organization's node resumes: the block after the last one in its ledger, at that
/// block's orderer position, chained to its hash ([`Resume::START`] and the zero hash for an
/// empty ledger). Its orderer client is set up from the same point.
pub async fn resume_point<B: Backend>(store: &Store<B>) -> Result<(Resume, Digest), NodeError> {
    match store.ledger_tail().await? {
        None => Ok((Resume::START, Digest::ZERO)),
        Some((last, hash)) => {
            let block = ledger::block(store, last).await?;
            Ok((
                Resume {
                    block: BlockNumber(last.0 + 1),
                    position: block.orderer_position,
                },
                hash,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn recovery_waits_for_an_unreachable_execution_component_within_its_budget() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let calls = AtomicU32::new(0);
        let flaky = || -> crate::port::PortFuture<'_, u32> {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if n < 3 {
                    Err(ExecutionError::Remote("connection refused".into()))
                } else {
                    Ok(n)
                }
            })
        };
        assert_eq!(
            patiently(Duration::from_secs(30), flaky).await.ok(),
            Some(3)
        );

        let down = || -> crate::port::PortFuture<'_, ()> {
            Box::pin(async { Err(ExecutionError::Remote("connection refused".into())) })
        };
        let e = patiently(Duration::from_secs(2), down).await.unwrap_err();
        assert!(e.to_string().contains("connection refused"), "{e}");

        // Anything but an unreachable component fails at once.
        let tries = AtomicU32::new(0);
        let broken = || -> crate::port::PortFuture<'_, ()> {
            tries.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                Err(ExecutionError::WrongNetwork {
                    block: BlockNumber(1),
                    network: "other".into(),
                })
            })
        };
        assert!(patiently(Duration::from_secs(30), broken).await.is_err());
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }
}
