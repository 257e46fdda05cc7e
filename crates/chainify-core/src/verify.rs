//! How an organization checks signatures: one rule everywhere, in batches, on all cores, and
//! never twice for the same signature.
//!
//! **The rule.** Every check (single or batched, at admission, in block validation, in
//! `verify-ledger`) applies ZIP 215 through `ed25519-zebra`: a batch verifies exactly when
//! each of its signatures verifies alone. Organizations validate an ordered block
//! deterministically, so how one of them groups the block's signatures into batches, or how many
//! cores it has, must never change a verdict; with the cofactorless rule of most libraries a
//! client could craft a signature that passes in a batch and fails alone, and split the
//! organizations.
//!
//! **Batches.** [`verify_many`] splits the signatures over the cores, verifies each share as one
//! batch (about twice as fast per signature as single checks) and, only when a share fails,
//! each of its signatures alone to name the bad ones.
//!
//! **Never twice.** A [`Verifier`] belongs to one organization and remembers the (key, message,
//! signature) triples it verified or made: the proposals and responses its admission checked come
//! back in ordered blocks, and its own endorsements come back signed by itself. Verification is
//! deterministic, so a remembered triple verifies again; the memory is bounded.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};

use crate::Digest;
use crate::crypto::{CryptoError, PublicKey, Signature, Signatures, SigningKey};

/// Signatures in one share of [`verify_many`] below which splitting over cores costs more than
/// it saves.
const MIN_SHARE: usize = 16;

/// Triples a [`Verifier`] remembers (about 5 MB): thousands of transactions between admission
/// and execution, each with a client signature and a few endorsements.
pub const REMEMBERED: usize = 1 << 16;

/// One signature to check: the signer's key, the signed bytes and the signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedBytes {
    /// The signer's public key.
    pub key: PublicKey,
    /// The canonical encoding that was signed.
    pub message: Vec<u8>,
    /// The signature.
    pub signature: Signature,
}

impl SignedBytes {
    /// Checks the signature alone (ZIP 215).
    pub fn verify(&self) -> Result<(), CryptoError> {
        verify_one(&self.key, &self.message, &self.signature)
    }

    /// What a [`Verifier`] remembers: the triple's hash.
    fn fingerprint(&self) -> Digest {
        let mut bytes = Vec::with_capacity(32 + 64 + self.message.len());
        bytes.extend_from_slice(&self.key.0);
        bytes.extend_from_slice(&self.signature.0);
        bytes.extend_from_slice(&self.message);
        Digest::of(&bytes)
    }
}

/// Checks one signature (ZIP 215).
pub(crate) fn verify_one(
    key: &PublicKey,
    message: &[u8],
    signature: &Signature,
) -> Result<(), CryptoError> {
    let key =
        ed25519_zebra::VerificationKey::try_from(key.0).map_err(|_| CryptoError::BadSignature)?;
    key.verify(&ed25519_zebra::Signature::from(signature.0), message)
        .map_err(|_| CryptoError::BadSignature)
}

/// Whether each signature verifies, in order: shares of the input, one per core, each
/// verified as a batch (and one by one only when its batch fails).
pub fn verify_many(items: &[SignedBytes]) -> Vec<bool> {
    // Asking the OS reads cgroup files: once per process.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let share = items.len().div_ceil(cores).max(MIN_SHARE);
    if items.len() <= share {
        return verify_share(items);
    }
    std::thread::scope(|scope| {
        let shares: Vec<_> = items
            .chunks(share)
            .map(|chunk| (chunk.len(), scope.spawn(move || verify_share(chunk))))
            .collect();
        shares
            .into_iter()
            .flat_map(|(len, s)| {
                // A panic in a share is a bug in the library: count its signatures as bad
                // rather than accept them.
                s.join().unwrap_or_else(|_| vec![false; len])
            })
            .collect()
    })
}

fn verify_share(items: &[SignedBytes]) -> Vec<bool> {
    if items.is_empty() {
        return Vec::new();
    }
    let mut batch = ed25519_zebra::batch::Verifier::new();
    for item in items {
        batch.queue((
            ed25519_zebra::VerificationKeyBytes::from(item.key.0),
            ed25519_zebra::Signature::from(item.signature.0),
            &item.message,
        ));
    }
    if batch.verify(rand_core::OsRng).is_ok() {
        return vec![true; items.len()];
    }
    items.iter().map(|i| i.verify().is_ok()).collect()
}

