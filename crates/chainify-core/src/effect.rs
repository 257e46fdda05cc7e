//! The effect of a block on the shared tables and its digest (`LedgerBlock::hash_digest`).
//!
//! The storage layer collects, after a block, every key its triggers recorded as changed and reads
//! the row's current image (see `docs/design/digest.md`): a [`RowEffect`] per key. The digest is
//! SHA-256 over the effects in canonical order, so it depends neither on the physical order in
//! which the engine fired its triggers nor on the order the rows were read back.
//!
//! Layout: tag `"chainify.v1.BlockEffect"`, `list` of effects sorted by (table bytes, encoded key
//! bytes), each `string table, list<value> key, option<list<value>> image` (none: the row no
//! longer exists). Values must already be normalized by the storage layer (decimals at the
//! column's declared scale), since `1.5` and `1.50` encode differently on purpose.

use crate::canonical::Encoder;
use crate::{Digest, Value};

/// One changed key of a shared table, as it stands after the block.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RowEffect {
    /// Table name (lower case, as registered).
    pub table: String,
    /// Primary-key values in key-column order.
    pub key: Vec<Value>,
    /// All column values in column order, or `None` when the row was deleted.
    pub image: Option<Vec<Value>>,
}

impl RowEffect {
    fn encoded_key(&self) -> Vec<u8> {
        let mut e = Encoder::untagged();
        e.count(self.key.len());
        for v in &self.key {
            e.value(v);
        }
        e.finish()
    }
}

/// Domain tag of the block-effect encoding.
pub const BLOCK_EFFECT_TAG: &str = "chainify.v1.BlockEffect";

/// The digest of a block's effects, independent of the order they are given in. The same key must
/// not appear twice (the storage layer reads each changed key once).
pub fn block_digest(effects: &[RowEffect]) -> Digest {
    let mut keyed: Vec<(&str, Vec<u8>, &RowEffect)> = effects
        .iter()
        .map(|e| (e.table.as_str(), e.encoded_key(), e))
        .collect();
    keyed.sort_by(|a, b| (a.0.as_bytes(), &a.1).cmp(&(b.0.as_bytes(), &b.1)));
    let mut enc = Encoder::new(BLOCK_EFFECT_TAG);
    enc.count(keyed.len());
    for (table, key, effect) in &keyed {
        enc.str(table);
        // The key bytes already carry their count prefix.
        for b in key {
            enc.u8(*b);
        }
        match &effect.image {
            None => {
                enc.u8(0);
            }
            Some(values) => {
                enc.u8(1).count(values.len());
                for v in values {
                    enc.value(v);
                }
            }
        }
    }
    Digest::of(&enc.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(table: &str, k: i64, image: Option<Vec<Value>>) -> RowEffect {
        RowEffect {
            table: table.into(),
            key: vec![Value::Int(k)],
            image,
        }
    }

    fn sample() -> Vec<RowEffect> {
        vec![
            row("checking", 2, Some(vec![Value::Int(2), Value::Int(-500)])),
            row("checking", -1, None),
            row(
                "savings",
                2,
                Some(vec![Value::Int(2), Value::Text("Zürich".into())]),
            ),
            row("accounts", 9, Some(vec![Value::Int(9), Value::Null])),
        ]
    }

    #[test]
    fn digest_ignores_the_order_of_effects() {
        let mut effects = sample();
        let d = block_digest(&effects);
        effects.reverse();
        assert_eq!(block_digest(&effects), d);
        effects.swap(0, 2);
        assert_eq!(block_digest(&effects), d);
    }

    #[test]
    fn digest_sees_every_part_of_an_effect() {
        let base = block_digest(&sample());
        let mut changed_value = sample();
        changed_value[0].image = Some(vec![Value::Int(2), Value::Int(-501)]);
        let mut deleted = sample();
        deleted[0].image = None;
        let mut other_table = sample();
        other_table[3].table = "accounts2".into();
        let mut other_key = sample();
        other_key[1].key = vec![Value::Int(1)];
        let mut missing = sample();
        missing.pop();
        let mut scale = sample();
        scale[0].image = Some(vec![
            Value::Int(2),
            Value::Decimal("-500.0".parse().unwrap()),
        ]);
        for variant in [
            changed_value,
            deleted,
            other_table,
            other_key,
            missing,
            scale,
        ] {
            assert_ne!(block_digest(&variant), base);
        }
    }

    #[test]
    fn empty_block_has_a_fixed_digest() {
        // tag (u32 23 + "chainify.v1.BlockEffect") + count 0, hashed.
        let mut expected = vec![0, 0, 0, 23];
        expected.extend_from_slice(b"chainify.v1.BlockEffect");
        expected.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(block_digest(&[]), Digest::of(&expected));
    }
}
