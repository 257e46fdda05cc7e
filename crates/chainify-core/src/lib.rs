//! chainify-core: the domain types every other crate shares, and the pure logic around them.
//!
//! - [`tx`]: proposals, early-abort responses, transaction and ledger blocks, votes, certificates;
//! - [`canonical`]: the one byte encoding that is signed and hashed (documented, with test vectors);
//! - [`crypto`]: Ed25519 keys (PKCS#8 files) and signatures;
//! - [`policy`]: agreement and endorsement policies and their evaluation;
//! - [`votes`]: counting signed votes (forgeries, equivocations) and verifying certificates;
//! - [`config`]: network and organization configuration, validated at load;
//! - [`rwset`]: primary-key read/write sets, the contract between SQL analysis and scheduling;
//! - [`effect`]: a block's effect on the shared tables and its order-independent digest;
//! - [`state`]: the incremental, order-independent digest of the shared tables' whole content;
//! - [`validate`]: deterministic validation of an ordered block's transactions.
//! - [`recent`]: a bounded memory of recent entries that is allocated once and never grows.
//! - [`verify`]: one signature rule everywhere (ZIP 215), batched over the cores, and an
//!   organization's memory of the signatures it verified or made.
//!
//! Where it sits: at the bottom of the workspace. Every other crate depends on it and it depends
//! on none of them. Invariant: no network, database or async runtime here; the only I/O is
//! reading key and config files when asked to (and [`verify`] spreading a block's signature checks
//! over the cores).

pub mod batch;
pub mod canonical;
pub mod config;
pub mod crypto;
mod digest;
pub mod effect;
mod ids;
pub mod policy;
pub mod ranges;
pub mod recent;
pub mod rwset;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tx;
pub mod validate;
mod value;
pub mod verify;
pub mod votes;

pub use digest::{Digest, DigestLengthError, Hasher};
pub use ids::{
    BlockNumber, ClientId, InvalidName, MAX_NAME_LEN, NetworkId, ORDERER_TLS_NAME, OrgId,
    TLS_DOMAIN, TxId,
};
pub use value::{Decimal, DecimalError, MAX_DECIMAL_DIGITS, Value};
