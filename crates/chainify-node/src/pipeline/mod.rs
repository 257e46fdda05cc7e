//! The node's pipeline as a state machine without I/O, beside the commit engine.
//!
//! [`Pipeline::handle`] takes one [`Event`] (a block ordered, executed or failed, the block
//! stream opened or broken, checkpoints listed, a checkpoint restored, a range replayed, a state
//! transferred, a vote, a tick) and returns the [`Command`]s the runtime must carry out (open
//! the block stream, execute a block chained to a given hash, prune checkpoints, restore, replay
//! a range, transfer a state, and the commit engine's votes and appends). The runtime
//! (`node.rs`) owns the database, the orderer and the clock and only carries commands out; what
//! to do next is decided here, where the tests assert it command by command.
//!
//! What lives here and nowhere else:
//! - **The chain hash**: the hash of the LedgerBlock the next execution chains to. It travels in
//!   [`Command::Execute`] and [`Command::Replay`]; executors keep no chain state.
//! - **Where the block stream resumes**, and when it is reopened.
//! - **The execution schedule**: which block runs next, how far ahead of the votes
//!   (`pipeline_depth`), when a checkpoint and a full scan are due, the backoff of a failed block.
//! - **Clean points**: the database holds exactly the agreed blocks. Repairs and fast joins start
//!   only there.
//! - **Recovery, repair and fast join** ([`recovery`]): which checkpoint to try, when to replay,
//!   when to fall back to a state transfer from another organization, when to give up.
//!
//! Time is the runtime's monotonic clock in milliseconds, passed with every event.

mod recovery;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

use chainify_commit::{self as commit, CommitEngine};
use chainify_core::tx::{Certificate, LedgerBlock, TransactionBlock, Vote};
use chainify_core::{BlockNumber, Digest};
use chainify_orderer::Resume;

use recovery::Job;
pub use recovery::{Notice, RecoveryError, RecoverySummary, Repaired};

/// How long a stream that broke (an unexpected block, an error, its end) waits to reopen.
const REOPEN_AFTER_MS: u64 = 200;
/// How long to wait before asking an unreachable orderer again.
const RECONNECT_AFTER_MS: u64 = 1000;

/// What the pipeline schedules, from the node's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Take a checkpoint after the first block and after every block whose number is a multiple
    /// of this (at least 1).
    pub checkpoint_interval: u64,
    /// Compare the tables with the state digest by a full scan with the first block after start
    /// and every block whose number is a multiple of this (at least 1).
    pub state_check_interval: u64,
    /// How many blocks may execute beyond the next block to append.
    pub pipeline_depth: u64,
    /// Start an empty ledger from another organization's verified state.
    pub fast_join: bool,
    /// How long a recovery keeps trying state transfers before it gives up.
    pub transfer_timeout_ms: u64,
}

/// An input to the pipeline.
#[derive(Debug)]
pub enum Event {
    /// Time passed.
    Tick,
    /// A vote from another organization.
    Vote(Vote),
    /// A certificate from another organization.
    Certificate(Certificate),
    /// [`Command::OpenStream`] succeeded.
    StreamOpened,
    /// [`Command::OpenStream`] failed: the orderer is unreachable.
    StreamFailed,
    /// The block stream failed, ended or delivered a block out of order.
    StreamBroken,
    /// The block stream delivered a block (pulled only while [`Pipeline::wants_block`]).
    Ordered(TransactionBlock),
    /// [`Command::Execute`] finished.
    Executed {
        /// The organization's LedgerBlock.
        ledger: LedgerBlock,
        /// The checkpoint asked for was taken.
        checkpointed: bool,
        /// A full scan found the tables differ from the state digest.
        repair_needed: bool,
    },
    /// [`Command::Execute`] failed; the block is tried again after a backoff, or after a
    /// repair when the failure is damage.
    ExecutionFailed {
        /// The block.
        block: TransactionBlock,
        /// The record of applied blocks is damaged ([`crate::ExecutionError::damage`]): no
        /// attempt would run the block, a repair would.
        damage: Option<String>,
    },
    /// The answer to [`Command::ListCheckpoints`]: the checkpoints before the block asked
    /// about, newest first.
    Checkpoints(Result<Vec<BlockNumber>, RecoveryError>),
    /// [`Command::Restore`] succeeded; `base` is the checkpoint's block from the ledger.
    Restored {
        /// The checkpoint.
        checkpoint: BlockNumber,
        /// Its agreed LedgerBlock.
        base: LedgerBlock,
    },
    /// [`Command::Restore`] failed.
    RestoreFailed {
        /// The checkpoint.
        checkpoint: BlockNumber,
        /// Why.
        error: RecoveryError,
    },
    /// [`Command::Replay`] executed the range, and the stream it read is now the node's block
    /// stream.
    Replayed {
        /// The range's last LedgerBlock.
        last: LedgerBlock,
        /// A full scan finished meanwhile found the tables differ from the state digest.
        repair_needed: bool,
    },
    /// [`Command::Replay`] failed.
    ReplayFailed(RecoveryError),
    /// [`Command::TransferState`] adopted another organization's agreed state of this block.
    Transferred(LedgerBlock),
    /// [`Command::TransferState`] failed.
    TransferFailed(RecoveryError),
}

