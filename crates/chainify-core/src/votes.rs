//! Counting the signed votes on one block: signatures and fields are checked, forgeries and
//! equivocations are set aside with a reason, and the agreement policy decides. An agreement comes
//! with its [`Certificate`]: the matching signed votes, which anyone holding the network's public
//! keys can check offline ([`verify_certificate`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::crypto::{PublicKey, Signatures, SigningKey};
use crate::policy::{Agreement, AgreementPolicy};
use crate::tx::{Certificate, LedgerBlock, Vote};
use crate::{BlockNumber, Digest, NetworkId, OrgId};

/// Why a vote was not counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VoteRejection {
    /// The voter is not an organization of the network.
    #[error("vote from unknown organization {0}")]
    UnknownOrg(OrgId),
    /// The vote is for another network.
    #[error("vote from {org} is for network {network}, not this one")]
    WrongNetwork {
        /// The voter.
        org: OrgId,
        /// The network named in the vote.
        network: String,
    },
    /// The vote is for another block.
    #[error("vote from {org} is for block {got}, not {expected}")]
    WrongBlock {
        /// The voter.
        org: OrgId,
        /// The block named in the vote.
        got: BlockNumber,
        /// The block being counted.
        expected: BlockNumber,
    },
    /// The signature does not verify with the voter's key.
    #[error("vote from {0} has a bad signature")]
    BadSignature(OrgId),
    /// The same vote was received again (harmless, not counted twice).
    #[error("duplicate vote from {0}")]
    Duplicate(OrgId),
    /// The voter signed two different hashes for the block: it is Byzantine and none of its votes
    /// count.
    #[error("{org} equivocated: voted {first} and {second}")]
    Equivocation {
        /// The voter.
        org: OrgId,
        /// Its first hash.
        first: Digest,
        /// Its conflicting hash.
        second: Digest,
    },
}

/// What an organization's votes amount to.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Choice {
    Hash(Digest),
    /// Signed two hashes: counts as voted, agreeing with nobody.
    Equivocated(OrgId),
}

/// What votes are checked against: the network, its organizations' public keys and the
/// agreement policy.
#[derive(Debug, Clone)]
pub struct VoteContext {
    /// The network.
    pub network: NetworkId,
    /// The agreement policy over the organizations.
    pub policy: AgreementPolicy,
    /// Each organization's public key.
    pub keys: BTreeMap<OrgId, PublicKey>,
    /// Whether votes are signed and checked.
    pub signatures: Signatures,
}

/// The votes received for one block.
#[derive(Debug, Clone)]
pub struct VoteTally {
    block: BlockNumber,
    votes: BTreeMap<OrgId, Vote>,
    equivocators: BTreeSet<OrgId>,
}

impl VoteTally {
    /// An empty tally for `block`.
    pub fn new(block: BlockNumber) -> Self {
        VoteTally {
            block,
            votes: BTreeMap::new(),
            equivocators: BTreeSet::new(),
        }
    }

    /// The block counted.
    pub fn block(&self) -> BlockNumber {
        self.block
    }

