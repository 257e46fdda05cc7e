//! Admission (docs/design/overview.md §2.1): whether a proposal may be ordered, and every reason it
//! may not, in one place and with no transport.
//!
//! A proposal is admitted at its *origin* (the organization a client submits through):
//! [`check_proposal`] (client, signature, network, the determinism rules, grants), its
//! (client, nonce) claimed in the [`Admission`]'s nonce window, not already in the ledger, and
//! endorsed: signed early-abort verdicts collected over an [`Endorser`] until the endorsement
//! policy is met. Every endorsing organization runs the same checks on the same proposal
//! ([`Admission::verdict`]), and every ExecutionServer runs [`check_proposal`] again on the
//! ordered block (the orderer is untrusted).
//!
//! The gRPC servers map a [`Refusal`] to a status code in one place (`chainify-net`'s
//! `status` module); the in-process cluster endorses through [`LocalEndorser`]s, so both run
//! this code.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chainify_core::config::{ClientInfo, NetworkConfig};
use chainify_core::crypto::{Signature, SigningKey};
use chainify_core::tx::{
    EarlyAbortBatch, EarlyAbortResponse, MAX_TRANSACTION_BYTES, Proposal, Verdict,
};
use chainify_core::verify::{SignedBytes, Verifier};
use chainify_core::{BlockNumber, ClientId, OrgId, TxId};
use chainify_sql::{AnalysisError, Analyzer, MissingGrant, RejectKind, TxAnalysis};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::fair::{FairLimits, FairShare};
use crate::group::{GroupChecker, GroupSigner};
use crate::offload::Offload;

/// Why a proposal is not ordered. Its text is what the client reads (and, for an endorser's
/// rejection, what the endorser signs), so it names the client, nonce, statement or grant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A field of the request is missing or malformed (the text names the field).
    #[error("{0}")]
    Malformed(String),
    /// The sender is not who it claims to be.
    #[error(transparent)]
    Unauthenticated(#[from] Unauthenticated),
    /// The proposal names another network.
    #[error("the proposal is for network {proposal:?}, this is network {this:?}")]
    WrongNetwork {
        /// The network the proposal names.
        proposal: String,
        /// This network.
        this: String,
    },
    /// The SQL breaks the portable subset or a determinism rule.
    #[error(transparent)]
    Invalid(AnalysisError),
    /// The client lacks a grant a statement needs.
    #[error(transparent)]
    PermissionDenied(#[from] MissingGrant),
    /// The proposal, or its nonce, was seen before.
    #[error(transparent)]
    Replay(#[from] Replay),
    /// The origin has too many submissions under way.
    #[error(
        "overloaded: {in_flight} submissions are in flight at {org} (max_in_flight); retry later"
    )]
    Overloaded {
        /// The organization.
        org: OrgId,
        /// Its limit of submissions under way.
        in_flight: usize,
    },
    /// The origin has too many submissions of this client under way.
    #[error(
        "overloaded: {in_flight} submissions of client {client:?} are being endorsed at {org} \
         (max_in_flight_per_client); retry later"
    )]
    OverloadedClient {
        /// The organization.
        org: OrgId,
        /// The client.
        client: String,
        /// Its limit of submissions under way from one client.
        in_flight: usize,
    },
    /// A queue this submission needs is full; naming which.
    #[error("busy: {0}")]
    Busy(String),
    /// The origin has too many submissions under way from the caller's address.
    #[error(
        "overloaded: {in_flight} submissions from {address} are in flight at {org} \
         (max_in_flight_per_address); retry later"
    )]
    OverloadedFrom {
        /// The organization.
        org: OrgId,
        /// The caller's address, as counted (an IPv6 /64 counts as one).
        address: std::net::IpAddr,
        /// Its limit of submissions under way from one address.
        in_flight: usize,
    },
    /// Organizations the endorsement policy needs rejected the proposal: trying again will
    /// not help.
    #[error("the endorsement policy cannot be met: rejected by {}", Failures(.0))]
    RejectedBy(Vec<EndorseFailure>),
    /// Organizations the endorsement policy needs did not answer: try again later.
    #[error("the endorsement policy cannot be met now: {}", Failures(.0))]
    NotEndorsed(Vec<EndorseFailure>),
    /// Something this organization needs is unavailable (its database, the orderer).
    #[error("{what}: {problem}")]
    Unavailable {
        /// What was being done.
        what: String,
        /// Why it failed.
        problem: String,
    },
}

/// An analysis that could not run here ([`RejectKind::Unavailable`]) is no verdict on the
/// transaction: this organization is unavailable, and the client (or the block) tries again.
impl From<AnalysisError> for Refusal {
    fn from(e: AnalysisError) -> Self {
        if e.kind == RejectKind::Unavailable {
            Refusal::unavailable("analysing the transaction", e)
        } else {
            Refusal::Invalid(e)
        }
    }
}

impl Refusal {
    /// A missing or malformed field, named.
    pub fn malformed(field: &str, problem: impl fmt::Display) -> Refusal {
        Refusal::Malformed(format!("{field}: {problem}"))
    }

    /// Something needed failed while `what`.
    pub fn unavailable(what: impl Into<String>, problem: impl fmt::Display) -> Refusal {
        Refusal::Unavailable {
            what: what.into(),
            problem: problem.to_string(),
        }
    }
}

/// Why the sender of a proposal or an early-abort batch is not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    /// The client is not in the network configuration.
    #[error("unknown client {client:?}: not in network {network}")]
    UnknownClient {
        /// The client the proposal names.
        client: String,
        /// This network.
        network: String,
    },
    /// The client's signature does not verify.
    #[error("the signature of the proposal by client {client:?} (nonce {nonce}) does not verify")]
    BadSignature {
        /// The client.
        client: String,
        /// The proposal's nonce.
        nonce: u64,
    },
    /// An early-abort batch names this organization or one outside the network.
    #[error(
        "an early-abort batch must come from another organization of the network, not org{from}"
    )]
    NotAPeer {
        /// The organization the batch names.
        from: u32,
    },
    /// An early-abort batch's signature does not verify.
    #[error("the early-abort batch is not signed by {from}, which it claims to come from")]
    BadBatchSignature {
        /// The organization the batch names.
        from: OrgId,
    },
}

/// Why a proposal is refused as a possible replay.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Replay {
    /// The nonce is at or below the oldest one still remembered for the client.
    #[error(
        "client {client:?}: nonce {nonce} is not above {floor}, the oldest nonce still remembered \
         for this client, and transaction {tx} is not in the ledger yet; it may be a replay: ask \
         TxStatus for {tx} (it may still be ordered) before signing it again with a fresh nonce"
    )]
    Forgotten {
        /// The client.
        client: String,
        /// The nonce.
        nonce: u64,
        /// The oldest nonce remembered.
        floor: u64,
        /// The proposal's transaction.
        tx: TxId,
    },
    /// Another transaction used the nonce.
    #[error(
        "client {client:?}: nonce {nonce} was already used (by transaction {by}, submitted through \
         {through}): replay refused"
    )]
    NonceUsed {
        /// The client.
        client: String,
        /// The nonce.
        nonce: u64,
        /// The transaction that used it.
        by: TxId,
        /// The organization it was submitted through.
        through: OrgId,
    },
    /// The same proposal was submitted at this origin before.
    #[error(
        "client {client:?}: nonce {nonce} was already used (by transaction {tx}): replay refused"
    )]
    Resubmitted {
        /// The client.
        client: String,
        /// The nonce.
        nonce: u64,
        /// The transaction.
        tx: TxId,
    },
    /// The transaction is in the ledger.
    #[error("transaction {0} is already in the ledger: replay refused")]
    InLedger(TxId),
}

/// One organization's failure to endorse a proposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndorseFailure {
    /// The organization.
    pub org: OrgId,
    /// Its signed rejection, or why no acceptable answer came.
    pub reason: String,
    /// Whether it rejected the proposal (rather than failing to answer).
    pub rejected: bool,
}

struct Failures<'a>(&'a [EndorseFailure]);

impl fmt::Display for Failures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", failure.org, failure.reason)?;
        }
        Ok(())
    }
}

/// Whether [`check_proposal`] verifies the client's signature.
#[derive(Clone, Copy, Debug)]
pub enum ClientSignature<'v> {
    /// Verify it (a proposal as received), with the organization's verifier.
    Verify(&'v Verifier),
    /// Block validation verified it already (`validate_block`): never twice.
    Verified,
}

/// Every check of a proposal that does not depend on history: the client is in the network and
/// signed it, it is for this network, its SQL passes analysis (the portable subset and the
/// determinism rules), and the client holds every grant it needs. Returns the analysis.
pub fn check_proposal(
    network: &NetworkConfig,
    analyzer: &Analyzer,
    proposal: &Proposal,
    signature: ClientSignature<'_>,
) -> Result<TxAnalysis, Refusal> {
    let client = check_envelope(network, proposal, signature)?;
    analyze_granted(analyzer, proposal, client)
}

