//! The Rust client SDK of chainify.
//!
//! A [`Client`] talks to one organization's ChainifyService over gRPC (TLS when the network
//! uses it). It signs every proposal and query with the client's Ed25519 key; transactions are
//! lists of parameterized statements with typed values, never SQL spliced with data.
//!
//! Where it sits: network I/O (tonic on tokio) over `chainify-core` and `chainify-proto` only,
//! nothing server-side, so an application linking it pulls in no database or Kafka code. The
//! binary (client commands, `devnet`, `bench --devnet`) and `chainify-net` (its channel setup)
//! use it.
//!
//! ```no_run
//! use chainify_client::{Client, Identity, OrgId, Tx};
//!
//! # async fn run() -> Result<(), chainify_client::ClientError> {
//! let identity = Identity::load("client1", "net/clients/client1.pk8")?;
//! let client = Client::connect("127.0.0.1:17100", "chainify-local", OrgId(1), identity)
//!     .tls_ca("net/tls/ca.pem")?
//!     // and `.org_key(key)`, organization 1's public key from the network file, to refuse
//!     // query answers it did not sign
//!     .connect()
//!     .await?;
//! let tx = Tx::new()
//!     .statement("UPDATE checking SET bal = bal + $2 WHERE custid = $1", [7i64.into(), 500i64.into()])
//!     .expect_rows(1);
//! let outcome = client.submit_and_wait(tx).await?;
//! assert!(outcome.agreed);
//! let rows = client
//!     .query("SELECT custid, bal FROM checking WHERE custid = $1", [7i64.into()])
//!     .await?;
//! println!("balance at block {}: {:?}", rows.height, rows.rows);
//! # Ok(()) }
//! ```
//!
//! Building a transaction is pure and checked on the server; see [`Tx`]:
//!
//! ```
//! use chainify_client::{Tx, Value};
//!
//! let tx = Tx::new()
//!     .statement("INSERT INTO accounts (custid, name) VALUES ($1, $2)", [Value::Int(1), "alice".into()])
//!     .statement("INSERT INTO checking (custid, bal) VALUES ($1, $2)", [Value::Int(1), Value::Int(0)])
//!     .expect_rows(1);
//! assert_eq!(tx.statements().len(), 2);
//! assert_eq!(tx.statements()[1].expect_rows, Some(1));
//! ```

