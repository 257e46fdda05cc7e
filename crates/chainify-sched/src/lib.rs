//! chainify-sched: the dependency DAG of a block and the scheduler that runs it in parallel with
//! the same effect as running it serially in block order.
//!
//! # The algorithm
//!
//! Two transactions *conflict* when a write of one overlaps a read or a write of the other
//! ([`ReadWriteSet::conflicts_with`]); transactions that do not conflict commute. So a parallel
//! execution has the effect of the serial one in block order as long as, for every conflicting
//! pair `i < j`, `j` starts only after `i` has finished: every conflict is then resolved the way the
//! serial order resolves it, and the execution is conflict-equivalent to that order. Nothing else
//! needs to be ordered.
//!
//! "`j` after `i`" need not be a direct edge. If the graph has a path `i → k → j`, then `j` waits
//! for `k`, which waited for `i`. [`DependencyGraph::build`] therefore adds only enough edges that
//! *reachability* covers every conflicting pair, in one scan of the block in order:
//!
//! - for each full key (a point access: [`KeyRange::is_point`]), it remembers the last writer and
//!   the readers since that write. A read waits for the last writer. A write waits for the last
//!   writer and the readers since, then becomes the last writer. The writers of a key form a
//!   chain, every reader hangs between two consecutive writers, and so every read-write,
//!   write-read and write-write pair on the key is joined by a path. A hot key written by 1000
//!   transactions costs 999 edges, not 499 500;
//! - ranges and whole-table accesses ([`KeySet::All`]) are handled conservatively: each waits
//!   directly for every earlier range access of its resource it conflicts with, and for the last
//!   writer (a write also for the readers since) of every full key it covers; each point access
//!   waits for every earlier range access that covers it and conflicts. Point accesses keep their
//!   chains, so a conflict between a point and a later range is reached through the chain.
//!
//! Every edge joins a conflicting pair (or a barrier, below) and goes from a lower to a higher
//! index, so the graph is acyclic by construction. The earlier range accesses an access meets are found through an
//! index of the block's ranges (sorted by where they start in key order, with the greatest end
//! below each node of a tree), so ranges that meet nothing cost about `log n` each, and a client
//! sending transactions with a thousand disjoint ranges costs no other range a comparison. Ranges
//! that do meet, and the readers a range write waits for, can still make a block quadratic (every
//! such edge may be needed), so the work is counted: a transaction that would spend more than its
//! share of [`WORK_BUDGET`] becomes a barrier, ordered after everything before it and before
//! everything after it (edges that join pairs which need not conflict, never a missing order),
//! and the transactions around it stay parallel. [`conflict_pairs`] computes the full, unreduced
//! conflict relation with the same indexes; it is what the graph is checked against.
//!
//! The [`Scheduler`] has no stages and no barriers. Running the DAG level by level would make
//! every transaction of a level wait for the slowest one of the level before it, although most of
//! them depend on nothing there. Instead each transaction keeps a count of predecessors that have
//! not finished; it becomes ready the moment its count reaches zero, which is exactly the condition
//! above and nothing more. [`run_block`] drives the scheduler with any async executor (at most `k`
//! transactions in flight, e.g. one per pooled connection); [`run_serial`] is the reference it
//! must agree with.
//!
//! All of this is only as good as the read/write sets: analysis must never under-approximate.
//!
//! # Invariant
//!
//! No I/O and no async runtime: the library is plain data structures and runtime-agnostic futures.
//! It depends on `chainify-core` only; `chainify-storage`'s block executor drives it, the binary's
//! `analyze` prints its conflict pairs, and the benchmarks time it.
//!
//! [`ReadWriteSet::conflicts_with`]: chainify_core::rwset::ReadWriteSet::conflicts_with
//! [`KeyRange::is_point`]: chainify_core::rwset::KeyRange::is_point
//! [`KeySet::All`]: chainify_core::rwset::KeySet::All

mod driver;
mod graph;
mod index;
mod lanes;
mod pairs;
mod scheduler;

pub use driver::{TxExecutor, run_block, run_serial};
pub use graph::{
    DependencyGraph, GraphLimits, MAX_INDEXED_SPANS, MIN_INDEXED_SHARE, MIN_SHARE, SHARES,
    SPAN_COST, WORK_BUDGET,
};
pub use lanes::{LanePlan, Step};
pub use pairs::{conflict_pairs, conflict_pairs_reference};
pub use scheduler::{ScheduleError, Scheduler};
