//! The per-resource index both [`crate::conflict_pairs`] and [`crate::DependencyGraph`] use: full-key
//! points in a hash map (the common case, O(1) per access), views of some of those keys with an
//! ordered view built only once a resource sees a range, and the tree of non-point accesses
//! ("spans").

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
}

impl<'a> PointIndex<'a> {
    /// An empty index for a resource with `arity` key columns, with room for `keys` keys.
    pub(crate) fn with_capacity(arity: usize, keys: usize) -> Self {
        PointIndex {
            arity,
            slots: FxHashMap::with_capacity_and_hasher(keys, FxBuildHasher),
            reps: Vec::with_capacity(keys),
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
        (slot, true)
    }
}

/// Bytes of text or bytes key columns one unit of work compares: a lookup of a range with longer
/// keys counts a unit more per this many bytes for each key or node it compares (a comparison
/// reads at most the shorter of its two keys, so the looked-up range's size bounds it). Ranges
/// of 1 KB text keys weigh 5, and cost about 2.8 times what short keys do here.
pub(crate) const UNIT_KEY_BYTES: usize = 512;

fn value_bytes(v: &KeyValue) -> usize {
    match v {
        KeyValue::Text(t) => t.len(),
        KeyValue::Bytes(b) => b.len(),
        KeyValue::Int(_) | KeyValue::Decimal(_) | KeyValue::Bool(_) => 0,
    }
}

fn key_bytes(key: &[KeyValue]) -> usize {
    key.iter().map(value_bytes).sum()
}

/// What one comparison with `span`'s keys costs, in units: 1, and 1 more per
/// [`UNIT_KEY_BYTES`] of its text and bytes columns.
pub(crate) fn weight(span: &Span<'_>) -> usize {
    let Span::Range(range) = span else { return 1 };
    let bounds = range.next.iter().flat_map(|(lo, hi)| [lo, hi]);
    let bytes = key_bytes(&range.prefix)
        + bounds
            .map(|b| match b {
                Bound::Included(v) | Bound::Excluded(v) => value_bytes(v),
                Bound::Unbounded => 0,
            })
            .sum::<usize>();
    1 + bytes / UNIT_KEY_BYTES
}

/// Some of a [`PointIndex`]'s slots: those a span lookup may find. The graph keeps the keys
/// touched since the last barrier (older ones can order nothing), so that a whole-table read
/// after a barrier does not look at every key the block touched before it.
///
/// The first range lookup orders the members' keys (a B-tree), which then takes each key as it
/// enters, so that range lookups cost about `log n` and the keys they look at. Ordering is not
/// counted as the lookup's work, as hashing point keys is not: it costs a few B-tree inserts
/// for each point access of the block (at most one a view, and again only after a barrier
/// empties it), about what the engines' own indexes pay for the same keys, and a narrow range
/// must not pay for ordering everybody's keys (review: one became a barrier for it).
#[derive(Debug, Default)]
pub(crate) struct KeyView<'a> {
    /// The members, in order of entry.
    members: Vec<u32>,
    /// Per slot: the generation in which it entered (`NONE` never), so that emptying the view
    /// does not visit its members.
    entered: Vec<u32>,
    generation: u32,
    /// The members' keys in order, mapping to the first slot of a chain in `twins`.
    ordered: Option<BTreeMap<&'a [KeyValue], u32>>,
    /// Per slot: the next member whose key is `Ord`-equal but not `Eq`-equal (a non-normalized
    /// decimal), so that the ordered view never loses a slot; `NONE` ends a chain.
    twins: Vec<u32>,
}

impl<'a> KeyView<'a> {
    /// Whether the view has no members.
    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn contains(&self, slot: u32) -> bool {
        self.entered.get(slot as usize) == Some(&self.generation)
    }

