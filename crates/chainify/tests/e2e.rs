//! End to end with real processes: a dev network of three organizations (PostgreSQL, MariaDB,
//! PostgreSQL) with Kafka, each organization's execution, commit and chainify components in
//! their own `chainify node --component …` process, used through the SDK over TLS. Needs the
//! servers of `cargo xtask test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chainify_client::{Client, Code, Identity, Tx, TxState, Value};
use chainify_core::config::{NetworkConfig, OrgConfig};
use chainify_core::crypto::SigningKey;
use chainify_core::tx::LedgerEntry;
use chainify_proto::pb;
use chainify_storage::{AnyBackend, Store, StoreOptions};
use chainify_workload::{KeyDistribution, Smallbank};
use common::{chainify, ok};
use futures_util::StreamExt;

/// Stops the network however the test ends.
struct Devnet {
    dir: PathBuf,
}

impl Drop for Devnet {
    fn drop(&mut self) {
        let _ = chainify(&["devnet", "down", "--dir", self.dir.to_str().unwrap()]);
        if std::thread::panicking() {
            for org in 1..=3 {
                for process in ["execution", "commit", "chainify"] {
                    let log = self.dir.join(format!("org{org}/{process}.log"));
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(25).collect();
                    eprintln!("--- {} (last 25 lines, newest first)", log.display());
                    for l in tail {
                        eprintln!("{l}");
                    }
                }
            }
        }
    }
}

fn client(dir: &Path, org: u32, id: &str, key: SigningKey) -> Client {
    let network = NetworkConfig::load(&dir.join("network.toml")).unwrap();
    let endpoint = &network.orgs[&chainify_core::OrgId(org)].chainify_endpoint;
    let rt = tokio::runtime::Handle::current();
    rt.block_on(async {
        Client::connect(
            endpoint,
            network.network_id.as_str(),
            chainify_core::OrgId(org),
            Identity::new(id, key).unwrap(),
        )
        .tls_ca(dir.join("tls/ca.pem"))
        .unwrap()
        .org_key(network.orgs[&chainify_core::OrgId(org)].public_key)
        .connect()
        .await
        .unwrap()
    })
}

fn key(dir: &Path, client: &str) -> SigningKey {
    SigningKey::load(&dir.join(format!("clients/{client}.pk8"))).unwrap()
}

async fn heights(dir: &Path) -> Vec<u64> {
    let mut out = Vec::new();
    for org in 1..=3 {
        let cfg = OrgConfig::load(&dir.join(format!("org{org}/org.toml"))).unwrap();
        let ca = std::fs::read(dir.join("tls/ca.pem")).unwrap();
        let channel =
            chainify_client::channel(&cfg.listen.admin, Some(&ca), &cfg.org_id.tls_name()).unwrap();
        let mut admin = pb::admin_service_client::AdminServiceClient::new(channel);
        out.push(match admin.status(pb::StatusRequest {}).await {
            Ok(s) => s.into_inner().agreed_height,
            Err(_) => 0,
        });
    }
    out
}

async fn ledger(dir: &Path, org: u32) -> Vec<LedgerEntry> {
    let cfg = OrgConfig::load(&dir.join(format!("org{org}/org.toml"))).unwrap();
    let options = StoreOptions::default();
    let store = Store::open(
        AnyBackend::connect(&cfg.database_url, &options)
            .await
            .unwrap(),
        options,
    )
    .await
    .unwrap();
    let last = store.ledger_tail().await.unwrap().map_or(0, |(b, _)| b.0);
    let mut entries = Vec::new();
    for b in 1..=last {
        entries.push(
            chainify_node::ledger::entry(&store, chainify_core::BlockNumber(b))
                .await
                .unwrap(),
        );
    }
    store.close().await;
    entries
}

