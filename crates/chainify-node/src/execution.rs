//! The ExecutionServer (docs/design/overview.md §2.3).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use crate::admission::{ClientSignature, Refusal, check_proposal, check_proposal_cached};
use chainify_core::config::NetworkConfig;
use chainify_core::tx::{LedgerBlock, Proposal, TransactionBlock};
use chainify_core::validate::{BlockSignatures, validate_block};
use chainify_core::verify::Verifier;
use chainify_core::{BlockNumber, Digest, TxId};
use chainify_sql::{Analyzer, TxAnalysis};
use chainify_storage::{Backend, BlockOutcome, ExecBlock, ExecMode, ExecTx, StorageError, Store};

/// Why a block could not be executed (the block can be run again).
#[derive(Debug, thiserror::Error)]
pub enum ExecutionError {
    /// The storage layer failed (database gone, …).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The execution process failed or could not be reached (the block can be run again).
    #[error("execution component: {0}")]
    Remote(String),
    /// Something the block's validation needs could not be had at this organization now (a
    /// thread to analyse a transaction on): no verdict on the block, which is run again.
    #[error("block {block}: {problem}")]
    Unavailable {
        /// The block.
        block: chainify_core::BlockNumber,
        /// What could not be had, for which transaction.
        problem: String,
    },
    /// The block is not for this network.
    #[error("block {block} is for network {network}, not this one")]
    WrongNetwork {
        /// The block.
        block: chainify_core::BlockNumber,
        /// The network it names.
        network: String,
    },
    /// The execution process found its record of applied blocks damaged
    /// ([`StorageError::Damaged`], as it reported it).
    #[error("execution component: {0}")]
    Damaged(String),
}

impl ExecutionError {
    /// What is damaged, when the block cannot run because the record of applied blocks was
    /// changed behind chainify: running it again fails the same way, a repair (a checkpoint
    /// restored) rewrites the record.
    pub fn damage(&self) -> Option<String> {
        match self {
            ExecutionError::Storage(e @ StorageError::Damaged { .. }) => Some(e.to_string()),
            ExecutionError::Damaged(what) => Some(what.clone()),
            _ => None,
        }
    }
}

/// A block as this organization executed it.
#[derive(Debug, Clone)]
pub struct Executed {
    /// What the organization votes on.
    pub ledger: LedgerBlock,
    /// The executor's outcome (timings, abort reasons, retries).
    pub outcome: BlockOutcome,
    /// Transactions flagged invalid before execution, with the reason.
    pub invalid: Vec<(usize, String)>,
    /// Time spent validating the block (zero when the block came back over the
    /// ExecutionService: the execution process records its own).
    pub validate_time: std::time::Duration,
    /// Time spent analysing its SQL (likewise).
    pub analyse_time: std::time::Duration,
    /// Transactions whose analysis was made ahead, while the block before executed.
    pub analysed_ahead: usize,
}

/// A block validated and analysed, not yet executed.
#[derive(Debug)]
pub(crate) struct Prepared {
    network: chainify_core::NetworkId,
    orderer_position: u64,
    exec: ExecBlock,
    ids: Vec<TxId>,
    valid: Vec<bool>,
    invalid: Vec<(usize, String)>,
    validate_time: std::time::Duration,
    analyse_time: std::time::Duration,
    analysed_ahead: usize,
}

/// Analyses made ahead, by transaction id: an analysis depends only on the proposal's body,
/// which its id is the hash of, and on the schema and network this server was made with.
type Analysed = HashMap<TxId, Result<TxAnalysis, Refusal>>;

/// Blocks whose analyses are kept at most (the node looks one block ahead; the one before may
/// not have started executing yet).
const KEPT_AHEAD: usize = 4;

/// What validates and analyses a block ahead of its execution, without the database: it
/// checks the block's signatures into the organization's verifier (which remembers them) and
/// keeps the analyses of its transactions for [`ExecutionServer::prepare`], by block number.
#[derive(Debug, Clone)]
pub struct LookAhead {
    network: Arc<NetworkConfig>,
    analyzer: Arc<Analyzer>,
    verifier: Arc<Verifier>,
    analysed: Arc<Mutex<BTreeMap<BlockNumber, Analysed>>>,
}

