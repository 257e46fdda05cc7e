//! The ChainifyServer (DESIGN §2.1): the client-facing `ChainifyService` and the
//! organization-to-organization `EndorsementService`.
//!
//! A proposal is authenticated (client key, signature), checked against the network, analysed
//! (the determinism rules) and against the client's grants, and its (client, nonce) must be new.
//! The server then asks the organizations the endorsement policy needs for signed early-abort
//! responses, in batches (one call per peer carries every proposal queued for it), builds the
//! ChainedTransaction once the accepting organizations satisfy the policy and broadcasts it.
//! Anything rejected before the broadcast never reaches the orderer.
//!
//! Outcomes come from the node's commit stream; the ledger answers for older transactions.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chainify_core::config::{ClientInfo, NetworkConfig};
use chainify_core::crypto::{Signature, Signatures, SigningKey};
use chainify_core::tx::{
    ChainedTransaction, EarlyAbortBatch, EarlyAbortResponse, Proposal, Verdict,
};
use chainify_core::{BlockNumber, ClientId, OrgId, TxId};
use chainify_node::metrics::{Metrics, Phase};
use chainify_node::{Committed, NodeStatus, ledger_entry};
use chainify_orderer::Orderer;
use chainify_proto::pb;
use chainify_proto::pb::chainify_service_server::ChainifyService;
use chainify_proto::pb::endorsement_service_client::EndorsementServiceClient;
use chainify_proto::pb::endorsement_service_server::EndorsementService;
use chainify_sql::Analyzer;
use chainify_storage::{Backend, Store};
use futures_util::stream::FuturesUnordered;
use futures_util::{Stream, StreamExt};
use tokio::sync::{Semaphore, broadcast, mpsc, oneshot, watch};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::{debug, warn};

use crate::query::{Queries, QueryAccess};
use crate::tls::{Tls, channel};
use crate::{NetError, invalid};

/// Sizes and time limits of a ChainifyServer.
#[derive(Clone, Debug)]
pub struct ChainifySettings {
    /// Submissions being checked, endorsed or broadcast at once; more are refused with
    /// RESOURCE_EXHAUSTED.
    pub max_in_flight: usize,
    /// Proposals queued for one peer's EndorsementService; more wait.
    pub endorse_queue: usize,
    /// Most proposals in one EarlyAbort call.
    pub max_endorse_batch: usize,
    /// Concurrent EarlyAbort calls per peer.
    pub endorse_calls_per_peer: usize,
    /// How long the endorsement of one proposal may take.
    pub endorse_timeout: Duration,
    /// How long SubmitAndWait waits for the block to be agreed.
    pub wait_limit: Duration,
    /// Nonces remembered per client; an older nonce is refused as a possible replay.
    pub nonce_window: usize,
    /// Outcomes kept for TxStatus with their abort reasons.
    pub recent_outcomes: usize,
    /// Commit events buffered per CommitStream subscriber.
    pub commit_stream_buffer: usize,
    /// How long a query waits for the node to be between blocks.
    pub query_wait: Duration,
}

impl Default for ChainifySettings {
    fn default() -> Self {
        ChainifySettings {
            max_in_flight: 8192,
            endorse_queue: 8192,
            max_endorse_batch: 1024,
            endorse_calls_per_peer: 4,
            endorse_timeout: Duration::from_secs(5),
            wait_limit: Duration::from_secs(60),
            nonce_window: 100_000,
            recent_outcomes: 100_000,
            commit_stream_buffer: 256,
            query_wait: Duration::from_secs(10),
        }
    }
}

/// Where a transaction ended, as told to clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The transaction.
    pub tx_id: TxId,
    /// Its block.
    pub block: BlockNumber,
    /// Its index in the block.
    pub index: u32,
    /// Whether it committed.
    pub success: bool,
    /// Why it aborted (empty on success; unknown for old blocks).
    pub reason: String,
}

impl From<&Outcome> for pb::TxOutcome {
    fn from(o: &Outcome) -> Self {
        pb::TxOutcome {
            tx_id: o.tx_id.0.as_bytes().to_vec(),
            block_number: o.block.0,
            index: o.index,
            success: o.success,
            agreed: true,
            reason: o.reason.clone(),
        }
    }
}

