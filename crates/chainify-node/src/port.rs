//! Where a node's blocks are executed: the [`ExecutionServer`] in the same process
//! ([`LocalExecution`]) or in the organization's execution process (`chainify node --component
//! execution`, reached over gRPC by `chainify-net`).
//!
//! Everything that changes the shared tables goes through the port (executing a block, taking,
//! restoring and pruning checkpoints), one operation at a time, so a restore never overlaps an
//! execution even when the node gave up waiting for one. The node passes the hash each
//! LedgerBlock chains to, so an execution process keeps no chain state of its own and may
//! restart at any time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chainify_core::tx::TransactionBlock;
use chainify_core::{BlockNumber, Digest};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use chainify_storage::{Backend, StateCheck, StorageError, Store, TriggerFault};
use futures_util::FutureExt;
use tokio::sync::Mutex;

use crate::execution::{Executed, ExecutionError, ExecutionServer, LookAhead};
use crate::metrics::{Metrics, Phase};

/// A boxed future of the port (the trait is used as `Arc<dyn ExecutionPort>`).
pub type PortFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ExecutionError>> + Send + 'a>>;

/// What became of the checkpoint asked for after a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checkpoint {
    /// None was asked for.
    NotAsked,
    /// Taken.
    Taken,
    /// Taking it failed; the block stands. The reason is text because it may come over the
    /// ExecutionService from the execution process.
    Skipped {
        /// Why.
        reason: String,
    },
}

/// An executed block, and whether the checkpoint asked for was taken.
#[derive(Debug, Clone)]
pub struct PortExecuted {
    /// The block as executed.
    pub executed: Executed,
    /// The checkpoint asked for.
    pub checkpoint: Checkpoint,
    /// Integrity findings since the last block (each reported once while it lasts): digest
    /// triggers found broken and reinstalled, foreign triggers, a full scan that differs.
    pub integrity: Vec<String>,
    /// A full scan found the tables differ from the state digest: they need a repair.
    pub repair_needed: bool,
}

/// A block to execute, and what to do with the state after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockJob {
    /// The ordered block.
    pub block: TransactionBlock,
    /// The hash of the LedgerBlock before it: its LedgerBlock chains to this.
    pub previous: Digest,
    /// Take a checkpoint of the resulting state.
    pub checkpoint: bool,
    /// Start a full scan against the state digest in the background (its finding comes with a
    /// later block).
    pub state_check: bool,
}

/// Executes blocks and manages checkpoints on the organization's database.
pub trait ExecutionPort: Send + Sync + std::fmt::Debug + 'static {
    /// Executes a [`BlockJob`]. Before every block the digest triggers are checked in the
    /// catalog and reinstalled when broken. Running a block again returns its stored outcome.
    fn execute(&self, job: BlockJob) -> PortFuture<'_, PortExecuted>;

    /// Restores the database to checkpoint `block`: the keys recorded as changed since, or,
    /// with `full` (the agreed state digest of `block`), every row after checking that the
    /// checkpoint holds exactly that state.
    fn restore(&self, block: BlockNumber, full: Option<Digest>) -> PortFuture<'_, ()>;

    /// Keeps the newest `keep` checkpoints.
    fn prune_checkpoints(&self, keep: usize) -> PortFuture<'_, ()>;

    /// Returns once every operation started through the port has finished (an execution the
    /// node stopped waiting for included). Until its next call the node may then change the
    /// database itself: it adopts a transferred state that way, which no single call could
    /// carry.
    fn settle(&self) -> PortFuture<'_, ()>;

    /// Starts validating and analysing `block` while the block before it executes, without the
    /// database, so that executing it finds that work done (its signatures remembered, its
    /// analyses kept; the next `execute` waits for it). It changes nothing, and `execute`
    /// trusts nothing from it beyond what a transaction id commits to. The default does
    /// nothing: an execution process prepares when it executes.
    fn prepare_ahead(&self, block: &TransactionBlock) {
        let _ = block;
    }
}

/// The ExecutionServer in this process.
#[derive(Debug)]
pub struct LocalExecution<B: Backend> {
    store: Arc<Store<B>>,
    server: Arc<Mutex<ExecutionServer<B>>>,
    ahead: LookAhead,
    /// Look-aheads under way, by block: that block's execution waits for its own rather than
    /// repeat its work.
    preparing: std::sync::Mutex<BTreeMap<BlockNumber, tokio::task::JoinHandle<()>>>,
    metrics: Arc<Metrics>,
    integrity: std::sync::Mutex<Integrity>,
}

