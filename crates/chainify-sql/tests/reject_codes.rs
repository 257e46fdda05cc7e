//! Rejection kinds and their stable codes: a representative rejection of every kind is classified
//! as documented, and the codes are distinct and equal to the table in
//! `docs/design/portable-sql.md` (a renamed or reused code fails here).
#![allow(clippy::unwrap_used)]

use chainify_core::Value;
use chainify_core::tx::{Statement, Transaction};
use chainify_sql::{AnalysisError, Analyzer, MAX_SQL_LEN, RejectKind, Schema};

fn analyzer() -> Analyzer {
    Analyzer::new(
        Schema::from_sql(
            "CREATE TABLE checking (custid BIGINT PRIMARY KEY, bal BIGINT NOT NULL, note TEXT);
             CREATE TABLE accounts (custid BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL);",
        )
        .unwrap(),
    )
}

fn rejected(a: &Analyzer, sql: &str, params: Vec<Value>) -> AnalysisError {
    a.analyze(&Transaction {
        statements: vec![Statement::new(sql, params)],
    })
    .unwrap_err()
}

/// The codes, as documented; changing one is a breaking change of the contract.
const TABLE: [(RejectKind, &str); 10] = [
    (RejectKind::Syntax, "SQL001"),
    (RejectKind::Unsupported, "SQL002"),
    (RejectKind::UnknownName, "SQL003"),
    (RejectKind::Type, "SQL004"),
    (RejectKind::Parameter, "SQL005"),
    (RejectKind::Nondeterministic, "SQL006"),
    (RejectKind::Limit, "SQL007"),
    (RejectKind::Statement, "SQL008"),
    (RejectKind::Internal, "SQL009"),
    (RejectKind::Unavailable, "SQL010"),
];

#[test]
fn codes_are_distinct_and_match_the_documented_table() {
    assert_eq!(RejectKind::ALL.len(), TABLE.len());
    for (kind, (expected, code)) in RejectKind::ALL.iter().zip(TABLE) {
        assert_eq!(*kind, expected);
        assert_eq!(kind.code(), code, "{kind:?}");
        assert_eq!(kind.to_string(), code);
    }
    let mut codes: Vec<&str> = RejectKind::ALL.iter().map(RejectKind::code).collect();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), RejectKind::ALL.len(), "codes must be distinct");

    // The table in the design note: one row `| `SQLnnn` | Kind | … |` per code, in order.
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/design/portable-sql.md"
    ))
    .unwrap();
    let documented: Vec<(String, String)> = doc
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let code = cells.get(1)?.strip_prefix("`SQL")?.strip_suffix('`')?;
            Some((
                format!("SQL{code}"),
                cells.get(2)?.trim_matches('`').to_owned(),
            ))
        })
        .collect();
    let expected: Vec<(String, String)> = TABLE
        .iter()
        .map(|(k, c)| ((*c).to_owned(), format!("{k:?}")))
        .collect();
    assert_eq!(documented, expected);
}