fn outcomes_of(
    block: &chainify_core::tx::LedgerBlock,
    reasons: &[(usize, String)],
) -> Vec<Outcome> {
    let reasons: BTreeMap<usize, &String> = reasons.iter().map(|(i, r)| (*i, r)).collect();
    block
        .tx_ids
        .iter()
        .enumerate()
        .map(|(i, id)| Outcome {
            tx_id: *id,
            block: block.number,
            index: u32::try_from(i).unwrap_or(u32::MAX),
            success: block.success.get(i).copied().unwrap_or(false),
            reason: reasons.get(&i).map(|r| (*r).clone()).unwrap_or_default(),
        })
        .collect()
}

fn event_of(number: BlockNumber, outcomes: &[Outcome]) -> pb::CommitEvent {
    pb::CommitEvent {
        block_number: number.0,
        outcomes: outcomes.iter().map(pb::TxOutcome::from).collect(),
    }
}

/// Nonces a client used recently, with the transaction each was used for and the organization
/// that submits it (this one, or the origin that asked for an early-abort response).
#[derive(Debug, Default)]
struct NonceWindow {
    /// Nonces at or below this are forgotten and refused.
    floor: Option<u64>,
    seen: BTreeMap<u64, (TxId, OrgId)>,
}

#[derive(Debug, PartialEq, Eq)]
enum Claim {
    New,
    /// The same transaction from the same origin again.
    Same,
}

impl NonceWindow {
    fn claim(
        &mut self,
        nonce: u64,
        id: TxId,
        origin: OrgId,
        capacity: usize,
    ) -> Result<Claim, String> {
        if let Some(floor) = self.floor
            && nonce <= floor
        {
            return Err(format!(
                "nonce {nonce} is not above {floor}, the oldest nonce still remembered for this \
                 client; it may be a replay: use a fresh nonce"
            ));
        }
        match self.seen.get(&nonce) {
            // The same transaction through another organization is the same claim: the client
            // signed it, and its origin only routes the answers. (Tying the claim to the first
            // origin let a Byzantine organization race a proposal's real origin and burn it.)
            Some((used, _)) if *used == id => return Ok(Claim::Same),
            Some((used, by)) => {
                return Err(format!(
                    "nonce {nonce} was already used (by transaction {used}, submitted through \
                     {by}): replay refused"
                ));
            }
            None => {}
        }
        self.seen.insert(nonce, (id, origin));
        while self.seen.len() > capacity.max(1) {
            if let Some((oldest, _)) = self.seen.pop_first() {
                self.floor = Some(oldest);
            }
        }
        Ok(Claim::New)
    }

    fn release(&mut self, nonce: u64, id: TxId, origin: OrgId) {
        if self.seen.get(&nonce) == Some(&(id, origin)) {
            self.seen.remove(&nonce);
        }
    }
}

struct EndorseJob {
    proposal: pb::Proposal,
    /// The proposal's transaction id (what the batch signature covers).
    id: TxId,
    reply: oneshot::Sender<Result<pb::EarlyAbortResponse, String>>,
}

/// Waiters for outcomes, recent outcomes, and the live commit events.
#[derive(Debug)]
struct Outcomes {
    waiters: Mutex<HashMap<TxId, Vec<oneshot::Sender<Outcome>>>>,
    recent: Mutex<(HashMap<TxId, Outcome>, VecDeque<TxId>)>,
    events: broadcast::Sender<Arc<pb::CommitEvent>>,
    /// Set when the node stopped: live streams end, so that a graceful shutdown completes.
    closed: watch::Sender<bool>,
}

impl Outcomes {
    fn record(&self, committed: &Committed, keep: usize) {
        let outcomes = outcomes_of(&committed.block, &committed.reasons);
        let _ = self
            .events
            .send(Arc::new(event_of(committed.block.number, &outcomes)));
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        for o in outcomes {
            for w in waiters.remove(&o.tx_id).unwrap_or_default() {
                let _ = w.send(o.clone());
            }
            recent.1.push_back(o.tx_id);
            recent.0.insert(o.tx_id, o);
        }
        while recent.1.len() > keep {
            if let Some(old) = recent.1.pop_front() {
                recent.0.remove(&old);
            }
        }
    }
}

pub(crate) struct Shared<B: Backend, O> {
    me: OrgId,
    key: Arc<SigningKey>,
    pub(crate) network: Arc<NetworkConfig>,
    pub(crate) analyzer: Analyzer,
    pub(crate) store: Arc<Store<B>>,
    orderer: Arc<O>,
    peers: BTreeMap<OrgId, mpsc::Sender<EndorseJob>>,
    nonces: Mutex<HashMap<ClientId, NonceWindow>>,
    in_flight: Arc<Semaphore>,
    outcomes: Arc<Outcomes>,
    status: watch::Receiver<NodeStatus>,
    queries: Queries<B>,
    metrics: Arc<Metrics>,
    pub(crate) settings: ChainifySettings,
}

