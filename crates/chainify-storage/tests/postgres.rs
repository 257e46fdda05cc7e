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

/// A COMMIT that refuses what a lane held (here a trigger refusing several markers at once,
/// standing in for an engine's surprise at commit) has each transaction decided again, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lane_commit_decides_each_transaction_once() {
    chainify_testkit::conformance::storage::a_refused_lane_commit_decides_each_transaction_once(
        &PgFixture,
        "CREATE FUNCTION trap_fn() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         IF (SELECT count(*) FROM fresh) > 1 THEN RAISE EXCEPTION 'several markers at once'; END IF; \
         RETURN NULL; END $$; \
         CREATE TRIGGER trap AFTER INSERT ON chainify_applied_txs REFERENCING NEW TABLE AS fresh \
         FOR EACH STATEMENT EXECUTE FUNCTION trap_fn()",
    )
    .await;
}

/// A publication of every table (for a change-data-capture tool or a logical replica) makes
/// PostgreSQL refuse deletes from a table without a replica identity: the digest and a restore
/// consume the change log with DELETE, so the log must have one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_of_every_table_stops_no_digest_or_restore() {
    use chainify_core::BlockNumber;
    use chainify_core::tx::{Statement, Transaction};
    use chainify_storage::ExecMode;
    use chainify_testkit::conformance::storage::{block, outside, setup};
    let store = setup(&PgFixture, "publication", StoreOptions::default()).await;
    outside(
        store.backend(),
        "CREATE PUBLICATION everything FOR ALL TABLES",
    )
    .await;
    let txs = || {
        vec![Some(Transaction {
            statements: vec![Statement::new(
                "UPDATE kv SET v = v + 1 WHERE k = 1",
                vec![],
            )],
        })]
    };
    for number in 0..2 {
        let out = store
            .execute_block(&block(&store, number, txs()), ExecMode::Parallel(2))
            .await
            .expect("the digest consumes the log");
        assert_eq!(out.success, vec![true]);
        if number == 0 {
            store.checkpoint(BlockNumber(0)).await.expect("checkpoint");
        }
    }
    store.restore(BlockNumber(0)).await.expect("restore");
    let check = store.check_state().await.expect("scan");
    assert!(check.agrees(), "{check:?}");
}

/// A replica role set for the database or a role fires no foreign-key trigger. chainify sets
/// its sessions back to `origin` where it may (as a superuser), so a dangling key is refused
/// as on the other engines, and refuses to work, naming why, where it may not.
#[tokio::test]
async fn a_replica_session_role_is_set_back_or_refused_by_name() {
    use chainify_storage::{Backend, Conn};
    use sqlx::Connection as _;
    PgFixture::create("replica_role").await;
    let url = PgFixture::url("replica_role");
    let mut admin = sqlx::PgConnection::connect(&url)
        .await
        .expect("admin connection");
    let database = url.rsplit('/').next().expect("a database name").to_owned();
    for sql in [
        "CREATE TABLE parent (k BIGINT NOT NULL PRIMARY KEY)".to_owned(),
        "CREATE TABLE child (k BIGINT NOT NULL PRIMARY KEY, p BIGINT REFERENCES parent (k))".into(),
        format!("ALTER DATABASE {database} SET session_replication_role = replica"),
        "DROP ROLE IF EXISTS chainify_replica".into(),
        "CREATE ROLE chainify_replica LOGIN".into(),
        format!("GRANT ALL ON DATABASE {database} TO chainify_replica"),
    ] {
        admin
            .execute(AssertSqlSafe(sql.as_str()))
            .await
            .expect(&sql);
    }
    let options = StoreOptions {
        connect_timeout: std::time::Duration::from_secs(2),
        ..StoreOptions::default()
    };
    let superuser = Postgres::connect(&url, &options).await;
    let ordinary = Postgres::connect(
        &url.replacen("postgres://postgres@", "postgres://chainify_replica@", 1),
        &options,
    )
    .await;
    let dangling = match &superuser {
        Ok(backend) => {
            let mut conn = backend.acquire().await.expect("a connection");
            Some(conn.batch("INSERT INTO child (k, p) VALUES (1, 99)").await)
        }
        Err(_) => None,
    };
    admin
        .execute(AssertSqlSafe(format!(
            "ALTER DATABASE {database} RESET session_replication_role"
        )))
        .await
        .expect("reset");
    superuser.expect("a superuser's session is set back");
    let e = dangling
        .expect("a connection")
        .expect_err("a dangling key is refused");
    assert_eq!(e.code.as_deref(), Some("23503"), "{e}");
    let e = ordinary
        .expect_err("an ordinary role cannot set it back")
        .to_string();
    assert!(
        e.contains("session_replication_role = replica, under which PostgreSQL enforces no foreign key, and cannot be set back"),
        "{e}"
    );
}

