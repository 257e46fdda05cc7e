//! The conformance suite on a real mysql server, plus mysql-specific faults.

use chainify_testkit::engines::MySqlFixture;

chainify_testkit::storage_conformance_tests!(MySqlFixture);

use chainify_storage::{MySql, StoreOptions};
use chainify_testkit::conformance::storage::database_lost_mid_block;
use sqlx::{AssertSqlSafe, Executor};

#[tokio::test]
async fn unreachable_database_fails_naming_the_url() {
    let options = StoreOptions {
        connect_timeout: std::time::Duration::from_secs(2),
        ..StoreOptions::default()
    };
    let err = MySql::connect("mysql://chainify:hunter2@127.0.0.1:9/nowhere", &options)
        .await
        .expect_err("nothing listens on port 9");
    let message = err.to_string();
    assert!(
        message.starts_with("cannot connect to mysql://chainify:***@127.0.0.1:9/nowhere: "),
        "{message}"
    );
    assert!(!message.contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_goes_away_mid_block() {
    database_lost_mid_block(&MySqlFixture, "lost", || async {
        let admin = MySqlFixture::url("lost").replace("/ct_lost", "/mysql");
        let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect(&admin)
            .await
            .expect("admin connection");
        // The waiting transaction first (the lock holder sleeps between statements): killing
        // the holder first would let the waiting transaction commit.
        for filter in ["AND COMMAND <> 'Sleep'", ""] {
            let ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST \
                 WHERE DB = 'ct_lost' AND ID <> CONNECTION_ID() {filter}"
            )))
            .fetch_all(&mut conn)
            .await
            .expect("processlist");
            for id in ids {
                let _ = conn
                    .execute(AssertSqlSafe(format!("KILL CONNECTION {id}")))
                    .await;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await;
}

/// MySQL's DDL is not transactional: when an install fails half-way (here: the user may create
/// tables but not triggers), what was created is removed again and the table is not registered.
#[tokio::test]
async fn failed_install_leaves_nothing_behind() {
    MySqlFixture::create("notrigger").await;
    let admin_url = MySqlFixture::url("notrigger").replace("/ct_notrigger", "/mysql");
    let mut admin = <sqlx::MySqlConnection as sqlx::Connection>::connect(&admin_url)
        .await
        .expect("admin connection");
    for sql in [
        "DROP USER IF EXISTS 'chainify_notrigger'@'127.0.0.1'",
        "CREATE USER 'chainify_notrigger'@'127.0.0.1'",
        "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX, ALTER, REFERENCES ON ct_notrigger.* TO 'chainify_notrigger'@'127.0.0.1'",
        "CREATE TABLE ct_notrigger.kv (k BIGINT NOT NULL PRIMARY KEY, v BIGINT NOT NULL)",
    ] {
        admin.execute(sql).await.expect(sql);
    }
    let url = MySqlFixture::url("notrigger").replace("root@", "chainify_notrigger@");
    let options = StoreOptions::default();
    let store = chainify_storage::Store::open(
        MySql::connect(&url, &options).await.expect("connect"),
        options,
    )
    .await
    .expect("the system tables need no trigger privilege");
    let message = store
        .register(&["kv"])
        .await
        .expect_err("no TRIGGER privilege")
        .to_string();
    assert!(
        message.starts_with(
            "installing the digest objects of table kv on mysql://chainify_notrigger@"
        ) && message.contains("TRIGGER"),
        "{message}"
    );
    assert!(store.tables().is_empty());
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT CONVERT(TABLE_NAME USING utf8mb4) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = 'ct_notrigger' AND TABLE_NAME LIKE 'chainify\\_%\\_kv'",
    )
    .fetch_all(&mut admin)
    .await
    .expect("catalog");
    assert!(left.is_empty(), "left behind: {left:?}");
    let registered: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM ct_notrigger.chainify_shared_tables")
            .fetch_one(&mut admin)
            .await
            .expect("registry");
    assert_eq!(registered, 0);
}

/// sqlx 0.9.0 stalls a MySQL connection for a delayed ACK whenever it evicts a prepared
/// statement, so the pool keeps a cache large enough to hold many statements without evicting,
/// and clears a connection's cache once it outgrows `STATEMENT_CACHE_CLEAR`, as the connection
/// leaves the pool.
#[tokio::test]
async fn statement_caches_hold_many_texts_and_are_cleared_in_the_pool() {
    use sqlx::Connection as _;
    MySqlFixture::create("stmtcache").await;
    let options = StoreOptions {
        max_connections: 1,
        ..StoreOptions::default()
    };
    let backend = MySql::connect(&MySqlFixture::url("stmtcache"), &options)
        .await
        .expect("connect");
    let texts = chainify_storage::STATEMENT_CACHE_CLEAR + 10;
    {
        let mut conn = backend.pool().acquire().await.expect("acquire");
        for i in 0..texts {
            let sum: i64 =
                sqlx::query_scalar(AssertSqlSafe(format!("SELECT CAST(? + {i} AS SIGNED)")))
                    .bind(1_i64)
                    .fetch_one(&mut *conn)
                    .await
                    .expect("a prepared statement");
            assert_eq!(sum, 1 + i as i64);
        }
        assert_eq!(
            conn.cached_statements_size(),
            texts,
            "every text stays prepared: nothing was evicted"
        );
    }
    let mut conn = backend
        .pool()
        .acquire()
        .await
        .expect("the same connection again");
    assert_eq!(
        conn.cached_statements_size(),
        0,
        "cleared on leaving the pool"
    );
    let one: i64 = sqlx::query_scalar("SELECT CAST(? AS SIGNED)")
        .bind(1_i64)
        .fetch_one(&mut *conn)
        .await
        .expect("the connection works after clearing");
    assert_eq!(one, 1);
}

/// Under MariaDB's `innodb_snapshot_isolation` a locking read of a row changed after the
/// transaction's snapshot fails: the digest takes its locks before anything else reads, so
/// direct writes racing it are still hashed exactly once and no block fails for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_digest_holds_under_snapshot_isolation() {
    let admin_url = MySqlFixture::url("racing_si").replace("/ct_racing_si", "/mysql");
    let mut admin = <sqlx::MySqlConnection as sqlx::Connection>::connect(&admin_url)
        .await
        .expect("admin connection");
    let before: Option<(String, String)> =
        sqlx::query_as("SHOW GLOBAL VARIABLES LIKE 'innodb_snapshot_isolation'")
            .fetch_optional(&mut admin)
            .await
            .expect("read the setting");
    let Some((_, before)) = before else {
        // Servers before 10.6.18 / 10.11.8 do not have it.
        return;
    };
    admin
        .execute("SET GLOBAL innodb_snapshot_isolation = ON")
        .await
        .expect("set");
    let result = tokio::spawn(async {
        chainify_testkit::conformance::storage::racing_outside_writes(&MySqlFixture, "racing_si")
            .await
    })
    .await;
    admin
        .execute(AssertSqlSafe(format!(
            "SET GLOBAL innodb_snapshot_isolation = {before}"
        )))
        .await
        .expect("restore");
    result.expect("the race is hashed exactly once");
}

/// Found by a hunt: a digest trigger recreated with its own text but another definer (one
/// that does not exist fails every change of the table here alone) or under other modes is
/// altered, and reinstalled; a foreign key moved to a same-named table in another database is
/// named as a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_s_definer_and_a_parent_s_database_count() {
    use chainify_storage::TriggerFault;
    use chainify_testkit::conformance::storage::{outside, setup};
    use sqlx::{Connection as _, Row as _};
    let store = setup(&MySqlFixture, "definer", StoreOptions::default()).await;
    let mut admin = sqlx::MySqlConnection::connect(&MySqlFixture::url("definer"))
        .await
        .expect("admin connection");
    let create: String = sqlx::query("SHOW CREATE TRIGGER chainify_dg_kv_au")
        .fetch_one(&mut admin)
        .await
        .expect("the trigger")
        .try_get(2)
        .expect("its statement");
    let start = create.find("DEFINER=").expect("a definer");
    let end = start + create[start..].find(" TRIGGER").expect("TRIGGER");
    let other = format!(
        "{}DEFINER=`nobody_here`@`localhost`{}",
        &create[..start],
        &create[end..]
    );
    admin
        .execute("DROP TRIGGER chainify_dg_kv_au")
        .await
        .expect("drop");
    admin
        .execute(AssertSqlSafe(other.as_str()))
        .await
        .expect("recreate under another definer");
    let problems = store.check_triggers().await.expect("the check");
    assert!(
        problems
            .iter()
            .any(|p| p.trigger == "chainify_dg_kv_au" && p.fault == TriggerFault::Altered),
        "{problems:?}"
    );
    store.reinstall_triggers(&["kv"]).await.expect("reinstall");
    assert_eq!(store.check_triggers().await.expect("the check"), vec![]);

    let elsewhere = MySqlFixture::url("definer_other");
    MySqlFixture::create("definer_other").await;
    let other_db = elsewhere.rsplit('/').next().expect("a name").to_owned();
    outside(
        store.backend(),
        &format!(
            "CREATE TABLE {other_db}.accounts (custid BIGINT NOT NULL PRIMARY KEY);\n\
             INSERT INTO {other_db}.accounts SELECT custid FROM accounts;\n\
             SET foreign_key_checks = 0;\n\
             ALTER TABLE savings DROP FOREIGN KEY savings_ibfk_1;\n\
             ALTER TABLE savings ADD CONSTRAINT savings_ibfk_1 FOREIGN KEY (custid) REFERENCES {other_db}.accounts (custid);\n\
             SET foreign_key_checks = 1"
        ),
    )
    .await;
    let changed = store.check_definitions().await.expect("catalog");
    let savings = changed
        .iter()
        .find(|c| c.table == "savings")
        .unwrap_or_else(|| panic!("{changed:?}"));
    assert!(
        savings.changes.iter().any(|c| c.contains(&format!(
            "references accounts in database {other_db}, not this one"
        ))),
        "{savings:?}"
    );
}

