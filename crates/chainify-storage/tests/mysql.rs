//! The conformance suite on a real mysql server, plus mysql-specific faults.

mod common;

use common::MySqlFixture;

chainify_storage::conformance_tests!(MySqlFixture);

use chainify_storage::conformance::database_lost_mid_block;
use chainify_storage::{MySql, StoreOptions};
use sqlx::{AssertSqlSafe, Executor};

#[tokio::test]
async fn unreachable_database_fails_naming_the_url() {
    let options = StoreOptions {
        connect_timeout: std::time::Duration::from_secs(2),
        ..StoreOptions::default()
    };
    let err = MySql::connect("mysql://chainify:hunter2@127.0.0.1:9/nowhere", &options)
        .await
        .expect_err("nothing listens on port 9");
    let message = err.to_string();
    assert!(
        message.starts_with("cannot connect to mysql://chainify:***@127.0.0.1:9/nowhere: "),
        "{message}"
    );
    assert!(!message.contains("hunter2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_goes_away_mid_block() {
    database_lost_mid_block(&MySqlFixture, "lost", || async {
        let admin = MySqlFixture::url("lost").replace("/ct_lost", "/mysql");
        let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect(&admin)
            .await
            .expect("admin connection");
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST WHERE DB = 'ct_lost'",
        )
        .fetch_all(&mut conn)
        .await
        .expect("processlist");
        for id in ids {
            let _ = conn
                .execute(AssertSqlSafe(format!("KILL CONNECTION {id}")))
                .await;
        }
    })
    .await;
}
