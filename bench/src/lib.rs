//! chainify's benchmarks.
//!
//! - The `chainify bench` harness: [`run`] (arguments, the measured run, the report), [`drive`]
//!   (workloads, closed-loop clients and the listener, shared with `chainify demo`), [`raw`]
//!   (the same streams straight on each engine), [`faults`] (tampering and crashes during a
//!   run), [`remote`] (a devnet of processes driven over gRPC, its layout in [`devnet`]) and
//!   [`svg`] (the report's picture).
//! - Fixtures for the Criterion micro-benchmarks of the pure crates (`benches/pure.rs`): the
//!   blocks the paper's evaluation uses, built deterministically so runs are comparable across
//!   machines and commits.
//! - The `storage-bench` and `recovery-bench` binaries, on real engines.
//!
//! Where it sits: the `chainify-bench` crate (not published), on top of the library crates and
//! `chainify-testkit`; the binary's `bench` command is a thin layer over [`run`]. Figures:
//! `bench/README.md`.

pub mod devnet;
pub mod drive;
pub mod faults;
pub mod raw;
pub mod remote;
pub mod run;
pub mod svg;

use chainify_core::tx::Transaction;
use chainify_sql::{Analyzer, Schema};
use chainify_workload::{KeyDistribution, SMALLBANK_SCHEMA, Smallbank};

/// Transactions per block in the paper's default configuration.
pub const BLOCK_TXS: usize = 4096;

/// Accounts in the Smallbank tables.
pub const ACCOUNTS: u64 = 100_000;

/// A Smallbank block with Zipf (s = 1.1) account choice.
pub fn smallbank_block_zipf(seed: u64) -> Vec<Transaction> {
    Smallbank::new(ACCOUNTS, &KeyDistribution::Zipf { s: 1.1, v: 0.0 }, seed).block(BLOCK_TXS)
}

/// A Smallbank block with uniform account choice.
pub fn smallbank_block_uniform(seed: u64) -> Vec<Transaction> {
    Smallbank::new(ACCOUNTS, &KeyDistribution::Uniform, seed).block(BLOCK_TXS)
}

/// A fresh analyzer (empty plan cache) over the Smallbank schema.
pub fn smallbank_analyzer() -> Analyzer {
    // The schema is a constant checked by tests; failing here is a programming error.
    Analyzer::new(
        Schema::from_sql(SMALLBANK_SCHEMA).unwrap_or_else(|e| panic!("Smallbank schema: {e}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_smallbank_transaction_analyses_to_point_sets() {
        let analyzer = smallbank_analyzer();
        for tx in smallbank_block_zipf(1).iter().take(512) {
            let a = analyzer.analyze(tx).unwrap();
            for (r, k) in a.rwset.reads.iter().chain(&a.rwset.writes) {
                match k {
                    chainify_core::rwset::KeySet::Ranges(ranges) => {
                        assert!(ranges.iter().all(|x| x.is_point(r.arity)), "{r:?} {k:?}")
                    }
                    chainify_core::rwset::KeySet::All => {
                        panic!("{} widened to the whole table", r.name)
                    }
                }
            }
        }
    }
}
