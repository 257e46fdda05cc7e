//! The state digest: an order-independent, incrementally updatable hash of the *whole* content of
//! the shared tables (`LedgerBlock::state_digest`, see `docs/design/digest.md`).
//!
//! It is LtHash (Bellare–Micciancio's additive set hash, with the lattice parameters of Lewi et
//! al., "Securing Update Propagation with Homomorphic Hashing", 2019): each row is expanded into
//! [`LANES`] 16-bit lanes by an extendable-output hash, and the state is the lane-wise sum modulo
//! 2^16 of its rows' expansions. Adding a row adds its lanes, removing one subtracts them, so
//!
//! - a block updates the state in O(rows it changed): minus each changed row's old image, plus
//!   its new one;
//! - the sum does not depend on the order rows are added in, so a full scan in any order, on any
//!   engine, recomputes the same value;
//! - finding two different row multisets with the same sum is as hard as the short-integer
//!   solution problem in dimension 1024 (about 200-bit security for these parameters).
//!
//! Rows are expanded with BLAKE3 in key-derivation mode (context [`ROW_CONTEXT`]) over the
//! canonical encoding `string table, list<value> row` ([`crate::canonical`]); the voted
//! [`StateHash::digest`] is SHA-256 over [`STATE_TAG`] and the 2048 lane bytes (little-endian).
//! Values must be normalized by the storage layer first (decimals at the column's scale), as for
//! the block digest.

use std::fmt;

use crate::canonical::Encoder;
use crate::{Digest, Value};

/// Number of 16-bit lanes.
pub const LANES: usize = 1024;

/// Size of the serialized accumulator in bytes.
pub const STATE_BYTES: usize = LANES * 2;

/// BLAKE3 key-derivation context of a row's expansion.
pub const ROW_CONTEXT: &str = "chainify.v1 2026-11 state row expansion";

/// Domain tag of the voted state digest.
pub const STATE_TAG: &str = "chainify.v1.StateDigest";

/// The expansion of one row: what it adds to (or removes from) the state.
#[derive(Clone, PartialEq, Eq)]
pub struct RowHash(Box<[u16; LANES]>);

impl RowHash {
    /// The expansion of `row` (all column values in column order) of `table`.
    pub fn of(table: &str, row: &[Value]) -> RowHash {
        let mut e = Encoder::untagged();
        e.str(table).count(row.len());
        for v in row {
            e.value(v);
        }
        let mut hasher = blake3::Hasher::new_derive_key(ROW_CONTEXT);
        hasher.update(&e.finish());
        let mut bytes = [0u8; STATE_BYTES];
        hasher.finalize_xof().fill(&mut bytes);
        let mut lanes = Box::new([0u16; LANES]);
        for (lane, pair) in lanes.iter_mut().zip(bytes.chunks_exact(2)) {
            *lane = u16::from_le_bytes([pair[0], pair[1]]);
        }
        RowHash(lanes)
    }
}

impl fmt::Debug for RowHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RowHash({:04x}{:04x}…)", self.0[0], self.0[1])
    }
}

/// The accumulator: a multiset of rows, as the lane-wise sum of their expansions.
#[derive(Clone, PartialEq, Eq)]
pub struct StateHash(Box<[u16; LANES]>);

impl Default for StateHash {
    fn default() -> Self {
        StateHash::empty()
    }
}

/// The serialized accumulator had the wrong length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a state accumulator is {STATE_BYTES} bytes, got {0}")]
pub struct StateLengthError(pub usize);

impl StateHash {
    /// The state of empty tables.
    pub fn empty() -> StateHash {
        StateHash(Box::new([0; LANES]))
    }

    /// Adds a row.
    pub fn add(&mut self, row: &RowHash) {
        for (a, b) in self.0.iter_mut().zip(row.0.iter()) {
            *a = a.wrapping_add(*b);
        }
    }

    /// Removes a row (added before, or to be added later: the sum is a group).
    pub fn remove(&mut self, row: &RowHash) {
        for (a, b) in self.0.iter_mut().zip(row.0.iter()) {
            *a = a.wrapping_sub(*b);
        }
    }

