//! The block-cutting rule (docs/design/overview.md §2.2), pure so that every consumer of an ordered
//! log cuts the same blocks: a block ends after `max_block_txs` transactions, or at the first
//! time-to-cut marker for its number when it holds at least one transaction. Markers for blocks
//! already cut (or not yet started) are ignored, so any number of marker producers may race.

use chainify_core::tx::{ChainedTransaction, TransactionBlock};
use chainify_core::{BlockNumber, NetworkId};

/// One entry of the ordered log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogEntry {
    /// A transaction.
    Tx(ChainedTransaction),
    /// "Cut block `n` now": sent when a transaction of block `n` waited the batch timeout, or
    /// when a consumer cutting on demand waits for block `n`.
    TimeToCut(BlockNumber),
}

/// Cuts blocks from the log entries it is fed, in log order.
#[derive(Clone, Debug)]
pub struct BlockCutter {
    network: NetworkId,
    max_block_txs: usize,
    next: BlockNumber,
    pending: Vec<ChainedTransaction>,
}

impl BlockCutter {
    /// A cutter whose next block is `next`, fed from the log position where block `next - 1`
    /// ended (its `orderer_position`), or from the start for the first block.
    pub fn new(network: NetworkId, max_block_txs: usize, next: BlockNumber) -> BlockCutter {
        BlockCutter {
            network,
            max_block_txs: max_block_txs.max(1),
            next,
            pending: Vec::new(),
        }
    }

    /// The number of the block being filled.
    pub fn next_block(&self) -> BlockNumber {
        self.next
    }

    /// Transactions waiting in the block being filled.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Feeds the entry at log position `position - 1`; `position` (the position after it) is
    /// recorded in a block it completes, as the place to resume from.
    pub fn push(&mut self, entry: LogEntry, position: u64) -> Option<TransactionBlock> {
        match entry {
            LogEntry::Tx(tx) => {
                self.pending.push(tx);
                (self.pending.len() >= self.max_block_txs).then(|| self.cut(position))
            }
            LogEntry::TimeToCut(n) if n == self.next && !self.pending.is_empty() => {
                Some(self.cut(position))
            }
            LogEntry::TimeToCut(_) => None,
        }
    }

    fn cut(&mut self, position: u64) -> TransactionBlock {
        let block = TransactionBlock {
            network: self.network.clone(),
            number: self.next,
            transactions: std::mem::take(&mut self.pending),
            orderer_position: position,
        };
        self.next = BlockNumber(self.next.0 + 1);
        block
    }
}

#[cfg(test)]
mod tests {
    use chainify_core::ClientId;
    use chainify_core::crypto::SigningKey;
    use chainify_core::tx::{Proposal, ProposalBody, Transaction};

    use super::*;

    pub(crate) fn tx(nonce: u64) -> ChainedTransaction {
        let body = ProposalBody {
            client: ClientId::new("c").unwrap(),
            nonce,
            network: NetworkId::new("net").unwrap(),
            transaction: Transaction::default(),
        };
        let key = SigningKey::from_seed(&[7; 32]);
        let signature = key.sign(&body.encode_canonical());
        ChainedTransaction {
            proposal: Proposal { body, signature },
            responses: vec![],
        }
    }

    fn run(entries: Vec<LogEntry>, max: usize, next: u64) -> Vec<(u64, Vec<u64>, u64)> {
        let mut c = BlockCutter::new(NetworkId::new("net").unwrap(), max, BlockNumber(next));
        entries
            .into_iter()
            .enumerate()
            .filter_map(|(i, e)| c.push(e, i as u64 + 1))
            .map(|b| {
                (
                    b.number.0,
                    b.transactions
                        .iter()
                        .map(|t| t.proposal.body.nonce)
                        .collect(),
                    b.orderer_position,
                )
            })
            .collect()
    }

    #[test]
    fn count_and_marker_cuts_ignore_stale_and_empty_markers() {
        use LogEntry::{TimeToCut as Cut, Tx};
        let entries = vec![
            Cut(BlockNumber(0)), // nothing pending: ignored
            Tx(tx(1)),
            Tx(tx(2)),
            Tx(tx(3)),           // count cut: block 0 = 1, 2, 3
            Cut(BlockNumber(0)), // stale
            Tx(tx(4)),
            Cut(BlockNumber(2)), // not block 1's marker
            Cut(BlockNumber(1)), // block 1 = 4
            Cut(BlockNumber(1)), // later marker for a cut block
            Tx(tx(5)),
        ];
        assert_eq!(
            run(entries.clone(), 3, 0),
            vec![(0, vec![1, 2, 3], 4), (1, vec![4], 8)]
        );
        // Resuming after block 0 from its position cuts the same later blocks.
        assert_eq!(run(entries[4..].to_vec(), 3, 1), vec![(1, vec![4], 4)]);
    }
}
