//! `chainify bench` measures a real in-process network: YCSB and Smallbank runs on SQLite and
//! on the servers of `cargo xtask test` end in agreement with sane figures, a JSON report and a
//! picture; bad options are refused by name.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Output;

use serde_json::Value;

fn bench(args: &[&str]) -> Output {
    common::subcommand("bench", args)
}

fn run(args: &[&str]) -> (Value, String) {
    let (report, svg, _) = run_process(args);
    (report, svg)
}

/// [`run`], and the process id the run's server databases are named by.
fn run_process(args: &[&str]) -> (Value, String, u32) {
    let out = tempfile::tempdir().unwrap();
    let mut all = vec!["bench", "--out", out.path().to_str().unwrap()];
    all.extend_from_slice(args);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_chainify"))
        .args(&all)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "exit {:?}\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // The human summary puts each figure on its own line.
    let stdout = String::from_utf8_lossy(&o.stdout);
    for line in ["  latency            p50 ", " in the measured window)"] {
        assert!(stdout.contains(line), "{line:?} missing:\n{stdout}");
    }
    assert!(
        stdout.contains(" agreed)") || stdout.contains(" agreed; "),
        "{stdout}"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("result.json")).unwrap())
            .unwrap();
    let svg = std::fs::read_to_string(out.path().join("result.svg")).unwrap();
    (report, svg, pid)
}

/// The databases on the test servers whose names start with `prefix`.
fn server_databases(prefix: &str) -> Vec<String> {
    use chainify_storage::{AnyBackend, Backend, Conn, StoreOptions, ddl::ReadType};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut found = Vec::new();
        for (engine, list) in [
            ("postgres", "SELECT datname::text FROM pg_database"),
            (
                "mariadb",
                "SELECT CONVERT(SCHEMA_NAME USING utf8mb4) FROM information_schema.SCHEMATA",
            ),
        ] {
            let url = chainify_testkit::engines::url(engine, "chainify_test");
            let backend = AnyBackend::connect(&url, &StoreOptions::default())
                .await
                .unwrap();
            let mut conn = backend.acquire().await.unwrap();
            for row in conn.query(list, &[], &[ReadType::Text]).await.unwrap() {
                if let Some(chainify_core::Value::Text(name)) = row.into_iter().next()
                    && name.starts_with(prefix)
                {
                    found.push(format!("{engine}: {name}"));
                }
            }
            drop(conn);
            backend.close().await;
        }
        found
    })
}

fn check(report: &Value, svg: &str, orgs: usize) {
    assert_eq!(report["all_agree"], true, "{report:#}");
    assert!(
        report["successful_tps"].as_f64().unwrap() > 0.0,
        "{report:#}"
    );
    let succeeded = report["succeeded"].as_u64().unwrap();
    assert!(succeeded > 0 && succeeded <= report["committed"].as_u64().unwrap());
    let p50 = report["latency_ms"]["p50"].as_f64().unwrap();
    let p99 = report["latency_ms"]["p99"].as_f64().unwrap();
    assert!(0.0 < p50 && p50 <= p99, "{report:#}");
    assert!(report["blocks"].as_u64().unwrap() > 0);
    let heights = report["heights_series"].as_object().unwrap();
    assert_eq!(heights.len(), orgs);
    for phase in ["validate", "analyse", "execute", "digest", "vote", "append"] {
        let per_org = report["phases"][phase].as_object().unwrap();
        assert_eq!(per_org.len(), orgs, "{phase}: {report:#}");
    }
    // One throughput line and one commit-timeline line per organization.
    assert_eq!(svg.matches("<polyline").count(), 1 + orgs);
    assert!(svg.contains("successful transactions per second"));
}

/// Unsigned YCSB A on SQLite while org2 is tampered with and org3 crashes and restarts: the
/// figures of a Fig. 8 run (recovery, catch-up) are reported and everything agrees at the end.
#[test]
fn ycsb_a_on_sqlite_measures_recovery_and_catch_up_without_signatures() {
    let (report, svg) = run(&[
        "--crypto",
        "off",
        "--tamper",
        "2@1.5",
        "--fail",
        "3@2+1",
        "--checkpoint-interval",
        "5",
        "--workload",
        "ycsb-a",
        "--keys",
        "500",
        "--fields",
        "4",
        "--field-length",
        "20",
        "--clients",
        "16",
        "--warmup",
        "1",
        "--duration",
        "3",
    ]);
    check(&report, &svg, 3);
    assert_eq!(report["config"]["workload"], "ycsb-a");
    assert_eq!(report["config"]["crypto"], "off");
    let events: Vec<&str> = report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        ["org2 tampered", "org3 crashed", "org3 restarted"],
        "{report:#}"
    );
    let recoveries = report["recoveries"].as_array().unwrap();
    assert!(
        recoveries
            .iter()
            .any(|r| r["org"] == "org2" && r["disagreement_to_agreed_ms"].as_f64().unwrap() > 0.0),
        "{report:#}"
    );
    let catch_ups = report["catch_ups"].as_array().unwrap();
    assert_eq!(catch_ups.len(), 1, "{report:#}");
    assert_eq!(catch_ups[0]["org"], "org3");
    assert!(catch_ups[0]["caught_up_after_s"].as_f64().unwrap() >= 0.0);
    // The warm-up and the three faults are marked on both time panels.
    assert_eq!(svg.matches("stroke-dasharray").count(), 2 * 4);
}

