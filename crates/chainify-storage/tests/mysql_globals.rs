//! A DBA's `SET GLOBAL`s reach every new session on the server, chainify's included unless it
//! sets them back. These cases change the MariaDB test server's globals for a moment, so they
//! run in a test binary of their own (binaries run one after another), one after the other:
//! no other test's unpinned connection (a fixture creating its database) meets them.

use chainify_storage::{MySql, StoreOptions};
use chainify_testkit::engines::MySqlFixture;
use sqlx::{AssertSqlSafe, Executor};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_settings_do_not_reach_chainify_sessions() {
    global_switches_do_not_turn_constraint_checks_off().await;
    global_limits_do_not_reach_chainify_sessions().await;
    a_global_point_in_time_does_not_reach_chainify_sessions().await;
    global_sort_settings_do_not_reach_chainify_sessions().await;
}

/// A DBA's smaller `sort_buffer_size` made statements the analysis accepts run out of sort
/// memory here alone (error 1038, the block tried again for ever), and a shorter
/// `max_sort_length` ordered VARCHAR keys on a prefix. Sessions pin both.
async fn global_sort_settings_do_not_reach_chainify_sessions() {
    use chainify_core::Value;
    use chainify_storage::ddl::ReadType;
    use chainify_storage::{Backend, Conn};
    use chainify_testkit::conformance::storage::setup;
    use sqlx::Connection as _;
    drop(setup(&MySqlFixture, "global_sort", StoreOptions::default()).await);
    let mut admin = sqlx::MySqlConnection::connect(&MySqlFixture::url("global_sort"))
        .await
        .expect("admin connection");
    admin
        .execute("SET GLOBAL sort_buffer_size = 32768, max_sort_length = 64")
        .await
        .expect("sort settings set globally");
    let read = async {
        let backend = MySql::connect(&MySqlFixture::url("global_sort"), &StoreOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut conn = backend.acquire().await.map_err(|e| e.to_string())?;
        conn.query(
            "SELECT CAST(@@session.sort_buffer_size AS SIGNED), CAST(@@session.max_sort_length AS SIGNED)",
            &[],
            &[ReadType::Int, ReadType::Int],
        )
        .await
        .map_err(|e| e.to_string())
    }
    .await;
    admin
        .execute("SET GLOBAL sort_buffer_size = DEFAULT, max_sort_length = DEFAULT")
        .await
        .expect("sort settings back");
    assert_eq!(
        read.expect("a session"),
        vec![vec![Value::Int(2 * 1024 * 1024), Value::Int(1024)]]
    );
}

/// A DBA's `SET GLOBAL` reaches every new session: with foreign-key and CHECK checks off
/// globally, this organization would accept rows the others refuse. chainify's sessions switch
/// them on themselves.
async fn global_switches_do_not_turn_constraint_checks_off() {
    use chainify_core::tx::{Statement, Transaction};
    use chainify_storage::{ExecMode, Store};
    use chainify_testkit::conformance::storage::{block, outside, setup};
    use sqlx::Connection as _;
    let store = setup(&MySqlFixture, "globals", StoreOptions::default()).await;
    outside(
        store.backend(),
        "CREATE TABLE pos (k BIGINT NOT NULL PRIMARY KEY, v BIGINT CHECK (v >= 0), c BIGINT, FOREIGN KEY (c) REFERENCES kv (k))",
    )
    .await;
    store.register(&["pos"]).await.expect("register");
    drop(store);
    let mut admin = sqlx::MySqlConnection::connect(&MySqlFixture::url("globals"))
        .await
        .expect("admin connection");
    let switches = "foreign_key_checks = {}, unique_checks = {}, check_constraint_checks = {}";
    admin
        .execute(AssertSqlSafe(format!(
            "SET GLOBAL {}",
            switches.replace("{}", "0")
        )))
        .await
        .expect("switch the checks off globally");
    let options = StoreOptions::default();
    let opened = async {
        let backend = MySql::connect(&MySqlFixture::url("globals"), &options).await?;
        Store::open(backend, options.clone()).await
    }
    .await;
    let outcome = match &opened {
        Ok(store) => {
            let txs = [
                "INSERT INTO pos (k, v) VALUES (1, -1)",
                "INSERT INTO pos (k, v, c) VALUES (2, 1, 999)",
                "INSERT INTO pos (k, v, c) VALUES (3, 1, 1)",
            ]
            .iter()
            .map(|sql| {
                Some(Transaction {
                    statements: vec![Statement::new(*sql, vec![])],
                })
            })
            .collect();
            Some(
                store
                    .execute_block(&block(store, 0, txs), ExecMode::Serial)
                    .await,
            )
        }
        Err(_) => None,
    };
    admin
        .execute(AssertSqlSafe(format!(
            "SET GLOBAL {}",
            switches.replace("{}", "1")
        )))
        .await
        .expect("switch the checks back on");
    opened.expect("the store opens");
    let outcome = outcome.expect("a store").expect("the block");
    assert_eq!(
        outcome.success,
        vec![false, false, true],
        "a negative v and a dangling key are refused"
    );
}

/// More of a DBA's `SET GLOBAL`s that would make this organization decide alone: safe updates
/// (an UPDATE by a non-key column fails), a statement time limit, a row limit on SELECTs (which
/// chainify's own reads of the digest rows go through). Sessions set them back.
async fn global_limits_do_not_reach_chainify_sessions() {
    use chainify_core::tx::{Statement, Transaction};
    use chainify_storage::{ExecMode, Store};
    use chainify_testkit::conformance::storage::{block, dump, setup};
    use sqlx::Connection as _;
    let store = setup(&MySqlFixture, "global_limits", StoreOptions::default()).await;
    let before = dump(&store, "kv").await;
    drop(store);
    let mut admin = sqlx::MySqlConnection::connect(&MySqlFixture::url("global_limits"))
        .await
        .expect("admin connection");
    admin
        .execute(
            "SET GLOBAL sql_safe_updates = 1, sql_select_limit = 1, max_statement_time = 0.000001",
        )
        .await
        .expect("limits set globally");
    let options = StoreOptions::default();
    let outcome = async {
        let backend = MySql::connect(&MySqlFixture::url("global_limits"), &options).await?;
        let store = Store::open(backend, options.clone()).await?;
        let tx = Transaction {
            statements: vec![Statement::new(
                "UPDATE kv SET v = v + 1 WHERE v >= 0",
                vec![],
            )],
        };
        let o = store
            .execute_block(&block(&store, 0, vec![Some(tx)]), ExecMode::Serial)
            .await?;
        Ok::<_, chainify_storage::StorageError>((o, dump(&store, "kv").await))
    }
    .await;
    admin
        .execute(
            "SET GLOBAL sql_safe_updates = DEFAULT, sql_select_limit = DEFAULT, max_statement_time = DEFAULT",
        )
        .await
        .expect("limits back");
    let (o, after) = outcome.expect("the block runs");
    assert_eq!(o.success, vec![true], "an UPDATE by a non-key column");
    assert_eq!(after.len(), before.len(), "every row read back");
    assert!(after.iter().zip(&before).all(|(a, b)| a[1] != b[1]));
}

/// A DBA's `SET GLOBAL system_versioning_asof` would have a system-versioned table read as of
/// another time (found by a hunt: the scan, the digest's reads and client queries then see
/// history, while statements change the current rows). Such tables are refused; sessions set
/// the point in time back too, for the minute before a definition read names one.
async fn a_global_point_in_time_does_not_reach_chainify_sessions() {
    use chainify_core::Value;
    use chainify_storage::{Backend, Conn, Store, ddl::ReadType};
    use chainify_testkit::conformance::storage::setup;
    use sqlx::Connection as _;
    let store = setup(&MySqlFixture, "global_asof", StoreOptions::default()).await;
    drop(store);
    let mut admin = sqlx::MySqlConnection::connect(&MySqlFixture::url("global_asof"))
        .await
        .expect("admin connection");
    admin
        .execute("SET GLOBAL system_versioning_asof = '2001-01-01 00:00:00'")
        .await
        .expect("a point in time set globally");
    let options = StoreOptions::default();
    let seen = async {
        let backend = MySql::connect(&MySqlFixture::url("global_asof"), &options)
            .await
            .map_err(|e| e.to_string())?;
        let store = Store::open(backend, options.clone())
            .await
            .map_err(|e| e.to_string())?;
        let mut conn = store.backend().acquire().await.map_err(|e| e.to_string())?;
        conn.query(
            "SELECT CAST(@@session.system_versioning_asof AS CHAR)",
            &[],
            &[ReadType::Text],
        )
        .await
        .map_err(|e| e.to_string())
    }
    .await;
    admin
        .execute("SET GLOBAL system_versioning_asof = DEFAULT")
        .await
        .expect("the point in time back");
    assert_eq!(
        seen.expect("a session"),
        vec![vec![Value::Text("DEFAULT".into())]]
    );
}
