//! A misbehaving orderer in front of three organizations (SQLite): every honest organization
//! flags the same transactions, appends only agreed blocks, and goes on correctly (an
//! organization the orderer deceived takes the agreed state from another one).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chainify_core::ranges::RangeNode;
use chainify_core::tx::LedgerEntry;
use chainify_core::{BlockNumber, Digest, OrgId, Value};
use chainify_node::{OfferedTable, PeerFuture, StateOffer, StatePeer};
use chainify_orderer::{LocalOrderer, OrdererError, Resume};
use chainify_testkit::cluster::{Cluster, ClusterSpec, OrdererFactory};
use chainify_testkit::engines::*;
use chainify_testkit::faulty::{Fault, FaultyOrderer};
use chainify_testkit::smallbank::*;

const ACCOUNTS: u64 = 100;
const BLOCK: usize = 20;
const BLOCKS: u64 = 10;
const WAIT: Duration = Duration::from_secs(120);

fn local(spec: &ClusterSpec) -> LocalOrderer {
    LocalOrderer::start(
        spec.network.network_id.clone(),
        spec.network.max_block_txs,
        Duration::from_secs(600),
    )
}

async fn cluster<F: OrdererFactory>(
    test: &str,
    make: impl FnOnce(&ClusterSpec) -> F,
) -> Cluster<F> {
    let urls = smallbank_dbs(test, &["sqlite", "sqlite", "sqlite"], ACCOUNTS).await;
    let spec = spec(test, "any-2", &urls, BLOCK);
    let factory = make(&spec);
    Cluster::start(spec, factory).await.expect("start")
}

/// Gives organization 1 the faulty orderer's first consumer (the equivocation's victim) and
/// everyone else the honest view.
struct Equivocating(FaultyOrderer<LocalOrderer>);

impl OrdererFactory for Equivocating {
    type Orderer = FaultyOrderer<LocalOrderer>;
    async fn orderer(
        &self,
        org: Option<OrgId>,
        _: Resume,
    ) -> Result<Arc<Self::Orderer>, OrdererError> {
        let consumer = usize::from(org != Some(OrgId(1)));
        Ok(Arc::new(self.0.as_consumer(consumer)))
    }
}

