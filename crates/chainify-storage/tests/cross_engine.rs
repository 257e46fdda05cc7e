//! The same blocks on PostgreSQL, MariaDB and SQLite produce byte-identical digests and
//! identical tables: awkward values, then high-conflict Smallbank blocks run in parallel on the
//! servers and serially on SQLite (the oracle: parallel equals serial, across engines).

use std::collections::{BTreeMap, BTreeSet};

use chainify_core::ranges::Descent;
use chainify_core::{BlockNumber, Digest, Value};
use chainify_storage::{
    AdoptedBlock, Adoption, Backend, ExecMode, RangePatch, Store, StoreOptions,
};
use chainify_testkit::conformance::storage::{
    ACCOUNTS, Fixture, awkward_digests, block, dump_all, setup,
};
use chainify_testkit::engines::{MySqlFixture, PgFixture, SqliteFixture};
use chainify_workload::{KeyDistribution, Smallbank};

async fn digests_on<F: Fixture>(
    f: &F,
    mode: ExecMode,
    database: &str,
) -> (Vec<Digest>, Vec<Vec<bool>>, Store<F::B>) {
    let store = setup(f, database, StoreOptions::default()).await;
    let mut digests = Vec::new();
    let mut success = Vec::new();
    for o in awkward_digests(&store).await {
        digests.push(o.digest);
        digests.push(o.state);
        success.push(o.success);
    }
    let u = u64::try_from(ACCOUNTS).expect("positive");
    let mut workload = Smallbank::new(u, &KeyDistribution::Zipf { s: 1.1, v: 0.0 }, 7);
    for n in 2..6 {
        let txs = workload.block(300).into_iter().map(Some).collect();
        let b = block(&store, n, txs);
        let o = store
            .execute_block(&b, mode)
            .await
            .expect("smallbank block");
        digests.push(o.digest);
        digests.push(o.state);
        success.push(o.success);
    }
    (digests, success, store)
}

