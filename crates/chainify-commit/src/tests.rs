//! Exact command sequences for each situation the engine decides.

use std::collections::BTreeMap;

use chainify_core::TxId;
use chainify_core::testing::{SeededNet, seeded_key};
use chainify_core::tx::LedgerBlock;

use super::*;

type Net = SeededNet;

fn net(policy: &str) -> Net {
    SeededNet::new(3, policy, chainify_core::crypto::Signatures::Ed25519)
}

/// Organization `org`'s engine.
trait Engines {
    fn engine(&self, org: u32) -> CommitEngine;
}

impl Engines for SeededNet {
    fn engine(&self, org: u32) -> CommitEngine {
        CommitEngine::new(
            OrgId(org),
            Arc::new(seeded_key(org)),
            self.ctx.clone(),
            Timing::default(),
            BlockNumber(0),
        )
    }
}

/// A ledger block whose effect digest is `effect`.
fn lb(n: &Net, number: u64, effect: &str) -> LedgerBlock {
    LedgerBlock {
        network: n.ctx.network.clone(),
        number: BlockNumber(number),
        tx_ids: vec![TxId(Digest::of(b"tx"))],
        success: vec![true],
        valid: vec![true],
        hash_digest: Digest::of(effect.as_bytes()),
        state_digest: Digest::of(b"state"),
        hash_previous: Digest::ZERO,
        orderer_position: number,
    }
}

fn appended(block: &LedgerBlock, cert: Certificate) -> Command {
    Command::Append {
        block: block.clone(),
        certificate: cert,
    }
}

#[test]
fn agreement_appends_with_the_matching_votes() {
    let n = net("any-2");
    let mut e = n.engine(1);
    let b0 = lb(&n, 0, "a");
    assert_eq!(
        e.handle(Event::Executed(b0.clone())),
        vec![Command::SendVote(n.vote(1, &b0))]
    );
    assert_eq!(
        e.handle(Event::Vote(n.vote(2, &b0))),
        vec![
            appended(&b0, n.certificate(&[1, 2], &b0)),
            Command::Notify(BlockNumber(0))
        ]
    );
    assert_eq!(e.next_block(), BlockNumber(1));
    // A late vote on a final block changes nothing here, whatever it says; the late voter is
    // sent the certificate so that it can decide at once.
    let catch_up = Command::SendCertificate {
        to: OrgId(3),
        block: BlockNumber(0),
    };
    assert_eq!(
        e.handle(Event::Vote(n.vote(3, &b0))),
        vec![catch_up.clone()]
    );
    // Once per organization and block: a replayed or second late vote gets nothing more.
    assert_eq!(e.handle(Event::Vote(n.vote(3, &lb(&n, 0, "z")))), vec![]);
    assert_eq!(e.handle(Event::Vote(n.vote(3, &b0))), vec![]);
    let _ = catch_up;
    assert_eq!(e.next_block(), BlockNumber(1));
    // Our own echo and votes of organizations outside the network get nothing.
    assert_eq!(e.handle(Event::Vote(n.vote(1, &b0))), vec![]);
    let mut stranger = n.vote(3, &b0);
    stranger.org = OrgId(9);
    assert_eq!(e.handle(Event::Vote(stranger)), vec![]);
    // A late vote whose signature does not check (someone claiming to be org3) is refused,
    // and buys no certificate.
    let mut forged = n.vote(3, &b0);
    forged.org = OrgId(2);
    assert_eq!(
        e.handle(Event::Vote(forged)),
        vec![Command::RejectVote(VoteRejection::BadSignature(OrgId(2)))]
    );
}

#[test]
fn votes_before_execution_wait_for_the_local_result() {
    let n = net("any-2");
    let mut e = n.engine(3);
    let b0 = lb(&n, 0, "a");
    assert_eq!(e.handle(Event::Vote(n.vote(1, &b0))), vec![]);
    assert_eq!(e.handle(Event::Vote(n.vote(2, &b0))), vec![]);
    assert_eq!(
        e.handle(Event::Executed(b0.clone())),
        vec![
            Command::SendVote(n.vote(3, &b0)),
            appended(&b0, n.certificate(&[1, 2], &b0)),
            Command::Notify(BlockNumber(0))
        ]
    );
}

