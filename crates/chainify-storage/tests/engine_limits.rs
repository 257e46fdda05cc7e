//! Engine limits the analysis keeps a statement below, on the three real engines. An
//! adversarial hunt found statements the analysis accepted and one engine refused alone: a
//! SELECT of 1 700 outputs (PostgreSQL: "target lists can have at most 1664 entries"), 2 100
//! ORDER BY or GROUP BY terms (SQLite: `SQLITE_MAX_COLUMN`), a GROUP BY of 160 text keys
//! (MariaDB: "Out of sort memory", failing the block at every run). A nested subtraction
//! multiplied MySQL's positional placeholders past the 65 535 MariaDB takes. Here the largest
//! statement of each shape the analysis accepts runs to the same outcome and digest on
//! PostgreSQL, MariaDB and SQLite, and the smallest one past the bound is refused by the
//! analysis (SQL007) before any engine sees it. A row of 1 000 TEXT outputs could take a
//! gigabyte, which PostgreSQL cannot send: the widest row the analysis accepts (`MAX_ROW_BYTES`,
//! counted from declared types and growth bounds) runs alike too, in a transaction and as a
//! query, over a row that holds a few MiB of real text (its bound is 15 MiB: filling it would
//! only make the test slower; the engines' own limits are far above, see
//! docs/design/portable-sql.md).
//! Run: `cargo test -p chainify-storage --test engine_limits`.

use chainify_core::tx::{Statement, Transaction};
use chainify_core::{BlockNumber, Digest, Value};
use std::time::Duration;

use chainify_sql::{Analyzer, MAX_ROW_BYTES, MAX_SELECT_ENTRIES, RejectKind};
use chainify_storage::{ExecBlock, ExecMode, Store, StoreOptions};
use chainify_testkit::conformance::storage::{Fixture, fixture_ddl, outside};
use chainify_testkit::engines::{MySqlFixture, PgFixture, SqliteFixture};

/// `w`: a key, an integer and 40 TEXT and 40 VARCHAR(256) columns (wide sort keys).
fn ddl() -> String {
    let text: Vec<String> = (0..40).map(|i| format!("c{i} {{text}}")).collect();
    let short: Vec<String> = (0..40).map(|i| format!("v{i} VARCHAR(256)")).collect();
    format!(
        "CREATE TABLE w (k BIGINT NOT NULL PRIMARY KEY, n BIGINT NOT NULL, {}, {})",
        text.join(", "),
        short.join(", ")
    )
}

fn list(item: &str, n: usize) -> String {
    vec![item; n].join(", ")
}

/// `n` columns named `prefix0…` of the four occurrences `a`, `b`, `c`, `d` of `w`.
fn keys(prefix: &str, n: usize) -> String {
    let tables = ["a", "b", "c", "d"];
    (0..n)
        .map(|i| format!("{}.{prefix}{}", tables[i / 40], i % 40))
        .collect::<Vec<_>>()
        .join(", ")
}

const JOIN4: &str =
    "FROM w a JOIN w b ON b.k = a.k JOIN w c ON c.k = a.k JOIN w d ON d.k = a.k WHERE a.k >= $1";

/// `UPDATE w SET n = …` whose MySQL rendering binds `$1` at `27 × n` places.
fn placeholders(n: usize) -> String {
    let mut e = format!("(CASE WHEN n IN ({}) THEN n ELSE n END)", list("$1", n));
    for _ in 0..3 {
        e = format!("(n - {e})");
    }
    format!("UPDATE w SET n = {e} WHERE k = 2")
}

/// The widest row accepted: 11 outputs of up to 1 MiB, one REPLACE of up to 4 MiB (a
/// VARCHAR(256), the longest text REPLACE takes, by 4 KiB), 80 bytes of `k` and 9 of framing
/// for each text value; `extra` more TEXT outputs.
fn wide_row(extra: usize) -> String {
    let text: Vec<String> = (1..12 + extra).map(|i| format!("c{i}")).collect();
    format!(
        "SELECT k, REPLACE(v0, 'é', '{}'), {} FROM w WHERE k = $1",
        "b".repeat(4096),
        text.join(", ")
    )
}

/// What `wide_row(extra)` may take in bytes, as the analysis counts it.
fn wide_row_bytes(extra: u64) -> u64 {
    80 + (4 << 20) + 9 + (11 + extra) * ((1 << 20) + 9)
}

/// The widest row a query may read (a query's outputs are columns): 15 TEXT columns and `k`.
fn wide_query(extra: usize) -> String {
    let text: Vec<String> = (0..15 + extra).map(|i| format!("c{i}")).collect();
    format!("SELECT k, {} FROM w WHERE k = $1", text.join(", "))
}