pub mod operator;

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chainify_core::crypto::SigningKey;
use chainify_core::tx::{ProposalBody, QueryAnswer, QueryBody, Statement, Transaction};
use chainify_core::{ClientId, NetworkId};
use chainify_proto::pb;
use chainify_proto::pb::chainify_service_client::ChainifyServiceClient;
use futures_util::{Stream, StreamExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

pub use chainify_core::crypto::{PublicKey, Signature};
pub use chainify_core::{BlockNumber, Decimal, OrgId, TxId, Value};
pub use tonic::Code;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server refused the call; the code says how (UNAUTHENTICATED, PERMISSION_DENIED,
    /// INVALID_ARGUMENT naming the statement and construct, ALREADY_EXISTS for a replay,
    /// RESOURCE_EXHAUSTED when overloaded, UNAVAILABLE, …).
    #[error("{code:?}: {message}")]
    Status {
        /// The gRPC status code.
        code: Code,
        /// The server's explanation.
        message: String,
    },
    /// The endpoint, key or TLS material cannot be used.
    #[error("{0}")]
    Setup(String),
    /// The server answered something that is not a valid answer.
    #[error("invalid response: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The gRPC code, when the server refused the call.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Status {
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
}

/// A client's id and signing key, as registered in the network file.
#[derive(Clone, Debug)]
pub struct Identity {
    id: ClientId,
    key: Arc<SigningKey>,
}

impl Identity {
    /// The client `id` with its PKCS#8 key file (as written by `chainify init`).
    pub fn load(id: &str, key: impl AsRef<Path>) -> Result<Identity, ClientError> {
        let key = SigningKey::load(key.as_ref())
            .map_err(|e| ClientError::Setup(format!("client key: {e}")))?;
        Identity::new(id, key)
    }

    /// The client `id` with `key`.
    pub fn new(id: &str, key: SigningKey) -> Result<Identity, ClientError> {
        let id = ClientId::new(id)
            .map_err(|e| ClientError::Setup(format!("client id {id:?}: {}", e.problem)))?;
        Ok(Identity {
            id,
            key: Arc::new(key),
        })
    }

    /// The client id.
    pub fn id(&self) -> &str {
        self.id.as_str()
    }
}

/// How long connecting may take before a call fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A lazily connecting channel to `endpoint` (`host:port`), over TLS trusting `ca` (PEM) when
/// given, to the server whose certificate carries `tls_name` ([`OrgId::tls_name`] or
/// [`chainify_core::ORDERER_TLS_NAME`]). Calls fail, and the channel reconnects, while the
/// server is down.
pub fn channel(endpoint: &str, ca: Option<&[u8]>, tls_name: &str) -> Result<Channel, ClientError> {
    Ok(endpoint_of(endpoint, ca, tls_name)?.connect_lazy())
}

/// The TLS name is checked instead of the endpoint's host: every organization's certificate
/// may name the same hosts (`localhost`), but only one names the organization.
fn endpoint_of(endpoint: &str, ca: Option<&[u8]>, tls_name: &str) -> Result<Endpoint, ClientError> {
    let scheme = if ca.is_some() { "https" } else { "http" };
    let bad = |e: &dyn std::fmt::Display| ClientError::Setup(format!("endpoint {endpoint:?}: {e}"));
    let mut ep = Endpoint::from_shared(format!("{scheme}://{endpoint}"))
        .map_err(|e| bad(&e))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    if let Some(ca) = ca {
        let config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name(tls_name);
        ep = ep.tls_config(config).map_err(|e| bad(&e))?;
    }
    Ok(ep)
}

/// A transaction being built: statements in order, each with typed parameters for `$1..$n`
/// and optionally the number of rows it must affect.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tx {
    statements: Vec<Statement>,
}

impl Tx {
    /// An empty transaction.
    pub fn new() -> Tx {
        Tx::default()
    }

    /// Appends a statement with its parameters.
    pub fn statement(
        mut self,
        sql: impl Into<String>,
        params: impl IntoIterator<Item = Value>,
    ) -> Tx {
        self.statements
            .push(Statement::new(sql, params.into_iter().collect()));
        self
    }

    /// The last statement must affect exactly `rows` rows, or the whole transaction aborts
    /// (on every organization alike).
    ///
    /// # Panics
    /// When no statement was added yet.
    #[allow(clippy::expect_used)]
    pub fn expect_rows(mut self, rows: u64) -> Tx {
        let last = self
            .statements
            .last_mut()
            .expect("expect_rows follows a statement");
        last.expect_rows = Some(rows);
        self
    }

    /// The statements so far.
    pub fn statements(&self) -> &[Statement] {
        &self.statements
    }
}

impl From<Tx> for Transaction {
    fn from(tx: Tx) -> Transaction {
        Transaction {
            statements: tx.statements,
        }
    }
}

#[doc(no_inline)]
pub use chainify_core::tx::TxOutcome;

/// What an organization knows of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxState {
    /// Never seen by this organization.
    Unknown,
    /// Ordered or executing; its block is not agreed yet. Or only invalid copies of it are
    /// agreed so far (`invalid_copy`, the newest): the orderer may have altered the
    /// transaction, and may still order it. Such a copy is not an abort: ask again later, and do
    /// not submit the statements again as a new transaction (both could apply).
    Pending {
        /// The newest invalid copy agreed, if any.
        invalid_copy: Option<TxOutcome>,
    },
    /// In an agreed block.
    Committed(TxOutcome),
}

/// An agreed block's outcomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitEvent {
    /// The block.
    pub block: BlockNumber,
    /// Each transaction's outcome, in block order.
    pub outcomes: Vec<TxOutcome>,
}

