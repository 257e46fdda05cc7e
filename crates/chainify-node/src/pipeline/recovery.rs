//! Recovery, repair and fast join: the pipeline's jobs that change the database outside a
//! block's execution (docs/design/overview.md §2.5, docs/operations.md).
//!
//! - **Recovery** of a block whose agreed hash is not ours (the commit engine's
//!   `StartRecovery { block, attempt }`): attempt 2k restores the k-th newest checkpoint before
//!   the block by the keys recorded as changed since, attempt 2k+1 the same checkpoint by every
//!   row, verified against its agreed state digest (which also undoes changes that bypassed the
//!   triggers); each then replays up to the block, and the engine compares the result. When no
//!   checkpoint is left, or the orderer cannot give the agreed blocks again (an equivocation),
//!   the agreed state comes from another organization by a state transfer, tried again every
//!   second for `transfer_timeout_ms`; then the engine halts.
//! - **Repair** of tables a full scan found different from the agreed state, at a clean point:
//!   the newest checkpoint whose snapshots hold its agreed state digest is restored row by row
//!   and the agreed blocks since are replayed; without one, a state transfer; without that, an
//!   alarm.
//! - **Fast join** of an empty ledger from another organization's verified state; without one
//!   the node replays from block 1.
//!
//! A block in flight when a recovery starts was executed on the state being discarded: the
//! recovery waits for it to land and drops its result.

use chainify_commit as commit;
use chainify_core::tx::LedgerBlock;
use chainify_core::{BlockNumber, Digest};
use chainify_orderer::OrdererError;

use super::{Command, Pipeline, REOPEN_AFTER_MS};
use crate::LocalFault;
use crate::transfer::TransferError;

/// How long a recovery waits before asking for a state transfer again.
const TRANSFER_RETRY_MS: u64 = 1000;
/// How long a failed repair waits before it is tried again.
pub(super) const REPAIR_RETRY_MS: u64 = 5000;

/// Why a step of a recovery, repair or join failed.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// Every checkpoint before the block was tried.
    #[error("no checkpoint before block {block} is left to try ({tried} tried)")]
    NoCheckpointLeft {
        /// The block being recovered.
        block: BlockNumber,
        /// Attempts made.
        tried: u32,
    },
    /// This organization's database (listing checkpoints), ledger, or execution component
    /// (restoring, executing).
    #[error(transparent)]
    Local(#[from] LocalFault),
    /// The orderer cannot deliver the blocks.
    #[error(transparent)]
    Orderer(#[from] OrdererError),
    /// The orderer did not deliver a block of the replay in time.
    #[error("the orderer did not deliver block {0} for the replay")]
    NotDelivered(BlockNumber),
    /// The orderer's stream ended before a block of the replay.
    #[error("the orderer ended before block {0}")]
    StreamEnded(BlockNumber),
    /// The orderer delivered another block than the replay needs.
    #[error("the orderer delivered block {got} instead of {expected}")]
    OutOfOrder {
        /// What came.
        got: BlockNumber,
        /// What was due.
        expected: BlockNumber,
    },
    /// A replayed agreed block differs from the ledger (the orderer equivocated, or the
    /// restored state is not the agreed one).
    #[error("replaying agreed block {block} gives LedgerBlock {got} but the ledger has {agreed}")]
    Diverged {
        /// The block.
        block: BlockNumber,
        /// Its hash as replayed.
        got: Digest,
        /// Its hash in the ledger.
        agreed: Digest,
    },
    /// A replay of an empty range.
    #[error("nothing to replay")]
    NothingToReplay,
    /// No organization transferred its state.
    #[error(transparent)]
    Transfer(#[from] TransferError),
}

crate::fault::from_local_faults!(RecoveryError);

/// A recovery that ended in an append or an adopted state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoverySummary {
    /// The block that disagreed.
    pub block: BlockNumber,
    /// The checkpoint that repaired it (or the block whose state was adopted).
    pub checkpoint: Option<BlockNumber>,
    /// Checkpoint attempts made.
    pub attempts: u32,
    /// Blocks re-executed by the last checkpoint attempt.
    pub replayed: u64,
}

/// How tables that differed from the agreed state were repaired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repaired {
    /// By a verified full restore of this checkpoint and a replay.
    Checkpoint(BlockNumber),
    /// By adopting another organization's state of this block (and a replay).
    Transfer(BlockNumber),
}