#[test]
fn a_slow_org_checks_itself_against_a_fetched_certificate() {
    let n = net("all");
    let mut e = n.engine(3);
    let b0 = lb(&n, 0, "a");
    let cert = n.certificate(&[1, 2, 3], &b0);
    assert_eq!(e.handle(Event::Certificate(cert.clone())), vec![]);
    assert_eq!(
        e.handle(Event::Executed(b0.clone())),
        vec![
            Command::SendVote(n.vote(3, &b0)),
            appended(&b0, cert),
            Command::Notify(BlockNumber(0))
        ]
    );
    // A certificate that does not satisfy the policy is rejected.
    let b1 = lb(&n, 1, "b");
    let short = n.certificate(&[1, 2], &b1);
    assert!(matches!(
        e.handle(Event::Certificate(short)).as_slice(),
        [Command::RejectCertificate(
            CertificateError::PolicyNotMet { .. }
        )]
    ));
}

#[test]
fn mismatch_recovers_then_appends_the_agreed_block() {
    let n = net("any-2");
    let mut e = n.engine(1);
    let wrong = lb(&n, 0, "tampered");
    let right = lb(&n, 0, "a");
    assert_eq!(
        e.handle(Event::Executed(wrong.clone())),
        vec![Command::SendVote(n.vote(1, &wrong))]
    );
    assert_eq!(e.handle(Event::Vote(n.vote(2, &right))), vec![]);
    assert_eq!(
        e.handle(Event::Vote(n.vote(3, &right))),
        vec![Command::StartRecovery {
            block: BlockNumber(0),
            attempt: 0
        }]
    );
    assert_eq!(
        e.state(),
        &State::Recovering {
            block: BlockNumber(0),
            attempt: 0
        }
    );
    // Block 1 executed on the divergent state meanwhile: void.
    assert_eq!(e.handle(Event::Executed(lb(&n, 1, "x"))), vec![]);
    // The newest checkpoint still gives a wrong result; the one before is right.
    assert_eq!(
        e.handle(Event::Recovered(wrong)),
        vec![Command::StartRecovery {
            block: BlockNumber(0),
            attempt: 1
        }]
    );
    assert_eq!(
        e.handle(Event::Recovered(right.clone())),
        vec![
            appended(&right, n.certificate(&[2, 3], &right)),
            Command::Notify(BlockNumber(0))
        ]
    );
    assert_eq!(e.state(), &State::Running);
    let b1 = lb(&n, 1, "b");
    assert_eq!(
        e.handle(Event::Executed(b1.clone())),
        vec![Command::SendVote(n.vote(1, &b1))]
    );
}

#[test]
fn a_failed_recovery_halts_without_appending() {
    let n = net("any-2");
    let mut e = n.engine(1);
    let right = lb(&n, 0, "a");
    e.handle(Event::Executed(lb(&n, 0, "tampered")));
    e.handle(Event::Vote(n.vote(2, &right)));
    e.handle(Event::Vote(n.vote(3, &right)));
    assert_eq!(
        e.handle(Event::RecoveryFailed {
            block: BlockNumber(0),
            reason: "no checkpoint at or before block #0".into()
        }),
        vec![Command::Alarm(
            "block #0: recovery failed: no checkpoint at or before block #0".into()
        )]
    );
    assert!(matches!(e.state(), State::Halted { .. }));
    assert_eq!(e.handle(Event::Recovered(right)), vec![]);
    assert_eq!(e.handle(Event::Tick { now_ms: 10_000 }), vec![]);
}

