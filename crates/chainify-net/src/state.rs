//! State transfer over gRPC (`docs/design/digest.md`, "State transfer"): the CommitService's
//! `StateOffer`, `StateDigests` and `StateRows` (serving [`StateServer`]), and
//! [`GrpcStatePeers`], through which a node transfers state from the other organizations.
//!
//! The rows are the shared tables, which a client may read only within its grants: every state
//! request is signed by an organization of the network ([`signing_bytes`]), fresh within
//! [`AUTH_WINDOW`], over TLS.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chainify_core::canonical::Encoder;
use chainify_core::config::NetworkConfig;
use chainify_core::crypto::{Signature, SigningKey};
use chainify_core::ranges::RangeNode;
use chainify_core::tx::LedgerEntry;
use chainify_core::verify::SignedBytes;
use chainify_core::votes::VoteContext;
use chainify_core::{BlockNumber, Digest, NetworkId, OrgId, Value};
use chainify_node::{
    OfferedTable, PeerError, PeerFuture, StateOffer, StatePeer, StatePeers, StateServer,
};
use chainify_proto::pb;
use chainify_proto::pb::commit_service_client::CommitServiceClient;
use chainify_storage::Backend;
use futures_util::{Stream, StreamExt};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::tls::{Tls, channel};
use crate::{NetError, status};

/// How far a state request's signing time may be from the server's clock.
pub const AUTH_WINDOW: Duration = Duration::from_secs(300);

/// How long one state call may take (a rows call scans a checkpoint).
pub const STATE_CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// Largest rows chunk sent (bytes, roughly): well under gRPC's message limits.
const CHUNK_BYTES: usize = 1 << 20;

/// Domain tag of a signed state request.
pub const STATE_REQUEST_TAG: &str = "chainify.v1.StateRequest";

/// What an organization signs to ask for state: the network, itself, the organization asked
/// (so a server cannot replay the request to a third one), the time, and the request
/// (`method`, block and table; 0 and "" where a method has none).
pub fn signing_bytes(
    network: &NetworkId,
    org: OrgId,
    server: OrgId,
    unix_ms: u64,
    method: &str,
    block: u64,
    table: &str,
) -> Vec<u8> {
    let mut e = Encoder::new(STATE_REQUEST_TAG);
    e.str(network.as_str())
        .u32(org.0)
        .u32(server.0)
        .u64(unix_ms)
        .str(method)
        .u64(block)
        .str(table);
    e.finish()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The serving side, for [`crate::CommitServer`].
pub(crate) struct StateService<B: Backend> {
    pub server: Arc<StateServer<B>>,
    pub ctx: VoteContext,
    pub me: OrgId,
    /// Rows responses held in memory at once (each is a table's ranges).
    pub responses: Arc<tokio::sync::Semaphore>,
}

/// Rows responses a CommitServer holds at once; more are refused with RESOURCE_EXHAUSTED.
pub const MAX_ROWS_RESPONSES: usize = 2;

impl<B: Backend> std::fmt::Debug for StateService<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateService")
            .field("me", &self.me)
            .finish()
    }
}

pub(crate) type RowsStream = Pin<Box<dyn Stream<Item = Result<pb::StateRowsChunk, Status>> + Send>>;

/// Checks that an organization of the network other than `me` signed `auth` for this request
/// (`method`, `block`, `table`, addressed to `me`) lately; returns it.
pub(crate) fn check_auth(
    ctx: &VoteContext,
    me: OrgId,
    auth: &pb::StateAuth,
    method: &str,
    block: u64,
    table: &str,
) -> Result<OrgId, Status> {
    let org = OrgId(auth.org_id);
    let key = ctx.keys.get(&org).filter(|_| org != me).ok_or_else(|| {
        status::permission_denied(format!(
            "organization {} is not another organization of this network",
            auth.org_id
        ))
    })?;
    let skew = now_ms().abs_diff(auth.unix_ms);
    if u128::from(skew) > AUTH_WINDOW.as_millis() {
        return Err(status::unauthenticated(format!(
            "the request was signed {skew} ms away from this server's clock (at most {} s)",
            AUTH_WINDOW.as_secs()
        )));
    }
    let signature = Signature::try_from(auth.signature.as_slice())
        .map_err(|_| status::unauthenticated("auth.signature is not 64 bytes"))?;
    let bytes = signing_bytes(&ctx.network, org, me, auth.unix_ms, method, block, table);
    let request = SignedBytes {
        key: *key,
        message: bytes,
        signature,
    };
    ctx.signatures.verify(&request).map_err(|_| {
        status::unauthenticated(format!(
            "the signature of organization {org} does not verify"
        ))
    })?;
    Ok(org)
}