/// A full scan's task: its verdict and how long it took, or how the task ended.
type ScanTask = tokio::task::JoinHandle<(Result<StateCheck, StorageError>, Duration)>;
type JoinedScan = Result<(Result<StateCheck, StorageError>, Duration), tokio::task::JoinError>;

/// A full scan whose recorded state is held against the ledger: the accumulators the scan
/// trusts must give the state digest the organizations certified for the ledger's newest block
/// (a DBA can rewrite `chainify_state`, not the certificate). A mismatch is a finding the scan
/// reports as a table that differs (`chainify_state`), so a repair follows.
async fn scan_against_ledger<B: Backend>(
    store: &Store<B>,
    ctx: &chainify_core::votes::VoteContext,
    definitions: bool,
) -> Result<StateCheck, StorageError> {
    let mut check = store.check_state_with(definitions).await?;
    if let (Some(first), Some(last)) = (check.stray_states.first(), check.stray_states.last()) {
        check.differing.push(format!(
            "chainify_state (accumulators for blocks {first}..={last}, past the newest applied block)"
        ));
    }
    // The newest applied block runs at most this far ahead of the ledger: the block being
    // voted on and the one executed meanwhile. Further is a block that was never agreed.
    const AHEAD: u64 = 2;
    let (applied, ledger) = (check.block, check.ledger_block);
    let behind = match (applied, ledger) {
        (Some(a), Some(l)) => a.0.saturating_sub(l.0),
        (Some(a), None) => a.0,
        _ => 0,
    };
    if behind > AHEAD {
        check.differing.push(format!(
            "chainify_applied_blocks (block {} is applied, {behind} past the ledger's {})",
            applied.map_or(0, |b| b.0),
            ledger.map_or("start".into(), |b| b.to_string())
        ));
    }
    let Some(block) = ledger else {
        return Ok(check);
    };
    let Some(recorded) = check.ledger_state else {
        check.differing.push(format!(
            "chainify_state (no accumulators for ledger block {block})"
        ));
        return Ok(check);
    };
    let problem = match crate::ledger::entry(store, block).await {
        Err(crate::ledger::LedgerError::Storage(e)) => return Err(e),
        Err(e) => Some(e.to_string()),
        Ok(entry) => {
            if entry.certificate.block != block
                || entry.certificate.ledger_block_hash != entry.block.hash()
            {
                Some(format!(
                    "ledger block {block}'s certificate is not for the block stored with it"
                ))
            } else if let Err(e) = chainify_core::votes::verify_certificate(&entry.certificate, ctx)
            {
                Some(format!("ledger block {block}: {e}"))
            } else if entry.block.state_digest != recorded {
                Some(format!(
                    "the recorded state of block {block} ({recorded}) is not the state the organizations agreed ({}): chainify_state was changed, or this organization computed the block otherwise",
                    entry.block.state_digest
                ))
            } else {
                None
            }
        }
    };
    if let Some(problem) = problem {
        check.differing.push(format!("chainify_state ({problem})"));
    }
    Ok(check)
}

/// The integrity checks' state between blocks.
#[derive(Debug, Default)]
struct Integrity {
    /// The full scan under way, and how long it took once done.
    scan: Option<ScanTask>,
    /// Trigger findings reported already (reported again only after they cleared).
    reported: BTreeSet<String>,
    /// When the next full scan starts.
    schedule: ScanSchedule,
    /// Findings not reported yet: they go out with the next block that succeeds.
    pending: Vec<String>,
    /// A full scan found the tables differ: reported with the next block that succeeds.
    repair_needed: bool,
    /// When a full scan last read the shared tables' definitions again.
    definitions_read: Option<Instant>,
}

/// How often a full scan also reads the shared tables' definitions from the catalog (a dozen
/// catalog queries a table, tens of milliseconds of a MariaDB server's CPU each time: with
/// every scan it cost a MariaDB organization 10 % of its throughput).
const DEFINITIONS_EVERY: Duration = Duration::from_secs(60);

/// A periodic full scan rests after the previous one for this many times its length, so scans
/// take at most a fifth of the time whatever the table size and block rate. (At 10⁶ accounts a
/// scan of SQLite's 3·10⁶ rows costs ~5 s of a core; one every 100 blocks took most of a core.)
const SCAN_REST_FACTOR: u32 = 4;

/// How often a check that must wait for the running scan looks again.
const SCAN_POLL: Duration = Duration::from_millis(5);

