//! The conformance suite on a real mysql server, plus mysql-specific faults.

mod common;

use common::MySqlFixture;

chainify_storage::conformance_tests!(MySqlFixture);
