//! The differential test of the portable subset (the SQLancer idea, applied to portability):
//! random statements from the accepted grammar — every accepted operator, function and
//! comparison, NULLs, unicode, extremes and boundary widths — run on PostgreSQL, MariaDB and
//! SQLite through chainify's own analysis, rendering and binding. For each case the outcome
//! (error or success), the rows affected, the keys a query returns and the table afterwards
//! must be identical on the three engines; any difference fails with the statement, its
//! parameters and each engine's text.
//!
//! The test command runs a fixed seed plus fresh random cases (`DIFFTEST_CASES` each, default
//! 400; `DIFFTEST_SEED` runs that seed alone; `DIFFTEST_DB` suffixes the databases' names so that
//! runs can go side by side); `cargo xtask difftest --cases N [--seed S]` runs longer and reports
//! cases run, refused and different.

mod common;

use chainify_core::tx::{Statement, Transaction};
use chainify_core::{Decimal, Value};
use chainify_sql::Analyzer;
use chainify_sql::render::Dialect;
use chainify_storage::conformance::{Fixture, fixture_ddl, outside};
use chainify_storage::ddl::{ReadType, select_all};
use chainify_storage::{Backend, Conn, DbErrorKind, Store, StoreOptions};
use chainify_workload::Rng;
use common::{MySqlFixture, PgFixture, SqliteFixture};

/// The tables: `d` with a column of every portable type at awkward widths, `e` for subqueries
/// (MySQL refuses a subquery on the table a statement modifies).
const SCHEMA: &str = "\
CREATE TABLE d (k BIGINT NOT NULL PRIMARY KEY, i INTEGER, b BIGINT, m DECIMAL(10,2), t VARCHAR(12), x {text}, f BOOLEAN, y {bytes}, w DECIMAL(15,2));
CREATE TABLE e (k BIGINT NOT NULL PRIMARY KEY, v BIGINT, s VARCHAR(20))";

const ROWS: &str = "\
INSERT INTO d (k, i, b, m, t, x, f, y) VALUES (1, 0, 0, 0.00, '', '', FALSE, {x:});
INSERT INTO d (k, i, b, m, t, x, f, y, w) VALUES (2, 2147483647, 9223372036854775807, 99999999.99, 'abc', 'ABC', TRUE, {x:00ff}, 9999999999999.99);
INSERT INTO d (k, i, b, m, t, x, f, y, w) VALUES (3, -2147483648, -9223372036854775807, -99999999.99, 'é東😀', 'a b ', NULL, NULL, -9999999999999.99);
INSERT INTO d (k) VALUES (4);
INSERT INTO d (k, i, b, m, t, x, f, y, w) VALUES (5, -1, -1, 0.05, 'a%_\\', 'O''Brien', FALSE, {x:41}, 6000000000000.01);
INSERT INTO d (k, i, b, m, t, x, f, y) VALUES (6, 7, 100, 1.05, 'Z', 'z', TRUE, {x:ff});
INSERT INTO d (k, i, b, m, t, x, f, y) VALUES (7, 1000, -7, -0.01, 'a ', 'a', FALSE, {x:00});
INSERT INTO d (k, i, b, m, t, x, f, y) VALUES (8, 3, 3, 3.00, 'Ab', 'ab', TRUE, {x:4142});
INSERT INTO d (k, b) VALUES (9, -9223372036854775808);
INSERT INTO d (k, m, t, x, w) VALUES (10, 12.34, 'aa', 'aaaa a', 99999999999.98);
INSERT INTO e (k, v, s) VALUES (1, 10, 'abc');
INSERT INTO e (k, v, s) VALUES (2, NULL, NULL);
INSERT INTO e (k, v, s) VALUES (3, -5, 'é');
INSERT INTO e (k, v, s) VALUES (7, 9223372036854775807, 'a ')";

