//! The analysis must never under-approximate. Random WHERE clauses (AND/OR/NOT, comparisons,
//! BETWEEN, IN, NULL, literals written as integers, decimals and numeric strings, parameters) over
//! key and non-key columns are evaluated row by row with SQL's three-valued logic; every row the
//! predicate selects must lie inside the key set the analyser computed.
#![allow(clippy::unwrap_used)]

use chainify_core::Value;
use chainify_core::rwset::{KeyRange, KeySet, KeyValue, ReadWriteSet};
use chainify_core::tx::{Statement, Transaction};
use chainify_sql::{Analyzer, Schema};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Lit {
    Int(i64),
    Dec(i64), // value×10 with one decimal digit: Dec(15) is 1.5
    Str(i64),
    Null,
    Param(i64),
}

#[derive(Clone, Debug)]
enum Pred {
    Cmp(usize, &'static str, Lit),
    Between(usize, Lit, Lit, bool),
    In(usize, Vec<Lit>, bool),
    Not(Box<Pred>),
    And(Box<Pred>, Box<Pred>),
    Or(Box<Pred>, Box<Pred>),
}

fn lit() -> impl Strategy<Value = Lit> {
    prop_oneof![
        6 => (-3i64..4).prop_map(Lit::Int),
        1 => (-35i64..36).prop_map(Lit::Dec),
        1 => (-3i64..4).prop_map(Lit::Str),
        1 => Just(Lit::Null),
        2 => (-3i64..4).prop_map(Lit::Param),
    ]
}

fn pred(ncols: usize) -> impl Strategy<Value = Pred> {
    let leaf = prop_oneof![
        (
            0..ncols,
            prop::sample::select(vec!["=", "<", "<=", ">", ">=", "<>"]),
            lit()
        )
            .prop_map(|(c, op, l)| Pred::Cmp(c, op, l)),
        (0..ncols, lit(), lit(), any::<bool>()).prop_map(|(c, l, h, n)| Pred::Between(c, l, h, n)),
        (0..ncols, prop::collection::vec(lit(), 1..4), any::<bool>())
            .prop_map(|(c, l, n)| Pred::In(c, l, n)),
    ];
    leaf.prop_recursive(4, 24, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|p| Pred::Not(Box::new(p))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Pred::And(Box::new(a), Box::new(b))),
            (inner.clone(), inner).prop_map(|(a, b)| Pred::Or(Box::new(a), Box::new(b))),
        ]
    })
}

/// Renders SQL, collecting parameter values.
fn sql_lit(l: &Lit, params: &mut Vec<Value>) -> String {
    match l {
        Lit::Int(i) => i.to_string(),
        Lit::Dec(x) => format!(
            "{}{}.{}",
            if *x < 0 { "-" } else { "" },
            x.abs() / 10,
            x.abs() % 10
        ),
        // Text compared with a number is refused now (engines convert differently); the
        // numeric-string case renders as the number it stood for.
        Lit::Str(i) => i.to_string(),
        Lit::Null => "NULL".into(),
        Lit::Param(i) => {
            params.push(Value::Int(*i));
            format!("${}", params.len())
        }
    }
}

fn sql(p: &Pred, cols: &[&str], params: &mut Vec<Value>) -> String {
    match p {
        Pred::Cmp(c, op, l) => format!("{} {op} {}", cols[*c], sql_lit(l, params)),
        Pred::Between(c, l, h, n) => {
            let (l, h) = (sql_lit(l, params), sql_lit(h, params));
            format!(
                "{} {}BETWEEN {l} AND {h}",
                cols[*c],
                if *n { "NOT " } else { "" }
            )
        }
        Pred::In(c, list, n) => {
            let items: Vec<String> = list.iter().map(|l| sql_lit(l, params)).collect();
            format!(
                "{} {}IN ({})",
                cols[*c],
                if *n { "NOT " } else { "" },
                items.join(", ")
            )
        }
        Pred::Not(p) => format!("NOT ({})", sql(p, cols, params)),
        Pred::And(a, b) => format!("({}) AND ({})", sql(a, cols, params), sql(b, cols, params)),
        Pred::Or(a, b) => format!("({}) OR ({})", sql(a, cols, params), sql(b, cols, params)),
    }
}

/// A literal's numeric value ×10 (exact for one decimal digit); None for NULL.
fn num(l: &Lit) -> Option<i64> {
    match l {
        Lit::Int(i) | Lit::Str(i) | Lit::Param(i) => Some(i * 10),
        Lit::Dec(x) => Some(*x),
        Lit::Null => None,
    }
}