/// The largest accepted statement of each shape (a name, the SQL).
fn largest() -> Vec<(&'static str, String)> {
    let m = MAX_SELECT_ENTRIES;
    vec![
        (
            "outputs",
            format!("SELECT {} FROM w WHERE k = $1", list("k", m)),
        ),
        (
            "outputs and a hidden sort key",
            format!("SELECT {} FROM w WHERE k = $1 ORDER BY n", list("k", m - 1)),
        ),
        (
            "ORDER BY terms",
            format!("SELECT k FROM w WHERE k = $1 ORDER BY {}", list("k", m)),
        ),
        (
            "GROUP BY terms",
            format!("SELECT k FROM w WHERE k = $1 GROUP BY {}", list("k", m)),
        ),
        (
            "GROUP BY text keys",
            format!("SELECT COUNT(*) {JOIN4} GROUP BY {}", keys("c", 63)),
        ),
        (
            "ORDER BY VARCHAR(256) keys",
            format!("SELECT a.k {JOIN4} ORDER BY {}", keys("v", 63)),
        ),
        (
            "DISTINCT VARCHAR(256) outputs",
            format!("SELECT DISTINCT {} {JOIN4}", keys("v", 63)),
        ),
        ("MySQL placeholders", placeholders(600)),
        ("the widest row", wide_row(0)),
    ]
}

/// The smallest refused statement of each shape, and what the refusal says.
fn smallest_refused() -> Vec<(String, &'static str)> {
    let m = MAX_SELECT_ENTRIES;
    vec![
        (
            format!("SELECT {} FROM w WHERE k = $1", list("k", m + 1)),
            "target-list entries",
        ),
        (
            format!("SELECT {} FROM w WHERE k = $1 ORDER BY n", list("k", m)),
            "target-list entries",
        ),
        (
            format!("SELECT k FROM w WHERE k = $1 ORDER BY {}", list("k", m + 1)),
            "ORDER BY terms",
        ),
        (
            format!("SELECT k FROM w WHERE k = $1 GROUP BY {}", list("k", m + 1)),
            "GROUP BY terms",
        ),
        (
            format!("SELECT COUNT(*) {JOIN4} GROUP BY {}", keys("c", 64)),
            "sorts on keys",
        ),
        (
            format!("SELECT a.k {JOIN4} ORDER BY {}", keys("v", 64)),
            "sorts on keys",
        ),
        (
            format!("SELECT DISTINCT {} {JOIN4}", keys("v", 64)),
            "sorts on keys",
        ),
        // 64 TEXT outputs pass the row bound before their sort keys are counted.
        (
            format!("SELECT DISTINCT {} {JOIN4}", keys("c", 64)),
            "returns rows of up to",
        ),
        (wide_row(1), "returns rows of up to"),
        (wide_query(1), "returns rows of up to"),
        (
            format!(
                "SELECT {} FROM w WHERE k = $1",
                list("c0", MAX_SELECT_ENTRIES)
            ),
            "returns rows of up to",
        ),
        // What the hunt ran.
        (
            format!("SELECT COUNT(*) {JOIN4} GROUP BY {}", keys("c", 160)),
            "sorts on keys",
        ),
        (
            format!("SELECT {} FROM w WHERE k = $1", list("k", 1_700)),
            "target-list entries",
        ),
        (placeholders(2_500), "places in its MySQL rendering"),
    ]
}

/// The most deeply nested statement `shape(depth)` the analysis accepts: SQLite bounds an
/// expression's height (`SQLITE_MAX_EXPR_DEPTH`, 1 000), and its rendering wraps each checked
/// operation in a few more levels.
fn deepest(analyzer: &Analyzer, shape: impl Fn(usize) -> String) -> String {
    (1..=chainify_sql::MAX_DEPTH)
        .rev()
        .map(&shape)
        .find(|sql| {
            analyzer
                .analyze(&Transaction {
                    statements: vec![Statement::new(sql.clone(), vec![Value::Int(1)])],
                })
                .is_ok()
        })
        .expect("some depth is accepted")
}

/// A deposit beside the statement, so the block has an effect to digest.
fn deposit() -> Statement {
    Statement::new(
        "UPDATE w SET n = n + $2 WHERE k = $1",
        vec![Value::Int(1), Value::Int(7)],
    )
    .expect_rows(1)
}

/// What [`run`] gives: each block's success bitmap and digest, and the widest query's answer.
type Outcomes = (Vec<(Vec<bool>, Digest)>, Vec<Vec<Value>>);

