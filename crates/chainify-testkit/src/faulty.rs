//! A misbehaving orderer for fault-injection tests: wraps an honest one and alters the blocks it
//! delivers from a given block on. Nothing downstream trusts the orderer, so each fault must be
//! either harmless or caught by validation or the vote.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use chainify_core::BlockNumber;
use chainify_core::tx::{ChainedTransaction, TransactionBlock};
use chainify_orderer::{BlockStream, Demand, Orderer, OrdererError, Resume};
use futures_util::StreamExt;

/// How the orderer misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Swaps the first two transactions of each block (the same for every consumer).
    Reorder,
    /// Leaves out the last transaction of each block.
    Drop,
    /// Repeats the first transaction at the end of each block.
    Duplicate,
    /// Adds a transaction whose content no client signed.
    Forge,
    /// Puts a copy of the first transaction, stripped of its endorsements, ahead of it (a
    /// transaction's id leaves them out, so the copy has the real one's id).
    StripAhead,
    /// Gives the first consumer reordered blocks and every other consumer the honest ones.
    Equivocate,
}

/// An orderer that applies `fault` to every block from `from` on.
#[derive(Debug, Clone)]
pub struct FaultyOrderer<O> {
    inner: O,
    fault: Fault,
    from: BlockNumber,
    /// The last block the fault applies to (`None`: every block from `from` on).
    through: Option<BlockNumber>,
    consumers: Arc<AtomicUsize>,
    /// Every stream goes to this consumer number instead of the next one.
    fixed: Option<usize>,
}

impl<O: Orderer> FaultyOrderer<O> {
    /// Wraps `inner`.
    pub fn new(inner: O, fault: Fault, from: BlockNumber) -> Self {
        FaultyOrderer {
            inner,
            fault,
            from,
            through: None,
            consumers: Arc::new(AtomicUsize::new(0)),
            fixed: None,
        }
    }

    /// The same fault, applied only up to block `last` (an orderer that misbehaved once).
    pub fn through(self, last: BlockNumber) -> Self {
        FaultyOrderer {
            through: Some(last),
            ..self
        }
    }

    /// The same orderer as consumer number `consumer` sees it, on every stream (an
    /// organization that reconnects or replays stays the same consumer).
    pub fn as_consumer(&self, consumer: usize) -> Self
    where
        O: Clone,
    {
        FaultyOrderer {
            fixed: Some(consumer),
            ..self.clone()
        }
    }
}

/// `block` as a misbehaving orderer would deliver it to consumer number `consumer`.
pub fn apply(fault: Fault, consumer: usize, mut block: TransactionBlock) -> TransactionBlock {
    let txs = &mut block.transactions;
    match fault {
        Fault::Reorder => {
            if txs.len() >= 2 {
                txs.swap(0, 1);
            }
        }
        Fault::Equivocate if consumer == 0 => {
            if txs.len() >= 2 {
                txs.swap(0, 1);
            }
        }
        Fault::Equivocate => {}
        Fault::Drop => {
            txs.pop();
        }
        Fault::Duplicate => {
            if let Some(first) = txs.first().cloned() {
                txs.push(first);
            }
        }
        Fault::StripAhead => {
            if let Some(first) = txs.first() {
                let mut stripped: ChainedTransaction = first.clone();
                stripped.responses.clear();
                txs.insert(0, stripped);
            }
        }
        Fault::Forge => {
            if let Some(first) = txs.first() {
                let mut forged: ChainedTransaction = first.clone();
                forged.proposal.body.nonce = forged.proposal.body.nonce.wrapping_add(1 << 40);
                txs.push(forged);
            }
        }
    }
    block
}

impl<O: Orderer> Orderer for FaultyOrderer<O> {
    async fn broadcast(&self, tx: ChainedTransaction) -> Result<(), OrdererError> {
        self.inner.broadcast(tx).await
    }

    async fn deliver(&self, from: Resume) -> Result<BlockStream, OrdererError> {
        self.deliver_on(from, Demand::always()).await
    }

    async fn deliver_on(&self, from: Resume, demand: Demand) -> Result<BlockStream, OrdererError> {
        let consumer = self
            .fixed
            .unwrap_or_else(|| self.consumers.fetch_add(1, Ordering::Relaxed));
        let (fault, start, end) = (self.fault, self.from, self.through);
        let honest = self.inner.deliver_on(from, demand).await?;
        Ok(Box::pin(honest.map(move |block| {
            block.map(|b| {
                if b.number >= start && end.is_none_or(|end| b.number <= end) {
                    apply(fault, consumer, b)
                } else {
                    b
                }
            })
        })))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use chainify_core::NetworkId;
    use chainify_core::testing::signed_transaction;
    use chainify_orderer::LocalOrderer;

    fn network() -> NetworkId {
        NetworkId::new("faulty").expect("a valid name")
    }

    fn transaction(nonce: u64) -> ChainedTransaction {
        signed_transaction(&network(), nonce)
    }

    fn nonces(b: &TransactionBlock) -> Vec<u64> {
        b.transactions
            .iter()
            .map(|t| t.proposal.body.nonce)
            .collect()
    }

    async fn first_blocks(fault: Fault) -> (TransactionBlock, TransactionBlock) {
        let honest = LocalOrderer::start(network(), 3, Duration::from_secs(60));
        let faulty = FaultyOrderer::new(honest, fault, BlockNumber(0));
        let mut a = faulty.deliver(Resume::START).await.unwrap();
        let mut b = faulty.deliver(Resume::START).await.unwrap();
        for n in 1..=3 {
            faulty.broadcast(transaction(n)).await.unwrap();
        }
        (
            a.next().await.unwrap().unwrap(),
            b.next().await.unwrap().unwrap(),
        )
    }

    #[tokio::test]
    async fn each_fault_alters_blocks_as_described() {
        let (a, b) = first_blocks(Fault::Reorder).await;
        assert_eq!((nonces(&a), nonces(&b)), (vec![2, 1, 3], vec![2, 1, 3]));
        let (a, _) = first_blocks(Fault::Drop).await;
        assert_eq!(nonces(&a), vec![1, 2]);
        let (a, _) = first_blocks(Fault::Duplicate).await;
        assert_eq!(nonces(&a), vec![1, 2, 3, 1]);
        let (a, _) = first_blocks(Fault::Forge).await;
        assert_eq!(a.transactions.len(), 4);
        let forged = &a.transactions[3].proposal;
        let key = chainify_core::crypto::SigningKey::from_seed(&[9; 32]).public_key();
        assert!(forged.verify(&key).is_err(), "nobody signed the forgery");
        let (a, b) = first_blocks(Fault::Equivocate).await;
        assert_eq!((nonces(&a), nonces(&b)), (vec![2, 1, 3], vec![1, 2, 3]));
    }

    #[tokio::test]
    async fn a_fixed_consumer_sees_the_same_blocks_on_every_stream() {
        let honest = LocalOrderer::start(network(), 3, Duration::from_secs(60));
        let faulty = FaultyOrderer::new(honest, Fault::Equivocate, BlockNumber(0));
        let (victim, other) = (faulty.as_consumer(0), faulty.as_consumer(1));
        for n in 1..=3 {
            faulty.broadcast(transaction(n)).await.unwrap();
        }
        for _ in 0..2 {
            let mut v = victim.deliver(Resume::START).await.unwrap();
            let mut o = other.deliver(Resume::START).await.unwrap();
            assert_eq!(nonces(&v.next().await.unwrap().unwrap()), vec![2, 1, 3]);
            assert_eq!(nonces(&o.next().await.unwrap().unwrap()), vec![1, 2, 3]);
        }
    }
}
