//! Databases and workloads for the cluster tests: each organization gets its own fresh database
//! with Smallbank loaded, on the servers `cargo xtask test` starts (PostgreSQL, MariaDB) or in
//! an SQLite file.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use chainify_core::TxId;
use chainify_node::NodeSettings;
use chainify_node::cluster::{Cluster, ClusterSpec, OrdererFactory};
use chainify_storage::{AnyBackend, Backend, Conn, StoreOptions, database_on, recreate_database};
use chainify_workload::{
    KeyDistribution, SMALLBANK_SCHEMA, Smallbank, SmallbankKind, smallbank_load_sql,
};

pub const TABLES: [&str; 3] = ["accounts", "savings", "checking"];

fn env_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run the tests with `cargo xtask test`, or start the servers with \
             `cargo xtask services start` and `eval \"$(cargo xtask services env)\"`"
        )
    })
}

fn with_database(base: &str, db: &str) -> String {
    database_on(base, db).expect("a server URL")
}

/// The URL of database `name` on engine `engine` (`postgres`, `mariadb`, `sqlite`).
pub fn url(engine: &str, name: &str) -> String {
    match engine {
        "postgres" => with_database(&env_url("CHAINIFY_TEST_POSTGRES_URL"), name),
        "mariadb" => with_database(&env_url("CHAINIFY_TEST_MYSQL_URL"), name),
        "sqlite" => format!("sqlite://{}/cluster/{name}.db", env!("CARGO_TARGET_TMPDIR")),
        other => panic!("unknown engine {other}"),
    }
}

/// A fresh database with `accounts` Smallbank accounts.
pub async fn smallbank_db(engine: &str, name: &str, accounts: u64) -> String {
    let url = url(engine, name);
    recreate_database(&url).await.expect("fresh database");
    let backend = AnyBackend::connect(&url, &StoreOptions::default())
        .await
        .expect("connect");
    let mut conn = backend.acquire().await.expect("conn");
    for ddl in SMALLBANK_SCHEMA.split(';').filter(|s| !s.trim().is_empty()) {
        conn.batch(ddl).await.expect("schema");
    }
    for insert in smallbank_load_sql(accounts, 500) {
        conn.batch(&insert).await.expect("load");
    }
    drop(conn);
    backend.close().await;
    url
}

/// One database per engine in `engines`, named `<test>_<n>`.
pub async fn smallbank_dbs(test: &str, engines: &[&str], accounts: u64) -> Vec<String> {
    let mut urls = Vec::new();
    for (i, engine) in engines.iter().enumerate() {
        urls.push(smallbank_db(engine, &format!("{test}_{}", i + 1), accounts).await);
    }
    urls
}

/// A cluster spec over `urls` with small blocks and frequent checkpoints.
pub fn spec(test: &str, policy: &str, urls: &[String], block_txs: usize) -> ClusterSpec {
    let mut spec = ClusterSpec::generate(
        test,
        policy,
        block_txs,
        Duration::from_millis(150),
        urls,
        &TABLES,
    )
    .expect("spec");
    spec.settings = NodeSettings {
        checkpoint_interval: 4,
        checkpoints_kept: 2,
        ..NodeSettings::default()
    };
    spec
}

/// Submits `n` Smallbank transactions.
pub async fn drive<F: OrdererFactory>(
    cluster: &Cluster<F>,
    workload: &mut Smallbank,
    n: usize,
) -> Vec<TxId> {
    use futures_util::StreamExt;
    // Admitted concurrently (each runs the first organization's admission and its endorsers'),
    // then ordered back to back in workload order: blocks fill as they would from many clients.
    let txs: Vec<_> = (0..n).map(|_| workload.next_tx().1).collect();
    let endorsed: Vec<_> = futures_util::stream::iter(txs)
        .map(|tx| cluster.endorse(tx))
        .buffered(32)
        .collect()
        .await;
    let mut ids = Vec::with_capacity(n);
    for tx in endorsed {
        let tx = tx.expect("admitted");
        ids.push(tx.proposal.tx_id());
        cluster.submit_raw(tx).await.expect("submit");
    }
    ids
}

/// Smallbank's full mix (with Amalgamate and Balance), Zipf 1.1.
pub fn smallbank(accounts: u64, seed: u64) -> Smallbank {
    Smallbank::new(accounts, &KeyDistribution::Zipf { s: 1.1, v: 0.0 }, seed)
        .with_mix(&SmallbankKind::FULL)
}

pub fn shared<O>(orderer: O) -> chainify_node::cluster::SharedOrderer<O> {
    chainify_node::cluster::SharedOrderer(Arc::new(orderer))
}
