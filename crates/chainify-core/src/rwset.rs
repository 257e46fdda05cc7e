//! Read and write sets: which primary-key intervals of which tables a transaction touches.
//!
//! A [`KeyRange`] is the set of keys whose first columns equal `prefix` and whose next column (if
//! `next` is set) lies in an interval; the remaining columns are unconstrained. This is exactly the
//! shape that conjunctive WHERE clauses over a composite key produce (`a = 1 AND b BETWEEN 2 AND 5`),
//! and overlap between two such ranges is decided column by column without enumerating keys.
//!
//! The analysis that fills these sets must never under-approximate; everything here is built so
//! that widening is always possible ([`KeySet::All`]) and cheap.

use std::cmp::Ordering;
use std::ops::Bound;
use std::sync::Arc;

use crate::Decimal;

/// A primary-key (or unique-key) column value, normalized so that SQL-equal values are equal:
/// decimals have no trailing fractional zeros, and values were coerced to the column's type.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum KeyValue {
    /// Integer key column.
    Int(i64),
    /// Decimal key column (normalized).
    Decimal(Decimal),
    /// Text key column (binary collation: byte order).
    Text(String),
    /// Bytes key column.
    Bytes(Vec<u8>),
    /// Boolean key column.
    Bool(bool),
}

impl KeyValue {
    fn rank(&self) -> u8 {
        match self {
            KeyValue::Bool(_) => 0,
            KeyValue::Int(_) => 1,
            KeyValue::Decimal(_) => 2,
            KeyValue::Text(_) => 3,
            KeyValue::Bytes(_) => 4,
        }
    }
}

impl Ord for KeyValue {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (KeyValue::Int(a), KeyValue::Int(b)) => a.cmp(b),
            (KeyValue::Decimal(a), KeyValue::Decimal(b)) => a.cmp_numeric(b),
            (KeyValue::Text(a), KeyValue::Text(b)) => a.as_bytes().cmp(b.as_bytes()),
            (KeyValue::Bytes(a), KeyValue::Bytes(b)) => a.cmp(b),
            (KeyValue::Bool(a), KeyValue::Bool(b)) => a.cmp(b),
            // Values of one column share a type after coercion; ranks keep Ord total anyway.
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for KeyValue {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Keys with the given prefix and, optionally, the next column within an interval.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct KeyRange {
    /// Leading key columns fixed to these values.
    pub prefix: Vec<KeyValue>,
    /// Interval of the column after the prefix; `None` leaves it unconstrained.
    pub next: Option<(Bound<KeyValue>, Bound<KeyValue>)>,
}

impl KeyRange {
    /// A single full key (or a prefix of one).
    pub fn point(key: Vec<KeyValue>) -> Self {
        KeyRange {
            prefix: key,
            next: None,
        }
    }

    /// A total order that agrees with equality (not with key order: it only keeps sets sorted).
    pub fn total_cmp(&self, other: &KeyRange) -> Ordering {
        fn bound(b: &Bound<KeyValue>) -> (u8, Option<&KeyValue>) {
            match b {
                Bound::Unbounded => (0, None),
                Bound::Included(v) => (1, Some(v)),
                Bound::Excluded(v) => (2, Some(v)),
            }
        }
        self.prefix
            .cmp(&other.prefix)
            .then_with(|| match (&self.next, &other.next) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Less,
                (Some(_), None) => Ordering::Greater,
                (Some((a_lo, a_hi)), Some((b_lo, b_hi))) => bound(a_lo)
                    .cmp(&bound(b_lo))
                    .then_with(|| bound(a_hi).cmp(&bound(b_hi))),
            })
    }

    /// True when this range is exactly one key of a table whose key has `arity` columns.
    pub fn is_point(&self, arity: usize) -> bool {
        self.next.is_none() && self.prefix.len() == arity
    }

    /// Whether some key lies in both ranges.
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        let common = self.prefix.len().min(other.prefix.len());
        if self.prefix[..common] != other.prefix[..common] {
            return false;
        }
        match self.prefix.len().cmp(&other.prefix.len()) {
            Ordering::Equal => match (&self.next, &other.next) {
                (Some(a), Some(b)) => intervals_overlap(a, b),
                _ => true,
            },
            Ordering::Less => self
                .next
                .as_ref()
                .is_none_or(|iv| contains(iv, &other.prefix[common])),
            Ordering::Greater => other
                .next
                .as_ref()
                .is_none_or(|iv| contains(iv, &self.prefix[common])),
        }
    }
}

