//! The portable form as an attacker meets it: text that engines would read differently from the
//! analyser renders the same as the plain statement (or is refused), control characters are
//! refused by name, and the largest accepted statement is safe to analyse, render and drop on
//! an ordinary worker stack while anything past the bounds is refused, never a crash.
#![allow(clippy::unwrap_used)]

use chainify_core::Value;
use chainify_core::tx::{Statement, Transaction};
use chainify_sql::render::Dialect;
use chainify_sql::{
    Analyzer, MAX_BOUND_BYTES, MAX_DEPTH, MAX_FOLDED_BYTES, MAX_KEY_VALUE_BYTES, MAX_PLACEHOLDERS,
    MAX_ROW_BYTES, MAX_SELECT_ENTRIES, MAX_SORT_KEY_BYTES, MAX_TERMS, RejectKind, Schema,
};

const DIALECTS: [Dialect; 3] = [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite];

fn analyzer() -> Analyzer {
    Analyzer::new(
        Schema::from_sql(
            "CREATE TABLE checking (custid BIGINT PRIMARY KEY, bal BIGINT NOT NULL);
             CREATE TABLE accounts (custid BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL);",
        )
        .unwrap(),
    )
}

fn tx(sql: &str, params: Vec<Value>) -> Transaction {
    Transaction {
        statements: vec![Statement::new(sql, params)],
    }
}

fn rendered(a: &Analyzer, sql: &str, params: Vec<Value>) -> Result<Vec<String>, String> {
    let analysis = a.analyze(&tx(sql, params)).map_err(|e| e.to_string())?;
    Ok(DIALECTS
        .iter()
        .map(|d| analysis.typed[0].rendered(*d).sql.clone())
        .collect())
}

/// Comments of every flavour, MySQL's executable comments, and comment markers some engine does
/// not treat as comments (`--` without a space, `#`) either vanish from what engines run (the
/// analyser read them as comments) or are refused; they never smuggle in a predicate.
#[test]
fn comments_and_hints_never_reach_an_engine() {
    let a = analyzer();
    let plain = rendered(
        &a,
        "UPDATE checking SET bal = bal + 1 WHERE custid = $1",
        vec![Value::Int(1)],
    )
    .unwrap();
    for hostile in [
        "UPDATE checking SET bal = bal + 1 WHERE custid = $1 --OR TRUE",
        "UPDATE checking SET bal = bal + 1 WHERE custid = $1 -- OR TRUE",
        "UPDATE checking SET bal = bal + 1 WHERE custid = $1 /* outer /* nested */ OR TRUE */",
        "UPDATE /*+ NO_INDEX(checking) */ checking SET bal = bal + 1 WHERE custid = $1",
        "UPDATE checking SET bal = bal + 1 WHERE custid = $1\n-- OR TRUE\n",
    ] {
        assert_eq!(
            rendered(&a, hostile, vec![Value::Int(1)]).unwrap(),
            plain,
            "{hostile}"
        );
    }
    // What the analyser reads as code (MySQL's /*! … */) is analysed as code: its OR TRUE is in
    // the read/write set (the whole table) and in every engine's text alike.
    let hinted = a
        .analyze(&tx(
            "UPDATE checking SET bal = bal + 1 WHERE custid = $1 /*! OR TRUE */",
            vec![Value::Int(1)],
        ))
        .unwrap();
    for d in DIALECTS {
        let sql = &hinted.typed[0].rendered(d).sql;
        assert!(!sql.contains("/*") && !sql.contains("--"), "{sql}");
        assert!(sql.contains(" OR "), "{sql}");
    }
    // `#` starts a comment only on MySQL: the analyser refuses it rather than guess.
    assert!(
        a.analyze(&tx(
            "UPDATE checking SET bal = bal + 1 WHERE custid = $1 # OR TRUE",
            vec![Value::Int(1)]
        ))
        .is_err()
    );
}

/// No rendered text contains a comment marker, a backslash escape or a quote outside a literal,
/// whatever the client wrote inside string literals.
#[test]
fn literals_are_re_spelled_from_their_values() {
    let a = analyzer();
    for name in [
        "O'Brien",
        "a\\' OR TRUE -- ",
        "/* x */",
        "$1 ?1 ?",
        "東京 é",
    ] {
        let sql = format!(
            "UPDATE accounts SET name = '{}' WHERE custid = 1",
            name.replace('\'', "''")
        );
        let out = rendered(&a, &sql, vec![]).unwrap();
        let expected = format!("'{}'", name.replace('\'', "''"));
        for r in &out {
            assert!(r.contains(&expected), "{r}");
            // Everything outside the one literal is chainify's own spelling.
            let outside = r.replacen(&expected, "", 1);
            assert!(!outside.contains('\''), "{r}");
            assert!(!outside.contains("--") && !outside.contains("/*"), "{r}");
        }
    }
}

#[test]
fn control_characters_are_refused_by_name() {
    let a = analyzer();
    let e = a
        .analyze(&tx(
            "UPDATE checking SET bal = 1 WHERE custid = 1\0 OR TRUE",
            vec![],
        ))
        .unwrap_err();
    assert!(e.reason.contains("U+0000"), "{e}");
    assert_eq!(e.kind, RejectKind::Syntax);
    let e = a
        .analyze(&tx(
            "UPDATE accounts SET name = $2 WHERE custid = $1",
            vec![Value::Int(1), Value::Text("a\u{1b}[2J".into())],
        ))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "statement 1: parameter $2 contains the control character U+001B; engines store or refuse it differently"
    );
    assert_eq!(e.kind, RejectKind::Parameter);
    let e = a
        .analyze(&tx(
            "UPDATE accounts SET name = 'a\u{7f}' WHERE custid = 1",
            vec![],
        ))
        .unwrap_err();
    assert!(e.reason.contains("U+007F"), "{e}");
    assert_eq!(e.kind, RejectKind::Syntax);
    // Tabs and newlines are ordinary text.
    a.analyze(&tx(
        "UPDATE accounts SET name = $2\tWHERE custid = $1",
        vec![Value::Int(1), Value::Text("line 1\nline 2\t".into())],
    ))
    .unwrap();
}

/// `COALESCE(bal, COALESCE(bal, … 1))` nested `n` deep (arithmetic doubles SQLite's text per
/// level and meets the rendered-length bound first).
fn nested(n: usize) -> String {
    let mut e = "1".to_owned();
    for _ in 0..n {
        e = format!("COALESCE(bal, {e})");
    }
    format!("UPDATE checking SET bal = {e} WHERE custid = 1")
}

/// The deepest accepted statement is analysed, rendered, bound and dropped on a thread with a
/// tokio worker's stack; one level more is refused with a message, as is a 50 KB OR chain that
/// once overflowed a worker's stack and aborted the process.
#[test]
fn bounds_are_refusals_and_the_largest_accepted_statement_is_safe() {
    let a = analyzer();
    let deepest = (1..200)
        .take_while(|n| a.plan(&nested(*n)).is_ok())
        .last()
        .unwrap();
    assert!(
        deepest >= MAX_DEPTH / 2 - 2,
        "only {deepest} levels accepted"
    );
    let e = a.plan(&nested(deepest + 1)).unwrap_err();
    assert_eq!(e.kind(), RejectKind::Limit, "{e}");
    assert!(
        e.reason().contains("deeper than") || e.reason().contains("recursion"),
        "{e}"
    );
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let fresh = analyzer();
            let analysis = fresh.analyze(&tx(&nested(deepest), vec![])).unwrap();
            for d in DIALECTS {
                assert!(analysis.typed[0].rendered(d).sql.len() < 200_000);
            }
            drop(analysis);
            drop(fresh);
        })
        .unwrap()
        .join()
        .unwrap();

    let chain: Vec<String> = (0..3_000).map(|i| format!("custid = {i}")).collect();
    let sql = format!("UPDATE checking SET bal = 0 WHERE {}", chain.join(" OR "));
    assert!(sql.len() > 40_000);
    let e = a.plan(&sql).unwrap_err();
    assert_eq!(e.kind(), RejectKind::Limit, "{e}");
    assert!(
        e.reason().contains("deeper than") || e.reason().contains("terms"),
        "{e}"
    );

    // A flat IN list is bounded by the number of terms.
    let list = |n: usize| {
        let items: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        format!(
            "UPDATE checking SET bal = 0 WHERE custid IN ({})",
            items.join(", ")
        )
    };
    let ok = list(MAX_TERMS - 10);
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let fresh = analyzer();
            fresh.analyze(&tx(&ok, vec![])).unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
    let e = a.plan(&list(MAX_TERMS + 10)).unwrap_err();
    assert_eq!(e.kind(), RejectKind::Limit, "{e}");
    assert!(e.reason().contains("terms"), "{e}");
}

/// Output aliases, bare names in subqueries and ordinals resolve as the engines resolve them;
/// rendering qualifies every column with a generated alias so no engine can bind it elsewhere.
#[test]
fn names_resolve_once_and_render_qualified() {
    let a = analyzer();
    // `ORDER BY custid` names the output alias (bal), not the key: no total order.
    assert!(
        a.plan("SELECT bal AS custid FROM checking ORDER BY custid LIMIT 1")
            .is_err()
    );
    let ok = a
        .analyze(&tx(
            "SELECT custid AS k FROM checking ORDER BY 1 LIMIT 2",
            vec![],
        ))
        .unwrap();
    for d in DIALECTS {
        let sql = &ok.typed[0].rendered(d).sql;
        assert!(sql.contains("\"chainify_t1\".\"custid\""), "{sql}");
        assert!(sql.contains("ORDER BY 1"), "{sql}");
        assert!(!sql.contains(" k"), "{sql}");
    }
    // A bare name inside a subquery binds to the innermost table that has it.
    let inner = a
        .analyze(&tx(
            "SELECT custid FROM accounts WHERE EXISTS (SELECT 1 FROM checking WHERE custid = 7)",
            vec![],
        ))
        .unwrap();
    let pg = &inner.typed[0].rendered(Dialect::Postgres).sql;
    assert!(pg.contains("(\"chainify_t2\".\"custid\" = 7)"), "{pg}");
}

