//! The Kafka orderer (docs/design/overview.md §2.2): one single-partition topic per network is the
//! ordered log. Producers are idempotent with `acks=all`. Every consumer cuts blocks itself with
//! [`BlockCutter`], so all consumers cut identical blocks without a leader. Time-to-cut markers are
//! produced by every `KafkaOrderer` instance that delivers blocks, once its oldest pending
//! transaction (as it saw it arrive) has waited the batch timeout; the cutting rule ignores the
//! redundant ones. An instance that only broadcasts (a split organization's chainify component)
//! follows no log. Cutting [`Cut::OnDemand`], a block stream that waits for its block with nothing
//! more of the log fetched also produces the marker for the block being filled, once: the stream
//! is polled only while its node wants a block, so no block waits on the timer while an
//! organization is idle. (A stream still reading history between two fetches may ask for a block
//! that is already cut further on in the log; every cutter ignores that marker alike.)
//!
//! Log entry encoding: one tag byte, then `1` + the protobuf `chainify.v1.ChainedTransaction`, or
//! `2` + the block number as 8 bytes big-endian. An entry that does not decode is skipped by every
//! consumer alike (the log is untrusted).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chainify_core::tx::{ChainedTransaction, MAX_ORDERED_TRANSACTION_BYTES};
use chainify_core::{BlockNumber, NetworkId};
use chainify_proto::pb;
use futures_util::{FutureExt as _, StreamExt};
use prost::Message as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::time::Instant;

use crate::{BlockCutter, BlockStream, Cut, Demand, LogEntry, Orderer, OrdererError, Resume};

const TAG_TX: u8 = 1;
const TAG_CUT: u8 = 2;

/// Encodes a log entry for the topic.
pub fn encode_entry(entry: &LogEntry) -> Vec<u8> {
    match entry {
        LogEntry::Tx(tx) => {
            let mut out = vec![TAG_TX];
            out.extend(pb::ChainedTransaction::from(tx).encode_to_vec());
            out
        }
        LogEntry::TimeToCut(n) => {
            let mut out = vec![TAG_CUT];
            out.extend(n.0.to_be_bytes());
            out
        }
    }
}

/// The length of `tx`'s encoding as blocks carry it.
pub fn ordered_len(tx: &ChainedTransaction) -> usize {
    pb::ChainedTransaction::from(tx).encoded_len()
}

/// Decodes a log entry; `None` for bytes no honest producer writes (a transaction longer than
/// [`MAX_ORDERED_TRANSACTION_BYTES`] as received or as blocks carry it included).
pub fn decode_entry(bytes: &[u8]) -> Option<LogEntry> {
    match bytes.split_first()? {
        (&TAG_TX, rest) if rest.len() > MAX_ORDERED_TRANSACTION_BYTES => None,
        (&TAG_TX, rest) => {
            let wire = pb::ChainedTransaction::decode(rest).ok()?;
            let tx = ChainedTransaction::try_from(wire).ok()?;
            // Measured as it travels on (blocks carry the parsed transaction encoded again,
            // which can be longer: `.5` is written `0.5`).
            (ordered_len(&tx) <= MAX_ORDERED_TRANSACTION_BYTES).then_some(LogEntry::Tx(tx))
        }
        (&TAG_CUT, rest) => Some(LogEntry::TimeToCut(BlockNumber(u64::from_be_bytes(
            rest.try_into().ok()?,
        )))),
        _ => None,
    }
}

/// Settings of a Kafka orderer.
#[derive(Clone, Debug)]
pub struct KafkaSettings {
    /// Bootstrap servers, `host:port,…`.
    pub brokers: String,
    /// The topic (one per network).
    pub topic: String,
    /// The network whose blocks are cut.
    pub network: NetworkId,
    /// Block size.
    pub max_block_txs: usize,
    /// Time-to-cut.
    pub batch_timeout: Duration,
    /// Whether a block stream waiting for its block also cuts it.
    pub cut: Cut,
    /// Replication factor when the topic is created (1 for a single broker).
    pub replication: i32,
    /// Where this instance starts following the log to produce time-to-cut markers: the block
    /// after the organization's last one ([`Resume::START`] for a new network), so that a
    /// restart does not re-read the whole topic.
    pub markers_from: Resume,
}