type Interval = (Bound<KeyValue>, Bound<KeyValue>);

fn contains((lo, hi): &Interval, v: &KeyValue) -> bool {
    let above = match lo {
        Bound::Unbounded => true,
        Bound::Included(l) => v >= l,
        Bound::Excluded(l) => v > l,
    };
    let below = match hi {
        Bound::Unbounded => true,
        Bound::Included(h) => v <= h,
        Bound::Excluded(h) => v < h,
    };
    above && below
}

/// Could a value be `>= lo` and `<= hi`? Exclusive bounds on discrete types may claim an overlap
/// that has no integer in it (`(1, 2)`): an over-approximation, which is safe.
fn lo_meets_hi(lo: &Bound<KeyValue>, hi: &Bound<KeyValue>) -> bool {
    match (lo, hi) {
        (Bound::Unbounded, _) | (_, Bound::Unbounded) => true,
        (Bound::Included(l), Bound::Included(h)) => l <= h,
        (Bound::Included(l) | Bound::Excluded(l), Bound::Included(h) | Bound::Excluded(h)) => l < h,
    }
}

fn intervals_overlap(a: &Interval, b: &Interval) -> bool {
    lo_meets_hi(&a.0, &b.1)
        && lo_meets_hi(&b.0, &a.1)
        && lo_meets_hi(&a.0, &a.1)
        && lo_meets_hi(&b.0, &b.1)
}

/// Most ranges kept per resource before widening to the whole table (bounds analysis and overlap
/// costs; a statement touching more keys than this is a bulk statement anyway).
pub const MAX_RANGES: usize = 1024;

/// The keys of one table (or unique-key space) a transaction reads or writes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum KeySet {
    /// Every key: the access could not be bounded.
    All,
    /// These ranges (kept sorted and deduplicated when built through [`KeySet::insert`]).
    Ranges(Vec<KeyRange>),
}

impl KeySet {
    /// No key.
    pub fn empty() -> Self {
        KeySet::Ranges(Vec::new())
    }

    /// Adds a range, widening to [`KeySet::All`] past [`MAX_RANGES`]. The ranges stay sorted
    /// ([`KeyRange::total_cmp`]), so a duplicate is found by binary search: a linear search made
    /// a statement's thousand keys cost half a million comparisons at every organization.
    pub fn insert(&mut self, range: KeyRange) {
        if let KeySet::Ranges(r) = self {
            if range.prefix.is_empty() && range.next.is_none() {
                *self = KeySet::All;
            } else if let Err(at) = r.binary_search_by(|x| x.total_cmp(&range)) {
                r.insert(at, range);
                if r.len() > MAX_RANGES {
                    *self = KeySet::All;
                }
            }
        }
    }

    /// Adds every key of `other`.
    pub fn absorb(&mut self, other: KeySet) {
        match other {
            KeySet::All => *self = KeySet::All,
            KeySet::Ranges(r) => r.into_iter().for_each(|x| self.insert(x)),
        }
    }

    /// Whether the two sets share a key.
    pub fn overlaps(&self, other: &KeySet) -> bool {
        match (self, other) {
            (KeySet::Ranges(a), KeySet::Ranges(b)) => {
                a.iter().any(|x| b.iter().any(|y| x.overlaps(y)))
            }
            (KeySet::All, KeySet::Ranges(r)) | (KeySet::Ranges(r), KeySet::All) => !r.is_empty(),
            (KeySet::All, KeySet::All) => true,
        }
    }

    /// Whether no key is in the set.
    pub fn is_empty(&self) -> bool {
        matches!(self, KeySet::Ranges(r) if r.is_empty())
    }
}

/// Something a transaction reads or writes: a shared table's primary-key space, or the value space
/// of one of its UNIQUE constraints (`accounts#unique(name)`), so that two writes of the same
/// unique value conflict even when they target different rows.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Resource {
    /// Table name, or `table#unique(col,…)` for a unique-key space.
    pub name: Arc<str>,
    /// Number of key columns.
    pub arity: usize,
}

/// Key sets per resource, sorted by resource. A transaction touches a handful of resources, so a
/// sorted vector beats a tree map here: one allocation instead of a tree node per map, and the
/// scheduler's hot loop walks it linearly.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct AccessMap(Vec<(Resource, KeySet)>);

impl AccessMap {
    fn position(&self, resource: &Resource) -> Result<usize, usize> {
        self.0.binary_search_by(|(r, _)| r.cmp(resource))
    }

