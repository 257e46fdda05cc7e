//! Foreign-key actions, differentially: random schemas of a few tables whose keys CASCADE, SET
//! NULL, SET DEFAULT (refused at registration), RESTRICT or only check, random rows, and random
//! DELETEs and key UPDATEs,
//! run through registration, analysis, execution and the digest on PostgreSQL and SQLite (MariaDB
//! refuses every modifying action). For each schema registration accepts, both engines must
//! commit or fail alike, reach the same rows, digests and state, and every row a statement
//! changes, its cascades included, must lie inside the analysed write set. Schemas registration
//! refuses are counted, not run: refusing is the safe side.
//!
//! `CHAINIFY_CASCADE_CASES` sets the number of schemas a seed (default 300), and
//! `CHAINIFY_CASCADE_SEED` one seed to run instead of the two default ones. With the rule on keys
//! that only check disabled, the default run finds the split it prevents (schema 175 of seed
//! 2211291). The split of a table two keys change, one by updating it, is rarer here (it takes a
//! SET NULL that fails, beside a CASCADE to the same row): an earlier version of
//! this generator found it at schema 5 of seed 1; seeds 1 to 7 of this one, 300 schemas each, do
//! not. The unit tests in `chainify-sql`'s schema.rs and the registration case of the
//! conformance suite hold that rule.

use std::collections::{BTreeMap, BTreeSet};

use chainify_core::rwset::{KeyRange, KeySet, KeyValue, Resource};
use chainify_core::tx::{Statement, Transaction};
use chainify_core::{BlockNumber, Value};
use chainify_sql::{Analyzer, Schema};
use chainify_storage::{Backend, BlockOutcome, ExecBlock, ExecMode, Store, StoreOptions};
use chainify_testkit::conformance::storage::{Fixture, dump, outside};
use chainify_testkit::engines::{PgFixture, SqliteFixture};
use chainify_workload::Rng;

/// Actions, weighted towards what schemas declare (and registration accepts) most.
const ACTIONS: [&str; 10] = [
    "NO ACTION",
    "NO ACTION",
    "NO ACTION",
    "RESTRICT",
    "CASCADE",
    "CASCADE",
    "CASCADE",
    "SET NULL",
    "SET NULL",
    // Refused at registration now (counted as refused); kept so that seeds draw as before.
    "SET DEFAULT",
];

/// One generated table: `k` its key, `u` a UNIQUE column, `f0…` its foreign-key columns.
struct Table {
    name: String,
    /// Per foreign key: parent table index, whether it references the parent's `u` (else `k`),
    /// NOT NULL, and the column's default.
    keys: Vec<(usize, bool, bool, Option<i64>)>,
    /// The parent whose `u` this table's own `u` references, if it does: a change that cascades
    /// into `u` goes on to this table's children (updates over several levels).
    u_parent: Option<usize>,
}

struct Case {
    tables: Vec<Table>,
    ddl: String,
    rows: Vec<String>,
    statements: Vec<Statement>,
}

fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[rng.below(items.len() as u64) as usize]
}

