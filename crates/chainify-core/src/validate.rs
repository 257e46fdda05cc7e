//! Deterministic validation of an ordered block (docs/design/overview.md §2.3 step 1). The orderer
//! is untrusted: every organization re-checks every transaction against the network configuration
//! only, so honest organizations flag exactly the same transactions. Invalid transactions keep
//! their slot in the block (a 0 in the success bitmap) and are never executed.
//!
//! The block's signatures are checked first, all at once ([`BlockSignatures`]: batched, on all
//! cores, off the async reactor, none twice; a small block whose signatures were all checked
//! before is found so by hashing, in place), then the checks run in order on their verdicts.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::BlockNumber;
use crate::config::NetworkConfig;
use crate::crypto::Signatures;
use crate::tx::{ChainedTransaction, TransactionBlock, Verdict};
use crate::verify::{SignedBytes, Verifier};
use crate::{ClientId, NetworkId, OrgId, TxId};

/// Why a transaction of a block is invalid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// The block or proposal names another network.
    #[error("proposal is for network {0}, not this one")]
    WrongNetwork(String),
    /// The proposing client is not in the network configuration.
    #[error("unknown client {0}")]
    UnknownClient(ClientId),
    /// The client's signature does not verify.
    #[error("the signature of client {0} does not verify")]
    BadClientSignature(ClientId),
    /// An early-abort response is for another transaction.
    #[error("the response of {0} is for another transaction")]
    ResponseForOtherTransaction(OrgId),
    /// An early-abort response comes from an organization outside the network.
    #[error("response from unknown organization {0}")]
    UnknownOrg(OrgId),
    /// An early-abort response's signature does not verify.
    #[error("the response signature of {0} does not verify")]
    BadResponseSignature(OrgId),
    /// Two responses from one organization.
    #[error("two responses from {0}")]
    DuplicateResponse(OrgId),
    /// The accepting organizations do not satisfy the endorsement policy.
    #[error("accepted by {accepted:?}, which does not satisfy the endorsement policy")]
    NotEndorsed {
        /// The organizations that accepted.
        accepted: Vec<u32>,
    },
    /// The transaction is already in the ledger.
    #[error("transaction {0} is already in the ledger")]
    AlreadyInLedger(TxId),
    /// The transaction (or the client's nonce) appeared earlier in the block.
    #[error("duplicate of transaction {0} of this block")]
    DuplicateInBlock(usize),
}

/// The signatures [`validate_block`] looks at, per transaction in the order it looks at them:
/// the client's, then each early-abort response's up to the first that is for another
/// transaction, from an unknown organization, or a second one from an organization (which make
/// the transaction invalid without further checks).
#[derive(Debug)]
pub struct BlockSignatures {
    items: Vec<SignedBytes>,
    /// Where each transaction's signatures end in `items`.
    ends: Vec<usize>,
    /// Each transaction's id, hashed from the encoding its client's signature is over.
    ids: Vec<TxId>,
    block: BlockId,
}

/// Signatures, and bytes of signed messages, of a block that [`BlockSignatures::remembered`]
/// hashes where it is called (a microsecond or two a signature of a few hundred bytes): beyond
/// these the caller's thread would be held too long.
const REMEMBERED_INLINE: usize = 128;
const REMEMBERED_INLINE_BYTES: usize = 128 * 1024;

/// Which block verdicts are for: [`validate_block`] ignores verdicts of another block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlockId {
    number: BlockNumber,
    orderer_position: u64,
    transactions: usize,
}

impl BlockId {
    fn of(block: &TransactionBlock) -> BlockId {
        BlockId {
            number: block.number,
            orderer_position: block.orderer_position,
            transactions: block.transactions.len(),
        }
    }
}

