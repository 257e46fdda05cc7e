//! `ChainifyService.Query` and `QueryService.Query`: a signed, granted, read-only SELECT on the
//! organization's database at an agreed block height. [`QueryServer`] runs where the node runs
//! (it needs the node's read gate); a chainify component in its own process forwards to it.

use std::sync::Arc;
use std::time::Duration;

use chainify_core::config::NetworkConfig;
use chainify_core::crypto::{Signature, Signatures, SigningKey};
use chainify_core::tx::{QUERY_NONCE_BYTES, QueryAnswer, QueryBody};
use chainify_core::{ClientId, Digest, OrgId, Value};
use chainify_node::{Offload, ReadGate};
use chainify_proto::pb;
use chainify_proto::pb::query_service_client::QueryServiceClient;
use chainify_sql::{Analyzer, QueryPlan};
use chainify_storage::{Backend, Store};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::{ChainifySettings, NetError, status};
use chainify_node::admission::{ANALYSES_WAITING_PER_CLIENT, analysis_turns};
use chainify_node::fair::{Crowded, FairLimits, FairShare};

/// Queries of one client waiting for a slot at once; more are refused at once.
pub const QUERIES_WAITING_PER_CLIENT: usize = 64;

/// Queries waiting for a slot at once, all clients together; more are refused at once, or push
/// out a caller of a client that waits longer.
pub const QUERIES_WAITING: usize = 4096;

/// How a ChainifyServer answers queries.
#[derive(Debug, Clone)]
pub enum QueryAccess {
    /// Through the read gate of the node in this process.
    Gate(ReadGate),
    /// By forwarding to the `QueryService` of the process that runs the organization's node.
    Forward(Channel),
}

pub(crate) enum Queries<B: Backend> {
    Local(QueryServer<B>),
    Remote(QueryServiceClient<Channel>),
}

impl<B: Backend + 'static> Queries<B> {
    pub(crate) fn new(
        access: QueryAccess,
        me: OrgId,
        key: Arc<SigningKey>,
        network: Arc<NetworkConfig>,
        store: Arc<Store<B>>,
        settings: &ChainifySettings,
    ) -> Result<Queries<B>, NetError> {
        Ok(match access {
            QueryAccess::Gate(gate) => {
                Queries::Local(QueryServer::new(me, key, network, store, gate, settings)?)
            }
            // An answer may be as large as the QueryService sends (tonic's default would
            // refuse one over 4 MiB here).
            QueryAccess::Forward(channel) => Queries::Remote(
                QueryServiceClient::new(channel).max_decoding_message_size(crate::org::MAX_MESSAGE),
            ),
        })
    }

    pub(crate) async fn query(
        &self,
        request: pb::QueryRequest,
    ) -> Result<pb::QueryResponse, Status> {
        match self {
            Queries::Local(server) => server.query(request).await,
            Queries::Remote(client) => {
                let mut client = client.clone();
                client.query(request).await.map(Response::into_inner)
            }
        }
    }
}

/// Answers queries at an agreed height on the organization's database.
#[derive(Debug)]
pub struct QueryServer<B: Backend> {
    inner: Arc<Inner<B>>,
}

impl<B: Backend> Clone for QueryServer<B> {
    fn clone(&self) -> Self {
        QueryServer {
            inner: self.inner.clone(),
        }
    }
}

#[derive(Debug)]
struct Inner<B: Backend> {
    /// The organization answering: queries are signed for it.
    me: OrgId,
    /// Its key, which signs every answer.
    key: Arc<SigningKey>,
    network: Arc<NetworkConfig>,
    analyzer: Analyzer,
    store: Arc<Store<B>>,
    gate: ReadGate,
    /// How long a query waits for the node to reach an agreed state.
    wait: Duration,
    /// How long a query may run.
    limit: Duration,
    /// The most bytes a query's answer may hold.
    max_answer_bytes: usize,
    /// Queries running at once (each holds a connection), shared fairly among clients.
    slots: FairShare<ClientId>,
    max_queries: usize,
    max_queries_per_client: usize,
    /// Where new statement shapes are analysed.
    offload: Offload,
    /// Turns at the analysis, shared fairly among clients (one running a client).
    analysing: FairShare<ClientId>,
}

