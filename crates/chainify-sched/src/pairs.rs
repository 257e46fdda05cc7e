//! Every conflicting pair of a block, without comparing every pair.

use chainify_core::rwset::{KeySet, ReadWriteSet, Resource};
use rustc_hash::FxHashMap;

use crate::index::{KeyView, PointIndex, Span, SpanAccess};

/// The definition [`conflict_pairs`] implements, in O(n²) pairwise checks: every `i < j` whose
/// sets conflict ([`ReadWriteSet::conflicts_with`]). The oracle of the tests; too slow for blocks.
pub fn conflict_pairs_reference(sets: &[Option<&ReadWriteSet>]) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    for (i, a) in sets.iter().enumerate() {
        for (j, b) in sets.iter().enumerate().skip(i + 1) {
            if let (Some(a), Some(b)) = (a, b)
                && a.conflicts_with(b)
            {
                pairs.push((i, j));
            }
        }
    }
    pairs
}

/// Every pair `(i, j)`, `i < j`, of transactions whose read/write sets conflict (a write of one
/// overlaps a read or a write of the other), sorted ascending and without duplicates.
///
/// The answer is exactly `{(i, j) | i < j, sets[i].conflicts_with(sets[j])}`; `None` entries
/// (transactions that analysis rejected) take part in no pair. It is not transitively reduced: this
/// is the full conflict relation, for checks and tests. The scheduler uses the smaller
/// [`DependencyGraph`](crate::DependencyGraph).
///
/// Cost: full-key points are grouped per resource through a hash map, so a point-only block costs
/// O(accesses + pairs). Ranges and whole-table accesses are compared with every other range of
/// their resource, and find the points they cover through an ordered index of that resource's keys.
pub fn conflict_pairs(sets: &[Option<&ReadWriteSet>]) -> Vec<(usize, usize)> {
    let mut resources: FxHashMap<&Resource, ResourceAccesses<'_>> = FxHashMap::default();
    for (tx, set) in sets.iter().enumerate() {
        let Some(set) = set else { continue };
        let tx = tx as u32;
        for (write, map) in [(false, &set.reads), (true, &set.writes)] {
            for (resource, keys) in map {
                let res = resources
                    .entry(resource)
                    .or_insert_with(|| ResourceAccesses::new(resource.arity));
                match keys {
                    KeySet::All => res.spans.push(SpanAccess {
                        tx,
                        write,
                        span: Span::All,
                    }),
                    KeySet::Ranges(ranges) => {
                        for range in ranges {
                            if range.is_point(resource.arity) {
                                let (slot, new) = res.index.slot(range);
                                if new {
                                    res.keys.enter(&res.index, slot);
                                }
                                res.points.push(PointAccess { slot, tx, write });
                            } else {
                                res.spans.push(SpanAccess {
                                    tx,
                                    write,
                                    span: Span::Range(range),
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    let mut pairs = Vec::new();
    for res in resources.values_mut() {
        res.collect_pairs(&mut pairs);
    }
    pairs.sort_unstable();
    pairs.dedup();
    pairs
}

/// One full-key access.
#[derive(Clone, Copy, Debug)]
struct PointAccess {
    slot: u32,
    tx: u32,
    write: bool,
}

/// All accesses of the block to one resource.
#[derive(Debug)]
struct ResourceAccesses<'a> {
    index: PointIndex<'a>,
    /// Every key of `index`.
    keys: KeyView<'a>,
    points: Vec<PointAccess>,
    spans: Vec<SpanAccess<'a>>,
}

impl ResourceAccesses<'_> {
    fn new(arity: usize) -> Self {
        ResourceAccesses {
            index: PointIndex::with_capacity(arity, 0),
            keys: KeyView::default(),
            points: Vec::new(),
            spans: Vec::new(),
        }
    }

    fn collect_pairs(&mut self, pairs: &mut Vec<(usize, usize)>) {
        // Group the point accesses by slot (counting sort): `by_slot[starts[s]..starts[s + 1]]`.
        let slots = self.index.len();
        let mut starts = vec![0u32; slots + 1];
        for p in &self.points {
            starts[p.slot as usize + 1] += 1;
        }
        for s in 0..slots {
            starts[s + 1] += starts[s];
        }
        let mut fill = starts.clone();
        let mut by_slot = vec![(0u32, false); self.points.len()];
        for p in &self.points {
            let at = &mut fill[p.slot as usize];
            by_slot[*at as usize] = (p.tx, p.write);
            *at += 1;
        }
        let group = |slot: u32| {
            &by_slot[starts[slot as usize] as usize..starts[slot as usize + 1] as usize]
        };
        let mut push = |a: u32, b: u32| {
            pairs.push(if a < b {
                (a as usize, b as usize)
            } else {
                (b as usize, a as usize)
            })
        };

        for slot in 0..slots as u32 {
            // Each unordered pair once: a writer pairs with every other access, except writers
            // before it (they already paired with it). A transaction that reads and writes the key
            // appears once per access; the final dedup removes what that repeats.
            let accesses = group(slot);
            for (a, &(writer, write)) in accesses.iter().enumerate() {
                if !write {
                    continue;
                }
                for (b, &(other, other_writes)) in accesses.iter().enumerate() {
                    if other != writer && !(other_writes && b < a) {
                        push(writer, other);
                    }
                }
            }
        }
        for (k, s) in self.spans.iter().enumerate() {
            for t in &self.spans[k + 1..] {
                if s.tx != t.tx && (s.write || t.write) && s.span.overlaps(&t.span) {
                    push(s.tx, t.tx);
                }
            }
            self.keys.covered(&self.index, s.span, usize::MAX, |slot| {
                for &(tx, write) in group(slot) {
                    if tx != s.tx && (s.write || write) {
                        push(s.tx, tx);
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Bound::{self, Excluded, Included, Unbounded};

    use chainify_core::rwset::{KeyRange, KeyValue};

    use super::*;

    fn res(name: &str, arity: usize) -> Resource {
        Resource {
            name: name.into(),
            arity,
        }
    }

    fn key(k: &[i64]) -> Vec<KeyValue> {
        k.iter().map(|v| KeyValue::Int(*v)).collect()
    }

    fn point(k: &[i64]) -> KeySet {
        KeySet::Ranges(vec![KeyRange::point(key(k))])
    }

    fn range(prefix: &[i64], lo: Bound<i64>, hi: Bound<i64>) -> KeySet {
        KeySet::Ranges(vec![KeyRange {
            prefix: key(prefix),
            next: Some((lo.map(KeyValue::Int), hi.map(KeyValue::Int))),
        }])
    }

    /// Builds a set from `(resource, keys, is_write)` accesses.
    fn set(accesses: &[(&Resource, KeySet, bool)]) -> ReadWriteSet {
        let mut s = ReadWriteSet::default();
        for (r, k, w) in accesses {
            if *w {
                s.write(r, k);
            } else {
                s.read(r, k);
            }
        }
        s
    }

    fn check(sets: &[Option<ReadWriteSet>], expected: &[(usize, usize)]) {
        let refs: Vec<Option<&ReadWriteSet>> = sets.iter().map(Option::as_ref).collect();
        assert_eq!(
            conflict_pairs_reference(&refs),
            expected,
            "the hand-written expectation is wrong"
        );
        assert_eq!(conflict_pairs(&refs), expected);
    }

    #[test]
    fn points_need_a_write_on_the_same_key() {
        let t = res("t", 1);
        let u = res("u", 1);
        check(
            &[
                Some(set(&[(&t, point(&[1]), false)])),
                Some(set(&[(&t, point(&[1]), false)])),
                Some(set(&[(&t, point(&[1]), true)])),
                Some(set(&[(&t, point(&[2]), true)])),
                Some(set(&[(&u, point(&[1]), true)])),
                Some(set(&[(&t, point(&[1]), true), (&t, point(&[1]), false)])),
                Some(set(&[(&t, point(&[2]), true)])),
            ],
            &[(0, 2), (0, 5), (1, 2), (1, 5), (2, 5), (3, 6)],
        );
    }

    #[test]
    fn same_name_with_another_arity_is_another_resource() {
        check(
            &[
                Some(set(&[(&res("t", 1), point(&[1]), true)])),
                Some(set(&[(&res("t", 2), point(&[1, 1]), true)])),
                Some(set(&[(&res("t", 2), KeySet::All, true)])),
            ],
            &[(1, 2)],
        );
    }

    #[test]
    fn composite_key_prefixes() {
        let t = res("t", 2);
        check(
            &[
                Some(set(&[(&t, point(&[1, 2]), true)])),
                Some(set(&[(&t, point(&[1, 3]), false)])),
                // All keys whose first column is 1.
                Some(set(&[(&t, point(&[1]), false)])),
                Some(set(&[(&t, point(&[2]), true)])),
                Some(set(&[(&t, point(&[2, 9]), false)])),
                Some(set(&[(&t, range(&[1], Included(3), Unbounded), true)])),
            ],
            &[(0, 2), (1, 5), (2, 5), (3, 4)],
        );
    }

    #[test]
    fn ranges_against_points_and_ranges() {
        let t = res("t", 1);
        check(
            &[
                Some(set(&[(&t, range(&[], Included(2), Excluded(5)), true)])),
                Some(set(&[(&t, point(&[1]), false)])),
                Some(set(&[(&t, point(&[2]), false)])),
                Some(set(&[(&t, point(&[4]), true)])),
                Some(set(&[(&t, point(&[5]), false)])),
                Some(set(&[(&t, range(&[], Excluded(3), Unbounded), false)])),
                Some(set(&[(&t, range(&[], Unbounded, Included(1)), true)])),
                Some(set(&[(&t, range(&[], Included(6), Included(3)), true)])),
            ],
            &[(0, 2), (0, 3), (0, 5), (1, 6), (3, 5)],
        );
    }

    #[test]
    fn whole_table_conflicts_with_every_access_that_writes() {
        let t = res("t", 1);
        let u = res("u", 1);
        check(
            &[
                Some(set(&[(&t, KeySet::All, false)])),
                Some(set(&[(&t, point(&[1]), false)])),
                Some(set(&[(&t, point(&[7]), true)])),
                Some(set(&[(&t, KeySet::All, false)])),
                Some(set(&[(&u, KeySet::All, true)])),
                Some(set(&[(&t, range(&[], Included(3), Included(3)), true)])),
                Some(set(&[(&t, KeySet::All, true)])),
            ],
            &[
                (0, 2),
                (0, 5),
                (0, 6),
                (1, 6),
                (2, 3),
                (2, 6),
                (3, 5),
                (3, 6),
                (5, 6),
            ],
        );
    }

    #[test]
    fn reads_never_conflict_with_reads() {
        let t = res("t", 1);
        check(
            &[
                Some(set(&[(&t, KeySet::All, false)])),
                Some(set(&[(&t, point(&[1]), false)])),
                Some(set(&[(&t, range(&[], Unbounded, Unbounded), false)])),
            ],
            &[],
        );
    }

    #[test]
    fn rejected_and_empty_entries_take_part_in_no_pair() {
        let t = res("t", 1);
        let mut empty_ranges = ReadWriteSet::default();
        empty_ranges.writes.insert(t.clone(), KeySet::empty());
        check(
            &[
                Some(set(&[(&t, KeySet::All, true)])),
                None,
                Some(empty_ranges),
                Some(ReadWriteSet::default()),
                Some(set(&[(&t, point(&[3]), false)])),
                None,
            ],
            &[(0, 4)],
        );
    }

    #[test]
    fn malformed_ranges_longer_than_the_key_still_match_naive() {
        // The analyser never builds these, but the answer must still equal the naive one.
        let t = res("t", 1);
        check(
            &[
                Some(set(&[(&t, point(&[1]), true)])),
                Some(set(&[(&t, point(&[1, 5]), false)])),
                Some(set(&[(&t, range(&[1], Included(0), Included(0)), false)])),
                Some(set(&[(&t, range(&[2], Unbounded, Unbounded), false)])),
            ],
            &[(0, 1), (0, 2)],
        );
    }

    #[test]
    fn non_normalized_decimals_are_not_lost_in_the_ordered_index() {
        use chainify_core::Decimal;
        let t = res("t", 1);
        let dec = |m: i128, s: u8| KeyValue::Decimal(Decimal::new(m, s).unwrap());
        let p = |v| KeySet::Ranges(vec![KeyRange::point(vec![v])]);
        let around_one_and_a_half = KeySet::Ranges(vec![KeyRange {
            prefix: vec![],
            next: Some((Included(dec(15, 1)), Included(dec(15, 1)))),
        }]);
        check(
            &[
                Some(set(&[(&t, p(dec(15, 1)), true)])),
                Some(set(&[(&t, p(dec(150, 2)), true)])),
                Some(set(&[(&t, around_one_and_a_half, false)])),
            ],
            &[(0, 2), (1, 2)],
        );
    }
}
