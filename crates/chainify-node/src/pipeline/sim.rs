//! N organizations' pipelines in one simulated network: votes and certificates dropped,
//! duplicated and reordered at random, executions failing at random, full scans finding the
//! tables changed at random (a repair follows), and one organization that computes a wrong block
//! (once, or every time it executes it) and whose listing, restores and replays also fail at
//! random. The orderer's stream fails to open and breaks at random, and blocks execute up to
//! `pipeline_depth` (1 to 3) ahead of their agreement. (An equivocating orderer's victim is an
//! organization that cannot compute the agreed block: the always-wrong fault.) Each database is
//! a model: a state hash, checkpoints, and the check that every block executes on the state
//! right before it. The property: no two organizations ever append different blocks at the same height,
//! every ledger chains, and the honest organizations append every block.

use std::collections::{BTreeMap, VecDeque};

use chainify_core::crypto::Signatures;
use chainify_core::tx::{Certificate, LedgerBlock, TransactionBlock, Vote};
use chainify_core::{BlockNumber, Digest};
use proptest::prelude::*;

use super::tests::{Blocks, Net, net_with};
use super::*;
use crate::transfer::TransferError;
use chainify_storage::StorageError;

/// Blocks the orderer delivers.
const BLOCKS: u64 = 12;
const TICK_MS: u64 = 50;

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The first execution of this block is wrong (a transient engine fault).
    Once(u64),
    /// Every execution of this block is wrong here (this organization cannot compute it).
    Always(u64),
}

#[derive(Debug)]
enum Message {
    Vote(Vote),
    Certificate(Certificate),
    CertificateRequest { from: usize, block: BlockNumber },
}

struct Org {
    pipeline: Pipeline,
    fault: Option<Fault>,
    /// The model database: the state after block `applied`.
    state: Digest,
    applied: u64,
    checkpoints: BTreeMap<u64, Digest>,
    /// The state after each block as last executed here.
    states: BTreeMap<u64, Digest>,
    executions: BTreeMap<u64, u32>,
    ledger: Vec<(LedgerBlock, Certificate)>,
    in_flight: Option<(TransactionBlock, Digest, bool)>,
    /// The next block the open stream delivers.
    stream_at: Option<u64>,
    /// A state transfer asked for and not yet carried out (it takes time: peers move on).
    transferring: bool,
    restores: u32,
    transfers: u32,
    /// The record of applied blocks is damaged: every execution fails naming it until a
    /// restore or a transfer rewrites it.
    damaged: bool,
    damages: u32,
    now: u64,
    alarms: Vec<String>,
}

impl Org {
    /// Executes `block` on the model database, which must hold the block before it.
    fn execute(&mut self, n: &Net, me: usize, block: u64, previous: Digest) -> LedgerBlock {
        assert_eq!(
            self.applied + 1,
            block,
            "organization {me} executes block {block} on the state of block {}",
            self.applied
        );
        let count = self.executions.entry(block).or_default();
        *count += 1;
        let wrong = match self.fault {
            Some(Fault::Once(b)) => b == block && *count == 1,
            Some(Fault::Always(b)) => b == block,
            None => false,
        };
        let effect = if wrong {
            format!("wrong {block} at {me}")
        } else {
            format!("block {block}")
        };
        self.state = Digest::of(format!("{} {effect}", self.state).as_bytes());
        self.applied = block;
        self.states.insert(block, self.state);
        LedgerBlock {
            state_digest: self.state,
            ..n.lb(block, previous, &effect)
        }
    }
}

struct Sim {
    n: Net,
    orgs: Vec<Org>,
    network: Vec<(usize, Message)>,
    /// The hash appended at each height by whoever appended it first.
    appended: Vec<Digest>,
    rng: u64,
    /// Whether streams break and fail to open.
    stream_faults: bool,
    stream_breaks: u32,
    failed_opens: u32,
}

impl Sim {
    fn random(&mut self, bound: u64) -> u64 {
        // SplitMix64: the whole run follows from the proptest's seed.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % bound
    }

    fn feed(&mut self, i: usize, event: Event) {
        let now = self.orgs[i].now;
        let mut todo = VecDeque::from(self.orgs[i].pipeline.handle(now, event));
        while let Some(command) = todo.pop_front() {
            if let Some(result) = self.carry_out(i, command) {
                let more = self.orgs[i].pipeline.handle(now, result);
                for c in more.into_iter().rev() {
                    todo.push_front(c);
                }
            }
        }
    }

