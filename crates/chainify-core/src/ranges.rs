//! Key ranges of a shared table and the Merkle tree over them that a state transfer compares
//! (`docs/design/digest.md`, "State transfer").
//!
//! A row's key falls in one of [`LEAVES`] ranges by a hash of its canonical key encoding (a
//! token range, as Cassandra's anti-entropy uses): engines sort keys differently (collations,
//! decimals, blobs), hashes they cannot disagree on. A node of the tree covers [`FANOUT`]^k
//! consecutive ranges and its digest is the [`StateHash`] digest of the rows in them, so
//!
//! - the root of a table is the digest of the table's accumulator, and the tables' roots sum to
//!   the voted state digest;
//! - two organizations find the ranges where they differ in [`DEPTH`] + 1 round trips of at most
//!   `FANOUT` digests per differing node, and transfer only those ranges' rows;
//! - whoever receives rows checks them against the agreed state digest by the same sums, without
//!   trusting any digest the sender gave.

use std::ops::Range;

use crate::canonical::Encoder;
use crate::state::{RowHash, StateHash};
use crate::{Digest, Value};

/// Children per inner node.
pub const FANOUT: u32 = 16;

/// Levels below the root: leaves are at level `DEPTH`.
pub const DEPTH: u32 = 3;

/// Number of key ranges (leaves) per table.
pub const LEAVES: u32 = FANOUT * FANOUT * FANOUT;

/// BLAKE3 key-derivation context of a key's range token.
pub const KEY_CONTEXT: &str = "chainify.v1 2026-11 key range token";

/// The range (leaf index) of the row of `table` with primary key `key` (values in key order,
/// normalized like the state digest's): the first 12 bits of BLAKE3 in key-derivation mode
/// ([`KEY_CONTEXT`]) over the canonical `string table, list<value> key`.
pub fn leaf_of(table: &str, key: &[Value]) -> u32 {
    let mut e = Encoder::untagged();
    e.str(table).count(key.len());
    for v in key {
        e.value(v);
    }
    let mut hasher = blake3::Hasher::new_derive_key(KEY_CONTEXT);
    hasher.update(&e.finish());
    let bytes = hasher.finalize();
    let token = u16::from_be_bytes([bytes.as_bytes()[0], bytes.as_bytes()[1]]);
    u32::from(token >> 4)
}

/// A node of the tree: level 0 is the root, level [`DEPTH`] the leaves; node `index` at level
/// `level` covers the leaves `index * FANOUT^(DEPTH - level)` up to the next node's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RangeNode {
    /// Distance from the root.
    pub level: u32,
    /// Position within the level.
    pub index: u32,
}

impl RangeNode {
    /// The root: every range.
    pub const ROOT: RangeNode = RangeNode { level: 0, index: 0 };

    /// Whether the node exists in the tree.
    pub fn is_valid(self) -> bool {
        self.level <= DEPTH && self.index < FANOUT.pow(self.level)
    }

    /// Whether the node is a single range.
    pub fn is_leaf(self) -> bool {
        self.level == DEPTH
    }

    /// The leaves the node covers.
    pub fn leaves(self) -> Range<u32> {
        let width = FANOUT.pow(DEPTH - self.level.min(DEPTH));
        self.index * width..(self.index + 1) * width
    }

    /// The node's children (none for a leaf).
    pub fn children(self) -> impl Iterator<Item = RangeNode> {
        let level = self.level + 1;
        let first = self.index * FANOUT;
        let count = if self.is_leaf() { 0 } else { FANOUT };
        (first..first + count).map(move |index| RangeNode { level, index })
    }
}

/// The rows of one table, summed per key range.
#[derive(Clone, Debug)]
pub struct RangeTree {
    table: String,
    key: Vec<usize>,
    /// `None`: no row in the range (most of a small table's ranges).
    leaves: Vec<Option<StateHash>>,
    rows: u64,
}

impl RangeTree {
    /// An empty tree of `table`, whose primary key is the columns at positions `key`.
    pub fn new(table: &str, key: Vec<usize>) -> RangeTree {
        RangeTree {
            table: table.to_owned(),
            key,
            leaves: vec![None; LEAVES as usize],
            rows: 0,
        }
    }

    /// The range of a row of the table (all columns, in column order).
    pub fn leaf_of_row(&self, row: &[Value]) -> u32 {
        let key: Vec<Value> = self
            .key
            .iter()
            .map(|i| row.get(*i).cloned().unwrap_or(Value::Null))
            .collect();
        leaf_of(&self.table, &key)
    }

