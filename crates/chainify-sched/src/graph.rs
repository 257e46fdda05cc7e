//! The dependency DAG of one block.

use chainify_core::rwset::{KeyRange, KeySet, ReadWriteSet, Resource};
use petgraph::Direction;
use petgraph::graph::{DiGraph, NodeIndex};
use rustc_hash::FxHashMap;

use crate::index::{NONE, PointIndex, Span, SpanAccess};

/// The dependency DAG of a block: node `i` is transaction `i`, an edge `i → j` (always `i < j`)
/// means `j` must not start before `i` has finished.
///
/// Built by [`DependencyGraph::build`]; edges implied by others are mostly left out (see the crate
/// docs), but for every conflicting pair `(i, j)` of [`conflict_pairs`](crate::conflict_pairs)
/// there is a path `i → … → j`, and every edge joins a conflicting pair, up to the work budget:
/// past [`WORK_BUDGET`] comparisons the rest of the block is ordered in block order
/// ([`DependencyGraph::serial_from`]).
#[derive(Clone, Debug, Default)]
pub struct DependencyGraph {
    /// Node `i` is transaction `i`; edges point from the earlier to the later transaction.
    graph: DiGraph<(), ()>,
    serial_from: Option<usize>,
}

/// Most comparisons of ranges and keys one block's graph may cost. Ranges are compared with
/// every earlier range of their table, so a block of transactions each with a thousand disjoint
/// ranges would cost trillions (hours, at every organization on every replay); past the budget
/// the remaining transactions run in block order, which orders every pair and costs one edge
/// each. Ordinary blocks stay far below it.
pub const WORK_BUDGET: u64 = 1 << 24;

impl DependencyGraph {
    /// Builds the graph of a block from each transaction's read/write set, in block order.
    ///
    /// `None` marks a transaction that analysis rejected (it is not executed): it gets a node
    /// without edges, so indices stay block indices.
    ///
    /// # Panics
    ///
    /// If the block has `u32::MAX` transactions or more (node indices are `u32`).
    pub fn build(sets: &[Option<&ReadWriteSet>]) -> DependencyGraph {
        let mut builder = Builder {
            block_len: sets.len(),
            edges: Vec::with_capacity(sets.len()),
            readers: Vec::with_capacity(sets.len()),
            ..Builder::default()
        };
        let mut serial_from = None;
        let mut last = None;
        for (tx, set) in sets.iter().enumerate() {
            let Some(set) = set else { continue };
            let tx32 = tx as u32;
            if serial_from.is_some() {
                // In block order: after the transaction before it, which is after all others.
                builder.edges.extend(last.map(|l| (l, tx32)));
            } else if !builder.add(tx32, set) {
                // Over budget: after every executed transaction before it.
                serial_from = Some(tx);
                builder.edges.truncate(builder.edges_before);
                builder.edges.extend(
                    (0..tx32)
                        .filter(|t| sets[*t as usize].is_some())
                        .map(|t| (t, tx32)),
                );
            }
            last = Some(tx32);
        }
        let mut graph = DiGraph::with_capacity(sets.len(), builder.edges.len());
        for _ in 0..sets.len() {
            graph.add_node(());
        }
        for &(from, to) in &builder.edges {
            graph.add_edge(
                NodeIndex::new(from as usize),
                NodeIndex::new(to as usize),
                (),
            );
        }
        DependencyGraph { graph, serial_from }
    }

    /// The first transaction ordered in block order because the block's graph went past
    /// [`WORK_BUDGET`] (`None`: every edge is a conflict).
    pub fn serial_from(&self) -> Option<usize> {
        self.serial_from
    }

    /// Number of transactions (nodes), including rejected ones.
    pub fn len(&self) -> usize {
        self.graph.node_count()
    }

    /// Whether the block is empty.
    pub fn is_empty(&self) -> bool {
        self.graph.node_count() == 0
    }

    /// Number of edges.
    pub fn edge_count(&self) -> usize {
        self.graph.edge_count()
    }

