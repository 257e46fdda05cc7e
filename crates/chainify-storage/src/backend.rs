//! The backend trait: the few engine-specific operations everything else is written against.
//! A fourth engine implements [`Backend`] and [`Conn`] and runs the conformance suite
//! (`chainify_testkit::conformance::storage`).

use std::future::Future;
use std::time::Duration;

use chainify_core::Value;
use chainify_sql::render::Dialect;

use crate::catalog::CatalogTable;
use crate::ddl::ReadType;
use crate::error::{DbError, DbErrorKind, StorageError};

/// One SQL engine behind a connection pool whose connections are pinned to chainify's session
/// settings (UTC, strict modes, binary comparison, READ COMMITTED).
pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// A pooled connection.
    type Conn: Conn;

    /// The SQL dialect (placeholders, DDL syntax).
    fn dialect(&self) -> Dialect;

    /// The database URL without its password, for messages.
    fn url(&self) -> &str;

    /// Whether transactions may run on several connections at once (false for SQLite, whose
    /// single writer runs a block serially in one database transaction).
    fn concurrent_writers(&self) -> bool;

    /// Whether the connections run the engine on the calling thread (SQLite in process): the
    /// store then runs long work (a block, a scan, a checkpoint) where blocking a thread is
    /// harmless rather than on the async runtime's workers.
    fn calls_inline(&self) -> bool {
        false
    }

    /// Whether DDL is transactional (PostgreSQL, SQLite); MySQL commits each DDL statement.
    fn transactional_ddl(&self) -> bool;

    /// How to check foreign keys only at commit in a transaction that repairs several tables.
    fn foreign_keys_deferred(&self) -> DeferForeignKeys;

    /// A connection from the pool.
    fn acquire(&self) -> impl Future<Output = Result<Self::Conn, DbError>> + Send;

    /// A connection was found lost: the engine may have dropped every connection, so the pool
    /// checks each one it hands out for a while ([`Suspicion`]).
    fn connection_lost(&self) {}

    /// Applies chainify's system-table migrations (`migrations/<dialect>`).
    fn migrate(&self) -> impl Future<Output = Result<(), StorageError>> + Send;

    /// Reads `table`'s definition from the catalog; `None` if there is no such table.
    fn introspect(
        &self,
        table: &str,
    ) -> impl Future<Output = Result<Option<CatalogTable>, StorageError>> + Send;

    /// Closes the pool.
    fn close(&self) -> impl Future<Output = ()> + Send;

    /// The connection pool's use: connections open, and of those idle.
    fn pool_use(&self) -> PoolUse;
}

/// How long after a lost connection a pool pings each connection before handing it out.
const SUSPICION: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection idle this long is pinged before use: a server or a middlebox may have dropped
/// it meanwhile (idle timeouts), and a connection dropped without a reset would otherwise hang
/// its first statement for TCP's retransmission timeout.
const IDLE_PING: std::time::Duration = std::time::Duration::from_secs(5);

/// When a pool last lost a connection. A pool does not ping a connection before each use (a
/// round trip per acquire, about ten a block), only one idle for [`IDLE_PING`]; but after a
/// loss the idle ones are likely dead too: for [`SUSPICION`] it pings each, and closes those
/// that do not answer, so a block run again after the engine came back does not fail on one
/// dead connection after another.
#[derive(Clone, Debug, Default)]
pub(crate) struct Suspicion(std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>);

impl Suspicion {
    /// A connection was lost now.
    pub(crate) fn raise(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
    }

    /// Whether a connection idle for `idle` is to be pinged before use: it was idle for
    /// [`IDLE_PING`], or a connection was lost in the last [`SUSPICION`].
    pub(crate) fn doubts(&self, idle: std::time::Duration) -> bool {
        idle >= IDLE_PING
            || self
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|at| at.elapsed() < SUSPICION)
    }

    /// The pools' hook before handing out `conn`: pings it when `doubtful`; an error closes it.
    pub(crate) async fn ping_if<C: sqlx::Connection>(
        doubtful: bool,
        conn: &mut C,
    ) -> Result<(), sqlx::Error> {
        if doubtful {
            conn.ping().await?;
        }
        Ok(())
    }
}

/// How much of a connection pool is in use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolUse {
    /// Connections open.
    pub open: u32,
    /// Of those, idle.
    pub idle: u32,
    /// The most the pool opens.
    pub max: u32,
}