/// What the runtime logs or counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The orderer delivered another block than the next; the stream is reopened.
    UnexpectedBlock {
        /// What came.
        got: BlockNumber,
        /// What was due.
        expected: BlockNumber,
    },
    /// A recovery attempt starts.
    Recovering {
        /// The block.
        block: BlockNumber,
        /// The attempt.
        attempt: u32,
    },
    /// Recovering from a checkpoint failed; a state transfer comes next.
    CheckpointsFailed {
        /// The block.
        block: BlockNumber,
        /// Why.
        reason: String,
    },
    /// No state transfer recovers the block yet; another try follows.
    TransferRetry {
        /// The block.
        block: BlockNumber,
        /// Why.
        reason: String,
    },
    /// A recovery ended.
    RecoveryEnded(RecoverySummary),
    /// A repair of the tables starts at the agreed block.
    Repairing {
        /// The last agreed block.
        agreed: BlockNumber,
    },
    /// No checkpoint repairs the tables; a state transfer comes next.
    NoCheckpointRepairs {
        /// Why.
        reason: String,
    },
    /// The tables were repaired.
    Repaired(Repaired),
    /// An empty ledger joined from another organization's state of this block.
    Joined(BlockNumber),
    /// No fast join: the node replays from block 1.
    NoJoin(String),
}

/// A job of the pipeline: at most one at a time, and no block executes meanwhile.
#[derive(Debug)]
pub(super) enum Job {
    Recovery(Recovery),
    Repair(Repair),
    /// A fast join's state transfer.
    Join,
}

#[derive(Debug)]
pub(super) struct Recovery {
    block: BlockNumber,
    attempt: u32,
    step: Step,
    summary: RecoverySummary,
    /// The summary was reported (an adopted state ends the recovery's report).
    reported: bool,
    /// A state older than the block was adopted and the replay from it did not give the
    /// agreed block: peers have no newer state yet, so the next transfer waits a little.
    adopted: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// A block in flight executes on the state being discarded.
    AwaitFlight,
    Listing,
    Restoring(BlockNumber),
    Replaying,
    /// `local` says why no checkpoint recovered the block; transfers are tried until
    /// `deadline`.
    Transferring {
        local: String,
        deadline: u64,
    },
    TransferWait {
        local: String,
        deadline: u64,
        at: u64,
    },
    ReplayingAfterTransfer {
        local: String,
        deadline: u64,
    },
    /// Re-executed; the commit engine decides.
    Agreeing,
}

#[derive(Debug)]
pub(super) struct Repair {
    agreed: BlockNumber,
    /// Checkpoints still to try, newest first.
    candidates: Vec<BlockNumber>,
    tried: Vec<String>,
    step: RepairStep,
}

#[derive(Debug)]
enum RepairStep {
    Listing,
    Restoring(BlockNumber),
    Replaying(BlockNumber),
    Transferring {
        local: String,
    },
    ReplayingAfterTransfer {
        local: String,
        adopted: Box<LedgerBlock>,
    },
}

/// Whether a recovery waits for the block in flight to land (its result is void).
pub(super) fn awaits_flight(job: &Option<Job>) -> bool {
    matches!(job, Some(Job::Recovery(r)) if r.step == Step::AwaitFlight)
}

impl Pipeline {
    /// Starts a fast join or a repair when one is due (at a clean point); returns whether one
    /// started.
    pub(super) fn start_job_if_due(&mut self, out: &mut Vec<Command>) -> bool {
        if self.join_pending {
            self.join_pending = false;
            if self.schedule.fast_join && self.has_peers {
                self.job = Some(Job::Join);
                out.push(Command::TransferState);
                return true;
            }
        }
        if self.repair_pending
            && self.now >= self.repair_after
            && matches!(self.engine.state(), commit::State::Running)
        {
            self.repair_pending = false;
            let agreed = BlockNumber(self.engine.next_block().0.saturating_sub(1));
            out.push(Command::Notice(Notice::Repairing { agreed }));
            self.job = Some(Job::Repair(Repair {
                agreed,
                candidates: Vec::new(),
                tried: Vec::new(),
                step: RepairStep::Listing,
            }));
            match self.repair_by_transfer.clone() {
                Some(local) => self.transfer_for_repair(local, out),
                None => out.push(Command::ListCheckpoints {
                    before: BlockNumber(agreed.0 + 1),
                }),
            }
            return true;
        }
        false
    }

