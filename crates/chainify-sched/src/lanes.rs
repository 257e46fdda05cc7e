//! Block-level group commit: which transaction runs on which of k *lanes* (a connection holding
//! one open database transaction across several block transactions), and when a lane commits.
//!
//! A lane's uncommitted writes are visible to the lane alone (READ COMMITTED) and lock their
//! rows until it commits. So a transaction may start on a lane only when every predecessor has
//! either committed or is held, uncommitted, by that same lane. The planner keeps to that rule and
//! otherwise commits as late as it can:
//!
//! - a transaction whose uncommitted predecessors all sit in one lane runs on that lane (a chain
//!   of dependent transactions stays on one connection and needs no commit in between);
//! - one with uncommitted predecessors in several lanes waits while all of those lanes but one
//!   commit;
//! - a lane that has nothing to run commits at once, so no lane sits on locks that a running
//!   transaction might wait for (the engine's own locks can be wider than the read/write sets);
//! - a lane holding `cap` transactions commits before it takes another (bounding what a retry
//!   replays).
//!
//! Transactions that need no database work (rejected by analysis, or committed by an earlier run
//! of the block) complete as soon as they are ready, on no lane. Pure state: the storage crate's
//! executor carries out the [`Step`]s and reports back.

use std::collections::BTreeSet;

use crate::{DependencyGraph, Scheduler};

/// What to start on a lane.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Step {
    /// Run transaction `tx` inside lane `lane`'s open database transaction (opening one if
    /// needed); report with [`LanePlan::ran`].
    Run {
        /// The lane.
        lane: usize,
        /// The transaction's index in the block.
        tx: usize,
    },
    /// Commit everything lane `lane` holds; report with [`LanePlan::committed`].
    Commit {
        /// The lane.
        lane: usize,
    },
}

#[derive(Clone, Debug, Default)]
struct Lane {
    busy: bool,
    /// The transactions it holds uncommitted.
    held: Vec<usize>,
}

/// The plan of one block's execution on lanes.
#[derive(Debug)]
pub struct LanePlan<'g> {
    graph: &'g DependencyGraph,
    scheduler: Scheduler<'g>,
    lanes: Vec<Lane>,
    /// The lane holding each transaction uncommitted.
    holder: Vec<Option<usize>>,
    /// Ready transactions not placed yet, lowest index first.
    waiting: BTreeSet<usize>,
    /// Transactions that complete without a lane.
    no_work: Vec<bool>,
    cap: usize,
}

impl<'g> LanePlan<'g> {
    /// A plan over `lanes` lanes (at least one) holding at most `cap` transactions each (at least
    /// one); `no_work[i]` marks the transactions that need no database work.
    pub fn new(graph: &'g DependencyGraph, lanes: usize, cap: usize, no_work: &[bool]) -> Self {
        LanePlan {
            graph,
            scheduler: Scheduler::new(graph),
            lanes: vec![Lane::default(); lanes.max(1)],
            holder: vec![None; graph.len()],
            waiting: BTreeSet::new(),
            no_work: (0..graph.len())
                .map(|i| no_work.get(i).copied().unwrap_or(false))
                .collect(),
            cap: cap.max(1),
        }
    }

