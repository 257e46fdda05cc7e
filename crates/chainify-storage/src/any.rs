//! One backend type for all engines, chosen by the URL's scheme at run time. Code that serves
//! organizations on different engines side by side (the in-process cluster, the node binary)
//! uses [`AnyBackend`] instead of being generic; the engine-specific types stay available for
//! code that knows its engine.

use chainify_core::Value;
use chainify_sql::render::Dialect;

use crate::backend::{Backend, Conn, DeferForeignKeys};
use crate::catalog::CatalogTable;
use crate::ddl::ReadType;
use crate::error::{DbError, StorageError, redact_url};
use crate::{MySql, MySqlConn, PgConn, Postgres, Sqlite, SqliteConn, StoreOptions};

/// PostgreSQL, MySQL/MariaDB or SQLite.
#[derive(Debug)]
pub enum AnyBackend {
    /// `postgres://…` or `postgresql://…`.
    Postgres(Postgres),
    /// `mysql://…` or `mariadb://…`.
    MySql(MySql),
    /// `sqlite://…` or `sqlite:…`.
    Sqlite(Sqlite),
}

/// A connection of an [`AnyBackend`].
#[derive(Debug)]
pub enum AnyConn {
    /// PostgreSQL.
    Postgres(PgConn),
    /// MySQL/MariaDB.
    MySql(MySqlConn),
    /// SQLite.
    Sqlite(SqliteConn),
}

impl AnyBackend {
    /// Connects to the engine the URL's scheme names.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<AnyBackend, StorageError> {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        match scheme {
            "postgres" | "postgresql" => {
                Ok(AnyBackend::Postgres(Postgres::connect(url, options).await?))
            }
            "mysql" | "mariadb" => {
                let url = url.replacen("mariadb:", "mysql:", 1);
                Ok(AnyBackend::MySql(MySql::connect(&url, options).await?))
            }
            "sqlite" => Ok(AnyBackend::Sqlite(Sqlite::connect(url, options).await?)),
            _ => Err(StorageError::Connect {
                url: redact_url(url),
                reason: format!(
                    "unknown database scheme {scheme:?}; use postgres://, mysql:// (or mariadb://) or sqlite://"
                ),
            }),
        }
    }
}

/// The URL of database `name` on the server `server_url` points at (its database path
/// replaced), e.g. a test database next to the one a test server's URL names.
pub fn database_on(server_url: &str, name: &str) -> Result<String, StorageError> {
    let bad = || StorageError::Connect {
        url: redact_url(server_url),
        reason: "expected scheme://host[:port][/database]".into(),
    };
    let (scheme, rest) = server_url.split_once("://").ok_or_else(bad)?;
    let host = rest
        .split(['/', '?'])
        .next()
        .filter(|h| !h.is_empty())
        .ok_or_else(bad)?;
    // The connection options (a Unix socket's directory, TLS) stay: only the database changes.
    let options = rest.find('?').map_or("", |at| &rest[at..]);
    Ok(format!("{scheme}://{host}/{name}{options}"))
}

/// Drops the database `url` names if it exists and creates it empty (a server database with
/// chainify's portable defaults; for SQLite, removes the file). For test and development
/// networks; the database name must be a plain identifier.
pub async fn recreate_database(url: &str) -> Result<(), StorageError> {
    administer(url, true).await
}

/// Drops the database `url` names if it exists (for SQLite, removes the file and its log):
/// what [`recreate_database`] made, once a test or benchmark is done with it.
pub async fn drop_database(url: &str) -> Result<(), StorageError> {
    administer(url, false).await
}