/// The rows of a query and the agreed block height they reflect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rows {
    /// Column names.
    pub columns: Vec<String>,
    /// Rows of typed values.
    pub rows: Vec<Vec<Value>>,
    /// The database held exactly the blocks up to this one.
    pub height: u64,
    /// The organization's signature over the answer ([`chainify_core::tx::QueryAnswer`]),
    /// checked when the client was given the organization's key ([`Connect::org_key`]): proof,
    /// for anyone, of what the organization answered. `None` on a network without signatures.
    pub signature: Option<Signature>,
}

fn tx_id(bytes: &[u8]) -> Result<TxId, ClientError> {
    chainify_core::Digest::try_from(bytes)
        .map(TxId)
        .map_err(|_| ClientError::Protocol(format!("a transaction id of {} bytes", bytes.len())))
}

fn outcome(o: pb::TxOutcome) -> Result<TxOutcome, ClientError> {
    Ok(TxOutcome {
        tx_id: tx_id(&o.tx_id)?,
        block: BlockNumber(o.block_number),
        index: o.index,
        success: o.success,
        agreed: o.agreed,
        valid: !o.invalid_copy,
        reason: o.reason,
    })
}

/// Connection settings, from [`Client::connect`].
#[derive(Debug)]
pub struct Connect {
    endpoint: String,
    network: String,
    org: OrgId,
    identity: Identity,
    ca: Option<Vec<u8>>,
    local: Option<std::net::IpAddr>,
    org_key: Option<PublicKey>,
}

impl Connect {
    /// Check every query answer against the organization's public key (the network file's
    /// `public_key` of the organization): an answer it did not sign is refused, whoever sent
    /// it. Without it, answers rest on TLS alone.
    pub fn org_key(mut self, key: PublicKey) -> Connect {
        self.org_key = Some(key);
        self
    }

    /// Connect from this local address (a host with several; the organization counts some
    /// limits per client address).
    pub fn local_address(mut self, ip: std::net::IpAddr) -> Connect {
        self.local = Some(ip);
        self
    }

    /// Use TLS, trusting the network's CA certificate in this PEM file. The server must
    /// present a certificate for the organization's own name ([`OrgId::tls_name`]), so that
    /// another organization of the network cannot answer in its place.
    pub fn tls_ca(mut self, path: impl AsRef<Path>) -> Result<Connect, ClientError> {
        let path = path.as_ref();
        let pem = std::fs::read(path)
            .map_err(|e| ClientError::Setup(format!("CA certificate {}: {e}", path.display())))?;
        self.ca = Some(pem);
        Ok(self)
    }

    /// Use TLS, trusting this PEM CA certificate.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Connect {
        self.ca = Some(pem.into());
        self
    }

    /// The client; it connects on the first call.
    pub async fn connect(self) -> Result<Client, ClientError> {
        let network = NetworkId::new(&self.network).map_err(|e| {
            ClientError::Setup(format!("network id {:?}: {}", self.network, e.problem))
        })?;
        let channel = endpoint_of(&self.endpoint, self.ca.as_deref(), &self.org.tls_name())?
            .local_address(self.local)
            .connect_lazy();
        Ok(Client {
            rpc: ChainifyServiceClient::new(channel).max_decoding_message_size(256 * 1024 * 1024),
            network,
            org: self.org,
            identity: self.identity,
            org_key: self.org_key,
        })
    }
}

/// A client of one organization's ChainifyService. Cloning shares the connection.
#[derive(Clone, Debug)]
pub struct Client {
    rpc: ChainifyServiceClient<Channel>,
    network: NetworkId,
    /// The organization at the endpoint; queries are signed for it alone.
    org: OrgId,
    identity: Identity,
    /// Its key, when answers are checked.
    org_key: Option<PublicKey>,
}

/// Low bits of every nonce this process makes: one identity used by several processes at once
/// then rarely collides. A collision is refused as a replay, never executed twice.
const NONCE_LANES: u64 = 1024;

/// The last nonce this process made, shared by all its clients: clients of one identity through
/// different organizations must never reuse each other's nonces.
static LAST_NONCE: AtomicU64 = AtomicU64::new(0);