    /// The transactions with an edge into `index` (all smaller than `index`), in no particular
    /// order; empty for an index outside the block.
    pub fn predecessors(&self, index: usize) -> impl Iterator<Item = usize> + '_ {
        self.neighbors(index, Direction::Incoming)
    }

    /// The transactions with an edge from `index` (all greater than `index`), in no particular
    /// order; empty for an index outside the block.
    pub fn successors(&self, index: usize) -> impl Iterator<Item = usize> + '_ {
        self.neighbors(index, Direction::Outgoing)
    }

    fn neighbors(&self, index: usize, direction: Direction) -> impl Iterator<Item = usize> + '_ {
        // Checked here: `NodeIndex::new` would truncate a huge index onto a real node.
        (index < self.len())
            .then(|| {
                self.graph
                    .neighbors_directed(NodeIndex::new(index), direction)
            })
            .into_iter()
            .flatten()
            .map(|n| n.index())
    }

    /// Every edge `(from, to)`, in no particular order.
    pub fn edges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.graph
            .raw_edges()
            .iter()
            .map(|e| (e.source().index(), e.target().index()))
    }

    /// Whether `to` is reachable from `from` (a transaction reaches itself); false for indices
    /// outside the block. A depth-first search that never leaves `from..=to`, since edges only go
    /// forward: meant for tests and checks, not for the hot path.
    pub fn has_path(&self, from: usize, to: usize) -> bool {
        if from > to || to >= self.len() {
            return false;
        }
        let mut seen = vec![false; to - from + 1];
        let mut stack = vec![from];
        seen[0] = true;
        while let Some(at) = stack.pop() {
            if at == to {
                return true;
            }
            for next in self.successors(at) {
                if next <= to && !seen[next - from] {
                    seen[next - from] = true;
                    stack.push(next);
                }
            }
        }
        false
    }

    /// The underlying petgraph graph (node `i` is transaction `i`), e.g. for petgraph's algorithms
    /// or DOT output.
    pub fn as_petgraph(&self) -> &DiGraph<(), ()> {
        &self.graph
    }
}

/// Per full key: who wrote it last and who read it since.
#[derive(Clone, Copy, Debug)]
struct KeyState {
    /// Last transaction that wrote the key through a point access, or `NONE`.
    last_writer: u32,
    /// Head of the list (in `Builder::readers`) of point readers since `last_writer`, or `NONE`.
    readers: u32,
}

/// One resource's state while the block is scanned.
#[derive(Debug)]
struct ResourceState<'a> {
    index: PointIndex<'a>,
    /// Indexed by slot of `index`.
    keys: Vec<KeyState>,
    /// Every range and whole-table access so far, in block order.
    spans: Vec<SpanAccess<'a>>,
}

/// Scans the block once, keeping per full key the last writer and the readers since (the classic
/// reduction), and comparing ranges with everything.
#[derive(Debug, Default)]
struct Builder<'a> {
    /// Number of transactions in the block (for capacity guesses).
    block_len: usize,
    resources: FxHashMap<&'a Resource, u32>,
    states: Vec<ResourceState<'a>>,
    /// Reader lists of all keys: `(tx, next)` nodes; a write drops a key's list by resetting its
    /// head, so nothing is allocated per key.
    readers: Vec<(u32, u32)>,
    /// `(from, to)`, grouped by `to` ascending, each group sorted and without duplicates.
    edges: Vec<(u32, u32)>,
    /// Scratch: predecessors of the current transaction.
    preds: Vec<u32>,
    /// Scratch: `(resource, slot, write)` point accesses of the current transaction, applied to
    /// the key states after all its predecessors are known (a transaction acts atomically).
    pending: Vec<(u32, u32, bool)>,
    /// Scratch: slots covered by a span.
    covered: Vec<u32>,
    /// Comparisons so far (earlier spans looked at, keys a span covers).
    work: u64,
    /// `edges.len()` before the current transaction's edges.
    edges_before: usize,
}

