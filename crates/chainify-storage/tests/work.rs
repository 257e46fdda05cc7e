//! The analysis's work bound holds on the real engines: every join and subquery shape it accepts
//! for a transaction makes PostgreSQL, MariaDB and SQLite do work linear in the tables' size,
//! counted by the engines themselves (rows through PostgreSQL's plan nodes, MariaDB's handler
//! reads, SQLite's virtual-machine steps) at n and 4n rows. The shapes it refuses are measured
//! too, to show the count would catch quadratic work.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use chainify_core::Value;
use chainify_sql::render::Dialect;
use chainify_sql::{Analyzer, Schema};
use chainify_storage::ddl::ReadType;
use chainify_storage::{Backend, Conn, StoreOptions};
use chainify_testkit::conformance::storage::Fixture;
use chainify_testkit::engines::{MySqlFixture, PgFixture, SqliteFixture};

const DDL: &str = "CREATE TABLE t (k BIGINT NOT NULL PRIMARY KEY, v BIGINT NOT NULL);
CREATE TABLE e (k BIGINT NOT NULL PRIMARY KEY, v BIGINT NOT NULL);
CREATE TABLE n (k INTEGER NOT NULL PRIMARY KEY, v BIGINT NOT NULL);
CREATE TABLE w (k BIGINT NOT NULL PRIMARY KEY, u BIGINT NOT NULL UNIQUE, v BIGINT NOT NULL)";

/// Rows at the small size; the large one has four times as many.
const N: i64 = 300;