#[test]
fn a_transferred_state_finalizes_its_blocks_and_execution_goes_on_after_it() {
    let n = net("any-2");
    let mut e = n.engine(1);
    let right = lb(&n, 0, "a");
    e.handle(Event::Executed(lb(&n, 0, "equivocated")));
    e.handle(Event::Vote(n.vote(2, &right)));
    e.handle(Event::Vote(n.vote(3, &right)));
    assert!(matches!(e.state(), State::Recovering { .. }));
    // Peers went on to blocks 1 and 2; block 3 is being voted on.
    let b3 = lb(&n, 3, "d");
    e.handle(Event::Vote(n.vote(2, &b3)));
    e.handle(Event::Executed(lb(&n, 2, "void")));
    let b2 = lb(&n, 2, "c");
    assert_eq!(e.handle(Event::Transferred(b2)), vec![]);
    assert_eq!(e.state(), &State::Running);
    assert_eq!(e.next_block(), BlockNumber(3));
    // A state older than what is final changes nothing.
    assert_eq!(e.handle(Event::Transferred(lb(&n, 1, "x"))), vec![]);
    assert_eq!(e.next_block(), BlockNumber(3));
    // The next block executes and counts the vote that arrived meanwhile.
    assert_eq!(
        e.handle(Event::Executed(b3.clone())),
        vec![
            Command::SendVote(n.vote(1, &b3)),
            appended(&b3, n.certificate(&[1, 2], &b3)),
            Command::Notify(BlockNumber(3))
        ]
    );
}

#[test]
fn impossible_agreement_alarms_recovers_and_waits() {
    let n = net("all");
    let mut e = n.engine(1);
    let mine = lb(&n, 0, "a");
    e.handle(Event::Executed(mine.clone()));
    let out = e.handle(Event::Vote(n.vote(2, &lb(&n, 0, "b"))));
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(
        matches!(&out[0], Command::Alarm(m) if m.starts_with("block #0: no agreement is possible any more (")),
        "{out:?}"
    );
    assert_eq!(
        out[1],
        Command::StartRecovery {
            block: BlockNumber(0),
            attempt: 0
        }
    );
    let out = e.handle(Event::Recovered(mine));
    assert!(matches!(out.as_slice(), [Command::Alarm(m)] if m.contains("the network waits")));
    assert_eq!(
        e.state(),
        &State::Waiting {
            block: BlockNumber(0)
        }
    );
    assert_eq!(e.handle(Event::Vote(n.vote(3, &lb(&n, 0, "a")))), vec![]);
}

#[test]
fn duplicate_forged_and_equivocating_votes_are_rejected() {
    let n = net("any-2");
    let mut e = n.engine(1);
    let b0 = lb(&n, 0, "a");
    assert_eq!(e.handle(Event::Vote(n.vote(2, &b0))), vec![]);
    assert_eq!(
        e.handle(Event::Vote(n.vote(2, &b0))),
        vec![Command::RejectVote(VoteRejection::Duplicate(OrgId(2)))]
    );
    let mut forged = n.vote(2, &b0);
    forged.org = OrgId(3);
    assert_eq!(
        e.handle(Event::Vote(forged)),
        vec![Command::RejectVote(VoteRejection::BadSignature(OrgId(3)))]
    );
    let other = lb(&n, 0, "b");
    assert_eq!(
        e.handle(Event::Vote(n.vote(2, &other))),
        vec![Command::RejectVote(VoteRejection::Equivocation {
            org: OrgId(2),
            first: b0.hash(),
            second: other.hash()
        })]
    );
    // Org 2 no longer counts: our vote and org 3's are needed.
    assert_eq!(
        e.handle(Event::Executed(b0.clone())),
        vec![Command::SendVote(n.vote(1, &b0))]
    );
    assert_eq!(
        e.handle(Event::Vote(n.vote(3, &b0))),
        vec![
            appended(&b0, n.certificate(&[1, 3], &b0)),
            Command::Notify(BlockNumber(0))
        ]
    );
    let far = lb(&n, MAX_BLOCKS_AHEAD + 5, "f");
    assert!(matches!(
        e.handle(Event::Vote(n.vote(2, &far))).as_slice(),
        [Command::RejectVote(VoteRejection::WrongBlock { .. })]
    ));
}

