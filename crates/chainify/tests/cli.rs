//! The `chainify` binary as a user runs it: `init` writes a network that loads, refuses to
//! overwrite and rejects bad arguments; `analyze` prints the documented JSON contract and fails
//! only on malformed input files.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Output;

use chainify_core::config::OrgConfig;
use common::{chainify, stderr};
use serde_json::{Value, json};

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

/// `issue-cert` writes a certificate for one organization from the network's CA, never over an
/// existing file, and refuses what names no organization.
#[test]
fn issue_cert_writes_an_organization_s_certificate_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("net");
    let o = chainify(&["init", "--orgs", "1", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (ca, ca_key) = (out.join("tls/ca.pem"), out.join("tls/ca.key"));
    let (cert, key) = (dir.path().join("org2.pem"), dir.path().join("org2.key"));
    let issue = |extra: &[&str]| {
        let mut args = vec![
            "issue-cert",
            "--ca",
            ca.to_str().unwrap(),
            "--ca-key",
            ca_key.to_str().unwrap(),
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        chainify(&args)
    };
    let o = issue(&["--org", "2", "--host", "org2.example.net"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("org2.chainify.internal"));
    let pem = std::fs::read_to_string(&cert).unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .contains("PRIVATE KEY")
    );
    // Private keys are the owner's alone, from their creation on.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for secret in [
        key.clone(),
        ca_key.clone(),
        out.join("org1/signing.pk8"),
        out.join("org1/tls.key"),
        out.join("tls/orderer.key"),
        out.join("clients/client1.pk8"),
    ] {
        assert_eq!(mode(&secret), 0o600, "{}", secret.display());
    }
    let again = issue(&["--org", "2"]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("never overwritten"),
        "{}",
        stderr(&again)
    );
    assert_eq!(std::fs::read_to_string(&cert).unwrap(), pem);
    let zero = issue(&["--org", "0"]);
    assert!(
        stderr(&zero).contains("numbered from 1"),
        "{}",
        stderr(&zero)
    );
    let neither = issue(&[]);
    assert!(!neither.status.success());
    assert!(stderr(&neither).contains("--org"), "{}", stderr(&neither));
}

/// A client command given another endpoint must name the organization there: queries are
/// signed for one organization, and signing them for organization 1 by default would hand the
/// endpoint's organization a query it could replay at organization 1.
#[test]
fn an_endpoint_without_its_organization_is_refused() {
    for command in ["query", "submit"] {
        let o = chainify(&[
            command,
            "--network",
            "net/network.toml",
            "--endpoint",
            "127.0.0.1:1",
            "--sql",
            "SELECT 1",
        ]);
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(err.contains("--org"), "{command}: {err}");
    }
}

#[test]
fn an_admin_endpoint_without_its_organization_is_refused() {
    for admin in ["127.0.0.1:1", "0=127.0.0.1:1", "x=127.0.0.1:1"] {
        let o = chainify(&["status", "--admin", admin]);
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(
            err.contains(&format!("{admin:?} does not name its organization")),
            "{admin}: {err}"
        );
    }
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
        [{"sql": "SELECT bal FROM checking WHERE custid = $1", "params": [3]}], // 4: reads 3, conflicts with 2
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
    assert_eq!(txs[0]["code"], Value::Null);
    assert_eq!(txs[4]["reads"], json!({"checking": [[3]]}));
    assert_eq!(
        txs[3],
        json!({
            "reads": {},
            "writes": {},
            "error": "statement 1: NOW() reads the clock, which differs between organizations",
            "code": "SQL006"
        })
    );
    // Every transaction has exactly the documented fields.
    for tx in txs {
        let mut keys: Vec<&str> = tx.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["code", "error", "reads", "writes"], "{tx}");
    }
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
    assert_eq!(out["transactions"][0]["code"], json!("SQL001"));
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

#[test]
fn init_options_reach_the_configuration() {
    use chainify_core::config::StatementKind;
    use chainify_core::config::{NetworkConfig, OrdererKind};
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
        "--orderer",
        "kafka",
        "--kafka-brokers",
        "127.0.0.1:59999",
        "--kafka-topic",
        "ledger",
        "--tables",
        "accounts,checking",
        "--grant",
        "client2:checking:select+update",
        "--database",
        "postgres://u@127.0.0.1:1/a",
        "--database",
        "mysql://u@127.0.0.1:1/b",
        "--database",
        "sqlite:///tmp/c.db",
        "--block-txs",
        "64",
        "--checkpoint-interval",
        "7",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let net = NetworkConfig::load(&out.join("network.toml")).unwrap();
    assert_eq!(net.orderer.kind, OrdererKind::Kafka);
    assert_eq!(net.orderer.kafka_topic.as_deref(), Some("ledger"));
    assert_eq!(net.tables, ["accounts", "checking"]);
    assert_eq!(net.max_block_txs, 64);
    assert_eq!(
        net.signatures,
        chainify_core::crypto::Signatures::Ed25519Zip215
    );
    let c2 = net
        .clients
        .values()
        .find(|c| c.id.as_str() == "client2")
        .unwrap();
    assert!(c2.may(StatementKind::Update, "checking"));
    assert!(!c2.may(StatementKind::Delete, "checking"));
    assert!(!c2.may(StatementKind::Select, "accounts"));
    let c1 = net
        .clients
        .values()
        .find(|c| c.id.as_str() == "client1")
        .unwrap();
    assert!(c1.may(StatementKind::Delete, "accounts"), "unrestricted");
    // TLS by default: a CA for the network, a certificate per organization.
    let ca = net.tls_ca.as_ref().unwrap();
    assert!(ca.exists(), "{}", ca.display());
    for (i, url) in [
        "postgres://u@127.0.0.1:1/a",
        "mysql://u@127.0.0.1:1/b",
        "sqlite:///tmp/c.db",
    ]
    .iter()
    .enumerate()
    {
        let cfg = OrgConfig::load(&out.join(format!("org{}/org.toml", i + 1))).unwrap();
        assert_eq!(cfg.database_url, *url);
        assert_eq!(cfg.checkpoint.interval_blocks, 7);
        assert!(cfg.tls.is_some());
    }

    let plain = dir.path().join("plain");
    let o = chainify(&[
        "init",
        "--out",
        plain.to_str().unwrap(),
        "--no-tls",
        "--unsigned",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let net = NetworkConfig::load(&plain.join("network.toml")).unwrap();
    assert_eq!(net.signatures, chainify_core::crypto::Signatures::Off);
    assert!(net.tls_ca.is_none());
    assert!(!plain.join("tls").exists());
    let cfg = OrgConfig::load(&plain.join("org1/org.toml")).unwrap();
    assert!(
        cfg.database_url.starts_with("sqlite:///"),
        "{}",
        cfg.database_url
    );
    assert!(
        cfg.database_url.ends_with("plain/org1/state.db"),
        "{}",
        cfg.database_url
    );
}

#[test]
fn bad_init_options_are_named_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("net");
    let o_ = out.to_str().unwrap();
    for (args, needle) in [
        (
            &["--grant", "client9:checking:select"][..],
            "--grant names \"client9\"",
        ),
        (
            &["--grant", "client1:checking:fly"][..],
            "\"fly\" is not select, insert, update or delete",
        ),
        (
            &["--grant", "client1:checking"][..],
            "expected CLIENT:TABLE:KIND",
        ),
        (
            &["--database", "sqlite:///tmp/x.db"][..],
            "--database given 1 times for 3 organizations",
        ),
        (
            &["--orderer", "kafka"][..],
            "--orderer kafka needs --kafka-brokers",
        ),
        (&["--orderer", "raft"][..], "--orderer \"raft\""),
        (
            &["--hosts", "a.example,b.example"][..],
            "--hosts names 2 machines for 3 organizations",
        ),
        (&["--hosts", "a,b,c"][..], "--hosts with --orderer solo"),
        (
            &[
                "--hosts",
                "a,b:7,c",
                "--orderer",
                "kafka",
                "--kafka-brokers",
                "k:1",
            ][..],
            "--hosts: \"b:7\" is not a host name",
        ),
        (
            &[
                "--orderer",
                "kafka",
                "--kafka-brokers",
                "k:1",
                "--kafka-replication",
                "0",
            ][..],
            "--kafka-replication 0",
        ),
        (
            &[
                "--hosts",
                "a,b,c",
                "--orderer",
                "kafka",
                "--kafka-brokers",
                "k:1",
                "--unsigned",
            ][..],
            "--unsigned with --hosts",
        ),
        // Caught only when the written network is loaded: still nothing is left behind.
        (&["--tables", "accounts,Bad Table"][..], "Bad Table"),
        (&["--block-txs", "0"][..], "max_block_txs"),
    ] {
        let mut all = vec!["init", "--out", o_];
        all.extend_from_slice(args);
        let o = chainify(&all);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(!out.exists(), "{args:?} left {}", out.display());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "{args:?} left a staging directory"
        );
    }
}

/// A dev network of three processes on SQLite with the solo orderer: a transaction submitted
/// and queried from the command line, and `verify-ledger` accepting the ledgers, refusing them
/// against another network's keys (exit 1, naming the block) and failing to read a missing
/// database (exit 2).
#[test]
fn devnet_submit_query_and_verify_ledger_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("net");
    let d = dir.to_str().unwrap();
    let up = chainify(&["devnet", "up", "--dir", d, "--base-port", "37600"]);
    struct Down<'a>(&'a str);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = chainify(&["devnet", "down", "--dir", self.0]);
        }
    }
    let _down = Down(d);
    assert!(up.status.success(), "{}", stderr(&up));
    let network = dir.join("network.toml");
    let n = network.to_str().unwrap();
    let submit = chainify(&[
        "submit",
        "--network",
        n,
        "--org",
        "2",
        "--sql",
        "UPDATE checking SET bal = bal + $2 WHERE custid = $1",
        "--params",
        "[5, 300]",
        "--expect-rows",
        "1",
        "--wait",
    ]);
    assert!(submit.status.success(), "{}", stderr(&submit));
    let outcome: Value = serde_json::from_slice(&submit.stdout).unwrap();
    assert_eq!(outcome["success"], true, "{outcome}");
    assert_eq!(outcome["agreed"], true, "{outcome}");
    let failed = chainify(&[
        "submit",
        "--network",
        n,
        "--sql",
        "UPDATE checking SET bal = bal + 1 WHERE custid = $1",
        "--params",
        "[999999]",
        "--expect-rows",
        "1",
        "--wait",
    ]);
    let failed: Value = serde_json::from_slice(&failed.stdout).unwrap();
    assert_eq!(failed["success"], false, "{failed}");
    // Both outcomes are proven by their agreed blocks and certificates, read from the ledger
    // of the organization that reported them.
    for (o, org) in [(&outcome, "2"), (&failed, "1")] {
        let proven = chainify(&[
            "tx-status",
            "--network",
            n,
            "--org",
            org,
            "--tx-id",
            o["tx_id"].as_str().unwrap(),
            "--prove",
        ]);
        assert!(proven.status.success(), "{}", stderr(&proven));
        let proven: Value = serde_json::from_slice(&proven.stdout).unwrap();
        assert_eq!(proven["outcome"]["success"], o["success"], "{proven}");
        assert!(
            proven["proof"]["certified_by"].as_array().unwrap().len() >= 2,
            "{proven}"
        );
    }
    assert!(
        failed["reason"]
            .as_str()
            .unwrap()
            .contains("expected 1 rows, got 0"),
        "{failed}"
    );
    let query = chainify(&[
        "query",
        "--network",
        n,
        "--org",
        "3",
        "--sql",
        "SELECT bal FROM checking WHERE custid = $1",
        "--params",
        "[5]",
    ]);
    assert!(query.status.success(), "{}", stderr(&query));
    let rows: Value = serde_json::from_slice(&query.stdout).unwrap();
    assert!(rows["height"].as_u64().unwrap() >= outcome["block"].as_u64().unwrap());
    assert_eq!(rows["columns"], json!(["bal"]), "{rows}");
    assert_eq!(rows["rows"].as_array().unwrap().len(), 1, "{rows}");

    // The benchmark drives the processes over gRPC, spread over the three organizations.
    let results = tmp.path().join("bench");
    let r = results.to_str().unwrap();
    let bench = chainify(&[
        "bench",
        "--devnet",
        d,
        "--clients",
        "6",
        "--warmup",
        "1",
        "--duration",
        "2",
        "--out",
        r,
    ]);
    assert!(bench.status.success(), "{}", stderr(&bench));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(results.join("result.json")).unwrap())
            .unwrap();
    assert_eq!(report["all_agree"], true, "{report:#}");
    assert!(
        report["successful_tps"].as_f64().unwrap() > 0.0,
        "{report:#}"
    );
    assert_eq!(report["config"]["keys"], 1000, "the devnet's accounts");
    assert_eq!(
        report["config"]["engines"],
        json!(["sqlite", "sqlite", "sqlite"])
    );
    for phase in ["endorse", "order", "execute", "vote"] {
        let orgs = report["phases"][phase].as_object().unwrap();
        assert_eq!(orgs.len(), 3, "{phase} at every organization: {report:#}");
    }
    for (args, needle) in [
        (&["--engines", "postgres"][..], "--engines"),
        (&["--workload", "ycsb-a"][..], "a devnet holds Smallbank"),
    ] {
        let mut all = vec!["bench", "--devnet", d, "--out", r];
        all.extend_from_slice(args);
        let o = chainify(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }

    for org in ["1", "2", "3"] {
        let o = chainify(&["verify-ledger", "--network", n, "--org", org]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let report: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(report["ok"], true, "{report}");
        assert_eq!(report["signatures_checked"], true, "{report}");
        assert!(report["blocks_checked"].as_u64().unwrap() >= 2, "{report}");
    }
    // The same ledger checked against another network's keys: its first certificate fails.
    let other = tmp.path().join("other");
    let o = chainify(&["init", "--out", other.to_str().unwrap(), "--no-tls"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let db = OrgConfig::load(&dir.join("org1/org.toml"))
        .unwrap()
        .database_url;
    let o = chainify(&[
        "verify-ledger",
        "--network",
        other.join("network.toml").to_str().unwrap(),
        "--database",
        &db,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(report["first_bad_block"], 1, "{report}");
    assert!(!report["problem"].as_str().unwrap().is_empty(), "{report}");
    let missing = format!("sqlite://{}/nowhere/x.db", tmp.path().display());
    let o = chainify(&["verify-ledger", "--network", n, "--database", &missing]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("nowhere"), "{}", stderr(&o));
    // A mistyped file is not created (an empty database once "verified" with exit 0).
    let typo = tmp.path().join("typo.db");
    let o = chainify(&[
        "verify-ledger",
        "--network",
        n,
        "--database",
        &format!("sqlite://{}", typo.display()),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("typo.db"), "{}", stderr(&o));
    assert!(!typo.exists(), "verify-ledger created {}", typo.display());

    // The data check: the tables are what the newest block's state digest says.
    let db2 = OrgConfig::load(&dir.join("org2/org.toml"))
        .unwrap()
        .database_url;
    let verify = |extra: &[&str]| {
        let mut all = vec!["verify-ledger", "--network", n, "--database", &db2];
        all.extend_from_slice(extra);
        let o = chainify(&all);
        let report: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        (o.status.code(), report, stderr(&o))
    };
    let (code, good, err) = verify(&["--data"]);
    assert_eq!(code, Some(0), "{good} {err}");
    assert_eq!(
        good["checks"],
        json!(["chain", "certificates", "data"]),
        "{good}"
    );
    let height = good["height"].as_u64().unwrap();
    let newest = good["newest_hash"].as_str().unwrap().to_owned();
    let h = height.to_string();
    let (code, report, _) = verify(&["--expect-height", &h, "--expect-hash", &newest]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(
        report["checks"],
        json!(["chain", "certificates", "height", "hash"]),
        "{report}"
    );
    // A truncated ledger (the auditor knows a later block) and a fork (another hash).
    let (code, report, _) = verify(&["--expect-height", &(height + 1).to_string()]);
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report["problem"].as_str().unwrap().contains("truncated"),
        "{report}"
    );
    let forged = "00".repeat(32);
    let (code, report, _) = verify(&["--expect-hash", &forged]);
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report["problem"].as_str().unwrap().contains("a fork"),
        "{report}"
    );
    let (code, _, err) = verify(&["--expect-hash", "xyz"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--expect-hash xyz"), "{err}");
    // A row changed behind the triggers' back: the chain still verifies, the data does not.
    tamper_sqlite(
        &db2,
        &[
            "DROP TRIGGER chainify_dg_accounts_au",
            "UPDATE accounts SET name = 'mallory' WHERE custid = 7",
        ],
    );
    let (code, report, _) = verify(&[]);
    assert_eq!(
        code,
        Some(0),
        "without --data the ledger alone verifies: {report}"
    );
    let (code, report, _) = verify(&["--data"]);
    assert_eq!(code, Some(1), "{report}");
    let problem = report["problem"].as_str().unwrap();
    assert!(
        problem.contains("not what ledger block") && problem.contains("accounts"),
        "{report}"
    );
    // A plain UPDATE by a DBA, recorded by the triggers but in no block: the recorded
    // before-image is the audited database's word, so the data check fails rather than take
    // the change back.
    let db3 = OrgConfig::load(&dir.join("org3/org.toml"))
        .unwrap()
        .database_url;
    tamper_sqlite(
        &db3,
        &["UPDATE checking SET bal = bal + 1 WHERE custid = 9"],
    );
    let o = chainify(&[
        "verify-ledger",
        "--network",
        n,
        "--database",
        &db3,
        "--data",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        report["problem"]
            .as_str()
            .unwrap()
            .contains("recorded but in no block"),
        "{report}"
    );
    assert_eq!(report["data"]["pending_changes"], 1, "{report}");
}

/// Runs statements on a SQLite database directly, as a DBA with the sqlite3 shell would.
fn tamper_sqlite(url: &str, statements: &[&str]) {
    use chainify_storage::{AnyBackend, Backend, Conn, StoreOptions};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let backend = AnyBackend::connect(url, &StoreOptions::default())
            .await
            .unwrap();
        let mut conn = backend.acquire().await.unwrap();
        for s in statements {
            conn.batch(s).await.unwrap();
        }
        drop(conn);
        backend.close().await;
    });
}

#[test]
fn a_node_refuses_an_unknown_component_and_a_missing_execution_address() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("net");
    let o = chainify(&["init", "--out", out.to_str().unwrap(), "--no-tls"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let config = out.join("org1/org.toml");
    let c = config.to_str().unwrap();
    let o = chainify(&["node", "--config", c, "--component", "voting"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("\"voting\" is not a component"),
        "{}",
        stderr(&o)
    );
    // An org file written before the execution address existed.
    let text = std::fs::read_to_string(&config).unwrap();
    let without: String = text
        .lines()
        .filter(|l| !l.starts_with("execution = "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(text, without, "init writes listen.execution");
    std::fs::write(&config, without).unwrap();
    let o = chainify(&["node", "--config", c, "--component", "execution"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("listen.execution is not set"),
        "{}",
        stderr(&o)
    );
    // The AdminService authenticates no caller: on every interface, the node does not start.
    let exposed: String = text
        .lines()
        .map(|l| {
            if l.starts_with("admin = ") {
                "admin = \"0.0.0.0:47003\"\n".to_owned()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&config, exposed).unwrap();
    let o = chainify(&["node", "--config", c]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("listen.admin = \"0.0.0.0:47003\"")
            && stderr(&o).contains("must be a loopback address"),
        "{}",
        stderr(&o)
    );
}