    /// Adds a row; returns its range.
    pub fn add(&mut self, row: &[Value]) -> u32 {
        let leaf = self.leaf_of_row(row);
        self.leaves[leaf as usize]
            .get_or_insert_with(StateHash::empty)
            .add(&RowHash::of(&self.table, row));
        self.rows += 1;
        leaf
    }

    /// The rows added.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The accumulator of one range.
    pub fn leaf(&self, leaf: u32) -> StateHash {
        self.leaves
            .get(leaf as usize)
            .and_then(Option::clone)
            .unwrap_or_default()
    }

    /// The accumulator of the whole table.
    pub fn total(&self) -> StateHash {
        let mut sum = StateHash::empty();
        for leaf in self.leaves.iter().flatten() {
            sum.combine(leaf);
        }
        sum
    }

    /// Every node's digest.
    pub fn digests(&self) -> RangeDigests {
        let empty = StateHash::empty().digest();
        let digest = |s: &Option<StateHash>| s.as_ref().map_or(empty, StateHash::digest);
        let mut levels = vec![self.leaves.iter().map(digest).collect::<Vec<_>>()];
        let mut sums: Vec<Option<StateHash>> = Vec::new();
        for level in 0..DEPTH {
            let below = if level == 0 { &self.leaves } else { &sums };
            let above: Vec<Option<StateHash>> = below
                .chunks(FANOUT as usize)
                .map(|children| {
                    let mut present = children.iter().flatten().peekable();
                    present.peek()?;
                    let mut sum = StateHash::empty();
                    for c in present {
                        sum.combine(c);
                    }
                    Some(sum)
                })
                .collect();
            levels.push(above.iter().map(digest).collect());
            sums = above;
        }
        levels.reverse();
        RangeDigests { levels }
    }
}

/// The digests of every node of a [`RangeTree`]: what an organization serves to one comparing
/// with it (about 140 KB per table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeDigests {
    /// `levels[l][i]`: the digest of node `i` at level `l`.
    levels: Vec<Vec<Digest>>,
}

impl RangeDigests {
    /// The digest of `node`, `None` if there is no such node.
    pub fn get(&self, node: RangeNode) -> Option<Digest> {
        self.levels
            .get(node.level as usize)?
            .get(node.index as usize)
            .copied()
    }

    /// The root: the digest of the table's accumulator.
    pub fn root(&self) -> Digest {
        self.levels[0][0]
    }
}

/// The walk down two trees to the ranges where they differ: ask the other side for the digests
/// of [`Descent::asking`], give them to [`Descent::answer`], until [`Descent::is_done`]. Each
/// step asks only for the children of nodes that differed.
#[derive(Debug)]
pub struct Descent<'a> {
    local: &'a RangeDigests,
    asking: Vec<RangeNode>,
    differing: Vec<u32>,
}

