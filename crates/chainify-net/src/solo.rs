//! The solo orderer over gRPC: [`SoloServer`] serves a [`LocalOrderer`] as `OrdererService`
//! for networks of processes without Kafka; [`RemoteOrderer`] is the [`Orderer`] its clients
//! use. Like every orderer it is untrusted; its log lives in its memory, so it is for
//! development networks (Kafka is the production orderer).
//!
//! Broadcasts are batched: concurrent callers' transactions go out in one `Broadcast` call.

use std::pin::Pin;
use std::time::Duration;

use chainify_core::BlockNumber;
use chainify_core::tx::{ChainedTransaction, MAX_ORDERED_TRANSACTION_BYTES, TransactionBlock};
use chainify_orderer::{BlockStream, LocalOrderer, Orderer, OrdererError, Resume};
use chainify_proto::pb;
use chainify_proto::pb::orderer_service_client::OrdererServiceClient;
use chainify_proto::pb::orderer_service_server::OrdererService;
use futures_util::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::tls::{Tls, channel};
use crate::{NetError, status};

/// Most transactions in one `Broadcast` call.
pub const MAX_BROADCAST_BATCH: usize = 1024;
/// Broadcasts waiting for a call; callers wait (backpressure) when it is full.
pub const BROADCAST_QUEUE: usize = 8192;

/// `OrdererService` over an in-process orderer.
#[derive(Debug, Clone)]
pub struct SoloServer {
    orderer: LocalOrderer,
    closing: watch::Receiver<bool>,
}

impl SoloServer {
    /// Serves `orderer`; block streams end once `closing` turns true (a graceful shutdown
    /// waits for every open call).
    pub fn new(orderer: LocalOrderer, closing: watch::Receiver<bool>) -> SoloServer {
        SoloServer { orderer, closing }
    }
}

type BlockWire = Pin<Box<dyn Stream<Item = Result<pb::TransactionBlock, Status>> + Send>>;

#[tonic::async_trait]
impl OrdererService for SoloServer {
    async fn broadcast(
        &self,
        request: Request<pb::BroadcastRequest>,
    ) -> Result<Response<pb::BroadcastResponse>, Status> {
        let wire = request.into_inner().transactions;
        if wire.len() > MAX_BROADCAST_BATCH {
            return Err(status::invalid(format!(
                "{} transactions in one broadcast; at most {MAX_BROADCAST_BATCH}",
                wire.len()
            )));
        }
        // Convert all first: a malformed batch appends nothing.
        let mut txs = Vec::with_capacity(wire.len());
        for (i, t) in wire.into_iter().enumerate() {
            let tx = ChainedTransaction::try_from(t)
                .map_err(|e| status::malformed(&format!("transactions[{i}]"), &e))?;
            // As blocks carry it: encoded again from what was parsed (`.5` becomes `0.5`).
            let size = chainify_orderer::ordered_len(&tx);
            if size > MAX_ORDERED_TRANSACTION_BYTES {
                return Err(status::invalid(format!(
                    "transactions[{i}] encodes to {size} bytes; an ordered transaction takes at most {MAX_ORDERED_TRANSACTION_BYTES}"
                )));
            }
            txs.push(tx);
        }
        for tx in txs {
            self.orderer.broadcast(tx).await.map_err(status::failed)?;
        }
        Ok(Response::new(pb::BroadcastResponse {
            position: self.orderer.log_len(),
        }))
    }

    type DeliverStream = BlockWire;