/// At most this many findings wait for a block to succeed.
const MAX_PENDING_FINDINGS: usize = 64;

/// When full scans start: a periodic one asked for while a scan runs or rests waits for it; a
/// scan asked for because a trigger was broken starts at the next chance. A new schedule (a
/// process that started, an execution process that restarted) scans with its first block.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ScanSchedule {
    /// A periodic scan is asked for and not started yet.
    wanted: bool,
    /// A trigger was broken: scan at the next chance, whatever the rest.
    urgent: bool,
    /// Periodic scans start from this time on (`None`: at once).
    rest_until: Option<Instant>,
}

impl Default for ScanSchedule {
    fn default() -> Self {
        ScanSchedule {
            wanted: true,
            urgent: false,
            rest_until: None,
        }
    }
}

impl ScanSchedule {
    /// Whether to start a scan before a block at `now`; `periodic` (the pipeline's interval or
    /// the first block after start) and `trigger_broken` are asked with this block, `running`
    /// tells whether a scan is under way.
    fn start(&mut self, now: Instant, periodic: bool, trigger_broken: bool, running: bool) -> bool {
        self.wanted |= periodic;
        self.urgent |= trigger_broken;
        let rested = self.rest_until.is_none_or(|t| now >= t);
        if running || !(self.urgent || (self.wanted && rested)) {
            return false;
        }
        self.wanted = false;
        self.urgent = false;
        true
    }

    /// A scan that took `took` was collected at `now`.
    fn finished(&mut self, now: Instant, took: Duration) {
        self.rest_until = Some(now + took * SCAN_REST_FACTOR);
    }
}

