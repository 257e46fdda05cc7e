//! `chainify bench` measures a real in-process network: YCSB and Smallbank runs on SQLite and
//! on the servers of `cargo xtask test` end in agreement with sane figures, a JSON report and a
//! picture; bad options are refused by name.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use serde_json::Value;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_chainify"))
        .arg("bench")
        .args(args)
        .output()
        .unwrap()
}

fn run(args: &[&str]) -> (Value, String) {
    let out = tempfile::tempdir().unwrap();
    let mut all = vec!["--out", out.path().to_str().unwrap()];
    all.extend_from_slice(args);
    let o = bench(&all);
    assert!(
        o.status.success(),
        "exit {:?}\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("result.json")).unwrap())
            .unwrap();
    let svg = std::fs::read_to_string(out.path().join("result.svg")).unwrap();
    (report, svg)
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
    for phase in ["validate_analyse", "execute", "digest", "vote", "append"] {
        let per_org = report["phases"][phase].as_object().unwrap();
        assert_eq!(per_org.len(), orgs, "{phase}: {report:#}");
    }
    // One throughput line and one commit-timeline line per organization.
    assert_eq!(svg.matches("<polyline").count(), 1 + orgs);
    assert!(svg.contains("successful transactions per second"));
}

#[test]
fn ycsb_a_on_sqlite_measures_and_agrees() {
    let (report, svg) = run(&[
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
        let (report, svg) = run(&args);
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
        (
            &["--engines", "oracle", "--duration", "1"][..],
            "\"oracle\" is not sqlite",
        ),
    ] {
        let o = bench(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