/// One organization's signature checks: the network's [`Signatures`] setting, and the triples
/// it already verified or made (see the module docs).
#[derive(Debug)]
pub struct Verifier {
    signatures: Signatures,
    remembered: Mutex<Remembered>,
}

#[derive(Debug, Default)]
struct Remembered {
    set: HashSet<Digest>,
    order: VecDeque<Digest>,
}

impl Remembered {
    fn insert(&mut self, fingerprint: Digest) {
        if self.set.insert(fingerprint) {
            self.order.push_back(fingerprint);
            if self.order.len() > REMEMBERED
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }
}

impl Verifier {
    /// A verifier that remembers nothing yet.
    pub fn new(signatures: Signatures) -> Verifier {
        Verifier {
            signatures,
            remembered: Mutex::default(),
        }
    }

    /// Whether the network signs and checks at all.
    pub fn signatures(&self) -> Signatures {
        self.signatures
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks one signature, or accepts when signatures are off.
    pub fn check(&self, item: &SignedBytes) -> Result<(), CryptoError> {
        self.check_all(std::slice::from_ref(item))[0]
            .then_some(())
            .ok_or(CryptoError::BadSignature)
    }

    /// Whether each signature verifies (all do when signatures are off): remembered triples
    /// without work, the rest with [`verify_many`].
    pub fn check_all(&self, items: &[SignedBytes]) -> Vec<bool> {
        if self.signatures == Signatures::Off {
            return vec![true; items.len()];
        }
        let fingerprints: Vec<Digest> = items.iter().map(SignedBytes::fingerprint).collect();
        let mut verdicts = vec![true; items.len()];
        let unknown: Vec<usize> = {
            let remembered = self.remembered();
            (0..items.len())
                .filter(|i| !remembered.set.contains(&fingerprints[*i]))
                .collect()
        };
        if unknown.is_empty() {
            return verdicts;
        }
        let fresh: Vec<SignedBytes> = unknown.iter().map(|i| items[*i].clone()).collect();
        let checked = verify_many(&fresh);
        let mut remembered = self.remembered();
        for (i, ok) in unknown.into_iter().zip(checked) {
            verdicts[i] = ok;
            if ok {
                remembered.insert(fingerprints[i]);
            }
        }
        verdicts
    }

    /// Signs `message` (or not, when signatures are off) and remembers the signature: the
    /// organization never checks its own signature.
    pub fn sign(&self, key: &SigningKey, message: Vec<u8>) -> Signature {
        let signature = self.signatures.sign(key, &message);
        if self.signatures == Signatures::Ed25519 {
            let item = SignedBytes {
                key: key.public_key(),
                message,
                signature,
            };
            self.remembered().insert(item.fingerprint());
        }
        signature
    }

    /// How many triples it remembers (at most [`REMEMBERED`]).
    pub fn remembered_len(&self) -> usize {
        self.remembered().set.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(seed: u8, message: &[u8]) -> SignedBytes {
        let key = SigningKey::from_seed(&[seed; 32]);
        SignedBytes {
            key: key.public_key(),
            message: message.to_vec(),
            signature: key.sign(message),
        }
    }

    fn forged(seed: u8, message: &[u8]) -> SignedBytes {
        let mut s = signed(seed, message);
        s.message.push(b'!');
        s
    }

    #[test]
    fn batches_name_exactly_the_bad_signatures_wherever_they_stand() {
        for n in [1, 2, 16, 17, 40] {
            for bad in [0, n / 2, n - 1] {
                let items: Vec<SignedBytes> = (0..n)
                    .map(|i| {
                        let m = format!("message {i}");
                        let seed = u8::try_from(i % 7).unwrap();
                        if i == bad {
                            forged(seed, m.as_bytes())
                        } else {
                            signed(seed, m.as_bytes())
                        }
                    })
                    .collect();
                let verdicts = verify_many(&items);
                let expected: Vec<bool> = (0..n).map(|i| i != bad).collect();
                assert_eq!(verdicts, expected, "{n} signatures, bad at {bad}");
                let alone: Vec<bool> = items.iter().map(|i| i.verify().is_ok()).collect();
                assert_eq!(verdicts, alone, "batched and single checks agree");
            }
        }
        assert!(verify_many(&[]).is_empty());
    }

    #[test]
    fn ring_signatures_verify_under_the_consensus_rule_and_tampering_fails() {
        let item = signed(3, b"block 7");
        assert!(item.verify().is_ok());
        let mut other_key = item.clone();
        other_key.key = SigningKey::from_seed(&[4; 32]).public_key();
        assert!(other_key.verify().is_err());
        let mut flipped = item.clone();
        flipped.signature.0[10] ^= 1;
        assert!(flipped.verify().is_err());
        // A signature whose S is not reduced mod l is refused (ZIP 215 keeps RFC 8032's check).
        let mut unreduced = item;
        unreduced.signature.0[63] |= 0xf0;
        assert!(unreduced.verify().is_err());
    }

    /// The signature that splits organizations under other rules: a small-order public key and
    /// an `R` of order 8 with `S = 0` verify under the cofactored equation (ZIP 215, and every
    /// batch) but not the cofactorless one (ring, and most single checks). Here single and
    /// batched checks agree on it, wherever it stands in a batch.
    #[test]
    fn a_crafted_small_order_signature_gets_one_verdict_alone_and_in_any_batch() {
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let order_8 =
            hex::decode("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05")
                .unwrap();
        let mut signature = [0u8; 64];
        signature[..32].copy_from_slice(&order_8);
        let crafted = SignedBytes {
            key: PublicKey(identity),
            message: b"pay mallory".to_vec(),
            signature: Signature(signature),
        };
        let cofactorless =
            ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, identity)
                .verify(&crafted.message, &signature);
        assert!(cofactorless.is_err(), "ring's rule refuses it");
        assert!(crafted.verify().is_ok(), "ZIP 215 accepts it");
        for n in [1usize, 5, 40] {
            let mut items: Vec<SignedBytes> = (0..n)
                .map(|i| signed(2, format!("m{i}").as_bytes()))
                .collect();
            items.insert(n / 2, crafted.clone());
            let mut with_bad = items.clone();
            with_bad.push(forged(3, b"x"));
            let mut expected = vec![true; n + 1];
            assert_eq!(verify_many(&items), expected);
            expected.push(false);
            assert_eq!(verify_many(&with_bad), expected);
        }
    }

    #[test]
    fn a_verifier_remembers_what_verified_and_what_it_signed_but_never_a_failure() {
        let v = Verifier::new(Signatures::Ed25519);
        let good = signed(1, b"a");
        let bad = forged(1, b"b");
        assert_eq!(v.check_all(&[good.clone(), bad.clone()]), [true, false]);
        assert_eq!(v.remembered_len(), 1);
        // Checked again: the good one from memory, the bad one fails again.
        assert_eq!(v.check_all(&[bad.clone(), good.clone()]), [false, true]);
        assert_eq!(v.remembered_len(), 1);
        // The same key and message with another (bad) signature is not the remembered triple.
        let mut other = good.clone();
        other.signature.0[0] ^= 1;
        assert!(v.check(&other).is_err());

        let key = SigningKey::from_seed(&[9; 32]);
        let signature = v.sign(&key, b"mine".to_vec());
        assert_eq!(v.remembered_len(), 2);
        let mine = SignedBytes {
            key: key.public_key(),
            message: b"mine".to_vec(),
            signature,
        };
        assert!(mine.verify().is_ok());
        assert!(v.check(&mine).is_ok());
    }

    #[test]
    fn memory_is_bounded_and_forgets_the_oldest() {
        let mut r = Remembered::default();
        for i in 0..(REMEMBERED + 10) {
            r.insert(Digest::of(&i.to_le_bytes()));
        }
        assert_eq!(r.set.len(), REMEMBERED);
        assert_eq!(r.order.len(), REMEMBERED);
        assert!(!r.set.contains(&Digest::of(&0usize.to_le_bytes())));
        assert!(r.set.contains(&Digest::of(&(REMEMBERED + 9).to_le_bytes())));
    }

    #[test]
    fn with_signatures_off_nothing_is_checked_or_signed() {
        let v = Verifier::new(Signatures::Off);
        assert_eq!(v.check_all(&[forged(1, b"x")]), [true]);
        let key = SigningKey::from_seed(&[2; 32]);
        assert_eq!(v.sign(&key, b"m".to_vec()), Signature([0; 64]));
        assert_eq!(v.remembered_len(), 0);
    }
}