    /// The keys of `resource`, if it is accessed.
    pub fn get(&self, resource: &Resource) -> Option<&KeySet> {
        self.position(resource).ok().map(|i| &self.0[i].1)
    }

    /// Sets the keys of `resource`, returning the previous ones.
    pub fn insert(&mut self, resource: Resource, keys: KeySet) -> Option<KeySet> {
        match self.position(&resource) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, keys)),
            Err(i) => {
                self.0.insert(i, (resource, keys));
                None
            }
        }
    }

    /// (resource, keys) in resource order.
    pub fn iter(&self) -> impl Iterator<Item = (&Resource, &KeySet)> {
        self.0.iter().map(|(r, k)| (r, k))
    }

    /// Number of resources.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no resource is accessed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn add(&mut self, resource: &Resource, keys: KeySet) {
        if keys.is_empty() {
            return;
        }
        match self.position(resource) {
            Ok(i) => self.0[i].1.absorb(keys),
            Err(i) => self.0.insert(i, (resource.clone(), keys)),
        }
    }
}

impl FromIterator<(Resource, KeySet)> for AccessMap {
    /// Collects key sets (empty ones included), merging those of the same resource.
    fn from_iter<I: IntoIterator<Item = (Resource, KeySet)>>(iter: I) -> Self {
        let mut map = AccessMap::default();
        for (r, k) in iter {
            match map.position(&r) {
                Ok(i) => map.0[i].1.absorb(k),
                Err(i) => map.0.insert(i, (r, k)),
            }
        }
        map
    }
}

impl<'a> IntoIterator for &'a AccessMap {
    type Item = (&'a Resource, &'a KeySet);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (Resource, KeySet)>,
        fn(&'a (Resource, KeySet)) -> Self::Item,
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(r, k)| (r, k))
    }
}

/// Everything one transaction reads and writes.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ReadWriteSet {
    /// Keys read, per resource.
    pub reads: AccessMap,
    /// Keys written, per resource.
    pub writes: AccessMap,
}

impl ReadWriteSet {
    /// Records a read.
    pub fn read(&mut self, resource: &Resource, keys: &KeySet) {
        self.reads.add(resource, keys.clone());
    }

    /// Records a write.
    pub fn write(&mut self, resource: &Resource, keys: &KeySet) {
        self.writes.add(resource, keys.clone());
    }

    /// Records a read of keys the caller no longer needs (no copy).
    pub fn read_owned(&mut self, resource: &Resource, keys: KeySet) {
        self.reads.add(resource, keys);
    }

    /// Records a write of keys the caller no longer needs (no copy).
    pub fn write_owned(&mut self, resource: &Resource, keys: KeySet) {
        self.writes.add(resource, keys);
    }

    /// Adds everything `other` reads and writes.
    pub fn merge(&mut self, other: &ReadWriteSet) {
        for (r, k) in &other.reads {
            self.read(r, k);
        }
        for (r, k) in &other.writes {
            self.write(r, k);
        }
    }

