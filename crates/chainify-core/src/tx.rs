//! Transactions, blocks, votes and certificates: the domain types of the pipeline, with their
//! canonical encodings (see [`crate::canonical`]), ids, hashes and signatures.

use crate::batch::BatchProof;
use crate::canonical::Encoder;
use crate::crypto::{CryptoError, PublicKey, Signature, Signatures, SigningKey};
use crate::verify::SignedBytes;
use crate::{BlockNumber, ClientId, Digest, NetworkId, OrgId, TxId, Value};

/// One SQL statement with its typed parameters.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Statement {
    /// SQL text in the portable subset with `$1..$n` placeholders.
    pub sql: String,
    /// Values for `$1..$n`.
    pub params: Vec<Value>,
    /// Abort the transaction unless exactly this many rows are affected.
    pub expect_rows: Option<u64>,
}

impl Statement {
    /// A statement without an `expect_rows` guard.
    pub fn new(sql: impl Into<String>, params: Vec<Value>) -> Self {
        Statement {
            sql: sql.into(),
            params,
            expect_rows: None,
        }
    }

    /// Adds an `expect_rows` guard.
    pub fn expect_rows(mut self, rows: u64) -> Self {
        self.expect_rows = Some(rows);
        self
    }

    /// Layout: `string sql, list<value> params, option<u64> expect_rows`.
    fn encode(&self, e: &mut Encoder) {
        e.str(&self.sql).count(self.params.len());
        for p in &self.params {
            e.value(p);
        }
        e.opt_u64(self.expect_rows);
    }
}

/// An ordered list of statements executed atomically.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Transaction {
    /// The statements, in execution order.
    pub statements: Vec<Statement>,
}

/// Most bytes of a proposal's canonical encoding ([`ProposalBody::encode_canonical`]). Clients
/// choose the size; blocks are cut by count, so without a bound per transaction one client's
/// large transactions would make a block too large for the messages that carry it (an audit
/// stalled an organization for good with a 78 MB block), and each proposal fits a Kafka
/// message (1 MB by default) with its endorsements.
pub const MAX_TRANSACTION_BYTES: usize = 512 * 1024;

/// Most bytes of an ordered transaction's protobuf encoding (`chainify.v1.ChainedTransaction`:
/// the proposal, whose wire encoding the origin also holds to [`MAX_TRANSACTION_BYTES`], its
/// signature and endorsements). Kafka consumers skip a longer log entry, all alike: any
/// organization can produce to the topic, and blocks of longer ones would pass what a node
/// sends its execution process ([`max_block_bytes`]), which would refuse them for good.
pub const MAX_ORDERED_TRANSACTION_BYTES: usize = MAX_TRANSACTION_BYTES + 63 * 1024;

/// Most bytes a block of `max_block_txs` transactions takes in a message: each at most
/// [`MAX_ORDERED_TRANSACTION_BYTES`], and 1 KiB of framing.
pub fn max_block_bytes(max_block_txs: usize) -> usize {
    max_block_txs.saturating_mul(MAX_ORDERED_TRANSACTION_BYTES + 1024)
}

/// The unsigned content of a proposal: what the client signs and what the transaction id hashes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ProposalBody {
    /// The proposing client.
    pub client: ClientId,
    /// Unique per client; a replayed (client, nonce) is rejected.
    pub nonce: u64,
    /// The network the proposal is for.
    pub network: NetworkId,
    /// The transaction.
    pub transaction: Transaction,
}

impl ProposalBody {
    /// Domain tag of the proposal encoding.
    pub const TAG: &'static str = "chainify.v1.Proposal";

    /// Layout: tag, `string client, u64 nonce, string network, list<statement>`.
    pub fn encode_canonical(&self) -> Vec<u8> {
        let mut e = Encoder::new(Self::TAG);
        e.str(self.client.as_str())
            .u64(self.nonce)
            .str(self.network.as_str())
            .count(self.transaction.statements.len());
        for s in &self.transaction.statements {
            s.encode(&mut e);
        }
        e.finish()
    }

    /// The transaction id: SHA-256 of the canonical encoding.
    pub fn tx_id(&self) -> TxId {
        self.encode_with_id().1
    }

    /// The canonical encoding (what the client signs) and the id hashed from it, for a caller
    /// that needs both.
    pub fn encode_with_id(&self) -> (Vec<u8>, TxId) {
        let encoded = self.encode_canonical();
        let id = TxId(Digest::of(&encoded));
        (encoded, id)
    }

