//! The runtime of one organization (DESIGN §2.3–2.5): blocks from the orderer go through the
//! [`ExecutionServer`]; the sans-IO [`CommitEngine`] decides; this loop carries out its commands
//! (send votes, append to the ledger in the organization's database, serve certificates,
//! restore and replay) and publishes status and commit events.
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
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chainify_commit::{Command, CommitEngine, Event, State, Timing};
use chainify_core::config::NetworkConfig;
use chainify_core::crypto::SigningKey;
use chainify_core::tx::LedgerEntry;
use chainify_core::tx::{Certificate, LedgerBlock, TransactionBlock};
use chainify_core::votes::VoteContext;
use chainify_core::{BlockNumber, Digest, OrgId};
use chainify_orderer::{BlockStream, Orderer, OrdererError, Resume};
use chainify_storage::{Backend, ExecMode, StorageError, Store};
use futures_util::StreamExt;
use tokio::sync::{OwnedRwLockWriteGuard, broadcast, mpsc, watch};
use tracing::{error, info, warn};

use crate::execution::{Executed, ExecutionError, ExecutionServer};
use crate::gate::{Gate, ReadGate};
use crate::ledger;
use crate::metrics::{Metrics, Phase};
use crate::port::{ExecutionPort, LocalExecution, PortExecuted};
use crate::transfer::{NoPeers, OFFER_TIMEOUT, StatePeers, StateServer, check_offer, fetch};

/// A peer whose state transfer failed is tried after the others for this long.
const FAILED_PEER_PENALTY: Duration = Duration::from_secs(600);
use crate::transport::{Inbox, PeerMessage, Transport};

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
    /// the first block after start and every block whose number is a multiple of this.
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
        }
    }
}

/// Why a node could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The organization's database failed in a way retrying does not fix.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The ExecutionServer could not be built.
    #[error(transparent)]
    Execution(#[from] ExecutionError),
    /// The ledger in the database cannot be read or does not match the database.
    #[error("ledger block {block}: {problem}")]
    Ledger {
        /// The block.
        block: BlockNumber,
        /// What is wrong.
        problem: String,
    },
    /// A setting is out of range.
    #[error("node settings: {0}")]
    Settings(String),
    /// A bug: a task of the node panicked.
    #[error("internal error: {0}")]
    Internal(String),
}

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
            .map(|r| r.map_err(|e| NodeError::Internal(format!("executing a block: {e}"))))
    }
}

const KEEP_REPORTS: usize = 64;
const KEEP_CERTIFICATES: usize = 256;

/// One organization's ExecutionServer and CommitServer.
pub struct Node<B: Backend, O: Orderer> {
    me: OrgId,
    store: Arc<Store<B>>,
    orderer: Arc<O>,
    transport: Arc<dyn Transport>,
    settings: NodeSettings,
    engine: CommitEngine,
    /// Where blocks execute (this process, or the organization's execution process).
    port: Arc<dyn ExecutionPort>,
    /// The hash the next executed LedgerBlock chains to.
    previous: Digest,
    inbox: Inbox,
    inbox_rx: mpsc::Receiver<PeerMessage>,
    status: watch::Sender<NodeStatus>,
    commits: broadcast::Sender<Arc<Committed>>,
    /// The block stream, and where it continues if it must be reopened.
    blocks: Option<BlockStream>,
    resume: Resume,
    reconnect_at: Option<Instant>,
    in_flight: Option<InFlight>,
    /// A block whose execution failed, and when to try again.
    retry: Option<(TransactionBlock, Instant)>,
    /// Failed attempts at the current block, for the backoff.
    failed_attempts: u32,
    /// Executed blocks not yet appended.
    executed: BTreeMap<BlockNumber, Executed>,
    certificates: BTreeMap<BlockNumber, Certificate>,
    /// The recovery under way: block, start, checkpoint used, attempts.
    recovering: Option<(Instant, RecoveryReport)>,
    started: Instant,
    /// Keeps readers out while the database holds more than the agreed blocks.
    gate: Gate,
    metrics: Arc<Metrics>,
    /// When each block not yet appended finished executing (for the vote phase).
    executed_at: BTreeMap<BlockNumber, Instant>,
    writing: Option<OwnedRwLockWriteGuard<()>>,
    /// Whether a full scan was asked for since start.
    state_checked: bool,
    /// A full scan found the tables differ from the agreed state: repair at a clean point.
    repair_pending: bool,
    /// Where states are transferred from, and what this node serves to others.
    peers: Arc<dyn StatePeers>,
    state_server: Arc<StateServer<B>>,
    ctx: VoteContext,
    /// A fast join is still to be tried (an empty ledger at start).
    join_pending: bool,
    /// Peers whose state transfer failed, and when.
    failed_peers: BTreeMap<OrgId, Instant>,
}