/// Joins of whole tables are allowed here: these cases are about how engines read them, not how
/// long they take.
fn review_analyzer() -> Analyzer {
    Analyzer::new(
        Schema::from_sql(
            "CREATE TABLE t (k BIGINT PRIMARY KEY, v BIGINT, i INTEGER, d DECIMAL(15,2), x VARCHAR(20), b BOOLEAN);
             CREATE TABLE e (k BIGINT PRIMARY KEY, v BIGINT, x TEXT);",
        )
        .unwrap(),
    )
    .with_nested_scans(4)
}

/// Statements an adversarial review found accepted but computed differently (or fatally): each
/// is now refused with its reason, and the hostile ones cost neither memory nor time.
#[test]
fn what_the_review_broke_is_refused() {
    let a = review_analyzer();
    let refused = |sql: &str, params: Vec<Value>, why: &str| {
        let e = a.analyze(&tx(sql, params)).unwrap_err().to_string();
        assert!(e.contains(why), "{sql}: {e}");
    };
    // Nested REPLACE once grew 4× per level in MySQL's and SQLite's text; now only the
    // replacement is repeated, and the text is bounded as it grows.
    let mut nested = "x".to_owned();
    for _ in 0..40 {
        nested = format!("replace({nested}, 'a', 'b')");
    }
    let linear = a
        .analyze(&tx(
            &format!("SELECT k FROM t WHERE {nested} = $1"),
            vec![Value::Text("q".into())],
        ))
        .map_err(|e| e.to_string())
        .unwrap();
    assert!(linear.typed[0].rendered(Dialect::MySql).sql.len() < 4_000);
    let mut doubling = "x".to_owned();
    for _ in 0..40 {
        doubling = format!("replace('q', 'a', {doubling})");
    }
    refused(
        &format!("SELECT k FROM t WHERE {doubling} = $1"),
        vec![Value::Text("q".into())],
        "renders to more than",
    );
    // … and its constant evaluation built a 10^10-character string.
    let mut grown = "$1".to_owned();
    for _ in 0..5 {
        grown = format!("replace({grown}, $2, $1)");
    }
    refused(
        &format!("UPDATE t SET x = {grown} WHERE k = 1"),
        vec![Value::Text("a".repeat(100)), Value::Text("a".into())],
        "may build",
    );
    // Decimals SQLite cannot hold exactly.
    refused(
        "DELETE FROM e WHERE k = 9007199254740993.0",
        vec![],
        "more than 15 significant digits",
    );
    refused(
        "SELECT k FROM t WHERE d = $1",
        vec![Value::Decimal("0.10000000000000001".parse().unwrap())],
        "parameter $1",
    );
    // DECIMAL arithmetic with unbounded integer operands.
    refused(
        "UPDATE t SET d = (v + 0.5) - v WHERE k = 1",
        vec![],
        "may exceed 15 digits",
    );
    refused(
        "UPDATE t SET d = ((v * 4) - (v * 4)) + 0.5 WHERE k = 1",
        vec![],
        "may exceed 15 digits",
    );
    // AND/OR evaluate both sides on SQLite.
    refused(
        "UPDATE t SET b = (v < 0 AND v * 2 < 0) WHERE k = 1",
        vec![],
        "may overflow",
    );
    // Constant sort keys, DISTINCT with a hidden sort key, overflow in a sort key.
    refused(
        "SELECT v, k FROM t ORDER BY TRUE, k LIMIT 1",
        vec![],
        "constant sort key",
    );
    refused(
        "SELECT DISTINCT v FROM t ORDER BY k LIMIT 2",
        vec![],
        "DISTINCT",
    );
    refused(
        "SELECT k FROM t ORDER BY k DESC, v * 2 LIMIT 1",
        vec![],
        "may overflow",
    );
    // A key moved on several rows collides depending on row order.
    refused(
        "UPDATE e SET k = k + 1 WHERE k >= 1",
        vec![],
        "must select one row",
    );
    a.analyze(&tx(
        "UPDATE e SET k = $2 WHERE k = $1",
        vec![Value::Int(1), Value::Int(2)],
    ))
    .unwrap();
    // Too many tables in one FROM.
    refused(
        "SELECT a.k FROM t AS a, t AS b, t AS c, t AS d, t AS f",
        vec![],
        "at most 4 tables",
    );
    // The second review: operands MariaDB (or PostgreSQL) evaluates only on some rows.
    // Outputs under LIMIT/OFFSET: PostgreSQL computes them for rows it sorts away or skips.
    refused(
        "SELECT k, v + 1 FROM t ORDER BY k LIMIT 1",
        vec![],
        "may overflow",
    );
    refused(
        "INSERT INTO e (k, v) SELECT k + 100, v + 1 FROM t ORDER BY k LIMIT 1",
        vec![],
        "may overflow",
    );
    // … while without LIMIT every engine computes every output.
    a.analyze(&tx("SELECT k, v + 1 FROM t", vec![])).unwrap();
    // Simple CASE: MariaDB skips the WHEN values when the operand is NULL.
    refused(
        "UPDATE t SET i = CASE i WHEN v - 1 THEN 1 ELSE 2 END WHERE k = 9",
        vec![],
        "may overflow",
    );
    // || and REPLACE: MariaDB stops at the first NULL argument.
    refused(
        "UPDATE t SET x = x || (CASE WHEN v - 1 > 0 THEN 'a' ELSE 'b' END) WHERE k = 9",
        vec![],
        "may overflow",
    );
    refused(
        "SELECT k, replace(x, (CASE WHEN v - 1 > 0 THEN 'a' ELSE 'b' END), 'y') FROM t WHERE k = 9",
        vec![],
        "may overflow",
    );
    // IN (subquery): MariaDB stops at the first match.
    refused(
        "SELECT k, (k + 10) IN (SELECT v + 1 FROM e) FROM t WHERE k = 1",
        vec![],
        "may overflow",
    );
    // DECIMAL arithmetic SQLite computes in floating point: an operand with more places than
    // the column (the exact result is then a tie, decided by a float's error), or magnitudes
    // whose error reaches half a cent.
    refused(
        "UPDATE t SET d = 99999999999.995 - 99999999999.98 WHERE k = 1",
        vec![],
        "3 decimal places, more than the 2",
    );
    refused(
        "UPDATE t SET d = d * i - d * (i - 1) WHERE k = 1",
        vec![],
        "may round differently on SQLite",
    );
    refused(
        "UPDATE t SET d = d + 0.01 WHERE k = 1",
        vec![],
        "may round differently on SQLite",
    );
    // Within the bound it is accepted: DECIMAL(10,2) and a parameter that fits.
    let small = Analyzer::new(
        Schema::from_sql("CREATE TABLE s (k BIGINT PRIMARY KEY, m DECIMAL(10,2), i INTEGER);")
            .unwrap(),
    );
    small
        .analyze(&tx(
            "UPDATE s SET m = m + $1 - 0.05 WHERE k = 1",
            vec![Value::Decimal("12.5".parse().unwrap())],
        ))
        .unwrap();
    let e = small
        .analyze(&tx(
            "UPDATE s SET m = m + $1 WHERE k = 1",
            vec![Value::Decimal("0.125".parse().unwrap())],
        ))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("parameter $1 must be a decimal that fits"),
        "{e}"
    );
    // NULLIF's first argument is its value: bounded like COALESCE's (a hunt stored 2.67 on
    // SQLite and 2.68 elsewhere when NULLIF hid the literal from the check).
    let places = |sql: &str, params: Vec<Value>| {
        small
            .analyze(&tx(sql, params))
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    for sql in [
        "UPDATE s SET m = NULLIF(2.675, 0) + 1000 - 1000 WHERE k = 1",
        "UPDATE s SET m = NULLIF(2.675, 0) + i - i WHERE k = 1",
        "INSERT INTO s (k, m) VALUES (30, NULLIF(0.005, 0) + 99999999 - 99999999)",
    ] {
        let e = places(sql, vec![]).unwrap_err();
        assert!(
            e.contains("3 decimal places, more than the 2"),
            "{sql}: {e}"
        );
    }
    let e = places(
        "UPDATE s SET m = NULLIF($1, 0) + 1000 - 1000 WHERE k = 1",
        vec![Value::Decimal("2.675".parse().unwrap())],
    )
    .unwrap_err();
    assert!(
        e.contains("parameter $1 must be a decimal that fits"),
        "{e}"
    );
    places(
        "UPDATE s SET m = NULLIF(2.67, 0) + 1000 - 1000 WHERE k = 1",
        vec![],
    )
    .unwrap();
    // A constant REPLACE is evaluated (and bounded) once its parameters are known.
    refused(
        "SELECT k FROM t WHERE x = replace(replace(replace($1, 'a', $1), 'a', $1), 'a', $1)",
        vec![Value::Text("a".repeat(300))],
        "may build",
    );
    // Text growth: MariaDB cannot compute more than its packet size, PostgreSQL would hold
    // a gigabyte. A TEXT column holds at most 1 MiB of what chainify stores.
    refused(
        "SELECT k, length(replace(replace(x, 'a', x), 'a', x)) FROM e WHERE k = 10",
        vec![],
        "REPLACE may build",
    );
    refused(
        "UPDATE e SET x = x || 'a' WHERE k = 1",
        vec![],
        "TEXT column x may reach",
    );
    refused(
        "UPDATE e SET x = $1 WHERE k = 1",
        vec![Value::Text("a".repeat(2 << 20))],
        "parameter $1 must be text of at most 1 MiB",
    );
    refused(
        "UPDATE e SET x = replace('abc', 'a', $1) WHERE k = 1",
        vec![Value::Text("b".repeat(5000))],
        "at most 4 KiB",
    );
    // A simple CASE on NULL: PostgreSQL types the NULL as text.
    refused(
        "UPDATE t SET i = CASE $1 WHEN -1 THEN 1 ELSE 2 END WHERE k = 1",
        vec![Value::Null],
        "CASE NULL WHEN",
    );
    // WHEN NULL never matches, and only SQLite evaluates the operand then (an overflow in it
    // failed on SQLite alone; found by the difftest, seed 1795505383035143664).
    refused(
        "UPDATE t SET i = CASE (i - -1) WHEN NULL THEN i ELSE 2 END WHERE k = 1",
        vec![],
        "WHEN NULL never matches",
    );
    refused(
        "UPDATE t SET i = CASE i WHEN 1 THEN 3 WHEN $1 THEN i ELSE 2 END WHERE k = 1",
        vec![Value::Null],
        "WHEN NULL never matches",
    );
    // IN over a subquery of NULLs: PostgreSQL types the NULL as text.
    refused(
        "SELECT k FROM t WHERE k IN (SELECT $1 FROM e) ORDER BY k LIMIT 5",
        vec![Value::Null],
        "IN (SELECT NULL",
    );
    // MariaDB's integer quirks, rendered around: 0 - (-2^63) wraps (a subtrahend that may be
    // -2^63 is guarded, a parameter checked), a negated parameter is unsigned (-1 * ?), a value
    // out of the range of an IN subquery's column type matches nothing even beside a NULL.
    let my = |sql: &str, params: Vec<Value>| {
        a.analyze(&tx(sql, params)).unwrap().typed[0]
            .rendered(Dialect::MySql)
            .sql
            .clone()
    };
    assert!(
        my("UPDATE t SET v = i - v WHERE k = 1", vec![])
            .contains("(CASE WHEN \"t\".\"v\" = (-9223372036854775807 - 1) THEN"),
        "{}",
        my("UPDATE t SET v = i - v WHERE k = 1", vec![])
    );
    assert!(!my("UPDATE t SET v = v - i WHERE k = 1", vec![]).contains("CASE"));
    assert!(my("UPDATE t SET v = -v WHERE k = 1", vec![]).contains("(-1 * \"t\".\"v\")"));
    refused(
        "UPDATE t SET v = v - $1 WHERE k = 1",
        vec![Value::Int(i64::MIN)],
        "other than -9223372036854775808",
    );
    assert!(
        my(
            "SELECT k FROM t WHERE v NOT IN (SELECT i FROM t AS u) ORDER BY k LIMIT 5",
            vec![]
        )
        .contains("SELECT CAST(\"chainify_t2\".\"i\" AS DECIMAL(65, 0)) FROM")
    );
    // Growth of bounded text is fine: VARCHAR(n) bounds itself alike everywhere.
    a.analyze(&tx("UPDATE t SET x = x || 'a' WHERE k = 1", vec![]))
        .unwrap();
    a.analyze(&tx("UPDATE e SET x = x WHERE k = 1", vec![]))
        .unwrap();
    // A transaction's SELECT carries the row cap in its text.
    let capped = a.analyze(&tx("SELECT k FROM t", vec![])).unwrap();
    for d in DIALECTS {
        assert!(
            capped.typed[0].rendered(d).sql.ends_with(" LIMIT 10001"),
            "{}",
            capped.typed[0].rendered(d).sql
        );
    }
}