fn nonce_lane() -> u64 {
    static LANE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LANE.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() % NONCE_LANES
    })
}

impl Client {
    /// Settings for a client of organization `org` of `network`, at `endpoint` (`host:port`).
    /// Queries are signed for `org`: another organization refuses them, so that the one that
    /// received a query cannot replay it elsewhere in the client's name.
    pub fn connect(endpoint: &str, network: &str, org: OrgId, identity: Identity) -> Connect {
        Connect {
            endpoint: endpoint.to_owned(),
            network: network.to_owned(),
            org,
            identity,
            ca: None,
            local: None,
            org_key: None,
        }
    }

    /// A fresh nonce: microseconds since the epoch (so nonces stay unique across restarts) with
    /// this process's lane in the low bits, strictly increasing within the process.
    fn next_nonce(&self) -> u64 {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let now = micros
            .saturating_mul(NONCE_LANES)
            .saturating_add(nonce_lane());
        let mut current = LAST_NONCE.load(Ordering::Relaxed);
        loop {
            let next = now.max(current + 1);
            match LAST_NONCE.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(seen) => current = seen,
            }
        }
    }

    /// Signs `tx` as a proposal with a fresh nonce.
    pub fn propose(&self, tx: impl Into<Transaction>) -> pb::Proposal {
        self.propose_with_id(tx).0
    }

    /// The proposal and its transaction id, which every answer about it must name.
    fn propose_with_id(&self, tx: impl Into<Transaction>) -> (pb::Proposal, TxId) {
        let body = ProposalBody {
            client: self.identity.id.clone(),
            nonce: self.next_nonce(),
            network: self.network.clone(),
            transaction: tx.into(),
        };
        let id = body.tx_id();
        (pb::Proposal::from(&body.sign(&self.identity.key)), id)
    }

    /// Submits a transaction; returns its id once it is ordered.
    pub async fn submit(&self, tx: impl Into<Transaction>) -> Result<TxId, ClientError> {
        let (proposal, id) = self.propose_with_id(tx);
        self.send(proposal, id).await
    }

    /// Submits an already signed proposal (for instance to retry it).
    pub async fn submit_proposal(&self, proposal: pb::Proposal) -> Result<TxId, ClientError> {
        let id = chainify_core::tx::Proposal::try_from(proposal.clone())
            .map_err(|e| ClientError::Setup(format!("the proposal to submit: {e}")))?
            .tx_id();
        self.send(proposal, id).await
    }

    async fn send(&self, proposal: pb::Proposal, id: TxId) -> Result<TxId, ClientError> {
        let r = self
            .rpc
            .clone()
            .submit(pb::SubmitRequest {
                proposal: Some(proposal),
            })
            .await?;
        self.named(id, tx_id(&r.into_inner().tx_id)?)
    }

    /// An organization's answers are not signed: one naming another transaction than the one
    /// asked about (another's success, say) is a protocol error, never an outcome.
    fn named(&self, asked: TxId, answered: TxId) -> Result<TxId, ClientError> {
        if answered == asked {
            Ok(answered)
        } else {
            Err(ClientError::Protocol(format!(
                "organization {} answered about transaction {answered}, not {asked}",
                self.org.0
            )))
        }
    }

    /// Submits a transaction and waits until its block is agreed.
    pub async fn submit_and_wait(
        &self,
        tx: impl Into<Transaction>,
    ) -> Result<TxOutcome, ClientError> {
        let (proposal, id) = self.propose_with_id(tx);
        let r = self
            .rpc
            .clone()
            .submit_and_wait(pb::SubmitRequest {
                proposal: Some(proposal),
            })
            .await?;
        let o = outcome(r.into_inner())?;
        self.named(id, o.tx_id)?;
        self.final_outcome(o)
    }

    /// `o`, unless it is of an invalid copy: that is never a transaction's outcome, and taking
    /// it for an abort would have the caller apply the statements twice.
    fn final_outcome(&self, o: TxOutcome) -> Result<TxOutcome, ClientError> {
        if o.valid {
            Ok(o)
        } else {
            Err(ClientError::Protocol(format!(
                "organization {} answered with an invalid copy of transaction {} (block {}, \
                 index {}) as its outcome; such a copy says nothing final about it",
                self.org.0, o.tx_id, o.block, o.index
            )))
        }
    }

    /// What the organization knows of transaction `id`.
    pub async fn status(&self, id: &TxId) -> Result<TxState, ClientError> {
        use pb::tx_status_response::State;
        let r = self
            .rpc
            .clone()
            .tx_status(pb::TxStatusRequest {
                tx_id: id.0.as_bytes().to_vec(),
            })
            .await?
            .into_inner();
        match (State::try_from(r.state), r.outcome) {
            (Ok(State::Committed), Some(o)) => {
                let o = outcome(o)?;
                self.named(*id, o.tx_id)?;
                Ok(TxState::Committed(self.final_outcome(o)?))
            }
            (Ok(State::Pending), copy) => {
                let invalid_copy = copy.map(outcome).transpose()?;
                if let Some(o) = &invalid_copy {
                    self.named(*id, o.tx_id)?;
                }
                Ok(TxState::Pending { invalid_copy })
            }
            (Ok(State::Unknown), _) => Ok(TxState::Unknown),
            (state, _) => Err(ClientError::Protocol(format!(
                "transaction state {state:?}"
            ))),
        }
    }

    /// Waits until transaction `id` is in an agreed block, asking every `poll`.
    pub async fn wait(&self, id: &TxId, poll: Duration) -> Result<TxOutcome, ClientError> {
        loop {
            if let TxState::Committed(o) = self.status(id).await? {
                return Ok(o);
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Agreed blocks from `from` on (0: from the next one), then as they are agreed.
    pub async fn commits(
        &self,
        from: u64,
    ) -> Result<Pin<Box<dyn Stream<Item = Result<CommitEvent, ClientError>> + Send>>, ClientError>
    {
        let stream = self
            .rpc
            .clone()
            .commit_stream(pb::CommitStreamRequest { from_block: from })
            .await?
            .into_inner();
        Ok(Box::pin(stream.map(|e| {
            let e = e?;
            Ok(CommitEvent {
                block: BlockNumber(e.block_number),
                outcomes: e
                    .outcomes
                    .into_iter()
                    .map(outcome)
                    .collect::<Result<_, _>>()?,
            })
        })))
    }

    /// Runs a read-only SELECT at the organization's newest agreed block.
    pub async fn query(
        &self,
        sql: &str,
        params: impl IntoIterator<Item = Value>,
    ) -> Result<Rows, ClientError> {
        let params: Vec<Value> = params.into_iter().collect();
        let nonce = chainify_core::crypto::random_bytes()
            .map_err(|e| ClientError::Protocol(format!("a nonce for the query: {e}")))?;
        let body = QueryBody {
            client: self.identity.id.clone(),
            network: self.network.clone(),
            org: self.org,
            sql: sql.to_owned(),
            params,
            nonce: Some(nonce),
        };
        let encoded = body.encode_canonical();
        let signature = self.identity.key.sign(&encoded);
        let r = self
            .rpc
            .clone()
            .query(pb::QueryRequest {
                sql: body.sql,
                params: body.params.iter().map(pb::Value::from).collect(),
                client_id: body.client.as_str().to_owned(),
                signature: signature.0.to_vec(),
                nonce: nonce.to_vec(),
            })
            .await?
            .into_inner();
        let mut rows = Vec::with_capacity(r.rows.len());
        for row in r.rows {
            let mut values = Vec::with_capacity(row.values.len());
            for v in row.values {
                values.push(Value::try_from(v).map_err(|e| ClientError::Protocol(e.to_string()))?);
            }
            rows.push(values);
        }
        let signature = match r.signature.as_slice() {
            [] => None,
            bytes => Some(Signature::try_from(bytes).map_err(|_| {
                ClientError::Protocol(format!(
                    "organization {}'s answer carries a signature of {} bytes",
                    self.org.0,
                    bytes.len()
                ))
            })?),
        };
        if let Some(key) = &self.org_key {
            let answer = QueryAnswer {
                query: chainify_core::Digest::of(&encoded),
                height: r.block_height,
                columns: &r.columns,
                rows: &rows,
            };
            match &signature {
                None => {
                    return Err(ClientError::Protocol(format!(
                        "the answer to the query carries no signature, and organization {}'s \
                         key was given to check it: refused (an organization of an older \
                         version, a network without signatures, or another party answered)",
                        self.org.0
                    )));
                }
                Some(s) if answer.verify(key, s).is_err() => {
                    return Err(ClientError::Protocol(format!(
                        "the answer to the query is not signed by organization {}'s key: \
                         refused (another party answered, or the answer was changed)",
                        self.org.0
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(Rows {
            columns: r.columns,
            rows,
            height: r.block_height,
            signature,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use pb::chainify_service_server::{ChainifyService, ChainifyServiceServer};
    use tonic::{Request, Response, Status};

    /// An organization that answers every question about another transaction, as if it had
    /// succeeded (its answers are not signed), and answers queries with one row signed by
    /// `key` (none without), its rows, height or columns changed after signing when `tamper`.
    struct Lying {
        key: Option<SigningKey>,
        tamper: Option<Tamper>,
    }

    #[derive(Clone, Copy, Debug)]
    enum Tamper {
        Rows,
        Height,
        Columns,
        /// The signed answer to an earlier query of the same text (another nonce).
        Replay,
        /// Outcomes of the transaction asked about, of an invalid copy of it.
        InvalidCopy,
    }

    fn invalid_copy(id: &[u8]) -> pb::TxOutcome {
        pb::TxOutcome {
            tx_id: id.to_vec(),
            success: false,
            reason: "accepted by [], which does not satisfy the endorsement policy".into(),
            invalid_copy: true,
            ..other_outcome()
        }
    }

    fn other_outcome() -> pb::TxOutcome {
        pb::TxOutcome {
            tx_id: chainify_core::Digest::of(b"another").as_bytes().to_vec(),
            block_number: 1,
            index: 0,
            success: true,
            agreed: true,
            reason: String::new(),
            invalid_copy: false,
        }
    }

    #[tonic::async_trait]
    impl ChainifyService for Lying {
        type CommitStreamStream =
            Pin<Box<dyn Stream<Item = Result<pb::CommitEvent, Status>> + Send>>;

        async fn submit(
            &self,
            _: Request<pb::SubmitRequest>,
        ) -> Result<Response<pb::SubmitResponse>, Status> {
            Ok(Response::new(pb::SubmitResponse {
                tx_id: other_outcome().tx_id,
            }))
        }
        async fn submit_and_wait(
            &self,
            request: Request<pb::SubmitRequest>,
        ) -> Result<Response<pb::TxOutcome>, Status> {
            Ok(Response::new(match self.tamper {
                Some(Tamper::InvalidCopy) => {
                    let wire = request.into_inner().proposal.unwrap();
                    let id = chainify_core::tx::Proposal::try_from(wire).unwrap().tx_id();
                    invalid_copy(id.0.as_bytes())
                }
                _ => other_outcome(),
            }))
        }
        async fn tx_status(
            &self,
            request: Request<pb::TxStatusRequest>,
        ) -> Result<Response<pb::TxStatusResponse>, Status> {
            use pb::tx_status_response::State;
            let asked = request.into_inner().tx_id;
            Ok(Response::new(match self.tamper {
                // An invalid copy as the outcome of a committed transaction.
                Some(Tamper::InvalidCopy) if asked[0].is_multiple_of(2) => pb::TxStatusResponse {
                    state: State::Committed.into(),
                    outcome: Some(invalid_copy(&asked)),
                },
                // Pending, with the invalid copy agreed so far.
                Some(Tamper::InvalidCopy) => pb::TxStatusResponse {
                    state: State::Pending.into(),
                    outcome: Some(invalid_copy(&asked)),
                },
                _ => pb::TxStatusResponse {
                    state: State::Committed.into(),
                    outcome: Some(other_outcome()),
                },
            }))
        }
        async fn commit_stream(
            &self,
            _: Request<pb::CommitStreamRequest>,
        ) -> Result<Response<Self::CommitStreamStream>, Status> {
            Err(Status::unimplemented("not here"))
        }
        async fn query(
            &self,
            request: Request<pb::QueryRequest>,
        ) -> Result<Response<pb::QueryResponse>, Status> {
            let r = request.into_inner();
            let body = QueryBody {
                client: ClientId::new(r.client_id).unwrap(),
                network: NetworkId::new("net").unwrap(),
                org: OrgId(2),
                sql: r.sql,
                params: vec![],
                nonce: match self.tamper {
                    Some(Tamper::Replay) => Some([0; chainify_core::tx::QUERY_NONCE_BYTES]),
                    _ => r.nonce.as_slice().try_into().ok(),
                },
            };
            let columns = vec!["bal".to_owned()];
            let mut rows = vec![vec![Value::Int(100)]];
            let answer = QueryAnswer {
                query: chainify_core::Digest::of(&body.encode_canonical()),
                height: 7,
                columns: &columns,
                rows: &rows,
            };
            let signature = self
                .key
                .as_ref()
                .map(|k| answer.sign(k).0.to_vec())
                .unwrap_or_default();
            let (mut columns, mut height) = (columns.clone(), 7);
            match self.tamper {
                Some(Tamper::Rows) => rows[0][0] = Value::Int(1_000_000),
                Some(Tamper::Height) => height = 8,
                Some(Tamper::Columns) => columns[0] = "savings".into(),
                Some(Tamper::Replay | Tamper::InvalidCopy) | None => {}
            }
            Ok(Response::new(pb::QueryResponse {
                columns,
                rows: rows
                    .iter()
                    .map(|r| pb::Row {
                        values: r.iter().map(pb::Value::from).collect(),
                    })
                    .collect(),
                block_height: height,
                signature,
            }))
        }
    }

    /// A client of a [`Lying`] organization on a real socket, checking answers against
    /// `org_key` when given.
    async fn lied_to(lying: Lying, org_key: Option<PublicKey>) -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ChainifyServiceServer::new(lying))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut connect = Client::connect(
            &addr,
            "net",
            OrgId(2),
            Identity::new("alice", SigningKey::from_seed(&[3; 32])).unwrap(),
        );
        if let Some(key) = org_key {
            connect = connect.org_key(key);
        }
        connect.connect().await.unwrap()
    }

    /// An answer about another transaction than the one submitted or asked about is refused.
    #[tokio::test]
    async fn an_answer_about_another_transaction_is_refused() {
        let lying = Lying {
            key: None,
            tamper: None,
        };
        let client = lied_to(lying, None).await;
        let tx = || Tx::new().statement("UPDATE t SET v = 1 WHERE k = 1", []);
        let named = |e: ClientError| {
            let e = e.to_string();
            assert!(
                e.contains("organization 2 answered about transaction"),
                "{e}"
            );
        };
        named(client.submit(tx()).await.unwrap_err());
        named(
            client
                .submit_proposal(client.propose(tx()))
                .await
                .unwrap_err(),
        );
        named(client.submit_and_wait(tx()).await.unwrap_err());
        let mine = TxId(chainify_core::Digest::of(b"mine"));
        named(client.status(&mine).await.unwrap_err());
        // A proposal that does not decode is refused before it is sent.
        let e = client
            .submit_proposal(pb::Proposal::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("the proposal to submit"), "{e}");
    }

    /// An invalid copy of a transaction (one the orderer stripped of its endorsements, say) is
    /// never taken for its outcome: the caller would try again under a new nonce and apply the
    /// statements twice. As a status it is pending, with the copy to look at.
    #[tokio::test]
    async fn an_invalid_copy_is_never_taken_for_an_outcome() {
        let lying = Lying {
            key: None,
            tamper: Some(Tamper::InvalidCopy),
        };
        let client = lied_to(lying, None).await;
        let e = client
            .submit_and_wait(Tx::new().statement("UPDATE t SET v = 1 WHERE k = 1", []))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("answered with an invalid copy of transaction"),
            "{e}"
        );
        let even = TxId(chainify_core::Digest::try_from(&[2u8; 32][..]).unwrap());
        let e = client.status(&even).await.unwrap_err().to_string();
        assert!(
            e.contains("answered with an invalid copy of transaction"),
            "{e}"
        );
        let odd = TxId(chainify_core::Digest::try_from(&[3u8; 32][..]).unwrap());
        let TxState::Pending {
            invalid_copy: Some(copy),
        } = client.status(&odd).await.unwrap()
        else {
            panic!("not pending with the copy");
        };
        assert!(!copy.valid && !copy.success);
        assert_eq!(copy.tx_id, odd);
    }

    /// A query answer counts only when the organization's own key signed exactly it: not one
    /// signed by another key (another organization, or whoever holds the TLS CA's key), not one
    /// changed after signing, not the signed answer to an earlier query (each query carries a
    /// nonce of its own), not an unsigned one. Without the key the answer rests on TLS.
    #[tokio::test]
    async fn a_query_answer_counts_only_when_the_organization_signed_it() {
        let org = SigningKey::from_seed(&[2; 32]);
        let other = SigningKey::from_seed(&[9; 32]);
        let query = |c: Client| async move { c.query("SELECT bal FROM checking", []).await };
        let honest = || Lying {
            key: Some(SigningKey::from_seed(&[2; 32])),
            tamper: None,
        };
        let rows = query(lied_to(honest(), Some(org.public_key())).await)
            .await
            .unwrap();
        assert_eq!(rows.rows, vec![vec![Value::Int(100)]]);
        assert!(rows.signature.is_some());
        let changed = |t| Lying {
            key: Some(SigningKey::from_seed(&[2; 32])),
            tamper: Some(t),
        };
        for (lying, what) in [
            (
                Lying {
                    key: Some(other),
                    tamper: None,
                },
                "another key",
            ),
            (changed(Tamper::Rows), "changed rows"),
            (changed(Tamper::Height), "changed height"),
            (changed(Tamper::Columns), "changed columns"),
            (changed(Tamper::Replay), "an answer to an earlier query"),
        ] {
            let e = query(lied_to(lying, Some(org.public_key())).await)
                .await
                .unwrap_err();
            assert!(
                e.to_string()
                    .contains("not signed by organization 2's key: refused"),
                "{what}: {e}"
            );
        }
        let unsigned = Lying {
            key: None,
            tamper: None,
        };
        let e = query(lied_to(unsigned, Some(org.public_key())).await)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("carries no signature"), "{e}");
        // A client given no key takes what TLS brought (a changed answer included).
        let rows = query(lied_to(changed(Tamper::Rows), None).await)
            .await
            .unwrap();
        assert_eq!(rows.rows, vec![vec![Value::Int(1_000_000)]]);
    }

    /// Two clients of one identity (say, through two organizations) never share a nonce, and
    /// each one's nonces increase.
    #[tokio::test]
    async fn clients_of_one_identity_never_reuse_a_nonce() {
        let make = |endpoint: &str| {
            Client::connect(
                endpoint,
                "net",
                OrgId(1),
                Identity::new("alice", SigningKey::from_seed(&[3; 32])).unwrap(),
            )
            .connect()
        };
        let a = make("127.0.0.1:1").await.unwrap();
        let b = make("127.0.0.1:2").await.unwrap();
        let mut seen = std::collections::BTreeSet::new();
        let (mut last_a, mut last_b) = (0, 0);
        for _ in 0..2000 {
            let na = a.next_nonce();
            let nb = b.next_nonce();
            assert!(na > last_a && nb > last_b);
            (last_a, last_b) = (na, nb);
            assert!(seen.insert(na) && seen.insert(nb), "{na} or {nb} reused");
        }
        assert!(a.propose(Tx::new()).nonce > last_b.max(last_a));
        // The time is in the high bits, so a restarted process starts above its old nonces.
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        assert!(
            micros.abs_diff(last_b / NONCE_LANES) < 10_000_000,
            "{last_b}"
        );
    }
}