type GateWait = Pin<Box<dyn Future<Output = OwnedRwLockWriteGuard<()>> + Send>>;

impl<B: Backend, O: Orderer + 'static> Node<B, O> {
    /// Prepares organization `me` over its opened store (shared tables registered), executing
    /// in this process: reads where its ledger ends and brings its database back to the ledger
    /// if a recovery was cut short.
    pub async fn start(
        store: Arc<Store<B>>,
        network: Arc<NetworkConfig>,
        me: OrgId,
        key: Arc<SigningKey>,
        orderer: Arc<O>,
        transport: Arc<dyn Transport>,
        settings: NodeSettings,
    ) -> Result<Self, NodeError> {
        // The node passes the hash to chain to with every block.
        let exec =
            ExecutionServer::new(store.clone(), network.clone(), settings.mode, Digest::ZERO)?;
        let metrics = Arc::new(Metrics::default());
        let port = Arc::new(LocalExecution::new(store.clone(), exec, metrics.clone()));
        Self::start_with(
            store, network, me, key, orderer, transport, port, metrics, settings,
        )
        .await
    }

    /// [`Node::start`] with blocks executed through `port` (the organization's execution
    /// process). `store` is the same database: the node reads and appends the ledger there.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_with(
        store: Arc<Store<B>>,
        network: Arc<NetworkConfig>,
        me: OrgId,
        key: Arc<SigningKey>,
        orderer: Arc<O>,
        transport: Arc<dyn Transport>,
        port: Arc<dyn ExecutionPort>,
        metrics: Arc<Metrics>,
        settings: NodeSettings,
    ) -> Result<Self, NodeError> {
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
            engine,
            port,
            previous,
            inbox,
            inbox_rx,
            status,
            commits,
            blocks: None,
            resume,
            reconnect_at: Some(Instant::now()),
            in_flight: None,
            retry: None,
            failed_attempts: 0,
            executed: BTreeMap::new(),
            certificates: BTreeMap::new(),
            recovering: None,
            started: Instant::now(),
            gate,
            writing,
            metrics,
            executed_at: BTreeMap::new(),
            state_checked: false,
            repair_pending: false,
            peers: Arc::new(NoPeers),
            state_server,
            ctx,
            join_pending: next == Resume::START.block,
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

    /// Appended blocks as they are appended.
    pub fn commits(&self) -> broadcast::Receiver<Arc<Committed>> {
        self.commits.subscribe()
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
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), NodeError> {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(self.settings.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut gate_wait: Option<GateWait> = None;
        loop {
            // Hand the database to waiting readers at the first clean point.
            if self.writing.is_some() && self.is_clean() && self.gate.readers_waiting() {
                self.writing = None;
            }
            let flying = self.in_flight.is_some();
            let wants_block = self.can_execute() && self.blocks.is_some();
            let take_block = wants_block && self.writing.is_some() && !self.gate.readers_waiting();
            if wants_block && self.writing.is_none() && gate_wait.is_none() {
                gate_wait = Some(Box::pin(self.gate.lock.clone().write_owned()));
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
                    Some(s) => Some(s.next().await),
                    None => None,
                } }, if take_block => Wake::Block(block),
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
                Wake::Block(block) => self.on_block(block),
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
        info!(org = %self.me, next = %self.engine.next_block(), "node stopped");
        Ok(())
    }

    /// The database holds exactly the agreed blocks: nothing executing, executed but not
    /// appended, failed half-way or being recovered.
    fn is_clean(&self) -> bool {
        self.in_flight.is_none()
            && self.executed.is_empty()
            && self.retry.is_none()
            && self.recovering.is_none()
    }

    /// Takes the gate from readers before the database changes outside a block in flight.
    async fn hold_gate(&mut self) {
        if self.writing.is_none() {
            self.writing = Some(self.gate.lock.clone().write_owned().await);
        }
    }

    fn can_execute(&self) -> bool {
        self.in_flight.is_none()
            && !self.repair_pending
            && !self.join_pending
            && self.retry.is_none()
            && matches!(self.engine.state(), State::Running)
            && self.resume.block.0 <= self.engine.next_block().0 + self.settings.pipeline_depth
    }

    fn checkpoint_due(&self, block: BlockNumber) -> bool {
        block == Resume::START.block || block.0.is_multiple_of(self.settings.checkpoint_interval)
    }

    fn launch(&mut self, block: TransactionBlock) {
        let port = self.port.clone();
        let previous = self.previous;
        let checkpoint = self.checkpoint_due(block.number);
        let state_check = !self.state_checked
            || block
                .number
                .0
                .is_multiple_of(self.settings.state_check_interval);
        self.state_checked = true;
        self.in_flight = Some(InFlight(tokio::spawn(async move {
            let result = port
                .execute(block.clone(), previous, checkpoint, state_check)
                .await;
            Flight { block, result }
        })));
    }

    fn on_block(&mut self, block: Option<Result<TransactionBlock, OrdererError>>) {
        match block {
            Some(Ok(block)) if block.number == self.resume.block => self.launch(block),
            Some(Ok(block)) => {
                warn!(org = %self.me, got = %block.number, expected = %self.resume.block,
                    "the orderer delivered an unexpected block; reconnecting");
                self.reopen_stream();
            }
            Some(Err(e)) => {
                warn!(org = %self.me, error = %e, "block stream failed; reconnecting");
                self.reopen_stream();
            }
            None => {
                warn!(org = %self.me, "the orderer ended the block stream; reconnecting");
                self.reopen_stream();
            }
        }
    }

    fn reopen_stream(&mut self) {
        self.blocks = None;
        self.reconnect_at = Some(Instant::now() + Duration::from_millis(200));
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
                // Stop launching blocks; the repair runs at the next clean point.
                self.repair_pending |= repair_needed;
                self.failed_attempts = 0;
                self.previous = executed.ledger.hash();
                self.resume = Resume::after(&flight.block);
                let number = flight.block.number;
                let invalid = executed.invalid.len() as u64;
                match checkpoint {
                    Some(Ok(())) => self.prune_checkpoints().await,
                    Some(Err(e)) => {
                        warn!(org = %self.me, block = %number, error = %e, "checkpoint skipped")
                    }
                    None => {}
                }
                let ledger = executed.ledger.clone();
                self.metrics.observe_block(ledger.tx_ids.len());
                self.executed_at.insert(number, Instant::now());
                self.executed.insert(number, executed);
                self.status.send_modify(|s| {
                    s.executed = Some(number);
                    s.invalid_transactions += invalid;
                });
                self.handle(Event::Executed(ledger)).await
            }
            Err(e) => {
                self.failed_attempts += 1;
                let attempts = self.failed_attempts;
                let delay = Duration::from_millis(100 << attempts.min(6));
                warn!(org = %self.me, block = %flight.block.number, error = %e, attempts,
                    "executing the block failed; retrying");
                self.status.send_modify(|s| {
                    s.execution_errors += 1;
                    s.last_error = Some(format!("block {}: {e}", flight.block.number));
                });
                self.retry = Some((flight.block, Instant::now() + delay));
                Ok(())
            }
        }
    }

    /// Keeps the configured number of agreed checkpoints (and every newer one: their blocks
    /// are not agreed yet).
    async fn prune_checkpoints(&mut self) {
        let next = self.engine.next_block();
        let result = async {
            let all = self.store.checkpoints().await.map_err(|e| e.to_string())?;
            let unagreed = all.iter().filter(|c| **c >= next).count();
            // A checkpoint another organization is transferring stays.
            let pinned = self
                .state_server
                .pinned()
                .map_or(0, |p| all.iter().filter(|c| **c >= p).count());
            self.port
                .prune_checkpoints((self.settings.checkpoints_kept + unagreed).max(pinned))
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        if let Err(e) = result {
            warn!(org = %self.me, error = %e, "pruning checkpoints failed");
        }
    }

    async fn on_message(&mut self, message: PeerMessage) -> Result<(), NodeError> {
        match message {
            PeerMessage::Vote(vote) => self.handle(Event::Vote(vote)).await,
            PeerMessage::Certificate(cert) => self.handle(Event::Certificate(cert)).await,
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
        if self.join_pending && self.is_clean() {
            self.join_pending = false;
            self.fast_join().await?;
        }
        if self.repair_pending && self.is_clean() && matches!(self.engine.state(), State::Running) {
            self.repair().await?;
        }
        let now = Instant::now();
        if self.blocks.is_none() && self.reconnect_at.is_some_and(|t| t <= now) {
            match self.orderer.deliver(self.resume).await {
                Ok(stream) => {
                    self.blocks = Some(stream);
                    self.reconnect_at = None;
                }
                Err(e) => {
                    warn!(org = %self.me, error = %e, "cannot reach the orderer");
                    self.reconnect_at = Some(now + Duration::from_secs(1));
                }
            }
        }
        if self.in_flight.is_none()
            && matches!(&self.retry, Some((_, at)) if *at <= now)
            && let Some((block, _)) = self.retry.take()
        {
            self.launch(block);
        }
        let dropped = self.inbox.dropped();
        self.status.send_if_modified(|s| {
            let changed = s.dropped_messages != dropped;
            s.dropped_messages = dropped;
            changed
        });
        let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.handle(Event::Tick { now_ms }).await
    }

    /// Feeds an event to the engine and carries out its commands, including the events that
    /// commands produce (a recovery's result).
    async fn handle(&mut self, event: Event) -> Result<(), NodeError> {
        let mut events = VecDeque::from([event]);
        while let Some(event) = events.pop_front() {
            for command in self.engine.handle(event) {
                match command {
                    Command::SendVote(vote) => self.transport.send_vote(&vote),
                    Command::Append { block, certificate } => {
                        self.append(block, certificate).await?
                    }
                    // Clients learn outcomes from the commit stream, fed by the append.
                    Command::Notify(_) => {}
                    Command::FetchCertificate(block) => self.transport.request_certificate(block),
                    Command::SendCertificate { to, block } => {
                        if let Some(cert) = self.certificate(block).await {
                            self.transport.send_certificate(to, &cert);
                        }
                    }
                    Command::StartRecovery { block, attempt } => {
                        events.push_back(self.recover(block, attempt).await);
                    }
                    Command::RejectVote(rejection) => {
                        warn!(org = %self.me, %rejection, "vote not counted");
                        self.status.send_modify(|s| s.rejected_votes += 1);
                    }
                    Command::RejectCertificate(problem) => {
                        warn!(org = %self.me, %problem, "certificate not accepted");
                        self.status.send_modify(|s| s.rejected_certificates += 1);
                    }
                    Command::Alarm(alarm) => self.alarm(alarm),
                }
            }
        }
        let (next, state) = (self.engine.next_block(), self.engine.state().clone());
        let votes = self.engine.pending_votes();
        self.status.send_if_modified(|s| {
            let changed = s.next_block != next || s.state != state || s.pending_votes != votes;
            s.next_block = next;
            s.state = state;
            s.pending_votes = votes;
            changed
        });
        Ok(())
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
        if let Some((since, report)) = &self.recovering
            && report.block == number
        {
            let report = RecoveryReport {
                elapsed: since.elapsed(),
                ..report.clone()
            };
            self.recovering = None;
            info!(org = %self.me, ?report, "recovered and agreed");
            self.status.send_modify(|s| {
                s.recoveries.push(report);
                s.recoveries_total += 1;
                trim(&mut s.recoveries);
            });
        }
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
        if block >= self.engine.next_block() {
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

    /// Repairs tables that a full scan found different from the agreed state (a change that
    /// bypassed the triggers): at a clean point, restores the newest checkpoint whose snapshots
    /// hold its agreed state digest, comparing every row, and replays the agreed blocks since.
    /// Without such a checkpoint it raises an alarm.
    async fn repair(&mut self) -> Result<(), NodeError> {
        self.repair_pending = false;
        self.hold_gate().await;
        let started = Instant::now();
        let agreed = BlockNumber(self.engine.next_block().0.saturating_sub(1));
        info!(org = %self.me, %agreed, "repairing tables that differ from the agreed state");
        let result = async {
            let candidates = checkpoints_before(&self.store, BlockNumber(agreed.0 + 1)).await?;
            let mut tried = Vec::new();
            for checkpoint in candidates {
                let base = ledger::block(&self.store, checkpoint)
                    .await
                    .map_err(|e| e.to_string())?;
                let port = self.port.clone();
                let agreed_state = base.state_digest;
                if let Err(e) = patiently(self.settings.replay_timeout, || {
                    port.restore(checkpoint, Some(agreed_state))
                })
                .await
                {
                    tried.push(format!("checkpoint {checkpoint}: {e}"));
                    continue;
                }
                self.previous = base.hash();
                let resume = Resume {
                    block: BlockNumber(checkpoint.0 + 1),
                    position: base.orderer_position,
                };
                if checkpoint < agreed {
                    self.replay(resume, agreed).await?;
                } else {
                    self.resume = resume;
                    self.reopen_stream();
                }
                return Ok(checkpoint);
            }
            Err(if tried.is_empty() {
                format!("no checkpoint at or before block {agreed}")
            } else {
                tried.join("; ")
            })
        }
        .await;
        match result {
            Ok(checkpoint) => {
                info!(org = %self.me, %checkpoint, elapsed = ?started.elapsed(), "tables repaired");
                self.status.send_modify(|s| s.repairs_total += 1);
            }
            Err(local) => {
                warn!(org = %self.me, problem = %local, "no checkpoint repairs the tables; transferring the state from another organization");
                let transferred = async {
                    let adopted = self.transfer().await?;
                    if adopted.number < agreed {
                        let resume = Resume {
                            block: BlockNumber(adopted.number.0 + 1),
                            position: adopted.orderer_position,
                        };
                        self.replay(resume, agreed).await?;
                    }
                    Ok::<_, String>(adopted)
                }
                .await;
                match transferred {
                    Ok(adopted) => {
                        info!(org = %self.me, block = %adopted.number, elapsed = ?started.elapsed(), "tables repaired by a state transfer");
                        self.status.send_modify(|s| s.repairs_total += 1);
                        if adopted.number >= self.engine.next_block() {
                            self.handle(Event::Transferred(adopted)).await?;
                        }
                    }
                    Err(e) => self.alarm(format!(
                        "the tables differ from the agreed state; no checkpoint repairs them ({local}) and no state transfer did ({e})"
                    )),
                }
            }
        }
        Ok(())
    }

    /// Starts an empty ledger from another organization's newest verified checkpoint instead of
    /// replaying every block from the first. Without an offer (a new network, no peer up) the
    /// node follows the orderer from block 1.
    async fn fast_join(&mut self) -> Result<(), NodeError> {
        if !self.settings.fast_join || self.peers.peers().is_empty() {
            return Ok(());
        }
        match self.transfer().await {
            Ok(adopted) => {
                info!(org = %self.me, block = %adopted.number, "joined from another organization's state");
                self.handle(Event::Transferred(adopted)).await
            }
            Err(e) => {
                info!(org = %self.me, reason = %e, "no fast join; replaying from block 1");
                Ok(())
            }
        }
    }

    /// Adopts the agreed state of another organization's newest verified checkpoint (see
    /// [`crate::transfer`]), trying every peer, newest offer first. Afterwards the node goes on
    /// from the adopted block; returns it.
    async fn transfer(&mut self) -> Result<LedgerBlock, String> {
        self.hold_gate().await;
        let started = Instant::now();
        let mut problems = Vec::new();
        let mut offers = Vec::new();
        // Every peer at once, each within its time: a peer that stalls delays nobody.
        let asked =
            futures_util::future::join_all(self.peers.peers().into_iter().map(|peer| async {
                let answer = tokio::time::timeout(OFFER_TIMEOUT, peer.offer())
                    .await
                    .unwrap_or_else(|_| Err(format!("no offer within {OFFER_TIMEOUT:?}")));
                (peer, answer)
            }))
            .await;
        for (peer, answer) in asked {
            match answer {
                Ok(Some(offer)) => match check_offer(&offer, &self.store, &self.ctx) {
                    Ok(()) => offers.push((peer, offer)),
                    Err(e) => problems.push(format!("{}: {e}", peer.org())),
                },
                Ok(None) => problems.push(format!("{}: no checkpoint to offer", peer.org())),
                Err(e) => problems.push(format!("{}: {e}", peer.org())),
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
                .map_err(|_| {
                    format!(
                        "it did not complete the transfer within {:?}",
                        self.settings.peer_transfer_timeout
                    )
                })??;
                self.store
                    .adopt(&fetched.adoption)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(fetched)
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
                    self.failed_peers.insert(peer.org(), Instant::now());
                    problems.push(format!("{}: {e}", peer.org()));
                }
            }
        }
        Err(if problems.is_empty() {
            "no other organization is reachable".to_owned()
        } else {
            problems.join("; ")
        })
    }

    /// After adopting `block`'s state: the node goes on from it; the ledger entries it brought
    /// reach the commit stream.
    fn adopted(&mut self, block: &LedgerBlock, entries: Vec<LedgerEntry>, report: TransferReport) {
        self.previous = block.hash();
        self.resume = Resume {
            block: BlockNumber(block.number.0 + 1),
            position: block.orderer_position,
        };
        self.reopen_stream();
        self.reconnect_at = Some(Instant::now());
        self.executed.clear();
        self.executed_at.clear();
        self.retry = None;
        self.failed_attempts = 0;
        if let Some((since, recovery)) = self.recovering.take() {
            let recovery = RecoveryReport {
                checkpoint: Some(block.number),
                elapsed: since.elapsed(),
                ..recovery
            };
            self.status.send_modify(|s| {
                s.recoveries.push(recovery);
                s.recoveries_total += 1;
                trim(&mut s.recoveries);
            });
        }
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

    /// A recovery no local checkpoint can do: adopt another organization's state and, if it is
    /// older than `block`, replay up to `block`. Peers may not have a checkpoint at or after
    /// `block` yet (an equivocation victim needs one: replaying gets it the wrong block again),
    /// so this keeps trying for `transfer_timeout`.
    async fn recover_by_transfer(&mut self, block: BlockNumber, local: &str) -> Event {
        let deadline = Instant::now() + self.settings.transfer_timeout;
        loop {
            let attempt = async {
                let adopted = self.transfer().await?;
                if adopted.number >= block {
                    return Ok(Event::Transferred(adopted));
                }
                let resume = Resume {
                    block: BlockNumber(adopted.number.0 + 1),
                    position: adopted.orderer_position,
                };
                self.replay(resume, block).await.map(Event::Recovered)
            }
            .await;
            match attempt {
                Ok(event) => return event,
                Err(e) if Instant::now() < deadline && !self.peers.peers().is_empty() => {
                    warn!(org = %self.me, %block, error = %e, "no state transfer recovers the block yet; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => {
                    return Event::RecoveryFailed {
                        block,
                        reason: format!("{local}; no state transfer recovers it: {e}"),
                    };
                }
            }
        }
    }

    /// Restores the `attempt`-th newest checkpoint before `block`, replays up to `block` and
    /// reports the re-executed block to the engine. Each checkpoint is tried twice: first
    /// restoring the keys recorded as changed since it, then (verified against its agreed
    /// state digest) every row, which also repairs changes that bypassed the triggers.
    async fn recover(&mut self, block: BlockNumber, attempt: u32) -> Event {
        self.hold_gate().await;
        if let Some(flight) = self.in_flight.take() {
            // Executed on the state being discarded.
            match flight.await {
                Ok(_) => {}
                Err(e) => {
                    return Event::RecoveryFailed {
                        block,
                        reason: e.to_string(),
                    };
                }
            }
        }
        self.retry = None;
        self.failed_attempts = 0;
        self.executed.retain(|b, _| *b < block);
        if !matches!(&self.recovering, Some((_, r)) if r.block == block) {
            self.recovering = Some((
                Instant::now(),
                RecoveryReport {
                    block,
                    checkpoint: None,
                    attempts: 0,
                    replayed: 0,
                    restore: Duration::ZERO,
                    replay: Duration::ZERO,
                    elapsed: Duration::ZERO,
                },
            ));
        }
        info!(org = %self.me, %block, attempt, "recovering");
        match checkpoints_before(&self.store, block).await {
            Ok(c) if c.len() <= attempt as usize / 2 => {
                let local =
                    format!("no checkpoint before block {block} is left to try ({attempt} tried)");
                return self.recover_by_transfer(block, &local).await;
            }
            _ => {}
        }
        let result = async {
            let candidates = checkpoints_before(&self.store, block).await?;
            let Some(&checkpoint) = candidates.get(attempt as usize / 2) else {
                return Err(format!(
                    "no checkpoint before block {block} is left to try ({} tried)",
                    attempt
                ));
            };
            let restoring = Instant::now();
            let port = self.port.clone();
            let full = if attempt % 2 == 1 {
                Some(
                    ledger::block(&self.store, checkpoint)
                        .await
                        .map_err(|e| e.to_string())?
                        .state_digest,
                )
            } else {
                None
            };
            patiently(self.settings.replay_timeout, || {
                port.restore(checkpoint, full)
            })
            .await?;
            if let Some((_, report)) = self.recovering.as_mut() {
                report.checkpoint = Some(checkpoint);
                report.attempts = attempt + 1;
                report.replayed = block.0 - checkpoint.0;
                report.restore += restoring.elapsed();
            }
            let base = ledger::block(&self.store, checkpoint)
                .await
                .map_err(|e| e.to_string())?;
            self.previous = base.hash();
            let replaying = Instant::now();
            let replayed = self
                .replay(
                    Resume {
                        block: BlockNumber(checkpoint.0 + 1),
                        position: base.orderer_position,
                    },
                    block,
                )
                .await;
            if let Some((_, report)) = self.recovering.as_mut() {
                report.replay += replaying.elapsed();
            }
            replayed
        }
        .await;
        match result {
            Ok(ledger) => Event::Recovered(ledger),
            Err(reason) => {
                // The orderer cannot give the agreed blocks again (an equivocation), or the
                // checkpoint is unusable: the agreed state comes from another organization.
                warn!(org = %self.me, %block, %reason, "recovering from a checkpoint failed");
                self.recover_by_transfer(block, &reason).await
            }
        }
    }

    /// Executes the blocks from `from` through `through` again, checking each one that is in
    /// the ledger against it; the stream then continues as the node's block stream. Returns
    /// the last block.
    async fn replay(&mut self, from: Resume, through: BlockNumber) -> Result<LedgerBlock, String> {
        let mut stream = self
            .orderer
            .deliver(from)
            .await
            .map_err(|e| e.to_string())?;
        let result = async {
            let mut last = None;
            for n in from.block.0..=through.0 {
                let block = tokio::time::timeout(self.settings.replay_timeout, stream.next())
                    .await
                    .map_err(|_| format!("the orderer did not deliver block {n} for the replay"))?
                    .ok_or_else(|| format!("the orderer ended before block {n}"))?
                    .map_err(|e| e.to_string())?;
                if block.number.0 != n {
                    return Err(format!(
                        "the orderer delivered block {} instead of {n}",
                        block.number
                    ));
                }
                let (port, previous) = (self.port.clone(), self.previous);
                let done = patiently(self.settings.replay_timeout, || {
                    port.execute(block.clone(), previous, false, false)
                })
                .await?
                .executed;
                self.previous = done.ledger.hash();
                if BlockNumber(n) < self.engine.next_block() {
                    let agreed = ledger::block(&self.store, BlockNumber(n))
                        .await
                        .map_err(|e| e.to_string())?;
                    if agreed.hash() != done.ledger.hash() {
                        return Err(format!(
                            "replaying agreed block {n} gives LedgerBlock {} but the ledger has {}",
                            done.ledger.hash(),
                            agreed.hash()
                        ));
                    }
                }
                self.resume = Resume::after(&block);
                self.status.send_modify(|s| s.executed = Some(block.number));
                last = Some(done);
            }
            last.ok_or_else(|| "nothing to replay".to_owned())
        }
        .await;
        let done = result?;
        self.blocks = Some(stream);
        self.reconnect_at = None;
        let ledger = done.ledger.clone();
        if ledger.number >= self.engine.next_block() {
            self.executed.insert(ledger.number, done);
        }
        Ok(ledger)
    }

    /// After a crash during a recovery the database may be behind its own ledger: replay the
    /// agreed blocks it misses, checked against the ledger.
    async fn catch_up(&mut self, last: BlockNumber) -> Result<(), NodeError> {
        let applied = self.store.last_applied_block().await?;
        if applied.is_some_and(|a| a >= last) {
            return Ok(());
        }
        let from = match applied {
            None => Resume::START,
            Some(a) => Resume {
                block: BlockNumber(a.0 + 1),
                position: ledger::block(&self.store, a).await?.orderer_position,
            },
        };
        info!(org = %self.me, from = %from.block, through = %last, "the database is behind the ledger; replaying");
        self.previous = match applied {
            None => Digest::ZERO,
            Some(a) => ledger::block(&self.store, a).await?.hash(),
        };
        self.replay(from, last)
            .await
            .map_err(|problem| NodeError::Ledger {
                block: last,
                problem,
            })?;
        Ok(())
    }
}

impl<B: Backend, O: Orderer> std::fmt::Debug for Node<B, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("org", &self.me)
            .field("next_block", &self.engine.next_block())
            .field("state", self.engine.state())
            .finish_non_exhaustive()
    }
}

/// Runs a port call during a recovery, retrying while the execution process cannot be reached
/// (it may be restarting), for at most `budget`.
async fn patiently<'a, T>(
    budget: Duration,
    mut call: impl FnMut() -> crate::port::PortFuture<'a, T>,
) -> Result<T, String> {
    let deadline = Instant::now() + budget;
    let mut delay = Duration::from_millis(100);
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(ExecutionError::Remote(e)) if Instant::now() + delay < deadline => {
                warn!(error = %e, "the execution component is unreachable during a recovery; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The checkpoints before `block`, newest first.
async fn checkpoints_before<B: Backend>(
    store: &Store<B>,
    block: BlockNumber,
) -> Result<Vec<BlockNumber>, String> {
    Ok(store
        .checkpoints()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|c| *c < block)
        .rev()
        .collect())
}

/// Errors that go away by themselves: the database is unreachable or busy.
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
        assert_eq!(patiently(Duration::from_secs(30), flaky).await, Ok(3));

        let down = || -> crate::port::PortFuture<'_, ()> {
            Box::pin(async { Err(ExecutionError::Remote("connection refused".into())) })
        };
        let e = patiently(Duration::from_secs(2), down).await.unwrap_err();
        assert!(e.contains("connection refused"), "{e}");

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
