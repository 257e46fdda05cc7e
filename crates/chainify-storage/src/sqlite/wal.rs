//! Keeping SQLite's write-ahead log short: checkpoints beside the writers ([`Checkpointer`]),
//! and new read snapshots held back while the log starts over ([`SnapshotGate`]).
//!
//! The log starts over only at a write that finds all of it copied into the database and no
//! reader still reading from it. A checkpoint copies no further than the oldest snapshot a
//! reader holds, so readers whose snapshots overlap (clients' queries, each within its time
//! limit) would keep the log growing for as long as they go on: a client could fill the disk.
//! Past [`RESTART_FROM`] frames the gate therefore lets no new snapshot start until those under
//! way have ended and a checkpoint has copied everything; snapshots that start afterwards read
//! the database alone, and the next write starts the log over.

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

/// Frames in the write-ahead log after which a commit asks the checkpointer for a checkpoint
/// (~16 MB; SQLite's own automatic threshold is 1 000). Rarer runs copy a page the blocks
/// rewrite once rather than at every run: 5 interleaved pairs at 24 clients on SQLite did
/// 5 778 TPS on average against 5 521 with 1 000 (session 15).
pub(super) const CHECKPOINT_AFTER: i32 = 4000;

/// Frames from which a commit checkpoints in place, once the checkpointer is idle (it is asked
/// for no more runs). The log starts over only after a checkpoint that copied all of it, which
/// one beside a writer that never pauses rarely does (the writer adds frames meanwhile); in
/// place, between the writer's transactions, it does, with little left to copy. So the log
/// stays under this plus the few blocks the checkpointer's last run takes, as long as no read
/// snapshot pins it.
pub(super) const CHECKPOINT_IN_PLACE: i32 = 2 * CHECKPOINT_AFTER;

/// Frames from which new read snapshots wait ([`SnapshotGate`]): reached only while readers
/// pin the log (~64 MB).
pub(super) const RESTART_FROM: i32 = 2 * CHECKPOINT_IN_PLACE;

/// The log file is cut back to this size when it starts over (SQLite keeps its largest size
/// otherwise).
pub(super) const LOG_SIZE_LIMIT: i64 = CHECKPOINT_IN_PLACE as i64 * 4096;

thread_local! {
    /// The log's length in frames after the last commit on this thread ([`wal_committed`]);
    /// the connection that committed reads it right after the call that committed.
    static WAL_FRAMES: Cell<i32> = const { Cell::new(0) };
}

/// SQLite's hook after every commit to the log; it replaces the automatic checkpoint, and only
/// notes the log's length (an error here would fail the statement after its commit).
pub(super) fn wal_committed(
    _: &rusqlite::hooks::Wal,
    frames: std::ffi::c_int,
) -> rusqlite::Result<()> {
    WAL_FRAMES.set(frames);
    Ok(())
}

/// The log's length noted by the last commit on this thread, forgotten once read.
pub(super) fn frames_committed() -> i32 {
    WAL_FRAMES.take()
}

/// Runs a checkpoint on `conn`: a passive one, which never waits for or holds back readers
/// and writers. Once the gate is closed and no reader is left, it then also makes the next
/// write start the log over (`RESTART`: it holds back writers while it copies, so it only
/// copies what the passive run could not, the writer's last commits). With no busy wait, it
/// gives way to a writer in a transaction or a reader the gate does not hold (another process;
/// a later commit tries again). Opens the gate when the log will start over. Returns whether it
/// tried to (the gate was drained).
fn checkpoint(conn: &Connection, gate: &SnapshotGate) -> bool {
    // busy, frames in the log, frames copied.
    let run = |sql: &str| {
        conn.query_row(sql, [], |row| {
            Ok(row.get::<_, i64>(0)? == 0 && row.get::<_, i64>(1)? == row.get::<_, i64>(2)?)
        })
        .unwrap_or(false)
    };
    let passive = run("PRAGMA wal_checkpoint(PASSIVE)");
    if !gate.drained() {
        return false;
    }
    if passive && run("PRAGMA wal_checkpoint(RESTART)") {
        gate.open();
    }
    true
}

/// A thread with a connection of its own that runs a passive checkpoint when a commit asks, one
/// at a time: a commit asks only once the previous run has ended. Started with the first
/// request, so a database that is only read never has one; it ends when the pool closes or is
/// dropped.
#[derive(Debug, Default)]
pub(super) struct Checkpointer {
    state: Mutex<CheckpointerState>,
    /// Held while a checkpoint runs, on the thread or in place.
    running: Arc<Mutex<()>>,
    /// A run is asked for or under way.
    in_flight: Arc<AtomicBool>,
    /// Opened by a run that copied everything once no reader is left.
    pub(super) gate: Arc<SnapshotGate>,
}

