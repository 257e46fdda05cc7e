//! Three organizations on real SQLite files run the Whatever-Voting pipeline in one process:
//! the in-process orderer cuts blocks, each organization's ExecutionServer validates and executes
//! them, the CommitEngines exchange signed votes and append only agreed blocks. One organization
//! is tampered with directly in its database, disagrees, recovers from its checkpoint and
//! agrees again; forged and replayed transactions are flagged identically everywhere.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chainify_commit::{Command, CommitEngine, Event, State, Timing};
use chainify_core::config::NetworkConfig;
use chainify_core::crypto::SigningKey;
use chainify_core::tx::{
    Certificate, ChainedTransaction, EarlyAbortResponse, LedgerBlock, Proposal, ProposalBody,
    TransactionBlock, Verdict,
};
use chainify_core::votes::VoteContext;
use chainify_core::{BlockNumber, ClientId, Digest, NetworkId, OrgId};
use chainify_node::ExecutionServer;
use chainify_orderer::{BlockStream, Fault, FaultyOrderer, LocalOrderer, Orderer, Resume};
use chainify_storage::conformance::dump;
use chainify_storage::{Backend, Conn, ExecMode, Sqlite, Store, StoreOptions};
use chainify_workload::{KeyDistribution, SMALLBANK_SCHEMA, Smallbank, smallbank_load_sql};
use futures_util::StreamExt;

const ORGS: u8 = 3;
const ACCOUNTS: u64 = 30;
const BLOCK_TXS: usize = 20;

fn org_key(i: u8) -> SigningKey {
    SigningKey::from_seed(&[i; 32])
}

fn client_key() -> SigningKey {
    SigningKey::from_seed(&[77; 32])
}

fn network() -> NetworkConfig {
    let mut text = String::from(
        "network_id = \"bank\"\nagreement_policy = \"any-2\"\n[block]\nmax_block_txs = 20\n",
    );
    for i in 1..=ORGS {
        text.push_str(&format!(
            "[[orgs]]\nid = {i}\nname = \"o{i}\"\npublic_key = \"{}\"\nchainify_endpoint = \"127.0.0.1:7{i}01\"\ncommit_endpoint = \"127.0.0.1:7{i}02\"\n",
            org_key(i).public_key()
        ));
    }
    text.push_str(&format!(
        "[[clients]]\nid = \"alice\"\npublic_key = \"{}\"\n[[clients.grants]]\ntable = \"*\"\nkinds = [\"select\", \"insert\", \"update\", \"delete\"]\n",
        client_key().public_key()
    ));
    NetworkConfig::from_toml(&text, Path::new("network.toml")).expect("network config")
}

fn chained(body: ProposalBody) -> ChainedTransaction {
    let signature = client_key().sign(&body.encode_canonical());
    let proposal = Proposal { body, signature };
    let id = proposal.tx_id();
    ChainedTransaction {
        responses: (1..=2)
            .map(|o| {
                EarlyAbortResponse::new_signed(
                    id,
                    OrgId(u32::from(o)),
                    Verdict::Accept,
                    &org_key(o),
                )
            })
            .collect(),
        proposal,
    }
}

struct Org {
    id: OrgId,
    store: Arc<Store<Sqlite>>,
    exec: ExecutionServer<Sqlite>,
    engine: CommitEngine,
    blocks: BlockStream,
    delivered: Vec<TransactionBlock>,
    ledger: Vec<(LedgerBlock, Certificate)>,
    alarms: Vec<String>,
}

