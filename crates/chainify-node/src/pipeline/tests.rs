//! Exact command sequences for the pipeline's schedule and every recovery path, without a
//! database, an orderer or a clock.

use std::sync::Arc;

use chainify_commit::{CommitEngine, Timing};
use chainify_core::crypto::Signatures;
use chainify_core::testing::{SeededNet, seeded_key};
use chainify_core::tx::{Certificate, LedgerBlock, TransactionBlock, Vote};
use chainify_core::{BlockNumber, Digest, OrgId, TxId};
use chainify_orderer::Resume;

use super::*;
use crate::transfer::{PeerError, TransferError};
use chainify_storage::StorageError;

pub(super) type Net = SeededNet;

/// `orgs` organizations under `policy`, organization i signing with seed [i; 32].
pub(super) fn net(orgs: u32, policy: &str) -> Net {
    SeededNet::new(orgs, policy, Signatures::Ed25519)
}

pub(super) fn net_with(orgs: u32, policy: &str, signatures: Signatures) -> Net {
    SeededNet::new(orgs, policy, signatures)
}

pub(super) const SCHEDULE: Schedule = Schedule {
    checkpoint_interval: 2,
    state_check_interval: 4,
    pipeline_depth: 1,
    fast_join: true,
    transfer_timeout_ms: 5_000,
};

/// Pipelines and blocks of a test network.
pub(super) trait Blocks {
    /// Organization `org`'s pipeline over a ledger that ends with `last` (none: empty).
    fn pipeline(&self, org: u32, last: Option<&LedgerBlock>) -> Pipeline {
        self.pipeline_with(org, last, SCHEDULE)
    }
    /// The same on another schedule.
    fn pipeline_with(&self, org: u32, last: Option<&LedgerBlock>, schedule: Schedule) -> Pipeline;
    /// Ordered block `number` (no transactions).
    fn tb(&self, number: u64) -> TransactionBlock;
    /// Block `number` chained to `previous`, its effect named by `effect`.
    fn lb(&self, number: u64, previous: Digest, effect: &str) -> LedgerBlock;
}

impl Blocks for SeededNet {
    fn pipeline_with(&self, org: u32, last: Option<&LedgerBlock>, schedule: Schedule) -> Pipeline {
        let (resume, previous) = match last {
            None => (Resume::START, Digest::ZERO),
            Some(b) => (
                Resume {
                    block: BlockNumber(b.number.0 + 1),
                    position: b.orderer_position,
                },
                b.hash(),
            ),
        };
        let engine = CommitEngine::new(
            OrgId(org),
            Arc::new(seeded_key(org)),
            self.ctx.clone(),
            Timing::default(),
            resume.block,
        );
        Pipeline::new(engine, schedule, resume, previous)
    }

    fn tb(&self, number: u64) -> TransactionBlock {
        TransactionBlock {
            network: self.ctx.network.clone(),
            number: BlockNumber(number),
            transactions: Vec::new(),
            orderer_position: number * 10,
        }
    }

    fn lb(&self, number: u64, previous: Digest, effect: &str) -> LedgerBlock {
        LedgerBlock {
            network: self.ctx.network.clone(),
            number: BlockNumber(number),
            tx_ids: vec![TxId(Digest::of(number.to_be_bytes().as_slice()))],
            success: vec![true],
            valid: vec![true],
            hash_digest: Digest::of(effect.as_bytes()),
            state_digest: Digest::of(format!("state {effect}").as_bytes()),
            hash_previous: previous,
            orderer_position: number * 10,
        }
    }
}

/// A transfer in which organization `org` failed with `error`.
fn peer_failed(org: u32, error: PeerError) -> RecoveryError {
    RecoveryError::Transfer(TransferError::Failed(vec![(OrgId(org), error)]))
}

/// A restore that failed reading a checkpoint.
fn snapshot_failed(why: &str) -> RecoveryError {
    RecoveryError::from(StorageError::Checkpoint(why.into()))
}

fn vote_cmd(v: Vote) -> Command {
    Command::Commit(commit::Command::SendVote(v))
}

fn append_cmd(block: &LedgerBlock, certificate: Certificate) -> Vec<Command> {
    vec![
        Command::Commit(commit::Command::Append {
            block: block.clone(),
            certificate,
        }),
        Command::Commit(commit::Command::Notify(block.number)),
    ]
}

fn replayed(last: LedgerBlock) -> Event {
    Event::Replayed {
        last,
        repair_needed: false,
    }
}

fn executed(ledger: &LedgerBlock, checkpointed: bool) -> Event {
    Event::Executed {
        ledger: ledger.clone(),
        checkpointed,
        repair_needed: false,
    }
}

fn recovering(block: u64, attempt: u32) -> Command {
    Command::Notice(Notice::Recovering {
        block: BlockNumber(block),
        attempt,
    })
}

