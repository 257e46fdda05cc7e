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
    table_t_with(name, StoreOptions::default()).await
}

async fn table_t_with(
    name: &str,
    options: StoreOptions,
) -> (Sqlite, chainify_storage::SqliteConn, std::path::PathBuf) {
    let dir = chainify_testkit::engines::SqliteFixture::path(name)
        .parent()
        .expect("a directory")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let db = Sqlite::connect(
        &format!("sqlite://{}", dir.join("t.db").display()),
        &options,
    )
    .await
    .expect("open");
    let mut conn = db.acquire().await.expect("conn");
    conn.batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        .await
        .expect("ddl");
    (db, conn, dir.join("t.db-wal"))
}

/// Commits `blocks` blocks of 30 rows of changed bytes spread over the table, back to back,
/// on `conn`; returns the longest the log grew, in frames (a page of 4 096 bytes and a
/// 24-byte header each).
async fn write_blocks(
    conn: &mut chainify_storage::SqliteConn,
    log: &std::path::Path,
    blocks: i64,
) -> u64 {
    write_blocks_from(conn, log, 0, blocks).await
}

/// [`write_blocks`] numbered from `first`.
async fn write_blocks_from(
    conn: &mut chainify_storage::SqliteConn,
    log: &std::path::Path,
    first: i64,
    blocks: i64,
) -> u64 {
    let mut longest = 0;
    for block in first..first + blocks {
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
        longest = longest.max(std::fs::metadata(log).expect("the log").len());
    }
    longest.saturating_sub(32) / 4120
}

/// One test, its parts in turn: they count the process's checkpoint threads.
#[tokio::test]
async fn the_log_is_checkpointed_beside_the_writer_and_stays_bounded() {
    the_log_is_checkpointed_on_a_thread_of_its_own().await;
    the_log_stays_bounded_under_a_writer_that_never_pauses().await;
    the_log_starts_over_beside_readers_that_overlap().await;
    the_gate_opens_once_the_log_started_over().await;
    a_closed_pool_starts_no_checkpoint_thread().await;
}