async fn org<O: Orderer>(i: u8, dir: &Path, net: &Arc<NetworkConfig>, orderer: &O) -> Org {
    let url = format!("sqlite://{}", dir.join(format!("org{i}.db")).display());
    let backend = Sqlite::connect(&url, &StoreOptions::default())
        .await
        .expect("open");
    let mut conn = backend.acquire().await.expect("conn");
    for ddl in SMALLBANK_SCHEMA.split(';').filter(|s| !s.trim().is_empty()) {
        conn.batch(ddl).await.expect("schema");
    }
    for insert in smallbank_load_sql(ACCOUNTS, 100) {
        conn.batch(&insert).await.expect("load");
    }
    drop(conn);
    let store = Arc::new(
        Store::open(backend, StoreOptions::default())
            .await
            .expect("store"),
    );
    store
        .register(&["accounts", "savings", "checking"])
        .await
        .expect("register");
    let exec = ExecutionServer::new(
        store.clone(),
        net.clone(),
        ExecMode::Parallel(4),
        Digest::ZERO,
    )
    .expect("execution server");
    let ctx = VoteContext {
        network: net.network_id.clone(),
        policy: net.agreement.clone(),
        keys: net.orgs.iter().map(|(id, o)| (*id, o.public_key)).collect(),
    };
    Org {
        id: OrgId(u32::from(i)),
        store,
        exec,
        engine: CommitEngine::new(
            OrgId(u32::from(i)),
            org_key(i),
            ctx,
            Timing::default(),
            BlockNumber(0),
        ),
        blocks: orderer.deliver(Resume::START).await.expect("deliver"),
        delivered: Vec::new(),
        ledger: Vec::new(),
        alarms: Vec::new(),
    }
}

/// Carries out commands until no organization has anything left to do.
async fn settle(orgs: &mut [Org], mut queue: VecDeque<(usize, Event)>) {
    while let Some((at, event)) = queue.pop_front() {
        for command in orgs[at].engine.handle(event) {
            match command {
                Command::SendVote(vote) => {
                    for other in 0..orgs.len() {
                        if other != at {
                            queue.push_back((other, Event::Vote(vote.clone())));
                        }
                    }
                }
                Command::Append { block, certificate } => {
                    orgs[at].ledger.push((block, certificate))
                }
                Command::StartRecovery { block, attempt } => {
                    queue.push_back((at, recover(&mut orgs[at], block, attempt).await));
                }
                Command::Alarm(reason) => orgs[at].alarms.push(reason),
                Command::Notify(_)
                | Command::FetchCertificate(_)
                | Command::SendCertificate { .. } => {}
                other => panic!("org {} unexpected command {other:?}", orgs[at].id),
            }
        }
    }
}

/// Restores the newest checkpoint at or before `block` (the `attempt`-th older one), replays
/// the delivered blocks after it and reports the re-executed block.
async fn recover(org: &mut Org, block: BlockNumber, attempt: u32) -> Event {
    let candidates: Vec<BlockNumber> = org
        .store
        .checkpoints()
        .await
        .expect("list")
        .into_iter()
        .filter(|c| *c < block)
        .rev()
        .collect();
    let Some(&checkpoint) = candidates.get(attempt as usize) else {
        return Event::RecoveryFailed {
            block,
            reason: format!("no checkpoint #{attempt} before block {block}"),
        };
    };
    org.store.restore(checkpoint).await.expect("restore");
    let previous = org.ledger[checkpoint.0 as usize].0.hash();
    org.exec.set_previous(previous);
    let mut last = None;
    for b in &org.delivered[checkpoint.0 as usize + 1..=block.0 as usize] {
        last = Some(org.exec.execute(b).await.expect("replay").ledger);
    }
    Event::Recovered(last.expect("at least the disagreeing block"))
}

/// Every organization takes the next block from the orderer and executes it.
async fn step(orgs: &mut [Org]) -> Vec<chainify_node::Executed> {
    let mut queue = VecDeque::new();
    let mut executed = Vec::new();
    for (i, org) in orgs.iter_mut().enumerate() {
        let block = tokio::time::timeout(Duration::from_secs(10), org.blocks.next())
            .await
            .expect("a block")
            .expect("stream")
            .expect("block");
        org.delivered.push(block.clone());
        let done = org.exec.execute(&block).await.expect("execute");
        queue.push_back((i, Event::Executed(done.ledger.clone())));
        executed.push(done);
    }
    settle(orgs, queue).await;
    executed
}