impl<B: Backend> LocalExecution<B> {
    /// Checks the digest triggers (reinstalling broken ones), collects a finished full scan
    /// and starts one when asked or when a trigger was broken. What to report is kept until a
    /// block succeeds ([`Integrity::pending`]). Fails when a broken trigger could not be
    /// reinstalled: the block must not run without it (it is tried again).
    async fn check_integrity(
        &self,
        block: BlockNumber,
        state_check: bool,
    ) -> Result<(), ExecutionError> {
        let mut findings = Vec::new();
        let triggers = self.store.check_triggers().await;
        let mut current = BTreeSet::new();
        let mut broken: Vec<String> = Vec::new();
        // The block runs only with its triggers known whole: a check that fails fails the block
        // (it is tried again) and asks for a scan at once.
        let mut failure = None;
        match triggers {
            Ok(problems) => {
                for p in problems {
                    match p.fault {
                        TriggerFault::Unexpected => {}
                        // Nothing chainify may undo: the block waits until a DBA removes it.
                        TriggerFault::Shadows => {
                            failure = Some(StorageError::DefinitionChanged(p.to_string()));
                        }
                        _ if !broken.contains(&p.table) => broken.push(p.table.clone()),
                        _ => {}
                    }
                    current.insert(p.to_string());
                }
            }
            Err(e) => {
                findings.push(format!(
                    "before block {block}: checking the digest triggers failed: {e}"
                ));
                failure = Some(e);
            }
        }
        if !broken.is_empty() {
            // A running scan's snapshot holds locks on the tables it read (PostgreSQL, MariaDB)
            // that `DROP TRIGGER` waits for: let it finish first. Stopping it instead would let
            // whoever breaks a trigger before every block keep any scan from finishing. The
            // handle stays in the state while waiting, so a cancelled check loses nothing.
            while self
                .lock_integrity()
                .scan
                .as_ref()
                .is_some_and(|s| !s.is_finished())
            {
                tokio::time::sleep(SCAN_POLL).await;
            }
            let names: Vec<&str> = broken.iter().map(String::as_str).collect();
            match self.store.reinstall_triggers(&names).await {
                Ok(()) => findings.push(format!(
                    "before block {block}: reinstalled the digest triggers of {}; changes made meanwhile are checked by a full scan",
                    broken.join(", ")
                )),
                Err(e) => {
                    findings.push(format!(
                        "before block {block}: reinstalling the digest triggers of {} failed: {e}",
                        broken.join(", ")
                    ));
                    failure = Some(e);
                }
            }
            self.metrics.trigger_repairs.fetch_add(1, Ordering::Relaxed);
        }
        let mut state = self.lock_integrity();
        for finding in &current {
            if !state.reported.contains(finding) {
                findings.push(format!("before block {block}: {finding}"));
            }
        }
        // A trigger still broken is reported again once a block succeeds.
        if failure.is_none() {
            state.reported = current;
        }
        if state.scan.as_ref().is_some_and(|s| s.is_finished())
            && let Some(scan) = state.scan.take()
            && let Some(joined) = scan.now_or_never()
        {
            self.absorb(&mut state, joined, &mut findings);
        }
        let running = state.scan.is_some();
        if state.schedule.start(
            Instant::now(),
            state_check,
            !broken.is_empty() || failure.is_some(),
            running,
        ) {
            let store = self.store.clone();
            let ctx = chainify_core::votes::VoteContext::of(self.ahead.network());
            let now = Instant::now();
            let definitions = state
                .definitions_read
                .is_none_or(|at| now.duration_since(at) >= DEFINITIONS_EVERY);
            if definitions {
                state.definitions_read = Some(now);
            }
            state.scan = Some(tokio::spawn(async move {
                let started = Instant::now();
                (
                    scan_against_ledger(&store, &ctx, definitions).await,
                    started.elapsed(),
                )
            }));
        }
        for finding in findings {
            // A block tried again and again adds the same findings: keep each once, and a few.
            if !state.pending.contains(&finding) && state.pending.len() < MAX_PENDING_FINDINGS {
                state.pending.push(finding);
            }
        }
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Takes in a finished full scan: its verdict, and how long it took.
    fn absorb(&self, state: &mut Integrity, joined: JoinedScan, findings: &mut Vec<String>) {
        self.metrics.state_checks.fetch_add(1, Ordering::Relaxed);
        let (result, took) = match joined {
            Ok(done) => done,
            Err(e) => {
                findings.push(format!("the full scan failed: {e}"));
                return;
            }
        };
        // A scan that failed sets no rest: the next periodic request starts one.
        if result.is_ok() {
            state.schedule.finished(Instant::now(), took);
        }
        if let Ok(check) = &result {
            // No restore repairs a definition: it is reported, and the vote stops what it
            // makes this organization compute otherwise.
            for change in &check.changed_definitions {
                self.metrics
                    .definition_changes
                    .fetch_add(1, Ordering::Relaxed);
                findings.push(format!(
                    "full scan: {change}; the organizations must agree on schema changes: restore the definition"
                ));
            }
        }
        match result {
            Ok(check) if check.differing.is_empty() => {
                tracing::info!(block = ?check.block, rows = check.rows, "full scan agrees with the state digest");
            }
            Ok(check) => {
                self.metrics
                    .state_mismatches
                    .fetch_add(1, Ordering::Relaxed);
                state.repair_needed = true;
                findings.push(format!(
                    "full scan after block {}: table(s) {} differ from the state digest (expected {}, scanned {} over {} rows)",
                    check.block.map_or("-".into(), |b| b.to_string()),
                    check.differing.join(", "),
                    check.expected,
                    check.actual,
                    check.rows
                ));
            }
            Err(e) => findings.push(format!("the full scan failed: {e}")),
        }
    }

    fn lock_integrity(&self) -> std::sync::MutexGuard<'_, Integrity> {
        self.integrity.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The findings and repair verdict kept since the last block that succeeded.
    fn take_findings(&self) -> (Vec<String>, bool) {
        let mut state = self.lock_integrity();
        (
            std::mem::take(&mut state.pending),
            std::mem::take(&mut state.repair_needed),
        )
    }
}

impl<B: Backend> Drop for LocalExecution<B> {
    fn drop(&mut self) {
        let state = self.integrity.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(scan) = state.scan.take() {
            scan.abort();
        }
    }
}

impl<B: Backend> LocalExecution<B> {
    /// A port over `server`, which executes on `store`, recording its phases in `metrics`.
    pub fn new(
        store: Arc<Store<B>>,
        server: ExecutionServer<B>,
        metrics: Arc<Metrics>,
    ) -> LocalExecution<B> {
        LocalExecution {
            store,
            ahead: server.look_ahead(),
            preparing: std::sync::Mutex::default(),
            server: Arc::new(Mutex::new(server)),
            metrics,
            integrity: std::sync::Mutex::new(Integrity::default()),
        }
    }
}

impl<B: Backend> ExecutionPort for LocalExecution<B> {
    fn execute(&self, job: BlockJob) -> PortFuture<'_, PortExecuted> {
        let BlockJob {
            block,
            previous,
            checkpoint,
            state_check,
        } = job;
        Box::pin(async move {
            let preparing = {
                let mut under_way = self.preparing.lock().unwrap_or_else(|e| e.into_inner());
                let later = under_way.split_off(&BlockNumber(block.number.0.saturating_add(1)));
                let this = under_way.remove(&block.number);
                *under_way = later;
                this
            };
            if let Some(preparing) = preparing {
                // It only warms what `prepare` checks anyway: a failure loses nothing.
                let _ = preparing.await;
            }
            // Dropping this future cuts the block short as a crash would; the store resumes it.
            let mut server = self.server.lock().await;
            // The trigger check is a catalog read: it overlaps validation, and both finish
            // before the block's first statement runs.
            let (checked, prepared) = tokio::join!(
                self.check_integrity(block.number, state_check),
                server.prepare(&block)
            );
            checked?;
            let executed = server.run(prepared?, previous).await?;
            let outcome = &executed.outcome;
            let m = &self.metrics;
            m.observe(Phase::Validate, executed.validate_time);
            m.observe(Phase::Analyse, executed.analyse_time);
            m.analysed_ahead
                .fetch_add(executed.analysed_ahead as u64, Ordering::Relaxed);
            // A block run again returns its stored outcome: nothing was executed or digested.
            if !(outcome.execute_time.is_zero() && outcome.digest_time.is_zero()) {
                m.observe(Phase::Execute, outcome.execute_time);
                m.observe(Phase::Digest, outcome.digest_time);
            }
            if let Some(first) = outcome.barriers.first() {
                m.graph_barriers
                    .fetch_add(outcome.barriers.len() as u64, Ordering::Relaxed);
                tracing::warn!(block = %block.number, first, count = outcome.barriers.len(), "transactions whose accesses cost the dependency graph more than their share ran as barriers: after every transaction before them, before every one after");
            }
            let checkpoint = if checkpoint {
                let taking = Instant::now();
                let taken = match self.store.checkpoint(block.number).await {
                    Ok(_) => Checkpoint::Taken,
                    Err(e) => Checkpoint::Skipped {
                        reason: e.to_string(),
                    },
                };
                m.observe(Phase::Checkpoint, taking.elapsed());
                taken
            } else {
                Checkpoint::NotAsked
            };
            let (integrity, repair_needed) = self.take_findings();
            Ok(PortExecuted {
                executed,
                checkpoint,
                integrity,
                repair_needed,
            })
        })
    }

