//! The commit feed on a real SQLite ledger: history, then live, refilled after a lag, without a
//! gap or a duplicate; the polling feed of a component in another process.

use std::sync::Arc;
use std::time::Duration;

use chainify_core::tx::{Certificate, LedgerBlock, LedgerEntry};
use chainify_core::{BlockNumber, Digest, NetworkId, TxId};
use chainify_node::{CommitFeed, Committed, Subscription, ledger};
use chainify_storage::{AnyBackend, Store, StoreOptions};
use tokio::sync::broadcast;

struct Ledger {
    store: Arc<Store<AnyBackend>>,
    blocks: Vec<LedgerBlock>,
    _dir: tempfile::TempDir,
}

impl Ledger {
    async fn new() -> Ledger {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}/feed.db", dir.path().display());
        let options = StoreOptions::default();
        let backend = AnyBackend::connect(&url, &options)
            .await
            .expect("SQLite opens");
        let store = Arc::new(
            Store::open(backend, options)
                .await
                .expect("the store opens"),
        );
        Ledger {
            store,
            blocks: Vec::new(),
            _dir: dir,
        }
    }

    /// Appends the next block to the ledger and returns its commit event.
    async fn append(&mut self) -> Arc<Committed> {
        let committed = self.upcoming();
        let entry = LedgerEntry {
            block: committed.block.clone(),
            certificate: committed.certificate.clone(),
        };
        ledger::append(&self.store, &entry)
            .await
            .expect("the ledger appends");
        self.blocks.push(committed.block.clone());
        committed
    }

    /// The commit event of the next block (with a reason, which only the live stream carries),
    /// not yet in the ledger.
    fn upcoming(&self) -> Arc<Committed> {
        let number = self.blocks.len() as u64 + 1;
        let block = LedgerBlock {
            network: NetworkId::new("net").expect("a network id"),
            number: BlockNumber(number),
            tx_ids: vec![TxId(Digest::of(number.to_be_bytes().as_slice()))],
            success: vec![false],
            valid: vec![true],
            hash_digest: Digest::of(b"effect"),
            state_digest: Digest::of(b"state"),
            hash_previous: self.blocks.last().map_or(Digest::ZERO, LedgerBlock::hash),
            orderer_position: number,
        };
        let certificate = Certificate {
            block: block.number,
            ledger_block_hash: block.hash(),
            votes: Vec::new(),
        };
        Arc::new(Committed {
            block,
            certificate,
            reasons: vec![(0, "rolled back".into())],
        })
    }
}

/// The next `n` blocks of `sub`: numbers, and whether each came live (with its reason).
async fn take(sub: &mut Subscription<AnyBackend>, n: usize) -> Vec<(u64, bool)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let c = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("a block within 10 s")
            .expect("the feed goes on")
            .expect("the ledger reads");
        out.push((c.block.number.0, !c.reasons.is_empty()));
    }
    out
}

#[tokio::test]
async fn history_then_live_without_a_gap_or_a_duplicate() {
    let mut l = Ledger::new().await;
    let (tx, _) = broadcast::channel(16);
    for _ in 0..3 {
        l.append().await;
    }
    let feed = CommitFeed::new(l.store.clone(), tx.downgrade());
    let mut sub = feed.subscribe(BlockNumber(2));
    // Block 3's event arrives late, after the subscription read it from the ledger.
    let three = Arc::new(Committed {
        block: l.blocks[2].clone(),
        certificate: Certificate {
            block: BlockNumber(3),
            ledger_block_hash: l.blocks[2].hash(),
            votes: Vec::new(),
        },
        reasons: vec![(0, "late".into())],
    });
    assert_eq!(take(&mut sub, 2).await, vec![(2, false), (3, false)]);
    tx.send(three).unwrap();
    // Block 4 is announced before the ledger has it: it can only come from the live stream.
    tx.send(l.upcoming()).unwrap();
    assert_eq!(take(&mut sub, 1).await, vec![(4, true)], "live, once");
    l.append().await;
    assert_eq!(sub.next_block(), BlockNumber(5));
    // The node stops: the feed ends; a subscription made afterwards plays the ledger and ends.
    drop(tx);
    assert!(sub.next().await.is_none());
    let mut after = feed.subscribe(BlockNumber(3));
    assert_eq!(take(&mut after, 2).await, vec![(3, false), (4, false)]);
    assert!(after.next().await.is_none());
}

