//! The conformance suite on a real sqlite server, plus sqlite-specific faults.

use chainify_testkit::engines::SqliteFixture;

chainify_testkit::storage_conformance_tests!(SqliteFixture);

use chainify_storage::{Sqlite, StoreOptions};

#[tokio::test]
async fn unreachable_database_fails_naming_the_url() {
    let err = Sqlite::connect(
        "sqlite:///nonexistent-chainify-dir/state.db",
        &StoreOptions::default(),
    )
    .await
    .expect_err("the directory does not exist");
    let message = err.to_string();
    assert!(
        message.starts_with("cannot connect to sqlite:///nonexistent-chainify-dir/state.db: "),
        "{message}"
    );
}

use chainify_core::Value;
use chainify_storage::{Backend, Conn};
use std::time::Duration;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = chainify_testkit::engines::SqliteFixture::path(name)
        .parent()
        .expect("a directory")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

#[tokio::test]
async fn urls_decode_escapes_and_refuse_what_they_cannot_honour() {
    let dir = scratch("sqlite_urls");
    let url = format!("sqlite://{}/a%20b.db", dir.display());
    let db = Sqlite::connect(&url, &StoreOptions::default())
        .await
        .expect("an escaped path opens");
    assert!(dir.join("a b.db").exists(), "the path is decoded");
    db.close().await;
    for (url, problem) in [
        (
            format!("sqlite://{}/x.db?cache=shared", dir.display()),
            "unknown option cache=shared",
        ),
        (format!("sqlite://{}/x%zz.db", dir.display()), "bad escape"),
        ("postgres://x".to_owned(), "sqlite://"),
    ] {
        let err = Sqlite::connect(&url, &StoreOptions::default())
            .await
            .expect_err("refused");
        assert!(err.to_string().contains(problem), "{url}: {err}");
    }
    // mode=rw opens only what exists.
    let err = Sqlite::connect(
        &format!("sqlite://{}/missing.db?mode=rw", dir.display()),
        &StoreOptions::default(),
    )
    .await
    .expect_err("no such file");
    assert!(err.to_string().starts_with("cannot connect to "), "{err}");
}

/// A connection dropped inside a transaction, even one a SAVEPOINT opened without BEGIN, never
/// reaches the next user with that transaction open.
#[tokio::test]
async fn a_connection_dropped_mid_transaction_is_handed_on_clean() {
    let dir = scratch("sqlite_drop");
    let options = StoreOptions {
        max_connections: 1,
        ..StoreOptions::default()
    };
    let db = Sqlite::connect(&format!("sqlite://{}/d.db", dir.display()), &options)
        .await
        .expect("open");
    let mut conn = db.acquire().await.expect("conn");
    conn.batch("CREATE TABLE t (k INTEGER PRIMARY KEY)")
        .await
        .expect("ddl");
    for open in ["SAVEPOINT s", "BEGIN IMMEDIATE"] {
        conn.batch(open).await.expect("open a transaction");
        conn.execute("INSERT INTO t (k) VALUES (?1)", &[&Value::Int(1)], false)
            .await
            .expect("insert");
        drop(conn);
        conn = db.acquire().await.expect("the only connection again");
        let rows = conn
            .query(
                "SELECT COUNT(*) FROM t",
                &[],
                &[chainify_storage::ddl::ReadType::Int],
            )
            .await
            .expect("count");
        assert_eq!(rows, vec![vec![Value::Int(0)]], "{open}: rolled back");
        conn.begin().await.expect("no transaction left open");
        conn.rollback().await.expect("rollback");
    }
}

/// A writer waits for another connection's lock without holding its thread: on a runtime of
/// one thread the holder still gets to commit (SQLite's busy handler would sleep in place and
/// starve it until the lock timeout).
#[tokio::test(flavor = "current_thread")]
async fn a_lock_held_elsewhere_is_waited_for_without_blocking_the_runtime() {
    let dir = scratch("sqlite_wait");
    let options = StoreOptions {
        lock_timeout: Duration::from_secs(20),
        ..StoreOptions::default()
    };
    let db = Sqlite::connect(&format!("sqlite://{}/w.db", dir.display()), &options)
        .await
        .expect("open");
    let mut holder = db.acquire().await.expect("conn");
    holder
        .batch("CREATE TABLE t (k INTEGER PRIMARY KEY)")
        .await
        .expect("ddl");
    holder.begin().await.expect("take the writer lock");
    let held = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder
            .execute("INSERT INTO t (k) VALUES (1)", &[], false)
            .await
            .expect("insert");
        holder.commit().await.expect("commit");
    });
    let mut waiter = db.acquire().await.expect("conn");
    waiter
        .begin()
        .await
        .expect("the lock once the holder commits");
    let rows = waiter
        .query(
            "SELECT k FROM t",
            &[],
            &[chainify_storage::ddl::ReadType::Int],
        )
        .await
        .expect("read");
    assert_eq!(
        rows,
        vec![vec![Value::Int(1)]],
        "began after the holder's commit"
    );
    waiter.rollback().await.expect("rollback");
    held.await.expect("holder");
}

/// A store over a fresh SQLite database holding `schema`, its table `table` shared.
async fn shared_store(
    test: &str,
    schema: &str,
    table: &str,
) -> chainify_storage::Store<chainify_storage::Sqlite> {
    use chainify_testkit::conformance::storage::{Fixture, outside};
    let backend = SqliteFixture.backend(test, &StoreOptions::default()).await;
    outside(&backend, schema).await;
    let store = chainify_storage::Store::open(backend, StoreOptions::default())
        .await
        .expect("store opens");
    store.register(&[table]).await.expect("registers");
    assert!(store.check_state().await.expect("scan").agrees());
    store
}

