//! SQLite: one writer, so blocks run serially in one database transaction.
//!
//! The engine runs in process through rusqlite and is called in-line: a statement costs SQLite's
//! own work, not a hand-off to a driver thread and back (sqlx's SQLite driver ran each
//! connection on a thread of its own; the wake-ups were a fifth of a one-organization run). The
//! store moves long work (a block, a full scan, a checkpoint) off the runtime's workers as a
//! whole ([`Backend::calls_inline`]), so a block costs one hand-off instead of one a statement.
//!
//! WAL checkpoints run beside the writers, on a thread of the pool's own ([`Checkpointer`]):
//! SQLite's automatic checkpoint runs inside the COMMIT that crosses its threshold, so every
//! ~30th block paid for copying the log into the database and two fsyncs (a fifth of the
//! digest's time on a one-organization run). Past a bound, new read snapshots wait while the
//! log starts over ([`wal`]): readers whose snapshots overlap would otherwise keep it growing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chainify_core::Value;
use chainify_sql::ColumnType;
use chainify_sql::render::Dialect;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::StoreOptions;
use crate::backend::{Backend, Conn, DeferForeignKeys, PoolUse};
use crate::catalog::{
    CatalogCheck, CatalogColumn, CatalogForeignKey, CatalogTable, classify_declared_type,
};
use crate::ddl::ReadType;
use crate::error::{DbError, DbErrorKind, StorageError, redact_url};
use crate::value::{bool_from_i64, decimal_from_f64, decimal_from_i64};

mod wal;

use wal::{CHECKPOINT_AFTER, CHECKPOINT_IN_PLACE, Checkpointer, LOG_SIZE_LIMIT, RESTART_FROM};

/// The migrations, embedded at build time; applied by [`Sqlite::migrate`] in sqlx's own
/// bookkeeping table, so that databases made before rusqlite carry on.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// SQLite keeps DECIMAL values as 64-bit floating point, exact to 15 significant digits.
pub(crate) const MAX_DECIMAL_PRECISION: u32 = 15;

/// Prepared statements kept per connection (sqlx's default): clients choose the texts, up to
/// 64 KiB each, so the cache stays bounded as before.
const STATEMENT_CACHE: usize = 100;

/// An SQLite database file.
#[derive(Debug)]
pub struct Sqlite {
    pool: Arc<Pool>,
    url: String,
}

/// What a connection opens, and how.
#[derive(Debug)]
struct Target {
    path: PathBuf,
    in_memory: bool,
    flags: OpenFlags,
    read_only: bool,
    lock_timeout: Duration,
}

/// A bounded pool of connections: a permit per connection in use, idle connections kept open.
#[derive(Debug)]
struct Pool {
    target: Target,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
    max: u32,
    open: AtomicU32,
    acquire_timeout: Duration,
    checkpointer: Checkpointer,
}

impl Pool {
    fn open_connection(&self) -> Result<Connection, DbError> {
        let t = &self.target;
        let conn = if t.in_memory {
            Connection::open_in_memory()
        } else {
            Connection::open_with_flags(&t.path, t.flags)
        }
        .map_err(db_err)?;
        // Opening waits in place for another process's lock (converting the file to WAL);
        // afterwards a connection waits asynchronously (`patiently`), with no busy handler.
        conn.busy_timeout(t.lock_timeout).map_err(db_err)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        if !t.read_only {
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))
                .map_err(db_err)?;
            if !t.in_memory {
                conn.wal_hook(Some(wal::wal_committed));
                conn.pragma_update(None, "journal_size_limit", LOG_SIZE_LIMIT)
                    .map_err(db_err)?;
            }
        }
        // Case-sensitive LIKE, as PostgreSQL and MySQL's binary collations; foreign keys and
        // CHECK constraints enforced, as the other engines do.
        conn.execute_batch(
            "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA case_sensitive_like = ON; \
             PRAGMA ignore_check_constraints = OFF",
        )
        .map_err(db_err)?;
        conn.busy_timeout(Duration::ZERO).map_err(db_err)?;
        self.open.fetch_add(1, Ordering::Relaxed);
        Ok(conn)
    }

    /// Asks the checkpointer for a run on the pool's database.
    fn request_checkpoint(&self) {
        self.checkpointer
            .request(&self.target.path, self.target.flags);
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes a connection (an open transaction is rolled back by SQLite).
    fn discard(&self, conn: Connection) {
        drop(conn);
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Splits `sqlite://path?options` (or `sqlite:path`, `sqlite::memory:`) into what to open.
fn target(url: &str, options: &StoreOptions) -> Result<Target, String> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or("an SQLite URL starts with sqlite://")?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let path = percent_decoded(path)?;
    let path = path.as_str();
    let mut in_memory = path == ":memory:";
    let mut create = !options.read_only;
    let mut read_only = options.read_only;
    for option in query.split('&').filter(|o| !o.is_empty()) {
        match option {
            "mode=memory" => in_memory = true,
            "mode=ro" => read_only = true,
            "mode=rw" => create = false,
            "mode=rwc" => {}
            other => {
                return Err(format!(
                    "unknown option {other} (known: mode=ro|rw|rwc|memory)"
                ));
            }
        }
    }
    if path.is_empty() && !in_memory {
        return Err("no database file named".into());
    }
    let mut flags = OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if read_only {
        flags |= OpenFlags::SQLITE_OPEN_READ_ONLY;
    } else {
        flags |= OpenFlags::SQLITE_OPEN_READ_WRITE;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
    }
    Ok(Target {
        path: PathBuf::from(path),
        in_memory,
        flags,
        read_only,
        lock_timeout: options.lock_timeout,
    })
}

/// `path` with its `%XX` escapes decoded, as sqlx read SQLite URLs.
fn percent_decoded(path: &str) -> Result<String, String> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = path
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| format!("bad escape at byte {i} of the path {path:?}"))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("the path {path:?} decodes to no UTF-8 text"))
}