fn and3(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn or3(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

fn eval(p: &Pred, row: &[i64]) -> Option<bool> {
    match p {
        Pred::Cmp(c, op, l) => {
            let (x, y) = (row[*c] * 10, num(l)?);
            Some(match *op {
                "=" => x == y,
                "<" => x < y,
                "<=" => x <= y,
                ">" => x > y,
                ">=" => x >= y,
                _ => x != y,
            })
        }
        Pred::Between(c, l, h, n) => {
            let x = row[*c] * 10;
            let lo = num(l).map(|l| x >= l);
            let hi = num(h).map(|h| x <= h);
            let r = and3(lo, hi);
            if *n { r.map(|b| !b) } else { r }
        }
        Pred::In(c, list, n) => {
            let x = row[*c] * 10;
            let mut r = Some(false);
            for l in list {
                r = or3(r, num(l).map(|y| x == y));
            }
            if *n { r.map(|b| !b) } else { r }
        }
        Pred::Not(p) => eval(p, row).map(|b| !b),
        Pred::And(a, b) => and3(eval(a, row), eval(b, row)),
        Pred::Or(a, b) => or3(eval(a, row), eval(b, row)),
    }
}

fn contains(set: Option<&KeySet>, key: Vec<KeyValue>) -> bool {
    match set {
        None => false,
        Some(KeySet::All) => true,
        Some(KeySet::Ranges(r)) => {
            let p = KeyRange::point(key);
            r.iter().any(|x| x.overlaps(&p))
        }
    }
}

fn written(rw: &ReadWriteSet, table: &str) -> Option<KeySet> {
    rw.writes
        .iter()
        .find(|(r, _)| &*r.name == table)
        .map(|(_, k)| k.clone())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn every_selected_row_is_in_the_key_set(p in pred(3), vs in prop::collection::vec(-3i64..4, 49)) {
        let analyzer = Analyzer::new(Schema::from_sql(
            "CREATE TABLE t (a INT, b INT, v INT, PRIMARY KEY (a, b)); CREATE TABLE u (a INT PRIMARY KEY, b INT, v INT)",
        ).unwrap());
        let mut params = Vec::new();
        let where_sql = sql(&p, &["a", "b", "v"], &mut params);
        for table in ["t", "u"] {
            let text = format!("UPDATE {table} SET v = 0 WHERE {where_sql}");
            let tx = Transaction { statements: vec![Statement::new(text.clone(), params.clone())] };
            let analysis = analyzer.analyze(&tx).unwrap();
            let keys = written(&analysis.rwset, table);
            for (i, (a, b)) in (-3i64..4).flat_map(|a| (-3i64..4).map(move |b| (a, b))).enumerate() {
                let row = [a, b, vs[i]];
                if eval(&p, &row) == Some(true) {
                    let key = if table == "t" { vec![KeyValue::Int(a), KeyValue::Int(b)] } else { vec![KeyValue::Int(a)] };
                    prop_assert!(contains(keys.as_ref(), key), "row {row:?} selected by `{text}` {params:?} but not in {keys:?}");
                }
            }
        }
    }

    /// Joins: `t JOIN u ON t.a = u.a` with a random WHERE over both tables. Every pair of rows the
    /// query combines must have both keys inside the respective read sets (the join equality
    /// carries bounds from one table's key to the other's).
    #[test]
    fn every_joined_row_is_in_the_read_sets(p in pred(4), join_on_key in any::<bool>()) {
        let analyzer = Analyzer::new(Schema::from_sql(
            "CREATE TABLE t (a INT, b INT, v INT, PRIMARY KEY (a, b)); CREATE TABLE u (a INT PRIMARY KEY, b INT, v INT)",
        ).unwrap()).with_nested_scans(4); // read sets of joins, whatever their work
        let mut params = Vec::new();
        let where_sql = sql(&p, &["t.a", "t.b", "u.a", "u.v"], &mut params);
        // Joining on a non-key column (u.v) must not carry any bound.
        let on = if join_on_key { "t.a = u.a" } else { "t.a = u.v" };
        let text = format!("SELECT t.v FROM t JOIN u ON {on} WHERE {where_sql}");
        let analysis = analyzer.analyze(&Transaction { statements: vec![Statement::new(text.clone(), params.clone())] }).unwrap();
        let read = |name: &str| analysis.rwset.reads.iter().find(|(r, _)| &*r.name == name).map(|(_, k)| k.clone());
        let (t_keys, u_keys) = (read("t"), read("u"));
        for ta in -2i64..3 {
            for tb in -2i64..3 {
                for ua in -2i64..3 {
                    let uv = (ta + ua).rem_euclid(5) - 2;
                    let joined = if join_on_key { ta == ua } else { ta == uv };
                    if joined && eval(&p, &[ta, tb, ua, uv]) == Some(true) {
                        prop_assert!(contains(t_keys.as_ref(), vec![KeyValue::Int(ta), KeyValue::Int(tb)]),
                            "t row ({ta},{tb}) used by `{text}` {params:?} but not in {t_keys:?}");
                        prop_assert!(contains(u_keys.as_ref(), vec![KeyValue::Int(ua)]),
                            "u row {ua} used by `{text}` {params:?} but not in {u_keys:?}");
                    }
                }
            }
        }
    }

    /// Correlated subqueries: `UPDATE u SET v = (SELECT max(t.v) FROM t WHERE t.a = u.a AND <pt>)
    /// WHERE <pu>`. Every `t` row the subquery can see for an updated `u` row must be in the read set.
    #[test]
    fn correlated_subquery_rows_are_in_the_read_set(pt in pred(3), pu in pred(2), correlate_on_key in any::<bool>()) {
        let analyzer = Analyzer::new(Schema::from_sql(
            "CREATE TABLE t (a INT, b INT, v INT, PRIMARY KEY (a, b)); CREATE TABLE u (a INT PRIMARY KEY, b INT, v INT)",
        ).unwrap()).with_nested_scans(4); // read sets of joins, whatever their work
        let mut params = Vec::new();
        let inner = sql(&pt, &["t.a", "t.b", "t.v"], &mut params);
        let outer = sql(&pu, &["u.a", "u.b"], &mut params);
        // Correlating on a non-key column (u.b) must not carry a bound.
        let corr = if correlate_on_key { "t.a = u.a" } else { "t.a = u.b" };
        let text = format!("UPDATE u SET v = (SELECT max(t.v) FROM t WHERE {corr} AND ({inner})) WHERE {outer}");
        let analysis = analyzer.analyze(&Transaction { statements: vec![Statement::new(text.clone(), params.clone())] }).unwrap();
        let t_keys = analysis.rwset.reads.iter().find(|(r, _)| &*r.name == "t").map(|(_, k)| k.clone());
        for ua in -2i64..3 {
            let ub = (ua * 3).rem_euclid(5) - 2;
            if eval(&pu, &[ua, ub]) != Some(true) {
                continue;
            }
            for ta in -2i64..3 {
                for tb in -2i64..3 {
                    let tv = (ta + tb).rem_euclid(3);
                    let correlated = if correlate_on_key { ta == ua } else { ta == ub };
                    if correlated && eval(&pt, &[ta, tb, tv]) == Some(true) {
                        prop_assert!(contains(t_keys.as_ref(), vec![KeyValue::Int(ta), KeyValue::Int(tb)]),
                            "t row ({ta},{tb}) seen for u row {ua} by `{text}` {params:?} but not in {t_keys:?}");
                    }
                }
            }
        }
    }

    /// The parser and analyser never panic, whatever the input.
    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,200}") {
        let analyzer = Analyzer::new(Schema::from_sql("CREATE TABLE t (a INT PRIMARY KEY, b TEXT UNIQUE)").unwrap());
        let _ = analyzer.analyze(&Transaction { statements: vec![Statement::new(s, vec![])] });
    }

    #[test]
    fn sql_like_text_never_panics(parts in prop::collection::vec(prop::sample::select(vec![
        "SELECT", "UPDATE", "INSERT INTO", "DELETE FROM", "t", "u", "SET", "WHERE", "a", "b", "=", "<", "(", ")",
        ",", "$1", "1", "'x'", "AND", "OR", "NOT", "IN", "BETWEEN", "VALUES", "FROM", "LIMIT", "ORDER BY", "NULL",
        "JOIN", "ON", "EXISTS", "*", "-", "1.5", "count(*)", "GROUP BY", "UNION",
    ]), 0..24)) {
        let analyzer = Analyzer::new(Schema::from_sql("CREATE TABLE t (a INT PRIMARY KEY, b TEXT UNIQUE); CREATE TABLE u (a INT PRIMARY KEY REFERENCES t)").unwrap());
        let text = parts.join(" ");
        let _ = analyzer.analyze(&Transaction { statements: vec![Statement::new(text, vec![Value::Int(1)])] });
    }
}