/// [`check_proposal`] if its analysis takes lookups only ([`Analyzer::analyze_cached`]);
/// `None` where it would parse or type: a caller on an async worker runs that elsewhere.
pub fn check_proposal_cached(
    network: &NetworkConfig,
    analyzer: &Analyzer,
    proposal: &Proposal,
    signature: ClientSignature<'_>,
) -> Option<Result<TxAnalysis, Refusal>> {
    let client = match check_envelope(network, proposal, signature) {
        Ok(client) => client,
        Err(refusal) => return Some(Err(refusal)),
    };
    analyze_granted_cached(analyzer, proposal, client)
}

/// The checks of [`check_proposal`] before its SQL is read: its size, its client and signature,
/// its network. Returns the client.
fn check_envelope<'n>(
    network: &'n NetworkConfig,
    proposal: &Proposal,
    signature: ClientSignature<'_>,
) -> Result<&'n ClientInfo, Refusal> {
    check_encoded_envelope(
        network,
        proposal,
        proposal.body.encode_canonical(),
        signature,
    )
}

fn too_large(reason: String) -> Refusal {
    Refusal::Invalid(AnalysisError {
        statement: 0,
        kind: RejectKind::Limit,
        reason,
    })
}

/// At the origin: the proposal's wire encoding within [`MAX_TRANSACTION_BYTES`] too. The log
/// holds an ordered transaction of at most
/// [`chainify_core::tx::MAX_ORDERED_TRANSACTION_BYTES`], which leaves the endorsements their
/// room only if the proposal's own wire encoding (larger than the one the signature covers for
/// some values: an integer of large magnitude takes ten bytes and three of framing, against
/// nine) stays within the bound.
pub fn check_wire_size(proposal: &Proposal) -> Result<(), Refusal> {
    use prost::Message as _;
    let size = chainify_proto::pb::Proposal::from(proposal).encoded_len();
    if size > MAX_TRANSACTION_BYTES {
        return Err(too_large(format!(
            "the proposal encodes to {size} bytes on the wire; at most {MAX_TRANSACTION_BYTES} are ordered"
        )));
    }
    Ok(())
}

/// [`check_envelope`] of a proposal whose body encodes to `signed` (the encoding the signature
/// covers).
fn check_encoded_envelope<'n>(
    network: &'n NetworkConfig,
    proposal: &Proposal,
    signed: Vec<u8>,
    signature: ClientSignature<'_>,
) -> Result<&'n ClientInfo, Refusal> {
    // First, before any signature or analysis work; the same at every organization, so a
    // block holding such a transaction (a client and an orderer colluding) fails it alike.
    let size = signed.len();
    if size > MAX_TRANSACTION_BYTES {
        return Err(too_large(format!(
            "the transaction encodes to {size} bytes; at most {MAX_TRANSACTION_BYTES} are accepted"
        )));
    }
    let client = authenticate(network, proposal, signed, signature)?;
    if proposal.body.network != network.network_id {
        return Err(Refusal::WrongNetwork {
            proposal: proposal.body.network.as_str().to_owned(),
            this: network.network_id.as_str().to_owned(),
        });
    }
    Ok(client)
}

/// [`analyze_granted`] if the analysis takes lookups only; `None` otherwise.
fn analyze_granted_cached(
    analyzer: &Analyzer,
    proposal: &Proposal,
    client: &ClientInfo,
) -> Option<Result<TxAnalysis, Refusal>> {
    let analysed = analyzer.analyze_cached(&proposal.body.transaction)?;
    Some(analysed.map_err(Refusal::from).and_then(|analysis| {
        analysis.check_grants(client)?;
        Ok(analysis)
    }))
}

/// Proposals of one client with new statement texts waiting for analysis at once; more are
/// refused at once.
pub const ANALYSES_WAITING_PER_CLIENT: usize = 16;

/// Proposals waiting for analysis at once, all clients together; more are refused, or push out
/// one of a client that waits longer.
pub const ANALYSES_WAITING: usize = 4096;

/// Turns at the analysis of new statement texts, in front of an [`Offload::per_core`]: as many
/// as it has permits, one running a client, [`ANALYSES_WAITING_PER_CLIENT`] of a client waiting.
/// One client's stream of new texts then waits behind every other client's next one instead of
/// filling the offload's queue. Queries use it as proposals do.
pub fn analysis_turns() -> FairShare<ClientId> {
    FairShare::new(FairLimits {
        places: crate::offload::cores(),
        per_key: 1,
        waiting_per_key: ANALYSES_WAITING_PER_CLIENT,
        waiting: ANALYSES_WAITING,
    })
}

/// One submission of a client being endorsed ([`Admission::share_of`]).
struct ClientShare<'a> {
    counts: &'a Mutex<HashMap<ClientId, usize>>,
    client: ClientId,
}

impl Drop for ClientShare<'_> {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = counts.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.client);
            }
        }
    }
}

/// Flights a proposal follows before it analyses alone ([`Admission::check_submitted`]).
const MAX_FOLLOWED_FLIGHTS: usize = 3;

/// Analyses under way, by statement texts (parameters bind later): a proposal that misses the
/// cache leads an analysis or follows the one under way for its texts. The key is a hash with
/// the process's own random keys; a collision only makes a follower wait for an unrelated
/// analysis, then analyse its own.
#[derive(Default)]
struct Flights {
    under_way: Mutex<HashMap<u64, tokio::sync::watch::Receiver<()>>>,
    keys: std::collections::hash_map::RandomState,
}

enum Flight<'a> {
    /// Analyse; dropping it (done, failed or cancelled) releases the followers.
    Lead(Lead<'a>),
    /// Wait for the leader: `changed()` ends when it is done.
    Follow(tokio::sync::watch::Receiver<()>),
}

struct Lead<'a> {
    flights: &'a Flights,
    key: u64,
    _done: tokio::sync::watch::Sender<()>,
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.flights.map().remove(&self.key);
    }
}

impl Flights {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, tokio::sync::watch::Receiver<()>>> {
        self.under_way
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The key of `proposal`'s statement texts.
    fn key(&self, proposal: &Proposal) -> u64 {
        use std::hash::BuildHasher;
        let texts: Vec<&str> = proposal
            .body
            .transaction
            .statements
            .iter()
            .map(|s| s.sql.as_str())
            .collect();
        self.keys.hash_one(texts)
    }

    fn join(&self, key: u64) -> Flight<'_> {
        let mut map = self.map();
        if let Some(done) = map.get(&key) {
            return Flight::Follow(done.clone());
        }
        let (tx, rx) = tokio::sync::watch::channel(());
        map.insert(key, rx);
        Flight::Lead(Lead {
            flights: self,
            key,
            _done: tx,
        })
    }
}

/// The checks of [`check_proposal`] that read the SQL: analysis, then `client`'s grants.
fn analyze_granted(
    analyzer: &Analyzer,
    proposal: &Proposal,
    client: &ClientInfo,
) -> Result<TxAnalysis, Refusal> {
    let analysis = analyzer.analyze(&proposal.body.transaction)?;
    analysis.check_grants(client)?;
    Ok(analysis)
}

/// The client of `proposal`, whose body encodes to `signed`, once its signature checks.
fn authenticate<'n>(
    network: &'n NetworkConfig,
    proposal: &Proposal,
    signed: Vec<u8>,
    signature: ClientSignature<'_>,
) -> Result<&'n ClientInfo, Unauthenticated> {
    let body = &proposal.body;
    let client =
        network
            .clients
            .get(&body.client)
            .ok_or_else(|| Unauthenticated::UnknownClient {
                client: body.client.as_str().to_owned(),
                network: network.network_id.to_string(),
            })?;
    if let ClientSignature::Verify(verifier) = signature {
        verifier
            .check(&SignedBytes {
                key: client.public_key,
                message: signed,
                signature: proposal.signature,
            })
            .map_err(|_| Unauthenticated::BadSignature {
                client: body.client.as_str().to_owned(),
                nonce: body.nonce,
            })?;
    }
    Ok(client)
}

/// A boxed future of an [`Endorser`].
pub type EndorseFuture<'a> =
    Pin<Box<dyn Future<Output = Result<EarlyAbortResponse, String>> + Send + 'a>>;

/// How an origin reaches the other organizations' endorsers, as [`crate::Transport`] carries
/// votes: gRPC in a deployment, [`LocalEndorser`] in one process.
pub trait Endorser: Send + Sync {
    /// `org`'s early-abort response to `proposal` (whose id is `id`), or why none came. The
    /// response is checked by the caller: a peer may answer anything.
    fn early_abort<'a>(&'a self, org: OrgId, proposal: &'a Proposal, id: TxId)
    -> EndorseFuture<'a>;
}

/// Whether a proposal's nonce was new to the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// First seen.
    New,
    /// The same transaction again (through this or another origin).
    Same,
}

/// Nonces a client used recently, with the transaction each was used for and the organization
/// that submits it (this one, or the origin that asked for an early-abort response).
#[derive(Debug, Default)]
struct NonceWindow {
    /// Nonces at or below this are forgotten and refused.
    floor: Option<u64>,
    seen: BTreeMap<u64, (TxId, OrgId)>,
}