struct Inner {
    settings: KafkaSettings,
    producer: FutureProducer,
    /// Whether the markers task runs: started by the first block stream.
    markers: AtomicBool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaOrderer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// An orderer on a Kafka topic.
#[derive(Debug, Clone)]
pub struct KafkaOrderer {
    inner: Arc<Inner>,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> OrdererError {
    OrdererError::Unavailable(format!("{what}: {e}"))
}

/// How long [`KafkaOrderer::connect`] retries topic creation through transient errors.
const TOPIC_CREATION_PATIENCE: Duration = Duration::from_secs(60);

/// Whether a topic creation that failed with `code` may succeed when retried: the errors of a
/// cluster or a client that is still starting, never a refusal of the request itself.
fn transient_while_starting(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::DestroyBroker
            | C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::OperationTimedOut
            | C::RequestTimedOut
            | C::NotController
            | C::LeaderNotAvailable
            | C::BrokerNotAvailable
            | C::InvalidReplicationFactor
    )
}

impl KafkaOrderer {
    /// Connects and creates the topic (one partition) when it does not exist. The first block
    /// stream starts the task that produces time-to-cut markers (it ends when the last clone is
    /// dropped).
    pub async fn connect(settings: KafkaSettings) -> Result<KafkaOrderer, OrdererError> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .create()
            .map_err(|e| unavailable(&format!("Kafka at {}", settings.brokers), e))?;
        let topic = NewTopic::new(
            &settings.topic,
            1,
            TopicReplication::Fixed(settings.replication),
        );
        // A cluster that has just started drops connections while clients learn its brokers
        // (librdkafka retires its bootstrap connections) and while it elects a controller: such
        // errors are retried until the deadline, anything else is reported at once.
        let deadline = Instant::now() + TOPIC_CREATION_PATIENCE;
        loop {
            let (code, error) = match admin
                .create_topics(
                    [&topic],
                    &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
                )
                .await
            {
                Ok(created) => match created.into_iter().find_map(Result::err) {
                    None | Some((_, RDKafkaErrorCode::TopicAlreadyExists)) => break,
                    Some((_, code)) => (Some(code), code.to_string()),
                },
                // The client's own error keeps its text (not every one carries a code).
                Err(e) => (e.rdkafka_error_code(), e.to_string()),
            };
            if !code.is_some_and(transient_while_starting) || Instant::now() >= deadline {
                return Err(unavailable(
                    &format!("creating topic {} on {}", settings.topic, settings.brokers),
                    error,
                ));
            }
            tracing::debug!(topic = %settings.topic, %error, "retrying topic creation");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "30000")
            .set("linger.ms", "1")
            .create()
            .map_err(|e| unavailable("creating the producer", e))?;
        let inner = Arc::new(Inner {
            settings,
            producer,
            markers: AtomicBool::new(false),
        });
        Ok(KafkaOrderer { inner })
    }
}

/// How much of the log a block stream fetches ahead of its reader (about: librdkafka may
/// overshoot by one fetch).
const PREFETCH_KIB: usize = 8 * 1024;

impl Inner {
    /// A consumer of the topic's partition from `position` on (no consumer group state).
    fn consumer(&self, position: u64) -> Result<StreamConsumer, OrdererError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.settings.brokers)
            .set(
                "group.id",
                format!("chainify-{}-{nanos}", self.settings.topic),
            )
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            // An organization behind the log would otherwise fetch up to 64 MB ahead (librdkafka's
            // default): its memory grew with its lag (issue #17). 8 MB is still thousands of
            // transactions ahead of the block being executed.
            .set("queued.max.messages.kbytes", PREFETCH_KIB.to_string())
            // With the queue full librdkafka waits this long before fetching again (1 s by
            // default): an organization catching up would pause once per 8 MB.
            .set("fetch.queue.backoff.ms", "50")
            .create()
            .map_err(|e| unavailable("creating a consumer", e))?;
        let mut partitions = TopicPartitionList::new();
        let offset = i64::try_from(position).map_err(|e| unavailable("position", e))?;
        partitions
            .add_partition_offset(&self.settings.topic, 0, Offset::Offset(offset))
            .map_err(|e| unavailable("assigning the partition", e))?;
        consumer
            .assign(&partitions)
            .map_err(|e| unavailable("assigning the partition", e))?;
        Ok(consumer)
    }

    async fn produce(&self, entry: &LogEntry) -> Result<(), OrdererError> {
        let payload = encode_entry(entry);
        // Every consumer would skip it: refused here, by name, rather than lost.
        if payload.len() > MAX_ORDERED_TRANSACTION_BYTES + 1 {
            return Err(OrdererError::Unavailable(format!(
                "the transaction encodes to {} bytes; the log takes at most {MAX_ORDERED_TRANSACTION_BYTES}",
                payload.len() - 1
            )));
        }
        let record: FutureRecord<'_, (), Vec<u8>> = FutureRecord::to(&self.settings.topic)
            .partition(0)
            .payload(&payload);
        self.producer
            .send(record, Duration::from_secs(30))
            .await
            .map(|_| ())
            .map_err(|(e, _)| unavailable(&format!("producing to {}", self.settings.topic), e))
    }
}

