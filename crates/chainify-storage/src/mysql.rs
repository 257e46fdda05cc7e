//! MySQL and MariaDB.

use std::str::FromStr;

use chainify_core::Value;
use chainify_sql::ColumnType;
use chainify_sql::render::Dialect;
use sqlx::mysql::{
    MySqlArguments, MySqlConnectOptions, MySqlDatabaseError, MySqlPool, MySqlPoolOptions, MySqlRow,
};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Connection as _, Executor, Row};

use crate::StoreOptions;
use crate::backend::{
    Backend, DeferForeignKeys, Suspicion, catalog_error, classify,
    plain_statement_text as statement_text, sqlx_backend_basics, sqlx_conn,
};
use crate::catalog::{
    CatalogCheck, CatalogColumn, CatalogForeignKey, CatalogTable, classify_declared_type,
};
use crate::ddl::ReadType;
use crate::error::{DbError, DbErrorKind, StorageError, redact_url};
use crate::value::{bool_from_i64, decimal_param, parse_decimal};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/mysql");

/// The SQL mode every connection runs with: strict (bad values are errors, not warnings),
/// standard string literals and `||`, `"name"` as an identifier (chainify's SQL is ANSI).
/// The session's `sort_buffer_size`: MariaDB's default, under which the analysis's bound on
/// a SELECT's sort keys (`chainify_sql::MAX_SORT_KEY_BYTES`, 1/32 of it) was measured.
const SORT_BUFFER_BYTES: u64 = 2 * 1024 * 1024;

/// The session's `max_sort_length`: MariaDB's default, the bytes of a text key it sorts on,
/// which the analysis's VARCHAR(n ≤ 256) for ORDER BY text stays within.
const MAX_SORT_LENGTH: u64 = 1024;

pub(crate) const SQL_MODE: &str = "STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ZERO_DATE,NO_ZERO_IN_DATE,\
NO_ENGINE_SUBSTITUTION,ANSI_QUOTES,NO_BACKSLASH_ESCAPES,PIPES_AS_CONCAT";

/// Text collations whose comparisons match PostgreSQL's and SQLite's: byte-wise, with trailing
/// spaces significant.
const PORTABLE_COLLATIONS: [&str; 2] = ["utf8mb4_nopad_bin", "utf8mb4_0900_bin"];

/// A MySQL or MariaDB database.
#[derive(Debug)]
pub struct MySql {
    pool: MySqlPool,
    url: String,
    suspicion: Suspicion,
}

/// Prepared statements a connection keeps. sqlx 0.9.0 no longer sets TCP_NODELAY
/// (transact-rs/sqlx#4335): when a connection's statement cache is full, sqlx closes the least
/// recently used statement with a packet the server never answers, and Nagle's algorithm then
/// holds the next command until the server's delayed ACK, 40 ms later (digests of 44, 88, 132 ms
/// at 128 clients, 200 TPS instead of 2 000). Chainify's own statement texts are few (multi-row
/// statements come in recurring sizes, `exec::row_chunks`), so this cache never evicts them.
/// A pool of 11 connections holds at most 5 632, so three organizations can share a server
/// within its default `max_prepared_stmt_count` (16 382 for all connections together); beyond
/// it the server refuses new statements (1461), which is retried, never an abort.
const STATEMENT_CACHE_CAPACITY: usize = 512;

/// A connection whose cache grew past this (clients' queries, workloads of many statement texts)
/// is cleared as it leaves the pool: one stall for hundreds of statements, not one for each.
pub const STATEMENT_CACHE_CLEAR: usize = 256;