impl NonceWindow {
    fn claim(
        &mut self,
        client: &ClientId,
        nonce: u64,
        id: TxId,
        origin: OrgId,
        capacity: usize,
    ) -> Result<Claim, Replay> {
        if let Some(floor) = self.floor
            && nonce <= floor
        {
            return Err(Replay::Forgotten {
                client: client.as_str().to_owned(),
                nonce,
                floor,
                tx: id,
            });
        }
        match self.seen.get(&nonce) {
            // The same transaction through another organization is the same claim: the client
            // signed it, and its origin only routes the answers. (Tying the claim to the first
            // origin let a Byzantine organization race a proposal's real origin and burn it.)
            Some((used, _)) if *used == id => return Ok(Claim::Same),
            Some((used, by)) => {
                return Err(Replay::NonceUsed {
                    client: client.as_str().to_owned(),
                    nonce,
                    by: *used,
                    through: *by,
                });
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

/// Nonces remembered per client by default. Replays of a transaction are refused by the ledger's
/// index whatever the window; the window refuses a nonce used for another transaction, and covers
/// the transactions not yet in the ledger many times over (32 768 is seconds of a whole network's
/// load from one identity). Each is ~80 bytes, so a busy identity costs ~2.6 MB.
pub const NONCE_WINDOW: usize = 1 << 15;

/// Sizes and time limits of admission.
#[derive(Clone, Debug)]
pub struct AdmissionSettings {
    /// Nonces remembered per client; an older nonce is refused as a possible replay.
    pub nonce_window: usize,
    /// How long the endorsement of one proposal may wait for one organization.
    pub endorse_timeout: Duration,
    /// Submissions of one client (by its verified signature) being endorsed at once; more are
    /// refused, so that one client cannot take every place from many addresses.
    pub max_in_flight_per_client: usize,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        AdmissionSettings {
            nonce_window: NONCE_WINDOW,
            endorse_timeout: Duration::from_secs(5),
            max_in_flight_per_client: 1024,
        }
    }
}

/// One organization's admission: its checks, its nonce windows and its signed verdicts.
pub struct Admission {
    me: OrgId,
    network: Arc<NetworkConfig>,
    analyzer: Analyzer,
    nonces: Mutex<HashMap<ClientId, NonceWindow>>,
    settings: AdmissionSettings,
    verifier: Arc<Verifier>,
    offload: Offload,
    signer: Arc<GroupSigner>,
    checker: Arc<GroupChecker>,
    analysing: Flights,
    /// Turns at the analysis of new statement texts, one running a client: one client's stream
    /// of new texts waits behind every other client's next one.
    turns: FairShare<ClientId>,
    /// Submissions being endorsed, by client.
    in_flight: Mutex<HashMap<ClientId, usize>>,
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("org", &self.me)
            .finish_non_exhaustive()
    }
}

impl Admission {
    /// Admission at `me`, signing its verdicts with `key`, analysing with `analyzer` (over the
    /// organization's schema).
    pub fn new(
        me: OrgId,
        key: Arc<SigningKey>,
        network: Arc<NetworkConfig>,
        analyzer: Analyzer,
        settings: AdmissionSettings,
        verifier: Arc<Verifier>,
    ) -> Admission {
        // Until told the ledger's height (`set_height`), batches only in a network that counts
        // them from its first block.
        let signer = Arc::new(GroupSigner::new(
            me,
            key,
            verifier.clone(),
            network.batches_at(BlockNumber(1)),
        ));
        let checker = Arc::new(GroupChecker::new(verifier.clone()));
        Admission {
            me,
            network,
            analyzer,
            nonces: Mutex::new(HashMap::new()),
            settings,
            verifier,
            offload: Offload::per_core(),
            signer,
            checker,
            analysing: Flights::default(),
            turns: analysis_turns(),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// A place among the submissions `client` has being endorsed, given back when dropped.
    fn share_of(&self, client: &ClientId) -> Result<ClientShare<'_>, Refusal> {
        let mut counts = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(client.clone()).or_default();
        let limit = self.settings.max_in_flight_per_client.max(1);
        if *count >= limit {
            if *count == 0 {
                counts.remove(client);
            }
            return Err(Refusal::OverloadedClient {
                org: self.me,
                client: client.as_str().to_owned(),
                in_flight: limit,
            });
        }
        *count += 1;
        Ok(ClientShare {
            counts: &self.in_flight,
            client: client.clone(),
        })
    }

    /// Tells admission the next block this organization's ledger expects: responses are
    /// signed as a batch once the network counts batches from that height on (a response
    /// signed now is ordered in that block or a later one).
    pub fn set_height(&self, next_block: u64) {
        self.signer
            .set_batches(self.network.batches_at(BlockNumber(next_block.max(1))));
    }

    /// The organization's verifier (its block validation shares it).
    pub fn verifier(&self) -> &Arc<Verifier> {
        &self.verifier
    }

    /// [`check_proposal`] for a proposal as received.
    pub fn check(&self, proposal: &Proposal) -> Result<TxAnalysis, Refusal> {
        check_proposal(
            &self.network,
            &self.analyzer,
            proposal,
            ClientSignature::Verify(&self.verifier),
        )
    }

    /// Claims the proposal's (client, nonce) for `id`, submitted through `origin`.
    pub fn claim_nonce(
        &self,
        proposal: &Proposal,
        id: TxId,
        origin: OrgId,
    ) -> Result<Claim, Replay> {
        let body = &proposal.body;
        self.nonces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(body.client.clone())
            .or_default()
            .claim(
                &body.client,
                body.nonce,
                id,
                origin,
                self.settings.nonce_window,
            )
    }

    /// Frees the nonce this origin claimed for `id`: the proposal was not ordered, and the
    /// client may submit it again.
    pub fn release_nonce(&self, proposal: &Proposal, id: TxId) {
        let mut nonces = self.nonces.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = nonces.get_mut(&proposal.body.client) {
            w.release(proposal.body.nonce, id, self.me);
        }
    }

    /// [`Admission::check`] for a proposal a client submitted here, with its SQL analysed off
    /// the async workers ([`Offload`]) unless the analysis takes lookups only
    /// ([`Analyzer::analyze_cached`]: every plan and typing cached). The size and
    /// signature come first, on the caller's thread: only the network's clients get to queue
    /// analysis work.
    pub async fn check_submitted(self: &Arc<Self>, proposal: &Proposal) -> Result<(), Refusal> {
        let signed = self.warm_client_signature(proposal).await;
        let client = check_encoded_envelope(
            &self.network,
            proposal,
            signed,
            ClientSignature::Verify(&self.verifier),
        )?;
        if let Some(checked) = analyze_granted_cached(&self.analyzer, proposal, client) {
            return checked.map(drop);
        }
        // Proposals with the same statement texts that miss the cache together (a burst of
        // clients meeting a new shape) wait for one analysis instead of each queuing its own:
        // the queue is bounded, and honest clients must not fill it.
        let shape = self.analysing.key(proposal);
        let mut followed = 0;
        let leading = loop {
            match self.analysing.join(shape) {
                Flight::Lead(lead) => break Some(lead),
                Flight::Follow(mut done) => {
                    // Ends when the leader's analysis does (or the leader goes away).
                    let _ = done.changed().await;
                    if let Some(checked) = analyze_granted_cached(&self.analyzer, proposal, client)
                    {
                        return checked.map(drop);
                    }
                    // Not cached: the leader went away or failed early (a wrong parameter
                    // count), or its parameters had other types. Follow (or lead) the next
                    // flight a few times, then analyse alone.
                    followed += 1;
                    if followed == MAX_FOLLOWED_FLIGHTS {
                        break None;
                    }
                }
            }
        };
        let _turn = self.turns.acquire(proposal.body.client.clone()).await.map_err(|_| {
            Refusal::Busy(format!(
                "client {:?} has {ANALYSES_WAITING_PER_CLIENT} proposals with new statement texts \
                 waiting for analysis at {}, or others' left no room for this one; wait for them",
                proposal.body.client.as_str(),
                self.me
            ))
        })?;
        let checked = self
            .offload
            .run_made(|| {
                let this = self.clone();
                let proposal = proposal.clone();
                let client = client.clone();
                move || analyze_granted(&this.analyzer, &proposal, &client).map(drop)
            })
            .await
            .map_err(|e| Refusal::unavailable("analysing the proposal", e))?;
        drop(leading);
        checked
    }

    /// Checks the client's signature of `proposal` with the others being checked at the time
    /// ([`GroupChecker`]), so that the single check that follows finds it remembered, and
    /// returns the body's encoding for that check. The single check decides; a proposal too
    /// large or from an unknown client is left to it.
    async fn warm_client_signature(&self, proposal: &Proposal) -> Vec<u8> {
        let message = proposal.body.encode_canonical();
        let Some(client) = self.network.clients.get(&proposal.body.client) else {
            return message;
        };
        if message.len() > MAX_TRANSACTION_BYTES {
            return message;
        }
        let warmed = self
            .checker
            .warm(SignedBytes {
                key: client.public_key,
                message,
                signature: proposal.signature,
            })
            .await;
        match warmed {
            Some(item) => item.message,
            // The group's task failed and took the bytes with it.
            None => proposal.body.encode_canonical(),
        }
    }

    /// Checks that an early-abort batch comes from the organization it names: the nonces of
    /// its proposals are claimed for that organization.
    pub fn check_batch_origin(
        &self,
        from: OrgId,
        ids: &[TxId],
        signature: &[u8],
    ) -> Result<(), Refusal> {
        let key = match self.network.orgs.get(&from) {
            Some(org) if from != self.me => &org.public_key,
            _ => return Err(Unauthenticated::NotAPeer { from: from.0 }.into()),
        };
        let signature =
            Signature::try_from(signature).map_err(|e| Refusal::malformed("signature", e))?;
        let batch = SignedBytes {
            key: *key,
            message: EarlyAbortBatch::signing_bytes(&self.network.network_id, from, ids),
            signature,
        };
        self.network
            .signatures
            .verify(&batch)
            .map_err(|_| Unauthenticated::BadBatchSignature { from }.into())
    }

    /// Checks the client signatures of an endorser's batch together ([`Verifier::warm`]): if
    /// they verify they are remembered, so [`Admission::verdict`] does not check them one by
    /// one; with a bad one among them every verdict checks its own, and refuses the bad one
    /// with its reason.
    pub fn preverify(&self, proposals: &[Proposal]) {
        let items: Vec<SignedBytes> = proposals
            .iter()
            .filter_map(|p| {
                let client = self.network.clients.get(&p.body.client)?;
                Some(p.signed_by(client.public_key))
            })
            .collect();
        self.verifier.warm(&items);
    }

    /// This organization's signed early-abort verdict on `proposal`, asked for by `origin`:
    /// the checks of [`check_proposal`], not in the ledger (`in_ledger`), and a nonce claim.
    /// No verdict when this organization could not judge it now ([`Refusal::Unavailable`]):
    /// a signed rejection would tell the client that trying again cannot help.
    pub fn verdict(
        &self,
        proposal: &Proposal,
        id: TxId,
        origin: OrgId,
        in_ledger: bool,
    ) -> Result<EarlyAbortResponse, Refusal> {
        let verdict = self.judge(proposal, id, origin, in_ledger)?;
        Ok(self.signer.sign_alone(id, verdict))
    }

    /// [`Admission::verdict`], signed with the other responses this organization signs at the
    /// time ([`GroupSigner`]).
    pub async fn verdict_grouped(
        &self,
        proposal: &Proposal,
        id: TxId,
        origin: OrgId,
        in_ledger: bool,
    ) -> Result<EarlyAbortResponse, Refusal> {
        // The encoding is made again by the checks (shared with `verdict`); in process only.
        let _ = self.warm_client_signature(proposal).await;
        let verdict = self.judge(proposal, id, origin, in_ledger)?;
        Ok(self.signer.sign(id, verdict).await)
    }

    /// The verdict to sign, or why there is none now.
    fn judge(
        &self,
        proposal: &Proposal,
        id: TxId,
        origin: OrgId,
        in_ledger: bool,
    ) -> Result<Verdict, Refusal> {
        match self.rejection(proposal, id, origin, in_ledger) {
            None => Ok(Verdict::Accept),
            Some(unavailable @ Refusal::Unavailable { .. }) => Err(unavailable),
            Some(refusal) => Ok(Verdict::Reject(refusal.to_string())),
        }
    }

    /// [`Admission::verdict`] on each of a batch of proposals asked for by `origin`, signed
    /// together ([`EarlyAbortResponse::sign_batch`]: one signature for the batch, which every
    /// organization then checks once). `proposals` are `(proposal, id, in_ledger)`. None when
    /// one of them could not be judged now (rare: an analysis that could not start): the origin
    /// counts that as no answer for each proposal of the batch, whose clients may submit again.
    pub fn verdicts(
        &self,
        proposals: &[(&Proposal, TxId, bool)],
        origin: OrgId,
    ) -> Result<Vec<EarlyAbortResponse>, Refusal> {
        let answers = proposals
            .iter()
            .map(|(proposal, id, in_ledger)| {
                Ok((*id, self.judge(proposal, *id, origin, *in_ledger)?))
            })
            .collect::<Result<_, Refusal>>()?;
        Ok(self.signer.sign_batch(answers))
    }

    fn rejection(
        &self,
        proposal: &Proposal,
        id: TxId,
        origin: OrgId,
        in_ledger: bool,
    ) -> Option<Refusal> {
        if let Err(refusal) = self.check(proposal) {
            return Some(refusal);
        }
        if in_ledger {
            return Some(Replay::InLedger(id).into());
        }
        self.claim_nonce(proposal, id, origin)
            .err()
            .map(Refusal::from)
    }

    /// Admits a proposal at this origin: checks it, claims its nonce, looks it up in the ledger
    /// (`in_ledger`, awaited only after the checks) and collects early-abort responses until
    /// the endorsement policy is met. On a refusal other than a replay the nonce is released;
    /// a caller that then fails to order the proposal calls [`Admission::release_nonce`].
    pub async fn admit<L>(
        self: &Arc<Self>,
        proposal: &Proposal,
        in_ledger: L,
        endorser: &dyn Endorser,
    ) -> Result<Vec<EarlyAbortResponse>, Refusal>
    where
        L: Future<Output = Result<bool, Refusal>>,
    {
        self.check_submitted(proposal).await?;
        // Counted once the signature verified: a client's share cannot be taken in its name.
        let _share = self.share_of(&proposal.body.client)?;
        let id = proposal.tx_id();
        // At the origin a nonce serves once; endorsers accept the same proposal again.
        let claimed = match self.claim_nonce(proposal, id, self.me) {
            // A proposal older than the window may be in the ledger: a client told only to use
            // a fresh nonce would run it twice.
            Err(forgotten @ Replay::Forgotten { .. }) => {
                return Err(if in_ledger.await? {
                    Replay::InLedger(id)
                } else {
                    forgotten
                }
                .into());
            }
            claimed => claimed?,
        };
        if claimed == Claim::Same {
            return Err(Replay::Resubmitted {
                client: proposal.body.client.as_str().to_owned(),
                nonce: proposal.body.nonce,
                tx: id,
            }
            .into());
        }
        let result = async {
            if in_ledger.await? {
                return Err(Replay::InLedger(id).into());
            }
            self.endorse(proposal, id, endorser).await
        }
        .await;
        if let Err(refusal) = &result
            && !matches!(refusal, Refusal::Replay(Replay::InLedger(_)))
        {
            self.release_nonce(proposal, id);
        }
        result
    }

    /// Collects accepting early-abort responses until the endorsement policy is met: first
    /// from a smallest combination with this organization, then from the others. This
    /// organization's own acceptance is signed here, not checked again.
    async fn endorse(
        &self,
        proposal: &Proposal,
        id: TxId,
        endorser: &dyn Endorser,
    ) -> Result<Vec<EarlyAbortResponse>, Refusal> {
        let policy = &self.network.endorsement;
        let mut accepted: BTreeMap<OrgId, EarlyAbortResponse> = BTreeMap::new();
        accepted.insert(self.me, self.signer.sign(id, Verdict::Accept).await);
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
        let satisfied = |accepted: &BTreeMap<OrgId, EarlyAbortResponse>| -> bool {
            policy.is_satisfied_by(&accepted.keys().copied().collect())
        };
        let timeout = self.settings.endorse_timeout;
        let mut failures: Vec<EndorseFailure> = Vec::new();
        for round in [first, rest] {
            if satisfied(&accepted) {
                break;
            }
            let mut pending: FuturesUnordered<_> = round
                .into_iter()
                .filter(|o| *o != self.me)
                .map(|org| async move {
                    match tokio::time::timeout(timeout, endorser.early_abort(org, proposal, id))
                        .await
                    {
                        Ok(answer) => (org, answer),
                        Err(_) => (org, Err(format!("no answer within {timeout:?}"))),
                    }
                })
                .collect();
            while let Some((org, answer)) = pending.next().await {
                match self.accept_response(org, id, answer) {
                    Ok(response) => {
                        accepted.insert(org, response);
                        if satisfied(&accepted) {
                            break;
                        }
                    }
                    Err(failure) => failures.push(failure),
                }
            }
        }
        if satisfied(&accepted) {
            Ok(accepted.into_values().collect())
        } else if failures.iter().any(|f| f.rejected) {
            Err(Refusal::RejectedBy(failures))
        } else {
            Err(Refusal::NotEndorsed(failures))
        }
    }

    /// `org`'s answer, if it is its signed acceptance of `id`.
    fn accept_response(
        &self,
        org: OrgId,
        id: TxId,
        answer: Result<EarlyAbortResponse, String>,
    ) -> Result<EarlyAbortResponse, EndorseFailure> {
        let failed = |reason: String, rejected: bool| EndorseFailure {
            org,
            reason,
            rejected,
        };
        let response = answer.map_err(|why| failed(why, false))?;
        let key = self
            .network
            .orgs
            .get(&org)
            .map(|o| o.public_key)
            .ok_or_else(|| failed("not in the network".into(), false))?;
        // A peer signs batches only once its ledger is at the height from which they count, so
        // what it endorses now is ordered where its batch counts: a lagging origin accepts it.
        let signed = self
            .verifier
            .check(&response.signed_by(key, self.network.counts_batches()));
        if response.org != org || response.tx_id != id || signed.is_err() {
            return Err(failed(
                "answered with a response that is not its signed verdict on this proposal".into(),
                false,
            ));
        }
        match &response.verdict {
            Verdict::Accept => Ok(response),
            Verdict::Reject(why) => Err(failed(why.clone(), true)),
        }
    }
}

/// Where a [`LocalEndorser`] finds an organization's admission and ledger.
pub trait LocalEndorsing: Send + Sync {
    /// `org`'s admission, if it is in the process.
    fn admission(&self, org: OrgId) -> Option<Arc<Admission>>;

    /// Whether `id` is in `org`'s ledger.
    fn in_ledger<'a>(
        &'a self,
        org: OrgId,
        id: TxId,
    ) -> Pin<Box<dyn Future<Output = Result<bool, String>> + Send + 'a>>;
}

impl<T: LocalEndorsing + ?Sized> LocalEndorsing for Arc<T> {
    fn admission(&self, org: OrgId) -> Option<Arc<Admission>> {
        (**self).admission(org)
    }

    fn in_ledger<'a>(
        &'a self,
        org: OrgId,
        id: TxId,
    ) -> Pin<Box<dyn Future<Output = Result<bool, String>> + Send + 'a>> {
        (**self).in_ledger(org, id)
    }
}