impl<B: Backend + 'static> QueryServer<B> {
    /// Organization `me`'s server over `store` (shared tables registered) behind `gate`: a
    /// query waits up to `query_wait` for an agreed state and for one of `max_queries` slots
    /// (at most `max_queries_per_client` of them a client's), runs for at most `query_timeout`
    /// and answers at most `max_query_answer_bytes`, which must leave an answer room in a gRPC
    /// message.
    pub fn new(
        me: OrgId,
        key: Arc<SigningKey>,
        network: Arc<NetworkConfig>,
        store: Arc<Store<B>>,
        gate: ReadGate,
        settings: &ChainifySettings,
    ) -> Result<QueryServer<B>, NetError> {
        let most = crate::org::MAX_MESSAGE / 2;
        if !(1..=most).contains(&settings.max_query_answer_bytes) {
            return Err(NetError::Config(format!(
                "max_query_answer_bytes = {}: must be between 1 and {most} (half the {} bytes \
                 of a gRPC message, which also carries the answer's encoding overhead)",
                settings.max_query_answer_bytes,
                crate::org::MAX_MESSAGE
            )));
        }
        let analyzer = Analyzer::new(store.schema().map_err(NetError::Storage)?);
        Ok(QueryServer {
            inner: Arc::new(Inner {
                me,
                key,
                network,
                analyzer,
                store,
                gate,
                wait: settings.query_wait,
                limit: settings.query_timeout,
                max_answer_bytes: settings.max_query_answer_bytes,
                slots: FairShare::new(FairLimits {
                    places: settings.max_queries,
                    per_key: settings.max_queries_per_client,
                    waiting_per_key: QUERIES_WAITING_PER_CLIENT,
                    waiting: QUERIES_WAITING,
                }),
                max_queries: settings.max_queries,
                max_queries_per_client: settings.max_queries_per_client,
                offload: Offload::per_core(),
                analysing: analysis_turns(),
            }),
        })
    }

    /// Verifies, analyses and runs one query.
    pub async fn query(&self, request: pb::QueryRequest) -> Result<pb::QueryResponse, Status> {
        let this = &*self.inner;
        let mut params = Vec::with_capacity(request.params.len());
        for (i, p) in request.params.into_iter().enumerate() {
            params.push(
                Value::try_from(p).map_err(|e| status::malformed(&format!("params[{i}]"), &e))?,
            );
        }
        let id = ClientId::new(&request.client_id)
            .map_err(|e| status::invalid(format_args!("client_id: {}", e.problem)))?;
        let client = this.network.clients.get(&id).ok_or_else(|| {
            status::unauthenticated(format!(
                "unknown client {:?}: not in network {}",
                request.client_id, this.network.network_id
            ))
        })?;
        let signature = Signature::try_from(request.signature.as_slice()).map_err(|_| {
            status::unauthenticated(format!(
                "signature: expected 64 bytes, got {}",
                request.signature.len()
            ))
        })?;
        let nonce = match request.nonce.as_slice() {
            [] => None,
            bytes => Some(<[u8; QUERY_NONCE_BYTES]>::try_from(bytes).map_err(|_| {
                status::invalid(format_args!(
                    "nonce: expected {QUERY_NONCE_BYTES} bytes or none, got {}",
                    bytes.len()
                ))
            })?),
        };
        let body = QueryBody {
            client: id,
            network: this.network.network_id.clone(),
            org: this.me,
            sql: request.sql,
            params,
            nonce,
        };
        let signed = body.signed_by(client.public_key, signature);
        let query = Digest::of(&signed.message);
        this.network.signatures.verify(&signed).map_err(|_| {
            status::unauthenticated(format!(
                "the signature of the query by client {:?} does not verify for network {} \
                     and organization {} (a query is signed for the organization it is sent to)",
                body.client.as_str(),
                this.network.network_id,
                this.me.0
            ))
        })?;
        // A new statement shape takes milliseconds to analyse: off the async workers, one at a
        // time a client, so that one client's stream of new texts waits behind every other
        // client's next one instead of filling the analysis queue.
        let plan = if let Some(checked) = this.analyzer.query_cached(&body.sql, &body.params) {
            checked
        } else {
            let _turn =
                match tokio::time::timeout(this.wait, this.analysing.acquire(body.client.clone()))
                    .await
                {
                    Ok(Ok(turn)) => turn,
                    Ok(Err(_)) | Err(_) => {
                        return Err(status::busy(format!(
                            "client {:?} has {ANALYSES_WAITING_PER_CLIENT} new queries waiting for \
                         analysis, or the analysis of others' did not leave room for this one \
                         within {:?}; try again",
                            body.client.as_str(),
                            this.wait
                        )));
                    }
                };
            let (sql, params) = (body.sql, &body.params);
            this.offload
                .run_made(|| {
                    let inner = self.inner.clone();
                    let params = params.clone();
                    move || inner.analyzer.query(&sql, &params)
                })
                .await
                .map_err(|e| status::offloaded("analysing the query", e))?
        }
        .map_err(status::analysis)?;
        plan.check_grants(client)
            .map_err(status::permission_denied)?;
        // A slot first, in the caller's own time: a flood of slow queries waits here, holding
        // no connection and no task (a caller that gives up while waiting leaves nothing), and
        // behind every other client's next query.
        let who = body.client;
        let slot = match tokio::time::timeout(this.wait, this.slots.acquire(who.clone())).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(Crowded::Key)) => {
                return Err(status::busy(format!(
                    "client {:?} already has {QUERIES_WAITING_PER_CLIENT} queries waiting for \
                     a slot (it runs at most {} at once: max_queries_per_client); wait for \
                     them",
                    who.as_str(),
                    this.max_queries_per_client
                )));
            }
            Ok(Err(Crowded::All)) => {
                return Err(status::busy(format!(
                    "{QUERIES_WAITING} queries are waiting for one of {} slots (max_queries), \
                     none of another client in a longer queue than client {:?}'s; try again",
                    this.max_queries,
                    who.as_str()
                )));
            }
            Err(_) if this.slots.held_by(&who) >= this.max_queries_per_client => {
                return Err(status::busy(format!(
                    "client {:?} already runs {} queries (max_queries_per_client) and none \
                     finished within {:?}; try again",
                    who.as_str(),
                    this.max_queries_per_client,
                    this.wait
                )));
            }
            Err(_) => {
                return Err(status::busy(format!(
                    "{} queries are running (max_queries) and none was free for this one \
                     within {:?}; try again",
                    this.max_queries, this.wait
                )));
            }
        };
        // Then a task of its own, which holds the slot and the connection until the engine is
        // done: a caller that gives up (a gRPC deadline) cannot leave the statement running on
        // the server with its connection back in the pool.
        let inner = self.inner.clone();
        let params = body.params;
        tokio::spawn(async move {
            let _slot = slot;
            inner.run(&plan, &params, query).await
        })
        .await
        .map_err(|e| {
            if e.is_cancelled() {
                status::shutting_down()
            } else {
                Status::internal(format!("the query failed unexpectedly: {e}"))
            }
        })?
    }
}