    fn restore(&self, block: BlockNumber, full: Option<Digest>) -> PortFuture<'_, ()> {
        Box::pin(async move {
            let _busy = self.server.lock().await;
            match full {
                None => self.store.restore(block).await?,
                Some(agreed) => self.store.restore_full(block, agreed).await?,
            };
            Ok(())
        })
    }

    fn prune_checkpoints(&self, keep: usize) -> PortFuture<'_, ()> {
        Box::pin(async move {
            let _busy = self.server.lock().await;
            self.store.prune_checkpoints(keep).await?;
            Ok(())
        })
    }

    fn settle(&self) -> PortFuture<'_, ()> {
        Box::pin(async move {
            drop(self.server.lock().await);
            Ok(())
        })
    }

    fn prepare_ahead(&self, block: &TransactionBlock) {
        let (ahead, block) = (self.ahead.clone(), block.clone());
        self.metrics.prepared_ahead.fetch_add(1, Ordering::Relaxed);
        let number = block.number;
        let preparing = tokio::task::spawn_blocking(move || ahead.prepare(&block));
        let mut under_way = self.preparing.lock().unwrap_or_else(|e| e.into_inner());
        under_way.insert(number, preparing);
        // As the analyses kept: a block numbered far ahead goes first.
        while under_way.len() > 4 {
            under_way.pop_last();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SQLite store whose blocks 0..=`applied` are applied and whose ledger holds block 1
    /// with `state` as its agreed state digest (`None`: the recorded one) and a certificate of
    /// `voters` under any-2.
    async fn ledgered(
        name: &str,
        applied: u64,
        state: Option<Digest>,
        voters: &[u32],
    ) -> (
        Store<chainify_storage::Sqlite>,
        chainify_core::votes::VoteContext,
    ) {
        use chainify_core::testing::SeededNet;
        use chainify_core::tx::{LedgerBlock, LedgerEntry};
        use chainify_testkit::conformance::storage::{random_block, setup};
        use chainify_testkit::engines::SqliteFixture;
        let store = setup(
            &SqliteFixture,
            name,
            chainify_storage::StoreOptions::default(),
        )
        .await;
        for b in 0..=applied {
            store
                .execute_block(
                    &random_block(&store, b, b + 1, 5),
                    chainify_storage::ExecMode::Serial,
                )
                .await
                .expect("a block");
        }
        let n = SeededNet::new(3, "any-2", chainify_core::crypto::Signatures::Ed25519);
        let block = LedgerBlock {
            network: n.ctx.network.clone(),
            number: BlockNumber(1),
            tx_ids: vec![],
            success: vec![],
            valid: vec![],
            hash_digest: Digest::of(b"effects"),
            state_digest: match state {
                Some(s) => s,
                None => store.state_digest_at(BlockNumber(1)).await.expect("state"),
            },
            hash_previous: Digest::ZERO,
            orderer_position: 1,
        };
        let entry = LedgerEntry {
            certificate: n.certificate(voters, &block),
            block,
        };
        crate::ledger::append(&store, &entry).await.expect("append");
        (store, n.ctx)
    }

    /// What the scan trusts is tied to the certified ledger: the recorded state of the ledger's
    /// newest block must be the agreed one under a certificate that verifies, an applied block
    /// may run at most two past the ledger, and accumulators past the newest applied block are
    /// named. Each is reported as a table that differs, so a repair follows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_scan_holds_the_recorded_state_against_the_certified_ledger() {
        let differing = |check: &StateCheck| check.differing.join("; ");
        let (store, ctx) = ledgered("anchor_ok", 2, None, &[1, 2]).await;
        let check = scan_against_ledger(&store, &ctx, true).await.expect("scan");
        assert!(check.differing.is_empty(), "{check:?}");
        assert_eq!(check.ledger_block, Some(BlockNumber(1)));
        // Accumulators planted past the newest applied block.
        let mut conn = store.backend().acquire().await.expect("conn");
        chainify_storage::Conn::batch(
            &mut conn,
            "INSERT INTO chainify_state (block, table_name, lanes) SELECT 99, table_name, lanes FROM chainify_state WHERE block = 2",
        )
        .await
        .expect("plant");
        drop(conn);
        let check = scan_against_ledger(&store, &ctx, true).await.expect("scan");
        assert!(
            differing(&check).contains(
                "chainify_state (accumulators for blocks #99..=#99, past the newest applied block)"
            ),
            "{check:?}"
        );

        let (store, ctx) = ledgered("anchor_other", 1, Some(Digest::of(b"other")), &[1, 2]).await;
        let check = scan_against_ledger(&store, &ctx, true).await.expect("scan");
        assert!(
            differing(&check).contains("is not the state the organizations agreed"),
            "{check:?}"
        );

        let (store, ctx) = ledgered("anchor_unmet", 1, None, &[1]).await;
        let check = scan_against_ledger(&store, &ctx, true).await.expect("scan");
        assert!(
            differing(&check).contains("do not satisfy the agreement policy"),
            "{check:?}"
        );

        let (store, ctx) = ledgered("anchor_ahead", 4, None, &[1, 2]).await;
        let check = scan_against_ledger(&store, &ctx, true).await.expect("scan");
        assert!(
            differing(&check)
                .contains("chainify_applied_blocks (block 4 is applied, 3 past the ledger's #1)"),
            "{check:?}"
        );
    }

    #[test]
    fn periodic_scans_rest_four_times_their_length_and_broken_triggers_do_not_wait() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = ScanSchedule::default();
        assert!(
            s.start(at(0), false, false, false),
            "a new schedule scans with its first block"
        );
        assert!(!s.start(at(0), false, false, false), "nothing asked");
        s.finished(at(0), Duration::ZERO);
        assert!(s.start(at(0), true, false, false), "asked and rested");
        assert!(!s.start(at(10), true, false, true), "one scan at a time");
        // The scan took 100 ms: the request kept meanwhile waits until 400 ms after it.
        s.finished(at(110), Duration::from_millis(100));
        assert!(!s.start(at(200), false, false, false), "resting");
        assert!(!s.start(at(509), true, false, false), "still resting");
        assert!(
            s.start(at(510), false, false, false),
            "the kept request starts"
        );
        assert!(
            !s.start(at(520), false, false, false),
            "and is not repeated"
        );
        // A broken trigger starts one at once, resting or not, but not beside a running one.
        s.finished(at(600), Duration::from_millis(100));
        assert!(!s.start(at(601), false, true, true), "a scan runs");
        assert!(
            s.start(at(602), false, false, false),
            "the urgent scan is kept"
        );
        s.finished(at(700), Duration::from_millis(100));
        assert!(s.start(at(701), false, true, false), "urgent while resting");
    }
}