async fn store<F: Fixture>(f: &F, name: &str) -> Store<F::B> {
    let backend = f.backend(name, &StoreOptions::default()).await;
    outside(&backend, &fixture_ddl(f, SCHEMA)).await;
    // Byte literals as each engine spells them (X'…' is a bit string in PostgreSQL).
    let mut rows = ROWS.to_owned();
    while let Some(at) = rows.find("{x:") {
        let end = at + rows[at..].find('}').expect("closing brace");
        let hex = rows[at + 3..end].to_owned();
        let literal = match backend.dialect() {
            Dialect::Postgres => format!("'\\x{hex}'::bytea"),
            _ => format!("X'{hex}'"),
        };
        rows.replace_range(at..=end, &literal);
    }
    outside(&backend, &rows).await;
    let store = Store::open(backend, StoreOptions::default())
        .await
        .expect("store opens");
    store.register(&["d", "e"]).await.expect("tables register");
    store
}

// ---------------------------------------------------------------------------------------------
// The generator: typed expressions of the accepted grammar.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum T {
    Int,
    Dec,
    Text,
    Bool,
    Bytes,
}

const TYPES: [T; 5] = [T::Int, T::Dec, T::Text, T::Bool, T::Bytes];

const INTS: &[i64] = &[
    0,
    1,
    -1,
    2,
    3,
    7,
    100,
    2_147_483_647,
    -2_147_483_648,
    2_147_483_648,
    4_294_967_296,
    9_223_372_036_854_775_807,
    -9_223_372_036_854_775_807,
];
const DECS: &[&str] = &[
    "0",
    "0.01",
    "-0.01",
    "1.05",
    "0.5",
    "0.005",
    "2.675",
    "99999999.99",
    "-99999999.99",
    "12345.67",
    "3",
];
const TEXTS: &[&str] = &[
    "",
    "abc",
    "ABC",
    "é東😀",
    "a b ",
    "a ",
    "O'Brien",
    "%",
    "_",
    "a%b",
    "Z",
    "z",
    "Ab",
    "ab",
    "a\\",
    "xxxxxxxxxxxxxxx",
    " a",
    "é",
];
const PATTERNS: &[&str] = &[
    "a%", "%b%", "_", "%", "a\\%%", "%é%", "A%", "", "__", "%\\_%", "a_", "%😀",
];
const BYTES: &[&[u8]] = &[b"", b"\x00\xff", b"A", b"\xff", b"\x00", b"AB"];

/// Where an expression stands: which tables its columns may come from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    /// Columns of `d` (unqualified) may appear.
    RowOfD,
    /// No columns (INSERT … VALUES).
    NoColumns,
    /// Columns of `e` (qualified) may appear: inside a subquery on `e`.
    RowOfE,
}

struct Gen {
    rng: Rng,
    params: Vec<Value>,
    /// Text-growth shapes (`x || x`, `REPLACE(x, 'a', x)`) left in this statement: they
    /// multiply lengths, so a statement gets at most one and values stay within a few KB.
    growth: u32,
}