/// A request's `auth` for `method`, `block` and `table`, signed now by `me` with `key` for
/// organization `server`.
pub(crate) fn sign_auth(
    network: &NetworkId,
    signatures: chainify_core::crypto::Signatures,
    key: &SigningKey,
    me: OrgId,
    server: OrgId,
    (method, block, table): (&str, u64, &str),
) -> pb::StateAuth {
    let unix_ms = now_ms();
    let bytes = signing_bytes(network, me, server, unix_ms, method, block, table);
    pb::StateAuth {
        org_id: me.0,
        unix_ms,
        signature: signatures.sign(key, &bytes).0.to_vec(),
    }
}

impl<B: Backend> StateService<B> {
    /// Checks that an organization of the network (not this one) signed the request lately.
    fn check(
        &self,
        auth: Option<&pb::StateAuth>,
        method: &str,
        block: u64,
        table: &str,
    ) -> Result<OrgId, Status> {
        let auth = auth.ok_or_else(|| {
            status::unauthenticated("state requests must be signed by an organization (auth)")
        })?;
        check_auth(&self.ctx, self.me, auth, method, block, table)
    }

    pub(crate) async fn offer(
        &self,
        r: pb::StateOfferRequest,
    ) -> Result<Response<pb::StateOfferResponse>, Status> {
        self.check(r.auth.as_ref(), "StateOffer", 0, "")?;
        let offer = self.server.offer().await.map_err(status::serve_failed)?;
        Ok(Response::new(match offer {
            Some(o) => pb::StateOfferResponse {
                entry: Some(pb::LedgerEntry::from(&o.entry)),
                tables: o.tables,
            },
            None => pb::StateOfferResponse::default(),
        }))
    }

    pub(crate) async fn digests(
        &self,
        r: pb::StateDigestsRequest,
    ) -> Result<Response<pb::StateDigestsResponse>, Status> {
        self.check(r.auth.as_ref(), "StateDigests", r.block, &r.table)?;
        let nodes: Vec<RangeNode> = r
            .nodes
            .iter()
            .map(|n| RangeNode {
                level: n.level,
                index: n.index,
            })
            .collect();
        let digests = self
            .server
            .digests(BlockNumber(r.block), &r.table, &nodes)
            .await
            .map_err(status::serve_failed)?;
        Ok(Response::new(pb::StateDigestsResponse {
            digests: digests.iter().map(|d| d.as_bytes().to_vec()).collect(),
        }))
    }

    pub(crate) async fn rows(
        &self,
        r: pb::StateRowsRequest,
    ) -> Result<Response<RowsStream>, Status> {
        self.check(r.auth.as_ref(), "StateRows", r.block, &r.table)?;
        let permit =
            self.responses.clone().try_acquire_owned().map_err(|_| {
                status::busy("other state transfers are being served; ask again later")
            })?;
        let rows = self
            .server
            .rows(BlockNumber(r.block), &r.table, &r.ranges)
            .await
            .map_err(status::serve_failed)?;
        let mut chunks = Vec::new();
        let mut chunk = Vec::new();
        let mut size = 0;
        for row in rows {
            size += row.iter().map(approximate_size).sum::<usize>();
            chunk.push(pb::Row {
                values: row.iter().map(pb::Value::from).collect(),
            });
            if size >= CHUNK_BYTES {
                chunks.push(Ok(pb::StateRowsChunk {
                    rows: std::mem::take(&mut chunk),
                }));
                size = 0;
            }
        }
        if !chunk.is_empty() {
            chunks.push(Ok(pb::StateRowsChunk { rows: chunk }));
        }
        // The permit goes with the response until it is sent or dropped.
        Ok(Response::new(Box::pin(
            futures_util::stream::iter(chunks).map(move |c| {
                let _held = &permit;
                c
            }),
        )))
    }
}

fn approximate_size(v: &Value) -> usize {
    match v {
        Value::Text(t) => t.len() + 8,
        Value::Bytes(b) => b.len() + 8,
        _ => 16,
    }
}