impl<B: Backend + 'static> Inner<B> {
    /// Runs a checked query on its slot: a connection, then the read gate only while the
    /// snapshot is taken, so the node executes blocks while the query runs.
    async fn run(
        &self,
        plan: &QueryPlan,
        params: &[Value],
        query: Digest,
    ) -> Result<pb::QueryResponse, Status> {
        // The connection before the gate: waiting for the pool never holds a block back.
        let conn = self
            .store
            .query_conn()
            .await
            .map_err(status::query_failed)?;
        let guard = tokio::time::timeout(self.wait, self.gate.read())
            .await
            .map_err(|_| {
                status::failed(format!(
                    "the node did not reach an agreed state within {:?} (recovering or \
                     waiting for agreement); try again",
                    self.wait
                ))
            })?;
        let snapshot = conn
            .snapshot(self.limit)
            .await
            .map_err(status::query_failed)?;
        let height = guard.height.map_or(0, |b| b.0);
        drop(guard);
        let result = snapshot
            .max_answer_bytes(self.max_answer_bytes)
            .query_rows(plan, params)
            .await
            .map_err(status::query_failed)?;
        let signature = if self.network.signatures == Signatures::Off {
            Vec::new()
        } else {
            let answer = QueryAnswer {
                query,
                height,
                columns: &result.columns,
                rows: &result.rows,
            };
            answer.sign(&self.key).0.to_vec()
        };
        Ok(pb::QueryResponse {
            signature,
            columns: result.columns,
            rows: result
                .rows
                .iter()
                .map(|r| pb::Row {
                    values: r.iter().map(pb::Value::from).collect(),
                })
                .collect(),
            block_height: height,
        })
    }
}

#[tonic::async_trait]
impl<B: Backend + 'static> pb::query_service_server::QueryService for QueryServer<B> {
    async fn query(
        &self,
        request: Request<pb::QueryRequest>,
    ) -> Result<Response<pb::QueryResponse>, Status> {
        QueryServer::query(self, request.into_inner())
            .await
            .map(Response::new)
    }
}
