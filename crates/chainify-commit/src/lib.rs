//! chainify-commit: the CommitServer's voting engine (docs/design/overview.md §2.4–2.5), sans I/O.
//!
//! [`CommitEngine::handle`] takes one [`Event`] (a block executed locally, a vote or certificate
//! from a peer, a recovery finished, a clock tick) and returns the [`Command`]s the runtime must
//! carry out (send a vote, append to the ledger, notify clients, fetch a certificate, start a
//! recovery, raise an alarm). No clocks, sockets or databases: the same inputs always give the
//! same commands, which the tests assert exactly.
//!
//! Rules:
//! - A block is appended only with a certificate (signed votes satisfying the agreement policy)
//!   for exactly the local LedgerBlock's hash, and only right after its predecessor. Nothing else
//!   is ever appended.
//! - Blocks may execute ahead (pipelining), but the vote on block b+1 is sent only once b is
//!   appended: a vote cast on a state that later turns out divergent would otherwise make an honest
//!   organization look like an equivocator after its recovery.
//! - An agreed hash that differs from the local one starts a recovery of that block (restore the
//!   newest checkpoint at or before it, replay, re-digest); a still different result tries an older
//!   checkpoint; when none is left the engine halts with an alarm.
//! - When no combination of the policy can agree any more, the organization raises an alarm and
//!   recovers the block; the network waits (nothing is appended) until an operator intervenes.
//! - Forged, misdirected, duplicate and equivocating votes are rejected with their reason (the
//!   runtime logs them) and never counted.
//!
//! Where it sits: pure, above `chainify-core` only. `chainify-node`'s pipeline wraps the engine
//! and carries out its commands; `chainify-net` reports its [`State`] in the AdminService.

use std::collections::BTreeMap;
use std::sync::Arc;

use chainify_core::crypto::SigningKey;
use chainify_core::policy::Agreement;
use chainify_core::tx::{Certificate, LedgerBlock, Vote};
use chainify_core::votes::{
    CertificateError, VoteContext, VoteRejection, VoteTally, verify_certificate,
};
use chainify_core::{BlockNumber, Digest, OrgId};

/// Votes are accepted for at most this many blocks beyond the next block to append, bounding
/// the memory a peer can make the engine use.
pub const MAX_BLOCKS_AHEAD: u64 = 1024;

/// Timing of the engine's retries, in the milliseconds of [`Event::Tick`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Re-send the local vote on the next block when it is still undecided after this long.
    pub resend_vote_after_ms: u64,
    /// Ask peers for the certificate of the next block when it is still undecided after this long.
    pub fetch_certificate_after_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            resend_vote_after_ms: 500,
            fetch_certificate_after_ms: 1000,
        }
    }
}

/// An input to the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The local ExecutionServer executed a block.
    Executed(LedgerBlock),
    /// A vote from another organization (or an echo of our own).
    Vote(Vote),
    /// A certificate obtained from a peer.
    Certificate(Certificate),
    /// A recovery started by [`Command::StartRecovery`] re-executed the block.
    Recovered(LedgerBlock),
    /// A recovery could not proceed (no older checkpoint, replay impossible).
    RecoveryFailed {
        /// The block being recovered.
        block: BlockNumber,
        /// Why.
        reason: String,
    },
    /// The database and the ledger adopted the agreed state of this block from another
    /// organization (a state transfer, checked against the block's certificate and state
    /// digest): every block through it is final here, and execution goes on after it.
    Transferred(LedgerBlock),
    /// Time passed; `now_ms` is monotonic.
    Tick {
        /// Milliseconds on the runtime's monotonic clock.
        now_ms: u64,
    },
}

/// An action for the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send this (signed) vote to every other organization.
    SendVote(Vote),
    /// Append the block with its certificate to the ledger.
    Append {
        /// The agreed block.
        block: LedgerBlock,
        /// The votes that agree on it.
        certificate: Certificate,
    },
    /// Tell clients the outcome of the block's transactions (it is final).
    Notify(BlockNumber),
    /// Ask peers for the certificate of a block.
    FetchCertificate(BlockNumber),
    /// Send the certificate of an appended block (from the ledger) to an organization that is
    /// behind: it voted on a block that is final here.
    SendCertificate {
        /// The organization that is behind.
        to: OrgId,
        /// The appended block.
        block: BlockNumber,
    },
    /// Restore a checkpoint at or before `block` and replay up to `block` (`attempt` 0, 1, …:
    /// the node's tries, newest checkpoint first; the node tries each checkpoint twice, see
    /// `chainify_node`), and report [`Event::Recovered`] or [`Event::RecoveryFailed`].
    /// Local execution results of later blocks are void.
    StartRecovery {
        /// The block that disagreed.
        block: BlockNumber,
        /// Which checkpoint to use, newest first.
        attempt: u32,
    },
    /// A vote was not counted (log it).
    RejectVote(VoteRejection),
    /// A certificate was not accepted (log it).
    RejectCertificate(CertificateError),
    /// Something needs an operator.
    Alarm(String),
}

