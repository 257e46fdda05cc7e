//! Smallbank networks for tests: a cluster spec with small blocks and frequent checkpoints,
//! the full Smallbank mix, and submitting through the first organization's admission.

use std::sync::Arc;
use std::time::Duration;

use chainify_core::TxId;
use chainify_node::NodeSettings;
use chainify_workload::{KeyDistribution, Smallbank, SmallbankKind};

use crate::cluster::{Cluster, ClusterSpec, OrdererFactory, SharedOrderer};
use crate::engines::TABLES;

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

/// One orderer for every organization.
pub fn shared<O>(orderer: O) -> SharedOrderer<O> {
    SharedOrderer(Arc::new(orderer))
}