async fn tables(dir: &Path, org: u32) -> Vec<Vec<Vec<Value>>> {
    let cfg = OrgConfig::load(&dir.join(format!("org{org}/org.toml"))).unwrap();
    let options = StoreOptions::default();
    let store = Store::open(
        AnyBackend::connect(&cfg.database_url, &options)
            .await
            .unwrap(),
        options,
    )
    .await
    .unwrap();
    let mut all = Vec::new();
    for t in ["accounts", "savings", "checking"] {
        all.push(chainify_testkit::conformance::storage::dump(&store, t).await);
    }
    store.close().await;
    all
}

/// Submits Smallbank transactions from `workers` tasks spread over `orgs`, at least `n` in all
/// and on until `stop` is set; the ids.
async fn drive(
    dir: &Path,
    orgs: &[u32],
    n: usize,
    workers: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Vec<chainify_client::TxId> {
    let clients: Vec<Client> = orgs
        .iter()
        .map(|o| {
            let dir = dir.to_owned();
            let o = *o;
            tokio::task::block_in_place(|| client(&dir, o, "client1", key(&dir, "client1")))
        })
        .collect();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let c = clients[w % clients.len()].clone();
        let mut workload = Smallbank::new(
            1000,
            &KeyDistribution::Zipf { s: 1.1, v: 0.0 },
            seed + w as u64,
        );
        let share = n / workers;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            while ids.len() < share || !stop.load(Ordering::Relaxed) {
                let (_, tx) = workload.next_tx();
                loop {
                    match c.submit(tx.clone()).await {
                        Ok(id) => {
                            ids.push(id);
                            break;
                        }
                        Err(e)
                            if matches!(
                                e.code(),
                                Some(Code::Unavailable | Code::ResourceExhausted)
                            ) =>
                        {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("submit: {e}"),
                    }
                }
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.unwrap());
    }
    ids
}

async fn wait_all(c: &Client, ids: &[chainify_client::TxId]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut successes = 0;
    for id in ids {
        loop {
            match c.status(id).await.unwrap() {
                TxState::Committed(o) => {
                    assert!(o.agreed);
                    successes += usize::from(o.success);
                    break;
                }
                _ if Instant::now() > deadline => panic!("transaction {id} never committed"),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    successes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_postgres_mariadb_postgres_with_kafka() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("net");
    let d = dir.to_str().unwrap().to_owned();
    let up = tokio::task::spawn_blocking({
        let d = d.clone();
        move || {
            chainify(&[
                "devnet",
                "up",
                "--dir",
                &d,
                "--engines",
                "postgres,mariadb,postgres",
                "--orderer",
                "kafka",
                "--policy",
                "any-2",
                "--base-port",
                "27100",
                "--clients",
                "2",
                "--grant",
                "client2:checking:select+update",
                "--checkpoint-interval",
                "10",
                "--block-txs",
                "64",
                "--split",
            ])
        }
    })
    .await
    .unwrap();
    let _net = Devnet { dir: dir.clone() };
    ok(&up);

    // Reflection lists the services, on every server of an organization.
    let cfg = OrgConfig::load(&dir.join("org1/org.toml")).unwrap();
    let ca = std::fs::read(dir.join("tls/ca.pem")).unwrap();
    for (addr, expected) in [
        (
            &cfg.listen.chainify,
            vec![
                "chainify.v1.ChainifyService",
                "chainify.v1.EndorsementService",
            ],
        ),
        (&cfg.listen.commit, vec!["chainify.v1.CommitService"]),
        (
            &cfg.listen.admin,
            vec!["chainify.v1.AdminService", "chainify.v1.QueryService"],
        ),
        (
            cfg.listen.execution.as_ref().unwrap(),
            vec!["chainify.v1.ExecutionService"],
        ),
    ] {
        let services = reflection_services(addr, &ca, &cfg.org_id.tls_name()).await;
        for s in expected.iter().chain(["grpc.health.v1.Health"].iter()) {
            assert!(services.contains(*s), "{addr} lists {services:?}, not {s}");
        }
    }

    // Rejections, each with its status code; none reaches the ledger.
    let good = tokio::task::block_in_place(|| client(&dir, 1, "client1", key(&dir, "client1")));
    let deposit = || {
        Tx::new()
            .statement(
                "UPDATE checking SET bal = bal + $2 WHERE custid = $1",
                [Value::Int(3), Value::Int(5)],
            )
            .expect_rows(1)
    };
    let mallory =
        tokio::task::block_in_place(|| client(&dir, 1, "mallory", SigningKey::from_seed(&[7; 32])));
    let e = mallory.submit(deposit()).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    assert!(e.to_string().contains("mallory"), "{e}");
    let forger =
        tokio::task::block_in_place(|| client(&dir, 1, "client1", SigningKey::from_seed(&[8; 32])));
    let e = forger.submit(deposit()).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    assert!(e.to_string().contains("signature"), "{e}");
    let proposal = good.propose(deposit());
    let first = good.submit_proposal(proposal.clone()).await.unwrap();
    let e = good.submit_proposal(proposal).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::AlreadyExists), "{e}");
    assert!(e.to_string().contains("nonce"), "{e}");
    let e = good
        .submit(Tx::new().statement(
            "UPDATE checking SET bal = bal + RANDOM() WHERE custid = $1",
            [Value::Int(3)],
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    assert!(e.to_string().to_lowercase().contains("random"), "{e}");
    let restricted =
        tokio::task::block_in_place(|| client(&dir, 3, "client2", key(&dir, "client2")));
    let e = restricted
        .submit(Tx::new().statement(
            "UPDATE savings SET bal = bal + 1 WHERE custid = $1",
            [Value::Int(3)],
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::PermissionDenied), "{e}");
    assert!(e.to_string().contains("savings"), "{e}");
    // ... while what it is granted works, through another organization.
    let granted = restricted
        .submit_and_wait(
            Tx::new()
                .statement(
                    "UPDATE checking SET bal = bal + 1 WHERE custid = $1",
                    [Value::Int(4)],
                )
                .expect_rows(1),
        )
        .await
        .unwrap();
    assert!(granted.success && granted.agreed, "{granted:?}");
    let first = good.wait(&first, Duration::from_millis(100)).await.unwrap();
    assert!(first.success);

    // Load from 4 concurrent tasks through org1 and org3; org2's execution process is killed
    // under load (its commit and chainify processes stay up) and restarted.
    let stop = Arc::new(AtomicBool::new(false));
    let loader = tokio::spawn({
        let dir = dir.clone();
        let stop = stop.clone();
        async move { drive(&dir, &[1, 3], 1200, 4, 11, stop).await }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!loader.is_finished(), "the load runs while org2 is killed");
    let kill = tokio::task::spawn_blocking({
        let d = d.clone();
        move || {
            chainify(&[
                "devnet",
                "stop",
                "--dir",
                &d,
                "--org",
                "2",
                "--component",
                "execution",
                "--kill",
            ])
        }
    })
    .await
    .unwrap();
    ok(&kill);
    let commit_pid = std::fs::read_to_string(dir.join("org2/commit.pid")).unwrap();
    let before = heights(&dir).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = heights(&dir).await;
    assert!(
        during[0] > before[0] && during[2] > before[2],
        "org1 and org3 go on without org2: {before:?} → {during:?}"
    );
    let restart = tokio::task::spawn_blocking({
        let d = d.clone();
        move || {
            chainify(&[
                "devnet",
                "start",
                "--dir",
                &d,
                "--org",
                "2",
                "--component",
                "execution",
            ])
        }
    })
    .await
    .unwrap();
    ok(&restart);
    assert_eq!(
        std::fs::read_to_string(dir.join("org2/commit.pid")).unwrap(),
        commit_pid,
        "org2's commit process stayed up"
    );
    // ... and kept trying to reach its execution process meanwhile.
    let status = tokio::task::spawn_blocking({
        let cfg = dir.join("org2/org.toml");
        move || chainify(&["status", "--config", cfg.to_str().unwrap()])
    })
    .await
    .unwrap();
    let status = ok(&status);
    assert!(
        status.contains("failed executions (retried)") && status.contains("execution component"),
        "{status}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let ids = loader.await.unwrap();
    assert!(ids.len() >= 1200, "{} submitted", ids.len());
    assert_eq!(
        ids.iter().collect::<BTreeSet<_>>().len(),
        ids.len(),
        "distinct transaction ids"
    );
    let successes = wait_all(&good, &ids).await;
    assert!(
        successes > ids.len() / 2,
        "{successes} of {} Smallbank transactions succeeded",
        ids.len()
    );

    // The restarted organization catches up; every ledger and table is identical.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let h = heights(&dir).await;
        if h[1] == h[0] && h[0] == h[2] {
            break;
        }
        assert!(Instant::now() < deadline, "org2 did not catch up: {h:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let l1 = ledger(&dir, 1).await;
    for org in [2, 3] {
        let l = ledger(&dir, org).await;
        assert_eq!(l.len(), l1.len());
        for (a, b) in l1.iter().zip(&l) {
            assert_eq!(
                a.block, b.block,
                "ledger block {} of org{org}",
                a.block.number
            );
        }
    }
    let t1 = tables(&dir, 1).await;
    for org in [2, 3] {
        assert!(
            tables(&dir, org).await == t1,
            "org{org}'s tables differ from org1's"
        );
    }
    for org in ["1", "2", "3"] {
        let o = tokio::task::spawn_blocking({
            let net = dir.join("network.toml");
            move || {
                chainify(&[
                    "verify-ledger",
                    "--network",
                    net.to_str().unwrap(),
                    "--org",
                    org,
                ])
            }
        })
        .await
        .unwrap();
        let report = ok(&o);
        assert!(report.contains("\"ok\": true"), "org{org}: {report}");
    }

    // Every component process serves its own metrics: the phases it runs.
    let cfg1 = OrgConfig::load(&dir.join("org1/org.toml")).unwrap();
    for (addr, component, phase) in [
        (
            cfg1.listen.metrics_chainify.clone().unwrap(),
            "chainify",
            "endorse",
        ),
        (
            cfg1.listen.metrics_execution.clone().unwrap(),
            "execution",
            "execute",
        ),
        (cfg1.listen.metrics.clone(), "commit", "vote"),
    ] {
        let text = scrape(&addr).await;
        assert!(
            text.contains(&format!(
                "chainify_info{{org=\"1\",component=\"{component}\"}} 1"
            )),
            "{text}"
        );
        let count = format!("chainify_phase_seconds_count{{phase=\"{phase}\"}} ");
        let n: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&count)?.parse().ok())
            .unwrap_or_else(|| panic!("{count} missing from {component}:\n{text}"));
        assert!(n > 0.0, "{component}: no {phase} observations");
    }

    // A query reflects an agreed height and the agreed state.
    let rows = good
        .query(
            "SELECT custid, bal FROM checking WHERE custid = $1",
            [Value::Int(4)],
        )
        .await
        .unwrap();
    assert_eq!(rows.columns, ["custid", "bal"]);
    assert_eq!(rows.rows.len(), 1);
    assert!(rows.height >= granted.block.0);

    // The commit stream replays agreed blocks in order.
    let mut stream = good.commits(1).await.unwrap();
    for expected in 1..=3u64 {
        let e = stream.next().await.unwrap().unwrap();
        assert_eq!(e.block.0, expected);
        assert_eq!(
            e.outcomes.len(),
            l1[expected as usize - 1].block.tx_ids.len()
        );
    }
}

/// The body of `GET /metrics` at `addr`.
async fn scrape(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(
        response.starts_with("HTTP/1.1 200 OK"),
        "{addr}: {response}"
    );
    response
}

async fn reflection_services(addr: &str, ca: &[u8], tls_name: &str) -> BTreeSet<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let channel = chainify_client::channel(addr, Some(ca), tls_name).unwrap();
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(futures_util::stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let mut names = BTreeSet::new();
    if let Some(r) = responses.next().await
        && let Some(MessageResponse::ListServicesResponse(list)) = r.unwrap().message_response
    {
        names.extend(list.service.into_iter().map(|s| s.name));
    }
    names
}