    /// `block` cannot run because the record of applied blocks is damaged (`damage`): alarm,
    /// and repair at the next clean point instead of running it again, which would fail the
    /// same way for ever. The repair restores a verified checkpoint, which rewrites the
    /// record, and replays to the agreed block; the block then comes again from a reopened
    /// stream. If the same block meets damage again, a restore did not reach it: the next
    /// repair waits [`REPAIR_RETRY_MS`] (no busy loop) and takes another organization's state
    /// instead of restoring a checkpoint again.
    pub(super) fn repair_damage(
        &mut self,
        block: BlockNumber,
        damage: &str,
        out: &mut Vec<Command>,
    ) {
        out.push(Command::Commit(commit::Command::Alarm(format!(
            "{damage}: repairing the tables from a checkpoint instead of running block {block} again"
        ))));
        self.retry = None;
        self.failed_attempts = 0;
        self.repair_pending = true;
        let again = self.damage_repaired == Some(block);
        self.repair_after = if again {
            self.now + REPAIR_RETRY_MS
        } else {
            self.now
        };
        self.repair_by_transfer = again.then(|| {
            format!("a checkpoint restored did not repair block {block}'s damage ({damage})")
        });
        self.damage_repaired = Some(block);
        self.reopen(REOPEN_AFTER_MS, out);
    }

    /// The commit engine asks to recover `block` with checkpoint attempt `attempt`.
    pub(super) fn start_recovery(
        &mut self,
        block: BlockNumber,
        attempt: u32,
        out: &mut Vec<Command>,
    ) {
        self.retry = None;
        self.failed_attempts = 0;
        self.executed.retain(|b| *b < block);
        let (summary, adopted) = match self.job.take() {
            Some(Job::Recovery(r)) if r.block == block => (r.summary, r.adopted),
            _ => (
                RecoverySummary {
                    block,
                    checkpoint: None,
                    attempts: 0,
                    replayed: 0,
                },
                false,
            ),
        };
        out.push(Command::Notice(Notice::Recovering { block, attempt }));
        let step = if self.in_flight.is_some() {
            Step::AwaitFlight
        } else {
            out.push(Command::ListCheckpoints { before: block });
            Step::Listing
        };
        self.job = Some(Job::Recovery(Recovery {
            block,
            attempt,
            step,
            summary,
            reported: false,
            adopted,
        }));
    }

    /// The block in flight landed (executed or failed): whether a recovery was waiting for it
    /// (its result is then void).
    pub(super) fn flight_landed(&mut self, out: &mut Vec<Command>) -> bool {
        let Some(Job::Recovery(r)) = &mut self.job else {
            return false;
        };
        if r.step != Step::AwaitFlight {
            return false;
        }
        r.step = Step::Listing;
        out.push(Command::ListCheckpoints { before: r.block });
        true
    }

    pub(super) fn on_checkpoints(
        &mut self,
        list: Result<Vec<BlockNumber>, RecoveryError>,
        out: &mut Vec<Command>,
    ) {
        match &mut self.job {
            Some(Job::Recovery(r)) if r.step == Step::Listing => {
                let (block, attempt) = (r.block, r.attempt);
                match list {
                    Ok(list) => match list.get(attempt as usize / 2) {
                        Some(&checkpoint) => {
                            r.step = Step::Restoring(checkpoint);
                            out.push(Command::Restore {
                                checkpoint,
                                full: attempt % 2 == 1,
                            });
                        }
                        None => {
                            let local = RecoveryError::NoCheckpointLeft {
                                block,
                                tried: attempt,
                            };
                            self.transfer_for_recovery(local.to_string(), out);
                        }
                    },
                    Err(e) => self.checkpoints_failed(e, out),
                }
            }
            Some(Job::Repair(r)) if matches!(r.step, RepairStep::Listing) => match list {
                Ok(list) => {
                    r.candidates = list;
                    self.next_repair_candidate(out);
                }
                Err(e) => self.transfer_for_repair(e.to_string(), out),
            },
            _ => {}
        }
    }

