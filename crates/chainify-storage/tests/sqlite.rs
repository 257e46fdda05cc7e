//! The conformance suite on a real sqlite server, plus sqlite-specific faults.

use chainify_testkit::engines::SqliteFixture;

chainify_testkit::storage_conformance_tests!(SqliteFixture);

use chainify_storage::{Sqlite, StoreOptions};

#[tokio::test]
async fn unreachable_database_fails_naming_the_url() {
    let err = Sqlite::connect(
        "sqlite:///nonexistent-chainify-dir/state.db",
        &StoreOptions::default(),
    )
    .await
    .expect_err("the directory does not exist");
    let message = err.to_string();
    assert!(
        message.starts_with("cannot connect to sqlite:///nonexistent-chainify-dir/state.db: "),
        "{message}"
    );
}
