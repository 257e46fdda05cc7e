//! Conversions between wire messages ([`pb`]) and `chainify-core` domain types.
//!
//! Receiving is fallible and happens once: `TryFrom<pb::X> for Y` checks what protobuf cannot
//! express (required messages, oneofs, byte lengths, id ranges, list sizes, exact decimals) and
//! names the offending field with its full dotted path, e.g.
//! `proposal.transaction.statements[2].params[0].decimal`. Sending is infallible:
//! `From<&Y> for pb::X`. Only structure is checked here; signatures, policies and cross-field
//! consistency (a vote's block against its certificate's) are the validators' business.

use std::str::FromStr;

use chainify_core::batch::{BatchProof, MAX_DEPTH};
use chainify_core::canonical::{pack_bits, unpack_bits};
use chainify_core::crypto::Signature;
use chainify_core::tx::{
    Certificate, ChainedTransaction, EarlyAbortResponse, LedgerBlock, LedgerEntry, Proposal,
    ProposalBody, Statement, Transaction, TransactionBlock, Verdict, Vote,
};
use chainify_core::{BlockNumber, ClientId, Decimal, Digest, NetworkId, OrgId, TxId, Value};

use crate::pb;
use crate::pb::value::Kind;

/// Most statements a transaction may have. Bounds the work one proposal can cause before it is
/// early-aborted.
pub const MAX_STATEMENTS: usize = 256;

/// A received message is malformed. Servers answer it with `Status::invalid_argument`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ProtocolError {
    /// Dotted path of the offending field from the converted message, e.g.
    /// `transaction.statements[2].params[0].decimal`.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ProtocolError {
    /// An error in `field` of the message being converted.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ProtocolError {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// Prefixes the path with the field that holds the nested message, so that the error names
    /// the field from the outermost message: `params[0].decimal` within `statements[2]`.
    pub fn within(mut self, outer: &str) -> Self {
        self.field = if self.field.is_empty() {
            outer.to_owned()
        } else {
            format!("{outer}.{}", self.field)
        };
        self
    }

    /// Prefixes the path with element `index` of the repeated field `list`.
    pub fn at(self, list: &str, index: usize) -> Self {
        self.within(&format!("{list}[{index}]"))
    }
}

// ------------------------------------------------------------------------------------------------
// Field helpers: each names the field it checks, so that callers only add the outer path.

/// A message field that proto3 makes optional but chainify requires, converted.
fn required<P, D>(message: Option<P>, field: &str) -> Result<D, ProtocolError>
where
    D: TryFrom<P, Error = ProtocolError>,
{
    let message = message.ok_or_else(|| ProtocolError::new(field, "required but missing"))?;
    D::try_from(message).map_err(|e| e.within(field))
}

/// A repeated message field, converted element by element.
fn list<P, D>(items: Vec<P>, field: &str) -> Result<Vec<D>, ProtocolError>
where
    D: TryFrom<P, Error = ProtocolError>,
{
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| D::try_from(item).map_err(|e| e.at(field, i)))
        .collect()
}

fn digest(bytes: &[u8], field: &str) -> Result<Digest, ProtocolError> {
    Digest::try_from(bytes).map_err(|e| ProtocolError::new(field, e.to_string()))
}

fn signature(bytes: &[u8], field: &str) -> Result<Signature, ProtocolError> {
    Signature::try_from(bytes).map_err(|e| ProtocolError::new(field, e.to_string()))
}

fn network_id(id: String, field: &str) -> Result<NetworkId, ProtocolError> {
    NetworkId::new(id).map_err(|e| ProtocolError::new(field, e.to_string()))
}

/// Org ids are 1-based (config and policies count from 1); 0 is proto3's "unset".
fn org_id(id: u32, field: &str) -> Result<OrgId, ProtocolError> {
    if id == 0 {
        return Err(ProtocolError::new(
            field,
            "organization ids start at 1, got 0",
        ));
    }
    Ok(OrgId(id))
}