/// An action for the runtime, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// One of the commit engine's commands (votes, appends, certificates, alarms). Its
    /// `StartRecovery` never appears: the pipeline carries it out.
    Commit(commit::Command),
    /// Open the orderer's block stream from `resume` and report [`Event::StreamOpened`] or
    /// [`Event::StreamFailed`].
    OpenStream(Resume),
    /// Drop the block stream: it resumes elsewhere.
    CloseStream,
    /// Execute `block` with its LedgerBlock chained to `previous` (report [`Event::Executed`] or
    /// [`Event::ExecutionFailed`]); the pipeline goes on meanwhile.
    Execute {
        /// The ordered block.
        block: TransactionBlock,
        /// The hash of the LedgerBlock before it.
        previous: Digest,
        /// Take a checkpoint after it.
        checkpoint: bool,
        /// Start a full scan against the state digest.
        state_check: bool,
    },
    /// Keep the configured number of checkpoints of agreed blocks (those before
    /// `agreed_before`) and every newer one.
    Prune {
        /// The next block to append.
        agreed_before: BlockNumber,
    },
    /// List the checkpoints before `before` (report [`Event::Checkpoints`]).
    ListCheckpoints {
        /// The bound.
        before: BlockNumber,
    },
    /// Restore checkpoint `checkpoint`: the keys recorded as changed since, or with `full`
    /// every row, after checking the checkpoint holds its agreed state digest (report
    /// [`Event::Restored`] or [`Event::RestoreFailed`]).
    Restore {
        /// The checkpoint.
        checkpoint: BlockNumber,
        /// Restore every row, verified against the agreed state digest.
        full: bool,
    },
    /// Execute the ordered blocks `from` through `through` again, the first chained to
    /// `previous`, checking each block before `agreed_before` against the ledger (report
    /// [`Event::Replayed`] or [`Event::ReplayFailed`]).
    Replay {
        /// Where the orderer's stream starts.
        from: Resume,
        /// The last block to execute.
        through: BlockNumber,
        /// The hash the first replayed LedgerBlock chains to.
        previous: Digest,
        /// Blocks before this are in the ledger.
        agreed_before: BlockNumber,
    },
    /// Adopt the agreed state of another organization's newest verified checkpoint (report
    /// [`Event::Transferred`] or [`Event::TransferFailed`]).
    TransferState,
    /// Something to log or count.
    Notice(Notice),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Open,
    /// Being opened by [`Command::OpenStream`].
    Opening,
    /// Closed; open it again from this time on.
    Closed {
        at: u64,
    },
}

/// One organization's pipeline.
#[derive(Debug)]
pub struct Pipeline {
    engine: CommitEngine,
    schedule: Schedule,
    now: u64,
    /// The hash the next executed LedgerBlock chains to.
    previous: Digest,
    /// The next block to execute, and where it starts in the orderer's log.
    resume: Resume,
    stream: Stream,
    /// The block being executed.
    in_flight: Option<BlockNumber>,
    /// A block whose execution failed, and when to try again.
    retry: Option<(TransactionBlock, u64)>,
    /// Failed attempts at the current block, for the backoff.
    failed_attempts: u32,
    /// Executed blocks not yet appended.
    executed: BTreeSet<BlockNumber>,
    /// Whether a block asked for a full scan executed since start.
    state_checked: bool,
    /// A full scan found the tables differ from the agreed state: repair at a clean point.
    repair_pending: bool,
    /// A failed repair is tried again from this time on.
    repair_after: u64,
    /// The block whose damaged record a repair was last started for.
    damage_repaired: Option<BlockNumber>,
    /// The next repair takes another organization's state, for this reason (a restore did not
    /// reach the damage).
    repair_by_transfer: Option<String>,
    /// A fast join is still to be tried (an empty ledger at start).
    join_pending: bool,
    /// Whether any organization may serve a state transfer.
    has_peers: bool,
    /// The recovery, repair or join under way.
    job: Option<Job>,
}