/// Runs every largest statement, each in a block of its own beside a deposit, then the widest
/// query; gives each block's success bitmap and digest, and the query's rows.
async fn run<F: Fixture>(f: &F, test: &str) -> Outcomes {
    let options = StoreOptions::default();
    let backend = f.backend(test, &options).await;
    outside(&backend, &fixture_ddl(f, &ddl())).await;
    let long = "é".repeat(200);
    // 1 MiB in `c0` and in `c1`. The widest row's REPLACE may make 4 MiB of `c0` but finds
    // only its 200 `é` (MariaDB's REPLACE is quadratic in the matches: 4 minutes or more for a
    // MiB of them).
    let c0 = format!("{long}{}", "a".repeat((1 << 20) - long.len()));
    let c1 = "b".repeat(1 << 20);
    outside(
        &backend,
        &format!(
            "INSERT INTO w (k, n, c0, c1, v0) VALUES (1, 1, '{c0}', '{c1}', '{long}'), (2, 2, 'b', 'b', 'b')"
        ),
    )
    .await;
    let store = Store::open(backend, options).await.expect("store opens");
    store.register(&["w"]).await.expect("w registers");
    let analyzer = Analyzer::new(store.schema().expect("schema")).with_nested_scans(4);
    let mut outcomes = Vec::new();
    let mut statements = largest();
    statements.push((
        "deepest checked arithmetic",
        deepest(&analyzer, |d| {
            let mut e = "n".to_owned();
            for _ in 0..d {
                e = format!("(ABS({e}) - n)");
            }
            format!("UPDATE w SET n = {e} WHERE k = $1")
        }),
    ));
    statements.push((
        "deepest nesting",
        deepest(&analyzer, |d| {
            let mut e = "n".to_owned();
            for _ in 0..d {
                e = format!("COALESCE({e}, 1)");
            }
            format!("UPDATE w SET n = {e} WHERE k = $1")
        }),
    ));
    for (number, (name, sql)) in statements.into_iter().enumerate() {
        let txs = vec![
            Some(Transaction {
                statements: vec![Statement::new(sql, vec![Value::Int(1)])],
            }),
            Some(Transaction {
                statements: vec![deposit()],
            }),
        ];
        let (b, rejected) = ExecBlock::analyze(BlockNumber(number as u64), txs, &analyzer);
        assert!(rejected.is_empty(), "{test}: {name}: {rejected:?}");
        let o = store
            .execute_block(&b, ExecMode::Parallel(4))
            .await
            .unwrap_or_else(|e| panic!("{test}: {name}: the block failed: {e}"));
        assert_eq!(
            o.success,
            vec![true, true],
            "{test}: {name}: {:?}",
            o.failures
        );
        outcomes.push((o.success, o.digest));
    }
    let plan = analyzer
        .query(&wide_query(0), &[Value::Int(1)])
        .unwrap_or_else(|e| panic!("{test}: the widest query: {e}"));
    let answer = store
        .read_snapshot(Duration::from_secs(60))
        .await
        .expect("a snapshot")
        .query_rows(&plan, &[Value::Int(1)])
        .await
        .unwrap_or_else(|e| panic!("{test}: the widest query failed: {e}"));
    let [row] = answer.rows.as_slice() else {
        panic!("{test}: {} rows", answer.rows.len());
    };
    assert_eq!(row[1], Value::Text(c0), "{test}");
    assert_eq!(row[2], Value::Text(c1), "{test}");
    (outcomes, answer.rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_accepted_statements_run_alike_on_every_engine() {
    let pg = run(&PgFixture, "limits_pg").await;
    let my = run(&MySqlFixture, "limits_my").await;
    let lite = run(&SqliteFixture, "limits_lite").await;
    assert_eq!(pg.0, my.0, "PostgreSQL and MariaDB");
    assert_eq!(pg.0, lite.0, "PostgreSQL and SQLite");
    // Megabytes of text: compared without printing them.
    assert!(
        pg.1 == my.1,
        "the widest query: PostgreSQL and MariaDB differ"
    );
    assert!(
        pg.1 == lite.1,
        "the widest query: PostgreSQL and SQLite differ"
    );
}

/// The widest row's bound is as close to `MAX_ROW_BYTES` as a TEXT output allows.
#[test]
fn the_widest_row_is_one_text_output_below_the_bound() {
    assert!(wide_row_bytes(0) <= MAX_ROW_BYTES);
    assert!(wide_row_bytes(1) > MAX_ROW_BYTES);
    let schema = chainify_sql::Schema::from_sql(&ddl().replace("{text}", "TEXT")).expect("schema");
    let analyzer = Analyzer::new(schema);
    let e = analyzer
        .analyze(&Transaction {
            statements: vec![Statement::new(wide_row(1), vec![Value::Int(1)])],
        })
        .unwrap_err();
    assert!(
        e.reason.contains(&format!(
            "returns rows of up to {} bytes",
            wide_row_bytes(1)
        )),
        "{e}"
    );
}

/// The analysis refuses the smallest statement past each bound, so no engine is given it.
#[test]
fn the_smallest_refused_statements_never_reach_an_engine() {
    let schema = chainify_sql::Schema::from_sql(&ddl().replace("{text}", "TEXT")).expect("schema");
    let analyzer = Analyzer::new(schema).with_nested_scans(4);
    for (sql, why) in smallest_refused() {
        let txs = vec![
            Some(Transaction {
                statements: vec![Statement::new(sql.clone(), vec![Value::Int(1)])],
            }),
            Some(Transaction {
                statements: vec![deposit()],
            }),
        ];
        let (b, rejected) = ExecBlock::analyze(BlockNumber(0), txs, &analyzer);
        let [(0, e)] = rejected.as_slice() else {
            panic!("{}: {rejected:?}", &sql[..60]);
        };
        assert_eq!(e.kind, RejectKind::Limit, "{e}");
        assert!(e.reason.contains(why), "{e}");
        assert_eq!(b.txs.iter().filter(|t| t.is_some()).count(), 1);
    }
}
