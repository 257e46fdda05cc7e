//! The orderer conformance suite on the in-process orderer.

use std::time::Duration;

use chainify_orderer::LocalOrderer;
use chainify_testkit::conformance::orderer::{self as conformance, network};

async fn local(max: usize, timeout: Duration) -> LocalOrderer {
    LocalOrderer::start(network(), max, timeout)
}

#[tokio::test]
async fn cuts_by_count_and_by_timeout() {
    conformance::cuts_by_count_and_by_timeout(local).await;
}

#[tokio::test]
async fn consumers_agree_and_resume() {
    conformance::consumers_agree_and_resume(local).await;
}
