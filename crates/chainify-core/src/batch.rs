//! One signature over many early-abort responses: an organization that answers a batch of
//! proposals signs the root of a Merkle tree over the responses, and each response carries its
//! path to the root ([`BatchProof`]).
//!
//! Every organization checks every response of every block, so a signature per response costs
//! the network a signing and a check per organization for each endorsement. Signed as a batch,
//! the responses of one call share one signature: the signer signs once, and a checker verifies
//! the root's signature once and remembers it ([`crate::verify::Verifier`]), leaving a few
//! hashes per response.
//!
//! **Tree.** Leaves are the responses' own signing bytes
//! ([`crate::tx::EarlyAbortResponse::signing_bytes`]) hashed as `H(0x00 ‖ bytes)`, padded to a
//! power of two with `H(0x02)`; an inner node is `H(0x01 ‖ left ‖ right)`. The prefixes keep a
//! node from passing as a leaf and a padding leaf from passing as a response (either would need a
//! SHA-256 preimage). The proof of leaf `index` lists the siblings from the leaf up; bit `k` of
//! `index` says whether the node at height `k` is a right child. The signed message names the
//! organization and the root ([`root_message`]), under a tag of its own, so it never equals a
//! single response's signing bytes.
//!
//! A batch of one response is signed alone, without a proof: what a node signs at low load is
//! what it signed before batches existed.

use crate::canonical::Encoder;
use crate::crypto::Signature;
use crate::{Digest, Hasher, OrgId};

/// Most siblings in a proof: a batch of up to 4 096 responses (the endorsement service takes
/// batches of 1 024 by default; larger ones are signed as several). Bounds the hashing a
/// response costs every organization that checks it.
pub const MAX_DEPTH: usize = 12;

/// Most responses under one signature.
pub const MAX_LEAVES: usize = 1 << MAX_DEPTH;

/// Domain tag of the signed root.
pub const ROOT_TAG: &str = "chainify.v1.EarlyAbortResponses";

const LEAF: u8 = 0x00;
const NODE: u8 = 0x01;
const PAD: u8 = 0x02;

/// Where a response sits in the batch its organization signed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BatchProof {
    /// The response's position among the tree's leaves (below `2^siblings.len()`).
    pub index: u32,
    /// The siblings on the way from the leaf to the root, lowest first (1 to [`MAX_DEPTH`]).
    pub siblings: Vec<Digest>,
}

/// Why a [`BatchProof`] is not well formed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// No siblings: a single response is signed alone, never as a batch of one.
    #[error("a batch proof needs at least one sibling; a single response is signed alone")]
    Empty,
    /// Deeper than any batch an organization signs.
    #[error("{0} siblings; at most {MAX_DEPTH}")]
    TooDeep(usize),
    /// The index names no leaf of a tree of that depth.
    #[error("index {index} is outside a tree of {leaves} leaves")]
    IndexOutOfRange {
        /// The index.
        index: u32,
        /// The tree's leaves.
        leaves: u64,
    },
}

impl BatchProof {
    /// Checks the proof's shape (not that it leads to any particular root).
    pub fn check(&self) -> Result<(), ProofError> {
        let depth = self.siblings.len();
        if depth == 0 {
            return Err(ProofError::Empty);
        }
        if depth > MAX_DEPTH {
            return Err(ProofError::TooDeep(depth));
        }
        let leaves = 1u64 << depth;
        if u64::from(self.index) >= leaves {
            return Err(ProofError::IndexOutOfRange {
                index: self.index,
                leaves,
            });
        }
        Ok(())
    }

    /// The root that the leaf with signing bytes `leaf` leads to along this proof.
    pub fn root(&self, leaf: &[u8]) -> Digest {
        let mut node = leaf_hash(leaf);
        for (height, sibling) in self.siblings.iter().enumerate() {
            node = if (self.index >> height) & 1 == 0 {
                node_hash(&node, sibling)
            } else {
                node_hash(sibling, &node)
            };
        }
        node
    }
}