/// An organization's ChainifyServer. Cloning shares it.
pub struct ChainifyServer<B: Backend, O> {
    shared: Arc<Shared<B, O>>,
}

impl<B: Backend, O> Clone for ChainifyServer<B, O> {
    fn clone(&self) -> Self {
        ChainifyServer {
            shared: self.shared.clone(),
        }
    }
}

impl<B: Backend, O> ChainifyServer<B, O> {
    /// Submissions under way (at most `max_in_flight`).
    pub fn in_flight(&self) -> usize {
        self.shared.settings.max_in_flight.max(1) - self.shared.in_flight.available_permits()
    }
}

impl<B: Backend, O> std::fmt::Debug for ChainifyServer<B, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainifyServer")
            .field("org", &self.shared.me)
            .finish_non_exhaustive()
    }
}

/// What a ChainifyServer runs on: its organization's parts.
#[derive(Debug)]
pub struct ChainifyParts<B: Backend, O> {
    /// This organization.
    pub me: OrgId,
    /// Its signing key (early-abort responses).
    pub key: Arc<SigningKey>,
    /// The network.
    pub network: Arc<NetworkConfig>,
    /// The organization's store (ledger, transaction index, queries).
    pub store: Arc<Store<B>>,
    /// Where ChainedTransactions go.
    pub orderer: Arc<O>,
    /// The node's status.
    pub status: watch::Receiver<NodeStatus>,
    /// The node's appended blocks.
    pub commits: broadcast::Receiver<Arc<Committed>>,
    /// Queries' access to the database at an agreed height.
    pub queries: QueryAccess,
    /// Where the endorse and order phases are recorded.
    pub metrics: Arc<Metrics>,
}

impl<B: Backend + 'static, O: Orderer + 'static> ChainifyServer<B, O> {
    /// A server for `parts`, reaching the other organizations' EndorsementServices at their
    /// `chainify_endpoint`. Must be called inside a tokio runtime (it starts the peer batching
    /// tasks and the commit follower, which end with the server).
    pub fn new(
        parts: ChainifyParts<B, O>,
        tls: Option<&Tls>,
        settings: ChainifySettings,
    ) -> Result<ChainifyServer<B, O>, NetError> {
        let analyzer = Analyzer::new(parts.store.schema().map_err(NetError::Storage)?);
        let queries = Queries::new(
            parts.queries,
            parts.network.clone(),
            parts.store.clone(),
            settings.query_wait,
        )?;
        let mut peers = BTreeMap::new();
        for org in parts.network.orgs.values().filter(|o| o.id != parts.me) {
            let client = EndorsementServiceClient::new(channel(&org.chainify_endpoint, tls)?)
                .max_decoding_message_size(64 * 1024 * 1024);
            let (tx, rx) = mpsc::channel(settings.endorse_queue.max(1));
            tokio::spawn(endorse_loop(
                BatchSigner {
                    me: parts.me,
                    key: parts.key.clone(),
                    network: parts.network.network_id.clone(),
                    signatures: parts.network.signatures,
                },
                org.id,
                client,
                rx,
                settings.max_endorse_batch.max(1),
                settings.endorse_calls_per_peer.max(1),
                settings.endorse_timeout,
            ));
            peers.insert(org.id, tx);
        }
        let (events, _) = broadcast::channel(1024);
        let outcomes = Arc::new(Outcomes {
            waiters: Mutex::new(HashMap::new()),
            recent: Mutex::new((HashMap::new(), VecDeque::new())),
            events,
            closed: watch::channel(false).0,
        });
        tokio::spawn(follow_commits(
            parts.commits,
            Arc::downgrade(&outcomes),
            settings.recent_outcomes,
        ));
        Ok(ChainifyServer {
            shared: Arc::new(Shared {
                me: parts.me,
                key: parts.key,
                network: parts.network,
                analyzer,
                store: parts.store,
                orderer: parts.orderer,
                peers,
                nonces: Mutex::new(HashMap::new()),
                in_flight: Arc::new(Semaphore::new(settings.max_in_flight.max(1))),
                outcomes,
                status: parts.status,
                queries,
                metrics: parts.metrics,
                settings,
            }),
        })
    }
}