impl LookAhead {
    /// The network the blocks belong to.
    pub(crate) fn network(&self) -> &Arc<NetworkConfig> {
        &self.network
    }

    /// Checks `block`'s signatures and analyses its transactions (CPU only: call it on the
    /// blocking pool). Nothing it finds is trusted later beyond what the id commits to.
    pub fn prepare(&self, block: &TransactionBlock) {
        if block.network != self.network.network_id {
            return;
        }
        let _ = BlockSignatures::of(block, &self.network).check(&self.verifier);
        let analysed = self.analyse(block.transactions.iter().map(|c| &c.proposal));
        let mut kept = self.lock();
        kept.insert(block.number, analysed);
        // The highest numbers go first: a block numbered far ahead (a forged one, which the
        // pipeline refuses) must not push out the next block's.
        while kept.len() > KEPT_AHEAD {
            kept.pop_last();
        }
    }

    /// [`check_proposal`] of each proposal, by id, its signature taken as verified (CPU only:
    /// on the blocking pool for anything not cached).
    fn analyse<'p>(&self, proposals: impl Iterator<Item = &'p Proposal>) -> Analysed {
        proposals
            .map(|proposal| {
                let analysis = check_proposal(
                    &self.network,
                    &self.analyzer,
                    proposal,
                    ClientSignature::Verified,
                );
                (proposal.tx_id(), analysis)
            })
            .collect()
    }

    /// The analyses kept for block `number`; those of earlier blocks are dropped (a block
    /// executes after the ones before it).
    fn take(&self, number: BlockNumber) -> Analysed {
        let mut kept = self.lock();
        let later = kept.split_off(&BlockNumber(number.0.saturating_add(1)));
        let this = kept.remove(&number).unwrap_or_default();
        *kept = later;
        this
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<BlockNumber, Analysed>> {
        self.analysed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Executes ordered blocks on one organization's database.
#[derive(Debug)]
pub struct ExecutionServer<B: Backend> {
    store: Arc<Store<B>>,
    mode: ExecMode,
    ahead: LookAhead,
}

impl<B: Backend> ExecutionServer<B> {
    /// A server over `store`. It keeps no chain state: the hash each LedgerBlock chains to is
    /// an argument of [`ExecutionServer::execute`]. `verifier` is the organization's: shared
    /// with its admission, so a signature checked there is not checked again here.
    pub fn new(
        store: Arc<Store<B>>,
        network: Arc<NetworkConfig>,
        mode: ExecMode,
        verifier: Arc<Verifier>,
    ) -> Result<Self, ExecutionError> {
        let analyzer = Arc::new(Analyzer::new(store.schema()?));
        Ok(ExecutionServer {
            store,
            mode,
            ahead: LookAhead {
                network,
                analyzer,
                verifier,
                analysed: Arc::default(),
            },
        })
    }

    /// What prepares blocks ahead for this server, while it executes the one before.
    pub fn look_ahead(&self) -> LookAhead {
        self.ahead.clone()
    }

    /// Validates, analyses, executes and digests `block`, and builds its LedgerBlock chained to
    /// `previous` (the hash of the LedgerBlock before it; [`Digest::ZERO`] for block 1).
    pub async fn execute(
        &mut self,
        block: &TransactionBlock,
        previous: Digest,
    ) -> Result<Executed, ExecutionError> {
        let prepared = self.prepare(block).await?;
        self.run(prepared, previous).await
    }

    /// Validates and analyses `block` without writing anything: what may overlap other reads
    /// (the trigger check) before [`ExecutionServer::run`] changes the database. Replays are
    /// looked up among the applied blocks: the block before must be applied before this one is
    /// prepared (so the two stay crate-private, used back to back under the port's lock).
    pub(crate) async fn prepare(
        &self,
        block: &TransactionBlock,
    ) -> Result<Prepared, ExecutionError> {
        let network = &self.ahead.network;
        if block.network != network.network_id {
            return Err(ExecutionError::WrongNetwork {
                block: block.number,
                network: block.network.to_string(),
            });
        }
        let validating = std::time::Instant::now();
        // The signature checks are the CPU-heavy part: all at once, on the blocking pool (which
        // spreads them over the cores), while the ledger lookup runs; unless the block is small
        // and every signature was checked before, which hashing finds in place.
        let verifier = self.ahead.verifier.clone();
        let signatures = BlockSignatures::of(block, network);
        let ids = signatures.ids().to_vec();
        let checking = match signatures.remembered(&verifier) {
            Ok(verdicts) => Ok(verdicts),
            Err(signatures) => Err(tokio::task::spawn_blocking(move || {
                signatures.check(&verifier)
            })),
        };
        let known: BTreeSet<TxId> = self.store.known_transactions(block.number, &ids).await?;
        let verdicts = match checking {
            Ok(verdicts) => verdicts,
            Err(checking) => checking.await.map_err(|e| {
                ExecutionError::Remote(format!("checking block {}'s signatures: {e}", block.number))
            })?,
        };
        let validation = validate_block(block, network, &verdicts, |id| known.contains(id));
        let validate_time = validating.elapsed();
        let analysing = std::time::Instant::now();
        let mut ahead = self.ahead.take(block.number);
        // What was not analysed ahead (the first block after a pause; every block on a split
        // execution service) is analysed on the blocking pool, unless its analysis takes
        // lookups only: new shapes take milliseconds each, which on a worker would hold back
        // the organization's votes and clients.
        let mut missing: Vec<Proposal> = Vec::new();
        let mut reused = 0;
        for (verdict, chained) in validation.iter().zip(&block.transactions) {
            let Ok(id) = verdict else { continue };
            if ahead.contains_key(id) {
                reused += 1;
            } else {
                match check_proposal_cached(
                    network,
                    &self.ahead.analyzer,
                    &chained.proposal,
                    ClientSignature::Verified,
                ) {
                    Some(checked) => {
                        ahead.insert(*id, checked);
                    }
                    None => missing.push(chained.proposal.clone()),
                }
            }
        }
        if !missing.is_empty() {
            let lookahead = self.ahead.clone();
            let analysed = tokio::task::spawn_blocking(move || lookahead.analyse(missing.iter()))
                .await
                .map_err(|e| {
                    ExecutionError::Remote(format!(
                        "analysing block {}'s transactions: {e}",
                        block.number
                    ))
                })?;
            ahead.extend(analysed);
        }
        let mut invalid = Vec::new();
        let mut txs = Vec::with_capacity(block.transactions.len());
        let mut valid_ids = Vec::new();
        let mut valid = Vec::with_capacity(block.transactions.len());
        for (index, (chained, verdict)) in block.transactions.iter().zip(validation).enumerate() {
            let id = match verdict {
                Ok(id) => id,
                Err(e) => {
                    invalid.push((index, e.to_string()));
                    txs.push(None);
                    valid.push(false);
                    continue;
                }
            };
            valid.push(true);
            valid_ids.push(id);
            // The admission checks again: the orderer is untrusted. Validation verified the
            // client's signature. The analysis made ahead for this id is the same.
            let checked = match ahead.remove(&id) {
                Some(checked) => checked,
                None => check_proposal(
                    network,
                    &self.ahead.analyzer,
                    &chained.proposal,
                    ClientSignature::Verified,
                ),
            };
            match checked {
                Ok(analysis) => txs.push(Some(ExecTx {
                    transaction: chained.proposal.body.transaction.clone(),
                    analysis,
                })),
                // Another organization may well analyse it: marking it invalid here alone
                // would set this organization's vote apart.
                Err(refusal @ Refusal::Unavailable { .. }) => {
                    return Err(ExecutionError::Unavailable {
                        block: block.number,
                        problem: format!("transaction {index}: {refusal}"),
                    });
                }
                Err(refusal) => {
                    invalid.push((index, refusal.to_string()));
                    txs.push(None);
                }
            }
        }
        let analyse_time = analysing.elapsed();
        Ok(Prepared {
            network: block.network.clone(),
            orderer_position: block.orderer_position,
            exec: ExecBlock {
                number: block.number,
                txs,
                tx_ids: valid_ids,
            },
            ids,
            valid,
            invalid,
            validate_time,
            analyse_time,
            analysed_ahead: reused,
        })
    }

    /// Executes and digests a block [`ExecutionServer::prepare`]d, and builds its LedgerBlock
    /// chained to `previous`.
    pub(crate) async fn run(
        &mut self,
        prepared: Prepared,
        previous: Digest,
    ) -> Result<Executed, ExecutionError> {
        let Prepared {
            network,
            orderer_position,
            exec,
            ids,
            valid,
            invalid,
            validate_time,
            analyse_time,
            analysed_ahead,
        } = prepared;
        let outcome = self.store.execute_block(&exec, self.mode).await?;
        let ledger = LedgerBlock {
            network,
            number: exec.number,
            tx_ids: ids,
            success: outcome.success.clone(),
            valid,
            hash_digest: outcome.digest,
            state_digest: outcome.state,
            hash_previous: previous,
            orderer_position,
        };
        Ok(Executed {
            ledger,
            outcome,
            invalid,
            validate_time,
            analyse_time,
            analysed_ahead,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::config::{GrantEntry, NetworkBuilder, PortPlan, StatementKind};
    use chainify_core::crypto::SigningKey;
    use chainify_core::tx::{ChainedTransaction, Proposal, ProposalBody, Statement, Transaction};
    use chainify_core::{ClientId, NetworkId};
    use chainify_sql::Schema;

    fn look_ahead() -> LookAhead {
        let mut b = NetworkBuilder::new("net", "any-1", PortPlan { base: 7010 });
        b.org(&SigningKey::from_seed(&[1; 32]).public_key(), "127.0.0.1");
        let grant = GrantEntry {
            table: "kv".into(),
            kinds: vec![StatementKind::Update],
        };
        b.client(
            "alice",
            &SigningKey::from_seed(&[42; 32]).public_key(),
            vec![grant],
        );
        let network = Arc::new(b.config("network.toml").expect("network"));
        let schema =
            Schema::from_sql("CREATE TABLE kv (k INT PRIMARY KEY, v INT)").expect("schema");
        LookAhead {
            verifier: Arc::new(Verifier::new(network.signatures)),
            network,
            analyzer: Arc::new(Analyzer::new(schema)),
            analysed: Arc::default(),
        }
    }

    fn block(number: u64, sql: &str) -> TransactionBlock {
        let body = ProposalBody {
            client: ClientId::new("alice").expect("client"),
            nonce: number,
            network: NetworkId::new("net").expect("network"),
            transaction: Transaction {
                statements: vec![Statement::new(sql, vec![])],
            },
        };
        let signature = SigningKey::from_seed(&[42; 32]).sign(&body.encode_canonical());
        TransactionBlock {
            network: body.network.clone(),
            number: BlockNumber(number),
            transactions: vec![ChainedTransaction {
                proposal: Proposal { body, signature },
                responses: vec![],
            }],
            orderer_position: number,
        }
    }

    /// What a look-ahead keeps is found by its block's execution (refusals too), dropped
    /// with the blocks before it, and bounded; blocks numbered far ahead (forged ones) never
    /// push out the next block's.
    #[test]
    fn analyses_made_ahead_are_kept_by_block_and_bounded() {
        let ahead = look_ahead();
        let fine = block(5, "UPDATE kv SET v = v + 1 WHERE k = 1");
        let refused = block(6, "DELETE FROM kv WHERE k = 1");
        ahead.prepare(&fine);
        ahead.prepare(&refused);
        let id = |b: &TransactionBlock| b.transactions[0].proposal.tx_id();
        let six = ahead.take(BlockNumber(6));
        assert!(six[&id(&refused)].is_err(), "the grant refusal is kept");
        assert!(
            ahead.take(BlockNumber(5)).is_empty(),
            "block 5's went with block 6's"
        );
        for n in 0..KEPT_AHEAD as u64 {
            ahead.prepare(&block(1_000_000 + n, "UPDATE kv SET v = 1 WHERE k = 2"));
        }
        let next = block(7, "UPDATE kv SET v = 2 WHERE k = 3");
        ahead.prepare(&next);
        let seven = ahead.take(BlockNumber(7));
        assert!(seven[&id(&next)].is_ok(), "the next block's analysis stays");
        assert!(ahead.lock().len() <= KEPT_AHEAD);
        // Another network's block is not analysed.
        let mut foreign = block(8, "UPDATE kv SET v = 3 WHERE k = 4");
        foreign.network = NetworkId::new("other").expect("network");
        ahead.prepare(&foreign);
        assert!(ahead.take(BlockNumber(8)).is_empty());
    }

    /// An analysis that cannot run here (no thread for it) is no verdict: the block fails at
    /// this organization and applies nothing, instead of being voted with the transaction
    /// marked invalid here alone; run again when the analysis can run, it commits.
    #[tokio::test]
    async fn an_analysis_that_cannot_run_here_fails_the_block_instead_of_the_transaction() {
        use chainify_core::OrgId;
        use chainify_core::tx::{EarlyAbortResponse, Verdict};
        use chainify_storage::{AnyBackend, StoreOptions};

        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}/unavailable.db", dir.path().display());
        let options = StoreOptions::default();
        let backend = AnyBackend::connect(&url, &options)
            .await
            .expect("SQLite opens");
        chainify_testkit::conformance::storage::outside(
            &backend,
            "CREATE TABLE kv (k BIGINT NOT NULL PRIMARY KEY, v BIGINT NOT NULL);\n\
             INSERT INTO kv VALUES (1, 10)",
        )
        .await;
        let store = Arc::new(
            Store::open(backend, options)
                .await
                .expect("the store opens"),
        );
        store.register(&["kv"]).await.expect("kv registers");
        let ahead = look_ahead();
        let mut server = ExecutionServer::new(
            store.clone(),
            ahead.network.clone(),
            ExecMode::Serial,
            ahead.verifier.clone(),
        )
        .expect("an execution server");
        let mut block = block(1, "UPDATE kv SET v = v + 1 WHERE k = 1");
        let id = block.transactions[0].proposal.tx_id();
        block.transactions[0].responses = vec![EarlyAbortResponse::new_signed(
            id,
            OrgId(1),
            Verdict::Accept,
            &SigningKey::from_seed(&[1; 32]),
        )];
        let working = server.ahead.analyzer.clone();
        server.ahead.analyzer =
            Arc::new(Analyzer::new(store.schema().expect("schema")).with_analysis_stack(1 << 60));
        let failed = server.execute(&block, Digest::ZERO).await.map(|e| e.ledger);
        let Err(ExecutionError::Unavailable {
            block: number,
            problem,
        }) = failed
        else {
            panic!("the block was not failed: {failed:?}");
        };
        assert_eq!(number, BlockNumber(1));
        assert!(
            problem.starts_with("transaction 0: analysing the transaction:")
                && problem.contains("no thread for the analysis at this organization"),
            "{problem}"
        );
        assert!(
            store
                .known_transactions(BlockNumber(2), &[id])
                .await
                .expect("the applied blocks")
                .is_empty(),
            "nothing of the block was applied"
        );
        server.ahead.analyzer = working;
        let executed = server
            .execute(&block, Digest::ZERO)
            .await
            .expect("the block runs once the analysis can");
        assert_eq!(executed.ledger.valid, vec![true]);
        assert_eq!(
            executed.ledger.success,
            vec![true],
            "{:?}",
            executed.invalid
        );
    }
}
