//! `chainify demo` as a newcomer runs it: a short run drives load, tampers with one
//! organization, shows its recovery, and ends with every organization agreeing (exit code 0);
//! bad options are refused by name before anything starts.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Output;

use serde_json::Value;

fn demo(args: &[&str]) -> Output {
    common::subcommand("demo", args)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_short_demo_recovers_the_tampered_org_and_ends_in_agreement() {
    let dir = tempfile::tempdir().unwrap();
    let o = demo(&[
        "--duration",
        "6",
        "--accounts",
        "500",
        "--clients",
        "32",
        "--dir",
        dir.path().to_str().unwrap(),
        "--json",
    ]);
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "exit {:?}\n{stderr}", o.status);
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["all_agree"], true, "{summary:#}");
    assert_eq!(summary["tampered"], "org2", "{summary:#}");
    let committed = summary["committed"].as_u64().unwrap();
    let succeeded = summary["succeeded"].as_u64().unwrap();
    assert!(committed > 0 && succeeded <= committed, "{summary:#}");
    assert!(summary["successful_tps"].as_f64().unwrap() > 0.0);
    let p50 = summary["latency_p50_ms"].as_f64().unwrap();
    let p99 = summary["latency_p99_ms"].as_f64().unwrap();
    assert!(0.0 < p50 && p50 <= p99, "{summary:#}");
    let orgs = summary["orgs"].as_array().unwrap();
    assert_eq!(orgs.len(), 3);
    let blocks = summary["blocks"].as_u64().unwrap();
    for org in orgs {
        assert_eq!(org["agrees"], true, "{summary:#}");
        assert_eq!(org["blocks"].as_u64().unwrap(), blocks, "{summary:#}");
    }
    // Only the tampered organization recovered, from a checkpoint before the bad block.
    assert_eq!(orgs[1]["recoveries"].as_u64().unwrap(), 1, "{summary:#}");
    assert_eq!(orgs[0]["recoveries"].as_u64().unwrap(), 0, "{summary:#}");
    assert_eq!(orgs[2]["recoveries"].as_u64().unwrap(), 0, "{summary:#}");
    let recoveries = summary["recoveries"].as_array().unwrap();
    assert_eq!(recoveries.len(), 1, "{summary:#}");
    let r = &recoveries[0];
    assert_eq!(r["org"], "org2");
    assert!(
        r["checkpoint"].as_u64().unwrap() < r["block"].as_u64().unwrap(),
        "{summary:#}"
    );
    assert!(r["recovery_ms"].as_f64().unwrap() > 0.0);
    // The recovery is shown while it happens.
    assert!(stderr.contains("tampered with org2's database"), "{stderr}");
    assert!(stderr.contains("org2 disagreed at block"), "{stderr}");
    // The SQLite files stay in the given directory.
    for n in 1..=3 {
        assert!(dir.path().join(format!("org{n}.db")).exists());
    }
}

#[test]
fn the_human_summary_names_the_figures() {
    let o = demo(&[
        "--duration",
        "2",
        "--accounts",
        "200",
        "--clients",
        "8",
        "--no-tamper",
    ]);
    let stdout = text(&o.stdout);
    assert!(o.status.success(), "{}\n{stdout}", text(&o.stderr));
    for needle in [
        "successful TPS",
        "latency            p50",
        "org1",
        "org3",
        "every organization agrees",
    ] {
        assert!(stdout.contains(needle), "{needle:?} missing:\n{stdout}");
    }
    assert!(!stdout.contains("recovery   "), "{stdout}");
}

#[test]
fn bad_options_are_refused_by_name() {
    for (args, needle) in [
        (&["--duration", "0"][..], "--duration 0"),
        (&["--orgs", "1"][..], "--orgs 1"),
        (&["--clients", "0"][..], "--clients 0"),
        (&["--accounts", "3"][..], "--accounts 3"),
        (
            &["--policy", "most-of-them", "--duration", "1"][..],
            "most-of-them",
        ),
        (&["--policy", "all", "--duration", "1"][..], "--policy all"),
    ] {
        let o = demo(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let stderr = text(&o.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}
