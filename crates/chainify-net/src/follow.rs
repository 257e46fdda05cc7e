//! A chainify component in its own process learns of appended blocks by following the ledger
//! in its organization's database (only the commit component appends to it). The commit
//! component announces each new height (`AdminService.WatchLedger`), so the ledger is read when
//! a block is appended; the interval only covers an announcement that is late or cannot arrive.

use std::sync::Arc;
use std::time::Duration;

use chainify_core::{BlockNumber, OrgId};
use chainify_node::{CommitFeed, NodeStatus};
use chainify_proto::pb;
use chainify_proto::pb::admin_service_client::AdminServiceClient;
use chainify_storage::{Backend, Store};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tracing::{debug, warn};

/// How often the ledger tail is read without an announcement.
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(20);
/// How long to wait before asking the commit component for its heights again.
const WATCH_RETRY: Duration = Duration::from_secs(1);

/// Publishes every block appended to `store`'s ledger from now on, as the node's commit stream
/// would (without abort reasons: they stay with the node), and the ledger height in a status;
/// stops when `closing` turns true, ending the feed's subscriptions. One task reads the ledger
/// however many subscribers the feed has; with `announcer` (the commit component's
/// AdminService) it reads when a height is announced, otherwise every [`FOLLOW_INTERVAL`].
pub async fn follow_ledger<B: Backend + 'static>(
    store: Arc<Store<B>>,
    org: OrgId,
    capacity: usize,
    announcer: Option<AdminServiceClient<Channel>>,
    mut closing: watch::Receiver<bool>,
) -> Result<
    (watch::Receiver<NodeStatus>, CommitFeed<B>, JoinHandle<()>),
    chainify_storage::StorageError,
> {
    let next = store.ledger_tail().await?.map_or(1, |(b, _)| b.0 + 1);
    let (status_tx, status) = watch::channel(NodeStatus::new(org, BlockNumber(next)));
    let (commits_tx, _) = broadcast::channel(capacity.max(1));
    let feed = CommitFeed::new(store.clone(), commits_tx.downgrade());
    let source = match announcer {
        Some(client) => {
            let (hint_tx, hint) = watch::channel(BlockNumber(next));
            tokio::spawn(watch_heights(client, hint_tx, closing.clone()));
            CommitFeed::hinted(store, FOLLOW_INTERVAL, hint)
        }
        None => CommitFeed::polling(store, FOLLOW_INTERVAL),
    };
    let mut blocks = source.subscribe(BlockNumber(next));
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

/// Passes on the heights the commit component announces, asking again after a broken or
/// refused stream, until `closing` turns true or nobody follows any more.
async fn watch_heights(
    mut client: AdminServiceClient<Channel>,
    hint: watch::Sender<BlockNumber>,
    mut closing: watch::Receiver<bool>,
) {
    loop {
        let watched = async {
            let mut heights = client
                .watch_ledger(pb::WatchLedgerRequest {})
                .await?
                .into_inner();
            while let Some(height) = heights.message().await? {
                if hint.is_closed() {
                    return Ok(());
                }
                // A height already announced is no reason to read the ledger again.
                let next = BlockNumber(height.next_block);
                hint.send_if_modified(|h| std::mem::replace(h, next) != next);
            }
            Err(tonic::Status::unavailable("the height stream ended"))
        };
        let ended = tokio::select! {
            _ = closing.wait_for(|c| *c) => return,
            ended = watched => ended,
        };
        match ended {
            Ok(()) => return,
            Err(e) => {
                debug!(error = %e, "no height announcements; following the ledger by its interval")
            }
        }
        tokio::select! {
            _ = closing.wait_for(|c| *c) => return,
            () = tokio::time::sleep(WATCH_RETRY) => {}
        }
    }
}