impl MySql {
    /// Connects a pool to `url` (`mysql://…`), pinning every connection to UTC, strict
    /// `sql_mode`, utf8mb4 and READ COMMITTED.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<MySql, StorageError> {
        let redacted = redact_url(url);
        let connect_err = |reason: String| StorageError::Connect {
            url: redacted.clone(),
            reason,
        };
        let connect = MySqlConnectOptions::from_str(url)
            .map_err(|e| connect_err(e.to_string()))?
            .timezone(Some("+00:00".to_owned()))
            .charset("utf8mb4")
            .statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
        let lock_wait = options.lock_timeout.as_secs().max(1);
        let read_only = options.read_only;
        let suspicion = Suspicion::default();
        let suspect = suspicion.clone();
        let pool = MySqlPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.connect_timeout)
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                let doubtful = suspect.doubts(meta.idle_for);
                Box::pin(async move {
                    Suspicion::ping_if(doubtful, &mut *conn).await?;
                    if conn.cached_statements_size() > STATEMENT_CACHE_CLEAR {
                        conn.clear_cached_statements().await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    // Constraint checks on and no statement limits, whatever the server's
                    // global settings: a DBA's `SET GLOBAL foreign_key_checks = 0` (or
                    // `sql_safe_updates`, `sql_select_limit`) would otherwise reach every new
                    // session and make this organization decide otherwise than the others. The
                    // sort settings the analysis's bounds are measured under: a smaller sort
                    // buffer runs out of sort memory (error 1038) on statements it accepts,
                    // a shorter sort length orders VARCHAR(256) keys on a prefix.
                    conn.execute(AssertSqlSafe(format!(
                        "SET SESSION sql_mode = '{SQL_MODE}', time_zone = '+00:00', \
                         innodb_lock_wait_timeout = {lock_wait}, lock_wait_timeout = {lock_wait}, \
                         foreign_key_checks = 1, unique_checks = 1, sql_safe_updates = 0, \
                         sql_select_limit = 18446744073709551615, \
                         sort_buffer_size = {SORT_BUFFER_BYTES}, max_sort_length = {MAX_SORT_LENGTH}"
                    )))
                    .await?;
                    // MariaDB's switch for CHECK constraints (MySQL has none), its statement
                    // time limit (a global one would stop this organization's statements alone;
                    // queries set their own, `limited_read`) and the point in time a
                    // system-versioned table is read at (a global one would show reads history
                    // while statements change the current rows); else MySQL's limit.
                    if conn
                        .execute(
                            "SET SESSION check_constraint_checks = 1, max_statement_time = 0, \
                             system_versioning_asof = DEFAULT",
                        )
                        .await
                        .is_err()
                        && conn
                            .execute("SET SESSION max_execution_time = 0")
                            .await
                            .is_err()
                    {
                        let mariadb: Option<String> =
                            sqlx::query_scalar("SELECT CAST(VERSION() AS CHAR)")
                                .persistent(false)
                                .fetch_optional(&mut *conn)
                                .await?;
                        if mariadb.is_some_and(|v| v.to_ascii_lowercase().contains("mariadb")) {
                            return Err(sqlx::Error::Protocol(
                                "cannot set MariaDB's check_constraint_checks = 1, max_statement_time = 0 and system_versioning_asof = DEFAULT for the session".into(),
                            ));
                        }
                    }
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    if read_only {
                        conn.execute("SET SESSION TRANSACTION READ ONLY").await?;
                    }
                    // Literals and parameters compare in the connection's collation: make it
                    // byte-wise with trailing spaces significant, as the columns must be
                    // (MariaDB's name first, then MySQL 8's).
                    if conn
                        .execute("SET NAMES utf8mb4 COLLATE utf8mb4_nopad_bin")
                        .await
                        .is_err()
                    {
                        conn.execute("SET NAMES utf8mb4 COLLATE utf8mb4_0900_bin")
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect_with(connect)
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        // Not prepared: it would take a place in the connection's statement cache.
        let packet: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)")
            .persistent(false)
            .fetch_one(&pool)
            .await
            .map_err(|e| connect_err(format!("reading max_allowed_packet: {e}")))?;
        check_packet(packet).map_err(connect_err)?;
        Ok(MySql {
            pool,
            url: redacted,
            suspicion,
        })
    }

    /// The underlying pool (tests, tools).
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
}

/// The smallest `max_allowed_packet` chainify runs on: MariaDB's default, room for a statement
/// whose parameters carry `chainify_sql::MAX_BOUND_BYTES` (4 MiB) and its text.
const MIN_PACKET: i64 = 16 << 20;

/// Refuses a server whose packet is smaller than [`MIN_PACKET`]: it would fail alone a statement
/// the other organizations run, and leave the network.
fn check_packet(bytes: i64) -> Result<(), String> {
    if bytes >= MIN_PACKET {
        return Ok(());
    }
    Err(format!(
        "the server's max_allowed_packet is {bytes} bytes; chainify needs at least {MIN_PACKET} \
         (16 MiB, MariaDB's default), or statements the other organizations run would fail here \
         alone: SET GLOBAL max_allowed_packet = {MIN_PACKET}, and in the server's configuration"
    ))
}

fn error_kind(e: &dyn sqlx::error::DatabaseError) -> (DbErrorKind, Option<String>) {
    let Some(my) = e.try_downcast_ref::<MySqlDatabaseError>() else {
        return (DbErrorKind::Statement, e.code().map(|c| c.into_owned()));
    };
    (kind_of_number(my.number()), Some(my.number().to_string()))
}

/// What a MySQL/MariaDB error number means for a block.
fn kind_of_number(number: u16) -> DbErrorKind {
    match number {
        // Deadlock, lock wait timeout, NOWAIT lock, too many connections; the server's prepared
        // statements (all connections together) at `max_prepared_stmt_count`, a prepared
        // statement to prepare again: a full server is no verdict on the transaction.
        // A locking read of a row changed since the snapshot (MariaDB's
        // `innodb_snapshot_isolation`): the transaction would see it on a second try.
        1213 | 1205 | 3572 | 1040 | 1461 | 1615 | 1020 => DbErrorKind::Transient,
        // Server shutdown, connection killed, gone away, lost.
        1053 | 1927 | 2006 | 2013 | 4031 => DbErrorKind::Connection,
        // Disk full, table full, out of memory or resources, lock table full, transaction
        // cache full, cannot create a thread: this server's trouble, not the transaction's
        // (it would set this organization apart); the block fails and is run again.
        1021 | 1114 | 1037 | 1038 | 1041 | 1206 | 1197 | 1135 => DbErrorKind::Connection,
        // An error during COMMIT or in the binary log: MySQL checks no constraint at commit, so
        // it is the server's too.
        1180 | 1598 => DbErrorKind::Connection,
        _ => DbErrorKind::Statement,
    }
}

fn db_err(e: sqlx::Error) -> DbError {
    classify(e, error_kind)
}

fn bind<'q>(
    q: Query<'q, sqlx::MySql, MySqlArguments>,
    v: &Value,
) -> Query<'q, sqlx::MySql, MySqlArguments> {
    match v {
        Value::Null => q.bind(Option::<String>::None),
        Value::Int(i) => q.bind(*i),
        Value::Decimal(d) => q.bind(decimal_param(*d)),
        Value::Text(s) => q.bind(s.clone()),
        Value::Bool(b) => q.bind(*b),
        Value::Bytes(b) => q.bind(b.clone()),
    }
}

