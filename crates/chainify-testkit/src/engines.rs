//! Databases on the servers `cargo xtask test` starts (PostgreSQL and MariaDB, their URLs in
//! `CHAINIFY_TEST_POSTGRES_URL` and `CHAINIFY_TEST_MYSQL_URL`) and SQLite files under the build
//! directory: one fresh database per test, by name. The storage conformance suite's
//! [`Fixture`]s live here too.
//!
//! Everything here panics with a message on failure: it serves tests.

use std::path::PathBuf;

use chainify_storage::{
    AnyBackend, Backend, Conn, MySql, Postgres, Sqlite, StoreOptions, database_on,
    recreate_database,
};
use chainify_workload::{SMALLBANK_SCHEMA, smallbank_load_sql};
use sqlx::{AssertSqlSafe, Executor};

use crate::conformance::storage::Fixture;

/// Smallbank's tables, in the order the network registers them.
pub const TABLES: [&str; 3] = ["accounts", "savings", "checking"];

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
    database_on(base, db).expect("a server URL")
}

/// A directory for SQLite files and other scratch, inside the build directory (beside the
/// test binaries, so `cargo clean` removes it).
pub fn scratch_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the running binary's path");
    let dir = exe.parent().expect("the binary's directory");
    // Test binaries sit in `target/<profile>/deps`.
    let profile = if dir.ends_with("deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    profile.join("chainify-scratch")
}

/// The URL of database `name` on engine `engine` (`postgres`, `mariadb`, `sqlite`).
pub fn url(engine: &str, name: &str) -> String {
    match engine {
        "postgres" => with_database(&env_url("CHAINIFY_TEST_POSTGRES_URL"), name),
        "mariadb" => with_database(&env_url("CHAINIFY_TEST_MYSQL_URL"), name),
        "sqlite" => format!("sqlite://{}/cluster/{name}.db", scratch_dir().display()),
        other => panic!("unknown engine {other}"),
    }
}

/// A fresh database with `accounts` Smallbank accounts.
pub async fn smallbank_db(engine: &str, name: &str, accounts: u64) -> String {
    let url = url(engine, name);
    recreate_database(&url).await.expect("fresh database");
    load_smallbank(&url, accounts).await;
    url
}

/// One database per engine in `engines`, named `<test>_<n>`.
pub async fn smallbank_dbs(test: &str, engines: &[&str], accounts: u64) -> Vec<String> {
    let mut urls = Vec::new();
    for (i, engine) in engines.iter().enumerate() {
        urls.push(smallbank_db(engine, &format!("{test}_{}", i + 1), accounts).await);
    }
    urls
}

/// Creates Smallbank's tables in the database at `url` and loads `accounts` accounts.
pub async fn load_smallbank(url: &str, accounts: u64) {
    let backend = AnyBackend::connect(url, &StoreOptions::default())
        .await
        .expect("connect");
    let mut conn = backend.acquire().await.expect("conn");
    for ddl in SMALLBANK_SCHEMA.split(';').filter(|s| !s.trim().is_empty()) {
        conn.batch(ddl).await.expect("schema");
    }
    for insert in smallbank_load_sql(accounts, 500) {
        conn.batch(&insert).await.expect("load");
    }
    drop(conn);
    backend.close().await;
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

/// SQLite files under [`scratch_dir`].
#[derive(Debug, Clone, Copy)]
pub struct SqliteFixture;

impl SqliteFixture {
    pub fn path(test: &str) -> PathBuf {
        scratch_dir().join("sqlite").join(format!("{test}.db"))
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
