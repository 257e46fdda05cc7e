//! chainify-storage: chainify on real SQL engines.
//!
//! - [`Backend`]/[`Conn`]: the engine-specific part (connect with pinned session settings,
//!   catalog introspection, binding and decoding values, error classification), implemented by
//!   [`Postgres`], [`MySql`] (also MariaDB) and [`Sqlite`], and by [`AnyBackend`], which picks
//!   one of them from the URL at run time;
//! - [`Store`]: everything else, written once against the trait: shared-table registration with
//!   generated digest tables and triggers ([`ddl`]), the block executor ([`Store::execute_block`])
//!   and its digest, checkpoints and restore, the hash-chained ledger.
//!
//! The suite every backend passes is `chainify_testkit::conformance::storage`.
//!
//! The digest is documented in `docs/design/digest.md`; values are normalized as described in
//! the `value` module so honest engines produce identical bytes.
//!
//! Where it sits: the only crate that talks SQL to an engine (sqlx on tokio; SQLite in
//! process through rusqlite). It builds on
//! `chainify-core`, `chainify-sql` (schema and rendered statements) and `chainify-sched` (the
//! executor's scheduling); `chainify-node`, `chainify-net`, the binary and the benchmarks use it.

mod any;
mod backend;
pub mod catalog;
mod checkpoint;
pub mod ddl;
mod error;
mod exec;
mod integrity;
mod layers;
mod ledger;
mod mysql;
mod postgres;
mod query;
mod sqlite;
mod state;
mod store;
mod transfer;
mod value;

use std::time::Duration;

pub use any::{AnyBackend, AnyConn, database_on, drop_database, recreate_database};
pub use backend::{Backend, Conn, DECIMAL_TEXT_BYTES, DeferForeignKeys, PoolUse, row_bytes};
pub use chainify_sql::MAX_QUERY_ROWS;
pub use checkpoint::CheckpointInfo;
pub use error::{DbError, DbErrorKind, RegistrationError, StorageError, redact_url};
pub use exec::{BlockOutcome, ExecBlock, ExecMode, ExecTx, TxFailure};
pub use integrity::{TriggerFault, TriggerProblem};
pub use mysql::{MySql, MySqlConn, STATEMENT_CACHE_CLEAR};
pub use postgres::{PgConn, Postgres};
pub use query::{MAX_ANSWER_BYTES, QueryConn, QueryResult, ReadSnapshot};
pub use sqlite::{Sqlite, SqliteConn};
pub use state::{StateCheck, state_digest};
pub use store::{DefinitionChange, Store};
pub use transfer::{AdoptedBlock, Adoption, RangePatch};

/// Connection and execution settings of a store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Pool size: the most transactions of a block that run at once, plus one.
    pub max_connections: u32,
    /// How long to wait for the database when connecting or acquiring a connection.
    pub connect_timeout: Duration,
    /// How long a statement waits for a row lock before the engine gives up (the transaction is
    /// then retried; the scheduler already orders conflicting transactions, so waits are rare).
    pub lock_timeout: Duration,
    /// How often a transaction is retried after transient errors before the block fails
    /// (resumably).
    pub max_attempts: u32,
    /// Only read (an auditor's tools): no migrations, nothing created (a missing SQLite file is
    /// an error, not a new database), sessions read-only where the engine has them.
    pub read_only: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 9,
            connect_timeout: Duration::from_secs(10),
            lock_timeout: Duration::from_secs(5),
            max_attempts: 50,
            read_only: false,
        }
    }
}