/// Where the engine stands, for status RPCs and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Voting and appending.
    Running,
    /// Recovering `block` with checkpoint `attempt`.
    Recovering {
        /// The block.
        block: BlockNumber,
        /// The checkpoint attempt.
        attempt: u32,
    },
    /// No agreement is possible on `block`; waiting for an operator.
    Waiting {
        /// The block.
        block: BlockNumber,
    },
    /// Recovery failed for good; nothing more is appended.
    Halted {
        /// Why.
        reason: String,
    },
}

#[derive(Debug)]
struct Slot {
    tally: VoteTally,
    /// The local LedgerBlock and its hash, once executed.
    mine: Option<(LedgerBlock, Digest)>,
    /// The local vote, once sent, and when.
    sent: Option<(Vote, u64)>,
    certificate: Option<Certificate>,
    /// When the slot became the next block to append with a local vote pending.
    waiting_since: Option<u64>,
    last_fetch: Option<u64>,
    impossible: bool,
}

impl Slot {
    fn new(block: BlockNumber) -> Slot {
        Slot {
            tally: VoteTally::new(block),
            mine: None,
            sent: None,
            certificate: None,
            waiting_since: None,
            last_fetch: None,
            impossible: false,
        }
    }
}

/// The voting engine of one organization.
#[derive(Debug)]
pub struct CommitEngine {
    me: OrgId,
    key: Arc<SigningKey>,
    ctx: VoteContext,
    timing: Timing,
    /// The next block to append; all before it are in the ledger.
    next: BlockNumber,
    slots: BTreeMap<BlockNumber, Slot>,
    state: State,
    now: u64,
    /// (organization, block) pairs already answered with a certificate for a late vote.
    certified_for: std::collections::BTreeSet<(OrgId, BlockNumber)>,
}

/// Most late-vote answers remembered (forgotten all at once beyond it).
const MAX_CERTIFIED_FOR: usize = 4096;

impl CommitEngine {
    /// An engine for organization `me` (signing with `key`) whose ledger ends before `next`.
    pub fn new(
        me: OrgId,
        key: Arc<SigningKey>,
        ctx: VoteContext,
        timing: Timing,
        next: BlockNumber,
    ) -> CommitEngine {
        CommitEngine {
            me,
            key,
            ctx,
            timing,
            next,
            slots: BTreeMap::new(),
            state: State::Running,
            now: 0,
            certified_for: std::collections::BTreeSet::new(),
        }
    }

    /// The next block to append.
    pub fn next_block(&self) -> BlockNumber {
        self.next
    }

    /// The votes counted so far for the next block to append, by organization: the hash each
    /// voted for (for operators: who is late, who disagrees).
    pub fn pending_votes(&self) -> BTreeMap<OrgId, Digest> {
        self.slots
            .get(&self.next)
            .map(|slot| slot.tally.hashes().collect())
            .unwrap_or_default()
    }

    /// Where the engine stands.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Handles one event and returns what to do, in order.
    pub fn handle(&mut self, event: Event) -> Vec<Command> {
        let mut out = Vec::new();
        if matches!(self.state, State::Halted { .. }) {
            return out;
        }
        match event {
            Event::Executed(block) => self.executed(block, &mut out),
            Event::Vote(vote) => self.vote(vote, &mut out),
            Event::Certificate(cert) => self.certificate(cert, &mut out),
            Event::Recovered(block) => self.recovered(block, &mut out),
            Event::Transferred(block) => self.transferred(&block, &mut out),
            Event::RecoveryFailed { block, reason } => {
                if matches!(self.state, State::Recovering { block: b, .. } if b == block) {
                    let reason = format!("block {block}: recovery failed: {reason}");
                    out.push(Command::Alarm(reason.clone()));
                    self.state = State::Halted { reason };
                }
            }
            Event::Tick { now_ms } => self.tick(now_ms, &mut out),
        }
        out
    }