/// A chain of agreed blocks 1..=n ("good 1", …), each chained to the one before.
fn chain(n: &Net, len: u64) -> Vec<LedgerBlock> {
    let mut out: Vec<LedgerBlock> = Vec::new();
    for b in 1..=len {
        let previous = out.last().map_or(Digest::ZERO, |l| l.hash());
        out.push(n.lb(b, previous, &format!("good {b}")));
    }
    out
}

#[test]
fn blocks_execute_in_order_chained_to_the_hash_before_them_with_checkpoints_on_schedule() {
    let n = net(3, "any-2");
    let good = chain(&n, 3);
    let mut p = n.pipeline(1, None);
    // No peers: no fast join; the stream opens from the first block.
    assert_eq!(
        p.handle(0, Event::Tick),
        vec![Command::OpenStream(Resume::START)]
    );
    assert!(!p.wants_block(), "the stream is not open yet");
    assert_eq!(p.handle(0, Event::StreamOpened), vec![]);
    assert!(p.wants_block());
    assert_eq!(
        p.handle(1, Event::Ordered(n.tb(1))),
        vec![Command::Execute {
            block: n.tb(1),
            previous: Digest::ZERO,
            checkpoint: true,
            state_check: true,
        }]
    );
    assert!(!p.wants_block(), "one block in flight at a time");
    assert_eq!(
        p.handle(2, executed(&good[0], true)),
        vec![
            Command::Prune {
                agreed_before: BlockNumber(1)
            },
            vote_cmd(n.vote(1, &good[0])),
        ]
    );
    // Pipelining: block 2 executes while block 1 is voted on, chained to block 1's hash.
    assert_eq!(
        p.handle(3, Event::Ordered(n.tb(2))),
        vec![Command::Execute {
            block: n.tb(2),
            previous: good[0].hash(),
            checkpoint: true,
            state_check: false,
        }]
    );
    assert_eq!(p.handle(4, executed(&good[1], false)), vec![]);
    assert!(
        !p.wants_block(),
        "depth 1: block 3 waits for block 1's agreement"
    );
    let mut expected = append_cmd(&good[0], n.certificate(&[1, 2], &good[0]));
    expected.push(vote_cmd(n.vote(1, &good[1])));
    assert_eq!(p.handle(5, Event::Vote(n.vote(2, &good[0]))), expected);
    assert!(p.wants_block());
    assert_eq!(
        p.handle(6, Event::Ordered(n.tb(3))),
        vec![Command::Execute {
            block: n.tb(3),
            previous: good[1].hash(),
            checkpoint: false,
            state_check: false,
        }]
    );
}

#[test]
fn a_failed_block_is_retried_after_a_growing_backoff_and_keeps_its_full_scan() {
    let n = net(3, "any-2");
    let mut p = n.pipeline(1, None);
    p.handle(0, Event::Tick);
    p.handle(0, Event::StreamOpened);
    p.handle(0, Event::Ordered(n.tb(1)));
    assert_eq!(
        p.handle(
            10,
            Event::ExecutionFailed {
                block: n.tb(1),
                damage: None
            }
        ),
        vec![]
    );
    assert!(!p.wants_block() && !p.is_clean());
    assert_eq!(p.handle(209, Event::Tick), vec![]);
    let again = Command::Execute {
        block: n.tb(1),
        previous: Digest::ZERO,
        checkpoint: true,
        // The first full scan after start was not done yet.
        state_check: true,
    };
    assert_eq!(p.handle(210, Event::Tick), vec![again.clone()]);
    assert_eq!(
        p.handle(
            220,
            Event::ExecutionFailed {
                block: n.tb(1),
                damage: None
            }
        ),
        vec![]
    );
    assert_eq!(p.failed_attempts(), 2);
    assert_eq!(p.handle(619, Event::Tick), vec![]);
    assert_eq!(p.handle(620, Event::Tick), vec![again]);
}

#[test]
fn a_broken_stream_reopens_where_execution_stands() {
    let n = net(3, "any-2");
    let good = chain(&n, 1);
    let mut p = n.pipeline(1, None);
    p.handle(0, Event::Tick);
    p.handle(0, Event::StreamOpened);
    p.handle(0, Event::Ordered(n.tb(1)));
    p.handle(0, executed(&good[0], false));
    // The orderer skips a block: the stream is dropped and reopened after block 1.
    assert_eq!(
        p.handle(100, Event::Ordered(n.tb(3))),
        vec![
            Command::Notice(Notice::UnexpectedBlock {
                got: BlockNumber(3),
                expected: BlockNumber(2)
            }),
            Command::CloseStream
        ]
    );
    assert_eq!(p.handle(299, Event::Tick), vec![]);
    let from = Resume {
        block: BlockNumber(2),
        position: 10,
    };
    assert_eq!(p.handle(300, Event::Tick), vec![Command::OpenStream(from)]);
    // Unreachable: asked again a second later (meanwhile the engine re-sends its vote).
    assert_eq!(p.handle(300, Event::StreamFailed), vec![]);
    let streams = |out: Vec<Command>| -> Vec<Command> {
        out.into_iter()
            .filter(|c| matches!(c, Command::OpenStream(_) | Command::CloseStream))
            .collect()
    };
    assert_eq!(streams(p.handle(1299, Event::Tick)), vec![]);
    assert_eq!(
        streams(p.handle(1300, Event::Tick)),
        vec![Command::OpenStream(from)]
    );
}