/// Session statements around a transaction whose foreign keys hold only at its end.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeferForeignKeys {
    /// Run before BEGIN.
    pub before_begin: &'static [&'static str],
    /// Run right after BEGIN.
    pub in_transaction: &'static [&'static str],
    /// Run after COMMIT or ROLLBACK.
    pub after_end: &'static [&'static str],
}

/// A pooled connection. A connection dropped inside a transaction is closed rather than
/// returned to the pool, so the next user never inherits a half-done transaction.
pub trait Conn: Send {
    /// Runs a (prepared, cached) statement with parameters already in bind order. Returns the
    /// rows it affected, or for a query the number of rows it returned: counted one at a time
    /// as they arrive and dropped undecoded, so that a query holds one row at once however many
    /// it returns (a transaction's SELECT may return thousands of rows of megabytes each).
    fn execute(
        &mut self,
        sql: &str,
        params: &[&Value],
        returns_rows: bool,
    ) -> impl Future<Output = Result<u64, DbError>> + Send;

    /// Runs a query and decodes each row's columns as `types`.
    fn query(
        &mut self,
        sql: &str,
        params: &[&Value],
        types: &[ReadType],
    ) -> impl Future<Output = Result<Vec<Vec<Value>>, DbError>> + Send;

    /// Runs a query as [`Conn::query`], reading and decoding one row at a time and counting what
    /// the decoded rows hold ([`row_bytes`]): once that passes `max_bytes` it stops reading and
    /// answers `None`, holding at most `max_bytes` and one row. The statement may then still be
    /// under way: a caller inside a transaction drops the connection (which closes it) rather
    /// than ending the transaction, so nothing waits for the rest of the rows.
    fn query_bounded(
        &mut self,
        sql: &str,
        params: &[&Value],
        types: &[ReadType],
        max_bytes: usize,
    ) -> impl Future<Output = Result<Option<Vec<Vec<Value>>>, DbError>> + Send;