    /// Signs the body with the client's key.
    pub fn sign(self, key: &SigningKey) -> Proposal {
        self.sign_as(key, Signatures::Ed25519)
    }

    /// Signs the body with the client's key, or not when the network's signatures are off.
    pub fn sign_as(self, key: &SigningKey, signatures: Signatures) -> Proposal {
        let signature = signatures.sign(key, &self.encode_canonical());
        Proposal {
            body: self,
            signature,
        }
    }
}

/// A client-signed proposal.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Proposal {
    /// What was signed.
    pub body: ProposalBody,
    /// The client's signature over `body`'s canonical encoding.
    pub signature: Signature,
}

impl Proposal {
    /// The transaction id.
    pub fn tx_id(&self) -> TxId {
        self.body.tx_id()
    }

    /// Checks the client's signature by RFC 8032 (valid under every rule; a network checks
    /// [`Self::signed_by`] by its own rule).
    pub fn verify(&self, client_key: &PublicKey) -> Result<(), CryptoError> {
        client_key.verify(&self.body.encode_canonical(), &self.signature)
    }

    /// The client's signature, to be checked with others ([`crate::verify::Verifier`]).
    pub fn signed_by(&self, client_key: PublicKey) -> SignedBytes {
        SignedBytes {
            key: client_key,
            message: self.body.encode_canonical(),
            signature: self.signature,
        }
    }
}

/// A client's read-only query, as signed (reads are subject to grants too).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct QueryBody {
    /// The querying client.
    pub client: ClientId,
    /// The network queried (the server's own; not sent on the wire, but signed).
    pub network: NetworkId,
    /// The organization queried (the server's own; not sent on the wire, but signed): a query
    /// one organization received cannot be replayed at another in the client's name, where it
    /// would take the client's share of that organization's query slots.
    pub org: OrgId,
    /// One SELECT.
    pub sql: String,
    /// Values for `$1..$n`.
    pub params: Vec<Value>,
    /// A value the client picks at random for this query alone. The organization's signed
    /// answer covers the query's encoding, so an answer to an earlier query (an older state)
    /// cannot be passed off as the answer to this one. `None`: a client of an earlier version.
    pub nonce: Option<[u8; QUERY_NONCE_BYTES]>,
}

/// Length of a query's nonce ([`QueryBody::nonce`]).
pub const QUERY_NONCE_BYTES: usize = 16;

impl QueryBody {
    /// Domain tag of the query encoding (a new tag for the layout that names the
    /// organization, so that no signature over the old layout reads as one over the new).
    pub const TAG: &'static str = "chainify.v1.OrgQuery";

    /// Domain tag of the layout with a nonce.
    pub const TAG_FRESH: &'static str = "chainify.v1.FreshQuery";

    /// Layout: tag, `string client, string network, u32 org, string sql, list<value> params`,
    /// then, under [`Self::TAG_FRESH`], `bytes nonce`.
    pub fn encode_canonical(&self) -> Vec<u8> {
        let tag = if self.nonce.is_some() {
            Self::TAG_FRESH
        } else {
            Self::TAG
        };
        let mut e = Encoder::new(tag);
        e.str(self.client.as_str())
            .str(self.network.as_str())
            .u32(self.org.0)
            .str(&self.sql)
            .count(self.params.len());
        for p in &self.params {
            e.value(p);
        }
        if let Some(nonce) = &self.nonce {
            e.bytes(nonce);
        }
        e.finish()
    }

    /// Checks the client's signature over the query by RFC 8032 (valid under every rule; a
    /// network checks [`Self::signed_by`] by its own rule).
    pub fn verify(&self, client_key: &PublicKey, signature: &Signature) -> Result<(), CryptoError> {
        client_key.verify(&self.encode_canonical(), signature)
    }

    /// The client's signature over the query, to be checked by the network's rule.
    pub fn signed_by(&self, client_key: PublicKey, signature: Signature) -> SignedBytes {
        SignedBytes {
            key: client_key,
            message: self.encode_canonical(),
            signature,
        }
    }
}

