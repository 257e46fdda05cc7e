//! CPU work that a client or a peer can make long, run off the async workers.
//!
//! Analysing a new statement shape takes milliseconds (a 64 KiB text: 6–16 ms on this machine),
//! checking a batch of signatures about as long. On a worker that time is taken from every task
//! of the organization: its votes, its appends, other clients. [`Offload`] runs such work on the
//! blocking pool, a bounded number of jobs at a time, so that a flood of it waits in a queue
//! instead of taking every core from the workers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Semaphore;

/// Runs closures on the blocking pool, at most `at_once` at a time.
#[derive(Clone, Debug)]
pub struct Offload {
    permits: Arc<Semaphore>,
    /// Jobs waiting for a permit, and the most that may.
    waiting: Arc<AtomicUsize>,
    max_waiting: usize,
}

/// Jobs that may wait per permit: a deeper queue is refused at once, so that a flood makes
/// callers retry instead of waiting behind it for longer than a client or peer would (on two
/// cores, 1 024 analyses of 10 ms wait ~5 s at most). Deep enough for a burst of honest
/// clients starting with the same new statement. A waiting job holds only its caller's future
/// ([`Offload::run_made`] builds the job once it has a permit).
pub(crate) const WAITING_PER_PERMIT: usize = 512;

/// Why offloaded work gave no result.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    /// The closure panicked, or the runtime is shutting down.
    #[error("the work stopped unexpectedly: {0}")]
    Stopped(String),
    /// Too many jobs wait already.
    #[error("{0} jobs wait already; try again later")]
    Busy(usize),
}

impl Offload {
    /// At most `at_once` jobs at a time (at least one).
    pub fn new(at_once: usize) -> Offload {
        Offload {
            permits: Arc::new(Semaphore::new(at_once.max(1))),
            waiting: Arc::new(AtomicUsize::new(0)),
            max_waiting: at_once.max(1) * WAITING_PER_PERMIT,
        }
    }

    /// As many jobs at a time as the machine has cores: the workers still get their share of
    /// each core from the operating system.
    pub fn per_core() -> Offload {
        Offload::new(cores())
    }

    /// Runs `work` on the blocking pool once a permit is free, or refuses it at once
    /// ([`OffloadError::Busy`]) when `WAITING_PER_PERMIT` jobs a permit wait already. A caller
    /// that gives up while waiting leaves nothing behind; once started, `work` runs to its end.
    pub async fn run<T, F>(&self, work: F) -> Result<T, OffloadError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.run_made(|| work).await
    }

    /// [`Offload::run`] of the job `make` returns, called once a permit is free: what the job
    /// copies from the caller (a proposal of up to 512 KiB) is copied only then.
    pub async fn run_made<T, F, M>(&self, make: M) -> Result<T, OffloadError>
    where
        M: FnOnce() -> F,
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let waiting = Waiting::enter(&self.waiting, self.max_waiting)?;
                // The semaphore is never closed.
                let permit = self
                    .permits
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|e| OffloadError::Stopped(e.to_string()))?;
                drop(waiting);
                permit
            }
        };
        let work = make();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| OffloadError::Stopped(e.to_string()))
    }
}

/// A job's place in the queue; left when dropped (the caller may give up while waiting).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicUsize, most: usize) -> Result<Waiting<'a>, OffloadError> {
        let before = count.fetch_add(1, Ordering::AcqRel);
        let waiting = Waiting(count);
        if before >= most {
            return Err(OffloadError::Busy(before));
        }
        Ok(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The machine's cores: the jobs a [`Offload::per_core`] runs at once.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn no_more_than_the_bound_run_at_once_and_a_panic_is_an_error() {
        let offload = Offload::new(2);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let jobs = (0..8).map(|_| {
            let (running, most) = (running.clone(), most.clone());
            offload.run(move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
                running.fetch_sub(1, Ordering::SeqCst);
            })
        });
        for done in futures_util::future::join_all(jobs).await {
            done.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
        let panicked = offload.run(|| panic!("boom")).await;
        assert!(
            matches!(panicked, Err(OffloadError::Stopped(_))),
            "{panicked:?}"
        );
        // The permit of the panicked job came back.
        offload.run(|| ()).await.unwrap();
    }

    #[tokio::test]
    async fn a_queue_deeper_than_its_bound_is_refused_at_once_and_drains() {
        let offload = Offload::new(1);
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let o = offload.clone();
        let running = tokio::spawn(async move { o.run(move || hold.recv().ok()).await });
        while offload.permits.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let waiting: Vec<_> = (0..WAITING_PER_PERMIT)
            .map(|_| {
                let o = offload.clone();
                async move { o.run(|| ()).await }
            })
            .collect();
        let all = tokio::spawn(futures_util::future::join_all(waiting));
        while offload.waiting.load(Ordering::SeqCst) < WAITING_PER_PERMIT {
            tokio::task::yield_now().await;
        }
        let refused = offload.run(|| ()).await;
        assert!(
            matches!(refused, Err(OffloadError::Busy(n)) if n == WAITING_PER_PERMIT),
            "{refused:?}"
        );
        release.send(()).unwrap();
        running.await.unwrap().unwrap();
        for done in all.await.unwrap() {
            done.unwrap();
        }
        assert_eq!(offload.waiting.load(Ordering::SeqCst), 0);
        offload.run(|| ()).await.unwrap();
    }
}