/// An [`Endorser`] within one process: the other organization's [`Admission::verdict`] is
/// called directly, for the origin `origin`.
pub struct LocalEndorser<L> {
    origin: OrgId,
    orgs: L,
}

impl<L> fmt::Debug for LocalEndorser<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalEndorser")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl<L: LocalEndorsing> LocalEndorser<L> {
    /// Endorsement for proposals submitted through `origin`.
    pub fn new(origin: OrgId, orgs: L) -> LocalEndorser<L> {
        LocalEndorser { origin, orgs }
    }
}

impl<L: LocalEndorsing> Endorser for LocalEndorser<L> {
    fn early_abort<'a>(
        &'a self,
        org: OrgId,
        proposal: &'a Proposal,
        id: TxId,
    ) -> EndorseFuture<'a> {
        Box::pin(async move {
            let admission = self
                .orgs
                .admission(org)
                .ok_or_else(|| format!("{org} is not in this process"))?;
            let in_ledger = self.orgs.in_ledger(org, id).await?;
            admission
                .verdict_grouped(proposal, id, self.origin, in_ledger)
                .await
                .map_err(|refusal| format!("{org}: Unavailable: {refusal}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::Digest;

    fn id(n: u8) -> TxId {
        TxId(Digest::of(&[n]))
    }

    fn claim(
        w: &mut NonceWindow,
        nonce: u64,
        n: u8,
        origin: u32,
        cap: usize,
    ) -> Result<Claim, String> {
        let client = ClientId::new("c").expect("client id");
        w.claim(&client, nonce, id(n), OrgId(origin), cap)
            .map_err(|e| e.to_string())
    }

    use chainify_core::NetworkId;
    use chainify_core::config::{GrantEntry, NetworkBuilder, PortPlan, StatementKind};
    use chainify_core::tx::{ProposalBody, Statement, Transaction};
    use chainify_sql::Schema;

    fn org_key(i: u32) -> Arc<SigningKey> {
        Arc::new(SigningKey::from_seed(&[i as u8; 32]))
    }

    fn client_key() -> SigningKey {
        SigningKey::from_seed(&[42; 32])
    }

    /// Three organizations, endorsement `policy`; client alice may update `kv` only.
    fn network(policy: &str) -> Arc<NetworkConfig> {
        let mut b =
            NetworkBuilder::new("net", "any-2", PortPlan { base: 7010 }).endorsement_policy(policy);
        for i in 1..=3u32 {
            b.org(&org_key(i).public_key(), "127.0.0.1");
        }
        let update_kv = GrantEntry {
            table: "kv".into(),
            kinds: vec![StatementKind::Update],
        };
        b.client("alice", &client_key().public_key(), vec![update_kv]);
        Arc::new(b.config("network.toml").expect("network"))
    }

    fn admission(org: u32, network: &Arc<NetworkConfig>) -> Arc<Admission> {
        admission_with(org, network, |a| a)
    }

    /// An organization's admission whose analyser `tune` sets up.
    fn admission_with(
        org: u32,
        network: &Arc<NetworkConfig>,
        tune: impl FnOnce(Analyzer) -> Analyzer,
    ) -> Arc<Admission> {
        let schema =
            Schema::from_sql("CREATE TABLE kv (k INT PRIMARY KEY, v INT)").expect("schema");
        Arc::new(Admission::new(
            OrgId(org),
            org_key(org),
            network.clone(),
            tune(Analyzer::new(schema)),
            AdmissionSettings {
                nonce_window: 100,
                endorse_timeout: Duration::from_millis(200),
                ..AdmissionSettings::default()
            },
            Arc::new(Verifier::new(network.signatures)),
        ))
    }

    /// Organization 1's admission with a share of two submissions under way a client.
    fn sharing_two(network: &Arc<NetworkConfig>) -> Arc<Admission> {
        let schema =
            Schema::from_sql("CREATE TABLE kv (k INT PRIMARY KEY, v INT)").expect("schema");
        Arc::new(Admission::new(
            OrgId(1),
            org_key(1),
            network.clone(),
            Analyzer::new(schema),
            AdmissionSettings {
                max_in_flight_per_client: 2,
                ..AdmissionSettings::default()
            },
            Arc::new(Verifier::new(network.signatures)),
        ))
    }

    /// A client's submissions being endorsed are counted by the verified client: past its share
    /// the next is refused by name, another client is not, and a finished one frees its place.
    #[test]
    fn a_client_s_submissions_in_flight_are_bounded_by_its_share() {
        let origin = sharing_two(&network("any-2"));
        let alice = ClientId::new("alice").expect("client");
        let bob = ClientId::new("bob").expect("client");
        let one = origin.share_of(&alice).expect("first");
        let _two = origin.share_of(&alice).expect("second");
        let Err(refusal) = origin.share_of(&alice) else {
            panic!("a third submission of alice was let through with a share of 2");
        };
        assert!(
            matches!(&refusal, Refusal::OverloadedClient { client, in_flight: 2, .. } if client == "alice"),
            "{refusal}"
        );
        assert!(
            refusal.to_string().contains("max_in_flight_per_client"),
            "{refusal}"
        );
        let _other = origin
            .share_of(&bob)
            .expect("another client has its own share");
        drop(one);
        let _again = origin
            .share_of(&alice)
            .expect("a finished submission frees its place");
    }

    fn proposal(nonce: u64, sql: &str) -> Proposal {
        let body = ProposalBody {
            client: ClientId::new("alice").expect("client"),
            nonce,
            network: NetworkId::new("net").expect("network"),
            transaction: Transaction {
                statements: vec![Statement::new(sql, vec![])],
            },
        };
        let signature = client_key().sign(&body.encode_canonical());
        Proposal { body, signature }
    }

    const UPDATE: &str = "UPDATE kv SET v = 1 WHERE k = 1";

    /// How each scripted organization answers.
    #[derive(Clone, Copy)]
    enum Answer {
        /// Its real admission's verdict.
        Honest,
        /// Nothing (the call hangs past the timeout).
        Silent,
        /// A transport error.
        Down,
        /// An acceptance signed by another organization's key.
        Forged,
    }

    struct Scripted {
        orgs: BTreeMap<OrgId, (Arc<Admission>, Answer)>,
        origin: OrgId,
        asked: Mutex<Vec<OrgId>>,
    }

    impl Scripted {
        fn new(network: &Arc<NetworkConfig>, answers: &[(u32, Answer)]) -> Scripted {
            Scripted {
                orgs: answers
                    .iter()
                    .map(|(o, a)| (OrgId(*o), (admission(*o, network), *a)))
                    .collect(),
                origin: OrgId(1),
                asked: Mutex::default(),
            }
        }
    }

    impl Endorser for Scripted {
        fn early_abort<'a>(
            &'a self,
            org: OrgId,
            proposal: &'a Proposal,
            id: TxId,
        ) -> EndorseFuture<'a> {
            self.asked.lock().expect("asked").push(org);
            Box::pin(async move {
                let (admission, answer) = self.orgs.get(&org).ok_or("unknown")?;
                match answer {
                    Answer::Honest => admission
                        .verdict(proposal, id, self.origin, false)
                        .map_err(|r| r.to_string()),
                    Answer::Silent => std::future::pending().await,
                    Answer::Down => Err(format!("{org}: Unavailable: connection refused")),
                    Answer::Forged => Ok(EarlyAbortResponse::new_signed(
                        id,
                        org,
                        Verdict::Accept,
                        &org_key(org.0 % 3 + 1),
                    )),
                }
            })
        }
    }

    async fn admit(
        origin: &Arc<Admission>,
        endorser: &Scripted,
        p: &Proposal,
    ) -> Result<Vec<EarlyAbortResponse>, Refusal> {
        origin.admit(p, async { Ok(false) }, endorser).await
    }

    /// Submissions being endorsed count against their client's share once the signature
    /// verified: a third of alice's, while two wait for silent peers, is refused by name.
    #[tokio::test]
    async fn a_client_past_its_share_of_submissions_under_way_is_refused() {
        let net = network("any-2");
        let origin = sharing_two(&net);
        let silent = Arc::new(Scripted::new(
            &net,
            &[(2, Answer::Silent), (3, Answer::Silent)],
        ));
        let alice = ClientId::new("alice").expect("client");
        let hanging: Vec<_> = (0..2)
            .map(|n| {
                let (origin, silent) = (origin.clone(), silent.clone());
                tokio::spawn(async move {
                    let p = proposal(n, "UPDATE kv SET v = 1 WHERE k = 1");
                    origin.admit(&p, async { Ok(false) }, &*silent).await
                })
            })
            .collect();
        for _ in 0..500 {
            if origin.in_flight.lock().expect("counts").get(&alice) == Some(&2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let third = proposal(9, "UPDATE kv SET v = 1 WHERE k = 1");
        let refusal = origin
            .admit(&third, async { Ok(false) }, &*silent)
            .await
            .expect_err("past alice's share");
        assert!(
            matches!(&refusal, Refusal::OverloadedClient { client, .. } if client == "alice"),
            "{refusal}"
        );
        for h in hanging {
            h.abort();
            let _ = h.await;
        }
        assert!(origin.in_flight.lock().expect("counts").is_empty());
    }

    #[tokio::test]
    async fn the_smallest_combination_is_asked_first_and_the_rest_only_when_it_fails() {
        let net = network("any-2");
        let origin = admission(1, &net);
        let all_honest = Scripted::new(&net, &[(2, Answer::Honest), (3, Answer::Honest)]);
        let p = proposal(1, UPDATE);
        let responses = admit(&origin, &all_honest, &p).await.expect("endorsed");
        let by: Vec<OrgId> = responses.iter().map(|r| r.org).collect();
        assert_eq!(by, [OrgId(1), OrgId(2)]);
        assert_eq!(*all_honest.asked.lock().expect("asked"), [OrgId(2)]);
        // Org 2 down: org 3 is asked in the second round and completes the policy.
        let org2_down = Scripted::new(&net, &[(2, Answer::Down), (3, Answer::Honest)]);
        let responses = admit(&origin, &org2_down, &proposal(2, UPDATE))
            .await
            .expect("endorsed by 1 and 3");
        let by: Vec<OrgId> = responses.iter().map(|r| r.org).collect();
        assert_eq!(by, [OrgId(1), OrgId(3)]);
        for r in &responses {
            r.verify(&net.orgs[&r.org].public_key)
                .expect("signed by its org");
        }
    }

    /// An endorser whose analysis cannot run now (no thread for it) signs no verdict: the
    /// client hears that the policy cannot be met now, not that it was rejected, and the same
    /// proposal is admitted once the endorser can analyse it.
    #[tokio::test]
    async fn an_endorser_that_cannot_analyse_now_signs_no_rejection() {
        let net = network("all");
        let origin = admission(1, &net);
        let starved = admission_with(2, &net, |a| a.with_analysis_stack(1 << 60));
        let p = proposal(1, UPDATE);
        let refusal = starved
            .verdict(&p, p.tx_id(), OrgId(1), false)
            .expect_err("no verdict");
        assert!(
            matches!(refusal, Refusal::Unavailable { .. }),
            "{refusal:?}"
        );
        let asked = [(&p, p.tx_id(), false)];
        assert!(matches!(
            starved.verdicts(&asked, OrgId(1)),
            Err(Refusal::Unavailable { .. })
        ));
        let mut endorsers = Scripted::new(&net, &[(2, Answer::Honest), (3, Answer::Honest)]);
        endorsers.orgs.insert(OrgId(2), (starved, Answer::Honest));
        let refusal = admit(&origin, &endorsers, &p).await.unwrap_err();
        let Refusal::NotEndorsed(failures) = &refusal else {
            panic!("{refusal:?}");
        };
        assert!(failures.iter().all(|f| !f.rejected), "{refusal}");
        assert!(
            refusal
                .to_string()
                .contains("no thread for the analysis at this organization"),
            "{refusal}"
        );
        let able = Scripted::new(&net, &[(2, Answer::Honest), (3, Answer::Honest)]);
        admit(&origin, &able, &p)
            .await
            .expect("admitted once org 2 can analyse");
    }

    #[tokio::test]
    async fn rejections_silence_and_forged_answers_are_refused_with_who_failed_and_why() {
        let net = network("all");
        let origin = admission(1, &net);
        // Org 3 never answers, org 2 forges: nobody rejected, so the client may retry.
        let unanswered = Scripted::new(&net, &[(2, Answer::Forged), (3, Answer::Silent)]);
        let p = proposal(1, UPDATE);
        let refusal = admit(&origin, &unanswered, &p).await.unwrap_err();
        let Refusal::NotEndorsed(failures) = &refusal else {
            panic!("{refusal:?}");
        };
        let text = refusal.to_string();
        assert!(text.contains("cannot be met now"), "{text}");
        assert!(text.contains("org3: no answer within"), "{text}");
        assert!(
            text.contains("org2: answered with a response that is not its signed verdict"),
            "{text}"
        );
        assert!(failures.iter().all(|f| !f.rejected));
        // Not ordered: the nonce was released and the same proposal may be submitted again.
        let honest = Scripted::new(&net, &[(2, Answer::Honest), (3, Answer::Honest)]);
        admit(&origin, &honest, &p)
            .await
            .expect("the retry is admitted");
        // An endorser that saw the nonce used by another transaction rejects, signed.
        let other = proposal(1, "UPDATE kv SET v = 2 WHERE k = 1");
        let origin2 = admission(1, &net);
        let refusal = admit(&origin2, &honest, &other).await.unwrap_err();
        assert!(matches!(refusal, Refusal::RejectedBy(_)), "{refusal:?}");
        let text = refusal.to_string();
        assert!(
            text.contains("rejected by org2: client \"alice\": nonce 1 was already used"),
            "{text}"
        );
    }

    /// A proposal, the refusal it must get, and a text the refusal must contain.
    type Case = (Proposal, fn(&Refusal) -> bool, &'static str);

    #[tokio::test]
    async fn every_check_refuses_before_anyone_is_asked() {
        let net = network("any-2");
        let origin = admission(1, &net);
        let endorser = Scripted::new(&net, &[(2, Answer::Honest), (3, Answer::Honest)]);
        let mut forged = proposal(1, UPDATE);
        forged.body.nonce = 2;
        let mut foreign = proposal(3, UPDATE);
        foreign.body.network = NetworkId::new("other").expect("network");
        foreign.signature = client_key().sign(&foreign.body.encode_canonical());
        let mut stranger = proposal(4, UPDATE);
        stranger.body.client = ClientId::new("mallory").expect("client");
        let cases: Vec<Case> = vec![
            (
                forged,
                |r| {
                    matches!(
                        r,
                        Refusal::Unauthenticated(Unauthenticated::BadSignature { .. })
                    )
                },
                "(nonce 2) does not verify",
            ),
            (
                foreign,
                |r| matches!(r, Refusal::WrongNetwork { .. }),
                "for network \"other\"",
            ),
            (
                stranger,
                |r| {
                    matches!(
                        r,
                        Refusal::Unauthenticated(Unauthenticated::UnknownClient { .. })
                    )
                },
                "unknown client \"mallory\"",
            ),
            (
                proposal(5, "UPDATE kv SET v = random() WHERE k = 1"),
                |r| matches!(r, Refusal::Invalid(_)),
                "statement 1",
            ),
            (
                proposal(6, "DELETE FROM kv WHERE k = 1"),
                |r| matches!(r, Refusal::PermissionDenied(_)),
                "may not delete table kv",
            ),
        ];
        for (p, kind, text) in cases {
            let refusal = admit(&origin, &endorser, &p).await.unwrap_err();
            assert!(kind(&refusal), "{refusal:?}");
            assert!(
                refusal.to_string().contains(text),
                "{refusal} lacks {text:?}"
            );
        }
        assert!(endorser.asked.lock().expect("asked").is_empty());
        // A transaction in the ledger keeps its nonce claimed: it was ordered once.
        let p = proposal(7, UPDATE);
        let refusal = origin
            .admit(&p, async { Ok(true) }, &endorser)
            .await
            .unwrap_err();
        assert_eq!(refusal, Refusal::Replay(Replay::InLedger(p.tx_id())));
        let again = admit(&origin, &endorser, &p).await.unwrap_err();
        assert!(
            matches!(again, Refusal::Replay(Replay::Resubmitted { .. })),
            "{again:?}"
        );
    }

    /// A proposal whose nonce has left the window is refused; if it is in the ledger, it says
    /// so (a client told only to use a fresh nonce would run the transaction twice), and
    /// otherwise it names the transaction to ask TxStatus about first.
    #[tokio::test]
    async fn a_forgotten_nonce_in_the_ledger_is_reported_as_in_the_ledger() {
        let net = network("any-2");
        let origin = admission(1, &net);
        let endorser = Scripted::new(&net, &[(2, Answer::Honest), (3, Answer::Honest)]);
        let old = proposal(1, UPDATE);
        admit(&origin, &endorser, &old).await.unwrap();
        // 100 newer nonces push nonce 1 out of the window of 100.
        for n in 2..=101 {
            admit(&origin, &endorser, &proposal(n, UPDATE))
                .await
                .unwrap();
        }
        let refusal = origin
            .admit(&old, async { Ok(true) }, &endorser)
            .await
            .unwrap_err();
        assert_eq!(refusal, Refusal::Replay(Replay::InLedger(old.tx_id())));
        let refusal = admit(&origin, &endorser, &old).await.unwrap_err();
        assert!(
            matches!(refusal, Refusal::Replay(Replay::Forgotten { tx, .. }) if tx == old.tx_id()),
            "{refusal:?}"
        );
        assert!(refusal.to_string().contains("ask TxStatus"), "{refusal}");
    }

    /// An endorser checks a batch's client signatures together first: a clean batch is
    /// remembered (not checked again one by one), a batch with a forged one is not, and every
    /// verdict is the one it would be without the batch check.
    #[test]
    fn a_batch_checked_ahead_keeps_every_verdict() {
        let net = network("any-2");
        let endorser = admission(2, &net);
        let clean: Vec<Proposal> = (11..=18).map(|n| proposal(n, UPDATE)).collect();
        let mut twice = clean.clone();
        twice.extend(clean.iter().cloned());
        endorser.preverify(&twice);
        assert_eq!(
            endorser.verifier().remembered_len(),
            8,
            "each client signature once"
        );
        for p in &clean {
            let response = endorser
                .verdict(p, p.tx_id(), OrgId(1), false)
                .expect("a verdict");
            assert_eq!(response.verdict, Verdict::Accept);
        }

        let net = network("any-2");
        let endorser = admission(2, &net);
        let mut proposals: Vec<Proposal> = (1..=8).map(|n| proposal(n, UPDATE)).collect();
        // Its signature covers nonce 6.
        proposals[5].body.nonce = 60;
        let mut stranger = proposal(9, UPDATE);
        stranger.body.client = ClientId::new("mallory").expect("client");
        proposals.push(stranger);
        endorser.preverify(&proposals);
        assert_eq!(
            endorser.verifier().remembered_len(),
            0,
            "a batch with a forged signature remembers nothing"
        );
        for (i, p) in proposals.iter().enumerate() {
            let response = endorser
                .verdict(p, p.tx_id(), OrgId(1), false)
                .expect("a verdict");
            match (i, &response.verdict) {
                (5, Verdict::Reject(why)) => assert!(why.contains("does not verify"), "{why}"),
                (8, Verdict::Reject(why)) => assert!(why.contains("unknown client"), "{why}"),
                (5 | 8, v) => panic!("proposal {i}: {v:?}"),
                (_, v) => assert_eq!(v, &Verdict::Accept, "proposal {i}"),
            }
        }
    }

    #[test]
    fn a_batch_must_be_signed_by_the_peer_it_names() {
        let net = network("any-2");
        let me = admission(2, &net);
        let ids = [id(1), id(2)];
        let bytes = EarlyAbortBatch::signing_bytes(&net.network_id, OrgId(1), &ids);
        let good = org_key(1).sign(&bytes);
        me.check_batch_origin(OrgId(1), &ids, &good.0)
            .expect("org 1's batch");
        let by_three = org_key(3).sign(&bytes);
        assert_eq!(
            me.check_batch_origin(OrgId(1), &ids, &by_three.0),
            Err(Unauthenticated::BadBatchSignature { from: OrgId(1) }.into())
        );
        for from in [2, 9] {
            assert_eq!(
                me.check_batch_origin(OrgId(from), &ids, &good.0),
                Err(Unauthenticated::NotAPeer { from }.into())
            );
        }
        assert!(matches!(
            me.check_batch_origin(OrgId(1), &ids, &[1, 2, 3]),
            Err(Refusal::Malformed(m)) if m.starts_with("signature: ")
        ));
    }

    #[test]
    fn a_nonce_is_claimed_once_and_retrying_the_same_transaction_is_not_a_replay() {
        let mut w = NonceWindow::default();
        assert_eq!(claim(&mut w, 5, 1, 1, 10), Ok(Claim::New));
        assert_eq!(claim(&mut w, 5, 1, 1, 10), Ok(Claim::Same));
        let other_tx = claim(&mut w, 5, 2, 1, 10).unwrap_err();
        assert!(other_tx.contains("nonce 5 was already used"), "{other_tx}");
        // The same transaction forwarded by another organization (first, even) burns nothing.
        assert_eq!(claim(&mut w, 5, 1, 2, 10), Ok(Claim::Same));
        // Lower nonces are fine while they are remembered: clients may submit concurrently.
        assert_eq!(claim(&mut w, 3, 3, 1, 10), Ok(Claim::New));
    }

    #[test]
    fn forgotten_nonces_are_refused_below_the_floor() {
        let mut w = NonceWindow::default();
        for n in 1..=4 {
            assert_eq!(claim(&mut w, n * 10, n as u8, 1, 3), Ok(Claim::New));
        }
        // 10 was forgotten to keep 3: it and everything below it are refused.
        for n in [10, 7] {
            let e = claim(&mut w, n, 9, 1, 3).unwrap_err();
            assert!(e.contains("not above 10"), "{e}");
        }
        assert_eq!(claim(&mut w, 11, 9, 1, 3), Ok(Claim::New));
    }

    #[test]
    fn a_released_nonce_can_be_used_again_but_only_by_its_claimant() {
        let mut w = NonceWindow::default();
        claim(&mut w, 8, 1, 1, 10).unwrap();
        w.release(8, id(2), OrgId(1));
        assert!(
            claim(&mut w, 8, 2, 1, 10).is_err(),
            "someone else's release"
        );
        w.release(8, id(1), OrgId(1));
        assert_eq!(claim(&mut w, 8, 2, 1, 10), Ok(Claim::New));
    }

    /// A client's new statement shape is analysed off the caller's thread (on one async
    /// worker it would stall every other task for milliseconds), a known one in place, and a
    /// proposal whose signature fails is refused before its SQL is read.
    #[tokio::test]
    async fn new_statement_shapes_are_analysed_off_the_caller_s_thread_and_only_when_signed() {
        let net = network("any-2");
        let origin = admission(1, &net);
        let values: Vec<String> = (0..3000).map(|i| i.to_string()).collect();
        let sql = format!("{UPDATE} AND v IN ({})", values.join(", "));
        let mut forged = proposal(1, &sql);
        forged.signature = client_key().sign(b"something else");
        let refused = origin.check_submitted(&forged).await;
        assert!(
            matches!(refused, Err(Refusal::Unauthenticated(_))),
            "{refused:?}"
        );
        assert_eq!(
            origin.analyzer.cached().0,
            0,
            "a forged proposal's SQL was analysed"
        );
        // Whether the check finished before a task beside it on the same thread first ran.
        let finished_first = |p: Proposal| {
            let origin = origin.clone();
            async move {
                let done = std::sync::atomic::AtomicBool::new(false);
                let (checked, seen) = tokio::join!(
                    async {
                        let checked = origin.check_submitted(&p).await;
                        done.store(true, std::sync::atomic::Ordering::SeqCst);
                        checked
                    },
                    async { done.load(std::sync::atomic::Ordering::SeqCst) }
                );
                checked.expect("admitted");
                seen
            }
        };
        assert!(
            !finished_first(proposal(1, &sql)).await,
            "a new shape was analysed on the caller's thread"
        );
        assert_eq!(origin.analyzer.cached().0, 1);
        assert!(
            finished_first(proposal(2, &sql)).await,
            "a known shape left the caller's thread"
        );
    }

    /// An endorser signs a batch under one signature only once its ledger has reached the
    /// height from which the network counts batches: before, each response alone (what it signs
    /// is ordered in a block at least that high).
    #[test]
    fn responses_are_signed_as_a_batch_only_from_the_networks_height_on() {
        let net = Arc::new(NetworkConfig {
            response_batches_from: Some(5),
            ..(*network("any-2")).clone()
        });
        let endorser = admission(2, &net);
        let proposals = [proposal(1, UPDATE), proposal(2, UPDATE)];
        let asked: Vec<(&Proposal, TxId, bool)> =
            proposals.iter().map(|p| (p, p.tx_id(), false)).collect();
        let proofs = |responses: Vec<EarlyAbortResponse>| -> Vec<bool> {
            responses.iter().map(|r| r.batch.is_some()).collect()
        };
        assert_eq!(
            proofs(endorser.verdicts(&asked, OrgId(1)).expect("verdicts")),
            [false, false]
        );
        endorser.set_height(4);
        assert_eq!(
            proofs(endorser.verdicts(&asked, OrgId(1)).expect("verdicts")),
            [false, false]
        );
        endorser.set_height(5);
        let batch = endorser.verdicts(&asked, OrgId(1)).expect("verdicts");
        assert_eq!(proofs(batch.clone()), [true, true]);
        assert_eq!(batch[0].signature, batch[1].signature);
        assert!(batch.iter().all(|r| r.verdict == Verdict::Accept));
    }

    /// A burst of clients meeting one new statement shape at once, more of them than the
    /// analysis queue takes, is admitted whole: the proposals wait for one analysis instead of
    /// each queuing its own (the queue's refusal is for floods of distinct shapes).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_one_new_shape_waits_for_one_analysis_instead_of_filling_the_queue() {
        let (refused, _) = burst_of_one_new_shape(false).await;
        assert_eq!(refused, Vec::<String>::new());
    }

    /// A client whose proposal with the burst's texts leads the analysis and fails it (a
    /// parameter too many in the first statement) does not send the burst to the queue: what
    /// the failed analysis left uncached, the followers analyse in the next flight, once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_that_fails_early_does_not_send_its_followers_to_the_queue() {
        let (refused, spoiler) = burst_of_one_new_shape(true).await;
        assert_eq!(refused, Vec::<String>::new());
        let spoiler = spoiler
            .expect("the spoiler ran")
            .expect_err("a parameter too many");
        assert!(spoiler.to_string().contains("parameter"), "{spoiler}");
    }

    /// Every analysis permit of an admission, held until released.
    struct AnalysisHeld {
        release: Vec<std::sync::mpsc::Sender<()>>,
        blockers: Vec<tokio::task::JoinHandle<Result<(), crate::offload::OffloadError>>>,
    }

    impl AnalysisHeld {
        fn all_of(origin: &Arc<Admission>) -> AnalysisHeld {
            let cores = std::thread::available_parallelism().map_or(2, usize::from);
            let (release, blockers) = (0..cores)
                .map(|_| {
                    let (release, wait) = std::sync::mpsc::channel::<()>();
                    let origin = origin.clone();
                    let blocker = tokio::spawn(async move {
                        origin.offload.run(move || wait.recv().unwrap_or(())).await
                    });
                    (release, blocker)
                })
                .unzip();
            AnalysisHeld { release, blockers }
        }

        async fn release(self) {
            drop(self.release);
            for blocker in self.blockers {
                blocker.await.expect("blocker").expect("blocker ran");
            }
        }
    }

    /// Submits more proposals with one new statement text than the analysis queue takes, while
    /// every analysis permit is busy, first `spoiler` (the same text with a parameter too many)
    /// when asked; returns the burst's refusals and the spoiler's outcome.
    async fn burst_of_one_new_shape(spoiler: bool) -> (Vec<String>, Option<Result<(), Refusal>>) {
        let net = network("any-2");
        let origin = admission(1, &net);
        let values: Vec<String> = (0..2000).map(|i| i.to_string()).collect();
        let sql = format!("{UPDATE} AND v IN ({})", values.join(", "));
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let burst = cores * crate::offload::WAITING_PER_PERMIT + 200;
        // Every analysis permit busy until the whole burst has arrived.
        let held = AnalysisHeld::all_of(&origin);
        // Two statements, the second slow to analyse; the spoiler's first has a parameter too
        // many, so its analysis fails before the second is parsed (nothing is cached).
        let shaped = |nonce: u64, spoiled: bool| {
            let mut p = proposal(nonce, UPDATE);
            let first = &mut p.body.transaction.statements[0];
            if spoiled {
                first.params.push(chainify_core::Value::Int(1));
            }
            p.body
                .transaction
                .statements
                .push(Statement::new(sql.clone(), vec![]));
            p.signature = client_key().sign(&p.body.encode_canonical());
            p
        };
        let spoiled = spoiler.then(|| {
            let p = shaped(1_000_000, true);
            let origin = origin.clone();
            tokio::spawn(async move { origin.check_submitted(&p).await })
        });
        if spoiler {
            // It leads: its flight is under way before the burst arrives.
            while origin.analysing.map().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let proposals: Vec<Proposal> = (0..burst as u64).map(|n| shaped(n, false)).collect();
        let checks: Vec<_> = proposals
            .into_iter()
            .map(|p| {
                let origin = origin.clone();
                tokio::spawn(async move { origin.check_submitted(&p).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(2)).await;
        held.release().await;
        let mut refused = Vec::new();
        for check in checks {
            if let Err(e) = check.await.expect("check") {
                refused.push(e.to_string());
            }
        }
        let spoiled = match spoiled {
            Some(task) => Some(task.await.expect("spoiler")),
            None => None,
        };
        assert!(
            origin.analysing.map().is_empty(),
            "an analysis stayed under way"
        );
        refused.truncate(3);
        (refused, spoiled)
    }

    /// One client's proposals with new statement texts are analysed one at a time, at most
    /// `ANALYSES_WAITING_PER_CLIENT` of them waiting: the rest are refused at once by name
    /// instead of filling the analysis queue that every client's new texts need.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_client_s_new_texts_wait_their_turn_and_do_not_fill_the_analysis_queue() {
        let net = network("any-2");
        let origin = admission(1, &net);
        // Every analysis permit busy until the whole burst has arrived.
        let held = AnalysisHeld::all_of(&origin);
        let burst = 60u64;
        let checks: Vec<_> = (0..burst)
            .map(|n| {
                let origin = origin.clone();
                let p = proposal(n, &format!("{UPDATE} AND v = {n}"));
                tokio::spawn(async move { origin.check_submitted(&p).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(1)).await;
        held.release().await;
        let mut refused = 0;
        for check in checks {
            if let Err(e) = check.await.expect("check") {
                assert!(matches!(e, Refusal::Busy(_)), "{e}");
                assert!(e.to_string().contains("client \"alice\""), "{e}");
                refused += 1;
            }
        }
        // One analysing, sixteen waiting their turn.
        assert_eq!(refused, burst as usize - 1 - ANALYSES_WAITING_PER_CLIENT);
    }

    /// A transaction whose encoding passes `MAX_TRANSACTION_BYTES` is refused by name and size,
    /// before its signature or SQL is looked at (a wrong signature does not change the
    /// answer); one just under it is admitted. The same check runs on a block's transactions.
    #[test]
    fn a_transaction_too_large_is_refused_with_its_size() {
        let network = network("any-2");
        let analyzer = Analyzer::new(
            Schema::from_sql("CREATE TABLE kv (k INT PRIMARY KEY, v INT)").expect("schema"),
        );
        let verifier = Verifier::new(network.signatures);
        let sized = |statements: usize, pad: usize| {
            let sql = format!("{UPDATE}{}", " ".repeat(pad));
            let body = ProposalBody {
                client: ClientId::new("alice").expect("client"),
                nonce: 1,
                network: NetworkId::new("net").expect("network"),
                transaction: Transaction {
                    statements: vec![Statement::new(&sql, vec![]); statements],
                },
            };
            let signature = client_key().sign(&body.encode_canonical());
            Proposal { body, signature }
        };
        let check = |p: &Proposal| {
            check_proposal(&network, &analyzer, p, ClientSignature::Verify(&verifier))
        };
        let big = sized(9, 60 * 1024);
        let size = big.body.encode_canonical().len();
        assert!(size > MAX_TRANSACTION_BYTES);
        let Err(Refusal::Invalid(e)) = check(&big) else {
            panic!("a transaction of {size} bytes was not refused by its size");
        };
        assert_eq!((e.statement, e.kind), (0, RejectKind::Limit), "{e}");
        assert!(e.reason.contains(&format!("{size} bytes")), "{e}");
        let mut forged = big.clone();
        forged.signature = client_key().sign(b"something else");
        assert!(matches!(check(&forged), Err(Refusal::Invalid(_))));
        let under = sized(7, 60 * 1024);
        assert!(under.body.encode_canonical().len() <= MAX_TRANSACTION_BYTES);
        check(&under).expect("a transaction under the limit is admitted");
    }

    /// An analysis that could not run here answers the client as unavailable (try again), and
    /// only that kind: every verdict on the SQL stays a refusal of the transaction.
    #[test]
    fn an_analysis_that_cannot_run_here_is_unavailable_not_invalid() {
        for kind in RejectKind::ALL {
            let refusal = Refusal::from(AnalysisError {
                statement: 1,
                kind,
                reason: "why".into(),
            });
            if kind == RejectKind::Unavailable {
                assert_eq!(
                    refusal.to_string(),
                    "analysing the transaction: statement 1: why"
                );
                assert!(matches!(refusal, Refusal::Unavailable { .. }));
            } else {
                assert!(matches!(refusal, Refusal::Invalid(_)), "{kind:?}");
            }
        }
    }
}
