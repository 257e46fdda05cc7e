//! State transfer from an agreeing organization (`docs/design/digest.md`, "State transfer").
//!
//! An organization that cannot reproduce the agreed state from its own checkpoints (the victim
//! of an equivocating orderer, a database repaired from nothing, a wiped or new database) takes
//! it from another one:
//!
//! 1. The peer offers its newest checkpoint of an agreed block whose snapshots hold that block's
//!    state digest ([`StateServer::offer`]); the receiver checks the block's certificate.
//! 2. The receiver fetches the ledger entries between its own ledger and that block and checks
//!    that they chain to its ledger and carry valid certificates.
//! 3. Per table, it walks the peer's Merkle tree over key ranges against its own
//!    ([`chainify_core::ranges`]) and fetches the rows of the ranges that differ.
//! 4. Its kept ranges plus the fetched rows must sum to the agreed state digest; otherwise it
//!    fetches every range once, and rejects the peer if that does not match either.
//! 5. It adopts the state ([`chainify_storage::Store::adopt`]), which checks the digest again on
//!    what was written before any shared table or the ledger changes.
//!
//! Nothing a peer says is trusted: certificates prove the blocks, the state digest proves the
//! rows. A lying peer costs time, never a wrong row.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chainify_core::ranges::{Descent, LEAVES, RangeDigests, RangeNode};
use chainify_core::state::{RowHash, StateHash};
use chainify_core::tx::LedgerBlock;
use chainify_core::tx::LedgerEntry;
use chainify_core::votes::{VoteContext, verify_certificate, verify_ledger_from};
use chainify_core::{BlockNumber, Digest, OrgId, Value};
use chainify_storage::{AdoptedBlock, Adoption, Backend, RangePatch, StorageError, Store};
use tokio::sync::{Semaphore, watch};

use crate::LocalFault;
use crate::ledger;
use crate::node::NodeStatus;

/// A boxed future of a peer call (peers are used as `Arc<dyn StatePeer>`).
pub type PeerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, PeerError>> + Send + 'a>>;

/// Why this organization cannot serve a peer's request for its state.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The request asks for what is not on offer or more than one call may carry.
    #[error("{0}")]
    Refused(String),
    /// This organization's database or ledger.
    #[error(transparent)]
    Local(#[from] LocalFault),
    /// The node is stopping (its scan slots closed, or the offer's task did not finish).
    #[error("{0}")]
    Stopping(String),
}

/// Why the transfer from one peer failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The peer did not answer, or refused the call (its explanation, as it came).
    #[error("{0}")]
    Unavailable(String),
    /// It had nothing to offer.
    #[error("no checkpoint to offer")]
    NoOffer,
    /// It did not offer within [`OFFER_TIMEOUT`].
    #[error("no offer within {0:?}")]
    OfferTimeout(Duration),
    /// It did not complete the transfer in time.
    #[error("it did not complete the transfer within {0:?}")]
    TransferTimeout(Duration),
    /// What it sent is not what the network agreed (wrong network or tables, a certificate or
    /// ledger that does not verify, rows that do not make the agreed state, malformed data).
    #[error("{0}")]
    Untrusted(String),
    /// Served in this process: the peer's own failure.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// This organization's database failed while fetching or adopting, its ledger, or its
    /// execution component did not settle before the adoption.
    #[error(transparent)]
    Local(#[from] LocalFault),
}

crate::fault::from_local_faults!(ServeError);
crate::fault::from_local_faults!(PeerError);

impl PeerError {
    /// Whether the peer is to blame (it goes last for a while), rather than this
    /// organization's own database, ledger or execution component. An adoption the store
    /// refuses (`StorageError::Transfer`: rows outside the ranges asked for, a row twice, a
    /// state that is not the agreed one) is the peer's data.
    pub fn is_peers_fault(&self) -> bool {
        match self {
            PeerError::Local(LocalFault::Storage(StorageError::Transfer(_))) => true,
            PeerError::Local(_) => false,
            _ => true,
        }
    }
}

