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
use chainify_node::fair::{FairLimits, FairPlace, FairShare};
use chainify_node::{Inbox, NodeStatus, PeerMessage, StateServer, Transport, ledger};
use chainify_proto::pb;
use chainify_proto::pb::commit_service_client::CommitServiceClient;
use chainify_proto::pb::commit_service_server::CommitService;
use chainify_storage::{Backend, Store};
use futures_util::{Stream, StreamExt};
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

/// What a transport signs its certificate requests with.
struct Signer {
    network: chainify_core::NetworkId,
    signatures: chainify_core::crypto::Signatures,
    key: Arc<chainify_core::crypto::SigningKey>,
    me: OrgId,
}

impl GrpcTransport {
    /// Connects (lazily) to every other organization's CommitService; certificate requests
    /// are signed with `key` as organization `me`. Must be called inside a tokio runtime: it
    /// starts one sending task per peer, which ends with the transport.
    pub fn new(
        network: &NetworkConfig,
        me: OrgId,
        key: Arc<chainify_core::crypto::SigningKey>,
        tls: Option<&Tls>,
    ) -> Result<GrpcTransport, NetError> {
        let inbox = Arc::new(OnceLock::new());
        let mut queues = BTreeMap::new();
        let signer = Arc::new(Signer {
            network: network.network_id.clone(),
            signatures: network.signatures,
            key,
            me,
        });
        for org in network.orgs.values().filter(|o| o.id != me) {
            let client =
                CommitServiceClient::new(channel(&org.commit_endpoint, tls, &org.id.tls_name())?);
            let (tx, rx) = mpsc::channel(PEER_QUEUE);
            tokio::spawn(send_loop(org.id, client, rx, inbox.clone(), signer.clone()));
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
    signer: Arc<Signer>,
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
                            auth: Some(crate::state::sign_auth(
                                &signer.network,
                                signer.signatures,
                                &signer.key,
                                signer.me,
                                peer,
                                ("GetCertificate", block.0, ""),
                            )),
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

/// `GetLedger` streams served at once: each reads the ledger through the pool the blocks use,
/// and they ask no one who calls (found by a hunt: a flood of them would hold the connections a
/// block needs). Shared fairly among addresses, one each.
const LEDGER_READS: FairLimits = FairLimits {
    places: 2,
    per_key: 1,
    waiting_per_key: 8,
    waiting: 64,
};

/// `GetCertificate` calls served at once, apart from the streams (a single read each, which a
/// lagging organization needs to catch up: slow streams must not hold them back).
const CERTIFICATE_READS: FairLimits = FairLimits {
    places: 2,
    per_key: 1,
    waiting_per_key: 8,
    waiting: 64,
};

/// How long a ledger read waits for its place before it is refused as busy.
const LEDGER_READ_WAIT: Duration = Duration::from_secs(5);

/// How long one `GetLedger` stream may take, however slowly its caller reads: it holds a place.
const LEDGER_STREAM_LIMIT: Duration = Duration::from_secs(120);

/// A vote or certificate queued again within this time is dropped before it is checked again
/// (peers resend their votes after 500 ms).
const REPLAY_WINDOW: Duration = Duration::from_millis(250);

/// Most entries each of [`VoteCheck`]'s memories keeps; it starts over when full.
const MAX_REMEMBERED: usize = 8192;

/// Late votes go on once per voter and block for the newest blocks agreed, this many (the node
/// answers them from the certificates it keeps in memory); further behind, only a voter's
/// votes that rise above the highest of its late votes forwarded so far: what a lagging
/// organization catching up sends. Without the bound, any member could replay the others'
/// signed votes for thousands of old blocks in a loop (the memory below starts over when
/// full), each one a signature check and a ledger read in the node's own task.
const LATE_WINDOW: u64 = 256;

/// Distinct hashes forwarded for one organization and block: two prove an equivocation.
const HASHES_PER_VOTER: u8 = 2;

/// Blocks checked at once off the async workers (each batch or certificate up to 512
/// signatures, ~36 µs each); a call that finds none free is answered "busy".
const CHECKS_AT_ONCE: usize = 2;

/// Batches of up to this many signatures are checked on the calling task.
const CHECKED_IN_PLACE: usize = 4;

/// Votes and certificates checked before the node's inbox. The CommitService has no client
/// authentication, and the node checks them one at a time in its own task: forged or replayed
/// ones queued there crowd out the real votes (an audit's flood of forged votes kept an
/// organization from agreeing for 30 s). Here a batch stops at its first vote that does not
/// verify, and what the node has no use for is dropped before it is checked: a copy queued a
/// moment ago, the organization's own votes, a block beyond the engine's window, a third hash
/// from one voter for one block, and a late vote (the engine answers it with the certificate,
/// once per voter and block) seen before.
#[derive(Debug)]
struct VoteCheck {
    ctx: chainify_core::votes::VoteContext,
    me: OrgId,
    memory: std::sync::Mutex<Memory>,
    checks: Arc<tokio::sync::Semaphore>,
}

type VoteKey = (OrgId, BlockNumber, chainify_core::Digest);

/// What [`VoteCheck`] has queued lately.
#[derive(Debug, Default)]
struct Memory {
    /// Votes by content, with when they were queued.
    queued: HashMap<VoteKey, Instant>,
    /// Certificates by block and hash, with when they were queued.
    certificates: HashMap<(BlockNumber, chainify_core::Digest), Instant>,
    /// Distinct hashes forwarded per voter and block.
    hashes: HashMap<(OrgId, BlockNumber), u8>,
    /// Late votes forwarded, per voter and block.
    late: std::collections::HashSet<(OrgId, BlockNumber)>,
    /// The highest late vote forwarded per voter from below the window.
    late_high: HashMap<OrgId, BlockNumber>,
}

/// Whether `key` is in `memory` from within the replay window.
fn recent<K: std::hash::Hash + Eq>(memory: &HashMap<K, Instant>, key: &K, now: Instant) -> bool {
    memory
        .get(key)
        .is_some_and(|at| now.duration_since(*at) < REPLAY_WINDOW)
}

/// Whether a late vote for `block` (at most `agreed`) is recent enough to go on.
fn within_late_window(block: BlockNumber, agreed: u64) -> bool {
    block.0.saturating_add(LATE_WINDOW) > agreed
}

/// Whether a vote or certificate for `block` is beyond the engine's window past `agreed`.
fn beyond_window(block: BlockNumber, agreed: u64) -> bool {
    block.0 > agreed.saturating_add(1 + MAX_BLOCKS_AHEAD)
}

impl Memory {
    /// Remembers the vote `key` as queued now (with its voter's hash, or as a late vote at
    /// agreed height `agreed`).
    fn queued(&mut self, key: VoteKey, agreed: u64, now: Instant) {
        let late = key.1.0 <= agreed;
        if self.queued.len() >= MAX_REMEMBERED {
            self.queued.clear();
        }
        if self.queued.insert(key, now).is_none() {
            if self.hashes.len() >= MAX_REMEMBERED {
                self.hashes.clear();
            }
            let count = self.hashes.entry((key.0, key.1)).or_default();
            *count = count.saturating_add(1);
        }
        if late && !within_late_window(key.1, agreed) {
            let high = self.late_high.entry(key.0).or_insert(key.1);
            *high = (*high).max(key.1);
        } else if late {
            // Only blocks within the window are ever forwarded late: those below it go first,
            // so that a late vote is not forwarded twice while the window holds fewer than
            // MAX_REMEMBERED (voters × LATE_WINDOW).
            if self.late.len() >= MAX_REMEMBERED {
                self.late.retain(|(_, b)| within_late_window(*b, agreed));
            }
            if self.late.len() >= MAX_REMEMBERED {
                self.late.clear();
            }
            self.late.insert((key.0, key.1));
        }
    }

    /// Remembers a certificate as queued now.
    fn certified(&mut self, block: BlockNumber, hash: chainify_core::Digest, now: Instant) {
        if self.certificates.len() >= MAX_REMEMBERED {
            self.certificates.clear();
        }
        self.certificates.insert((block, hash), now);
    }
}

impl VoteCheck {
    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The votes of a batch worth queueing (each once), or the first that does not verify.
    fn check(&self, votes: Vec<Vote>, agreed: u64) -> Result<Vec<Vote>, Status> {
        let now = Instant::now();
        // What this batch adds to the memory, counted as the memory counts.
        let mut seen = std::collections::HashSet::with_capacity(votes.len());
        let mut hashes: HashMap<(OrgId, BlockNumber), u8> = HashMap::new();
        // The highest late vote from below the window this batch forwards, per voter.
        let mut rising: HashMap<OrgId, BlockNumber> = HashMap::new();
        let mut fresh = Vec::with_capacity(votes.len());
        for (i, vote) in votes.into_iter().enumerate() {
            let (org, block) = (vote.org, vote.block);
            let key = (org, block, vote.ledger_block_hash);
            if org == self.me || beyond_window(block, agreed) || !seen.insert(key) {
                continue;
            }
            let wanted = {
                let memory = self.memory();
                let added = hashes.get(&(org, block)).copied().unwrap_or(0);
                if recent(&memory.queued, &key, now) {
                    false
                } else if block.0 <= agreed && within_late_window(block, agreed) {
                    added == 0 && !memory.late.contains(&(org, block))
                } else if block.0 <= agreed {
                    let high = rising.get(&org).or(memory.late_high.get(&org));
                    high.is_none_or(|h| block > *h)
                } else {
                    memory.queued.contains_key(&key)
                        || memory.hashes.get(&(org, block)).copied().unwrap_or(0) + added
                            < HASHES_PER_VOTER
                }
            };
            if !wanted {
                continue;
            }
            chainify_core::votes::check_vote_signature(&vote, &self.ctx)
                .map_err(|e| status::invalid(format_args!("votes[{i}]: {e}")))?;
            *hashes.entry((org, block)).or_default() += 1;
            if block.0 <= agreed && !within_late_window(block, agreed) {
                rising.insert(org, block);
            }
            fresh.push(vote);
        }
        Ok(fresh)
    }

    /// Runs `check` on the calling task when it checks at most [`CHECKED_IN_PLACE`]
    /// signatures, else off the workers, one of [`CHECKS_AT_ONCE`].
    async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        signatures: usize,
        check: impl FnOnce(&VoteCheck) -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        if signatures <= CHECKED_IN_PLACE {
            return check(self);
        }
        let permit = self.checks.clone().try_acquire_owned().map_err(|_| {
            status::busy("the CommitServer is checking other votes; send again later")
        })?;
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            check(&this)
        })
        .await
        .map_err(|e| status::internal("checking votes", e))?
    }
}