/// Another organization's CommitService, as a transfer reads it.
#[derive(Debug)]
pub struct GrpcStatePeer {
    org: OrgId,
    me: OrgId,
    network: NetworkId,
    signatures: chainify_core::crypto::Signatures,
    key: Arc<SigningKey>,
    client: CommitServiceClient<Channel>,
    /// The most bytes of rows, as held in memory, one call takes.
    max_rows_bytes: u64,
    /// The most bytes of ledger entries, as sent, one call takes ([`LEDGER_CALL_BYTES`]).
    max_ledger_bytes: usize,
    /// The most bytes one entry takes ([`ledger_entry_bytes`]): a call asks for as many
    /// blocks as fit `max_ledger_bytes`.
    max_entry_bytes: usize,
}

/// What one call for ledger entries may bring (a peer may send less than asked; the transfer
/// asks again from where it ended).
const LEDGER_CALL_BYTES: usize = 256 << 20;

/// The most bytes an entry of blocks of `max_block_txs` transactions takes: the ids, bits and
/// framing of each (about 34 bytes) and 64 KiB for the rest and its certificate.
fn ledger_entry_bytes(max_block_txs: usize) -> usize {
    64 * 1024 + 48 * max_block_txs
}

/// What a row takes in memory: its vector, its values and their text or bytes.
fn row_bytes(row: &[Value]) -> u64 {
    let payload: usize = row
        .iter()
        .map(|v| match v {
            Value::Text(t) => t.len(),
            Value::Bytes(b) => b.len(),
            _ => 0,
        })
        .sum();
    (std::mem::size_of::<Vec<Value>>() + std::mem::size_of_val(row) + payload) as u64
}

impl GrpcStatePeer {
    fn auth(&self, method: &str, block: u64, table: &str) -> pb::StateAuth {
        sign_auth(
            &self.network,
            self.signatures,
            &self.key,
            self.me,
            self.org,
            (method, block, table),
        )
    }

    fn failed(&self, what: &str, s: &Status) -> PeerError {
        PeerError::Unavailable(format!(
            "{what} from organization {}: {}",
            self.org,
            s.message()
        ))
    }
}

fn timed<T>(message: T) -> Request<T> {
    let mut r = Request::new(message);
    r.set_timeout(STATE_CALL_TIMEOUT);
    r
}

impl StatePeer for GrpcStatePeer {
    fn org(&self) -> OrgId {
        self.org
    }