/// Why no organization transferred its state: each asked organization's failure, in the order
/// they were tried.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// No other organization is configured or reachable.
    #[error("no other organization is reachable")]
    NoPeers,
    /// Every organization asked failed.
    #[error("{}", list(.0))]
    Failed(Vec<(OrgId, PeerError)>),
}

fn list(failures: &[(OrgId, PeerError)]) -> String {
    failures
        .iter()
        .map(|(org, e)| format!("{org}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// How long a checkpoint stays exempt from pruning after a transfer last used it.
pub const PIN_FOR: Duration = Duration::from_secs(120);

/// How long a checkpoint stays exempt from pruning at most, however often it is asked for (a
/// peer that keeps asking must not make this organization keep every checkpoint).
pub const PIN_AT_MOST: Duration = Duration::from_secs(900);

/// How long a peer may take to make an offer (it may scan its checkpoint first).
pub const OFFER_TIMEOUT: Duration = Duration::from_secs(60);

/// Most ledger entries asked for in one call.
pub const LEDGER_CHUNK: u64 = 10_000;

/// Most nodes whose digests one call may ask for: a whole level of leaves.
pub const MAX_NODES_PER_CALL: usize = LEAVES as usize;

/// What an organization offers to transfer: a checkpoint of an agreed block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateOffer {
    /// The block and its certificate.
    pub entry: LedgerEntry,
    /// The shared tables, by name.
    pub tables: Vec<String>,
}

/// A shared table in the checkpoint a peer offered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfferedTable {
    /// The checkpoint's block.
    pub block: BlockNumber,
    /// The table.
    pub table: String,
}

/// Another organization's state, as a transfer reads it.
pub trait StatePeer: Send + Sync + fmt::Debug + 'static {
    /// Which organization.
    fn org(&self) -> OrgId;
    /// Its newest transferable checkpoint (`None`: it has none yet).
    fn offer(&self) -> PeerFuture<'_, Option<StateOffer>>;
    /// Its ledger entries `from..=to`.
    fn ledger(&self, from: BlockNumber, to: BlockNumber) -> PeerFuture<'_, Vec<LedgerEntry>>;
    /// The digests of `nodes` of the table's range tree.
    fn digests(&self, of: OfferedTable, nodes: Vec<RangeNode>) -> PeerFuture<'_, Vec<Digest>>;
    /// The table's rows in `ranges`.
    fn rows(&self, of: OfferedTable, ranges: Vec<u32>) -> PeerFuture<'_, Vec<Vec<Value>>>;
}

/// The other organizations a node may transfer state from.
pub trait StatePeers: Send + Sync + fmt::Debug + 'static {
    /// Every other organization reachable now.
    fn peers(&self) -> Vec<Arc<dyn StatePeer>>;
}

/// No peers (a node on its own: transfers fail, fast join is skipped).
#[derive(Debug, Default)]
pub struct NoPeers;

impl StatePeers for NoPeers {
    fn peers(&self) -> Vec<Arc<dyn StatePeer>> {
        Vec::new()
    }
}

#[derive(Debug, Default)]
struct Served {
    /// The checkpoint offered and checked against its ledger block.
    offer: Option<StateOffer>,
    /// Range digests by checkpoint and table.
    trees: BTreeMap<(BlockNumber, String), Arc<RangeDigests>>,
    /// The checkpoint a transfer uses, since when, and when it last did.
    pinned: Option<(BlockNumber, Instant, Instant)>,
}

/// The serving side: what this organization offers others from its checkpoints. Reads only
/// checkpoints of agreed blocks, so serving never waits for or stalls the pipeline.
#[derive(Debug)]
pub struct StateServer<B: Backend> {
    store: Arc<Store<B>>,
    status: watch::Receiver<NodeStatus>,
    served: Mutex<Served>,
    /// One checkpoint scan at a time: a peer cannot make this organization scan in parallel.
    scans: Semaphore,
}

impl<B: Backend> StateServer<B> {
    /// Serves the checkpoints of `store`, agreed as far as `status` says.
    pub fn new(store: Arc<Store<B>>, status: watch::Receiver<NodeStatus>) -> StateServer<B> {
        StateServer {
            store,
            status,
            served: Mutex::default(),
            scans: Semaphore::new(1),
        }
    }