impl Sqlite {
    /// Opens (creating if missing) the database at `url` (`sqlite://path` or `sqlite::memory:`)
    /// with WAL, foreign keys on, case-sensitive LIKE (as PostgreSQL and binary MySQL
    /// collations) and a busy timeout. One connection is opened at once, so a database that
    /// cannot be opened fails here.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Sqlite, StorageError> {
        let redacted = redact_url(url);
        let connect_err = |reason: String| StorageError::Connect {
            url: redacted.clone(),
            reason,
        };
        let target = target(url, options).map_err(connect_err)?;
        // Every connection to an in-memory database is a separate database.
        let max = if target.in_memory {
            1
        } else {
            options.max_connections.max(1)
        };
        let pool = Pool {
            target,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max as usize)),
            max,
            open: AtomicU32::new(0),
            acquire_timeout: options.connect_timeout,
            checkpointer: Checkpointer::default(),
        };
        let first = pool.open_connection().map_err(|e| connect_err(e.message))?;
        pool.idle().push(first);
        Ok(Sqlite {
            pool: Arc::new(pool),
            url: redacted,
        })
    }
}

fn error_kind(extended_code: i32) -> DbErrorKind {
    match extended_code & 0xff {
        // SQLITE_BUSY, SQLITE_LOCKED.
        5 | 6 => DbErrorKind::Transient,
        // SQLITE_NOMEM, SQLITE_READONLY, SQLITE_INTERRUPT, SQLITE_IOERR, SQLITE_CORRUPT,
        // SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB: this organization's fault, never the
        // statement's (an abort here would differ from the other organizations).
        7..=11 | 13 | 14 | 26 => DbErrorKind::Connection,
        _ => DbErrorKind::Statement,
    }
}

/// SQLITE_BUSY or SQLITE_LOCKED, but not SQLITE_BUSY_SNAPSHOT (a read snapshot that may not
/// turn into a write: waiting cannot help, the transaction must start over).
fn lock_held_elsewhere(e: &DbError) -> bool {
    e.kind == DbErrorKind::Transient && e.code.as_deref() != Some("517")
}

fn db_err(e: rusqlite::Error) -> DbError {
    match e {
        rusqlite::Error::SqliteFailure(failure, message) => DbError {
            kind: error_kind(failure.extended_code),
            code: Some(failure.extended_code.to_string()),
            message: message.unwrap_or_else(|| failure.to_string()),
        },
        // A prepare error: the message without the statement's text (up to 64 KiB).
        rusqlite::Error::SqlInputError { error, msg, .. } => DbError {
            kind: error_kind(error.extended_code),
            code: Some(error.extended_code.to_string()),
            message: msg,
        },
        other => DbError {
            kind: DbErrorKind::Statement,
            code: None,
            message: other.to_string(),
        },
    }
}

/// Binds `params` as sqlx did: `?NNN` takes the NNN-th value, a bare `?` the next one, and a
/// parameter without a value stays NULL.
fn bind(stmt: &mut rusqlite::CachedStatement<'_>, params: &[&Value]) -> Result<(), DbError> {
    let mut next = 0;
    for i in 1..=stmt.parameter_count() {
        let n: usize = match stmt.parameter_name(i) {
            Some(name) => match name.strip_prefix(['?', '$']).and_then(|n| n.parse().ok()) {
                Some(n) => n,
                None => {
                    return Err(DbError {
                        kind: DbErrorKind::Statement,
                        code: None,
                        message: format!("unsupported parameter {name}"),
                    });
                }
            },
            None => {
                next += 1;
                next
            }
        };
        let Some(value) = n.checked_sub(1).and_then(|n| params.get(n)) else {
            continue;
        };
        let raw = match **value {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(i),
            // SQLite's DECIMAL is a floating-point or integer number.
            Value::Decimal(ref d) => match d.to_i64_exact() {
                Some(i) => ValueRef::Integer(i),
                None => ValueRef::Real(d.to_string().parse::<f64>().unwrap_or(f64::NAN)),
            },
            Value::Text(ref s) => ValueRef::Text(s.as_bytes()),
            Value::Bool(b) => ValueRef::Integer(i64::from(b)),
            Value::Bytes(ref b) => ValueRef::Blob(b),
        };
        stmt.raw_bind_parameter(i, ToSqlOutput::Borrowed(raw))
            .map_err(db_err)?;
    }
    Ok(())
}

/// Reads whatever SQLite stored (its columns accept any storage class) as faithfully as
/// possible for the declared type.
fn decode_value(raw: ValueRef<'_>, ty: ReadType) -> Result<Value, String> {
    Ok(match raw {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => match ty {
            ReadType::Bool => bool_from_i64(i),
            ReadType::Decimal(s) => decimal_from_i64(i, s),
            _ => Value::Int(i),
        },
        ValueRef::Real(x) => match ty {
            ReadType::Decimal(s) => decimal_from_f64(x, s),
            // A float where none belongs: keep its digits so the digest shows it.
            _ => Value::Text(x.to_string()),
        },
        // Text stays text, in a DECIMAL column too: chainify binds numbers, and SQLite's
        // NUMERIC affinity stores every well-formed one as a number, so text there was written
        // behind chainify's back ('100.00' followed by a no-break space compares as text, not
        // as 100, in every later statement) and must digest unlike the number it resembles.
        // Text that is not UTF-8 (written behind chainify: `CAST(X'FF' AS TEXT)`) reads as its
        // bytes, which no text equals: the scan and the digest see a changed value rather than
        // fail on every later block. In a BYTES column, where its bytes would pass for the blob
        // every later comparison finds unequal (a hunt's `SET data = CAST(data AS TEXT)` passed
        // the scan), it reads as text, which no blob equals.
        ValueRef::Text(bytes) => match (std::str::from_utf8(bytes), ty) {
            (Ok(text), _) => Value::Text(text.to_owned()),
            (Err(_), ReadType::Bytes) => Value::Text(String::from_utf8_lossy(bytes).into_owned()),
            (Err(_), _) => Value::Bytes(bytes.to_vec()),
        },
        ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
    })
}

