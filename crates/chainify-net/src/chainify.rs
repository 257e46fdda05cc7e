//! The ChainifyServer (docs/design/overview.md §2.1): the client-facing `ChainifyService` and the
//! organization-to-organization `EndorsementService`, a gRPC adapter over the organization's
//! [`Admission`] (`chainify_node::admission` decides; `crate::status` picks the code).
//!
//! Submissions are admitted (checks, nonce, ledger, endorsement) and broadcast; early-abort
//! requests from other organizations arrive in batches (one call per peer carries every
//! proposal queued for it) and are answered with this organization's signed verdicts. Anything
//! refused before the broadcast never reaches the orderer.
//!
//! Outcomes come from the node's commit stream; the ledger answers for older transactions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chainify_core::config::NetworkConfig;
use chainify_core::crypto::{PublicKey, Signatures, SigningKey};
use chainify_core::recent::Recent;
use chainify_core::tx::{
    ChainedTransaction, EarlyAbortBatch, EarlyAbortResponse, Proposal, TxOutcome,
};
use chainify_core::verify::{SignedBytes, Verifier};
use chainify_core::{BlockNumber, OrgId, TxId};
use chainify_node::admission::{AdmissionSettings, EndorseFuture};
use chainify_node::ledger::TxLookup;
use chainify_node::metrics::{Metrics, Phase};
use chainify_node::{
    Admission, CommitFeed, Committed, Endorser, NodeStatus, Offload, Refusal, Subscription, ledger,
};
use chainify_orderer::Orderer;
use chainify_proto::pb;
use chainify_proto::pb::chainify_service_server::ChainifyService;
use chainify_proto::pb::endorsement_service_client::EndorsementServiceClient;
use chainify_proto::pb::endorsement_service_server::EndorsementService;
use chainify_sql::Analyzer;
use chainify_storage::{Backend, Store};
use futures_util::Stream;
use prost::Message;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::{Instrument, debug, warn};

use crate::NetError;
use crate::conns::{AddressLimiter, ConnectionLimits, counted_as};
use crate::query::{Queries, QueryAccess};
use crate::status;
use crate::tls::{Tls, channel};
use chainify_node::fair::{Crowded, FairLimits, FairPlace, FairShare};

/// Lookups for one address waiting for a place at once; more are refused at once.
pub const LOOKUPS_WAITING_PER_ADDRESS: usize = 256;

/// Lookups waiting for a place at once, all addresses together; more are refused at once.
pub const LOOKUPS_WAITING: usize = 4096;

/// Sizes and time limits of a ChainifyServer.
#[derive(Clone, Debug)]
pub struct ChainifySettings {
    /// Submissions being checked, endorsed or broadcast at once; more are refused with
    /// RESOURCE_EXHAUSTED.
    pub max_in_flight: usize,
    /// Of those, from one IP address (an IPv6 /64 counts as one), so that one client's flood
    /// leaves room for everyone else's submissions.
    pub max_in_flight_per_address: usize,
    /// Of those, of one client (counted once its signature verified, from any address).
    pub max_in_flight_per_client: usize,
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
    /// Outcomes kept for TxStatus with their abort reasons, at most (at least half as many are;
    /// about 64 bytes each, allocated at start).
    pub recent_outcomes: usize,
    /// Clients' reads of the transaction index and the ledger running at once (TxStatus,
    /// SubmitAndWait's polls; not the peers' endorsement batches). Each holds a database connection,
    /// which blocks need too; more wait up to `query_wait`, then are refused.
    pub max_lookups: usize,
    /// Of those, for one IP address (an IPv6 /64 counts as one); a freed place goes to the
    /// waiting addresses in turn, so that one client's flood of TxStatus calls waits behind
    /// everyone else's.
    pub max_lookups_per_address: usize,
    /// Commit events buffered per CommitStream subscriber.
    pub commit_stream_buffer: usize,
    /// CommitStreams open at once; more are refused. Each holds a task and its buffer until
    /// its client goes away, however slowly that client reads.
    pub max_commit_streams: usize,
    /// How long a CommitStream's client may read nothing while its buffer is full: then the
    /// stream ends, naming the block to resume from, and its place is freed.
    pub commit_stream_stall: Duration,
    /// CommitStreams open at once from one IP address (an IPv6 /64 counts as one), so that
    /// one client cannot take every place.
    pub max_commit_streams_per_address: usize,
    /// How long a query waits for the node to be between blocks.
    pub query_wait: Duration,
    /// How long a query may run: the engine stops it then (the analysis bounds a query's rows,
    /// not its work).
    pub query_timeout: Duration,
    /// Queries run at once; each holds a database connection of its own (the pool has that
    /// many more), so queries never take the connections blocks run on. More wait up to
    /// `query_wait`, then are refused.
    pub max_queries: usize,
    /// Of those, one client's (by its signed identity); a freed slot goes to the waiting
    /// clients in turn, so that one client's slow queries cannot keep everyone else's out.
    pub max_queries_per_client: usize,
    /// The most bytes a query's answer may hold (each value's size in memory plus its text or
    /// bytes, counted while the rows are read): past it the query is refused with
    /// RESOURCE_EXHAUSTED. The analysis bounds an answer's rows, not their width (10 001 rows
    /// of 4 096 columns of up to 1 MiB). An answer is held about three times while it is
    /// signed and sent, by each of `max_queries` queries; it must stay well under the 64 MiB
    /// of a gRPC message (`validate` refuses more).
    pub max_query_answer_bytes: usize,
}

