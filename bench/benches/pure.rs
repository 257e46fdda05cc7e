//! Criterion benchmarks of the pure pipeline stages on the paper's 4096-transaction Smallbank
//! block (100k accounts): SQL analysis cold and cached, DAG build, conflict pairs, scheduler
//! overhead, Ed25519 signing and verification, and policy evaluation.
//!
//! Run: `cargo bench -p chainify-bench` (or `just bench-pure`). Target from issue #2: cached
//! analysis + DAG for one block ≤ 5 ms on one core.

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;

use chainify_bench::{
    BLOCK_TXS, smallbank_analyzer, smallbank_block_uniform, smallbank_block_zipf,
};
use chainify_core::batch::{Roots, sign_leaves};
use chainify_core::crypto::{Signatures, SigningKey};
use chainify_core::policy::{AgreementPolicy, PolicySpec};
use std::ops::Bound::Included;

use chainify_core::rwset::{KeyRange, KeySet, KeyValue, ReadWriteSet, Resource};
use chainify_core::tx::{Proposal, ProposalBody, QueryAnswer};
use chainify_core::verify::verify_many;
use chainify_core::{ClientId, Digest, NetworkId, OrgId, Value};
use chainify_sched::{DependencyGraph, LanePlan, Step, TxExecutor, conflict_pairs, run_block};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

fn analysis(c: &mut Criterion) {
    let block = smallbank_block_zipf(1);
    let mut g = c.benchmark_group("analysis");
    g.throughput(Throughput::Elements(BLOCK_TXS as u64));
    g.bench_function("smallbank_4096_cold", |b| {
        b.iter_batched(
            smallbank_analyzer,
            |an| {
                for tx in &block {
                    black_box(an.analyze(tx).ok());
                }
            },
            BatchSize::LargeInput,
        )
    });
    let an = smallbank_analyzer();
    g.bench_function("smallbank_4096_cached", |b| {
        b.iter(|| {
            for tx in &block {
                black_box(an.analyze(tx).ok());
            }
        })
    });
    g.finish();
}

fn rwsets(block: &[chainify_core::tx::Transaction]) -> Vec<ReadWriteSet> {
    let an = smallbank_analyzer();
    block
        .iter()
        .filter_map(|tx| an.analyze(tx).ok().map(|a| a.rwset))
        .collect()
}