/// Follows the log with its own cutter and appends a marker for the block being filled once its
/// first transaction (as seen here) has waited the batch timeout; again after every further
/// timeout until the block is cut.
async fn produce_markers(inner: std::sync::Weak<Inner>, consumer: StreamConsumer) {
    let (network, max, timeout, from) = match inner.upgrade() {
        Some(i) => (
            i.settings.network.clone(),
            i.settings.max_block_txs,
            i.settings.batch_timeout,
            i.settings.markers_from.block,
        ),
        None => return,
    };
    let mut cutter = BlockCutter::new(network, max, from);
    let mut oldest: Option<Instant> = None;
    loop {
        let wait = oldest.map_or(timeout, |t| timeout.saturating_sub(t.elapsed()));
        match tokio::time::timeout(wait.max(Duration::from_millis(1)), consumer.recv()).await {
            Ok(Ok(message)) => {
                let position = u64::try_from(message.offset()).unwrap_or(0) + 1;
                if let Some(entry) = message.payload().and_then(decode_entry) {
                    let is_tx = matches!(entry, LogEntry::Tx(_));
                    if cutter.push(entry, position).is_some() {
                        oldest = None;
                    } else if is_tx && oldest.is_none() {
                        oldest = Some(Instant::now());
                    }
                }
            }
            Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => {
                let Some(strong) = inner.upgrade() else {
                    return;
                };
                if oldest.is_some() {
                    let _ = strong
                        .produce(&LogEntry::TimeToCut(cutter.next_block()))
                        .await;
                    oldest = Some(Instant::now());
                }
            }
        }
        if inner.strong_count() == 0 {
            return;
        }
    }
}

impl Orderer for KafkaOrderer {
    async fn broadcast(&self, tx: ChainedTransaction) -> Result<(), OrdererError> {
        self.inner.produce(&LogEntry::Tx(tx)).await
    }

    async fn deliver(&self, from: Resume) -> Result<BlockStream, OrdererError> {
        self.deliver_on(from, Demand::always()).await
    }

    async fn deliver_on(&self, from: Resume, demand: Demand) -> Result<BlockStream, OrdererError> {
        // Only an instance that waits for blocks needs them cut; one that only broadcasts would
        // fetch and decode the whole log for nothing.
        if !self.inner.markers.swap(true, Ordering::AcqRel) {
            match self
                .inner
                .consumer(self.inner.settings.markers_from.position)
            {
                Ok(markers) => {
                    tokio::spawn(produce_markers(Arc::downgrade(&self.inner), markers));
                }
                Err(e) => {
                    self.inner.markers.store(false, Ordering::Release);
                    return Err(e);
                }
            }
        }
        let consumer = self.inner.consumer(from.position)?;
        let cutter = BlockCutter::new(
            self.inner.settings.network.clone(),
            self.inner.settings.max_block_txs,
            from.block,
        );
        let asking = (self.inner.settings.cut == Cut::OnDemand).then(|| Asking {
            orderer: Arc::downgrade(&self.inner),
            asked: None,
        });
        let stream = futures_util::stream::unfold(
            (consumer, cutter, asking, demand),
            |(consumer, mut cutter, mut asking, mut demand)| async move {
                loop {
                    // A message already fetched is read at once; only a reader that has caught
                    // up with the log, with a block half filled, asks for the cut, and only
                    // while it wants the block (a reader looking ahead waits for its demand).
                    let ready = consumer.recv().now_or_never();
                    let received = match ready {
                        Some(received) => received,
                        None => {
                            if let Some(asking) = &mut asking
                                && demand.wanted()
                            {
                                asking.ask(&cutter);
                            }
                            // `recv` takes a message only when it returns one: dropping it for
                            // a changed demand loses nothing.
                            tokio::select! {
                                received = consumer.recv() => received,
                                () = demand.changed() => continue,
                            }
                        }
                    };
                    let message = match received {
                        Ok(m) => m.detach(),
                        // librdkafka reports a lost broker connection and goes on fetching from
                        // the same offset once the partition has a leader again (a broker of a
                        // cluster died): nothing for the reader to do. With every broker gone
                        // (`AllBrokersDown`) the error reaches the reader, which says so.
                        Err(KafkaError::MessageConsumption(
                            RDKafkaErrorCode::BrokerTransportFailure,
                        )) => continue,
                        Err(e) => {
                            return Some((
                                Err(unavailable("consuming", e)),
                                (consumer, cutter, asking, demand),
                            ));
                        }
                    };
                    let position = u64::try_from(message.offset()).unwrap_or(0) + 1;
                    let Some(entry) = message.payload().and_then(decode_entry) else {
                        continue;
                    };
                    if let Some(block) = cutter.push(entry, position) {
                        return Some((Ok(block), (consumer, cutter, asking, demand)));
                    }
                }
            },
        );
        Ok(stream.boxed())
    }
}

