//! The batched ledger lookup admission uses, on a real SQLite ledger: many lookups at once,
//! each answered for its own id, and a failing database reported to every asker.

use std::time::Duration;

use chainify_core::{Digest, OrgId, TxId};
use chainify_node::ledger::{LookupError, TxLookup};
use chainify_orderer::LocalOrderer;
use chainify_testkit::cluster::Cluster;
use chainify_testkit::engines::smallbank_dbs;
use chainify_testkit::smallbank::{drive, shared, smallbank, spec};

const ACCOUNTS: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_lookups_each_get_their_own_answer() {
    let test = "tx_lookup";
    let urls = smallbank_dbs(test, &["sqlite", "sqlite", "sqlite"], ACCOUNTS).await;
    let spec = spec(test, "any-2", &urls, 50);
    let orderer = shared(LocalOrderer::start(
        spec.network.network_id.clone(),
        spec.network.max_block_txs,
        spec.network.batch_timeout,
    ));
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let ids = drive(&cluster, &mut smallbank(ACCOUNTS, 3), 300).await;
    let orgs = cluster.orgs();
    cluster
        .wait_committed(&orgs, &ids, Duration::from_secs(120))
        .await
        .expect("committed");

    let store = cluster.store(OrgId(2)).expect("store");
    let lookup = TxLookup::spawn(store.clone());
    let made_up: Vec<TxId> = (0..300u32)
        .map(|i| TxId(Digest::of(&i.to_le_bytes())))
        .collect();
    // Interleaved, all at once: most go to the database together.
    let asked: Vec<(TxId, bool)> = ids
        .iter()
        .zip(&made_up)
        .flat_map(|(known, unknown)| [(*known, true), (*unknown, false)])
        .collect();
    let answers = futures_util::future::join_all(asked.iter().map(|(id, _)| {
        let lookup = lookup.clone();
        async move { lookup.contains(*id).await.expect("the lookup answers") }
    }))
    .await;
    for ((id, expected), got) in asked.iter().zip(&answers) {
        assert_eq!(got, expected, "transaction {id}");
    }
    cluster.shutdown().await.expect("shutdown");

    // The database gone: every asker learns the database's error, none waits forever.
    store.close().await;
    let failed = futures_util::future::join_all(
        ids[..20]
            .iter()
            .map(|id| tokio::time::timeout(Duration::from_secs(10), lookup.contains(*id))),
    )
    .await;
    for answer in failed {
        match answer.expect("answered in time") {
            Err(LookupError::Storage(e)) => {
                assert!(e.to_string().contains("looking up transaction ids"), "{e}")
            }
            other => panic!("expected the database's error, got {other:?}"),
        }
    }
}