async fn administer(url: &str, create: bool) -> Result<(), StorageError> {
    use sqlx::{AssertSqlSafe, Connection, Executor};

    let failed = |reason: String| StorageError::Connect {
        url: redact_url(url),
        reason,
    };
    let scheme = url.split_once(':').map_or("", |(s, _)| s);
    if scheme == "sqlite" {
        let path = url
            .trim_start_matches("sqlite:")
            .trim_start_matches("//")
            .split('?')
            .next()
            .unwrap_or_default();
        for suffix in ["", "-wal", "-shm"] {
            match std::fs::remove_file(format!("{path}{suffix}")) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed(format!("removing {path}{suffix}: {e}"))),
            }
        }
        if create && let Some(dir) = std::path::Path::new(path).parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| failed(format!("creating {}: {e}", dir.display())))?;
        }
        return Ok(());
    }
    // The connection options stay, as in `database_on`.
    let (url, options) = url.split_at(url.find('?').unwrap_or(url.len()));
    let (base, name) = url
        .rsplit_once('/')
        .filter(|(base, _)| base.contains("://"))
        .ok_or_else(|| failed("the URL names no database".into()))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(failed(format!(
            "database name {name:?} must be letters, digits and underscores"
        )));
    }
    match scheme {
        "postgres" | "postgresql" => {
            let mut conn = sqlx::PgConnection::connect(&format!("{base}/postgres{options}"))
                .await
                .map_err(|e| failed(e.to_string()))?;
            let mut sql = vec![format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")];
            if create {
                sql.push(format!("CREATE DATABASE {name} ENCODING 'UTF8'"));
            }
            for sql in sql {
                conn.execute(AssertSqlSafe(sql))
                    .await
                    .map_err(|e| failed(e.to_string()))?;
            }
        }
        "mysql" | "mariadb" => {
            let base = base.replacen("mariadb:", "mysql:", 1);
            let mut conn = sqlx::MySqlConnection::connect(&format!("{base}/mysql{options}"))
                .await
                .map_err(|e| failed(e.to_string()))?;
            let mut sql = vec![format!("DROP DATABASE IF EXISTS {name}")];
            if create {
                sql.push(format!(
                    "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
                ));
            }
            for sql in sql {
                conn.execute(AssertSqlSafe(sql))
                    .await
                    .map_err(|e| failed(e.to_string()))?;
            }
        }
        _ => return Err(failed(format!("unknown database scheme {scheme:?}"))),
    }
    Ok(())
}

/// Calls the same method on whichever engine `$self` holds.
macro_rules! each {
    ($enum:ident, $self:expr, $b:ident => $e:expr) => {
        match $self {
            $enum::Postgres($b) => $e,
            $enum::MySql($b) => $e,
            $enum::Sqlite($b) => $e,
        }
    };
}

impl Backend for AnyBackend {
    type Conn = AnyConn;

    fn dialect(&self) -> Dialect {
        each!(AnyBackend, self, b => b.dialect())
    }

    fn url(&self) -> &str {
        each!(AnyBackend, self, b => b.url())
    }

    fn concurrent_writers(&self) -> bool {
        each!(AnyBackend, self, b => b.concurrent_writers())
    }

    fn calls_inline(&self) -> bool {
        each!(AnyBackend, self, b => b.calls_inline())
    }

    fn transactional_ddl(&self) -> bool {
        each!(AnyBackend, self, b => b.transactional_ddl())
    }

    fn foreign_keys_deferred(&self) -> DeferForeignKeys {
        each!(AnyBackend, self, b => b.foreign_keys_deferred())
    }

    async fn acquire(&self) -> Result<AnyConn, DbError> {
        Ok(match self {
            AnyBackend::Postgres(b) => AnyConn::Postgres(b.acquire().await?),
            AnyBackend::MySql(b) => AnyConn::MySql(b.acquire().await?),
            AnyBackend::Sqlite(b) => AnyConn::Sqlite(b.acquire().await?),
        })
    }

    fn connection_lost(&self) {
        each!(AnyBackend, self, b => b.connection_lost())
    }

    async fn migrate(&self) -> Result<(), StorageError> {
        each!(AnyBackend, self, b => b.migrate().await)
    }

    async fn introspect(&self, table: &str) -> Result<Option<CatalogTable>, StorageError> {
        each!(AnyBackend, self, b => b.introspect(table).await)
    }

    async fn close(&self) {
        each!(AnyBackend, self, b => b.close().await)
    }

    fn pool_use(&self) -> crate::backend::PoolUse {
        each!(AnyBackend, self, b => b.pool_use())
    }
}

impl Conn for AnyConn {
    async fn execute(
        &mut self,
        sql: &str,
        params: &[&Value],
        returns_rows: bool,
    ) -> Result<u64, DbError> {
        each!(AnyConn, self, c => c.execute(sql, params, returns_rows).await)
    }

    async fn query(
        &mut self,
        sql: &str,
        params: &[&Value],
        types: &[ReadType],
    ) -> Result<Vec<Vec<Value>>, DbError> {
        each!(AnyConn, self, c => c.query(sql, params, types).await)
    }

    async fn query_bounded(
        &mut self,
        sql: &str,
        params: &[&Value],
        types: &[ReadType],
        max_bytes: usize,
    ) -> Result<Option<Vec<Vec<Value>>>, DbError> {
        each!(AnyConn, self, c => c.query_bounded(sql, params, types, max_bytes).await)
    }