/// Deleting a parent whose child is ON DELETE SET NULL updates the child's row, so a grandchild
/// referencing the child's nulled column reacts by its ON UPDATE action: a write of the
/// grandchild when that is CASCADE (PostgreSQL and SQLite change its rows), and the analysis
/// must say so, not only the check of a read.
#[test]
fn a_delete_that_nulls_a_child_writes_the_grandchild_that_cascades_on_update() {
    let analyzer = Analyzer::new(
        Schema::from_sql(
            "CREATE TABLE p (id INT PRIMARY KEY);
             CREATE TABLE c1 (id INT PRIMARY KEY, p INT UNIQUE REFERENCES p(id) ON DELETE SET NULL);
             CREATE TABLE c2 (id INT PRIMARY KEY, c1p INT REFERENCES c1(p) ON UPDATE CASCADE);",
        )
        .unwrap(),
    );
    let tx = Transaction {
        statements: vec![Statement::new(
            "DELETE FROM p WHERE id = $1",
            vec![Value::Int(1)],
        )],
    };
    let analysis = analyzer.analyze(&tx).unwrap();
    assert!(
        written(&analysis.rwset, "c1").is_some(),
        "{:?}",
        analysis.rwset
    );
    assert_eq!(
        written(&analysis.rwset, "c2"),
        Some(KeySet::All),
        "{:?}",
        analysis.rwset
    );
}