/// An organization's answer to a query, as it signs it with its own key: query answers are
/// provable, to the client and to anyone it shows them to, and no other party (another
/// organization, whoever holds the TLS CA's key) can answer in the organization's name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QueryAnswer<'a> {
    /// SHA-256 of the query's canonical encoding ([`QueryBody::encode_canonical`]): it names
    /// the client, network, organization, SQL and parameters answered.
    pub query: Digest,
    /// The agreed block height the rows reflect.
    pub height: u64,
    /// Column names.
    pub columns: &'a [String],
    /// The rows, in the query's order.
    pub rows: &'a [Vec<Value>],
}

impl QueryAnswer<'_> {
    /// Domain tag of the answer encoding.
    pub const TAG: &'static str = "chainify.v1.QueryAnswer";

    /// Layout: tag, `digest query, u64 height, list<string> columns, list<list<value>> rows`.
    pub fn encode_canonical(&self) -> Vec<u8> {
        let mut e = Encoder::new(Self::TAG);
        e.digest(&self.query)
            .u64(self.height)
            .count(self.columns.len());
        for c in self.columns {
            e.str(c);
        }
        e.count(self.rows.len());
        for row in self.rows {
            e.count(row.len());
            for v in row {
                e.value(v);
            }
        }
        e.finish()
    }

    /// The answering organization's signature.
    pub fn sign(&self, key: &SigningKey) -> Signature {
        key.sign(&self.encode_canonical())
    }

    /// Checks the answering organization's signature by RFC 8032 (what every rule accepts of
    /// a signature made by [`Self::sign`]).
    pub fn verify(&self, org_key: &PublicKey, signature: &Signature) -> Result<(), CryptoError> {
        org_key.verify(&self.encode_canonical(), signature)
    }
}

/// An organization's early-abort verdict.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// The organization would execute the proposal.
    Accept,
    /// The organization rejects it, with the reason.
    Reject(String),
}

/// A signed early-abort response.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct EarlyAbortResponse {
    /// The proposal's transaction id.
    pub tx_id: TxId,
    /// The answering organization.
    pub org: OrgId,
    /// Accept or reject.
    pub verdict: Verdict,
    /// The organization's signature: over [`Self::signing_bytes`] when it answered alone, over
    /// the root of its batch's Merkle tree when `batch` is set ([`crate::batch`]).
    pub signature: Signature,
    /// The response's path to the root its organization signed, when it signed a batch.
    pub batch: Option<BatchProof>,
}

impl EarlyAbortResponse {
    /// Domain tag of the response encoding.
    pub const TAG: &'static str = "chainify.v1.EarlyAbortResponse";

    /// Layout: tag, `digest tx_id, u32 org, bool accept, string reason` (empty when accepted).
    pub fn signing_bytes(tx_id: &TxId, org: OrgId, verdict: &Verdict) -> Vec<u8> {
        let mut e = Encoder::new(Self::TAG);
        e.digest(&tx_id.0).u32(org.0);
        match verdict {
            Verdict::Accept => e.bool(true).str(""),
            Verdict::Reject(reason) => e.bool(false).str(reason),
        };
        e.finish()
    }

    /// Creates and signs a response.
    pub fn new_signed(tx_id: TxId, org: OrgId, verdict: Verdict, key: &SigningKey) -> Self {
        Self::new_as(tx_id, org, verdict, key, Signatures::Ed25519)
    }

    /// Creates a response, signed unless the network's signatures are off.
    pub fn new_as(
        tx_id: TxId,
        org: OrgId,
        verdict: Verdict,
        key: &SigningKey,
        signatures: Signatures,
    ) -> Self {
        Self::new_with(tx_id, org, verdict, |bytes| signatures.sign(key, &bytes))
    }

    /// Creates a response signed by `sign` (given the bytes to sign): an organization signs
    /// through its [`crate::verify::Verifier`], which remembers its own signatures.
    pub fn new_with(
        tx_id: TxId,
        org: OrgId,
        verdict: Verdict,
        sign: impl FnOnce(Vec<u8>) -> Signature,
    ) -> Self {
        let signature = sign(Self::signing_bytes(&tx_id, org, &verdict));
        EarlyAbortResponse {
            tx_id,
            org,
            verdict,
            signature,
            batch: None,
        }
    }