    /// The hash each organization voted (equivocators excluded).
    pub fn hashes(&self) -> impl Iterator<Item = (OrgId, Digest)> + '_ {
        self.votes.iter().map(|(o, v)| (*o, v.ledger_block_hash))
    }

    /// Organizations that signed two different hashes.
    pub fn equivocators(&self) -> &BTreeSet<OrgId> {
        &self.equivocators
    }

    /// Checks and counts a vote.
    pub fn add(&mut self, ctx: &VoteContext, vote: Vote) -> Result<(), VoteRejection> {
        check_vote(&vote, ctx, self.block)?;
        self.count(vote)
    }

    /// Signs `org`'s vote for `hash` on this tally's block with `key`, by the network's rule,
    /// and counts it; returns the vote (to send) and whether it counted. Its signature is not
    /// checked again when `key` is the one the network names for `org` (a check costs twice the
    /// signing, once a block); any other key gets the full check, which refuses the vote, as
    /// peers refuse it. Only a vote made here skips the check: none can be handed in.
    pub fn vote_as(
        &mut self,
        ctx: &VoteContext,
        hash: Digest,
        org: OrgId,
        key: &SigningKey,
    ) -> (Vote, Result<(), VoteRejection>) {
        let vote = Vote::new_as(
            ctx.network.clone(),
            self.block,
            hash,
            org,
            key,
            ctx.signatures,
        );
        let counted = if ctx.keys.get(&org) == Some(&key.public_key()) {
            check_vote_fields(&vote, ctx, self.block).and_then(|_| self.count(vote.clone()))
        } else {
            self.add(ctx, vote.clone())
        };
        (vote, counted)
    }

    /// Counts a checked vote: an organization's second vote, for another hash, makes it an
    /// equivocator.
    fn count(&mut self, vote: Vote) -> Result<(), VoteRejection> {
        if self.equivocators.contains(&vote.org) {
            return Err(VoteRejection::Duplicate(vote.org));
        }
        match self.votes.get(&vote.org) {
            Some(prev) if prev.ledger_block_hash == vote.ledger_block_hash => {
                Err(VoteRejection::Duplicate(vote.org))
            }
            Some(prev) => {
                let err = VoteRejection::Equivocation {
                    org: vote.org,
                    first: prev.ledger_block_hash,
                    second: vote.ledger_block_hash,
                };
                self.votes.remove(&vote.org);
                self.equivocators.insert(vote.org);
                Err(err)
            }
            None => {
                self.votes.insert(vote.org, vote);
                Ok(())
            }
        }
    }

    /// The policy's verdict on the votes counted so far.
    pub fn outcome(&self, ctx: &VoteContext) -> Agreement<Digest> {
        let choices: BTreeMap<OrgId, Choice> = self
            .votes
            .iter()
            .map(|(o, v)| (*o, Choice::Hash(v.ledger_block_hash)))
            .chain(
                self.equivocators
                    .iter()
                    .map(|o| (*o, Choice::Equivocated(*o))),
            )
            .collect();
        match ctx.policy.evaluate(&choices) {
            Agreement::Agreed {
                hash: Choice::Hash(h),
                voters,
            } => Agreement::Agreed { hash: h, voters },
            // Only a one-organization combination can be met by an equivocator alone; accepted
            // policies have pairwise intersecting combinations, so every combination then contains
            // that organization and none can be met any more.
            Agreement::Agreed { .. } | Agreement::Impossible => Agreement::Impossible,
            Agreement::Pending => Agreement::Pending,
        }
    }

    /// The certificate, once the policy is met: every counted vote for the agreed hash.
    pub fn certificate(&self, ctx: &VoteContext) -> Option<Certificate> {
        let Agreement::Agreed { hash, voters } = self.outcome(ctx) else {
            return None;
        };
        Some(Certificate {
            block: self.block,
            ledger_block_hash: hash,
            votes: voters
                .iter()
                .filter_map(|o| self.votes.get(o).cloned())
                .collect(),
        })
    }
}

/// Checks a vote on its own block: a known organization, this network, a valid signature.
pub fn check_vote_signature(vote: &Vote, ctx: &VoteContext) -> Result<(), VoteRejection> {
    check_vote(vote, ctx, vote.block)
}

fn check_vote(vote: &Vote, ctx: &VoteContext, block: BlockNumber) -> Result<(), VoteRejection> {
    let key = check_vote_fields(vote, ctx, block)?;
    ctx.signatures
        .verify(&vote.signed_by(key))
        .map_err(|_| VoteRejection::BadSignature(vote.org))
}

/// Everything [`check_vote`] checks but the signature; returns the voter's key.
fn check_vote_fields(
    vote: &Vote,
    ctx: &VoteContext,
    block: BlockNumber,
) -> Result<PublicKey, VoteRejection> {
    let VoteContext { network, keys, .. } = ctx;
    let key = keys
        .get(&vote.org)
        .ok_or(VoteRejection::UnknownOrg(vote.org))?;
    if &vote.network != network {
        return Err(VoteRejection::WrongNetwork {
            org: vote.org,
            network: vote.network.to_string(),
        });
    }
    if vote.block != block {
        return Err(VoteRejection::WrongBlock {
            org: vote.org,
            got: vote.block,
            expected: block,
        });
    }
    Ok(*key)
}