/// Three organizations behind one orderer, with Smallbank transactions from one client.
struct Harness<O> {
    orgs: Vec<Org>,
    orderer: O,
    workload: Smallbank,
    nonce: u64,
    _dir: tempfile::TempDir,
}

impl<O: Orderer> Harness<O> {
    /// Organizations on fresh SQLite files behind the orderer `make` builds from the local one.
    async fn new(seed: u64, make: impl FnOnce(LocalOrderer) -> O) -> Harness<O> {
        let dir = tempfile::tempdir().expect("tempdir");
        let net = Arc::new(network());
        let orderer = make(LocalOrderer::start(
            net.network_id.clone(),
            BLOCK_TXS,
            Duration::from_secs(60),
        ));
        let mut orgs = Vec::new();
        for i in 1..=ORGS {
            orgs.push(org(i, dir.path(), &net, &orderer).await);
        }
        Harness {
            orgs,
            orderer,
            workload: Smallbank::new(ACCOUNTS, &KeyDistribution::Zipf { s: 1.1 }, seed),
            nonce: 0,
            _dir: dir,
        }
    }

    /// The client's next (honest, endorsed) transaction.
    fn next_tx(&mut self) -> ChainedTransaction {
        self.nonce += 1;
        chained(ProposalBody {
            client: ClientId::new("alice").expect("name"),
            nonce: self.nonce,
            network: NetworkId::new("bank").expect("name"),
            transaction: self.workload.next_tx().1,
        })
    }

    /// Submits `first`, then honest transactions up to a full block, and runs the block through
    /// every organization.
    async fn block_with(&mut self, first: Vec<ChainedTransaction>) -> Vec<chainify_node::Executed> {
        let honest = BLOCK_TXS.saturating_sub(first.len());
        for tx in first {
            self.orderer.broadcast(tx).await.expect("broadcast");
        }
        for _ in 0..honest {
            let tx = self.next_tx();
            self.orderer.broadcast(tx).await.expect("broadcast");
        }
        step(&mut self.orgs).await
    }

    /// A block of honest transactions.
    async fn block(&mut self) -> Vec<chainify_node::Executed> {
        self.block_with(Vec::new()).await
    }

    fn ledger(&self, i: usize) -> Vec<Digest> {
        self.orgs[i].ledger.iter().map(|(b, _)| b.hash()).collect()
    }