fn decode(row: &rusqlite::Row<'_>, types: &[ReadType]) -> Result<Vec<Value>, DbError> {
    let bad = |e: String| DbError {
        kind: DbErrorKind::Statement,
        code: None,
        message: format!("decoding a row: {e}"),
    };
    types
        .iter()
        .enumerate()
        .map(|(i, ty)| {
            let raw = row.get_ref(i).map_err(|e| bad(e.to_string()))?;
            decode_value(raw, *ty).map_err(bad)
        })
        .collect()
}

/// A pooled connection. Each call runs SQLite on the calling thread.
#[derive(Debug)]
pub struct SqliteConn {
    conn: Option<Connection>,
    pool: Arc<Pool>,
    _permit: OwnedSemaphorePermit,
    /// A progress handler stops statements past a deadline ([`Conn::begin_limited_read`]).
    limited: bool,
    /// Let through the snapshot gate, for a read snapshot to come or under way.
    pass: Option<wal::Pass>,
}

impl Drop for SqliteConn {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        // Never handed on half-done, by SQLite's own state (a SAVEPOINT opens a transaction
        // too, and SQLite may end one by itself): rolled back, or else closed; nor with a
        // deadline that would stop the next user's statements.
        let unlimited = !self.limited || conn.progress_handler(0, None::<fn() -> bool>).is_ok();
        let clean = unlimited && (conn.is_autocommit() || conn.execute_batch("ROLLBACK").is_ok());
        {
            let mut idle = self.pool.idle();
            // Checked under the idle list's lock, which `close` drains after closing the
            // permits.
            if clean && !self.pool.permits.is_closed() {
                idle.push(conn);
            } else {
                drop(idle);
                self.pool.discard(conn);
            }
        }
        // Its snapshot, if any, ended above.
        self.end_read();
    }
}

impl SqliteConn {
    fn conn(&self) -> &Connection {
        self.conn.as_ref().expect("a connection until dropped")
    }

    /// After a call that may have committed: a checkpoint when the log has grown long.
    fn after_commit(&self) {
        let frames = wal::frames_committed();
        let (pool, checkpointer) = (&self.pool, &self.pool.checkpointer);
        checkpointer.committed(frames);
        if frames >= CHECKPOINT_IN_PLACE {
            let drained =
                frames >= RESTART_FROM && checkpointer.gate.close(pool.target.lock_timeout);
            // Copying and two fsyncs: never on a runtime worker (a ledger append commits
            // there); the next block, which runs off the workers, does it, or the thread.
            if !crate::store::on_runtime_worker() {
                checkpointer.in_place(self.conn());
            } else if drained {
                pool.request_checkpoint();
            }
        } else if frames >= CHECKPOINT_AFTER {
            pool.request_checkpoint();
        }
    }

    /// Waits at the snapshot gate unless already let through.
    async fn let_through(&mut self) -> &mut wal::Pass {
        if self.pass.is_none() {
            self.pass = Some(self.pool.checkpointer.gate.enter().await);
        }
        self.pass.as_mut().expect("just let through")
    }

    /// The read snapshot has ended (or never started): the last reader out while the gate is
    /// closed asks for the checkpoint that opens it.
    fn end_read(&mut self) {
        if let Some(pass) = self.pass.take()
            && pass.end()
        {
            self.pool.request_checkpoint();
        }
    }

    /// After COMMIT or ROLLBACK: a snapshot that ended lets its pass go.
    fn ended(&mut self) {
        if self.conn.as_ref().is_some_and(Connection::is_autocommit) {
            self.end_read();
        }
    }

    /// Removes a deadline's progress handler (still `limited` if that fails: the connection is
    /// then closed, not handed on).
    fn unlimit(&mut self) -> Result<(), DbError> {
        if self.limited {
            self.conn()
                .progress_handler(0, None::<fn() -> bool>)
                .map_err(db_err)?;
            self.limited = false;
        }
        Ok(())
    }