/// The roots of many proofs, each tree node hashed once where proofs share it: the responses of
/// one batch in a block climb the same nodes above where their paths meet, and every
/// organization gathers every response of every block. A root is reused only from a node of
/// the same height, position and value whose siblings above are the same, so each root is
/// exactly [`BatchProof::root`]'s, whatever the other proofs hold (forged ones included). A
/// node keeps the first proof's siblings: forged proofs gathered first can make the honest ones
/// of their batch miss, which costs them no more than hashing alone (plus the lookups).
#[derive(Debug, Default)]
pub struct Roots<'a> {
    /// (height, position at that height, node) → the siblings above it and the root they lead
    /// to, from the first proof that climbed through it.
    known: std::collections::HashMap<(usize, u32, Digest), (&'a [Digest], Digest)>,
}

impl<'a> Roots<'a> {
    /// [`BatchProof::root`] of `proof` for the leaf with signing bytes `leaf`; for a proof
    /// that [`BatchProof::check`]s (as every caller checks first).
    pub fn root(&mut self, proof: &'a BatchProof, leaf: &[u8]) -> Digest {
        debug_assert!(proof.check().is_ok(), "a malformed proof: {proof:?}");
        let mut node = leaf_hash(leaf);
        let mut climbed = Vec::with_capacity(proof.siblings.len());
        let mut found = None;
        for (height, sibling) in proof.siblings.iter().enumerate() {
            let position = proof.index >> height;
            // Leaves are not kept: only a response gathered twice would meet another at one.
            if height > 0 {
                let above = &proof.siblings[height..];
                if let Some((known_above, root)) = self.known.get(&(height, position, node))
                    && *known_above == above
                {
                    found = Some(*root);
                    break;
                }
                climbed.push((height, position, node));
            }
            node = if position & 1 == 0 {
                node_hash(&node, sibling)
            } else {
                node_hash(sibling, &node)
            };
        }
        let root = found.unwrap_or(node);
        for (height, position, node) in climbed {
            self.known
                .entry((height, position, node))
                .or_insert((&proof.siblings[height..], root));
        }
        root
    }
}

fn leaf_hash(bytes: &[u8]) -> Digest {
    let mut h = Hasher::new();
    h.update(&[LEAF]);
    h.update(bytes);
    h.finish()
}

fn node_hash(left: &Digest, right: &Digest) -> Digest {
    let mut h = Hasher::new();
    h.update(&[NODE]);
    h.update(&left.0);
    h.update(&right.0);
    h.finish()
}

fn pad_hash() -> Digest {
    Digest::of(&[PAD])
}

/// What `org` signs for a batch whose tree has root `root`.
pub fn root_message(org: OrgId, root: &Digest) -> Vec<u8> {
    let mut e = Encoder::new(ROOT_TAG);
    e.u32(org.0).digest(root);
    e.finish()
}

