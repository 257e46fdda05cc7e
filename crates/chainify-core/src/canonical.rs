//! The canonical byte encoding of everything chainify signs or hashes.
//!
//! Protobuf bytes are not canonical (field order, default values and unknown fields may vary), so
//! signatures and hashes are computed over this encoding of the *domain* types instead. Any
//! implementation (another language, an auditor's script) can reproduce it from this page; the
//! test vectors in `tests/vectors/canonical.json` pin it.
//!
//! # Rules
//! - Every signed or hashed object starts with its **domain tag**, encoded as a string (below),
//!   e.g. `"chainify.v1.Proposal"`, so that a signature over one kind of object can never be
//!   replayed as a signature over another.
//! - `u8`: one byte. `u32`, `u64`: big-endian, fixed width. `i64`: big-endian two's complement,
//!   8 bytes. `i128`: big-endian two's complement, 16 bytes.
//! - `bool`: `0x00` or `0x01`.
//! - `bytes` and `string` (UTF-8): `u32` length, then the bytes.
//! - `digest`: the 32 bytes, no length.
//! - `option<T>`: `0x00` for none, or `0x01` followed by `T`.
//! - `list<T>`: `u32` count, then each element.
//! - `bitmap` (a list of booleans): `u32` count of bits, then `ceil(count/8)` bytes, bit *i* in byte
//!   `i/8` at position `i%8` counted from the least significant bit; unused bits are zero.
//! - `value`: a one-byte type tag, then the payload:
//!   `0x00` NULL (no payload), `0x01` integer (`i64`), `0x02` decimal (`i128` mantissa, then `u8`
//!   scale, exactly as written: `1.50` is mantissa 150, scale 2), `0x03` text (`string`),
//!   `0x04` boolean (`bool`), `0x05` bytes (`bytes`).
//!
//! Object layouts are documented on each type's `encode_canonical` in [`crate::tx`].

use crate::{Decimal, Digest, Value};

/// Builds a canonical encoding. Infallible: every domain value has exactly one encoding.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// Starts an object with its domain tag.
    pub fn new(domain_tag: &str) -> Self {
        let mut e = Encoder {
            buf: Vec::with_capacity(128),
        };
        e.str(domain_tag);
        e
    }

    /// An encoder without a domain tag, for values embedded in other encodings (e.g. digest rows).
    pub fn untagged() -> Self {
        Encoder::default()
    }

    /// The encoded bytes.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }

    /// Appends one byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// Appends a big-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Appends a big-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Appends a big-endian two's complement `i64`.
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Appends a big-endian two's complement `i128`.
    pub fn i128(&mut self, v: i128) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// Appends a boolean.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(u8::from(v))
    }
    /// Appends a length-prefixed byte string.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(len_u32(v.len()));
        self.buf.extend_from_slice(v);
        self
    }
    /// Appends a length-prefixed UTF-8 string.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    /// Appends a digest's 32 bytes.
    pub fn digest(&mut self, d: &Digest) -> &mut Self {
        self.buf.extend_from_slice(&d.0);
        self
    }
    /// Appends a list count.
    pub fn count(&mut self, n: usize) -> &mut Self {
        self.u32(len_u32(n))
    }
    /// Appends an optional `u64`.
    pub fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            None => self.u8(0),
            Some(v) => self.u8(1).u64(v),
        }
    }
    /// Appends a bitmap.
    pub fn bitmap(&mut self, bits: &[bool]) -> &mut Self {
        self.count(bits.len());
        self.buf.extend_from_slice(&pack_bits(bits));
        self
    }
    /// Appends a typed value.
    pub fn value(&mut self, v: &Value) -> &mut Self {
        match v {
            Value::Null => self.u8(0),
            Value::Int(i) => self.u8(1).i64(*i),
            Value::Decimal(d) => self.u8(2).decimal(d),
            Value::Text(s) => self.u8(3).str(s),
            Value::Bool(b) => self.u8(4).bool(*b),
            Value::Bytes(b) => self.u8(5).bytes(b),
        }
    }
    fn decimal(&mut self, d: &Decimal) -> &mut Self {
        self.i128(d.mantissa()).u8(d.scale())
    }
}

/// Lengths above 4 GiB cannot occur: every wire message is far smaller (gRPC limits), and domain
/// types are only built from validated wire messages.
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Packs booleans LSB-first into bytes (the bitmap layout above, without the count).
pub fn pack_bits(bits: &[bool]) -> Vec<u8> {
    let mut out = vec![0u8; bits.len().div_ceil(8)];
    for (i, _) in bits.iter().enumerate().filter(|(_, b)| **b) {
        out[i / 8] |= 1 << (i % 8);
    }
    out
}

/// Unpacks `count` bits packed by [`pack_bits`]; `None` when the byte length is wrong or an unused
/// bit is set (a second encoding of the same bitmap would break canonicity).
pub fn unpack_bits(bytes: &[u8], count: usize) -> Option<Vec<bool>> {
    if bytes.len() != count.div_ceil(8) {
        return None;
    }
    let bits: Vec<bool> = (0..count)
        .map(|i| bytes[i / 8] & (1 << (i % 8)) != 0)
        .collect();
    (pack_bits(&bits) == bytes).then_some(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_round_trip_and_rejects_stray_bits() {
        let bits = [true, false, true, true, false, false, false, false, true];
        let packed = pack_bits(&bits);
        assert_eq!(packed, vec![0b0000_1101, 0b0000_0001]);
        assert_eq!(unpack_bits(&packed, bits.len()).unwrap(), bits);
        assert_eq!(unpack_bits(&[0b0000_0010], 1), None);
        assert_eq!(unpack_bits(&[0, 0], 8), None);
    }

    #[test]
    fn hand_checked_value_encodings() {
        let mut e = Encoder::untagged();
        e.value(&Value::Int(-2))
            .value(&Value::Null)
            .value(&Value::Text("é".into()));
        assert_eq!(
            hex::encode(e.finish()),
            concat!("01fffffffffffffffe", "00", "0300000002c3a9")
        );
    }
}