fn decode(row: &MySqlRow, types: &[ReadType]) -> Result<Vec<Value>, DbError> {
    let bad = |e: sqlx::Error| DbError {
        kind: DbErrorKind::Statement,
        code: None,
        message: format!("decoding a row: {e}"),
    };
    types
        .iter()
        .enumerate()
        .map(|(i, ty)| {
            Ok(match ty {
                ReadType::Int => row
                    .try_get::<Option<i64>, _>(i)
                    .map_err(bad)?
                    .map(Value::Int),
                ReadType::Bool => row
                    .try_get::<Option<i64>, _>(i)
                    .map_err(bad)?
                    .map(bool_from_i64),
                // Text when chainify cast it; a client query reads the engine's own type.
                ReadType::Decimal(scale) => match row.try_get::<Option<String>, _>(i) {
                    Ok(s) => s,
                    Err(_) => row
                        .try_get::<Option<bigdecimal::BigDecimal>, _>(i)
                        .map_err(bad)?
                        .map(|d| d.to_plain_string()),
                }
                .map(|s| parse_decimal(&s, *scale)),
                ReadType::Text => match row.try_get::<Option<String>, _>(i) {
                    Ok(s) => s.map(Value::Text),
                    Err(_) => row.try_get::<Option<Vec<u8>>, _>(i).map_err(bad)?.map(|b| {
                        match String::from_utf8(b) {
                            Ok(s) => Value::Text(s),
                            Err(e) => Value::Bytes(e.into_bytes()),
                        }
                    }),
                },
                ReadType::Bytes => row
                    .try_get::<Option<Vec<u8>>, _>(i)
                    .map_err(bad)?
                    .map(Value::Bytes),
            }
            .unwrap_or(Value::Null))
        })
        .collect()
}

