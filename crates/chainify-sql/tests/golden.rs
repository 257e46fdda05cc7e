//! Golden files for SQL analysis: every case in `golden/cases.txt` is analysed against
//! `golden/schema.sql`, and the read/write sets (or the rejection, with its code) must equal
//! `golden/cases.expected`.
//! Regenerate with `CHAINIFY_BLESS=1 cargo test -p chainify-sql --test golden` and review the diff:
//! the expected file is the reviewed statement of what each SQL shape reads and writes.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use chainify_core::tx::{Statement, Transaction};
use chainify_sql::json::{rwset_json, value_from_json};
use chainify_sql::render::Dialect;
use chainify_sql::{Analyzer, Schema};

fn run_cases(dir: &Path) -> String {
    let schema =
        Schema::from_sql(&std::fs::read_to_string(dir.join("schema.sql")).unwrap()).unwrap();
    let analyzer = Analyzer::new(schema);
    let text = std::fs::read_to_string(dir.join("cases.txt")).unwrap();
    let mut out = String::new();
    for block in text.split("\n\n") {
        let lines: Vec<&str> = block
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .collect();
        let Some((sql, rest)) = lines.split_first() else {
            continue;
        };
        let params: Vec<serde_json::Value> = rest
            .iter()
            .find_map(|l| l.strip_prefix("params:"))
            .map_or_else(Vec::new, |p| serde_json::from_str(p.trim()).unwrap());
        let tx = Transaction {
            statements: vec![Statement::new(
                *sql,
                params.iter().map(|p| value_from_json(p).unwrap()).collect(),
            )],
        };
        let result = match analyzer.analyze(&tx) {
            Ok(a) => {
                let (reads, writes) = rwset_json(&a.rwset);
                serde_json::json!({ "reads": reads, "writes": writes })
            }
            Err(e) => serde_json::json!({ "error": e.to_string(), "code": e.code() }),
        };
        out.push_str(&format!("== {sql}\n"));
        if !params.is_empty() {
            out.push_str(&format!(
                "   params {}\n",
                serde_json::to_string(&params).unwrap()
            ));
        }
        out.push_str(&serde_json::to_string(&result).unwrap());
        out.push('\n');
        // What each engine runs: rendered from the portable form, never copied from the text.
        if let Ok(a) = analyzer.analyze(&tx) {
            for (name, dialect) in [
                ("postgres", Dialect::Postgres),
                ("mysql", Dialect::MySql),
                ("sqlite", Dialect::Sqlite),
            ] {
                let r = a.typed[0].rendered(dialect);
                out.push_str(&format!("   {name}: {}", r.sql));
                if dialect == Dialect::MySql && !r.bind_order.is_empty() {
                    out.push_str(&format!("  binds {:?}", r.bind_order));
                }
                out.push('\n');
            }
        }
        out.push('\n');
    }
    out
}

#[test]
fn analysis_matches_golden_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let actual = run_cases(&dir);
    let expected_path = dir.join("cases.expected");
    if std::env::var_os("CHAINIFY_BLESS").is_some() {
        std::fs::write(&expected_path, &actual).unwrap();
    }
    let expected = std::fs::read_to_string(&expected_path).unwrap();
    if actual != expected {
        for (a, e) in actual.lines().zip(expected.lines()) {
            assert_eq!(a, e, "first differing line of the golden output");
        }
        assert_eq!(
            actual.lines().count(),
            expected.lines().count(),
            "golden output length differs"
        );
    }
}