async fn follow_commits(
    mut commits: broadcast::Receiver<Arc<Committed>>,
    outcomes: std::sync::Weak<Outcomes>,
    keep: usize,
) {
    loop {
        match commits.recv().await {
            Ok(c) => match outcomes.upgrade() {
                Some(o) => o.record(&c, keep),
                None => return,
            },
            // Waiters fall back to the ledger.
            Err(broadcast::error::RecvError::Lagged(n)) => {
                warn!(
                    missed = n,
                    "the ChainifyServer fell behind the commit stream"
                );
            }
            Err(broadcast::error::RecvError::Closed) => {
                if let Some(o) = outcomes.upgrade() {
                    o.closed.send_replace(true);
                }
                return;
            }
        }
    }
}

/// Signs this organization's early-abort batches.
struct BatchSigner {
    me: OrgId,
    key: Arc<SigningKey>,
    network: chainify_core::NetworkId,
    signatures: Signatures,
}

impl BatchSigner {
    fn batch(&self, proposals: Vec<pb::Proposal>, ids: &[TxId]) -> pb::EarlyAbortBatch {
        let bytes = EarlyAbortBatch::signing_bytes(&self.network, self.me, ids);
        pb::EarlyAbortBatch {
            from_org: self.me.0,
            proposals,
            signature: self.signatures.sign(&self.key, &bytes).0.to_vec(),
        }
    }
}

async fn endorse_loop(
    signer: BatchSigner,
    peer: OrgId,
    client: EndorsementServiceClient<Channel>,
    mut rx: mpsc::Receiver<EndorseJob>,
    max_batch: usize,
    calls: usize,
    timeout: Duration,
) {
    let permits = Arc::new(Semaphore::new(calls));
    loop {
        // Wait for a free call first: what queues meanwhile goes into the next batch.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else { return };
        let mut jobs = vec![first];
        while jobs.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let mut client = client.clone();
        let ids: Vec<TxId> = jobs.iter().map(|j| j.id).collect();
        let (proposals, replies): (Vec<_>, Vec<_>) =
            jobs.into_iter().map(|j| (j.proposal, j.reply)).unzip();
        let batch = signer.batch(proposals, &ids);
        tokio::spawn(async move {
            let _permit = permit;
            let n = batch.proposals.len();
            let mut request = Request::new(batch);
            request.set_timeout(timeout);
            match client.early_abort(request).await {
                Ok(r) if r.get_ref().responses.len() == n => {
                    for (reply, resp) in replies.into_iter().zip(r.into_inner().responses) {
                        let _ = reply.send(Ok(resp));
                    }
                }
                Ok(r) => {
                    let why = format!(
                        "{peer} answered {} responses to {n} proposals",
                        r.get_ref().responses.len()
                    );
                    for reply in replies {
                        let _ = reply.send(Err(why.clone()));
                    }
                }
                Err(e) => {
                    debug!(%peer, error = %e, "early abort call failed");
                    let why = format!("{peer}: {:?}: {}", e.code(), e.message());
                    for reply in replies {
                        let _ = reply.send(Err(why.clone()));
                    }
                }
            }
        });
    }
}

impl<B: Backend + 'static, O: Orderer + 'static> Shared<B, O> {
    fn client(&self, proposal: &Proposal) -> Result<&ClientInfo, Status> {
        let client = self
            .network
            .clients
            .get(&proposal.body.client)
            .ok_or_else(|| {
                Status::unauthenticated(format!(
                    "unknown client {:?}: not in network {}",
                    proposal.body.client.as_str(),
                    self.network.network_id
                ))
            })?;
        self.network
            .signatures
            .check(|| proposal.verify(&client.public_key))
            .map_err(|_| {
                Status::unauthenticated(format!(
                    "the signature of the proposal by client {:?} (nonce {}) does not verify",
                    proposal.body.client.as_str(),
                    proposal.body.nonce
                ))
            })?;
        Ok(client)
    }

    /// Every check that does not depend on what this server has seen before.
    fn check(&self, proposal: &Proposal) -> Result<(), Status> {
        let client = self.client(proposal)?;
        if proposal.body.network != self.network.network_id {
            return Err(Status::invalid_argument(format!(
                "the proposal is for network {:?}, this is network {:?}",
                proposal.body.network.as_str(),
                self.network.network_id.as_str()
            )));
        }
        let analysis = self
            .analyzer
            .analyze(&proposal.body.transaction)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        analysis
            .check_grants(client)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        Ok(())
    }

    fn claim_nonce(&self, proposal: &Proposal, id: TxId, origin: OrgId) -> Result<Claim, Status> {
        let mut nonces = self.nonces.lock().unwrap_or_else(PoisonError::into_inner);
        nonces
            .entry(proposal.body.client.clone())
            .or_default()
            .claim(proposal.body.nonce, id, origin, self.settings.nonce_window)
            .map_err(|why| {
                Status::already_exists(format!("client {:?}: {why}", proposal.body.client.as_str()))
            })
    }