impl BlockSignatures {
    /// Gathers them (encodings and, for a response signed as a batch, at most
    /// [`crate::batch::MAX_DEPTH`] + 1 hashes, the nodes shared with the block's other
    /// responses of its batch hashed once ([`crate::batch::Roots`]): no curve arithmetic).
    pub fn of(block: &TransactionBlock, network: &NetworkConfig) -> BlockSignatures {
        let mut items = Vec::new();
        let mut ends = Vec::with_capacity(block.transactions.len());
        let mut ids = Vec::with_capacity(block.transactions.len());
        // A block's responses are read by the rule of its number, at every organization and
        // on every replay alike.
        let batches = network.batches_at(block.number);
        let mut roots = crate::batch::Roots::default();
        for chained in &block.transactions {
            // One encoding a proposal: its id is its hash, and its client signed it.
            let (encoded, id) = chained.proposal.body.encode_with_id();
            ids.push(id);
            if block.network == network.network_id {
                gather(
                    chained,
                    network,
                    batches,
                    (encoded, id),
                    &mut roots,
                    &mut items,
                );
            }
            ends.push(items.len());
        }
        BlockSignatures {
            items,
            ends,
            ids,
            block: BlockId::of(block),
        }
    }

    /// The block's transaction ids, in order.
    pub fn ids(&self) -> &[TxId] {
        &self.ids
    }

    /// The verdicts, without curve arithmetic or a hand-off to another thread, when the block
    /// is small and `verifier` remembers every one of its signatures (checked at admission, or
    /// made by this organization); otherwise the signatures back for [`BlockSignatures::check`].
    /// Hashing a dozen signed messages takes microseconds, and a hand-off to the blocking pool
    /// took ~0.4 ms a block on a busy machine.
    pub fn remembered(self, verifier: &Verifier) -> Result<SignatureVerdicts, BlockSignatures> {
        let bytes: usize = self.items.iter().map(|i| i.message.len()).sum();
        if self.items.len() > REMEMBERED_INLINE
            || bytes > REMEMBERED_INLINE_BYTES
            || !verifier.remembers_all(&self.items)
        {
            return Err(self);
        }
        Ok(SignatureVerdicts {
            verdicts: vec![true; self.items.len()],
            ends: self.ends,
            ids: self.ids,
            block: self.block,
            rule: verifier.signatures(),
        })
    }

    /// Checks them all at once (CPU-bound: call it off the async reactor).
    pub fn check(self, verifier: &Verifier) -> SignatureVerdicts {
        SignatureVerdicts {
            verdicts: verifier.check_all(&self.items),
            ends: self.ends,
            ids: self.ids,
            block: self.block,
            rule: verifier.signatures(),
        }
    }
}

/// A transaction's signatures, given its body's encoding and its id.
fn gather<'a>(
    chained: &'a ChainedTransaction,
    network: &NetworkConfig,
    batches: bool,
    (encoded, id): (Vec<u8>, TxId),
    roots: &mut crate::batch::Roots<'a>,
    items: &mut Vec<SignedBytes>,
) {
    let proposal = &chained.proposal;
    if proposal.body.network != network.network_id {
        return;
    }
    let Some(client) = network.clients.get(&proposal.body.client) else {
        return;
    };
    items.push(SignedBytes {
        key: client.public_key,
        message: encoded,
        signature: proposal.signature,
    });
    let mut responders = BTreeSet::new();
    for response in &chained.responses {
        let Some(org) = network.orgs.get(&response.org) else {
            return;
        };
        if response.tx_id != id {
            return;
        }
        items.push(response.signed_by_among(org.public_key, batches, roots));
        if !responders.insert(response.org) {
            return;
        }
    }
}

/// Whether each signature of a [`BlockSignatures`] verifies.
#[derive(Debug)]
pub struct SignatureVerdicts {
    verdicts: Vec<bool>,
    ends: Vec<usize>,
    /// The transactions' ids, as [`BlockSignatures`] hashed them.
    ids: Vec<TxId>,
    block: BlockId,
    /// The rule they were reached by.
    rule: Signatures,
}

impl SignatureVerdicts {
    /// Transaction `index`'s verdicts, in the order they were gathered (none for a transaction
    /// out of range: a signature without a verdict never counts as verified).
    fn of(&self, index: usize) -> impl Iterator<Item = bool> + '_ {
        let end = self.ends.get(index).copied().unwrap_or(0);
        let start = match index {
            0 => 0,
            i => self.ends.get(i - 1).copied().unwrap_or(end),
        };
        self.verdicts.get(start..end).unwrap_or(&[]).iter().copied()
    }
}