    async fn checkpoint_all(&self, block: u64) {
        for org in &self.orgs {
            org.store
                .checkpoint(BlockNumber(block))
                .await
                .expect("checkpoint");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_orgs_agree_flag_forgeries_and_repair_a_tampered_org() {
    let mut net = Harness::new(5, |local| local).await;

    // Block 0: a forged transaction among honest ones.
    let replayed = net.next_tx();
    let mut forged = net.next_tx();
    forged.proposal.body.nonce += 1000;
    let executed = net.block_with(vec![replayed.clone(), forged]).await;
    for e in &executed {
        assert_eq!(e.invalid.len(), 1, "{:?}", e.invalid);
        assert_eq!(e.invalid[0].0, 1);
        assert!(
            e.invalid[0].1.contains("signature of client alice"),
            "{:?}",
            e.invalid
        );
        assert!(!e.ledger.success[1]);
    }

    // Block 1: the orderer replays a transaction of block 0.
    let executed = net.block_with(vec![replayed]).await;
    for e in &executed {
        assert!(
            e.invalid[0].1.contains("already in the ledger"),
            "{:?}",
            e.invalid
        );
    }
    for org in &net.orgs {
        assert_eq!(
            org.ledger.len(),
            2,
            "org {} appended blocks 0 and 1",
            org.id
        );
    }
    net.checkpoint_all(1).await;

    // Org 3's database is changed directly; block 2 exposes it.
    let mut conn = net.orgs[2].store.backend().acquire().await.expect("conn");
    conn.batch("UPDATE checking SET bal = 0 WHERE custid = 1")
        .await
        .expect("tamper");
    drop(conn);
    let executed = net.block().await;
    assert_eq!(executed[0].ledger.hash(), executed[1].ledger.hash());
    assert_ne!(
        executed[2].ledger.hash(),
        executed[0].ledger.hash(),
        "the tampering shows in the digest"
    );
    assert_eq!(
        net.orgs[2].engine.state(),
        &State::Running,
        "org 3 recovered"
    );

    // Block 3: business as usual.
    net.block().await;

    for org in &net.orgs {
        assert_eq!(org.ledger.len(), 4, "org {}", org.id);
    }
    assert_eq!(net.ledger(0), net.ledger(1));
    assert_eq!(net.ledger(0), net.ledger(2));
    for w in net.orgs[0].ledger.windows(2) {
        assert_eq!(w[1].0.hash_previous, w[0].0.hash(), "hash chain");
    }
    for table in ["accounts", "savings", "checking"] {
        let reference = dump(&net.orgs[0].store, table).await;
        for org in &net.orgs[1..] {
            assert_eq!(
                dump(&org.store, table).await,
                reference,
                "org {} table {table}",
                org.id
            );
        }
    }
}

/// Reordered, shortened, duplicated and forged blocks reach every organization alike: the
/// organizations flag the same transactions and keep agreeing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uniform_orderer_faults_are_flagged_alike_and_agreed() {
    for (fault, flagged) in [
        (Fault::Reorder, None),
        (Fault::Drop, None),
        (
            Fault::Duplicate,
            Some("duplicate of transaction 0 of this block"),
        ),
        (Fault::Forge, Some("signature of client alice")),
    ] {
        let mut net =
            Harness::new(9, |local| FaultyOrderer::new(local, fault, BlockNumber(0))).await;
        for _ in 0..2 {
            let executed = net.block().await;
            let expected_len = match fault {
                Fault::Drop => BLOCK_TXS - 1,
                Fault::Duplicate | Fault::Forge => BLOCK_TXS + 1,
                _ => BLOCK_TXS,
            };
            for e in &executed {
                assert_eq!(e.ledger.tx_ids.len(), expected_len, "{fault:?}");
                match flagged {
                    Some(reason) => {
                        assert_eq!(e.invalid.len(), 1, "{fault:?}: {:?}", e.invalid);
                        assert_eq!(e.invalid[0].0, BLOCK_TXS, "{fault:?}");
                        assert!(
                            e.invalid[0].1.contains(reason),
                            "{fault:?}: {:?}",
                            e.invalid
                        );
                    }
                    None => assert!(e.invalid.is_empty(), "{fault:?}: {:?}", e.invalid),
                }
            }
        }
        assert_eq!(net.ledger(0).len(), 2, "{fault:?}");
        assert_eq!(net.ledger(0), net.ledger(1), "{fault:?}");
        assert_eq!(net.ledger(0), net.ledger(2), "{fault:?}");
    }
}

/// An orderer that gives organization 1 a different block than the others: organization 1 is
/// outvoted, cannot reproduce the agreed block from what it was given, and halts with an alarm
/// without ever appending a block that was not agreed; the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equivocation_is_outvoted_and_the_victim_halts_safely() {
    let mut net = Harness::new(9, |local| {
        FaultyOrderer::new(local, Fault::Equivocate, BlockNumber(1))
    })
    .await;
    net.block().await;
    net.checkpoint_all(0).await;
    let executed = net.block().await;
    assert_ne!(executed[0].ledger.hash(), executed[1].ledger.hash());
    assert_eq!(executed[1].ledger.hash(), executed[2].ledger.hash());
    net.block().await;
    assert!(
        matches!(net.orgs[0].engine.state(), State::Halted { .. }),
        "{:?}",
        net.orgs[0].engine.state()
    );
    assert!(
        net.orgs[0]
            .alarms
            .iter()
            .any(|a| a.contains("recovery failed")),
        "{:?}",
        net.orgs[0].alarms
    );
    assert_eq!(net.ledger(1).len(), 3);
    assert_eq!(net.ledger(1), net.ledger(2));
    assert_eq!(
        net.ledger(0),
        net.ledger(1)[..1].to_vec(),
        "the victim appended only agreed blocks"
    );
}