    fn release_nonce(&self, proposal: &Proposal, id: TxId) {
        let mut nonces = self.nonces.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = nonces.get_mut(&proposal.body.client) {
            w.release(proposal.body.nonce, id, self.me);
        }
    }

    async fn known(&self, ids: &[TxId]) -> Result<BTreeSet<TxId>, Status> {
        self.store
            .known_transactions(BlockNumber(u64::MAX), ids)
            .await
            .map_err(|e| Status::unavailable(format!("looking up transaction ids: {e}")))
    }

    /// Collects accepting early-abort responses until the endorsement policy is met: first
    /// from a smallest combination with this organization, then from the others.
    async fn endorse(
        &self,
        wire: &pb::Proposal,
        id: TxId,
    ) -> Result<Vec<EarlyAbortResponse>, Status> {
        let policy = &self.network.endorsement;
        let mut accepted: BTreeMap<OrgId, EarlyAbortResponse> = BTreeMap::new();
        accepted.insert(
            self.me,
            EarlyAbortResponse::new_as(
                id,
                self.me,
                Verdict::Accept,
                &self.key,
                self.network.signatures,
            ),
        );
        let first: BTreeSet<OrgId> = policy
            .smallest_combination_with(self.me)
            .unwrap_or_else(|| self.network.orgs.keys().copied().collect());
        let rest: BTreeSet<OrgId> = self
            .network
            .orgs
            .keys()
            .copied()
            .filter(|o| !first.contains(o))
            .collect();
        let mut failures: Vec<(OrgId, String, bool)> = Vec::new();
        for round in [first, rest] {
            if policy.is_satisfied_by(&accepted.keys().copied().collect()) {
                break;
            }
            let mut pending = FuturesUnordered::new();
            for org in round.into_iter().filter(|o| *o != self.me) {
                let Some(queue) = self.peers.get(&org) else {
                    continue;
                };
                let (reply, answer) = oneshot::channel();
                let job = EndorseJob {
                    proposal: wire.clone(),
                    id,
                    reply,
                };
                let timeout = self.settings.endorse_timeout;
                pending.push(async move {
                    if queue.send(job).await.is_err() {
                        return (org, Err("the endorsement task stopped".to_owned()));
                    }
                    match tokio::time::timeout(timeout, answer).await {
                        Ok(Ok(r)) => (org, r),
                        Ok(Err(_)) => (org, Err("no answer".to_owned())),
                        Err(_) => (org, Err(format!("no answer within {timeout:?}"))),
                    }
                });
            }
            while let Some((org, answer)) = pending.next().await {
                match self.accept_response(org, id, answer) {
                    Ok(resp) => {
                        accepted.insert(org, resp);
                        if policy.is_satisfied_by(&accepted.keys().copied().collect()) {
                            break;
                        }
                    }
                    Err(Refusal::Rejected(why)) => failures.push((org, why, true)),
                    Err(Refusal::Failed(why)) => failures.push((org, why, false)),
                }
            }
        }
        if policy.is_satisfied_by(&accepted.keys().copied().collect()) {
            return Ok(accepted.into_values().collect());
        }
        let listed = failures
            .iter()
            .map(|(o, why, _)| format!("{o}: {why}"))
            .collect::<Vec<_>>()
            .join("; ");
        if failures.iter().any(|(_, _, rejected)| *rejected) {
            Err(Status::failed_precondition(format!(
                "the endorsement policy cannot be met: rejected by {listed}"
            )))
        } else {
            Err(Status::unavailable(format!(
                "the endorsement policy cannot be met now: {listed}"
            )))
        }
    }

    fn accept_response(
        &self,
        org: OrgId,
        id: TxId,
        wire: Result<pb::EarlyAbortResponse, String>,
    ) -> Result<EarlyAbortResponse, Refusal> {
        let wire = wire.map_err(Refusal::Failed)?;
        let resp = EarlyAbortResponse::try_from(wire)
            .map_err(|e| Refusal::Failed(format!("malformed response: {e}")))?;
        let key = self
            .network
            .orgs
            .get(&org)
            .map(|o| o.public_key)
            .ok_or_else(|| Refusal::Failed("not in the network".into()))?;
        let signed = self.network.signatures.check(|| resp.verify(&key));
        if resp.org != org || resp.tx_id != id || signed.is_err() {
            return Err(Refusal::Failed(
                "answered with a response that is not its signed verdict on this proposal".into(),
            ));
        }
        match &resp.verdict {
            Verdict::Accept => Ok(resp),
            Verdict::Reject(why) => Err(Refusal::Rejected(why.clone())),
        }
    }