/// Why a certificate does not prove agreement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateError {
    /// A vote in it is invalid.
    #[error("certificate for block {block}: {source}")]
    BadVote {
        /// The certified block.
        block: BlockNumber,
        /// The problem with the vote.
        source: VoteRejection,
    },
    /// A vote is for another hash than the certified one.
    #[error("certificate for block {block}: vote from {org} is for another hash")]
    HashMismatch {
        /// The certified block.
        block: BlockNumber,
        /// The voter.
        org: OrgId,
    },
    /// The voters do not satisfy the agreement policy.
    #[error("certificate for block {block}: voters {voters:?} do not satisfy the agreement policy")]
    PolicyNotMet {
        /// The certified block.
        block: BlockNumber,
        /// The distinct valid voters.
        voters: Vec<u32>,
    },
}

/// Checks a certificate offline: every vote is valid, for the certified block and hash, from a
/// distinct organization, and together they satisfy the agreement policy.
pub fn verify_certificate(cert: &Certificate, ctx: &VoteContext) -> Result<(), CertificateError> {
    let mut voters = BTreeSet::new();
    for vote in &cert.votes {
        check_vote(vote, ctx, cert.block).map_err(|source| CertificateError::BadVote {
            block: cert.block,
            source,
        })?;
        if vote.ledger_block_hash != cert.ledger_block_hash {
            return Err(CertificateError::HashMismatch {
                block: cert.block,
                org: vote.org,
            });
        }
        if !voters.insert(vote.org) {
            return Err(CertificateError::BadVote {
                block: cert.block,
                source: VoteRejection::Duplicate(vote.org),
            });
        }
    }
    if ctx.policy.is_satisfied_by(&voters) {
        Ok(())
    } else {
        Err(CertificateError::PolicyNotMet {
            block: cert.block,
            voters: voters.iter().map(|o| o.0).collect(),
        })
    }
}

impl VoteContext {
    /// The context of a network's configuration.
    pub fn of(network: &crate::config::NetworkConfig) -> VoteContext {
        VoteContext {
            network: network.network_id.clone(),
            policy: network.agreement.clone(),
            keys: network
                .orgs
                .iter()
                .map(|(id, o)| (*id, o.public_key))
                .collect(),
            signatures: network.signatures,
        }
    }
}

/// Why a ledger entry does not prove a transaction's outcome ([`prove_outcome`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the outcome of transaction {tx} in block {block} is not proven: {problem}")]
pub struct UnprovenOutcome {
    /// The transaction.
    pub tx: crate::TxId,
    /// The block the outcome names.
    pub block: BlockNumber,
    /// What does not hold.
    pub problem: String,
}

/// Checks that `entry` (an agreed block with its certificate, from any organization) proves
/// `outcome` (as one organization reported it): the block is the network's, numbered as the
/// outcome says, certified for exactly its hash by votes satisfying the agreement policy, and
/// holds the transaction at the outcome's index with the outcome's success. Proven so, an
/// outcome rests on the policy's organizations, not on the one that reported it. (The abort
/// reason is no part of the agreed block and is not proven.)
pub fn prove_outcome(
    entry: &crate::tx::LedgerEntry,
    ctx: &VoteContext,
    outcome: &crate::tx::TxOutcome,
) -> Result<(), UnprovenOutcome> {
    let fail = |problem: String| UnprovenOutcome {
        tx: outcome.tx_id,
        block: outcome.block,
        problem,
    };
    let (block, cert) = (&entry.block, &entry.certificate);
    if !outcome.agreed {
        return Err(fail("the outcome is not reported as agreed".into()));
    }
    if block.network != ctx.network {
        return Err(fail(format!(
            "the ledger block belongs to network {}, not {}",
            block.network, ctx.network
        )));
    }
    if block.number != outcome.block {
        return Err(fail(format!("the ledger entry is block {}", block.number)));
    }
    if cert.block != block.number || cert.ledger_block_hash != block.hash() {
        return Err(fail(format!(
            "the certificate is for block {} with hash {}, not this block's hash {}",
            cert.block,
            cert.ledger_block_hash,
            block.hash()
        )));
    }
    verify_certificate(cert, ctx).map_err(|e| fail(e.to_string()))?;
    let index = usize::try_from(outcome.index).unwrap_or(usize::MAX);
    match block.tx_ids.get(index) {
        Some(id) if *id == outcome.tx_id => {}
        Some(id) => {
            return Err(fail(format!(
                "the agreed block holds transaction {id} at index {index}"
            )));
        }
        None => {
            return Err(fail(format!(
                "the agreed block holds {} transactions, none at index {index}",
                block.tx_ids.len()
            )));
        }
    }
    // A transaction's id leaves its signature out, so an ordered copy with a broken or
    // stripped signature (or a replay) is recorded under the same id as invalid: it says
    // nothing final about the transaction, which may commit elsewhere.
    if !block.valid.get(index).copied().unwrap_or(false) {
        return Err(fail(format!(
            "the agreed block holds an invalid copy of it at index {index} (a replay, or a copy whose signatures or endorsements failed), which says nothing final about it"
        )));
    }
    let agreed = block.success.get(index).copied().unwrap_or(false);
    if agreed != outcome.success {
        let said = |s: bool| if s { "committed" } else { "aborted" };
        return Err(fail(format!(
            "the outcome says it {}, the agreed block says it {}",
            said(outcome.success),
            said(agreed)
        )));
    }
    Ok(())
}