    /// Runs `op`, waiting for a lock another connection holds without holding the thread:
    /// SQLite's own busy handler sleeps in place, which on a runtime worker would stall every
    /// task there, the lock's holder among them. Every call also spends from the task's
    /// cooperative budget, since a call that never waits would otherwise never yield.
    async fn patiently<T>(
        &mut self,
        mut op: impl FnMut(&mut Self) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        tokio::task::consume_budget().await;
        let started = Instant::now();
        let mut pause = Duration::ZERO;
        loop {
            let done = op(self);
            self.after_commit();
            match done {
                Err(e)
                    if lock_held_elsewhere(&e)
                        && started.elapsed() < self.pool.target.lock_timeout =>
                {
                    if pause.is_zero() {
                        tokio::task::yield_now().await;
                        pause = Duration::from_micros(500);
                    } else {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(8));
                    }
                }
                done => return done,
            }
        }
    }

    /// Runs `op` with SQLite's busy handler waiting up to the lock timeout in place: for rare
    /// work (migrations, catalog reads, several statements in one text).
    fn waiting_in_place<T>(&mut self, op: impl FnOnce(&mut Self) -> T) -> Result<T, DbError> {
        let wait = self.pool.target.lock_timeout;
        self.conn().busy_timeout(wait).map_err(db_err)?;
        let done = op(self);
        self.conn().busy_timeout(Duration::ZERO).map_err(db_err)?;
        // A checkpoint never waits for readers or writers.
        self.after_commit();
        Ok(done)
    }

    /// One statement of chainify's own (BEGIN, COMMIT, ROLLBACK), waited for patiently.
    async fn simple(&mut self, sql: &str) -> Result<(), DbError> {
        self.patiently(|c| c.conn().execute_batch(sql).map_err(db_err))
            .await
    }

    /// Runs `sql` with `params`, handing each row to `each`; returns the rows it returned.
    /// `each` tells whether to read on: false leaves the rest unread.
    fn run(
        &mut self,
        sql: &str,
        params: &[&Value],
        mut each: impl FnMut(&rusqlite::Row<'_>) -> Result<bool, DbError>,
    ) -> Result<u64, DbError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(sql).map_err(db_err)?;
        bind(&mut stmt, params)?;
        let mut rows = stmt.raw_query();
        let mut n = 0;
        while let Some(row) = rows.next().map_err(db_err)? {
            n += 1;
            if !each(row)? {
                break;
            }
        }
        Ok(n)
    }

    /// Runs a query and decodes its rows, on the calling thread.
    fn query_now(
        &mut self,
        sql: &str,
        params: &[&Value],
        types: &[ReadType],
    ) -> Result<Vec<Vec<Value>>, DbError> {
        let mut out = Vec::new();
        self.run(sql, params, |row| {
            out.push(decode(row, types)?);
            Ok(true)
        })?;
        Ok(out)
    }
}

impl Conn for SqliteConn {
    async fn execute(
        &mut self,
        sql: &str,
        params: &[&Value],
        returns_rows: bool,
    ) -> Result<u64, DbError> {
        self.patiently(|c| {
            let returned = c.run(sql, params, |_| Ok(true))?;
            Ok(if returns_rows {
                returned
            } else {
                c.conn().changes()
            })
        })
        .await
    }

    async fn query(
        &mut self,
        sql: &str,
        params: &[&Value],
        types: &[ReadType],
    ) -> Result<Vec<Vec<Value>>, DbError> {
        self.patiently(|c| c.query_now(sql, params, types)).await
    }

    async fn query_bounded(
        &mut self,
        sql: &str,
        params: &[&Value],
        types: &[ReadType],
        max_bytes: usize,
    ) -> Result<Option<Vec<Vec<Value>>>, DbError> {
        self.patiently(|c| {
            let mut out = crate::backend::BoundedRows::new(max_bytes);
            c.run(sql, params, |row| Ok(out.push(decode(row, types)?)))?;
            Ok(out.finish())
        })
        .await
    }

    // Several statements: retrying the whole text after a wait would run again what already
    // ran, so a lock is waited for in place (DDL and savepoints; inside a block's transaction
    // the writer lock is already held).
    async fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        tokio::task::consume_budget().await;
        self.waiting_in_place(|c| c.conn().execute_batch(sql).map_err(db_err))?
    }

    // The snapshot transaction takes the writer lock up front: nobody changes anything while
    // it runs.
    async fn begin(&mut self) -> Result<(), DbError> {
        self.simple("BEGIN IMMEDIATE").await
    }

    // A statement that waits for a lock is retried alone: each opening statement is one step.
    async fn begin_with(
        &mut self,
        begin: &[&str],
        reads: &[(&str, &[ReadType])],
    ) -> Result<Vec<Vec<Vec<Value>>>, DbError> {
        for statement in begin {
            self.simple(statement).await?;
        }
        self.query_many(reads).await
    }

    // In process there is no round trip to save; the statements carry literal values, so they
    // are prepared each time rather than churning the statement cache.
    async fn query_many(
        &mut self,
        statements: &[(&str, &[ReadType])],
    ) -> Result<Vec<Vec<Vec<Value>>>, DbError> {
        tokio::task::consume_budget().await;
        self.waiting_in_place(|c| {
            let mut out = Vec::with_capacity(statements.len());
            for (sql, types) in statements {
                let mut stmt = c.conn().prepare(sql).map_err(db_err)?;
                let mut rows = stmt.raw_query();
                let mut got = Vec::new();
                while let Some(row) = rows.next().map_err(db_err)? {
                    got.push(decode(row, types)?);
                }
                out.push(got);
            }
            Ok(out)
        })?
    }

    async fn commit_after(&mut self, sql: &str) -> Result<(), DbError> {
        self.batch(&format!("{sql}; COMMIT")).await?;
        self.unlimit()
    }

    async fn begin_snapshot(&mut self) -> Result<(), DbError> {
        self.simple("BEGIN IMMEDIATE").await
    }

    async fn ready_to_read(&mut self) {
        self.let_through().await;
    }

    // A deferred transaction: in WAL mode its first read fixes what it sees.
    async fn begin_read_snapshot(&mut self) -> Result<(), DbError> {
        self.let_through().await.unlimited();
        let begun = self.simple("BEGIN").await;
        self.ended();
        begun
    }

    // SQLite asks the handler every thousand virtual-machine steps (microseconds); once past
    // the deadline, the statement stops with SQLITE_INTERRUPT.
    async fn begin_limited_read(&mut self, limit: Duration) -> Result<(), DbError> {
        self.let_through().await;
        if let Err(e) = self.simple("BEGIN").await {
            self.ended();
            return Err(e);
        }
        let deadline = Instant::now() + limit;
        if let Some(pass) = &self.pass {
            pass.limited(deadline);
        }
        self.limited = true;
        self.conn()
            .progress_handler(1000, Some(move || Instant::now() >= deadline))
            .map_err(db_err)
    }

    async fn commit(&mut self) -> Result<(), DbError> {
        let done = self.simple("COMMIT").await;
        self.ended();
        done?;
        self.unlimit()
    }

    async fn rollback(&mut self) -> Result<(), DbError> {
        let done = self.simple("ROLLBACK").await;
        self.ended();
        done?;
        self.unlimit()
    }
}