#[test]
fn pipelined_blocks_vote_only_after_their_predecessor_is_final() {
    let n = net("any-2");
    let mut e = n.engine(1);
    let (b0, b1, b2) = (lb(&n, 0, "a"), lb(&n, 1, "b"), lb(&n, 2, "c"));
    assert_eq!(
        e.handle(Event::Executed(b0.clone())),
        vec![Command::SendVote(n.vote(1, &b0))]
    );
    assert_eq!(e.handle(Event::Executed(b1.clone())), vec![]);
    assert_eq!(e.handle(Event::Executed(b2.clone())), vec![]);
    // Peers already agree on block 1; it waits for block 0.
    assert_eq!(e.handle(Event::Vote(n.vote(2, &b1))), vec![]);
    assert_eq!(
        e.handle(Event::Vote(n.vote(2, &b0))),
        vec![
            appended(&b0, n.certificate(&[1, 2], &b0)),
            Command::Notify(BlockNumber(0)),
            Command::SendVote(n.vote(1, &b1)),
            appended(&b1, n.certificate(&[1, 2], &b1)),
            Command::Notify(BlockNumber(1)),
            Command::SendVote(n.vote(1, &b2)),
        ]
    );
}

#[test]
fn ticks_resend_the_vote_and_fetch_the_certificate() {
    let n = net("any-2");
    let mut e = n.engine(1);
    let b0 = lb(&n, 0, "a");
    e.handle(Event::Executed(b0.clone()));
    assert_eq!(e.handle(Event::Tick { now_ms: 499 }), vec![]);
    assert_eq!(
        e.handle(Event::Tick { now_ms: 500 }),
        vec![Command::SendVote(n.vote(1, &b0))]
    );
    assert_eq!(
        e.handle(Event::Tick { now_ms: 1000 }),
        vec![
            Command::SendVote(n.vote(1, &b0)),
            Command::FetchCertificate(BlockNumber(0))
        ]
    );
    assert_eq!(e.handle(Event::Tick { now_ms: 1200 }), vec![]);
}

#[test]
fn pending_votes_show_who_voted_what_for_the_next_block_only() {
    let n = net("all");
    let mut e = n.engine(1);
    let b0 = lb(&n, 0, "a");
    let other = lb(&n, 0, "b");
    assert!(e.pending_votes().is_empty());
    e.handle(Event::Vote(n.vote(2, &other)));
    e.handle(Event::Vote(n.vote(3, &lb(&n, 1, "c"))));
    assert_eq!(
        e.pending_votes(),
        BTreeMap::from([(OrgId(2), other.hash())]),
        "block 1's vote is not for the next block"
    );
    e.handle(Event::Executed(b0.clone()));
    assert_eq!(
        e.pending_votes(),
        BTreeMap::from([(OrgId(1), b0.hash()), (OrgId(2), other.hash())])
    );
}

#[test]
fn a_node_signing_with_a_key_the_network_does_not_name_does_not_count_its_own_vote() {
    let n = SeededNet::new(1, "any-1", chainify_core::crypto::Signatures::Ed25519);
    let b0 = lb(&n, 0, "a");
    // With its own key, its vote alone agrees.
    let mut right = n.engine(1);
    let sent = right.handle(Event::Executed(b0.clone()));
    assert!(
        sent.iter().any(|c| matches!(c, Command::Append { .. })),
        "{sent:?}"
    );
    // With another key, the vote is sent (peers refuse it too) but not counted here.
    let mut wrong = CommitEngine::new(
        OrgId(1),
        Arc::new(seeded_key(7)),
        n.ctx.clone(),
        Timing::default(),
        BlockNumber(0),
    );
    let sent = wrong.handle(Event::Executed(b0.clone()));
    assert!(
        matches!(sent.as_slice(), [Command::SendVote(v)] if v.org == OrgId(1)),
        "{sent:?}"
    );
    assert!(wrong.pending_votes().is_empty());
    assert_eq!(wrong.next_block(), BlockNumber(0));
}