    /// The steps to start now; their lanes are busy until reported back.
    ///
    /// Called after every reported step, so it costs what the free lanes need, not what waits:
    /// the scan over the waiting transactions stops once no lane is free, since nothing after
    /// that point could start or commit (a block of 1 024 ready transactions would otherwise be
    /// scanned again at each of its 1 024 steps).
    pub fn steps(&mut self) -> Vec<Step> {
        self.take_ready();
        let mut steps = Vec::new();
        let mut claimed = vec![false; self.lanes.len()];
        let mut free_left = self.lanes.iter().filter(|l| !l.busy).count();
        let mut started = Vec::new();
        // The lanes holding a transaction's uncommitted predecessors, ascending, each once.
        let mut needed: Vec<usize> = Vec::new();
        for &tx in &self.waiting {
            if free_left == 0 {
                break;
            }
            needed.clear();
            needed.extend(self.graph.predecessors(tx).filter_map(|p| self.holder[p]));
            needed.sort_unstable();
            needed.dedup();
            let free =
                |lane: usize, lanes: &[Lane], claimed: &[bool]| !lanes[lane].busy && !claimed[lane];
            let target = match needed.len() {
                0 => (0..self.lanes.len())
                    .filter(|&l| free(l, &self.lanes, &claimed))
                    // The emptiest free lane: spreads independent work, keeps chains apart.
                    .min_by_key(|&l| self.lanes[l].held.len()),
                1 => Some(needed[0]).filter(|&l| free(l, &self.lanes, &claimed)),
                _ => {
                    // All but one of the lanes must commit first; keep the one that holds most
                    // (if it is idle it commits as well below: no idle lane holds locks that a
                    // running transaction might wait for).
                    let keep = needed
                        .iter()
                        .copied()
                        .max_by_key(|&l| self.lanes[l].held.len());
                    for &l in &needed {
                        if Some(l) != keep && free(l, &self.lanes, &claimed) {
                            claimed[l] = true;
                            free_left -= 1;
                            steps.push(Step::Commit { lane: l });
                        }
                    }
                    None
                }
            };
            let Some(lane) = target else { continue };
            claimed[lane] = true;
            free_left -= 1;
            if self.lanes[lane].held.len() >= self.cap {
                steps.push(Step::Commit { lane });
                continue;
            }
            started.push(tx);
            steps.push(Step::Run { lane, tx });
        }
        for tx in started {
            self.waiting.remove(&tx);
        }
        // A lane with nothing to run gives up its locks.
        for (lane, state) in self.lanes.iter().enumerate() {
            if !state.busy && !claimed[lane] && !state.held.is_empty() {
                claimed[lane] = true;
                steps.push(Step::Commit { lane });
            }
        }
        for step in &steps {
            let (Step::Run { lane, .. } | Step::Commit { lane }) = *step;
            self.lanes[lane].busy = true;
        }
        steps
    }

    /// Transaction `tx` ran on `lane` (successfully or flagged as aborted): the lane holds it
    /// until it commits.
    ///
    /// # Panics
    /// If `tx` was not started on `lane` by [`LanePlan::steps`] (a bug in the driver).
    pub fn ran(&mut self, lane: usize, tx: usize) {
        let completed = self.scheduler.complete(tx);
        assert!(completed.is_ok(), "{completed:?}");
        self.lanes[lane].busy = false;
        self.lanes[lane].held.push(tx);
        self.holder[tx] = Some(lane);
    }

    /// `lane` committed everything it held.
    pub fn committed(&mut self, lane: usize) {
        let state = &mut self.lanes[lane];
        state.busy = false;
        for tx in state.held.drain(..) {
            self.holder[tx] = None;
        }
    }

    /// Whether every transaction ran and every lane committed.
    pub fn is_finished(&self) -> bool {
        self.scheduler.is_finished()
            && self.waiting.is_empty()
            && self.lanes.iter().all(|l| !l.busy && l.held.is_empty())
    }

    /// The lane holding `tx` uncommitted, if any.
    pub fn holder(&self, tx: usize) -> Option<usize> {
        self.holder[tx]
    }