    /// `org`'s responses to a batch of proposals, signed together by `sign` (given the bytes to
    /// sign): a Merkle tree's root for each [`crate::batch::MAX_LEAVES`] of them
    /// ([`crate::batch`]), the response itself when one is left alone.
    pub fn sign_batch(
        org: OrgId,
        answers: Vec<(TxId, Verdict)>,
        mut sign: impl FnMut(Vec<u8>) -> Signature,
    ) -> Vec<Self> {
        let mut signed = Vec::with_capacity(answers.len());
        let mut rest = answers;
        while !rest.is_empty() {
            let after = rest.split_off(rest.len().min(crate::batch::MAX_LEAVES));
            signed.extend(Self::sign_tree(org, rest, &mut sign));
            rest = after;
        }
        signed
    }

    /// At most [`crate::batch::MAX_LEAVES`] answers under one signature (or one alone).
    fn sign_tree(
        org: OrgId,
        answers: Vec<(TxId, Verdict)>,
        sign: &mut dyn FnMut(Vec<u8>) -> Signature,
    ) -> Vec<Self> {
        if answers.len() < 2 {
            return answers
                .into_iter()
                .map(|(tx_id, verdict)| Self::new_with(tx_id, org, verdict, &mut *sign))
                .collect();
        }
        let leaves: Vec<Vec<u8>> = answers
            .iter()
            .map(|(tx_id, verdict)| Self::signing_bytes(tx_id, org, verdict))
            .collect();
        let (signature, proofs) = crate::batch::sign_leaves(org, &leaves, sign);
        answers
            .into_iter()
            .zip(proofs)
            .map(|((tx_id, verdict), proof)| EarlyAbortResponse {
                tx_id,
                org,
                verdict,
                signature,
                batch: Some(proof),
            })
            .collect()
    }

    /// The bytes the signature is over: its batch's root message when the network counts
    /// batches (`batches`, the network file's `response_batches`) and the proof is well formed
    /// ([`BatchProof::check`]), the response's own otherwise. A network without batches reads a
    /// response as a node that predates them does (it never sees the proof), so a rolling
    /// upgrade never splits the organizations.
    pub fn signed_message(&self, batches: bool) -> Vec<u8> {
        self.signed_message_by(batches, |proof, own| proof.root(own))
    }

    /// [`Self::signed_message`], with the batch's root found by `root` (given the proof and
    /// the response's own signing bytes).
    fn signed_message_by<'a>(
        &'a self,
        batches: bool,
        root: impl FnOnce(&'a crate::batch::BatchProof, &[u8]) -> Digest,
    ) -> Vec<u8> {
        let own = Self::signing_bytes(&self.tx_id, self.org, &self.verdict);
        match &self.batch {
            Some(proof) if batches && proof.check().is_ok() => {
                crate::batch::root_message(self.org, &root(proof, &own))
            }
            _ => own,
        }
    }

    /// Checks the organization's signature by RFC 8032 (valid under every rule; a network checks
    /// [`Self::signed_by`] by its own rule), with batches counted.
    pub fn verify(&self, org_key: &PublicKey) -> Result<(), CryptoError> {
        org_key.verify(&self.signed_message(true), &self.signature)
    }

    /// The organization's signature, to be checked with others, in a network that counts
    /// batches or not ([`Self::signed_message`]). The responses of one batch give the same
    /// triple: a [`crate::verify::Verifier`] checks it once.
    pub fn signed_by(&self, org_key: PublicKey, batches: bool) -> SignedBytes {
        SignedBytes {
            key: org_key,
            message: self.signed_message(batches),
            signature: self.signature,
        }
    }

    /// [`Self::signed_by`] for one of many responses gathered together: the batch's root is
    /// hashed through `roots`, which shares the nodes the responses of one batch have in
    /// common (the same message either way).
    pub fn signed_by_among<'a>(
        &'a self,
        org_key: PublicKey,
        batches: bool,
        roots: &mut crate::batch::Roots<'a>,
    ) -> SignedBytes {
        SignedBytes {
            key: org_key,
            message: self.signed_message_by(batches, |proof, own| roots.root(proof, own)),
            signature: self.signature,
        }
    }
}

/// What a forwarding organization signs over an early-abort batch: it proves which
/// organization forwards the proposals (the receiver claims the clients' nonces for it).
#[derive(Debug)]
pub struct EarlyAbortBatch;

impl EarlyAbortBatch {
    /// Domain tag of the batch encoding.
    pub const TAG: &'static str = "chainify.v1.EarlyAbortBatch";