/// A superuser can switch one foreign key off by disabling its internal trigger, which the
/// digest triggers' check does not look at: the shared table then accepts rows the other
/// organizations refuse. The definition check names the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_foreign_key_trigger_is_named() {
    use chainify_testkit::conformance::storage::{outside, setup};
    let store = setup(&PgFixture, "ri_disabled", StoreOptions::default()).await;
    assert_eq!(store.check_definitions().await.expect("catalog"), vec![]);
    outside(
        store.backend(),
        "DO $$ DECLARE t text; BEGIN \
           SELECT tgname INTO t FROM pg_trigger WHERE tgrelid = 'savings'::regclass AND tgisinternal LIMIT 1; \
           EXECUTE format('ALTER TABLE savings DISABLE TRIGGER %I', t); \
         END $$",
    )
    .await;
    let changed = store.check_definitions().await.expect("catalog");
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(changed[0].table, "savings");
    assert!(
        changed[0].changes[0].contains("has a foreign-key trigger that does not fire")
            && changed[0].changes[0].contains("the foreign key is not enforced here"),
        "{changed:?}"
    );
    assert!(!store.check_state().await.expect("scan").agrees());
}

/// Settings a DBA gives the database (or chainify's role) do not reach chainify's sessions
/// where they would change its work: quoted names would change what the catalog prints (and
/// the store would not open, its tables seemingly changed), a statement timeout would stop this
/// organization's statements alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_settings_do_not_change_chainify_sessions() {
    use chainify_core::Value;
    use chainify_storage::ddl::ReadType;
    use chainify_storage::{Backend, Conn, Store};
    use chainify_testkit::conformance::storage::Fixture as _;
    use chainify_testkit::conformance::storage::setup;
    let store = setup(&PgFixture, "db_settings", StoreOptions::default()).await;
    drop(store);
    let url = PgFixture::url("db_settings");
    let database = url.rsplit('/').next().expect("a database name").to_owned();
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .expect("admin connection");
    admin
        .execute(AssertSqlSafe(format!(
            "ALTER DATABASE {database} SET quote_all_identifiers = on"
        )))
        .await
        .expect("quoted names");
    admin
        .execute(AssertSqlSafe(format!(
            "ALTER DATABASE {database} SET statement_timeout = 1"
        )))
        .await
        .expect("a timeout");
    let options = StoreOptions::default();
    let store = Store::open(PgFixture.reconnect("db_settings", &options).await, options)
        .await
        .expect("the store opens: its tables read as registered");
    let mut conn = store.backend().acquire().await.expect("a connection");
    let settings = conn
        .query(
            "SELECT current_setting('statement_timeout'), current_setting('quote_all_identifiers')",
            &[],
            &[ReadType::Text, ReadType::Text],
        )
        .await
        .expect("the settings");
    assert_eq!(
        settings,
        vec![vec![Value::Text("0".into()), Value::Text("off".into())]]
    );
}