    fn take_ready(&mut self) {
        while let Some(tx) = self.scheduler.pop_ready() {
            if self.no_work[tx] {
                let completed = self.scheduler.complete(tx);
                debug_assert!(completed.is_ok(), "{completed:?}");
            } else {
                self.waiting.insert(tx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chainify_core::rwset::{KeyRange, KeySet, KeyValue, ReadWriteSet, Resource};
    use proptest::prelude::*;

    use super::*;

    fn set(reads: &[i64], writes: &[i64]) -> ReadWriteSet {
        let t = Resource {
            name: "t".into(),
            arity: 1,
        };
        let point = |k: &i64| KeySet::Ranges(vec![KeyRange::point(vec![KeyValue::Int(*k)])]);
        let mut s = ReadWriteSet::default();
        for k in reads {
            s.read(&t, &point(k));
        }
        for k in writes {
            s.write(&t, &point(k));
        }
        s
    }

    /// Drives the plan to the end, finishing the in-flight steps in the order `pick` chooses,
    /// and checks the lane rule at every start. Returns the number of commits.
    fn drive(
        graph: &DependencyGraph,
        lanes: usize,
        cap: usize,
        no_work: &[bool],
        mut pick: impl FnMut(usize) -> usize,
    ) -> usize {
        let mut plan = LanePlan::new(graph, lanes, cap, no_work);
        let mut in_flight: Vec<Step> = Vec::new();
        let mut ran = vec![false; graph.len()];
        let mut committed = vec![false; graph.len()];
        let mut commits = 0;
        loop {
            for step in plan.steps() {
                if let Step::Run { lane, tx } = step {
                    assert!(!no_work[tx], "{tx} needs no lane");
                    for p in graph.predecessors(tx) {
                        assert!(
                            ran[p] || no_work[p],
                            "{tx} started before its predecessor {p} ran"
                        );
                        assert!(
                            committed[p] || no_work[p] || plan.holder(p) == Some(lane),
                            "{tx} on lane {lane} cannot see {p}, uncommitted on {:?}",
                            plan.holder(p)
                        );
                    }
                }
                assert!(
                    !in_flight.iter().any(|s| {
                        let (Step::Run { lane: a, .. } | Step::Commit { lane: a }) = *s;
                        let (Step::Run { lane: b, .. } | Step::Commit { lane: b }) = step;
                        a == b
                    }),
                    "two steps at once on one lane"
                );
                in_flight.push(step);
            }
            if in_flight.is_empty() {
                break;
            }
            match in_flight.remove(pick(in_flight.len())) {
                Step::Run { lane, tx } => {
                    ran[tx] = true;
                    plan.ran(lane, tx);
                }
                Step::Commit { lane } => {
                    for (tx, done) in committed.iter_mut().enumerate() {
                        if plan.holder(tx) == Some(lane) {
                            *done = true;
                        }
                    }
                    commits += 1;
                    plan.committed(lane);
                }
            }
        }
        assert!(plan.is_finished(), "the plan stalled");
        for tx in 0..graph.len() {
            assert!(
                no_work[tx] || (ran[tx] && committed[tx]),
                "{tx} not run and committed"
            );
        }
        commits
    }

    #[test]
    fn a_chain_stays_on_one_lane_and_commits_once() {
        let sets: Vec<ReadWriteSet> = (0..10).map(|_| set(&[1], &[1])).collect();
        let graph = DependencyGraph::build(&sets.iter().map(Some).collect::<Vec<_>>());
        assert_eq!(drive(&graph, 4, 64, &[false; 10], |_| 0), 1);
    }

    #[test]
    fn independent_transactions_commit_once_per_lane_at_most_per_cap() {
        let sets: Vec<ReadWriteSet> = (0..40).map(|k| set(&[], &[k])).collect();
        let graph = DependencyGraph::build(&sets.iter().map(Some).collect::<Vec<_>>());
        let commits = drive(&graph, 4, 64, &[false; 40], |_| 0);
        assert!(commits <= 40 / 2, "{commits} commits for 40 transactions");
        // A cap of 5 holds no more than 5 in a lane.
        let capped = drive(&graph, 1, 5, &[false; 40], |_| 0);
        assert_eq!(capped, 8);
    }

    #[test]
    fn a_join_of_two_lanes_commits_one_of_them_first() {
        // 0 and 1 independent, 2 reads both.
        let sets = [set(&[], &[1]), set(&[], &[2]), set(&[1, 2], &[3])];
        let graph = DependencyGraph::build(&sets.iter().map(Some).collect::<Vec<_>>());
        drive(&graph, 2, 64, &[false; 3], |_| 0);
        drive(&graph, 2, 64, &[false; 3], |n| n - 1);
    }

    #[test]
    fn work_free_transactions_take_no_lane() {
        let sets = [set(&[], &[1]), set(&[1], &[2]), set(&[2], &[])];
        let graph = DependencyGraph::build(&sets.iter().map(Some).collect::<Vec<_>>());
        drive(&graph, 2, 64, &[true, true, false], |_| 0);
        drive(&graph, 2, 64, &[true; 3], |_| 0);
    }

    proptest! {
        /// Random blocks over few keys (many conflicts), random lanes, caps and completion
        /// orders: every start obeys the lane rule, nothing stalls, everything commits.
        #[test]
        fn every_start_sees_its_predecessors_and_the_plan_drains(
            txs in proptest::collection::vec(
                (proptest::collection::vec(0i64..6, 0..3), proptest::collection::vec(0i64..6, 0..3)),
                0..40,
            ),
            lanes in 1usize..6,
            cap in 1usize..8,
            no_work_mask in any::<u64>(),
            picks in proptest::collection::vec(any::<usize>(), 0..200),
        ) {
            let sets: Vec<ReadWriteSet> = txs.iter().map(|(r, w)| set(r, w)).collect();
            let graph = DependencyGraph::build(&sets.iter().map(Some).collect::<Vec<_>>());
            // Work-free transactions stand for resumed ones: closed under predecessors.
            let mut no_work = vec![false; sets.len()];
            for i in 0..sets.len() {
                no_work[i] = no_work_mask >> (i % 64) & 1 == 1
                    && graph.predecessors(i).all(|p| no_work[p]);
            }
            let mut picks = picks.into_iter();
            drive(&graph, lanes, cap, &no_work, |n| picks.next().unwrap_or(0) % n);
        }
    }
}