    fn served(&self) -> std::sync::MutexGuard<'_, Served> {
        self.served.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn agreed(&self) -> BlockNumber {
        BlockNumber(self.status.borrow().next_block.0.saturating_sub(1))
    }

    /// The checkpoint a transfer is using, kept from pruning for [`PIN_FOR`] after its last use.
    pub fn pinned(&self) -> Option<BlockNumber> {
        let mut served = self.served();
        match served.pinned {
            Some((b, since, last)) if last.elapsed() < PIN_FOR && since.elapsed() < PIN_AT_MOST => {
                Some(b)
            }
            _ => {
                served.pinned = None;
                None
            }
        }
    }

    fn pin(&self, block: BlockNumber) {
        let mut served = self.served();
        let now = Instant::now();
        let since = match served.pinned {
            Some((b, since, _)) if b == block => since,
            _ => now,
        };
        served.pinned = Some((block, since, now));
    }

    /// The newest checkpoint of an agreed block whose snapshots hold the block's state digest.
    /// The check scans the checkpoint once; it finishes and is remembered even when the asking
    /// peer stops waiting (a large checkpoint takes longer than one request may).
    pub async fn offer(self: &Arc<Self>) -> Result<Option<StateOffer>, ServeError> {
        let server = self.clone();
        tokio::spawn(async move { server.offer_now().await })
            .await
            .map_err(|e| ServeError::Stopping(format!("making an offer: {e}")))?
    }

    async fn offer_now(&self) -> Result<Option<StateOffer>, ServeError> {
        let agreed = self.agreed();
        let checkpoints = self.store.checkpoints().await?;
        for c in checkpoints
            .into_iter()
            .rev()
            .filter(|c| *c <= agreed && c.0 > 0)
        {
            let cached = self.served().offer.clone();
            if let Some(offer) = cached.filter(|o| o.entry.block.number == c) {
                self.pin(c);
                return Ok(Some(offer));
            }
            let entry = ledger::entry(&self.store, c).await?;
            let _scan = self.scan().await?;
            let held = self.store.checkpoint_state_digest(c).await?;
            if held != entry.block.state_digest {
                tracing::warn!(checkpoint = %c, %held, agreed = %entry.block.state_digest,
                    "a checkpoint does not hold its agreed state; not offered");
                continue;
            }
            let offer = StateOffer {
                entry,
                tables: self.store.tables().keys().cloned().collect(),
            };
            self.served().offer = Some(offer.clone());
            self.pin(c);
            return Ok(Some(offer));
        }
        Ok(None)
    }

    /// Ledger entries `from..=to` (at most the agreed ones).
    pub async fn ledger(
        &self,
        from: BlockNumber,
        to: BlockNumber,
    ) -> Result<Vec<LedgerEntry>, ServeError> {
        let to = to.min(self.agreed());
        if to.0 >= from.0 && to.0 - from.0 >= LEDGER_CHUNK {
            return Err(ServeError::Refused(format!(
                "blocks {from}..={to}: at most {LEDGER_CHUNK} ledger entries per call"
            )));
        }
        let mut out = Vec::new();
        for b in from.0.max(1)..=to.0 {
            out.push(ledger::entry(&self.store, BlockNumber(b)).await?);
        }
        Ok(out)
    }

    /// Checks that `block` is the checkpoint on offer.
    /// Checks that `table` is one of this organization's shared tables.
    fn shared(&self, table: &str) -> Result<(), ServeError> {
        if self.store.tables().contains_key(table) {
            Ok(())
        } else {
            Err(ServeError::Refused(format!(
                "{table:?} is not a shared table here"
            )))
        }
    }

    fn offered(&self, block: BlockNumber) -> Result<(), ServeError> {
        let offered = self.served().offer.as_ref().map(|o| o.entry.block.number);
        if offered != Some(block) {
            return Err(ServeError::Refused(format!(
                "the checkpoint at block {block} is not on offer (ask for an offer first)"
            )));
        }
        self.pin(block);
        Ok(())
    }

