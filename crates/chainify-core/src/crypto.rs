//! Ed25519 keys (made and read by ring, stored as PKCS#8 DER files) and signatures (made by
//! `ed25519-zebra` from the key's seed, checked as [`crate::verify`] says).
//!
//! Ed25519 signing is deterministic (RFC 8032): both libraries make the same bytes for a key and
//! a message, and ed25519-zebra's precomputed base-point tables make them ~25 % faster here
//! (18 µs against 24 µs), which counts three times a transaction in a network.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use ring::rand::SystemRandom;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};

/// A key or signature could not be created, loaded or checked.
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    /// The key file could not be read.
    #[error("cannot read key file {path}: {source}")]
    ReadKey {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bytes are not an Ed25519 PKCS#8 document.
    #[error("{what} is not an Ed25519 PKCS#8 key: {reason}")]
    BadKey {
        /// Where the bytes came from.
        what: String,
        /// ring's reason, or where the seed was not found.
        reason: String,
    },
    /// Key generation failed (no system randomness).
    #[error("cannot generate an Ed25519 key: no system randomness")]
    Generate,
    /// The operating system gave no random bytes.
    #[error("no system randomness")]
    Random,
    /// A public key or signature had the wrong length or encoding.
    #[error("{0}")]
    Malformed(String),
    /// The signature does not verify.
    #[error("signature does not verify")]
    BadSignature,
}

/// An Ed25519 signing key. Its secret is held once, and wiped when the key is dropped.
pub struct SigningKey {
    signer: ed25519_zebra::SigningKey,
    public: PublicKey,
}

impl Drop for SigningKey {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.signer);
    }
}

/// The seed of an Ed25519 PKCS#8 document (RFC 8410) that ring accepted: DER is canonical, so
/// in both versions (v2 adds the public key after the seed, either may carry attributes after
/// it) the seed's 32 bytes follow the same 16 bytes of header, whose second byte is the
/// document's length (short form: ring reads no document of 128 bytes or more).
fn seed_of(der: &[u8]) -> Option<[u8; 32]> {
    const ALGORITHM_AND_SEED: [u8; 11] = [
        0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
    ];
    let (&[sequence, length, 0x02, 0x01, version], rest) = der.split_first_chunk::<5>()? else {
        return None;
    };
    let (header, rest) = rest.split_at_checked(11)?;
    if sequence != 0x30
        || usize::from(length) + 2 != der.len()
        || version > 1
        || header != ALGORITHM_AND_SEED
    {
        return None;
    }
    rest.get(..32)?.try_into().ok()
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        write!(f, "SigningKey(public {})", self.public_key())
    }
}

/// `N` bytes from the operating system's secure generator (nonces no one can guess ahead).
pub fn random_bytes<const N: usize>() -> Result<[u8; N], CryptoError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; N];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| CryptoError::Random)?;
    Ok(bytes)
}