    /// Checks, endorses and broadcasts a proposal: the transaction id once it is ordered, and
    /// with `wait` a receiver of its outcome.
    async fn submit(
        &self,
        wire: pb::Proposal,
        wait: bool,
    ) -> Result<(TxId, Option<oneshot::Receiver<Outcome>>), Status> {
        let Ok(_permit) = self.in_flight.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(format!(
                "overloaded: {} submissions are in flight at {}; retry later",
                self.settings.max_in_flight, self.me
            )));
        };
        let proposal = Proposal::try_from(wire.clone()).map_err(|e| invalid("proposal", &e))?;
        self.check(&proposal)?;
        let id = proposal.tx_id();
        // At the origin a nonce serves once; endorsers accept the same proposal again.
        if self.claim_nonce(&proposal, id, self.me)? == Claim::Same {
            return Err(Status::already_exists(format!(
                "client {:?}: nonce {} was already used (by transaction {id}): replay refused",
                proposal.body.client.as_str(),
                proposal.body.nonce
            )));
        }
        let result = async {
            if !self.known(&[id]).await?.is_empty() {
                return Err(Status::already_exists(format!(
                    "transaction {id} is already in the ledger: replay refused"
                )));
            }
            let endorsing = Instant::now();
            let responses = self.endorse(&wire, id).await?;
            self.metrics.observe(Phase::Endorse, endorsing.elapsed());
            // Registered before the broadcast, so that a fast commit is not missed.
            let waiter = wait.then(|| {
                let (tx, rx) = oneshot::channel();
                self.outcomes
                    .waiters
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(id)
                    .or_default()
                    .push(tx);
                rx
            });
            let ordering = Instant::now();
            self.orderer
                .broadcast(ChainedTransaction {
                    proposal: proposal.clone(),
                    responses,
                })
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            self.metrics.observe(Phase::Order, ordering.elapsed());
            Ok(waiter)
        }
        .await;
        match result {
            Ok(waiter) => Ok((id, waiter)),
            Err(status) => {
                // Not ordered: the client may try the same proposal again.
                if status.code() != tonic::Code::AlreadyExists {
                    self.release_nonce(&proposal, id);
                }
                self.outcomes
                    .waiters
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
                Err(status)
            }
        }
    }

    fn agreed(&self) -> BlockNumber {
        BlockNumber(self.status.borrow().next_block.0.saturating_sub(1))
    }

    /// The outcome of an agreed transaction.
    async fn lookup(&self, id: TxId) -> Result<Option<Outcome>, Status> {
        if let Some(o) = self
            .outcomes
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .get(&id)
        {
            return Ok(Some(o.clone()));
        }
        let agreed = self.agreed();
        let Some(block) = self
            .store
            .transaction_block(&id)
            .await
            .map_err(|e| Status::unavailable(format!("looking up transaction {id}: {e}")))?
        else {
            return Ok(None);
        };
        if block > agreed {
            return Ok(None);
        }
        let entry = ledger_entry(&self.store, block)
            .await
            .map_err(|e| Status::unavailable(format!("reading ledger block {block}: {e}")))?;
        Ok(outcomes_of(&entry.block, &[])
            .into_iter()
            .find(|o| o.tx_id == id))
    }

    async fn wait(
        &self,
        id: TxId,
        mut waiter: oneshot::Receiver<Outcome>,
    ) -> Result<Outcome, Status> {
        let deadline = tokio::time::Instant::now() + self.settings.wait_limit;
        let mut poll = tokio::time::interval(Duration::from_secs(1));
        poll.tick().await;
        loop {
            tokio::select! {
                o = &mut waiter => match o {
                    Ok(o) => return Ok(o),
                    Err(_) => waiter = oneshot::channel().1,
                },
                _ = poll.tick() => {
                    // The commit stream may have lagged.
                    if let Some(o) = self.lookup(id).await? {
                        return Ok(o);
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(Status::deadline_exceeded(format!(
                        "transaction {id} is ordered but its block was not agreed within {:?}; \
                         ask TxStatus later",
                        self.settings.wait_limit
                    )));
                }
            }
        }
    }
}

enum Refusal {
    Rejected(String),
    Failed(String),
}

fn tx_id_of(bytes: &[u8]) -> Result<TxId, Status> {
    chainify_core::Digest::try_from(bytes)
        .map(TxId)
        .map_err(|_| {
            Status::invalid_argument(format!("tx_id: expected 32 bytes, got {}", bytes.len()))
        })
}