    /// Whether executing the two transactions in different orders could give different results:
    /// a write of one overlaps a read or a write of the other.
    pub fn conflicts_with(&self, other: &ReadWriteSet) -> bool {
        let hit = |a: &AccessMap, b: &AccessMap| {
            a.iter()
                .any(|(r, ka)| b.get(r).is_some_and(|kb| ka.overlaps(kb)))
        };
        hit(&self.writes, &other.writes)
            || hit(&self.writes, &other.reads)
            || hit(&self.reads, &other.writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Bound::*;

    fn i(v: i64) -> KeyValue {
        KeyValue::Int(v)
    }

    fn range(prefix: &[i64], lo: Bound<i64>, hi: Bound<i64>) -> KeyRange {
        KeyRange {
            prefix: prefix.iter().map(|v| i(*v)).collect(),
            next: Some((lo.map(i), hi.map(i))),
        }
    }

    proptest::proptest! {
        /// Inserting keeps each distinct range once, whatever the order and repetitions, as a
        /// linear search for duplicates did; the set stays sorted for the next binary search.
        #[test]
        fn inserted_ranges_are_each_kept_once_and_sorted(
            ranges in proptest::collection::vec(
                (proptest::collection::vec(0i64..3, 0..3), proptest::option::of((0u8..3, 0i64..3, 0u8..3, 0i64..3))),
                0..60,
            )
        ) {
            let bound = |kind: u8, v: i64| match kind {
                0 => Unbounded,
                1 => Included(i(v)),
                _ => Excluded(i(v)),
            };
            let ranges: Vec<KeyRange> = ranges
                .into_iter()
                .map(|(prefix, next)| KeyRange {
                    prefix: prefix.into_iter().map(i).collect(),
                    next: next.map(|(a, x, b, y)| (bound(a, x), bound(b, y))),
                })
                .filter(|r| !(r.prefix.is_empty() && r.next.is_none()))
                .collect();
            let mut set = KeySet::empty();
            let mut naive: Vec<KeyRange> = Vec::new();
            for r in &ranges {
                set.insert(r.clone());
                if !naive.contains(r) {
                    naive.push(r.clone());
                }
            }
            let KeySet::Ranges(kept) = set else { panic!("widened") };
            proptest::prop_assert_eq!(kept.len(), naive.len());
            proptest::prop_assert!(naive.iter().all(|r| kept.contains(r)));
            proptest::prop_assert!(kept.windows(2).all(|w| w[0].total_cmp(&w[1]) == Ordering::Less));
        }
    }

    #[test]
    fn composite_prefix_overlaps() {
        let p12 = KeyRange::point(vec![i(1), i(2)]);
        let p13 = KeyRange::point(vec![i(1), i(3)]);
        let a1 = KeyRange::point(vec![i(1)]);
        assert!(!p12.overlaps(&p13));
        assert!(a1.overlaps(&p12) && p13.overlaps(&a1));
        let b_2_to_5 = range(&[1], Included(2), Excluded(5));
        assert!(b_2_to_5.overlaps(&p12) && p13.overlaps(&b_2_to_5));
        assert!(!b_2_to_5.overlaps(&KeyRange::point(vec![i(1), i(5)])));
        assert!(!b_2_to_5.overlaps(&KeyRange::point(vec![i(2), i(3)])));
        assert!(b_2_to_5.overlaps(&range(&[1], Included(4), Unbounded)));
        assert!(!b_2_to_5.overlaps(&range(&[1], Included(5), Unbounded)));
        assert!(!range(&[], Excluded(3), Unbounded).overlaps(&range(&[], Unbounded, Included(3))));
        assert!(range(&[], Included(3), Unbounded).overlaps(&range(&[], Unbounded, Included(3))));
    }

    #[test]
    fn decimal_keys_compare_numerically() {
        let d = |s: &str| KeyValue::Decimal(s.parse::<Decimal>().unwrap().normalized());
        assert_eq!(d("1.50"), d("1.5"));
        assert!(d("-2") < d("-1.99"));
    }

    #[test]
    fn conflicts_need_a_write() {
        let t = Resource {
            name: "t".into(),
            arity: 1,
        };
        let one = KeySet::Ranges(vec![KeyRange::point(vec![i(1)])]);
        let mut r1 = ReadWriteSet::default();
        r1.read(&t, &one);
        let r2 = r1.clone();
        assert!(!r1.conflicts_with(&r2));
        let mut w = ReadWriteSet::default();
        w.write(&t, &KeySet::All);
        assert!(w.conflicts_with(&r1) && r1.conflicts_with(&w));
    }

    #[test]
    fn access_map_stays_sorted_and_merges() {
        let a = Resource {
            name: "a".into(),
            arity: 1,
        };
        let b = Resource {
            name: "b".into(),
            arity: 1,
        };
        let p = |k: i64| KeySet::Ranges(vec![KeyRange::point(vec![i(k)])]);
        let mut set = ReadWriteSet::default();
        set.write_owned(&b, p(1));
        set.write_owned(&a, p(2));
        set.write_owned(&b, p(3));
        set.write_owned(&a, KeySet::empty());
        let names: Vec<&str> = set.writes.iter().map(|(r, _)| &*r.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            set.writes.get(&b),
            Some(&KeySet::Ranges(vec![
                KeyRange::point(vec![i(1)]),
                KeyRange::point(vec![i(3)])
            ]))
        );
        let collected: AccessMap = [
            (b.clone(), p(1)),
            (a.clone(), KeySet::empty()),
            (b.clone(), KeySet::All),
        ]
        .into_iter()
        .collect();
        assert_eq!(collected.len(), 2);
        assert_eq!(collected.get(&a), Some(&KeySet::empty()));
        assert_eq!(collected.get(&b), Some(&KeySet::All));
    }

    #[test]
    fn key_sets_widen_past_the_limit() {
        let mut s = KeySet::empty();
        for k in 0..=MAX_RANGES as i64 {
            s.insert(KeyRange::point(vec![i(k)]));
        }
        assert_eq!(s, KeySet::All);
    }
}