/// Block 0 is the genesis position; no block, vote or certificate has that number.
fn block_number(number: u64, field: &str) -> Result<BlockNumber, ProtocolError> {
    if number == 0 {
        return Err(ProtocolError::new(field, "block numbers start at 1, got 0"));
    }
    Ok(BlockNumber(number))
}

// ------------------------------------------------------------------------------------------------
// Receive: wire → domain.

impl TryFrom<pb::Value> for Value {
    type Error = ProtocolError;

    fn try_from(v: pb::Value) -> Result<Self, Self::Error> {
        Ok(match v.kind {
            None => return Err(ProtocolError::new("kind", "value has no kind")),
            // The oneof case carries the meaning; its bool payload is only there because proto3
            // has no unit type.
            Some(Kind::Null(_)) => Value::Null,
            Some(Kind::Int(i)) => Value::Int(i),
            Some(Kind::Decimal(text)) => Value::Decimal(
                Decimal::from_str(&text)
                    .map_err(|e| ProtocolError::new("decimal", e.to_string()))?,
            ),
            Some(Kind::Text(s)) => Value::Text(s),
            Some(Kind::Bool(b)) => Value::Bool(b),
            Some(Kind::Bytes(b)) => Value::Bytes(b),
        })
    }
}

impl TryFrom<pb::Statement> for Statement {
    type Error = ProtocolError;

    fn try_from(s: pb::Statement) -> Result<Self, Self::Error> {
        Ok(Statement {
            sql: s.sql,
            params: list(s.params, "params")?,
            expect_rows: s.expect_rows,
        })
    }
}

impl TryFrom<pb::Transaction> for Transaction {
    type Error = ProtocolError;

    fn try_from(t: pb::Transaction) -> Result<Self, Self::Error> {
        // Checked before converting so that an oversized transaction costs no parsing.
        let n = t.statements.len();
        if n == 0 {
            return Err(ProtocolError::new(
                "statements",
                "a transaction needs at least one statement",
            ));
        }
        if n > MAX_STATEMENTS {
            return Err(ProtocolError::new(
                "statements",
                format!("{n} statements; at most {MAX_STATEMENTS} are allowed"),
            ));
        }
        Ok(Transaction {
            statements: list(t.statements, "statements")?,
        })
    }
}

impl TryFrom<pb::Proposal> for Proposal {
    type Error = ProtocolError;

    fn try_from(p: pb::Proposal) -> Result<Self, Self::Error> {
        let client = ClientId::new(p.client_id)
            .map_err(|e| ProtocolError::new("client_id", e.to_string()))?;
        let network = network_id(p.network_id, "network_id")?;
        let transaction = required(p.transaction, "transaction")?;
        let signature = signature(&p.signature, "signature")?;
        Ok(Proposal {
            body: ProposalBody {
                client,
                nonce: p.nonce,
                network,
                transaction,
            },
            signature,
        })
    }
}

impl TryFrom<pb::EarlyAbortResponse> for EarlyAbortResponse {
    type Error = ProtocolError;

    fn try_from(r: pb::EarlyAbortResponse) -> Result<Self, Self::Error> {
        let verdict = match (r.accept, r.reason) {
            (true, reason) if !reason.is_empty() => {
                // The signed encoding of an accept has an empty reason; a reason here would be
                // silently dropped and the signature would not cover what the sender meant.
                return Err(ProtocolError::new(
                    "reason",
                    format!("must be empty when accept is true, got {reason:?}"),
                ));
            }
            (true, _) => Verdict::Accept,
            (false, reason) => Verdict::Reject(reason),
        };
        Ok(EarlyAbortResponse {
            tx_id: TxId(digest(&r.tx_id, "tx_id")?),
            org: org_id(r.org_id, "org_id")?,
            verdict,
            signature: signature(&r.signature, "signature")?,
            batch: r.batch.map(batch_proof),
        })
    }
}

