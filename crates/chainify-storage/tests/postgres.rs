//! The conformance suite on a real postgres server, plus postgres-specific faults.

mod common;

use common::PgFixture;

chainify_storage::conformance_tests!(PgFixture);