impl Gen {
    fn pick<'a, X>(&mut self, xs: &'a [X]) -> &'a X {
        &xs[usize::try_from(self.rng.below(xs.len() as u64)).unwrap_or(0)]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.rng.below(100) < percent
    }

    fn param(&mut self, v: Value) -> String {
        self.params.push(v);
        format!("${}", self.params.len())
    }

    fn int_lit(&mut self) -> String {
        let v = *self.pick(INTS);
        if self.chance(25) {
            return self.param(Value::Int(v));
        }
        v.to_string()
    }

    fn dec_value(&mut self) -> Decimal {
        self.pick(DECS).parse().unwrap_or_else(|_| unreachable!())
    }

    fn text_lit(&mut self) -> String {
        let s = *self.pick(TEXTS);
        if self.chance(25) {
            return self.param(Value::Text(s.to_owned()));
        }
        format!("'{}'", s.replace('\'', "''"))
    }

    fn column(&mut self, t: T, ctx: Ctx) -> Option<String> {
        match ctx {
            Ctx::NoColumns => return None,
            Ctx::RowOfE => {
                return match t {
                    T::Int => Some((*self.pick(&["e.k", "e.v", "e.v"])).to_owned()),
                    T::Text => Some("e.s".to_owned()),
                    _ => None,
                };
            }
            Ctx::RowOfD => {}
        }
        Some(
            match t {
                T::Int => *self.pick(&["i", "b", "k"]),
                T::Dec => *self.pick(&["m", "w"]),
                T::Text => *self.pick(&["t", "x"]),
                T::Bool => "f",
                T::Bytes => "y",
            }
            .to_owned(),
        )
    }

    fn leaf(&mut self, t: T, ctx: Ctx) -> String {
        if self.chance(45)
            && let Some(c) = self.column(t, ctx)
        {
            return c;
        }
        if self.chance(4) {
            // A NULL parameter is bound untyped: its type comes from the context.
            if self.chance(30) {
                return self.param(Value::Null);
            }
            return "NULL".into();
        }
        match t {
            T::Int => self.int_lit(),
            T::Dec => {
                let d = self.dec_value();
                if self.chance(25) {
                    self.param(Value::Decimal(d))
                } else {
                    d.to_string()
                }
            }
            T::Text => self.text_lit(),
            T::Bool => {
                let b = self.chance(50);
                if self.chance(25) {
                    self.param(Value::Bool(b))
                } else {
                    if b { "TRUE" } else { "FALSE" }.into()
                }
            }
            T::Bytes => {
                let b = self.pick(BYTES).to_vec();
                if self.chance(40) {
                    self.param(Value::Bytes(b))
                } else {
                    let hex: String = b.iter().map(|x| format!("{x:02X}")).collect();
                    format!("X'{hex}'")
                }
            }
        }
    }

    /// An expression of type `t`; `stored` allows DECIMAL arithmetic (the value is stored).
    fn expr(&mut self, t: T, depth: u32, ctx: Ctx, stored: bool) -> String {
        if depth == 0 || self.chance(30) {
            return self.leaf(t, ctx);
        }
        let d = depth - 1;
        match t {
            T::Int => match self.rng.below(13) {
                0 => format!(
                    "({} + {})",
                    self.expr(T::Int, d, ctx, false),
                    self.expr(T::Int, d, ctx, false)
                ),
                1 => format!(
                    "({} - {})",
                    self.expr(T::Int, d, ctx, false),
                    self.expr(T::Int, d, ctx, false)
                ),
                2 => format!(
                    "({} * {})",
                    self.expr(T::Int, d, ctx, false),
                    self.expr(T::Int, d, ctx, false)
                ),
                3 => {
                    let divisor = *self.pick(&[1i64, 2, 3, 7, 1000, 2_147_483_648]);
                    let divisor = if self.chance(30) {
                        self.param(Value::Int(divisor))
                    } else {
                        divisor.to_string()
                    };
                    let op = if self.chance(50) { "/" } else { "%" };
                    format!("({} {op} {divisor})", self.expr(T::Int, d, ctx, false))
                }
                4 => format!("(-{})", self.expr(T::Int, d, ctx, false)),
                5 => format!("ABS({})", self.expr(T::Int, d, ctx, false)),
                6 => {
                    let f = *self.pick(&["LENGTH", "CHAR_LENGTH"]);
                    let inner = if self.chance(80) {
                        self.expr(T::Text, d, ctx, false)
                    } else {
                        self.expr(T::Bytes, d, ctx, false)
                    };
                    format!("{f}({inner})")
                }
                7 => format!(
                    "CASE WHEN {} THEN {} ELSE {} END",
                    self.expr(T::Bool, d, ctx, false),
                    self.expr(T::Int, d, ctx, stored),
                    self.expr(T::Int, d, ctx, stored)
                ),
                8 => format!(
                    "COALESCE({}, {})",
                    self.expr(T::Int, d, ctx, false),
                    self.expr(T::Int, d, ctx, false)
                ),
                9 => format!(
                    "NULLIF({}, {})",
                    self.expr(T::Int, d, ctx, false),
                    self.expr(T::Int, d, ctx, false)
                ),
                10 => format!(
                    "(SELECT v FROM e WHERE e.k = {})",
                    self.expr(T::Int, d, ctx, false)
                ),
                11 => match self.rng.below(3) {
                    0 => "(SELECT MAX(v) FROM e)".into(),
                    1 => format!(
                        "(SELECT COUNT(*) FROM e WHERE e.v > {})",
                        self.expr(T::Int, d, ctx, false)
                    ),
                    _ => format!(
                        "(SELECT MIN(e.k) FROM e WHERE e.s = {})",
                        self.expr(T::Text, d, ctx, false)
                    ),
                },
                _ => self.leaf(T::Int, ctx),
            },
            T::Dec => match self.rng.below(6) {
                0 if stored => format!(
                    "({} + {})",
                    self.expr(T::Dec, d, ctx, true),
                    self.expr(T::Dec, d, ctx, true)
                ),
                1 if stored => format!(
                    "({} - {})",
                    self.expr(T::Dec, d, ctx, true),
                    self.expr(T::Int, d, ctx, false)
                ),
                2 if stored => format!(
                    "({} * {})",
                    self.expr(T::Dec, d, ctx, true),
                    self.leaf(T::Int, Ctx::NoColumns)
                ),
                3 => format!("ABS({})", self.expr(T::Dec, d, ctx, false)),
                4 => format!(
                    "COALESCE({}, {})",
                    self.expr(T::Dec, d, ctx, false),
                    self.expr(T::Dec, d, ctx, false)
                ),
                5 => format!(
                    "CASE WHEN {} THEN {} ELSE {} END",
                    self.expr(T::Bool, d, ctx, false),
                    self.expr(T::Dec, d, ctx, stored),
                    self.expr(T::Dec, d, ctx, stored)
                ),
                _ => self.leaf(T::Dec, ctx),
            },
            T::Text => match self.rng.below(8) {
                0 => format!(
                    "({} || {})",
                    self.expr(T::Text, d, ctx, false),
                    self.expr(T::Text, d, ctx, false)
                ),
                1 => {
                    let start = *self.pick(&[1i64, 2, 3, 5]);
                    let start = if self.chance(30) {
                        self.param(Value::Int(start))
                    } else {
                        start.to_string()
                    };
                    if self.chance(50) {
                        let len = *self.pick(&[0i64, 1, 2, 10]);
                        format!(
                            "SUBSTR({}, {start}, {len})",
                            self.expr(T::Text, d, ctx, false)
                        )
                    } else {
                        format!("SUBSTRING({}, {start})", self.expr(T::Text, d, ctx, false))
                    }
                }
                2 => {
                    let f = *self.pick(&["TRIM", "LTRIM", "RTRIM"]);
                    format!("{f}({})", self.expr(T::Text, d, ctx, false))
                }
                3 => format!(
                    "REPLACE({}, {}, {})",
                    self.expr(T::Text, d, ctx, false),
                    self.expr(T::Text, d, ctx, false),
                    self.expr(T::Text, d, ctx, false)
                ),
                4 => format!(
                    "COALESCE({}, {})",
                    self.expr(T::Text, d, ctx, false),
                    self.expr(T::Text, d, ctx, false)
                ),
                5 => format!(
                    "CASE WHEN {} THEN {} ELSE {} END",
                    self.expr(T::Bool, d, ctx, false),
                    self.expr(T::Text, d, ctx, stored),
                    self.expr(T::Text, d, ctx, stored)
                ),
                6 => format!(
                    "(SELECT s FROM e WHERE e.k = {})",
                    self.expr(T::Int, d, ctx, false)
                ),
                _ => self.leaf(T::Text, ctx),
            },
            T::Bool => match self.rng.below(11) {
                0 | 1 => {
                    let ty = *self.pick(&TYPES);
                    let other = if ty == T::Int && self.chance(30) {
                        T::Dec
                    } else {
                        ty
                    };
                    let op = *self.pick(&["=", "<>", "<", "<=", ">", ">="]);
                    format!(
                        "({} {op} {})",
                        self.expr(ty, d, ctx, false),
                        self.expr(other, d, ctx, false)
                    )
                }
                2 => format!(
                    "({} AND {})",
                    self.expr(T::Bool, d, ctx, false),
                    self.expr(T::Bool, d, ctx, false)
                ),
                3 => format!(
                    "({} OR {})",
                    self.expr(T::Bool, d, ctx, false),
                    self.expr(T::Bool, d, ctx, false)
                ),
                4 => format!("(NOT {})", self.expr(T::Bool, d, ctx, false)),
                5 => {
                    let ty = *self.pick(&TYPES);
                    let not = if self.chance(50) { " NOT" } else { "" };
                    format!("({} IS{not} NULL)", self.expr(ty, d, ctx, false))
                }
                6 => {
                    let ty = *self.pick(&[T::Int, T::Dec, T::Text]);
                    let not = if self.chance(30) { " NOT" } else { "" };
                    format!(
                        "({}{not} BETWEEN {} AND {})",
                        self.expr(ty, d, ctx, false),
                        self.expr(ty, d, ctx, false),
                        self.expr(ty, d, ctx, false)
                    )
                }
                7 => {
                    let ty = *self.pick(&[T::Int, T::Text, T::Bytes]);
                    let not = if self.chance(30) { " NOT" } else { "" };
                    format!(
                        "({}{not} IN ({}, {}, {}))",
                        self.expr(ty, d, ctx, false),
                        self.leaf(ty, ctx),
                        self.leaf(ty, ctx),
                        self.leaf(ty, ctx)
                    )
                }
                8 => {
                    let p = *self.pick(PATTERNS);
                    let pattern = if self.chance(30) {
                        self.param(Value::Text(p.to_owned()))
                    } else {
                        format!("'{}'", p.replace('\'', "''"))
                    };
                    let not = if self.chance(30) { " NOT" } else { "" };
                    format!(
                        "({}{not} LIKE {pattern})",
                        self.expr(T::Text, d, ctx, false)
                    )
                }
                9 if ctx == Ctx::RowOfD => {
                    let not = if self.chance(30) { "NOT " } else { "" };
                    format!(
                        "({not}EXISTS (SELECT 1 FROM e WHERE e.k = d.k AND {}))",
                        self.expr(T::Bool, d, Ctx::NoColumns, false)
                    )
                }
                10 if ctx == Ctx::RowOfD => {
                    let not = if self.chance(30) { " NOT" } else { "" };
                    format!(
                        "(d.k{not} IN (SELECT e.k FROM e WHERE {}))",
                        self.expr(T::Bool, d, Ctx::NoColumns, false)
                    )
                }
                _ => self.leaf(T::Bool, ctx),
            },
            T::Bytes => match self.rng.below(3) {
                0 => format!(
                    "COALESCE({}, {})",
                    self.expr(T::Bytes, d, ctx, false),
                    self.expr(T::Bytes, d, ctx, false)
                ),
                1 => format!(
                    "CASE WHEN {} THEN {} ELSE {} END",
                    self.expr(T::Bool, d, ctx, false),
                    self.expr(T::Bytes, d, ctx, stored),
                    self.expr(T::Bytes, d, ctx, stored)
                ),
                _ => self.leaf(T::Bytes, ctx),
            },
        }
    }

    /// One statement with its parameters, and whether it is a query of keys.
    fn statement(&mut self) -> (String, Vec<Value>, Kind) {
        self.params.clear();
        let depth = 1 + u32::try_from(self.rng.below(4)).unwrap_or(0);
        let (sql, kind) = match self.rng.below(10) {
            0..=2 => (
                format!(
                    "SELECT k FROM d WHERE {} ORDER BY k",
                    self.expr(T::Bool, depth, Ctx::RowOfD, false)
                ),
                Kind::Keys,
            ),
            3..=5 => {
                let (col, t) = *self.pick(&[
                    ("i", T::Int),
                    ("b", T::Int),
                    ("m", T::Dec),
                    ("t", T::Text),
                    ("x", T::Text),
                    ("f", T::Bool),
                    ("y", T::Bytes),
                ]);
                let value = self.expr(t, depth, Ctx::RowOfD, true);
                let cond = self.expr(T::Bool, depth.min(2), Ctx::RowOfD, false);
                (
                    format!("UPDATE d SET {col} = {value} WHERE {cond}"),
                    Kind::Change,
                )
            }
            6 => (
                format!(
                    "DELETE FROM d WHERE {}",
                    self.expr(T::Bool, depth, Ctx::RowOfD, false)
                ),
                Kind::Change,
            ),
            7 => {
                let mut values = vec!["100".to_owned()];
                for t in [
                    T::Int,
                    T::Int,
                    T::Dec,
                    T::Text,
                    T::Text,
                    T::Bool,
                    T::Bytes,
                    T::Dec,
                ] {
                    values.push(self.expr(t, depth.min(2), Ctx::NoColumns, true));
                }
                (
                    format!(
                        "INSERT INTO d (k, i, b, m, t, x, f, y) VALUES ({})",
                        values.join(", ")
                    ),
                    Kind::Change,
                )
            }
            8 => {
                let col = *self.pick(&["i", "b", "m", "w", "t", "x", "f", "y"]);
                let dir = *self.pick(&["", " ASC", " DESC"]);
                let nulls = *self.pick(&["", "", " NULLS FIRST", " NULLS LAST"]);
                let limit = 1 + self.rng.below(8);
                (
                    format!("SELECT k FROM d ORDER BY {col}{dir}{nulls}, k LIMIT {limit}"),
                    Kind::Keys,
                )
            }
            _ => {
                let col = *self.pick(&["i", "b", "m", "w", "t", "x"]);
                let agg = *self.pick(&["MIN", "MAX"]);
                (
                    format!(
                        "SELECT k FROM d WHERE {col} = (SELECT {agg}({col}) FROM d AS inner_d WHERE {}) ORDER BY k",
                        self.expr(T::Bool, depth.min(2), Ctx::NoColumns, false)
                    ),
                    Kind::Keys,
                )
            }
        };
        (sql, self.params.clone(), kind)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// A query of `d`'s keys (compared in order).
    Keys,
    /// A change (compared by rows affected and the tables afterwards).
    Change,
}

