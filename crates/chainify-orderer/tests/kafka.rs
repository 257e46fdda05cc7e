//! The orderer conformance suite on a real Kafka broker (started by `cargo xtask test`), plus two
//! orderer instances sharing one topic, as two organizations do.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chainify_core::BlockNumber;
use chainify_orderer::{Cut, KafkaOrderer, KafkaSettings, Orderer, Resume};
use chainify_testkit::conformance::orderer::{self as conformance, network, transaction};
use futures_util::StreamExt;

fn settings(test: &str, max: usize, timeout: Duration) -> KafkaSettings {
    let brokers = std::env::var("CHAINIFY_TEST_KAFKA_BROKERS").unwrap_or_else(|_| {
        panic!(
            "CHAINIFY_TEST_KAFKA_BROKERS is not set: run `cargo xtask test`, or `cargo xtask services start kafka` and `eval \"$(cargo xtask services env)\"`"
        )
    });
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    KafkaSettings {
        brokers,
        topic: format!("chainify-test-{test}-{nanos}"),
        network: network(),
        max_block_txs: max,
        batch_timeout: timeout,
        cut: Cut::Timeout,
        replication: 1,
        markers_from: Resume::START,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_by_count_and_by_timeout() {
    conformance::cuts_by_count_and_by_timeout(|max, timeout| async move {
        KafkaOrderer::connect(settings("cuts", max, timeout))
            .await
            .expect("kafka")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_agree_and_resume() {
    conformance::consumers_agree_and_resume(|max, timeout| async move {
        KafkaOrderer::connect(settings("agree", max, timeout))
            .await
            .expect("kafka")
    })
    .await;
}

/// An orderer on its own topic `name` that cuts on demand.
async fn on_demand(name: &str, max: usize, timeout: Duration) -> KafkaOrderer {
    KafkaOrderer::connect(KafkaSettings {
        cut: Cut::OnDemand,
        ..settings(name, max, timeout)
    })
    .await
    .expect("kafka")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_on_demand() {
    conformance::cuts_on_demand(|max, timeout| on_demand("demand", max, timeout)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looking_ahead_cuts_nothing() {
    conformance::looking_ahead_cuts_nothing(|max, timeout| on_demand("ahead", max, timeout)).await;
}

/// Reads blocks from the start until they hold `count` transactions.
async fn collect(o: &KafkaOrderer, count: usize) -> Vec<chainify_core::tx::TransactionBlock> {
    let mut stream = o.deliver(Resume::START).await.expect("deliver");
    let mut blocks = Vec::new();
    let mut seen = 0;
    while seen < count {
        let block = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("a block within 30 s")
            .expect("stream")
            .expect("block");
        seen += block.transactions.len();
        blocks.push(block);
    }
    blocks
}

/// Two instances cutting on demand (two organizations), each reading while the other produces:
/// their demand markers race in the log, and both still deliver the same blocks, which a third
/// reader that asks for nothing (it starts after the last transaction) reads alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_demands_cut_the_same_blocks_for_every_reader() {
    let s = KafkaSettings {
        cut: Cut::OnDemand,
        ..settings("racing", 6, Duration::from_secs(3600))
    };
    let a = KafkaOrderer::connect(s.clone()).await.expect("kafka");
    let b = KafkaOrderer::connect(s.clone()).await.expect("kafka");
    let produce = |o: KafkaOrderer, nonces: std::ops::Range<u64>| async move {
        for nonce in nonces {
            o.broadcast(transaction(nonce)).await.expect("broadcast");
            if nonce % 3 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let (from_a, from_b, (), ()) = tokio::join!(
        collect(&a, 40),
        collect(&b, 40),
        produce(a.clone(), 1..21),
        produce(b.clone(), 21..41),
    );
    assert_eq!(from_a, from_b);
    let numbers: Vec<u64> = from_a.iter().map(|b| b.number.0).collect();
    assert_eq!(numbers, (1..=from_a.len() as u64).collect::<Vec<_>>());
    let mut nonces: Vec<u64> = from_a
        .iter()
        .flat_map(|b| b.transactions.iter().map(|t| t.proposal.body.nonce))
        .collect();
    nonces.sort_unstable();
    assert_eq!(
        nonces,
        (1..=40).collect::<Vec<_>>(),
        "every transaction once"
    );
    assert!(
        from_a.iter().any(|b| b.transactions.len() < 6),
        "the readers' demands cut blocks before they filled (the timer waits an hour)"
    );
    let c = KafkaOrderer::connect(s).await.expect("kafka");
    assert_eq!(collect(&c, 40).await, from_a);
}

/// Two orderer instances on one topic (two organizations): both produce transactions and
/// time-to-cut markers, and both deliver the same blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_topic_cut_the_same_blocks() {
    let s = settings("shared", 4, Duration::from_millis(150));
    let a = KafkaOrderer::connect(s.clone()).await.expect("kafka");
    let b = KafkaOrderer::connect(s).await.expect("kafka");
    for nonce in 1..=14 {
        let orderer = if nonce % 2 == 0 { &a } else { &b };
        orderer
            .broadcast(transaction(nonce))
            .await
            .expect("broadcast");
        if nonce % 5 == 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let from_a = collect(&a, 14).await;
    let from_b = collect(&b, 14).await;
    assert_eq!(from_a, from_b);
    let numbers: Vec<u64> = from_a.iter().map(|b| b.number.0).collect();
    assert_eq!(numbers, (1..=from_a.len() as u64).collect::<Vec<_>>());
    assert!(
        from_a.iter().any(|b| b.transactions.len() < 4),
        "some blocks were cut by a marker"
    );
    assert_eq!(from_a[0].number, BlockNumber(1));
}

/// An instance that joins after block 1 (a restarted organization) follows the log from its
/// resume point and still cuts the next block by timeout with the right number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_instance_resumes_its_markers_from_its_last_block() {
    let s = settings("restart", 4, Duration::from_millis(300));
    let a = KafkaOrderer::connect(s.clone()).await.expect("kafka");
    for nonce in 1..=4 {
        a.broadcast(transaction(nonce)).await.expect("broadcast");
    }
    let block0 = a
        .deliver(Resume::START)
        .await
        .expect("deliver")
        .next()
        .await
        .expect("stream")
        .expect("block 1");
    drop(a);
    let b = KafkaOrderer::connect(KafkaSettings {
        markers_from: Resume::after(&block0),
        ..s
    })
    .await
    .expect("kafka");
    b.broadcast(transaction(5)).await.expect("broadcast");
    let mut blocks = b.deliver(Resume::after(&block0)).await.expect("deliver");
    let block1 = tokio::time::timeout(Duration::from_secs(30), blocks.next())
        .await
        .expect("block 1 is cut by the restarted instance's marker")
        .expect("stream")
        .expect("block");
    assert_eq!(block1.number, BlockNumber(2));
    assert_eq!(block1.transactions.len(), 1);
}

/// A topic the broker refuses is reported with its name and the broker's reason (an invalid
/// topic, which `connect` does not retry: see the unit test of `transient_while_starting`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_topic_is_reported_with_its_name_and_reason() {
    let mut s = settings("refused", 4, Duration::from_millis(150));
    s.topic = "chainify test has spaces".into();
    let error = KafkaOrderer::connect(s)
        .await
        .expect_err("an invalid topic name");
    let text = error.to_string();
    assert!(
        text.contains("chainify test has spaces") && text.to_lowercase().contains("invalid topic"),
        "the error names the topic and the reason: {text}"
    );
}

/// The topic's high watermark: how many entries (transactions and markers) it holds.
fn entries(s: &KafkaSettings) -> i64 {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &s.brokers)
        .set("group.id", format!("{}-watermarks", s.topic))
        .create()
        .expect("a consumer");
    consumer
        .fetch_watermarks(&s.topic, 0, Duration::from_secs(10))
        .expect("watermarks")
        .1
}

/// An instance that only broadcasts (a split organization's chainify component) follows no log
/// and produces no time-to-cut markers; once it delivers blocks, it cuts them by timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_instance_that_delivers_produces_markers() {
    let s = settings("broadcaster", 4, Duration::from_millis(100));
    let a = KafkaOrderer::connect(s.clone()).await.expect("kafka");
    a.broadcast(transaction(1)).await.expect("broadcast");
    // Ten batch timeouts: a following instance would have produced a marker long since.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(entries(&s), 1, "the transaction alone");
    let mut blocks = a.deliver(Resume::START).await.expect("deliver");
    let block = tokio::time::timeout(Duration::from_secs(30), blocks.next())
        .await
        .expect("the delivering instance cuts block 1 by its marker")
        .expect("stream")
        .expect("block");
    assert_eq!(block.transactions.len(), 1);
    assert!(entries(&s) >= 2, "a marker was produced");
}