#[tokio::test]
async fn a_lagging_subscriber_refills_from_the_ledger_in_order() {
    let mut l = Ledger::new().await;
    let (tx, _) = broadcast::channel(2);
    let feed = CommitFeed::new(l.store.clone(), tx.downgrade());
    let mut sub = feed.subscribe(BlockNumber(1));
    let mut later = feed.clone().subscribe(BlockNumber(5));
    for _ in 0..7 {
        let c = l.append().await;
        tx.send(c).unwrap();
    }
    // Blocks 1..=7 were appended before reading: the stream kept only the last two.
    let got = take(&mut sub, 7).await;
    assert_eq!(
        got.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        (1..=7).collect::<Vec<_>>()
    );
    assert_eq!(
        take(&mut later, 3)
            .await
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>(),
        vec![5, 6, 7]
    );
    tx.send(l.upcoming()).unwrap();
    assert_eq!(take(&mut sub, 1).await, vec![(8, true)], "live again");
}

#[tokio::test]
async fn a_polling_feed_follows_a_ledger_another_process_appends() {
    let mut l = Ledger::new().await;
    l.append().await;
    let feed = CommitFeed::polling(l.store.clone(), Duration::from_millis(10));
    let mut sub = feed.subscribe(BlockNumber(1));
    assert_eq!(take(&mut sub, 1).await, vec![(1, false)]);
    let appender = tokio::spawn(async move {
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(30)).await;
            l.append().await;
        }
        l
    });
    assert_eq!(
        take(&mut sub, 3).await,
        vec![(2, false), (3, false), (4, false)]
    );
    appender.await.unwrap();
}

#[tokio::test]
async fn a_hinted_feed_reads_the_ledger_when_the_hint_moves() {
    let mut l = Ledger::new().await;
    l.append().await;
    // An interval no test waits out: only the hint can bring the next block in time.
    let (hint_tx, hint) = tokio::sync::watch::channel(BlockNumber(2));
    let feed = CommitFeed::hinted(l.store.clone(), Duration::from_secs(3600), hint);
    let mut sub = feed.subscribe(BlockNumber(1));
    assert_eq!(take(&mut sub, 1).await, vec![(1, false)]);
    let waiting = tokio::spawn(async move { (take(&mut sub, 1).await, sub) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    l.append().await;
    hint_tx.send(BlockNumber(3)).unwrap();
    // `take` gives up after 10 s, long before the interval.
    let (got, mut sub) = waiting.await.expect("the hint wakes the feed");
    assert_eq!(got, vec![(2, false)]);
    // A hint ahead of the ledger reads nothing new and waits again: blocks come from the
    // ledger, never from the hint.
    hint_tx.send(BlockNumber(9)).unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), take(&mut sub, 1))
            .await
            .is_err(),
        "no block 3 yet"
    );
}

#[tokio::test]
async fn a_hinted_feed_whose_announcer_is_gone_polls_by_its_interval() {
    let mut l = Ledger::new().await;
    let (hint_tx, hint) = tokio::sync::watch::channel(BlockNumber(1));
    let feed = CommitFeed::hinted(l.store.clone(), Duration::from_millis(10), hint);
    let mut sub = feed.subscribe(BlockNumber(1));
    drop(hint_tx);
    let appender = tokio::spawn(async move {
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(30)).await;
            l.append().await;
        }
        l
    });
    assert_eq!(take(&mut sub, 2).await, vec![(1, false), (2, false)]);
    appender.await.unwrap();
}