/// Organization 1 with blocks 1..=4 agreed, having executed block 5 as `mine` and voted; `n`
/// is the network, `good` the agreed chain through block 5.
fn diverged(mine: &str) -> (Net, Vec<LedgerBlock>, Pipeline, LedgerBlock) {
    let n = net(3, "any-2");
    let good = chain(&n, 5);
    let mut p = n.pipeline(1, Some(&good[3]));
    p.handle(0, Event::Tick);
    p.handle(0, Event::StreamOpened);
    p.handle(0, Event::Ordered(n.tb(5)));
    let bad = n.lb(5, good[3].hash(), mine);
    assert_eq!(
        p.handle(1, executed(&bad, false)),
        vec![vote_cmd(n.vote(1, &bad))]
    );
    (n, good, p, bad)
}

/// Votes of organizations 2 and 3 for the agreed block 5: recovery attempt 0 starts.
fn outvoted(n: &Net, good: &[LedgerBlock], p: &mut Pipeline) {
    assert_eq!(p.handle(2, Event::Vote(n.vote(2, &good[4]))), vec![]);
    assert_eq!(
        p.handle(3, Event::Vote(n.vote(3, &good[4]))),
        vec![
            recovering(5, 0),
            Command::ListCheckpoints {
                before: BlockNumber(5)
            }
        ]
    );
    assert!(!p.is_clean() && !p.wants_block());
}

#[test]
fn a_divergent_block_is_recovered_from_the_newest_checkpoint_and_replayed() {
    let (n, good, mut p, _) = diverged("bad 5");
    outvoted(&n, &good, &mut p);
    let checkpoints = vec![BlockNumber(4), BlockNumber(2)];
    assert_eq!(
        p.handle(4, Event::Checkpoints(Ok(checkpoints))),
        vec![Command::Restore {
            checkpoint: BlockNumber(4),
            full: false
        }]
    );
    assert_eq!(
        p.handle(
            5,
            Event::Restored {
                checkpoint: BlockNumber(4),
                base: good[3].clone()
            }
        ),
        vec![Command::Replay {
            from: Resume {
                block: BlockNumber(5),
                position: 40
            },
            through: BlockNumber(5),
            previous: good[3].hash(),
            agreed_before: BlockNumber(5),
        }]
    );
    let mut expected = append_cmd(&good[4], n.certificate(&[2, 3], &good[4]));
    expected.push(Command::Notice(Notice::RecoveryEnded(RecoverySummary {
        block: BlockNumber(5),
        checkpoint: Some(BlockNumber(4)),
        attempts: 1,
        replayed: 1,
    })));
    assert_eq!(p.handle(6, replayed(good[4].clone())), expected);
    assert!(p.is_clean());
    // The replay's stream goes on: block 6 chains to the agreed block 5.
    assert_eq!(
        p.handle(7, Event::Ordered(n.tb(6))),
        vec![Command::Execute {
            block: n.tb(6),
            previous: good[4].hash(),
            checkpoint: true,
            state_check: false,
        }]
    );
}

#[test]
fn each_checkpoint_is_tried_by_its_keys_then_in_full_then_the_next_older() {
    let (n, good, mut p, bad) = diverged("bad 5");
    outvoted(&n, &good, &mut p);
    let list = || Event::Checkpoints(Ok(vec![BlockNumber(4), BlockNumber(2)]));
    let restored = |c: usize| Event::Restored {
        checkpoint: BlockNumber(c as u64),
        base: good[c - 1].clone(),
    };
    let list_again = Command::ListCheckpoints {
        before: BlockNumber(5),
    };
    let restore = |c: u64, full: bool| Command::Restore {
        checkpoint: BlockNumber(c),
        full,
    };
    assert_eq!(p.handle(4, list()), vec![restore(4, false)]);
    assert!(matches!(
        &p.handle(5, restored(4))[..],
        [Command::Replay { .. }]
    ));
    // The replay gives the divergent block again: the same checkpoint, every row.
    assert_eq!(
        p.handle(6, replayed(bad.clone())),
        vec![recovering(5, 1), list_again.clone()]
    );
    assert_eq!(p.handle(7, list()), vec![restore(4, true)]);
    assert!(matches!(
        &p.handle(8, restored(4))[..],
        [Command::Replay { .. }]
    ));
    assert_eq!(
        p.handle(9, replayed(bad.clone())),
        vec![recovering(5, 2), list_again]
    );
    assert_eq!(p.handle(10, list()), vec![restore(2, false)]);
    assert_eq!(
        p.handle(11, restored(2)),
        vec![Command::Replay {
            from: Resume {
                block: BlockNumber(3),
                position: 20
            },
            through: BlockNumber(5),
            previous: good[1].hash(),
            agreed_before: BlockNumber(5),
        }]
    );
    let mut expected = append_cmd(&good[4], n.certificate(&[2, 3], &good[4]));
    expected.push(Command::Notice(Notice::RecoveryEnded(RecoverySummary {
        block: BlockNumber(5),
        checkpoint: Some(BlockNumber(2)),
        attempts: 3,
        replayed: 3,
    })));
    assert_eq!(p.handle(12, replayed(good[4].clone())), expected);
}