/// A schema of two to four tables, each referencing only tables before it (cycles are refused
/// for other reasons), rows that satisfy every key, and one to three statements.
fn case(n: usize, rng: &mut Rng) -> Case {
    let count = 2 + rng.below(3) as usize;
    let mut tables: Vec<Table> = Vec::new();
    let mut ddl = Vec::new();
    for i in 0..count {
        let name = format!("c{n}_t{i}");
        let mut keys = Vec::new();
        let mut columns = vec![
            "k BIGINT NOT NULL PRIMARY KEY".to_owned(),
            "u BIGINT UNIQUE".to_owned(),
        ];
        let mut constraints = Vec::new();
        let mut u_parent = None;
        if i > 0 && rng.below(5) == 0 {
            let parent = rng.below(i as u64) as usize;
            constraints.push(format!(
                "FOREIGN KEY (u) REFERENCES {} (u) ON DELETE {} ON UPDATE {}",
                tables[parent].name,
                pick(rng, &ACTIONS),
                pick(rng, &ACTIONS)
            ));
            u_parent = Some(parent);
        }
        if i > 0 {
            for f in 0..1 + rng.below(2) as usize {
                let parent = rng.below(i as u64) as usize;
                let by_unique = rng.below(3) == 0;
                let not_null = rng.below(4) == 0;
                let default = match rng.below(3) {
                    0 => Some(1),
                    1 => Some(99),
                    _ => None,
                };
                columns.push(format!(
                    "f{f} BIGINT{}{}",
                    if not_null { " NOT NULL" } else { "" },
                    default.map_or(String::new(), |d| format!(" DEFAULT {d}"))
                ));
                constraints.push(format!(
                    "FOREIGN KEY (f{f}) REFERENCES {} ({}) ON DELETE {} ON UPDATE {}",
                    tables[parent].name,
                    if by_unique { "u" } else { "k" },
                    pick(rng, &ACTIONS),
                    pick(rng, &ACTIONS)
                ));
                keys.push((parent, by_unique, not_null, default));
            }
        }
        columns.extend(constraints);
        ddl.push(format!("CREATE TABLE {name} ({})", columns.join(", ")));
        tables.push(Table {
            name,
            keys,
            u_parent,
        });
    }
    // Rows: keys 1..=5 (1 always present, the defaults' target), `u` = 10·k or NULL, and each
    // foreign-key column an existing parent value (or NULL where allowed).
    let mut values: Vec<Vec<(i64, Option<i64>)>> = Vec::new();
    let mut rows = Vec::new();
    for t in &tables {
        let mut own = Vec::new();
        for k in 1..=5 {
            if k > 1 && rng.below(4) == 0 {
                continue;
            }
            // Row 1 always has a `u` (a NOT NULL key always has a value to reference), unless
            // `u` references a parent whose row of the same key has none.
            let mut u = (k == 1 || rng.below(4) != 0).then_some(10 * k);
            if let Some(parent) = t.u_parent {
                u = values[parent]
                    .iter()
                    .find(|(pk, _)| *pk == k)
                    .and_then(|(_, pu)| *pu);
            }
            let mut cells = vec![k.to_string(), u.map_or("NULL".into(), |u| u.to_string())];
            for (parent, by_unique, not_null, _) in &t.keys {
                let choices: Vec<i64> = values[*parent]
                    .iter()
                    .filter_map(|(pk, pu)| if *by_unique { *pu } else { Some(*pk) })
                    .collect();
                // Mostly the parent row of the same key: rows then hang together along every
                // path, where one statement's actions meet.
                let aligned = values[*parent]
                    .iter()
                    .find(|(pk, _)| *pk == k)
                    .and_then(|(pk, pu)| if *by_unique { *pu } else { Some(*pk) });
                if !not_null && rng.below(6) == 0 {
                    cells.push("NULL".into());
                } else if let Some(v) = aligned.filter(|_| rng.below(4) != 0) {
                    cells.push(v.to_string());
                } else {
                    cells.push(pick(rng, &choices).to_string());
                }
            }
            own.push((k, u));
            rows.push(format!(
                "INSERT INTO {} VALUES ({})",
                t.name,
                cells.join(", ")
            ));
        }
        values.push(own);
    }
    let mut statements = Vec::new();
    for _ in 0..1 + rng.below(3) {
        // Mostly the first table, which the others reference most.
        let t = match rng.below(4) {
            0 | 1 => &tables[0].name,
            2 => &tables[1].name,
            _ => &tables[rng.below(tables.len() as u64) as usize].name,
        };
        // Key 1 is in every table and referenced most.
        let k = if rng.below(2) == 0 {
            1
        } else {
            1 + rng.below(5) as i64
        };
        let v = 1 + rng.below(7) as i64;
        statements.push(match rng.below(5) {
            0 => Statement::new(format!("DELETE FROM {t} WHERE k = $1"), vec![Value::Int(k)]),
            1 => Statement::new(
                format!("DELETE FROM {t} WHERE k >= $1"),
                vec![Value::Int(k)],
            ),
            2 => Statement::new(
                format!("UPDATE {t} SET k = $1 WHERE k = $2"),
                vec![Value::Int(v), Value::Int(k)],
            ),
            3 => Statement::new(
                format!("UPDATE {t} SET u = $1 WHERE k = $2"),
                vec![Value::Int(10 * v), Value::Int(k)],
            ),
            _ => Statement::new(
                format!("UPDATE {t} SET u = NULL WHERE k = $1"),
                vec![Value::Int(k)],
            ),
        });
    }
    Case {
        tables,
        ddl: ddl.join(";\n"),
        rows,
        statements,
    }
}