    fn send(&mut self, from: usize, message: impl Fn() -> Message) {
        for to in 0..self.orgs.len() {
            if to != from {
                self.network.push((to, message()));
            }
        }
    }

    fn carry_out(&mut self, i: usize, command: Command) -> Option<Event> {
        // The faulty organization's database and orderer also fail now and then.
        let unlucky = self.orgs[i].fault.is_some() && self.random(100) < 6;
        // Any organization's orderer may be unreachable when it opens its stream.
        if self.stream_faults && matches!(command, Command::OpenStream(_)) && self.random(100) < 5 {
            self.failed_opens += 1;
            return Some(Event::StreamFailed);
        }
        let n = &self.n;
        let org = &mut self.orgs[i];
        match command {
            Command::Commit(c) => match c {
                commit::Command::SendVote(v) => self.send(i, || Message::Vote(v.clone())),
                commit::Command::Append { block, certificate } => {
                    let height = block.number.0;
                    assert_eq!(height, org.ledger.len() as u64 + 1, "appends in order");
                    let previous = org.ledger.last().map_or(Digest::ZERO, |(b, _)| b.hash());
                    assert_eq!(block.hash_previous, previous, "the ledger chains");
                    assert_eq!(certificate.ledger_block_hash, block.hash());
                    match self.appended.get(height as usize - 1) {
                        Some(first) => assert_eq!(
                            *first,
                            block.hash(),
                            "organization {i} appends another block {height} than another organization"
                        ),
                        None => self.appended.push(block.hash()),
                    }
                    org.ledger.push((block, certificate));
                }
                commit::Command::FetchCertificate(block) => {
                    self.send(i, || Message::CertificateRequest { from: i, block })
                }
                commit::Command::SendCertificate { to, block } => {
                    if let Some((_, c)) = org.ledger.get(block.0 as usize - 1) {
                        self.network
                            .push((to.0 as usize - 1, Message::Certificate(c.clone())));
                    }
                }
                commit::Command::Alarm(a) => org.alarms.push(a),
                commit::Command::StartRecovery { .. } => {
                    panic!("the pipeline carries recoveries out")
                }
                commit::Command::Notify(_)
                | commit::Command::RejectVote(_)
                | commit::Command::RejectCertificate(_) => {}
            },
            Command::OpenStream(resume) => {
                org.stream_at = Some(resume.block.0);
                return Some(Event::StreamOpened);
            }
            Command::CloseStream => org.stream_at = None,
            Command::Execute {
                block,
                previous,
                checkpoint,
                ..
            } => {
                assert!(org.in_flight.is_none(), "one block in flight");
                org.in_flight = Some((block, previous, checkpoint));
            }
            Command::Prune { .. } | Command::Notice(_) => {}
            Command::ListCheckpoints { .. } if unlucky => {
                return Some(Event::Checkpoints(Err(RecoveryError::from(
                    StorageError::Query("simulated: the database is unreachable".into()),
                ))));
            }
            Command::Restore { checkpoint, .. } if unlucky => {
                return Some(Event::RestoreFailed {
                    checkpoint,
                    error: RecoveryError::from(StorageError::Checkpoint(
                        "simulated: a snapshot is unreadable".into(),
                    )),
                });
            }
            Command::Replay { from, .. } if unlucky => {
                return Some(Event::ReplayFailed(RecoveryError::NotDelivered(from.block)));
            }
            Command::ListCheckpoints { before } => {
                let list = org
                    .checkpoints
                    .keys()
                    .rev()
                    .filter(|c| **c < before.0)
                    .map(|c| BlockNumber(*c))
                    .collect();
                return Some(Event::Checkpoints(Ok(list)));
            }
            Command::Restore { checkpoint, .. } => {
                let c = checkpoint.0;
                assert!(
                    org.in_flight.is_none(),
                    "no restore under a block in flight"
                );
                let state = org.checkpoints[&c];
                let (base, _) = org.ledger[c as usize - 1].clone();
                assert_eq!(
                    base.state_digest, state,
                    "checkpoints before the block are agreed"
                );
                org.state = state;
                org.applied = c;
                org.checkpoints.retain(|k, _| *k <= c);
                org.restores += 1;
                org.damaged = false;
                return Some(Event::Restored { checkpoint, base });
            }
            Command::Replay {
                from,
                through,
                previous,
                agreed_before,
            } => {
                assert!(org.in_flight.is_none(), "no replay under a block in flight");
                let mut previous = previous;
                let mut last = None;
                for b in from.block.0..=through.0 {
                    let done = org.execute(n, i + 1, b, previous);
                    if b < agreed_before.0 && org.ledger[b as usize - 1].0.hash() != done.hash() {
                        return Some(Event::ReplayFailed(RecoveryError::Diverged {
                            block: BlockNumber(b),
                            got: done.hash(),
                            agreed: org.ledger[b as usize - 1].0.hash(),
                        }));
                    }
                    previous = done.hash();
                    last = Some(done);
                }
                org.stream_at = Some(through.0 + 1);
                return Some(Event::Replayed {
                    last: last.expect("a range"),
                    repair_needed: false,
                });
            }
            Command::TransferState => org.transferring = true,
        }
        None
    }

