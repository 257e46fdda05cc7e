//! The async drivers' contract: at most `parallelism` transactions in flight, an executor error
//! stops the block (nothing new starts once the error is seen, in-flight ones are awaited, the
//! first error is returned), and the serial reference runs in block order.
//!
//! Everything runs on a current-thread runtime, where `FuturesUnordered` polls every transaction
//! pushed so far before `run_block` looks at the results, so the counts asserted here are exact.

#![allow(clippy::unwrap_used)]

use std::sync::Mutex;

use chainify_core::rwset::{KeyRange, KeySet, KeyValue, ReadWriteSet, Resource};
use chainify_sched::{DependencyGraph, TxExecutor, run_block, run_serial};
use tokio::sync::Semaphore;

/// Each transaction writes its own key: no edges at all.
fn independent(n: usize) -> DependencyGraph {
    let t = Resource {
        name: "t".into(),
        arity: 1,
    };
    let sets: Vec<ReadWriteSet> = (0..n as i64)
        .map(|k| {
            let mut s = ReadWriteSet::default();
            s.write(
                &t,
                &KeySet::Ranges(vec![KeyRange::point(vec![KeyValue::Int(k)])]),
            );
            s
        })
        .collect();
    let refs: Vec<_> = sets.iter().map(Some).collect();
    let graph = DependencyGraph::build(&refs);
    assert_eq!(graph.edge_count(), 0);
    graph
}

/// Records starts and ends; transactions in `fail` return `Err(index)`. When `gated`, every
/// transaction except the first failing one waits for a permit, which that failing one hands out
/// (plenty, so that a wrong driver fails the test instead of hanging) in the same poll in which it
/// fails: no other transaction can finish before the error is produced.
/// Permits the first failing transaction hands out.
const PLENTY: usize = 1 << 16;

#[derive(Debug)]
struct Recorder {
    fail: Vec<usize>,
    gated: bool,
    permits: Semaphore,
    starts: Mutex<Vec<usize>>,
    ends: Mutex<Vec<usize>>,
    in_flight: Mutex<(usize, usize)>,
}

impl Recorder {
    fn new(fail: &[usize], gated: bool) -> Self {
        Recorder {
            fail: fail.to_vec(),
            gated,
            permits: Semaphore::new(0),
            starts: Mutex::default(),
            ends: Mutex::default(),
            in_flight: Mutex::default(),
        }
    }

    fn starts(&self) -> Vec<usize> {
        self.starts.lock().unwrap().clone()
    }

    fn max_in_flight(&self) -> usize {
        self.in_flight.lock().unwrap().1
    }
}

impl TxExecutor for Recorder {
    type Error = usize;

    async fn execute(&self, index: usize) -> Result<(), usize> {
        self.starts.lock().unwrap().push(index);
        {
            let mut in_flight = self.in_flight.lock().unwrap();
            in_flight.0 += 1;
            in_flight.1 = in_flight.1.max(in_flight.0);
        }
        if self.gated {
            if self.fail.first() == Some(&index) {
                self.permits.add_permits(PLENTY);
                self.in_flight.lock().unwrap().0 -= 1;
                self.ends.lock().unwrap().push(index);
                return Err(index);
            }
            self.permits.acquire().await.unwrap().forget();
        }
        tokio::task::yield_now().await;
        self.in_flight.lock().unwrap().0 -= 1;
        self.ends.lock().unwrap().push(index);
        if self.fail.contains(&index) {
            Err(index)
        } else {
            Ok(())
        }
    }
}

#[tokio::test]
async fn an_error_stops_new_starts_and_waits_for_the_in_flight() {
    let graph = independent(20);
    // 0 fails while 1, 2, 3 are in flight and cannot finish before it.
    let executor = Recorder::new(&[0], true);
    assert_eq!(run_block(&graph, &executor, 4).await, Err(0));
    assert_eq!(executor.starts(), [0, 1, 2, 3], "started after the error");
    let mut ends = executor.ends.lock().unwrap().clone();
    ends.sort_unstable();
    assert_eq!(ends, [0, 1, 2, 3], "returned before the in-flight finished");
}

#[tokio::test]
async fn the_first_error_wins() {
    let graph = independent(10);
    // 2 fails first and releases 0, 1 and 3; 3 fails after it.
    let executor = Recorder::new(&[2, 3], true);
    assert_eq!(run_block(&graph, &executor, 4).await, Err(2));
    assert_eq!(executor.starts(), [0, 1, 2, 3]);
}

#[tokio::test]
async fn one_at_a_time_stops_right_after_the_failing_transaction() {
    let graph = independent(10);
    let executor = Recorder::new(&[5], false);
    assert_eq!(run_block(&graph, &executor, 1).await, Err(5));
    assert_eq!(executor.starts(), [0, 1, 2, 3, 4, 5]);
}

#[tokio::test]
async fn parallelism_bounds_the_transactions_in_flight() {
    for (parallelism, expected) in [(0, 1), (1, 1), (3, 3), (8, 8), (50, 20)] {
        let executor = Recorder::new(&[], false);
        run_block(&independent(20), &executor, parallelism)
            .await
            .unwrap();
        assert_eq!(
            executor.max_in_flight(),
            expected,
            "parallelism {parallelism}"
        );
        let mut starts = executor.starts();
        starts.sort_unstable();
        assert_eq!(starts, (0..20).collect::<Vec<_>>());
    }
}

#[tokio::test]
async fn dependencies_hold_back_even_with_room_to_spare() {
    // 0 → 1 → 2 on one key; 3 is independent.
    let t = Resource {
        name: "t".into(),
        arity: 1,
    };
    let one = KeySet::Ranges(vec![KeyRange::point(vec![KeyValue::Int(1)])]);
    let mut w = ReadWriteSet::default();
    w.write(&t, &one);
    let graph = DependencyGraph::build(&[Some(&w), Some(&w), Some(&w), None]);
    let executor = Recorder::new(&[], false);
    run_block(&graph, &executor, 8).await.unwrap();
    // 0 and 3 start together; 1 only after 0 ended, 2 only after 1 ended.
    assert_eq!(executor.starts(), [0, 3, 1, 2]);
    assert_eq!(executor.max_in_flight(), 2);
}

#[tokio::test]
async fn serial_runs_in_block_order_and_stops_at_the_first_error() {
    let executor = Recorder::new(&[], false);
    run_serial(5, &executor).await.unwrap();
    assert_eq!(executor.starts(), [0, 1, 2, 3, 4]);
    assert_eq!(executor.max_in_flight(), 1);

    let executor = Recorder::new(&[2, 3], false);
    assert_eq!(run_serial(5, &executor).await, Err(2));
    assert_eq!(executor.starts(), [0, 1, 2]);
}

#[test]
fn run_block_is_send_for_spawning() {
    fn assert_send<T: Send>(_: &T) {}
    let graph = independent(1);
    let executor = Recorder::new(&[], false);
    let future = run_block(&graph, &executor, 2);
    assert_send(&future);
}