    async fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        each!(AnyConn, self, c => c.batch(sql).await)
    }

    async fn begin(&mut self) -> Result<(), DbError> {
        each!(AnyConn, self, c => c.begin().await)
    }

    async fn begin_with(
        &mut self,
        begin: &[&str],
        reads: &[(&str, &[ReadType])],
    ) -> Result<Vec<Vec<Vec<Value>>>, DbError> {
        each!(AnyConn, self, c => c.begin_with(begin, reads).await)
    }

    async fn query_many(
        &mut self,
        statements: &[(&str, &[ReadType])],
    ) -> Result<Vec<Vec<Vec<Value>>>, DbError> {
        each!(AnyConn, self, c => c.query_many(statements).await)
    }

    async fn commit_after(&mut self, sql: &str) -> Result<(), DbError> {
        each!(AnyConn, self, c => c.commit_after(sql).await)
    }

    async fn begin_snapshot(&mut self) -> Result<(), DbError> {
        each!(AnyConn, self, c => c.begin_snapshot().await)
    }

    async fn ready_to_read(&mut self) {
        each!(AnyConn, self, c => c.ready_to_read().await)
    }

    async fn begin_read_snapshot(&mut self) -> Result<(), DbError> {
        each!(AnyConn, self, c => c.begin_read_snapshot().await)
    }

    async fn begin_limited_read(&mut self, limit: std::time::Duration) -> Result<(), DbError> {
        each!(AnyConn, self, c => c.begin_limited_read(limit).await)
    }

    async fn commit(&mut self) -> Result<(), DbError> {
        each!(AnyConn, self, c => c.commit().await)
    }

    async fn rollback(&mut self) -> Result<(), DbError> {
        each!(AnyConn, self, c => c.rollback().await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unknown_scheme_is_named() {
        let err = AnyBackend::connect("oracle://scott:tiger@db/x", &StoreOptions::default())
            .await
            .expect_err("no such engine");
        let text = err.to_string();
        assert!(text.contains("\"oracle\""), "{text}");
        assert!(!text.contains("tiger"), "the password is masked: {text}");
    }

    #[test]
    fn database_on_replaces_the_database_only() {
        assert_eq!(
            database_on("postgres://u:p@127.0.0.1:5/a?sslmode=require", "b").expect("url"),
            "postgres://u:p@127.0.0.1:5/b?sslmode=require"
        );
        assert_eq!(
            database_on("postgres://u@localhost?host=/run/pg&port=5", "b").expect("url"),
            "postgres://u@localhost/b?host=/run/pg&port=5"
        );
        assert_eq!(
            database_on("mysql://root@h:3306", "x").expect("url"),
            "mysql://root@h:3306/x"
        );
        assert!(database_on("not a url", "x").is_err());
    }

    #[tokio::test]
    async fn recreating_and_dropping_refuse_odd_names_and_handle_sqlite_files() {
        let err = recreate_database("postgres://u:secret@127.0.0.1:1/x;drop")
            .await
            .expect_err("odd name");
        assert!(err.to_string().contains("\"x;drop\""), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("b.db");
        let url = format!("sqlite://{}", path.display());
        recreate_database(&url).await.expect("fresh");
        std::fs::write(&path, b"old").expect("write");
        recreate_database(&url).await.expect("again");
        assert!(!path.exists(), "the old file is gone");
        std::fs::write(&path, b"new").expect("write");
        std::fs::write(format!("{}-wal", path.display()), b"log").expect("write");
        drop_database(&url).await.expect("dropped");
        assert!(!path.exists(), "the file is gone");
        assert!(
            !std::path::Path::new(&format!("{}-wal", path.display())).exists(),
            "and its log"
        );
        drop_database(&url)
            .await
            .expect("dropping what is gone is no error");
        let err = drop_database("mysql://u:secret@127.0.0.1:1/a-b")
            .await
            .expect_err("odd name");
        assert!(err.to_string().contains("\"a-b\""), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[tokio::test]
    async fn the_scheme_picks_the_engine() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("a.db").display());
        let backend = AnyBackend::connect(&url, &StoreOptions::default())
            .await
            .expect("sqlite");
        assert!(matches!(backend, AnyBackend::Sqlite(_)));
        assert_eq!(backend.dialect(), Dialect::Sqlite);
        let mut conn = backend.acquire().await.expect("conn");
        let rows = conn
            .query("SELECT 40 + 2", &[], &[ReadType::Int])
            .await
            .expect("query");
        assert_eq!(rows, vec![vec![Value::Int(42)]]);
    }
}
