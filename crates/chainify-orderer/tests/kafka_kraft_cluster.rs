//! The three-node KRaft cluster of `deploy/kafka` forms a quorum and orders chainify's
//! transactions: the shipped `kafka-N.properties`, moved onto loopback and private ports, start
//! three JVMs; a Kafka orderer creates its topic with three replicas and orders transactions;
//! with the partition's leader killed (SIGKILL), ordering goes on (min.insync.replicas = 2) and
//! every transaction arrives once, in order, at a consumer that was reading and at a new one.
//!
//! Needs the Kafka jars that `cargo xtask services start kafka` fetches (the test command does).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chainify_orderer::{BlockStream, Cut, KafkaOrderer, KafkaSettings, Orderer, Resume};
use chainify_testkit::conformance::orderer::{network, transaction};
use futures_util::StreamExt;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// Node n listens on BASE_PORT + 10·n (clients) and BASE_PORT + 10·n + 1 (controller): below
/// the kernel's ephemeral range (32768 on), so no outgoing connection can hold one (59300 was
/// inside it, and a node once exited at start).
const BASE_PORT: u16 = 28300;
const STARTED_LINE: &str = "Kafka Server started";

fn broker_port(n: u16) -> u16 {
    BASE_PORT + 10 * n
}

fn controller_port(n: u16) -> u16 {
    BASE_PORT + 10 * n + 1
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn java() -> PathBuf {
    std::env::var_os("JAVA_HOME")
        .map(|home| PathBuf::from(home).join("bin/java"))
        .filter(|j| j.exists())
        .unwrap_or_else(|| PathBuf::from("java"))
}

fn libs() -> PathBuf {
    let libs = workspace().join("target/services/kafka/libs");
    assert!(
        libs.is_dir(),
        "{} is missing: run `cargo xtask services start kafka` (it fetches the Kafka jars)",
        libs.display()
    );
    libs
}

/// A `java` command for a Kafka main class.
fn kafka(main_class: &str) -> Command {
    let mut cmd = Command::new(java());
    cmd.args(["-Xms128m", "-Xmx384m", "-XX:+UseG1GC"])
        .arg(format!(
            "-Dlog4j.configuration=file:{}",
            workspace()
                .join("deploy/dev/kafka/log4j.properties")
                .display()
        ))
        .arg("-cp")
        .arg(format!("{}/*", libs().display()))
        .arg(main_class);
    cmd
}

/// Node `n`'s shipped configuration, with every machine moved onto loopback.
fn render(n: u16, data: &Path) -> String {
    let mut text =
        std::fs::read_to_string(workspace().join(format!("deploy/kafka/kafka-{n}.properties")))
            .unwrap();
    for m in 1..=3 {
        text = text
            .replace(
                &format!("kafka{m}.example.net:9092"),
                &format!("127.0.0.1:{}", broker_port(m)),
            )
            .replace(
                &format!("kafka{m}.example.net:9093"),
                &format!("127.0.0.1:{}", controller_port(m)),
            );
    }
    let text = text
        .replace("0.0.0.0:9092", &format!("127.0.0.1:{}", broker_port(n)))
        .replace("0.0.0.0:9093", &format!("127.0.0.1:{}", controller_port(n)))
        .replace("/var/lib/kafka/data", &data.display().to_string());
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            !line.contains("example.net") && !line.contains("0.0.0.0"),
            "kafka-{n}.properties: {line:?} was not moved onto loopback"
        );
    }
    text
}