    /// Adopts the newest agreed state of another organization whose ledger extends ours.
    fn transfer(&mut self, i: usize) -> Event {
        let own = self.orgs[i].ledger.len();
        let best = (0..self.orgs.len())
            .filter(|p| *p != i)
            .filter(|p| {
                let peer = &self.orgs[*p].ledger;
                peer.len() >= own.max(1)
                    && (own == 0 || peer[own - 1].0.hash() == self.orgs[i].ledger[own - 1].0.hash())
            })
            .max_by_key(|p| self.orgs[*p].ledger.len());
        let Some(p) = best else {
            return Event::TransferFailed(RecoveryError::Transfer(TransferError::NoPeers));
        };
        let height = self.orgs[p].ledger.len();
        let entries = self.orgs[p].ledger[own..height].to_vec();
        let state = self.orgs[p].states[&(height as u64)];
        let (block, _) = self.orgs[p].ledger[height - 1].clone();
        assert_eq!(block.state_digest, state);
        let org = &mut self.orgs[i];
        assert!(
            org.in_flight.is_none(),
            "no transfer under a block in flight"
        );
        org.ledger.extend(entries);
        // Checkpoints of blocks not agreed before the transfer were taken on the state given
        // up (the store forgets them on adoption).
        org.checkpoints.retain(|k, _| *k <= own as u64);
        org.state = state;
        org.applied = height as u64;
        org.states.insert(height as u64, state);
        org.checkpoints.insert(height as u64, state);
        org.stream_at = None;
        org.transfers += 1;
        org.damaged = false;
        Event::Transferred(block)
    }

    fn step(&mut self, drop_percent: u64, dup_percent: u64) {
        let orgs = self.orgs.len() as u64;
        // Now and then an organization's stream from the orderer breaks.
        if self.stream_faults && self.random(100) == 0 {
            let i = self.random(orgs) as usize;
            if self.orgs[i].stream_at.take().is_some() {
                self.stream_breaks += 1;
                self.feed(i, Event::StreamBroken);
            }
            return;
        }
        match self.random(10) {
            0..=3 if !self.network.is_empty() => {
                let k = self.random(self.network.len() as u64) as usize;
                let (to, message) = if self.random(100) < dup_percent {
                    let (to, m) = &self.network[k];
                    let copy = match m {
                        Message::Vote(v) => Message::Vote(v.clone()),
                        Message::Certificate(c) => Message::Certificate(c.clone()),
                        Message::CertificateRequest { from, block } => {
                            Message::CertificateRequest {
                                from: *from,
                                block: *block,
                            }
                        }
                    };
                    (*to, copy)
                } else {
                    self.network.swap_remove(k)
                };
                if self.random(100) < drop_percent {
                    return;
                }
                match message {
                    Message::Vote(v) => self.feed(to, Event::Vote(v)),
                    Message::Certificate(c) => self.feed(to, Event::Certificate(c)),
                    Message::CertificateRequest { from, block } => {
                        if let Some((_, c)) = self.orgs[to].ledger.get(block.0 as usize - 1) {
                            self.network.push((from, Message::Certificate(c.clone())));
                        }
                    }
                }
            }
            4..=5 => {
                let i = self.random(orgs) as usize;
                self.orgs[i].now += TICK_MS;
                self.feed(i, Event::Tick);
            }
            6..=7 => {
                let i = self.random(orgs) as usize;
                if std::mem::take(&mut self.orgs[i].transferring) {
                    let done = self.transfer(i);
                    self.feed(i, done);
                    return;
                }
                let Some((block, previous, checkpoint)) = self.orgs[i].in_flight.take() else {
                    return;
                };
                // Now and then a DBA damages the record of applied blocks of an organization
                // that has a checkpoint to repair from; it stays until a restore or a transfer.
                let failure = self.random(100);
                if failure < 2 && self.orgs[i].ledger.len() >= 2 {
                    self.orgs[i].damaged = true;
                    self.orgs[i].damages += 1;
                }
                if self.orgs[i].damaged || failure < 5 {
                    let damage = self.orgs[i].damaged.then(|| DAMAGE.into());
                    self.feed(i, Event::ExecutionFailed { block, damage });
                    return;
                }
                // A full scan finds the tables changed behind the triggers: repair.
                let repair_needed = self.random(100) < 3;
                let n = &self.n;
                let org = &mut self.orgs[i];
                let ledger = org.execute(n, i + 1, block.number.0, previous);
                if checkpoint {
                    org.checkpoints.insert(block.number.0, org.state);
                }
                self.feed(
                    i,
                    Event::Executed {
                        ledger,
                        checkpointed: checkpoint,
                        repair_needed,
                    },
                );
            }
            _ => {
                let i = self.random(orgs) as usize;
                let org = &mut self.orgs[i];
                let Some(at) = org.stream_at else { return };
                if at > BLOCKS || !org.pipeline.wants_block() {
                    return;
                }
                org.stream_at = Some(at + 1);
                let block = self.n.tb(at);
                self.feed(i, Event::Ordered(block));
            }
        }
    }
}

