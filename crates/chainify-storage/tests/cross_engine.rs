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
