//! The suite every orderer passes: cutting by count and by timeout, every consumer seeing the
//! same blocks, resuming from a block number. `make` builds a fresh orderer for the given block
//! size and batch timeout.

use std::future::Future;
use std::time::Duration;

use chainify_core::NetworkId;
use chainify_core::testing::signed_transaction;
use chainify_core::tx::{ChainedTransaction, TransactionBlock};
use futures_util::StreamExt;

use chainify_orderer::{BlockStream, Demand, Orderer, Resume};

/// The network the suite's transactions belong to.
pub fn network() -> NetworkId {
    NetworkId::new("conformance").expect("a valid name")
}

/// A signed transaction told apart by its nonce.
pub fn transaction(nonce: u64) -> ChainedTransaction {
    signed_transaction(&network(), nonce)
}

fn nonces(block: &TransactionBlock) -> Vec<u64> {
    block
        .transactions
        .iter()
        .map(|t| t.proposal.body.nonce)
        .collect()
}

async fn take(stream: &mut BlockStream, n: usize) -> Vec<TransactionBlock> {
    let mut out = Vec::new();
    while out.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("a block within 30 s")
            .expect("the stream goes on")
            .expect("a block");
        out.push(next);
    }
    out
}

/// Blocks end after `max_block_txs` transactions, or after the batch timeout with fewer.
pub async fn cuts_by_count_and_by_timeout<O: Orderer, F: Future<Output = O>>(
    make: impl FnOnce(usize, Duration) -> F,
) {
    // Long enough that a loaded machine still delivers three transactions in one block.
    let orderer = make(3, Duration::from_millis(800)).await;
    let mut blocks = orderer.deliver(Resume::START).await.expect("deliver");
    for nonce in 1..=7 {
        orderer
            .broadcast(transaction(nonce))
            .await
            .expect("broadcast");
    }
    let got = take(&mut blocks, 3).await;
    let shape: Vec<(u64, Vec<u64>)> = got.iter().map(|b| (b.number.0, nonces(b))).collect();
    assert_eq!(
        shape,
        vec![(1, vec![1, 2, 3]), (2, vec![4, 5, 6]), (3, vec![7])],
        "block 3 is cut by the timeout"
    );
    assert!(
        got.windows(2)
            .all(|w| w[0].orderer_position < w[1].orderer_position)
    );
}

/// Every consumer sees the same blocks; one that starts later from a block number sees the same
/// blocks from there on.
pub async fn consumers_agree_and_resume<O: Orderer, F: Future<Output = O>>(
    make: impl FnOnce(usize, Duration) -> F,
) {
    let orderer = make(4, Duration::from_millis(600)).await;
    let mut a = orderer.deliver(Resume::START).await.expect("deliver");
    let mut b = orderer.deliver(Resume::START).await.expect("deliver");
    for nonce in 1..=10 {
        orderer
            .broadcast(transaction(nonce))
            .await
            .expect("broadcast");
        if nonce == 6 {
            // Let a timeout cut happen in the middle.
            tokio::time::sleep(Duration::from_millis(2500)).await;
        }
    }
    // 1..4 by count, 5..6 by the timeout, 7..10 by count.
    let from_a = take(&mut a, 3).await;
    let from_b = take(&mut b, 3).await;
    assert_eq!(from_a, from_b);
    let all: Vec<u64> = from_a.iter().flat_map(nonces).collect();
    assert_eq!(
        all,
        (1..=10).collect::<Vec<_>>(),
        "every transaction once, in order"
    );
    assert_eq!(from_a[1].transactions.len(), 2, "a timeout cut");
    let mut resumed = orderer
        .deliver(Resume::after(&from_a[0]))
        .await
        .expect("deliver");
    assert_eq!(take(&mut resumed, 2).await, from_a[1..].to_vec());
}

/// For orderers that cut on demand (`make` gets a batch timeout of an hour): a consumer waiting
/// for the block being filled has its first transaction cut at once; transactions that arrive
/// while no consumer asks wait for the next ask, all in one block; every consumer sees the same
/// blocks.
pub async fn cuts_on_demand<O: Orderer, F: Future<Output = O>>(
    make: impl FnOnce(usize, Duration) -> F,
) {
    let orderer = make(10, Duration::from_secs(3600)).await;
    let mut a = orderer.deliver(Resume::START).await.expect("deliver");
    let mut waiting = Box::pin(take(&mut a, 1));
    // The consumer is waiting before the transaction arrives.
    assert!(
        futures_util::FutureExt::now_or_never(&mut waiting).is_none(),
        "nothing to deliver yet"
    );
    orderer.broadcast(transaction(1)).await.expect("broadcast");
    let first = waiting.await;
    assert_eq!(
        nonces(&first[0]),
        vec![1],
        "cut at once for the waiting consumer"
    );
    for nonce in 2..=4 {
        orderer
            .broadcast(transaction(nonce))
            .await
            .expect("broadcast");
    }
    let second = take(&mut a, 1).await;
    assert_eq!(
        nonces(&second[0]),
        vec![2, 3, 4],
        "what arrived while nobody asked, in one block"
    );
    let mut b = orderer.deliver(Resume::START).await.expect("deliver");
    assert_eq!(
        take(&mut b, 2).await,
        vec![first[0].clone(), second[0].clone()]
    );
}

/// For orderers that cut on demand (`make` gets a batch timeout of an hour): a consumer that
/// looks ahead (its demand cleared) cuts nothing; it still receives a block that fills up, and
/// one another consumer asked for; setting its demand again cuts the block being filled at
/// once.
pub async fn looking_ahead_cuts_nothing<O: Orderer, F: Future<Output = O>>(
    make: impl FnOnce(usize, Duration) -> F,
) {
    let orderer = make(3, Duration::from_secs(3600)).await;
    let (wants, demand) = Demand::channel(false);
    let mut ahead = orderer
        .deliver_on(Resume::START, demand)
        .await
        .expect("deliver");
    for nonce in 1..=4 {
        orderer
            .broadcast(transaction(nonce))
            .await
            .expect("broadcast");
    }
    // Transaction 4 waits in the block being filled: looking ahead takes the full block only.
    let full = take(&mut ahead, 1).await;
    assert_eq!(nonces(&full[0]), vec![1, 2, 3], "the full block arrives");
    let mut next = Box::pin(take(&mut ahead, 1));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        futures_util::FutureExt::now_or_never(&mut next).is_none(),
        "looking ahead cut a partial block"
    );
    // Another consumer that wants it cuts it, for everyone.
    let mut other = orderer
        .deliver(Resume::after(&full[0]))
        .await
        .expect("deliver");
    let cut = take(&mut other, 1).await;
    assert_eq!(nonces(&cut[0]), vec![4], "the other consumer's cut");
    assert_eq!(
        next.await,
        cut,
        "the consumer looking ahead sees the same block"
    );
    // Wanting the block again asks at once, even while waiting.
    orderer.broadcast(transaction(5)).await.expect("broadcast");
    let mut waiting = Box::pin(take(&mut ahead, 1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        futures_util::FutureExt::now_or_never(&mut waiting).is_none(),
        "nothing asked yet"
    );
    wants.send_replace(true);
    assert_eq!(nonces(&waiting.await[0]), vec![5], "cut when wanted");
}