// ---------------------------------------------------------------------------------------------
// Running a case.

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The statement failed (the engines' messages differ; the class must not).
    Failed,
    Keys(Vec<Vec<Value>>),
    Changed {
        rows: u64,
        tables: Vec<Vec<Vec<Value>>>,
    },
}

async fn run_case<B: Backend>(
    store: &Store<B>,
    analysis: &chainify_sql::TxAnalysis,
    params: &[Value],
    kind: Kind,
) -> (Outcome, String) {
    let dialect = store.backend().dialect();
    let rendered = analysis.typed[0].rendered(dialect);
    let bound: Vec<&Value> = rendered.bind_order.iter().map(|i| &params[*i]).collect();
    let text = rendered.sql.clone();
    for attempt in 0.. {
        let mut conn = store.backend().acquire().await.expect("a connection");
        conn.begin().await.expect("begin");
        let result = match kind {
            Kind::Keys => conn
                .query(&rendered.sql, &bound, &[ReadType::Int])
                .await
                .map(Outcome::Keys),
            Kind::Change => match conn.execute(&rendered.sql, &bound, false).await {
                Ok(rows) => {
                    let mut tables = Vec::new();
                    for t in ["d", "e"] {
                        let all = store.tables();
                        let (sql, types) = select_all(dialect, &all[t]);
                        tables.push(conn.query(&sql, &[], &types).await.expect("read back"));
                    }
                    Ok(Outcome::Changed { rows, tables })
                }
                Err(e) => Err(e),
            },
        };
        conn.rollback().await.expect("rollback");
        match result {
            Ok(o) => return (o, text),
            Err(e) if e.kind == DbErrorKind::Statement => {
                return (Outcome::Failed, format!("{text}\n    error: {}", e.message));
            }
            Err(e) if attempt < 5 => {
                eprintln!("retrying a transient error: {e}");
            }
            Err(e) => panic!("{dialect:?} failed on `{text}`: {e}"),
        }
    }
    unreachable!()
}

