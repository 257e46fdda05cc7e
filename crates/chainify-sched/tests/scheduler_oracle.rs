//! Differential tests of the parallel scheduler against serial execution in block order.
//!
//! Scenario: random high-conflict blocks (20–200 transactions over 8 integer keys of one table
//! "kv") of point reads and writes, inserts, deletes, range updates and whole-table reads and
//! updates, with some transactions rejected by analysis. Each transaction's read/write set is
//! derived from its operations. The block runs through `run_block` on a two-worker tokio runtime,
//! every transaction in its own spawned task that yields between operations; the test records
//! every pair of conflicting transactions that overlapped in time (there must be none) and compares
//! the final table and every transaction's observations with serial execution.
//!
//! Also: `conflict_pairs` equals the naive pairwise `conflicts_with` on random sets over two
//! resources with composite keys, ranges and whole-table accesses, and the reduced graph has a path
//! for every conflicting pair and an edge only between conflicting transactions (or, within small
//! limits, a barrier and the rest).

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{self, Excluded, Included, Unbounded};
use std::sync::{Arc, Mutex, OnceLock};

use chainify_core::rwset::{KeyRange, KeySet, KeyValue, ReadWriteSet, Resource};
use chainify_sched::{
    DependencyGraph, GraphLimits, SPAN_COST, TxExecutor, conflict_pairs, run_block,
};
use proptest::prelude::*;

const KEYS: i64 = 8;

/// One operation of a transaction on the table `kv(k PRIMARY KEY, v)`.
#[derive(Clone, Debug)]
enum Op {
    /// Observe `v` of `k` (or its absence).
    Read(i64),
    /// Upsert `k := acc` (a function of everything observed so far and the transaction index).
    Write(i64),
    /// Insert `k := acc` if absent; observes whether it was there.
    Insert(i64),
    /// Delete `k` (blind).
    Delete(i64),
    /// `v := 3v + acc` for every present key in the interval.
    RangeUpdate(Bound<i64>, Bound<i64>),
    /// Observe the whole table.
    ReadAll,
    /// `v := v + 1` for every row.
    BumpAll,
}

fn mix(acc: i64, seen: i64) -> i64 {
    acc.wrapping_mul(1_000_003).wrapping_add(seen) ^ (acc >> 7)
}

fn contains((lo, hi): (Bound<i64>, Bound<i64>), k: i64) -> bool {
    (match lo {
        Included(l) => k >= l,
        Excluded(l) => k > l,
        Unbounded => true,
    }) && (match hi {
        Included(h) => k <= h,
        Excluded(h) => k < h,
        Unbounded => true,
    })
}

/// Applies one operation; `acc` carries what the transaction has observed.
fn apply(op: &Op, table: &mut BTreeMap<i64, i64>, acc: &mut i64) {
    match *op {
        Op::Read(k) => *acc = mix(*acc, table.get(&k).copied().unwrap_or(-1)),
        Op::Write(k) => {
            table.insert(k, *acc);
        }
        Op::Insert(k) => {
            let present = table.contains_key(&k);
            if !present {
                table.insert(k, *acc);
            }
            *acc = mix(*acc, i64::from(present));
        }
        Op::Delete(k) => {
            table.remove(&k);
        }
        Op::RangeUpdate(lo, hi) => {
            for (k, v) in table.iter_mut() {
                if contains((lo, hi), *k) {
                    *v = v.wrapping_mul(3).wrapping_add(*acc);
                }
            }
        }
        Op::ReadAll => {
            for (k, v) in table.iter() {
                *acc = mix(mix(*acc, *k), *v);
            }
        }
        Op::BumpAll => table.values_mut().for_each(|v| *v = v.wrapping_add(1)),
    }
}

fn kv() -> Resource {
    Resource {
        name: "kv".into(),
        arity: 1,
    }
}

fn point(k: i64) -> KeySet {
    KeySet::Ranges(vec![KeyRange::point(vec![KeyValue::Int(k)])])
}

