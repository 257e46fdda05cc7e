//! chainify-testkit: what tests, the demo and the benchmarks stand chainify up with.
//!
//! - [`cluster`]: N organizations on any engines in one process, each with its own database,
//!   node and admission, over the in-process vote transport, with fault hooks (tamper, crash,
//!   stop, restart, partition).
//! - [`faulty`]: a misbehaving orderer (reorder, drop, duplicate, forge, equivocate).
//! - [`conformance`]: the suites every storage backend and every orderer passes (the orderer
//!   suite with the feature `testing`: its transactions are signed with seeded keys, which the
//!   binary, linking only the cluster, does not carry).
//! - [`engines`]: one fresh database per test on the test servers or in an SQLite file.
//! - [`smallbank`]: Smallbank networks for tests: specs, the workload, submitting.
//!
//! Where it sits: above `chainify-node`, `chainify-storage` and `chainify-orderer`, which carry
//! no test harness of their own; their integration tests, `chainify demo`, `chainify bench`
//! and `bench/` use it. Of the runtime, only the binary links it (for `demo` and `bench`).

pub mod cluster;
pub mod conformance;
pub mod engines;
pub mod faulty;
pub mod smallbank;