/// Found by a hunt: objects a DBA makes in the database that chainify's SQL would resolve to
/// instead of PostgreSQL's own. A cast from numeric to text read every DECIMAL through the
/// DBA's function (the scan and the digest saw what it said); an `=` for two VARCHARs (an exact
/// match beats pg_catalog's `text = text`) made the verified full restore keep a changed row
/// and the digest trigger miss a key's move. The check before every block names each such
/// object, and a search path that does not start with pg_catalog; nothing else (an operator
/// on a type of the user's own, a function named unlike any built-in one) is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_that_shadow_the_built_in_ones_are_named_before_every_block() {
    use chainify_storage::TriggerFault;
    use chainify_testkit::conformance::storage::{outside, setup};
    let store = setup(&PgFixture, "shadowing", StoreOptions::default()).await;
    assert_eq!(store.check_triggers().await.expect("catalog"), vec![]);
    // Harmless: a type of the user's own with its operator and functions, and a function
    // named unlike any built-in one.
    outside(
        store.backend(),
        "CREATE DOMAIN public.sku AS varchar(20); \
         CREATE TYPE public.pair AS (a bigint, b bigint); \
         CREATE FUNCTION public.pair_eq(public.pair, public.pair) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true'; \
         CREATE OPERATOR public.= (LEFTARG = public.pair, RIGHTARG = public.pair, FUNCTION = public.pair_eq); \
         CREATE FUNCTION public.my_helper(varchar) RETURNS varchar LANGUAGE sql IMMUTABLE AS 'SELECT $1'",
    )
    .await;
    assert_eq!(store.check_triggers().await.expect("catalog"), vec![]);
    let cases = [
        (
            "CREATE FUNCTION public.shadow_num_text(numeric) RETURNS text LANGUAGE sql IMMUTABLE STRICT \
             AS 'SELECT numeric_out($1)::text'; \
             CREATE CAST (numeric AS text) WITH FUNCTION public.shadow_num_text(numeric)",
            "cast (numeric AS text)",
            "DROP CAST (numeric AS text); DROP FUNCTION public.shadow_num_text(numeric)",
        ),
        (
            "CREATE FUNCTION public.shadow_vc_eq(varchar, varchar) RETURNS boolean LANGUAGE sql \
             IMMUTABLE AS 'SELECT length($1) = length($2)'; \
             CREATE OPERATOR public.= (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.shadow_vc_eq)",
            "operator public.= (character varying, character varying)",
            "DROP OPERATOR public.= (varchar, varchar); DROP FUNCTION public.shadow_vc_eq(varchar, varchar)",
        ),
        (
            "CREATE FUNCTION public.lower(varchar) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT ''x'''",
            "function public.lower(character varying)",
            "DROP FUNCTION public.lower(varchar)",
        ),
        (
            "CREATE DOMAIN public.int8 AS numeric",
            "type public.int8",
            "DROP DOMAIN public.int8",
        ),
        // A superuser may make objects in pg_catalog itself (found by a review).
        (
            "CREATE FUNCTION pg_catalog.shadow_ci_eq(varchar, varchar) RETURNS boolean LANGUAGE sql \
             IMMUTABLE AS 'SELECT lower($1) = lower($2)'; \
             CREATE OPERATOR pg_catalog.= (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = pg_catalog.shadow_ci_eq)",
            "operator pg_catalog.= (character varying, character varying)",
            "DROP OPERATOR pg_catalog.= (varchar, varchar); DROP FUNCTION pg_catalog.shadow_ci_eq(varchar, varchar)",
        ),
        (
            "CREATE FUNCTION pg_catalog.char_length(varchar) RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 42'",
            "function pg_catalog.char_length(character varying)",
            "DROP FUNCTION pg_catalog.char_length(varchar)",
        ),
    ];
    for (make, named, remove) in cases {
        outside(store.backend(), make).await;
        let found = store.check_triggers().await.expect("catalog");
        assert_eq!(found.len(), 1, "{make}: {found:?}");
        assert_eq!(found[0].fault, TriggerFault::Shadows, "{found:?}");
        assert_eq!(found[0].trigger, named, "{found:?}");
        assert!(
            found[0]
                .to_string()
                .contains("no block runs until it is removed"),
            "{}",
            found[0]
        );
        outside(store.backend(), remove).await;
        assert_eq!(
            store.check_triggers().await.expect("catalog"),
            vec![],
            "{remove}"
        );
    }
    // Common extensions add operators and functions under other names or on other types, or
    // twins of pg_catalog's, which never win: nothing to name (found by a review: pg_trgm's
    // `%` on text held every block back).
    for extension in [
        "pg_trgm",
        "pgcrypto",
        "btree_gist",
        "intarray",
        "citext",
        "hstore",
    ] {
        outside(store.backend(), &format!("CREATE EXTENSION {extension}")).await;
    }
    assert_eq!(store.check_triggers().await.expect("catalog"), vec![]);
    // A search path a database gives its sessions, with the user's schema first.
    drop(store);
    let url = PgFixture::url("shadowing");
    let database = url.rsplit('/').next().expect("a database name").to_owned();
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .expect("admin connection");
    admin
        .execute(AssertSqlSafe(format!(
            "ALTER DATABASE {database} SET search_path = public, pg_catalog"
        )))
        .await
        .expect("alter database");
    let store = chainify_storage::Store::open(
        chainify_storage::AnyBackend::Postgres(
            Postgres::connect(&url, &StoreOptions::default())
                .await
                .expect("connect"),
        ),
        StoreOptions::default(),
    )
    .await
    .expect("open");
    let found = store.check_triggers().await.expect("catalog");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].trigger, "search_path public, pg_catalog",
        "{found:?}"
    );
    admin
        .execute(AssertSqlSafe(format!(
            "ALTER DATABASE {database} RESET search_path"
        )))
        .await
        .expect("reset");
}