/// Validates every transaction of `block`, given the verdicts on its [`BlockSignatures`]
/// (gathered from this same block: the verdicts carry its transaction ids).
/// `in_ledger` answers whether a transaction id is in the ledger already (it must answer from
/// agreed blocks only, so every organization agrees). Returns, per transaction, its id or why
/// it is invalid.
pub fn validate_block(
    block: &TransactionBlock,
    network: &NetworkConfig,
    signatures: &SignatureVerdicts,
    in_ledger: impl Fn(&TxId) -> bool,
) -> Vec<Result<TxId, Invalid>> {
    let mut seen_ids: BTreeMap<TxId, usize> = BTreeMap::new();
    let mut seen_nonces: HashSet<(ClientId, u64)> = HashSet::new();
    let mut nonce_at: BTreeMap<(ClientId, u64), usize> = BTreeMap::new();
    // Verdicts of another block, or by another rule than the network's, verify nothing.
    let usable = signatures.block == BlockId::of(block) && signatures.rule == network.signatures;
    block
        .transactions
        .iter()
        .enumerate()
        .map(|(index, chained)| {
            let proposal = &chained.proposal;
            let body = &proposal.body;
            let mut verified = signatures.of(index);
            let mut verified = move || usable && verified.next().unwrap_or(false);
            check_network(&block.network, network)?;
            check_network(&body.network, network)?;
            if !network.clients.contains_key(&body.client) {
                return Err(Invalid::UnknownClient(body.client.clone()));
            }
            if !verified() {
                return Err(Invalid::BadClientSignature(body.client.clone()));
            }
            // `usable` ties the verdicts to a block of this number, position and length, not to
            // its content: callers gather them from the very block they validate, so the ids
            // are its own (checked in debug builds).
            let id = signatures
                .ids
                .get(index)
                .copied()
                .unwrap_or_else(|| proposal.tx_id());
            debug_assert_eq!(id, proposal.tx_id(), "verdicts of another block");
            let mut responders = BTreeSet::new();
            let mut accepted = BTreeSet::new();
            for response in &chained.responses {
                if response.tx_id != id {
                    return Err(Invalid::ResponseForOtherTransaction(response.org));
                }
                if !network.orgs.contains_key(&response.org) {
                    return Err(Invalid::UnknownOrg(response.org));
                }
                if !verified() {
                    return Err(Invalid::BadResponseSignature(response.org));
                }
                if !responders.insert(response.org) {
                    return Err(Invalid::DuplicateResponse(response.org));
                }
                if response.verdict == Verdict::Accept {
                    accepted.insert(response.org);
                }
            }
            if !network.endorsement.is_satisfied_by(&accepted) {
                return Err(Invalid::NotEndorsed {
                    accepted: accepted.iter().map(|o| o.0).collect(),
                });
            }
            if in_ledger(&id) {
                return Err(Invalid::AlreadyInLedger(id));
            }
            if let Some(first) = seen_ids.get(&id) {
                return Err(Invalid::DuplicateInBlock(*first));
            }
            let nonce = (body.client.clone(), body.nonce);
            if !seen_nonces.insert(nonce.clone()) {
                return Err(Invalid::DuplicateInBlock(
                    nonce_at.get(&nonce).copied().unwrap_or(index),
                ));
            }
            nonce_at.insert(nonce, index);
            seen_ids.insert(id, index);
            Ok(id)
        })
        .collect()
}