    pub(super) fn on_restored(
        &mut self,
        checkpoint: BlockNumber,
        base: &LedgerBlock,
        out: &mut Vec<Command>,
    ) {
        let agreed_before = self.engine.next_block();
        let through = match &mut self.job {
            Some(Job::Recovery(r)) if r.step == Step::Restoring(checkpoint) => {
                r.summary.checkpoint = Some(checkpoint);
                r.summary.attempts = r.attempt + 1;
                r.summary.replayed = r.block.0 - checkpoint.0;
                r.step = Step::Replaying;
                r.block
            }
            Some(Job::Repair(r)) if matches!(r.step, RepairStep::Restoring(c) if c == checkpoint) =>
            {
                if checkpoint < r.agreed {
                    r.step = RepairStep::Replaying(checkpoint);
                    r.agreed
                } else {
                    // The checkpoint is the agreed block: nothing to replay.
                    self.chain_to(base);
                    self.reopen(REOPEN_AFTER_MS, out);
                    self.repaired(Repaired::Checkpoint(checkpoint), out);
                    return;
                }
            }
            _ => return,
        };
        // The database now holds the checkpoint's state.
        self.chain_to(base);
        out.push(Command::Replay {
            from: self.resume,
            through,
            previous: self.previous,
            agreed_before,
        });
    }

    pub(super) fn on_restore_failed(
        &mut self,
        checkpoint: BlockNumber,
        error: RecoveryError,
        out: &mut Vec<Command>,
    ) {
        match &mut self.job {
            Some(Job::Recovery(r)) if r.step == Step::Restoring(checkpoint) => {
                self.checkpoints_failed(error, out)
            }
            Some(Job::Repair(r)) if matches!(r.step, RepairStep::Restoring(c) if c == checkpoint) =>
            {
                r.tried.push(format!("checkpoint {checkpoint}: {error}"));
                self.next_repair_candidate(out);
            }
            _ => {}
        }
    }

    pub(super) fn on_replayed(&mut self, last: LedgerBlock, out: &mut Vec<Command>) {
        let Some(job) = &mut self.job else { return };
        // The replay's stream goes on as the block stream.
        let replaying = match job {
            Job::Recovery(r) => matches!(
                r.step,
                Step::Replaying | Step::ReplayingAfterTransfer { .. }
            ),
            Job::Repair(r) => matches!(
                r.step,
                RepairStep::Replaying(_) | RepairStep::ReplayingAfterTransfer { .. }
            ),
            Job::Join => false,
        };
        if !replaying {
            return;
        }
        self.chain_to(&last);
        self.stream = super::Stream::Open;
        if last.number >= self.engine.next_block() {
            self.executed.insert(last.number);
        }
        match self.job.as_mut() {
            Some(Job::Recovery(r)) => {
                r.step = Step::Agreeing;
                self.commit(commit::Event::Recovered(last), out);
            }
            Some(Job::Repair(r)) => match std::mem::replace(&mut r.step, RepairStep::Listing) {
                RepairStep::Replaying(checkpoint) => {
                    self.repaired(Repaired::Checkpoint(checkpoint), out)
                }
                RepairStep::ReplayingAfterTransfer { adopted, .. } => {
                    self.repaired_by_transfer(*adopted, out)
                }
                _ => unreachable!("checked above"),
            },
            _ => {}
        }
    }

    pub(super) fn on_replay_failed(&mut self, error: RecoveryError, out: &mut Vec<Command>) {
        let Some(job) = self.job.as_mut() else { return };
        match job {
            Job::Recovery(r) => match std::mem::replace(&mut r.step, Step::Listing) {
                Step::Replaying => {
                    self.reopen(REOPEN_AFTER_MS, out);
                    self.checkpoints_failed(error, out);
                }
                Step::ReplayingAfterTransfer { local, deadline } => {
                    self.reopen(REOPEN_AFTER_MS, out);
                    self.transfer_failed(local, deadline, error, out);
                }
                step => r.step = step,
            },
            Job::Repair(r) => match std::mem::replace(&mut r.step, RepairStep::Listing) {
                RepairStep::Replaying(_) => {
                    self.reopen(REOPEN_AFTER_MS, out);
                    self.transfer_for_repair(error.to_string(), out);
                }
                RepairStep::ReplayingAfterTransfer { local, .. } => {
                    self.reopen(REOPEN_AFTER_MS, out);
                    self.repair_failed(&local, &error, out);
                }
                step => r.step = step,
            },
            Job::Join => {}
        }
    }