impl<'a> Descent<'a> {
    /// Starts at the root.
    pub fn new(local: &'a RangeDigests) -> Descent<'a> {
        Descent {
            local,
            asking: vec![RangeNode::ROOT],
            differing: Vec::new(),
        }
    }

    /// The nodes whose digests to ask for next.
    pub fn asking(&self) -> &[RangeNode] {
        &self.asking
    }

    /// Whether the walk is over.
    pub fn is_done(&self) -> bool {
        self.asking.is_empty()
    }

    /// Takes the other side's digests of [`Descent::asking`], in that order.
    pub fn answer(&mut self, remote: &[Digest]) -> Result<(), String> {
        if remote.len() != self.asking.len() {
            return Err(format!(
                "asked for {} range digests, got {}",
                self.asking.len(),
                remote.len()
            ));
        }
        let mut next = Vec::new();
        for (node, digest) in self.asking.iter().zip(remote) {
            if self.local.get(*node) == Some(*digest) {
                continue;
            }
            if node.is_leaf() {
                self.differing.push(node.index);
            } else {
                next.extend(node.children());
            }
        }
        self.asking = next;
        Ok(())
    }

    /// The ranges that differ, ascending.
    pub fn differing(&self) -> &[u32] {
        &self.differing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tree(rows: &[(i64, &str)]) -> RangeTree {
        let mut t = RangeTree::new("accounts", vec![0]);
        for (k, v) in rows {
            t.add(&[Value::Int(*k), Value::Text((*v).into())]);
        }
        t
    }

    /// Walks `local` against `remote` as a transfer does; returns the ranges and round trips.
    fn walk(local: &RangeDigests, remote: &RangeDigests) -> (Vec<u32>, usize) {
        let mut d = Descent::new(local);
        let mut trips = 0;
        while !d.is_done() {
            let answer: Vec<Digest> = d
                .asking()
                .iter()
                .map(|n| remote.get(*n).expect("a node"))
                .collect();
            d.answer(&answer).expect("answer");
            trips += 1;
        }
        (d.differing().to_vec(), trips)
    }

    #[test]
    fn the_root_is_the_table_accumulator_and_leaves_cover_the_key_space() {
        let t = tree(&[(1, "a"), (2, "b"), (3, "c")]);
        assert_eq!(t.digests().root(), t.total().digest());
        let mut whole = StateHash::empty();
        for k in 1..=3 {
            whole.add(&RowHash::of(
                "accounts",
                &[
                    Value::Int(k),
                    Value::Text(["a", "b", "c"][k as usize - 1].into()),
                ],
            ));
        }
        assert_eq!(t.total(), whole);
        assert_eq!(RangeNode::ROOT.leaves(), 0..LEAVES);
        let mid = RangeNode { level: 2, index: 5 };
        assert_eq!(mid.leaves(), 80..96);
        assert!(mid.children().all(|c| c.is_valid() && c.level == 3));
        assert_eq!(mid.children().count(), 16);
        assert!(
            !RangeNode {
                level: 1,
                index: 16
            }
            .is_valid()
        );
        assert!(!RangeNode { level: 4, index: 0 }.is_valid());
        assert_eq!(RangeNode { level: 3, index: 7 }.children().count(), 0);
    }

    #[test]
    fn ranges_depend_on_the_table_and_the_key_only() {
        let a = leaf_of("accounts", &[Value::Int(42)]);
        assert!(a < LEAVES);
        assert_eq!(a, leaf_of("accounts", &[Value::Int(42)]));
        let t = RangeTree::new("accounts", vec![1]);
        assert_eq!(t.leaf_of_row(&[Value::Text("x".into()), Value::Int(42)]), a);
        assert_eq!(t.leaf_of_row(&[Value::Text("y".into()), Value::Int(42)]), a);
        // Over many keys every range is used: the token spreads keys.
        let used: std::collections::BTreeSet<u32> = (0..100_000)
            .map(|k| leaf_of("accounts", &[Value::Int(k)]))
            .collect();
        assert_eq!(used.len(), LEAVES as usize);
    }

    #[test]
    fn equal_tables_compare_in_one_round_trip() {
        let a = tree(&[(1, "a"), (2, "b")]);
        let b = tree(&[(2, "b"), (1, "a")]);
        assert_eq!(walk(&a.digests(), &b.digests()), (vec![], 1));
    }

    #[test]
    fn a_short_answer_is_refused() {
        let a = tree(&[(1, "a")]).digests();
        let mut d = Descent::new(&a);
        assert!(d.answer(&[]).unwrap_err().contains("asked for 1"));
    }

    proptest! {
        // A tree is 8 MB of lanes: few cases, each with many keys.
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// The walk finds exactly the ranges holding a key whose row differs, in DEPTH + 1
        /// round trips whenever anything differs.
        #[test]
        fn the_descent_finds_exactly_the_differing_ranges(
            base in proptest::collection::btree_map(0i64..5000, "[a-c]{1,3}", 0..300),
            changes in proptest::collection::btree_map(0i64..5000, proptest::option::of("[a-c]{1,3}"), 0..20),
        ) {
            let mut other = base.clone();
            for (k, v) in &changes {
                match v {
                    Some(v) => { other.insert(*k, v.clone()); }
                    None => { other.remove(k); }
                }
            }
            let rows = |m: &std::collections::BTreeMap<i64, String>| {
                let v: Vec<(i64, &str)> = m.iter().map(|(k, v)| (*k, v.as_str())).collect();
                tree(&v)
            };
            let (a, b) = (rows(&base), rows(&other));
            let (found, trips) = walk(&a.digests(), &b.digests());
            let expected: std::collections::BTreeSet<u32> = changes
                .keys()
                .filter(|k| base.get(*k) != other.get(*k))
                .map(|k| leaf_of("accounts", &[Value::Int(*k)]))
                .collect();
            prop_assert_eq!(found.iter().copied().collect::<std::collections::BTreeSet<_>>(), expected.clone());
            prop_assert_eq!(trips, if expected.is_empty() { 1 } else { DEPTH as usize + 1 });
            // The other side's state from ours: minus our differing ranges, plus theirs.
            let mut patched = a.total();
            for leaf in &found {
                patched.subtract(&a.leaf(*leaf));
                patched.combine(&b.leaf(*leaf));
            }
            prop_assert_eq!(patched, b.total());
        }
    }
}