async fn run_blocks<F: OrdererFactory>(cluster: &Cluster<F>, orgs: &[OrgId]) {
    let mut workload = smallbank(ACCOUNTS, 7);
    drive(cluster, &mut workload, BLOCK * BLOCKS as usize).await;
    cluster
        .wait_until("every block appended", WAIT, |s| {
            orgs.iter().all(|o| s[o].next_block.0 > BLOCKS)
        })
        .await
        .expect("progress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uniform_faults_are_flagged_alike_and_agreed() {
    for fault in [
        Fault::Reorder,
        Fault::Drop,
        Fault::Duplicate,
        Fault::Forge,
        Fault::StripAhead,
    ] {
        let test = format!("fault_{fault:?}").to_lowercase();
        let cluster = cluster(&test, |spec| {
            shared(FaultyOrderer::new(local(spec), fault, BlockNumber(2)))
        })
        .await;
        let orgs = cluster.orgs();
        run_blocks(&cluster, &orgs).await;
        cluster.check_consistent(&orgs).await.expect("consistent");
        let ledger = cluster.ledger(OrgId(1)).await.expect("ledger");
        let txs: usize = ledger
            .iter()
            .take(BLOCKS as usize)
            .map(|e| e.block.tx_ids.len())
            .sum();
        let faulty_blocks = BLOCKS as usize - 1;
        let (expected_txs, expected_invalid) = match fault {
            Fault::Drop => (BLOCK * BLOCKS as usize - faulty_blocks, 0),
            Fault::Duplicate | Fault::Forge | Fault::StripAhead => (
                BLOCK * BLOCKS as usize + faulty_blocks,
                faulty_blocks as u64,
            ),
            _ => (BLOCK * BLOCKS as usize, 0),
        };
        assert_eq!(txs, expected_txs, "{fault:?}");
        for status in cluster.statuses().values() {
            assert_eq!(
                status.invalid_transactions, expected_invalid,
                "{fault:?}: {status:?}"
            );
            assert!(status.alarms.is_empty(), "{fault:?}: {status:?}");
        }
        if matches!(fault, Fault::Duplicate | Fault::Forge) {
            for entry in &ledger[1..BLOCKS as usize] {
                assert!(
                    !entry.block.success.last().copied().unwrap_or(true),
                    "{fault:?}: the extra transaction of block {} is flagged",
                    entry.block.number
                );
            }
        }
        if fault == Fault::StripAhead {
            // The stripped copy is flagged, and the real one behind it, under the same id, is
            // not: it runs (and is indexed) as if the copy were not there.
            for entry in &ledger[1..BLOCKS as usize] {
                let b = &entry.block;
                assert_eq!(b.tx_ids[0], b.tx_ids[1], "block {}", b.number);
                assert_eq!(
                    (b.valid[0], b.valid[1], b.success[0]),
                    (false, true, false),
                    "block {}",
                    b.number
                );
                assert_eq!(b.outcome_of(&b.tx_ids[0]).map(|o| o.index), Some(1));
            }
        }
        cluster.shutdown().await.expect("shutdown");
    }
}

/// Forged and replayed transactions submitted to an honest orderer are flagged by every
/// organization alike and never executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_replayed_transactions_are_flagged() {
    let cluster = cluster("forged", |spec| shared(local(spec))).await;
    let orgs = cluster.orgs();
    let mut workload = smallbank(ACCOUNTS, 8);
    let honest = cluster
        .endorse(workload.next_tx().1)
        .await
        .expect("endorse");
    let mut forged = cluster
        .endorse(workload.next_tx().1)
        .await
        .expect("endorse");
    forged.proposal.body.nonce += 1_000_000;
    cluster.submit_raw(honest.clone()).await.expect("submit");
    cluster.submit_raw(forged.clone()).await.expect("submit");
    drive(&cluster, &mut workload, BLOCK - 2).await;
    cluster.submit_raw(honest.clone()).await.expect("replay");
    drive(&cluster, &mut workload, BLOCK - 1).await;
    cluster
        .wait_until("two blocks", WAIT, |s| {
            s.values().all(|s| s.next_block.0 > 2)
        })
        .await
        .expect("progress");
    cluster.check_consistent(&orgs).await.expect("consistent");
    let ledger = cluster.ledger(OrgId(1)).await.expect("ledger");
    let (b1, b2) = (&ledger[0].block, &ledger[1].block);
    assert_eq!(b1.tx_ids[0], honest.proposal.tx_id());
    assert!(b1.success[0], "the honest transaction committed");
    assert!(!b1.success[1], "the forgery is flagged");
    assert_eq!(
        b2.tx_ids[0],
        honest.proposal.tx_id(),
        "the replay is in block 2"
    );
    assert!(!b2.success[0], "the replay is flagged");
    for status in cluster.statuses().values() {
        assert_eq!(status.invalid_transactions, 2, "{status:?}");
    }
    cluster.shutdown().await.expect("shutdown");
}

/// Organization 1 gets different blocks than the others: it is outvoted and cannot reproduce the
/// agreed block from what the orderer gives it, from any of its checkpoints. It takes the
/// agreed state from another organization instead (the ledger entries by their certificates,
/// the rows by the agreed state digest) and goes on with the others; it never appends a block
/// that was not agreed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_equivocation_victim_takes_the_agreed_state_from_a_peer_and_goes_on() {
    let cluster = cluster("equivocate", |spec| {
        Equivocating(
            FaultyOrderer::new(local(spec), Fault::Equivocate, BlockNumber(3))
                .through(BlockNumber(3)),
        )
    })
    .await;
    run_blocks(&cluster, &[OrgId(1), OrgId(2), OrgId(3)]).await;
    let victim = cluster.status(OrgId(1)).expect("status");
    assert!(victim.state_transfers_total >= 1, "{victim:?}");
    let transfer = victim.last_transfer.clone().expect("a transfer");
    assert!(transfer.block >= BlockNumber(3), "{transfer:?}");
    assert!(transfer.from != OrgId(1));
    for org in [OrgId(2), OrgId(3)] {
        let s = cluster.status(org).expect("status");
        assert_eq!(
            s.state_transfers_total, 0,
            "{org} needed no transfer: {s:?}"
        );
    }
    cluster
        .check_consistent(&[OrgId(1), OrgId(2), OrgId(3)])
        .await
        .expect("the victim agrees with the others again");
    let victim_ledger = cluster.ledger(OrgId(1)).await.expect("ledger");
    let agreed = cluster.ledger(OrgId(2)).await.expect("ledger");
    // The same blocks; the certificates may carry different (each sufficient) sets of votes,
    // depending on whose arrived first; check_consistent checked each against the policy.
    let blocks = |l: &[chainify_core::tx::LedgerEntry]| {
        l.iter().map(|e| e.block.clone()).collect::<Vec<_>>()
    };
    assert!(victim_ledger.len() as u64 >= BLOCKS);
    assert_eq!(
        blocks(&victim_ledger),
        blocks(&agreed),
        "only agreed blocks"
    );
    cluster.shutdown().await.expect("shutdown");
}