    fn slot(&mut self, block: BlockNumber) -> &mut Slot {
        self.slots.entry(block).or_insert_with(|| Slot::new(block))
    }

    fn executed(&mut self, block: LedgerBlock, out: &mut Vec<Command>) {
        let number = block.number;
        if number < self.next {
            return;
        }
        if let State::Recovering { block: r, .. } = self.state
            && number >= r
        {
            // Executed on the state being repaired: void; the runtime re-executes after recovery.
            return;
        }
        let hash = block.hash();
        self.slot(number).mine = Some((block, hash));
        self.vote_if_next(number, out);
        self.decide(out);
    }

    /// Sends the local vote on `number` if it is the next block to append and not yet voted.
    fn vote_if_next(&mut self, number: BlockNumber, out: &mut Vec<Command>) {
        if number != self.next || !matches!(self.state, State::Running) {
            return;
        }
        let now = self.now;
        let me = self.me;
        let key = &self.key;
        let Some(slot) = self.slots.get_mut(&number) else {
            return;
        };
        let Some((_, hash)) = &slot.mine else { return };
        if slot.sent.is_some() {
            return;
        }
        // Counted like anybody else's, but for the check of the signature just made.
        let (vote, _) = slot.tally.vote_as(&self.ctx, *hash, me, key);
        slot.sent = Some((vote.clone(), now));
        slot.waiting_since = Some(now);
        out.push(Command::SendVote(vote));
        // Peers may have voted already: our vote can complete the agreement.
        self.evaluate(number, out);
    }

    fn vote(&mut self, vote: Vote, out: &mut Vec<Command>) {
        let number = vote.block;
        if number < self.next {
            // Late: the block is final here. The voter is behind; answer with the certificate
            // so that it can decide without waiting to fetch it — once the vote is proven to
            // come from that organization (a forged vote must not buy a reply to anyone).
            if vote.org == self.me {
                return;
            }
            match chainify_core::votes::check_vote_signature(&vote, &self.ctx) {
                // Once per organization and block: replayed votes buy nothing more.
                Ok(()) if self.certified_for.insert((vote.org, number)) => {
                    if self.certified_for.len() > MAX_CERTIFIED_FOR {
                        self.certified_for.clear();
                        self.certified_for.insert((vote.org, number));
                    }
                    out.push(Command::SendCertificate {
                        to: vote.org,
                        block: number,
                    });
                }
                Ok(()) => {}
                Err(VoteRejection::UnknownOrg(_)) => {}
                Err(rejection) => out.push(Command::RejectVote(rejection)),
            }
            return;
        }
        if number.0 > self.next.0.saturating_add(MAX_BLOCKS_AHEAD) {
            out.push(Command::RejectVote(VoteRejection::WrongBlock {
                org: vote.org,
                got: number,
                expected: self.next,
            }));
            return;
        }
        if vote.org == self.me {
            // Our own vote echoed back: counted when sent.
            return;
        }
        let ctx = &self.ctx;
        let slot = self
            .slots
            .entry(number)
            .or_insert_with(|| Slot::new(number));
        if let Err(rejection) = slot.tally.add(ctx, vote) {
            out.push(Command::RejectVote(rejection));
            // An equivocation changes the outcome (the equivocator agrees with nobody).
        }
        self.evaluate(number, out);
        self.decide(out);
    }

    fn certificate(&mut self, cert: Certificate, out: &mut Vec<Command>) {
        if cert.block < self.next {
            return;
        }
        if let Err(e) = verify_certificate(&cert, &self.ctx) {
            out.push(Command::RejectCertificate(e));
            return;
        }
        let slot = self.slot(cert.block);
        if slot.certificate.is_none() {
            slot.certificate = Some(cert);
        }
        self.decide(out);
    }

    /// Updates a slot's certificate or impossibility from its votes.
    fn evaluate(&mut self, number: BlockNumber, out: &mut Vec<Command>) {
        let ctx = &self.ctx;
        let Some(slot) = self.slots.get_mut(&number) else {
            return;
        };
        if slot.certificate.is_some() || slot.impossible {
            return;
        }
        match slot.tally.outcome(ctx) {
            Agreement::Agreed { .. } => slot.certificate = slot.tally.certificate(ctx),
            Agreement::Impossible => {
                slot.impossible = true;
                let votes: Vec<String> = slot
                    .tally
                    .hashes()
                    .map(|(o, h)| format!("{o}: {h}"))
                    .chain(
                        slot.tally
                            .equivocators()
                            .iter()
                            .map(|o| format!("{o}: equivocated")),
                    )
                    .collect();
                out.push(Command::Alarm(format!(
                    "block {number}: no agreement is possible any more ({}); recovering and waiting",
                    votes.join(", ")
                )));
            }
            Agreement::Pending => {}
        }
    }