#[test]
fn with_no_checkpoint_left_the_agreed_state_is_transferred_from_a_peer() {
    let (n, good, mut p, _) = diverged("bad 5");
    p.set_peers(true);
    outvoted(&n, &good, &mut p);
    assert_eq!(
        p.handle(4, Event::Checkpoints(Ok(vec![]))),
        vec![Command::TransferState]
    );
    // A peer's state of block 6 (beyond the disagreement): adopted, the ledger goes on there.
    let six = n.lb(6, good[4].hash(), "good 6");
    assert_eq!(
        p.handle(5, Event::Transferred(six.clone())),
        vec![
            Command::CloseStream,
            Command::Notice(Notice::RecoveryEnded(RecoverySummary {
                block: BlockNumber(5),
                checkpoint: Some(BlockNumber(6)),
                attempts: 0,
                replayed: 0,
            })),
        ]
    );
    assert_eq!(p.next_block(), BlockNumber(7));
    assert!(p.is_clean());
    assert_eq!(
        p.handle(6, Event::Tick),
        vec![Command::OpenStream(Resume {
            block: BlockNumber(7),
            position: 60
        })]
    );
}

#[test]
fn an_equivocation_victim_transfers_an_older_state_and_replays_up_to_the_block() {
    let (n, good, mut p, _) = diverged("bad 5");
    p.set_peers(true);
    outvoted(&n, &good, &mut p);
    p.handle(4, Event::Checkpoints(Ok(vec![BlockNumber(4)])));
    p.handle(
        5,
        Event::Restored {
            checkpoint: BlockNumber(4),
            base: good[3].clone(),
        },
    );
    // The orderer gives this organization another block 5 than the others got.
    let problem = RecoveryError::Diverged {
        block: BlockNumber(5),
        got: Digest::of(b"x"),
        agreed: Digest::of(b"y"),
    };
    let reason = problem.to_string();
    assert_eq!(
        p.handle(6, Event::ReplayFailed(problem)),
        vec![
            Command::CloseStream,
            Command::Notice(Notice::CheckpointsFailed {
                block: BlockNumber(5),
                reason
            }),
            Command::TransferState,
        ]
    );
    // The peer's newest verified checkpoint is block 4: adopted, then block 5 replayed.
    assert_eq!(
        p.handle(7, Event::Transferred(good[3].clone())),
        vec![
            Command::Notice(Notice::RecoveryEnded(RecoverySummary {
                block: BlockNumber(5),
                checkpoint: Some(BlockNumber(4)),
                attempts: 1,
                replayed: 1,
            })),
            Command::Replay {
                from: Resume {
                    block: BlockNumber(5),
                    position: 40
                },
                through: BlockNumber(5),
                previous: good[3].hash(),
                agreed_before: BlockNumber(5),
            },
        ]
    );
    assert_eq!(
        p.handle(8, replayed(good[4].clone())),
        append_cmd(&good[4], n.certificate(&[2, 3], &good[4]))
    );
    assert!(p.is_clean());
}

#[test]
fn a_failing_state_transfer_is_retried_every_second_until_the_deadline_then_the_node_halts() {
    let (n, good, mut p, _) = diverged("bad 5");
    p.set_peers(true);
    outvoted(&n, &good, &mut p);
    assert_eq!(
        p.handle(1_000, Event::Checkpoints(Ok(vec![]))),
        vec![Command::TransferState]
    );
    let failed =
        || Event::TransferFailed(peer_failed(2, PeerError::Unavailable("unreachable".into())));
    let retry = Command::Notice(Notice::TransferRetry {
        block: BlockNumber(5),
        reason: "org2: unreachable".into(),
    });
    assert_eq!(p.handle(1_100, failed()), vec![retry.clone()]);
    assert_eq!(p.handle(2_099, Event::Tick), vec![]);
    assert_eq!(p.handle(2_100, Event::Tick), vec![Command::TransferState]);
    assert_eq!(p.handle(5_999, failed()), vec![retry]);
    assert_eq!(p.handle(6_999, Event::Tick), vec![Command::TransferState]);
    // Past the deadline (5 s after the first try).
    let reason = "no checkpoint before block #5 is left to try (0 tried); no state transfer recovers it: org2: unreachable";
    assert_eq!(
        p.handle(7_000, failed()),
        vec![Command::Commit(commit::Command::Alarm(format!(
            "block #5: recovery failed: {reason}"
        )))]
    );
    assert!(matches!(p.engine().state(), commit::State::Halted { .. }));
    assert!(!p.wants_block());
    assert_eq!(
        p.handle(8_000, Event::Tick),
        vec![],
        "a halted node does nothing"
    );
}