    /// One of the scan slots (a checkpoint scan reads a whole table).
    async fn scan(&self) -> Result<tokio::sync::SemaphorePermit<'_>, ServeError> {
        self.scans
            .acquire()
            .await
            .map_err(|e| ServeError::Stopping(e.to_string()))
    }

    /// The digests of `nodes` of `table`'s tree in the checkpoint on offer.
    pub async fn digests(
        &self,
        block: BlockNumber,
        table: &str,
        nodes: &[RangeNode],
    ) -> Result<Vec<Digest>, ServeError> {
        self.offered(block)?;
        self.shared(table)?;
        if nodes.len() > MAX_NODES_PER_CALL {
            return Err(ServeError::Refused(format!(
                "{} nodes asked for; at most {MAX_NODES_PER_CALL} per call",
                nodes.len()
            )));
        }
        if let Some(bad) = nodes.iter().find(|n| !n.is_valid()) {
            return Err(ServeError::Refused(format!(
                "there is no range node {bad:?}"
            )));
        }
        let key = (block, table.to_owned());
        let cached = self.served().trees.get(&key).cloned();
        let tree = match cached {
            Some(t) => t,
            None => {
                let _scan = self.scan().await?;
                let tree = Arc::new(self.store.range_tree(table, Some(block)).await?.digests());
                let mut served = self.served();
                // Trees of older checkpoints are not asked for again.
                served.trees.retain(|(b, _), _| *b == block);
                served.trees.insert(key, tree.clone());
                tree
            }
        };
        Ok(nodes.iter().filter_map(|n| tree.get(*n)).collect())
    }

    /// The rows of `table` in `ranges` in the checkpoint on offer.
    pub async fn rows(
        &self,
        block: BlockNumber,
        table: &str,
        ranges: &[u32],
    ) -> Result<Vec<Vec<Value>>, ServeError> {
        self.offered(block)?;
        self.shared(table)?;
        if let Some(bad) = ranges.iter().find(|r| **r >= LEAVES) {
            return Err(ServeError::Refused(format!("there is no key range {bad}")));
        }
        let ranges: BTreeSet<u32> = ranges.iter().copied().collect();
        let _scan = self.scan().await?;
        Ok(self.store.checkpoint_rows(block, table, &ranges).await?)
    }
}

/// A peer in this process (the in-process cluster, the demo).
#[derive(Debug)]
pub struct LocalPeer<B: Backend> {
    org: OrgId,
    server: Arc<StateServer<B>>,
}

impl<B: Backend> LocalPeer<B> {
    /// Organization `org`'s server.
    pub fn new(org: OrgId, server: Arc<StateServer<B>>) -> LocalPeer<B> {
        LocalPeer { org, server }
    }
}

impl<B: Backend> StatePeer for LocalPeer<B> {
    fn org(&self) -> OrgId {
        self.org
    }
    fn offer(&self) -> PeerFuture<'_, Option<StateOffer>> {
        Box::pin(async { Ok(self.server.offer().await?) })
    }
    fn ledger(&self, from: BlockNumber, to: BlockNumber) -> PeerFuture<'_, Vec<LedgerEntry>> {
        Box::pin(async move { Ok(self.server.ledger(from, to).await?) })
    }
    fn digests(&self, of: OfferedTable, nodes: Vec<RangeNode>) -> PeerFuture<'_, Vec<Digest>> {
        Box::pin(async move { Ok(self.server.digests(of.block, &of.table, &nodes).await?) })
    }
    fn rows(&self, of: OfferedTable, ranges: Vec<u32>) -> PeerFuture<'_, Vec<Vec<Value>>> {
        Box::pin(async move { Ok(self.server.rows(of.block, &of.table, &ranges).await?) })
    }
}

/// What a transfer fetched, ready to adopt.
#[derive(Debug)]
pub(crate) struct Fetched {
    pub adoption: Adoption,
    /// The adopted block.
    pub block: LedgerBlock,
    /// The ledger entries fetched (after the local ledger, through the block).
    pub entries: Vec<LedgerEntry>,
    /// Ranges and rows transferred.
    pub ranges: usize,
    pub rows: usize,
}