/// One engine's store, the analyser of its registered schema, and the next block number.
struct Engine<B: Backend> {
    store: Store<B>,
    analyzer: Analyzer,
    next: u64,
}

impl<B: Backend> Engine<B> {
    async fn open<F: Fixture<B = B>>(f: &F) -> Self {
        let backend = f.backend("cascades", &StoreOptions::default()).await;
        let store = Store::open(backend, StoreOptions::default())
            .await
            .expect("store opens");
        Engine {
            analyzer: Analyzer::new(store.schema().expect("schema")),
            store,
            next: 1,
        }
    }

    /// Creates, fills and registers the case's tables, and analyses with what this engine's
    /// catalog then says: the registration's error, if any.
    async fn install(&mut self, case: &Case) -> Result<(), String> {
        outside(self.store.backend(), &case.ddl).await;
        outside(self.store.backend(), &case.rows.join(";\n")).await;
        let names: Vec<&str> = case.tables.iter().map(|t| t.name.as_str()).collect();
        self.store
            .register(&names)
            .await
            .map_err(|e| e.to_string())?;
        self.analyzer = Analyzer::new(self.store.schema().expect("schema"));
        Ok(())
    }

    async fn rows(&self, case: &Case) -> Vec<Vec<Vec<Value>>> {
        let mut all = Vec::new();
        for t in &case.tables {
            all.push(dump(&self.store, &t.name).await);
        }
        all
    }

    /// Runs `statement` alone in the next block.
    async fn run(&mut self, statement: &Statement) -> BlockOutcome {
        let tx = Transaction {
            statements: vec![statement.clone()],
        };
        let (block, rejected) =
            ExecBlock::analyze(BlockNumber(self.next), vec![Some(tx)], &self.analyzer);
        assert!(rejected.is_empty(), "{statement:?}: {rejected:?}");
        self.next += 1;
        self.store
            .execute_block(&block, ExecMode::Serial)
            .await
            .expect("the block runs")
    }

    /// Whether the analysed write set of `statement` holds `value` in `resource` (a table's
    /// key, or the value space of its UNIQUE column).
    fn written(&self, statement: &Statement, resource: &str, value: i64) -> bool {
        let analysis = self
            .analyzer
            .analyze(&Transaction {
                statements: vec![statement.clone()],
            })
            .expect("analysed before");
        let resource = Resource {
            name: resource.into(),
            arity: 1,
        };
        analysis.rwset.writes.get(&resource).is_some_and(|keys| {
            let mut point = KeySet::empty();
            point.insert(KeyRange::point(vec![KeyValue::Int(value)]));
            keys.overlaps(&point)
        })
    }
}

/// What a statement changed, per table: each key whose row it added, removed or changed, and
/// each `u` value that the table held before and not after, or after and not before (a row
/// moved to another key keeps its `u` taken).
#[derive(Default)]
struct Changed {
    keys: Vec<(String, i64)>,
    uniques: Vec<(String, i64)>,
}

fn changed(case: &Case, before: &[Vec<Vec<Value>>], after: &[Vec<Vec<Value>>]) -> Changed {
    let mut out = Changed::default();
    for ((t, b), a) in case.tables.iter().zip(before).zip(after) {
        let by_key = |rows: &[Vec<Value>]| -> BTreeMap<i64, Vec<Value>> {
            rows.iter()
                .map(|r| match r.first() {
                    Some(Value::Int(k)) => (*k, r.clone()),
                    other => panic!("a key {other:?}"),
                })
                .collect()
        };
        let (b, a) = (by_key(b), by_key(a));
        let keys: BTreeSet<i64> = b.keys().chain(a.keys()).copied().collect();
        for k in keys {
            if b.get(&k) != a.get(&k) {
                out.keys.push((t.name.clone(), k));
            }
        }
        let uniques = |rows: &BTreeMap<i64, Vec<Value>>| -> BTreeSet<i64> {
            rows.values()
                .filter_map(|r| match r.get(1) {
                    Some(Value::Int(u)) => Some(*u),
                    _ => None,
                })
                .collect()
        };
        let (ub, ua) = (uniques(&b), uniques(&a));
        for u in ub.symmetric_difference(&ua) {
            out.uniques.push((t.name.clone(), *u));
        }
    }
    out
}

