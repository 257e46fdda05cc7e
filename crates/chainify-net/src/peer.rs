//! CommitServers over gRPC: [`GrpcTransport`] sends votes, certificates and certificate
//! requests to the other organizations; [`CommitServer`] receives them into the node's inbox
//! and serves certificates and ledger entries.
//!
//! Sending never blocks the node: each peer has a bounded queue drained by its own task, which
//! sends every vote queued at that moment in one `SendVotes` call. A full queue drops the
//! message (the protocol re-sends votes and re-requests certificates), and a peer that is down
//! costs one failed call per batch, not one per vote.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use chainify_core::config::NetworkConfig;
use chainify_core::tx::LedgerEntry;
use chainify_core::tx::{Certificate, Vote};
use chainify_core::{BlockNumber, OrgId};
use chainify_node::{Inbox, NodeStatus, PeerMessage, StateServer, Transport, ledger};
use chainify_proto::pb;
use chainify_proto::pb::commit_service_client::CommitServiceClient;
use chainify_proto::pb::commit_service_server::CommitService;
use chainify_storage::{Backend, Store};
use futures_util::Stream;
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::debug;

use crate::state::{RowsStream, StateService};
use crate::tls::{Tls, channel};
use crate::{NetError, status};

/// Messages queued for one peer; more are dropped.
pub const PEER_QUEUE: usize = 4096;
/// Most votes in one `SendVotes` call.
pub const MAX_VOTE_BATCH: usize = 512;
/// How long a call to a peer may take.
pub const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(5);

enum Outgoing {
    Vote(pb::Vote),
    Certificate(pb::Certificate),
    Request(BlockNumber),
}

/// The sending side of an organization's CommitServer.
#[derive(Debug)]
pub struct GrpcTransport {
    queues: BTreeMap<OrgId, mpsc::Sender<Outgoing>>,
    dropped: Arc<AtomicU64>,
    /// Where answers to certificate requests go: this node's inbox, known once it starts.
    inbox: Arc<OnceLock<Inbox>>,
}

impl GrpcTransport {
    /// Connects (lazily) to every other organization's CommitService. Must be called inside a
    /// tokio runtime: it starts one sending task per peer, which ends with the transport.
    pub fn new(
        network: &NetworkConfig,
        me: OrgId,
        tls: Option<&Tls>,
    ) -> Result<GrpcTransport, NetError> {
        let inbox = Arc::new(OnceLock::new());
        let mut queues = BTreeMap::new();
        for org in network.orgs.values().filter(|o| o.id != me) {
            let client = CommitServiceClient::new(channel(&org.commit_endpoint, tls)?);
            let (tx, rx) = mpsc::channel(PEER_QUEUE);
            tokio::spawn(send_loop(org.id, client, rx, inbox.clone()));
            queues.insert(org.id, tx);
        }
        Ok(GrpcTransport {
            queues,
            dropped: Arc::new(AtomicU64::new(0)),
            inbox,
        })
    }

    /// Sets the node's inbox, for answers to certificate requests.
    pub fn attach(&self, inbox: Inbox) {
        let _ = self.inbox.set(inbox);
    }