/// A catalog query's error on the database at `url` while doing `during`.
fn catalog_error(url: &str, during: &str) -> impl Fn(DbError) -> StorageError + use<> {
    let (url, during) = (url.to_owned(), during.to_owned());
    move |source| StorageError::Database {
        url: url.clone(),
        during: during.clone(),
        source,
    }
}

/// The rows `sql` returns for `param` (a catalog read), each read by `row`.
fn catalog_rows<T>(
    conn: &Connection,
    sql: &str,
    param: &str,
    row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>, DbError> {
    let mut stmt = conn.prepare_cached(sql).map_err(db_err)?;
    let rows = stmt.query_map([param], row).map_err(db_err)?;
    rows.collect::<Result<_, _>>().map_err(db_err)
}

fn column(name: String, declared: &str, not_null: bool) -> CatalogColumn {
    let (ty, precision) = classify_declared_type(declared);
    let problem = match (&ty, precision) {
        (ColumnType::Decimal { .. }, Some(p)) if p > MAX_DECIMAL_PRECISION => Some(format!(
            "SQLite stores DECIMAL as 64-bit floating point, exact only to {MAX_DECIMAL_PRECISION} significant digits; declare DECIMAL(p, s) with p <= {MAX_DECIMAL_PRECISION}"
        )),
        _ => None,
    };
    CatalogColumn {
        name,
        native_type: declared.to_owned(),
        ty,
        not_null,
        precision,
        engine_problem: problem,
        default: None,
    }
}

/// The upper-cased words of a `CREATE TABLE` text, comments left out (SQLite keeps them in
/// `sqlite_master.sql`, and `ON /* */ CONFLICT` is still a conflict clause). Words inside quoted
/// names and strings are kept: they can only make a check refuse a table, never pass one.
fn definition_words(definition: &str) -> Vec<String> {
    let mut text = String::with_capacity(definition.len());
    let mut chars = definition.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match quote {
            Some(close) => {
                if c == close {
                    quote = None;
                }
                text.push(c);
            }
            None if c == '-' && chars.peek() == Some(&'-') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
                text.push(' ');
            }
            None if c == '/' && chars.peek() == Some(&'*') => {
                chars.next();
                let mut star = false;
                for c in chars.by_ref() {
                    if star && c == '/' {
                        break;
                    }
                    star = c == '*';
                }
                text.push(' ');
            }
            None => {
                quote = match c {
                    '\'' | '"' | '`' => Some(c),
                    '[' => Some(']'),
                    _ => None,
                };
                text.push(c);
            }
        }
    }
    text.to_ascii_uppercase()
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The first collation other than BINARY that a `CREATE TABLE` text names, if any.
fn non_binary_collation(definition: &str) -> Option<String> {
    let words = definition_words(definition);
    let mut words = words.iter().map(String::as_str);
    while let Some(w) = words.next() {
        if w == "COLLATE" {
            match words.next() {
                Some("BINARY") => {}
                Some(other) => return Some(other.to_owned()),
                None => return Some(String::new()),
            }
        }
    }
    None
}

/// The first conflict resolution other than ABORT (the default) that `definition` declares on
/// a constraint (`… PRIMARY KEY ON CONFLICT REPLACE`): with it SQLite replaces, ignores or rolls
/// back where the other engines abort the statement.
fn conflict_resolution(definition: &str) -> Option<String> {
    let words = definition_words(definition);
    words.windows(2).enumerate().find_map(|(i, pair)| {
        (pair[0] == "ON" && pair[1] == "CONFLICT")
            .then(|| words.get(i + 2).cloned().unwrap_or_default())
            .filter(|resolution| resolution != "ABORT")
    })
}

/// Whether `definition` declares a constraint `INITIALLY DEFERRED`: SQLite then checks that
/// foreign key only when the block's transaction commits, failing the whole block (again at
/// every retry), where the other engines refuse the one statement that broke it.
fn deferred_constraint(definition: &str) -> bool {
    definition_words(definition)
        .windows(2)
        .any(|pair| pair[0] == "INITIALLY" && pair[1] == "DEFERRED")
}