    /// Appends every consecutive decided block from `next` on, or starts a recovery at the first
    /// whose agreed hash is not ours.
    fn decide(&mut self, out: &mut Vec<Command>) {
        loop {
            if !matches!(self.state, State::Running) {
                return;
            }
            let number = self.next;
            let Some(slot) = self.slots.get(&number) else {
                return;
            };
            if slot.impossible {
                self.start_recovery(number, out);
                return;
            }
            let (Some(cert), Some((block, hash))) = (&slot.certificate, &slot.mine) else {
                return;
            };
            if cert.ledger_block_hash != *hash {
                self.start_recovery(number, out);
                return;
            }
            out.push(Command::Append {
                block: block.clone(),
                certificate: cert.clone(),
            });
            out.push(Command::Notify(number));
            self.slots.remove(&number);
            self.next = BlockNumber(number.0 + 1);
            self.vote_if_next(self.next, out);
        }
    }

    fn start_recovery(&mut self, number: BlockNumber, out: &mut Vec<Command>) {
        self.state = State::Recovering {
            block: number,
            attempt: 0,
        };
        self.forget_from(number);
        out.push(Command::StartRecovery {
            block: number,
            attempt: 0,
        });
    }

    /// Voids local execution results from `number` on (they were computed on a divergent state).
    fn forget_from(&mut self, number: BlockNumber) {
        for (_, slot) in self.slots.range_mut(number..) {
            slot.mine = None;
            slot.waiting_since = None;
        }
    }

    fn transferred(&mut self, block: &LedgerBlock, out: &mut Vec<Command>) {
        if block.number < self.next {
            return;
        }
        self.next = BlockNumber(block.number.0 + 1);
        self.slots = self.slots.split_off(&self.next);
        // Results computed on the state given up are void; nothing after the block was voted.
        self.forget_from(self.next);
        self.state = State::Running;
        self.vote_if_next(self.next, out);
        self.decide(out);
    }

    fn recovered(&mut self, block: LedgerBlock, out: &mut Vec<Command>) {
        let State::Recovering { block: r, attempt } = self.state else {
            return;
        };
        if block.number != r {
            return;
        }
        let hash = block.hash();
        let slot = self.slot(r);
        let agreed = slot.certificate.as_ref().map(|c| c.ledger_block_hash);
        if agreed == Some(hash) {
            slot.mine = Some((block, hash));
        }
        match agreed {
            Some(agreed) if agreed == hash => {
                self.state = State::Running;
                self.decide(out);
            }
            Some(_) => {
                self.state = State::Recovering {
                    block: r,
                    attempt: attempt + 1,
                };
                out.push(Command::StartRecovery {
                    block: r,
                    attempt: attempt + 1,
                });
            }
            None => {
                // Recovered after an impossible agreement: nothing can be appended; wait.
                self.state = State::Waiting { block: r };
                out.push(Command::Alarm(format!(
                    "block {r}: recovered, but the organizations still cannot agree; the network waits for an operator"
                )));
            }
        }
    }

    fn tick(&mut self, now_ms: u64, out: &mut Vec<Command>) {
        self.now = self.now.max(now_ms);
        let now = self.now;
        let timing = self.timing;
        let next = self.next;
        let running = matches!(self.state, State::Running);
        let Some(slot) = self.slots.get_mut(&next) else {
            return;
        };
        if !running || slot.certificate.is_some() {
            return;
        }
        if let Some((vote, at)) = &mut slot.sent
            && now.saturating_sub(*at) >= timing.resend_vote_after_ms
        {
            *at = now;
            out.push(Command::SendVote(vote.clone()));
        }
        if let Some(since) = slot.waiting_since
            && now.saturating_sub(since) >= timing.fetch_certificate_after_ms
            && slot
                .last_fetch
                .is_none_or(|t| now.saturating_sub(t) >= timing.fetch_certificate_after_ms)
        {
            slot.last_fetch = Some(now);
            out.push(Command::FetchCertificate(next));
        }
    }
}

#[cfg(test)]
mod tests;
