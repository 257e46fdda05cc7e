//! The synchronous scheduling state machine.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;

use crate::DependencyGraph;

/// Where a transaction is in its life.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TxState {
    /// Some predecessor has not completed.
    Waiting,
    /// Every predecessor completed; in the ready queue.
    Ready,
    /// Handed out by [`Scheduler::pop_ready`], not completed yet.
    InFlight,
    /// Completed.
    Done,
}

/// Releases the transactions of a block as their predecessors complete.
///
/// A plain state machine, no runtime: a driver (such as [`run_block`](crate::run_block)) calls
/// [`pop_ready`](Scheduler::pop_ready) to get work and [`complete`](Scheduler::complete) when a
/// transaction has finished. A transaction becomes ready the moment its last predecessor completes;
/// there are no stage barriers.
#[derive(Debug)]
pub struct Scheduler<'g> {
    /// The block's DAG.
    graph: &'g DependencyGraph,
    /// Per transaction, predecessors not completed yet.
    waiting_on: Vec<u32>,
    /// Per transaction, its state.
    state: Vec<TxState>,
    /// Ready transactions, lowest index on top (block order keeps the pipeline's behaviour
    /// predictable and favours the long chains that start early).
    ready: BinaryHeap<Reverse<usize>>,
    /// Number of transactions in [`TxState::InFlight`].
    in_flight: usize,
    /// Number of transactions in [`TxState::Done`].
    done: usize,
}

/// [`Scheduler::complete`] was called for a transaction that is not in flight: a bug in the driver.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ScheduleError {
    /// The index is not a transaction of the block.
    OutOfRange {
        /// The index passed.
        index: usize,
        /// Number of transactions in the block.
        len: usize,
    },
    /// The transaction was never handed out by [`Scheduler::pop_ready`].
    NotStarted {
        /// The index passed.
        index: usize,
    },
    /// The transaction was already completed.
    AlreadyCompleted {
        /// The index passed.
        index: usize,
    },
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::OutOfRange { index, len } => {
                write!(f, "transaction {index} is outside the block of {len}")
            }
            ScheduleError::NotStarted { index } => {
                write!(f, "transaction {index} was completed before it was started")
            }
            ScheduleError::AlreadyCompleted { index } => {
                write!(f, "transaction {index} was completed twice")
            }
        }
    }
}

impl std::error::Error for ScheduleError {}

impl<'g> Scheduler<'g> {
    /// A scheduler at the start of the block: the transactions without predecessors are ready.
    pub fn new(graph: &'g DependencyGraph) -> Self {
        let len = graph.len();
        let mut waiting_on = vec![0u32; len];
        for (_, to) in graph.edges() {
            waiting_on[to] += 1;
        }
        let mut state = vec![TxState::Waiting; len];
        let mut ready = BinaryHeap::new();
        for (index, waiting) in waiting_on.iter().enumerate() {
            if *waiting == 0 {
                state[index] = TxState::Ready;
                ready.push(Reverse(index));
            }
        }
        Scheduler {
            graph,
            waiting_on,
            state,
            ready,
            in_flight: 0,
            done: 0,
        }
    }

    /// The lowest-index ready transaction, now in flight; `None` when nothing is ready (wait for a
    /// [`complete`](Scheduler::complete), or the block is finished).
    pub fn pop_ready(&mut self) -> Option<usize> {
        let Reverse(index) = self.ready.pop()?;
        self.state[index] = TxState::InFlight;
        self.in_flight += 1;
        Some(index)
    }

    /// Records that transaction `index` finished; the successors whose predecessors have now all
    /// completed become ready. Errors (and changes nothing) unless `index` is in flight.
    pub fn complete(&mut self, index: usize) -> Result<(), ScheduleError> {
        match self.state.get(index) {
            None => {
                return Err(ScheduleError::OutOfRange {
                    index,
                    len: self.state.len(),
                });
            }
            Some(TxState::Waiting | TxState::Ready) => {
                return Err(ScheduleError::NotStarted { index });
            }
            Some(TxState::Done) => return Err(ScheduleError::AlreadyCompleted { index }),
            Some(TxState::InFlight) => {}
        }
        self.state[index] = TxState::Done;
        self.in_flight -= 1;
        self.done += 1;
        for next in self.graph.successors(index) {
            self.waiting_on[next] -= 1;
            if self.waiting_on[next] == 0 {
                self.state[next] = TxState::Ready;
                self.ready.push(Reverse(next));
            }
        }
        Ok(())
    }

    /// Whether every transaction of the block has completed.
    pub fn is_finished(&self) -> bool {
        self.done == self.state.len()
    }

    /// Number of transactions handed out and not completed yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Number of transactions ready to be handed out.
    pub fn ready_count(&self) -> usize {
        self.ready.len()
    }
}