impl Default for ChainifySettings {
    fn default() -> Self {
        ChainifySettings {
            max_in_flight: 8192,
            max_in_flight_per_address: 1024,
            max_in_flight_per_client: 1024,
            endorse_queue: 8192,
            max_endorse_batch: 1024,
            endorse_calls_per_peer: 4,
            endorse_timeout: Duration::from_secs(5),
            wait_limit: Duration::from_secs(60),
            nonce_window: chainify_node::admission::NONCE_WINDOW,
            recent_outcomes: 100_000,
            max_lookups: 2,
            max_lookups_per_address: 1,
            commit_stream_buffer: 256,
            max_commit_streams: 1024,
            max_commit_streams_per_address: 64,
            commit_stream_stall: Duration::from_secs(60),
            query_wait: Duration::from_secs(10),
            query_timeout: Duration::from_secs(10),
            max_queries: 2,
            max_queries_per_client: 1,
            max_query_answer_bytes: chainify_storage::MAX_ANSWER_BYTES,
        }
    }
}

fn to_wire(o: &TxOutcome) -> pb::TxOutcome {
    pb::TxOutcome {
        tx_id: o.tx_id.0.as_bytes().to_vec(),
        block_number: o.block.0,
        index: o.index,
        success: o.success,
        agreed: o.agreed,
        reason: o.reason.clone(),
        invalid_copy: !o.valid,
    }
}

fn event_of(number: BlockNumber, outcomes: &[TxOutcome]) -> pb::CommitEvent {
    pb::CommitEvent {
        block_number: number.0,
        outcomes: outcomes.iter().map(to_wire).collect(),
    }
}

struct EndorseJob {
    proposal: pb::Proposal,
    /// The proposal's transaction id (what the batch signature covers).
    id: TxId,
    reply: oneshot::Sender<Result<EarlyAbortResponse, String>>,
}

/// Waiters for outcomes, and recent outcomes.
#[derive(Debug)]
struct Outcomes {
    waiters: Mutex<HashMap<TxId, Vec<oneshot::Sender<TxOutcome>>>>,
    recent: Mutex<Recent<TxId, Kept>>,
}

/// A recent outcome without its id (the key): 32 bytes.
#[derive(Debug)]
struct Kept {
    block: BlockNumber,
    index: u32,
    success: bool,
    /// False for an invalid copy, kept only while no valid copy is known.
    valid: bool,
    reason: Option<Box<str>>,
}

impl Outcomes {
    fn new(keep: usize) -> Outcomes {
        Outcomes {
            waiters: Mutex::new(HashMap::new()),
            recent: Mutex::new(Recent::new(keep)),
        }
    }

    fn record(&self, committed: &Committed) {
        let outcomes = committed.block.outcomes(&committed.reasons);
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        for o in outcomes {
            // An invalid copy says nothing final: the orderer may have stripped the real one's
            // endorsements and ordered the copy first, and the real one may still commit.
            // Waking its waiters with "aborted" would have clients try again under a new nonce,
            // and apply twice.
            if o.valid {
                for w in waiters.remove(&o.tx_id).unwrap_or_default() {
                    let _ = w.send(o.clone());
                }
            } else if recent.contains(&o.tx_id) {
                // Never hides the outcome of a valid copy, nor an earlier invalid one.
                continue;
            }
            let kept = Kept {
                block: o.block,
                index: o.index,
                success: o.success,
                valid: o.valid,
                reason: (!o.reason.is_empty()).then(|| o.reason.into_boxed_str()),
            };
            recent.insert(o.tx_id, kept);
        }
    }

    /// A recent outcome of a valid copy (every outcome recorded is of an appended, so agreed,
    /// block).
    fn recent(&self, id: &TxId) -> Option<TxOutcome> {
        self.kept(id).filter(|o| o.valid)
    }

    /// A recent invalid copy of `id`, when no valid copy of it is recent.
    fn invalid_copy(&self, id: &TxId) -> Option<TxOutcome> {
        self.kept(id).filter(|o| !o.valid)
    }

    fn kept(&self, id: &TxId) -> Option<TxOutcome> {
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        recent.get(id).map(|k| TxOutcome {
            tx_id: *id,
            block: k.block,
            index: k.index,
            success: k.success,
            agreed: true,
            valid: k.valid,
            reason: k.reason.as_deref().unwrap_or_default().to_owned(),
        })
    }
}

/// What one ChainifyServer holds: its organization's admission, the way to the other
/// organizations' endorsers, the orderer, and the outcomes it reports.
pub(crate) struct Gateway<B: Backend, O> {
    me: OrgId,
    pub(crate) admission: Arc<Admission>,
    endorser: GrpcEndorser,
    pub(crate) store: Arc<Store<B>>,
    /// The origin's ledger lookups, batched.
    lookup: TxLookup,
    orderer: Arc<O>,
    /// A place per submission under way, by address.
    in_flight: AddressLimiter,
    /// Where each peer's endorsement batches are checked: a queue a peer, so that a Byzantine
    /// organization's flood is refused without holding back the others'.
    endorsing: BTreeMap<OrgId, Offload>,
    /// A place per lookup under way, shared fairly among addresses.
    lookups: FairShare<IpAddr>,
    /// A place per open CommitStream.
    streams: AddressLimiter,
    outcomes: Arc<Outcomes>,
    /// Appended blocks, for CommitStream subscribers.
    feed: CommitFeed<B>,
    status: watch::Receiver<NodeStatus>,
    queries: Queries<B>,
    metrics: Arc<Metrics>,
    pub(crate) settings: ChainifySettings,
}

/// An organization's ChainifyServer. Cloning shares it.
pub struct ChainifyServer<B: Backend, O> {
    gateway: Arc<Gateway<B, O>>,
}

impl<B: Backend, O> Clone for ChainifyServer<B, O> {
    fn clone(&self) -> Self {
        ChainifyServer {
            gateway: self.gateway.clone(),
        }
    }
}

impl<B: Backend, O> ChainifyServer<B, O> {
    /// Submissions under way (at most `max_in_flight`).
    pub fn in_flight(&self) -> usize {
        self.gateway.in_flight.open()
    }
}

