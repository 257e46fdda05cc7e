//! How an organization checks signatures: one rule per network, on all cores, in batches where
//! the rule allows, and never twice for the same signature.
//!
//! **The rule** is the network file's `signatures` ([`Signatures`]), so every organization
//! applies the same one to every check (admission, block validation, votes, `verify-ledger`):
//! - `ed25519-zip215` (what `chainify init` writes): ZIP 215 through `ed25519-zebra`, under
//!   which a batch verifies exactly when each of its signatures verifies alone. Organizations
//!   validate an ordered block deterministically, so how one of them groups the block's
//!   signatures into batches, or how many cores it has, must never change a verdict.
//! - `ed25519` (networks made before, and files that name no rule): RFC 8032's cofactorless
//!   check through ring, one signature at a time. A client can craft a signature (a torsion
//!   component in `R`) that this rule refuses and any cofactored batch accepts, so these networks
//!   never batch. The two rules differ on such signatures: a network changes rule only with every
//!   organization at once, never in a rolling upgrade (docs/operations.md).
//!
//! **Batches.** [`verify_many`] splits the signatures over the cores; under ZIP 215 it verifies
//! each share as one batch (about twice as fast per signature as single checks) and, when a
//! batch fails, halves it until the bad signatures are found, so a forger pays for his own.
//!
//! **Never twice.** A [`Verifier`] belongs to one organization and remembers the (key, message,
//! signature) triples it verified or made: the proposals and responses its admission checked come
//! back in ordered blocks, and its own endorsements come back signed by itself. Verification is
//! deterministic, so a remembered triple verifies again; the memory is bounded.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use crate::crypto::{CryptoError, PublicKey, Signature, Signatures, SigningKey};
use crate::recent::Recent;
use crate::{Digest, Hasher};

/// Signatures in one share of [`verify_many`] below which splitting over cores costs more than
/// it saves.
const MIN_SHARE: usize = 16;

/// Triples a [`Verifier`] remembers, at most (between half of it and all; about 4 MB, allocated
/// with the verifier): thousands of transactions between admission and execution, each with a
/// client signature and a few endorsements.
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
    /// Checks the signature alone under `rule`.
    pub fn verify(&self, rule: Signatures) -> Result<(), CryptoError> {
        match rule {
            Signatures::Off => Ok(()),
            Signatures::Ed25519 => self.key.verify(&self.message, &self.signature),
            Signatures::Ed25519Zip215 => zip215(&self.key, &self.message, &self.signature),
        }
    }

    /// What a [`Verifier`] remembers: the triple's hash.
    fn fingerprint(&self) -> Digest {
        // Fixed-width key and signature first: the concatenation is unambiguous.
        let mut h = Hasher::new();
        h.update(&self.key.0);
        h.update(&self.signature.0);
        h.update(&self.message);
        h.finish()
    }
}

/// Checks one signature under ZIP 215.
fn zip215(key: &PublicKey, message: &[u8], signature: &Signature) -> Result<(), CryptoError> {
    let key =
        ed25519_zebra::VerificationKey::try_from(key.0).map_err(|_| CryptoError::BadSignature)?;
    key.verify(&ed25519_zebra::Signature::from(signature.0), message)
        .map_err(|_| CryptoError::BadSignature)
}