/// Found by a hunt: a shared table partitioned, or made system-versioned, after registration
/// was named by nothing (the rows did not change; the first row no partition takes split the
/// vote with no cause given). Both are named as definition changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioning_or_versioning_after_registration_is_named() {
    use chainify_testkit::conformance::storage::{outside, setup};
    let store = setup(&MySqlFixture, "repartition", StoreOptions::default()).await;
    assert_eq!(store.check_definitions().await.expect("catalog"), vec![]);
    for (change, named, undo) in [
        (
            "ALTER TABLE kv PARTITION BY RANGE (k) (PARTITION p0 VALUES LESS THAN (1000))",
            "partitioned (PARTITION BY …)",
            "ALTER TABLE kv REMOVE PARTITIONING",
        ),
        (
            "ALTER TABLE kv ADD SYSTEM VERSIONING",
            "system-versioned (WITH SYSTEM VERSIONING)",
            "ALTER TABLE kv DROP SYSTEM VERSIONING",
        ),
    ] {
        outside(store.backend(), change).await;
        let changed = store.check_definitions().await.expect("catalog");
        assert_eq!(changed.len(), 1, "{change}: {changed:?}");
        assert_eq!(changed[0].table, "kv");
        assert!(
            changed[0].changes.iter().any(|c| c.starts_with(named)),
            "{change}: {changed:?}"
        );
        outside(store.backend(), undo).await;
        assert_eq!(
            store.check_definitions().await.expect("catalog"),
            vec![],
            "{undo}"
        );
    }
}