/// Applies the embedded migrations that `conn`'s database lacks, each in a transaction,
/// recorded in sqlx's `_sqlx_migrations` (version, checksum) as sqlx's migrator did.
fn apply_migrations(conn: &Connection) -> Result<(), String> {
    let e = |e: rusqlite::Error| e.to_string();
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS _sqlx_migrations (version BIGINT PRIMARY KEY, \
         description TEXT NOT NULL, installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \
         success BOOLEAN NOT NULL, checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)",
    )
    .map_err(e)?;
    let mut applied = std::collections::BTreeMap::new();
    {
        let mut stmt = conn
            .prepare("SELECT version, checksum, success FROM _sqlx_migrations")
            .map_err(e)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    (r.get::<_, Vec<u8>>(1)?, r.get::<_, bool>(2)?),
                ))
            })
            .map_err(e)?;
        for row in rows {
            let (version, found) = row.map_err(e)?;
            applied.insert(version, found);
        }
    }
    let known: Vec<_> = MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .collect();
    if let Some(version) = applied
        .keys()
        .find(|v| !known.iter().any(|m| m.version == **v))
    {
        return Err(format!(
            "the database has migration {version}, which this build does not know (made by a newer chainify?)"
        ));
    }
    for m in known {
        match applied.get(&m.version) {
            Some((_, false)) => {
                return Err(format!(
                    "migration {} ({}) was left half-applied",
                    m.version, m.description
                ));
            }
            Some((checksum, true)) if checksum[..] != m.checksum[..] => {
                return Err(format!(
                    "migration {} ({}) differs from the one applied to the database",
                    m.version, m.description
                ));
            }
            Some(_) => {}
            None => {
                let started = Instant::now();
                // The writer lock first, then a second look: another process starting on the
                // same file may have applied it meanwhile.
                let tx = rusqlite::Transaction::new_unchecked(
                    conn,
                    rusqlite::TransactionBehavior::Immediate,
                )
                .map_err(e)?;
                let done: bool = tx
                    .query_row(
                        "SELECT COUNT(*) > 0 FROM _sqlx_migrations WHERE version = ?1",
                        [m.version],
                        |r| r.get(0),
                    )
                    .map_err(e)?;
                if done {
                    continue;
                }
                tx.execute_batch(m.sql.as_str())
                    .map_err(|err| format!("migration {} ({}): {err}", m.version, m.description))?;
                tx.execute(
                    "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                     VALUES (?1, ?2, TRUE, ?3, ?4)",
                    rusqlite::params![
                        m.version,
                        m.description.as_ref(),
                        m.checksum.as_ref(),
                        i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX)
                    ],
                )
                .map_err(e)?;
                tx.commit().map_err(e)?;
            }
        }
    }
    Ok(())
}

