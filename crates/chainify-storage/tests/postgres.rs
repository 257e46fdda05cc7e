//! The conformance suite on a real postgres server, plus postgres-specific faults.

mod common;

use common::PgFixture;

chainify_storage::conformance_tests!(PgFixture);

use chainify_storage::conformance::database_lost_mid_block;
use chainify_storage::{Postgres, StoreOptions};
use sqlx::{AssertSqlSafe, Executor};

#[tokio::test]
async fn unreachable_database_fails_naming_the_url() {
    let options = StoreOptions {
        connect_timeout: std::time::Duration::from_secs(2),
        ..StoreOptions::default()
    };
    let err = Postgres::connect("postgres://chainify:hunter2@127.0.0.1:9/nowhere", &options)
        .await
        .expect_err("nothing listens on port 9");
    let message = err.to_string();
    assert!(
        message.starts_with("cannot connect to postgres://chainify:***@127.0.0.1:9/nowhere: "),
        "{message}"
    );
    assert!(!message.contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_goes_away_mid_block() {
    database_lost_mid_block(&PgFixture, "lost", || async {
        let admin = PgFixture::url("lost").replace("/ct_lost", "/postgres");
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
            .await
            .expect("admin connection");
        conn.execute(AssertSqlSafe(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'ct_lost'",
        ))
        .await
        .expect("terminate");
    })
    .await;
}