/// Completes once the flag is set (or its sender is gone).
async fn until_set(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|c| *c).await;
}

type Events = Pin<Box<dyn Stream<Item = Result<pb::CommitEvent, Status>> + Send>>;

#[tonic::async_trait]
impl<B: Backend + 'static, O: Orderer + 'static> ChainifyService for ChainifyServer<B, O> {
    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let wire = request
            .into_inner()
            .proposal
            .ok_or_else(|| Status::invalid_argument("proposal: missing"))?;
        let (id, _) = self.shared.submit(wire, false).await?;
        Ok(Response::new(pb::SubmitResponse {
            tx_id: id.0.as_bytes().to_vec(),
        }))
    }

    async fn submit_and_wait(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::TxOutcome>, Status> {
        let wire = request
            .into_inner()
            .proposal
            .ok_or_else(|| Status::invalid_argument("proposal: missing"))?;
        let (id, waiter) = self.shared.submit(wire, true).await?;
        let waiter = waiter.unwrap_or_else(|| oneshot::channel().1);
        let outcome = self.shared.wait(id, waiter).await?;
        Ok(Response::new(pb::TxOutcome::from(&outcome)))
    }

    async fn tx_status(
        &self,
        request: Request<pb::TxStatusRequest>,
    ) -> Result<Response<pb::TxStatusResponse>, Status> {
        let id = tx_id_of(&request.into_inner().tx_id)?;
        use pb::tx_status_response::State;
        let response = match self.shared.lookup(id).await? {
            Some(o) => pb::TxStatusResponse {
                state: State::Committed as i32,
                outcome: Some(pb::TxOutcome::from(&o)),
            },
            None => {
                let executed_or_pending = !self.shared.known(&[id]).await?.is_empty()
                    || self
                        .shared
                        .outcomes
                        .waiters
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .contains_key(&id);
                pb::TxStatusResponse {
                    state: if executed_or_pending {
                        State::Pending as i32
                    } else {
                        State::Unknown as i32
                    },
                    outcome: None,
                }
            }
        };
        Ok(Response::new(response))
    }

    type CommitStreamStream = Events;

    async fn commit_stream(
        &self,
        request: Request<pb::CommitStreamRequest>,
    ) -> Result<Response<Events>, Status> {
        let from = request.into_inner().from_block;
        let shared = self.shared.clone();
        let mut live = shared.outcomes.events.subscribe();
        let mut closed = shared.outcomes.closed.subscribe();
        let mut next = if from == 0 {
            shared.agreed().0 + 1
        } else {
            from
        };
        let (tx, rx) = mpsc::channel(shared.settings.commit_stream_buffer.max(1));
        tokio::spawn(async move {
            loop {
                // History (and gaps after lagging) from the ledger, then live events.
                while next <= shared.agreed().0 {
                    let event = ledger_entry(&shared.store, BlockNumber(next))
                        .await
                        .map(|e| event_of(e.block.number, &outcomes_of(&e.block, &[])))
                        .map_err(|e| {
                            Status::unavailable(format!("reading ledger block {next}: {e}"))
                        });
                    let failed = event.is_err();
                    if tx.send(event).await.is_err() || failed {
                        return;
                    }
                    next += 1;
                }
                let event = tokio::select! {
                    e = live.recv() => e,
                    () = until_set(&mut closed) => {
                        let _ = tx.send(Err(Status::unavailable("the organization is shutting down"))).await;
                        return;
                    }
                };
                match event {
                    Ok(event) if event.block_number == next => {
                        if tx.send(Ok((*event).clone())).await.is_err() {
                            return;
                        }
                        next += 1;
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn query(
        &self,
        request: Request<pb::QueryRequest>,
    ) -> Result<Response<pb::QueryResponse>, Status> {
        self.shared
            .queries
            .query(request.into_inner())
            .await
            .map(Response::new)
    }
}

#[tonic::async_trait]
impl<B: Backend + 'static, O: Orderer + 'static> EndorsementService for ChainifyServer<B, O> {
    async fn early_abort(
        &self,
        request: Request<pb::EarlyAbortBatch>,
    ) -> Result<Response<pb::EarlyAbortBatchResponse>, Status> {
        let shared = &self.shared;
        let batch = request.into_inner();
        if batch.proposals.len() > shared.settings.max_endorse_batch {
            return Err(Status::invalid_argument(format!(
                "{} proposals in one batch; at most {}",
                batch.proposals.len(),
                shared.settings.max_endorse_batch
            )));
        }
        let mut proposals = Vec::with_capacity(batch.proposals.len());
        for (i, p) in batch.proposals.into_iter().enumerate() {
            proposals
                .push(Proposal::try_from(p).map_err(|e| invalid(&format!("proposals[{i}]"), &e))?);
        }
        let ids: Vec<TxId> = proposals.iter().map(Proposal::tx_id).collect();
        let from = OrgId(batch.from_org);
        // The batch must come from the organization it names: nonces are claimed for it.
        let from_key = match shared.network.orgs.get(&from) {
            Some(org) if from != shared.me => &org.public_key,
            _ => {
                return Err(Status::unauthenticated(format!(
                    "an early-abort batch must come from another organization of the network, not org{}",
                    batch.from_org
                )));
            }
        };
        let signature = Signature::try_from(batch.signature.as_slice())
            .map_err(|e| Status::invalid_argument(format!("signature: {e}")))?;
        shared
            .network
            .signatures
            .check(|| {
                from_key.verify(
                    &EarlyAbortBatch::signing_bytes(&shared.network.network_id, from, &ids),
                    &signature,
                )
            })
            .map_err(|_| {
                Status::unauthenticated(format!(
                    "the early-abort batch is not signed by {from}, which it claims to come from"
                ))
            })?;
        let known = shared.known(&ids).await?;
        // Signature checks and analysis are CPU work: off the async threads.
        let worker = self.clone();
        let responses = tokio::task::spawn_blocking(move || {
            let s = &worker.shared;
            proposals
                .iter()
                .zip(&ids)
                .map(|(p, id)| {
                    let verdict = match s.check(p) {
                        Err(status) => Verdict::Reject(status.message().to_owned()),
                        Ok(()) if known.contains(id) => Verdict::Reject(format!(
                            "transaction {id} is already in the ledger: replay refused"
                        )),
                        Ok(()) => match s.claim_nonce(p, *id, from) {
                            Ok(_) => Verdict::Accept,
                            Err(status) => Verdict::Reject(status.message().to_owned()),
                        },
                    };
                    pb::EarlyAbortResponse::from(&EarlyAbortResponse::new_as(
                        *id,
                        s.me,
                        verdict,
                        &s.key,
                        s.network.signatures,
                    ))
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| Status::internal(format!("checking proposals: {e}")))?;
        Ok(Response::new(pb::EarlyAbortBatchResponse { responses }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::Digest;

    fn id(n: u8) -> TxId {
        TxId(Digest::of(&[n]))
    }

    #[test]
    fn a_nonce_is_claimed_once_and_retrying_the_same_transaction_is_not_a_replay() {
        let mut w = NonceWindow::default();
        assert_eq!(w.claim(5, id(1), OrgId(1), 10), Ok(Claim::New));
        assert_eq!(w.claim(5, id(1), OrgId(1), 10), Ok(Claim::Same));
        let other_tx = w.claim(5, id(2), OrgId(1), 10).unwrap_err();
        assert!(other_tx.contains("nonce 5 was already used"), "{other_tx}");
        // The same transaction forwarded by another organization (first, even) burns nothing.
        assert_eq!(w.claim(5, id(1), OrgId(2), 10), Ok(Claim::Same));
        // Lower nonces are fine while they are remembered: clients may submit concurrently.
        assert_eq!(w.claim(3, id(3), OrgId(1), 10), Ok(Claim::New));
    }

    #[test]
    fn forgotten_nonces_are_refused_below_the_floor() {
        let mut w = NonceWindow::default();
        for n in 1..=4 {
            assert_eq!(w.claim(n * 10, id(n as u8), OrgId(1), 3), Ok(Claim::New));
        }
        // 10 was forgotten to keep 3: it and everything below it are refused.
        for n in [10, 7] {
            let e = w.claim(n, id(9), OrgId(1), 3).unwrap_err();
            assert!(e.contains("not above 10"), "{e}");
        }
        assert_eq!(w.claim(11, id(9), OrgId(1), 3), Ok(Claim::New));
    }

    #[test]
    fn a_released_nonce_can_be_used_again_but_only_by_its_claimant() {
        let mut w = NonceWindow::default();
        w.claim(8, id(1), OrgId(1), 10).unwrap();
        w.release(8, id(2), OrgId(1));
        assert!(
            w.claim(8, id(2), OrgId(1), 10).is_err(),
            "someone else's release"
        );
        w.release(8, id(1), OrgId(1));
        assert_eq!(w.claim(8, id(2), OrgId(1), 10), Ok(Claim::New));
    }
}