impl<B: Backend, O> std::fmt::Debug for ChainifyServer<B, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainifyServer")
            .field("org", &self.gateway.me)
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
    /// Its signature checks, shared with its execution.
    pub verifier: Arc<Verifier>,
    /// The network.
    pub network: Arc<NetworkConfig>,
    /// The organization's store (ledger, transaction index, queries).
    pub store: Arc<Store<B>>,
    /// Where ChainedTransactions go.
    pub orderer: Arc<O>,
    /// The node's status.
    pub status: watch::Receiver<NodeStatus>,
    /// The node's appended blocks.
    pub commits: CommitFeed<B>,
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
        let admission = Arc::new(Admission::new(
            parts.me,
            parts.key.clone(),
            parts.network.clone(),
            Analyzer::new(parts.store.schema().map_err(NetError::Storage)?),
            AdmissionSettings {
                nonce_window: settings.nonce_window,
                endorse_timeout: settings.endorse_timeout,
                max_in_flight_per_client: settings.max_in_flight_per_client,
            },
            parts.verifier.clone(),
        ));
        let queries = Queries::new(
            parts.queries,
            parts.me,
            parts.key.clone(),
            parts.network.clone(),
            parts.store.clone(),
            &settings,
        )?;
        let mut peers = BTreeMap::new();
        for org in parts.network.orgs.values().filter(|o| o.id != parts.me) {
            let client = EndorsementServiceClient::new(channel(
                &org.chainify_endpoint,
                tls,
                &org.id.tls_name(),
            )?)
            .max_decoding_message_size(crate::org::MAX_MESSAGE);
            let (tx, rx) = mpsc::channel(settings.endorse_queue.max(1));
            tokio::spawn(endorse_loop(
                BatchSigner {
                    me: parts.me,
                    key: parts.key.clone(),
                    network: parts.network.network_id.clone(),
                    signatures: parts.network.signatures,
                    verifier: parts.verifier.clone(),
                    // As admission's own check of the answers reads them.
                    response_batches: parts.network.counts_batches(),
                },
                (org.id, org.public_key),
                client,
                rx,
                settings.max_endorse_batch.max(1),
                settings.endorse_calls_per_peer.max(1),
                settings.endorse_timeout,
            ));
            peers.insert(org.id, tx);
        }
        let outcomes = Arc::new(Outcomes::new(settings.recent_outcomes));
        let feed = parts.commits;
        let from = parts.status.borrow().next_block;
        tokio::spawn(follow_height(
            parts.status.clone(),
            Arc::downgrade(&admission),
        ));
        tokio::spawn(follow_commits(
            feed.subscribe(from),
            Arc::downgrade(&outcomes),
        ));
        Ok(ChainifyServer {
            gateway: Arc::new(Gateway {
                me: parts.me,
                admission,
                endorser: GrpcEndorser { peers },
                lookup: TxLookup::spawn(parts.store.clone()),
                store: parts.store,
                orderer: parts.orderer,
                in_flight: AddressLimiter::new(ConnectionLimits {
                    total: settings.max_in_flight.max(1),
                    per_address: settings.max_in_flight_per_address.max(1),
                    ..ConnectionLimits::default()
                }),
                streams: AddressLimiter::new(ConnectionLimits {
                    total: settings.max_commit_streams,
                    per_address: settings.max_commit_streams_per_address,
                    ..ConnectionLimits::default()
                }),
                lookups: FairShare::new(FairLimits {
                    places: settings.max_lookups,
                    per_key: settings.max_lookups_per_address,
                    waiting_per_key: LOOKUPS_WAITING_PER_ADDRESS,
                    waiting: LOOKUPS_WAITING,
                }),
                endorsing: parts
                    .network
                    .orgs
                    .keys()
                    .filter(|o| **o != parts.me)
                    .map(|o| (*o, Offload::per_core()))
                    .collect(),
                outcomes,
                feed,
                status: parts.status,
                queries,
                metrics: parts.metrics,
                settings,
            }),
        })
    }
}