impl SigningKey {
    /// Generates a key; returns it with its PKCS#8 DER encoding (to be written to a file).
    pub fn generate() -> Result<(SigningKey, Vec<u8>), CryptoError> {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| CryptoError::Generate)?;
        let key = SigningKey::from_pkcs8(doc.as_ref(), "generated key")?;
        Ok((key, doc.as_ref().to_vec()))
    }

    /// A key from a 32-byte Ed25519 seed (RFC 8032 secret key): deterministic keys for test
    /// vectors and reproducible test networks. Production keys come from [`SigningKey::generate`].
    pub fn from_seed(seed: &[u8; 32]) -> SigningKey {
        // A 32-byte seed is always a valid Ed25519 secret key.
        SigningKey::of_seed(*seed)
    }

    /// The key of `seed`, which is wiped.
    fn of_seed(mut seed: [u8; 32]) -> SigningKey {
        let signer = ed25519_zebra::SigningKey::from(seed);
        zeroize::Zeroize::zeroize(&mut seed);
        let public = PublicKey(ed25519_zebra::VerificationKey::from(&signer).into());
        SigningKey { signer, public }
    }

    /// Parses PKCS#8 DER; `what` names the source in errors.
    pub fn from_pkcs8(der: &[u8], what: &str) -> Result<SigningKey, CryptoError> {
        let bad = |reason: String| CryptoError::BadKey {
            what: what.to_owned(),
            reason,
        };
        let pair =
            Ed25519KeyPair::from_pkcs8_maybe_unchecked(der).map_err(|e| bad(e.to_string()))?;
        let key = seed_of(der)
            .map(SigningKey::of_seed)
            .ok_or_else(|| bad("its seed is not where RFC 8410 puts it".into()))?;
        // What ring derives from the document is what the signatures will be checked against.
        if pair.public_key().as_ref() != key.public.0 {
            return Err(bad("its seed does not give the key ring reads".into()));
        }
        Ok(key)
    }

    /// Loads a PKCS#8 DER key file.
    pub fn load(path: &Path) -> Result<SigningKey, CryptoError> {
        let der = std::fs::read(path).map_err(|source| CryptoError::ReadKey {
            path: path.display().to_string(),
            source,
        })?;
        SigningKey::from_pkcs8(&der, &path.display().to_string())
    }

    /// The matching public key.
    pub fn public_key(&self) -> PublicKey {
        self.public
    }

    /// Signs a message (the canonical encoding of the signed object).
    pub fn sign(&self, message: &[u8]) -> Signature {
        Signature(self.signer.sign(message).into())
    }
}

/// An Ed25519 public key (32 bytes; hex in config files).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    /// Verifies `signature` over `message` by RFC 8032's cofactorless check (ring): what the
    /// `ed25519` rule applies, and accepted under every rule. A network's checks go through
    /// [`Signatures::verify`], which applies the network's rule.
    pub fn verify(&self, message: &[u8], signature: &Signature) -> Result<(), CryptoError> {
        UnparsedPublicKey::new(&ED25519, &self.0)
            .verify(message, &signature.0)
            .map_err(|_| CryptoError::BadSignature)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", hex::encode(&self.0[..6]))
    }
}

impl FromStr for PublicKey {
    type Err = CryptoError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = hex::decode(s).map_err(|e| {
            CryptoError::Malformed(format!(
                "public key is not hex ({e}); expected 64 hex digits"
            ))
        })?;
        let key = <[u8; 32]>::try_from(bytes.as_slice())
            .map(PublicKey)
            .map_err(|_| {
                CryptoError::Malformed(format!(
                    "public key has {} bytes; an Ed25519 public key has 32 (64 hex digits)",
                    bytes.len()
                ))
            })?;
        key.check_usable()?;
        Ok(key)
    }
}

impl PublicKey {
    /// Refuses a key no signature can prove anything for: not a point of the curve (nothing
    /// verifies), or a point of small order (under ZIP 215 anyone can sign for it).
    pub fn check_usable(&self) -> Result<(), CryptoError> {
        let point = curve25519_dalek::edwards::CompressedEdwardsY(self.0)
            .decompress()
            .ok_or_else(|| {
                CryptoError::Malformed(format!("public key {self} is not a point of Ed25519"))
            })?;
        if point.is_small_order() {
            return Err(CryptoError::Malformed(format!(
                "public key {self} is a point of small order: anyone could sign for it"
            )));
        }
        Ok(())
    }
}

/// An Ed25519 signature (64 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signature(pub [u8; 64]);

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({}…)", hex::encode(&self.0[..6]))
    }
}

impl TryFrom<&[u8]> for Signature {
    type Error = CryptoError;
    fn try_from(bytes: &[u8]) -> Result<Self, Self::Error> {
        <[u8; 64]>::try_from(bytes).map(Signature).map_err(|_| {
            CryptoError::Malformed(format!(
                "signature has {} bytes; an Ed25519 signature has 64",
                bytes.len()
            ))
        })
    }
}

