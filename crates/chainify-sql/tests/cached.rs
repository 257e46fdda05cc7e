//! An analysis made of lookups alone (`analyze_cached`, `query_cached`: what an async worker
//! runs in place) answers exactly as the full one whenever it answers: the same plans,
//! typings, read/write sets, columns and refusals, with the cache cleared under it or not.
#![allow(clippy::unwrap_used)]

use chainify_core::Decimal;
use chainify_core::Value;
use chainify_core::tx::{Statement, Transaction};
use chainify_sql::{AnalysisError, Analyzer, QueryPlan, Schema, TxAnalysis};
use proptest::prelude::*;

const SCHEMA: &str = "CREATE TABLE t (a INT, b INT, v INT, s TEXT, PRIMARY KEY (a, b));
  CREATE TABLE u (a INT PRIMARY KEY, b INT, v INT, d DECIMAL(10,2), n VARCHAR(4));";

fn val() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (-3i64..4).prop_map(Value::Int),
        1 => prop_oneof![Just(i64::MAX), Just(i64::MIN)].prop_map(Value::Int),
        2 => Just(Value::Null),
        1 => (-999i128..999, 0u8..3).prop_map(|(m, s)| Value::Decimal(Decimal::new(m, s).unwrap())),
        2 => "[a-z]{0,6}".prop_map(Value::Text),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => prop::collection::vec(any::<u8>(), 0..3).prop_map(Value::Bytes),
    ]
}

fn text() -> impl Strategy<Value = String> {
    let col = prop::sample::select(vec!["a", "b", "v", "s", "d", "n", "t.a", "u.a", "u.v"]);
    let op = prop::sample::select(vec!["=", "<", ">=", "<>"]);
    let rhs = prop::sample::select(vec!["$1", "$2", "$3", "1", "'x'", "NULL", "1.5", "$1 + $2"]);
    let cond = (col.clone(), op, rhs).prop_map(|(c, o, r)| format!("{c} {o} {r}"));
    let conds = prop::collection::vec(cond, 0..3).prop_map(|cs| {
        if cs.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", cs.join(" AND "))
        }
    });
    let soup = prop::collection::vec(
        prop::sample::select(vec![
            "SELECT",
            "UPDATE",
            "INSERT INTO",
            "DELETE FROM",
            "t",
            "u",
            "SET",
            "WHERE",
            "a",
            "b",
            "=",
            "(",
            ")",
            ",",
            "$1",
            "$2",
            "1",
            "'x'",
            "AND",
            "VALUES",
            "FROM",
            "LIMIT",
            "*",
            "JOIN",
            "ON",
            "count(*)",
            "GROUP BY",
            "UNION",
            "random()",
        ]),
        0..14,
    )
    .prop_map(|p| p.join(" "));
    prop_oneof![
        (
            prop::sample::select(vec![
                "SELECT v FROM t",
                "SELECT * FROM u",
                "SELECT t.v, u.d FROM t JOIN u ON t.a = u.a",
                "SELECT count(*) FROM t",
                "UPDATE t SET v = $1",
                "UPDATE u SET d = $1, n = $2",
                "DELETE FROM u",
                "SELECT t.v FROM t, u, t AS x",
                "SELECT t.v FROM t JOIN u ON t.a = u.v JOIN t AS y ON y.a = u.b",
            ]),
            conds
        )
            .prop_map(|(h, w)| format!("{h}{w}")),
        Just("INSERT INTO u (a, b, v, d, n) VALUES ($1, $2, $3, $4, $5)".to_string()),
        Just("INSERT INTO t (a, b, v, s) VALUES ($1, 2, 3, $2)".to_string()),
        soup,
    ]
}

fn stmt() -> impl Strategy<Value = Statement> {
    (text(), prop::collection::vec(val(), 0..6), any::<bool>()).prop_map(|(s, mut p, fit)| {
        if fit {
            let n = (1..=6)
                .rev()
                .find(|k| s.contains(&format!("${k}")))
                .unwrap_or(0);
            p.resize(n, Value::Int(1));
        }
        Statement::new(s, p)
    })
}

fn same_tx(a: &Result<TxAnalysis, AnalysisError>, b: &Result<TxAnalysis, AnalysisError>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => {
            a.rwset == b.rwset
                && a.typed.len() == b.typed.len()
                && a.typed.iter().zip(&b.typed).all(|(x, y)| **x == **y)
                && a.plans.iter().zip(&b.plans).all(|(x, y)| x.kind == y.kind)
        }
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}

fn same_q(a: &Result<QueryPlan, AnalysisError>, b: &Result<QueryPlan, AnalysisError>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a.columns == b.columns && *a.typed == *b.typed && a.sql == b.sql,
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]
    #[test]
    fn cached_answers_equal_full_answers(
        txs in prop::collection::vec(prop::collection::vec(stmt(), 0..4), 1..12),
        order in prop::collection::vec(0usize..100, 1..40),
        tiny in any::<bool>(),
    ) {
        let schema = || Schema::from_sql(SCHEMA).unwrap();
        let mut shared = Analyzer::new(schema());
        if tiny {
            // Cleared every few texts.
            shared = shared.with_plan_cache_bytes(40_000);
        }
        let fresh = Analyzer::new(schema());
        for i in order {
            let tx = Transaction { statements: txs[i % txs.len()].clone() };
            let full = fresh.analyze(&tx);
            if let Some(cached) = shared.analyze_cached(&tx) {
                prop_assert!(same_tx(&cached, &full), "tx {tx:?}\ncached {cached:?}\nfull {full:?}");
            }
            prop_assert!(same_tx(&shared.analyze(&tx), &full));
            for st in &tx.statements {
                let full = fresh.query(&st.sql, &st.params);
                if let Some(cached) = shared.query_cached(&st.sql, &st.params) {
                    prop_assert!(same_q(&cached, &full), "query {st:?}\ncached {cached:?}\nfull {full:?}");
                }
                prop_assert!(same_q(&shared.query(&st.sql, &st.params), &full));
                if !tiny {
                    prop_assert!(
                        shared.query_cached(&st.sql, &st.params).is_some(),
                        "a query analysed in full is not answered from the cache: {st:?}"
                    );
                }
            }
        }
    }
}