#[test]
fn without_peers_a_recovery_with_no_checkpoint_halts_at_once() {
    let (n, good, mut p, _) = diverged("bad 5");
    outvoted(&n, &good, &mut p);
    assert_eq!(
        p.handle(4, Event::Checkpoints(Ok(vec![]))),
        vec![Command::TransferState]
    );
    let out = p.handle(
        5,
        Event::TransferFailed(RecoveryError::Transfer(TransferError::NoPeers)),
    );
    assert!(
        matches!(&out[..], [Command::Commit(commit::Command::Alarm(a))] if a.contains("no other organization is reachable")),
        "{out:?}"
    );
}

#[test]
fn a_block_in_flight_when_a_recovery_starts_lands_first_and_its_result_is_void() {
    let (n, good, mut p, bad) = diverged("bad 5");
    // Block 6 executes on the divergent state.
    assert!(matches!(
        &p.handle(2, Event::Ordered(n.tb(6)))[..],
        [Command::Execute { .. }]
    ));
    p.handle(3, Event::Vote(n.vote(2, &good[4])));
    assert_eq!(
        p.handle(4, Event::Vote(n.vote(3, &good[4]))),
        vec![recovering(5, 0)],
        "no checkpoint is listed while block 6 may still change the database"
    );
    let six = n.lb(6, bad.hash(), "bad 6");
    assert_eq!(
        p.handle(5, executed(&six, true)),
        vec![Command::ListCheckpoints {
            before: BlockNumber(5)
        }],
        "neither a vote nor a prune for a block executed on a discarded state"
    );
}

#[test]
fn a_repair_at_a_clean_point_restores_the_newest_verified_checkpoint_and_replays() {
    let n = net(3, "any-2");
    let good = chain(&n, 6);
    let mut p = n.pipeline(1, Some(&good[3]));
    p.handle(0, Event::Tick);
    p.handle(0, Event::StreamOpened);
    p.handle(0, Event::Ordered(n.tb(5)));
    // The full scan with block 5 finds the tables differ from the state digest.
    p.handle(
        1,
        Event::Executed {
            ledger: good[4].clone(),
            checkpointed: false,
            repair_needed: true,
        },
    );
    assert!(
        !p.wants_block(),
        "no block is launched while a repair is pending"
    );
    p.handle(2, Event::Vote(n.vote(2, &good[4])));
    assert!(
        !p.is_clean(),
        "block 5 is agreed, but the tables differ from it: no reader until the repair"
    );
    assert_eq!(
        p.handle(3, Event::Tick),
        vec![
            Command::Notice(Notice::Repairing {
                agreed: BlockNumber(5)
            }),
            Command::ListCheckpoints {
                before: BlockNumber(6)
            },
        ]
    );
    let full = |c| Command::Restore {
        checkpoint: BlockNumber(c),
        full: true,
    };
    assert_eq!(
        p.handle(
            4,
            Event::Checkpoints(Ok(vec![BlockNumber(4), BlockNumber(2)]))
        ),
        vec![full(4)]
    );
    // Checkpoint 4's snapshots do not hold its agreed state either: the older one.
    assert_eq!(
        p.handle(
            5,
            Event::RestoreFailed {
                checkpoint: BlockNumber(4),
                error: snapshot_failed("tampered snapshot"),
            }
        ),
        vec![full(2)]
    );
    assert_eq!(
        p.handle(
            6,
            Event::Restored {
                checkpoint: BlockNumber(2),
                base: good[1].clone()
            }
        ),
        vec![Command::Replay {
            from: Resume {
                block: BlockNumber(3),
                position: 20
            },
            through: BlockNumber(5),
            previous: good[1].hash(),
            agreed_before: BlockNumber(6),
        }]
    );
    assert_eq!(
        p.handle(7, replayed(good[4].clone())),
        vec![Command::Notice(Notice::Repaired(Repaired::Checkpoint(
            BlockNumber(2)
        )))]
    );
    assert!(p.is_clean());
    assert_eq!(
        p.handle(8, Event::Ordered(n.tb(6))),
        vec![Command::Execute {
            block: n.tb(6),
            previous: good[4].hash(),
            checkpoint: true,
            state_check: false,
        }]
    );
}