async fn the_log_is_checkpointed_on_a_thread_of_its_own() {
    let (db, mut conn, log) = table_t("sqlite_checkpoints").await;
    let first = log_restarts(&log);
    let insert = "INSERT INTO t (k, v) VALUES (?1, zeroblob(100))";
    // Below the threshold nothing is checkpointed and no thread started.
    for k in 0..2000 {
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
    // Every commit writes a frame at least: past 4 000 frames the checkpointer starts, and the
    // log starts over at the first commit after its checkpoint. SQLite's automatic checkpoint
    // is off (the hook replaces it), so nothing else could restart the log this early.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut k = 2000;
    while log_restarts(&log) == first {
        assert!(
            Instant::now() < deadline,
            "the log was never checkpointed ({k} commits)"
        );
        if k >= 4100 {
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
    let frames = write_blocks(&mut conn, &log, 1500).await;
    // Plus what the writer adds while the thread finishes a run (~40 frames a block; more on a
    // loaded machine); without the in-place step it reached 15 000–39 000.
    assert!(frames <= 8000 + 1000, "the log reached {frames} frames");
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

/// Clients' queries whose snapshots overlap would pin the log for as long as they go on (a
/// checkpoint copies no further than the oldest snapshot, and the log starts over only once
/// all of it is copied): past 16 000 frames new snapshots wait until those under way end and
/// the log is copied, and it starts over. The readers go on meanwhile.
async fn the_log_starts_over_beside_readers_that_overlap() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (db, mut conn, log) = table_t("sqlite_log_readers").await;
    let db = Arc::new(db);
    let stop = Arc::new(AtomicBool::new(false));
    let snapshots = Arc::new(AtomicU64::new(0));
    // Two readers, each holding its snapshot 30 ms and starting the next at once, 15 ms apart:
    // at every moment one of them holds a snapshot.
    let readers: Vec<_> = (0..2u64)
        .map(|i| {
            let (db, stop, snapshots) = (db.clone(), stop.clone(), snapshots.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .expect("runtime");
                runtime.block_on(async {
                    tokio::time::sleep(Duration::from_millis(15 * i)).await;
                    while !stop.load(Ordering::Relaxed) {
                        let mut reader = db.acquire().await.expect("reader");
                        reader.ready_to_read().await;
                        reader
                            .begin_limited_read(Duration::from_secs(10))
                            .await
                            .expect("begin");
                        reader
                            .query(
                                "SELECT COUNT(*) FROM t",
                                &[],
                                &[chainify_storage::ddl::ReadType::Int],
                            )
                            .await
                            .expect("read");
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        reader.rollback().await.expect("end");
                        snapshots.fetch_add(1, Ordering::Relaxed);
                    }
                });
            })
        })
        .collect();
    let first = log_restarts(&log);
    let frames = write_blocks(&mut conn, &log, 2500).await;
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().expect("reader");
    }
    // The log grows on while the snapshots under way end (30 ms, ~1 000 frames here); without
    // the gate it reached 103 000 frames.
    assert!(frames <= 16_000 + 4_000, "the log reached {frames} frames");
    assert!(log_restarts(&log) > first, "the log started over");
    assert!(
        snapshots.load(Ordering::Relaxed) >= 20,
        "the readers went on: {} snapshots",
        snapshots.load(Ordering::Relaxed)
    );
    drop(conn);
    db.close().await;
    assert_eq!(threads_after_close(), 0, "the thread ends with the pool");
}

/// Commits that go on after the pool closed (on a connection taken before) ask for
/// checkpoints, and no thread starts for them: none is left once the connection is gone.
async fn a_closed_pool_starts_no_checkpoint_thread() {
    let (db, mut conn, _log) = table_t("sqlite_closed_pool").await;
    // Past the threshold, with the thread started.
    let mut k = 0;
    let insert = "INSERT INTO t (k, v) VALUES (?1, randomblob(100))";
    while checkpoint_threads() == 0 {
        conn.execute(insert, &[&Value::Int(k)], false)
            .await
            .expect("insert");
        k += 1;
        assert!(k < 100_000, "no checkpoint thread started");
    }
    db.close().await;
    assert_eq!(threads_after_close(), 0, "the thread ends with the pool");
    // Every commit is at least a frame: these cross the threshold again, more than once.
    for _ in 0..2500 {
        conn.execute(insert, &[&Value::Int(k)], false)
            .await
            .expect("a connection taken before the close still works");
        k += 1;
    }
    assert_eq!(checkpoint_threads(), 0, "no thread after the close");
    drop(conn);
    assert_eq!(threads_after_close(), 0);
}

/// A reader the gate does not hold (here another connection; in process, a transaction
/// lookup) on the log when the last held reader leaves makes that reader's checkpoint give
/// way, though it copied everything; the next write starts the log over, and that opens the
/// gate: new snapshots do not wait out the whole hold (here a 60 s query limit; the test
/// waits 10 s).
async fn the_gate_opens_once_the_log_started_over() {
    let (db, mut conn, log) = table_t("sqlite_gate_reopens").await;
    let mut held = db.acquire().await.expect("reader");
    held.ready_to_read().await;
    held.begin_limited_read(Duration::from_secs(60))
        .await
        .expect("begin");
    held.query(
        "SELECT COUNT(*) FROM t",
        &[],
        &[chainify_storage::ddl::ReadType::Int],
    )
    .await
    .expect("read");
    // Past 16 000 frames, pinned: the gate closes.
    let mut block = 0;
    while std::fs::metadata(&log).expect("log").len() / 4120 < 16_100 {
        write_blocks_from(&mut conn, &log, block, 1).await;
        block += 1;
    }
    let outside = rusqlite::Connection::open(log.with_extension("db")).expect("outside");
    outside.execute_batch("BEGIN").expect("begin");
    let _: i64 = outside
        .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
        .expect("read");
    held.rollback().await.expect("end");
    drop(held);
    // The last held reader's checkpoint has given way to the outside one (the thread's run).
    tokio::time::sleep(Duration::from_millis(200)).await;
    outside.execute_batch("COMMIT").expect("end");
    let restarts = log_restarts(&log);
    write_blocks_from(&mut conn, &log, block, 1).await;
    assert!(log_restarts(&log) > restarts, "the log started over");
    let mut reader = db.acquire().await.expect("reader");
    tokio::time::timeout(Duration::from_secs(10), reader.ready_to_read())
        .await
        .expect("the gate opened with the log started over, not after the hold");
    drop((reader, conn));
    db.close().await;
    assert_eq!(threads_after_close(), 0, "the thread ends with the pool");
}