    /// Layout: tag, `string network, u32 from_org, u32 count, digest tx_id…`.
    pub fn signing_bytes(network: &NetworkId, from: OrgId, tx_ids: &[TxId]) -> Vec<u8> {
        let mut e = Encoder::new(Self::TAG);
        e.str(network.as_str())
            .u32(from.0)
            .u32(u32::try_from(tx_ids.len()).unwrap_or(u32::MAX));
        for id in tx_ids {
            e.digest(&id.0);
        }
        e.finish()
    }
}

/// A proposal with the responses that endorse it: what the orderer orders.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChainedTransaction {
    /// The client's proposal.
    pub proposal: Proposal,
    /// Early-abort responses (validators check they satisfy the endorsement policy).
    pub responses: Vec<EarlyAbortResponse>,
}

/// A block as cut by the orderer. Nothing in it is trusted until validated.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TransactionBlock {
    /// The network.
    pub network: NetworkId,
    /// The block number.
    pub number: BlockNumber,
    /// Transactions in block order.
    pub transactions: Vec<ChainedTransaction>,
    /// Orderer position after this block (resume point).
    pub orderer_position: u64,
}

/// The record organizations vote on: the effect of one block.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LedgerBlock {
    /// The network.
    pub network: NetworkId,
    /// The block number.
    pub number: BlockNumber,
    /// Transaction ids in block order.
    pub tx_ids: Vec<TxId>,
    /// Whether each transaction committed.
    pub success: Vec<bool>,
    /// Whether each transaction passed validation (signatures, endorsements, not a replay):
    /// exactly these ids are recorded against replays. A state transfer rebuilds that record
    /// from the ledger, so it is certified with the block.
    pub valid: Vec<bool>,
    /// Hash over the block's digest-table rows.
    pub hash_digest: Digest,
    /// Digest of the shared tables' whole content after the block ([`crate::state`]).
    pub state_digest: Digest,
    /// Hash of the previous LedgerBlock ([`Digest::ZERO`] for block 1).
    pub hash_previous: Digest,
    /// Orderer position after this block.
    pub orderer_position: u64,
}

/// Where and how a transaction ended: what clients, the cluster and the benchmarks read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxOutcome {
    /// The transaction.
    pub tx_id: TxId,
    /// Its block.
    pub block: BlockNumber,
    /// Its position in the block.
    pub index: u32,
    /// Whether it committed (false: aborted by a statement, an `expect_rows` guard, or
    /// validation).
    pub success: bool,
    /// Whether its block is agreed and in the ledger.
    pub agreed: bool,
    /// False for an invalid copy: a replay, or a copy whose signatures or endorsements failed
    /// validation. Such a copy says nothing final about the transaction: the orderer is
    /// untrusted, and may order a copy stripped of its endorsements ahead of the real one,
    /// which may still commit.
    pub valid: bool,
    /// Why it aborted; empty on success or when no longer known.
    pub reason: String,
}

impl LedgerBlock {
    /// Domain tag of the ledger block encoding.
    pub const TAG: &'static str = "chainify.v1.LedgerBlock";

    /// The outcome of each of the block's transactions, as agreed, with the abort `reasons`
    /// known (index in the block and reason; none for blocks read back from the ledger).
    pub fn outcomes(&self, reasons: &[(usize, String)]) -> Vec<TxOutcome> {
        let reasons: std::collections::BTreeMap<usize, &String> =
            reasons.iter().map(|(i, r)| (*i, r)).collect();
        self.tx_ids
            .iter()
            .enumerate()
            .map(|(i, id)| TxOutcome {
                tx_id: *id,
                block: self.number,
                index: u32::try_from(i).unwrap_or(u32::MAX),
                success: self.success.get(i).copied().unwrap_or(false),
                agreed: true,
                valid: self.valid.get(i).copied().unwrap_or(false),
                reason: reasons.get(&i).map(|r| (*r).clone()).unwrap_or_default(),
            })
            .collect()
    }

    /// Layout: tag, `string network, u64 number, list<digest> tx_ids, bitmap success, bitmap
    /// valid, digest hash_digest, digest state_digest, digest hash_previous, u64 orderer_position`.
    pub fn encode_canonical(&self) -> Vec<u8> {
        let mut e = Encoder::new(Self::TAG);
        e.str(self.network.as_str())
            .u64(self.number.0)
            .count(self.tx_ids.len());
        for id in &self.tx_ids {
            e.digest(&id.0);
        }
        e.bitmap(&self.success)
            .bitmap(&self.valid)
            .digest(&self.hash_digest)
            .digest(&self.state_digest)
            .digest(&self.hash_previous)
            .u64(self.orderer_position);
        e.finish()
    }