    fn offer(&self) -> PeerFuture<'_, Option<StateOffer>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let mut request = Request::new(pb::StateOfferRequest {
                auth: Some(self.auth("StateOffer", 0, "")),
            });
            request.set_timeout(chainify_node::transfer::OFFER_TIMEOUT);
            let r = client
                .state_offer(request)
                .await
                .map_err(|s| self.failed("an offer", &s))?
                .into_inner();
            let Some(entry) = r.entry else {
                return Ok(None);
            };
            let entry = LedgerEntry::try_from(entry)
                .map_err(|e| PeerError::Untrusted(format!("a malformed offer: {e}")))?;
            Ok(Some(StateOffer {
                entry,
                tables: r.tables,
            }))
        })
    }

    fn ledger(&self, from: BlockNumber, to: BlockNumber) -> PeerFuture<'_, Vec<LedgerEntry>> {
        let mut client = self.client.clone();
        // As many blocks as the bytes of one call hold at most (the caller asks again).
        let fit = (self.max_ledger_bytes / self.max_entry_bytes.max(1)).max(1) as u64;
        let to = BlockNumber(to.0.min(from.0.saturating_add(fit - 1)));
        Box::pin(async move {
            let mut stream = client
                .get_ledger(timed(pb::GetLedgerRequest {
                    from_block: from.0,
                    to_block: to.0,
                    auth: Some(self.auth("GetLedger", from.0, "")),
                }))
                .await
                .map_err(|s| self.failed("ledger entries", &s))?
                .into_inner();
            let mut out = Vec::new();
            let wanted = usize::try_from(to.0.saturating_sub(from.0) + 1).unwrap_or(usize::MAX);
            let mut bytes = 0;
            while out.len() < wanted
                && let Some(item) = stream.next().await
            {
                let entry = item.map_err(|s| self.failed("ledger entries", &s))?;
                bytes += prost::Message::encoded_len(&entry);
                if bytes > self.max_ledger_bytes {
                    return Err(PeerError::Untrusted(format!(
                        "it sent more than {} bytes of ledger entries for blocks {from}..={to}",
                        self.max_ledger_bytes
                    )));
                }
                out.push(
                    LedgerEntry::try_from(entry).map_err(|e| {
                        PeerError::Untrusted(format!("a malformed ledger entry: {e}"))
                    })?,
                );
            }
            Ok(out)
        })
    }

    fn digests(&self, of: OfferedTable, nodes: Vec<RangeNode>) -> PeerFuture<'_, Vec<Digest>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let r = client
                .state_digests(timed(pb::StateDigestsRequest {
                    auth: Some(self.auth("StateDigests", of.block.0, &of.table)),
                    block: of.block.0,
                    table: of.table,
                    nodes: nodes
                        .iter()
                        .map(|n| pb::RangeNode {
                            level: n.level,
                            index: n.index,
                        })
                        .collect(),
                }))
                .await
                .map_err(|s| self.failed("range digests", &s))?
                .into_inner();
            r.digests
                .iter()
                .map(|d| {
                    Digest::try_from(d.as_slice())
                        .map_err(|_| PeerError::Untrusted("a range digest is not 32 bytes".into()))
                })
                .collect()
        })
    }

    fn rows(&self, of: OfferedTable, ranges: Vec<u32>) -> PeerFuture<'_, Vec<Vec<Value>>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let table = of.table;
            let mut stream = client
                .state_rows(timed(pb::StateRowsRequest {
                    auth: Some(self.auth("StateRows", of.block.0, &table)),
                    block: of.block.0,
                    table: table.clone(),
                    ranges,
                }))
                .await
                .map_err(|s| self.failed("rows", &s))?
                .into_inner();
            let mut rows = Vec::new();
            let mut bytes = 0;
            while let Some(chunk) = stream.next().await {
                for row in chunk.map_err(|s| self.failed("rows", &s))?.rows {
                    let row = row
                        .values
                        .into_iter()
                        .map(Value::try_from)
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| {
                            PeerError::Untrusted(format!("table {table}: a malformed value: {e}"))
                        })?;
                    bytes += row_bytes(&row);
                    if bytes > self.max_rows_bytes {
                        return Err(PeerError::Untrusted(format!(
                            "table {table}: it sent more than {} bytes of rows (checkpoint.transfer_max_bytes; raise it if the table is that large)",
                            self.max_rows_bytes
                        )));
                    }
                    rows.push(row);
                }
            }
            Ok(rows)
        })
    }
}

/// The other organizations of a network, reached over gRPC.
#[derive(Debug)]
pub struct GrpcStatePeers {
    peers: Vec<Arc<dyn StatePeer>>,
}

impl GrpcStatePeers {
    /// Connects (lazily) to every other organization's CommitService; requests are signed with
    /// `key` as organization `me`.
    pub fn new(
        network: &NetworkConfig,
        me: OrgId,
        key: Arc<SigningKey>,
        tls: Option<&Tls>,
        max_rows_bytes: u64,
    ) -> Result<GrpcStatePeers, NetError> {
        let mut peers: Vec<Arc<dyn StatePeer>> = Vec::new();
        for org in network.orgs.values().filter(|o| o.id != me) {
            let client =
                CommitServiceClient::new(channel(&org.commit_endpoint, tls, &org.id.tls_name())?)
                    .max_decoding_message_size(64 << 20);
            peers.push(Arc::new(GrpcStatePeer {
                org: org.id,
                me,
                network: network.network_id.clone(),
                signatures: network.signatures,
                key: key.clone(),
                client,
                max_rows_bytes,
                max_ledger_bytes: LEDGER_CALL_BYTES,
                max_entry_bytes: ledger_entry_bytes(network.max_block_txs),
            }));
        }
        Ok(GrpcStatePeers { peers })
    }
}