/// Noticed by a hunt: chainify's own tables moved off InnoDB (a digest log on MyISAM keeps
/// what a rolled-back transaction's trigger wrote, so this organization's digests differ and no
/// restore moves the table back) were named by nothing. Each is named as a changed definition,
/// which the full scan reports and a restart refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chainify_s_own_tables_off_innodb_are_named() {
    use chainify_testkit::conformance::storage::{outside, setup};
    let store = setup(&MySqlFixture, "own_engine", StoreOptions::default()).await;
    assert_eq!(store.check_definitions().await.expect("catalog"), vec![]);
    for table in ["chainify_dg_accounts", "chainify_state"] {
        outside(
            store.backend(),
            &format!("ALTER TABLE {table} ENGINE=MyISAM"),
        )
        .await;
        let changed = store.check_definitions().await.expect("catalog");
        assert_eq!(changed.len(), 1, "{table}: {changed:?}");
        assert_eq!(changed[0].table, table);
        assert!(
            changed[0]
                .to_string()
                .contains("stored by the MyISAM engine")
                && changed[0]
                    .to_string()
                    .contains(&format!("ALTER TABLE {table} ENGINE=InnoDB")),
            "{changed:?}"
        );
        outside(
            store.backend(),
            &format!("ALTER TABLE {table} ENGINE=InnoDB"),
        )
        .await;
        assert_eq!(store.check_definitions().await.expect("catalog"), vec![]);
    }
}
