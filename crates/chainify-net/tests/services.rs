//! The services over real sockets with TLS: three organizations (SQLite) and the solo orderer
//! over gRPC in one test process, used through the SDK. Every rejection has its status code and
//! reaches nothing; outcomes, the commit stream, queries and the admin service report what the
//! ledger holds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use chainify_client::{Client, Code, Identity, Tx, TxState, Value};
use chainify_core::config::{
    GrantEntry, NetworkBuilder, NetworkConfig, OrdererFile, OrdererKind, OrgConfig, PortPlan,
    StatementKind, all_grants,
};
use chainify_core::crypto::SigningKey;
use chainify_core::tx::TransactionBlock;
use chainify_core::{BlockNumber, OrgId};
use chainify_net::tls::issue_network_certs;
use chainify_net::{
    ChainifySettings, Component, OrgRuntime, SoloServer, Tls, run_org, server_builder,
};
use chainify_orderer::LocalOrderer;
use chainify_proto::pb;
use chainify_proto::pb::orderer_service_server::{OrdererService, OrdererServiceServer};
use chainify_storage::{AnyBackend, StoreOptions};
use chainify_testkit::engines::load_smallbank;
use chainify_testkit::faulty::{self, Fault};
use futures_util::StreamExt;
use tokio::sync::oneshot;

struct Net {
    dir: PathBuf,
    network: NetworkConfig,
    client_key: Vec<u8>,
    stops: Vec<Option<oneshot::Sender<()>>>,
    runs: Vec<Option<tokio::task::JoinHandle<Result<(), chainify_net::NetError>>>>,
    ca: String,
    _tmp: tempfile::TempDir,
}

fn write(path: &Path, bytes: impl AsRef<[u8]>) {
    std::fs::write(path, bytes).unwrap();
}

/// Writes a network of three organizations on ports from `base` and starts it. Bases stay
/// below 32768, outside the ports the kernel hands out to outgoing connections (a test's own
/// client sockets could otherwise hold a port a server of another test needs).
async fn start(base: u16, chainify: ChainifySettings) -> Net {
    start_on(base, chainify, None).await
}

/// As [`start`], with the solo orderer misbehaving by `fault` on every block it delivers.
async fn start_faulty(base: u16, fault: Fault) -> Net {
    start_with(base, ChainifySettings::default(), None, Some(fault)).await
}

/// As [`start`], with organization 1 on the database at `org1_url` (Smallbank loaded) instead
/// of SQLite.
async fn start_on(base: u16, chainify: ChainifySettings, org1_url: Option<String>) -> Net {
    start_with(base, chainify, org1_url, None).await
}