impl<'a> Builder<'a> {
    /// Orders transaction `tx` after everything it conflicts with so far, then records its
    /// accesses. Reads are visited before writes, so that the pending updates apply a
    /// transaction's reads first. Returns false, having recorded nothing, when the block's
    /// graph went past [`WORK_BUDGET`].
    fn add(&mut self, tx: u32, set: &'a ReadWriteSet) -> bool {
        self.preds.clear();
        self.pending.clear();
        self.edges_before = self.edges.len();
        for (write, map) in [(false, &set.reads), (true, &set.writes)] {
            for (resource, keys) in map {
                let r = self.resource(tx, resource);
                let within = match keys {
                    KeySet::All => self.span(tx, r, write, Span::All),
                    KeySet::Ranges(ranges) => ranges.iter().all(|range| {
                        if range.is_point(resource.arity) {
                            self.point(r, write, range)
                        } else {
                            self.span(tx, r, write, Span::Range(range))
                        }
                    }),
                };
                if !within {
                    return false;
                }
            }
        }

        self.preds.sort_unstable();
        self.preds.dedup();
        // Only this transaction's own earlier spans can name it.
        if self.preds.last() == Some(&tx) {
            self.preds.pop();
        }
        self.edges.extend(self.preds.iter().map(|&p| (p, tx)));

        for &(r, slot, write) in &self.pending {
            let key = &mut self.states[r as usize].keys[slot as usize];
            if write {
                key.last_writer = tx;
                key.readers = NONE;
            } else {
                self.readers.push((tx, key.readers));
                key.readers = (self.readers.len() - 1) as u32;
            }
        }
        true
    }

    /// Counts `n` comparisons; false past the budget.
    fn spend(&mut self, n: usize) -> bool {
        self.work = self.work.saturating_add(n as u64);
        self.work <= WORK_BUDGET
    }

    /// The index of `resource` in `states`, created on first sight (by transaction `tx`).
    fn resource(&mut self, tx: u32, resource: &'a Resource) -> u32 {
        if let Some(&r) = self.resources.get(resource) {
            return r;
        }
        let r = self.states.len() as u32;
        self.resources.insert(resource, r);
        // Guess: one new key per remaining transaction. Saves most rehashing on point-heavy
        // blocks, costs little on others.
        let keys = self.block_len - tx as usize;
        self.states.push(ResourceState {
            index: PointIndex::with_capacity(resource.arity, keys),
            keys: Vec::with_capacity(keys),
            spans: Vec::new(),
        });
        r
    }

    /// A full-key access: after the key's last writer; a write also after the readers since.
    /// Earlier spans covering the key are ordered directly.
    fn point(&mut self, r: u32, write: bool, range: &'a KeyRange) -> bool {
        if !self.spend(self.states[r as usize].spans.len()) {
            return false;
        }
        let state = &mut self.states[r as usize];
        let (slot, new) = state.index.slot(range);
        if new {
            state.keys.push(KeyState {
                last_writer: NONE,
                readers: NONE,
            });
        }
        let key = state.keys[slot as usize];
        Self::after_key(&mut self.preds, &self.readers, key, write);
        for s in &state.spans {
            if (write || s.write) && s.span.covers(range) {
                self.preds.push(s.tx);
            }
        }
        self.pending.push((r, slot, write));
        true
    }

    /// A range or whole-table access: after every earlier overlapping span it conflicts with, and
    /// after the last writer (and, for a write, the readers since) of every full key it covers.
    fn span(&mut self, tx: u32, r: u32, write: bool, span: Span<'a>) -> bool {
        if !self.spend(self.states[r as usize].spans.len()) {
            return false;
        }
        let state = &mut self.states[r as usize];
        for s in &state.spans {
            if (write || s.write) && s.span.overlaps(&span) {
                self.preds.push(s.tx);
            }
        }
        let preds_before = self.preds.len();
        self.covered.clear();
        let covered = &mut self.covered;
        let looked = state.index.covered(span, |slot| covered.push(slot));
        for &slot in &self.covered {
            Self::after_key(
                &mut self.preds,
                &self.readers,
                state.keys[slot as usize],
                write,
            );
        }
        state.spans.push(SpanAccess { tx, write, span });
        // Each key looked at (covered or passed over), and for a write each covered key's
        // readers since its last writer.
        let walked = looked + (self.preds.len() - preds_before);
        self.spend(walked)
    }