/// Another organization's state as a test serves it: the liar changes one value in the rows it
/// sends (and says so in `lied`); the honest one offers nothing until the liar was asked, so the
/// victim tries the liar first.
#[derive(Debug)]
struct Staged {
    inner: Arc<dyn StatePeer>,
    lied: Arc<AtomicBool>,
    liar: bool,
}

impl StatePeer for Staged {
    fn org(&self) -> OrgId {
        self.inner.org()
    }
    fn offer(&self) -> PeerFuture<'_, Option<StateOffer>> {
        if self.liar || self.lied.load(Ordering::SeqCst) {
            self.inner.offer()
        } else {
            Box::pin(async { Ok(None) })
        }
    }
    fn ledger(&self, from: BlockNumber, to: BlockNumber) -> PeerFuture<'_, Vec<LedgerEntry>> {
        self.inner.ledger(from, to)
    }
    fn digests(&self, of: OfferedTable, nodes: Vec<RangeNode>) -> PeerFuture<'_, Vec<Digest>> {
        self.inner.digests(of, nodes)
    }
    fn rows(&self, of: OfferedTable, ranges: Vec<u32>) -> PeerFuture<'_, Vec<Vec<Value>>> {
        Box::pin(async move {
            let mut rows = self.inner.rows(of, ranges).await?;
            if self.liar
                && let Some(v) = rows
                    .iter_mut()
                    .flat_map(|r| r.iter_mut())
                    .find(|v| matches!(v, Value::Int(_)))
            {
                *v = Value::Int(-7);
                self.lied.store(true, Ordering::SeqCst);
            }
            Ok(rows)
        })
    }
}

/// The equivocation victim asks a Byzantine organization first, which serves a changed row:
/// the rows do not hash to the agreed state digest, nothing is applied, and the victim takes
/// the state from the honest organization instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_peer_is_refused_and_an_honest_one_serves_the_victim() {
    let cluster = cluster("lying_peer", |spec| {
        Equivocating(
            FaultyOrderer::new(local(spec), Fault::Equivocate, BlockNumber(3))
                .through(BlockNumber(3)),
        )
    })
    .await;
    let lied = Arc::new(AtomicBool::new(false));
    let liar = cluster.state_peer(OrgId(2)).expect("org2 serves");
    let honest = cluster.state_peer(OrgId(3)).expect("org3 serves");
    cluster.serve_state(
        OrgId(2),
        Arc::new(Staged {
            inner: liar,
            lied: lied.clone(),
            liar: true,
        }),
    );
    cluster.serve_state(
        OrgId(3),
        Arc::new(Staged {
            inner: honest,
            lied: lied.clone(),
            liar: false,
        }),
    );
    run_blocks(&cluster, &[OrgId(1), OrgId(2), OrgId(3)]).await;
    assert!(lied.load(Ordering::SeqCst), "the liar was asked");
    let victim = cluster.status(OrgId(1)).expect("status");
    let transfer = victim.last_transfer.clone().expect("a transfer");
    assert_eq!(transfer.from, OrgId(3), "{victim:?}");
    cluster
        .check_consistent(&[OrgId(1), OrgId(2), OrgId(3)])
        .await
        .expect("the victim holds the agreed state");
    cluster.shutdown().await.expect("shutdown");
}