fn dag(c: &mut Criterion) {
    let mut g = c.benchmark_group("dag");
    g.throughput(Throughput::Elements(BLOCK_TXS as u64));
    for (name, block) in [
        ("zipf", smallbank_block_zipf(2)),
        ("uniform", smallbank_block_uniform(2)),
    ] {
        let sets = rwsets(&block);
        let refs: Vec<Option<&ReadWriteSet>> = sets.iter().map(Some).collect();
        g.bench_function(format!("build_smallbank_4096_{name}"), |b| {
            b.iter(|| black_box(DependencyGraph::build(&refs)))
        });
        g.bench_function(format!("conflict_pairs_smallbank_4096_{name}"), |b| {
            b.iter(|| black_box(conflict_pairs(&refs)))
        });
        let an = smallbank_analyzer();
        // The goal of issue #2 (≤ 5 ms) is analysis + DAG; freeing the block's sets afterwards is
        // measured separately below.
        g.bench_function(format!("cached_analysis_plus_build_4096_{name}"), |b| {
            b.iter_with_large_drop(|| {
                let sets: Vec<Option<ReadWriteSet>> = block
                    .iter()
                    .map(|tx| an.analyze(tx).ok().map(|a| a.rwset))
                    .collect();
                let refs: Vec<Option<&ReadWriteSet>> = sets.iter().map(Option::as_ref).collect();
                let graph = DependencyGraph::build(&refs);
                (graph, sets)
            })
        });
        g.bench_function(
            format!("cached_analysis_plus_build_plus_drop_4096_{name}"),
            |b| {
                b.iter(|| {
                    let sets: Vec<Option<ReadWriteSet>> = block
                        .iter()
                        .map(|tx| an.analyze(tx).ok().map(|a| a.rwset))
                        .collect();
                    let refs: Vec<Option<&ReadWriteSet>> =
                        sets.iter().map(Option::as_ref).collect();
                    black_box(DependencyGraph::build(&refs))
                })
            },
        );
    }
    // A Smallbank block with 32 transactions of a thousand disjoint ranges each mixed in (what
    // one client can send): the ranges must not cost every other range a comparison.
    let mut sets = rwsets(&smallbank_block_uniform(2));
    let table = Resource {
        name: "checking".into(),
        arity: 1,
    };
    for t in 0..32i64 {
        let keys = KeySet::Ranges(
            (0..1000)
                .map(|i| KeyRange {
                    prefix: vec![],
                    next: Some((
                        Included(KeyValue::Int(1_000_000 + t * 10_000 + 4 * i)),
                        Included(KeyValue::Int(1_000_000 + t * 10_000 + 4 * i + 1)),
                    )),
                })
                .collect(),
        );
        let mut set = ReadWriteSet::default();
        set.read(&table, &keys);
        sets.insert(t as usize * 128, set);
    }
    let refs: Vec<Option<&ReadWriteSet>> = sets.iter().map(Some).collect();
    g.bench_function("build_smallbank_4096_with_32_range_heavy", |b| {
        b.iter(|| black_box(DependencyGraph::build(&refs)))
    });
    // The same block with 32 transactions that each write the same thousand ranges of another
    // table (every range meets every earlier one): those past their share of the work become
    // barriers, and the Smallbank transactions between them stay parallel.
    let mut sets = rwsets(&smallbank_block_uniform(2));
    let audit = Resource {
        name: "audit".into(),
        arity: 1,
    };
    let keys = KeySet::Ranges(
        (0..1000)
            .map(|i| KeyRange {
                prefix: vec![],
                next: Some((
                    Included(KeyValue::Int(4 * i)),
                    Included(KeyValue::Int(4 * i + 1)),
                )),
            })
            .collect(),
    );
    for t in 0..32 {
        let mut set = ReadWriteSet::default();
        set.write(&audit, &keys);
        sets.insert(t * 128, set);
    }
    let refs: Vec<Option<&ReadWriteSet>> = sets.iter().map(Some).collect();
    g.bench_function("build_smallbank_4096_with_32_meeting_ranges", |b| {
        b.iter(|| black_box(DependencyGraph::build(&refs)))
    });
    g.finish();
}

struct Noop;

impl TxExecutor for Noop {
    type Error = ();
    async fn execute(&self, _index: usize) -> Result<(), ()> {
        Ok(())
    }
}

fn scheduler(c: &mut Criterion) {
    let sets = rwsets(&smallbank_block_zipf(3));
    let refs: Vec<Option<&ReadWriteSet>> = sets.iter().map(Some).collect();
    let graph = DependencyGraph::build(&refs);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let mut g = c.benchmark_group("scheduler");
    g.throughput(Throughput::Elements(BLOCK_TXS as u64));
    for k in [1usize, 8, 64] {
        g.bench_function(format!("run_block_noop_4096_k{k}"), |b| {
            b.iter(|| rt.block_on(run_block(&graph, &Noop, k)))
        });
    }
    // The executor's lane planner (8 lanes of at most 32 transactions, as the node runs a
    // block), its steps finished in the order they were started: the planner's own cost a block.
    for k in [8usize, 64] {
        g.bench_function(format!("lane_plan_4096_k{k}"), |b| {
            b.iter(|| {
                let mut plan = LanePlan::new(&graph, k, 32, &[]);
                let mut in_flight = std::collections::VecDeque::new();
                loop {
                    in_flight.extend(plan.steps());
                    match in_flight.pop_front() {
                        Some(Step::Run { lane, tx }) => plan.ran(lane, tx),
                        Some(Step::Commit { lane }) => plan.committed(lane),
                        None => break,
                    }
                }
                assert!(plan.is_finished());
            })
        });
    }
    g.finish();
}