/// `--transactions` ends the measurement once that many are agreed, well before the duration.
#[test]
fn a_transaction_count_ends_the_measurement() {
    let (report, svg) = run(&[
        "--keys",
        "500",
        "--clients",
        "8",
        "--warmup",
        "0.5",
        "--duration",
        "120",
        "--transactions",
        "300",
    ]);
    check(&report, &svg, 3);
    assert!(report["committed"].as_u64().unwrap() >= 300, "{report:#}");
    assert!(report["measured_s"].as_f64().unwrap() < 120.0, "{report:#}");
    assert_eq!(report["config"]["transactions"], 300);
}

/// YCSB B and the full Smallbank mix on PostgreSQL, MariaDB and SQLite side by side, serially
/// and in parallel.
#[test]
fn heterogeneous_engines_run_ycsb_and_the_full_smallbank_mix() {
    for (workload, execution, raw) in [
        ("ycsb-b", "parallel", false),
        ("smallbank-full", "serial", true),
    ] {
        let mut args = vec![
            "--engines",
            "postgres,mariadb,sqlite",
            "--workload",
            workload,
            "--execution",
            execution,
            "--keys",
            "300",
            "--clients",
            "16",
            "--warmup",
            "1",
            "--duration",
            "3",
        ];
        if raw {
            args.push("--raw");
        }
        let (report, svg, pid) = run_process(&args);
        // The organizations' and the raw baseline's server databases are gone after the run.
        assert_eq!(
            server_databases(&format!("bench_{pid}_")),
            Vec::<String>::new()
        );
        if raw {
            // The raw baseline ran the same streams on each engine; its bars follow the rest.
            let rows = report["raw"].as_array().unwrap();
            assert_eq!(rows.len(), 3, "{report:#}");
            for (row, engine) in rows.iter().zip(["postgres", "mariadb", "sqlite"]) {
                assert_eq!(row["engine"], engine);
                assert!(row["successful_tps"].as_f64().unwrap() > 0.0, "{row}");
                assert!(row["layer_over_raw"].as_f64().unwrap() > 0.0, "{row}");
            }
            assert!(svg.contains("chainify vs each engine raw"));
        } else {
            assert!(report.get("raw").is_none());
        }
        check(&report, &svg, 3);
    }
}

#[test]
fn bad_options_are_refused_by_name() {
    for (args, needle) in [
        (&["--workload", "tpcc"][..], "--workload \"tpcc\""),
        (&["--distribution", "zipf:x"][..], "--distribution"),
        (&["--execution", "quantum"][..], "--execution \"quantum\""),
        (&["--duration", "0"][..], "--duration 0"),
        (&["--fields", "0"][..], "0 fields"),
        (&["--crypto", "maybe"][..], "--crypto \"maybe\""),
        (
            &["--cut", "sometimes"][..],
            "--cut \"sometimes\": on-demand or timeout",
        ),
        (&["--transactions", "0"][..], "--transactions 0"),
        (
            &["--tamper", "4@1"][..],
            "--tamper \"4@1\": the network has organizations 1 to 3",
        ),
        (&["--fail", "1@1"][..], "org1 observes the latency"),
        (
            &["--policy", "all", "--tamper", "2@1"][..],
            "other than org2 cannot agree",
        ),
        (&["--policy", "any-5"][..], "--policy \"any-5\""),
        (
            &["--fail", "2@1+5", "--fail", "3@2"][..],
            "other than org2 and org3 cannot agree while they are",
        ),
        (
            &["--fail", "2@99", "--duration", "5"][..],
            "the run ends at 10 s",
        ),
        (
            &["--engines", "oracle,sqlite,sqlite", "--duration", "1"][..],
            "\"oracle\" is not sqlite",
        ),
    ] {
        let o = bench(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