    pub(super) fn on_transferred(&mut self, adopted: LedgerBlock, out: &mut Vec<Command>) {
        let transferring = match &self.job {
            Some(Job::Recovery(r)) => matches!(r.step, Step::Transferring { .. }),
            Some(Job::Repair(r)) => matches!(r.step, RepairStep::Transferring { .. }),
            Some(Job::Join) => true,
            None => false,
        };
        if !transferring {
            return;
        }
        // The database and the ledger hold the adopted block; everything executed is void.
        self.chain_to(&adopted);
        self.reopen(0, out);
        self.executed.clear();
        self.retry = None;
        self.failed_attempts = 0;
        let agreed_before = self.engine.next_block();
        match self.job.take() {
            Some(Job::Recovery(mut r)) => {
                let Step::Transferring { local, deadline } = r.step else {
                    unreachable!("checked above")
                };
                r.summary.checkpoint = Some(adopted.number);
                if !r.reported {
                    out.push(Command::Notice(Notice::RecoveryEnded(r.summary.clone())));
                    r.reported = true;
                }
                if adopted.number >= r.block {
                    self.commit(commit::Event::Transferred(adopted), out);
                } else {
                    out.push(Command::Replay {
                        from: self.resume,
                        through: r.block,
                        previous: self.previous,
                        agreed_before,
                    });
                    r.step = Step::ReplayingAfterTransfer { local, deadline };
                    r.adopted = true;
                    self.job = Some(Job::Recovery(r));
                }
            }
            Some(Job::Repair(mut r)) => {
                let RepairStep::Transferring { local } = r.step else {
                    unreachable!("checked above")
                };
                if adopted.number < r.agreed {
                    out.push(Command::Replay {
                        from: self.resume,
                        through: r.agreed,
                        previous: self.previous,
                        agreed_before,
                    });
                    r.step = RepairStep::ReplayingAfterTransfer {
                        local,
                        adopted: Box::new(adopted),
                    };
                    self.job = Some(Job::Repair(r));
                } else {
                    self.repaired_by_transfer(adopted, out);
                }
            }
            Some(Job::Join) => {
                out.push(Command::Notice(Notice::Joined(adopted.number)));
                self.commit(commit::Event::Transferred(adopted), out);
            }
            None => {}
        }
    }

    pub(super) fn on_transfer_failed(&mut self, error: RecoveryError, out: &mut Vec<Command>) {
        match self.job.take() {
            Some(Job::Recovery(mut r)) => match std::mem::replace(&mut r.step, Step::Listing) {
                Step::Transferring { local, deadline } => {
                    self.job = Some(Job::Recovery(r));
                    self.transfer_failed(local, deadline, error, out);
                }
                step => {
                    r.step = step;
                    self.job = Some(Job::Recovery(r));
                }
            },
            Some(Job::Repair(r)) => match &r.step {
                RepairStep::Transferring { local } => {
                    let local = local.clone();
                    self.job = Some(Job::Repair(r));
                    self.repair_failed(&local, &error, out)
                }
                _ => self.job = Some(Job::Repair(r)),
            },
            Some(Job::Join) => out.push(Command::Notice(Notice::NoJoin(error.to_string()))),
            None => {}
        }
    }

    /// A recovery waiting to ask for a state transfer again asks when its time has come.
    pub(super) fn recovery_tick(&mut self, out: &mut Vec<Command>) {
        let now = self.now;
        if let Some(Job::Recovery(r)) = &mut self.job
            && let Step::TransferWait {
                local,
                deadline,
                at,
            } = &r.step
            && *at <= now
        {
            r.step = Step::Transferring {
                local: local.clone(),
                deadline: *deadline,
            };
            out.push(Command::TransferState);
        }
    }