impl Pipeline {
    /// A pipeline over `engine` whose ledger ends before `resume.block`, its last LedgerBlock
    /// hashing to `previous` ([`Digest::ZERO`] for an empty ledger).
    pub fn new(engine: CommitEngine, schedule: Schedule, resume: Resume, previous: Digest) -> Self {
        assert!(
            schedule.checkpoint_interval > 0 && schedule.state_check_interval > 0,
            "intervals are checked by the node's settings"
        );
        Pipeline {
            join_pending: resume.block == Resume::START.block,
            engine,
            schedule,
            now: 0,
            previous,
            resume,
            stream: Stream::Closed { at: 0 },
            in_flight: None,
            retry: None,
            failed_attempts: 0,
            executed: BTreeSet::new(),
            state_checked: false,
            repair_pending: false,
            repair_after: 0,
            damage_repaired: None,
            repair_by_transfer: None,
            has_peers: false,
            job: None,
        }
    }

    /// Whether other organizations may serve state transfers.
    pub fn set_peers(&mut self, has_peers: bool) {
        self.has_peers = has_peers;
    }

    /// The voting engine (its state and pending votes).
    pub fn engine(&self) -> &CommitEngine {
        &self.engine
    }

    /// The next block to append.
    pub fn next_block(&self) -> BlockNumber {
        self.engine.next_block()
    }

    /// Failed attempts at the block being retried.
    pub fn failed_attempts(&self) -> u32 {
        self.failed_attempts
    }

    /// The runtime should pull the next block from the stream.
    pub fn wants_block(&self) -> bool {
        self.stream == Stream::Open && self.can_execute()
    }

    /// The database holds exactly the agreed blocks: nothing executing, executed but not
    /// appended, failed half-way, or being recovered, repaired or joined; the engine runs (a
    /// halted or waiting organization's database may hold a block nobody agreed on); and no
    /// full scan found the tables different without a repair since.
    pub fn is_clean(&self) -> bool {
        self.quiet() && !self.repair_pending
    }

    /// Nothing under way that changes the database: where a repair or a fast join may start.
    fn quiet(&self) -> bool {
        self.in_flight.is_none()
            && self.executed.is_empty()
            && self.retry.is_none()
            && self.job.is_none()
            && matches!(self.engine.state(), commit::State::Running)
    }

    /// The block in flight executes on a state a recovery discards: its result is void.
    pub fn discards_flight(&self) -> bool {
        recovery::awaits_flight(&self.job)
    }

    fn can_execute(&self) -> bool {
        self.in_flight.is_none()
            && self.job.is_none()
            && !self.repair_pending
            && !self.join_pending
            && self.retry.is_none()
            && matches!(self.engine.state(), commit::State::Running)
            && self.resume.block.0 <= self.engine.next_block().0 + self.schedule.pipeline_depth
    }

    /// Handles one event at `now_ms` and returns what to do, in order.
    pub fn handle(&mut self, now_ms: u64, event: Event) -> Vec<Command> {
        self.now = self.now.max(now_ms);
        let mut out = Vec::new();
        match event {
            Event::Tick => self.tick(&mut out),
            Event::Vote(vote) => self.commit(commit::Event::Vote(vote), &mut out),
            Event::Certificate(cert) => self.commit(commit::Event::Certificate(cert), &mut out),
            Event::StreamOpened => {
                if self.stream == Stream::Opening {
                    self.stream = Stream::Open;
                }
            }
            Event::StreamFailed => {
                self.stream = Stream::Closed {
                    at: self.now + RECONNECT_AFTER_MS,
                }
            }
            Event::StreamBroken => self.reopen(REOPEN_AFTER_MS, &mut out),
            Event::Ordered(block) => {
                if block.number == self.resume.block && self.can_execute() {
                    self.launch(block, &mut out);
                } else {
                    out.push(Command::Notice(Notice::UnexpectedBlock {
                        got: block.number,
                        expected: self.resume.block,
                    }));
                    self.reopen(REOPEN_AFTER_MS, &mut out);
                }
            }
            Event::Executed {
                ledger,
                checkpointed,
                repair_needed,
            } => self.executed(ledger, checkpointed, repair_needed, &mut out),
            Event::ExecutionFailed { block, damage } => {
                self.in_flight = None;
                if !self.flight_landed(&mut out) {
                    match damage {
                        Some(damage) => self.repair_damage(block.number, &damage, &mut out),
                        None => {
                            self.failed_attempts += 1;
                            let delay = 100u64 << self.failed_attempts.min(6);
                            self.retry = Some((block, self.now + delay));
                        }
                    }
                }
            }
            Event::Checkpoints(list) => self.on_checkpoints(list, &mut out),
            Event::Restored { checkpoint, base } => self.on_restored(checkpoint, &base, &mut out),
            Event::RestoreFailed { checkpoint, error } => {
                self.on_restore_failed(checkpoint, error, &mut out)
            }
            Event::Replayed {
                last,
                repair_needed,
            } => {
                self.repair_pending |= repair_needed;
                self.on_replayed(last, &mut out)
            }
            Event::ReplayFailed(error) => self.on_replay_failed(error, &mut out),
            Event::Transferred(block) => self.on_transferred(block, &mut out),
            Event::TransferFailed(error) => self.on_transfer_failed(error, &mut out),
        }
        out
    }