/// A received batch proof. Never refused: a node that predates batches ignores the field, so
/// refusing a malformed proof here (a Kafka entry dropped by some consumers and not others)
/// would split a network in a rolling upgrade. A proof that is not 1 to `MAX_DEPTH` siblings of
/// 32 bytes is kept as one without siblings; every proof that fails [`BatchProof::check`] (no
/// siblings, an index beyond its tree) leaves the response read as signed alone
/// (`EarlyAbortResponse::signed_message`), as such a node reads it.
fn batch_proof(p: pb::BatchProof) -> BatchProof {
    let siblings = if p.siblings.len() <= MAX_DEPTH {
        p.siblings
            .iter()
            .map(|s| Digest::try_from(s.as_slice()))
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    BatchProof {
        index: p.index,
        siblings,
    }
}

impl TryFrom<pb::ChainedTransaction> for ChainedTransaction {
    type Error = ProtocolError;

    fn try_from(c: pb::ChainedTransaction) -> Result<Self, Self::Error> {
        Ok(ChainedTransaction {
            proposal: required(c.proposal, "proposal")?,
            responses: list(c.responses, "responses")?,
        })
    }
}

impl TryFrom<pb::TransactionBlock> for TransactionBlock {
    type Error = ProtocolError;

    fn try_from(b: pb::TransactionBlock) -> Result<Self, Self::Error> {
        Ok(TransactionBlock {
            network: network_id(b.network_id, "network_id")?,
            number: block_number(b.number, "number")?,
            transactions: list(b.transactions, "transactions")?,
            orderer_position: b.orderer_position,
        })
    }
}

impl TryFrom<pb::LedgerBlock> for LedgerBlock {
    type Error = ProtocolError;

    fn try_from(b: pb::LedgerBlock) -> Result<Self, Self::Error> {
        let tx_ids = b
            .tx_ids
            .iter()
            .enumerate()
            .map(|(i, id)| digest(id, &format!("tx_ids[{i}]")).map(TxId))
            .collect::<Result<Vec<_>, _>>()?;
        let success = unpack_bits(&b.success_bitmap, tx_ids.len()).ok_or_else(|| {
            let (got, n) = (b.success_bitmap.len(), tx_ids.len());
            let expected = n.div_ceil(8);
            let problem = if got == expected {
                format!("bits beyond the {n} transactions are set; unused bits must be zero")
            } else {
                format!("expected {expected} bytes for {n} transactions, got {got}")
            };
            ProtocolError::new("success_bitmap", problem)
        })?;
        let valid = unpack_bits(&b.valid_bitmap, tx_ids.len()).ok_or_else(|| {
            ProtocolError::new(
                "valid_bitmap",
                format!(
                    "expected {} bytes with no bits beyond the {} transactions, got {}",
                    tx_ids.len().div_ceil(8),
                    tx_ids.len(),
                    b.valid_bitmap.len()
                ),
            )
        })?;
        Ok(LedgerBlock {
            network: network_id(b.network_id, "network_id")?,
            number: block_number(b.number, "number")?,
            tx_ids,
            success,
            valid,
            hash_digest: digest(&b.hash_digest, "hash_digest")?,
            state_digest: digest(&b.state_digest, "state_digest")?,
            hash_previous: digest(&b.hash_previous, "hash_previous")?,
            orderer_position: b.orderer_position,
        })
    }
}

impl TryFrom<pb::Vote> for Vote {
    type Error = ProtocolError;

    fn try_from(v: pb::Vote) -> Result<Self, Self::Error> {
        Ok(Vote {
            network: network_id(v.network_id, "network_id")?,
            block: block_number(v.block_number, "block_number")?,
            ledger_block_hash: digest(&v.ledger_block_hash, "ledger_block_hash")?,
            org: org_id(v.org_id, "org_id")?,
            signature: signature(&v.signature, "signature")?,
        })
    }
}

impl TryFrom<pb::Certificate> for Certificate {
    type Error = ProtocolError;

    fn try_from(c: pb::Certificate) -> Result<Self, Self::Error> {
        Ok(Certificate {
            block: block_number(c.block_number, "block_number")?,
            ledger_block_hash: digest(&c.ledger_block_hash, "ledger_block_hash")?,
            votes: list(c.votes, "votes")?,
        })
    }
}

impl TryFrom<pb::LedgerEntry> for LedgerEntry {
    type Error = ProtocolError;

    fn try_from(e: pb::LedgerEntry) -> Result<Self, Self::Error> {
        Ok(LedgerEntry {
            block: required(e.block, "block")?,
            certificate: required(e.certificate, "certificate")?,
        })
    }
}

// ------------------------------------------------------------------------------------------------
// Send: domain → wire. Domain values are valid by construction, so these cannot fail.

impl From<&Value> for pb::Value {
    fn from(v: &Value) -> Self {
        let kind = match v {
            Value::Null => Kind::Null(true),
            Value::Int(i) => Kind::Int(*i),
            // Display keeps the scale ("1.50" stays "1.50"), which the signature covers.
            Value::Decimal(d) => Kind::Decimal(d.to_string()),
            Value::Text(s) => Kind::Text(s.clone()),
            Value::Bool(b) => Kind::Bool(*b),
            Value::Bytes(b) => Kind::Bytes(b.clone()),
        };
        pb::Value { kind: Some(kind) }
    }
}

impl From<&Statement> for pb::Statement {
    fn from(s: &Statement) -> Self {
        pb::Statement {
            sql: s.sql.clone(),
            params: s.params.iter().map(Into::into).collect(),
            expect_rows: s.expect_rows,
        }
    }
}

impl From<&Transaction> for pb::Transaction {
    fn from(t: &Transaction) -> Self {
        pb::Transaction {
            statements: t.statements.iter().map(Into::into).collect(),
        }
    }
}

impl From<&Proposal> for pb::Proposal {
    fn from(p: &Proposal) -> Self {
        pb::Proposal {
            client_id: p.body.client.as_str().to_owned(),
            nonce: p.body.nonce,
            network_id: p.body.network.as_str().to_owned(),
            transaction: Some((&p.body.transaction).into()),
            signature: p.signature.0.to_vec(),
        }
    }
}

impl From<&EarlyAbortResponse> for pb::EarlyAbortResponse {
    fn from(r: &EarlyAbortResponse) -> Self {
        let (accept, reason) = match &r.verdict {
            Verdict::Accept => (true, String::new()),
            Verdict::Reject(reason) => (false, reason.clone()),
        };
        pb::EarlyAbortResponse {
            tx_id: r.tx_id.0.0.to_vec(),
            org_id: r.org.0,
            accept,
            reason,
            signature: r.signature.0.to_vec(),
            batch: r.batch.as_ref().map(|p| pb::BatchProof {
                index: p.index,
                siblings: p.siblings.iter().map(|s| s.0.to_vec()).collect(),
            }),
        }
    }
}

impl From<&ChainedTransaction> for pb::ChainedTransaction {
    fn from(c: &ChainedTransaction) -> Self {
        pb::ChainedTransaction {
            proposal: Some((&c.proposal).into()),
            responses: c.responses.iter().map(Into::into).collect(),
        }
    }
}

impl From<&TransactionBlock> for pb::TransactionBlock {
    fn from(b: &TransactionBlock) -> Self {
        pb::TransactionBlock {
            network_id: b.network.as_str().to_owned(),
            number: b.number.0,
            transactions: b.transactions.iter().map(Into::into).collect(),
            orderer_position: b.orderer_position,
        }
    }
}

impl From<&LedgerBlock> for pb::LedgerBlock {
    /// `success` must have one entry per transaction id (as every block built by the executor
    /// does); otherwise the receiver rejects the bitmap.
    fn from(b: &LedgerBlock) -> Self {
        pb::LedgerBlock {
            network_id: b.network.as_str().to_owned(),
            number: b.number.0,
            tx_ids: b.tx_ids.iter().map(|id| id.0.0.to_vec()).collect(),
            success_bitmap: pack_bits(&b.success),
            valid_bitmap: pack_bits(&b.valid),
            hash_digest: b.hash_digest.0.to_vec(),
            state_digest: b.state_digest.0.to_vec(),
            hash_previous: b.hash_previous.0.to_vec(),
            orderer_position: b.orderer_position,
        }
    }
}

impl From<&Vote> for pb::Vote {
    fn from(v: &Vote) -> Self {
        pb::Vote {
            network_id: v.network.as_str().to_owned(),
            block_number: v.block.0,
            ledger_block_hash: v.ledger_block_hash.0.to_vec(),
            org_id: v.org.0,
            signature: v.signature.0.to_vec(),
        }
    }
}

impl From<&Certificate> for pb::Certificate {
    fn from(c: &Certificate) -> Self {
        pb::Certificate {
            block_number: c.block.0,
            ledger_block_hash: c.ledger_block_hash.0.to_vec(),
            votes: c.votes.iter().map(Into::into).collect(),
        }
    }
}

impl From<&LedgerEntry> for pb::LedgerEntry {
    fn from(e: &LedgerEntry) -> Self {
        pb::LedgerEntry {
            block: Some((&e.block).into()),
            certificate: Some((&e.certificate).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Debug;

    use chainify_core::crypto::SigningKey;
    use prost::Message;

    use super::*;

    fn key() -> SigningKey {
        SigningKey::from_seed(&[7u8; 32])
    }

    fn net() -> NetworkId {
        NetworkId::new("testnet").unwrap()
    }

    fn dec(text: &str) -> Value {
        Value::Decimal(text.parse().unwrap())
    }

    /// Three statements so that paths such as `statements[2]` are exercised, and every value
    /// kind, including a decimal whose trailing zero the signature covers.
    fn proposal() -> Proposal {
        ProposalBody {
            client: ClientId::new("alice").unwrap(),
            nonce: 42,
            network: net(),
            transaction: Transaction {
                statements: vec![
                    Statement::new(
                        "UPDATE checking SET bal = bal - $2 WHERE custid = $1 AND bal >= $2",
                        vec![Value::Int(1), dec("1.50")],
                    )
                    .expect_rows(1),
                    Statement::new(
                        "INSERT INTO audit VALUES ($1, $2, $3, $4)",
                        vec![
                            Value::Null,
                            Value::Text("it's".into()),
                            Value::Bool(false),
                            Value::Bytes(vec![0, 255]),
                        ],
                    ),
                    Statement::new(
                        "UPDATE savings SET bal = bal + $2 WHERE custid = $1",
                        vec![dec("-0.001"), Value::Int(i64::MIN)],
                    ),
                ],
            },
        }
        .sign(&key())
    }

    fn responses(p: &Proposal) -> Vec<EarlyAbortResponse> {
        vec![
            EarlyAbortResponse::new_signed(p.tx_id(), OrgId(1), Verdict::Accept, &key()),
            EarlyAbortResponse::new_signed(
                p.tx_id(),
                OrgId(2),
                Verdict::Reject("table checking not granted".into()),
                &key(),
            ),
            // A response of a signed batch, with its proof.
            batched(p).swap_remove(1),
        ]
    }

    /// Three responses of organization 3, signed as one batch (a tree of four leaves).
    fn batched(p: &Proposal) -> Vec<EarlyAbortResponse> {
        let answers = (0u8..3)
            .map(|i| {
                let id = if i == 1 {
                    p.tx_id()
                } else {
                    TxId(Digest::of(&[i]))
                };
                (id, Verdict::Accept)
            })
            .collect();
        EarlyAbortResponse::sign_batch(OrgId(3), answers, |bytes| key().sign(&bytes))
    }

    /// Malformed proofs are never refused (a node that predates batches ignores the field):
    /// the response reads as signed alone, so its batch signature does not count.
    #[test]
    fn malformed_batch_proofs_leave_the_response_read_as_signed_alone() {
        let response = batched(&proposal())[1].clone();
        let wire = pb::EarlyAbortResponse::from(&response);
        assert_eq!(wire.batch.as_ref().map(|b| b.siblings.len()), Some(2));
        response.verify(&key().public_key()).unwrap();
        let cases = [
            with(&wire, |r| {
                r.batch.as_mut().unwrap().siblings[1].pop();
            }),
            with(&wire, |r| r.batch.as_mut().unwrap().siblings.clear()),
            with(&wire, |r| r.batch.as_mut().unwrap().index = 4),
            with(&wire, |r| {
                r.batch.as_mut().unwrap().siblings = vec![vec![0; 32]; MAX_DEPTH + 1];
            }),
        ];
        let alone =
            EarlyAbortResponse::signing_bytes(&response.tx_id, response.org, &response.verdict);
        for (i, malformed) in cases.into_iter().enumerate() {
            let read = EarlyAbortResponse::try_from(malformed).expect("never refused");
            assert!(
                read.batch.as_ref().is_some_and(|p| p.check().is_err()),
                "case {i}"
            );
            assert_eq!(read.signed_message(true), alone, "case {i}");
            assert!(read.verify(&key().public_key()).is_err(), "case {i}");
        }
    }

    fn chained() -> ChainedTransaction {
        let proposal = proposal();
        ChainedTransaction {
            responses: responses(&proposal),
            proposal,
        }
    }

    fn transaction_block() -> TransactionBlock {
        TransactionBlock {
            network: net(),
            number: BlockNumber(5),
            transactions: vec![chained(), chained()],
            orderer_position: 1234,
        }
    }

    /// Nine transactions so that the bitmap spans two bytes.
    fn ledger_block() -> LedgerBlock {
        LedgerBlock {
            network: net(),
            number: BlockNumber(5),
            tx_ids: (0u8..9).map(|i| TxId(Digest::of(&[i]))).collect(),
            success: vec![true, false, true, true, false, false, false, true, true],
            valid: vec![true, false, true, true, true, false, true, true, true],
            hash_digest: Digest::of(b"digest rows"),
            state_digest: Digest::of(b"state"),
            hash_previous: Digest::of(b"block 4"),
            orderer_position: 1234,
        }
    }

    fn certificate() -> Certificate {
        let hash = ledger_block().hash();
        Certificate {
            block: BlockNumber(5),
            ledger_block_hash: hash,
            votes: (1..=3)
                .map(|org| Vote::new_signed(net(), BlockNumber(5), hash, OrgId(org), &key()))
                .collect(),
        }
    }

    /// Domain → pb → protobuf bytes → pb → domain must give back the original.
    fn round_trip<D, P>(original: &D)
    where
        for<'a> P: From<&'a D>,
        P: Message + Default,
        D: TryFrom<P, Error = ProtocolError> + PartialEq + Debug,
    {
        let bytes = P::from(original).encode_to_vec();
        let decoded = P::decode(bytes.as_slice()).unwrap();
        assert_eq!(&D::try_from(decoded).unwrap(), original);
    }

    #[test]
    fn every_type_round_trips() {
        for v in [
            Value::Null,
            Value::Int(-7),
            dec("1.50"),
            dec("-0.0"),
            dec("99999999999999999999999999999999999999"),
            Value::Text(String::new()),
            Value::Bool(true),
            Value::Bytes(vec![]),
        ] {
            round_trip::<Value, pb::Value>(&v);
        }
        let p = proposal();
        for s in &p.body.transaction.statements {
            round_trip::<Statement, pb::Statement>(s);
        }
        round_trip::<Transaction, pb::Transaction>(&p.body.transaction);
        round_trip::<Proposal, pb::Proposal>(&p);
        for r in &responses(&p) {
            round_trip::<EarlyAbortResponse, pb::EarlyAbortResponse>(r);
        }
        round_trip::<ChainedTransaction, pb::ChainedTransaction>(&chained());
        round_trip::<TransactionBlock, pb::TransactionBlock>(&transaction_block());
        let empty_block = TransactionBlock {
            transactions: vec![],
            ..transaction_block()
        };
        round_trip::<TransactionBlock, pb::TransactionBlock>(&empty_block);
        round_trip::<LedgerBlock, pb::LedgerBlock>(&ledger_block());
        let first_empty = LedgerBlock {
            number: BlockNumber(1),
            tx_ids: vec![],
            success: vec![],
            valid: vec![],
            hash_previous: Digest::ZERO,
            ..ledger_block()
        };
        round_trip::<LedgerBlock, pb::LedgerBlock>(&first_empty);
        round_trip::<Vote, pb::Vote>(&certificate().votes[0]);
        round_trip::<Certificate, pb::Certificate>(&certificate());
        round_trip::<LedgerEntry, pb::LedgerEntry>(&LedgerEntry {
            block: ledger_block(),
            certificate: certificate(),
        });
    }

    #[test]
    fn decimal_keeps_its_scale_on_the_wire() {
        let wire = pb::Value::from(&dec("1.50"));
        assert_eq!(wire.kind, Some(Kind::Decimal("1.50".into())));
    }

    /// `base` with `change` applied.
    fn with<T: Clone>(base: &T, change: impl FnOnce(&mut T)) -> T {
        let mut t = base.clone();
        change(&mut t);
        t
    }

    /// The error converting `wire` into `D`.
    fn error<D, P>(wire: P) -> ProtocolError
    where
        D: TryFrom<P, Error = ProtocolError> + Debug,
    {
        D::try_from(wire).unwrap_err()
    }

    fn statements(p: &mut pb::Proposal) -> &mut Vec<pb::Statement> {
        &mut p.transaction.as_mut().unwrap().statements
    }

    #[test]
    fn malformed_messages_name_the_field() {
        let prop = pb::Proposal::from(&proposal());
        let chain = pb::ChainedTransaction::from(&chained());
        let tblock = pb::TransactionBlock::from(&transaction_block());
        let lblock = pb::LedgerBlock::from(&ledger_block());
        let response = pb::EarlyAbortResponse::from(&responses(&proposal())[0]);
        let cert = pb::Certificate::from(&certificate());
        let entry = pb::LedgerEntry::from(&LedgerEntry {
            block: ledger_block(),
            certificate: certificate(),
        });

        let cases: Vec<(&str, ProtocolError, &str, &str)> = vec![
            (
                "missing oneof",
                error::<Proposal, _>(with(&prop, |p| statements(p)[0].params[1].kind = None)),
                "transaction.statements[0].params[1].kind",
                "value has no kind",
            ),
            (
                "decimal with exponent",
                error::<ChainedTransaction, _>(with(&chain, |c| {
                    let p = c.proposal.as_mut().unwrap();
                    statements(p)[2].params[0].kind = Some(Kind::Decimal("1e5".into()));
                })),
                "proposal.transaction.statements[2].params[0].decimal",
                "\"1e5\"",
            ),
            (
                "31-byte tx id in a ledger block",
                error::<LedgerBlock, _>(with(&lblock, |b| b.tx_ids[3].truncate(31))),
                "tx_ids[3]",
                "got 31 bytes",
            ),
            (
                "31-byte tx id in a response",
                error::<TransactionBlock, _>(with(&tblock, |b| {
                    b.transactions[1].responses[1].tx_id.truncate(31)
                })),
                "transactions[1].responses[1].tx_id",
                "got 31 bytes",
            ),
            (
                "bitmap too short",
                error::<LedgerBlock, _>(with(&lblock, |b| b.success_bitmap.truncate(1))),
                "success_bitmap",
                "expected 2 bytes for 9 transactions, got 1",
            ),
            (
                "bitmap too long",
                error::<LedgerBlock, _>(with(&lblock, |b| b.success_bitmap.push(0))),
                "success_bitmap",
                "expected 2 bytes",
            ),
            (
                "stray bitmap bit",
                error::<LedgerBlock, _>(with(&lblock, |b| b.success_bitmap[1] |= 0b1000_0000)),
                "success_bitmap",
                "unused bits must be zero",
            ),
            (
                "empty transaction",
                error::<Proposal, _>(with(&prop, |p| statements(p).clear())),
                "transaction.statements",
                "at least one statement",
            ),
            (
                "too many statements",
                error::<Proposal, _>(with(&prop, |p| {
                    let s = statements(p)[0].clone();
                    *statements(p) = vec![s; MAX_STATEMENTS + 1];
                })),
                "transaction.statements",
                "257 statements; at most 256",
            ),
            (
                "missing transaction",
                error::<Proposal, _>(with(&prop, |p| p.transaction = None)),
                "transaction",
                "missing",
            ),
            (
                "accept with a reason",
                error::<EarlyAbortResponse, _>(with(&response, |r| r.reason = "because".into())),
                "reason",
                "must be empty when accept is true",
            ),
            (
                "org id 0 in a response",
                error::<ChainedTransaction, _>(with(&chain, |c| c.responses[0].org_id = 0)),
                "responses[0].org_id",
                "start at 1",
            ),
            (
                "org id 0 in a vote",
                error::<Certificate, _>(with(&cert, |c| c.votes[2].org_id = 0)),
                "votes[2].org_id",
                "start at 1",
            ),
            (
                "empty client id",
                error::<Proposal, _>(with(&prop, |p| p.client_id.clear())),
                "client_id",
                "must not be empty",
            ),
            (
                "control character in network id",
                error::<Proposal, _>(with(&prop, |p| p.network_id = "a\nb".into())),
                "network_id",
                "control characters",
            ),
            (
                "63-byte signature",
                error::<Proposal, _>(with(&prop, |p| p.signature.truncate(63))),
                "signature",
                "63 bytes",
            ),
            (
                "block number 0",
                error::<TransactionBlock, _>(with(&tblock, |b| b.number = 0)),
                "number",
                "start at 1",
            ),
            (
                "short hash_previous",
                error::<LedgerBlock, _>(with(&lblock, |b| b.hash_previous = vec![0; 30])),
                "hash_previous",
                "got 30 bytes",
            ),
            (
                "missing certificate",
                error::<LedgerEntry, _>(with(&entry, |e| e.certificate = None)),
                "certificate",
                "missing",
            ),
            (
                "bad vote signature in an entry",
                error::<LedgerEntry, _>(with(&entry, |e| {
                    e.certificate.as_mut().unwrap().votes[1].signature = vec![1; 65]
                })),
                "certificate.votes[1].signature",
                "65 bytes",
            ),
        ];
        for (name, err, field, problem) in cases {
            assert_eq!(err.field, field, "{name}: {err}");
            assert!(err.problem.contains(problem), "{name}: {err}");
        }
    }

    #[test]
    fn error_displays_path_then_problem() {
        let err = ProtocolError::new("decimal", "bad")
            .at("params", 0)
            .at("statements", 2)
            .within("transaction");
        assert_eq!(
            err.to_string(),
            "transaction.statements[2].params[0].decimal: bad"
        );
    }

    #[test]
    fn wire_proposal_verifies_until_a_param_changes() {
        let signed = proposal();
        let public = key().public_key();
        let bytes = pb::Proposal::from(&signed).encode_to_vec();
        let wire = pb::Proposal::decode(bytes.as_slice()).unwrap();

        let received = Proposal::try_from(wire.clone()).unwrap();
        received.verify(&public).unwrap();
        assert_eq!(received.tx_id(), signed.tx_id());

        // Same number, different scale: still a different signed message.
        let rescaled = with(&wire, |p| {
            statements(p)[0].params[1].kind = Some(Kind::Decimal("1.5".into()));
        });
        let tampered = Proposal::try_from(rescaled).unwrap();
        assert!(tampered.verify(&public).is_err());

        let other_amount = with(&wire, |p| {
            statements(p)[0].params[0].kind = Some(Kind::Int(2));
        });
        let tampered = Proposal::try_from(other_amount).unwrap();
        assert!(tampered.verify(&public).is_err());
    }
}
