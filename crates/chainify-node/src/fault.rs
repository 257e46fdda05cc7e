//! This organization's own failures, one type for every error that can carry them.
//!
//! Recovery, state transfer, serving a peer and the node itself all fail, among other ways,
//! because this organization's database, ledger or execution component failed. That is the
//! line openraft draws between "this request failed" (the peer lied, the orderer is late) and
//! "this node cannot go on": a [`LocalFault`] never counts against a peer.

use chainify_storage::StorageError;

use crate::execution::ExecutionError;
use crate::ledger::LedgerError;

/// This organization's database, ledger or execution component failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalFault {
    /// The database.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The ledger in the database.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The execution component.
    #[error(transparent)]
    Execution(#[from] ExecutionError),
}

/// `From` each local error for an error type with a `Local(LocalFault)` variant, so `?` works
/// on storage, ledger and execution results alike.
macro_rules! from_local_faults {
    ($error:ty) => {
        impl From<chainify_storage::StorageError> for $error {
            fn from(e: chainify_storage::StorageError) -> Self {
                Self::Local(e.into())
            }
        }
        impl From<$crate::ledger::LedgerError> for $error {
            fn from(e: $crate::ledger::LedgerError) -> Self {
                Self::Local(e.into())
            }
        }
        impl From<$crate::execution::ExecutionError> for $error {
            fn from(e: $crate::execution::ExecutionError) -> Self {
                Self::Local(e.into())
            }
        }
    };
}
pub(crate) use from_local_faults;