    fn tick(&mut self, out: &mut Vec<Command>) {
        if self.quiet() && self.start_job_if_due(out) {
            // The job changes where the stream resumes: nothing else this tick.
            return;
        }
        if self.job.is_none()
            && let Stream::Closed { at } = self.stream
            && at <= self.now
        {
            self.stream = Stream::Opening;
            out.push(Command::OpenStream(self.resume));
        }
        if self.in_flight.is_none()
            && self.job.is_none()
            && matches!(&self.retry, Some((_, at)) if *at <= self.now)
            && let Some((block, _)) = self.retry.take()
        {
            self.launch(block, out);
        }
        self.recovery_tick(out);
        self.commit(commit::Event::Tick { now_ms: self.now }, out);
    }

    fn launch(&mut self, block: TransactionBlock, out: &mut Vec<Command>) {
        let number = block.number;
        let checkpoint = number == Resume::START.block
            || number.0.is_multiple_of(self.schedule.checkpoint_interval);
        // The first full scan after start goes with the first block that executes (a failed
        // attempt asks again).
        let state_check =
            !self.state_checked || number.0.is_multiple_of(self.schedule.state_check_interval);
        self.in_flight = Some(number);
        out.push(Command::Execute {
            block,
            previous: self.previous,
            checkpoint,
            state_check,
        });
    }

    fn executed(
        &mut self,
        ledger: LedgerBlock,
        checkpointed: bool,
        repair_needed: bool,
        out: &mut Vec<Command>,
    ) {
        self.in_flight = None;
        // Stop launching blocks; the repair runs at the next clean point. (A scan's finding
        // counts even when it comes with a block a recovery discards.)
        self.repair_pending |= repair_needed;
        if self.flight_landed(out) {
            // Executed on the state a recovery discards.
            return;
        }
        self.state_checked = true;
        self.failed_attempts = 0;
        // A block ran: any damage is behind.
        self.repair_by_transfer = None;
        self.chain_to(&ledger);
        if checkpointed {
            out.push(Command::Prune {
                agreed_before: self.engine.next_block(),
            });
        }
        if ledger.number >= self.engine.next_block() {
            self.executed.insert(ledger.number);
        }
        self.commit(commit::Event::Executed(ledger), out);
    }

    /// The next block executes after `ledger`: chained to its hash, from its orderer position.
    fn chain_to(&mut self, ledger: &LedgerBlock) {
        self.previous = ledger.hash();
        self.resume = Resume {
            block: BlockNumber(ledger.number.0 + 1),
            position: ledger.orderer_position,
        };
    }

    /// Closes the block stream and opens it again `after_ms` from now.
    fn reopen(&mut self, after_ms: u64, out: &mut Vec<Command>) {
        if !matches!(self.stream, Stream::Closed { .. }) {
            out.push(Command::CloseStream);
        }
        self.stream = Stream::Closed {
            at: self.now + after_ms,
        };
    }

    /// Feeds the commit engine and carries out the commands that are the pipeline's (a
    /// recovery) and the bookkeeping of appends; the rest goes to the runtime.
    fn commit(&mut self, event: commit::Event, out: &mut Vec<Command>) {
        let mut appended = Vec::new();
        for command in self.engine.handle(event) {
            match command {
                commit::Command::StartRecovery { block, attempt } => {
                    self.start_recovery(block, attempt, out)
                }
                commit::Command::Append { block, certificate } => {
                    self.executed.remove(&block.number);
                    appended.push(block.number);
                    out.push(Command::Commit(commit::Command::Append {
                        block,
                        certificate,
                    }));
                }
                other => out.push(Command::Commit(other)),
            }
        }
        // After the engine's notifications: a recovery ends with its block's append.
        for number in appended {
            self.appended(number, out);
        }
    }
}