async fn start_with(
    base: u16,
    chainify: ChainifySettings,
    org1_url: Option<String>,
    fault: Option<Fault>,
) -> Net {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let certs = issue_network_certs("svc", &[vec![], vec![], vec![]], &[]).unwrap();
    write(&dir.join("ca.pem"), &certs.ca.cert_pem);
    let mut builder = NetworkBuilder::new("svc", "any-2", PortPlan { base })
        .tables(&["accounts".into(), "savings".into(), "checking".into()])
        .block(32, 20)
        .orderer(OrdererFile {
            kind: OrdererKind::Solo,
            solo_endpoint: Some(format!("127.0.0.1:{}", base + 99)),
            ..OrdererFile::default()
        })
        .tls(Path::new("ca.pem"));
    let mut keys = Vec::new();
    for n in 1..=3u16 {
        let (key, der) = SigningKey::generate().unwrap();
        let org_dir = dir.join(format!("org{n}"));
        std::fs::create_dir_all(&org_dir).unwrap();
        write(&org_dir.join("key.pk8"), &der);
        write(
            &org_dir.join("tls.pem"),
            &certs.orgs[n as usize - 1].cert_pem,
        );
        write(
            &org_dir.join("tls.key"),
            &certs.orgs[n as usize - 1].key_pem,
        );
        builder.org(&key.public_key(), "127.0.0.1");
        keys.push(key);
    }
    let (client, client_der) = SigningKey::generate().unwrap();
    let (reader, reader_der) = SigningKey::generate().unwrap();
    write(&dir.join("reader.pk8"), &reader_der);
    builder.client("client1", &client.public_key(), all_grants());
    let checking = GrantEntry {
        table: "checking".into(),
        kinds: vec![StatementKind::Select, StatementKind::Update],
    };
    builder.client("reader", &reader.public_key(), vec![checking]);
    write(
        &dir.join("network.toml"),
        toml::to_string(&builder.build()).unwrap(),
    );
    let network = NetworkConfig::load(&dir.join("network.toml")).unwrap();

    // The solo orderer.
    let tls = Tls::from_pem(
        &certs.ca.cert_pem,
        Some((&certs.orderer.cert_pem, &certs.orderer.key_pem)),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", base + 99))
        .await
        .unwrap();
    let orderer = LocalOrderer::start(network.network_id.clone(), 32, Duration::from_millis(20));
    let solo = SoloServer::new(orderer, tokio::sync::watch::channel(false).1);
    let mut server = server_builder(Some(&tls)).unwrap();
    let server = match fault {
        None => server.add_service(OrdererServiceServer::new(solo)),
        Some(fault) => server.add_service(OrdererServiceServer::new(Faulty { solo, fault })),
    }
    .serve_with_incoming(chainify_net::incoming(listener));
    tokio::spawn(server);

    let mut net = Net {
        dir: dir.clone(),
        network,
        client_key: client_der,
        stops: Vec::new(),
        runs: Vec::new(),
        ca: certs.ca.cert_pem.clone(),
        _tmp: tmp,
    };
    for n in 1..=3u16 {
        let org_dir = dir.join(format!("org{n}"));
        let url = match (&org1_url, n) {
            (Some(url), 1) => url.clone(),
            _ => {
                let url = format!("sqlite://{}", org_dir.join("state.db").display());
                load_smallbank(&url, 100).await;
                url
            }
        };
        let port = base + 10 * (n - 1);
        write(
            &org_dir.join("org.toml"),
            format!(
                "org_id = {n}\nnetwork_config = \"../network.toml\"\nsigning_key = \"key.pk8\"\ndatabase_url = \"{url}\"\n\
                 [listen]\nchainify = \"127.0.0.1:{port}\"\ncommit = \"127.0.0.1:{}\"\nadmin = \"127.0.0.1:{}\"\nmetrics = \"127.0.0.1:{}\"\n\
                 [checkpoint]\ninterval_blocks = 5\n[tls]\ncert = \"tls.pem\"\nkey = \"tls.key\"\n",
                port + 1,
                port + 2,
                port + 3
            ),
        );
        net.stops.push(None);
        net.runs.push(None);
        net.start_org(n as usize, chainify.clone());
    }
    net
}

/// The solo orderer over gRPC, delivering every block as `fault` alters it.
struct Faulty {
    solo: SoloServer,
    fault: Fault,
}

#[tonic::async_trait]
impl OrdererService for Faulty {
    async fn broadcast(
        &self,
        request: tonic::Request<pb::BroadcastRequest>,
    ) -> Result<tonic::Response<pb::BroadcastResponse>, tonic::Status> {
        self.solo.broadcast(request).await
    }

    type DeliverStream = <SoloServer as OrdererService>::DeliverStream;

    async fn deliver(
        &self,
        request: tonic::Request<pb::DeliverRequest>,
    ) -> Result<tonic::Response<Self::DeliverStream>, tonic::Status> {
        let fault = self.fault;
        let honest = self.solo.deliver(request).await?.into_inner();
        Ok(tonic::Response::new(Box::pin(honest.map(move |b| {
            let block = TransactionBlock::try_from(b?).unwrap();
            Ok(pb::TransactionBlock::from(&faulty::apply(fault, 0, block)))
        }))))
    }
}

impl Net {
    fn start_org(&mut self, n: usize, chainify: ChainifySettings) {
        let config = OrgConfig::load(&self.dir.join(format!("org{n}/org.toml"))).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let run = tokio::spawn(run_org(
            config,
            OrgRuntime {
                node: None,
                chainify,
            },
            Component::All,
            async move {
                let _ = stopped.await;
            },
        ));
        self.stops[n - 1] = Some(stop);
        self.runs[n - 1] = Some(run);
    }

    async fn stop_org(&mut self, n: usize) {
        if let Some(stop) = self.stops[n - 1].take() {
            let _ = stop.send(());
        }
        if let Some(run) = self.runs[n - 1].take() {
            run.await.unwrap().expect("a graceful stop");
        }
    }

    async fn client(&self, org: u32, id: &str, key: SigningKey) -> Client {
        self.connect(org, ("svc", org), Identity::new(id, key).unwrap(), None)
            .await
    }

    /// Client `id` of organization `org`, connecting from the local address `from`.
    async fn client_from(&self, org: u32, id: &str, key: SigningKey, from: [u8; 4]) -> Client {
        let identity = Identity::new(id, key).unwrap();
        self.connect(org, ("svc", org), identity, Some(from)).await
    }

    async fn client1(&self, org: u32) -> Client {
        let key = SigningKey::from_pkcs8(&self.client_key, "client1").unwrap();
        self.client(org, "client1", key).await
    }

    /// Client 1 at organization `at`'s endpoint, believing it is in `network` and talking to
    /// organization `signs_for` (what a wrong or a replayed request looks like).
    async fn client1_misled(&self, at: u32, network: &str, signs_for: u32) -> Client {
        let key = SigningKey::from_pkcs8(&self.client_key, "client1").unwrap();
        let identity = Identity::new("client1", key).unwrap();
        self.connect(at, (network, signs_for), identity, None).await
    }

    /// `identity` at organization `at`'s endpoint, signing for `(network, org)`.
    async fn connect(
        &self,
        at: u32,
        (network, org): (&str, u32),
        identity: Identity,
        from: Option<[u8; 4]>,
    ) -> Client {
        let endpoint = &self.network.orgs[&chainify_core::OrgId(at)].chainify_endpoint;
        let mut connect = Client::connect(endpoint, network, chainify_core::OrgId(org), identity)
            .tls_ca_pem(self.ca.clone())
            .org_key(self.network.orgs[&OrgId(org)].public_key);
        if let Some(from) = from {
            connect = connect.local_address(std::net::IpAddr::from(from));
        }
        connect.connect().await.unwrap()
    }

    /// `GET path` on organization `org`'s metrics address: the raw HTTP response.
    async fn scrape(&self, org: u32, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let cfg = OrgConfig::load(&self.dir.join(format!("org{org}/org.toml"))).unwrap();
        let mut stream = tokio::net::TcpStream::connect(&cfg.listen.metrics)
            .await
            .unwrap();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    async fn admin(&self, org: u32) -> pb::StatusResponse {
        self.try_admin(org).await.unwrap()
    }

    /// The status, or why the organization does not answer.
    async fn try_admin(&self, org: u32) -> Result<pb::StatusResponse, tonic::Status> {
        let cfg = OrgConfig::load(&self.dir.join(format!("org{org}/org.toml"))).unwrap();
        let channel = chainify_client::channel(
            &cfg.listen.admin,
            Some(self.ca.as_bytes()),
            &OrgId(org).tls_name(),
        )
        .unwrap();
        pb::admin_service_client::AdminServiceClient::new(channel)
            .status(pb::StatusRequest {})
            .await
            .map(tonic::Response::into_inner)
    }
}

/// The value of the sample `name` (with its labels) in a metrics text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

fn deposit(custid: i64, amount: i64) -> Tx {
    Tx::new()
        .statement(
            "UPDATE checking SET bal = bal + $2 WHERE custid = $1",
            [Value::Int(custid), Value::Int(amount)],
        )
        .expect_rows(1)
}

/// Waits until every organization answers (three networks start side by side on two cores:
/// up to a minute), and fails with an organization's own error if it stopped instead.
async fn wait_ready(net: &mut Net) {
    for org in 1..=3 {
        let c = net.client1(org).await;
        for attempt in 0.. {
            match c
                .status(&chainify_client::TxId(chainify_core::Digest::ZERO))
                .await
            {
                Ok(_) => break,
                Err(e) => {
                    let slot = &mut net.runs[org as usize - 1];
                    if slot.as_ref().is_some_and(|r| r.is_finished())
                        && let Some(run) = slot.take()
                    {
                        panic!("org{org} stopped while starting: {:?}", run.await);
                    }
                    if attempt >= 600 {
                        panic!("org{org} does not answer: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_submit_through_any_organization_and_every_rejection_has_its_code() {
    let mut net = start(27100, ChainifySettings::default()).await;
    wait_ready(&mut net).await;
    let c1 = net.client1(1).await;
    let c3 = net.client1(3).await;

    // Concurrent submissions through two organizations: all ordered and agreed.
    let mut tasks = Vec::new();
    for i in 0..60i64 {
        let c = if i % 2 == 0 { c1.clone() } else { c3.clone() };
        tasks.push(tokio::spawn(async move {
            c.submit(deposit(i % 10 + 1, 1)).await.unwrap()
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    for id in &ids {
        let o = c1.wait(id, Duration::from_millis(50)).await.unwrap();
        assert!(o.success && o.agreed, "{o:?}");
    }
    // The height a chainify component in its own process follows: the current one at once,
    // then each new one, never ahead of the ledger.
    let cfg = OrgConfig::load(&net.dir.join("org3/org.toml")).unwrap();
    let admin = chainify_client::channel(
        &cfg.listen.admin,
        Some(net.ca.as_bytes()),
        &cfg.org_id.tls_name(),
    )
    .unwrap();
    let mut heights = pb::admin_service_client::AdminServiceClient::new(admin)
        .watch_ledger(pb::WatchLedgerRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = heights
        .message()
        .await
        .unwrap()
        .expect("the current height")
        .next_block;
    assert!(first > 1, "blocks were agreed: {first}");
    let waited = c3.submit_and_wait(deposit(1, 5)).await.unwrap();
    assert!(waited.success && waited.agreed);
    let next = heights
        .message()
        .await
        .unwrap()
        .expect("a new height")
        .next_block;
    assert!(next > first, "{next} after {first}");
    let agreed = net.admin(3).await.agreed_height;
    assert!(
        agreed + 1 >= next,
        "announced {next} with {agreed} in the ledger"
    );
    let failed = c1
        .submit_and_wait(
            deposit(1, 5)
                .statement(
                    "UPDATE savings SET bal = bal - $2 WHERE custid = $1 AND bal >= $2",
                    [Value::Int(1), Value::Int(1_000_000_000)],
                )
                .expect_rows(1),
        )
        .await
        .unwrap();
    assert!(!failed.success && failed.agreed);
    assert!(failed.reason.contains("statement 2"), "{failed:?}");
    // TxStatus answers the same from the organization's recent outcomes, reason and all.
    assert_eq!(
        c1.status(&failed.tx_id).await.unwrap(),
        TxState::Committed(failed.clone())
    );
    assert_eq!(
        c1.status(&waited.tx_id).await.unwrap(),
        TxState::Committed(waited.clone())
    );

    // Rejections.
    let unknown = net
        .client(1, "mallory", SigningKey::from_seed(&[1; 32]))
        .await;
    let e = unknown.submit(deposit(1, 1)).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    assert!(e.to_string().contains("mallory"));
    let forged = net
        .client(1, "client1", SigningKey::from_seed(&[2; 32]))
        .await;
    let e = forged.submit(deposit(1, 1)).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    let proposal = c1.propose(deposit(2, 1));
    let first = c1.submit_proposal(proposal.clone()).await.unwrap();
    let e = c1.submit_proposal(proposal.clone()).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::AlreadyExists), "{e}");
    // The same proposal through another organization once it is in the ledger. (Before, a second
    // origin may order it again: the copy is invalid at every organization alike, as a duplicate.)
    c1.wait(&first, Duration::from_millis(50)).await.unwrap();
    let e = c3.submit_proposal(proposal).await.unwrap_err();
    assert!(
        matches!(
            e.code(),
            Some(Code::AlreadyExists | Code::FailedPrecondition)
        ),
        "{e}"
    );
    let e = c1
        .submit(Tx::new().statement(
            "UPDATE checking SET bal = bal + 1 WHERE custid = RANDOM()",
            [],
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    assert!(e.to_string().contains("statement 1"), "{e}");
    // Within the bound as signed (nine bytes an integer), past it on the wire (a large
    // one takes ten there, and three of framing): the log could not hold it with its endorsements.
    let wide = Tx::new().statement(
        "UPDATE checking SET bal = bal + 1 WHERE custid = $1",
        vec![Value::Int(i64::MAX); 50_000],
    );
    let e = c1.submit(wide).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    assert!(
        e.to_string()
            .contains("bytes on the wire; at most 524288 are ordered"),
        "{e}"
    );
    let reader_key = SigningKey::load(&net.dir.join("reader.pk8")).unwrap();
    let reader = net.client(3, "reader", reader_key).await;
    let e = reader
        .submit(Tx::new().statement("DELETE FROM checking WHERE custid = $1", [Value::Int(1)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::PermissionDenied), "{e}");
    assert!(e.to_string().contains("checking"), "{e}");
    let other_network = net.client1_misled(1, "elsewhere", 1).await;
    let e = other_network.submit(deposit(1, 1)).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    assert!(e.to_string().contains("elsewhere"), "{e}");
    assert_eq!(
        c1.status(&chainify_client::TxId(chainify_core::Digest::of(b"never")))
            .await
            .unwrap(),
        TxState::Unknown
    );

    // Nothing rejected reached the ledger: 60 + 2 + 1 accepted transactions in all blocks.
    let mut stream = c1.commits(1).await.unwrap();
    let mut seen = 0;
    let mut block = 0;
    while seen < 63 {
        let e = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("commit events")
            .unwrap()
            .unwrap();
        block += 1;
        assert_eq!(e.block.0, block, "blocks in order without gaps");
        seen += e.outcomes.len();
    }
    assert_eq!(seen, 63);
    let heights: Vec<u64> = [
        net.admin(1).await.agreed_height,
        net.admin(2).await.agreed_height,
        net.admin(3).await.agreed_height,
    ]
    .to_vec();
    assert!(heights.iter().all(|h| *h >= block), "{heights:?}");

    // The Prometheus endpoint shows the same heights and every phase the blocks went through.
    let metrics = net.scrape(1, "/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
    assert!(
        metrics.contains("chainify_info{org=\"1\",component=\"all\"} 1"),
        "{metrics}"
    );
    let height = metric(&metrics, "chainify_block_height{component=\"commit\"}");
    assert!(height >= block as f64, "{height} after block {block}");
    for phase in [
        "endorse", "order", "validate", "analyse", "execute", "digest", "vote", "append",
    ] {
        let n = metric(
            &metrics,
            &format!("chainify_phase_seconds_count{{phase=\"{phase}\"}}"),
        );
        assert!(n > 0.0, "no {phase} observations:\n{metrics}");
    }
    assert_eq!(metric(&metrics, "chainify_state{state=\"running\"}"), 1.0);
    assert!(metric(&metrics, "chainify_db_connections{state=\"max\"}") >= 1.0);
    assert!(metric(&metrics, "chainify_db_connections{state=\"open\"}") >= 1.0);
    metric(&metrics, "chainify_queue_depth{queue=\"node_inbox\"}");
    metric(
        &metrics,
        "chainify_queue_depth{queue=\"chainify_in_flight\"}",
    );
    assert!(net.scrape(1, "/").await.starts_with("HTTP/1.1 404"));

    // Queries: the agreed state at an agreed height, checked like transactions.
    let rows = c3
        .query(
            "SELECT custid, bal FROM checking WHERE custid <= $1 ORDER BY custid",
            [Value::Int(2)],
        )
        .await
        .unwrap();
    assert_eq!(rows.columns, ["custid", "bal"]);
    assert!(
        rows.height >= block,
        "height {} after block {block}",
        rows.height
    );
    let initial = |custid: i64| {
        rows.rows
            .iter()
            .find(|r| r[0] == Value::Int(custid))
            .map(|r| r[1].clone())
            .unwrap()
    };
    // custid 1 got six deposits of 1 (i % 10 == 0), one of 5 and one rolled back; 2 got six
    // and the replayed proposal's one.
    let Value::Int(b1) = initial(1) else { panic!() };
    let Value::Int(b2) = initial(2) else { panic!() };
    assert_eq!(b1 - b2, 5 - 1, "balances {b1} and {b2}");
    let count = c1.query("SELECT COUNT(*) FROM accounts", []).await.unwrap();
    assert_eq!(count.rows, vec![vec![Value::Int(100)]]);
    let e = c1
        .query("SELECT SUM(bal) FROM checking", [])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    assert!(e.to_string().contains("SUM"), "{e}");
    let e = c1
        .query("UPDATE checking SET bal = 0", [])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    let e = reader
        .query("SELECT custid FROM savings", [])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::PermissionDenied), "{e}");
    assert!(
        reader
            .query("SELECT custid FROM checking WHERE custid = 1", [])
            .await
            .is_ok()
    );
    let e = forged
        .query("SELECT custid FROM checking", [])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    // A client told that organization 2's endpoint is organization 1's does not reach it: the
    // certificate there names organization 2 (every certificate names localhost too).
    let misled = net.client1_misled(2, "svc", 1).await;
    let e = misled
        .query("SELECT COUNT(*) FROM accounts", [])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::Unavailable), "{e}");
    assert!(
        e.to_string()
            .contains("not valid for name \"org1.chainify.internal\"")
            && e.to_string().contains("org2.chainify.internal"),
        "{e}"
    );
    // A query signed for organization 1, relayed by organization 1 to organization 2 (it may
    // present its own certificate), is refused there, naming the organization it must be
    // signed for.
    let body = chainify_core::tx::QueryBody {
        client: chainify_core::ClientId::new("client1").unwrap(),
        network: net.network.network_id.clone(),
        org: OrgId(1),
        sql: "SELECT COUNT(*) FROM accounts".into(),
        params: vec![],
        nonce: None,
    };
    let key = SigningKey::from_pkcs8(&net.client_key, "client1").unwrap();
    let signature = key.sign(&body.encode_canonical());
    let endpoint = &net.network.orgs[&OrgId(2)].chainify_endpoint;
    let channel =
        chainify_client::channel(endpoint, Some(net.ca.as_bytes()), &OrgId(2).tls_name()).unwrap();
    let e = pb::chainify_service_client::ChainifyServiceClient::new(channel)
        .query(pb::QueryRequest {
            sql: body.sql.clone(),
            params: vec![],
            client_id: "client1".into(),
            signature: signature.0.to_vec(),
            nonce: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    assert!(e.message().contains("organization 2"), "{e}");
    // A nonce is 16 bytes or none; one the client did not sign fails its signature.
    let endpoint = &net.network.orgs[&OrgId(1)].chainify_endpoint;
    let channel =
        chainify_client::channel(endpoint, Some(net.ca.as_bytes()), &OrgId(1).tls_name()).unwrap();
    let mut org1 = pb::chainify_service_client::ChainifyServiceClient::new(channel);
    let request = |nonce: Vec<u8>| pb::QueryRequest {
        sql: body.sql.clone(),
        params: vec![],
        client_id: "client1".into(),
        signature: signature.0.to_vec(),
        nonce,
    };
    let e = org1.query(request(vec![1; 15])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(
        e.message()
            .contains("nonce: expected 16 bytes or none, got 15"),
        "{e}"
    );
    let e = org1.query(request(vec![1; 16])).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e}");
    org1.query(request(vec![]))
        .await
        .expect("the query as signed, without a nonce (a client of an earlier version)");

    // With two organizations gone, Any-2 endorsement cannot be met: UNAVAILABLE, nothing ordered.
    net.stop_org(2).await;
    net.stop_org(3).await;
    let e = c1.submit(deposit(3, 1)).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::Unavailable), "{e}");
    assert!(
        e.to_string().contains("org2") && e.to_string().contains("org3"),
        "{e}"
    );
    // They come back and catch up.
    net.start_org(2, ChainifySettings::default());
    net.start_org(3, ChainifySettings::default());
    wait_ready(&mut net).await;
    let o = c1.submit_and_wait(deposit(3, 1)).await.unwrap();
    assert!(o.success);
    // The outcome organization 1 reported is proven by the agreed block organization 3 serves,
    // over its CommitService; one bent by its reporter is not.
    wait_height(&net, 3, o.block.0, "the deposit's block").await;
    let entry = chainify_client::operator::prove_outcome(&net.network, OrgId(3), &o)
        .await
        .expect("proven");
    assert_eq!(entry.block.number, o.block);
    assert!(
        entry.certificate.votes.len() >= 2,
        "{:?}",
        entry.certificate
    );
    for (bent, what) in [
        (
            chainify_client::TxOutcome {
                success: false,
                ..o.clone()
            },
            "the outcome says it aborted, the agreed block says it committed",
        ),
        (
            chainify_client::TxOutcome {
                index: o.index + 1,
                ..o.clone()
            },
            "none at index",
        ),
    ] {
        let e = chainify_client::operator::prove_outcome(&net.network, OrgId(3), &bent)
            .await
            .expect_err(what)
            .to_string();
        assert!(e.contains(what), "{e}");
    }
    let e = chainify_client::operator::prove_outcome(
        &net.network,
        OrgId(3),
        &chainify_client::TxOutcome {
            block: BlockNumber(o.block.0 + 1_000),
            ..o.clone()
        },
    )
    .await
    .expect_err("no such block")
    .to_string();
    assert!(e.contains("has no agreed block"), "{e}");
    net.stop_org(1).await;
    net.stop_org(2).await;
    net.stop_org(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byzantine_peer_cannot_speak_for_another_organization() {
    // A Byzantine org3 forwards a client's proposal to org2's EndorsementService claiming to be
    // org1, to burn the client's nonce there for org1. The batch must carry the named
    // organization's signature: refused, and the client's real submission through org1 goes on.
    let mut net = start(27500, ChainifySettings::default()).await;
    wait_ready(&mut net).await;
    let c1 = net.client1(1).await;
    let proposal = c1.propose(deposit(3, 1));
    let id = chainify_core::tx::Proposal::try_from(proposal.clone())
        .unwrap()
        .tx_id();
    let org3 = SigningKey::load(&net.dir.join("org3/key.pk8")).unwrap();
    let endpoint = &net.network.orgs[&OrgId(2)].chainify_endpoint;
    let channel =
        chainify_client::channel(endpoint, Some(net.ca.as_bytes()), &OrgId(2).tls_name()).unwrap();
    let mut peer = pb::endorsement_service_client::EndorsementServiceClient::new(channel);
    let network = net.network.network_id.clone();
    let signed = |from: u32, key: &SigningKey| pb::EarlyAbortBatch {
        from_org: from,
        proposals: vec![proposal.clone()],
        signature: key
            .sign(&chainify_core::tx::EarlyAbortBatch::signing_bytes(
                &network,
                chainify_core::OrgId(from),
                &[id],
            ))
            .0
            .to_vec(),
    };
    for (batch, why) in [
        (signed(1, &org3), "signed by org3, claiming org1"),
        (
            pb::EarlyAbortBatch {
                signature: Vec::new(),
                ..signed(1, &org3)
            },
            "unsigned",
        ),
        (signed(2, &org3), "claiming to be the receiver"),
        (signed(9, &org3), "an organization outside the network"),
    ] {
        let e = peer.early_abort(batch).await.unwrap_err();
        assert!(
            matches!(e.code(), Code::Unauthenticated | Code::InvalidArgument),
            "{why}: {e:?}"
        );
    }
    // Nothing was claimed: the client's own submission through org1 is endorsed and agreed.
    let submitted = c1.submit_proposal(proposal.clone()).await.unwrap();
    let o = c1
        .wait(&submitted, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(o.success && o.agreed, "{o:?}");
    // Signed by the organization it names, the same batch is answered (a replay of what org1
    // itself sent: the nonce is the same transaction's, so not a burn).
    let answer = peer
        .early_abort(signed(3, &org3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.responses.len(), 1);
    for n in 1..=3 {
        net.stop_org(n).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_server_refuses_with_resource_exhausted() {
    let mut net = start(
        27300,
        ChainifySettings {
            max_in_flight: 1,
            max_commit_streams: 3,
            max_commit_streams_per_address: 2,
            max_lookups: 1,
            query_wait: Duration::from_millis(1),
            ..ChainifySettings::default()
        },
    )
    .await;
    wait_ready(&mut net).await;
    // A connection that never starts its TLS handshake is closed after TLS_HANDSHAKE_TIMEOUT.
    let mut idle = tokio::net::TcpStream::connect(("127.0.0.1", 27300))
        .await
        .unwrap();
    let c = net.client1(1).await;
    // Commit streams: two open from this address, a third refused by name; closing one frees
    // its place.
    let first = c.commits(0).await.unwrap();
    let _second = c.commits(0).await.unwrap();
    let Err(e) = c.commits(0).await else {
        panic!("a third commit stream was opened from one address with a limit of 2");
    };
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    assert!(e.to_string().contains("max_commit_streams"), "{e}");
    drop(first);
    // Status lookups: one at a time reads the database; those that cannot start within
    // query_wait are refused by name, the rest answered.
    // Many at once: on a loaded machine requests arrive spread out, and 200 once all found the
    // place free in time.
    let lookups = (0..1000u32).map(|i| {
        let c = c.clone();
        async move {
            c.status(&chainify_client::TxId(chainify_core::Digest::of(
                &i.to_le_bytes(),
            )))
            .await
        }
    });
    let (states, busy) =
        exhausted_apart(futures_util::future::join_all(lookups).await, "max_lookups");
    for state in states {
        assert!(matches!(state, TxState::Unknown), "{state:?}");
    }
    assert!(
        busy > 0,
        "1 000 lookups at once with one place, none waited past 1 ms"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let _third = loop {
        match c.commits(0).await {
            Ok(stream) => break stream,
            Err(e) if tokio::time::Instant::now() < deadline => {
                assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("a closed stream's place was not freed: {e}"),
        }
    };
    let mut tasks = Vec::new();
    for i in 0..40i64 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.submit(deposit(i % 10 + 1, 1)).await
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let (accepted, exhausted) = exhausted_apart(answers, "overloaded");
    assert!(
        exhausted > 0,
        "40 concurrent submissions with one slot: some are refused"
    );
    assert!(!accepted.is_empty());
    for id in &accepted {
        assert!(c.wait(id, Duration::from_millis(50)).await.unwrap().agreed);
    }
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(
        chainify_net::TLS_HANDSHAKE_TIMEOUT * 3,
        tokio::io::AsyncReadExt::read(&mut idle, &mut byte),
    )
    .await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "a connection without a handshake was kept: {read:?}"
    );
}

/// The answers that succeeded, and how many were refused with RESOURCE_EXHAUSTED naming
/// `named`; any other failure fails the test.
fn exhausted_apart<T>(
    answers: Vec<Result<T, chainify_client::ClientError>>,
    named: &str,
) -> (Vec<T>, usize) {
    let mut exhausted = 0;
    let mut ok = Vec::new();
    for answer in answers {
        match answer {
            Ok(t) => ok.push(t),
            Err(e) => {
                assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
                assert!(e.to_string().contains(named), "{e}");
                exhausted += 1;
            }
        }
    }
    (ok, exhausted)
}

/// Waits until organization `org` has agreed `height` blocks.
async fn wait_height(net: &Net, org: u32, height: u64, what: &str) {
    let mut last = String::new();
    for _ in 0..1200 {
        // The organization may still be starting: not answering yet is not a failure.
        match net.try_admin(org).await {
            Ok(s) if s.agreed_height >= height => return,
            Ok(s) => last = format!("at {}", s.agreed_height),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: org{org} {last}, not at {height}");
}

/// A wiped organization (its database recreated with the initial tables only) rejoins under load
/// from another organization's verified checkpoint, over gRPC, instead of replaying every block;
/// afterwards its tables, state digest and ledger are the others'. Nobody outside the network
/// may read the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_organization_fast_joins_from_a_peer_under_load() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut net = start(27700, ChainifySettings::default()).await;
    wait_ready(&mut net).await;
    let stop = Arc::new(AtomicBool::new(false));
    let c1 = net.client1(1).await;
    let load = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut accepted = 0u64;
            let mut n = 0i64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                if c1.submit(deposit(1 + n % 100, 1)).await.is_ok() {
                    accepted += 1;
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            accepted
        })
    };
    wait_height(&net, 1, 12, "load before the wipe").await;
    net.stop_org(3).await;
    let db = net.dir.join("org3/state.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    load_smallbank(&format!("sqlite://{}", db.display()), 100).await;
    let wiped_at = net.admin(1).await.agreed_height;
    net.start_org(3, ChainifySettings::default());
    wait_height(&net, 3, wiped_at + 5, "the wiped organization under load").await;
    stop.store(true, Ordering::Relaxed);
    assert!(load.await.unwrap() > 0, "the load went through");
    // Quiet now: everybody reaches the same height.
    let top = net.admin(1).await.agreed_height;
    for org in 2..=3 {
        wait_height(&net, org, top, "the end of the load").await;
    }

    let metrics = net.scrape(3, "/metrics").await;
    assert_eq!(metric(&metrics, "chainify_state_transfers_total"), 1.0);
    let executed = metric(&metrics, "chainify_block_transactions_count");
    assert!(
        executed < top as f64 - 5.0,
        "org3 executed {executed} blocks of {top}: it replayed instead of joining"
    );
    let mut states = Vec::new();
    for org in 1..=3 {
        let url = format!(
            "sqlite://{}",
            net.dir.join(format!("org{org}/state.db")).display()
        );
        let options = StoreOptions {
            read_only: true,
            ..StoreOptions::default()
        };
        let store = chainify_storage::Store::open(
            AnyBackend::connect(&url, &options).await.unwrap(),
            options,
        )
        .await
        .unwrap();
        let check = store.check_state().await.unwrap();
        assert!(check.agrees(), "org{org}: {check:?}");
        states.push((
            check.block,
            check.actual,
            store.ledger_tail().await.unwrap(),
        ));
    }
    assert_eq!(states[2], states[0], "org3 and org1 differ");
    assert_eq!(states[1], states[0], "org2 and org1 differ");

    // The state RPCs answer organizations only: unsigned, and signed by a key outside the
    // network, both refused.
    let commit = &net.network.orgs[&OrgId(1)].commit_endpoint;
    let channel =
        chainify_client::channel(commit, Some(net.ca.as_bytes()), &OrgId(1).tls_name()).unwrap();
    let mut peer = pb::commit_service_client::CommitServiceClient::new(channel);
    let e = peer
        .state_offer(pb::StateOfferRequest { auth: None })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let (stranger, _) = SigningKey::generate().unwrap();
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let bytes = chainify_net::state::signing_bytes(
        &net.network.network_id,
        chainify_core::OrgId(2),
        chainify_core::OrgId(1),
        unix_ms,
        "StateRows",
        0,
        "checking",
    );
    let refused = peer
        .state_rows(pb::StateRowsRequest {
            auth: Some(pb::StateAuth {
                org_id: 2,
                unix_ms,
                signature: stranger.sign(&bytes).0.to_vec(),
            }),
            block: 0,
            table: "checking".into(),
            ranges: vec![0],
        })
        .await;
    let Err(e) = refused else {
        panic!("a stranger read rows")
    };
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    for n in 1..=3 {
        net.stop_org(n).await;
    }
}

/// A query that would run for minutes (four tables joined with no key, a text built on every
/// row) holds no block back: the organization commits while it runs, and the engine stops it
/// after `query_timeout` with RESOURCE_EXHAUSTED naming the setting; queries beyond
/// `max_queries` wait, then are refused, so they cannot take the blocks' connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_query_is_stopped_and_holds_no_block_back() {
    let settings = ChainifySettings {
        query_timeout: Duration::from_secs(3),
        max_queries: 1,
        query_wait: Duration::from_secs(1),
        ..ChainifySettings::default()
    };
    // Organization 1 on PostgreSQL: there a query's statement runs on the server, where a
    // caller that gives up could leave it running.
    let pg = chainify_testkit::engines::smallbank_db("postgres", "svc_slow_query", 100).await;
    let mut net = start_on(27900, settings, Some(pg)).await;
    wait_ready(&mut net).await;
    let c1 = net.client1(1).await;
    let asker = net.client1(1).await;
    let slow = tokio::spawn(async move {
        asker
            .query(
                "SELECT COUNT(*) FROM accounts a, savings b, checking c, accounts d \
                 WHERE a.name || d.name <> '' AND b.custid <> c.custid",
                [],
            )
            .await
    });
    let o = c1.submit_and_wait(deposit(1, 1)).await.unwrap();
    assert!(o.success);
    assert!(
        !slow.is_finished(),
        "the transaction was agreed only after the query ended"
    );
    // The one query slot is taken: another query waits `query_wait`, then is refused.
    let e = c1
        .query("SELECT bal FROM checking WHERE custid = 1", [])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    assert!(e.to_string().contains("max_queries"), "{e}");
    let e = slow.await.unwrap().unwrap_err();
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    assert!(e.to_string().contains("query_timeout"), "{e}");
    // A caller that gives up leaves the query to run out on its slot and connection: the slot
    // is not free until the engine stopped the statement.
    let quitter = net.client1(1).await;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        quitter.query(
            "SELECT COUNT(*) FROM accounts a, savings b, checking c, accounts d \
             WHERE a.name || d.name <> '' AND b.custid <> c.custid",
            [],
        ),
    )
    .await;
    assert!(gave_up.is_err(), "the query was still running");
    let e = c1
        .query("SELECT bal FROM checking WHERE custid = 1", [])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    // Once the engine stopped it, the slot is free again.
    let mut tries = 0;
    let rows = loop {
        match c1
            .query("SELECT bal FROM checking WHERE custid = 1", [])
            .await
        {
            Ok(rows) => break rows,
            Err(e) if e.code() == Some(Code::ResourceExhausted) && tries < 10 => tries += 1,
            Err(e) => panic!("{e}"),
        }
    };
    assert!(rows.height >= o.block.0, "{} < {}", rows.height, o.block);
    for n in 1..=3 {
        net.stop_org(n).await;
    }
}

/// One client cannot take every place from the others (THREATS: a client "must not be able to
/// stall or exhaust a process"). Its slow queries hold at most `max_queries_per_client` of the
/// slots, so another client's query runs at once; its submissions fill at most
/// `max_in_flight_per_address`, so another address's are all taken; its flood of status lookups
/// waits behind another address's. Before, the first two made every other client wait out its
/// deadline and be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_client_cannot_take_every_place_from_the_others() {
    let settings = ChainifySettings {
        max_queries: 2,
        max_queries_per_client: 1,
        query_timeout: Duration::from_secs(3),
        query_wait: Duration::from_secs(1),
        max_in_flight: 8,
        max_in_flight_per_address: 4,
        max_lookups: 1,
        max_lookups_per_address: 1,
        ..ChainifySettings::default()
    };
    let mut net = start(28500, settings).await;
    wait_ready(&mut net).await;
    let flood = net.client1(1).await;
    let reader_key = SigningKey::from_pkcs8(
        &std::fs::read(net.dir.join("reader.pk8")).unwrap(),
        "reader",
    )
    .unwrap();
    let other = net
        .client_from(1, "reader", reader_key, [127, 0, 0, 2])
        .await;
    let client1_key = SigningKey::from_pkcs8(&net.client_key, "client1").unwrap();
    let elsewhere = net
        .client_from(1, "client1", client1_key, [127, 0, 0, 2])
        .await;

    // Queries: the flooding client's first query runs until `query_timeout`; its others wait
    // for its own slot and are refused after `query_wait`, naming the share.
    let slow = "SELECT COUNT(*) FROM accounts a, savings b, checking c, accounts d \
                WHERE a.name || d.name || a.name || d.name <> '' AND b.custid <> c.custid";
    let slow_queries: Vec<_> = (0..4)
        .map(|_| {
            let flood = flood.clone();
            tokio::spawn(async move { flood.query(slow, []).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rows = other
        .query("SELECT bal FROM checking WHERE custid = 1", [])
        .await
        .expect("another client's query runs beside the flood");
    assert_eq!(rows.rows.len(), 1);
    let mut timed_out = 0;
    let mut refused = 0;
    for q in slow_queries {
        let e = q.await.unwrap().expect_err("the slow query cannot finish");
        assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
        if e.to_string().contains("query_timeout") {
            timed_out += 1;
        } else {
            assert!(e.to_string().contains("max_queries_per_client"), "{e}");
            refused += 1;
        }
    }
    assert_eq!(
        (timed_out, refused),
        (1, 3),
        "one slot for the flooding client"
    );

    // New query texts: analysed one at a time a client, 16 of a client waiting; the flood's
    // others are refused at once by name, and another client's new text is analysed and run.
    let texts: Vec<_> = (0..200i64)
        .map(|i| {
            let flood = flood.clone();
            let list: Vec<String> = (0..400).map(|k| (k * 1000 + i).to_string()).collect();
            let sql = format!(
                "SELECT bal FROM checking WHERE custid IN ({})",
                list.join(", ")
            );
            tokio::spawn(async move { flood.query(&sql, []).await })
        })
        .collect();
    let rows = other
        .query("SELECT bal FROM checking WHERE custid = 2", [])
        .await
        .expect("another client's new query is analysed beside the flood");
    assert_eq!(rows.rows.len(), 1);
    let mut busy = 0;
    for t in texts {
        // Those analysed then wait for the client's one query slot, and may be refused there.
        if let Err(e) = t.await.unwrap() {
            assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
            busy += usize::from(e.to_string().contains("waiting for analysis"));
        }
    }
    assert!(
        busy > 0,
        "200 new texts at once from one client, none refused"
    );

    // Submissions: 40 at once from one address, 4 from another. The second address's are all
    // taken; the first's beyond its share are refused by name.
    let flooding: Vec<_> = (0..40i64)
        .map(|i| {
            let flood = flood.clone();
            tokio::spawn(async move { flood.submit(deposit(i % 10 + 1, 1)).await })
        })
        .collect();
    let others: Vec<_> = (0..4i64)
        .map(|i| {
            let elsewhere = elsewhere.clone();
            tokio::spawn(async move { elsewhere.submit(deposit(i + 20, 1)).await })
        })
        .collect();
    let mut answers = Vec::new();
    for t in flooding {
        answers.push(t.await.unwrap());
    }
    let (accepted, exhausted) = exhausted_apart(answers, "max_in_flight_per_address");
    assert!(exhausted > 0, "40 submissions at once with a share of 4");
    assert!(!accepted.is_empty());
    for t in others {
        let id = t
            .await
            .unwrap()
            .expect("another address's submission is taken");
        assert!(
            elsewhere
                .wait(&id, Duration::from_millis(50))
                .await
                .unwrap()
                .agreed
        );
    }

    // Status lookups: one place, a flood of 1 000 from one address, then 20 at once from
    // another: those are served in turn with the flood (one of each address), not behind it.
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let lookups: Vec<_> = (0..1000u32)
        .map(|i| {
            let (flood, answered) = (flood.clone(), answered.clone());
            tokio::spawn(async move {
                let state = flood
                    .status(&chainify_client::TxId(chainify_core::Digest::of(
                        &i.to_le_bytes(),
                    )))
                    .await;
                if state.is_ok() {
                    answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                state
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = answered.load(std::sync::atomic::Ordering::SeqCst);
    let theirs = futures_util::future::join_all((0..20u32).map(|i| {
        let other = other.clone();
        async move {
            other
                .status(&chainify_client::TxId(chainify_core::Digest::of(
                    &(1_000_000 + i).to_le_bytes(),
                )))
                .await
        }
    }))
    .await;
    let during = answered.load(std::sync::atomic::Ordering::SeqCst) - before;
    for state in theirs {
        let state = state.expect("another address's lookup is answered during the flood");
        assert!(matches!(state, TxState::Unknown), "{state:?}");
    }
    assert!(
        during < 128,
        "{during} of the flood's lookups were answered while another address's 20 waited"
    );
    let mut answers = Vec::new();
    for t in lookups {
        answers.push(t.await.unwrap());
    }
    let (_, busy) = exhausted_apart(answers, "max_lookups");
    assert!(
        busy > 0,
        "1 000 lookups at once from one address, none refused"
    );
    for n in 1..=3 {
        net.stop_org(n).await;
    }
}

/// Anyone who reaches an organization's CommitService (it has no client authentication) floods
/// it with forged votes and replays of real ones: the organization still agrees, as fast as its
/// peers. A batch is refused at its first vote that does not verify, before anything is queued
/// for the node (an audit's flood kept it from agreeing for 30 s when the node checked them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forged_and_replayed_votes_does_not_stall_agreement() {
    let mut net = start(28100, ChainifySettings::default()).await;
    wait_ready(&mut net).await;
    let c2 = net.client1(2).await;
    c2.submit_and_wait(deposit(1, 1)).await.unwrap();
    let agreed = net.admin(1).await.agreed_height;
    // A real vote to replay: the newest certificate's, as any client can fetch it.
    let commit1 = &net.network.orgs[&OrgId(1)].commit_endpoint;
    let channel =
        chainify_client::channel(commit1, Some(net.ca.as_bytes()), &OrgId(1).tls_name()).unwrap();
    let mut probe = pb::commit_service_client::CommitServiceClient::new(channel.clone());
    let certificate = probe
        .get_certificate(pb::GetCertificateRequest {
            block_number: agreed,
            auth: None,
        })
        .await
        .unwrap()
        .into_inner()
        .certificate
        .expect("a certificate of the agreed block");
    let real: Vec<pb::Vote> = certificate
        .votes
        .into_iter()
        .filter(|v| v.org_id != 1)
        .collect();
    assert!(!real.is_empty());
    let forged = move |i: u64| pb::Vote {
        network_id: "svc".into(),
        block_number: agreed + 1 + i % 64,
        ledger_block_hash: vec![i as u8; 32],
        org_id: 2 + (i % 2) as u32,
        signature: vec![7; 64],
    };
    let refused = probe
        .send_votes(pb::VoteBatch {
            votes: vec![real[0].clone(), forged(0)],
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("votes[1]"), "{refused:?}");
    // More than a peer ever sends at once: refused whole, before any is checked.
    let refused = probe
        .send_votes(pb::VoteBatch {
            votes: vec![real[0].clone(); 513],
        })
        .await
        .unwrap_err();
    assert!(refused.message().contains("at most 512"), "{refused:?}");
    let forged_certificate = move |i: u64| pb::Certificate {
        block_number: agreed + 1 + i % 64,
        ledger_block_hash: vec![i as u8; 32],
        votes: vec![forged(i), forged(i + 1)],
    };
    let refused = probe
        .send_certificate(forged_certificate(0))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    // Votes sent so far by all floods: the measurement starts once the flood is under way, so
    // a slow machine floods longer rather than less.
    let flooded = std::sync::Arc::new(AtomicU64::new(0));
    let mut floods = Vec::new();
    for t in 0..3u64 {
        let (channel, stop, real) = (channel.clone(), stop.clone(), real.clone());
        let flooded = flooded.clone();
        floods.push(tokio::spawn(async move {
            let mut client = pb::commit_service_client::CommitServiceClient::new(channel);
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if t == 2 {
                    // Forged certificates.
                    let _ = client.send_certificate(forged_certificate(sent)).await;
                    sent += 2;
                    flooded.fetch_add(2, Ordering::Relaxed);
                    continue;
                }
                // Forged votes after replayed real ones; and batches of replays alone.
                let mut votes: Vec<pb::Vote> =
                    (0..64).map(|i| real[i % real.len()].clone()).collect();
                if t == 0 {
                    votes.extend((0..448).map(forged));
                }
                sent += votes.len() as u64;
                flooded.fetch_add(votes.len() as u64, Ordering::Relaxed);
                let _ = client.send_votes(pb::VoteBatch { votes }).await;
            }
            sent
        }));
    }
    let flooding = std::time::Instant::now();
    while flooded.load(Ordering::Relaxed) < 20_000 {
        assert!(
            flooding.elapsed() < Duration::from_secs(120),
            "the flood sent only {} votes in two minutes",
            flooded.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = flooded.load(Ordering::Relaxed);
    let mut last = None;
    for i in 0..10i64 {
        last = Some(c2.submit_and_wait(deposit(i + 1, 1)).await.unwrap());
    }
    let target = last.unwrap().block.0;
    // Agreed at org1 too while the flood goes on.
    let started = std::time::Instant::now();
    while net.admin(1).await.agreed_height < target {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "org1 stalled at {} of {target} under the flood",
            net.admin(1).await.agreed_height
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let during = flooded.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    for flood in floods {
        flood.await.unwrap();
    }
    // The blocks were agreed with the flood going on, not after it (a count, not a rate: how
    // many depends on the machine).
    assert!(during > 0, "no vote was sent while the blocks were agreed");
    for n in 1..=3 {
        net.stop_org(n).await;
    }
}

/// The orderer (untrusted) puts a copy of each transaction stripped of its endorsements ahead of
/// it. The copy has the transaction's id and is invalid; the real one commits. A client waiting
/// for its outcome, asking its status or reading the commit stream is never told that the
/// transaction aborted: it would try again under a new nonce, and the statements would apply
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_copy_ordered_first_is_not_the_transaction_s_outcome() {
    let mut net = start_faulty(28700, Fault::StripAhead).await;
    wait_ready(&mut net).await;
    let c1 = net.client1(1).await;
    let c2 = net.client1(2).await;
    let mut events = c2.commits(0).await.unwrap();
    let balance = |rows: chainify_client::Rows| match rows.rows.as_slice() {
        [row] => row[0].clone(),
        other => panic!("{other:?}"),
    };
    let before = balance(
        c1.query("SELECT bal FROM checking WHERE custid = 3", [])
            .await
            .unwrap(),
    );
    let o = c1.submit_and_wait(deposit(3, 5)).await.unwrap();
    assert!(o.success && o.agreed && o.valid, "{o:?}");
    assert_eq!(
        o.index, 1,
        "the real copy is behind the stripped one: {o:?}"
    );
    let id = o.tx_id;
    // Every organization reports the real copy's outcome, from memory and from the ledger.
    for org in 1..=3 {
        let c = net.client1(org).await;
        match c.status(&id).await.unwrap() {
            TxState::Committed(got) => assert_eq!(got, o, "org{org}"),
            other => panic!("org{org}: {other:?}"),
        }
    }
    // The commit stream shows both copies, the stripped one marked as such.
    let event = loop {
        let e = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .expect("a commit event")
            .unwrap()
            .unwrap();
        if e.outcomes.iter().any(|x| x.tx_id == id) {
            break e;
        }
    };
    let copies: Vec<_> = event
        .outcomes
        .iter()
        .filter(|x| x.tx_id == id)
        .map(|x| (x.index, x.valid, x.success))
        .collect();
    assert_eq!(copies, vec![(0, false, false), (1, true, true)]);
    assert!(
        event.outcomes[0]
            .reason
            .contains("does not satisfy the endorsement policy"),
        "{event:?}"
    );
    // The deposit applied once, everywhere.
    let Value::Int(before) = before else {
        panic!("{before:?}")
    };
    for org in 1..=3 {
        let rows = net
            .client1(org)
            .await
            .query("SELECT bal FROM checking WHERE custid = 3", [])
            .await
            .unwrap();
        assert_eq!(balance(rows), Value::Int(before + 5), "org{org}");
    }
    for n in 1..=3 {
        net.stop_org(n).await;
    }
}

/// A CommitService client on `endpoint` connecting from the local address `from`.
async fn commit_client_from(
    net: &Net,
    org: u32,
    from: [u8; 4],
) -> pb::commit_service_client::CommitServiceClient<tonic::transport::Channel> {
    let endpoint = &net.network.orgs[&OrgId(org)].commit_endpoint;
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{endpoint}"))
        .unwrap()
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(net.ca.as_bytes()))
                .domain_name(OrgId(org).tls_name()),
        )
        .unwrap()
        .local_address(Some(std::net::IpAddr::from(from)))
        // HTTP/2's smallest windows: a stream its caller does not read stays open sooner.
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(65_535))
        .connect()
        .await
        .unwrap();
    pb::commit_service_client::CommitServiceClient::new(channel)
}

/// Found by a hunt: GetLedger and GetCertificate ask no one who calls and read the ledger
/// through the pool the blocks use; a flood of them would hold the connections a block needs.
/// Reads take places shared fairly among addresses, one an address: a second stream from an
/// address holding one waits, then is refused as busy, while another address is served and
/// certificates are read apart; a stream let go frees its place. Reads an organization of the
/// network signs take places of their own, one an organization, so that callers from many
/// addresses cannot hold back one that catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_the_ledger_take_a_place_an_address() {
    let mut net = start(28900, ChainifySettings::default()).await;
    wait_ready(&mut net).await;
    // More ledger than a stream's flow-control window holds (64 KiB), so that a stream whose
    // caller does not read stays open.
    let c1 = net.client1(1).await;
    for i in 0..400 {
        c1.submit_and_wait(deposit(i % 10 + 1, 1)).await.unwrap();
    }
    let agreed = net.admin(1).await.agreed_height;
    let mut greedy = commit_client_from(&net, 1, [127, 0, 0, 5]).await;
    let mut held = greedy
        .get_ledger(pb::GetLedgerRequest {
            from_block: 1,
            to_block: 0,
            auth: None,
        })
        .await
        .unwrap()
        .into_inner();
    held.message().await.unwrap().expect("a first entry");
    let certificate = |block: u64| pb::GetCertificateRequest {
        block_number: block,
        auth: None,
    };
    let whole = || pb::GetLedgerRequest {
        from_block: 1,
        to_block: 0,
        auth: None,
    };
    let e = greedy
        .get_ledger(whole())
        .await
        .expect_err("its address holds its place");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("reads of the ledger are under way"),
        "{e:?}"
    );
    // A certificate, which a lagging organization needs, is read apart from the streams.
    let answer = greedy.get_certificate(certificate(agreed)).await.unwrap();
    assert!(answer.into_inner().certificate.is_some());
    let mut other = commit_client_from(&net, 1, [127, 0, 0, 6]).await;
    let mut stream = other.get_ledger(whole()).await.unwrap().into_inner();
    assert!(stream.message().await.unwrap().is_some());
    // Two addresses now hold both places of the callers without a signature; an organization
    // of the network, signing its reads, has places of its own, one each.
    let e = commit_client_from(&net, 1, [127, 0, 0, 7])
        .await
        .get_ledger(whole())
        .await
        .expect_err("every address place is taken");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let org2 = SigningKey::load(&net.dir.join("org2/key.pk8")).unwrap();
    let signed = |method: &str, block: u64, key: &SigningKey| {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let bytes = chainify_net::state::signing_bytes(
            &net.network.network_id,
            OrgId(2),
            OrgId(1),
            unix_ms,
            method,
            block,
            "",
        );
        pb::StateAuth {
            org_id: 2,
            unix_ms,
            signature: key.sign(&bytes).0.to_vec(),
        }
    };
    let mut member = commit_client_from(&net, 1, [127, 0, 0, 8]).await;
    let mut theirs = member
        .get_ledger(pb::GetLedgerRequest {
            auth: Some(signed("GetLedger", 1, &org2)),
            ..whole()
        })
        .await
        .expect("an organization's read has its own place")
        .into_inner();
    assert!(theirs.message().await.unwrap().is_some());
    let e = member
        .get_ledger(pb::GetLedgerRequest {
            auth: Some(signed("GetLedger", 1, &org2)),
            ..whole()
        })
        .await
        .expect_err("one place an organization");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("none for org2"), "{e:?}");
    drop(theirs);
    let answer = member
        .get_certificate(pb::GetCertificateRequest {
            auth: Some(signed("GetCertificate", agreed, &org2)),
            ..certificate(agreed)
        })
        .await
        .expect("a signed certificate read");
    assert!(answer.into_inner().certificate.is_some());
    // A signature that does not verify (a stranger's, or one for another block) or was made
    // too far from the server's clock counts for nothing: the read is anyone's, and takes an
    // address's place, all held now (a peer whose clock is off still reads, as before).
    let (stranger, _) = SigningKey::generate().unwrap();
    let mut skewed = signed("GetLedger", 1, &org2);
    skewed.unix_ms -= 6 * 60 * 1000;
    let bytes = chainify_net::state::signing_bytes(
        &net.network.network_id,
        OrgId(2),
        OrgId(1),
        skewed.unix_ms,
        "GetLedger",
        1,
        "",
    );
    skewed.signature = org2.sign(&bytes).0.to_vec();
    for auth in [
        signed("GetLedger", 1, &stranger),
        signed("GetLedger", 2, &org2),
        skewed,
    ] {
        let e = member
            .get_ledger(pb::GetLedgerRequest {
                auth: Some(auth),
                ..whole()
            })
            .await
            .expect_err("no member place for it, and no address place free");
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("one an address"), "{e:?}");
    }
    drop(stream);
    drop(held);
    let mut answered = false;
    for _ in 0..50 {
        if let Ok(r) = greedy.get_ledger(whole()).await {
            answered = r.into_inner().message().await.unwrap().is_some();
            break;
        }
    }
    assert!(answered, "the stream let go keeps its place");
    for n in 1..=3 {
        net.stop_org(n).await;
    }
}