impl Sqlite {
    /// Reads `table`'s definition from the catalog on `conn`.
    fn read_catalog(
        &self,
        conn: &Connection,
        table: &str,
    ) -> Result<Option<CatalogTable>, StorageError> {
        let err = |during: &str| catalog_error(&self.url, during);
        let definition: Option<Option<String>> = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = ?1 AND type = 'table'",
                [table],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err)
            .map_err(err("looking up a table"))?;
        let Some(definition) = definition else {
            return Ok(None);
        };
        let columns = catalog_rows(
            conn,
            "SELECT name, type, \"notnull\", pk, dflt_value, hidden FROM pragma_table_xinfo(?1) ORDER BY cid",
            table,
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    // A column declared without a type has an empty (or NULL) one.
                    r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            },
        )
        .map_err(err("reading the columns of a table"))?;
        let mut t = CatalogTable {
            name: table.to_owned(),
            ..CatalogTable::default()
        };
        let mut pk: Vec<(i64, String)> = Vec::new();
        for (name, declared, not_null, pk_pos, default, hidden) in columns {
            if pk_pos > 0 {
                pk.push((pk_pos, name.clone()));
            }
            let mut c = column(name, &declared, not_null != 0);
            // `hidden` 2 and 3: a generated column (virtual, stored).
            c.default = if hidden >= 2 {
                Some("GENERATED ALWAYS AS (…)".into())
            } else {
                default
            };
            t.columns.push(c);
        }
        pk.sort();
        t.primary_key = pk.into_iter().map(|(_, n)| n).collect();
        let indexes = catalog_rows(
            conn,
            "SELECT name, origin, partial FROM pragma_index_list(?1) WHERE \"unique\" = 1 ORDER BY name",
            table,
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, bool>(2)?,
                ))
            },
        )
        .map_err(err("reading the indexes of a table"))?;
        // A primary key without an index of its own is the rowid (`INTEGER PRIMARY KEY` in a
        // table with a rowid), which SQLite fills in when an INSERT gives it NULL, where the
        // other engines refuse the row. Asked of SQLite, not read from the definition's text.
        if !t.primary_key.is_empty() && !indexes.iter().any(|(_, origin, _)| origin == "pk") {
            t.problems.push(format!(
                "primary key {} is SQLite's rowid (INTEGER PRIMARY KEY), which SQLite fills in when an INSERT gives it NULL where the other engines refuse the row; declare it BIGINT",
                t.primary_key.join(", ")
            ));
        }
        for (name, origin, partial) in indexes {
            // The index's own collation (`CREATE UNIQUE INDEX … (u COLLATE NOCASE)`) is not in
            // the table's definition: keys the analysis tells apart would collide.
            let keys = catalog_rows(
                conn,
                "SELECT name, coll FROM pragma_index_xinfo(?1) WHERE key = 1 ORDER BY seqno",
                &name,
                |r| {
                    Ok((
                        r.get::<_, Option<String>>(0)?,
                        r.get::<_, Option<String>>(1)?,
                    ))
                },
            )
            .map_err(err("reading an index"))?;
            if let Some(coll) = keys
                .iter()
                .filter_map(|(_, coll)| coll.as_deref())
                .find(|coll| !coll.eq_ignore_ascii_case("BINARY"))
            {
                t.problems.push(format!(
                    "unique index {name} compares with COLLATE {coll}, under which keys the analysis tells apart collide; use the default (BINARY)"
                ));
            }
            if partial {
                t.problems.push(format!(
                    "unique index {name} is partial (WHERE …): a change of the predicate's columns can make rows collide, which conflict analysis does not follow"
                ));
            }
            if origin == "pk" {
                continue;
            }
            let cols: Vec<Option<String>> = keys.into_iter().map(|(col, _)| col).collect();
            match cols.into_iter().collect::<Option<Vec<String>>>() {
                Some(cols) => t.uniques.push(cols),
                None => t.problems.push(format!(
                    "unique index {name} is on an expression, which conflict analysis cannot bound"
                )),
            }
        }
        // SQLite evaluates an index's expression or predicate on every change, here alone:
        // where it fails (abs() of the smallest integer), a row is refused here only.
        let evaluated = catalog_rows(
            conn,
            "SELECT il.name FROM pragma_index_list(?1) il WHERE il.\"unique\" = 0 AND (il.partial = 1 \
             OR EXISTS (SELECT 1 FROM pragma_index_xinfo(il.name) x WHERE x.key = 1 AND x.cid = -2)) \
             ORDER BY il.name",
            table,
            |r| r.get::<_, String>(0),
        )
        .map_err(err("reading the indexes of a table"))?;
        for name in evaluated {
            t.problems.push(format!(
                "index {name} is on an expression or has a predicate (WHERE …), which SQLite evaluates here alone on every change: where it fails, a row is refused here that the other organizations store"
            ));
        }
        // A column COLLATE NOCASE or RTRIM compares text unlike the other engines; user
        // triggers would change rows differently from the other organizations.
        if let Some(collation) = definition.as_deref().and_then(non_binary_collation) {
            t.problems.push(format!(
                "declares COLLATE {collation}, which compares text unlike the other engines; use the default (BINARY)"
            ));
        }
        if let Some(resolution) = definition.as_deref().and_then(conflict_resolution) {
            t.problems.push(format!(
                "declares ON CONFLICT {resolution}, with which SQLite resolves a constraint violation where the other engines abort the statement (REPLACE deletes rows no trigger records, ROLLBACK ends the block's transaction); remove the clause"
            ));
        }
        // SQLite keeps its CHECK constraints only in the definition's text. One that cannot be
        // read is refused rather than taken for none.
        if let Some(definition) = definition.as_deref()
            && definition_words(definition).iter().any(|w| w == "CHECK")
        {
            match chainify_sql::check::sqlite_checks(definition) {
                Ok(checks) => t.checks.extend(checks.into_iter().map(|(name, clause)| {
                    CatalogCheck {
                        name: name.unwrap_or_else(|| format!("CHECK ({clause})")),
                        clause,
                        dialect: Dialect::Sqlite,
                    }
                })),
                Err(e) => t.problems.push(format!(
                    "its CHECK constraints cannot be read from its definition ({e}); declare them as `CHECK (<comparisons>)`"
                )),
            }
        }
        if definition.as_deref().is_some_and(deferred_constraint) {
            t.problems.push(
                "declares a foreign key DEFERRABLE INITIALLY DEFERRED, which SQLite checks only when the block commits (failing the whole block) where the other engines refuse the one statement; remove the clause".into(),
            );
        }
        let triggers = catalog_rows(
            conn,
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?1 \
             AND name NOT LIKE 'chainify!_%' ESCAPE '!' ORDER BY name",
            table,
            |r| r.get::<_, String>(0),
        )
        .map_err(err("reading the triggers of a table"))?;
        for name in triggers {
            t.problems.push(format!(
                "{name} is a user trigger, which would change rows differently from the other organizations; shared tables carry only chainify's triggers"
            ));
        }
        t.referenced_by = catalog_rows(
            conn,
            "SELECT DISTINCT lower(m.name) FROM sqlite_master m, pragma_foreign_key_list(m.name) f \
             WHERE m.type = 'table' AND lower(f.\"table\") = lower(?1) AND lower(m.name) <> lower(?1) \
             ORDER BY 1",
            table,
            |r| r.get::<_, String>(0),
        )
        .map_err(err("reading the foreign keys to a table"))?;
        let fks = catalog_rows(
            conn,
            "SELECT id, \"table\", \"from\", \"to\", on_update, on_delete FROM pragma_foreign_key_list(?1) ORDER BY id, seq",
            table,
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Option<String>>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                ))
            },
        )
        .map_err(err("reading the foreign keys of a table"))?;
        let mut last = None;
        for (id, parent, from, to, on_update, on_delete) in fks {
            if last == Some(id)
                && let Some(fk) = t.foreign_keys.last_mut()
            {
                fk.columns.push(from);
                fk.parent_columns.extend(to);
                continue;
            }
            t.foreign_keys.push(CatalogForeignKey {
                columns: vec![from],
                parent,
                parent_columns: to.into_iter().collect(),
                on_update,
                on_delete,
            });
            last = Some(id);
        }
        // `REFERENCES parent` without columns means the parent's primary key.
        for fk in &mut t.foreign_keys {
            if fk.parent_columns.is_empty() {
                fk.parent_columns = catalog_rows(
                    conn,
                    "SELECT name FROM pragma_table_info(?1) WHERE pk > 0 ORDER BY pk",
                    &fk.parent,
                    |r| r.get::<_, String>(0),
                )
                .map_err(err("reading a referenced table"))?;
            }
        }
        Ok(Some(t))
    }
}

impl Backend for Sqlite {
    type Conn = SqliteConn;

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn url(&self) -> &str {
        &self.url
    }

    fn concurrent_writers(&self) -> bool {
        false
    }

    fn transactional_ddl(&self) -> bool {
        true
    }