    /// Makes `slot` of `index` a member (nothing if it is one).
    pub(crate) fn enter(&mut self, index: &PointIndex<'a>, slot: u32) {
        let at = slot as usize;
        if at >= self.entered.len() {
            self.entered.resize(at + 1, NONE);
            self.twins.resize(at + 1, NONE);
        }
        if self.entered[at] == self.generation {
            return;
        }
        self.entered[at] = self.generation;
        self.members.push(slot);
        if let Some(ordered) = &mut self.ordered {
            Self::insert_ordered(ordered, &mut self.twins, &index.reps[at].prefix, slot);
        }
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
                twins[slot as usize] = NONE;
                ordered.insert(key, slot);
            }
        }
    }

    /// Removes every member, at a cost that does not grow with them (but for dropping the
    /// ordered view, which was as costly to build).
    pub(crate) fn clear(&mut self) {
        self.generation += 1;
        self.members.clear();
        self.ordered = None;
    }

    /// Calls `f` with every member whose key lies in `span`, each once, in no particular order.
    /// Returns what the lookup cost in units: [`weight`] for each key it looked at, covered or
    /// not. Stops once that is more than `limit`: then some members may be left out, and the
    /// count says so.
    pub(crate) fn covered(
        &mut self,
        index: &PointIndex<'a>,
        span: Span<'_>,
        limit: usize,
        mut f: impl FnMut(u32),
    ) -> usize {
        let range = match span {
            Span::All => {
                if self.members.len() > limit {
                    return limit + 1;
                }
                self.members.iter().copied().for_each(f);
                return self.members.len();
            }
            Span::Range(range) => range,
        };
        let w = weight(&span);
        if range.prefix.len() >= index.arity {
            // Only the point equal to the first `arity` columns can overlap (see
            // `KeyRange::overlaps`: a longer prefix or an interval past the last column still
            // contains that key and no other).
            if let Some(&slot) = index.slots.get(&range.prefix[..index.arity])
                && self.contains(slot)
                && range.overlaps(index.reps[slot as usize])
            {
                f(slot);
            }
            return w;
        }
        let ordered = self.ordered.get_or_insert_with(|| {
            let mut ordered = BTreeMap::new();
            for &slot in &self.members {
                let key = &index.reps[slot as usize].prefix;
                Self::insert_ordered(&mut ordered, &mut self.twins, key, slot);
            }
            ordered
        });
        let mut looked = 0;
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
        for (key, &first) in
            ordered.range::<[KeyValue], _>((Bound::Included(start), Bound::Unbounded))
        {
            if looked > limit {
                break;
            }
            looked += w;
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
            while slot != NONE && looked <= limit {
                looked += w;
                if range.overlaps(index.reps[slot as usize]) {
                    f(slot);
                }
                slot = self.twins[slot as usize];
            }
        }
        looked
    }
}

/// Where a lexicographic interval of keys starts or ends: `prefix`, then `value` if any, then a
/// side that sorts below (`Low`) or above (`High`) every value. A [`KeyRange`] is the contiguous
/// set of keys between its [`start`](Cut::start) and [`end`](Cut::end) cuts (whatever its prefix
/// length), so two ranges that share a key have intersecting cut intervals. The converse does
/// not hold exactly (an exclusive bound meets an inclusive one at the same value, decimals that
/// are `Ord`-equal but not `Eq`-equal): the index only narrows, [`KeyRange::overlaps`] decides.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cut<'a> {
    prefix: &'a [KeyValue],
    value: Option<&'a KeyValue>,
    high: bool,
}

/// One place of a cut's sequence.
enum Place<'a> {
    Value(&'a KeyValue),
    Side(bool),
}

impl<'a> Cut<'a> {
    /// Below every key.
    const LOWEST: Cut<'static> = Cut {
        prefix: &[],
        value: None,
        high: false,
    };
    /// Above every key.
    const HIGHEST: Cut<'static> = Cut {
        prefix: &[],
        value: None,
        high: true,
    };

    fn start(range: &'a KeyRange) -> Cut<'a> {
        let (value, high) = match &range.next {
            None | Some((Bound::Unbounded, _)) => (None, false),
            Some((Bound::Included(v), _)) => (Some(v), false),
            Some((Bound::Excluded(v), _)) => (Some(v), true),
        };
        Cut {
            prefix: &range.prefix,
            value,
            high,
        }
    }

    fn end(range: &'a KeyRange) -> Cut<'a> {
        let (value, high) = match &range.next {
            None | Some((_, Bound::Unbounded)) => (None, true),
            Some((_, Bound::Included(v))) => (Some(v), true),
            Some((_, Bound::Excluded(v))) => (Some(v), false),
        };
        Cut {
            prefix: &range.prefix,
            value,
            high,
        }
    }

    fn place(&self, i: usize) -> Place<'a> {
        match (self.prefix.get(i), i == self.prefix.len(), self.value) {
            (Some(v), _, _) => Place::Value(v),
            (None, true, Some(v)) => Place::Value(v),
            _ => Place::Side(self.high),
        }
    }

    fn cmp(&self, other: &Cut<'_>) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        for i in 0.. {
            match (self.place(i), other.place(i)) {
                (Place::Value(a), Place::Value(b)) => match a.cmp(b) {
                    Ordering::Equal => {}
                    unequal => return unequal,
                },
                (Place::Value(_), Place::Side(high)) => {
                    return if high {
                        Ordering::Less
                    } else {
                        Ordering::Greater
                    };
                }
                (Place::Side(high), Place::Value(_)) => {
                    return if high {
                        Ordering::Greater
                    } else {
                        Ordering::Less
                    };
                }
                (Place::Side(a), Place::Side(b)) => return a.cmp(&b),
            }
        }
        unreachable!("every cut ends in a side")
    }
}