    /// Adds every row of another accumulator (for example one table's share of the state).
    pub fn combine(&mut self, other: &StateHash) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a = a.wrapping_add(*b);
        }
    }

    /// Removes every row of another accumulator (one part of the state replaced by another).
    pub fn subtract(&mut self, other: &StateHash) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a = a.wrapping_sub(*b);
        }
    }

    /// Whether no row (or rows that cancel out) has been added.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|l| *l == 0)
    }

    /// The lanes as 2048 little-endian bytes, as stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|l| l.to_le_bytes()).collect()
    }

    /// Parses [`StateHash::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<StateHash, StateLengthError> {
        if bytes.len() != STATE_BYTES {
            return Err(StateLengthError(bytes.len()));
        }
        let mut lanes = Box::new([0u16; LANES]);
        for (lane, pair) in lanes.iter_mut().zip(bytes.chunks_exact(2)) {
            *lane = u16::from_le_bytes([pair[0], pair[1]]);
        }
        Ok(StateHash(lanes))
    }

    /// The voted digest: SHA-256 over the tag and the lane bytes.
    pub fn digest(&self) -> Digest {
        let mut e = Encoder::new(STATE_TAG);
        e.bytes(&self.to_bytes());
        Digest::of(&e.finish())
    }
}

impl fmt::Debug for StateHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateHash({:?})", self.digest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(k: i64, v: &str) -> RowHash {
        RowHash::of("accounts", &[Value::Int(k), Value::Text(v.into())])
    }

    #[test]
    fn empty_state_has_a_fixed_digest_and_round_trips() {
        let empty = StateHash::empty();
        assert!(empty.is_empty());
        assert_eq!(StateHash::from_bytes(&empty.to_bytes()), Ok(empty.clone()));
        let mut s = StateHash::empty();
        s.add(&row(1, "a"));
        assert_ne!(s.digest(), empty.digest());
        assert_eq!(StateHash::from_bytes(&s.to_bytes()), Ok(s));
        assert_eq!(
            StateHash::from_bytes(&[0; 3]),
            Err(StateLengthError(3)),
            "a truncated accumulator is refused"
        );
    }

    #[test]
    fn an_update_is_remove_old_add_new() {
        let mut incremental = StateHash::empty();
        incremental.add(&row(1, "a"));
        incremental.add(&row(2, "b"));
        incremental.remove(&row(1, "a"));
        incremental.add(&row(1, "c"));
        let mut scanned = StateHash::empty();
        scanned.add(&row(2, "b"));
        scanned.add(&row(1, "c"));
        assert_eq!(incremental, scanned);
    }

    #[test]
    fn table_and_every_value_matter() {
        let base = RowHash::of("t", &[Value::Int(1), Value::Null]);
        assert_ne!(base, RowHash::of("u", &[Value::Int(1), Value::Null]));
        assert_ne!(base, RowHash::of("t", &[Value::Int(1), Value::Int(0)]));
        assert_ne!(base, RowHash::of("t", &[Value::Int(1)]));
        // A row twice is not a row once: the state is a multiset sum.
        let mut once = StateHash::empty();
        once.add(&base);
        let mut twice = once.clone();
        twice.add(&base);
        assert_ne!(once, twice);
    }

    proptest! {
        #[test]
        fn the_sum_ignores_order_and_removal_inverts(
            rows in proptest::collection::vec((any::<i64>(), ".{0,8}"), 0..20),
            seed in any::<u64>(),
        ) {
            let hashes: Vec<RowHash> = rows.iter().map(|(k, v)| row(*k, v)).collect();
            let mut forward = StateHash::empty();
            for h in &hashes {
                forward.add(h);
            }
            let mut shuffled: Vec<&RowHash> = hashes.iter().collect();
            let n = shuffled.len().max(1);
            shuffled.rotate_left((seed as usize) % n);
            shuffled.reverse();
            let mut backward = StateHash::empty();
            for h in shuffled {
                backward.add(h);
            }
            prop_assert_eq!(&forward, &backward);
            for h in &hashes {
                forward.remove(h);
            }
            prop_assert!(forward.is_empty());
        }
    }
}