    fn after_key(preds: &mut Vec<u32>, readers: &[(u32, u32)], key: KeyState, write: bool) {
        if key.last_writer != NONE {
            preds.push(key.last_writer);
        }
        if write {
            let mut at = key.readers;
            while at != NONE {
                let (reader, next) = readers[at as usize];
                preds.push(reader);
                at = next;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Bound::{Included, Unbounded};

    use chainify_core::rwset::KeyValue;

    use super::*;

    fn t() -> Resource {
        Resource {
            name: "t".into(),
            arity: 1,
        }
    }

    fn point(k: i64) -> KeySet {
        KeySet::Ranges(vec![KeyRange::point(vec![KeyValue::Int(k)])])
    }

    fn reads(keys: KeySet) -> ReadWriteSet {
        let mut s = ReadWriteSet::default();
        s.read(&t(), &keys);
        s
    }

    fn writes(keys: KeySet) -> ReadWriteSet {
        let mut s = ReadWriteSet::default();
        s.write(&t(), &keys);
        s
    }

    fn sorted_edges(sets: &[Option<ReadWriteSet>]) -> Vec<(usize, usize)> {
        let refs: Vec<_> = sets.iter().map(Option::as_ref).collect();
        let mut edges: Vec<_> = DependencyGraph::build(&refs).edges().collect();
        edges.sort_unstable();
        edges
    }

    #[test]
    fn writers_of_one_key_form_a_chain() {
        let sets = vec![Some(writes(point(1))); 4];
        assert_eq!(sorted_edges(&sets), [(0, 1), (1, 2), (2, 3)]);
    }

    #[test]
    fn readers_hang_off_the_last_writer_and_gate_the_next() {
        let sets = [
            Some(writes(point(1))),
            Some(reads(point(1))),
            Some(reads(point(1))),
            Some(writes(point(1))),
            Some(reads(point(1))),
        ];
        assert_eq!(
            sorted_edges(&sets),
            [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3), (3, 4)]
        );
    }

    #[test]
    fn read_and_write_of_one_key_in_one_transaction() {
        let mut rw = reads(point(1));
        rw.write(&t(), &point(1));
        let sets = [Some(reads(point(1))), Some(rw), Some(reads(point(1)))];
        assert_eq!(sorted_edges(&sets), [(0, 1), (1, 2)]);
    }

    #[test]
    fn spans_order_against_earlier_spans_and_covered_keys() {
        let range = KeySet::Ranges(vec![KeyRange {
            prefix: vec![],
            next: Some((Included(KeyValue::Int(2)), Unbounded)),
        }]);
        let sets = [
            Some(reads(point(1))),
            Some(reads(point(2))),
            Some(writes(range.clone())),
            Some(writes(point(3))),
            Some(reads(KeySet::All)),
            Some(writes(point(1))),
            Some(reads(range)),
        ];
        assert_eq!(
            sorted_edges(&sets),
            [
                (0, 5),
                (1, 2),
                (2, 3),
                (2, 4),
                (2, 6),
                (3, 4),
                (3, 6),
                (4, 5)
            ]
        );
    }

    #[test]
    fn rejected_transactions_are_isolated_nodes() {
        let sets = [Some(writes(KeySet::All)), None, Some(writes(KeySet::All))];
        let refs: Vec<_> = sets.iter().map(Option::as_ref).collect();
        let g = DependencyGraph::build(&refs);
        assert_eq!(g.len(), 3);
        assert_eq!(g.edge_count(), 1);
        assert_eq!(g.predecessors(1).count() + g.successors(1).count(), 0);
        assert!(g.has_path(0, 2) && !g.has_path(0, 1) && !g.has_path(2, 0));
        assert_eq!(g.predecessors(7).count(), 0);
        assert!(!g.has_path(0, 7));
    }
}

#[cfg(test)]
mod budget {
    use std::ops::Bound::{Excluded, Included};

    use chainify_core::rwset::KeyValue;

    use super::*;

    /// Table `t` with a key of `arity` columns.
    fn table(arity: usize) -> Resource {
        Resource {
            name: "t".into(),
            arity,
        }
    }

    /// One transaction writing `n` disjoint ranges of `t`, from `from` on.
    fn ranges(from: i64, n: i64) -> ReadWriteSet {
        let t = table(1);
        let keys = KeySet::Ranges(
            (0..n)
                .map(|i| KeyRange {
                    prefix: vec![],
                    next: Some((
                        Included(KeyValue::Int(from + 4 * i)),
                        Included(KeyValue::Int(from + 4 * i + 1)),
                    )),
                })
                .collect(),
        );
        let mut s = ReadWriteSet::default();
        s.write(&t, &keys);
        s
    }

    /// A block of transactions with a thousand disjoint ranges each would compare every range with
    /// every earlier one (trillions of comparisons for a full block). Past the budget the rest
    /// runs in block order: each transaction after all the executed ones before it, rejected
    /// transactions still without edges.
    #[test]
    fn a_block_past_the_work_budget_is_ordered_in_block_order_from_there() {
        let n = 64usize;
        let sets: Vec<Option<ReadWriteSet>> = (0..n)
            .map(|i| (i != 40).then(|| ranges(i as i64 * 10_000, 1000)))
            .collect();
        let refs: Vec<_> = sets.iter().map(Option::as_ref).collect();
        let graph = DependencyGraph::build(&refs);
        // Within the budget: the transactions' ranges are disjoint, so no edges at all.
        let first = graph.serial_from().expect("past the budget");
        let compared = |t: u64| t * 1000 * (t * 1000 - 1) / 2;
        assert!(
            compared(first as u64 + 1) > WORK_BUDGET && compared(first as u64 - 1) <= WORK_BUDGET,
            "serial from {first}"
        );
        for to in 0..n {
            let preds: Vec<usize> = graph.predecessors(to).collect();
            if to < first || to == 40 {
                assert!(preds.is_empty(), "{to}: {preds:?}");
            }
        }
        for (i, j) in (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j))) {
            if j >= first && i != 40 && j != 40 {
                assert!(graph.has_path(i, j), "{i} before {j}");
            }
        }
        // An ordinary block stays within it.
        let small: Vec<_> = (0..64).map(|i| Some(ranges(i * 10_000, 8))).collect();
        let refs: Vec<_> = small.iter().map(Option::as_ref).collect();
        assert_eq!(DependencyGraph::build(&refs).serial_from(), None);
    }

