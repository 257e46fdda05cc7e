//! Storage errors. Each names what went wrong and where: the table, column, value or URL.

use chainify_core::BlockNumber;

/// How a database error affects the transaction or block that hit it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DbErrorKind {
    /// The statement failed for a reason every honest engine shares (constraint violation, bad
    /// value, type error): the transaction aborts deterministically.
    Statement,
    /// Deadlock, serialization failure, lock timeout, busy database: not deterministic, so the
    /// transaction is retried, never flagged as aborted.
    Transient,
    /// The connection or the database is gone: the block cannot go on.
    Connection,
}

/// An error from the database, classified.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("{message}{}", code.as_ref().map(|c| format!(" (code {c})")).unwrap_or_default())]
pub struct DbError {
    /// Classification.
    pub kind: DbErrorKind,
    /// The engine's error code (SQLSTATE, MySQL error number, SQLite result code).
    pub code: Option<String>,
    /// The engine's message.
    pub message: String,
}

impl DbError {
    /// A connection-level error with a message.
    pub fn connection(message: impl Into<String>) -> DbError {
        DbError {
            kind: DbErrorKind::Connection,
            code: None,
            message: message.into(),
        }
    }
}

/// A problem with a table offered for registration as a shared table.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum RegistrationError {
    /// No such table in the database.
    #[error("table {table} does not exist in {database}")]
    UnknownTable {
        /// The requested name.
        table: String,
        /// The database (redacted URL).
        database: String,
    },
    /// The table has no primary key.
    #[error(
        "table {table} has no primary key; shared tables need one (rows are identified by it in read/write sets and digests)"
    )]
    NoPrimaryKey {
        /// The table.
        table: String,
    },
    /// A column's type is not portable across engines.
    #[error("table {table} column {column}: unsupported type {ty}: {hint}")]
    UnsupportedType {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// The declared type.
        ty: String,
        /// What to use instead.
        hint: String,
    },
    /// Something else about the table's definition.
    #[error("table {table}: {problem}")]
    Definition {
        /// The table.
        table: String,
        /// What is wrong.
        problem: String,
    },
}

/// Everything that can go wrong in the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database could not be reached or refused the connection.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The URL with its password removed.
        url: String,
        /// Why.
        reason: String,
    },
    /// The connection broke while working; the operation can be re-run once the database is back.
    #[error("lost the connection to {url} while {during}: {reason}")]
    ConnectionLost {
        /// The URL with its password removed.
        url: String,
        /// What was being done.
        during: String,
        /// Why.
        reason: String,
    },
    /// A statement chainify itself issued failed.
    #[error("{during} on {url}: {source}")]
    Database {
        /// The URL with its password removed.
        url: String,
        /// What was being done.
        during: String,
        /// The database's error.
        source: DbError,
    },
    /// A table cannot be shared.
    #[error(transparent)]
    Registration(#[from] RegistrationError),
    /// The migrations of chainify's system tables failed.
    #[error("installing chainify's system tables on {url}: {reason}")]
    Migration {
        /// The URL with its password removed.
        url: String,
        /// Why.
        reason: String,
    },
    /// A block was malformed for execution.
    #[error("block {block}: {problem}")]
    BadBlock {
        /// The block.
        block: BlockNumber,
        /// What is wrong.
        problem: String,
    },
    /// chainify's record of the applied blocks (`chainify_applied_blocks`, `chainify_state`)
    /// holds what chainify never wrote there, or lacks what it wrote: damaged behind chainify
    /// (a DBA, a restored backup, a bug). Running the block again fails the same way; restoring
    /// a checkpoint rewrites the record.
    #[error("block {block}: {problem}")]
    Damaged {
        /// The block that cannot run on it.
        block: BlockNumber,
        /// What is wrong, naming the table.
        problem: String,
    },
    /// A transaction (or, on SQLite, the block's database transaction) kept hitting transient
    /// errors (deadlocks, lock timeouts, a busy database) beyond the retry budget; the block is
    /// left resumable.
    #[error("block {block} {what}: still failing after {attempts} attempts: {last}")]
    RetriesExhausted {
        /// The block.
        block: BlockNumber,
        /// What kept failing: `transaction 3`, or `database transaction`.
        what: String,
        /// How often it was tried.
        attempts: u32,
        /// The last transient error.
        last: DbError,
    },
    /// A read-only query cannot be answered as asked.
    #[error("query: {0}")]
    Query(String),
    /// A read-only query ran for as long as a query may and was stopped by the engine.
    #[error(
        "query: stopped after {limit:?}, the longest a query may run (query_timeout); narrow it \
         (fix a key in the WHERE clause, join fewer tables)"
    )]
    QueryTimeout {
        /// How long a query may run.
        limit: std::time::Duration,
    },
    /// A read-only query's answer grew past the most bytes an answer may hold, and was
    /// dropped (it is counted while it is read, as each row's values take in memory).
    #[error(
        "query: the answer is larger than {limit} bytes ({} MiB), the most a query may answer \
         (max_query_answer_bytes); narrow it (fewer or shorter columns, fix a key in the WHERE \
         clause, join fewer tables, page with ORDER BY … LIMIT)",
        limit >> 20
    )]
    QueryTooLarge {
        /// The most bytes an answer may hold.
        limit: usize,
    },
    /// One of chainify's own tables holds something chainify never writes.
    #[error("corrupt system table: {0}")]
    Corrupt(String),
    /// A shared table's definition changed behind chainify since it was registered: the
    /// organization would compute otherwise than the others, and no restore repairs that.
    #[error("{0}")]
    DefinitionChanged(String),
    /// A checkpoint operation cannot proceed.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A transferred state cannot be adopted (it is malformed or does not match the agreed
    /// state); nothing was changed.
    #[error("state transfer: {0}")]
    Transfer(String),
    /// A value read from the database does not fit its declared type.
    #[error(
        "table {table} column {column}: stored value {value} does not fit the declared type {ty}"
    )]
    BadStoredValue {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// The value as read.
        value: String,
        /// The declared type.
        ty: String,
    },
}