    fn calls_inline(&self) -> bool {
        true
    }

    fn foreign_keys_deferred(&self) -> DeferForeignKeys {
        DeferForeignKeys {
            in_transaction: &["PRAGMA defer_foreign_keys = ON"],
            ..DeferForeignKeys::default()
        }
    }

    async fn acquire(&self) -> Result<SqliteConn, DbError> {
        let pool = &self.pool;
        let permit =
            tokio::time::timeout(pool.acquire_timeout, pool.permits.clone().acquire_owned())
                .await
                .map_err(|_| {
                    DbError::connection(format!(
                        "no connection free within {:?} (all {} in use)",
                        pool.acquire_timeout, pool.max
                    ))
                })?
                .map_err(|_| DbError::connection("the pool is closed"))?;
        let idle = pool.idle().pop();
        let conn = match idle {
            Some(conn) => conn,
            None => pool.open_connection()?,
        };
        Ok(SqliteConn {
            conn: Some(conn),
            pool: pool.clone(),
            _permit: permit,
            limited: false,
            pass: None,
        })
    }

    async fn migrate(&self) -> Result<(), StorageError> {
        let migration_err = |reason: String| StorageError::Migration {
            url: self.url.clone(),
            reason,
        };
        let mut conn = self.acquire().await.map_err(|e| migration_err(e.message))?;
        // Once, at start: waiting in place for another process's lock is harmless here.
        conn.waiting_in_place(|c| apply_migrations(c.conn()))
            .map_err(|e| migration_err(e.message))?
            .map_err(migration_err)
    }

    async fn introspect(&self, table: &str) -> Result<Option<CatalogTable>, StorageError> {
        let mut conn = self
            .acquire()
            .await
            .map_err(catalog_error(&self.url, "reading the catalog"))?;
        // Catalog reads are few and short: they may wait for a lock in place.
        conn.waiting_in_place(|c| self.read_catalog(c.conn(), table))
            .map_err(catalog_error(&self.url, "reading the catalog"))?
    }

    async fn close(&self) {
        self.pool.permits.close();
        let idle = std::mem::take(&mut *self.pool.idle());
        for conn in idle {
            self.pool.discard(conn);
        }
        self.pool.checkpointer.stop().await;
    }

    fn pool_use(&self) -> PoolUse {
        let idle = u32::try_from(self.pool.idle().len()).unwrap_or(u32::MAX);
        PoolUse {
            open: self.pool.open.load(Ordering::Relaxed),
            idle,
            max: self.pool.max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_clauses_other_than_abort_are_found() {
        let table =
            |clause: &str| format!("CREATE TABLE t (k INTEGER PRIMARY KEY {clause}, v INT)");
        assert_eq!(conflict_resolution(&table("")), None);
        assert_eq!(conflict_resolution(&table("ON CONFLICT ABORT")), None);
        for resolution in ["REPLACE", "ROLLBACK", "FAIL", "IGNORE"] {
            assert_eq!(
                conflict_resolution(&table(&format!(
                    "on\n conflict {}",
                    resolution.to_lowercase()
                ))),
                Some(resolution.to_owned())
            );
        }
        // After an ABORT clause, a later one still counts.
        assert_eq!(
            conflict_resolution(
                "CREATE TABLE t (k INT PRIMARY KEY ON CONFLICT ABORT, v INT NOT NULL ON CONFLICT IGNORE)"
            ),
            Some("IGNORE".to_owned())
        );
        // Comments hide nothing; quoted text can only refuse.
        assert_eq!(
            conflict_resolution("CREATE TABLE t (k INT PRIMARY KEY ON /* x */ CONFLICT REPLACE)"),
            Some("REPLACE".to_owned())
        );
        assert_eq!(
            conflict_resolution(
                "CREATE TABLE t (k INT PRIMARY KEY ON CONFLICT /* ABORT */ REPLACE)"
            ),
            Some("REPLACE".to_owned())
        );
        assert_eq!(
            conflict_resolution("CREATE TABLE t (k INT PRIMARY KEY ON -- ABORT\n CONFLICT IGNORE)"),
            Some("IGNORE".to_owned())
        );
        assert_eq!(
            conflict_resolution(
                "CREATE TABLE t (k INT PRIMARY KEY, \"a--b\" INT ON CONFLICT FAIL)"
            ),
            Some("FAIL".to_owned()),
            "a quoted -- opens no comment"
        );
        assert_eq!(
            non_binary_collation(
                "CREATE TABLE t (k INT PRIMARY KEY, n TEXT COLLATE /* BINARY */ NOCASE)"
            ),
            Some("NOCASE".to_owned())
        );
        // Only a deferred constraint is: DEFERRABLE alone, or INITIALLY IMMEDIATE, checks at once.
        assert!(deferred_constraint(
            "CREATE TABLE c (k INT PRIMARY KEY, p INT REFERENCES t (k) deferrable\n initially /* x */ deferred)"
        ));
        for immediate in [
            "DEFERRABLE",
            "DEFERRABLE INITIALLY IMMEDIATE",
            "NOT DEFERRABLE",
            "",
        ] {
            assert!(!deferred_constraint(&format!(
                "CREATE TABLE c (k INT PRIMARY KEY, p INT REFERENCES t (k) {immediate})"
            )));
        }
        // ON DELETE / ON UPDATE actions are not conflict clauses.
        assert_eq!(
            conflict_resolution(
                "CREATE TABLE c (k INT PRIMARY KEY, p INT REFERENCES t (k) ON DELETE RESTRICT)"
            ),
            None
        );
    }
}