/// A block stream's markers for the block being filled ([`Cut::OnDemand`]).
struct Asking {
    /// Weak, as the markers task's: a stream does not keep a dropped orderer producing.
    orderer: std::sync::Weak<Inner>,
    /// The block this stream last produced a marker for: once per block is enough.
    asked: Option<BlockNumber>,
}

impl Asking {
    /// Produces the time-to-cut marker of the block `cutter` is filling, unless it is empty or
    /// already asked for. The stream does not wait for the broker's acknowledgement: it reads the
    /// marker back from the log like any other entry, and a marker that is lost only leaves the
    /// block to the timeout.
    fn ask(&mut self, cutter: &BlockCutter) {
        let block = cutter.next_block();
        if cutter.pending() == 0 || self.asked == Some(block) {
            return;
        }
        let Some(orderer) = self.orderer.upgrade() else {
            return;
        };
        self.asked = Some(block);
        tokio::spawn(async move {
            if let Err(e) = orderer.produce(&LogEntry::TimeToCut(block)).await {
                tracing::debug!(%block, error = %e, "the on-demand time-to-cut marker was not produced");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::testing::signed_transaction;

    fn transaction(nonce: u64) -> ChainedTransaction {
        signed_transaction(&NetworkId::new("kafka").expect("a valid name"), nonce)
    }

    #[test]
    fn only_the_errors_of_a_starting_cluster_are_retried() {
        assert!(transient_while_starting(RDKafkaErrorCode::DestroyBroker));
        assert!(transient_while_starting(RDKafkaErrorCode::NotController));
        assert!(!transient_while_starting(
            RDKafkaErrorCode::TopicAuthorizationFailed
        ));
        assert!(!transient_while_starting(RDKafkaErrorCode::InvalidTopic));
        assert!(!transient_while_starting(RDKafkaErrorCode::InvalidConfig));
    }

    #[test]
    fn entries_round_trip_and_garbage_is_skipped() {
        let tx = LogEntry::Tx(transaction(3));
        assert_eq!(decode_entry(&encode_entry(&tx)), Some(tx));
        let cut = LogEntry::TimeToCut(BlockNumber(7));
        assert_eq!(decode_entry(&encode_entry(&cut)), Some(cut));
        assert_eq!(decode_entry(&[]), None);
        assert_eq!(decode_entry(&[9, 1, 2]), None);
        assert_eq!(decode_entry(&[TAG_CUT, 1, 2]), None);
        assert_eq!(decode_entry(&[TAG_TX, 0xff, 0xff]), None);
    }

    /// Any organization can produce to the topic: an entry longer than an ordered transaction
    /// may be (found by a hunt: blocks of them passed what a split organization's execution
    /// process accepts, which stalled it for good) is skipped by every consumer alike; one at
    /// the bound is taken.
    #[test]
    fn entries_longer_than_a_transaction_may_be_are_skipped() {
        let with_note = |bytes: usize| {
            let mut tx = transaction(5);
            tx.proposal.body.transaction.statements[0]
                .params
                .push(chainify_core::Value::Text("x".repeat(bytes)));
            encode_entry(&LogEntry::Tx(tx))
        };
        let base = with_note(0).len();
        // A text value costs its bytes and a few of framing.
        let at = (0..64)
            .map(|extra| with_note(MAX_ORDERED_TRANSACTION_BYTES + 1 - base - extra))
            .find(|e| e.len() == MAX_ORDERED_TRANSACTION_BYTES + 1)
            .expect("an entry of exactly the bound");
        assert!(matches!(decode_entry(&at), Some(LogEntry::Tx(_))));
        let over = with_note(MAX_ORDERED_TRANSACTION_BYTES + 1 - base);
        assert!(over.len() > MAX_ORDERED_TRANSACTION_BYTES + 1);
        assert_eq!(decode_entry(&over), None);
        // Found by a review: within the bound as received, past it as blocks carry it again
        // (each `.5` is written back `0.5`, a byte longer).
        let mut tx = transaction(6);
        let params = &mut tx.proposal.body.transaction.statements[0].params;
        params.clear();
        params.extend(std::iter::repeat_n(
            chainify_core::Value::Decimal("0.5".parse().expect("a decimal")),
            90_000,
        ));
        let mut wire = pb::ChainedTransaction::from(&tx);
        for p in &mut wire
            .proposal
            .as_mut()
            .expect("a proposal")
            .transaction
            .as_mut()
            .expect("a transaction")
            .statements[0]
            .params
        {
            p.kind = Some(pb::value::Kind::Decimal(".5".into()));
        }
        let mut short = vec![TAG_TX];
        short.extend(wire.encode_to_vec());
        assert!(
            short.len() <= MAX_ORDERED_TRANSACTION_BYTES + 1,
            "{}",
            short.len()
        );
        assert!(ordered_len(&tx) > MAX_ORDERED_TRANSACTION_BYTES);
        assert_eq!(decode_entry(&short), None);
    }
}