/// Why a ledger does not verify: the first bad block and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ledger block {block}: {problem}")]
pub struct LedgerFault {
    /// The first block that does not verify.
    pub block: BlockNumber,
    /// What is wrong.
    pub problem: String,
}

/// Verifies a ledger offline, from its first block (block 1) on. Each block must belong to the
/// network, follow the previous one by number and by hash, and carry a certificate for exactly
/// its hash whose votes satisfy the agreement policy. Returns the number of blocks.
pub fn verify_ledger<'a>(
    entries: impl IntoIterator<Item = (&'a LedgerBlock, &'a Certificate)>,
    ctx: &VoteContext,
) -> Result<u64, LedgerFault> {
    verify_ledger_from(BlockNumber(1), Digest::ZERO, entries, ctx)
}

/// [`verify_ledger`] for a part of a ledger: the entries must start at block `first` and chain
/// to `previous`, the hash of the block before it (what a state transfer appends to a ledger
/// that ends there).
pub fn verify_ledger_from<'a>(
    first: BlockNumber,
    previous: Digest,
    entries: impl IntoIterator<Item = (&'a LedgerBlock, &'a Certificate)>,
    ctx: &VoteContext,
) -> Result<u64, LedgerFault> {
    let mut expected = first;
    let mut previous = previous;
    let mut count = 0;
    for (block, cert) in entries {
        let fault = |problem: String| LedgerFault {
            block: block.number,
            problem,
        };
        if block.number != expected {
            return Err(fault(format!("expected block {expected} here")));
        }
        if block.network != ctx.network {
            return Err(fault(format!(
                "belongs to network {}, not {}",
                block.network, ctx.network
            )));
        }
        if block.hash_previous != previous {
            return Err(fault(format!(
                "its previous hash {} is not the hash {previous} of the block before",
                block.hash_previous
            )));
        }
        let hash = block.hash();
        if cert.block != block.number || cert.ledger_block_hash != hash {
            return Err(fault(format!(
                "the certificate is for block {} hash {}, not for this block's hash {hash}",
                cert.block, cert.ledger_block_hash
            )));
        }
        verify_certificate(cert, ctx).map_err(|e| fault(e.to_string()))?;
        previous = hash;
        expected = BlockNumber(block.number.0 + 1);
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::SeededNet;

    type Net = SeededNet;

    fn net(policy: &str) -> Net {
        SeededNet::new(3, policy, Signatures::Ed25519)
    }

    /// Organization `org`'s vote for any hash at `block`.
    fn vote(n: &Net, org: u32, block: u64, hash: &[u8]) -> Vote {
        Vote::new_signed(
            n.ctx.network.clone(),
            BlockNumber(block),
            Digest::of(hash),
            OrgId(org),
            &n.keys[org as usize - 1],
        )
    }

    /// A valid ledger of `n` blocks certified by organizations 1 and 2.
    fn ledger(n: &Net, blocks: u64) -> Vec<(LedgerBlock, Certificate)> {
        let mut out: Vec<(LedgerBlock, Certificate)> = Vec::new();
        for b in 1..=blocks {
            let block = LedgerBlock {
                network: n.ctx.network.clone(),
                number: BlockNumber(b),
                tx_ids: vec![],
                success: vec![],
                valid: vec![],
                hash_digest: Digest::of(&b.to_be_bytes()),
                state_digest: Digest::of(b"state"),
                hash_previous: out.last().map_or(Digest::ZERO, |(p, _)| p.hash()),
                orderer_position: b,
            };
            let cert = n.certificate(&[1, 2], &block);
            out.push((block, cert));
        }
        out
    }

    fn verify(n: &Net, l: &[(LedgerBlock, Certificate)]) -> Result<u64, LedgerFault> {
        verify_ledger(l.iter().map(|(b, c)| (b, c)), &n.ctx)
    }

    /// An outcome is proven by an agreed block holding it and a certificate satisfying the
    /// policy; every way a lying organization could bend it is named.
    #[test]
    fn an_outcome_is_proven_only_by_its_certified_block() {
        use crate::TxId;
        use crate::tx::{LedgerEntry, TxOutcome};
        let n = net("any-2");
        let (a, b) = (TxId(Digest::of(b"a")), TxId(Digest::of(b"b")));
        let block = LedgerBlock {
            tx_ids: vec![a, b],
            success: vec![true, false],
            valid: vec![true, true],
            ..ledger(&n, 1).remove(0).0
        };
        let entry = |orgs: &[u32], block: &LedgerBlock| LedgerEntry {
            block: block.clone(),
            certificate: n.certificate(orgs, block),
        };
        let good = entry(&[1, 2], &block);
        let outcome = |tx: TxId, index: u32, success: bool| TxOutcome {
            tx_id: tx,
            block: BlockNumber(1),
            index,
            success,
            agreed: true,
            valid: true,
            reason: String::new(),
        };
        prove_outcome(&good, &n.ctx, &outcome(a, 0, true)).expect("a committed");
        prove_outcome(&good, &n.ctx, &outcome(b, 1, false)).expect("b aborted");
        let unproven = |entry: &LedgerEntry, o: &TxOutcome| {
            prove_outcome(entry, &n.ctx, o)
                .expect_err("not proven")
                .to_string()
        };
        let e = unproven(&good, &outcome(b, 1, true));
        assert!(
            e.ends_with("the outcome says it committed, the agreed block says it aborted"),
            "{e}"
        );
        let e = unproven(&good, &outcome(b, 0, false));
        assert!(e.contains("holds transaction"), "{e}");
        let e = unproven(&good, &outcome(a, 2, true));
        assert!(e.contains("holds 2 transactions, none at index 2"), "{e}");
        let e = unproven(
            &good,
            &TxOutcome {
                block: BlockNumber(2),
                ..outcome(a, 0, true)
            },
        );
        assert!(e.contains("the ledger entry is block #1"), "{e}");
        let e = unproven(&entry(&[1], &block), &outcome(a, 0, true));
        assert!(e.contains("do not satisfy the agreement policy"), "{e}");
        // A block changed after agreement (the success bit flipped) no longer matches its
        // certificate.
        let mut flipped = good.clone();
        flipped.block.success[1] = true;
        let e = unproven(&flipped, &outcome(b, 1, true));
        assert!(e.contains("not this block's hash"), "{e}");
        let mut forged = good.clone();
        forged.certificate.votes[1] = vote(&n, 2, 1, b"another block");
        forged.certificate.ledger_block_hash = block.hash();
        let e = unproven(&forged, &outcome(a, 0, true));
        assert!(e.contains("certificate for block #1"), "{e}");
        let mut pending = outcome(a, 0, true);
        pending.agreed = false;
        assert!(unproven(&good, &pending).contains("not reported as agreed"));
        // An invalid copy of a (stripped of its endorsements, ordered ahead of it) proves no
        // abort of a: only its valid entry is final.
        let copied = LedgerBlock {
            tx_ids: vec![a, a],
            success: vec![false, true],
            valid: vec![false, true],
            ..block.clone()
        };
        let copied = entry(&[1, 2], &copied);
        let e = unproven(&copied, &outcome(a, 0, false));
        assert!(e.contains("holds an invalid copy of it at index 0"), "{e}");
        prove_outcome(&copied, &n.ctx, &outcome(a, 1, true)).expect("the valid entry");
    }

    #[test]
    fn a_ledger_verifies_and_the_first_bad_block_is_named() {
        let n = net("any-2");
        let good = ledger(&n, 3);
        assert_eq!(verify(&n, &good), Ok(3));
        assert_eq!(verify(&n, &[]), Ok(0));

        let mut broken = good.clone();
        broken[1].0.hash_digest = Digest::of(b"rewritten");
        let fault = verify(&n, &broken).unwrap_err();
        assert_eq!(fault.block, BlockNumber(2));
        assert!(
            fault.problem.contains("certificate is for block"),
            "{fault}"
        );

        let mut rechained = good.clone();
        rechained[1].0.hash_digest = Digest::of(b"rewritten");
        rechained[1].1 = n.certificate(&[1, 2], &rechained[1].0);
        let fault = verify(&n, &rechained).unwrap_err();
        assert_eq!(fault.block, BlockNumber(3), "block 3 no longer chains");
        assert!(fault.problem.contains("previous hash"), "{fault}");

        let mut lonely = good.clone();
        lonely[2].1 = n.certificate(&[3], &lonely[2].0);
        let fault = verify(&n, &lonely).unwrap_err();
        assert_eq!(fault.block, BlockNumber(3));
        assert!(fault.problem.contains("do not satisfy"), "{fault}");

        let fault = verify(&n, &good[1..]).unwrap_err();
        assert!(fault.problem.contains("expected block #1"), "{fault}");

        let mut forged = good.clone();
        forged[0].1.votes[1].signature = forged[0].1.votes[0].signature;
        assert_eq!(verify(&n, &forged).unwrap_err().block, BlockNumber(1));
    }

    #[test]
    fn a_vote_made_here_counts_unchecked_only_under_the_key_the_network_names() {
        let n = net("any-2");
        let mut tally = VoteTally::new(BlockNumber(4));
        let (mine, counted) = tally.vote_as(&n.ctx, Digest::of(b"h"), OrgId(1), &n.keys[0]);
        assert_eq!(counted, Ok(()));
        assert_eq!(mine, vote(&n, 1, 4, b"h"), "the vote peers get");
        assert_eq!(check_vote_signature(&mine, &n.ctx), Ok(()));
        // A second vote for another hash still makes an equivocator.
        let (_, again) = tally.vote_as(&n.ctx, Digest::of(b"other"), OrgId(1), &n.keys[0]);
        assert_eq!(
            again,
            Err(VoteRejection::Equivocation {
                org: OrgId(1),
                first: Digest::of(b"h"),
                second: Digest::of(b"other"),
            })
        );
        // Signed with a key the network does not name for the voter: checked, and refused.
        let stranger = SigningKey::from_seed(&[99; 32]);
        let (sent, refused) = tally.vote_as(&n.ctx, Digest::of(b"h"), OrgId(2), &stranger);
        assert_eq!(refused, Err(VoteRejection::BadSignature(OrgId(2))));
        assert_eq!(sent.org, OrgId(2));
        // Made for an organization the network does not have: refused.
        let (_, unknown) = tally.vote_as(&n.ctx, Digest::of(b"h"), OrgId(9), &n.keys[0]);
        assert_eq!(unknown, Err(VoteRejection::UnknownOrg(OrgId(9))));
        assert_eq!(tally.hashes().count(), 0, "only the equivocator voted");
    }

    #[test]
    fn agreement_yields_a_verifiable_certificate() {
        let n = net("any-2");
        let mut t = VoteTally::new(BlockNumber(5));
        t.add(&n.ctx, vote(&n, 1, 5, b"h")).unwrap();
        assert_eq!(t.outcome(&n.ctx), Agreement::Pending);
        assert_eq!(t.certificate(&n.ctx), None);
        t.add(&n.ctx, vote(&n, 2, 5, b"x")).unwrap();
        t.add(&n.ctx, vote(&n, 3, 5, b"h")).unwrap();
        let cert = t.certificate(&n.ctx).unwrap();
        assert_eq!(cert.ledger_block_hash, Digest::of(b"h"));
        assert_eq!(
            cert.votes.iter().map(|v| v.org.0).collect::<Vec<_>>(),
            [1, 3]
        );
        verify_certificate(&cert, &n.ctx).unwrap();
    }

    #[test]
    fn forged_misdirected_and_duplicate_votes_are_not_counted() {
        let n = net("all");
        let mut t = VoteTally::new(BlockNumber(5));
        let mut forged = vote(&n, 2, 5, b"h");
        forged.org = OrgId(3);
        assert_eq!(
            t.add(&n.ctx, forged),
            Err(VoteRejection::BadSignature(OrgId(3)))
        );
        assert!(matches!(
            t.add(&n.ctx, vote(&n, 1, 6, b"h")),
            Err(VoteRejection::WrongBlock { .. })
        ));
        let mut unknown = vote(&n, 1, 5, b"h");
        unknown.org = OrgId(9);
        assert_eq!(
            t.add(&n.ctx, unknown),
            Err(VoteRejection::UnknownOrg(OrgId(9)))
        );
        t.add(&n.ctx, vote(&n, 1, 5, b"h")).unwrap();
        assert_eq!(
            t.add(&n.ctx, vote(&n, 1, 5, b"h")),
            Err(VoteRejection::Duplicate(OrgId(1)))
        );
        assert_eq!(t.outcome(&n.ctx), Agreement::Pending);
    }

    #[test]
    fn unsigned_votes_count_only_on_an_unsigned_network() {
        let mut n = net("all");
        let unsigned = |org: u32| {
            Vote::new_as(
                n.ctx.network.clone(),
                BlockNumber(5),
                Digest::of(b"h"),
                OrgId(org),
                &n.keys[0],
                Signatures::Off,
            )
        };
        let votes: Vec<Vote> = (1..=3).map(unsigned).collect();
        let mut t = VoteTally::new(BlockNumber(5));
        assert_eq!(
            t.add(&n.ctx, votes[0].clone()),
            Err(VoteRejection::BadSignature(OrgId(1)))
        );
        n.ctx.signatures = Signatures::Off;
        for v in &votes {
            t.add(&n.ctx, v.clone()).unwrap();
        }
        assert!(matches!(t.outcome(&n.ctx), Agreement::Agreed { .. }));
        let cert = t.certificate(&n.ctx).unwrap();
        verify_certificate(&cert, &n.ctx).unwrap();
        // Still counted by the policy: two unsigned votes do not make "all".
        let short = Certificate {
            votes: cert.votes[..2].to_vec(),
            ..cert
        };
        assert!(matches!(
            verify_certificate(&short, &n.ctx),
            Err(CertificateError::PolicyNotMet { .. })
        ));
    }

    #[test]
    fn an_equivocator_agrees_with_nobody() {
        let n = net("any-2");
        let mut t = VoteTally::new(BlockNumber(1));
        t.add(&n.ctx, vote(&n, 1, 1, b"h")).unwrap();
        assert!(matches!(
            t.add(&n.ctx, vote(&n, 1, 1, b"x")),
            Err(VoteRejection::Equivocation { .. })
        ));
        t.add(&n.ctx, vote(&n, 2, 1, b"h")).unwrap();
        // Org 1's earlier vote for h no longer counts: only org 2 voted h so far.
        assert_eq!(t.outcome(&n.ctx), Agreement::Pending);
        t.add(&n.ctx, vote(&n, 3, 1, b"y")).unwrap();
        assert_eq!(t.outcome(&n.ctx), Agreement::Impossible);
    }

    #[test]
    fn tampered_certificates_are_rejected() {
        let n = net("any-2");
        let cert = Certificate {
            block: BlockNumber(2),
            ledger_block_hash: Digest::of(b"h"),
            votes: vec![vote(&n, 1, 2, b"h"), vote(&n, 2, 2, b"h")],
        };
        verify_certificate(&cert, &n.ctx).unwrap();
        let mut short = cert.clone();
        short.votes.pop();
        assert!(matches!(
            verify_certificate(&short, &n.ctx),
            Err(CertificateError::PolicyNotMet { .. })
        ));
        let mut doubled = cert.clone();
        doubled.votes[1] = doubled.votes[0].clone();
        assert!(matches!(
            verify_certificate(&doubled, &n.ctx),
            Err(CertificateError::BadVote { .. })
        ));
        let mut other_hash = cert.clone();
        other_hash.ledger_block_hash = Digest::of(b"x");
        assert!(matches!(
            verify_certificate(&other_hash, &n.ctx),
            Err(CertificateError::HashMismatch { .. })
        ));
        let mut forged = cert;
        // Re-pointing the votes at another hash without re-signing them.
        for v in &mut forged.votes {
            v.ledger_block_hash = Digest::of(b"h2");
        }
        forged.ledger_block_hash = Digest::of(b"h2");
        assert!(
            verify_certificate(&forged, &n.ctx)
                .unwrap_err()
                .to_string()
                .contains("bad signature")
        );
    }
}