/// Votes further ahead of the agreed height the engine refuses
/// ([`chainify_commit::MAX_BLOCKS_AHEAD`]).
const MAX_BLOCKS_AHEAD: u64 = chainify_commit::MAX_BLOCKS_AHEAD;

/// The receiving side of an organization's CommitServer.
#[derive(Debug)]
pub struct CommitServer<B: Backend> {
    inbox: Inbox,
    votes: Arc<VoteCheck>,
    store: Arc<Store<B>>,
    status: watch::Receiver<NodeStatus>,
    /// State transfer to other organizations (absent: the state RPCs are unavailable).
    state: Option<StateService<B>>,
    /// Places for streams of the ledger ([`LEDGER_READS`]): the organizations' (by their
    /// signed requests) and everyone else's (by address).
    ledger_reads: ReadPlaces,
    /// Places for reads of a certificate ([`CERTIFICATE_READS`]), likewise.
    certificate_reads: ReadPlaces,
}

/// Places to read the ledger: the network's organizations, one each by the signature on their
/// request, apart from every other caller, one an address. So that callers from many
/// addresses cannot hold back an organization that catches up.
#[derive(Debug)]
struct ReadPlaces {
    limits: FairLimits,
    members: FairShare<OrgId>,
    others: FairShare<std::net::IpAddr>,
}