/// Runs `change` on `table` behind its digest triggers, as a DBA would: every trigger of the
/// table dropped, the change made, each trigger put back as it was, in one transaction (so no
/// trigger check sees a gap).
async fn behind_the_triggers(
    store: &chainify_storage::Store<chainify_storage::Sqlite>,
    table: &str,
    change: &str,
) {
    use chainify_testkit::conformance::storage::outside;
    let mut conn = store.backend().acquire().await.expect("a connection");
    let triggers = conn
        .query(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?1",
            &[&Value::Text(table.to_owned())],
            &[chainify_storage::ddl::ReadType::Text; 2],
        )
        .await
        .expect("the triggers");
    drop(conn);
    assert!(!triggers.is_empty(), "{table} has digest triggers");
    let mut tamper = String::from("BEGIN;\n");
    let mut put_back = String::new();
    for t in triggers {
        let Ok([Value::Text(name), Value::Text(sql)]) = <[Value; 2]>::try_from(t) else {
            panic!("a trigger row of {table}");
        };
        tamper.push_str(&format!("DROP TRIGGER {name};\n"));
        put_back.push_str(&format!("{sql};\n"));
    }
    tamper.push_str(&format!("{change};\n{put_back}COMMIT"));
    outside(store.backend(), &tamper).await;
    assert_eq!(
        store.check_triggers().await.expect("catalog"),
        vec![],
        "the triggers are as chainify made them"
    );
}

/// Text in a DECIMAL column, written behind chainify's back: '100.00' and a no-break space
/// compares as text, not as 100, in every later statement. The scan must see it (a hunt found
/// it decoded as 100.00, digesting like the honest row).
#[tokio::test]
async fn text_in_a_decimal_column_is_not_the_number_it_resembles() {
    let store = shared_store(
        "decimal_text",
        "CREATE TABLE acct (k BIGINT NOT NULL PRIMARY KEY, amount DECIMAL(10,2));\n\
         INSERT INTO acct (k, amount) VALUES (1, 100.00)",
        "acct",
    )
    .await;
    behind_the_triggers(
        &store,
        "acct",
        "UPDATE acct SET amount = '100.00' || char(160) WHERE k = 1",
    )
    .await;
    let check = store.check_state().await.expect("scan");
    assert_eq!(check.differing, vec!["acct".to_owned()], "{check:?}");
}

/// Found by a hunt: text that is not UTF-8 (`CAST(X'FF' AS TEXT)`) failed every later scan and
/// digest with a decoding error that named no table, stalling the organization. It reads as its
/// bytes: the block after it digests (what it records differs from the other organizations',
/// which the vote settles), and a change behind the triggers shows in the scan.
#[tokio::test]
async fn text_that_is_not_utf8_stalls_nothing() {
    use chainify_core::tx::{Statement, Transaction};
    use chainify_storage::ExecMode;
    use chainify_testkit::conformance::storage::{block, outside, setup};
    let store = setup(&SqliteFixture, "bad_utf8", StoreOptions::default()).await;
    outside(
        store.backend(),
        "UPDATE accounts SET name = CAST(X'FF' AS TEXT) WHERE custid = 1",
    )
    .await;
    let check = store.check_state().await.expect("the scan reads it");
    assert_eq!(check.pending, 1, "the change was recorded: {check:?}");
    let tx = Transaction {
        statements: vec![Statement::new(
            "UPDATE kv SET v = v + 1 WHERE k = 1",
            vec![],
        )],
    };
    let o = store
        .execute_block(&block(&store, 0, vec![Some(tx)]), ExecMode::Serial)
        .await
        .expect("the next block digests");
    assert_eq!(o.success, vec![true]);
    // Behind the triggers, the same value is a difference the scan names.
    outside(
        store.backend(),
        "UPDATE accounts SET name = CAST(X'FE' AS TEXT) WHERE custid = 2;\n\
         DELETE FROM chainify_dg_accounts",
    )
    .await;
    let check = store.check_state().await.expect("the scan reads it");
    assert_eq!(check.differing, vec!["accounts".to_owned()], "{check:?}");
}

/// Found by a hunt: a BYTES value rewritten behind the triggers as text of the same bytes
/// (`CAST(data AS TEXT)`, not UTF-8) read back as those bytes, so the scan agreed while every
/// later comparison with the value (`WHERE data = X'…'`) was false here alone. It reads as
/// text, which no blob equals.
#[tokio::test]
async fn bytes_rewritten_as_text_are_not_the_bytes_they_hold() {
    let store = shared_store(
        "bytes_text",
        "CREATE TABLE blobs (k BIGINT NOT NULL PRIMARY KEY, data BLOB);\n\
         INSERT INTO blobs (k, data) VALUES (1, X'FF00FE'), (2, X'414243')",
        "blobs",
    )
    .await;
    // Not UTF-8 (k = 1) and UTF-8 (k = 2): each is text now, unequal to its bytes.
    for k in [1, 2] {
        behind_the_triggers(
            &store,
            "blobs",
            &format!("UPDATE blobs SET data = CAST(data AS TEXT) WHERE k = {k}"),
        )
        .await;
        let check = store.check_state().await.expect("scan");
        assert_eq!(
            check.differing,
            vec!["blobs".to_owned()],
            "k = {k}: {check:?}"
        );
    }
}
