//! The conformance suite on a real sqlite server, plus sqlite-specific faults.

mod common;

use common::SqliteFixture;

chainify_storage::conformance_tests!(SqliteFixture);
