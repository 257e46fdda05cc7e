//! CPU work that a client or a peer can make long, run off the async workers.
//!
//! Analysing a new statement shape takes milliseconds (a 64 KiB text: 6–16 ms on this machine),
//! checking a batch of signatures about as long. On a worker that time is taken from every task
//! of the organization: its votes, its appends, other clients. [`Offload`] runs such work on the
//! blocking pool, a bounded number of jobs at a time, so that a flood of it waits in a queue
//! instead of taking every core from the workers.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Runs closures on the blocking pool, at most `at_once` at a time.
#[derive(Clone, Debug)]
pub struct Offload {
    permits: Arc<Semaphore>,
}

/// Why offloaded work gave no result.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    /// The closure panicked, or the runtime is shutting down.
    #[error("the work stopped unexpectedly: {0}")]
    Stopped(String),
}

impl Offload {
    /// At most `at_once` jobs at a time (at least one).
    pub fn new(at_once: usize) -> Offload {
        Offload {
            permits: Arc::new(Semaphore::new(at_once.max(1))),
        }
    }

    /// As many jobs at a time as the machine has cores: the workers still get their share of
    /// each core from the operating system.
    pub fn per_core() -> Offload {
        Offload::new(std::thread::available_parallelism().map_or(2, usize::from))
    }

    /// Runs `work` on the blocking pool once a permit is free. A caller that gives up while
    /// waiting leaves nothing behind; once started, `work` runs to its end.
    pub async fn run<T, F>(&self, work: F) -> Result<T, OffloadError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        // The semaphore is never closed.
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| OffloadError::Stopped(e.to_string()))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| OffloadError::Stopped(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
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
}