    /// The outcome of transaction `id` if the block holds a valid copy of it (a block holds
    /// at most one), passing over invalid copies ordered before it.
    pub fn outcome_of(&self, id: &TxId) -> Option<TxOutcome> {
        let index = self
            .tx_ids
            .iter()
            .enumerate()
            .position(|(i, t)| t == id && self.valid.get(i).copied().unwrap_or(false))?;
        Some(TxOutcome {
            tx_id: *id,
            block: self.number,
            index: u32::try_from(index).unwrap_or(u32::MAX),
            success: self.success.get(index).copied().unwrap_or(false),
            agreed: true,
            valid: true,
            reason: String::new(),
        })
    }

    /// The hash that is voted on and chained.
    pub fn hash(&self) -> Digest {
        Digest::of(&self.encode_canonical())
    }
}

/// A signed vote of one organization on one block.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Vote {
    /// The network.
    pub network: NetworkId,
    /// The block voted on.
    pub block: BlockNumber,
    /// The voter's LedgerBlock hash.
    pub ledger_block_hash: Digest,
    /// The voter.
    pub org: OrgId,
    /// The voter's signature.
    pub signature: Signature,
}

impl Vote {
    /// Domain tag of the vote encoding.
    pub const TAG: &'static str = "chainify.v1.Vote";

    /// Layout: tag, `string network, u64 block, digest ledger_block_hash, u32 org`.
    pub fn signing_bytes(
        network: &NetworkId,
        block: BlockNumber,
        hash: &Digest,
        org: OrgId,
    ) -> Vec<u8> {
        let mut e = Encoder::new(Self::TAG);
        e.str(network.as_str()).u64(block.0).digest(hash).u32(org.0);
        e.finish()
    }

    /// Creates and signs a vote.
    pub fn new_signed(
        network: NetworkId,
        block: BlockNumber,
        ledger_block_hash: Digest,
        org: OrgId,
        key: &SigningKey,
    ) -> Vote {
        Self::new_as(
            network,
            block,
            ledger_block_hash,
            org,
            key,
            Signatures::Ed25519,
        )
    }

    /// Creates a vote, signed unless the network's signatures are off.
    pub fn new_as(
        network: NetworkId,
        block: BlockNumber,
        ledger_block_hash: Digest,
        org: OrgId,
        key: &SigningKey,
        signatures: Signatures,
    ) -> Vote {
        let signature = signatures.sign(
            key,
            &Self::signing_bytes(&network, block, &ledger_block_hash, org),
        );
        Vote {
            network,
            block,
            ledger_block_hash,
            org,
            signature,
        }
    }

    /// Checks the voter's signature by RFC 8032 (valid under every rule; a network checks
    /// [`Self::signed_by`] by its own rule).
    pub fn verify(&self, org_key: &PublicKey) -> Result<(), CryptoError> {
        org_key.verify(
            &Self::signing_bytes(&self.network, self.block, &self.ledger_block_hash, self.org),
            &self.signature,
        )
    }

    /// The voter's signature, to be checked by the network's rule.
    pub fn signed_by(&self, org_key: PublicKey) -> SignedBytes {
        SignedBytes {
            key: org_key,
            message: Self::signing_bytes(
                &self.network,
                self.block,
                &self.ledger_block_hash,
                self.org,
            ),
            signature: self.signature,
        }
    }
}

/// One entry of an organization's ledger: an agreed block and the certificate proving the
/// agreement. Stored and streamed protobuf-encoded (`chainify_proto::ledger`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LedgerEntry {
    /// The agreed block.
    pub block: LedgerBlock,
    /// The votes proving agreement on `block`.
    pub certificate: Certificate,
}