/// Checks an offer: a block of this network with a valid certificate for exactly it, over the
/// same shared tables.
pub(crate) fn check_offer<B: Backend>(
    offer: &StateOffer,
    store: &Store<B>,
    ctx: &VoteContext,
) -> Result<(), PeerError> {
    let untrusted = PeerError::Untrusted;
    let LedgerEntry { block, certificate } = &offer.entry;
    if block.network != ctx.network {
        return Err(untrusted(format!(
            "it offers a block of network {}",
            block.network
        )));
    }
    if certificate.block != block.number || certificate.ledger_block_hash != block.hash() {
        return Err(untrusted(format!(
            "the certificate it offers is not for block {}",
            block.number
        )));
    }
    verify_certificate(certificate, ctx).map_err(|e| untrusted(e.to_string()))?;
    let ours: Vec<String> = store.tables().keys().cloned().collect();
    if offer.tables != ours {
        return Err(untrusted(format!(
            "it shares tables {:?}, this organization {ours:?}",
            offer.tables
        )));
    }
    Ok(())
}

/// Fetches the state of a checked `offer` from `peer` (steps 2–4 of the module docs).
pub(crate) async fn fetch<B: Backend>(
    store: &Store<B>,
    ctx: &VoteContext,
    peer: &dyn StatePeer,
    offer: &StateOffer,
) -> Result<Fetched, PeerError> {
    let untrusted = PeerError::Untrusted;
    let block = offer.entry.block.clone();
    let c = block.number;
    let tail = store.ledger_tail().await?;
    let mut entries = Vec::new();
    match tail {
        Some((t, hash)) if t >= c => {
            let ours = ledger::entry(store, c).await?;
            if ours.block.hash() != block.hash() {
                return Err(untrusted(format!(
                    "its block {c} has hash {}, this ledger's {} (two certified blocks: a safety violation)",
                    block.hash(),
                    hash
                )));
            }
        }
        _ => {
            let (after, mut previous) = tail.unwrap_or((BlockNumber(0), Digest::ZERO));
            let mut from = BlockNumber(after.0 + 1);
            while from <= c {
                let to = BlockNumber((from.0 + LEDGER_CHUNK - 1).min(c.0));
                let chunk = peer.ledger(from, to).await?;
                if chunk.is_empty() {
                    return Err(untrusted(format!(
                        "it sent no ledger entries for blocks {from}..={to}"
                    )));
                }
                // Each chunk as it comes: a peer sending entries that do not chain is refused
                // before the next is asked for, not after it has filled the memory.
                verify_ledger_from(
                    from,
                    previous,
                    chunk.iter().map(|e| (&e.block, &e.certificate)),
                    ctx,
                )
                .map_err(|e| untrusted(format!("its ledger entries: {e}")))?;
                previous = chunk.last().map_or(previous, |e| e.block.hash());
                from = BlockNumber(from.0 + chunk.len() as u64);
                entries.extend(chunk);
            }
            if entries.last().map(|e| e.block.hash()) != Some(block.hash()) {
                return Err(untrusted(format!(
                    "its ledger entries do not end at block {c}"
                )));
            }
        }
    }
    // Steps 3 and 4: compare trees, fetch what differs; all of it once if the sum is wrong.
    let mut patches = fetch_ranges(store, peer, c, false).await?;
    if sum(&patches) != block.state_digest {
        tracing::warn!(peer = %peer.org(), block = %c,
            "the ranges that differ do not lead to the agreed state; fetching every range");
        patches = fetch_ranges(store, peer, c, true).await?;
        let found = sum(&patches);
        if found != block.state_digest {
            return Err(untrusted(format!(
                "its rows make state {found}, not the agreed {} of block {c}",
                block.state_digest
            )));
        }
    }
    let ranges = patches.values().map(|p| p.patch.ranges.len()).sum();
    let rows = patches.values().map(|p| p.patch.rows.len()).sum();
    let adopted = entries
        .iter()
        .map(|e| AdoptedBlock {
            number: e.block.number,
            hash: e.block.hash(),
            previous: e.block.hash_previous,
            entry: chainify_proto::ledger::encode(e),
            // Only the ids that passed validation are recorded against replays (as the
            // executor records them): a replayed id appears in the ledger again, flagged.
            tx_ids: e
                .block
                .tx_ids
                .iter()
                .zip(&e.block.valid)
                .filter(|(_, valid)| **valid)
                .map(|(id, _)| id.0)
                .collect(),
        })
        .collect();
    let adoption = Adoption {
        block: c,
        state: block.state_digest,
        hash_digest: block.hash_digest,
        success: block.success.clone(),
        patches: patches
            .into_iter()
            .filter(|(_, p)| !p.patch.ranges.is_empty())
            .map(|(t, p)| (t, p.patch))
            .collect(),
        ledger: adopted,
    };
    // What the store would refuse (a row outside the ranges asked for, a key twice, a bad
    // shape) is the peer's doing, found before anything is written.
    store
        .check_adoption(&adoption)
        .map_err(|e| untrusted(e.to_string()))?;
    Ok(Fetched {
        adoption,
        block,
        entries,
        ranges,
        rows,
    })
}