    async fn deliver(
        &self,
        request: Request<pb::DeliverRequest>,
    ) -> Result<Response<BlockWire>, Status> {
        let from = request.into_inner().from_block.max(Resume::START.block.0);
        let blocks = self
            .orderer
            .deliver(Resume {
                block: BlockNumber(from),
                position: 0,
            })
            .await
            .map_err(status::failed)?;
        let mut closing = self.closing.clone();
        let closed = async move {
            // A dropped sender means nobody will close: serve on.
            if closing.wait_for(|c| *c).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let wire = blocks
            .map(|b| {
                b.map(|b| pb::TransactionBlock::from(&b))
                    .map_err(status::failed)
            })
            .take_until(closed);
        Ok(Response::new(Box::pin(wire)))
    }
}

type Ack = oneshot::Sender<Result<(), OrdererError>>;

/// What no honest orderer cuts: more transactions than the network's block size, or one longer
/// than [`MAX_ORDERED_TRANSACTION_BYTES`]. Such a block passes what the node sends its execution
/// process, which would refuse it for good; refused here, named, it waits for the orderer (which
/// the network relies on to make progress anyway).
fn check_block(b: &TransactionBlock, max_txs: usize) -> Result<(), String> {
    if b.transactions.len() > max_txs {
        return Err(format!(
            "{} transactions, more than the network's {max_txs} a block",
            b.transactions.len()
        ));
    }
    // As the node sends it on: encoded again from what was parsed.
    match b
        .transactions
        .iter()
        .map(chainify_orderer::ordered_len)
        .enumerate()
        .find(|(_, n)| *n > MAX_ORDERED_TRANSACTION_BYTES)
    {
        Some((i, n)) => Err(format!(
            "transaction {i} encodes to {n} bytes, more than the {MAX_ORDERED_TRANSACTION_BYTES} an ordered one may"
        )),
        None => Ok(()),
    }
}

/// The client of a solo orderer.
#[derive(Debug, Clone)]
pub struct RemoteOrderer {
    client: OrdererServiceClient<Channel>,
    queue: mpsc::Sender<(pb::ChainedTransaction, Ack)>,
    /// The network's block size: a longer block is refused.
    max_block_txs: usize,
}

impl RemoteOrderer {
    /// A client of the solo orderer at `endpoint` (connects lazily). Must be called inside a
    /// tokio runtime: it starts the batching task, which ends with the last clone.
    pub fn new(
        endpoint: &str,
        tls: Option<&Tls>,
        max_block_txs: usize,
    ) -> Result<RemoteOrderer, NetError> {
        let client =
            OrdererServiceClient::new(channel(endpoint, tls, chainify_core::ORDERER_TLS_NAME)?)
                .max_decoding_message_size(
                    chainify_core::tx::max_block_bytes(max_block_txs).max(256 * 1024 * 1024),
                );
        let (queue, rx) = mpsc::channel(BROADCAST_QUEUE);
        tokio::spawn(broadcast_loop(client.clone(), rx));
        Ok(RemoteOrderer {
            client,
            queue,
            max_block_txs,
        })
    }
}

async fn broadcast_loop(
    mut client: OrdererServiceClient<Channel>,
    mut rx: mpsc::Receiver<(pb::ChainedTransaction, Ack)>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BROADCAST_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (transactions, acks): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        let mut request = Request::new(pb::BroadcastRequest { transactions });
        request.set_timeout(Duration::from_secs(10));
        let result = client
            .broadcast(request)
            .await
            .map(|_| ())
            .map_err(|e| OrdererError::Unavailable(format!("solo orderer: {}", e.message())));
        for ack in acks {
            let _ = ack.send(result.clone());
        }
    }
}

impl Orderer for RemoteOrderer {
    async fn broadcast(&self, tx: ChainedTransaction) -> Result<(), OrdererError> {
        let (ack, done) = oneshot::channel();
        self.queue
            .send((pb::ChainedTransaction::from(&tx), ack))
            .await
            .map_err(|_| OrdererError::Unavailable("the broadcast task stopped".into()))?;
        done.await
            .map_err(|_| OrdererError::Unavailable("the broadcast task stopped".into()))?
    }

    async fn deliver(&self, from: Resume) -> Result<BlockStream, OrdererError> {
        let stream = self
            .client
            .clone()
            .deliver(pb::DeliverRequest {
                from_block: from.block.0,
            })
            .await
            .map_err(|e| OrdererError::Unavailable(format!("solo orderer: {}", e.message())))?
            .into_inner();
        let max_txs = self.max_block_txs;
        let blocks = stream.map(move |b| match b {
            Ok(b) => {
                let number = b.number;
                let block = TransactionBlock::try_from(b).map_err(|e| {
                    OrdererError::Unavailable(format!("solo orderer sent a malformed block: {e}"))
                })?;
                check_block(&block, max_txs).map_err(|why| {
                    OrdererError::Unavailable(format!("solo orderer sent block {number}: {why}"))
                })?;
                Ok(block)
            }
            Err(e) => Err(OrdererError::Unavailable(format!(
                "solo orderer: {}",
                e.message()
            ))),
        });
        Ok(Box::pin(blocks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::NetworkId;
    use chainify_core::testing::signed_transaction;

    /// A block no honest orderer cuts (found by a hunt: one passes what the node sends its
    /// execution process) is refused by name: too many transactions, or one too long.
    #[test]
    fn blocks_past_the_network_s_limits_are_refused() {
        let net = NetworkId::new("solo").expect("a name");
        let block = |txs: Vec<ChainedTransaction>| TransactionBlock {
            network: net.clone(),
            number: BlockNumber(4),
            transactions: txs,
            orderer_position: 9,
        };
        let three: Vec<_> = (1..=3).map(|n| signed_transaction(&net, n)).collect();
        assert_eq!(check_block(&block(three.clone()), 3), Ok(()));
        let e = check_block(&block(three), 2).expect_err("too many");
        assert_eq!(e, "3 transactions, more than the network's 2 a block");
        let mut long = signed_transaction(&net, 4);
        long.proposal.body.transaction.statements[0]
            .params
            .push(chainify_core::Value::Text(
                "x".repeat(MAX_ORDERED_TRANSACTION_BYTES),
            ));
        let e =
            check_block(&block(vec![signed_transaction(&net, 5), long]), 3).expect_err("too long");
        assert!(e.starts_with("transaction 1 encodes to "), "{e}");
    }
}