/// The three JVMs, killed when the test ends however it ends.
struct Nodes(Vec<(u16, Child, PathBuf)>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Nodes {
    fn start(dir: &Path) -> Nodes {
        let out = kafka("kafka.tools.StorageTool")
            .arg("random-uuid")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let cluster_id = String::from_utf8(out.stdout).unwrap();
        let cluster_id = cluster_id.lines().rfind(|l| !l.trim().is_empty()).unwrap();
        let mut nodes = Nodes(Vec::new());
        for n in 1..=3 {
            let config = dir.join(format!("kafka-{n}.properties"));
            std::fs::write(&config, render(n, &dir.join(format!("data-{n}")))).unwrap();
            let out = kafka("kafka.tools.StorageTool")
                .args(["format", "-t", cluster_id.trim(), "-c"])
                .arg(&config)
                .output()
                .unwrap();
            assert!(out.status.success(), "formatting node {n}: {out:?}");
            let log_path = dir.join(format!("kafka-{n}.log"));
            let log = std::fs::File::create(&log_path).unwrap();
            let child = kafka("kafka.Kafka")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            nodes.0.push((n, child, log_path));
        }
        let deadline = Instant::now() + Duration::from_secs(240);
        for (n, child, log) in &mut nodes.0 {
            loop {
                let text = std::fs::read_to_string(&*log).unwrap_or_default();
                if text.contains(STARTED_LINE) {
                    break;
                }
                let tail: String = text.lines().rev().take(30).collect::<Vec<_>>().join("\n");
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("Kafka node {n} exited ({status}):\n{tail}");
                }
                assert!(
                    Instant::now() < deadline,
                    "Kafka node {n} did not start within 240 s:\n{tail}"
                );
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        nodes
    }

    fn kill(&mut self, node: u16) {
        let (_, child, _) = self.0.iter_mut().find(|(n, _, _)| *n == node).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

fn brokers() -> String {
    (1..=3)
        .map(|n| format!("127.0.0.1:{}", broker_port(n)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Waits until the cluster's metadata lists all three brokers (each logs that it started
/// before the controllers have registered every broker).
fn wait_for_three_brokers() {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let seen = consumer
            .fetch_metadata(None, Duration::from_secs(5))
            .map(|m| m.brokers().len())
            .unwrap_or(0);
        if seen == 3 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster lists {seen} brokers after 120 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The node leading the topic's only partition.
fn leader(topic: &str) -> u16 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .unwrap();
    let leader = metadata.topics()[0].partitions()[0].leader();
    u16::try_from(leader).unwrap()
}

/// A block stream with the point after the last block it delivered.
struct Reading {
    stream: BlockStream,
    after: Resume,
}

/// The nonces of the next `count` transactions the stream delivers, in order. A stream that
/// fails is opened again after the last block it delivered, as the node does: librdkafka
/// connects to brokers as it needs them, and reports `AllBrokersDown` when the only broker it
/// was talking to dies though the others live.
async fn nonces(orderer: &KafkaOrderer, reading: &mut Reading, count: usize) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while out.len() < count {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = tokio::time::timeout(left, reading.stream.next())
            .await
            .expect("the blocks within 60 s")
            .expect("the stream goes on");
        match next {
            Ok(block) => {
                reading.after = Resume::after(&block);
                out.extend(block.transactions.iter().map(|t| t.proposal.body.nonce));
            }
            Err(e) => {
                eprintln!("the block stream failed ({e}); opening it again");
                reading.stream = orderer.deliver(reading.after).await.expect("deliver again");
            }
        }
    }
    out
}

#[test]
fn the_shipped_three_node_cluster_orders_through_the_loss_of_its_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Nodes::start(dir.path());
    wait_for_three_brokers();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let topic = "chainify-kraft-cluster";
    let settings = KafkaSettings {
        brokers: brokers(),
        topic: topic.into(),
        network: network(),
        max_block_txs: 4,
        batch_timeout: Duration::from_millis(200),
        cut: Cut::Timeout,
        replication: 3,
        markers_from: Resume::START,
    };
    let (orderer, mut reading) = runtime.block_on(async {
        // A freshly started cluster may still be settling its controller and brokers: creating
        // the replicated topic can fail transiently then (seen: DestroyBroker), so try again
        // until it is ready or a minute has passed.
        let ready_by = Instant::now() + Duration::from_secs(60);
        let orderer = loop {
            match KafkaOrderer::connect(settings.clone()).await {
                Ok(orderer) => break orderer,
                Err(e) if Instant::now() < ready_by => {
                    eprintln!("connecting to the fresh cluster: {e}; trying again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("kafka: {e:?}"),
            }
        };
        for nonce in 1..=8 {
            orderer
                .broadcast(transaction(nonce))
                .await
                .expect("broadcast");
        }
        let mut reading = Reading {
            stream: orderer.deliver(Resume::START).await.expect("deliver"),
            after: Resume::START,
        };
        assert_eq!(
            nonces(&orderer, &mut reading, 8).await,
            (1..=8).collect::<Vec<_>>()
        );
        (orderer, reading)
    });
    let dead = leader(topic);
    nodes.kill(dead);
    runtime.block_on(async {
        for nonce in 9..=16 {
            tokio::time::timeout(
                Duration::from_secs(60),
                orderer.broadcast(transaction(nonce)),
            )
            .await
            .unwrap_or_else(|_| panic!("broadcast {nonce} after node {dead} died"))
            .expect("broadcast");
        }
        assert_eq!(
            nonces(&orderer, &mut reading, 8).await,
            (9..=16).collect::<Vec<_>>(),
            "the consumer that was reading"
        );
        let fresh = KafkaOrderer::connect(settings).await.expect("kafka");
        let mut from_start = Reading {
            stream: fresh.deliver(Resume::START).await.expect("deliver"),
            after: Resume::START,
        };
        assert_eq!(
            nonces(&fresh, &mut from_start, 16).await,
            (1..=16).collect::<Vec<_>>(),
            "a new consumer from the start"
        );
    });
    assert_ne!(leader(topic), dead, "a surviving node leads the partition");
}