/// Whether a network signs and checks proposals, early-abort responses, votes and queries, and
/// by which rule (every organization applies the network's; see [`crate::verify`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Signatures {
    /// Ed25519 checked by RFC 8032's cofactorless rule, one signature at a time: networks made
    /// before ZIP 215, and network files that name no rule.
    #[default]
    #[serde(rename = "ed25519")]
    Ed25519,
    /// Ed25519 checked by ZIP 215, under which batched and single checks agree, so blocks'
    /// signatures are checked in batches. What `chainify init` writes.
    #[serde(rename = "ed25519-zip215")]
    Ed25519Zip215,
    /// Nothing signed or checked. Exists only to measure what signatures cost (the crypto switch
    /// of the paper's Fig. 9): such a network trusts every client, organization and orderer.
    #[serde(rename = "off")]
    Off,
}

impl Signatures {
    /// Whether anything is signed and checked.
    pub fn is_signed(self) -> bool {
        self != Signatures::Off
    }

    /// Signs `message` with `key`, or returns the all-zero signature when signatures are off.
    pub fn sign(self, key: &SigningKey, message: &[u8]) -> Signature {
        if self.is_signed() {
            key.sign(message)
        } else {
            Signature([0; 64])
        }
    }

    /// Checks one signature by this rule (accepts anything when signatures are off).
    pub fn verify(self, signed: &crate::verify::SignedBytes) -> Result<(), CryptoError> {
        signed.verify(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signatures are RFC 8032's, byte for byte as ring makes them, for keys from a seed
    /// and from both PKCS#8 versions; a document whose seed is elsewhere is refused by name.
    #[test]
    fn signatures_are_ring_s_and_keys_read_from_either_pkcs8_version() {
        let rng = SystemRandom::new();
        for seed in [[0u8; 32], [7; 32], [255; 32]] {
            let ring = Ed25519KeyPair::from_seed_unchecked(&seed).unwrap();
            let key = SigningKey::from_seed(&seed);
            assert_eq!(key.public_key().0, ring.public_key().as_ref());
            for message in [&b""[..], b"m", &[0xab; 1000]] {
                assert_eq!(key.sign(message).0, ring.sign(message).as_ref());
            }
        }
        let v2 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let v2 = v2.as_ref();
        let ring = Ed25519KeyPair::from_pkcs8(v2).unwrap();
        let key = SigningKey::from_pkcs8(v2, "v2").unwrap();
        assert_eq!(key.sign(b"m").0, ring.sign(b"m").as_ref());
        // Version 1 holds the seed alone.
        let mut v1 = vec![0x30, 0x2e, 0x02, 0x01, 0x00];
        v1.extend_from_slice(&v2[5..48]);
        let key = SigningKey::from_pkcs8(&v1, "v1").unwrap();
        assert_eq!(key.sign(b"m").0, ring.sign(b"m").as_ref());
        assert_eq!(seed_of(&v1), seed_of(v2));
        // With (empty) attributes after the seed, which ring reads.
        let mut attributes = v1.clone();
        attributes.extend_from_slice(&[0xa0, 0x00]);
        attributes[1] += 2;
        let ring = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&attributes).unwrap();
        let key = SigningKey::from_pkcs8(&attributes, "attributes").unwrap();
        assert_eq!(key.sign(b"m").0, ring.sign(b"m").as_ref());
        // A length that is not the document's.
        let mut wrong = v1.clone();
        wrong[1] += 1;
        assert_eq!(seed_of(&wrong), None);
        // A header other than RFC 8410's, and a document cut short.
        let mut moved = v2.to_vec();
        moved[10] = 0x71;
        assert_eq!(seed_of(&moved), None);
        assert_eq!(seed_of(&v2[..40]), None);
        let e = SigningKey::from_pkcs8(&v2[..40], "short.der")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("short.der is not an Ed25519 PKCS#8 key"),
            "{e}"
        );
    }

    #[test]
    fn signatures_off_neither_signs_nor_checks() {
        let key = SigningKey::from_seed(&[7; 32]);
        let on = Signatures::Ed25519.sign(&key, b"m");
        assert!(key.public_key().verify(b"m", &on).is_ok());
        let off = Signatures::Off.sign(&key, b"m");
        assert_eq!(off, Signature([0; 64]));
        let bad = crate::verify::SignedBytes {
            key: key.public_key(),
            message: b"m".to_vec(),
            signature: off,
        };
        assert!(Signatures::Ed25519.verify(&bad).is_err());
        assert!(Signatures::Ed25519Zip215.verify(&bad).is_err());
        assert!(Signatures::Off.verify(&bad).is_ok());
    }