struct Totals {
    cases: u64,
    refused: u64,
    failed_alike: u64,
    differences: Vec<String>,
}

async fn run_seed(
    seed: u64,
    cases: u64,
    stores: &(
        Store<chainify_storage::Postgres>,
        Store<chainify_storage::MySql>,
        Store<chainify_storage::Sqlite>,
    ),
) -> Totals {
    let analyzer = Analyzer::new(stores.0.schema().expect("schema"));
    // Each engine's own catalog must give the same portable schema.
    assert_eq!(stores.1.schema().expect("schema"), *analyzer.schema());
    assert_eq!(stores.2.schema().expect("schema"), *analyzer.schema());
    let mut g = Gen {
        rng: Rng::new(seed),
        params: Vec::new(),
    };
    let mut totals = Totals {
        cases: 0,
        refused: 0,
        failed_alike: 0,
        differences: Vec::new(),
    };
    for _ in 0..cases {
        let (sql, params, kind) = g.statement();
        totals.cases += 1;
        let tx = Transaction {
            statements: vec![Statement::new(sql.clone(), params.clone())],
        };
        let analysis = match analyzer.analyze(&tx) {
            Ok(a) => a,
            Err(_) => {
                totals.refused += 1;
                continue;
            }
        };
        let (pg, pg_sql) = run_case(&stores.0, &analysis, &params, kind).await;
        let (my, my_sql) = run_case(&stores.1, &analysis, &params, kind).await;
        let (lite, lite_sql) = run_case(&stores.2, &analysis, &params, kind).await;
        if pg == my && my == lite {
            if pg == Outcome::Failed {
                totals.failed_alike += 1;
            }
            continue;
        }
        // Tables are long: show which rows differ from PostgreSQL's.
        let brief = |o: &Outcome| match (o, &pg) {
            (Outcome::Changed { rows, tables }, Outcome::Changed { tables: base, .. }) => {
                let differing: Vec<String> = tables
                    .iter()
                    .flatten()
                    .filter(|r| !base.iter().flatten().any(|b| b == *r))
                    .map(|r| format!("{r:?}"))
                    .collect();
                format!(
                    "Changed {rows} rows; rows unlike postgres's: {}",
                    differing.join(" ")
                )
            }
            (Outcome::Changed { rows, .. }, _) => format!("Changed {rows} rows"),
            (other, _) => format!("{other:?}"),
        };
        totals.differences.push(format!(
            "{sql}\n  params {params:?}\n  postgres {}\n    {pg_sql}\n  mariadb {}\n    {my_sql}\n  sqlite {}\n    {lite_sql}",
            brief(&pg),
            brief(&my),
            brief(&lite)
        ));
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portable_statements_agree_on_three_engines() {
    // DIFFTEST_DB names the databases, so that runs can go on side by side.
    let name = format!(
        "difftest{}",
        std::env::var("DIFFTEST_DB").unwrap_or_default()
    );
    let stores = (
        store(&PgFixture, &name).await,
        store(&MySqlFixture, &name).await,
        store(&SqliteFixture, &name).await,
    );
    let per_seed: u64 = std::env::var("DIFFTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    // A given seed runs alone; otherwise the fixed seed and a fresh one.
    let seeds: Vec<u64> = match std::env::var("DIFFTEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(seed) => vec![seed],
        None => vec![
            20_261_123,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64),
        ],
    };
    let started = std::time::Instant::now();
    let mut all = Vec::new();
    for seed in seeds {
        let t = run_seed(seed, per_seed, &stores).await;
        eprintln!(
            "difftest seed {seed}: {} cases, {} refused by analysis, {} failed alike, {} differences",
            t.cases,
            t.refused,
            t.failed_alike,
            t.differences.len()
        );
        assert!(
            t.refused * 2 < t.cases,
            "seed {seed}: {} of {} generated statements were refused: the generator no longer exercises the subset",
            t.refused,
            t.cases
        );
        all.extend(
            t.differences
                .into_iter()
                .map(|d| format!("seed {seed}: {d}")),
        );
    }
    eprintln!("difftest: {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        all.is_empty(),
        "{} cases differ between the engines:\n\n{}",
        all.len(),
        all.iter()
            .take(
                usize::try_from(
                    std::env::var("DIFFTEST_SHOW")
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(12)
                )
                .unwrap_or(12)
            )
            .cloned()
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}