fn check_network(named: &NetworkId, network: &NetworkConfig) -> Result<(), Invalid> {
    if named == &network.network_id {
        Ok(())
    } else {
        Err(Invalid::WrongNetwork(named.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockNumber;
    use crate::config::{NetworkBuilder, PortPlan};
    use crate::crypto::SigningKey;
    use crate::tx::{
        ChainedTransaction, EarlyAbortResponse, Proposal, ProposalBody, Statement, Transaction,
    };

    /// Validation as an organization runs it, with a verifier of its own.
    fn validate(
        b: &TransactionBlock,
        n: &NetworkConfig,
        in_ledger: impl Fn(&TxId) -> bool,
    ) -> Vec<Result<TxId, Invalid>> {
        let verdicts = BlockSignatures::of(b, n).check(&Verifier::new(n.signatures));
        validate_block(b, n, &verdicts, in_ledger)
    }

    fn org_key(i: u8) -> SigningKey {
        SigningKey::from_seed(&[i; 32])
    }

    fn client_key() -> SigningKey {
        SigningKey::from_seed(&[42; 32])
    }

    fn network() -> NetworkConfig {
        let mut b = NetworkBuilder::new("net", "any-2", PortPlan { base: 7010 })
            .endorsement_policy("any-2");
        for i in 1..=3u8 {
            b.org(&org_key(i).public_key(), "127.0.0.1");
        }
        b.client("alice", &client_key().public_key(), Vec::new());
        b.config("network.toml").unwrap()
    }

    fn chained(nonce: u64, endorsers: &[u8]) -> ChainedTransaction {
        let body = ProposalBody {
            client: ClientId::new("alice").unwrap(),
            nonce,
            network: NetworkId::new("net").unwrap(),
            transaction: Transaction {
                statements: vec![Statement::new("UPDATE kv SET v = 1 WHERE k = 1", vec![])],
            },
        };
        let signature = client_key().sign(&body.encode_canonical());
        let proposal = Proposal { body, signature };
        let id = proposal.tx_id();
        ChainedTransaction {
            responses: endorsers
                .iter()
                .map(|o| {
                    EarlyAbortResponse::new_signed(
                        id,
                        OrgId(u32::from(*o)),
                        Verdict::Accept,
                        &org_key(*o),
                    )
                })
                .collect(),
            proposal,
        }
    }

    fn block(txs: Vec<ChainedTransaction>) -> TransactionBlock {
        TransactionBlock {
            network: NetworkId::new("net").unwrap(),
            number: BlockNumber(0),
            transactions: txs,
            orderer_position: 1,
        }
    }

    #[test]
    fn the_gathered_ids_are_each_transaction_s_own_even_where_nothing_is_gathered() {
        let n = network();
        let mut foreign = chained(7, &[1, 2]);
        foreign.proposal.body.network = NetworkId::new("elsewhere").unwrap();
        let mut stranger = chained(8, &[1, 2]);
        stranger.proposal.body.client = ClientId::new("mallory").unwrap();
        let b = block(vec![chained(6, &[1, 2]), foreign, stranger]);
        let gathered = BlockSignatures::of(&b, &n);
        let ids: Vec<TxId> = b.transactions.iter().map(|t| t.proposal.tx_id()).collect();
        assert_eq!(gathered.ids(), ids.as_slice());
        let verdicts = gathered.check(&Verifier::new(n.signatures));
        assert_eq!(
            validate_block(&b, &n, &verdicts, |_| false),
            vec![
                Ok(ids[0]),
                Err(Invalid::WrongNetwork("elsewhere".into())),
                Err(Invalid::UnknownClient(ClientId::new("mallory").unwrap())),
            ]
        );
    }

    /// Organization 2's responses to four transactions, signed as one batch.
    fn batch_endorsed(first_nonce: u64) -> Vec<ChainedTransaction> {
        let mut txs: Vec<ChainedTransaction> =
            (0..4).map(|i| chained(first_nonce + i, &[1])).collect();
        let answers = txs
            .iter()
            .map(|t| (t.proposal.tx_id(), Verdict::Accept))
            .collect();
        let signed = EarlyAbortResponse::sign_batch(OrgId(2), answers, |b| org_key(2).sign(&b));
        for (t, r) in txs.iter_mut().zip(signed) {
            t.responses.push(r);
        }
        txs
    }

    /// Responses signed as a batch count from the network file's `response_batches_from` on,
    /// by the block's number: every organization, now or replaying, reads a block alike. Before
    /// it a response reads as a node that predates batches reads it (signed alone: a proof is
    /// ignored), from it a proof counts, and each response counts for its own transaction only.
    #[test]
    fn batch_signed_responses_count_from_the_networks_height_on() {
        let n = NetworkConfig {
            response_batches_from: Some(5),
            ..network()
        };
        let at = |txs: &[ChainedTransaction], number: u64| TransactionBlock {
            number: BlockNumber(number),
            ..block(txs.to_vec())
        };
        let mut txs = batch_endorsed(10);
        // A response moved to another transaction of the batch.
        let moved = txs[1].responses[1].clone();
        txs[3].responses[1] = EarlyAbortResponse {
            tx_id: txs[3].proposal.tx_id(),
            ..moved
        };
        // A response signed alone, with a well-formed proof attached by someone else.
        let mut junk = chained(20, &[1, 2]);
        junk.responses[1].batch = Some(crate::batch::BatchProof {
            index: 0,
            siblings: vec![crate::Digest::of(b"junk")],
        });
        txs.push(junk);
        let ids: Vec<TxId> = txs.iter().map(|t| t.proposal.tx_id()).collect();
        let bad = Err(Invalid::BadResponseSignature(OrgId(2)));
        assert_eq!(
            validate(&at(&txs, 4), &n, |_| false),
            [
                bad.clone(),
                bad.clone(),
                bad.clone(),
                bad.clone(),
                Ok(ids[4])
            ]
        );
        let from = validate(&at(&txs, 5), &n, |_| false);
        assert_eq!(
            from,
            [Ok(ids[0]), Ok(ids[1]), Ok(ids[2]), bad.clone(), bad.clone()]
        );
        // A network without the setting never counts a proof.
        let never = NetworkConfig {
            response_batches_from: None,
            ..network()
        };
        assert_eq!(
            validate(&at(&txs, 9), &never, |_| false),
            validate(&at(&txs, 4), &n, |_| false)
        );
        // The same verdicts from a verifier that remembers the batch's root and checks the
        // rest of the block without it.
        let verifier = Verifier::new(n.signatures);
        let _ = BlockSignatures::of(&at(&txs[..1], 5), &n).check(&verifier);
        let b = at(&txs, 5);
        let verdicts = BlockSignatures::of(&b, &n).check(&verifier);
        assert_eq!(validate_block(&b, &n, &verdicts, |_| false), from);
    }

    #[test]
    fn each_forgery_is_flagged_deterministically() {
        let n = network();
        let good = chained(1, &[1, 2]);
        let good_id = good.proposal.tx_id();
        let mut forged_client = chained(2, &[1, 2]);
        forged_client.proposal.body.nonce = 99;
        let short = chained(3, &[1]);
        let mut rejected = chained(4, &[1]);
        rejected.responses.push(EarlyAbortResponse::new_signed(
            rejected.proposal.tx_id(),
            OrgId(2),
            Verdict::Reject("no".into()),
            &org_key(2),
        ));
        let mut forged_response = chained(5, &[1, 2]);
        forged_response.responses[1].org = OrgId(3);
        let mut other_tx = chained(6, &[1, 2]);
        other_tx.responses[0].tx_id = good_id;
        let twice = chained(7, &[1, 1]);
        let mut stranger = chained(8, &[1, 2]);
        stranger.proposal.body.client = ClientId::new("mallory").unwrap();
        let old = chained(9, &[2, 3]);
        let old_id = old.proposal.tx_id();
        let b = block(vec![
            good.clone(),
            forged_client,
            short,
            rejected,
            forged_response,
            other_tx,
            twice,
            stranger,
            old,
            good,
        ]);
        let out = validate(&b, &n, |id| *id == old_id);
        assert_eq!(out[0], Ok(good_id));
        assert_eq!(
            out[1],
            Err(Invalid::BadClientSignature(ClientId::new("alice").unwrap()))
        );
        assert_eq!(out[2], Err(Invalid::NotEndorsed { accepted: vec![1] }));
        assert_eq!(out[3], Err(Invalid::NotEndorsed { accepted: vec![1] }));
        assert_eq!(out[4], Err(Invalid::BadResponseSignature(OrgId(3))));
        assert_eq!(out[5], Err(Invalid::ResponseForOtherTransaction(OrgId(1))));
        assert_eq!(out[6], Err(Invalid::DuplicateResponse(OrgId(1))));
        assert_eq!(
            out[7],
            Err(Invalid::UnknownClient(ClientId::new("mallory").unwrap()))
        );
        assert_eq!(out[8], Err(Invalid::AlreadyInLedger(old_id)));
        assert_eq!(out[9], Err(Invalid::DuplicateInBlock(0)));
    }

    #[test]
    fn an_unsigned_network_checks_everything_but_signatures() {
        let mut n = network();
        n.signatures = crate::crypto::Signatures::Off;
        let mut forged_client = chained(1, &[1, 2]);
        forged_client.proposal.signature = crate::crypto::Signature([1; 64]);
        let mut forged_response = chained(2, &[1, 2]);
        forged_response.responses[1].org = OrgId(3);
        let short = chained(3, &[1]);
        let mut stranger = chained(4, &[1, 2]);
        stranger.proposal.body.client = ClientId::new("mallory").unwrap();
        let out = validate(
            &block(vec![forged_client, forged_response, short, stranger]),
            &n,
            |_| false,
        );
        assert!(out[0].is_ok() && out[1].is_ok(), "{out:?}");
        assert_eq!(out[2], Err(Invalid::NotEndorsed { accepted: vec![1] }));
        assert_eq!(
            out[3],
            Err(Invalid::UnknownClient(ClientId::new("mallory").unwrap()))
        );
    }

    /// A small block whose signatures all passed this organization's checks before is
    /// validated without checking any again, with the verdicts a full check reaches; one
    /// signature it has not seen, or a large block, goes to the full check.
    #[test]
    fn remembered_signatures_are_found_by_hashing_alone() {
        let n = network();
        let forged = {
            let mut t = chained(3, &[1, 2]);
            t.proposal.body.nonce = 99;
            t
        };
        let seen = block(vec![chained(1, &[1, 2]), chained(2, &[2, 3])]);
        let verifier = Verifier::new(n.signatures);
        let unseen = BlockSignatures::of(&seen, &n)
            .remembered(&verifier)
            .expect_err("nothing remembered yet");
        let checked = unseen.check(&verifier);
        let remembered = BlockSignatures::of(&seen, &n)
            .remembered(&verifier)
            .expect("every signature remembered by the check");
        assert_eq!(
            validate_block(&seen, &n, &remembered, |_| false),
            validate_block(&seen, &n, &checked, |_| false)
        );
        assert!(
            validate_block(&seen, &n, &remembered, |_| false)
                .iter()
                .all(Result::is_ok)
        );
        // A forged proposal beside remembered ones: checked in full, and refused.
        let mixed = block(vec![chained(1, &[1, 2]), forged]);
        let Err(signatures) = BlockSignatures::of(&mixed, &n).remembered(&verifier) else {
            panic!("a signature never verified is not remembered");
        };
        let out = validate_block(&mixed, &n, &signatures.check(&verifier), |_| false);
        assert!(out[0].is_ok());
        assert_eq!(
            out[1],
            Err(Invalid::BadClientSignature(ClientId::new("alice").unwrap()))
        );
        // Up to 128 signatures and 128 KiB of messages hashed in place, not one more.
        let verifier = Verifier::new(n.signatures);
        let in_place = |b: &TransactionBlock| {
            let _ = BlockSignatures::of(b, &n).check(&verifier);
            BlockSignatures::of(b, &n).remembered(&verifier).is_ok()
        };
        let signed = |count: u64| block((0..count).map(|i| chained(i, &[1])).collect());
        // Each transaction carries two signatures: the client's and one response.
        assert!(in_place(&signed(REMEMBERED_INLINE as u64 / 2)));
        let mut one_more = signed(REMEMBERED_INLINE as u64 / 2);
        one_more.transactions.push(chained(1000, &[]));
        assert!(!in_place(&one_more));
        let mut long = chained(2000, &[]);
        long.proposal.body.transaction.statements = vec![Statement::new(
            format!(
                "UPDATE kv SET v = '{}' WHERE k = 1",
                "x".repeat(REMEMBERED_INLINE_BYTES)
            ),
            vec![],
        )];
        long.proposal.signature = client_key().sign(&long.proposal.body.encode_canonical());
        assert!(!in_place(&block(vec![long])));
        // Without signatures there is nothing to remember or check.
        let unsigned = NetworkConfig {
            signatures: Signatures::Off,
            ..n.clone()
        };
        assert!(
            BlockSignatures::of(&mixed, &unsigned)
                .remembered(&Verifier::new(Signatures::Off))
                .is_ok()
        );
    }

    #[test]
    fn a_block_for_another_network_is_invalid_throughout() {
        let n = network();
        let mut b = block(vec![chained(1, &[1, 2])]);
        b.network = NetworkId::new("other").unwrap();
        assert_eq!(
            validate(&b, &n, |_| false),
            vec![Err(Invalid::WrongNetwork("other".into()))]
        );
    }

    #[test]
    fn verdicts_of_another_block_or_rule_never_validate_a_transaction() {
        let n = network();
        let b = block(vec![chained(1, &[1, 2]), chained(2, &[2, 3])]);
        let alice = ClientId::new("alice").unwrap();
        let refused = vec![
            Err(Invalid::BadClientSignature(alice.clone())),
            Err(Invalid::BadClientSignature(alice)),
        ];
        let verifier = Verifier::new(n.signatures);
        let empty = BlockSignatures::of(&block(vec![]), &n).check(&verifier);
        assert_eq!(validate_block(&b, &n, &empty, |_| false), refused);
        // Same shape, another block: every verdict true, none of them for this block.
        let mut other = b.clone();
        other.number = BlockNumber(7);
        let others = BlockSignatures::of(&other, &n).check(&verifier);
        assert_eq!(validate_block(&b, &n, &others, |_| false), refused);
        // This block's verdicts with signatures off, for a network that signs.
        let unchecked = BlockSignatures::of(&b, &n).check(&Verifier::new(Signatures::Off));
        assert_eq!(validate_block(&b, &n, &unchecked, |_| false), refused);
        let checked = BlockSignatures::of(&b, &n).check(&verifier);
        assert!(
            validate_block(&b, &n, &checked, |_| false)
                .iter()
                .all(Result::is_ok)
        );
    }

    /// A transaction with one of the ways it can be forged (0: none).
    fn forged(nonce: u64, how: u8) -> ChainedTransaction {
        let mut t = chained(nonce, &[1, 2, 3]);
        match how {
            1 => t.proposal.signature.0[5] ^= 1,
            2 => t.responses[1].signature.0[9] ^= 1,
            3 => t.responses[2].org = OrgId(1),
            4 => t.responses[0].tx_id = TxId(crate::Digest::of(b"other")),
            5 => t.responses[1].org = OrgId(9),
            6 => t.responses[2].verdict = Verdict::Reject("changed".into()),
            7 => t.proposal.body.client = ClientId::new("mallory").unwrap(),
            8 => t.responses.truncate(1),
            _ => {}
        }
        t
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Batched checks, checks an organization remembers (in part, or because it made the
        /// signature) and single checks give the same verdicts on any mix of forgeries.
        #[test]
        fn batching_and_memory_never_change_a_verdict(
            kinds in proptest::collection::vec(0u8..9, 1..48),
            warm in proptest::collection::vec(proptest::bool::ANY, 48),
        ) {
            let n = network();
            let b = block(
                kinds.iter().enumerate().map(|(i, k)| forged(i as u64, *k)).collect(),
            );
            let fresh = validate(&b, &n, |_| false);

            let single = {
                let gathered = BlockSignatures::of(&b, &n);
                SignatureVerdicts {
                    verdicts: gathered
                        .items
                        .iter()
                        .map(|i| i.verify(n.signatures).is_ok())
                        .collect(),
                    ends: gathered.ends,
                    ids: gathered.ids,
                    block: gathered.block,
                    rule: n.signatures,
                }
            };
            proptest::prop_assert_eq!(&fresh, &validate_block(&b, &n, &single, |_| false));

            // An organization that already checked some of these transactions alone, and signed
            // org 2's responses itself.
            let verifier = Verifier::new(n.signatures);
            for (t, w) in b.transactions.iter().zip(&warm) {
                if *w {
                    let one = block(vec![t.clone()]);
                    BlockSignatures::of(&one, &n).check(&verifier);
                }
                let _ = verifier.sign(&org_key(2), EarlyAbortResponse::signing_bytes(
                    &t.proposal.tx_id(), OrgId(2), &Verdict::Accept,
                ));
            }
            let remembered = BlockSignatures::of(&b, &n).check(&verifier);
            proptest::prop_assert_eq!(&fresh, &validate_block(&b, &n, &remembered, |_| false));
            proptest::prop_assert!(
                fresh.iter().zip(&kinds).all(|(r, k)| r.is_ok() == (*k == 0)),
                "{:?} {:?}", kinds, fresh
            );
        }
    }
}