    /// A range write waits for the readers of every key it covers, and a range write leaves
    /// them in place, so each later range write walks them all again: the walks count too.
    #[test]
    fn readers_walked_by_range_writes_count_against_the_budget() {
        let t = table(1);
        let mut sets = Vec::new();
        let (readers, writers) = (256, 128);
        for _ in 0..readers {
            let mut s = ReadWriteSet::default();
            let keys = KeySet::Ranges(
                (0..1024)
                    .map(|k| KeyRange::point(vec![KeyValue::Int(k)]))
                    .collect(),
            );
            s.read(&t, &keys);
            sets.push(Some(s));
        }
        for _ in 0..writers {
            let mut s = ReadWriteSet::default();
            s.write(
                &t,
                &KeySet::Ranges(vec![KeyRange {
                    prefix: vec![],
                    next: Some((Included(KeyValue::Int(0)), Included(KeyValue::Int(5000)))),
                }]),
            );
            sets.push(Some(s));
        }
        let refs: Vec<_> = sets.iter().map(Option::as_ref).collect();
        let graph = DependencyGraph::build(&refs);
        // 256 readers of 1 024 keys each are walked by every range write: the budget trips
        // after about 64 of them.
        let first = graph.serial_from().expect("past the budget");
        assert!(
            (readers + 32..readers + writers).contains(&first),
            "serial from {first}"
        );
        for j in first..sets.len() {
            assert!(graph.has_path(j - 1, j), "{} before {j}", j - 1);
        }
    }

    /// A range that starts just past a column value is looked up from that value, so it passes
    /// over every key sharing it without covering one: those keys count as looked at.
    #[test]
    fn keys_a_range_passes_over_count_against_the_budget() {
        let t = table(2);
        let mut sets = Vec::new();
        for i in 0..32 {
            let mut s = ReadWriteSet::default();
            let keys = KeySet::Ranges(
                (0..1024)
                    .map(|b| KeyRange::point(vec![KeyValue::Int(5), KeyValue::Int(i * 1024 + b)]))
                    .collect(),
            );
            s.read(&t, &keys);
            sets.push(Some(s));
        }
        for x in 0..1024 {
            let mut s = ReadWriteSet::default();
            s.read(
                &t,
                &KeySet::Ranges(vec![KeyRange {
                    prefix: vec![],
                    next: Some((Excluded(KeyValue::Int(5)), Excluded(KeyValue::Int(10 + x)))),
                }]),
            );
            sets.push(Some(s));
        }
        let refs: Vec<_> = sets.iter().map(Option::as_ref).collect();
        let graph = DependencyGraph::build(&refs);
        // Each range passes over the 32 768 keys of a = 5: the budget trips after about 512.
        let first = graph.serial_from().expect("past the budget");
        assert!(
            (32 + 128..32 + 1024).contains(&first),
            "serial from {first}"
        );
    }
}
