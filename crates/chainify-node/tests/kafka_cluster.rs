//! The pipeline end to end with the Kafka orderer (a real broker from `cargo xtask test`): each
//! organization has its own Kafka client, producing time-to-cut markers from where its ledger
//! ends; PostgreSQL, MariaDB and SQLite organizations agree under Any-2 and All-3.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chainify_core::{NetworkId, OrgId};
use chainify_orderer::{Cut, KafkaOrderer, KafkaSettings, OrdererError, Resume};
use chainify_testkit::cluster::{Cluster, OrdererFactory};
use chainify_testkit::engines::*;
use chainify_testkit::smallbank::*;

const ACCOUNTS: u64 = 200;

struct Kafka {
    brokers: String,
    topic: String,
    network: NetworkId,
    max_block_txs: usize,
    batch_timeout: Duration,
}

impl OrdererFactory for Kafka {
    type Orderer = KafkaOrderer;

    async fn orderer(
        &self,
        _: Option<OrgId>,
        from: Resume,
    ) -> Result<Arc<KafkaOrderer>, OrdererError> {
        KafkaOrderer::connect(KafkaSettings {
            brokers: self.brokers.clone(),
            topic: self.topic.clone(),
            network: self.network.clone(),
            max_block_txs: self.max_block_txs,
            batch_timeout: self.batch_timeout,
            // The production default: each node's block stream cuts the block it waits for.
            cut: Cut::OnDemand,
            replication: 1,
            markers_from: from,
        })
        .await
        .map(Arc::new)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heterogeneous_orgs_agree_over_kafka() {
    let brokers = std::env::var("CHAINIFY_TEST_KAFKA_BROKERS").unwrap_or_else(|_| {
        panic!(
            "CHAINIFY_TEST_KAFKA_BROKERS is not set: run `cargo xtask test`, or `cargo xtask services start` and `eval \"$(cargo xtask services env)\"`"
        )
    });
    for policy in ["any-2", "all"] {
        let test = format!("kafka_{}", policy.replace('-', ""));
        let urls = smallbank_dbs(&test, &["postgres", "mariadb", "sqlite"], ACCOUNTS).await;
        let spec = spec(&test, policy, &urls, 100);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let factory = Kafka {
            brokers: brokers.clone(),
            topic: format!("chainify-test-{test}-{nanos}"),
            network: spec.network.network_id.clone(),
            max_block_txs: spec.network.max_block_txs,
            batch_timeout: spec.network.batch_timeout,
        };
        let mut cluster = Cluster::start(spec, factory).await.expect("start");
        let mut workload = smallbank(ACCOUNTS, 11);
        let orgs = cluster.orgs();
        // 2 530 transactions: full blocks and a last one cut by time.
        let mut ids = drive(&cluster, &mut workload, 2530).await;
        cluster
            .wait_committed(&orgs, &ids, Duration::from_secs(180))
            .await
            .expect("committed");
        // A restarted organization resumes from the Kafka offset of its last block.
        cluster.stop(OrgId(2)).await.expect("stop");
        cluster.restart(OrgId(2)).await.expect("restart");
        ids.extend(drive(&cluster, &mut workload, 130).await);
        cluster
            .wait_committed(&orgs, &ids, Duration::from_secs(180))
            .await
            .expect("committed after the restart");
        let blocks = cluster.check_consistent(&orgs).await.expect("consistent");
        assert!(blocks >= 27, "{policy}: {blocks} blocks");
        let oracle = smallbank_db("sqlite", &format!("{test}_oracle"), ACCOUNTS).await;
        cluster
            .check_against_serial(OrgId(3), &oracle)
            .await
            .expect("serial oracle");
        cluster.shutdown().await.expect("shutdown");
    }
}