    /// Messages dropped because a peer's queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn push(&self, to: OrgId, message: Outgoing) {
        if let Some(q) = self.queues.get(&to)
            && q.try_send(message).is_err()
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Transport for GrpcTransport {
    fn send_vote(&self, vote: &Vote) {
        let wire = pb::Vote::from(vote);
        for to in self.queues.keys() {
            self.push(*to, Outgoing::Vote(wire.clone()));
        }
    }

    fn send_certificate(&self, to: OrgId, certificate: &Certificate) {
        self.push(
            to,
            Outgoing::Certificate(pb::Certificate::from(certificate)),
        );
    }

    fn request_certificate(&self, block: BlockNumber) {
        for to in self.queues.keys() {
            self.push(*to, Outgoing::Request(block));
        }
    }
}

fn timed<T>(message: T) -> Request<T> {
    let mut r = Request::new(message);
    r.set_timeout(PEER_CALL_TIMEOUT);
    r
}

async fn send_loop(
    peer: OrgId,
    mut client: CommitServiceClient<Channel>,
    mut rx: mpsc::Receiver<Outgoing>,
    inbox: Arc<OnceLock<Inbox>>,
) {
    while let Some(first) = rx.recv().await {
        let mut votes = Vec::new();
        let mut others = Vec::new();
        let mut next = Some(first);
        while let Some(message) = next {
            match message {
                Outgoing::Vote(v) => votes.push(v),
                other => others.push(other),
            }
            next = if votes.len() < MAX_VOTE_BATCH {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        if !votes.is_empty()
            && let Err(e) = client.send_votes(timed(pb::VoteBatch { votes })).await
        {
            debug!(%peer, error = %e, "sending votes failed");
        }
        for message in others {
            match message {
                Outgoing::Certificate(c) => {
                    if let Err(e) = client.send_certificate(timed(c)).await {
                        debug!(%peer, error = %e, "sending a certificate failed");
                    }
                }
                Outgoing::Request(block) => {
                    let answer = client
                        .get_certificate(timed(pb::GetCertificateRequest {
                            block_number: block.0,
                        }))
                        .await;
                    match answer.map(|r| r.into_inner().certificate) {
                        Ok(Some(c)) => match Certificate::try_from(c) {
                            Ok(c) => {
                                if let Some(inbox) = inbox.get() {
                                    inbox.deliver(PeerMessage::Certificate(c));
                                }
                            }
                            Err(e) => debug!(%peer, error = %e, "malformed certificate"),
                        },
                        Ok(None) => {}
                        Err(e) => debug!(%peer, error = %e, "requesting a certificate failed"),
                    }
                }
                Outgoing::Vote(_) => {}
            }
        }
    }
}

/// Most ledger entries one `GetLedger` call streams.
pub const MAX_LEDGER_STREAM: u64 = 100_000;

/// Votes this far below the agreed height are dropped before the node's inbox: they buy
/// nothing there (a voter that far behind fetches certificates itself).
const LATE_VOTES: u64 = 64;

/// A vote queued again within this time is dropped before it is checked again (peers resend
/// their votes after 500 ms).
const REPLAY_WINDOW: Duration = Duration::from_millis(250);

/// Most votes remembered as queued; older ones are forgotten first.
const MAX_REMEMBERED_VOTES: usize = 8192;

/// Votes checked before the node's inbox. The CommitService has no client authentication, and
/// the node checks votes one at a time in its own task: forged or replayed votes queued there
/// crowd out the real ones (an audit's flood of forged votes kept an organization from agreeing
/// for 30 s). Here a batch stops at its first vote that does not verify, and a vote queued a
/// moment ago is not checked or queued again.
#[derive(Debug)]
struct VoteCheck {
    ctx: chainify_core::votes::VoteContext,
    me: OrgId,
    queued: std::sync::Mutex<HashMap<(OrgId, BlockNumber, chainify_core::Digest), Instant>>,
}

impl VoteCheck {
    /// The votes of a batch worth queueing, or the first that does not verify.
    fn check(&self, votes: Vec<Vote>, agreed: u64) -> Result<Vec<Vote>, Status> {
        let now = Instant::now();
        let mut fresh = Vec::with_capacity(votes.len());
        for (i, vote) in votes.into_iter().enumerate() {
            if vote.org == self.me || vote.block.0.saturating_add(LATE_VOTES) < agreed {
                continue;
            }
            let key = (vote.org, vote.block, vote.ledger_block_hash);
            let recent = self
                .queued()
                .get(&key)
                .is_some_and(|at| now.duration_since(*at) < REPLAY_WINDOW);
            if recent {
                continue;
            }
            chainify_core::votes::check_vote_signature(&vote, &self.ctx)
                .map_err(|e| status::invalid(format_args!("votes[{i}]: {e}")))?;
            fresh.push(vote);
        }
        Ok(fresh)
    }

    /// Remembers a vote as queued now.
    fn queued_now(&self, vote: &Vote) {
        let now = Instant::now();
        let mut queued = self.queued();
        if queued.len() >= MAX_REMEMBERED_VOTES {
            queued.retain(|_, at| now.duration_since(*at) < REPLAY_WINDOW);
            if queued.len() >= MAX_REMEMBERED_VOTES {
                queued.clear();
            }
        }
        queued.insert((vote.org, vote.block, vote.ledger_block_hash), now);
    }

    fn queued(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(OrgId, BlockNumber, chainify_core::Digest), Instant>>
    {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Batches of up to this many votes are checked on the calling task (about 36 µs a vote).
const VOTES_CHECKED_IN_PLACE: usize = 4;

/// The receiving side of an organization's CommitServer.
#[derive(Debug)]
pub struct CommitServer<B: Backend> {
    inbox: Inbox,
    votes: Arc<VoteCheck>,
    store: Arc<Store<B>>,
    status: watch::Receiver<NodeStatus>,
    /// State transfer to other organizations (absent: the state RPCs are unavailable).
    state: Option<StateService<B>>,
}

impl<B: Backend> CommitServer<B> {
    /// Serves the node (organization `me` of `network`) with this inbox, store and status.
    pub fn new(
        network: &NetworkConfig,
        me: OrgId,
        inbox: Inbox,
        store: Arc<Store<B>>,
        status: watch::Receiver<NodeStatus>,
    ) -> CommitServer<B> {
        CommitServer {
            inbox,
            votes: Arc::new(VoteCheck {
                ctx: chainify_core::votes::VoteContext::of(network),
                me,
                queued: std::sync::Mutex::default(),
            }),
            store,
            status,
            state: None,
        }
    }

    /// Also serves the node's state to the other organizations of `network` (this one is `me`).
    pub fn with_state(
        self,
        server: Arc<StateServer<B>>,
        network: &NetworkConfig,
        me: OrgId,
    ) -> CommitServer<B> {
        CommitServer {
            state: Some(StateService {
                server,
                ctx: chainify_core::votes::VoteContext::of(network),
                me,
                responses: Arc::new(tokio::sync::Semaphore::new(
                    crate::state::MAX_ROWS_RESPONSES,
                )),
            }),
            ..self
        }
    }

    fn state(&self) -> Result<&StateService<B>, Status> {
        self.state
            .as_ref()
            .ok_or_else(|| status::not_served("this CommitServer does not serve state"))
    }

    fn agreed(&self) -> u64 {
        self.status.borrow().next_block.0.saturating_sub(1)
    }
}

type LedgerStream = Pin<Box<dyn Stream<Item = Result<pb::LedgerEntry, Status>> + Send>>;

#[tonic::async_trait]
impl<B: Backend + 'static> CommitService for CommitServer<B> {
    async fn send_votes(
        &self,
        request: Request<pb::VoteBatch>,
    ) -> Result<Response<pb::VoteAck>, Status> {
        let votes = request
            .into_inner()
            .votes
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                Vote::try_from(v).map_err(|e| status::malformed(&format!("votes[{i}]"), &e))
            })
            .collect::<Result<Vec<Vote>, Status>>()?;
        let agreed = self.agreed();
        let fresh = if votes.len() <= VOTES_CHECKED_IN_PLACE {
            self.votes.check(votes, agreed)?
        } else {
            let check = self.votes.clone();
            tokio::task::spawn_blocking(move || check.check(votes, agreed))
                .await
                .map_err(|e| status::internal("checking votes", e))??
        };
        // The engine checks membership and duplicates again, with the tally.
        let mut accepted = 0u32;
        for vote in fresh {
            self.votes.queued_now(&vote);
            if self.inbox.deliver(PeerMessage::Vote(vote)) {
                accepted += 1;
            }
        }
        Ok(Response::new(pb::VoteAck { accepted }))
    }

    async fn send_certificate(
        &self,
        request: Request<pb::Certificate>,
    ) -> Result<Response<pb::CertificateAck>, Status> {
        let cert = Certificate::try_from(request.into_inner())
            .map_err(|e| status::malformed("certificate", &e))?;
        if !self.inbox.deliver(PeerMessage::Certificate(cert)) {
            return Err(status::busy(
                "the CommitServer's inbox is full; send again later",
            ));
        }
        Ok(Response::new(pb::CertificateAck {}))
    }

    async fn get_certificate(
        &self,
        request: Request<pb::GetCertificateRequest>,
    ) -> Result<Response<pb::GetCertificateResponse>, Status> {
        let block = request.into_inner().block_number;
        if block == 0 || block > self.agreed() {
            return Ok(Response::new(pb::GetCertificateResponse {
                certificate: None,
            }));
        }
        let entry = ledger::entry(&self.store, BlockNumber(block))
            .await
            .map_err(|e| status::unavailable(format_args!("reading ledger block {block}"), e))?;
        Ok(Response::new(pb::GetCertificateResponse {
            certificate: Some(pb::Certificate::from(&entry.certificate)),
        }))
    }

    type GetLedgerStream = LedgerStream;
    type StateRowsStream = RowsStream;

    async fn state_offer(
        &self,
        request: Request<pb::StateOfferRequest>,
    ) -> Result<Response<pb::StateOfferResponse>, Status> {
        self.state()?.offer(request.into_inner()).await
    }

    async fn state_digests(
        &self,
        request: Request<pb::StateDigestsRequest>,
    ) -> Result<Response<pb::StateDigestsResponse>, Status> {
        self.state()?.digests(request.into_inner()).await
    }

    async fn state_rows(
        &self,
        request: Request<pb::StateRowsRequest>,
    ) -> Result<Response<RowsStream>, Status> {
        self.state()?.rows(request.into_inner()).await
    }

    async fn get_ledger(
        &self,
        request: Request<pb::GetLedgerRequest>,
    ) -> Result<Response<LedgerStream>, Status> {
        let r = request.into_inner();
        let agreed = self.agreed();
        let from = r.from_block.max(1);
        let to = if r.to_block == 0 {
            agreed
        } else {
            r.to_block.min(agreed)
        };
        if to >= from && to - from >= MAX_LEDGER_STREAM {
            return Err(status::invalid(format!(
                "blocks {from}..={to}: at most {MAX_LEDGER_STREAM} ledger entries per call"
            )));
        }
        let store = self.store.clone();
        let stream = futures_util::stream::unfold(from, move |b| {
            let store = store.clone();
            async move {
                if b > to {
                    return None;
                }
                let item = ledger::entry(&store, BlockNumber(b))
                    .await
                    .map(|e: LedgerEntry| pb::LedgerEntry::from(&e))
                    .map_err(|e| status::unavailable(format_args!("reading ledger block {b}"), e));
                // After an error the stream ends.
                let next = if item.is_ok() { b + 1 } else { u64::MAX };
                Some((item, next))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