fn signatures(c: &mut Criterion) {
    let key = SigningKey::from_seed(&[9; 32]);
    let pk = key.public_key();
    let block = smallbank_block_zipf(4);
    let proposals: Vec<Proposal> = block
        .iter()
        .enumerate()
        .map(|(i, tx)| {
            ProposalBody {
                client: ClientId::new("bench").unwrap_or_else(|e| panic!("{e}")),
                nonce: i as u64,
                network: NetworkId::new("bench").unwrap_or_else(|e| panic!("{e}")),
                transaction: tx.clone(),
            }
            .sign(&key)
        })
        .collect();
    let mut g = c.benchmark_group("ed25519");
    let msg = proposals[0].body.encode_canonical();
    g.bench_function("sign_proposal", |b| b.iter(|| black_box(key.sign(&msg))));
    g.bench_function("verify_proposal", |b| {
        b.iter(|| pk.verify(&msg, &proposals[0].signature))
    });
    g.throughput(Throughput::Elements(BLOCK_TXS as u64));
    g.bench_function("verify_block_4096_with_encoding", |b| {
        b.iter(|| proposals.iter().all(|p| p.verify(&pk).is_ok()))
    });
    // What block validation does: the block's signatures in batches, one share per core.
    let signed: Vec<_> = proposals.iter().map(|p| p.signed_by(pk)).collect();
    let signed: Vec<_> = signed.iter().collect();
    g.bench_function("verify_block_4096_zip215_batched", |b| {
        b.iter(|| {
            verify_many(Signatures::Ed25519Zip215, &signed)
                .into_iter()
                .all(|ok| ok)
        })
    });
    g.bench_function("verify_block_4096_rfc8032_cores", |b| {
        b.iter(|| {
            verify_many(Signatures::Ed25519, &signed)
                .into_iter()
                .all(|ok| ok)
        })
    });
    // A query answer signed by the organization (what every query costs it since answers are
    // signed): one Smallbank balance, and 1 000 rows of (key, balance, name).
    let one = vec![vec![Value::Int(7), Value::Int(10_000)]];
    let many: Vec<Vec<Value>> = (0..1000)
        .map(|i| {
            vec![
                Value::Int(i),
                Value::Int(10_000 + i),
                Value::Text(format!("customer {i}")),
            ]
        })
        .collect();
    let columns = vec!["custid".to_owned(), "bal".to_owned(), "name".to_owned()];
    g.throughput(Throughput::Elements(1));
    for (name, rows) in [
        ("sign_query_answer_1_row", &one),
        ("sign_query_answer_1000_rows", &many),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                QueryAnswer {
                    query: Digest::of(b"query"),
                    height: 9,
                    columns: &columns,
                    rows,
                }
                .sign(&key)
            })
        });
    }
    g.finish();
    // A block's endorsements signed as one batch of 1 024: each response's root, alone or with
    // the nodes the batch's proofs share hashed once (what gathering a block does).
    let leaves: Vec<Vec<u8>> = (0..1024u32).map(|i| i.to_be_bytes().repeat(20)).collect();
    let (_, proofs) = sign_leaves(OrgId(2), &leaves, |m| key.sign(&m));
    let mut g = c.benchmark_group("batch_proofs");
    g.throughput(Throughput::Elements(leaves.len() as u64));
    g.bench_function("roots_1024_alone", |b| {
        b.iter(|| {
            leaves
                .iter()
                .zip(&proofs)
                .map(|(l, p)| p.root(l))
                .collect::<Vec<_>>()
        })
    });
    g.bench_function("roots_1024_shared", |b| {
        b.iter(|| {
            let mut roots = Roots::default();
            leaves
                .iter()
                .zip(&proofs)
                .map(|(l, p)| roots.root(p, l))
                .collect::<Vec<_>>()
        })
    });
    g.finish();
}

fn policy(c: &mut Criterion) {
    let mut g = c.benchmark_group("policy");
    let cases = [
        ("any-2_of_3", "any-2", 3u32),
        ("all_of_3", "all", 3),
        ("majority_of_7", "majority", 7),
        ("explicit_of_3", "[[1,2],[1,3]]", 3),
    ];
    for (name, spec, n) in cases {
        let orgs: BTreeSet<OrgId> = (1..=n).map(OrgId).collect();
        let p = AgreementPolicy::new(
            &spec.parse::<PolicySpec>().unwrap_or_else(|e| panic!("{e}")),
            &orgs,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let h = Digest::of(b"block");
        let votes: BTreeMap<OrgId, Digest> = orgs.iter().map(|o| (*o, h)).collect();
        g.bench_function(name, |b| b.iter(|| black_box(p.evaluate(&votes))));
    }
    g.finish();
}

criterion_group!(benches, analysis, dag, scheduler, signatures, policy);
criterion_main!(benches);