/// Noticed by a hunt: a shared table given REPLICA IDENTITY NOTHING while a publication
/// publishes its updates makes PostgreSQL refuse every UPDATE and DELETE of it here alone (the
/// vote splits, and no restore changes it). Named as a changed definition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_replica_identity_under_a_publication_is_named() {
    use chainify_core::tx::{Statement, Transaction};
    use chainify_storage::ExecMode;
    use chainify_testkit::conformance::storage::{block, outside, setup};
    let store = setup(&PgFixture, "no_identity", StoreOptions::default()).await;
    outside(
        store.backend(),
        "ALTER TABLE kv REPLICA IDENTITY NOTHING; CREATE PUBLICATION kv_changes FOR TABLE kv",
    )
    .await;
    let changed = store.check_definitions().await.expect("catalog");
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(changed[0].table, "kv");
    assert!(
        changed[0]
            .to_string()
            .contains("no replica identity (REPLICA IDENTITY NOTHING, or USING an index that is gone) while publication kv_changes publishes"),
        "{changed:?}"
    );
    // What it would do: the update is refused here alone.
    let update = Transaction {
        statements: vec![Statement::new(
            "UPDATE kv SET v = v + 1 WHERE k = 1",
            vec![],
        )],
    };
    let out = store
        .execute_block(&block(&store, 0, vec![Some(update)]), ExecMode::Serial)
        .await
        .expect("the block runs");
    assert_eq!(out.success, vec![false]);
    outside(store.backend(), "ALTER TABLE kv REPLICA IDENTITY DEFAULT").await;
    assert_eq!(store.check_definitions().await.expect("catalog"), vec![]);
    // Found by a review: a publication of the schema's tables (PostgreSQL 15), and an identity
    // index dropped (PostgreSQL then has none).
    outside(
        store.backend(),
        "DROP PUBLICATION kv_changes; CREATE PUBLICATION schema_changes FOR TABLES IN SCHEMA public; \
         CREATE UNIQUE INDEX kv_ident ON kv (k); ALTER TABLE kv REPLICA IDENTITY USING INDEX kv_ident",
    )
    .await;
    // (The extra unique index is a change of its own; the identity it gives is not named.)
    let changed = store.check_definitions().await.expect("catalog");
    assert!(
        changed
            .iter()
            .all(|c| !c.to_string().contains("replica identity")),
        "{changed:?}"
    );
    outside(store.backend(), "DROP INDEX kv_ident").await;
    let changed = store.check_definitions().await.expect("catalog");
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(
        changed[0]
            .to_string()
            .contains("while publication schema_changes publishes"),
        "{changed:?}"
    );
}