impl StorageError {
    /// Whether re-running the same operation later may succeed (the database went away).
    pub fn is_connection(&self) -> bool {
        matches!(
            self,
            StorageError::Connect { .. } | StorageError::ConnectionLost { .. }
        )
    }

    /// Whether this request failed but the same one may succeed later: the database went away
    /// or answered with a passing error (deadlock, lock timeout, busy, serialization failure).
    /// Anything else (a statement the database refuses, a malformed block, corrupt system
    /// tables) fails again the same way.
    pub fn is_transient(&self) -> bool {
        match self {
            StorageError::Connect { .. } | StorageError::ConnectionLost { .. } => true,
            StorageError::Database { source, .. } => source.kind != DbErrorKind::Statement,
            _ => false,
        }
    }
}

/// Removes the password from a database URL for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{tail}")
            } else {
                format!("{scheme}://{user}@{host}{tail}")
            }
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    fn database(kind: DbErrorKind) -> StorageError {
        StorageError::Database {
            url: "sqlite://x".into(),
            during: "appending".into(),
            source: DbError {
                kind,
                code: None,
                message: "m".into(),
            },
        }
    }

    #[test]
    fn only_passing_database_errors_are_retried() {
        assert!(database(DbErrorKind::Transient).is_transient());
        assert!(database(DbErrorKind::Connection).is_transient());
        assert!(
            StorageError::ConnectionLost {
                url: "u".into(),
                during: "d".into(),
                reason: "r".into(),
            }
            .is_transient()
        );
        assert!(!database(DbErrorKind::Statement).is_transient());
        assert!(
            !StorageError::BadBlock {
                block: BlockNumber(3),
                problem: "does not follow".into(),
            }
            .is_transient()
        );
    }

    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact_url("postgres://alice:s3cret@db:5432/x?sslmode=disable"),
            "postgres://alice:***@db:5432/x?sslmode=disable"
        );
        assert_eq!(
            redact_url("mysql://root@127.0.0.1:3306/t"),
            "mysql://root@127.0.0.1:3306/t"
        );
        assert_eq!(redact_url("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        assert_eq!(
            redact_url("postgres://u:p@ss@h/db"),
            "postgres://u:***@h/db"
        );
    }
}
