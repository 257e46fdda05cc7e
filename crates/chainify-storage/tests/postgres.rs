//! The conformance suite on a real postgres server, plus postgres-specific faults.

use chainify_testkit::engines::PgFixture;

chainify_testkit::storage_conformance_tests!(PgFixture);

use chainify_storage::{Postgres, StoreOptions};
use chainify_testkit::conformance::storage::database_lost_mid_block;
use sqlx::{AssertSqlSafe, Executor};

#[tokio::test]
async fn unreachable_database_fails_naming_the_url() {
    let options = StoreOptions {
        connect_timeout: std::time::Duration::from_secs(2),
        ..StoreOptions::default()
    };
    let err = Postgres::connect("postgres://chainify:hunter2@127.0.0.1:9/nowhere", &options)
        .await
        .expect_err("nothing listens on port 9");
    let message = err.to_string();
    assert!(
        message.starts_with("cannot connect to postgres://chainify:***@127.0.0.1:9/nowhere: "),
        "{message}"
    );
    assert!(!message.contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_goes_away_mid_block() {
    database_lost_mid_block(&PgFixture, "lost", || async {
        let admin = PgFixture::url("lost").replace("/ct_lost", "/postgres");
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
            .await
            .expect("admin connection");
        // The waiting transaction first: killing the lock holder first would let it commit.
        for sql in [
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'ct_lost' AND wait_event_type = 'Lock'",
            "SELECT pg_sleep(0.2)",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'ct_lost'",
        ] {
            conn.execute(AssertSqlSafe(sql)).await.expect(sql);
        }
    })
    .await;
}

/// An install that fails half-way (the user may create tables but not triggers on `kv`) rolls
/// back completely: PostgreSQL's DDL is transactional.
#[tokio::test]
async fn failed_install_leaves_nothing_behind() {
    PgFixture::create("notrigger").await;
    let admin_url = PgFixture::url("notrigger");
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&admin_url)
        .await
        .expect("admin connection");
    for sql in [
        "DROP ROLE IF EXISTS chainify_notrigger",
        "CREATE ROLE chainify_notrigger LOGIN",
        "GRANT CREATE, USAGE ON SCHEMA public TO chainify_notrigger",
        "CREATE TABLE kv (k BIGINT NOT NULL PRIMARY KEY, v BIGINT NOT NULL)",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON kv TO chainify_notrigger",
    ] {
        admin.execute(sql).await.expect(sql);
    }
    let url = admin_url.replace("postgres@", "chainify_notrigger@");
    let options = StoreOptions::default();
    let store = chainify_storage::Store::open(
        Postgres::connect(&url, &options).await.expect("connect"),
        options,
    )
    .await
    .expect("system tables");
    let message = store
        .register(&["kv"])
        .await
        .expect_err("not the owner of kv")
        .to_string();
    assert!(
        message.starts_with(
            "installing the digest objects of table kv on postgres://chainify_notrigger@"
        ),
        "{message}"
    );
    assert!(store.tables().is_empty());
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_class WHERE relname LIKE 'chainify\\_%\\_kv'",
    )
    .fetch_all(&mut admin)
    .await
    .expect("catalog");
    assert!(left.is_empty(), "left behind: {left:?}");
    store.close().await;
    admin
        .execute("DROP OWNED BY chainify_notrigger")
        .await
        .expect("cleanup");
}

/// Every connection plans generically (one kind of plan, whatever its history) and reads
/// `x = NULL` as NULL, whatever the database's defaults say: the analyser's model of what
/// PostgreSQL folds assumes both.
#[tokio::test]
async fn connections_pin_generic_plans_and_null_comparisons() {
    PgFixture::create("pins").await;
    let url = PgFixture::url("pins");
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .expect("admin connection");
    for sql in [
        "ALTER DATABASE ct_pins SET plan_cache_mode = force_custom_plan",
        "ALTER DATABASE ct_pins SET transform_null_equals = on",
    ] {
        admin.execute(AssertSqlSafe(sql)).await.expect(sql);
    }
    let store = Postgres::connect(&url, &StoreOptions::default())
        .await
        .expect("connect");
    for (setting, pinned) in [
        ("plan_cache_mode", "force_generic_plan"),
        ("transform_null_equals", "off"),
    ] {
        let value: String = sqlx::query_scalar(AssertSqlSafe(format!("SHOW {setting}")))
            .fetch_one(store.pool())
            .await
            .expect(setting);
        assert_eq!(value, pinned, "{setting}");
    }
}