    /// Runs unprepared SQL (DDL); no parameters, no result.
    fn batch(&mut self, sql: &str) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Starts a READ COMMITTED transaction (the engine's lowest safe level; SQLite: an
    /// immediate write transaction).
    fn begin(&mut self) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Starts a transaction with `begin`, statements that open it and what must come first in
    /// it (an isolation level, table locks), and runs the queries `reads` in it: all unprepared
    /// and without parameters, in one round trip where the engine allows. Returns the rows of
    /// each query, decoded as its types.
    fn begin_with(
        &mut self,
        begin: &[&str],
        reads: &[(&str, &[ReadType])],
    ) -> impl Future<Output = Result<Vec<Vec<Vec<Value>>>, DbError>> + Send;

    /// Runs `statements` (unprepared, without parameters) in one round trip where the engine
    /// allows, and returns the rows of each, decoded as its types (none for a statement that
    /// returns no rows). The first statement that fails stops the rest.
    fn query_many(
        &mut self,
        statements: &[(&str, &[ReadType])],
    ) -> impl Future<Output = Result<Vec<Vec<Vec<Value>>>, DbError>> + Send;

    /// Runs `sql` (unprepared statements without parameters) and commits, in one round trip.
    /// A statement that fails stops the rest, COMMIT included, and the transaction stays open
    /// to be rolled back.
    fn commit_after(&mut self, sql: &str) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Starts a transaction that sees one consistent snapshot for all its reads (checkpoints).
    fn begin_snapshot(&mut self) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Waits until a read snapshot may start on this connection, which then starts one without
    /// waiting: a caller that holds back block execution while the snapshot starts (a client
    /// query) waits here first. Only SQLite ever holds new snapshots back, while its log
    /// starts over.
    fn ready_to_read(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Starts a transaction that only reads, sees one consistent snapshot and holds back no
    /// writer (full scans beside the executor). SQLite: a deferred transaction, whose WAL
    /// snapshot is fixed by its first read; [`Conn::begin_snapshot`] would take the writer lock.
    fn begin_read_snapshot(&mut self) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Starts a read snapshot as [`Conn::begin_read_snapshot`] in which the engine stops any
    /// statement that has run for `limit` with an error: client queries, whose work the
    /// analysis bounds in rows, not in time. The snapshot is fixed by its first read on every
    /// engine; committing or rolling back lifts the limit.
    fn begin_limited_read(
        &mut self,
        limit: Duration,
    ) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Commits the open transaction.
    fn commit(&mut self) -> impl Future<Output = Result<(), DbError>> + Send;

    /// Rolls the open transaction back.
    fn rollback(&mut self) -> impl Future<Output = Result<(), DbError>> + Send;
}

/// What a decoded row holds in memory, counted against a query's byte bound
/// ([`Conn::query_bounded`]): each value's own size plus the text or bytes it carries (a
/// decimal: its text on the wire, at most [`DECIMAL_TEXT_BYTES`]), and the row's vector. It
/// is at least what the row takes in a `QueryResponse` (a value's protobuf tags and lengths
/// take at most 12 bytes, a row's 6) and in the signed answer's canonical encoding.
pub fn row_bytes(row: &[Value]) -> usize {
    row.iter().fold(std::mem::size_of::<Vec<Value>>(), |n, v| {
        let carried = match v {
            Value::Text(t) => t.len(),
            Value::Bytes(b) => b.len(),
            Value::Decimal(_) => DECIMAL_TEXT_BYTES,
            Value::Null | Value::Int(_) | Value::Bool(_) => 0,
        };
        n.saturating_add(std::mem::size_of::<Value>() + carried)
    })
}

/// Rows decoded against a byte bound ([`Conn::query_bounded`]), counted by [`row_bytes`].
pub(crate) struct BoundedRows {
    rows: Vec<Vec<Value>>,
    held: usize,
    max: usize,
}

impl BoundedRows {
    pub(crate) fn new(max: usize) -> BoundedRows {
        BoundedRows {
            rows: Vec::new(),
            held: 0,
            max,
        }
    }

    /// Keeps `row`; false once the rows would pass the bound (the row is not kept).
    pub(crate) fn push(&mut self, row: Vec<Value>) -> bool {
        self.held = self.held.saturating_add(row_bytes(&row));
        if self.held > self.max {
            return false;
        }
        self.rows.push(row);
        true
    }

    /// The rows, or `None` when they passed the bound.
    pub(crate) fn finish(self) -> Option<Vec<Vec<Value>>> {
        (self.held <= self.max).then_some(self.rows)
    }
}

/// A decimal's exact text (what a `QueryResponse` carries) takes at most this many bytes: 38
/// digits, a sign, a point and a leading zero.
pub const DECIMAL_TEXT_BYTES: usize = 48;

/// Classifies an sqlx error; `engine` maps a database error to its kind and the code to report.
pub(crate) fn classify(
    error: sqlx::Error,
    engine: fn(&dyn sqlx::error::DatabaseError) -> (DbErrorKind, Option<String>),
) -> DbError {
    match error {
        sqlx::Error::Database(e) => {
            let (kind, code) = engine(e.as_ref());
            DbError {
                kind,
                code,
                message: e.message().to_owned(),
            }
        }
        e @ (sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed
        | sqlx::Error::Configuration(_)) => DbError::connection(e.to_string()),
        other => DbError {
            kind: DbErrorKind::Statement,
            code: None,
            message: other.to_string(),
        },
    }
}

/// Statement text that tells prepared statements apart by their parameters' types, for engines
/// whose prepared statements fix the parameter types at preparation (PostgreSQL): the
/// statement cache is keyed by text, and binding a text where an integer was prepared would
/// otherwise break the protocol instead of failing the statement.
pub(crate) fn typed_statement_text(sql: &str, params: &[&Value]) -> String {
    let mut text = String::with_capacity(sql.len() + params.len() + 8);
    text.push_str(sql);
    text.push_str(" /* ");
    for p in params {
        text.push(match p {
            Value::Null => '_',
            Value::Int(_) => 'i',
            Value::Decimal(_) => 'd',
            Value::Text(_) => 't',
            Value::Bool(_) => 'b',
            Value::Bytes(_) => 'x',
        });
    }
    text.push_str(" */");
    text
}

/// Statement text as is, for engines that send parameter types with every execution.
pub(crate) fn plain_statement_text(sql: &str, _: &[&Value]) -> String {
    sql.to_owned()
}

/// Defines a backend's pooled connection type over an sqlx pool connection, implementing
/// [`Conn`] with the calling module's `bind`, `decode`, `db_err` and `statement_text` functions,
/// the engine's statements that start a transaction and a snapshot transaction, and its
/// `limited_read` function (`async fn(&mut $name, Duration) -> Result<(), DbError>`, which may
/// leave a statement in `after_end` that lifts the limit). A connection dropped inside a
/// transaction, or whose limit could not be lifted, is closed rather than returned to the pool.
macro_rules! sqlx_conn {
    ($name:ident, $db:ty, begin: [$($begin:literal),+], snapshot: [$($snapshot:literal),+], read_snapshot: [$($read:literal),+], limited_read: $limited:path) => {
        /// A pooled connection.
        #[derive(Debug)]
        pub struct $name {
            conn: sqlx::pool::PoolConnection<$db>,
            in_transaction: bool,
            /// Run after the transaction ends: a session setting of the transaction to undo.
            after_end: Option<&'static str>,
        }

        impl Drop for $name {
            fn drop(&mut self) {
                if self.in_transaction {
                    self.conn.close_on_drop();
                }
            }
        }

        impl $name {
            fn new(conn: sqlx::pool::PoolConnection<$db>) -> Self {
                $name {
                    conn,
                    in_transaction: false,
                    after_end: None,
                }
            }

            /// Ends the transaction with `sql`, then undoes its session setting; until both
            /// succeeded the connection counts as inside a transaction (closed when dropped).
            async fn end(&mut self, sql: &'static str) -> Result<(), DbError> {
                self.simple(sql).await?;
                if let Some(reset) = self.after_end {
                    self.simple(reset).await?;
                    self.after_end = None;
                }
                self.in_transaction = false;
                Ok(())
            }

            async fn simple(&mut self, sql: &'static str) -> Result<(), DbError> {
                sqlx::Executor::execute(&mut *self.conn, sql)
                    .await
                    .map_err(db_err)?;
                Ok(())
            }
        }

        impl $crate::backend::Conn for $name {
            async fn execute(
                &mut self,
                sql: &str,
                params: &[&Value],
                returns_rows: bool,
            ) -> Result<u64, DbError> {
                let mut q = sqlx::query(sqlx::AssertSqlSafe(statement_text(sql, params)));
                for p in params {
                    q = bind(q, p);
                }
                if returns_rows {
                    use futures_util::TryStreamExt;
                    // Counted and dropped as they arrive, never decoded: one row at a time.
                    q.fetch(&mut *self.conn)
                        .try_fold(0u64, |n, _row| async move { Ok(n + 1) })
                        .await
                        .map_err(db_err)
                } else {
                    let done = q.execute(&mut *self.conn).await.map_err(db_err)?;
                    Ok(done.rows_affected())
                }
            }

            async fn query(
                &mut self,
                sql: &str,
                params: &[&Value],
                types: &[ReadType],
            ) -> Result<Vec<Vec<Value>>, DbError> {
                let mut q = sqlx::query(sqlx::AssertSqlSafe(statement_text(sql, params)));
                for p in params {
                    q = bind(q, p);
                }
                let rows = q.fetch_all(&mut *self.conn).await.map_err(db_err)?;
                rows.iter().map(|r| decode(r, types)).collect()
            }

            async fn query_bounded(
                &mut self,
                sql: &str,
                params: &[&Value],
                types: &[ReadType],
                max_bytes: usize,
            ) -> Result<Option<Vec<Vec<Value>>>, DbError> {
                use futures_util::TryStreamExt;
                let mut q = sqlx::query(sqlx::AssertSqlSafe(statement_text(sql, params)));
                for p in params {
                    q = bind(q, p);
                }
                let mut rows = q.fetch(&mut *self.conn);
                let mut out = $crate::backend::BoundedRows::new(max_bytes);
                while let Some(row) = rows.try_next().await.map_err(db_err)? {
                    if !out.push(decode(&row, types)?) {
                        break;
                    }
                }
                Ok(out.finish())
            }

            async fn batch(&mut self, sql: &str) -> Result<(), DbError> {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut *self.conn)
                    .await
                    .map_err(db_err)?;
                Ok(())
            }

            async fn begin(&mut self) -> Result<(), DbError> {
                self.in_transaction = true;
                $(self.simple($begin).await?;)+
                Ok(())
            }

            async fn begin_with(
                &mut self,
                begin: &[&str],
                reads: &[(&str, &[ReadType])],
            ) -> Result<Vec<Vec<Vec<Value>>>, DbError> {
                self.in_transaction = true;
                let all: Vec<(&str, &[ReadType])> = begin
                    .iter()
                    .map(|&s| (s, &[][..]))
                    .chain(reads.iter().copied())
                    .collect();
                let mut rows = $crate::backend::Conn::query_many(self, &all).await?;
                Ok(rows.split_off(begin.len()))
            }

            async fn query_many(
                &mut self,
                statements: &[(&str, &[ReadType])],
            ) -> Result<Vec<Vec<Vec<Value>>>, DbError> {
                use futures_util::TryStreamExt;
                let sql: Vec<&str> = statements.iter().map(|(s, _)| *s).collect();
                let sql = sql.join("; ");
                let mut out = vec![Vec::new(); statements.len()];
                // Each statement's end is one result, after its rows.
                let mut at = 0;
                let mut replies =
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).fetch_many(&mut *self.conn);
                while let Some(reply) = replies.try_next().await.map_err(db_err)? {
                    match reply {
                        sqlx::Either::Left(_) => at += 1,
                        // Rows past the last statement are drained, then refused below.
                        sqlx::Either::Right(row) => {
                            if let Some((_, types)) = statements.get(at) {
                                out[at].push(decode(&row, types)?);
                            }
                        }
                    }
                }
                if at != statements.len() {
                    return Err(DbError {
                        kind: DbErrorKind::Statement,
                        code: None,
                        message: format!(
                            "{} statements sent in one text, {at} answered",
                            statements.len()
                        ),
                    });
                }
                Ok(out)
            }

            async fn commit_after(&mut self, sql: &str) -> Result<(), DbError> {
                $crate::backend::Conn::batch(self, &format!("{sql}; COMMIT")).await?;
                if let Some(reset) = self.after_end {
                    self.simple(reset).await?;
                    self.after_end = None;
                }
                self.in_transaction = false;
                Ok(())
            }

            async fn begin_snapshot(&mut self) -> Result<(), DbError> {
                self.in_transaction = true;
                $(self.simple($snapshot).await?;)+
                Ok(())
            }

            async fn begin_read_snapshot(&mut self) -> Result<(), DbError> {
                self.in_transaction = true;
                $(self.simple($read).await?;)+
                Ok(())
            }

            async fn begin_limited_read(&mut self, limit: std::time::Duration) -> Result<(), DbError> {
                self.in_transaction = true;
                $limited(self, limit).await
            }

            async fn commit(&mut self) -> Result<(), DbError> {
                self.end("COMMIT").await
            }

            async fn rollback(&mut self) -> Result<(), DbError> {
                self.end("ROLLBACK").await
            }
        }
    };
}

