//! SQLite: one writer, so blocks run serially in one database transaction.

use std::str::FromStr;

use chainify_core::Value;
use chainify_sql::ColumnType;
use chainify_sql::render::Dialect;
use sqlx::query::Query;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous, SqliteValueRef,
};
use sqlx::{Decode, Row, TypeInfo, ValueRef};

use crate::StoreOptions;
use crate::backend::{
    Backend, DeferForeignKeys, catalog_error, classify, plain_statement_text as statement_text,
    sqlx_backend_basics, sqlx_conn,
};
use crate::catalog::{CatalogColumn, CatalogForeignKey, CatalogTable, classify_declared_type};
use crate::ddl::ReadType;
use crate::error::{DbError, DbErrorKind, StorageError, redact_url};
use crate::value::{bool_from_i64, decimal_from_f64, decimal_from_i64, parse_decimal};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

/// SQLite keeps DECIMAL values as 64-bit floating point, exact to 15 significant digits.
pub(crate) const MAX_DECIMAL_PRECISION: u32 = 15;

/// An SQLite database file.
#[derive(Debug)]
pub struct Sqlite {
    pool: SqlitePool,
    url: String,
}

impl Sqlite {
    /// Opens (creating if missing) the database at `url` (`sqlite://path` or `sqlite::memory:`)
    /// with WAL, foreign keys on, case-sensitive LIKE (as PostgreSQL and binary MySQL
    /// collations) and a busy timeout.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Sqlite, StorageError> {
        let redacted = redact_url(url);
        let connect_err = |reason: String| StorageError::Connect {
            url: redacted.clone(),
            reason,
        };
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|e| connect_err(e.to_string()))?
            .create_if_missing(!options.read_only)
            .read_only(options.read_only)
            .foreign_keys(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(options.lock_timeout)
            .pragma("case_sensitive_like", "ON");
        let pool = SqlitePoolOptions::new()
            // Every connection to an in-memory database is a separate database.
            .max_connections(if in_memory {
                1
            } else {
                options.max_connections
            })
            .acquire_timeout(options.connect_timeout)
            .connect_with(connect)
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        Ok(Sqlite {
            pool,
            url: redacted,
        })
    }

    /// The underlying pool (tests, tools).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

fn error_kind(e: &dyn sqlx::error::DatabaseError) -> (DbErrorKind, Option<String>) {
    let code = e.code().map(|c| c.into_owned());
    let primary = code
        .as_deref()
        .and_then(|c| c.parse::<i32>().ok())
        .map(|c| c & 0xff);
    let kind = match primary {
        // SQLITE_BUSY, SQLITE_LOCKED.
        Some(5 | 6) => DbErrorKind::Transient,
        // SQLITE_IOERR, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB.
        Some(10 | 11 | 13 | 14 | 26) => DbErrorKind::Connection,
        _ => DbErrorKind::Statement,
    };
    (kind, code)
}

fn db_err(e: sqlx::Error) -> DbError {
    classify(e, error_kind)
}

fn bind<'q>(
    q: Query<'q, sqlx::Sqlite, SqliteArguments>,
    v: &Value,
) -> Query<'q, sqlx::Sqlite, SqliteArguments> {
    match v {
        Value::Null => q.bind(Option::<i64>::None),
        Value::Int(i) => q.bind(*i),
        // SQLite's DECIMAL is a floating-point or integer number.
        Value::Decimal(d) => match d.to_i64_exact() {
            Some(i) => q.bind(i),
            None => q.bind(d.to_string().parse::<f64>().unwrap_or(f64::NAN)),
        },
        Value::Text(s) => q.bind(s.clone()),
        Value::Bool(b) => q.bind(i64::from(*b)),
        Value::Bytes(b) => q.bind(b.clone()),
    }
}