/// Signs leaves (the responses' signing bytes) with one signature over their tree's root: the
/// signature and each leaf's proof, in order. `sign` gets [`root_message`]'s bytes. Two or more
/// leaves (a single response is signed alone).
///
/// # Panics
/// With fewer than two leaves, or more than `2^MAX_DEPTH`.
pub fn sign_leaves(
    org: OrgId,
    leaves: &[Vec<u8>],
    sign: impl FnOnce(Vec<u8>) -> Signature,
) -> (Signature, Vec<BatchProof>) {
    assert!(
        leaves.len() >= 2 && leaves.len() <= MAX_LEAVES,
        "a batch signs 2 to 2^{MAX_DEPTH} responses, not {}",
        leaves.len()
    );
    let width = leaves.len().next_power_of_two();
    let depth = width.trailing_zeros() as usize;
    // levels[0] are the leaves, levels[depth] the root.
    let mut level: Vec<Digest> = leaves.iter().map(|l| leaf_hash(l)).collect();
    level.resize(width, pad_hash());
    let mut levels = vec![level];
    for height in 0..depth {
        let next: Vec<Digest> = levels[height]
            .chunks_exact(2)
            .map(|pair| node_hash(&pair[0], &pair[1]))
            .collect();
        levels.push(next);
    }
    let root = levels[depth][0];
    let signature = sign(root_message(org, &root));
    let proofs = (0..leaves.len())
        .map(|i| BatchProof {
            index: u32::try_from(i).expect("at most 2^MAX_DEPTH leaves"),
            siblings: (0..depth).map(|h| levels[h][(i >> h) ^ 1]).collect(),
        })
        .collect();
    (signature, proofs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn leaves(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("response {i}").into_bytes())
            .collect()
    }

    /// A "signature" that is the signed bytes' hash, to see which root was signed.
    fn sign_root(message: Vec<u8>) -> Signature {
        let d = Digest::of(&message);
        let mut s = [0u8; 64];
        s[..32].copy_from_slice(&d.0);
        Signature(s)
    }

    fn signed_root(org: OrgId, proof: &BatchProof, leaf: &[u8]) -> Signature {
        sign_root(root_message(org, &proof.root(leaf)))
    }

    proptest! {
        #[test]
        fn every_leaf_leads_to_the_signed_root(n in 2usize..70) {
            let org = OrgId(2);
            let leaves = leaves(n);
            let (signature, proofs) = sign_leaves(org, &leaves, sign_root);
            prop_assert_eq!(proofs.len(), n);
            for (leaf, proof) in leaves.iter().zip(&proofs) {
                prop_assert_eq!(proof.check(), Ok(()));
                prop_assert_eq!(proof.siblings.len(), n.next_power_of_two().trailing_zeros() as usize);
                prop_assert_eq!(signed_root(org, proof, leaf), signature);
            }
        }

        #[test]
        fn a_changed_leaf_index_or_sibling_leads_elsewhere(
            n in 2usize..40,
            pick in any::<prop::sample::Index>(),
            byte in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let org = OrgId(1);
            let leaves = leaves(n);
            let (signature, proofs) = sign_leaves(org, &leaves, sign_root);
            let i = pick.index(n);
            let (leaf, proof) = (&leaves[i], &proofs[i]);
            // Another response's bytes with this proof.
            let mut other = leaf.clone();
            let at = byte.index(other.len());
            other[at] ^= 1 << bit;
            prop_assert_ne!(signed_root(org, proof, &other), signature);
            // Another response's proof with these bytes.
            let j = (i + 1) % n;
            prop_assert_ne!(signed_root(org, &proofs[j], leaf), signature);
            // A changed sibling.
            let mut bent = proof.clone();
            let s = byte.index(bent.siblings.len());
            bent.siblings[s].0[at % 32] ^= 1 << bit;
            prop_assert_ne!(signed_root(org, &bent, leaf), signature);
            // The same root signed by another organization.
            prop_assert_ne!(signed_root(OrgId(3), proof, leaf), signature);
        }
    }

    proptest! {
        /// Shared hashing changes no root: every proof of a block's batches, some bent, in any
        /// order, leads where it leads alone.
        #[test]
        fn roots_hashed_together_are_each_proof_s_own(
            sizes in prop::collection::vec(2usize..40, 1..4),
            bends in prop::collection::vec(
                (any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0usize..3),
                0..12,
            ),
            order in any::<prop::sample::Index>(),
        ) {
            let mut items: Vec<(Vec<u8>, BatchProof)> = Vec::new();
            for (b, n) in sizes.iter().enumerate() {
                let leaves: Vec<Vec<u8>> = (0..*n)
                    .map(|i| format!("batch {b} response {i}").into_bytes())
                    .collect();
                let (_, proofs) = sign_leaves(OrgId(b as u32 + 1), &leaves, sign_root);
                items.extend(leaves.into_iter().zip(proofs));
            }
            // Forgeries beside the honest proofs: a sibling changed, an index moved, a leaf
            // claiming another's proof.
            for (pick, at, kind) in bends {
                let i = pick.index(items.len());
                let (leaf, mut proof) = items[i].clone();
                match kind {
                    0 => {
                        let s = at.index(proof.siblings.len());
                        proof.siblings[s].0[0] ^= 1;
                        items.push((leaf, proof));
                    }
                    1 => {
                        proof.index ^= 1 << at.index(proof.siblings.len());
                        items.push((leaf, proof));
                    }
                    _ => {
                        let other = items[at.index(items.len())].0.clone();
                        items.push((other, proof));
                    }
                }
            }
            let k = order.index(items.len());
            items.rotate_left(k);
            let mut roots = Roots::default();
            for (leaf, proof) in &items {
                prop_assert_eq!(roots.root(proof, leaf), proof.root(leaf));
            }
        }
    }

    #[test]
    fn a_forged_path_that_meets_an_honest_one_gets_its_own_root() {
        let leaves = leaves(8);
        let (_, proofs) = sign_leaves(OrgId(1), &leaves, sign_root);
        let mut roots = Roots::default();
        let honest = roots.root(&proofs[0], &leaves[0]);
        // Leaf 1 meets leaf 0's path at height 1; a forged top sibling must not borrow its root.
        let mut forged = proofs[1].clone();
        *forged.siblings.last_mut().unwrap() = Digest::of(b"elsewhere");
        let root = roots.root(&forged, &leaves[1]);
        assert_eq!(root, forged.root(&leaves[1]));
        assert_ne!(root, honest);
        assert_eq!(roots.root(&proofs[1], &leaves[1]), honest);
    }

    #[test]
    fn an_inner_node_or_padding_does_not_pass_as_a_response() {
        let org = OrgId(1);
        let leaves = leaves(3);
        let (signature, proofs) = sign_leaves(org, &leaves, sign_root);
        // Leaves 0 and 1 hash to a node; presenting that node's preimage as a leaf one level up
        // gives another root (the leaf prefix differs from the node prefix).
        let node_bytes = [
            &[NODE][..],
            &leaf_hash(&leaves[0]).0,
            &leaf_hash(&leaves[1]).0,
        ]
        .concat();
        let lifted = BatchProof {
            index: 0,
            siblings: proofs[0].siblings[1..].to_vec(),
        };
        assert_ne!(signed_root(org, &lifted, &node_bytes[1..]), signature);
        // The padding leaf (index 3) has a proof, but no response's bytes hash to it.
        let padding = BatchProof {
            index: 3,
            siblings: vec![leaf_hash(&leaves[2]), proofs[2].siblings[1]],
        };
        // The path is the padding leaf's own: its sibling pair is the one leaf 0 climbs past.
        assert_eq!(
            node_hash(&padding.siblings[0], &pad_hash()),
            proofs[0].siblings[1]
        );
        assert_ne!(signed_root(org, &padding, &[PAD]), signature);
        assert_ne!(signed_root(org, &padding, b""), signature);
    }

    #[test]
    fn malformed_proofs_are_named() {
        let d = Digest::of(b"x");
        assert_eq!(
            BatchProof {
                index: 0,
                siblings: vec![]
            }
            .check(),
            Err(ProofError::Empty)
        );
        assert_eq!(
            BatchProof {
                index: 0,
                siblings: vec![d; MAX_DEPTH + 1]
            }
            .check(),
            Err(ProofError::TooDeep(MAX_DEPTH + 1))
        );
        let out = BatchProof {
            index: 4,
            siblings: vec![d; 2],
        };
        assert_eq!(
            out.check(),
            Err(ProofError::IndexOutOfRange {
                index: 4,
                leaves: 4
            })
        );
        assert_eq!(
            out.check().unwrap_err().to_string(),
            "index 4 is outside a tree of 4 leaves"
        );
    }

    #[test]
    #[should_panic(expected = "a batch signs 2")]
    fn a_single_response_is_not_a_batch() {
        let _ = sign_leaves(OrgId(1), &leaves(1), sign_root);
    }
}