/// A block that fails on a damaged record of applied blocks is not run again for ever: the
/// organization alarms, repairs from a checkpoint (which rewrites the record) and then runs
/// the block from a reopened stream; damage again at the same block waits before the next
/// repair.
#[test]
fn damage_to_the_record_of_applied_blocks_is_repaired_not_retried() {
    let n = net(3, "any-2");
    let good = chain(&n, 5);
    let mut p = n.pipeline(1, Some(&good[3]));
    let from = Resume {
        block: BlockNumber(5),
        position: good[3].orderer_position,
    };
    let execute = Command::Execute {
        block: n.tb(5),
        previous: good[3].hash(),
        checkpoint: false,
        state_check: true,
    };
    assert_eq!(p.handle(0, Event::Tick), vec![Command::OpenStream(from)]);
    p.handle(0, Event::StreamOpened);
    assert_eq!(p.handle(0, Event::Ordered(n.tb(5))), vec![execute.clone()]);
    let damaged = |at| Event::ExecutionFailed {
        block: n.tb(5),
        damage: Some(format!(
            "block #5: chainify_state holds a bad accumulator ({at})"
        )),
    };
    assert_eq!(
        p.handle(10, damaged(1)),
        vec![
            Command::Commit(commit::Command::Alarm(
                "block #5: chainify_state holds a bad accumulator (1): repairing the tables \
                 from a checkpoint instead of running block #5 again"
                    .into()
            )),
            Command::CloseStream,
        ]
    );
    assert!(!p.wants_block() && !p.is_clean());
    assert_eq!(
        p.handle(11, Event::Tick),
        vec![
            Command::Notice(Notice::Repairing {
                agreed: BlockNumber(4)
            }),
            Command::ListCheckpoints {
                before: BlockNumber(5)
            },
        ],
        "no attempt at the block first"
    );
    assert_eq!(
        p.handle(12, Event::Checkpoints(Ok(vec![BlockNumber(4)]))),
        vec![Command::Restore {
            checkpoint: BlockNumber(4),
            full: true,
        }]
    );
    assert_eq!(
        p.handle(
            13,
            Event::Restored {
                checkpoint: BlockNumber(4),
                base: good[3].clone()
            }
        ),
        vec![Command::Notice(Notice::Repaired(Repaired::Checkpoint(
            BlockNumber(4)
        )))]
    );
    assert_eq!(p.handle(500, Event::Tick), vec![Command::OpenStream(from)]);
    p.handle(500, Event::StreamOpened);
    assert_eq!(p.handle(500, Event::Ordered(n.tb(5))), vec![execute]);
    // Damage again at the same block: the restore did not reach it. The next repair waits,
    // then takes another organization's state instead.
    p.handle(510, damaged(2));
    assert_eq!(p.handle(511, Event::Tick), vec![]);
    let by_transfer = vec![
        Command::Notice(Notice::Repairing {
            agreed: BlockNumber(4),
        }),
        Command::Notice(Notice::NoCheckpointRepairs {
            reason:
                "a checkpoint restored did not repair block #5's damage (block #5: chainify_state \
                     holds a bad accumulator (2))"
                    .into(),
        }),
        Command::TransferState,
    ];
    assert_eq!(
        p.handle(510 + recovery::REPAIR_RETRY_MS, Event::Tick),
        by_transfer
    );
    // No organization has a state to give: alarm, and a transfer again later, not a restore.
    let at = 520 + recovery::REPAIR_RETRY_MS;
    let out = p.handle(
        at,
        Event::TransferFailed(peer_failed(2, PeerError::NoOffer)),
    );
    assert!(
        matches!(&out[..], [Command::Commit(commit::Command::Alarm(_))]),
        "{out:?}"
    );
    assert_eq!(
        p.handle(at + recovery::REPAIR_RETRY_MS, Event::Tick),
        by_transfer
    );
}

#[test]
fn a_repair_no_checkpoint_or_transfer_can_do_raises_an_alarm_naming_both() {
    let n = net(3, "any-2");
    let good = chain(&n, 5);
    let mut p = n.pipeline(1, Some(&good[3]));
    p.set_peers(true);
    p.handle(0, Event::Tick);
    p.handle(0, Event::StreamOpened);
    p.handle(0, Event::Ordered(n.tb(5)));
    p.handle(
        1,
        Event::Executed {
            ledger: good[4].clone(),
            checkpointed: false,
            repair_needed: true,
        },
    );
    p.handle(2, Event::Vote(n.vote(2, &good[4])));
    p.handle(3, Event::Tick);
    let local = "no checkpoint at or before block #5";
    assert_eq!(
        p.handle(4, Event::Checkpoints(Ok(vec![]))),
        vec![
            Command::Notice(Notice::NoCheckpointRepairs {
                reason: local.into()
            }),
            Command::TransferState
        ]
    );
    assert_eq!(
        p.handle(5, Event::TransferFailed(peer_failed(2, PeerError::NoOffer))),
        vec![Command::Commit(commit::Command::Alarm(format!(
            "the tables differ from the agreed state; no checkpoint repairs them ({local}) and no state transfer did (org2: no checkpoint to offer)"
        )))]
    );
    assert!(
        !p.is_clean(),
        "the tables still differ: no reader is let in"
    );
    assert!(!p.wants_block(), "no block executes on them");
}