sqlx_conn!(MySqlConn, sqlx::MySql, begin: ["BEGIN"], snapshot: ["SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", "START TRANSACTION WITH CONSISTENT SNAPSHOT"], read_snapshot: ["SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"], limited_read: limited_read);

/// A read snapshot whose statements the server stops after `limit`: MariaDB's
/// `max_statement_time` (seconds), else MySQL's `max_execution_time` (milliseconds, SELECTs
/// only, which is all a client query is). A session setting, undone when the transaction ends.
async fn limited_read(conn: &mut MySqlConn, limit: std::time::Duration) -> Result<(), DbError> {
    let mariadb = format!(
        "SET SESSION max_statement_time = {:.3}",
        limit.as_secs_f64().max(0.001)
    );
    if Executor::execute(&mut *conn.conn, AssertSqlSafe(mariadb))
        .await
        .is_ok()
    {
        conn.after_end = Some("SET SESSION max_statement_time = 0");
    } else {
        let mysql = format!(
            "SET SESSION max_execution_time = {}",
            limit.as_millis().clamp(1, u128::from(u32::MAX))
        );
        Executor::execute(&mut *conn.conn, AssertSqlSafe(mysql))
            .await
            .map_err(db_err)?;
        conn.after_end = Some("SET SESSION max_execution_time = 0");
    }
    conn.simple("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .await?;
    conn.simple("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        .await
}

const COLUMNS: &str = "SELECT CONVERT(COLUMN_NAME USING utf8mb4), CONVERT(DATA_TYPE USING utf8mb4), \
     CONVERT(COLUMN_TYPE USING utf8mb4), CONVERT(IS_NULLABLE USING utf8mb4), \
     CONVERT(CHARACTER_SET_NAME USING utf8mb4), CONVERT(COLLATION_NAME USING utf8mb4), \
     CONVERT(COLUMN_DEFAULT USING utf8mb4), CONVERT(EXTRA USING utf8mb4), \
     CONVERT(GENERATION_EXPRESSION USING utf8mb4) \
     FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? \
     ORDER BY ORDINAL_POSITION";

/// The widest index InnoDB builds (DYNAMIC rows), in declared bytes.
const INNODB_MAX_KEY_BYTES: u64 = 3_072;

/// The bytes InnoDB counts for `c` in an index: four a character of a VARCHAR (utf8mb4), the
/// declared length of a VARBINARY, 8 for an integer, at most 32 for another type.
fn declared_key_bytes(c: &crate::catalog::CatalogColumn) -> u64 {
    let n = chainify_sql::schema::declared_args(&c.native_type.to_ascii_lowercase())
        .first()
        .copied()
        .map_or(0, u64::from);
    match c.ty {
        chainify_sql::ColumnType::Text => 4 * n,
        chainify_sql::ColumnType::Bytes => n,
        chainify_sql::ColumnType::Int => 8,
        _ => 32,
    }
}

/// The table's storage engine (only InnoDB rolls a failed statement or transaction back), its
/// options (`partitioned`) and type (`SYSTEM VERSIONED`).
const ENGINE: &str = "SELECT CONVERT(ENGINE USING utf8mb4), CONVERT(CREATE_OPTIONS USING utf8mb4), \
     CONVERT(TABLE_TYPE USING utf8mb4) FROM information_schema.TABLES \
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?";

const INDEXES: &str = "SELECT CONVERT(INDEX_NAME USING utf8mb4), CONVERT(COLUMN_NAME USING utf8mb4), \
     CAST(SUB_PART AS SIGNED) FROM information_schema.STATISTICS \
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND NON_UNIQUE = 0 \
     ORDER BY INDEX_NAME, SEQ_IN_INDEX";

/// Tables of this database with a foreign key to this one. (Children in other databases are
/// not looked for: MariaDB would read every database's tables to find them, 200 ms a table on a
/// server with 90 databases.)
const REFERENCED_BY: &str = "SELECT DISTINCT CONVERT(TABLE_NAME USING utf8mb4) \
     FROM information_schema.REFERENTIAL_CONSTRAINTS \
     WHERE CONSTRAINT_SCHEMA = DATABASE() AND UNIQUE_CONSTRAINT_SCHEMA = DATABASE() \
       AND REFERENCED_TABLE_NAME = ? AND TABLE_NAME <> REFERENCED_TABLE_NAME \
     ORDER BY 1";

/// CHECK constraints: name and expression (MariaDB names a column's after the column, so they
/// are told apart by table).
const CHECKS_MARIADB: &str = "SELECT CONVERT(CONSTRAINT_NAME USING utf8mb4), CONVERT(CHECK_CLAUSE USING utf8mb4) \
     FROM information_schema.CHECK_CONSTRAINTS \
     WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY CONSTRAINT_NAME";

/// The same on MySQL, whose CHECK_CONSTRAINTS has no table (names are unique in a schema).
const CHECKS_MYSQL: &str = "SELECT CONVERT(cc.CONSTRAINT_NAME USING utf8mb4), CONVERT(cc.CHECK_CLAUSE USING utf8mb4) \
     FROM information_schema.TABLE_CONSTRAINTS tc JOIN information_schema.CHECK_CONSTRAINTS cc \
       ON cc.CONSTRAINT_SCHEMA = tc.CONSTRAINT_SCHEMA AND cc.CONSTRAINT_NAME = tc.CONSTRAINT_NAME \
     WHERE tc.CONSTRAINT_TYPE = 'CHECK' AND tc.TABLE_SCHEMA = DATABASE() AND tc.TABLE_NAME = ? \
     ORDER BY cc.CONSTRAINT_NAME";

/// A table's foreign-key columns. Read apart from their actions ([`FOREIGN_KEY_RULES`]): MariaDB
/// answers a join of the two views by reading every database's tables (150 ms on a server with
/// 90 databases, where each alone takes 10).
const FOREIGN_KEYS: &str = "SELECT CONVERT(CONSTRAINT_NAME USING utf8mb4), CONVERT(COLUMN_NAME USING utf8mb4), \
     CONVERT(REFERENCED_TABLE_NAME USING utf8mb4), CONVERT(REFERENCED_COLUMN_NAME USING utf8mb4), \
     CONVERT(REFERENCED_TABLE_SCHEMA USING utf8mb4), CAST(REFERENCED_TABLE_SCHEMA = DATABASE() AS SIGNED) \
     FROM information_schema.KEY_COLUMN_USAGE \
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND REFERENCED_TABLE_NAME IS NOT NULL \
     ORDER BY CONSTRAINT_NAME, ORDINAL_POSITION";

/// The ON DELETE and ON UPDATE actions of a table's foreign keys, by constraint name.
const FOREIGN_KEY_RULES: &str = "SELECT CONVERT(CONSTRAINT_NAME USING utf8mb4), \
     CONVERT(DELETE_RULE USING utf8mb4), CONVERT(UPDATE_RULE USING utf8mb4) \
     FROM information_schema.REFERENTIAL_CONSTRAINTS \
     WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = ?";

fn column(
    name: String,
    data_type: &str,
    column_type: &str,
    nullable: &str,
    charset: Option<String>,
    collation: Option<String>,
) -> CatalogColumn {
    let unsigned = column_type.contains("unsigned");
    let mut problem = None;
    let ty = match data_type {
        "tinyint" if column_type.starts_with("tinyint(1)") => ColumnType::Bool,
        "tinyint" | "smallint" | "mediumint" | "int" | "bigint" if unsigned => {
            problem = Some(format!(
                "{} UNSIGNED has a range no other engine stores; use a signed integer (BIGINT, or DECIMAL(20,0) for BIGINT UNSIGNED)",
                data_type.to_uppercase()
            ));
            ColumnType::Int
        }
        "tinyint" | "mediumint" => {
            problem = Some(format!(
                "{} has a width no other engine has; use SMALLINT, INTEGER or BIGINT",
                data_type.to_uppercase()
            ));
            ColumnType::Int
        }
        "smallint" | "int" | "bigint" => ColumnType::Int,
        "decimal" => classify_declared_type(column_type).0,
        "varchar" | "text" | "tinytext" | "mediumtext" | "longtext" | "char" => {
            if data_type == "char" {
                problem = Some("CHAR(n) pads and compares trailing spaces differently on each engine; use VARCHAR(n) or TEXT".to_owned());
            } else if matches!(data_type, "text" | "tinytext" | "mediumtext") {
                // What the other engines' TEXT holds must fit here too.
                problem = Some(format!(
                    "{} holds fewer bytes than TEXT on the other engines; use LONGTEXT (or VARCHAR(n) everywhere)",
                    data_type.to_uppercase()
                ));
            } else if charset.as_deref() != Some("utf8mb4")
                || !collation
                    .as_deref()
                    .is_some_and(|c| PORTABLE_COLLATIONS.contains(&c))
            {
                problem = Some(format!(
                    "text with character set {} and collation {} compares differently from other engines (case, accents or trailing spaces); use CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin (MariaDB) or utf8mb4_0900_bin (MySQL)",
                    charset.as_deref().unwrap_or("?"),
                    collation.as_deref().unwrap_or("?")
                ));
            }
            ColumnType::Text
        }
        "longblob" => ColumnType::Bytes,
        "varbinary" | "blob" | "tinyblob" | "mediumblob" => {
            // PostgreSQL's BYTEA and SQLite's BLOB have no such bound.
            problem = Some(format!(
                "{} holds fewer bytes than the other engines' bytes columns; use LONGBLOB",
                data_type.to_uppercase()
            ));
            ColumnType::Bytes
        }
        "binary" => {
            problem = Some("BINARY(n) pads with zero bytes; use LONGBLOB".to_owned());
            ColumnType::Bytes
        }
        "float" | "double" => ColumnType::Float,
        _ => ColumnType::Other(column_type.to_owned()),
    };
    let precision = classify_declared_type(column_type).1;
    let native_type = match (&ty, &charset, &collation) {
        (ColumnType::Text, Some(cs), Some(co)) => {
            format!("{column_type} CHARACTER SET {cs} COLLATE {co}")
        }
        _ => column_type.to_owned(),
    };
    CatalogColumn {
        name,
        native_type,
        ty,
        not_null: nullable == "NO",
        precision,
        engine_problem: problem,
        default: None,
    }
}

/// How MySQL or MariaDB fills a column an INSERT leaves out ([`CatalogColumn::default`]):
/// what generates it (`EXTRA`: auto-increment, a generated column, `ON UPDATE`, MySQL's
/// expression defaults), else `COLUMN_DEFAULT` (MariaDB prints literals as SQL, `NULL` for none).
fn column_default(
    default: Option<String>,
    extra: Option<&str>,
    generated: Option<String>,
) -> Option<String> {
    let extra = extra.unwrap_or("").to_ascii_lowercase();
    if extra.contains("auto_increment") {
        Some("AUTO_INCREMENT".into())
    } else if extra.contains("generated") && !extra.contains("default_generated") {
        Some(format!(
            "GENERATED ALWAYS AS ({})",
            generated.unwrap_or_default()
        ))
    } else if extra.contains("on update") {
        // `ON UPDATE CURRENT_TIMESTAMP`: every update writes the clock.
        Some(extra.to_ascii_uppercase())
    } else if extra.contains("default_generated") {
        Some(format!("({})", default.unwrap_or_default()))
    } else {
        default
    }
}

impl Backend for MySql {
    type Conn = MySqlConn;

    fn dialect(&self) -> Dialect {
        Dialect::MySql
    }

    fn concurrent_writers(&self) -> bool {
        true
    }

    fn transactional_ddl(&self) -> bool {
        false
    }

    async fn introspect(&self, table: &str) -> Result<Option<CatalogTable>, StorageError> {
        let err = |during: &str| catalog_error(&self.url, during, db_err);
        let rows = sqlx::query(COLUMNS)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err("reading the columns of a table"))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut t = CatalogTable {
            name: table.to_owned(),
            ..CatalogTable::default()
        };
        for r in rows {
            let e = err("decoding a column");
            let data_type: String = r.try_get(1).map_err(&e)?;
            let column_type: String = r.try_get(2).map_err(&e)?;
            let nullable: String = r.try_get(3).map_err(&e)?;
            let mut c = column(
                r.try_get(0).map_err(&e)?,
                &data_type.to_lowercase(),
                &column_type.to_lowercase(),
                &nullable,
                r.try_get(4).map_err(&e)?,
                r.try_get(5).map_err(&e)?,
            );
            let default: Option<String> = r.try_get(6).map_err(&e)?;
            let extra: Option<String> = r.try_get(7).map_err(&e)?;
            let generated: Option<String> = r.try_get(8).map_err(&e)?;
            if extra
                .as_deref()
                .is_some_and(|x| x.to_ascii_lowercase().contains("invisible"))
            {
                c.engine_problem = Some(
                    "an INVISIBLE column, which MariaDB's SELECT * leaves out and the other engines' does not".into(),
                );
            }
            c.default = column_default(default, extra.as_deref(), generated);
            t.columns.push(c);
        }
        let storage: Option<(Option<String>, Option<String>, Option<String>)> =
            sqlx::query_as(ENGINE)
                .bind(table)
                .fetch_optional(&self.pool)
                .await
                .map_err(err("reading the storage engine of a table"))?;
        let (engine, options, kind) = storage.unwrap_or_default();
        match engine {
            Some(e) if e.eq_ignore_ascii_case("InnoDB") => {}
            other => t.problems.push(format!(
                "stored by the {} engine, which does not roll back a failed statement or transaction as the other engines do; use ENGINE=InnoDB",
                other.as_deref().unwrap_or("unknown")
            )),
        }
        if options
            .as_deref()
            .is_some_and(|o| o.to_ascii_lowercase().contains("partitioned"))
        {
            t.problems.push(
                "partitioned (PARTITION BY …): MariaDB refuses a row no partition takes where the other engines store it, and a partition truncated or exchanged changes rows behind the digest triggers; remove the partitioning".into(),
            );
        }
        if kind
            .as_deref()
            .is_some_and(|k| k.eq_ignore_ascii_case("SYSTEM VERSIONED"))
        {
            t.problems.push(
                "system-versioned (WITH SYSTEM VERSIONING): a session reading it as of another time sees history where statements change the current rows, and its hidden period columns are filled from the clock; remove the versioning".into(),
            );
        }
        let indexes = sqlx::query(INDEXES)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err("reading the indexes of a table"))?;
        let mut current: Option<(String, Vec<String>)> = None;
        let mut groups = Vec::new();
        for r in indexes {
            let e = err("decoding an index");
            let index: String = r.try_get(0).map_err(&e)?;
            let col: Option<String> = r.try_get(1).map_err(&e)?;
            let sub_part: Option<i64> = r.try_get(2).map_err(&e)?;
            match (col, sub_part) {
                (Some(c), None) => match &mut current {
                    Some((name, cols)) if *name == index => cols.push(c),
                    _ => {
                        groups.extend(current.take());
                        current = Some((index, vec![c]));
                    }
                },
                _ => t.problems.push(format!(
                    "unique index {index} is on a prefix or an expression, which conflict analysis cannot bound"
                )),
            }
        }
        groups.extend(current);
        for (name, cols) in groups {
            if name == "PRIMARY" {
                t.primary_key = cols;
            } else {
                t.uniques.push(cols);
            }
        }
        // InnoDB refuses an index wider than 3 072 bytes as declared (utf8mb4: four a
        // character), and chainify's snapshot tables key the rows by the primary key and the
        // block: said here, not as the server's error while installing.
        let width: u64 = t.key_columns().map(declared_key_bytes).sum();
        if width + 8 > INNODB_MAX_KEY_BYTES {
            t.problems.push(format!(
                "its primary key is {width} bytes wide as declared, and chainify's snapshot tables key rows by it and an 8-byte block: more than InnoDB's {INNODB_MAX_KEY_BYTES}; declare the key narrower"
            ));
        }
        t.referenced_by = sqlx::query_scalar(REFERENCED_BY)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err("reading the foreign keys to a table"))?;
        let checks = match sqlx::query(CHECKS_MARIADB)
            .bind(table)
            .fetch_all(&self.pool)
            .await
        {
            Ok(rows) => rows,
            Err(_) => sqlx::query(CHECKS_MYSQL)
                .bind(table)
                .fetch_all(&self.pool)
                .await
                .map_err(err("reading the CHECK constraints of a table"))?,
        };
        for r in checks {
            let e = err("decoding a CHECK constraint");
            t.checks.push(CatalogCheck {
                name: r.try_get(0).map_err(&e)?,
                clause: r.try_get(1).map_err(&e)?,
                dialect: Dialect::MySql,
            });
        }
        let fks = sqlx::query(FOREIGN_KEYS)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err("reading the foreign keys of a table"))?;
        let mut rules = std::collections::BTreeMap::new();
        for r in sqlx::query(FOREIGN_KEY_RULES)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err("reading the actions of a table's foreign keys"))?
        {
            let e = err("decoding a foreign key's actions");
            let name: String = r.try_get(0).map_err(&e)?;
            let on_delete: String = r.try_get(1).map_err(&e)?;
            let on_update: String = r.try_get(2).map_err(&e)?;
            rules.insert(name, (on_delete, on_update));
        }
        let mut last: Option<String> = None;
        for r in fks {
            let e = err("decoding a foreign key");
            let name: String = r.try_get(0).map_err(&e)?;
            let col: String = r.try_get(1).map_err(&e)?;
            let parent: String = r.try_get(2).map_err(&e)?;
            let parent_col: String = r.try_get(3).map_err(&e)?;
            // A parent of the same name in another database is not the shared table.
            let schema: Option<String> = r.try_get(4).map_err(&e)?;
            let here: Option<i64> = r.try_get(5).map_err(&e)?;
            if here != Some(1) {
                t.problems.push(format!(
                    "its foreign key {name} references {parent} in database {}, not this one",
                    schema.as_deref().unwrap_or("?")
                ));
            }
            if last.as_deref() == Some(name.as_str())
                && let Some(fk) = t.foreign_keys.last_mut()
            {
                fk.columns.push(col);
                fk.parent_columns.push(parent_col);
                continue;
            }
            // A key without its actions (read a moment apart) is one the catalog cannot name.
            let (on_delete, on_update) = rules
                .get(&name)
                .cloned()
                .unwrap_or_else(|| ("unknown".into(), "unknown".into()));
            t.foreign_keys.push(CatalogForeignKey {
                columns: vec![col],
                parent,
                parent_columns: vec![parent_col],
                on_delete,
                on_update,
            });
            last = Some(name);
        }
        // Rows that MySQL changes through a foreign key fire no triggers, so the digest would
        // miss them.
        for fk in &t.foreign_keys {
            for (event, action) in [("DELETE", &fk.on_delete), ("UPDATE", &fk.on_update)] {
                if !matches!(action.to_uppercase().as_str(), "RESTRICT" | "NO ACTION") {
                    t.problems.push(format!(
                        "its foreign key to {} has ON {event} {action}: MySQL and MariaDB change those rows without firing triggers, so no digest would see them; use RESTRICT or NO ACTION",
                        fk.parent
                    ));
                }
            }
        }
        let triggers: Vec<String> = sqlx::query_scalar(
            "SELECT CONVERT(TRIGGER_NAME USING utf8mb4) FROM information_schema.TRIGGERS \
             WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = ? \
             AND TRIGGER_NAME NOT LIKE 'chainify!_%' ESCAPE '!' ORDER BY TRIGGER_NAME",
        )
        .bind(table)
        .fetch_all(&self.pool)
        .await
        .map_err(err("reading the triggers of a table"))?;
        for name in triggers {
            t.problems.push(format!(
                "{name} has a user trigger, which would change rows differently from the other organizations; shared tables carry only chainify's triggers"
            ));
        }
        Ok(Some(t))
    }

    fn foreign_keys_deferred(&self) -> DeferForeignKeys {
        // Checked row by row; switched off for the session around the repair.
        DeferForeignKeys {
            before_begin: &["SET FOREIGN_KEY_CHECKS = 0"],
            after_end: &["SET FOREIGN_KEY_CHECKS = 1"],
            ..DeferForeignKeys::default()
        }
    }

    sqlx_backend_basics!(MySqlConn);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_smaller_than_mariadbs_default_is_refused_by_name() {
        assert_eq!(check_packet(MIN_PACKET), Ok(()));
        assert_eq!(check_packet(64 << 20), Ok(()));
        let e = check_packet(4 << 20).unwrap_err();
        assert!(
            e.starts_with(
                "the server's max_allowed_packet is 4194304 bytes; chainify needs at least 16777216"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_servers_own_trouble_fails_the_block_instead_of_aborting_the_transaction() {
        for number in [
            1021, 1114, 1037, 1038, 1041, 1206, 1197, 1135, 2006, 2013, 1180, 1598,
        ] {
            assert_eq!(kind_of_number(number), DbErrorKind::Connection, "{number}");
        }
        for number in [1213, 1205, 3572, 1040, 1461, 1615] {
            assert_eq!(kind_of_number(number), DbErrorKind::Transient, "{number}");
        }
        for number in [1062, 1452, 1264, 1146] {
            assert_eq!(kind_of_number(number), DbErrorKind::Statement, "{number}");
        }
    }
}
