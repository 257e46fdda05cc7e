//! Pins the canonical encoding (see `chainify_core::canonical`) with checked-in test vectors: the
//! bytes, SHA-256 and Ed25519 signature of representative objects built with the RFC 8032 test key.
//! Another implementation of the encoding can check itself against `vectors/canonical.json`.
//!
//! To regenerate after an *intentional* format change: `CHAINIFY_BLESS=1 cargo test -p chainify-core
//! --test canonical_vectors`, and bump the domain tags' version.
#![allow(clippy::unwrap_used)]

use chainify_core::canonical::Encoder;
use chainify_core::crypto::SigningKey;
use chainify_core::state::{RowHash, StateHash};
use chainify_core::tx::{
    EarlyAbortResponse, LedgerBlock, ProposalBody, QueryAnswer, QueryBody, Statement, Transaction,
    Verdict, Vote,
};
use chainify_core::{BlockNumber, ClientId, Decimal, Digest, NetworkId, OrgId, Value};
use serde_json::{Value as Json, json};

const RFC8032_SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";

fn key() -> SigningKey {
    SigningKey::from_seed(&hex::decode(RFC8032_SEED).unwrap().try_into().unwrap())
}

fn awkward_values() -> Vec<Value> {
    vec![
        Value::Null,
        Value::Int(i64::MIN),
        Value::Int(i64::MAX),
        Value::Int(-1),
        Value::Decimal("-12.50".parse::<Decimal>().unwrap()),
        Value::Decimal("0.000".parse::<Decimal>().unwrap()),
        Value::Text(String::new()),
        Value::Text("Zürich 東京 🚀".into()),
        Value::Bool(true),
        Value::Bytes(vec![0, 255, 16]),
    ]
}

fn proposal() -> ProposalBody {
    ProposalBody {
        client: ClientId::new("client1").unwrap(),
        nonce: 42,
        network: NetworkId::new("chainify-test").unwrap(),
        transaction: Transaction {
            statements: vec![
                Statement::new(
                    "UPDATE checking SET bal = bal - $3 WHERE custid = $1 AND bal >= $3",
                    vec![Value::Int(1), Value::Int(2), Value::Int(500)],
                )
                .expect_rows(1),
                Statement::new("INSERT INTO t (k, v) VALUES ($1, $2)", awkward_values()),
            ],
        },
    }
}