/// Whether each signature verifies under `rule`, in order: shares of the input, one per core,
/// each verified as batches under ZIP 215 and one by one under RFC 8032.
pub fn verify_many(rule: Signatures, items: &[&SignedBytes]) -> Vec<bool> {
    if rule == Signatures::Off {
        return vec![true; items.len()];
    }
    // Asking the OS reads cgroup files: once per process.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let share = items.len().div_ceil(cores).max(MIN_SHARE);
    if items.len() <= share {
        return verify_share(rule, items);
    }
    std::thread::scope(|scope| {
        let shares: Vec<_> = items
            .chunks(share)
            .map(|chunk| scope.spawn(move || verify_share(rule, chunk)))
            .collect();
        shares
            .into_iter()
            // A panic (no randomness for the batch, a bug) is the caller's failure, never a
            // verdict: verdicts must not depend on how the signatures were split.
            .flat_map(|s| s.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Below this a failed batch is checked one by one rather than halved again.
const SMALLEST_BATCH: usize = 4;

/// Whether `items` verify as one ZIP 215 batch: exactly when each of them does.
fn batch_verifies<'a>(items: impl Iterator<Item = &'a SignedBytes>) -> bool {
    let mut batch = ed25519_zebra::batch::Verifier::new();
    for item in items {
        batch.queue((
            ed25519_zebra::VerificationKeyBytes::from(item.key.0),
            ed25519_zebra::Signature::from(item.signature.0),
            &item.message,
        ));
    }
    batch.verify(rand_core::OsRng).is_ok()
}

fn verify_share(rule: Signatures, items: &[&SignedBytes]) -> Vec<bool> {
    if rule != Signatures::Ed25519Zip215 || items.len() < SMALLEST_BATCH {
        return items.iter().map(|i| i.verify(rule).is_ok()).collect();
    }
    if batch_verifies(items.iter().copied()) {
        return vec![true; items.len()];
    }
    let (left, right) = items.split_at(items.len() / 2);
    let mut verdicts = verify_share(rule, left);
    verdicts.extend(verify_share(rule, right));
    verdicts
}

/// One organization's signature checks: the network's [`Signatures`] setting, and the triples
/// it already verified or made (see the module docs).
#[derive(Debug)]
pub struct Verifier {
    signatures: Signatures,
    remembered: Mutex<Recent<Digest, ()>>,
}

impl Verifier {
    /// A verifier that remembers nothing yet.
    pub fn new(signatures: Signatures) -> Verifier {
        Verifier {
            signatures,
            // Nothing is remembered without signatures: no memory for it.
            remembered: Mutex::new(Recent::new(if signatures.is_signed() {
                REMEMBERED
            } else {
                0
            })),
        }
    }

    /// The rule it checks by (the network's).
    pub fn signatures(&self) -> Signatures {
        self.signatures
    }

    fn remembered(&self) -> std::sync::MutexGuard<'_, Recent<Digest, ()>> {
        self.remembered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks one signature (alone: no batch of one), or accepts when signatures are off.
    pub fn check(&self, item: &SignedBytes) -> Result<(), CryptoError> {
        if !self.signatures.is_signed() {
            return Ok(());
        }
        let fingerprint = item.fingerprint();
        if self.remembered().contains(&fingerprint) {
            return Ok(());
        }
        item.verify(self.signatures)?;
        self.remembered().insert(fingerprint, ());
        Ok(())
    }

    /// Whether every one of `items` is remembered (or signatures are off): then they all
    /// verify, found by hashing alone.
    pub fn remembers_all(&self, items: &[SignedBytes]) -> bool {
        if !self.signatures.is_signed() {
            return true;
        }
        // Hashed one at a time, up to the first one not remembered.
        items.iter().all(|item| {
            let fingerprint = item.fingerprint();
            self.remembered().contains(&fingerprint)
        })
    }

    /// Whether each signature verifies (all do when signatures are off): remembered triples
    /// without work, the rest with [`verify_many`].
    pub fn check_all(&self, items: &[SignedBytes]) -> Vec<bool> {
        if !self.signatures.is_signed() {
            return vec![true; items.len()];
        }
        let fingerprints: Vec<Digest> = items.iter().map(SignedBytes::fingerprint).collect();
        let mut verdicts = vec![true; items.len()];
        let unknown: Vec<usize> = {
            let remembered = self.remembered();
            (0..items.len())
                .filter(|i| !remembered.contains(&fingerprints[*i]))
                .collect()
        };
        if unknown.is_empty() {
            return verdicts;
        }
        // A triple repeated in `items` (the responses of one signed batch) is checked once.
        let mut first: std::collections::HashMap<Digest, usize> = std::collections::HashMap::new();
        let mut fresh: Vec<&SignedBytes> = Vec::new();
        let slots: Vec<usize> = unknown
            .iter()
            .map(|i| {
                *first.entry(fingerprints[*i]).or_insert_with(|| {
                    fresh.push(&items[*i]);
                    fresh.len() - 1
                })
            })
            .collect();
        let checked = verify_many(self.signatures, &fresh);
        let mut remembered = self.remembered();
        for (i, slot) in unknown.into_iter().zip(slots) {
            let ok = checked[slot];
            verdicts[i] = ok;
            if ok {
                remembered.insert(fingerprints[i], ());
            }
        }
        verdicts
    }

    /// Checks `items` as one batch, on this thread, and remembers them all if it verifies: it
    /// spares the single checks that follow (admission's, for a batch of proposals or
    /// responses). Only under ZIP 215, where a batch verifies exactly when each signature does.
    /// A batch that fails remembers nothing and is not searched for its bad signature: the
    /// single checks find it, so whoever forges one makes this cost one batch and no more.
    /// Repeated and remembered triples are left out.
    pub fn warm(&self, items: &[SignedBytes]) {
        if self.signatures != Signatures::Ed25519Zip215 {
            return;
        }
        let fresh: Vec<(Digest, &SignedBytes)> = {
            let remembered = self.remembered();
            let mut seen = HashSet::new();
            items
                .iter()
                .map(|item| (item.fingerprint(), item))
                .filter(|(f, _)| !remembered.contains(f) && seen.insert(*f))
                .collect()
        };
        if fresh.len() < SMALLEST_BATCH {
            return;
        }
        if batch_verifies(fresh.iter().map(|(_, item)| *item)) {
            let mut remembered = self.remembered();
            for (fingerprint, _) in fresh {
                remembered.insert(fingerprint, ());
            }
        }
    }

    /// Signs `message` (or not, when signatures are off) and remembers the signature: the
    /// organization never checks its own signature.
    pub fn sign(&self, key: &SigningKey, message: Vec<u8>) -> Signature {
        let signature = self.signatures.sign(key, &message);
        if self.signatures.is_signed() {
            let item = SignedBytes {
                key: key.public_key(),
                message,
                signature,
            };
            self.remembered().insert(item.fingerprint(), ());
        }
        signature
    }

    /// How many triples it remembers (at most [`REMEMBERED`]).
    pub fn remembered_len(&self) -> usize {
        self.remembered().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZIP215: Signatures = Signatures::Ed25519Zip215;
    const RFC8032: Signatures = Signatures::Ed25519;

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

    /// A small-order public key (the identity) and an `R` of order 8 with `S = 0`: valid under
    /// the cofactored equation (ZIP 215, every batch), not under the cofactorless one (RFC 8032,
    /// ring).
    fn torsion() -> SignedBytes {
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let order_8 =
            hex::decode("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05")
                .unwrap();
        let mut signature = [0u8; 64];
        signature[..32].copy_from_slice(&order_8);
        SignedBytes {
            key: PublicKey(identity),
            message: b"pay mallory".to_vec(),
            signature: Signature(signature),
        }
    }

    #[test]
    fn every_rule_names_exactly_the_bad_signatures_wherever_they_stand() {
        for rule in [ZIP215, RFC8032] {
            for n in [1, 2, 16, 17, 40] {
                for bad in [
                    vec![0],
                    vec![n / 2],
                    vec![n - 1],
                    (0..n).step_by(3).collect(),
                ] {
                    let items: Vec<SignedBytes> = (0..n)
                        .map(|i| {
                            let m = format!("message {i}");
                            let seed = u8::try_from(i % 7).unwrap();
                            if bad.contains(&i) {
                                forged(seed, m.as_bytes())
                            } else {
                                signed(seed, m.as_bytes())
                            }
                        })
                        .collect();
                    let refs: Vec<&SignedBytes> = items.iter().collect();
                    let verdicts = verify_many(rule, &refs);
                    let expected: Vec<bool> = (0..n).map(|i| !bad.contains(&i)).collect();
                    assert_eq!(verdicts, expected, "{rule:?}: {n} signatures, bad {bad:?}");
                    let alone: Vec<bool> = items.iter().map(|i| i.verify(rule).is_ok()).collect();
                    assert_eq!(verdicts, alone, "{rule:?}: batched and single checks agree");
                }
            }
            assert!(verify_many(rule, &[]).is_empty());
        }
        assert_eq!(verify_many(Signatures::Off, &[&forged(1, b"x")]), [true]);
    }

    #[test]
    fn signatures_by_ring_verify_under_both_rules_and_tampering_fails_under_both() {
        for rule in [ZIP215, RFC8032] {
            let item = signed(3, b"block 7");
            assert!(item.verify(rule).is_ok());
            let mut other_key = item.clone();
            other_key.key = SigningKey::from_seed(&[4; 32]).public_key();
            assert!(other_key.verify(rule).is_err());
            let mut flipped = item.clone();
            flipped.signature.0[10] ^= 1;
            assert!(flipped.verify(rule).is_err());
            // An S not reduced mod l is refused by both.
            let mut unreduced = item;
            unreduced.signature.0[63] |= 0xf0;
            assert!(unreduced.verify(rule).is_err());
        }
    }

    /// The signature that would split organizations if batches and single checks followed
    /// different rules: each rule gives it one verdict, alone and in any batch.
    #[test]
    fn a_crafted_torsion_signature_gets_one_verdict_per_rule_alone_and_in_any_batch() {
        let crafted = torsion();
        assert!(crafted.verify(RFC8032).is_err(), "RFC 8032 refuses it");
        assert!(crafted.verify(ZIP215).is_ok(), "ZIP 215 accepts it");
        for rule in [ZIP215, RFC8032] {
            let accepted = rule == ZIP215;
            for n in [1usize, 5, 40] {
                let mut items: Vec<SignedBytes> = (0..n)
                    .map(|i| signed(2, format!("m{i}").as_bytes()))
                    .collect();
                items.insert(n / 2, crafted.clone());
                items.push(forged(3, b"x"));
                let refs: Vec<&SignedBytes> = items.iter().collect();
                let mut expected = vec![true; n + 2];
                expected[n / 2] = accepted;
                expected[n + 1] = false;
                assert_eq!(verify_many(rule, &refs), expected, "{rule:?}, {n}");
            }
        }
    }

    #[test]
    fn repeated_triples_get_each_its_own_verdict() {
        // The responses of one signed batch repeat one triple; every copy gets the verdict, a
        // forged copy among good ones too, under both rules and past the batch threshold.
        for rule in [ZIP215, RFC8032] {
            let v = Verifier::new(rule);
            let good = signed(1, b"root");
            let bad = forged(2, b"root");
            let mut items = Vec::new();
            let mut expected = Vec::new();
            for i in 0..40 {
                let forgery = i % 7 == 3;
                items.push(if forgery { bad.clone() } else { good.clone() });
                expected.push(!forgery);
            }
            assert_eq!(v.check_all(&items), expected, "{rule:?}");
            assert_eq!(v.remembered_len(), 1, "{rule:?}");
        }
    }

    #[test]
    fn a_verifier_remembers_what_verified_and_what_it_signed_but_never_a_failure() {
        let v = Verifier::new(ZIP215);
        let good = signed(1, b"a");
        let bad = forged(1, b"b");
        assert_eq!(v.check_all(&[good.clone(), bad.clone()]), [true, false]);
        assert_eq!(v.remembered_len(), 1);
        // Checked again: the good one from memory, the bad one fails again.
        assert_eq!(v.check_all(&[bad.clone(), good.clone()]), [false, true]);
        assert!(v.check(&bad).is_err());
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
        assert!(mine.verify(ZIP215).is_ok());
        assert!(v.check(&mine).is_ok());
        // A single check remembers too.
        let third = signed(5, b"c");
        assert!(v.check(&third).is_ok());
        assert_eq!(v.remembered_len(), 3);
    }

    #[test]
    fn a_verifier_applies_its_networks_rule() {
        let rfc = Verifier::new(RFC8032);
        let zip = Verifier::new(ZIP215);
        assert!(rfc.check(&torsion()).is_err());
        assert_eq!(rfc.check_all(&[torsion(), signed(1, b"a")]), [false, true]);
        assert!(zip.check(&torsion()).is_ok());
        assert_eq!(zip.check_all(&[torsion(), signed(1, b"a")]), [true, true]);
    }

    #[test]
    fn memory_is_bounded_and_forgets_the_oldest() {
        let v = Verifier::new(ZIP215);
        let mut r = v.remembered();
        let allocated = r.allocated();
        let last = 3 * REMEMBERED;
        for i in 0..=last {
            r.insert(Digest::of(&i.to_le_bytes()), ());
        }
        assert!(r.len() <= REMEMBERED && r.len() >= REMEMBERED / 2);
        assert_eq!(r.allocated(), allocated, "its memory never grows");
        assert!(!r.contains(&Digest::of(&0usize.to_le_bytes())));
        for i in last - REMEMBERED / 2 + 1..=last {
            assert!(r.contains(&Digest::of(&i.to_le_bytes())));
        }
    }

    #[test]
    fn with_signatures_off_nothing_is_checked_or_signed() {
        let v = Verifier::new(Signatures::Off);
        assert_eq!(v.check_all(&[forged(1, b"x")]), [true]);
        assert!(v.check(&forged(1, b"y")).is_ok());
        let key = SigningKey::from_seed(&[2; 32]);
        assert_eq!(v.sign(&key, b"m".to_vec()), Signature([0; 64]));
        assert_eq!(v.remembered_len(), 0);
    }

    #[test]
    fn warming_remembers_a_clean_batch_once_and_a_forged_batch_not_at_all() {
        let clean: Vec<SignedBytes> = (0..6u8).map(|i| signed(i, &[i; 40])).collect();
        let v = Verifier::new(Signatures::Ed25519Zip215);
        let mut twice = clean.clone();
        twice.extend(clean.iter().cloned());
        v.warm(&twice);
        assert_eq!(v.remembered_len(), 6, "each triple once");
        assert!(clean.iter().all(|c| v.check(c).is_ok()));

        let v = Verifier::new(Signatures::Ed25519Zip215);
        let mut with_forged = clean.clone();
        with_forged.insert(3, forged(9, b"m"));
        v.warm(&with_forged);
        assert_eq!(v.remembered_len(), 0, "a failed batch is not searched");
        assert!(
            v.check(&with_forged[3]).is_err(),
            "the single check still refuses it"
        );

        // RFC 8032 is never batched.
        let v = Verifier::new(Signatures::Ed25519);
        v.warm(&clean);
        assert_eq!(v.remembered_len(), 0);
    }
}