/// The digest reads several statements' rows as text in one round trip; a database whose
/// default `bytea_output` is `escape` must not change how its bytes decode (the connection pins
/// `hex`), or every block would fail the same way, forever.
#[tokio::test]
async fn a_database_default_bytea_output_does_not_reach_the_digest() {
    use chainify_core::tx::{Statement, Transaction};
    use chainify_storage::{ExecMode, Store};
    use chainify_testkit::conformance::storage::Fixture;
    use chainify_testkit::conformance::storage::{block, setup};
    let options = StoreOptions::default();
    drop(setup(&PgFixture, "bytea_escape", options.clone()).await);
    let mut admin =
        <sqlx::PgConnection as sqlx::Connection>::connect(&PgFixture::url("bytea_escape"))
            .await
            .expect("admin connection");
    admin
        .execute("ALTER DATABASE ct_bytea_escape SET bytea_output = 'escape'")
        .await
        .expect("alter");
    let store = Store::open(PgFixture.reconnect("bytea_escape", &options).await, options)
        .await
        .expect("reopen");
    let txs = vec![Some(Transaction {
        statements: vec![Statement::new(
            "UPDATE kv SET v = v + 1 WHERE k = 1",
            vec![],
        )],
    })];
    let out = store
        .execute_block(&block(&store, 0, txs), ExecMode::Parallel(2))
        .await
        .expect("the digest decodes its bytes");
    assert_eq!(out.success, vec![true]);
    let check = store.check_state().await.expect("scan");
    assert!(check.agrees(), "{check:?}");
}

