//! The same blocks on PostgreSQL, MariaDB and SQLite produce byte-identical digests and
//! identical tables: awkward values, then high-conflict Smallbank blocks run in parallel on the
//! servers and serially on SQLite (the oracle: parallel equals serial, across engines).

mod common;

use chainify_core::Digest;
use chainify_storage::conformance::{ACCOUNTS, Fixture, awkward_digests, block, dump_all, setup};
use chainify_storage::{Backend, ExecMode, Store, StoreOptions};
use chainify_workload::{KeyDistribution, Smallbank};
use common::{MySqlFixture, PgFixture, SqliteFixture};

async fn digests_on<F: Fixture>(
    f: &F,
    mode: ExecMode,
) -> (Vec<Digest>, Vec<Vec<bool>>, Store<F::B>) {
    let store = setup(f, "cross_engine", StoreOptions::default()).await;
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
    let (lite, lite_ok, lite_store) = digests_on(&SqliteFixture, ExecMode::Serial).await;
    let (pg, pg_ok, pg_store) = digests_on(&PgFixture, ExecMode::Parallel(8)).await;
    let (my, my_ok, my_store) = digests_on(&MySqlFixture, ExecMode::Parallel(8)).await;
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
/// the state digest stays equal to a full scan.
async fn decimal_keys_on<F: Fixture>(f: &F) -> Vec<(Digest, Digest)> {
    use chainify_core::tx::{Statement, Transaction};
    use chainify_storage::conformance::outside;
    let store = setup(f, "decimal_keys", StoreOptions::default()).await;
    outside(
        store.backend(),
        "CREATE TABLE dk (k DECIMAL(10,2) NOT NULL PRIMARY KEY, v BIGINT NOT NULL);\n\
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