    #[test]
    fn keys_no_signature_can_prove_anything_for_are_refused_by_name() {
        let identity = format!("01{}", "00".repeat(31));
        let e = identity.parse::<PublicKey>().unwrap_err().to_string();
        assert!(e.contains("small order") && e.contains(&identity), "{e}");
        let order_8 = "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05";
        assert!(
            order_8
                .parse::<PublicKey>()
                .unwrap_err()
                .to_string()
                .contains("small order")
        );
        let off_curve: Vec<String> = (2u8..40)
            .map(|y| format!("{y:02x}{}", "00".repeat(31)))
            .filter(|k| k.parse::<PublicKey>().is_err())
            .collect();
        assert!(!off_curve.is_empty());
        for k in off_curve {
            let e = k.parse::<PublicKey>().unwrap_err().to_string();
            assert!(
                e.contains("not a point of Ed25519") && e.contains(&k),
                "{e}"
            );
        }
        let real = SigningKey::from_seed(&[1; 32]).public_key();
        assert_eq!(real.to_string().parse::<PublicKey>().unwrap(), real);
    }

    #[test]
    fn the_rule_is_named_in_the_network_file_and_defaults_to_rfc_8032() {
        #[derive(serde::Deserialize)]
        struct File {
            #[serde(default)]
            signatures: Signatures,
        }
        let rule = |toml: &str| toml::from_str::<File>(toml).map(|f| f.signatures);
        assert_eq!(rule("").unwrap(), Signatures::Ed25519);
        assert_eq!(
            rule("signatures = \"ed25519\"").unwrap(),
            Signatures::Ed25519
        );
        assert_eq!(
            rule("signatures = \"ed25519-zip215\"").unwrap(),
            Signatures::Ed25519Zip215
        );
        assert_eq!(rule("signatures = \"off\"").unwrap(), Signatures::Off);
        let e = rule("signatures = \"zip215\"").unwrap_err().to_string();
        assert!(e.contains("ed25519-zip215"), "{e}");
    }

    #[test]
    fn sign_verify_and_tamper() {
        let (key, der) = SigningKey::generate().unwrap();
        let sig = key.sign(b"block 7");
        let pk = key.public_key();
        pk.verify(b"block 7", &sig).unwrap();
        assert!(matches!(
            pk.verify(b"block 8", &sig),
            Err(CryptoError::BadSignature)
        ));
        let reloaded = SigningKey::from_pkcs8(&der, "test").unwrap();
        assert_eq!(reloaded.public_key(), pk);
        assert_eq!(pk.to_string().parse::<PublicKey>().unwrap(), pk);
    }

    #[test]
    fn rfc8032_test_vector_1() {
        let seed = hex::decode("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
            .unwrap();
        let key = SigningKey::from_seed(&seed.try_into().unwrap());
        assert_eq!(
            key.public_key().to_string(),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
        assert_eq!(
            hex::encode(key.sign(b"").0),
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
        );
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pk8");
        let err = SigningKey::load(&missing).unwrap_err().to_string();
        assert!(err.contains("nope.pk8"), "{err}");
        let junk = dir.path().join("junk.pk8");
        std::fs::write(&junk, b"not a key").unwrap();
        let err = SigningKey::load(&junk).unwrap_err().to_string();
        assert!(err.contains("junk.pk8") && err.contains("PKCS#8"), "{err}");
    }

    #[test]
    fn malformed_public_keys_and_signatures_are_named() {
        assert!(
            "zz".parse::<PublicKey>()
                .unwrap_err()
                .to_string()
                .contains("not hex")
        );
        assert!(
            "abcd"
                .parse::<PublicKey>()
                .unwrap_err()
                .to_string()
                .contains("2 bytes")
        );
        assert!(
            Signature::try_from(&[0u8; 63][..])
                .unwrap_err()
                .to_string()
                .contains("63 bytes")
        );
    }
}