#[test]
fn every_kind_has_a_representative_rejection() {
    let a = analyzer();
    let cases: &[(&str, Vec<Value>, RejectKind)] = &[
        // Syntax
        ("UPDATE (", vec![], RejectKind::Syntax),
        ("SELECT 1; SELECT 2", vec![], RejectKind::Syntax),
        ("", vec![], RejectKind::Syntax),
        (
            "UPDATE checking SET bal = 1 WHERE custid = 1\u{1} OR TRUE",
            vec![],
            RejectKind::Syntax,
        ),
        // Unsupported
        (
            "SELECT CAST(bal AS TEXT) FROM checking WHERE custid = 1",
            vec![],
            RejectKind::Unsupported,
        ),
        (
            "UPDATE checking SET bal = 1 WHERE custid = 1 RETURNING bal",
            vec![],
            RejectKind::Unsupported,
        ),
        (
            "SELECT custid FROM checking UNION SELECT custid FROM accounts",
            vec![],
            RejectKind::Unsupported,
        ),
        // UnknownName
        ("SELECT 1 FROM nope", vec![], RejectKind::UnknownName),
        (
            "SELECT nope FROM checking WHERE custid = 1",
            vec![],
            RejectKind::UnknownName,
        ),
        (
            "SELECT custid FROM checking c, accounts a WHERE a.custid = 1 AND c.custid = 1",
            vec![],
            RejectKind::UnknownName,
        ),
        // Type
        (
            "SELECT bal FROM checking WHERE custid = 'a'",
            vec![],
            RejectKind::Type,
        ),
        (
            "UPDATE checking SET bal = 1.5 WHERE custid = 1",
            vec![],
            RejectKind::Type,
        ),
        // Parameter
        (
            "SELECT bal FROM checking WHERE custid = $2",
            vec![Value::Int(1)],
            RejectKind::Parameter,
        ),
        (
            "SELECT bal FROM checking WHERE custid = ?",
            vec![],
            RejectKind::Parameter,
        ),
        (
            "UPDATE checking SET bal = bal / $2 WHERE custid = $1",
            vec![Value::Int(1), Value::Int(0)],
            RejectKind::Parameter,
        ),
        // Nondeterministic
        (
            "UPDATE checking SET bal = NOW() WHERE custid = 1",
            vec![],
            RejectKind::Nondeterministic,
        ),
        (
            "SELECT custid FROM checking LIMIT 1",
            vec![],
            RejectKind::Nondeterministic,
        ),
        (
            "SELECT CASE bal WHEN NULL THEN 1 ELSE 2 END FROM checking WHERE custid = 1",
            vec![],
            RejectKind::Nondeterministic,
        ),
        // Limit
        (
            "UPDATE checking SET note = REPLACE(REPLACE(note, 'a', note), 'b', note) WHERE custid = 1",
            vec![],
            RejectKind::Limit,
        ),
        // Statement
        (
            "CREATE TABLE t (a INT PRIMARY KEY)",
            vec![],
            RejectKind::Statement,
        ),
        ("BEGIN", vec![], RejectKind::Statement),
    ];
    let mut seen = Vec::new();
    for (sql, params, kind) in cases {
        let e = rejected(&a, sql, params.clone());
        assert_eq!(e.kind, *kind, "{sql}: {e}");
        assert_eq!(e.code(), kind.code());
        seen.push(*kind);
    }

    // Limit: the text's length, and the nesting depth (the parser's recursion limit too).
    let long = format!(
        "SELECT bal FROM checking WHERE custid = 1{}",
        " ".repeat(MAX_SQL_LEN)
    );
    assert_eq!(rejected(&a, &long, vec![]).kind, RejectKind::Limit);
    let deep = format!(
        "SELECT bal FROM checking WHERE custid = {}1{}",
        "(".repeat(300),
        ")".repeat(300)
    );
    let e = a.plan(&deep).unwrap_err();
    assert_eq!(e.kind(), RejectKind::Limit, "{e}");
    assert_eq!(e.code(), "SQL007");

    // A transaction without statements is malformed as a whole (statement 0).
    let e = a.analyze(&Transaction { statements: vec![] }).unwrap_err();
    assert_eq!((e.statement, e.kind), (0, RejectKind::Syntax));

    // A query that is not a SELECT.
    let e = a
        .query("UPDATE checking SET bal = 1 WHERE custid = 1", &[])
        .unwrap_err();
    assert_eq!(e.kind, RejectKind::Statement, "{e}");

    // An analysis thread that cannot start: its stack cannot be mapped.
    let e = Analyzer::new(a.schema().clone())
        .with_analysis_stack(1 << 60)
        .analyze(&Transaction {
            statements: vec![Statement::new(
                "UPDATE checking SET bal = 1 WHERE custid = 1",
                vec![],
            )],
        })
        .unwrap_err();
    assert_eq!(
        (e.kind, e.code()),
        (RejectKind::Unavailable, "SQL010"),
        "{e}"
    );
    seen.push(e.kind);

    // Every kind but Internal (the analysis panicking, which no statement should provoke)
    // has a representative above.
    for kind in RejectKind::ALL {
        assert!(
            seen.contains(&kind) || kind == RejectKind::Internal,
            "no representative of {kind:?}"
        );
    }
}

/// The code travels beside the text; the text (and its Display) is unchanged.
#[test]
fn the_code_is_beside_an_unchanged_text() {
    let a = analyzer();
    let e = rejected(
        &a,
        "UPDATE checking SET bal = NOW() WHERE custid = 1",
        vec![],
    );
    assert_eq!(
        e.to_string(),
        "statement 1: NOW() reads the clock, which differs between organizations"
    );
    assert_eq!(
        e.reason,
        "NOW() reads the clock, which differs between organizations"
    );
    assert_eq!(e.code(), "SQL006");
    let r = a
        .plan("UPDATE checking SET bal = NOW() WHERE custid = 1")
        .unwrap_err();
    assert_eq!(r.to_string(), e.reason);
    assert_eq!(r.reason(), e.reason);
    assert_eq!(r.kind(), e.kind);
}

/// Clients choose the texts the plan cache keeps: a text refused for its length or a control
/// character is never kept, and the texts kept stay within the cache's bytes however many
/// distinct long ones arrive (an audit grew a node by 632 MB with 150 refused 4 MiB texts).
#[test]
fn the_plan_cache_keeps_no_refused_text_and_stays_within_its_bytes() {
    // A budget of 16 texts of this length.
    let budget = 16 * MAX_SQL_LEN * chainify_sql::PLAN_BYTES_PER_TEXT_BYTE;
    let a = analyzer().with_plan_cache_bytes(budget);
    for i in 0..20 {
        let huge = format!(
            "SELECT bal FROM checking WHERE custid = {i} {}",
            " ".repeat(4 << 20)
        );
        assert_eq!(rejected(&a, &huge, vec![]).kind, RejectKind::Limit);
        let control = format!("SELECT bal FROM checking WHERE custid = {i}\u{0}");
        assert_eq!(rejected(&a, &control, vec![]).kind, RejectKind::Syntax);
    }
    assert_eq!(a.cached(), (0, 0), "nothing refused before parsing is kept");
    // Distinct texts just under the length limit, planned or refused by the parser alike.
    let padding = " ".repeat(MAX_SQL_LEN - 100);
    let mut most = 0;
    for i in 0..40 {
        let sql = if i % 2 == 0 {
            format!("SELECT bal FROM checking WHERE custid = {i}{padding}")
        } else {
            format!("SELECT bal FROM checking WHERE custid = = {i}{padding}")
        };
        let _ = a.plan(&sql);
        let (texts, bytes) = a.cached();
        assert!(bytes <= budget, "{texts} texts, {bytes} bytes kept");
        most = most.max(texts);
    }
    assert!(most >= 15, "the cache still keeps texts: at most {most}");
}