    /// `number` was appended: a recovery of it is over.
    pub(super) fn appended(&mut self, number: BlockNumber, out: &mut Vec<Command>) {
        if let Some(Job::Recovery(r)) = &self.job
            && r.block == number
        {
            if !r.reported {
                out.push(Command::Notice(Notice::RecoveryEnded(r.summary.clone())));
            }
            self.job = None;
        }
    }

    /// Recovering from a checkpoint failed: the agreed state comes from another organization.
    fn checkpoints_failed(&mut self, error: RecoveryError, out: &mut Vec<Command>) {
        let Some(Job::Recovery(r)) = &self.job else {
            return;
        };
        out.push(Command::Notice(Notice::CheckpointsFailed {
            block: r.block,
            reason: error.to_string(),
        }));
        self.transfer_for_recovery(error.to_string(), out);
    }

    fn transfer_for_recovery(&mut self, local: String, out: &mut Vec<Command>) {
        let deadline = self.now + self.schedule.transfer_timeout_ms;
        if let Some(Job::Recovery(r)) = &mut self.job {
            if r.adopted {
                // No peer had a newer state a moment ago: no busy loop of transfers.
                r.step = Step::TransferWait {
                    local,
                    deadline,
                    at: self.now + TRANSFER_RETRY_MS,
                };
            } else {
                r.step = Step::Transferring { local, deadline };
                out.push(Command::TransferState);
            }
        }
    }

    /// A state transfer (or the replay after it) did not recover the block: try again within
    /// the deadline while any organization may serve one, else the engine halts.
    fn transfer_failed(
        &mut self,
        local: String,
        deadline: u64,
        error: RecoveryError,
        out: &mut Vec<Command>,
    ) {
        let now = self.now;
        let has_peers = self.has_peers;
        let Some(Job::Recovery(r)) = &mut self.job else {
            return;
        };
        let block = r.block;
        if now < deadline && has_peers {
            out.push(Command::Notice(Notice::TransferRetry {
                block,
                reason: error.to_string(),
            }));
            r.step = Step::TransferWait {
                local,
                deadline,
                at: now + TRANSFER_RETRY_MS,
            };
        } else {
            self.job = None;
            self.commit(
                commit::Event::RecoveryFailed {
                    block,
                    reason: format!("{local}; no state transfer recovers it: {error}"),
                },
                out,
            );
        }
    }

    fn next_repair_candidate(&mut self, out: &mut Vec<Command>) {
        let Some(Job::Repair(r)) = &mut self.job else {
            return;
        };
        if r.candidates.is_empty() {
            let local = if r.tried.is_empty() {
                format!("no checkpoint at or before block {}", r.agreed)
            } else {
                r.tried.join("; ")
            };
            self.transfer_for_repair(local, out);
            return;
        }
        let checkpoint = r.candidates.remove(0);
        r.step = RepairStep::Restoring(checkpoint);
        out.push(Command::Restore {
            checkpoint,
            full: true,
        });
    }

    fn transfer_for_repair(&mut self, local: String, out: &mut Vec<Command>) {
        if let Some(Job::Repair(r)) = &mut self.job {
            out.push(Command::Notice(Notice::NoCheckpointRepairs {
                reason: local.clone(),
            }));
            r.step = RepairStep::Transferring { local };
            out.push(Command::TransferState);
        }
    }

    fn repaired(&mut self, how: Repaired, out: &mut Vec<Command>) {
        self.job = None;
        out.push(Command::Notice(Notice::Repaired(how)));
    }

    fn repaired_by_transfer(&mut self, adopted: LedgerBlock, out: &mut Vec<Command>) {
        self.repaired(Repaired::Transfer(adopted.number), out);
        if adopted.number >= self.engine.next_block() {
            self.commit(commit::Event::Transferred(adopted), out);
        }
    }

    /// Nothing repaired the tables: alarm, and try again later. Meanwhile no block executes and
    /// no reader is let in: the tables are not the agreed state (and a restore may have moved
    /// them further from it).
    fn repair_failed(&mut self, local: &str, error: &RecoveryError, out: &mut Vec<Command>) {
        self.job = None;
        self.repair_pending = true;
        self.repair_after = self.now + REPAIR_RETRY_MS;
        out.push(Command::Commit(commit::Command::Alarm(format!(
            "the tables differ from the agreed state; no checkpoint repairs them ({local}) and no state transfer did ({error})"
        ))));
    }
}
