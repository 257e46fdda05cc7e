//! A network of deterministic keys for tests and simulations (feature `testing`): organization
//! i signs with the key of seed `[i; 32]`, so any test can sign a vote or certificate as any
//! organization without generating or passing keys around.

use std::collections::BTreeMap;

use crate::crypto::{Signatures, SigningKey};
use crate::policy::{AgreementPolicy, PolicySpec};
use crate::tx::{
    Certificate, ChainedTransaction, LedgerBlock, Proposal, ProposalBody, Statement, Transaction,
    Vote,
};
use crate::votes::VoteContext;
use crate::{ClientId, NetworkId, OrgId, Value};

/// Organizations 1..=N of network `net` with seeded keys, and the context that checks their
/// votes.
#[derive(Debug)]
pub struct SeededNet {
    /// Organization i's key at index i − 1.
    pub keys: Vec<SigningKey>,
    /// Network `net`, the policy, the public keys.
    pub ctx: VoteContext,
}

/// Organization `org`'s seeded key.
pub fn seeded_key(org: u32) -> SigningKey {
    let seed = u8::try_from(org).unwrap_or_else(|_| panic!("org {org}: seeds go up to 255"));
    SigningKey::from_seed(&[seed; 32])
}

impl SeededNet {
    /// `orgs` organizations under agreement policy `policy` (`any-2`, `all`, …); panics on a
    /// policy the organizations cannot have.
    pub fn new(orgs: u32, policy: &str, signatures: Signatures) -> SeededNet {
        let keys: Vec<SigningKey> = (1..=orgs).map(seeded_key).collect();
        let public: BTreeMap<OrgId, _> = (1..=orgs)
            .zip(&keys)
            .map(|(i, k)| (OrgId(i), k.public_key()))
            .collect();
        let ids = public.keys().copied().collect();
        let spec = policy
            .parse::<PolicySpec>()
            .unwrap_or_else(|e| panic!("policy {policy:?}: {e}"));
        SeededNet {
            keys,
            ctx: VoteContext {
                network: NetworkId::new("net").unwrap_or_else(|e| panic!("{e:?}")),
                policy: AgreementPolicy::new(&spec, &ids)
                    .unwrap_or_else(|e| panic!("policy {policy:?}: {e}")),
                keys: public,
                signatures,
            },
        }
    }

    /// Organization `org`'s signed vote for `block`.
    pub fn vote(&self, org: u32, block: &LedgerBlock) -> Vote {
        Vote::new_signed(
            self.ctx.network.clone(),
            block.number,
            block.hash(),
            OrgId(org),
            &self.keys[org as usize - 1],
        )
    }

    /// A certificate for `block` of the votes of `orgs`.
    pub fn certificate(&self, orgs: &[u32], block: &LedgerBlock) -> Certificate {
        Certificate {
            block: block.number,
            ledger_block_hash: block.hash(),
            votes: orgs.iter().map(|o| self.vote(*o, block)).collect(),
        }
    }
}

/// Client `client1`'s transaction in `network`, told apart by its nonce (one parameterized
/// UPDATE of `kv`), signed with the key of seed `[9; 32]`; no endorsements.
pub fn signed_transaction(network: &NetworkId, nonce: u64) -> ChainedTransaction {
    let body = ProposalBody {
        client: ClientId::new("client1").unwrap_or_else(|e| panic!("{e:?}")),
        nonce,
        network: network.clone(),
        transaction: Transaction {
            statements: vec![Statement::new(
                "UPDATE kv SET v = v + 1 WHERE k = $1",
                vec![Value::Int(i64::try_from(nonce).unwrap_or(i64::MAX))],
            )],
        },
    };
    let signature = SigningKey::from_seed(&[9; 32]).sign(&body.encode_canonical());
    ChainedTransaction {
        proposal: Proposal { body, signature },
        responses: vec![],
    }
}
