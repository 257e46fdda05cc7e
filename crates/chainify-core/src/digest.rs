//! SHA-256 digests.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A SHA-256 digest: transaction ids, block hashes, digest-table hashes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The all-zero digest, used as `hash_previous` of block 1.
    pub const ZERO: Digest = Digest([0; 32]);

    /// SHA-256 of `data`.
    pub fn of(data: &[u8]) -> Digest {
        Digest(Sha256::digest(data).into())
    }

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl TryFrom<&[u8]> for Digest {
    type Error = DigestLengthError;
    fn try_from(bytes: &[u8]) -> Result<Self, Self::Error> {
        <[u8; 32]>::try_from(bytes)
            .map(Digest)
            .map_err(|_| DigestLengthError(bytes.len()))
    }
}

/// A byte string that should have been a 32-byte digest was not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected a 32-byte SHA-256 digest, got {0} bytes")]
pub struct DigestLengthError(pub usize);

impl FromStr for Digest {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = hex::decode(s).map_err(|e| format!("not hex: {e}"))?;
        Digest::try_from(bytes.as_slice()).map_err(|e| e.to_string())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Short form keeps logs and assertion output readable.
        write!(f, "Digest({}…)", &self.to_hex()[..12])
    }
}

/// An incremental SHA-256 hasher for callers that stream bytes (e.g. digest-table rows).
#[derive(Debug, Clone, Default)]
pub struct Hasher(Sha256);

impl Hasher {
    /// A fresh hasher.
    pub fn new() -> Self {
        Hasher(Sha256::new())
    }
    /// Feeds bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }
    /// The digest of everything fed.
    pub fn finish(self) -> Digest {
        Digest(self.0.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_abc_matches_fips_180_2() {
        assert_eq!(
            Digest::of(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn hasher_equals_one_shot() {
        let mut h = Hasher::new();
        h.update(b"a");
        h.update(b"bc");
        assert_eq!(h.finish(), Digest::of(b"abc"));
    }

    #[test]
    fn parse_rejects_wrong_length() {
        assert!("abcd".parse::<Digest>().unwrap_err().contains("2 bytes"));
        let d = Digest::of(b"x");
        assert_eq!(d.to_hex().parse::<Digest>(), Ok(d));
    }
}