pub(crate) use sqlx_conn;

/// The [`Backend`] methods every sqlx backend shares, for a struct with `pool` and `url` fields,
/// its connection type `$conn`, and the calling module's `MIGRATOR` and `db_err`.
macro_rules! sqlx_backend_basics {
    ($conn:ident) => {
        fn url(&self) -> &str {
            &self.url
        }

        async fn acquire(&self) -> Result<$conn, DbError> {
            let conn = self.pool.acquire().await.map_err(db_err)?;
            Ok($conn::new(conn))
        }

        fn connection_lost(&self) {
            self.suspicion.raise();
        }

        async fn migrate(&self) -> Result<(), StorageError> {
            MIGRATOR
                .run(&self.pool)
                .await
                .map_err(|e| StorageError::Migration {
                    url: self.url.clone(),
                    reason: e.to_string(),
                })
        }

        async fn close(&self) {
            self.pool.close().await;
        }

        fn pool_use(&self) -> crate::backend::PoolUse {
            crate::backend::PoolUse {
                open: self.pool.size(),
                idle: u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX),
                max: self.pool.options().get_max_connections(),
            }
        }
    };
}

pub(crate) use sqlx_backend_basics;

/// Maps errors of catalog queries on the database at `url` while doing `during`.
pub(crate) fn catalog_error(
    url: &str,
    during: &str,
    db_err: fn(sqlx::Error) -> DbError,
) -> impl Fn(sqlx::Error) -> StorageError + use<> {
    let (url, during) = (url.to_owned(), during.to_owned());
    move |e| StorageError::Database {
        url: url.clone(),
        during: during.clone(),
        source: db_err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_doubts_long_idle_connections_and_all_of_them_after_a_loss() {
        let s = Suspicion::default();
        assert!(
            !s.doubts(Duration::ZERO),
            "a fresh pool trusts a busy connection"
        );
        assert!(s.doubts(IDLE_PING), "a connection idle that long is pinged");
        s.raise();
        assert!(
            s.doubts(Duration::ZERO),
            "after a loss, every connection is pinged"
        );
    }
}
