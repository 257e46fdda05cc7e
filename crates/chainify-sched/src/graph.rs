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
/// there is a path `i → … → j`, and every edge joins a conflicting pair.
#[derive(Clone, Debug, Default)]
pub struct DependencyGraph {
    /// Node `i` is transaction `i`; edges point from the earlier to the later transaction.
    graph: DiGraph<(), ()>,
}

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
        for (tx, set) in sets.iter().enumerate() {
            if let Some(set) = set {
                builder.add(tx as u32, set);
            }
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
        DependencyGraph { graph }
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
}

impl<'a> Builder<'a> {
    /// Orders transaction `tx` after everything it conflicts with so far, then records its
    /// accesses. Reads are visited before writes, so that the pending updates apply a
    /// transaction's reads first.
    fn add(&mut self, tx: u32, set: &'a ReadWriteSet) {
        self.preds.clear();
        self.pending.clear();
        for (write, map) in [(false, &set.reads), (true, &set.writes)] {
            for (resource, keys) in map {
                let r = self.resource(tx, resource);
                match keys {
                    KeySet::All => self.span(tx, r, write, Span::All),
                    KeySet::Ranges(ranges) => {
                        for range in ranges {
                            if range.is_point(resource.arity) {
                                self.point(r, write, range);
                            } else {
                                self.span(tx, r, write, Span::Range(range));
                            }
                        }
                    }
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
    fn point(&mut self, r: u32, write: bool, range: &'a KeyRange) {
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
    }

    /// A range or whole-table access: after every earlier overlapping span it conflicts with, and
    /// after the last writer (and, for a write, the readers since) of every full key it covers.
    fn span(&mut self, tx: u32, r: u32, write: bool, span: Span<'a>) {
        let state = &mut self.states[r as usize];
        for s in &state.spans {
            if (write || s.write) && s.span.overlaps(&span) {
                self.preds.push(s.tx);
            }
        }
        self.covered.clear();
        let covered = &mut self.covered;
        state.index.covered(span, |slot| covered.push(slot));
        for &slot in &self.covered {
            Self::after_key(
                &mut self.preds,
                &self.readers,
                state.keys[slot as usize],
                write,
            );
        }
        state.spans.push(SpanAccess { tx, write, span });
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
