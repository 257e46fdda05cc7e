//! A chainify component in its own process learns of appended blocks by following the ledger
//! in its organization's database (only the commit component appends to it).

use std::sync::Arc;
use std::time::Duration;

use chainify_core::{BlockNumber, OrgId};
use chainify_node::{CommitFeed, NodeStatus};
use chainify_storage::{Backend, Store};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tracing::warn;

/// How often the ledger tail is read.
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(20);

/// Publishes every block appended to `store`'s ledger from now on, as the node's commit stream
/// would (without abort reasons: they stay with the node), and the ledger height in a status;
/// stops when `closing` turns true, ending the feed's subscriptions. One task reads the ledger
/// however many subscribers the feed has.
pub async fn follow_ledger<B: Backend + 'static>(
    store: Arc<Store<B>>,
    org: OrgId,
    capacity: usize,
    mut closing: watch::Receiver<bool>,
) -> Result<
    (watch::Receiver<NodeStatus>, CommitFeed<B>, JoinHandle<()>),
    chainify_storage::StorageError,
> {
    let next = store.ledger_tail().await?.map_or(1, |(b, _)| b.0 + 1);
    let (status_tx, status) = watch::channel(NodeStatus::new(org, BlockNumber(next)));
    let (commits_tx, _) = broadcast::channel(capacity.max(1));
    let feed = CommitFeed::new(store.clone(), commits_tx.downgrade());
    let mut blocks = CommitFeed::polling(store, FOLLOW_INTERVAL).subscribe(BlockNumber(next));
    let task = tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                _ = closing.wait_for(|c| *c) => return,
                next = blocks.next() => next,
            };
            match next {
                Some(Ok(committed)) => {
                    let after = BlockNumber(committed.block.number.0 + 1);
                    // Nobody listening is fine.
                    let _ = commits_tx.send(committed);
                    status_tx.send_modify(|s| s.next_block = after);
                }
                Some(Err(e)) => {
                    warn!(%org, block = %blocks.next_block(), error = %e, "reading the ledger failed; retrying");
                    tokio::time::sleep(FOLLOW_INTERVAL).await;
                }
                // A polling feed does not end.
                None => return,
            }
        }
    });
    Ok((status, feed, task))
}