/// Pipelined statements (a transaction's statements in one round trip) prepare each shape once
/// a session, keep at most a bounded number prepared however many shapes clients send, send
/// large values, long texts and texts with a semicolon or comment one by one, and treat a
/// prepared statement the session lost or that no longer fits its table as bookkeeping to
/// retry, never as the transaction's failure (which only PostgreSQL organizations would see).
#[tokio::test]
async fn pipelined_statements_stay_bounded_and_survive_lost_ones() {
    use chainify_core::Value;
    use chainify_storage::{Backend, Conn, DbErrorKind, Pipelined};

    PgFixture::create("pipelined").await;
    let backend = Postgres::connect(&PgFixture::url("pipelined"), &StoreOptions::default())
        .await
        .expect("connect");
    let mut conn = backend.acquire().await.expect("a connection");
    conn.batch("CREATE TABLE kv (k BIGINT NOT NULL PRIMARY KEY, v BIGINT NOT NULL); INSERT INTO kv VALUES (1, 0)")
        .await
        .expect("table");
    let key = Value::Int(1);
    // Three hundred shapes, two statements each: every one runs, the session keeps at most 256.
    let texts: Vec<String> = (0..300)
        .map(|i| format!("UPDATE kv SET v = v + {i} WHERE k = $1"))
        .collect();
    let params = [&key];
    let mut most = 0;
    for pair in texts.chunks(2) {
        let list: Vec<Pipelined<'_>> = pair
            .iter()
            .map(|sql| Pipelined {
                sql,
                params: &params,
                returns_rows: false,
            })
            .collect();
        let done = conn.execute_pipelined(&list).await;
        assert!(done.error.is_none(), "{:?}", done.error);
        assert_eq!(done.rows, vec![1, 1]);
        most = most.max(prepared_now(&mut conn).await);
    }
    assert!(most <= 128, "{most} statements prepared at once");
    assert!(most >= 100, "shapes are kept between transactions: {most}");
    let sum: i64 = (0..300).sum();
    let v = conn
        .query(
            "SELECT v FROM kv WHERE k = 1",
            &[],
            &[chainify_storage::ddl::ReadType::Int],
        )
        .await
        .expect("v");
    assert_eq!(v, vec![vec![Value::Int(sum)]], "each ran exactly once");
    // The session loses its statements behind the registry's back: a retryable error, then
    // the statements are read again and prepared anew.
    let names = conn
        .query(
            "SELECT name FROM pg_prepared_statements WHERE starts_with(name, 'chainify_p')",
            &[],
            &[chainify_storage::ddl::ReadType::Text],
        )
        .await
        .expect("names");
    let gone: Vec<String> = names
        .iter()
        .map(|row| match &row[0] {
            Value::Text(name) => format!("DEALLOCATE {name}"),
            other => panic!("{other:?}"),
        })
        .collect();
    conn.batch(&gone.join("; ")).await.expect("deallocate");
    let list = [
        Pipelined {
            sql: &texts[298],
            params: &params,
            returns_rows: false,
        },
        Pipelined {
            sql: &texts[299],
            params: &params,
            returns_rows: false,
        },
    ];
    let lost = conn.execute_pipelined(&list).await;
    let error = lost.error.expect("the statement is gone");
    assert_eq!(error.kind, DbErrorKind::Transient, "{error}");
    let again = conn.execute_pipelined(&list).await;
    assert!(again.error.is_none(), "{:?}", again.error);
    assert_eq!(again.rows, vec![1, 1]);

    // Large values, a long text, a semicolon in a literal: one by one, nothing prepared.
    let before = prepared_now(&mut conn).await;
    let big = Value::Int(1);
    let long_in = format!(
        "UPDATE kv SET v = v + 0 WHERE k IN ({})",
        (1..300)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let wide = Value::Text("x".repeat(3000));
    for list in [
        vec![
            Pipelined {
                sql: "UPDATE kv SET v = v + 0 WHERE k = $1",
                params: &[&big],
                returns_rows: false,
            },
            Pipelined {
                sql: &long_in,
                params: &[],
                returns_rows: false,
            },
        ],
        vec![
            Pipelined {
                sql: "SELECT k FROM kv WHERE k = $1 AND 'a;b' <> ''",
                params: &[&big],
                returns_rows: true,
            },
            Pipelined {
                sql: "SELECT k FROM kv WHERE k = $1",
                params: &[&big],
                returns_rows: true,
            },
        ],
        vec![
            Pipelined {
                sql: "SELECT k FROM kv WHERE k = $1",
                params: &[&big],
                returns_rows: true,
            },
            Pipelined {
                sql: "SELECT k FROM kv WHERE k = $1 AND $2 <> ''",
                params: &[&big, &wide],
                returns_rows: true,
            },
        ],
    ] {
        let done = conn.execute_pipelined(&list).await;
        assert!(done.error.is_none(), "{:?}", done.error);
        assert_eq!(done.rows, vec![1, 1]);
        assert_eq!(prepared_now(&mut conn).await, before, "sent one by one");
    }

    // A prepared SELECT whose column changed type: retried once its statements are dropped.
    let read = [
        Pipelined {
            sql: "SELECT v FROM kv WHERE k = $1",
            params: &params,
            returns_rows: true,
        },
        Pipelined {
            sql: "SELECT v, k FROM kv WHERE k = $1",
            params: &params,
            returns_rows: true,
        },
    ];
    let done = conn.execute_pipelined(&read).await;
    assert!(done.error.is_none(), "{:?}", done.error);
    conn.batch("ALTER TABLE kv ALTER COLUMN v TYPE NUMERIC")
        .await
        .expect("alter");
    let changed = conn.execute_pipelined(&read).await;
    let error = changed.error.expect("the plan no longer fits");
    assert_eq!(error.kind, DbErrorKind::Transient, "{error}");
    let again = conn.execute_pipelined(&read).await;
    assert!(again.error.is_none(), "{:?}", again.error);
    assert_eq!(again.rows, vec![1, 1]);
}

/// How many statements the session prepared for pipelining.
async fn prepared_now(conn: &mut chainify_storage::PgConn) -> i64 {
    use chainify_storage::Conn;
    let sql = "SELECT count(*) FROM pg_prepared_statements WHERE starts_with(name, 'chainify_p')";
    match &conn
        .query(sql, &[], &[chainify_storage::ddl::ReadType::Int])
        .await
        .expect(sql)[0][0]
    {
        chainify_core::Value::Int(n) => *n,
        other => panic!("{other:?}"),
    }
}