/// Reads whatever SQLite stored (its columns accept any storage class) as faithfully as
/// possible for the declared type.
fn decode_value(raw: SqliteValueRef<'_>, ty: ReadType) -> Result<Value, sqlx::error::BoxDynError> {
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let class = raw.type_info().name().to_owned();
    Ok(match class.as_str() {
        "INTEGER" => {
            let i = <i64 as Decode<sqlx::Sqlite>>::decode(raw)?;
            match ty {
                ReadType::Bool => bool_from_i64(i),
                ReadType::Decimal(s) => decimal_from_i64(i, s),
                _ => Value::Int(i),
            }
        }
        "REAL" => {
            let x = <f64 as Decode<sqlx::Sqlite>>::decode(raw)?;
            match ty {
                ReadType::Decimal(s) => decimal_from_f64(x, s),
                // A float where none belongs: keep its digits so the digest shows it.
                _ => Value::Text(x.to_string()),
            }
        }
        "TEXT" => {
            let s = <String as Decode<sqlx::Sqlite>>::decode(raw)?;
            match ty {
                ReadType::Decimal(scale) => parse_decimal(&s, scale),
                _ => Value::Text(s),
            }
        }
        _ => Value::Bytes(<Vec<u8> as Decode<sqlx::Sqlite>>::decode(raw)?),
    })
}

fn decode(row: &SqliteRow, types: &[ReadType]) -> Result<Vec<Value>, DbError> {
    let bad = |e: String| DbError {
        kind: DbErrorKind::Statement,
        code: None,
        message: format!("decoding a row: {e}"),
    };
    types
        .iter()
        .enumerate()
        .map(|(i, ty)| {
            let raw = row.try_get_raw(i).map_err(|e| bad(e.to_string()))?;
            decode_value(raw, *ty).map_err(|e| bad(e.to_string()))
        })
        .collect()
}

// The snapshot transaction takes the writer lock up front: nobody changes anything while it runs.
// A read snapshot is a deferred transaction: in WAL mode its first read fixes what it sees.
sqlx_conn!(SqliteConn, sqlx::Sqlite, begin: ["BEGIN IMMEDIATE"], snapshot: ["BEGIN IMMEDIATE"], read_snapshot: ["BEGIN"]);

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

impl Backend for Sqlite {
    type Conn = SqliteConn;

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn concurrent_writers(&self) -> bool {
        false
    }

    fn transactional_ddl(&self) -> bool {
        true
    }