/// Checks that `engine`'s analysis of `statement` writes every key and UNIQUE value it changed.
fn within_write_set<B: Backend>(
    engine: &Engine<B>,
    statement: &Statement,
    changed: &Changed,
    context: &str,
) {
    for (table, k) in &changed.keys {
        assert!(
            engine.written(statement, table, *k),
            "{context}\nchanged {table} key {k} outside the analysed write set"
        );
    }
    for (table, u) in &changed.uniques {
        let space = format!("{table}#unique(u)");
        assert!(
            engine.written(statement, &space, *u),
            "{context}\nchanged {space} value {u} outside the analysed write set"
        );
    }
}

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_foreign_key_actions_agree_on_postgres_and_sqlite_within_the_write_set() {
    let cases = setting("CHAINIFY_CASCADE_CASES", 300);
    let seeds = match std::env::var("CHAINIFY_CASCADE_SEED") {
        Ok(seed) => vec![seed.parse().expect("a seed")],
        Err(_) => vec![2211291, 1],
    };
    for seed in seeds {
        run_seed(seed, cases).await;
    }
}

async fn run_seed(seed: u64, cases: u64) {
    let mut rng = Rng::new(seed);
    let mut pg = Engine::open(&PgFixture).await;
    let mut lite = Engine::open(&SqliteFixture).await;
    let (mut refused, mut run, mut failed, mut cascaded) = (0, 0, 0, 0);
    for n in 0..cases as usize {
        // A fresh database now and then: registration and the schema grow with every table.
        if n > 0 && n % 50 == 0 {
            pg = Engine::open(&PgFixture).await;
            lite = Engine::open(&SqliteFixture).await;
        }
        let case = case(n, &mut rng);
        let ddl = case.ddl.replace(";\n", "; ");
        let parsed = Schema::from_sql(&ddl).map(drop).map_err(|e| e.to_string());
        if let Err(e) = &parsed
            && std::env::var("CHAINIFY_CASCADE_WHY").is_ok()
        {
            eprintln!("refused: {e}");
        }
        // Registration reads each engine's catalog: it must judge as the DDL does.
        let (on_pg, on_lite) = (pg.install(&case).await, lite.install(&case).await);
        assert_eq!(
            (on_pg.is_ok(), on_lite.is_ok()),
            (parsed.is_ok(), parsed.is_ok()),
            "seed {seed} case {n}: registration judged otherwise than the DDL: PostgreSQL {on_pg:?}, SQLite {on_lite:?}, DDL {parsed:?}\n{ddl}"
        );
        if parsed.is_err() {
            refused += 1;
            continue;
        }
        for statement in &case.statements {
            let before = pg.rows(&case).await;
            assert_eq!(before, lite.rows(&case).await, "seed {seed} case {n}");
            let (p, l) = (pg.run(statement).await, lite.run(statement).await);
            let after = pg.rows(&case).await;
            let context = format!(
                "seed {seed} case {n}: {statement:?}\n{ddl}\n{}\nPostgreSQL {:?}, SQLite {:?}",
                case.rows.join("; "),
                p.failures,
                l.failures
            );
            assert_eq!(p.success, l.success, "{context}");
            assert_eq!(after, lite.rows(&case).await, "{context}");
            assert_eq!((p.digest, p.state), (l.digest, l.state), "{context}");
            run += 1;
            if p.success.iter().all(|s| !s) {
                failed += 1;
            }
            let changed = changed(&case, &before, &after);
            let own = statement
                .sql
                .split_whitespace()
                .find(|w| w.starts_with(&format!("c{n}_t")))
                .unwrap_or_default();
            if changed.keys.iter().any(|(t, _)| t != own) {
                cascaded += 1;
            }
            within_write_set(&pg, statement, &changed, &context);
            within_write_set(&lite, statement, &changed, &context);
        }
    }
    eprintln!(
        "cascades seed {seed}: {cases} schemas, {refused} refused, {run} statements run, {failed} failed alike, {cascaded} changed rows through actions"
    );
    // The generator must reach what the test is about.
    assert!(run >= cases / 4, "only {run} statements ran");
    assert!(
        failed >= 5 && cascaded >= 5,
        "{failed} failed, {cascaded} cascaded"
    );
}
