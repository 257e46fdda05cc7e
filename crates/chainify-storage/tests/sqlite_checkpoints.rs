//! SQLite's write-ahead log is checkpointed beside the writers, and stays bounded. (A test
//! binary of its own: it counts the process's checkpoint threads.)

use std::time::{Duration, Instant};

use chainify_core::Value;
use chainify_storage::{Backend, Conn, Sqlite, StoreOptions};

/// The threads of this process named as the checkpointer names its own.
fn checkpoint_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "wal-checkpoint")
        .count()
}

/// The checkpoint threads once the pool has closed: the kernel may list a joined thread for a
/// moment after it ended.
fn threads_after_close() -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    while checkpoint_threads() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    checkpoint_threads()
}

/// The log header's checkpoint sequence number, which moves each time the log starts over
/// (which it does only after a checkpoint copied all of it into the database).
fn log_restarts(log: &std::path::Path) -> u32 {
    let header = std::fs::read(log).expect("the log exists once something committed");
    u32::from_be_bytes(header[12..16].try_into().expect("a 32-byte header"))
}

/// A fresh database in a directory named `name` with a table `t (k, v)`: the pool, a
/// connection and the path of its log.
async fn table_t(name: &str) -> (Sqlite, chainify_storage::SqliteConn, std::path::PathBuf) {
    let dir = chainify_testkit::engines::SqliteFixture::path(name)
        .parent()
        .expect("a directory")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let db = Sqlite::connect(
        &format!("sqlite://{}", dir.join("t.db").display()),
        &StoreOptions::default(),
    )
    .await
    .expect("open");
    let mut conn = db.acquire().await.expect("conn");
    conn.batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        .await
        .expect("ddl");
    (db, conn, dir.join("t.db-wal"))
}

/// One test, its parts in turn: they count the process's checkpoint threads.
#[tokio::test]
async fn the_log_is_checkpointed_beside_the_writer_and_stays_bounded() {
    the_log_is_checkpointed_on_a_thread_of_its_own().await;
    the_log_stays_bounded_under_a_writer_that_never_pauses().await;
}

async fn the_log_is_checkpointed_on_a_thread_of_its_own() {
    let (db, mut conn, log) = table_t("sqlite_checkpoints").await;
    let first = log_restarts(&log);
    let insert = "INSERT INTO t (k, v) VALUES (?1, zeroblob(100))";
    // Below the threshold nothing is checkpointed and no thread started.
    for k in 0..500 {
        conn.execute(insert, &[&Value::Int(k)], false)
            .await
            .expect("insert");
    }
    assert_eq!(
        checkpoint_threads(),
        0,
        "no checkpoint before the threshold"
    );
    assert_eq!(log_restarts(&log), first);
    // Every commit writes a frame at least: past 1 000 frames the checkpointer starts, and the
    // log starts over at the first commit after its checkpoint. SQLite's automatic checkpoint
    // is off (the hook replaces it), so nothing else could restart the log this early.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut k = 500;
    while log_restarts(&log) == first {
        assert!(
            Instant::now() < deadline,
            "the log was never checkpointed ({k} commits)"
        );
        if k >= 1100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        conn.execute(insert, &[&Value::Int(k)], false)
            .await
            .expect("insert");
        k += 1;
    }
    assert_eq!(checkpoint_threads(), 1, "one checkpoint thread");
    let rows = conn
        .query(
            "SELECT COUNT(*) FROM t",
            &[],
            &[chainify_storage::ddl::ReadType::Int],
        )
        .await
        .expect("count");
    assert_eq!(rows, vec![vec![Value::Int(k)]], "every commit kept");
    drop(conn);
    db.close().await;
    assert_eq!(threads_after_close(), 0, "the thread ends with the pool");
}

/// A writer that never pauses still sees its log start over: the checkpointer copies most of
/// it beside the writer, which rarely lets it finish, and from 8 000 frames a commit
/// checkpoints the rest in place once the checkpointer is idle.
async fn the_log_stays_bounded_under_a_writer_that_never_pauses() {
    let (db, mut conn, log) = table_t("sqlite_log_bound").await;
    let first = log_restarts(&log);
    let mut longest = 0;
    // Blocks of 30 rows spread over the table, one commit each, back to back.
    for block in 0..1500i64 {
        conn.begin().await.expect("begin");
        for row in 0..30i64 {
            conn.execute(
                "INSERT INTO t (k, v) VALUES (?1, randomblob(1000)) ON CONFLICT (k) DO UPDATE SET v = randomblob(1000)",
                &[&Value::Int((block * 7919 + row * 104_729) % 20_000)],
                false,
            )
            .await
            .expect("upsert");
        }
        conn.commit().await.expect("commit");
        longest = longest.max(std::fs::metadata(&log).expect("the log").len());
    }
    // A frame is a page of 4 096 bytes and a 24-byte header.
    let frames = longest.saturating_sub(32) / 4120;
    assert!(
        frames <= 8000 + 400,
        "the log reached {frames} frames ({longest} bytes)"
    );
    // The log reached its bound more than once.
    assert!(
        log_restarts(&log) >= first + 2,
        "the log started over {} times",
        log_restarts(&log) - first
    );
    drop(conn);
    db.close().await;
    assert_eq!(threads_after_close(), 0, "the thread ends with the pool");
}