impl StatePeers for GrpcStatePeers {
    fn peers(&self) -> Vec<Arc<dyn StatePeer>> {
        self.peers.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_proto::pb::commit_service_server::{CommitService, CommitServiceServer};

    /// A member that streams rows, or ledger entries, without end.
    struct Endless;

    type Stream<T> = Pin<Box<dyn futures_util::Stream<Item = Result<T, Status>> + Send>>;

    #[tonic::async_trait]
    impl CommitService for Endless {
        async fn send_votes(
            &self,
            _: Request<pb::VoteBatch>,
        ) -> Result<Response<pb::VoteAck>, Status> {
            Err(Status::unimplemented("not here"))
        }
        async fn send_certificate(
            &self,
            _: Request<pb::Certificate>,
        ) -> Result<Response<pb::CertificateAck>, Status> {
            Err(Status::unimplemented("not here"))
        }
        async fn get_certificate(
            &self,
            _: Request<pb::GetCertificateRequest>,
        ) -> Result<Response<pb::GetCertificateResponse>, Status> {
            Err(Status::unimplemented("not here"))
        }
        type GetLedgerStream = Stream<pb::LedgerEntry>;
        async fn get_ledger(
            &self,
            _: Request<pb::GetLedgerRequest>,
        ) -> Result<Response<Self::GetLedgerStream>, Status> {
            // Well-formed entries of a megabyte of ids each.
            let n = 32 * 1024;
            let entry = pb::LedgerEntry::from(&LedgerEntry {
                block: chainify_core::tx::LedgerBlock {
                    network: NetworkId::new("net").unwrap(),
                    number: BlockNumber(1),
                    tx_ids: vec![chainify_core::TxId(Digest::of(b"t")); n],
                    success: vec![true; n],
                    valid: vec![true; n],
                    hash_digest: Digest::ZERO,
                    state_digest: Digest::ZERO,
                    hash_previous: Digest::ZERO,
                    orderer_position: 1,
                },
                certificate: chainify_core::tx::Certificate {
                    block: BlockNumber(1),
                    ledger_block_hash: Digest::ZERO,
                    votes: Vec::new(),
                },
            });
            Ok(Response::new(Box::pin(futures_util::stream::repeat_with(
                move || Ok(entry.clone()),
            ))))
        }
        async fn state_offer(
            &self,
            _: Request<pb::StateOfferRequest>,
        ) -> Result<Response<pb::StateOfferResponse>, Status> {
            Err(Status::unimplemented("not here"))
        }
        async fn state_digests(
            &self,
            _: Request<pb::StateDigestsRequest>,
        ) -> Result<Response<pb::StateDigestsResponse>, Status> {
            Err(Status::unimplemented("not here"))
        }
        type StateRowsStream = Stream<pb::StateRowsChunk>;
        async fn state_rows(
            &self,
            _: Request<pb::StateRowsRequest>,
        ) -> Result<Response<Self::StateRowsStream>, Status> {
            let row = pb::Row {
                values: (1..=3).map(|i| pb::Value::from(&Value::Int(i))).collect(),
            };
            let chunk = pb::StateRowsChunk {
                rows: vec![row; 10_000],
            };
            Ok(Response::new(Box::pin(futures_util::stream::repeat_with(
                move || Ok(chunk.clone()),
            ))))
        }
    }

    /// Found by a hunt: a member's stream of rows or ledger entries has no end of its own, and
    /// a transfer took all of it into memory (7 GB from one call). Past the bound the peer is
    /// refused as lying, and the transfer goes on with another. (An honest chunk of ledger
    /// entries of 1 024-transaction blocks stays within the bound.)
    #[tokio::test]
    async fn a_peer_streaming_without_end_is_refused_past_the_bound() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(CommitServiceServer::new(Endless))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let peer = GrpcStatePeer {
            org: OrgId(2),
            me: OrgId(1),
            network: NetworkId::new("net").unwrap(),
            signatures: chainify_core::crypto::Signatures::default(),
            key: Arc::new(SigningKey::from_seed(&[1; 32])),
            client: CommitServiceClient::new(channel(&addr, None, "org2").unwrap())
                .max_decoding_message_size(64 << 20),
            max_rows_bytes: 8 << 20,
            max_ledger_bytes: 16 << 20,
            max_entry_bytes: 1,
        };
        let of = OfferedTable {
            block: BlockNumber(3),
            table: "kv".into(),
        };
        let e = peer.rows(of, vec![0, 1]).await.unwrap_err();
        assert!(e.is_peers_fault(), "{e}");
        assert!(
            e.to_string()
                .contains("table kv: it sent more than 8388608 bytes of rows"),
            "{e}"
        );
        let e = peer
            .ledger(BlockNumber(1), BlockNumber(10_000))
            .await
            .unwrap_err();
        assert!(e.is_peers_fault(), "{e}");
        assert!(
            e.to_string()
                .contains("it sent more than 16777216 bytes of ledger entries"),
            "{e}"
        );
        // An honest entry of 1 024 transactions fits; a call asks for 2 340 of them.
        assert!(ledger_entry_bytes(1024) > 1024 * 34 + 2_000);
        assert_eq!(LEDGER_CALL_BYTES / ledger_entry_bytes(1024), 2_340);
    }
}
