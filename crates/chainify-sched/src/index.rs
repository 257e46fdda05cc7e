//! The per-resource index both [`crate::conflict_pairs`] and [`crate::DependencyGraph`] use: full-key
//! points in a hash map (the common case, O(1) per access), an ordered view of the same keys built
//! only once a resource sees a range, and the list of non-point accesses ("spans").

use std::collections::BTreeMap;
use std::collections::hash_map::Entry;
use std::ops::Bound;

use chainify_core::rwset::{KeyRange, KeyValue};
use rustc_hash::{FxBuildHasher, FxHashMap};

/// End of a singly linked list of slots (or readers) kept in a `Vec<u32>`.
pub(crate) const NONE: u32 = u32::MAX;

/// A non-point access: a whole table or a range that is not a single full key.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Span<'a> {
    /// [`chainify_core::rwset::KeySet::All`].
    All,
    /// A range that is not [`KeyRange::is_point`] for its resource.
    Range(&'a KeyRange),
}

impl Span<'_> {
    /// Whether the two spans share a key (exactly what [`KeySet::overlaps`] decides for them).
    ///
    /// [`KeySet::overlaps`]: chainify_core::rwset::KeySet::overlaps
    pub(crate) fn overlaps(&self, other: &Span<'_>) -> bool {
        match (self, other) {
            (Span::Range(a), Span::Range(b)) => a.overlaps(b),
            _ => true,
        }
    }

    /// Whether the span contains the full key `point`.
    pub(crate) fn covers(&self, point: &KeyRange) -> bool {
        match self {
            Span::All => true,
            Span::Range(r) => r.overlaps(point),
        }
    }
}

/// A span access of one transaction.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpanAccess<'a> {
    /// Transaction index in the block.
    pub(crate) tx: u32,
    /// Write (true) or read (false).
    pub(crate) write: bool,
    /// The keys.
    pub(crate) span: Span<'a>,
}

/// The distinct full keys of one resource, numbered densely ("slots") in order of first sight.
#[derive(Debug)]
pub(crate) struct PointIndex<'a> {
    /// Number of key columns of the resource.
    arity: usize,
    /// Key → slot. Equality here is `KeyValue`'s `Eq`, the same that [`KeyRange::overlaps`] uses
    /// for two points, so two points overlap exactly when they share a slot.
    slots: FxHashMap<&'a [KeyValue], u32>,
    /// One range per slot (the first seen), to decide span coverage with [`KeyRange::overlaps`].
    reps: Vec<&'a KeyRange>,
    /// Ordered view of the keys, built on the first range query (point-only resources never pay
    /// for it). Maps to the first slot of a chain in `ord_twins`.
    ordered: Option<BTreeMap<&'a [KeyValue], u32>>,
    /// Next slot whose key is `Ord`-equal but not `Eq`-equal (a non-normalized decimal), so that
    /// the ordered view never loses a slot; `NONE` ends a chain.
    ord_twins: Vec<u32>,
}

impl<'a> PointIndex<'a> {
    /// An empty index for a resource with `arity` key columns, with room for `keys` keys.
    pub(crate) fn with_capacity(arity: usize, keys: usize) -> Self {
        PointIndex {
            arity,
            slots: FxHashMap::with_capacity_and_hasher(keys, FxBuildHasher),
            reps: Vec::with_capacity(keys),
            ordered: None,
            ord_twins: Vec::with_capacity(keys),
        }
    }

    /// Number of slots.
    pub(crate) fn len(&self) -> usize {
        self.reps.len()
    }

    /// The slot of a full key (`point.is_point(arity)`), and whether it was new.
    pub(crate) fn slot(&mut self, point: &'a KeyRange) -> (u32, bool) {
        let slot = self.reps.len() as u32;
        match self.slots.entry(point.prefix.as_slice()) {
            Entry::Occupied(known) => return (*known.get(), false),
            Entry::Vacant(new) => new.insert(slot),
        };
        self.reps.push(point);
        self.ord_twins.push(NONE);
        if let Some(ordered) = &mut self.ordered {
            Self::insert_ordered(ordered, &mut self.ord_twins, &point.prefix, slot);
        }
        (slot, true)
    }

    fn insert_ordered(
        ordered: &mut BTreeMap<&'a [KeyValue], u32>,
        twins: &mut [u32],
        key: &'a [KeyValue],
        slot: u32,
    ) {
        match ordered.get(key) {
            Some(&first) => {
                twins[slot as usize] = twins[first as usize];
                twins[first as usize] = slot;
            }
            None => {
                ordered.insert(key, slot);
            }
        }
    }

    /// Calls `f` with every slot whose key lies in `span`, each once, in no particular order.
    /// Returns how many keys it looked at, covered or not (what the lookup cost).
    pub(crate) fn covered(&mut self, span: Span<'a>, mut f: impl FnMut(u32)) -> usize {
        let range = match span {
            Span::All => {
                (0..self.reps.len() as u32).for_each(f);
                return self.reps.len();
            }
            Span::Range(range) => range,
        };
        if range.prefix.len() >= self.arity {
            // Only the point equal to the first `arity` columns can overlap (see
            // `KeyRange::overlaps`: a longer prefix or an interval past the last column still
            // contains that key and no other).
            if let Some(&slot) = self.slots.get(&range.prefix[..self.arity])
                && range.overlaps(self.reps[slot as usize])
            {
                f(slot);
            }
            return 1;
        }
        let ordered = self.ordered.get_or_insert_with(|| {
            let mut ordered = BTreeMap::new();
            for (slot, rep) in self.reps.iter().enumerate() {
                Self::insert_ordered(&mut ordered, &mut self.ord_twins, &rep.prefix, slot as u32);
            }
            ordered
        });
        let prefix = range.prefix.as_slice();
        let (lo, hi) = match &range.next {
            Some((lo, hi)) => (lo, hi),
            None => (&Bound::Unbounded, &Bound::Unbounded),
        };
        // Every key with this prefix and next column >= lo sorts at or after `start`; the keys
        // with the prefix are contiguous. Navigation uses `Ord`, the final test `overlaps` itself,
        // so the answer is exactly the naive one.
        let owned_start: Vec<KeyValue>;
        let start: &[KeyValue] = match lo {
            Bound::Included(v) | Bound::Excluded(v) => {
                owned_start = prefix.iter().chain(std::iter::once(v)).cloned().collect();
                &owned_start
            }
            Bound::Unbounded => prefix,
        };
        let mut looked = 0;
        for (key, &first) in
            ordered.range::<[KeyValue], _>((Bound::Included(start), Bound::Unbounded))
        {
            looked += 1;
            if key.len() < prefix.len() || key[..prefix.len()].cmp(prefix).is_ne() {
                break;
            }
            if let Some(next) = key.get(prefix.len()) {
                let past = match hi {
                    Bound::Included(h) => next > h,
                    Bound::Excluded(h) => next >= h,
                    Bound::Unbounded => false,
                };
                if past {
                    break;
                }
            }
            let mut slot = first;
            while slot != NONE {
                looked += 1;
                if range.overlaps(self.reps[slot as usize]) {
                    f(slot);
                }
                slot = self.ord_twins[slot as usize];
            }
        }
        looked
    }
}