/// The read/write set of a transaction, derived from its operations.
fn rwset(ops: &[Op]) -> ReadWriteSet {
    let t = kv();
    let mut set = ReadWriteSet::default();
    for op in ops {
        match *op {
            Op::Read(k) => set.read(&t, &point(k)),
            Op::Write(k) | Op::Delete(k) => set.write(&t, &point(k)),
            Op::Insert(k) => {
                set.read(&t, &point(k));
                set.write(&t, &point(k));
            }
            Op::RangeUpdate(lo, hi) => {
                let keys = KeySet::Ranges(vec![KeyRange {
                    prefix: vec![],
                    next: Some((lo.map(KeyValue::Int), hi.map(KeyValue::Int))),
                }]);
                set.read(&t, &keys);
                set.write(&t, &keys);
            }
            Op::ReadAll => set.read(&t, &KeySet::All),
            Op::BumpAll => {
                set.read(&t, &KeySet::All);
                set.write(&t, &KeySet::All);
            }
        }
    }
    set
}

/// A transaction of the block.
#[derive(Clone, Debug)]
struct Tx {
    ops: Vec<Op>,
    /// Times to yield before each operation, to provoke interleavings.
    yields: u8,
    /// Rejected by analysis: stays in the block, is not executed.
    rejected: bool,
}

fn bound() -> impl Strategy<Value = Bound<i64>> {
    prop_oneof![
        Just(Unbounded),
        (-1..=KEYS).prop_map(Included),
        (-1..=KEYS).prop_map(Excluded),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    prop_oneof![
        6 => key.clone().prop_map(Op::Read),
        6 => key.clone().prop_map(Op::Write),
        2 => key.clone().prop_map(Op::Insert),
        2 => key.prop_map(Op::Delete),
        2 => (bound(), bound()).prop_map(|(lo, hi)| Op::RangeUpdate(lo, hi)),
        1 => Just(Op::ReadAll),
        1 => Just(Op::BumpAll),
    ]
}

fn tx() -> impl Strategy<Value = Tx> {
    (
        proptest::collection::vec(op(), 1..5),
        0u8..3,
        proptest::bool::weighted(0.05),
    )
        .prop_map(|(ops, yields, rejected)| Tx {
            ops,
            yields,
            rejected,
        })
}

/// What the executor shares with the tasks it spawns.
#[derive(Debug)]
struct Shared {
    txs: Vec<Tx>,
    sets: Vec<ReadWriteSet>,
    table: Mutex<BTreeMap<i64, i64>>,
    in_flight: Mutex<BTreeSet<usize>>,
    /// `(running, starting)` pairs of conflicting transactions that overlapped in time.
    overlaps: Mutex<Vec<(usize, usize)>>,
    /// Per transaction, its final `acc`; `None` if it never ran.
    observed: Mutex<Vec<Option<i64>>>,
    starts: Mutex<Vec<usize>>,
}

#[derive(Debug)]
struct KvExecutor(Arc<Shared>);

impl TxExecutor for KvExecutor {
    type Error = String;

    fn execute(&self, index: usize) -> impl Future<Output = Result<(), String>> + Send {
        let shared = Arc::clone(&self.0);
        async move {
            tokio::spawn(run_tx(shared, index))
                .await
                .map_err(|e| format!("transaction {index}: {e}"))
        }
    }
}

async fn run_tx(shared: Arc<Shared>, index: usize) {
    shared.starts.lock().unwrap().push(index);
    let tx = &shared.txs[index];
    if tx.rejected {
        return;
    }
    {
        let mut in_flight = shared.in_flight.lock().unwrap();
        for &other in in_flight.iter() {
            if shared.sets[other].conflicts_with(&shared.sets[index]) {
                shared.overlaps.lock().unwrap().push((other, index));
            }
        }
        in_flight.insert(index);
    }
    let mut acc = index as i64 + 1;
    for op in &tx.ops {
        for _ in 0..tx.yields {
            tokio::task::yield_now().await;
        }
        apply(op, &mut shared.table.lock().unwrap(), &mut acc);
    }
    tokio::task::yield_now().await;
    shared.observed.lock().unwrap()[index] = Some(acc);
    shared.in_flight.lock().unwrap().remove(&index);
}

fn serial(initial: &BTreeMap<i64, i64>, txs: &[Tx]) -> (BTreeMap<i64, i64>, Vec<Option<i64>>) {
    let mut table = initial.clone();
    let mut observed = vec![None; txs.len()];
    for (index, tx) in txs.iter().enumerate().filter(|(_, tx)| !tx.rejected) {
        let mut acc = index as i64 + 1;
        for op in &tx.ops {
            apply(op, &mut table, &mut acc);
        }
        observed[index] = Some(acc);
    }
    (table, observed)
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap()
    })
}

