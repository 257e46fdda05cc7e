//! The ExecutionServer (docs/design/overview.md §2.3).

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::admission::{ClientSignature, check_proposal};
use chainify_core::config::NetworkConfig;
use chainify_core::tx::{LedgerBlock, TransactionBlock};
use chainify_core::validate::{BlockSignatures, validate_block};
use chainify_core::verify::Verifier;
use chainify_core::{Digest, TxId};
use chainify_sql::Analyzer;
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
    /// The block is not for this network.
    #[error("block {block} is for network {network}, not this one")]
    WrongNetwork {
        /// The block.
        block: chainify_core::BlockNumber,
        /// The network it names.
        network: String,
    },
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
}

/// Executes ordered blocks on one organization's database.
#[derive(Debug)]
pub struct ExecutionServer<B: Backend> {
    store: Arc<Store<B>>,
    network: Arc<NetworkConfig>,
    analyzer: Analyzer,
    mode: ExecMode,
    verifier: Arc<Verifier>,
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
        let analyzer = Analyzer::new(store.schema()?);
        Ok(ExecutionServer {
            store,
            network,
            analyzer,
            mode,
            verifier,
        })
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
        if block.network != self.network.network_id {
            return Err(ExecutionError::WrongNetwork {
                block: block.number,
                network: block.network.to_string(),
            });
        }
        let ids: Vec<TxId> = block
            .transactions
            .iter()
            .map(|t| t.proposal.tx_id())
            .collect();
        let validating = std::time::Instant::now();
        // The signature checks are the CPU-heavy part: all at once, on the blocking pool (which
        // spreads them over the cores), while the ledger lookup runs.
        let signatures = BlockSignatures::of(block, &self.network);
        let verifier = self.verifier.clone();
        let checking = tokio::task::spawn_blocking(move || signatures.check(&verifier));
        let known: BTreeSet<TxId> = self.store.known_transactions(block.number, &ids).await?;
        let verdicts = checking.await.map_err(|e| {
            ExecutionError::Remote(format!("checking block {}'s signatures: {e}", block.number))
        })?;
        let validation = validate_block(block, &self.network, &verdicts, |id| known.contains(id));
        let validate_time = validating.elapsed();
        let analysing = std::time::Instant::now();
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
            // client's signature.
            match check_proposal(
                &self.network,
                &self.analyzer,
                &chained.proposal,
                ClientSignature::Verified,
            ) {
                Ok(analysis) => txs.push(Some(ExecTx {
                    transaction: chained.proposal.body.transaction.clone(),
                    analysis,
                })),
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
        })
    }
}
