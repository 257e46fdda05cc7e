//! The `chainify` binary as a user runs it: `init` writes a network that loads, refuses to
//! overwrite and rejects bad arguments; `analyze` prints the documented JSON contract and fails
//! only on malformed input files.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use chainify_core::config::OrgConfig;
use serde_json::{Value, json};

fn chainify(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_chainify"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn init_writes_a_network_that_loads() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("net");
    let o = chainify(&[
        "init",
        "--orgs",
        "3",
        "--clients",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--policy",
        "any-2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for i in 1..=3 {
        let cfg = OrgConfig::load(&out.join(format!("org{i}/org.toml"))).unwrap();
        assert_eq!(cfg.org_id.0, i);
        assert_eq!(cfg.network.orgs.len(), 3);
        assert_eq!(cfg.network.clients.len(), 2);
        let key = chainify_core::crypto::SigningKey::load(&cfg.signing_key).unwrap();
        assert_eq!(key.public_key(), cfg.network.orgs[&cfg.org_id].public_key);
    }
    assert!(Path::new(&out.join("clients/client2.pk8")).exists());
    // A second init into the same directory must not overwrite keys.
    let again = chainify(&["init", "--orgs", "3", "--out", out.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("already contains a network.toml"),
        "{}",
        stderr(&again)
    );
}

#[test]
fn init_rejects_bad_arguments_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("net");
    let o = chainify(&[
        "init",
        "--orgs",
        "4",
        "--policy",
        "any-2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(
            "--policy: policy `any-2`: combinations [1, 2] and [3, 4] share no organization"
        ),
        "{}",
        stderr(&o)
    );
    assert!(
        !out.exists(),
        "nothing may be written for rejected arguments"
    );
    let o = chainify(&["init", "--orgs", "0", "--out", out.to_str().unwrap()]);
    assert!(stderr(&o).contains("--orgs 0"), "{}", stderr(&o));
}

const SCHEMA: &str = "CREATE TABLE accounts (custid BIGINT PRIMARY KEY, name TEXT UNIQUE);
CREATE TABLE savings (custid BIGINT PRIMARY KEY REFERENCES accounts(custid), bal BIGINT);
CREATE TABLE checking (custid BIGINT PRIMARY KEY REFERENCES accounts(custid), bal BIGINT);";

fn analyze(block: &Value) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.sql");
    let file = dir.path().join("block.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    std::fs::write(&file, block.to_string()).unwrap();
    chainify(&[
        "analyze",
        "--schema",
        schema.to_str().unwrap(),
        file.to_str().unwrap(),
    ])
}

#[test]
fn analyze_prints_sets_and_every_conflicting_pair() {
    let send = |a: i64, b: i64| {
        json!([
            {"sql": "UPDATE checking SET bal = bal - $3 WHERE custid = $1 AND bal >= $3", "params": [a, b, 10], "expect_rows": 1},
            {"sql": "UPDATE checking SET bal = bal + $3 WHERE custid = $2", "params": [a, b, 10], "expect_rows": 1}
        ])
    };
    let block = json!([
        send(1, 2),                                                             // 0
        [{"sql": "UPDATE savings SET bal = bal + $2 WHERE custid = $1", "params": [2, 5]}], // 1
        send(2, 3),                                                             // 2: conflicts with 0
        [{"sql": "UPDATE checking SET bal = NOW() WHERE custid = 1"}],          // 3: rejected
        [{"sql": "SELECT bal FROM checking WHERE custid = $1", "params": ["3"]}], // 4: reads 3, conflicts with 2
        [{"sql": "DELETE FROM accounts WHERE custid = 2"}],                     // 5: FK checks read savings[2], checking[2]
        send(1, 2),                                                             // 6: conflicts with 0, 2
    ]);
    let o = analyze(&block);
    assert!(o.status.success(), "{}", stderr(&o));
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    let txs = out["transactions"].as_array().unwrap();
    assert_eq!(txs.len(), 7);
    assert_eq!(txs[0]["writes"], json!({"checking": [[1], [2]]}));
    assert_eq!(txs[0]["error"], Value::Null);
    assert_eq!(txs[4]["reads"], json!({"checking": [[3]]}));
    assert_eq!(
        txs[3]["error"],
        json!("statement 1: NOW() reads the clock, which differs between organizations")
    );
    assert_eq!(txs[5]["reads"]["savings"], json!([[2]]));
    assert_eq!(
        out["conflicts"],
        json!([
            [0, 2],
            [0, 5],
            [0, 6],
            [1, 5],
            [2, 4],
            [2, 5],
            [2, 6],
            [5, 6]
        ])
    );
}

#[test]
fn analyze_fails_only_on_malformed_files() {
    let o = analyze(&json!({"not": "an array"}));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("block must be a JSON array of transactions"),
        "{}",
        stderr(&o)
    );
    let o = analyze(&json!([[{"sql": 5}]]));
    assert!(
        stderr(&o).contains("transaction 0, statement 0: \"sql\" must be a string"),
        "{}",
        stderr(&o)
    );
    let o = analyze(&json!([[{"sql": "SELECT 1", "params": [[1]]}]]));
    assert!(
        stderr(&o).contains("transaction 0, statement 0, parameter $1"),
        "{}",
        stderr(&o)
    );
    // Unparseable SQL inside a well-formed file is a per-transaction error, not a failure.
    let o = analyze(&json!([[{"sql": "UPDATE ("}]]));
    assert!(o.status.success(), "{}", stderr(&o));
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        out["transactions"][0]["error"]
            .as_str()
            .unwrap()
            .contains("does not parse")
    );
    assert_eq!(out["conflicts"], json!([]));

    let dir = tempfile::tempdir().unwrap();
    let bad_schema = dir.path().join("s.sql");
    std::fs::write(&bad_schema, "CREATE TABLE (").unwrap();
    let block = dir.path().join("b.json");
    std::fs::write(&block, "[]").unwrap();
    let o = chainify(&[
        "analyze",
        "--schema",
        bad_schema.to_str().unwrap(),
        block.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("s.sql: schema does not parse"),
        "{}",
        stderr(&o)
    );
}