/// Tells admission the ledger's height as it grows: it signs responses as a batch once the
/// network counts batches at that height.
async fn follow_height(
    mut status: watch::Receiver<NodeStatus>,
    admission: std::sync::Weak<Admission>,
) {
    loop {
        let next = status.borrow_and_update().next_block;
        match admission.upgrade() {
            Some(admission) => admission.set_height(next.0),
            None => return,
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}

/// Resolves outcome waiters from every appended block (after a lag, from the ledger).
async fn follow_commits<B: Backend>(
    mut blocks: Subscription<B>,
    outcomes: std::sync::Weak<Outcomes>,
) {
    while let Some(next) = blocks.next().await {
        match next {
            Ok(c) => match outcomes.upgrade() {
                Some(o) => o.record(&c),
                None => return,
            },
            Err(e) => {
                warn!(block = %blocks.next_block(), error = %e, "reading the ledger for outcomes failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Signs this organization's early-abort batches and checks the answers.
struct BatchSigner {
    me: OrgId,
    key: Arc<SigningKey>,
    network: chainify_core::NetworkId,
    signatures: Signatures,
    verifier: Arc<Verifier>,
    /// Whether the peers' responses may be signed as a batch (the network's setting).
    response_batches: bool,
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

/// Fewer responses than this are left to admission's own checks: a batch that small gains less
/// than the hop to the blocking pool costs (interleaved devnet runs at 24 clients, where batches
/// hold one or two responses, showed no gain).
const PREVERIFY_FROM: usize = 16;

/// Checks a peer's early-abort responses together, off the reactor ([`Verifier::warm`]): if they
/// verify they are remembered, so each transaction's own check at admission finds them done;
/// with a bad one among them every admission checks its own, and refuses the bad one.
async fn preverify(
    verifier: &Arc<Verifier>,
    (peer, batches): (PublicKey, bool),
    responses: &[Result<EarlyAbortResponse, String>],
) {
    // The responses of one signed batch are one triple: checked once.
    let items: Vec<SignedBytes> = responses
        .iter()
        .flatten()
        .map(|response| response.signed_by(peer, batches))
        .collect();
    let verifier = verifier.clone();
    // A panic here only leaves the checks to admission.
    let _ = tokio::task::spawn_blocking(move || verifier.warm(&items)).await;
}

/// The most bytes of proposals in one EarlyAbort call: a quarter of the peers' message limit
/// (`MAX_MESSAGE`, 64 MiB). Bounded by count alone, a batch of large proposals (a client may
/// send many of up to `MAX_TRANSACTION_BYTES`) would pass the limit and the peer would refuse
/// every proposal in it.
const MAX_ENDORSE_BATCH_BYTES: usize = 16 * 1024 * 1024;

/// A batch starting with `first`, with what is queued in `rx`: at most `max_batch` proposals
/// and `max_bytes` of them encoded (a first one larger than that goes alone). The job that
/// did not fit comes back, to start the next batch.
fn fill_batch(
    first: EndorseJob,
    rx: &mut mpsc::Receiver<EndorseJob>,
    max_batch: usize,
    max_bytes: usize,
) -> (Vec<EndorseJob>, Option<EndorseJob>) {
    let mut bytes = first.proposal.encoded_len();
    let mut jobs = vec![first];
    while jobs.len() < max_batch {
        let Ok(job) = rx.try_recv() else { break };
        bytes += job.proposal.encoded_len();
        if bytes > max_bytes {
            return (jobs, Some(job));
        }
        jobs.push(job);
    }
    (jobs, None)
}

async fn endorse_loop(
    signer: BatchSigner,
    (peer, peer_key): (OrgId, PublicKey),
    client: EndorsementServiceClient<Channel>,
    mut rx: mpsc::Receiver<EndorseJob>,
    max_batch: usize,
    calls: usize,
    timeout: Duration,
) {
    let permits = Arc::new(Semaphore::new(calls));
    let mut carried = None;
    loop {
        // Wait for a free call first: what queues meanwhile goes into the next batch.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let jobs;
        (jobs, carried) = fill_batch(first, &mut rx, max_batch, MAX_ENDORSE_BATCH_BYTES);
        let mut client = client.clone();
        let ids: Vec<TxId> = jobs.iter().map(|j| j.id).collect();
        let (proposals, replies): (Vec<_>, Vec<_>) =
            jobs.into_iter().map(|j| (j.proposal, j.reply)).unzip();
        let batch = signer.batch(proposals, &ids);
        let verifier = signer.verifier.clone();
        let batches = signer.response_batches;
        tokio::spawn(async move {
            let _permit = permit;
            let n = batch.proposals.len();
            let mut request = Request::new(batch);
            request.set_timeout(timeout);
            match client.early_abort(request).await {
                Ok(r) if r.get_ref().responses.len() == n => {
                    // Decoded once here, for the batch check and the waiting admissions.
                    let responses: Vec<_> = r
                        .into_inner()
                        .responses
                        .into_iter()
                        .map(|wire| {
                            EarlyAbortResponse::try_from(wire)
                                .map_err(|e| format!("malformed response: {e}"))
                        })
                        .collect();
                    if responses.len() >= PREVERIFY_FROM {
                        preverify(&verifier, (peer_key, batches), &responses).await;
                    }
                    for (reply, response) in replies.into_iter().zip(responses) {
                        let _ = reply.send(response);
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

/// A CommitStream's events for its client, sent by a task of their own (which holds `place`)
/// through a buffer of `buffer` events, until the client goes away (at once, not at the next
/// block), `events` end, or the client has read nothing for `stall` while the buffer was full:
/// then the stream ends with RESOURCE_EXHAUSTED naming the block to resume from, and the task
/// and its place are freed.
fn pump<P: Send + 'static>(
    mut events: Pin<Box<dyn Stream<Item = Result<pb::CommitEvent, Status>> + Send>>,
    buffer: usize,
    stall: Duration,
    place: P,
) -> Events {
    use futures_util::StreamExt;
    let (tx, rx) = mpsc::channel(buffer.max(1));
    let (fail, failed) = oneshot::channel::<Status>();
    tokio::spawn(async move {
        let _place = place;
        loop {
            let next = tokio::select! {
                next = events.next() => next,
                () = tx.closed() => return,
            };
            let Some(event) = next else { return };
            let block = event.as_ref().map(|e| e.block_number).ok();
            let end = event.is_err();
            match tx.send_timeout(event, stall).await {
                Ok(()) if !end => {}
                Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                    let resume = block.map_or_else(String::new, |b| format!(" from block {b}"));
                    let _ = fail.send(status::busy(format!(
                        "the client read no commit event for {stall:?} (commit_stream_stall); \
                         the stream ends: open another{resume}"
                    )));
                    return;
                }
                _ => return,
            }
        }
    });
    let failure = futures_util::stream::once(failed).filter_map(|f| async move { f.ok().map(Err) });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx).chain(failure))
}

/// The other organizations' EndorsementServices, through their batching tasks.
struct GrpcEndorser {
    peers: BTreeMap<OrgId, mpsc::Sender<EndorseJob>>,
}

impl Endorser for GrpcEndorser {
    fn early_abort<'a>(
        &'a self,
        org: OrgId,
        proposal: &'a Proposal,
        id: TxId,
    ) -> EndorseFuture<'a> {
        Box::pin(async move {
            let queue = self
                .peers
                .get(&org)
                .ok_or_else(|| format!("no endorsement channel to {org}"))?;
            let (reply, answer) = oneshot::channel();
            let job = EndorseJob {
                proposal: pb::Proposal::from(proposal),
                id,
                reply,
            };
            queue
                .send(job)
                .await
                .map_err(|_| "the endorsement task stopped".to_owned())?;
            answer.await.map_err(|_| "no answer".to_owned())?
        })
    }
}

impl<B: Backend + 'static, O: Orderer + 'static> Gateway<B, O> {
    /// Which of `ids` are in the ledger. A client's call takes a [`Gateway::lookup_slot`]
    /// first; a peer's endorsement batch (signed by the peer) does not wait behind clients.
    async fn known(&self, ids: &[TxId]) -> Result<BTreeSet<TxId>, Status> {
        self.store
            .known_transactions(BlockNumber(u64::MAX), ids)
            .await
            .map_err(|e| status::refused(Refusal::unavailable("looking up transaction ids", e)))
    }

    /// One of `max_lookups` places to read the database for a client at `from`: a flood of
    /// status requests waits here rather than in the connection pool, ahead of blocks (and of
    /// the peers' endorsement batches, which take none), and one address's flood waits behind
    /// every other address's next request.
    async fn lookup_slot(&self, from: IpAddr) -> Result<FairPlace<IpAddr>, Status> {
        let settings = &self.settings;
        let from = counted_as(from);
        match tokio::time::timeout(settings.query_wait, self.lookups.acquire(from)).await {
            Ok(Ok(slot)) => Ok(slot),
            Ok(Err(Crowded::Key)) => Err(status::busy(format!(
                "{LOOKUPS_WAITING_PER_ADDRESS} lookups of transactions from {from} (an IPv6 /64 \
                 counts as one address) are waiting at organization {}, which runs {} an \
                 address at once (max_lookups_per_address); wait for them",
                self.me, settings.max_lookups_per_address
            ))),
            Ok(Err(Crowded::All)) => Err(status::busy(format!(
                "{LOOKUPS_WAITING} lookups of transactions are waiting at organization {} \
                 (max_lookups {}), none from another address in a longer queue than {from}'s; \
                 try again",
                self.me, settings.max_lookups
            ))),
            Err(_) if self.lookups.held_by(&from) >= settings.max_lookups_per_address => {
                Err(status::busy(format!(
                    "{from} already runs {} lookups of transactions at organization {} \
                     (max_lookups_per_address) and none finished within {:?}; try again",
                    settings.max_lookups_per_address, self.me, settings.query_wait
                )))
            }
            Err(_) => Err(status::busy(format!(
                "{} lookups of transactions are under way at organization {} (max_lookups) and \
                 none was free for this one within {:?}; try again",
                settings.max_lookups, self.me, settings.query_wait
            ))),
        }
    }

    /// Admits, endorses and broadcasts a proposal: the transaction id once it is ordered, and
    /// with `wait` a receiver of its outcome.
    async fn submit(
        &self,
        wire: pb::Proposal,
        wait: bool,
        from: IpAddr,
    ) -> Result<(TxId, Option<oneshot::Receiver<TxOutcome>>), Refusal> {
        let Some(_place) = self.in_flight.admit(from) else {
            let settings = &self.settings;
            // The caller's own share first: that is what it can act on.
            return Err(
                if self.in_flight.open_from(from) >= settings.max_in_flight_per_address.max(1) {
                    Refusal::OverloadedFrom {
                        org: self.me,
                        address: counted_as(from),
                        in_flight: settings.max_in_flight_per_address.max(1),
                    }
                } else {
                    Refusal::Overloaded {
                        org: self.me,
                        in_flight: settings.max_in_flight,
                    }
                },
            );
        };
        let proposal = Proposal::try_from(wire)
            .map_err(|e| Refusal::Malformed(e.within("proposal").to_string()))?;
        chainify_node::admission::check_wire_size(&proposal)?;
        let id = proposal.tx_id();
        // Everything logged about this transaction at the origin carries its id.
        let span = tracing::info_span!("tx", org = %self.me, tx = %id);
        let outcome = self
            .admit_and_order(proposal, id, wait)
            .instrument(span)
            .await;
        if let Err(refusal) = &outcome {
            debug!(org = %self.me, tx = %id, %refusal, "refused");
        }
        outcome
    }

    async fn admit_and_order(
        &self,
        proposal: Proposal,
        id: TxId,
        wait: bool,
    ) -> Result<(TxId, Option<oneshot::Receiver<TxOutcome>>), Refusal> {
        let admitting = Instant::now();
        let in_ledger = async {
            self.lookup
                .contains(id)
                .await
                .map_err(|e| Refusal::unavailable("looking up transaction ids", e))
        };
        let responses = self
            .admission
            .admit(&proposal, in_ledger, &self.endorser)
            .await?;
        self.metrics.observe(Phase::Endorse, admitting.elapsed());
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
        let ordered = self
            .orderer
            .broadcast(ChainedTransaction {
                proposal: proposal.clone(),
                responses,
            })
            .await;
        if let Err(e) = ordered {
            // Not ordered: the client may try the same proposal again.
            self.admission.release_nonce(&proposal, id);
            self.outcomes
                .waiters
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
            return Err(Refusal::unavailable("the orderer", e));
        }
        self.metrics.observe(Phase::Order, ordering.elapsed());
        Ok((id, waiter))
    }

    fn agreed(&self) -> BlockNumber {
        BlockNumber(self.status.borrow().next_block.0.saturating_sub(1))
    }

    /// The outcome of an agreed transaction, waiting for a lookup place of `from`.
    async fn lookup(&self, id: TxId, from: IpAddr) -> Result<Option<TxOutcome>, Status> {
        if let Some(o) = self.outcomes.recent(&id) {
            return Ok(Some(o));
        }
        let slot = self.lookup_slot(from).await?;
        self.lookup_in_ledger(id, slot).await
    }

    /// The outcome of agreed transaction `id` from the ledger, on a lookup place.
    async fn lookup_in_ledger(
        &self,
        id: TxId,
        _slot: FairPlace<IpAddr>,
    ) -> Result<Option<TxOutcome>, Status> {
        let agreed = self.agreed();
        let Some(block) = self
            .store
            .transaction_block(&id)
            .await
            .map_err(|e| status::unavailable(format_args!("looking up transaction {id}"), e))?
        else {
            return Ok(None);
        };
        if block > agreed {
            return Ok(None);
        }
        let entry = ledger::entry(&self.store, block)
            .await
            .map_err(|e| status::unavailable(format_args!("reading ledger block {block}"), e))?;
        // The index holds valid copies only; an invalid copy ordered ahead of the valid one in
        // the same block is passed over.
        Ok(entry.block.outcome_of(&id))
    }

    /// The outcome of `id`, submitted from `from`, once its block is agreed.
    async fn wait(
        &self,
        id: TxId,
        mut waiter: oneshot::Receiver<TxOutcome>,
        from: IpAddr,
    ) -> Result<TxOutcome, Status> {
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
                    // The commit stream may have lagged. Only when a lookup place is free at
                    // once, and a failed look is tried again at the next tick: clients flooding
                    // TxStatus must not end (or hold up) a wait whose transaction commits.
                    if let Some(o) = self.outcomes.recent(&id) {
                        return Ok(o);
                    }
                    if let Some(slot) = self.lookups.try_acquire(counted_as(from))
                        && let Ok(Some(o)) = self.lookup_in_ledger(id, slot).await
                    {
                        return Ok(o);
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    let limit = self.settings.wait_limit;
                    return Err(status::deadline(match self.outcomes.invalid_copy(&id) {
                        Some(copy) => format!(
                            "transaction {id} was ordered, but within {limit:?} only an invalid \
                             copy of it was agreed (block {}, index {}: {}); the orderer may have \
                             altered it and may still order it: ask TxStatus later, and do not \
                             submit the statements again as a new transaction (both could apply)",
                            copy.block,
                            copy.index,
                            if copy.reason.is_empty() { "invalid" } else { &copy.reason }
                        ),
                        None => format!(
                            "transaction {id} is ordered but its block was not agreed within \
                             {limit:?}; ask TxStatus later"
                        ),
                    }));
                }
            }
        }
    }
}

fn tx_id_of(bytes: &[u8]) -> Result<TxId, Status> {
    chainify_core::Digest::try_from(bytes)
        .map(TxId)
        .map_err(|_| status::wrong_length("tx_id", 32, bytes.len()))
}

/// The address a client's call came from (`0.0.0.0` when the transport does not say, as for
/// calls within the process).
pub(crate) fn caller<T>(request: &Request<T>) -> IpAddr {
    request
        .remote_addr()
        .map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip())
}

type Events = Pin<Box<dyn Stream<Item = Result<pb::CommitEvent, Status>> + Send>>;

#[tonic::async_trait]
impl<B: Backend + 'static, O: Orderer + 'static> ChainifyService for ChainifyServer<B, O> {
    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let from = caller(&request);
        let wire = request
            .into_inner()
            .proposal
            .ok_or_else(|| status::missing("proposal"))?;
        let (id, _) = self
            .gateway
            .submit(wire, false, from)
            .await
            .map_err(status::refused)?;
        Ok(Response::new(pb::SubmitResponse {
            tx_id: id.0.as_bytes().to_vec(),
        }))
    }

    async fn submit_and_wait(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::TxOutcome>, Status> {
        let from = caller(&request);
        let wire = request
            .into_inner()
            .proposal
            .ok_or_else(|| status::missing("proposal"))?;
        let (id, waiter) = self
            .gateway
            .submit(wire, true, from)
            .await
            .map_err(status::refused)?;
        let waiter = waiter.unwrap_or_else(|| oneshot::channel().1);
        let outcome = self.gateway.wait(id, waiter, from).await?;
        Ok(Response::new(to_wire(&outcome)))
    }

    async fn tx_status(
        &self,
        request: Request<pb::TxStatusRequest>,
    ) -> Result<Response<pb::TxStatusResponse>, Status> {
        let from = caller(&request);
        let id = tx_id_of(&request.into_inner().tx_id)?;
        use pb::tx_status_response::State;
        let response = match self.gateway.lookup(id, from).await? {
            Some(o) => pb::TxStatusResponse {
                state: State::Committed as i32,
                outcome: Some(to_wire(&o)),
            },
            None => {
                let slot = self.gateway.lookup_slot(from).await?;
                let in_index = !self.gateway.known(&[id]).await?.is_empty();
                drop(slot);
                // Only invalid copies agreed so far: pending, with the newest as the outcome.
                let copy = self.gateway.outcomes.invalid_copy(&id);
                let executed_or_pending = in_index
                    || copy.is_some()
                    || self
                        .gateway
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
                    outcome: copy.as_ref().map(to_wire),
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
        let address = caller(&request);
        let from = request.into_inner().from_block;
        let gateway = self.gateway.clone();
        let Some(permit) = gateway.streams.admit(address) else {
            let settings = &gateway.settings;
            return Err(status::busy(format!(
                "organization {} keeps at most {} commit streams open, {} from one address \
                 (max_commit_streams, max_commit_streams_per_address); close one or try again \
                 later",
                gateway.me, settings.max_commit_streams, settings.max_commit_streams_per_address
            )));
        };
        let from = if from == 0 {
            BlockNumber(gateway.agreed().0 + 1)
        } else {
            BlockNumber(from)
        };
        let blocks = gateway.feed.subscribe(from);
        let events = futures_util::stream::unfold(Some(blocks), |blocks| async move {
            let mut blocks = blocks?;
            let event = match blocks.next().await {
                Some(Ok(c)) => Ok(event_of(c.block.number, &c.block.outcomes(&c.reasons))),
                Some(Err(e)) => Err(status::unavailable(
                    format_args!("reading ledger block {}", blocks.next_block()),
                    e,
                )),
                // The node stopped: the stream ends, so that a graceful shutdown completes.
                None => Err(status::shutting_down()),
            };
            let more = event.is_ok().then_some(blocks);
            Some((event, more))
        });
        let settings = &gateway.settings;
        let stream = pump(
            Box::pin(events),
            settings.commit_stream_buffer,
            settings.commit_stream_stall,
            permit,
        );
        Ok(Response::new(stream))
    }

    async fn query(
        &self,
        request: Request<pb::QueryRequest>,
    ) -> Result<Response<pb::QueryResponse>, Status> {
        self.gateway
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
        let gateway = &self.gateway;
        let batch = request.into_inner();
        if batch.proposals.len() > gateway.settings.max_endorse_batch {
            return Err(status::invalid(format!(
                "{} proposals in one batch; at most {}",
                batch.proposals.len(),
                gateway.settings.max_endorse_batch
            )));
        }
        let mut proposals = Vec::with_capacity(batch.proposals.len());
        for (i, p) in batch.proposals.into_iter().enumerate() {
            proposals.push(
                Proposal::try_from(p)
                    .map_err(|e| status::malformed(&format!("proposals[{i}]"), &e))?,
            );
        }
        let ids: Vec<TxId> = proposals.iter().map(Proposal::tx_id).collect();
        // The batch must come from the organization it names: nonces are claimed for it.
        let from = OrgId(batch.from_org);
        gateway
            .admission
            .check_batch_origin(from, &ids, &batch.signature)
            .map_err(status::refused)?;
        let known = gateway.known(&ids).await?;
        // Signature checks and analysis are CPU work: off the async threads, and bounded, so a
        // peer's calls at once cannot take every core; apart from clients' work, so that a
        // client's flood of new statement shapes does not hold back the peers' endorsements.
        let admission = gateway.admission.clone();
        let queue = gateway.endorsing.get(&from).ok_or_else(|| {
            status::internal("checking proposals", format!("no queue for {from}"))
        })?;
        let responses = queue
            .run(move || {
                admission.preverify(&proposals);
                let asked: Vec<(&Proposal, TxId, bool)> = proposals
                    .iter()
                    .zip(&ids)
                    .map(|(p, id)| (p, *id, known.contains(id)))
                    .collect();
                admission.verdicts(&asked, from).map(|responses| {
                    responses
                        .iter()
                        .map(pb::EarlyAbortResponse::from)
                        .collect::<Vec<_>>()
                })
            })
            .await
            .map_err(|e| status::offloaded(format_args!("checking proposals of {from}"), e))?
            .map_err(status::refused)?;
        Ok(Response::new(pb::EarlyAbortBatchResponse { responses }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::tx::{Certificate, LedgerBlock};
    use chainify_core::{Digest, NetworkId};

    fn committed(number: u64, txs: &[(TxId, bool, bool)], reasons: &[(usize, &str)]) -> Committed {
        Committed {
            block: LedgerBlock {
                network: NetworkId::new("net").unwrap(),
                number: BlockNumber(number),
                tx_ids: txs.iter().map(|t| t.0).collect(),
                success: txs.iter().map(|t| t.1).collect(),
                valid: txs.iter().map(|t| t.2).collect(),
                hash_digest: Digest::ZERO,
                state_digest: Digest::ZERO,
                hash_previous: Digest::ZERO,
                orderer_position: 0,
            },
            certificate: Certificate {
                block: BlockNumber(number),
                ledger_block_hash: Digest::ZERO,
                votes: Vec::new(),
            },
            reasons: reasons.iter().map(|(i, r)| (*i, (*r).to_owned())).collect(),
        }
    }

    /// Endorsement batches are bounded by bytes as well as by count, so that large proposals
    /// never make a call the peer refuses for its size (with every other proposal in it).
    #[test]
    fn endorsement_batches_stay_within_their_bytes_and_lose_no_proposal() {
        let job = |n: u8, pad: usize| {
            let proposal = pb::Proposal {
                signature: vec![n; 64 + pad],
                ..pb::Proposal::default()
            };
            let (reply, _) = oneshot::channel();
            EndorseJob {
                proposal,
                id: TxId(Digest::try_from(&[n; 32][..]).unwrap()),
                reply,
            }
        };
        let (tx, mut rx) = mpsc::channel(64);
        // Sizes 100 B, 600 B, 300 B, 2 000 B (alone over the budget), 100 B.
        for (n, pad) in [(1, 36), (2, 536), (3, 236), (4, 1_936), (5, 36)] {
            tx.try_send(job(n, pad)).unwrap();
        }
        drop(tx);
        let mut batches = Vec::new();
        let mut carried = None;
        loop {
            let first = match carried.take() {
                Some(job) => job,
                None => match rx.try_recv() {
                    Ok(job) => job,
                    Err(_) => break,
                },
            };
            let (jobs, rest) = fill_batch(first, &mut rx, 3, 1_000);
            carried = rest;
            let sizes: Vec<usize> = jobs.iter().map(|j| j.proposal.encoded_len()).collect();
            assert!(
                sizes.len() == 1 || sizes.iter().sum::<usize>() <= 1_000,
                "{sizes:?}"
            );
            batches.push(
                jobs.iter()
                    .map(|j| j.id.0.as_bytes()[0])
                    .collect::<Vec<u8>>(),
            );
        }
        assert_eq!(batches, [vec![1, 2], vec![3], vec![4], vec![5]]);
    }

    // At the real budget, a whole batch (with its framing) fits in the peers' message limit.
    const _: () = assert!(
        MAX_ENDORSE_BATCH_BYTES + 2 * chainify_core::tx::MAX_TRANSACTION_BYTES
            < crate::org::MAX_MESSAGE
    );

    /// A client that reads nothing while its buffer is full loses the stream after the stall,
    /// told where to resume; one that reads gets every event; one that leaves frees the place.
    #[tokio::test]
    async fn a_commit_stream_whose_client_stops_reading_ends_and_frees_its_place() {
        use futures_util::StreamExt;
        let event = |b: u64| {
            Ok(pb::CommitEvent {
                block_number: b,
                outcomes: Vec::new(),
            })
        };
        let place = Arc::new(());
        let source = futures_util::stream::iter((1..=10).map(event));
        let mut stream = pump(
            Box::pin(source),
            2,
            Duration::from_millis(100),
            place.clone(),
        );
        // Not read: the task fills the buffer (blocks 1, 2), waits for block 3's room, gives
        // up after the stall and frees the place.
        let freed = |place: &Arc<()>| {
            let place = place.clone();
            async move {
                for _ in 0..1000 {
                    if Arc::strong_count(&place) == 2 {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                false
            }
        };
        assert!(freed(&place).await, "the stalled stream's place was kept");
        let got: Vec<_> = stream.by_ref().collect().await;
        let blocks: Vec<u64> = got
            .iter()
            .filter_map(|e| e.as_ref().ok())
            .map(|e| e.block_number)
            .collect();
        assert_eq!(blocks, [1, 2]);
        let Some(Err(end)) = got.last() else {
            panic!("the stream ended without saying why: {got:?}");
        };
        assert_eq!(end.code(), tonic::Code::ResourceExhausted);
        assert!(end.message().contains("from block 3"), "{end:?}");
        // A client that reads gets everything, and the stream ends when the source does.
        let source = futures_util::stream::iter((1..=10).map(event));
        let read: Vec<_> = pump(Box::pin(source), 2, Duration::from_secs(10), ())
            .collect()
            .await;
        assert_eq!(read.len(), 10);
        assert!(read.iter().all(Result::is_ok));
        // A client that goes away frees the place at once, though no event comes.
        let place = Arc::new(());
        let stream = pump(
            Box::pin(futures_util::stream::pending()),
            2,
            Duration::from_secs(60),
            place.clone(),
        );
        drop(stream);
        assert!(freed(&place).await, "a closed stream's place was kept");
    }

    /// TxStatus answers with a transaction's own outcome, reason included, and a later invalid
    /// copy of it (a duplicate the orderer repeated) does not replace it.
    #[test]
    fn a_duplicate_copy_does_not_hide_the_outcome() {
        let (t, u) = (TxId(Digest::of(b"t")), TxId(Digest::of(b"u")));
        let outcomes = Outcomes::new(100);
        outcomes.record(&committed(
            1,
            &[(t, true, true), (u, false, true)],
            &[(1, "statement 1: expected 1 rows, got 0")],
        ));
        outcomes.record(&committed(
            2,
            &[(t, false, false)],
            &[(0, "duplicate: already in the ledger")],
        ));
        let held = outcomes.recent(&t).expect("t");
        assert!(held.success && held.agreed && held.reason.is_empty());
        assert_eq!((held.block, held.index), (BlockNumber(1), 0));
        let failed = outcomes.recent(&u).expect("u");
        assert!(!failed.success);
        assert_eq!(failed.reason, "statement 1: expected 1 rows, got 0");
        assert_eq!((failed.block, failed.index), (BlockNumber(1), 1));
        // An invalid copy seen first is kept as such, with its reason, but is no outcome.
        let v = TxId(Digest::of(b"v"));
        outcomes.record(&committed(3, &[(v, false, false)], &[(0, "not endorsed")]));
        assert_eq!(outcomes.recent(&v), None);
        let copy = outcomes.invalid_copy(&v).expect("v's copy");
        assert_eq!(copy.reason, "not endorsed");
        assert!(!copy.valid);
        // The valid copy, agreed later, replaces it.
        outcomes.record(&committed(4, &[(v, true, true)], &[]));
        assert_eq!(outcomes.recent(&v).expect("v").block, BlockNumber(4));
        assert_eq!(outcomes.invalid_copy(&v), None);
    }

    /// A client waiting for its transaction is not told it aborted because the (untrusted)
    /// orderer ordered a copy stripped of its endorsements first, in an earlier block or
    /// earlier in the same one: it would try again under a new nonce and apply twice.
    #[test]
    fn an_invalid_copy_does_not_answer_a_waiting_client() {
        let (t, u) = (TxId(Digest::of(b"t")), TxId(Digest::of(b"u")));
        let outcomes = Outcomes::new(100);
        let wait = |id: TxId| {
            let (tx, rx) = oneshot::channel();
            outcomes
                .waiters
                .lock()
                .unwrap()
                .entry(id)
                .or_default()
                .push(tx);
            rx
        };
        let (mut for_t, mut for_u) = (wait(t), wait(u));
        outcomes.record(&committed(1, &[(t, false, false)], &[(0, "stripped")]));
        assert!(for_t.try_recv().is_err(), "woken by the stripped copy");
        outcomes.record(&committed(
            2,
            &[(u, false, false), (t, true, true), (u, true, true)],
            &[(0, "stripped")],
        ));
        let got = for_t.try_recv().expect("t's outcome");
        assert!(got.success && got.valid);
        assert_eq!((got.block, got.index), (BlockNumber(2), 1));
        let got = for_u.try_recv().expect("u's outcome");
        assert!(got.success && got.valid);
        assert_eq!((got.block, got.index), (BlockNumber(2), 2));
    }
}