fn vectors() -> Json {
    let key = key();
    let mut values = Encoder::untagged();
    for v in awkward_values() {
        values.value(&v);
    }
    let p = proposal();
    let p_bytes = p.encode_canonical();
    let tx_id = p.tx_id();
    let block = LedgerBlock {
        network: NetworkId::new("chainify-test").unwrap(),
        number: BlockNumber(7),
        tx_ids: vec![tx_id, tx_id],
        success: vec![true, false],
        valid: vec![true, true],
        hash_digest: Digest::of(b"digest rows"),
        state_digest: Digest::of(b"state"),
        hash_previous: Digest::of(b"block 6"),
        orderer_position: 1234,
    };
    let vote = Vote::new_signed(
        block.network.clone(),
        block.number,
        block.hash(),
        OrgId(2),
        &key,
    );
    let reject = EarlyAbortResponse::new_signed(
        tx_id,
        OrgId(3),
        Verdict::Reject("statement 1: NOW() reads the clock".into()),
        &key,
    );
    let query = QueryBody {
        client: ClientId::new("client1").unwrap(),
        network: NetworkId::new("chainify-test").unwrap(),
        org: OrgId(2),
        sql: "SELECT bal FROM checking WHERE custid = $1".into(),
        params: vec![Value::Int(7)],
        nonce: None,
    };
    let fresh_query = QueryBody {
        nonce: Some(*b"0123456789abcdef"),
        ..query.clone()
    };
    let answer_columns = vec!["custid".to_owned(), "value".to_owned()];
    let answer_rows: Vec<Vec<Value>> = awkward_values()
        .into_iter()
        .enumerate()
        .map(|(i, v)| vec![Value::Int(i as i64), v])
        .collect();
    let answer = QueryAnswer {
        query: Digest::of(&query.encode_canonical()),
        height: 9,
        columns: &answer_columns,
        rows: &answer_rows,
    };
    let effects = vec![
        chainify_core::effect::RowEffect {
            table: "checking".into(),
            key: vec![Value::Int(2)],
            image: Some(vec![
                Value::Int(2),
                Value::Decimal("-500.25".parse::<Decimal>().unwrap()),
            ]),
        },
        chainify_core::effect::RowEffect {
            table: "accounts".into(),
            key: vec![Value::Int(7)],
            image: None,
        },
    ];
    // The state digest: one row per awkward value (keyed 0..), then one removed again.
    let rows: Vec<Vec<Value>> = awkward_values()
        .into_iter()
        .enumerate()
        .map(|(i, v)| vec![Value::Int(i as i64), v])
        .collect();
    let mut state = StateHash::empty();
    for r in &rows {
        state.add(&RowHash::of("accounts", r));
    }
    let full = state.digest();
    state.remove(&RowHash::of("accounts", &rows[0]));
    let first_row = RowHash::of("accounts", &rows[1]);
    let mut single = StateHash::empty();
    single.add(&first_row);
    // Key ranges: the range of each awkward value as a key, and a tree's digests.
    let ranges: Vec<u32> = awkward_values()
        .into_iter()
        .map(|v| chainify_core::ranges::leaf_of("accounts", &[v]))
        .collect();
    let mut tree = chainify_core::ranges::RangeTree::new("accounts", vec![0]);
    for r in &rows {
        tree.add(r);
    }
    let first_leaf = chainify_core::ranges::RangeNode {
        level: chainify_core::ranges::DEPTH,
        index: tree.leaf_of_row(&rows[0]),
    };
    json!({
        "ranges": {
            "leaf_of_each_awkward_value": ranges,
            "root_of_all_awkward_rows": tree.digests().root().to_string(),
            "leaf_of_row_0": first_leaf.index,
            "leaf_digest_of_row_0": tree.digests().get(first_leaf).unwrap().to_string(),
        },
        "state": {
            "empty": StateHash::empty().digest().to_string(),
            "row_1_lanes_le_first_16_bytes": hex::encode(&single.to_bytes()[..16]),
            "all_awkward_rows": full.to_string(),
            "all_but_row_0": state.digest().to_string(),
        },
        "block_effect_digest": chainify_core::effect::block_digest(&effects).to_string(),
        "query": {
            "bytes": hex::encode(query.encode_canonical()),
            "signature": hex::encode(key.sign(&query.encode_canonical()).0),
        },
        "fresh_query": {
            "bytes": hex::encode(fresh_query.encode_canonical()),
            "signature": hex::encode(key.sign(&fresh_query.encode_canonical()).0),
        },
        "query_answer": {
            "bytes": hex::encode(answer.encode_canonical()),
            "signature": hex::encode(answer.sign(&key).0),
        },
        "key": { "seed": RFC8032_SEED, "public_key": key.public_key().to_string() },
        "values": { "bytes": hex::encode(values.finish()) },
        "proposal": {
            "bytes": hex::encode(&p_bytes),
            "tx_id": tx_id.to_string(),
            "signature": hex::encode(p.clone().sign(&key).signature.0),
        },
        "ledger_block": {
            "bytes": hex::encode(block.encode_canonical()),
            "hash": block.hash().to_string(),
        },
        "vote": {
            "bytes": hex::encode(Vote::signing_bytes(&vote.network, vote.block, &vote.ledger_block_hash, vote.org)),
            "signature": hex::encode(vote.signature.0),
        },
        "early_abort_reject": {
            "bytes": hex::encode(EarlyAbortResponse::signing_bytes(&reject.tx_id, reject.org, &reject.verdict)),
            "signature": hex::encode(reject.signature.0),
        },
    })
}

#[test]
fn canonical_encoding_matches_checked_in_vectors() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/canonical.json");
    let actual = vectors();
    if std::env::var_os("CHAINIFY_BLESS").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&actual).unwrap() + "\n").unwrap();
    }
    let expected: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        actual, expected,
        "canonical encoding changed; see this file's docs"
    );
}

#[test]
fn vector_prefix_is_the_domain_tag() {
    // Hand check of the layout's first fields: u32 length 20, "chainify.v1.Proposal", u32 length 7, "client1".
    let bytes = proposal().encode_canonical();
    assert_eq!(&bytes[..4], &[0, 0, 0, 20]);
    assert_eq!(&bytes[4..24], b"chainify.v1.Proposal");
    assert_eq!(&bytes[24..28], &[0, 0, 0, 7]);
    assert_eq!(&bytes[28..35], b"client1");
    assert_eq!(&bytes[35..43], &42u64.to_be_bytes());
}