#[test]
fn an_empty_ledger_joins_from_a_peer_and_follows_the_orderer_from_the_adopted_block() {
    let n = net(3, "any-2");
    let good = chain(&n, 7);
    let mut p = n.pipeline(3, None);
    p.set_peers(true);
    assert_eq!(p.handle(0, Event::Tick), vec![Command::TransferState]);
    assert!(!p.wants_block());
    assert_eq!(
        p.handle(1, Event::Transferred(good[6].clone())),
        vec![Command::Notice(Notice::Joined(BlockNumber(7)))]
    );
    assert_eq!(p.next_block(), BlockNumber(8));
    assert_eq!(
        p.handle(2, Event::Tick),
        vec![Command::OpenStream(Resume {
            block: BlockNumber(8),
            position: 70
        })]
    );
    p.handle(2, Event::StreamOpened);
    assert_eq!(
        p.handle(3, Event::Ordered(n.tb(8))),
        vec![Command::Execute {
            block: n.tb(8),
            previous: good[6].hash(),
            checkpoint: true,
            state_check: true,
        }]
    );
}

#[test]
fn without_a_state_to_join_from_the_node_replays_from_block_one() {
    let n = net(3, "any-2");
    let mut p = n.pipeline(3, None);
    p.set_peers(true);
    assert_eq!(p.handle(0, Event::Tick), vec![Command::TransferState]);
    assert_eq!(
        p.handle(1, Event::TransferFailed(peer_failed(1, PeerError::NoOffer))),
        vec![Command::Notice(Notice::NoJoin(
            "org1: no checkpoint to offer".into()
        ))]
    );
    assert_eq!(
        p.handle(2, Event::Tick),
        vec![Command::OpenStream(Resume::START)]
    );
    // Once only.
    p.handle(2, Event::StreamOpened);
    assert!(p.wants_block());
}

#[test]
fn a_halted_organization_is_never_clean_so_readers_stay_out() {
    let (n, good, mut p, _) = diverged("bad 5");
    outvoted(&n, &good, &mut p);
    p.handle(4, Event::Checkpoints(Ok(vec![])));
    p.handle(
        5,
        Event::TransferFailed(RecoveryError::Transfer(TransferError::NoPeers)),
    );
    assert!(matches!(p.engine().state(), commit::State::Halted { .. }));
    assert!(
        !p.is_clean(),
        "the database holds block 5 as this organization computed it, which nobody agreed on"
    );
}

#[test]
fn a_restore_that_fails_during_a_recovery_falls_back_to_a_state_transfer() {
    let (n, good, mut p, _) = diverged("bad 5");
    outvoted(&n, &good, &mut p);
    p.handle(4, Event::Checkpoints(Ok(vec![BlockNumber(4)])));
    let error = snapshot_failed("snapshot unreadable");
    assert_eq!(
        p.handle(
            5,
            Event::RestoreFailed {
                checkpoint: BlockNumber(4),
                error
            }
        ),
        vec![
            Command::Notice(Notice::CheckpointsFailed {
                block: BlockNumber(5),
                reason: "checkpoint: snapshot unreadable".into()
            }),
            Command::TransferState
        ]
    );
}

#[test]
fn a_recovery_that_adopts_twice_is_reported_once() {
    let (n, good, mut p, _) = diverged("bad 5");
    p.set_peers(true);
    outvoted(&n, &good, &mut p);
    p.handle(4, Event::Checkpoints(Ok(vec![])));
    // An older state first; the replay from it cannot give the agreed block 5.
    let out = p.handle(5, Event::Transferred(good[3].clone()));
    assert!(matches!(
        &out[..],
        [
            Command::CloseStream,
            Command::Notice(Notice::RecoveryEnded(_)),
            Command::Replay { .. }
        ]
    ));
    assert_eq!(
        p.handle(6, Event::ReplayFailed(RecoveryError::NothingToReplay)),
        vec![Command::Notice(Notice::TransferRetry {
            block: BlockNumber(5),
            reason: "nothing to replay".into()
        })]
    );
    assert_eq!(p.handle(1_006, Event::Tick), vec![Command::TransferState]);
    // Then a state at block 5: adopted, reported no second time.
    assert_eq!(p.handle(1_007, Event::Transferred(good[4].clone())), vec![]);
    assert_eq!(p.next_block(), BlockNumber(6));
    assert!(p.is_clean());
}