/// How a simulated network runs.
#[derive(Clone, Copy, Debug)]
struct Setup {
    orgs: u32,
    faulty: u32,
    fault: Fault,
    seed: u64,
    drop_percent: u64,
    dup_percent: u64,
    depth: u64,
    stream_faults: bool,
}

impl Setup {
    /// Organization `faulty` of `orgs` has `fault`; 10 % of messages dropped and 10 %
    /// duplicated; one block executed ahead of agreement; streams that never fail.
    fn new(orgs: u32, faulty: u32, fault: Fault, seed: u64) -> Setup {
        Setup {
            orgs,
            faulty,
            fault,
            seed,
            drop_percent: 10,
            dup_percent: 10,
            depth: 1,
            stream_faults: false,
        }
    }
}

/// What a simulated damaged record of applied blocks reports.
const DAMAGE: &str = "chainify_state holds a bad accumulator";

fn run(setup: Setup) -> Sim {
    let Setup {
        orgs,
        faulty,
        fault,
        seed,
        drop_percent,
        dup_percent,
        depth,
        stream_faults,
    } = setup;
    let policy = format!("any-{}", orgs / 2 + 1);
    let n = net_with(orgs, &policy, Signatures::Off);
    let schedule = Schedule {
        pipeline_depth: depth,
        ..super::tests::SCHEDULE
    };
    let mut sim = Sim {
        orgs: (1..=orgs)
            .map(|o| {
                let mut pipeline = n.pipeline_with(o, None, schedule);
                pipeline.set_peers(true);
                Org {
                    pipeline,
                    fault: (o == faulty).then_some(fault),
                    state: Digest::ZERO,
                    applied: 0,
                    checkpoints: BTreeMap::new(),
                    states: BTreeMap::new(),
                    executions: BTreeMap::new(),
                    ledger: Vec::new(),
                    in_flight: None,
                    stream_at: None,
                    transferring: false,
                    restores: 0,
                    transfers: 0,
                    damaged: false,
                    damages: 0,
                    now: 0,
                    alarms: Vec::new(),
                }
            })
            .collect(),
        n,
        network: Vec::new(),
        appended: Vec::new(),
        rng: seed,
        stream_faults,
        stream_breaks: 0,
        failed_opens: 0,
    };
    let honest_done = |sim: &Sim| {
        sim.orgs
            .iter()
            .enumerate()
            .all(|(i, o)| i as u32 + 1 == faulty || o.ledger.len() as u64 == BLOCKS)
    };
    let mut steps = 0;
    while !honest_done(&sim) {
        steps += 1;
        assert!(
            steps < 400_000,
            "no progress: ledgers {:?}, states {:?}",
            sim.orgs.iter().map(|o| o.ledger.len()).collect::<Vec<_>>(),
            sim.orgs
                .iter()
                .map(|o| o.pipeline.engine().state().clone())
                .collect::<Vec<_>>()
        );
        sim.step(drop_percent, dup_percent);
    }
    for (i, org) in sim.orgs.iter().enumerate() {
        // Every ledger chains (checked at each append) and is a prefix of the agreed chain.
        for (h, (block, _)) in org.ledger.iter().enumerate() {
            assert_eq!(block.hash(), sim.appended[h], "organization {}", i + 1);
        }
        if i as u32 + 1 != faulty {
            // Only the damage the simulation injects, each named and repaired.
            let unexpected: Vec<_> = org
                .alarms
                .iter()
                .filter(|a| !a.starts_with(DAMAGE))
                .collect();
            assert!(unexpected.is_empty(), "honest {}: {:?}", i + 1, unexpected);
        }
    }
    sim
}