/// Random sets over `a` (key arity 1) and `b` (arity 2), keys 0..4: mostly points, some
/// composite-key prefixes, ranges (some malformed: longer than the key), whole tables, empty
/// range lists.
fn any_set() -> impl Strategy<Value = ReadWriteSet> {
    let resource =
        prop_oneof![Just(("a", 1usize)), Just(("b", 2usize))].prop_map(|(n, arity)| Resource {
            name: n.into(),
            arity,
        });
    let small_bound = prop_oneof![
        Just(Unbounded),
        (0i64..4).prop_map(|v| Included(KeyValue::Int(v))),
        (0i64..4).prop_map(|v| Excluded(KeyValue::Int(v))),
    ];
    let range = (
        proptest::collection::vec((0i64..4).prop_map(KeyValue::Int), 0..4),
        proptest::option::weighted(0.3, (small_bound.clone(), small_bound)),
    )
        .prop_map(|(prefix, next)| KeyRange { prefix, next });
    let keys = prop_oneof![
        1 => Just(KeySet::All),
        10 => proptest::collection::vec(range, 0..3).prop_map(KeySet::Ranges),
    ];
    let map = proptest::collection::btree_map(resource, keys, 0..3);
    (map.clone(), map).prop_map(|(reads, writes)| ReadWriteSet {
        reads: reads.into_iter().collect(),
        writes: writes.into_iter().collect(),
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn parallel_execution_never_overlaps_conflicts_and_matches_serial(
        txs in proptest::collection::vec(tx(), 20..200),
        initial in proptest::collection::btree_map(0..KEYS, -50i64..50, 0..KEYS as usize),
        parallelism in 1usize..=8,
    ) {
        let sets: Vec<ReadWriteSet> = txs.iter().map(|tx| rwset(&tx.ops)).collect();
        let analysed: Vec<Option<&ReadWriteSet>> = txs
            .iter()
            .zip(&sets)
            .map(|(tx, set)| (!tx.rejected).then_some(set))
            .collect();
        let graph = DependencyGraph::build(&analysed);
        let shared = Arc::new(Shared {
            sets: sets.clone(),
            table: Mutex::new(initial.clone()),
            in_flight: Mutex::new(BTreeSet::new()),
            overlaps: Mutex::new(Vec::new()),
            observed: Mutex::new(vec![None; txs.len()]),
            starts: Mutex::new(Vec::new()),
            txs: txs.clone(),
        });
        let executor = KvExecutor(Arc::clone(&shared));
        runtime().block_on(run_block(&graph, &executor, parallelism)).unwrap();

        prop_assert_eq!(&*shared.overlaps.lock().unwrap(), &Vec::<(usize, usize)>::new());
        let mut starts = shared.starts.lock().unwrap().clone();
        starts.sort_unstable();
        prop_assert_eq!(starts, (0..txs.len()).collect::<Vec<_>>(), "each exactly once");
        prop_assert!(shared.in_flight.lock().unwrap().is_empty());
        let (table, observed) = serial(&initial, &txs);
        prop_assert_eq!(&*shared.table.lock().unwrap(), &table);
        prop_assert_eq!(&*shared.observed.lock().unwrap(), &observed);
    }

    #[test]
    fn conflict_pairs_equal_naive_and_the_graph_orders_every_pair(
        sets in proptest::collection::vec(proptest::option::weighted(0.9, any_set()), 0..60),
    ) {
        let refs: Vec<Option<&ReadWriteSet>> = sets.iter().map(Option::as_ref).collect();
        let pairs = conflict_pairs(&refs);
        prop_assert_eq!(&pairs, &chainify_sched::conflict_pairs_reference(&refs));

        let graph = DependencyGraph::build(&refs);
        prop_assert_eq!(graph.len(), sets.len());
        let conflicting: BTreeSet<(usize, usize)> = pairs.iter().copied().collect();
        let mut edges: Vec<_> = graph.edges().collect();
        for edge in &edges {
            prop_assert!(conflicting.contains(edge), "edge {:?} joins no conflict", edge);
        }
        edges.sort_unstable();
        edges.dedup();
        prop_assert_eq!(edges.len(), graph.edge_count(), "duplicate edges");
        for &(i, j) in &pairs {
            prop_assert!(graph.has_path(i, j), "conflict {:?} is not ordered", (i, j));
        }
    }

    /// The same promises within limits small enough that random blocks reach them: every
    /// conflicting pair is still ordered, every edge joins a conflicting pair or a barrier, and a
    /// barrier is after every executed transaction before it and before every one after it. A
    /// barrier's edges come from the transactions nothing waited for yet, and a transaction after
    /// it waits for it only when for nothing else, so limits add at most two edges a transaction.
    #[test]
    fn barriers_keep_every_pair_ordered(
        sets in proptest::collection::vec(proptest::option::weighted(0.9, any_set()), 0..60),
        work in 0u64..400,
        min_share in 0u64..40,
        indexed_spans in 0usize..24,
        min_indexed_share in 0usize..4,
    ) {
        let refs: Vec<Option<&ReadWriteSet>> = sets.iter().map(Option::as_ref).collect();
        let limits = GraphLimits { work, min_share, indexed_spans, min_indexed_share };
        let graph = DependencyGraph::build_within(&refs, limits);
        let pairs: BTreeSet<(usize, usize)> = conflict_pairs(&refs).into_iter().collect();
        let ancestors = ancestors(&graph);
        let reaches = |i: usize, j: usize| ancestors[j][i / 64] & (1 << (i % 64)) != 0;
        for &(i, j) in &pairs {
            prop_assert!(reaches(i, j), "conflict {:?} is not ordered", (i, j));
        }
        let barriers = graph.barriers();
        for (i, j) in graph.edges() {
            prop_assert!(
                pairs.contains(&(i, j)) || barriers.contains(&i) || barriers.contains(&j),
                "edge {:?} joins no conflict and no barrier", (i, j)
            );
        }
        for &b in barriers {
            prop_assert!(refs[b].is_some(), "rejected transaction {} is a barrier", b);
            for t in (0..refs.len()).filter(|t| refs[*t].is_some() && *t != b) {
                prop_assert!(
                    if t < b { reaches(t, b) } else { reaches(b, t) },
                    "barrier {} does not order {}", b, t
                );
            }
        }
        let unlimited = DependencyGraph::build(&refs);
        prop_assert!(graph.edge_count() <= unlimited.edge_count() + 2 * sets.len());
        prop_assert!(graph.work() <= work + sets.len() as u64 * (min_share + SPAN_COST as u64 + 8));
    }

    /// Same as above on the transaction shapes of the oracle (one table, high conflict).
    #[test]
    fn graph_orders_every_pair_of_kv_blocks(txs in proptest::collection::vec(tx(), 0..120)) {
        let sets: Vec<ReadWriteSet> = txs.iter().map(|tx| rwset(&tx.ops)).collect();
        let refs: Vec<Option<&ReadWriteSet>> = sets.iter().map(Some).collect();
        let pairs = conflict_pairs(&refs);
        prop_assert_eq!(&pairs, &chainify_sched::conflict_pairs_reference(&refs));
        let graph = DependencyGraph::build(&refs);
        let ancestors = ancestors(&graph);
        for &(i, j) in &pairs {
            prop_assert!(ancestors[j][i / 64] & (1 << (i % 64)) != 0, "conflict {:?} is not ordered", (i, j));
        }
    }
}

/// Per transaction, the bit set of every transaction it (transitively) waits for: one pass in
/// block order, since edges only go forward. Cheaper than a search per pair on blocks with
/// thousands of pairs.
fn ancestors(graph: &DependencyGraph) -> Vec<Vec<u64>> {
    let words = graph.len().div_ceil(64);
    let mut ancestors = vec![vec![0u64; words]; graph.len()];
    for j in 0..graph.len() {
        let mut mine = vec![0u64; words];
        for p in graph.predecessors(j) {
            assert!(p < j, "edge {p} -> {j} goes backwards");
            mine[p / 64] |= 1 << (p % 64);
            for (w, a) in mine.iter_mut().zip(&ancestors[p]) {
                *w |= a;
            }
        }
        ancestors[j] = mine;
    }
    ancestors
}