/// The cut interval of a span.
fn cuts<'a>(span: &Span<'a>) -> (Cut<'a>, Cut<'a>) {
    match span {
        Span::All => (Cut::LOWEST, Cut::HIGHEST),
        Span::Range(r) => (Cut::start(r), Cut::end(r)),
    }
}

/// The cut interval of a full key.
pub(crate) fn point_cuts(point: &KeyRange) -> (Cut<'_>, Cut<'_>) {
    (Cut::start(point), Cut::end(point))
}

/// Every span access of one kind (reads or writes) of one resource in a block, known in
/// advance and sorted by start; an access takes part once it is [`activate`](Self::activate)d
/// (the scan reached its transaction). [`overlapping`](Self::overlapping) finds the active
/// accesses whose cut interval meets a query's through a tree of the greatest end below each
/// node, so it costs about `log n` per access found instead of a look at every earlier one:
/// a block of transactions with a thousand disjoint ranges each no longer compares every range
/// with every other.
#[derive(Debug)]
pub(crate) struct SpanTree<'a> {
    /// `(start, end, access)`, by start.
    entries: Vec<(Cut<'a>, Cut<'a>, SpanAccess<'a>)>,
    /// Implicit binary tree over `entries` (node 1 the root, leaves from `leaves`): the active
    /// entry with the greatest end below each node.
    greatest: Vec<u32>,
    leaves: usize,
    /// The places active now, to deactivate them all at the cost of their activation.
    active: Vec<u32>,
}