#[derive(Debug, Default)]
struct CheckpointerState {
    wake: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
    /// The pool closed: no thread starts again.
    closed: bool,
}

impl Checkpointer {
    /// Asks for a run on the thread (started, with a connection to `path` opened with `flags`,
    /// if it is not running), unless one is asked for or under way.
    pub(super) fn request(&self, path: &PathBuf, flags: OpenFlags) {
        if self.in_flight.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut state = lock(&self.state);
        let sent = !state.closed
            && match state.wake.as_ref().map(|w| w.try_send(())) {
                Some(Ok(())) => true,
                // Not started, or its thread is gone: (re)started with the request queued.
                _ => self.start(&mut state, path, flags),
            };
        if !sent {
            self.in_flight.store(false, Ordering::Release);
        }
    }

    fn start(&self, state: &mut CheckpointerState, path: &PathBuf, flags: OpenFlags) -> bool {
        state.wake = None;
        // Never creates the file: a database moved away is not made again empty.
        let flags = flags - OpenFlags::SQLITE_OPEN_CREATE;
        let Ok(conn) = Connection::open_with_flags(path, flags) else {
            return false;
        };
        if conn.busy_timeout(Duration::ZERO).is_err() {
            return false;
        }
        let (sender, receiver) = std::sync::mpsc::sync_channel::<()>(1);
        let (running, in_flight, gate) = (
            self.running.clone(),
            self.in_flight.clone(),
            self.gate.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("wal-checkpoint".into())
            .spawn(move || {
                while receiver.recv().is_ok() {
                    {
                        let _running = lock(&running);
                        // The last reader may have left during a run begun before, its own
                        // request turned away (one at a time): then one more.
                        if !checkpoint(&conn, &gate) && gate.drained() {
                            checkpoint(&conn, &gate);
                        }
                    }
                    in_flight.store(false, Ordering::Release);
                }
            });
        let Ok(handle) = spawned else {
            return false;
        };
        if sender.try_send(()).is_err() {
            return false;
        }
        state.wake = Some(sender);
        // A thread whose channel broke has ended; its handle is let go.
        drop(state.thread.replace(handle));
        true
    }

    /// Checkpoints on `conn`, which just committed, unless the thread is running one (then a
    /// later commit does, without waiting for it).
    pub(super) fn in_place(&self, conn: &Connection) {
        let _running = match self.running.try_lock() {
            Ok(running) => running,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        checkpoint(conn, &self.gate);
    }

    /// After a commit that left the log at `frames`: a log that started over since the gate
    /// closed (a checkpoint that gave way to a reader the gate does not hold still copied
    /// everything, and the next write started the log over) opens it.
    pub(super) fn committed(&self, frames: i32) {
        if frames > 0 && frames < CHECKPOINT_IN_PLACE && self.gate.is_closed() {
            self.gate.open();
        }
    }

    /// Stops the thread, letting a running checkpoint finish.
    pub(super) async fn stop(&self) {
        let thread = {
            let mut state = lock(&self.state);
            state.closed = true;
            state.wake = None;
            state.thread.take()
        };
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        // Nobody is left to open it.
        self.gate.open();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Holds back new read snapshots while the log starts over (see the module's doc).
///
/// Closed by a commit that finds the log past [`RESTART_FROM`] frames; opened by the first
/// checkpoint that copies everything once the snapshots under way have ended, and makes the
/// next write start the log over (or by a commit that finds the log started over). A hold
/// never outlasts the latest time limit of the snapshots under way plus a grace (the lock
/// timeout); a reader let through before the gate closed that starts its snapshot after (a
/// query that waited for the node's read gate) pushes the end out to its own limit plus the
/// grace. Past the end, waiting readers open the gate themselves and it stays open for as long
/// as the hold lasted, so that a reader outside chainify (another process) pinning the log
/// cannot stall queries.
/// A full scan without a time limit (an operator's state check) keeps the gate open while it
/// runs: no client can start one.
#[derive(Debug, Default)]
pub(super) struct SnapshotGate {
    state: Mutex<GateState>,
    opened: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct GateState {
    /// Read snapshots under way, and connections let through to start one.
    readers: usize,
    /// Of them, full scans without a time limit.
    unlimited: usize,
    /// The latest deadline of a limited snapshot begun so far.
    latest_deadline: Option<Instant>,
    /// Since when, and until when at the latest, new snapshots wait.
    closed: Option<(Instant, Instant)>,
    /// How long past the latest deadline a hold may last.
    grace: Duration,
    /// Not closed again before this (after a hold that ran out).
    not_before: Option<Instant>,
}

/// A reader let through the gate: counted until dropped (when its snapshot has ended).
#[derive(Debug)]
pub(super) struct Pass {
    gate: Arc<SnapshotGate>,
    unlimited: bool,
}

impl SnapshotGate {
    /// Waits until new snapshots may start, and counts one more reader (under the lock that
    /// found the gate open, so no close comes in between).
    pub(super) async fn enter(self: &Arc<Self>) -> Pass {
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            let until = {
                let mut s = lock(&self.state);
                let now = Instant::now();
                match s.closed {
                    Some((_, until)) if now < until => Some(until),
                    closed => {
                        if let Some((since, until)) = closed {
                            // The hold ran out: open for as long as it lasted.
                            s.not_before = Some(now + (until - since));
                            s.closed = None;
                            self.opened.notify_waiters();
                        }
                        s.readers += 1;
                        None
                    }
                }
            };
            match until {
                Some(until) => {
                    let _ = tokio::time::timeout_at(until.into(), opened).await;
                }
                None => {
                    return Pass {
                        gate: self.clone(),
                        unlimited: false,
                    };
                }
            }
        }
    }

    /// Closes the gate (unless it is, or may not be yet); whether no reader is left, so that a
    /// checkpoint now may copy everything.
    pub(super) fn close(&self, grace: Duration) -> bool {
        let mut s = lock(&self.state);
        let now = Instant::now();
        if s.closed.is_none() {
            if s.unlimited > 0 || s.not_before.is_some_and(|t| now < t) {
                return false;
            }
            let until = s.latest_deadline.map_or(now, |d| d.max(now)) + grace;
            s.closed = Some((now, until));
            s.grace = grace;
        }
        s.readers == 0
    }

    /// Whether the gate is closed with no reader left.
    fn drained(&self) -> bool {
        let s = lock(&self.state);
        s.closed.is_some() && s.readers == 0
    }

    fn open(&self) {
        lock(&self.state).closed = None;
        self.opened.notify_waiters();
    }

    fn is_closed(&self) -> bool {
        lock(&self.state).closed.is_some()
    }
}

impl Pass {
    /// The snapshot it lets through has a time limit ending at `deadline`.
    pub(super) fn limited(&self, deadline: Instant) {
        let mut s = lock(&self.gate.state);
        s.latest_deadline = Some(s.latest_deadline.map_or(deadline, |d| d.max(deadline)));
        if let Some((since, until)) = s.closed {
            s.closed = Some((since, until.max(deadline + s.grace)));
        }
    }

    /// The snapshot it lets through has no time limit.
    pub(super) fn unlimited(&mut self) {
        if !self.unlimited {
            self.unlimited = true;
            lock(&self.gate.state).unlimited += 1;
        }
    }

    /// Ends it; whether the gate is closed and no reader is left (a checkpoint may then copy
    /// everything).
    pub(super) fn end(self) -> bool {
        let gate = self.gate.clone();
        drop(self);
        gate.drained()
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut s = lock(&self.gate.state);
        s.readers -= 1;
        s.unlimited -= usize::from(self.unlimited);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `enter` returns within a moment (it is pending while the gate holds it).
    async fn enters_now(gate: &Arc<SnapshotGate>) -> Option<Pass> {
        tokio::time::timeout(Duration::from_millis(50), gate.enter())
            .await
            .ok()
    }

    /// A database in WAL mode with a table and a log of some frames, for `conns` connections.
    /// A directory removed when dropped.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn logged_database(name: &str, conns: usize) -> (Scratch, Vec<Connection>) {
        let dir = std::env::temp_dir().join(format!("chainify-wal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let conns: Vec<Connection> = (0..conns)
            .map(|_| {
                let conn = Connection::open(dir.join("t.db")).expect("open");
                // As the pool's: a checkpoint never waits.
                conn.busy_timeout(Duration::ZERO).expect("busy");
                conn
            })
            .collect();
        conns[0]
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;
                 CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB);
                 INSERT INTO t VALUES (1, randomblob(10000));",
            )
            .expect("setup");
        (Scratch(dir), conns)
    }

    /// The log header's checkpoint sequence number, which moves when the log starts over.
    fn restarts(conn: &Connection) -> i64 {
        let path: String = conn
            .query_row("PRAGMA database_list", [], |r| r.get(2))
            .expect("path");
        let header = std::fs::read(format!("{path}-wal")).expect("log");
        i64::from(u32::from_be_bytes(
            header[12..16].try_into().expect("header"),
        ))
    }

    #[tokio::test]
    async fn new_snapshots_wait_until_the_last_reader_is_out_and_the_log_starts_over() {
        let (_scratch, conns) = logged_database("gate", 3);
        let (writer, outside) = (&conns[0], &conns[1]);
        let gate = Arc::new(SnapshotGate::default());
        let old = enters_now(&gate).await.expect("open at first");
        assert!(!gate.close(Duration::from_secs(60)), "a reader is left");
        assert!(enters_now(&gate).await.is_none(), "held back while closed");
        // While a reader is left, a checkpoint opens nothing.
        checkpoint(&conns[2], &gate);
        assert!(gate.is_closed());
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.enter().await }
        });
        assert!(old.end(), "the last reader out finds the gate drained");
        // A reader outside chainify still on the log: the checkpoint gives way, still closed.
        outside.execute_batch("BEGIN").expect("begin");
        let _: i64 = outside
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .expect("read");
        writer
            .execute("UPDATE t SET v = randomblob(10000)", [])
            .expect("write");
        checkpoint(&conns[2], &gate);
        assert!(gate.is_closed(), "not while a reader pins the log");
        outside.execute_batch("COMMIT").expect("end");
        let before = restarts(writer);
        checkpoint(&conns[2], &gate);
        assert!(!gate.is_closed(), "opened once everything is copied");
        let admitted = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiting reader is let through once the gate opens")
            .expect("task");
        // A reader let in now reads the database alone: the next write starts the log over.
        outside.execute_batch("BEGIN").expect("begin");
        let _: i64 = outside
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .expect("read");
        writer
            .execute("UPDATE t SET v = randomblob(10000)", [])
            .expect("write");
        assert_eq!(restarts(writer), before + 1, "the log started over");
        outside.execute_batch("COMMIT").expect("end");
        assert!(!admitted.end(), "open: nothing to drain");
    }

    #[tokio::test]
    async fn a_full_scan_keeps_the_gate_open_and_a_drained_gate_closes_for_nobody() {
        let gate = Arc::new(SnapshotGate::default());
        let mut scan = enters_now(&gate).await.expect("open");
        scan.unlimited();
        assert!(!gate.close(Duration::from_secs(60)));
        assert!(!gate.is_closed(), "not closed while a full scan runs");
        drop(scan);
        assert!(gate.close(Duration::from_secs(60)), "no reader left");
        assert!(gate.drained());
        gate.open();
        assert!(enters_now(&gate).await.is_some());
    }

    #[tokio::test]
    async fn a_hold_that_runs_out_lets_readers_in_and_stays_open_as_long() {
        let gate = Arc::new(SnapshotGate::default());
        // A reader whose limit ends in 100 ms never leaves (as a reader outside chainify
        // pinning the log): the hold lasts that plus the grace, then readers go in.
        let stuck = enters_now(&gate).await.expect("open");
        stuck.limited(Instant::now() + Duration::from_millis(100));
        assert!(!gate.close(Duration::from_millis(100)));
        let started = Instant::now();
        assert!(enters_now(&gate).await.is_none(), "held back at first");
        let pass = tokio::time::timeout(Duration::from_secs(10), gate.enter())
            .await
            .expect("let through once the hold ran out");
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert!(!gate.is_closed());
        // Open for as long as it was closed: a commit cannot close it again yet.
        assert!(!gate.close(Duration::from_millis(100)));
        assert!(!gate.is_closed());
        drop((pass, stuck));
    }

    #[tokio::test]
    async fn a_reader_let_through_before_the_close_pushes_the_hold_out_to_its_limit() {
        let gate = Arc::new(SnapshotGate::default());
        // Let through, then waiting for the node's read gate while a commit closes this one.
        let early = enters_now(&gate).await.expect("open");
        assert!(!gate.close(Duration::from_millis(100)));
        // Its snapshot starts now, with a limit of 400 ms: the hold lasts that plus the grace,
        // not the 100 ms fixed at the close, or the early reader would still pin the log when
        // the gate opens again.
        early.limited(Instant::now() + Duration::from_millis(400));
        let started = Instant::now();
        let pass = tokio::time::timeout(Duration::from_secs(10), gate.enter())
            .await
            .expect("let through once the longer hold ran out");
        assert!(started.elapsed() >= Duration::from_millis(450));
        drop((pass, early));
    }

    #[tokio::test]
    async fn after_a_hold_ran_out_the_gate_stays_open_as_long_as_the_hold_not_the_quiet_after() {
        let gate = Arc::new(SnapshotGate::default());
        let stuck = enters_now(&gate).await.expect("open");
        assert!(!gate.close(Duration::from_millis(50)));
        // Nobody opens it (the last reader's checkpoint gave way) and nobody comes for a while.
        drop(stuck);
        tokio::time::sleep(Duration::from_millis(600)).await;
        drop(enters_now(&gate).await.expect("the hold ran out"));
        assert!(!gate.is_closed());
        assert!(
            !gate.close(Duration::from_millis(50)),
            "open for the hold's length first"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            gate.close(Duration::from_millis(50)),
            "closes again once the hold's length has passed, whatever the quiet before"
        );
        assert!(gate.is_closed());
    }
}