async fn tables<B: Backend>(store: &Store<B>) -> Vec<Vec<Vec<chainify_core::Value>>> {
    dump_all(store).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_digests_and_tables_on_every_engine() {
    let (lite, lite_ok, lite_store) =
        digests_on(&SqliteFixture, ExecMode::Serial, "cross_engine").await;
    let (pg, pg_ok, pg_store) = digests_on(&PgFixture, ExecMode::Parallel(8), "cross_engine").await;
    let (my, my_ok, my_store) =
        digests_on(&MySqlFixture, ExecMode::Parallel(8), "cross_engine").await;
    assert!(
        lite_ok[2..].iter().flatten().any(|s| !s),
        "the Smallbank blocks should contain failing guards"
    );
    assert_eq!(
        pg_ok, lite_ok,
        "PostgreSQL success bitmaps differ from SQLite's"
    );
    assert_eq!(
        my_ok, lite_ok,
        "MariaDB success bitmaps differ from SQLite's"
    );
    assert_eq!(pg, lite, "PostgreSQL digests differ from SQLite's");
    assert_eq!(my, lite, "MariaDB digests differ from SQLite's");
    let lite_tables = tables(&lite_store).await;
    assert_eq!(tables(&pg_store).await, lite_tables);
    assert_eq!(tables(&my_store).await, lite_tables);
}

/// A DECIMAL primary key written with more places than its scale (1.005 into DECIMAL(10,2)):
/// PostgreSQL and MariaDB round it on store, SQLite only in chainify's trigger after the write,
/// which therefore records the key rounded. Inserted and moved keys digest alike everywhere, and
/// the state digest stays equal to a full scan. Decimals of 15 significant digits at the top of
/// their column (999999999.999999 in a DECIMAL(15,6)) are stored as they are: SQLite's rounding
/// nudge once carried them to the next power of ten and refused them as too large.
async fn decimal_keys_on<F: Fixture>(f: &F) -> Vec<(Digest, Digest)> {
    use chainify_core::tx::{Statement, Transaction};
    use chainify_testkit::conformance::storage::outside;
    let store = setup(f, "decimal_keys", StoreOptions::default()).await;
    outside(
        store.backend(),
        "CREATE TABLE dk (k DECIMAL(10,2) NOT NULL PRIMARY KEY, v BIGINT NOT NULL, w DECIMAL(15,6), z DECIMAL(15,0));\n\
         INSERT INTO dk (k, v) VALUES (1, 1)",
    )
    .await;
    store.register(&["dk"]).await.expect("register dk");
    let one = |sql: &str| {
        vec![Some(Transaction {
            statements: vec![Statement::new(sql, vec![])],
        })]
    };
    let mut out = Vec::new();
    for (n, sql) in [
        "INSERT INTO dk (k, v) VALUES (1.005, 7)",
        "UPDATE dk SET k = 2.005 WHERE k = 1",
        "UPDATE dk SET v = v + 1 WHERE k = 2.01",
        "DELETE FROM dk WHERE k = 1.01",
        "UPDATE dk SET w = 999999999.999999, z = 999999999999999 WHERE k = 2.01",
        "INSERT INTO dk (k, v, w, z) VALUES (99999999.99, 1, -999999999.999999, -999999999999999)",
        "UPDATE dk SET v = 2 WHERE k = 99999999.99",
    ]
    .into_iter()
    .enumerate()
    {
        let b = block(
            &store,
            n as u64,
            one(sql).into_iter().flatten().map(Some).collect(),
        );
        let o = store
            .execute_block(&b, ExecMode::Serial)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert_eq!(o.success, vec![true], "{sql}");
        let check = store.check_state().await.expect("scan");
        assert!(check.agrees(), "{sql}: {check:?}");
        assert_eq!(check.pending, 0, "{sql}: a record was left behind");
        out.push((o.digest, o.state));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decimal_keys_digest_alike_on_every_engine() {
    let lite = decimal_keys_on(&SqliteFixture).await;
    let pg = decimal_keys_on(&PgFixture).await;
    let my = decimal_keys_on(&MySqlFixture).await;
    assert_eq!(pg, lite, "PostgreSQL and SQLite differ");
    assert_eq!(my, lite, "MariaDB and SQLite differ");
}

/// The ranges where `target`'s tables differ from `source`'s checkpoint at `c`, found by the
/// Merkle descent, with `source`'s rows in them: what a state transfer fetches.
/// CHECK constraints are evaluated by each engine itself, on the row as it stores it: text
/// compared byte by byte ('é' sorts after 'zz', trailing spaces count), NULL passing, integers
/// beyond 2^53 exactly, a DECIMAL only tested for NULL (SQLite would compare it before rounding).
/// The shared subset decides every row alike, in one block where each transaction's outcome
/// hangs on its CHECKs.
async fn checks_on<F: Fixture>(f: &F) -> (Vec<bool>, Vec<Digest>, Vec<Vec<Vec<Value>>>) {
    use chainify_core::tx::{Statement, Transaction};
    use chainify_testkit::conformance::storage::outside;
    let store = setup(f, "check_constraints", StoreOptions::default()).await;
    outside(
        store.backend(),
        "CREATE TABLE ck (k BIGINT NOT NULL PRIMARY KEY, v BIGINT CHECK (v >= 0), \
         d DECIMAL(6,2), s VARCHAR(8) CHECK (s <> '' AND s BETWEEN 'a' AND 'zz'), lo BIGINT, \
         hi BIGINT, CONSTRAINT ordered CHECK (NOT (lo > hi)), \
         CONSTRAINT priced CHECK (d IS NOT NULL OR v IS NULL))",
    )
    .await;
    store.register(&["ck"]).await.expect("register ck");
    let statements = [
        "INSERT INTO ck (k, v, d, s, lo, hi) VALUES (1, 0, 999.99, 'a', 1, 2)",
        "INSERT INTO ck (k, v, d) VALUES (2, -1, 1)",
        "INSERT INTO ck (k, v) VALUES (3, 5)",
        "INSERT INTO ck (k, d) VALUES (4, 1.005)",
        "INSERT INTO ck (k, v, d) VALUES (5, 1, -2.495)",
        "INSERT INTO ck (k, v, d) VALUES (6, 9007199254740993, 1)",
        "INSERT INTO ck (k, s) VALUES (7, 'é')",
        "INSERT INTO ck (k, s) VALUES (8, 'zz')",
        "INSERT INTO ck (k, s) VALUES (9, 'zz ')",
        "INSERT INTO ck (k, s) VALUES (10, '')",
        "INSERT INTO ck (k, lo, hi) VALUES (11, 3, 2)",
        "INSERT INTO ck (k, lo) VALUES (12, 3)",
        "UPDATE ck SET v = v - 1 WHERE k = 1",
        "UPDATE ck SET d = NULL WHERE k = 1",
        "UPDATE ck SET hi = 1 WHERE k = 1",
        "UPDATE ck SET hi = 0, lo = 0 WHERE k = 1",
    ];
    let txs = statements
        .iter()
        .map(|sql| {
            Some(Transaction {
                statements: vec![Statement::new(*sql, vec![])],
            })
        })
        .collect();
    let b = block(&store, 0, txs);
    let o = store
        .execute_block(&b, ExecMode::Serial)
        .await
        .expect("the block");
    let check = store.check_state().await.expect("scan");
    assert!(check.agrees(), "{check:?}");
    (o.success, vec![o.digest, o.state], dump_all(&store).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_constraints_decide_alike_on_every_engine() {
    let lite = checks_on(&SqliteFixture).await;
    let pg = checks_on(&PgFixture).await;
    let my = checks_on(&MySqlFixture).await;
    assert_eq!(
        lite.0,
        vec![
            true, false, false, true, true, true, false, true, false, false, false, true, false,
            false, true, true
        ],
        "SQLite's outcomes"
    );
    assert_eq!(pg.0, lite.0, "PostgreSQL's outcomes differ from SQLite's");
    assert_eq!(my.0, lite.0, "MariaDB's outcomes differ from SQLite's");
    assert_eq!(pg.1, lite.1, "PostgreSQL's digests differ from SQLite's");
    assert_eq!(my.1, lite.1, "MariaDB's digests differ from SQLite's");
    assert_eq!(pg.2, lite.2);
    assert_eq!(my.2, lite.2);
}

/// SELECTs inside transactions, whose rows are counted as they arrive and dropped: wide
/// outputs (REPLACE of a 2 000-byte parameter, 15 times a row: each may take 1 MiB, and a row
/// at most `MAX_ROW_BYTES`), a row count the guard expects
/// and one it does not, an output that overflows on some rows only (every row's outputs are
/// still computed: the engine's error aborts the transaction), and a SELECT before a write.
/// Every engine decides each transaction alike and digests the block alike.
async fn counted_selects_on<F: Fixture>(f: &F) -> (Vec<bool>, Vec<Digest>) {
    use chainify_core::tx::{Statement, Transaction};
    let store = setup(f, "counted_selects", StoreOptions::default()).await;
    let wide = format!(
        "SELECT {} FROM accounts WHERE custid <= $2",
        vec!["REPLACE(name, 'c', $1)"; 15].join(", ")
    );
    let filler = Value::Text("x".repeat(2_000));
    let statements = [
        vec![Statement::new(&wide, vec![filler.clone(), Value::Int(40)]).expect_rows(40)],
        vec![Statement::new(&wide, vec![filler.clone(), Value::Int(40)]).expect_rows(39)],
        vec![
            Statement::new(&wide, vec![filler, Value::Int(10)]).expect_rows(10),
            Statement::new("UPDATE kv SET v = v + 1 WHERE k = 1", vec![]).expect_rows(1),
        ],
        vec![
            Statement::new(
                "SELECT custid * $1 FROM accounts WHERE custid <= $2",
                vec![Value::Int(1 << 62), Value::Int(3)],
            ),
            Statement::new("UPDATE kv SET v = v + 1 WHERE k = 2", vec![]).expect_rows(1),
        ],
        vec![
            Statement::new(
                "SELECT custid * $1 FROM accounts WHERE custid <= $2",
                vec![Value::Int(1 << 62), Value::Int(1)],
            )
            .expect_rows(1),
            Statement::new("UPDATE kv SET v = v + 1 WHERE k = 3", vec![]).expect_rows(1),
        ],
    ];
    let txs = statements
        .into_iter()
        .map(|statements| Some(Transaction { statements }))
        .collect();
    let b = block(&store, 0, txs);
    let o = store
        .execute_block(&b, ExecMode::Parallel(4))
        .await
        .expect("the block");
    let check = store.check_state().await.expect("scan");
    assert!(check.agrees(), "{check:?}");
    (o.success, vec![o.digest, o.state])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counted_selects_decide_alike_on_every_engine() {
    let lite = counted_selects_on(&SqliteFixture).await;
    let pg = counted_selects_on(&PgFixture).await;
    let my = counted_selects_on(&MySqlFixture).await;
    assert_eq!(
        lite.0,
        vec![true, false, true, false, true],
        "SQLite's outcomes"
    );
    assert_eq!(pg.0, lite.0, "PostgreSQL's outcomes differ from SQLite's");
    assert_eq!(my.0, lite.0, "MariaDB's outcomes differ from SQLite's");
    assert_eq!(pg.1, lite.1, "PostgreSQL's digests differ from SQLite's");
    assert_eq!(my.1, lite.1, "MariaDB's digests differ from SQLite's");
}

/// A long key aborted on PostgreSQL alone (a B-tree entry holds at most 2 704 bytes), and one a
/// little shorter broke its checkpoints (the snapshot's key is 8 bytes longer): found by a hunt.
/// The analysis, from each engine's own catalog, holds keys to the same share everywhere, so the
/// same transactions are refused, the rest commit alike, and every engine checkpoints them.
async fn long_keys_on<F: Fixture>(
    f: &F,
) -> (Vec<String>, Vec<bool>, Vec<Digest>, Vec<Vec<Vec<Value>>>) {
    use chainify_core::tx::{Statement, Transaction};
    use chainify_storage::ExecBlock;
    use chainify_testkit::conformance::storage::outside;
    let store = setup(f, "long_keys", StoreOptions::default()).await;
    outside(
        store.backend(),
        "CREATE TABLE lk (k VARCHAR(700) NOT NULL PRIMARY KEY, v BIGINT NOT NULL)",
    )
    .await;
    store.register(&["lk"]).await.expect("register lk");
    // Characters of four bytes each that do not repeat, so that PostgreSQL cannot compress
    // the entry below its limit.
    let key = |chars: u32, seed: u32| -> String {
        (0..chars)
            .map(|i| char::from_u32(0x2_0000 + (i * 7_919 + seed * 104_729) % 0xA6D0).expect("CJK"))
            .collect()
    };
    let txs: Vec<Option<Transaction>> = [
        (key(648, 1), "INSERT INTO lk (k, v) VALUES ($1, 1)"),
        (key(650, 2), "INSERT INTO lk (k, v) VALUES ($1, 2)"),
        (key(672, 3), "INSERT INTO lk (k, v) VALUES ($1, 3)"),
        (key(700, 4), "INSERT INTO lk (k, v) VALUES ($1, 4)"),
        (key(648, 1), "UPDATE lk SET v = v + 10 WHERE k = $1"),
    ]
    .into_iter()
    .map(|(k, sql)| {
        Some(Transaction {
            statements: vec![Statement::new(sql, vec![Value::Text(k)])],
        })
    })
    .collect();
    let analyzer = chainify_sql::Analyzer::new(store.schema().expect("schema"));
    let (b, rejected) = ExecBlock::analyze(BlockNumber(0), txs, &analyzer);
    let rejected: Vec<String> = rejected.iter().map(|(i, e)| format!("{i}: {e}")).collect();
    let o = store
        .execute_block(&b, ExecMode::Serial)
        .await
        .expect("the block");
    let check = store.check_state().await.expect("scan");
    assert!(check.agrees(), "{check:?}");
    store
        .checkpoint(BlockNumber(0))
        .await
        .expect("a checkpoint of the longest key");
    (
        rejected,
        o.success,
        vec![o.digest, o.state],
        dump_all(&store).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_keys_are_refused_alike_and_checkpointed_on_every_engine() {
    let lite = long_keys_on(&SqliteFixture).await;
    let pg = long_keys_on(&PgFixture).await;
    let my = long_keys_on(&MySqlFixture).await;
    assert_eq!(lite.0.len(), 3, "{:?}", lite.0);
    assert!(
        lite.0
            .iter()
            .all(|r| r.contains("text or bytes in that key hold at most 2592")),
        "{:?}",
        lite.0
    );
    assert_eq!(
        lite.1,
        vec![true, false, false, false, true],
        "SQLite's outcomes"
    );
    assert_eq!(pg.0, lite.0, "PostgreSQL refuses other transactions");
    assert_eq!(my.0, lite.0, "MariaDB refuses other transactions");
    assert_eq!(pg.1, lite.1, "PostgreSQL's outcomes differ from SQLite's");
    assert_eq!(my.1, lite.1, "MariaDB's outcomes differ from SQLite's");
    assert_eq!(pg.2, lite.2, "PostgreSQL's digests differ from SQLite's");
    assert_eq!(my.2, lite.2, "MariaDB's digests differ from SQLite's");
    assert_eq!(pg.3, lite.3);
    assert_eq!(my.3, lite.3);
}

async fn patches<S: Backend, T: Backend>(
    source: &Store<S>,
    c: BlockNumber,
    target: &Store<T>,
) -> (BTreeMap<String, RangePatch>, usize) {
    let mut out = BTreeMap::new();
    let mut ranges_total = 0;
    for table in source.tables().keys() {
        let remote = source
            .range_tree(table, Some(c))
            .await
            .expect("source tree")
            .digests();
        let local = target
            .range_tree(table, None)
            .await
            .expect("target tree")
            .digests();
        let mut walk = Descent::new(&local);
        while !walk.is_done() {
            let answer: Vec<Digest> = walk
                .asking()
                .iter()
                .map(|n| remote.get(*n).expect("a node"))
                .collect();
            walk.answer(&answer).expect("answer");
        }
        if walk.differing().is_empty() {
            continue;
        }
        let ranges: BTreeSet<u32> = walk.differing().iter().copied().collect();
        ranges_total += ranges.len();
        let rows = source
            .checkpoint_rows(c, table, &ranges)
            .await
            .expect("rows");
        out.insert(table.clone(), RangePatch { ranges, rows });
    }
    (out, ranges_total)
}

/// A ledger of `n` blocks as a transfer appends it (the storage layer keeps entries opaque).
fn fake_ledger(n: u64) -> Vec<AdoptedBlock> {
    let mut previous = Digest::ZERO;
    (1..=n)
        .map(|i| {
            let hash = Digest::of(format!("block {i}").as_bytes());
            let b = AdoptedBlock {
                number: BlockNumber(i),
                hash,
                previous,
                entry: format!("entry {i}").into_bytes(),
                tx_ids: vec![Digest::of(format!("tx {i}").as_bytes())],
            };
            previous = hash;
            b
        })
        .collect()
}

/// A state checkpointed on one engine is adopted by an organization on another: one that was
/// wiped (its tables back at the initial load) and one whose rows were changed behind the
/// triggers. Only the differing ranges travel; a patch that does not match the agreed state,
/// or that is malformed, changes nothing; after adopting, the next block gives the same digests
/// on both sides.
async fn transfer_to<S: Backend, F: Fixture>(
    source: &Store<S>,
    c: BlockNumber,
    outcome: &(Digest, Digest, Vec<bool>),
    next: &[Option<chainify_core::tx::Transaction>],
    f: &F,
) {
    use chainify_testkit::conformance::storage::outside;
    let target = setup(f, "transfer_target", StoreOptions::default()).await;
    outside(
        target.backend(),
        "UPDATE kv SET v = v + 1 WHERE k = 3;\nDELETE FROM kv WHERE k = 4",
    )
    .await;
    let before = tables(&target).await;
    let (digest, state, success) = outcome.clone();
    let adoption = |patches| Adoption {
        block: c,
        state,
        hash_digest: digest,
        success: success.clone(),
        patches,
        ledger: fake_ledger(c.0),
    };
    let (honest, ranges) = patches(source, c, &target).await;
    assert!(ranges > 0 && ranges < 4 * 4096, "{ranges} ranges differ");

    // A lying peer: one value changed in a transferred row.
    let mut lie = honest.clone();
    let kv = lie.get_mut("kv").expect("kv differs");
    kv.rows[0][1] = Value::Int(-1);
    let e = target
        .adopt(&adoption(lie))
        .await
        .expect_err("refused")
        .to_string();
    assert!(e.contains("not the agreed"), "{e}");
    // Malformed: a row twice, a row outside the ranges asked for.
    let mut twice = honest.clone();
    let kv = twice.get_mut("kv").expect("kv");
    kv.rows.push(kv.rows[0].clone());
    let e = target
        .adopt(&adoption(twice))
        .await
        .expect_err("refused")
        .to_string();
    assert!(e.contains("appears twice"), "{e}");
    let mut outside_ranges = honest.clone();
    outside_ranges.get_mut("kv").expect("kv").ranges.clear();
    let e = target
        .adopt(&adoption(outside_ranges))
        .await
        .expect_err("refused")
        .to_string();
    assert!(e.contains("not asked for"), "{e}");
    assert_eq!(
        tables(&target).await,
        before,
        "a refused transfer changed rows"
    );
    assert_eq!(target.last_applied_block().await.expect("applied"), None);
    assert!(
        !target
            .checkpoints()
            .await
            .expect("checkpoints")
            .contains(&c),
        "a refused state stayed behind as a checkpoint"
    );
    assert_eq!(target.ledger_tail().await.expect("tail"), None);

    // The organization executed a block of its own that nobody agreed on (an equivocating
    // orderer's victim) and checkpointed it. Adopting the agreed state must forget that
    // checkpoint: once block 1 is agreed through the transfer, a later restore must not take the
    // divergent state for block 1's.
    let divergent = chainify_core::tx::Transaction {
        statements: vec![chainify_core::tx::Statement::new(
            "UPDATE checking SET bal = bal + 7 WHERE custid = 1",
            vec![],
        )],
    };
    target
        .execute_block(&block(&target, 1, vec![Some(divergent)]), ExecMode::Serial)
        .await
        .expect("a divergent block");
    target
        .checkpoint(BlockNumber(1))
        .await
        .expect("checkpoint of the divergent block");
    assert!(
        c.0 > 1,
        "the adopted block {c} lies beyond the divergent one"
    );
    assert_eq!(
        target.checkpoints().await.expect("checkpoints"),
        vec![BlockNumber(1)]
    );
    let (honest, _) = patches(source, c, &target).await;

    target.adopt(&adoption(honest)).await.expect("adopt");
    assert_eq!(
        target.checkpoints().await.expect("checkpoints"),
        vec![c],
        "the divergent block's checkpoint survived the adoption"
    );
    assert_eq!(tables(&target).await, tables(source).await);
    let check = target.check_state().await.expect("scan");
    assert!(check.agrees(), "{check:?}");
    assert_eq!(check.expected, state);
    assert_eq!(target.last_applied_block().await.expect("applied"), Some(c));
    let ledger = fake_ledger(c.0);
    assert_eq!(
        target.ledger_tail().await.expect("tail"),
        Some((c, ledger.last().expect("a block").hash))
    );
    assert!(
        target
            .checkpoints()
            .await
            .expect("checkpoints")
            .contains(&c)
    );
    // The adopted state is a real one: the next block gives the same outcome on both sides.
    let b = block(&target, c.0 + 1, next.to_vec());
    let theirs = source
        .execute_block(&block(source, c.0 + 1, next.to_vec()), ExecMode::Serial)
        .await
        .expect("source block");
    let ours = target
        .execute_block(&b, ExecMode::Serial)
        .await
        .expect("target block");
    assert_eq!((ours.digest, ours.state), (theirs.digest, theirs.state));
    // And the checkpoint it keeps restores it.
    target
        .restore(c)
        .await
        .expect("restore the adopted checkpoint");
    source.restore(c).await.expect("restore the source");
    assert_eq!(tables(&target).await, tables(source).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_transfers_between_any_two_engines() {
    let u = u64::try_from(ACCOUNTS).expect("positive");
    let mut workload = Smallbank::new(u, &KeyDistribution::Zipf { s: 1.1, v: 0.0 }, 11);
    let next: Vec<_> = workload.block(100).into_iter().map(Some).collect();
    let (pg_digests, pg_ok, pg) =
        digests_on(&PgFixture, ExecMode::Parallel(8), "transfer_source").await;
    let (lite_digests, _, lite) =
        digests_on(&SqliteFixture, ExecMode::Serial, "transfer_source").await;
    let c = pg
        .last_applied_block()
        .await
        .expect("applied")
        .expect("a block");
    assert_eq!(lite_digests, pg_digests);
    let outcome = (
        pg_digests[pg_digests.len() - 2],
        pg_digests[pg_digests.len() - 1],
        pg_ok.last().expect("a block").clone(),
    );
    for source in [&pg] {
        source.checkpoint(c).await.expect("checkpoint");
        transfer_to(source, c, &outcome, &next, &SqliteFixture).await;
        source.restore(c).await.expect("restore");
        transfer_to(source, c, &outcome, &next, &MySqlFixture).await;
    }
    lite.checkpoint(c).await.expect("checkpoint");
    transfer_to(&lite, c, &outcome, &next, &PgFixture).await;
}

/// A database dropped after use is gone from its server (benchmarks drop theirs), and dropping
/// it again is no error.
#[tokio::test]
async fn dropped_databases_are_gone_from_their_servers() {
    for engine in ["postgres", "mariadb", "sqlite"] {
        let url = chainify_testkit::engines::url(engine, "dropped_after_use");
        chainify_storage::recreate_database(&url)
            .await
            .expect("created");
        let backend = chainify_storage::AnyBackend::connect(&url, &StoreOptions::default())
            .await
            .expect("it exists");
        chainify_storage::Backend::close(&backend).await;
        chainify_storage::drop_database(&url)
            .await
            .expect("dropped");
        let options = StoreOptions {
            read_only: engine == "sqlite",
            ..StoreOptions::default()
        };
        let gone = chainify_storage::AnyBackend::connect(&url, &options).await;
        assert!(gone.is_err(), "{engine}: the database is gone");
        chainify_storage::drop_database(&url)
            .await
            .expect("dropping again");
    }
}
