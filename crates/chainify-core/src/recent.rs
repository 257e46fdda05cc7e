//! A bounded memory of the most recent entries, in two generations.
//!
//! Entries go into the newer generation; when it is full, the older one is emptied and becomes
//! the newer. Both are allocated once, at their full size, and never grow, shrink or rehash: a
//! process's memory for them is reached in its first minutes and stays flat. Nothing is ever
//! removed from a table but by clearing it whole (a key inserted again goes into the newer one,
//! which shadows the older), so no table holds tombstones that would make it rehash or grow. (A map trimmed one
//! entry at a time from a queue, as before, collected tombstones until it doubled in size;
//! issue #17 measured it growing for minutes and jumping by 13 MB when it did.)

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

/// At least the last `capacity / 2` keys inserted (and at least one), in at most `capacity`
/// entries (two for a capacity under two).
#[derive(Debug)]
pub struct Recent<K, V> {
    newer: HashMap<K, V>,
    older: HashMap<K, V>,
    half: usize,
}

impl<K: Eq + Hash, V> Recent<K, V> {
    /// An empty memory for about `capacity` entries, allocated now.
    pub fn new(capacity: usize) -> Self {
        let half = (capacity / 2).max(1);
        Recent {
            newer: HashMap::with_capacity(half),
            older: HashMap::with_capacity(half),
            half,
        }
    }

    /// Remembers `value` for `key` as the newest entry (replacing what it held); whether the key
    /// was new to it.
    pub fn insert(&mut self, key: K, value: V) -> bool {
        if let Some(held) = self.newer.get_mut(&key) {
            *held = value;
            return false;
        }
        let known = self.older.contains_key(&key);
        if self.newer.len() >= self.half {
            self.older.clear();
            std::mem::swap(&mut self.newer, &mut self.older);
        }
        self.newer.insert(key, value);
        !known
    }

    /// The value held for `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.newer.get(key).or_else(|| self.older.get(key))
    }

    /// Whether it holds `key`.
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.get(key).is_some()
    }

    /// How many entries it holds (a key inserted again while in the older generation counts
    /// twice until that generation is cleared).
    pub fn len(&self) -> usize {
        self.newer.len() + self.older.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many entries its tables can hold without growing (fixed at creation).
    pub fn allocated(&self) -> usize {
        self.newer.capacity() + self.older.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_half_at_least_and_never_more_than_its_capacity() {
        let mut r = Recent::new(100);
        for i in 0..1_000u32 {
            assert!(r.insert(i, i * 2));
            assert!(r.len() <= 100, "{} entries after {i}", r.len());
            // The last 50 keys inserted are always held, with their values.
            for back in 0..50.min(i + 1) {
                assert_eq!(r.get(&(i - back)), Some(&((i - back) * 2)));
            }
        }
        assert!(!r.contains(&0));
        assert!(r.len() >= 50);
    }

    #[test]
    fn its_tables_never_grow() {
        // 57 344 is a full table of 65 536 buckets: no slack for tombstones to hide in.
        for capacity in [1 << 12, 2 * 57_344] {
            let mut r = Recent::new(capacity);
            let allocated = r.allocated();
            for i in 0..(4 * capacity as u64) {
                r.insert(i, ());
                // Repeats of older keys, up to a whole older generation inserted again.
                if i % 7 == 0 {
                    r.insert(i / 2, ());
                }
                r.insert(i.saturating_sub(capacity as u64 / 2), ());
                assert_eq!(r.allocated(), allocated, "after {i}");
            }
        }
    }

    #[test]
    fn an_insert_of_a_held_key_replaces_it_and_is_not_new() {
        let mut r = Recent::new(4);
        assert!(r.insert("a", 1));
        assert!(r.insert("b", 2));
        // "a" is in the older generation now.
        assert!(r.insert("c", 3));
        assert!(!r.insert("a", 10));
        assert_eq!(r.get("a"), Some(&10));
        assert!(!r.insert("a", 11));
        assert_eq!(r.get("a"), Some(&11));
        // The newer "a" shadows the older until the older generation is cleared.
        assert_eq!(r.len(), 4);
        assert!(r.insert("d", 4));
        assert_eq!(r.get("a"), Some(&11));
        assert_eq!(r.get("b"), None);
    }

    #[test]
    fn a_capacity_of_zero_or_one_still_holds_the_last_key() {
        for capacity in [0, 1] {
            let mut r = Recent::new(capacity);
            assert!(r.is_empty());
            for i in 0..10 {
                r.insert(i, ());
                assert!(r.contains(&i));
                assert!(r.len() <= 2);
            }
        }
    }
}