    async fn introspect(&self, table: &str) -> Result<Option<CatalogTable>, StorageError> {
        let err = |during: &str| catalog_error(&self.url, during, db_err);
        let kind: Option<String> =
            sqlx::query_scalar("SELECT type FROM sqlite_master WHERE name = ?1 AND type = 'table'")
                .bind(table)
                .fetch_optional(&self.pool)
                .await
                .map_err(err("looking up a table"))?;
        if kind.is_none() {
            return Ok(None);
        }
        let rows = sqlx::query(
            "SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1) ORDER BY cid",
        )
        .bind(table)
        .fetch_all(&self.pool)
        .await
        .map_err(err("reading the columns of a table"))?;
        let mut t = CatalogTable {
            name: table.to_owned(),
            ..CatalogTable::default()
        };
        let mut pk: Vec<(i64, String)> = Vec::new();
        for r in &rows {
            let e = err("decoding a column");
            let name: String = r.try_get(0).map_err(&e)?;
            let declared: String = r.try_get(1).map_err(&e)?;
            let not_null: i64 = r.try_get(2).map_err(&e)?;
            let pk_pos: i64 = r.try_get(3).map_err(&e)?;
            if pk_pos > 0 {
                pk.push((pk_pos, name.clone()));
            }
            t.columns.push(column(name, &declared, not_null != 0));
        }
        pk.sort();
        t.primary_key = pk.into_iter().map(|(_, n)| n).collect();
        // `INTEGER PRIMARY KEY` is the rowid itself, which is never NULL.
        if let [key] = t.primary_key.as_slice()
            && let Some(c) = t.columns.iter_mut().find(|c| &c.name == key)
            && c.native_type.eq_ignore_ascii_case("integer")
        {
            c.not_null = true;
        }
        let indexes = sqlx::query(
            "SELECT name, origin, \"partial\" FROM pragma_index_list(?1) WHERE \"unique\" = 1 ORDER BY name",
        )
        .bind(table)
        .fetch_all(&self.pool)
        .await
        .map_err(err("reading the indexes of a table"))?;
        for r in indexes {
            let e = err("decoding an index");
            let name: String = r.try_get(0).map_err(&e)?;
            let origin: String = r.try_get(1).map_err(&e)?;
            if origin == "pk" {
                continue;
            }
            let cols: Vec<Option<String>> =
                sqlx::query_scalar("SELECT name FROM pragma_index_info(?1) ORDER BY seqno")
                    .bind(&name)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(err("reading an index"))?;
            match cols.into_iter().collect::<Option<Vec<String>>>() {
                Some(cols) => t.uniques.push(cols),
                None => t.problems.push(format!(
                    "unique index {name} is on an expression, which conflict analysis cannot bound"
                )),
            }
        }
        // A column COLLATE NOCASE or RTRIM compares text unlike the other engines; user
        // triggers would change rows differently from the other organizations.
        let definition: Option<String> =
            sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = ?1 AND type = 'table'")
                .bind(table)
                .fetch_optional(&self.pool)
                .await
                .map_err(err("reading a table's definition"))?
                .flatten();
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
        let triggers: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?1 \
             AND name NOT LIKE 'chainify!_%' ESCAPE '!' ORDER BY name",
        )
        .bind(table)
        .fetch_all(&self.pool)
        .await
        .map_err(err("reading the triggers of a table"))?;
        for name in triggers {
            t.problems.push(format!(
                "{name} is a user trigger, which would change rows differently from the other organizations; shared tables carry only chainify's triggers"
            ));
        }
        let fks = sqlx::query(
            "SELECT id, \"table\", \"from\", \"to\", on_update, on_delete FROM pragma_foreign_key_list(?1) ORDER BY id, seq",
        )
        .bind(table)
        .fetch_all(&self.pool)
        .await
        .map_err(err("reading the foreign keys of a table"))?;
        let mut last = None;
        for r in fks {
            let e = err("decoding a foreign key");
            let id: i64 = r.try_get(0).map_err(&e)?;
            let parent: String = r.try_get(1).map_err(&e)?;
            let from: String = r.try_get(2).map_err(&e)?;
            let to: Option<String> = r.try_get(3).map_err(&e)?;
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
                on_update: r.try_get(4).map_err(&e)?,
                on_delete: r.try_get(5).map_err(&e)?,
            });
            last = Some(id);
        }
        // `REFERENCES parent` without columns means the parent's primary key.
        for fk in &mut t.foreign_keys {
            if fk.parent_columns.is_empty() {
                let keys: Vec<String> = sqlx::query_scalar(
                    "SELECT name FROM pragma_table_info(?1) WHERE pk > 0 ORDER BY pk",
                )
                .bind(&fk.parent)
                .fetch_all(&self.pool)
                .await
                .map_err(err("reading a referenced table"))?;
                fk.parent_columns = keys;
            }
        }
        Ok(Some(t))
    }

    fn foreign_keys_deferred(&self) -> DeferForeignKeys {
        DeferForeignKeys {
            in_transaction: &["PRAGMA defer_foreign_keys = ON"],
            ..DeferForeignKeys::default()
        }
    }

    sqlx_backend_basics!(SqliteConn);
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
        // ON DELETE / ON UPDATE actions are not conflict clauses.
        assert_eq!(
            conflict_resolution(
                "CREATE TABLE c (k INT PRIMARY KEY, p INT REFERENCES t (k) ON DELETE RESTRICT)"
            ),
            None
        );
    }
}