proptest! {
    // PROPTEST_CASES=… for a longer run.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_two_organizations_append_different_blocks_at_one_height(
        orgs in 3u32..=5,
        faulty in 1u32..=5,
        always in any::<bool>(),
        block in 1u64..=BLOCKS,
        seed in any::<u64>(),
        drop_percent in 0u64..=30,
        dup_percent in 0u64..=30,
        depth in 1u64..=3,
        stream_faults in any::<bool>(),
    ) {
        let faulty = (faulty - 1) % orgs + 1;
        let fault = if always { Fault::Always(block) } else { Fault::Once(block) };
        let sim = run(Setup {
            orgs, faulty, fault, seed, drop_percent, dup_percent, depth, stream_faults,
        });
        // Some honest organizations may have appended first and told the others by
        // certificate; every one holds the whole chain.
        prop_assert_eq!(sim.appended.len() as u64, BLOCKS);
    }
}

#[test]
fn the_simulation_exercises_recovery_and_transfer() {
    // A fixed run whose faulty organization must recover (once wrong) and one whose faulty
    // organization cannot compute a block (always wrong) and takes a peer's state.
    let once = run(Setup::new(3, 2, Fault::Once(3), 7));
    assert!(
        once.orgs[1].restores > 0,
        "the faulty organization restored a checkpoint"
    );
    let always = run(Setup {
        drop_percent: 20,
        dup_percent: 5,
        ..Setup::new(4, 1, Fault::Always(5), 11)
    });
    let faulty = &always.orgs[0];
    assert!(
        faulty.transfers > 0,
        "the faulty organization took a peer's state"
    );
    assert!(
        faulty.alarms.iter().all(|a| a.starts_with(DAMAGE)),
        "{:?}",
        faulty.alarms
    );
}

#[test]
fn damaged_records_of_applied_blocks_are_repaired_and_the_chain_completes() {
    let mut damaged = 0;
    for seed in 0..40 {
        let sim = run(Setup::new(4, 1, Fault::Once(3), seed));
        assert_eq!(sim.appended.len() as u64, BLOCKS, "seed {seed}");
        for org in sim.orgs.iter().filter(|o| o.damages > 0) {
            damaged += 1;
            assert!(!org.damaged, "seed {seed}: damage left unrepaired");
            assert!(org.restores + org.transfers > 0, "seed {seed}");
        }
    }
    assert!(damaged > 0, "no run damaged an organization");
}

#[test]
fn the_cases_proptest_found_still_hold() {
    // The two failures proptest shrank to (proptest-regressions/pipeline/sim.txt), at the
    // setup they were found with: its saved seeds now also draw the depth and stream faults.
    for (orgs, faulty, block, seed, drop_percent, dup_percent) in [
        (5, 1, 6, 13_911_920_255_490_103_419, 24, 6),
        (3, 2, 1, 14_376_327_198_572_666_388, 1, 18),
    ] {
        let sim = run(Setup {
            drop_percent,
            dup_percent,
            ..Setup::new(orgs, faulty, Fault::Once(block), seed)
        });
        assert_eq!(sim.appended.len() as u64, BLOCKS);
    }
}

#[test]
fn streams_break_and_fail_to_open_and_blocks_run_three_ahead_without_a_fork() {
    let sim = run(Setup {
        depth: 3,
        stream_faults: true,
        ..Setup::new(4, 3, Fault::Once(7), 5)
    });
    assert_eq!(sim.appended.len() as u64, BLOCKS);
    assert!(sim.stream_breaks > 0, "no stream broke");
    assert!(sim.failed_opens > 0, "no stream failed to open");
}