/// A place held by one read: given back when the read drops it.
struct ReadPlace {
    _member: Option<FairPlace<OrgId>>,
    _other: Option<FairPlace<std::net::IpAddr>>,
}

impl ReadPlaces {
    fn new(limits: FairLimits) -> ReadPlaces {
        ReadPlaces {
            limits,
            members: FairShare::new(limits),
            others: FairShare::new(limits),
        }
    }

    /// A place for organization `member` (its signature checked), or for the caller at `from`;
    /// busy after [`LEDGER_READ_WAIT`].
    async fn acquire(
        &self,
        member: Option<OrgId>,
        from: std::net::IpAddr,
    ) -> Result<ReadPlace, Status> {
        let busy = |whose: String| {
            status::busy(format!(
                "{} reads of the ledger are under way ({whose}) and none was free within {LEDGER_READ_WAIT:?}; ask again later",
                self.limits.places
            ))
        };
        match member {
            Some(org) => {
                match tokio::time::timeout(LEDGER_READ_WAIT, self.members.acquire(org)).await {
                    Ok(Ok(place)) => Ok(ReadPlace {
                        _member: Some(place),
                        _other: None,
                    }),
                    _ => Err(busy(format!("one an organization, none for {org}"))),
                }
            }
            None => {
                let from = crate::conns::counted_as(from);
                match tokio::time::timeout(LEDGER_READ_WAIT, self.others.acquire(from)).await {
                    Ok(Ok(place)) => Ok(ReadPlace {
                        _member: None,
                        _other: Some(place),
                    }),
                    _ => Err(busy(format!("one an address, none for {from}"))),
                }
            }
        }
    }
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
                memory: std::sync::Mutex::default(),
                checks: Arc::new(tokio::sync::Semaphore::new(CHECKS_AT_ONCE)),
            }),
            store,
            status,
            state: None,
            ledger_reads: ReadPlaces::new(LEDGER_READS),
            certificate_reads: ReadPlaces::new(CERTIFICATE_READS),
        }
    }

    /// The organization that signed a read's `auth` for `method` and `block`, or none: an
    /// unsigned read, and one whose signature does not verify or was made too far from this
    /// server's clock, take an address's place (a peer whose clock is off still reads the
    /// certificates it needs to catch up, as before reads were signed).
    fn reader(&self, auth: Option<&pb::StateAuth>, method: &str, block: u64) -> Option<OrgId> {
        let auth = auth?;
        crate::state::check_auth(&self.votes.ctx, self.votes.me, auth, method, block, "")
            .inspect_err(|e| {
                debug!(org = auth.org_id, error = %e.message(), "a read's auth does not count; it takes an address's place");
            })
            .ok()
    }

    /// Also serves the node's state to the other organizations.
    pub fn with_state(self, server: Arc<StateServer<B>>) -> CommitServer<B> {
        CommitServer {
            state: Some(StateService {
                server,
                ctx: self.votes.ctx.clone(),
                me: self.votes.me,
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
        let votes = request.into_inner().votes;
        // What an honest peer sends at most in one call.
        if votes.len() > MAX_VOTE_BATCH {
            return Err(status::invalid(format_args!(
                "{} votes in one batch; at most {MAX_VOTE_BATCH}",
                votes.len()
            )));
        }
        let votes = votes
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                Vote::try_from(v).map_err(|e| status::malformed(&format!("votes[{i}]"), &e))
            })
            .collect::<Result<Vec<Vote>, Status>>()?;
        let agreed = self.agreed();
        let fresh = self
            .votes
            .run(votes.len(), move |c| c.check(votes, agreed))
            .await?;
        // The engine checks membership and duplicates again, with the tally.
        let mut accepted = 0u32;
        for vote in fresh {
            let key = (vote.org, vote.block, vote.ledger_block_hash);
            if self.inbox.deliver(PeerMessage::Vote(vote)) {
                self.votes.memory().queued(key, agreed, Instant::now());
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
        // Checked before the node's inbox, as votes are; one for an agreed block, or one
        // queued a moment ago, has no use there.
        let agreed = self.agreed();
        let (block, hash) = (cert.block, cert.ledger_block_hash);
        if block.0 <= agreed
            || recent(
                &self.votes.memory().certificates,
                &(block, hash),
                Instant::now(),
            )
        {
            return Ok(Response::new(pb::CertificateAck {}));
        }
        if beyond_window(block, agreed) {
            return Err(status::invalid(format_args!(
                "certificate of block {}: more than {MAX_BLOCKS_AHEAD} blocks ahead of the agreed {agreed}",
                cert.block
            )));
        }
        if cert.votes.len() > self.votes.ctx.keys.len() {
            return Err(status::invalid(format_args!(
                "certificate of block {}: {} votes from {} organizations",
                cert.block,
                cert.votes.len(),
                self.votes.ctx.keys.len()
            )));
        }
        let cert = self
            .votes
            .run(cert.votes.len(), move |c| {
                chainify_core::votes::verify_certificate(&cert, &c.ctx)
                    .map_err(|e| status::invalid(format_args!("certificate: {e}")))?;
                Ok(cert)
            })
            .await?;
        if !self.inbox.deliver(PeerMessage::Certificate(cert)) {
            return Err(status::busy(
                "the CommitServer's inbox is full; send again later",
            ));
        }
        self.votes.memory().certified(block, hash, Instant::now());
        Ok(Response::new(pb::CertificateAck {}))
    }

    async fn get_certificate(
        &self,
        request: Request<pb::GetCertificateRequest>,
    ) -> Result<Response<pb::GetCertificateResponse>, Status> {
        let from = crate::chainify::caller(&request);
        let r = request.into_inner();
        let block = r.block_number;
        if block == 0 || block > self.agreed() {
            return Ok(Response::new(pb::GetCertificateResponse {
                certificate: None,
            }));
        }
        let member = self.reader(r.auth.as_ref(), "GetCertificate", block);
        let _place = self.certificate_reads.acquire(member, from).await?;
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
        let from_address = crate::chainify::caller(&request);
        let r = request.into_inner();
        let member = self.reader(r.auth.as_ref(), "GetLedger", r.from_block);
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
        let place = self.ledger_reads.acquire(member, from_address).await?;
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
        })
        // The place goes with the stream, which ends after LEDGER_STREAM_LIMIT.
        .map(move |item| {
            let _held = &place;
            item
        })
        .take_until(tokio::time::sleep(LEDGER_STREAM_LIMIT));
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::Digest;
    use chainify_core::config::{NetworkBuilder, PortPlan};
    use chainify_core::crypto::SigningKey;

    fn key(org: u32) -> SigningKey {
        SigningKey::from_seed(&[org as u8; 32])
    }

    fn check() -> (VoteCheck, chainify_core::NetworkId) {
        let mut b = NetworkBuilder::new("net", "any-2", PortPlan { base: 7110 });
        for org in 1..=3 {
            b.org(&key(org).public_key(), "127.0.0.1");
        }
        let network = b.config("network.toml").expect("network");
        let check = VoteCheck {
            ctx: chainify_core::votes::VoteContext::of(&network),
            me: OrgId(1),
            memory: std::sync::Mutex::default(),
            checks: Arc::new(tokio::sync::Semaphore::new(CHECKS_AT_ONCE)),
        };
        (check, network.network_id)
    }

    fn vote(network: &chainify_core::NetworkId, org: u32, block: u64, hash: u8) -> Vote {
        Vote::new_signed(
            network.clone(),
            BlockNumber(block),
            Digest::of(&[hash]),
            OrgId(org),
            &key(org),
        )
    }

    /// Queues what `check` lets through, as `send_votes` does; how many.
    fn queue(check: &VoteCheck, votes: Vec<Vote>, agreed: u64) -> Result<usize, String> {
        let fresh = check
            .check(votes, agreed)
            .map_err(|s| s.message().to_owned())?;
        for v in &fresh {
            let key = (v.org, v.block, v.ledger_block_hash);
            check.memory().queued(key, agreed, Instant::now());
        }
        Ok(fresh.len())
    }

    #[test]
    fn only_what_the_node_has_a_use_for_is_queued() {
        let (check, net) = check();
        let agreed = 10;
        // Copies in one batch count once; a copy right after is dropped, a resend later not.
        let v = vote(&net, 2, 11, 1);
        assert_eq!(queue(&check, vec![v.clone(); 500], agreed), Ok(1));
        assert_eq!(queue(&check, vec![v.clone()], agreed), Ok(0));
        std::thread::sleep(REPLAY_WINDOW);
        assert_eq!(queue(&check, vec![v.clone()], agreed), Ok(1), "a resend");
        // Two hashes from one voter for one block (an equivocation), not a third.
        assert_eq!(
            queue(
                &check,
                vec![vote(&net, 2, 11, 2), vote(&net, 2, 11, 3)],
                agreed
            ),
            Ok(1)
        );
        // Its own votes, and blocks beyond the engine's window, are dropped.
        assert_eq!(
            queue(
                &check,
                vec![
                    vote(&net, 1, 11, 1),
                    vote(&net, 3, agreed + 2 + MAX_BLOCKS_AHEAD, 1)
                ],
                agreed
            ),
            Ok(0)
        );
        assert_eq!(
            queue(
                &check,
                vec![vote(&net, 3, agreed + 1 + MAX_BLOCKS_AHEAD, 1)],
                agreed
            ),
            Ok(1)
        );
        // A late vote goes on once per voter and block (the engine answers it with the
        // certificate).
        assert_eq!(queue(&check, vec![vote(&net, 3, 2, 1)], agreed), Ok(1));
        std::thread::sleep(REPLAY_WINDOW);
        assert_eq!(queue(&check, vec![vote(&net, 3, 2, 1)], agreed), Ok(0));
        // A batch stops at its first vote that does not verify, naming it.
        let mut forged = vote(&net, 2, 12, 1);
        forged.org = OrgId(3);
        let refused = queue(&check, vec![vote(&net, 2, 13, 1), forged], agreed).unwrap_err();
        assert!(refused.starts_with("votes[1]"), "{refused}");
    }

    /// Found by a hunt: the others' signed votes for old blocks, replayed in a loop by any
    /// member, went on to the node again each time the memory started over (24 992 of 8 400
    /// distinct ones in three rounds), each a signature check and a ledger read in the node's
    /// task. Late votes now go on once each: within the newest LATE_WINDOW blocks per voter and
    /// block, below them only rising (a lagging organization catching up, found by a review:
    /// it got one certificate a second by asking).
    #[test]
    fn replayed_late_votes_go_on_once_and_only_for_recent_blocks() {
        let (check, net) = check();
        let agreed = 4_300;
        let old: Vec<Vote> = (1..=agreed)
            .flat_map(|b| [vote(&net, 2, b, 1), vote(&net, 3, b, 1)])
            .collect();
        let mut forwarded = 0;
        for _ in 0..3 {
            for batch in old.chunks(MAX_VOTE_BATCH) {
                forwarded += queue(&check, batch.to_vec(), agreed).unwrap();
            }
            std::thread::sleep(REPLAY_WINDOW);
        }
        assert_eq!(forwarded, 2 * agreed as usize, "each once, and no more");
        // Below the window, a vote under the voter's highest goes no further.
        let (check, net) = self::check();
        let rise = |from: u64, to: u64| -> Vec<Vote> {
            (from..=to).map(|b| vote(&net, 2, b, 1)).collect()
        };
        assert_eq!(queue(&check, rise(100, 120), agreed), Ok(21), "catching up");
        std::thread::sleep(REPLAY_WINDOW);
        assert_eq!(queue(&check, rise(90, 120), agreed), Ok(0), "replayed");
        assert_eq!(queue(&check, rise(115, 125), agreed), Ok(5), "rising on");
        // Within the window, each once whatever its order.
        let near = agreed - LATE_WINDOW + 1;
        assert_eq!(queue(&check, rise(near, near + 2), agreed), Ok(3));
        std::thread::sleep(REPLAY_WINDOW);
        assert_eq!(queue(&check, rise(near, near + 3), agreed), Ok(1));
    }
}