/// A decimal key is stored rounded to its column's scale: `INSERT … (5.0004)` into
/// DECIMAL(5,3) writes the key 5.000 on every engine, so it conflicts with a transaction that
/// writes 5.000 (which of the two fails on the duplicate must not depend on timing). A hunt found
/// the write set named 5.0004 alone.
#[test]
fn a_decimal_key_stored_rounded_conflicts_with_the_key_it_rounds_to() {
    let analyzer = Analyzer::new(
        Schema::from_sql(
            "CREATE TABLE g (k DECIMAL(5,3) PRIMARY KEY, s INT);
             CREATE TABLE c (id INT PRIMARY KEY, gk DECIMAL(5,3) REFERENCES g(k));",
        )
        .unwrap(),
    );
    let analyze = |sql: &str, params: Vec<Value>| {
        analyzer
            .analyze(&Transaction {
                statements: vec![Statement::new(sql, params)],
            })
            .unwrap()
            .rwset
    };
    let d = |s: &str| Value::Decimal(s.parse().unwrap());
    let exact = analyze("INSERT INTO g (k, s) VALUES ($1, 1)", vec![d("5.000")]);
    for (sql, params) in [
        ("INSERT INTO g (k, s) VALUES (5.0004, 1)", vec![]),
        ("INSERT INTO g (k, s) VALUES ($1, 1)", vec![d("5.0004")]),
        ("INSERT INTO g (k, s) VALUES ($1, 1)", vec![d("4.9996")]),
        ("UPDATE g SET k = $1 WHERE k = 4.000", vec![d("5.0004")]),
    ] {
        let rounded = analyze(sql, params);
        assert!(rounded.conflicts_with(&exact), "{sql}: {rounded:?}");
    }
    // A child's foreign key is looked up as stored: 5.0004 finds the parent 5.000.
    let child = analyze("INSERT INTO c (id, gk) VALUES (1, $1)", vec![d("5.0004")]);
    let parent_gone = analyze("DELETE FROM g WHERE k = 5", vec![]);
    assert!(child.conflicts_with(&parent_gone), "{child:?}");
    // A value at the column's scale keeps its point key.
    assert_eq!(
        written(&exact, "g").unwrap(),
        written(&analyze("INSERT INTO g (k, s) VALUES (5, 1)", vec![]), "g").unwrap()
    );
}

/// A foreign key whose columns store values differently from the parent's (a coarser decimal,
/// an integer under a decimal) is refused by name.
#[test]
fn a_foreign_key_of_another_type_than_its_parent_is_refused() {
    for (child, parent) in [("DECIMAL(5,1)", "DECIMAL(5,3)"), ("INT", "DECIMAL(5,2)")] {
        let e = Schema::from_sql(&format!(
            "CREATE TABLE p (k {parent} PRIMARY KEY); CREATE TABLE c (id INT PRIMARY KEY, pk {child} REFERENCES p(k));"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("foreign key column pk is") && e.contains("p.k"),
            "{e}"
        );
    }
    Schema::from_sql(
        "CREATE TABLE p (k BIGINT PRIMARY KEY); CREATE TABLE c (id INT PRIMARY KEY, pk SMALLINT REFERENCES p(k));",
    )
    .unwrap();
    // SET DEFAULT moves children to a default key whose parent and collisions the analysis does
    // not follow (a hunt made the order of a DELETE and an INSERT decide the outcome).
    for action in ["ON DELETE SET DEFAULT", "ON UPDATE SET DEFAULT"] {
        let e = Schema::from_sql(&format!(
            "CREATE TABLE p (k BIGINT PRIMARY KEY); CREATE TABLE c (id INT PRIMARY KEY, pk BIGINT DEFAULT 0 REFERENCES p(k) {action});"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("SET DEFAULT action"), "{action}: {e}");
    }
}