/// PostgreSQL folds a strict function or operator with a NULL constant argument to NULL when it
/// plans, whatever its other arguments (`replace(x, col, NULL)`, `col + NULL`, `col = NULL`,
/// `NULL IN (col, 2)`), then folds what is around it, and fails on a folded constant that does
/// not fit its column even when no row is touched; MariaDB and SQLite change nothing. (Found by
/// the difftest, seed 20261123 at 50 000 cases.) Each statement below fails that way on
/// PostgreSQL 15 with `WHERE k = 99` on an empty match; the analysis refuses it, and accepts it
/// with a value in place of the NULL.
#[test]
fn constants_folded_around_a_null_argument_are_checked() {
    let a = review_analyzer();
    let long = "'xxxxxxxxxxxxxxxxxxxxxxxxx'";
    // REPLACE's result may be longer than the column and end in blanks whatever $1 is: that
    // alone refuses it now (engines differ on storing it).
    let replaced = format!(
        "UPDATE t SET x = COALESCE(REPLACE('a b ', x, $1), CASE WHEN FALSE THEN x ELSE {long} END) WHERE k = 99"
    );
    for v in [Value::Null, Value::Text("b".into())] {
        let e = a.analyze(&tx(&replaced, vec![v])).unwrap_err().to_string();
        assert!(
            e.contains("does not fit column x") || e.contains("end in blanks"),
            "{e}"
        );
    }
    let cases = [
        format!("UPDATE t SET x = CASE WHEN x = $1 THEN x ELSE {long} END WHERE k = 99"),
        format!("UPDATE t SET x = CASE WHEN x LIKE $1 THEN x ELSE {long} END WHERE k = 99"),
        format!("UPDATE t SET x = CASE WHEN $1 IN (x, 'b') THEN x ELSE {long} END WHERE k = 99"),
        format!(
            "UPDATE t SET x = CASE WHEN $1 BETWEEN x AND 'c' THEN x ELSE {long} END WHERE k = 99"
        ),
        format!(
            "UPDATE t SET x = CASE WHEN LENGTH(REPLACE(x, 'a', $1)) > 2 THEN x ELSE {long} END WHERE k = 99"
        ),
        format!(
            "UPDATE t SET x = CASE REPLACE(x, 'a', $1) WHEN 'b' THEN x ELSE {long} END WHERE k = 99"
        ),
        format!("UPDATE t SET x = CASE WHEN x IN ($1) THEN x ELSE {long} END WHERE k = 99"),
        format!(
            "UPDATE t SET x = CASE WHEN x NOT BETWEEN $1 AND $1 THEN x ELSE {long} END WHERE k = 99"
        ),
    ];
    for sql in &cases {
        let e = a
            .analyze(&tx(sql, vec![Value::Null]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not fit column x"), "{sql}: {e}");
        a.analyze(&tx(sql, vec![Value::Text("b".into())]))
            .unwrap_or_else(|e| panic!("{sql} with a value: {e}"));
    }
    // A constant deciding half settles IN and BETWEEN whatever the other items are.
    for sql in [
        format!("UPDATE t SET x = CASE WHEN $1 IN (x, 'b') THEN {long} ELSE x END WHERE k = 99"),
        format!(
            "UPDATE t SET x = CASE WHEN $1 NOT IN (x, 'b') THEN x ELSE {long} END WHERE k = 99"
        ),
        format!(
            "UPDATE t SET x = CASE WHEN $1 BETWEEN x AND 'a' THEN x ELSE {long} END WHERE k = 99"
        ),
        format!(
            "UPDATE t SET x = CASE WHEN $1 NOT BETWEEN x AND 'a' THEN {long} ELSE x END WHERE k = 99"
        ),
    ] {
        let e = a
            .analyze(&tx(&sql, vec![Value::Text("b".into())]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not fit column x"), "{sql}: {e}");
        a.analyze(&tx(&sql, vec![Value::Text("0".into())]))
            .unwrap_or_else(|e| panic!("{sql} with '0': {e}"));
    }
    let e = a
        .analyze(&tx(
            "UPDATE t SET i = COALESCE(v + $1, 99999999999) WHERE k = 99",
            vec![Value::Null],
        ))
        .unwrap_err()
        .to_string();
    // Refused either way: arithmetic on a NULL operand is refused on its own.
    assert!(
        e.contains("does not fit column i") || e.contains("always NULL"),
        "{e}"
    );
    a.analyze(&tx(
        "UPDATE t SET i = COALESCE(v + $1, 99999999999) WHERE k = 99",
        vec![Value::Int(1)],
    ))
    .unwrap();
}

/// SQLite (3.47 on) evaluates first the operand of `+`, `||` or a comparison that holds no
/// subquery and, when it is NULL, skips the one that does; PostgreSQL and MariaDB evaluate both
/// and raise what fails there. The difftest found `i + (ABS(b) - (SELECT …))` failing on two
/// engines and succeeding on SQLite for a row whose `i` is NULL. An operand SQLite may skip is
/// now held to what may fail on some rows only; one beside an operand that cannot be NULL (NOT
/// NULL columns, keys, non-NULL parameters and arithmetic of those) is not.
#[test]
fn operands_sqlite_skips_beside_a_null_must_not_fail() {
    let a = Analyzer::new(
        Schema::from_sql(
            "CREATE TABLE t (k BIGINT PRIMARY KEY, v BIGINT, n BIGINT NOT NULL, i INTEGER);
             CREATE TABLE e (k BIGINT PRIMARY KEY, v BIGINT NOT NULL);
             CREATE TABLE s (k BIGINT PRIMARY KEY, v BIGINT NOT NULL);",
        )
        .unwrap(),
    );
    let run =
        |sql: &str, params: Vec<Value>| a.analyze(&tx(sql, params)).map_err(|e| e.to_string());
    let one = || vec![Value::Int(1)];
    let sub = "(SELECT v FROM e WHERE e.k = 1)";
    // The subquery on the right of a nullable operand, on the left of one, under comparisons:
    // each time what could overflow there is refused.
    for sql in [
        format!("UPDATE t SET v = i + (ABS(v) - {sub}) WHERE k = $1"),
        format!("UPDATE t SET v = i + (v + {sub}) WHERE k = $1"),
        format!("UPDATE t SET v = (v + {sub}) - i WHERE k = $1"),
        format!("UPDATE t SET i = CASE WHEN (n + {sub}) > v THEN 1 ELSE 0 END WHERE k = $1"),
        format!("UPDATE t SET i = CASE WHEN v < (n * {sub}) THEN 1 ELSE 0 END WHERE k = $1"),
    ] {
        let e = run(&sql, one()).unwrap_err();
        assert!(e.contains("may overflow"), "{sql}: {e}");
    }
    // Beside operands that cannot be NULL nothing is skipped: Smallbank's WriteCheck shape.
    let write_check = format!(
        "UPDATE t SET n = n - $2 - CASE WHEN n + {sub} < $2 THEN 1 ELSE 0 END WHERE k = $1"
    );
    run(&write_check, vec![Value::Int(1), Value::Int(5)]).unwrap();
    run(
        &format!("UPDATE t SET n = k + (n + {sub}) WHERE k = $1"),
        one(),
    )
    .unwrap();
    // … but a NULL parameter beside it lets SQLite skip the CASE, and its sum may overflow.
    let e = run(&write_check, vec![Value::Int(1), Value::Null]).unwrap_err();
    assert!(
        e.contains("may overflow") || e.contains("always NULL"),
        "{e}"
    );
    // A subquery alone, or one whose operand cannot fail, is fine beside anything.
    run(&format!("UPDATE t SET v = i + {sub} WHERE k = $1"), one()).unwrap();
    run(
        &format!("UPDATE t SET i = CASE WHEN v > {sub} THEN 1 ELSE 0 END WHERE k = $1"),
        one(),
    )
    .unwrap();
    // PostgreSQL folds a comparison, IN, BETWEEN or LIKE with a NULL constant to NULL when it
    // plans, without evaluating the other side; MariaDB and SQLite evaluate it (found by the
    // review, with SQLite reading `x IN (c)` as `x = c` and skipping `x` beside a NULL `c`).
    for sql in [
        "SELECT k, ABS(v) = $1 FROM t".to_owned(),
        "SELECT k, ABS(v) IN ($1) FROM t".to_owned(),
        "SELECT k, ABS(v) NOT BETWEEN $1 AND $1 FROM t".to_owned(),
        format!("SELECT k, (ABS(v) + {sub}) IN ($1) FROM t"),
    ] {
        let e = run(&sql, vec![Value::Null]).unwrap_err();
        assert!(e.contains("may overflow"), "{sql}: {e}");
        run(&sql, one()).unwrap_or_else(|e| panic!("{sql} with a value: {e}"));
    }
    // The optional side of a LEFT JOIN may be NULL whatever its column says.
    let e = run(
        &format!(
            "INSERT INTO s (k, v) SELECT t.k, e.v + (t.n + {sub}) FROM t LEFT JOIN e ON e.k = t.k ORDER BY t.k"
        ),
        vec![],
    )
    .unwrap_err();
    assert!(e.contains("may overflow"), "{e}");
}

/// A grouped query's subqueries see its rows' columns as constants of the group: only grouped
/// columns are. PostgreSQL refuses the others where MariaDB and SQLite pick a row (found by the
/// review); an aggregate over an outer column is computed in the outer query by PostgreSQL only.
#[test]
fn grouping_reaches_into_subqueries() {
    let a = review_analyzer();
    let run = |sql: &str| a.analyze(&tx(sql, vec![])).map_err(|e| e.to_string());
    for sql in [
        "SELECT COUNT(*), (SELECT e.v FROM e WHERE e.k = t.k) FROM t",
        "SELECT t.i, COUNT(*) FROM t GROUP BY t.i HAVING EXISTS (SELECT 1 FROM e WHERE e.k = t.k)",
        "SELECT t.i FROM t GROUP BY t.i ORDER BY (SELECT e.v FROM e WHERE e.k = t.v)",
        "SELECT MAX(t.v), t.i IN (SELECT e.v FROM e WHERE e.k = t.k) FROM t",
        "SELECT COUNT(*) FROM t HAVING 1 IN (SELECT e.k FROM e WHERE e.v = (SELECT t.v FROM e AS f WHERE f.k = 1))",
    ] {
        let e = run(sql).unwrap_err();
        assert!(e.contains("neither grouped nor aggregated"), "{sql}: {e}");
    }
    for sql in [
        "SELECT (SELECT MAX(t.v) FROM e WHERE e.k = 1) FROM t",
        "SELECT t.k FROM t WHERE t.v > (SELECT MIN(t.i) FROM e WHERE e.k = 1)",
        "SELECT (SELECT MAX(e.v + t.v) FROM e) FROM t",
    ] {
        let e = run(sql).unwrap_err();
        assert!(e.contains("outer query's column"), "{sql}: {e}");
    }
    // What engines group differently (found by the second review): HAVING or an aggregate in
    // ORDER BY in a query not otherwise grouped, and GROUP BY on an outer query's column.
    for (sql, why) in [
        (
            "DELETE FROM e WHERE e.k IN (SELECT t.k FROM t HAVING t.k > 2)",
            "HAVING without GROUP BY",
        ),
        ("SELECT 1 FROM t HAVING 1 = 1", "HAVING without GROUP BY"),
        (
            "SELECT 1 FROM t HAVING COUNT(*) > 3",
            "HAVING without GROUP BY",
        ),
        (
            "UPDATE e SET v = 0 WHERE EXISTS (SELECT 1 FROM t WHERE t.k = e.v ORDER BY MAX(t.v))",
            "aggregate in ORDER BY",
        ),
        ("SELECT 1 FROM t ORDER BY COUNT(*)", "aggregate in ORDER BY"),
        (
            "UPDATE e SET v = 0 WHERE EXISTS (SELECT 1 FROM t GROUP BY t.i, e.x)",
            "of an outer query",
        ),
    ] {
        let e = run(sql).unwrap_err();
        assert!(e.contains(why), "{sql}: {e}");
    }
    // Under HAVING, MariaDB computes the outputs and sort keys of the groups it drops, the
    // others only of those kept (found by the difftest): what may overflow there is refused.
    for sql in [
        "INSERT INTO e (k, v) SELECT t.v + 1000, COUNT(*) FROM t GROUP BY t.v HAVING COUNT(*) > 2",
        "SELECT t.v, COUNT(*) FROM t GROUP BY t.v HAVING COUNT(*) > 0 ORDER BY t.v + 1",
        // PostgreSQL never evaluates IN's left side against an empty subquery.
        "UPDATE t SET b = ((2 + t.v) IN (SELECT e.v FROM e WHERE FALSE)) WHERE t.k = 1",
        // MariaDB only asks COUNT's argument whether it is NULL: an overflow there passes.
        "SELECT MAX(t.k), COUNT(t.k - COALESCE(t.v, -9223372036854775807)) FROM t",
    ] {
        let e = run(sql).unwrap_err();
        assert!(e.contains("may overflow"), "{sql}: {e}");
    }
    run("INSERT INTO e (k, v) SELECT t.i + 1000, COUNT(*) FROM t GROUP BY t.i HAVING COUNT(*) > 2")
        .unwrap();
    run("UPDATE t SET b = ((2 + t.i) IN (SELECT e.v FROM e WHERE FALSE)) WHERE t.k = 1").unwrap();
    // Grouped columns, aggregates and a WHERE (evaluated before grouping) are fine.
    for sql in [
        "SELECT t.i, COUNT(*), (SELECT MAX(e.v) FROM e WHERE e.k = t.i) FROM t GROUP BY t.i",
        "SELECT COUNT(*) FROM t WHERE EXISTS (SELECT 1 FROM e WHERE e.k = t.k)",
        "SELECT t.i FROM t GROUP BY t.i HAVING MAX(t.v) > (SELECT MIN(e.v) FROM e)",
        "SELECT (SELECT MAX(e.v) FROM e WHERE e.k = t.k) FROM t",
        "SELECT COUNT(*) FROM t ORDER BY COUNT(*)",
        "SELECT COUNT(*) FROM t HAVING COUNT(*) > 0",
        "SELECT t.i FROM t GROUP BY t.i HAVING t.i > 1 ORDER BY MAX(t.v), t.i",
    ] {
        run(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// What the second hunt found: PostgreSQL computes the outputs of an aggregating subquery
/// under EXISTS where the others never do, and MariaDB decides that a decimal beyond the
/// subquery column's precision matches nothing in `IN (SELECT …)` even beside a NULL.
#[test]
fn exists_outputs_and_decimal_in_subqueries_agree() {
    let a = review_analyzer();
    let run = |sql: &str| a.analyze(&tx(sql, vec![])).map_err(|e| e.to_string());
    for sql in [
        "SELECT CASE WHEN EXISTS (SELECT MAX(e.v) + 1 FROM e) THEN 1 ELSE 0 END FROM t",
        "UPDATE e SET v = CASE WHEN NOT EXISTS (SELECT -MIN(t.v) FROM t WHERE t.k = 9) THEN 1 ELSE 0 END WHERE e.k = 1",
    ] {
        let e = run(sql).unwrap_err();
        assert!(e.contains("may overflow"), "{sql}: {e}");
    }
    run("SELECT CASE WHEN EXISTS (SELECT MAX(e.v) FROM e) THEN 1 ELSE 0 END FROM t").unwrap();
    let sql = "SELECT k FROM t WHERE t.d NOT IN (SELECT f.d FROM t AS f)";
    let mysql = rendered(&a, sql, vec![]).unwrap()[1].clone();
    assert!(mysql.contains("AS DECIMAL(65, 30))"), "{mysql}");
}

/// Text computed into VARCHAR(n) that may be longer and end in blanks: PostgreSQL cuts excess
/// spaces silently, MariaDB spaces and tabs, SQLite fails (found by the review); longer text
/// that ends otherwise fails on all three, and what provably fits is fine.
#[test]
fn overlong_text_ending_in_blanks_is_refused() {
    let a = review_analyzer();
    let run = |sql: &str, v: Value| {
        let params = if sql.contains("$1") { vec![v] } else { vec![] };
        a.analyze(&tx(sql, params)).map_err(|e| e.to_string())
    };
    for sql in [
        "UPDATE t SET x = x || '            ' WHERE k = 5",
        "UPDATE t SET x = TRIM(x) || ' ' WHERE k = 5",
        "UPDATE t SET x = x || $1 WHERE k = 7",
        "INSERT INTO t (k, x) SELECT e.k + 100, e.x FROM e WHERE e.k = 7",
        "UPDATE t SET x = CASE WHEN k > 1 THEN x || x ELSE 'a' END WHERE k = 5",
    ] {
        let e = run(sql, Value::Text("\t\t".into())).unwrap_err();
        assert!(
            e.contains("end in blanks") || e.contains("does not end in a blank"),
            "{sql}: {e}"
        );
    }
    // A parameter ending the text is checked by its value: neither empty nor ending in a blank.
    let appended = "UPDATE t SET x = x || $1 WHERE k = 7";
    run(appended, Value::Text("ab".into())).unwrap();
    for v in ["a ", ""] {
        let e = run(appended, Value::Text(v.into())).unwrap_err();
        assert!(
            e.contains("parameter $1 must be text that is not empty"),
            "{e}"
        );
    }
    for sql in [
        "UPDATE t SET x = x || 'abc' WHERE k = 5",
        "UPDATE t SET x = CASE WHEN k > 1 THEN x ELSE 'xxxxxxxxxxxxxxxxxxxxxxxxx' END WHERE k = 5",
        "UPDATE t SET x = SUBSTR(x, 1, 3) || ' ' WHERE k = 5",
        "UPDATE t SET x = $1 WHERE k = 5",
        "INSERT INTO t (k, x) SELECT e.k + 100, e.x || 'z' FROM e WHERE e.k = 7",
    ] {
        run(sql, Value::Text("  ".into())).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// From the review's second hunt: an ON naming a table joined after it (SQLite sees it, the
/// others do not), and a subquery reading the INSERT's own table in a VALUES row of several
/// (MariaDB sees the rows inserted before it).
#[test]
fn join_scopes_and_values_subqueries_agree() {
    let a = review_analyzer();
    let run = |sql: &str| a.analyze(&tx(sql, vec![])).map_err(|e| e.to_string());
    for sql in [
        "SELECT t.k FROM t JOIN e ON f.k = t.k JOIN e AS f ON f.k = e.k ORDER BY t.k",
        "SELECT t.k FROM t, e JOIN e AS f ON f.k = t.k ORDER BY t.k",
        "SELECT t.k FROM t JOIN e ON EXISTS (SELECT 1 FROM e AS g WHERE g.k = f.k) JOIN e AS f ON f.k = e.k ORDER BY t.k",
    ] {
        let e = run(sql).unwrap_err();
        assert!(e.contains("not joined before it"), "{sql}: {e}");
    }
    run(
        "SELECT t.k FROM t JOIN e ON e.k = t.k JOIN e AS f ON f.k = e.k AND f.v = t.v ORDER BY t.k",
    )
    .unwrap();
    run("SELECT t.k FROM t, e JOIN e AS f ON f.k = e.k ORDER BY t.k, e.k").unwrap();
    for sql in [
        "INSERT INTO e (k, v) VALUES (100, 1), (101, (SELECT COUNT(*) FROM e))",
        "INSERT INTO e (k, v) VALUES (100, 1), (101, CASE WHEN EXISTS (SELECT 1 FROM e AS g WHERE g.v = 1) THEN 1 ELSE 0 END)",
    ] {
        let e = run(sql).unwrap_err();
        assert!(e.contains("inserts into"), "{sql}: {e}");
    }
    run("INSERT INTO e (k, v) VALUES (100, (SELECT COUNT(*) FROM e))").unwrap();
    // MariaDB rounded a decimal it looked an integer key up by (`e.k = d.k AND e.k = 2.675`
    // matched e.k = 3 under a LEFT JOIN; found by the difftest): on MySQL an integer meets a
    // decimal as a decimal, in `=` and in IN lists.
    for sql in [
        "SELECT t.k FROM t LEFT JOIN e ON e.k = t.k AND e.k = 2.675 ORDER BY t.k",
        "SELECT t.k FROM t LEFT JOIN e ON e.k = t.k AND e.k IN (2.675) ORDER BY t.k",
    ] {
        let [pg, mysql, sqlite] =
            <[String; 3]>::try_from(rendered(&a, sql, vec![]).unwrap()).unwrap();
        assert!(
            mysql.contains("CAST(\"chainify_t2\".\"k\" AS DECIMAL(65, 0))"),
            "{mysql}"
        );
        assert!(
            !pg.contains("CAST") && !sqlite.contains("CAST"),
            "{pg} {sqlite}"
        );
    }
    run("INSERT INTO e (k, v) VALUES (100, 1), (101, (SELECT COUNT(*) FROM t))").unwrap();
}

/// What the hunt over SMALLINT, DECIMAL(5,3) keys and DECIMAL(15,6) columns found on MariaDB:
/// `g1.k = g2.r AND g2.r = 1.0004` was carried over to `g1.k = 1.0004` and the DECIMAL(5,3)
/// key looked up by 1.000, and `b NOT IN (SELECT CAST(s AS SIGNED) …)` with a SMALLINT `s`
/// still decided that ±2⁶³−1 matches nothing beside a NULL. On MySQL decimal columns of
/// different scales are compared as DECIMAL(65, 30), and a narrow integer output of
/// `IN (SELECT …)` is widened to DECIMAL(65, 0).
#[test]
fn decimal_scales_and_smallint_subqueries_compare_exactly_on_mysql() {
    let a = Analyzer::new(
        Schema::from_sql(
            "CREATE TABLE g (k DECIMAL(5,3) PRIMARY KEY, s SMALLINT, p DECIMAL(5,3), r DECIMAL(15,6));
             CREATE TABLE d (k BIGINT PRIMARY KEY, b BIGINT);",
        )
        .unwrap(),
    )
    .with_nested_scans(4);
    let my = |sql: &str| rendered(&a, sql, vec![]).unwrap()[1].clone();
    let join = my(
        "SELECT g1.s FROM g AS g2 LEFT JOIN g AS g1 ON g1.k = g2.r AND g2.r = 1.0004 ORDER BY g2.k",
    );
    assert!(
        join.contains("(CAST(\"chainify_t2\".\"k\" AS DECIMAL(65, 30)) = CAST(\"chainify_t1\".\"r\" AS DECIMAL(65, 30)))"),
        "{join}"
    );
    // The constant meets one column: MariaDB compares it exactly, and the key stays usable.
    assert!(join.contains("(\"chainify_t1\".\"r\" = 1.0004)"), "{join}");
    let listed = my("SELECT g1.s FROM g AS g1, g AS g2 WHERE g1.k IN (g2.r, 2.5)");
    assert!(
        listed.contains("CAST(\"chainify_t2\".\"r\" AS DECIMAL(65, 30))"),
        "{listed}"
    );
    // Columns of the same scale, and a column beside a literal, are compared as they are.
    for sql in [
        "SELECT g1.s FROM g AS g1, g AS g2 WHERE g1.k = g2.p",
        "SELECT s FROM g WHERE k = 1.0004",
        "SELECT s FROM g WHERE r IN (1.0004, 2)",
    ] {
        assert!(!my(sql).contains("65, 30"), "{sql}: {}", my(sql));
    }
    let narrow = my("SELECT k FROM d WHERE b NOT IN (SELECT g.s FROM g)");
    assert!(
        narrow.contains("SELECT CAST(\"chainify_t2\".\"s\" AS DECIMAL(65, 0)) FROM"),
        "{narrow}"
    );
    // PostgreSQL and SQLite are given the comparison as written.
    let pg = rendered(
        &a,
        "SELECT g1.s FROM g AS g1, g AS g2 WHERE g1.k = g2.r",
        vec![],
    )
    .unwrap();
    assert!(!pg[0].contains("CAST") && !pg[2].contains("CAST"), "{pg:?}");
}

/// A constant that folds to NULL only once evaluated (NULLIF, a CASE without ELSE) beside an
/// operand that is not constant: PostgreSQL folds the operator to NULL and never computes that
/// operand, MariaDB and SQLite compute it and fail when it overflows (found by the review of
/// generic plans: `bal + 9223372036854775807` committed NULL on PostgreSQL and failed on the
/// others). Refused with the reason; the same statements with values that do not fold to NULL
/// are accepted.
#[test]
fn a_constant_folding_to_null_beside_a_column_is_refused() {
    let a = analyzer();
    let refused = [
        (
            "UPDATE checking SET bal = (bal + 9223372036854775807) + NULLIF(1, 1) WHERE custid = 1",
            vec![],
        ),
        (
            "UPDATE checking SET bal = (bal + 9223372036854775807) + CASE WHEN 1 = 2 THEN 1 END WHERE custid = 1",
            vec![],
        ),
        (
            "UPDATE checking SET bal = (bal + 9223372036854775807) + NULLIF($1, $2) WHERE custid = 1",
            vec![Value::Int(3), Value::Int(3)],
        ),
        (
            "UPDATE checking SET bal = ABS(bal + 9223372036854775807) * CASE WHEN $1 = 2 THEN 1 END WHERE custid = 1",
            vec![Value::Int(1)],
        ),
        (
            "SELECT (bal + 9223372036854775807) + NULLIF(1, 1) FROM checking WHERE custid = 1",
            vec![],
        ),
        // A simple CASE compares its operand with each WHEN (found by the difftest).
        (
            "UPDATE checking SET bal = CASE (bal * 7) WHEN NULLIF(0, 0) THEN 1 ELSE 2 END WHERE custid = 1",
            vec![],
        ),
        (
            "SELECT CASE (bal + 1) WHEN CASE WHEN 1 = 2 THEN 2 END THEN 1 ELSE 2 END FROM checking WHERE custid = 1",
            vec![],
        ),
        // Comparisons are strict too: `x = NULL` folds whole, x never computed.
        (
            "SELECT CASE WHEN (bal + 9223372036854775807) = NULLIF(1, 1) THEN 1 ELSE 0 END FROM checking WHERE custid = 1",
            vec![],
        ),
        (
            "UPDATE checking SET bal = CASE WHEN (bal + 9223372036854775807) > NULLIF($1, 3) THEN 1 ELSE 0 END WHERE custid = 1",
            vec![Value::Int(3)],
        ),
        (
            "SELECT (bal + 9223372036854775807) IN (NULLIF(1, 1)) FROM checking WHERE custid = 1",
            vec![],
        ),
        (
            "SELECT (bal + 9223372036854775807) BETWEEN NULLIF(1, 1) AND NULLIF(2, 2) FROM checking WHERE custid = 1",
            vec![],
        ),
    ];
    for (sql, params) in refused {
        let err = a.analyze(&tx(sql, params)).unwrap_err();
        assert!(err.to_string().contains("always NULL"), "{sql}: {err}");
    }
    for (sql, params) in [
        (
            "UPDATE checking SET bal = (bal + 1) + NULLIF($1, $2) WHERE custid = 1",
            vec![Value::Int(3), Value::Int(4)],
        ),
        (
            "UPDATE checking SET bal = bal + CASE WHEN $1 = 2 THEN 1 ELSE 0 END WHERE custid = 1",
            vec![Value::Int(1)],
        ),
        (
            "UPDATE checking SET bal = CASE WHEN (bal + 1) > NULLIF($1, 3) THEN 1 ELSE 0 END WHERE custid = 1",
            vec![Value::Int(4)],
        ),
        (
            "UPDATE checking SET bal = CASE (bal * 7) WHEN NULLIF(0, 1) THEN 1 ELSE 2 END WHERE custid = 1",
            vec![],
        ),
        // A column alone cannot fail: every engine gives NULL.
        (
            "SELECT bal + NULLIF(1, 1) FROM checking WHERE custid = 1",
            vec![],
        ),
    ] {
        a.analyze(&tx(sql, params.clone()))
            .unwrap_or_else(|e| panic!("{sql} {params:?}: {e}"));
    }
}

/// A parameter repeated in a long `IN` list costs its bytes at every place: MySQL is sent it at
/// each, and constant folding holds the list's values at once. Past [`MAX_BOUND_BYTES`] the
/// statement is refused, as a transaction and as a query, before anything is folded or bound,
/// with the parameter named; the same list with a short value, and one long value used once,
/// pass.
#[test]
fn a_parameter_repeated_past_the_byte_bound_is_refused_before_it_is_folded() {
    let a = analyzer();
    let places = 2_000;
    // The list's places and the subject's.
    let list = vec!["$1"; places - 1].join(", ");
    let update =
        format!("UPDATE accounts SET name = name WHERE custid = ABS($2) AND $1 IN ({list})");
    let query = format!("SELECT custid FROM accounts WHERE custid = ABS($2) AND $1 IN ({list})");
    let value = |bytes: usize| vec![Value::Text("a".repeat(bytes)), Value::Int(1)];
    // 2 000 places of 4 KiB: 8 MiB, about twice the bound.
    let e = a.analyze(&tx(&update, value(4096))).unwrap_err();
    assert_eq!(e.kind, RejectKind::Limit, "{e}");
    let expected = format!(
        "the parameters carry {} bytes where the statement uses them, more than {MAX_BOUND_BYTES} (parameter $1 alone {}, at {places} places)",
        places * 4096 + 16,
        places * 4096
    );
    assert!(e.reason.contains(&expected), "{e}");
    let e = a.query(&query, &value(4096)).unwrap_err().to_string();
    assert!(e.contains(&expected), "{e}");
    // Under the bound: the same list with a value of 1 KiB (2 MiB), and 3 MiB used once.
    a.analyze(&tx(&update, value(1024))).unwrap();
    a.analyze(&tx(
        "UPDATE accounts SET name = name WHERE custid = ABS($2) AND name = $1",
        value(3 << 20),
    ))
    .unwrap();
}

/// Constant folding evaluates every operator with everything under it, so the values it produces
/// are counted, and a transaction's statements share [`MAX_FOLDED_BYTES`]: statements each within
/// [`MAX_BOUND_BYTES`] are refused once together they pass it, naming the statement; one alone,
/// and queries, keep their own budget.
#[test]
fn constant_folding_shares_one_byte_budget_across_a_transaction() {
    let a = analyzer();
    let list = vec!["$1"; 1749].join(", ");
    let sql = format!("UPDATE accounts SET name = name WHERE custid = ABS($2) AND $1 IN ({list})");
    let params = vec![Value::Text("a".repeat(2048)), Value::Int(1)];
    // 1 750 places of 2 KiB: 3.5 MiB each, under the bound.
    a.analyze(&tx(&sql, params.clone())).unwrap();
    let statements = |n: usize| Transaction {
        statements: vec![Statement::new(&sql, params.clone()); n],
    };
    a.analyze(&statements(4)).unwrap();
    let e = a.analyze(&statements(5)).unwrap_err();
    assert_eq!((e.statement, e.kind), (5, RejectKind::Limit), "{e}");
    assert!(
        e.reason.contains(&format!(
            "more than the {MAX_FOLDED_BYTES} bytes of values a transaction may"
        )),
        "{e}"
    );
}

/// Two IN lists on one key column keep exactly the values in both, however long, repeated or
/// ordered the lists are.
#[test]
fn in_lists_on_one_key_column_intersect() {
    use chainify_core::rwset::{KeySet, KeyValue};
    let a = analyzer();
    let first: Vec<i64> = (0..1500).rev().collect();
    let second: Vec<i64> = (1000..2400).chain(1000..1100).collect();
    let list = |from: usize, n: usize| {
        (from..from + n)
            .map(|i| format!("${i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sql = format!(
        "UPDATE checking SET bal = bal WHERE custid IN ({}) AND custid IN ({})",
        list(1, first.len()),
        list(first.len() + 1, second.len())
    );
    let params: Vec<Value> = first
        .iter()
        .chain(&second)
        .map(|v| Value::Int(*v))
        .collect();
    let analysis = a.analyze(&tx(&sql, params)).unwrap();
    let (_, keys) = analysis.rwset.writes.into_iter().next().unwrap();
    let KeySet::Ranges(ranges) = keys else {
        panic!("{keys:?}")
    };
    let mut written: Vec<i64> = ranges
        .iter()
        .map(|r| match r.prefix.as_slice() {
            [KeyValue::Int(k)] => *k,
            other => panic!("{other:?}"),
        })
        .collect();
    written.sort_unstable();
    assert_eq!(written, (1000..1500).collect::<Vec<_>>());
}

/// Rebuilding a long value under nested operators is what folding pays for, parameters or not:
/// a chain of REPLACEs of a literal grown to 1 MiB produces 1 MiB at each level, and is refused
/// once what it produced passes [`MAX_FOLDED_BYTES`], not after gigabytes. Each level is
/// folded once: twelve levels produce 13 MiB (folding each again under every level above it
/// produced 79).
#[test]
fn folding_a_value_rebuilt_under_nested_operators_is_bounded() {
    let a =
        Analyzer::new(Schema::from_sql("CREATE TABLE t (k BIGINT PRIMARY KEY, v TEXT)").unwrap());
    // Just under the 1 MiB a constant text may take, with room for the `||`s.
    let grown = format!(
        "REPLACE('{}', 'a', '{}')",
        "a".repeat(1024),
        "b".repeat(1000)
    );
    let chain =
        |depth: usize| (0..depth).fold(grown.clone(), |inner, _| format!("({inner} || 'c')"));
    let sql = |depth: usize| format!("UPDATE t SET v = v WHERE k = $1 AND v = {}", chain(depth));
    a.analyze(&tx(&sql(2), vec![Value::Int(1)])).unwrap();
    a.analyze(&tx(&sql(12), vec![Value::Int(1)])).unwrap();
    let e = a.analyze(&tx(&sql(16), vec![Value::Int(1)])).unwrap_err();
    assert_eq!(e.kind, RejectKind::Limit, "{e}");
    assert!(
        e.reason
            .contains("folding its constants produces more than"),
        "{e}"
    );
}

/// A long key value is no key: beside an IN list on the next key column it would be copied into
/// every combination (half a gigabyte for 500 KB and 1 024 values), so the access covers the
/// table's keys instead, a wider set and never a narrower one; a short one still gives a key
/// per value.
#[test]
fn a_long_key_value_beside_an_in_list_widens_the_access_instead_of_multiplying() {
    use chainify_core::rwset::KeySet;
    let a = Analyzer::new(
        Schema::from_sql("CREATE TABLE t (a VARCHAR(64) NOT NULL, b BIGINT NOT NULL, v BIGINT, PRIMARY KEY (a, b))")
            .unwrap(),
    );
    let list = (1..=1024)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!("UPDATE t SET v = 0 WHERE a = $1 AND b IN ({list})");
    let keys = |bytes: usize| {
        let analysis = a
            .analyze(&tx(&sql, vec![Value::Text("x".repeat(bytes))]))
            .unwrap();
        let (_, keys) = analysis.rwset.writes.into_iter().next().unwrap();
        keys.clone()
    };
    match keys(MAX_KEY_VALUE_BYTES) {
        KeySet::Ranges(r) => assert_eq!(r.len(), 1024),
        KeySet::All => panic!("a short key value"),
    }
    assert_eq!(keys(MAX_KEY_VALUE_BYTES + 1), KeySet::All);
    assert_eq!(keys(500_000), KeySet::All);
}

/// A long text or bytes key aborted on PostgreSQL alone (an index entry over 2 704 bytes, found
/// by a hunt), and a slightly shorter one broke its snapshot tables' keys: what is stored into
/// a key column is held to the column's share of the key, the same on every engine, by its
/// value; a computed value there is refused.
#[test]
fn long_keys_are_refused_on_every_engine_alike() {
    let a = Analyzer::new(
        Schema::from_sql(
            "CREATE TABLE t (k TEXT PRIMARY KEY, v BIGINT NOT NULL, note TEXT);
             CREATE TABLE h (id BIGINT NOT NULL, hash BYTEA NOT NULL, PRIMARY KEY (id), UNIQUE (hash));
             CREATE TABLE w (k VARCHAR(700) PRIMARY KEY, v BIGINT NOT NULL);
             CREATE TABLE n (k VARCHAR(64) PRIMARY KEY, v BIGINT NOT NULL);",
        )
        .unwrap(),
    );
    let text = |n: usize| Value::Text("é".repeat(n / 2));
    let insert = "INSERT INTO t (k, v, note) VALUES ($1, 1, $2)";
    a.analyze(&tx(insert, vec![text(2_592), text(100_000)]))
        .expect("a key within its share, and long text outside keys");
    let e = a
        .analyze(&tx(insert, vec![text(2_594), Value::Null]))
        .unwrap_err();
    assert_eq!(e.kind, RejectKind::Limit, "{e}");
    assert!(
        e.to_string().contains(
            "key column k of table t holds 2594 bytes; text or bytes in that key hold at most 2592"
        ),
        "{e}"
    );
    // A literal, an UPDATE and a bytes key alike.
    let long = "x".repeat(2_600);
    let e = a
        .analyze(&tx(
            &format!("INSERT INTO t (k, v) VALUES ('{long}', 1)"),
            vec![],
        ))
        .unwrap_err();
    assert!(e.to_string().contains("holds 2600 bytes"), "{e}");
    let e = a
        .analyze(&tx("UPDATE t SET k = $1 WHERE k = 'a'", vec![text(3_000)]))
        .unwrap_err();
    assert!(e.to_string().contains("key column k of table t"), "{e}");
    let e = a
        .analyze(&tx(
            "INSERT INTO h (id, hash) VALUES (1, $1)",
            vec![Value::Bytes(vec![7; 2_593])],
        ))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("key column hash of table h holds 2593 bytes"),
        "{e}"
    );
    a.analyze(&tx(
        "INSERT INTO h (id, hash) VALUES (1, $1)",
        vec![Value::Bytes(vec![7; 32])],
    ))
    .expect("a hash as a key");
    // VARCHAR(700) may hold 2 800 bytes, more than a key: held by value too.
    let e = a
        .analyze(&tx(
            "INSERT INTO w (k, v) VALUES ($1, 1)",
            vec![text(2_800)],
        ))
        .unwrap_err();
    assert!(e.to_string().contains("holds 2800 bytes"), "{e}");
    // Computed into a capped key: refused whatever the values; into a key that fits as
    // declared, fine.
    for sql in [
        "UPDATE t SET k = k || 'x' WHERE k = 'a'",
        "INSERT INTO t (k, v) SELECT note, v FROM t WHERE k = 'a'",
        "INSERT INTO w (k, v) VALUES ($1 || 'x', 1)",
    ] {
        let e = a
            .analyze(&tx(sql, vec![Value::Text("a".into())]))
            .unwrap_err();
        assert!(e.to_string().contains("is computed"), "{sql}: {e}");
    }
    a.analyze(&tx("UPDATE n SET k = k || 'x' WHERE k = 'a'", vec![]))
        .expect("VARCHAR(64) always fits a key");
}

/// A schema wide enough to reach the engines' own limits: 40 TEXT and 40 VARCHAR(256) columns
/// in `w`, a narrow table `o`, and `y` of four BYTEA columns.
fn wide_analyzer() -> Analyzer {
    let text: Vec<String> = (0..40).map(|i| format!("c{i} TEXT")).collect();
    let short: Vec<String> = (0..40).map(|i| format!("v{i} VARCHAR(256)")).collect();
    Analyzer::new(
        Schema::from_sql(&format!(
            "CREATE TABLE w (k BIGINT PRIMARY KEY, n BIGINT NOT NULL, {}, {});
             CREATE TABLE o (k BIGINT PRIMARY KEY, n BIGINT NOT NULL);
             CREATE TABLE y (k BIGINT PRIMARY KEY, b0 BYTEA, b1 BYTEA, b2 BYTEA, b3 BYTEA);",
            text.join(", "),
            short.join(", ")
        ))
        .unwrap(),
    )
    .with_nested_scans(4)
}

fn limit_refusal(a: &Analyzer, sql: &str, params: Vec<Value>, why: &str) {
    let e = a.analyze(&tx(sql, params)).unwrap_err();
    assert_eq!(e.kind, RejectKind::Limit, "{sql}: {e}");
    assert!(e.to_string().contains(why), "{e}");
    assert!(e.to_string().starts_with("statement 1: "), "{e}");
}

/// Engines refuse statements past limits of their own (found by an adversarial hunt: a SELECT
/// of 1 700 outputs failed on PostgreSQL alone, 2 100 ORDER BY terms on SQLite alone). The
/// analysis refuses, naming the SELECT, the count and the bound, every SELECT past
/// `MAX_SELECT_ENTRIES` target-list entries (outputs, and sort keys that are not outputs),
/// ORDER BY or GROUP BY terms, at any nesting level, and accepts the largest one within.
#[test]
fn target_lists_and_sort_terms_are_bounded_below_every_engine() {
    let a = analyzer();
    let n = MAX_SELECT_ENTRIES;
    let list = |item: &str, n: usize| vec![item; n].join(", ");
    let p = || vec![Value::Int(1)];
    // The largest accepted at each place.
    for sql in [
        format!(
            "SELECT {} FROM accounts WHERE custid = $1",
            list("custid", n)
        ),
        format!(
            "SELECT custid FROM accounts WHERE custid = $1 ORDER BY {}",
            list("custid", n)
        ),
        format!(
            "SELECT custid FROM accounts WHERE custid = $1 GROUP BY {}",
            list("custid", n)
        ),
        format!(
            "SELECT {} FROM accounts WHERE custid = $1 ORDER BY name",
            list("custid", n - 1)
        ),
        format!(
            "SELECT custid FROM checking WHERE custid = $1 AND EXISTS (SELECT {} FROM accounts WHERE custid = $1)",
            list("custid", n)
        ),
    ] {
        a.analyze(&tx(&sql, p()))
            .unwrap_or_else(|e| panic!("{}: {e}", &sql[..80]));
    }
    // One more is refused, naming the count and the bound.
    limit_refusal(
        &a,
        &format!(
            "SELECT {} FROM accounts WHERE custid = $1",
            list("custid", n + 1)
        ),
        p(),
        &format!(
            "the SELECT has {} target-list entries ({} outputs and 0 ORDER BY or GROUP BY keys that are not outputs); at most {n}",
            n + 1,
            n + 1
        ),
    );
    // A sort key that is not an output is a hidden entry on PostgreSQL.
    limit_refusal(
        &a,
        &format!(
            "SELECT {} FROM accounts WHERE custid = $1 ORDER BY name",
            list("custid", n)
        ),
        p(),
        &format!("{} outputs and 1 ORDER BY or GROUP BY keys", n),
    );
    limit_refusal(
        &a,
        &format!(
            "SELECT custid FROM accounts WHERE custid = $1 ORDER BY {}",
            list("1", n + 1)
        ),
        p(),
        &format!("has {} ORDER BY terms; at most {n}", n + 1),
    );
    limit_refusal(
        &a,
        &format!(
            "SELECT custid FROM accounts WHERE custid = $1 GROUP BY {}",
            list("custid", n + 1)
        ),
        p(),
        &format!("has {} GROUP BY terms; at most {n}", n + 1),
    );
    // At any nesting level: a subquery, and INSERT … SELECT.
    limit_refusal(
        &a,
        &format!(
            "UPDATE checking SET bal = 0 WHERE custid = $1 AND EXISTS (SELECT {} FROM accounts WHERE custid = $1)",
            list("custid", n + 1)
        ),
        p(),
        "a SELECT nested 1 level deep has 1001 target-list entries",
    );
    limit_refusal(
        &a,
        &format!(
            "SELECT custid FROM checking WHERE custid = $1 AND custid IN (SELECT custid FROM accounts WHERE custid = $1 GROUP BY {})",
            list("custid", n + 1)
        ),
        p(),
        "a SELECT nested 1 level deep has 1001 GROUP BY terms",
    );
}

/// MariaDB sorts a text key on up to `max_sort_length` (1 024) bytes and refuses to sort when
/// about 15 rows' keys do not fit its 2 MiB sort buffer, where PostgreSQL and SQLite spill to
/// disk (found by an adversarial hunt: a GROUP BY of 160 text columns failed every block on
/// MariaDB alone). Every SELECT's GROUP BY, ORDER BY and DISTINCT keys share
/// `MAX_SORT_KEY_BYTES`, counted from the declared types.
#[test]
fn sort_keys_are_bounded_by_their_declared_width() {
    let a = wide_analyzer();
    let keys = |col: &str, n: usize| -> String {
        let tables = ["a", "b", "c", "d"];
        (0..n)
            .map(|i| format!("{}.{col}{}", tables[i / 40], i % 40))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let from =
        "FROM w a JOIN w b ON b.k = a.k JOIN w c ON c.k = a.k JOIN w d ON d.k = a.k WHERE a.k = $1";
    let p = || vec![Value::Int(1)];
    // A TEXT key counts 1 024 bytes and 8 more: 63 fit in 64 KiB, 64 do not.
    let per_text = 1024 + 8;
    let fit = usize::try_from(MAX_SORT_KEY_BYTES / per_text).unwrap();
    assert_eq!(fit, 63);
    a.analyze(&tx(
        &format!("SELECT COUNT(*) {from} GROUP BY {}", keys("c", fit)),
        p(),
    ))
    .unwrap();
    limit_refusal(
        &a,
        &format!("SELECT COUNT(*) {from} GROUP BY {}", keys("c", fit + 1)),
        p(),
        &format!(
            "the SELECT sorts on keys of up to {} bytes a row (GROUP BY, ORDER BY;",
            (fit as u64 + 1) * per_text
        ),
    );
    limit_refusal(
        &a,
        &format!("SELECT COUNT(*) {from} GROUP BY {}", keys("c", 160)),
        p(),
        &format!("at most {MAX_SORT_KEY_BYTES} are accepted"),
    );
    // VARCHAR(256) counts 4 × 256 bytes; ORDER BY keys count as GROUP BY keys do.
    a.analyze(&tx(
        &format!("SELECT a.k {from} ORDER BY {}", keys("v", fit)),
        p(),
    ))
    .unwrap();
    limit_refusal(
        &a,
        &format!("SELECT a.k {from} ORDER BY {}", keys("v", fit + 1)),
        p(),
        "sorts on keys",
    );
    // DISTINCT outputs are keys too (VARCHAR(256): 64 TEXT outputs pass `MAX_ROW_BYTES`
    // first); integer keys are narrow.
    a.analyze(&tx(
        &format!("SELECT DISTINCT {} {from}", keys("v", fit)),
        p(),
    ))
    .unwrap();
    limit_refusal(
        &a,
        &format!("SELECT DISTINCT {} {from}", keys("v", fit + 1)),
        p(),
        "GROUP BY, ORDER BY and DISTINCT outputs",
    );
    let ints = (0..400).map(|_| "a.n").collect::<Vec<_>>().join(", ");
    a.analyze(&tx(&format!("SELECT COUNT(*) {from} GROUP BY {ints}"), p()))
        .unwrap();
    // In a subquery too.
    limit_refusal(
        &a,
        &format!(
            "UPDATE o SET n = 1 WHERE k = $1 AND EXISTS (SELECT COUNT(*) {from} GROUP BY {})",
            keys("c", fit + 1)
        ),
        p(),
        "a SELECT nested 1 level deep sorts on keys",
    );
}

/// One row of a SELECT is bounded in bytes (`MAX_ROW_BYTES`, 16 MiB), each output counted
/// from what the analysis knows: a TEXT column 1 MiB (what chainify stores there is checked), a
/// bytes column 4 MiB (what a statement's parameters may carry), `||` and REPLACE their growth
/// bound (at most 4 MiB), the parameters 4 MiB together, 9 bytes of framing for each text or
/// bytes value. Found in review: 1 000 TEXT outputs made a row of a gigabyte, which PostgreSQL
/// cannot send (it fails a row over 1 GB where the others return it) and which every
/// organization's driver holds several times over. Largest accepted and smallest refused for
/// each kind of output, in a transaction and in a query alike, at every nesting level.
#[test]
fn a_selects_row_is_bounded_in_bytes() {
    let a = wide_analyzer();
    let cols = |prefix: &str, from: usize, n: usize| -> Vec<String> {
        (from..from + n).map(|i| format!("{prefix}{i}")).collect()
    };
    let select = |outputs: Vec<String>, from: &str| {
        format!("SELECT {} FROM {from} WHERE k = $1", outputs.join(", "))
    };
    let mib = 1u64 << 20;
    let text = mib + 9;
    let computed = 4 * mib + 9;
    let bytes = MAX_BOUND_BYTES as u64 + 9;
    // REPLACE's text is bounded (`MAX_REPLACE_SUBJECT`): a VARCHAR(256) by 4 KiB.
    let replaced =
        |n: usize| -> Vec<String> { vec![format!("REPLACE(v0, 'a', '{}')", "b".repeat(4096)); n] };
    let params = |n: usize| -> Vec<String> { (2..2 + n).map(|i| format!("${i}")).collect() };
    let with = |mut a: Vec<String>, b: Vec<String>| {
        a.extend(b);
        a
    };
    let p = |n: usize| -> Vec<Value> {
        std::iter::once(Value::Int(1))
            .chain((0..n).map(|_| Value::Text("x".into())))
            .collect()
    };
    // (largest accepted, its bound, smallest refused, its bound, parameters); a query's
    // outputs are columns and aggregates only.
    let cases = [
        // Stored TEXT columns: 15 fit, 16 do not.
        (
            select(cols("c", 0, 15), "w"),
            15 * text,
            select(cols("c", 0, 16), "w"),
            16 * text,
            0,
        ),
        // Computed text: REPLACE of a VARCHAR(256) by 4 KiB may take 4 MiB.
        (
            select(with(replaced(3), cols("c", 3, 3)), "w"),
            3 * computed + 3 * text,
            select(replaced(4), "w"),
            4 * computed,
            0,
        ),
        // A replacement parameter is checked to 4 KiB: REPLACE of a VARCHAR(256) by one may
        // take 4 MiB, and the parameter is no part of the row's 4 MiB of parameters.
        (
            select(
                with(vec!["REPLACE(v0, 'a', $2)".to_owned(); 3], cols("c", 0, 3)),
                "w",
            ),
            3 * computed + 3 * text,
            select(vec!["REPLACE(v0, 'a', $2)".to_owned(); 4], "w"),
            4 * computed,
            1,
        ),
        // Bytes columns: 4 MiB each.
        (
            select(cols("b", 0, 3), "y"),
            3 * bytes,
            select(cols("b", 0, 4), "y"),
            4 * bytes,
            0,
        ),
        // Parameters: 4 MiB together, however many.
        (
            select(with(cols("c", 0, 11), params(8)), "w"),
            11 * text + 8 * 9 + MAX_BOUND_BYTES as u64,
            select(with(cols("c", 0, 12), params(8)), "w"),
            12 * text + 8 * 9 + MAX_BOUND_BYTES as u64,
            8,
        ),
    ];
    for (ok, ok_bytes, refused, refused_bytes, n) in cases {
        assert!(ok_bytes <= MAX_ROW_BYTES && refused_bytes > MAX_ROW_BYTES);
        a.analyze(&tx(&ok, p(n)))
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
        let why = format!("the SELECT returns rows of up to {refused_bytes} bytes");
        limit_refusal(&a, &refused, p(n), &why);
        if ok.contains('(') || n > 0 {
            continue;
        }
        a.query(&ok, &p(n)).unwrap_or_else(|e| panic!("{ok}: {e}"));
        let e = a.query(&refused, &p(n)).unwrap_err();
        assert_eq!(e.kind, RejectKind::Limit, "{e}");
        assert!(e.to_string().contains(&why), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("at most {MAX_ROW_BYTES} bytes (16.0 MiB) a row")),
            "{e}"
        );
    }
    // A scalar subquery's output counts what it holds; ordinary rows are far below.
    a.analyze(&tx(
        &format!(
            "SELECT (SELECT c0 FROM w WHERE k = 2), {} FROM w WHERE k = $1",
            cols("c", 1, 14).join(", ")
        ),
        p(0),
    ))
    .unwrap();
    limit_refusal(
        &a,
        &format!(
            "SELECT (SELECT c0 FROM w WHERE k = 2), {} FROM w WHERE k = $1",
            cols("c", 1, 15).join(", ")
        ),
        p(0),
        &format!("returns rows of up to {} bytes", 16 * text),
    );
    // At every nesting level, and into INSERT … SELECT.
    limit_refusal(
        &a,
        &format!(
            "UPDATE o SET n = 1 WHERE k = $1 AND EXISTS (SELECT {} FROM w WHERE k = $1)",
            cols("c", 0, 16).join(", ")
        ),
        p(0),
        "a SELECT nested 1 level deep returns rows of up to",
    );
    limit_refusal(
        &a,
        &format!(
            "INSERT INTO w (k, n, {0}) SELECT k + 1, n, {0} FROM w WHERE k = $1",
            cols("c", 0, 16).join(", ")
        ),
        p(0),
        "returns rows of up to",
    );
}

/// MySQL binds a parameter again at each place its rendering uses it, and its guarded
/// subtraction writes the right side three times, so nesting multiplied a statement's `?` past
/// the 65 535 MariaDB takes (error 1390) while PostgreSQL and SQLite bind each parameter once.
#[test]
fn mysql_placeholders_are_bounded() {
    let a = wide_analyzer();
    let dense = |n: usize, levels: usize| {
        let mut e = format!(
            "(CASE WHEN n IN ({}) THEN n ELSE n END)",
            vec!["$1"; n].join(", ")
        );
        for _ in 0..levels {
            e = format!("(n - {e})");
        }
        format!("UPDATE w SET n = {e} WHERE k = 1")
    };
    // 3³ places for each `$1` in the list: 27 × 600 = 16 200 fit, 27 × 2 500 = 67 500 not.
    let ok = a.analyze(&tx(&dense(600, 3), vec![Value::Int(1)])).unwrap();
    let places = ok.typed[0].rendered(Dialect::MySql).bind_order.len();
    assert!(places > 16_000 && places <= MAX_PLACEHOLDERS, "{places}");
    limit_refusal(
        &a,
        &dense(2_500, 3),
        vec![Value::Int(1)],
        &format!(
            "binds its parameters at 67500 places in its MySQL rendering; at most {MAX_PLACEHOLDERS}"
        ),
    );
}

/// MariaDB's REPLACE takes time quadratic in its matches (64 KiB of them 1.7 s, a TEXT column's
/// MiB about six minutes, where PostgreSQL and SQLite are linear): its text is bounded at
/// `MAX_REPLACE_SUBJECT`, a VARCHAR(256), and a parameter there is checked by value.
#[test]
fn replace_takes_text_of_at_most_a_kib() {
    use chainify_sql::portable::MAX_REPLACE_SUBJECT;
    let a = wide_analyzer();
    let run = |sql: &str, params: Vec<Value>| {
        a.analyze(&tx(
            sql,
            std::iter::once(Value::Int(1)).chain(params).collect(),
        ))
    };
    run("SELECT REPLACE(v0, 'a', 'bb') FROM w WHERE k = $1", vec![]).unwrap();
    run(
        "SELECT REPLACE(SUBSTR(c0, 1, 10), 'a', 'b') FROM w WHERE k = $1",
        vec![],
    )
    .expect_err("SUBSTR keeps its text's bound");
    for (sql, params) in [
        ("SELECT REPLACE(c0, 'a', 'b') FROM w WHERE k = $1", vec![]),
        (
            "SELECT REPLACE(v0 || v1, 'a', 'b') FROM w WHERE k = $1",
            vec![],
        ),
        (
            "SELECT REPLACE(REPLACE(v0, 'a', 'bb'), 'b', 'c') FROM w WHERE k = $1",
            vec![],
        ),
    ] {
        let e = run(sql, params).unwrap_err();
        assert_eq!(e.kind, RejectKind::Limit, "{sql}: {e}");
        assert!(
            e.reason.contains("REPLACE's text may hold")
                && e.reason.contains("quadratic in its matches"),
            "{sql}: {e}"
        );
    }
    let by_value = "SELECT REPLACE($2, 'a', 'b') FROM w WHERE k = $1";
    let kib = usize::try_from(MAX_REPLACE_SUBJECT).unwrap();
    run(by_value, vec![Value::Text("a".repeat(kib))]).unwrap();
    let e = run(by_value, vec![Value::Text("a".repeat(kib + 1))]).unwrap_err();
    assert!(e.reason.contains("$2"), "{e}");
}