#[cfg(test)]
mod tests {
    use chainify_core::rwset::{KeyRange, KeySet, KeyValue, ReadWriteSet, Resource};
    use proptest::prelude::*;

    use super::*;

    fn writes(keys: &[i64]) -> ReadWriteSet {
        let t = Resource {
            name: "t".into(),
            arity: 1,
        };
        let mut s = ReadWriteSet::default();
        for k in keys {
            s.write(
                &t,
                &KeySet::Ranges(vec![KeyRange::point(vec![KeyValue::Int(*k)])]),
            );
        }
        s
    }

    fn graph(sets: &[ReadWriteSet]) -> DependencyGraph {
        let refs: Vec<_> = sets.iter().map(Some).collect();
        DependencyGraph::build(&refs)
    }

    #[test]
    fn releases_a_successor_when_its_last_predecessor_completes() {
        // 0 and 1 are independent, 2 needs both, 3 needs only 1.
        let g = graph(&[writes(&[1]), writes(&[2]), writes(&[1, 2]), writes(&[2])]);
        let mut s = Scheduler::new(&g);
        assert_eq!(
            (s.pop_ready(), s.pop_ready(), s.pop_ready()),
            (Some(0), Some(1), None)
        );
        assert_eq!(s.in_flight(), 2);
        s.complete(1).unwrap();
        // No barrier: 2 still waits on 0, but nothing else is held back.
        assert_eq!(s.pop_ready(), None);
        s.complete(0).unwrap();
        assert_eq!((s.pop_ready(), s.pop_ready()), (Some(2), None));
        s.complete(2).unwrap();
        assert_eq!(s.pop_ready(), Some(3));
        assert!(!s.is_finished());
        s.complete(3).unwrap();
        assert!(s.is_finished() && s.in_flight() == 0 && s.pop_ready().is_none());
    }

    #[test]
    fn lowest_ready_index_first() {
        let g = graph(&[writes(&[1]), writes(&[1]), writes(&[2]), writes(&[3])]);
        let mut s = Scheduler::new(&g);
        assert_eq!(s.ready_count(), 3);
        assert_eq!(s.pop_ready(), Some(0));
        s.complete(0).unwrap();
        assert_eq!(
            (s.pop_ready(), s.pop_ready(), s.pop_ready()),
            (Some(1), Some(2), Some(3))
        );
    }

    #[test]
    fn misuse_is_an_error_not_a_panic() {
        let g = graph(&[writes(&[1]), writes(&[1])]);
        let mut s = Scheduler::new(&g);
        assert_eq!(s.complete(0), Err(ScheduleError::NotStarted { index: 0 }));
        assert_eq!(s.complete(1), Err(ScheduleError::NotStarted { index: 1 }));
        assert_eq!(
            s.complete(2),
            Err(ScheduleError::OutOfRange { index: 2, len: 2 })
        );
        assert_eq!(s.pop_ready(), Some(0));
        s.complete(0).unwrap();
        assert_eq!(
            s.complete(0),
            Err(ScheduleError::AlreadyCompleted { index: 0 })
        );
        // The failed calls changed nothing.
        assert_eq!((s.pop_ready(), s.in_flight()), (Some(1), 1));
        assert!(!s.complete(0).unwrap_err().to_string().is_empty());
    }

    #[test]
    fn empty_block_is_finished() {
        let g = DependencyGraph::default();
        let mut s = Scheduler::new(&g);
        assert!(s.is_finished() && s.pop_ready().is_none());
    }

    proptest! {
        /// Any completion order: a transaction is handed out only after all its predecessors
        /// completed, each exactly once, and the block always finishes.
        #[test]
        fn respects_edges_in_any_completion_order(
            keys in proptest::collection::vec(proptest::collection::vec(0i64..6, 1..3), 0..40),
            picks in proptest::collection::vec(any::<usize>(), 0..200),
        ) {
            let sets: Vec<_> = keys.iter().map(|k| writes(k)).collect();
            let g = graph(&sets);
            let mut s = Scheduler::new(&g);
            let mut done = vec![false; g.len()];
            let mut started = vec![false; g.len()];
            let mut running: Vec<usize> = Vec::new();
            let mut picks = picks.into_iter();
            while !s.is_finished() {
                // Start a random number of ready transactions, then complete a random one.
                let starts = picks.next().unwrap_or(1) % 4 + 1;
                for _ in 0..starts {
                    let Some(i) = s.pop_ready() else { break };
                    prop_assert!(!started[i]);
                    prop_assert!(g.predecessors(i).all(|p| done[p]));
                    started[i] = true;
                    running.push(i);
                }
                prop_assert_eq!(s.in_flight(), running.len());
                prop_assert!(!running.is_empty(), "stuck with nothing in flight");
                let i = running.swap_remove(picks.next().unwrap_or(0) % running.len());
                s.complete(i).unwrap();
                done[i] = true;
            }
            prop_assert!(done.iter().all(|d| *d));
        }
    }
}