/// Join and subquery shapes over `t` and `e`, keyed and not, as transactions would write them.
fn shapes() -> Vec<String> {
    let mut out = Vec::new();
    let cols = ["k", "v"];
    for (a, b) in [("t", "t"), ("t", "e")] {
        for c1 in cols {
            for c2 in cols {
                out.push(format!(
                    "SELECT COUNT(*) FROM {a} x JOIN {b} y ON y.{c1} = x.{c2}"
                ));
                out.push(format!(
                    "SELECT COUNT(y.k) FROM {a} x LEFT JOIN {b} y ON y.{c1} = x.{c2}"
                ));
                out.push(format!(
                    "SELECT COUNT(*) FROM {a} x WHERE EXISTS (SELECT 1 FROM {b} y WHERE y.{c1} = x.{c2})"
                ));
                out.push(format!(
                    "SELECT COUNT(*) FROM {a} x WHERE x.{c2} IN (SELECT y.{c1} FROM {b} y)"
                ));
                out.push(format!(
                    "UPDATE e SET v = (SELECT COUNT(*) FROM t WHERE t.{c1} = e.{c2})"
                ));
                out.push(format!(
                    "DELETE FROM e WHERE EXISTS (SELECT 1 FROM t WHERE t.{c1} = e.{c2})"
                ));
                // MariaDB runs IN (SELECT …) per row in an UPDATE or DELETE (found by the
                // review), PostgreSQL outside a WHERE's conjunction and for NOT IN.
                for inner in ["t", "n"] {
                    out.push(format!(
                        "UPDATE e SET v = 0 WHERE e.{c2} IN (SELECT {inner}.{c1} FROM {inner})"
                    ));
                    out.push(format!(
                        "DELETE FROM e WHERE e.{c2} NOT IN (SELECT {inner}.{c1} FROM {inner})"
                    ));
                    out.push(format!(
                        "UPDATE e SET v = CASE WHEN e.{c2} IN (SELECT {inner}.{c1} FROM {inner}) THEN 1 ELSE 0 END"
                    ));
                }
                // Correlated or grouped IN (SELECT …) is no lookup (the second review).
                out.push(format!(
                    "SELECT COUNT(*) FROM {a} x WHERE x.{c2} IN (SELECT y.k FROM {b} y WHERE y.{c1} <> x.k)"
                ));
                out.push(format!(
                    "DELETE FROM e WHERE e.{c2} IN (SELECT t.k FROM t GROUP BY t.k HAVING COUNT(*) > {})",
                    if c1 == "k" { 0 } else { 1 }
                ));
                // A UNIQUE column is a lookup like the key.
                let wc = if c1 == "k" { "u" } else { "v" };
                out.push(format!(
                    "SELECT COUNT(*) FROM {a} x JOIN w y ON y.{wc} = x.{c2}"
                ));
                out.push(format!(
                    "DELETE FROM e WHERE EXISTS (SELECT 1 FROM w WHERE w.{wc} = e.{c2})"
                ));
                for c3 in cols {
                    out.push(format!(
                        "SELECT COUNT(*) FROM {a} x JOIN {b} y ON y.{c1} = x.{c2} JOIN t z ON z.k = y.{c3}"
                    ));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The rows of every table at `n` rows each: `v` (and `w.u`) a permutation of the keys, so every join
/// on it finds one row.
async fn load<B: Backend>(backend: &B, n: i64) {
    let mut conn = backend.acquire().await.expect("conn");
    for table in ["t", "e", "n", "w"] {
        conn.batch(&format!("DELETE FROM {table}"))
            .await
            .expect("empty");
        let (columns, rows): (&str, Vec<String>) = if table == "w" {
            let rows = (0..n)
                .map(|k| format!("({k}, {}, {})", (k * 11 + 5) % n, (k * 7 + 3) % n))
                .collect();
            ("k, u, v", rows)
        } else {
            let rows = (0..n)
                .map(|k| format!("({k}, {})", (k * 7 + 3) % n))
                .collect();
            ("k, v", rows)
        };
        for chunk in rows.chunks(500) {
            conn.batch(&format!(
                "INSERT INTO {table} ({columns}) VALUES {}",
                chunk.join(", ")
            ))
            .await
            .expect("load");
        }
    }
    if backend.dialect() == Dialect::Postgres {
        conn.batch("ANALYZE").await.expect("statistics");
    } else if backend.dialect() == Dialect::MySql {
        conn.batch("ANALYZE TABLE t, e, n")
            .await
            .expect("statistics");
    }
}

/// The work the engine counts for `sql` (changes rolled back).
async fn work<B: Backend>(backend: &B, sqlite: Option<&rusqlite::Connection>, sql: &str) -> u64 {
    let mut conn = backend.acquire().await.expect("conn");
    match backend.dialect() {
        Dialect::Postgres => {
            conn.begin().await.expect("begin");
            let lines = conn
                .query(
                    &format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {sql}"),
                    &[],
                    &[ReadType::Text],
                )
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            conn.rollback().await.expect("rollback");
            rows_through_plan(lines.iter().map(|r| match &r[0] {
                Value::Text(t) => t.as_str(),
                other => panic!("{other:?}"),
            }))
        }
        Dialect::MySql => {
            let reads = "SELECT CAST(SUM(VARIABLE_VALUE) AS SIGNED) FROM information_schema.SESSION_STATUS \
                         WHERE VARIABLE_NAME LIKE 'HANDLER_READ%'";
            let count = |rows: Vec<Vec<Value>>| match rows[0][0] {
                Value::Int(n) => u64::try_from(n).expect("a count"),
                ref other => panic!("{other:?}"),
            };
            conn.begin().await.expect("begin");
            let before = count(
                conn.query(reads, &[], &[ReadType::Int])
                    .await
                    .expect("status"),
            );
            conn.execute(sql, &[], sql.starts_with("SELECT"))
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            let after = count(
                conn.query(reads, &[], &[ReadType::Int])
                    .await
                    .expect("status"),
            );
            conn.rollback().await.expect("rollback");
            after - before
        }
        Dialect::Sqlite => {
            let c = sqlite.expect("a direct connection");
            c.execute_batch("BEGIN").expect("begin");
            let mut stmt = c.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
            let mut rows = stmt.raw_query();
            while rows.next().expect("step").is_some() {}
            drop(rows);
            let steps = stmt.get_status(rusqlite::StatementStatus::VmStep);
            drop(stmt);
            c.execute_batch("ROLLBACK").expect("rollback");
            u64::try_from(steps).expect("steps")
        }
    }
}

/// Σ (rows out + rows removed) × loops over the nodes of a PostgreSQL `EXPLAIN ANALYZE`.
fn rows_through_plan<'a>(lines: impl Iterator<Item = &'a str>) -> u64 {
    let number = |line: &str, key: &str| -> Option<u64> {
        let at = line.find(key)? + key.len();
        let digits: String = line[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    let mut total = 0;
    let mut loops = 1;
    for line in lines {
        if let (Some(rows), Some(l)) = (number(line, "rows="), number(line, "loops=")) {
            loops = l;
            total += (rows + 1) * l;
        } else if let Some(removed) = number(line, "Rows Removed by Filter: ")
            .or_else(|| number(line, "Rows Removed by Join Filter: "))
        {
            total += removed * loops;
        }
    }
    total
}

async fn bound_holds<F: Fixture>(f: &F, test: &str) {
    let backend = f.backend(test, &StoreOptions::default()).await;
    let mut conn = backend.acquire().await.expect("conn");
    for ddl in DDL.split(";\n") {
        conn.batch(ddl).await.expect("tables");
    }
    drop(conn);
    let sqlite = (backend.dialect() == Dialect::Sqlite)
        .then(|| rusqlite::Connection::open(SqliteFixture::path(test)).expect("open"));
    let schema = Schema::from_sql(DDL).expect("schema");
    let strict = Analyzer::new(schema.clone());
    let any = Analyzer::new(schema).with_nested_scans(3);
    let mut measured = Vec::new();
    for sql in shapes() {
        let tx = chainify_core::tx::Transaction {
            statements: vec![chainify_core::tx::Statement::new(&sql, vec![])],
        };
        let accepted = strict.analyze(&tx).is_ok();
        let analysis = any.analyze(&tx).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let degree = analysis.typed[0].work.degree;
        // Cubic shapes are left out: they are refused, and 10^9 rows take a while.
        if accepted || degree == 2 {
            let rendered = analysis.typed[0].rendered(backend.dialect()).sql.clone();
            measured.push((sql, accepted, rendered));
        }
    }
    let mut small = Vec::new();
    load(&backend, N).await;
    for (_, _, rendered) in &measured {
        small.push(work(&backend, sqlite.as_ref(), rendered).await);
    }
    load(&backend, 4 * N).await;
    let mut superlinear = 0;
    for ((sql, accepted, rendered), small) in measured.iter().zip(small) {
        let large = work(&backend, sqlite.as_ref(), rendered).await;
        let ratio = large as f64 / small.max(1) as f64;
        eprintln!(
            "{:?} {accepted:5} {small:>9} {large:>10} {ratio:6.2} {sql}",
            backend.dialect()
        );
        if *accepted {
            // Linear, with room for a sort's logarithm and a constant.
            assert!(
                large <= 6 * small + 1_000,
                "{sql} was accepted but its work grew from {small} to {large} at four times the rows on {:?}",
                backend.dialect()
            );
        } else if ratio > 10.0 {
            superlinear += 1;
        }
    }
    // The count sees quadratic work where the engine does it (at least one refused shape).
    assert!(
        superlinear > 0,
        "no refused shape grew faster than linear on {:?}",
        backend.dialect()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_shapes_are_linear_on_postgres() {
    bound_holds(&PgFixture, "work_bound").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_shapes_are_linear_on_mariadb() {
    bound_holds(&MySqlFixture, "work_bound").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_shapes_are_linear_on_sqlite() {
    bound_holds(&SqliteFixture, "work_bound").await;
}
