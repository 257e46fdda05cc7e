//! SQLite's write-ahead log is checkpointed beside the writers, never inside their commits.
//! (A test binary of its own: it counts the process's checkpoint threads.)

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

/// The log header's checkpoint sequence number, which moves each time the log starts over
/// (which it does only after a checkpoint copied all of it into the database).
fn log_restarts(log: &std::path::Path) -> u32 {
    let header = std::fs::read(log).expect("the log exists once something committed");
    u32::from_be_bytes(header[12..16].try_into().expect("a 32-byte header"))
}

#[tokio::test]
async fn the_log_is_checkpointed_on_a_thread_of_its_own() {
    let dir = chainify_testkit::engines::SqliteFixture::path("sqlite_checkpoints")
        .parent()
        .expect("a directory")
        .join("sqlite_checkpoints");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join("c.db");
    let db = Sqlite::connect(
        &format!("sqlite://{}", path.display()),
        &StoreOptions::default(),
    )
    .await
    .expect("open");
    let mut conn = db.acquire().await.expect("conn");
    conn.batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        .await
        .expect("ddl");
    let log = dir.join("c.db-wal");
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
    assert_eq!(checkpoint_threads(), 0, "the thread ends with the pool");
}