/// `analyze_cached` answers only what takes lookups: a new text, or a known text with new
/// parameter types (typing and rendering one costs ~0.2 ms a statement, and a transaction may
/// hold hundreds), is a miss; once analysed, the same answer as `analyze`, refusals included.
#[test]
fn a_cached_only_analysis_never_parses_or_types() {
    let a = analyzer();
    let sql = "UPDATE checking SET bal = bal + $1 WHERE custid = $2";
    let tx = |params: Vec<Value>| Transaction {
        statements: vec![Statement::new(sql, params)],
    };
    let ints = tx(vec![Value::Int(1), Value::Int(2)]);
    assert!(a.analyze_cached(&ints).is_none(), "a new text");
    assert_eq!(a.cached().0, 0, "a miss parses nothing");
    let full = a.analyze(&ints).unwrap();
    let cached = a.analyze_cached(&ints).expect("known").unwrap();
    assert_eq!(cached.rwset, full.rwset);
    let nulls = tx(vec![Value::Null, Value::Int(2)]);
    assert!(a.analyze_cached(&nulls).is_none(), "new parameter types");
    let typed = a.analyze(&nulls).map(|t| t.rwset);
    let again = a.analyze_cached(&nulls).expect("known").map(|t| t.rwset);
    assert_eq!(again, typed);
    // A refusal is answered from the cache too, with the same reason.
    let bad = Transaction {
        statements: vec![Statement::new("UPDATE checking SET bal = = 1", vec![])],
    };
    let refused = a.analyze(&bad).unwrap_err();
    assert_eq!(a.analyze_cached(&bad).expect("known").unwrap_err(), refused);
    let long = Transaction {
        statements: vec![Statement::new(" ".repeat(MAX_SQL_LEN + 1), vec![])],
    };
    assert!(a.analyze_cached(&long).expect("refused unread").is_err());
    // Queries alike.
    let query = "SELECT bal FROM checking WHERE custid = $1";
    assert!(a.query_cached(query, &[Value::Int(1)]).is_none());
    a.query(query, &[Value::Int(1)]).unwrap();
    assert!(
        a.query_cached(query, &[Value::Int(1)])
            .expect("known")
            .is_ok()
    );
    assert!(a.query_cached(query, &[Value::Null]).is_none());
}

/// The typed renderings a plan caches count against the budget as they are made: nested
/// arithmetic renders to far more than its text (a review kept 856 MB with 2 000 such
/// statements typed for 16 signatures each, while their texts were 171 KB).
#[test]
fn typed_renderings_count_against_the_plan_cache() {
    let a = analyzer();
    let sum: Vec<String> = (2..=12).map(|i| format!("${i}")).collect();
    let sql = format!(
        "UPDATE checking SET bal = bal + {} WHERE custid = $1",
        sum.join(" + ")
    );
    let tx = |nulls: u32| Transaction {
        statements: vec![Statement::new(
            sql.as_str(),
            std::iter::once(Value::Int(1))
                .chain((0..11).map(|i| {
                    if nulls & (1 << i) != 0 {
                        Value::Null
                    } else {
                        Value::Int(1)
                    }
                }))
                .collect(),
        )],
    };
    let _ = a.analyze(&tx(0));
    let (_, planned) = a.cached();
    for nulls in 1..16 {
        let _ = a.analyze(&tx(nulls));
    }
    let (texts, typed) = a.cached();
    assert_eq!(texts, 1);
    assert!(
        typed > planned,
        "{planned} bytes before the typings, {typed} after"
    );
    // A budget that holds a few such plans keeps no more, however many arrive.
    let budget = 8 * (typed / 16) + sql.len() * chainify_sql::PLAN_BYTES_PER_TEXT_BYTE;
    let small = analyzer().with_plan_cache_bytes(budget);
    let mut most = 0;
    for i in 0..40 {
        let distinct = sql.replace("bal + ", &format!("bal + {i} + "));
        for nulls in 0..4 {
            let mut t = tx(nulls);
            t.statements[0].sql = distinct.clone();
            let _ = small.analyze(&t);
            assert!(
                small.cached().1 <= budget,
                "{:?} over {budget}",
                small.cached()
            );
            most = most.max(small.cached().1);
        }
    }
    assert!(
        most > budget / 2,
        "the typings were counted: at most {most} of {budget}"
    );
}
