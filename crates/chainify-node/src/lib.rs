//! chainify-node: the components of one organization.
//!
//! - [`ExecutionServer`]: turns an ordered [`TransactionBlock`] into the organization's
//!   [`LedgerBlock`]: validate every transaction deterministically (signatures, endorsement,
//!   replays), analyse and check grants, execute on the local engine, digest, chain.

mod execution;

pub use execution::{Executed, ExecutionError, ExecutionServer};

#[doc(no_inline)]
pub use chainify_core::tx::{LedgerBlock, TransactionBlock};