/// Proof of agreement on a block: matching votes that satisfy the agreement policy.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Certificate {
    /// The agreed block.
    pub block: BlockNumber,
    /// The agreed LedgerBlock hash.
    pub ledger_block_hash: Digest,
    /// The matching votes, one per organization, ordered by org id.
    pub votes: Vec<Vote>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> ProposalBody {
        ProposalBody {
            client: ClientId::new("alice").unwrap(),
            nonce: 7,
            network: NetworkId::new("net").unwrap(),
            transaction: Transaction {
                statements: vec![
                    Statement::new(
                        "UPDATE checking SET bal = bal + $2 WHERE custid = $1",
                        vec![Value::Int(1), Value::Int(50)],
                    )
                    .expect_rows(1),
                ],
            },
        }
    }

    #[test]
    fn proposal_signature_covers_every_field() {
        let (key, _) = SigningKey::generate().unwrap();
        let p = body().sign(&key);
        p.verify(&key.public_key()).unwrap();
        let mut tampered = p.clone();
        tampered.body.transaction.statements[0].expect_rows = Some(2);
        assert!(tampered.verify(&key.public_key()).is_err());
        assert_ne!(tampered.tx_id(), p.tx_id());
        let mut other_nonce = p.clone();
        other_nonce.body.nonce = 8;
        assert!(other_nonce.verify(&key.public_key()).is_err());
    }

    #[test]
    fn votes_and_responses_verify_only_for_their_content() {
        let (key, _) = SigningKey::generate().unwrap();
        let net = NetworkId::new("net").unwrap();
        let v = Vote::new_signed(net, BlockNumber(3), Digest::of(b"x"), OrgId(2), &key);
        v.verify(&key.public_key()).unwrap();
        let mut forged = v.clone();
        forged.org = OrgId(3);
        assert!(forged.verify(&key.public_key()).is_err());

        let r = EarlyAbortResponse::new_signed(body().tx_id(), OrgId(1), Verdict::Accept, &key);
        r.verify(&key.public_key()).unwrap();
        let mut flipped = r.clone();
        flipped.verdict = Verdict::Reject(String::new());
        assert!(flipped.verify(&key.public_key()).is_err());
    }

    #[test]
    fn responses_signed_as_a_batch_verify_one_by_one_and_share_one_triple() {
        let (key, _) = SigningKey::generate().unwrap();
        let id = |n: u8| TxId(Digest::of(&[n]));
        let answers: Vec<(TxId, Verdict)> = (0..5)
            .map(|n| {
                let verdict = if n == 3 {
                    Verdict::Reject("no".into())
                } else {
                    Verdict::Accept
                };
                (id(n), verdict)
            })
            .collect();
        let mut signings = 0;
        let batch = EarlyAbortResponse::sign_batch(OrgId(2), answers.clone(), |bytes| {
            signings += 1;
            key.sign(&bytes)
        });
        assert_eq!(signings, 1);
        assert_eq!(batch.len(), 5);
        let triple = batch[0].signed_by(key.public_key(), true);
        for (r, (tx_id, verdict)) in batch.iter().zip(&answers) {
            assert_eq!((&r.tx_id, &r.verdict, r.org), (tx_id, verdict, OrgId(2)));
            r.verify(&key.public_key()).unwrap();
            assert_eq!(r.signed_by(key.public_key(), true), triple);
            // A network without batches reads only the response's own bytes.
            assert!(
                r.signed_by(key.public_key(), false)
                    .verify(Signatures::Ed25519)
                    .is_err()
            );
        }
        // What the signature does not cover: another verdict, transaction, organization or
        // position, or a response without its proof.
        let mut flipped = batch[3].clone();
        flipped.verdict = Verdict::Accept;
        assert!(flipped.verify(&key.public_key()).is_err());
        let mut moved = batch[0].clone();
        moved.tx_id = id(9);
        assert!(moved.verify(&key.public_key()).is_err());
        let mut renamed = batch[0].clone();
        renamed.org = OrgId(3);
        assert!(renamed.verify(&key.public_key()).is_err());
        let mut swapped = batch[0].clone();
        swapped.batch = batch[1].batch.clone();
        assert!(swapped.verify(&key.public_key()).is_err());
        let mut bare = batch[0].clone();
        bare.batch = None;
        assert!(bare.verify(&key.public_key()).is_err());
        // One answer is signed alone, as before batches.
        let single =
            EarlyAbortResponse::sign_batch(OrgId(2), answers[..1].to_vec(), |b| key.sign(&b));
        assert_eq!(
            single,
            vec![EarlyAbortResponse::new_signed(
                id(0),
                OrgId(2),
                Verdict::Accept,
                &key
            )]
        );
        assert!(EarlyAbortResponse::sign_batch(OrgId(2), vec![], |b| key.sign(&b)).is_empty());
    }

    #[test]
    fn more_answers_than_a_tree_holds_are_signed_as_several_trees() {
        let (key, _) = SigningKey::generate().unwrap();
        let n = crate::batch::MAX_LEAVES + 3;
        let answers: Vec<(TxId, Verdict)> = (0..n as u32)
            .map(|i| (TxId(Digest::of(&i.to_le_bytes())), Verdict::Accept))
            .collect();
        let mut signings = 0;
        let signed = EarlyAbortResponse::sign_batch(OrgId(1), answers, |b| {
            signings += 1;
            key.sign(&b)
        });
        assert_eq!((signed.len(), signings), (n, 2));
        let depth = |r: &EarlyAbortResponse| r.batch.as_ref().map(|p| p.siblings.len());
        assert_eq!(depth(&signed[0]), Some(crate::batch::MAX_DEPTH));
        assert_eq!(depth(&signed[n - 1]), Some(2));
        assert_ne!(signed[0].signature, signed[n - 1].signature);
        for r in [&signed[0], &signed[n - 4], &signed[n - 3], &signed[n - 1]] {
            r.verify(&key.public_key()).unwrap();
        }
    }

    #[test]
    fn query_signature_binds_network_organization_and_params() {
        let (key, _) = SigningKey::generate().unwrap();
        let q = QueryBody {
            client: ClientId::new("alice").unwrap(),
            network: NetworkId::new("net").unwrap(),
            org: OrgId(1),
            sql: "SELECT bal FROM checking WHERE custid = $1".into(),
            params: vec![Value::Int(1)],
            nonce: Some([7; QUERY_NONCE_BYTES]),
        };
        let sig = key.sign(&q.encode_canonical());
        q.verify(&key.public_key(), &sig).unwrap();
        let mut other_nonce = q.clone();
        other_nonce.nonce = Some([8; QUERY_NONCE_BYTES]);
        assert!(other_nonce.verify(&key.public_key(), &sig).is_err());
        let mut no_nonce = q.clone();
        no_nonce.nonce = None;
        assert!(no_nonce.verify(&key.public_key(), &sig).is_err());
        let mut other_net = q.clone();
        other_net.network = NetworkId::new("net2").unwrap();
        assert!(other_net.verify(&key.public_key(), &sig).is_err());
        let mut other_org = q.clone();
        other_org.org = OrgId(2);
        assert!(other_org.verify(&key.public_key(), &sig).is_err());
        let mut other_param = q;
        other_param.params[0] = Value::Int(2);
        assert!(other_param.verify(&key.public_key(), &sig).is_err());
    }

    #[test]
    fn ledger_block_hash_depends_on_success_bits() {
        let mut b = LedgerBlock {
            network: NetworkId::new("net").unwrap(),
            number: BlockNumber(1),
            tx_ids: vec![body().tx_id()],
            success: vec![true],
            valid: vec![true],
            hash_digest: Digest::of(b"d"),
            state_digest: Digest::of(b"state"),
            hash_previous: Digest::ZERO,
            orderer_position: 1,
        };
        let h = b.hash();
        b.success[0] = false;
        assert_ne!(b.hash(), h);
        let h = b.hash();
        b.valid[0] = false;
        assert_ne!(b.hash(), h, "the valid bits are certified too");
    }

    #[test]
    fn an_invalid_copy_says_nothing_of_the_valid_one() {
        let id = body().tx_id();
        let other = TxId(Digest::of(b"other"));
        // The orderer put a stripped copy of `id` ahead of the real one.
        let b = LedgerBlock {
            network: NetworkId::new("net").unwrap(),
            number: BlockNumber(4),
            tx_ids: vec![id, other, id],
            success: vec![false, true, true],
            valid: vec![false, true, true],
            hash_digest: Digest::of(b"d"),
            state_digest: Digest::of(b"state"),
            hash_previous: Digest::ZERO,
            orderer_position: 1,
        };
        let all = b.outcomes(&[(0, "stripped".into())]);
        assert_eq!(
            all.iter().map(|o| o.valid).collect::<Vec<_>>(),
            vec![false, true, true]
        );
        let o = b.outcome_of(&id).expect("the valid copy");
        assert_eq!((o.index, o.success, o.valid), (2, true, true));
        let only_invalid = LedgerBlock {
            tx_ids: vec![id],
            success: vec![false],
            valid: vec![false],
            ..b
        };
        assert_eq!(only_invalid.outcome_of(&id), None);
    }
}