/// One table's share of a fetched state.
struct TablePart {
    patch: RangePatch,
    /// The table's accumulator: local rows outside the ranges plus the fetched ones.
    state: StateHash,
}

fn sum(parts: &BTreeMap<String, TablePart>) -> Digest {
    let mut total = StateHash::empty();
    for p in parts.values() {
        total.combine(&p.state);
    }
    total.digest()
}

async fn fetch_ranges<B: Backend>(
    store: &Store<B>,
    peer: &dyn StatePeer,
    c: BlockNumber,
    every_range: bool,
) -> Result<BTreeMap<String, TablePart>, PeerError> {
    let mut out = BTreeMap::new();
    for (name, t) in store.tables().iter() {
        // Fetching every range keeps no local row: no need to read them.
        let offered = || OfferedTable {
            block: c,
            table: name.clone(),
        };
        let (differing, mut state): (Vec<u32>, StateHash) = if every_range {
            ((0..LEAVES).collect(), StateHash::empty())
        } else {
            let local = store.range_tree(name, None).await?;
            let digests = local.digests();
            let mut walk = Descent::new(&digests);
            while !walk.is_done() {
                let answer = peer.digests(offered(), walk.asking().to_vec()).await?;
                walk.answer(&answer)
                    .map_err(|e| PeerError::Untrusted(format!("table {name}: {e}")))?;
            }
            let mut kept = local.total();
            for r in walk.differing() {
                kept.subtract(&local.leaf(*r));
            }
            (walk.differing().to_vec(), kept)
        };
        let mut rows = Vec::new();
        if !differing.is_empty() {
            rows = peer.rows(offered(), differing.clone()).await?;
            let width = t.columns.len();
            for (i, row) in rows.iter().enumerate() {
                if row.len() != width {
                    return Err(PeerError::Untrusted(format!(
                        "table {name} row {i}: {} values for {width} columns",
                        row.len()
                    )));
                }
                state.add(&RowHash::of(name, row));
            }
        }
        out.insert(
            name.clone(),
            TablePart {
                patch: RangePatch {
                    ranges: differing.into_iter().collect(),
                    rows,
                },
                state,
            },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_peers_own_failures_count_against_it_and_every_failure_is_named_by_org() {
        assert!(PeerError::Untrusted("its rows make state x".into()).is_peers_fault());
        assert!(PeerError::NoOffer.is_peers_fault());
        assert!(PeerError::TransferTimeout(Duration::from_secs(1)).is_peers_fault());
        assert!(PeerError::Serve(ServeError::Refused("no".into())).is_peers_fault());
        let ours = PeerError::from(StorageError::Checkpoint("disk full".into()));
        assert!(!ours.is_peers_fault());
        let refused = PeerError::from(StorageError::Transfer("row 3 appears twice".into()));
        assert!(
            refused.is_peers_fault(),
            "a refused adoption is the peer's data"
        );
        let failed = TransferError::Failed(vec![(OrgId(2), PeerError::NoOffer), (OrgId(3), ours)]);
        assert_eq!(
            failed.to_string(),
            "org2: no checkpoint to offer; org3: checkpoint: disk full"
        );
        assert_eq!(
            TransferError::NoPeers.to_string(),
            "no other organization is reachable"
        );
    }
}