impl<'a> SpanTree<'a> {
    /// A tree of `accesses` (in block order), none active yet. Returns it and, for each access
    /// in the order given, its place in the tree.
    pub(crate) fn new(accesses: Vec<SpanAccess<'a>>) -> (SpanTree<'a>, Vec<u32>) {
        let mut entries: Vec<(Cut<'a>, Cut<'a>, SpanAccess<'a>, u32)> = accesses
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                let (start, end) = cuts(&a.span);
                (start, end, a, i as u32)
            })
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut places = vec![0u32; entries.len()];
        for (at, e) in entries.iter().enumerate() {
            places[e.3 as usize] = at as u32;
        }
        let leaves = entries.len().next_power_of_two();
        let tree = SpanTree {
            entries: entries.into_iter().map(|(s, e, a, _)| (s, e, a)).collect(),
            greatest: vec![NONE; 2 * leaves],
            leaves,
            active: Vec::new(),
        };
        (tree, places)
    }

    /// Whether no access is active.
    pub(crate) fn is_idle(&self) -> bool {
        self.active.is_empty()
    }

    /// The access at `place` takes part in later queries.
    pub(crate) fn activate(&mut self, place: u32) {
        self.active.push(place);
        let mut node = self.leaves + place as usize;
        self.greatest[node] = place;
        while node > 1 {
            node /= 2;
            let (l, r) = (self.greatest[2 * node], self.greatest[2 * node + 1]);
            self.greatest[node] = match (l, r) {
                (NONE, x) | (x, NONE) => x,
                (l, r) => {
                    if self.entries[l as usize]
                        .1
                        .cmp(&self.entries[r as usize].1)
                        .is_ge()
                    {
                        l
                    } else {
                        r
                    }
                }
            };
        }
    }

    /// No access takes part any more, until activated again. Costs what activating them did:
    /// a path is cleared up to the first node an earlier path cleared (its ancestors are clear
    /// too, since every active leaf below them is cleared in turn).
    pub(crate) fn deactivate_all(&mut self) {
        for place in std::mem::take(&mut self.active) {
            let mut node = self.leaves + place as usize;
            while node >= 1 && self.greatest[node] != NONE {
                self.greatest[node] = NONE;
                node /= 2;
            }
        }
    }

    /// Calls `f` with every active access whose cut interval meets `[start, end]` (a superset of
    /// those that overlap the query; none that overlaps is left out). Returns how many nodes it
    /// visited; stops once that is more than `limit`, when some accesses may be left out.
    /// `stack` is scratch space, reused so that a lookup allocates nothing.
    pub(crate) fn overlapping(
        &self,
        (start, end): (Cut<'_>, Cut<'_>),
        limit: usize,
        stack: &mut Vec<(usize, usize, usize)>,
        mut f: impl FnMut(&SpanAccess<'a>),
    ) -> usize {
        if self.entries.is_empty() {
            return 0;
        }
        // Entries from `before` on start past the query's end.
        let before = self.entries.partition_point(|e| e.0.cmp(&end).is_le());
        let mut visited = 0;
        stack.clear();
        stack.push((1usize, 0usize, self.leaves));
        while let Some((node, from, to)) = stack.pop() {
            if visited > limit {
                break;
            }
            visited += 1;
            let best = self.greatest[node];
            if from >= before || best == NONE || self.entries[best as usize].1.cmp(&start).is_lt() {
                continue;
            }
            if to - from == 1 {
                f(&self.entries[from].2);
                continue;
            }
            let mid = (from + to) / 2;
            stack.push((2 * node + 1, mid, to));
            stack.push((2 * node, from, mid));
        }
        visited
    }

    /// The cut interval of a span, for [`overlapping`](Self::overlapping).
    pub(crate) fn cuts_of(span: &Span<'a>) -> (Cut<'a>, Cut<'a>) {
        cuts(span)
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Bound::{Excluded, Included, Unbounded};

    use proptest::prelude::*;

    use super::*;

    /// Values of mixed types, decimals written with and without trailing zeros (`Ord`-equal,
    /// not `Eq`-equal).
    fn value() -> impl Strategy<Value = KeyValue> {
        prop_oneof![
            4 => (0i64..4).prop_map(KeyValue::Int),
            1 => prop_oneof![Just("1"), Just("1.0"), Just("1.5"), Just("2")]
                .prop_map(|d| KeyValue::Decimal(d.parse().expect("decimal"))),
            1 => prop_oneof![Just(""), Just("a"), Just("ab")].prop_map(|t| KeyValue::Text(t.into())),
            1 => any::<bool>().prop_map(KeyValue::Bool),
        ]
    }

    fn bound() -> impl Strategy<Value = Bound<KeyValue>> {
        prop_oneof![
            Just(Unbounded),
            value().prop_map(Included),
            value().prop_map(Excluded),
        ]
    }

    fn range() -> impl Strategy<Value = KeyRange> {
        (
            proptest::collection::vec(value(), 0..4),
            proptest::option::weighted(0.5, (bound(), bound())),
        )
            .prop_map(|(prefix, next)| KeyRange { prefix, next })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// The tree finds every active span that overlaps a query (what the graph's soundness
        /// rests on), and only active ones: spans activated before a `deactivate_all` (phase 1)
        /// take no part, those activated after it (phase 2) do.
        #[test]
        fn the_tree_finds_every_active_overlapping_span(
            spans in proptest::collection::vec((range(), any::<bool>(), 0..3u8), 0..40),
            queries in proptest::collection::vec(prop_oneof![
                4 => range().prop_map(Some),
                1 => Just(None),
            ], 1..10),
        ) {
            let accesses: Vec<SpanAccess<'_>> = spans
                .iter()
                .enumerate()
                .map(|(i, (r, all, _))| SpanAccess {
                    tx: i as u32,
                    write: false,
                    span: if *all && i % 5 == 0 { Span::All } else { Span::Range(r) },
                })
                .collect();
            let (mut tree, places) = SpanTree::new(accesses.clone());
            for phase in [1, 2] {
                for (i, _) in spans.iter().enumerate().filter(|(_, s)| s.2 == phase) {
                    tree.activate(places[i]);
                }
                if phase == 1 {
                    tree.deactivate_all();
                }
            }
            let spans: Vec<_> = spans.iter().map(|(r, all, phase)| (r, all, *phase == 2)).collect();
            for q in &queries {
                let span = q.as_ref().map_or(Span::All, Span::Range);
                let mut found = Vec::new();
                tree.overlapping(SpanTree::cuts_of(&span), usize::MAX, &mut Vec::new(), |s| found.push(s.tx));
                found.sort_unstable();
                for &tx in &found {
                    prop_assert!(spans[tx as usize].2, "inactive span {} found", tx);
                }
                for (i, a) in accesses.iter().enumerate() {
                    if spans[i].2 && a.span.overlaps(&span) {
                        prop_assert!(
                            found.binary_search(&(i as u32)).is_ok(),
                            "span {:?} overlaps {:?} and was not found", a.span, span
                        );
                    }
                }
                // Points are looked up through their own cuts.
                if let Some(r) = q {
                    let mut found = Vec::new();
                    tree.overlapping(point_cuts(r), usize::MAX, &mut Vec::new(), |s| found.push(s.tx));
                    found.sort_unstable();
                    for (i, a) in accesses.iter().enumerate() {
                        if spans[i].2 && a.span.covers(r) {
                            prop_assert!(found.binary_search(&(i as u32)).is_ok());
                        }
                    }
                }
            }
        }
    }

    /// A step of a key view's life: a key enters, or a span is looked up (`None`: the table).
    #[derive(Clone, Debug)]
    enum Step {
        Enter(usize),
        Look(Option<KeyRange>),
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// A key view finds exactly its members whose keys a span covers (what
        /// [`KeyRange::overlaps`] says, decimal twins included), through every way its members
        /// change: entered before and after its keys are ordered, entered twice, cleared.
        #[test]
        fn a_view_finds_exactly_its_members_in_a_span(
            keys in proptest::collection::vec(proptest::collection::vec(value(), 2), 1..40),
            steps in proptest::collection::vec(prop_oneof![
                6 => (0..40usize).prop_map(Step::Enter),
                2 => range().prop_map(|r| Step::Look(Some(r))),
                1 => Just(Step::Look(None)),
            ], 1..80),
            clear_at in proptest::collection::vec(0..80usize, 0..3),
        ) {
            let points: Vec<KeyRange> = keys.into_iter().map(KeyRange::point).collect();
            let mut index = PointIndex::with_capacity(2, 0);
            let slots: Vec<u32> = points.iter().map(|p| index.slot(p).0).collect();
            let mut view = KeyView::default();
            let mut members: Vec<u32> = Vec::new();
            for (i, step) in steps.iter().enumerate() {
                if clear_at.contains(&i) {
                    view.clear();
                    members.clear();
                }
                match step {
                    Step::Enter(k) => {
                        let slot = slots[k % slots.len()];
                        view.enter(&index, slot);
                        if !members.contains(&slot) {
                            members.push(slot);
                        }
                    }
                    Step::Look(query) => {
                        let span = query.as_ref().map_or(Span::All, Span::Range);
                        let mut found = Vec::new();
                        view.covered(&index, span, usize::MAX, |slot| found.push(slot));
                        found.sort_unstable();
                        let mut expected: Vec<u32> = members
                            .iter()
                            .copied()
                            .filter(|&slot| span.covers(index.reps[slot as usize]))
                            .collect();
                        expected.sort_unstable();
                        prop_assert_eq!(found, expected, "span {:?}", span);
                    }
                }
            }
        }
    }

    /// A view's lookup stops at its limit, and a range lookup pays only for the keys in and
    /// next to its range, however many the view holds.
    #[test]
    fn a_view_lookup_pays_for_what_it_looks_at_and_stops_at_its_limit() {
        let points: Vec<KeyRange> = (0..100)
            .map(|k| KeyRange::point(vec![KeyValue::Int(k)]))
            .collect();
        let mut index = PointIndex::with_capacity(1, 0);
        let mut view = KeyView::default();
        for p in &points[..50] {
            let (slot, _) = index.slot(p);
            view.enter(&index, slot);
        }
        let all = KeyRange {
            prefix: vec![],
            next: Some((Unbounded, Unbounded)),
        };
        let two = KeyRange {
            prefix: vec![],
            next: Some((Included(KeyValue::Int(10)), Included(KeyValue::Int(11)))),
        };
        let mut found = 0;
        // A key and a slot for each of the two, and the next key; ordering the view is free.
        assert_eq!(
            view.covered(&index, Span::Range(&two), 1000, |_| found += 1),
            5
        );
        assert_eq!(found, 2);
        // Keys entered once ordered are found too.
        for p in &points[50..] {
            let (slot, _) = index.slot(p);
            view.enter(&index, slot);
        }
        found = 0;
        assert_eq!(view.covered(&index, Span::All, 99, |_| found += 1), 100);
        assert_eq!(found, 0);
        assert_eq!(view.covered(&index, Span::All, 100, |_| found += 1), 100);
        assert_eq!(found, 100);
        found = 0;
        let looked = view.covered(&index, Span::Range(&all), usize::MAX, |_| found += 1);
        assert_eq!((found, looked), (100, 200));
        found = 0;
        let looked = view.covered(&index, Span::Range(&all), 50, |_| found += 1);
        assert!(found < 50 && looked == 51, "{found} found, {looked} looked");
        view.clear();
        assert_eq!(
            view.covered(&index, Span::Range(&all), 1000, |_| found += 1),
            0
        );
        assert!(view.is_empty() && !view.contains(0));
    }

    /// A comparison with long text or bytes keys weighs a unit more per [`UNIT_KEY_BYTES`].
    #[test]
    fn long_keys_weigh_more() {
        let text = |n: usize| KeyValue::Text("k".repeat(n));
        let range = |v: KeyValue| KeyRange {
            prefix: vec![],
            next: Some((Included(v), Unbounded)),
        };
        assert_eq!(weight(&Span::All), 1);
        assert_eq!(weight(&Span::Range(&range(KeyValue::Int(7)))), 1);
        assert_eq!(weight(&Span::Range(&range(text(511)))), 1);
        assert_eq!(weight(&Span::Range(&range(text(2048)))), 5);
        let all_columns = KeyRange {
            prefix: vec![KeyValue::Bytes(vec![0; 1024])],
            next: Some((Included(text(512)), Excluded(text(512)))),
        };
        assert_eq!(weight(&Span::Range(&all_columns)), 5);

        let points: Vec<KeyRange> = (0..10)
            .map(|i| KeyRange::point(vec![KeyValue::Text(format!("{}{i}", "k".repeat(1023)))]))
            .collect();
        let mut index = PointIndex::with_capacity(1, 0);
        let mut view = KeyView::default();
        for p in &points {
            let (slot, _) = index.slot(p);
            view.enter(&index, slot);
        }
        // A key and a slot each, weighing what the range's own keys do.
        let mut found = 0;
        let looked = view.covered(&index, Span::Range(&range(text(0))), usize::MAX, |_| {
            found += 1
        });
        assert_eq!((found, looked), (10, 20));
        let long = KeyRange {
            prefix: vec![],
            next: Some((
                Included(text(1023)),
                Included(KeyValue::Text(format!("{}9", "k".repeat(1023)))),
            )),
        };
        // 2 047 bytes of bounds: 4 units a comparison.
        let looked = view.covered(&index, Span::Range(&long), usize::MAX, |_| found += 1);
        assert_eq!((found, looked), (20, 20 * 4));
    }

    /// Disjoint ranges are found without looking at the others: a query that meets one range of
    /// a thousand visits a few dozen nodes, not a thousand.
    #[test]
    fn a_query_visits_about_log_n_nodes_per_span_found() {
        let ranges: Vec<KeyRange> = (0..1000)
            .map(|i| KeyRange {
                prefix: vec![],
                next: Some((
                    Included(KeyValue::Int(4 * i)),
                    Included(KeyValue::Int(4 * i + 1)),
                )),
            })
            .collect();
        let accesses = ranges
            .iter()
            .enumerate()
            .map(|(i, r)| SpanAccess {
                tx: i as u32,
                write: true,
                span: Span::Range(r),
            })
            .collect();
        let (mut tree, places) = SpanTree::new(accesses);
        for p in places {
            tree.activate(p);
        }
        let query = KeyRange {
            prefix: vec![],
            next: Some((Included(KeyValue::Int(401)), Included(KeyValue::Int(402)))),
        };
        let mut found = Vec::new();
        let visited = tree.overlapping(point_cuts(&query), usize::MAX, &mut Vec::new(), |s| {
            found.push(s.tx)
        });
        assert_eq!(found, [100]);
        assert!(visited <= 2 * 11 + 2, "visited {visited} nodes");
    }
}
