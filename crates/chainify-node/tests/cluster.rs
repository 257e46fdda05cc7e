//! The Whatever-Voting pipeline end to end: organizations on PostgreSQL, MariaDB and SQLite,
//! each with its own node, behind the in-process orderer.

mod common;

use std::time::Duration;

use chainify_core::OrgId;
use chainify_node::cluster::Cluster;
use chainify_orderer::LocalOrderer;
use common::*;

const ACCOUNTS: u64 = 200;
const WAIT: Duration = Duration::from_secs(120);

fn local(
    spec: &chainify_node::cluster::ClusterSpec,
) -> chainify_node::cluster::Shared<LocalOrderer> {
    shared(LocalOrderer::start(
        spec.network.network_id.clone(),
        spec.network.max_block_txs,
        spec.network.batch_timeout,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heterogeneous_orgs_agree_under_any_2_and_all_3() {
    for policy in ["any-2", "all"] {
        let test = format!("het_{}", policy.replace('-', ""));
        let urls = smallbank_dbs(&test, &["postgres", "mariadb", "sqlite"], ACCOUNTS).await;
        let spec = spec(&test, policy, &urls, 100);
        let orderer = local(&spec);
        let cluster = Cluster::start(spec, orderer).await.expect("start");
        let mut workload = smallbank(ACCOUNTS, 1);
        let ids = drive(&cluster, &mut workload, 2000).await;
        let orgs = cluster.orgs();
        cluster
            .wait_committed(&orgs, &ids, WAIT)
            .await
            .expect("committed");
        let blocks = cluster.check_consistent(&orgs).await.expect("consistent");
        assert!(blocks >= 20, "{policy}: {blocks} blocks");
        let oracle = smallbank_db("sqlite", &format!("{test}_oracle"), ACCOUNTS).await;
        cluster
            .check_against_serial(OrgId(1), &oracle)
            .await
            .expect("serial oracle");
        let succeeded = ids
            .iter()
            .filter(|id| cluster.outcome(OrgId(2), id).expect("outcome").success)
            .count();
        assert!(
            succeeded > 1000,
            "{policy}: {succeeded} of 2000 committed successfully"
        );
        for status in cluster.statuses().values() {
            assert!(status.alarms.is_empty(), "{status:?}");
            assert!(status.recoveries.is_empty(), "{status:?}");
        }
        cluster.shutdown().await.expect("shutdown");
    }
}
