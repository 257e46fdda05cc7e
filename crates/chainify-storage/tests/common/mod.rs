//! Fixtures for the three engines: each test gets its own database on the servers that
//! `cargo xtask test` starts (PostgreSQL and MariaDB) or its own SQLite file.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

use chainify_storage::conformance::Fixture;
use chainify_storage::{MySql, Postgres, Sqlite, StoreOptions};
use sqlx::{AssertSqlSafe, Executor};

fn env_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run the tests with `cargo xtask test`, or start the servers with \
             `cargo xtask services start` and `eval \"$(cargo xtask services env)\"`"
        )
    })
}

/// `base` with its database path replaced by `db`.
fn with_database(base: &str, db: &str) -> String {
    chainify_storage::database_on(base, db).expect("a server URL")
}

fn db_name(test: &str) -> String {
    format!("ct_{test}")
}

/// PostgreSQL databases on the test server.
#[derive(Debug, Clone, Copy)]
pub struct PgFixture;

impl PgFixture {
    pub fn url(test: &str) -> String {
        with_database(&env_url("CHAINIFY_TEST_POSTGRES_URL"), &db_name(test))
    }

    pub async fn create(test: &str) {
        let admin = with_database(&env_url("CHAINIFY_TEST_POSTGRES_URL"), "postgres");
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
            .await
            .expect("admin connection to the test PostgreSQL");
        let db = db_name(test);
        conn.execute(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
        )))
        .await
        .expect("drop database");
        conn.execute(AssertSqlSafe(format!("CREATE DATABASE {db}")))
            .await
            .expect("create database");
    }
}

impl Fixture for PgFixture {
    type B = Postgres;

    async fn backend(&self, test: &str, options: &StoreOptions) -> Postgres {
        Self::create(test).await;
        self.reconnect(test, options).await
    }

    async fn reconnect(&self, test: &str, options: &StoreOptions) -> Postgres {
        Postgres::connect(&Self::url(test), options)
            .await
            .expect("connect")
    }

    fn bytes_type(&self) -> &'static str {
        "BYTEA"
    }
}

/// MariaDB databases on the test server, with the portable default collation.
#[derive(Debug, Clone, Copy)]
pub struct MySqlFixture;

impl MySqlFixture {
    pub fn url(test: &str) -> String {
        with_database(&env_url("CHAINIFY_TEST_MYSQL_URL"), &db_name(test))
    }

    pub async fn create(test: &str) {
        let admin = with_database(&env_url("CHAINIFY_TEST_MYSQL_URL"), "mysql");
        let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect(&admin)
            .await
            .expect("admin connection to the test MariaDB");
        let db = db_name(test);
        conn.execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {db}")))
            .await
            .expect("drop database");
        conn.execute(AssertSqlSafe(format!(
            "CREATE DATABASE {db} CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
        )))
        .await
        .expect("create database");
    }
}

impl Fixture for MySqlFixture {
    type B = MySql;

    async fn backend(&self, test: &str, options: &StoreOptions) -> MySql {
        Self::create(test).await;
        self.reconnect(test, options).await
    }

    async fn reconnect(&self, test: &str, options: &StoreOptions) -> MySql {
        MySql::connect(&Self::url(test), options)
            .await
            .expect("connect")
    }

    fn bytes_type(&self) -> &'static str {
        "LONGBLOB"
    }

    fn text_type(&self) -> &'static str {
        "LONGTEXT"
    }
}

/// SQLite files under the integration tests' temporary directory.
#[derive(Debug, Clone, Copy)]
pub struct SqliteFixture;

impl SqliteFixture {
    pub fn path(test: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("sqlite")
            .join(format!("{test}.db"))
    }

    pub fn url(test: &str) -> String {
        format!("sqlite://{}", Self::path(test).display())
    }
}

impl Fixture for SqliteFixture {
    type B = Sqlite;

    async fn backend(&self, test: &str, options: &StoreOptions) -> Sqlite {
        let path = Self::path(test);
        std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        self.reconnect(test, options).await
    }

    async fn reconnect(&self, test: &str, options: &StoreOptions) -> Sqlite {
        Sqlite::connect(&Self::url(test), options)
            .await
            .expect("connect")
    }

    fn bytes_type(&self) -> &'static str {
        "BLOB"
    }
}