#[test]
fn a_failed_execution_of_the_block_in_flight_lets_the_recovery_go_on() {
    let (n, good, mut p, _) = diverged("bad 5");
    p.handle(2, Event::Ordered(n.tb(6)));
    p.handle(3, Event::Vote(n.vote(2, &good[4])));
    p.handle(4, Event::Vote(n.vote(3, &good[4])));
    assert!(p.discards_flight());
    assert_eq!(
        p.handle(
            5,
            Event::ExecutionFailed {
                block: n.tb(6),
                damage: None
            }
        ),
        vec![Command::ListCheckpoints {
            before: BlockNumber(5)
        }]
    );
    assert_eq!(
        p.failed_attempts(),
        0,
        "no retry of a block on a discarded state"
    );
}

/// Organization 1 with blocks 1..=5 agreed, a full scan with block 5 having found the tables
/// different, and the repair started.
fn repairing() -> (Net, Vec<LedgerBlock>, Pipeline) {
    let n = net(3, "any-2");
    let good = chain(&n, 6);
    let mut p = n.pipeline(1, Some(&good[3]));
    p.set_peers(true);
    p.handle(0, Event::Tick);
    p.handle(0, Event::StreamOpened);
    p.handle(0, Event::Ordered(n.tb(5)));
    p.handle(
        1,
        Event::Executed {
            ledger: good[4].clone(),
            checkpointed: false,
            repair_needed: true,
        },
    );
    p.handle(2, Event::Vote(n.vote(2, &good[4])));
    assert!(matches!(
        &p.handle(3, Event::Tick)[..],
        [
            Command::Notice(Notice::Repairing { .. }),
            Command::ListCheckpoints { .. }
        ]
    ));
    (n, good, p)
}

#[test]
fn a_repair_by_transfer_replays_from_an_older_adopted_state() {
    let (_, good, mut p) = repairing();
    p.handle(4, Event::Checkpoints(Ok(vec![])));
    assert_eq!(
        p.handle(5, Event::Transferred(good[2].clone())),
        vec![
            Command::CloseStream,
            Command::Replay {
                from: Resume {
                    block: BlockNumber(4),
                    position: 30
                },
                through: BlockNumber(5),
                previous: good[2].hash(),
                agreed_before: BlockNumber(6),
            }
        ]
    );
    assert_eq!(
        p.handle(6, replayed(good[4].clone())),
        vec![Command::Notice(Notice::Repaired(Repaired::Transfer(
            BlockNumber(3)
        )))]
    );
    assert!(p.is_clean());
}

#[test]
fn a_failed_repair_alarms_and_is_tried_again_before_anything_executes() {
    let (n, good, mut p) = repairing();
    p.handle(4, Event::Checkpoints(Ok(vec![BlockNumber(4)])));
    p.handle(
        5,
        Event::Restored {
            checkpoint: BlockNumber(4),
            base: good[3].clone(),
        },
    );
    assert_eq!(
        p.handle(
            6,
            Event::ReplayFailed(RecoveryError::NotDelivered(BlockNumber(5)))
        ),
        vec![
            Command::CloseStream,
            Command::Notice(Notice::NoCheckpointRepairs {
                reason: "the orderer did not deliver block #5 for the replay".into()
            }),
            Command::TransferState
        ]
    );
    let out = p.handle(
        7,
        Event::TransferFailed(RecoveryError::Transfer(TransferError::NoPeers)),
    );
    assert!(
        matches!(&out[..], [Command::Commit(commit::Command::Alarm(_))]),
        "{out:?}"
    );
    // The database holds checkpoint 4, not the agreed block 5: nothing executes on it and no
    // reader is let in until a repair succeeds.
    assert!(!p.is_clean());
    let streams_and_repairs = |out: Vec<Command>| -> Vec<Command> {
        out.into_iter()
            .filter(|c| {
                matches!(
                    c,
                    Command::Execute { .. }
                        | Command::ListCheckpoints { .. }
                        | Command::Notice(Notice::Repairing { .. })
                )
            })
            .collect()
    };
    assert_eq!(streams_and_repairs(p.handle(5_006, Event::Tick)), vec![]);
    p.handle(5_006, Event::StreamOpened);
    assert!(!p.wants_block());
    assert_eq!(
        streams_and_repairs(p.handle(5_007, Event::Tick)),
        vec![
            Command::Notice(Notice::Repairing {
                agreed: BlockNumber(5)
            }),
            Command::ListCheckpoints {
                before: BlockNumber(6)
            },
        ]
    );
    p.handle(5_008, Event::Checkpoints(Ok(vec![BlockNumber(4)])));
    p.handle(
        5_009,
        Event::Restored {
            checkpoint: BlockNumber(4),
            base: good[3].clone(),
        },
    );
    assert_eq!(
        p.handle(5_010, replayed(good[4].clone())),
        vec![Command::Notice(Notice::Repaired(Repaired::Checkpoint(
            BlockNumber(4)
        )))]
    );
    assert!(p.is_clean());
    assert_eq!(
        p.handle(5_011, Event::Ordered(n.tb(6))),
        vec![Command::Execute {
            block: n.tb(6),
            previous: good[4].hash(),
            checkpoint: true,
            state_check: false,
        }]
    );
}
