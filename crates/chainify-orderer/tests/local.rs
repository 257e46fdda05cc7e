//! The orderer conformance suite on the in-process orderer.

use std::time::Duration;

use chainify_orderer::{Cut, LocalOrderer};
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

#[tokio::test]
async fn cuts_on_demand() {
    conformance::cuts_on_demand(|max, timeout| async move {
        LocalOrderer::start_cutting(network(), max, timeout, Cut::OnDemand)
    })
    .await;
}

/// Cutting on demand changes nothing that the timeout suite checks.
#[tokio::test]
async fn on_demand_passes_the_timeout_suite() {
    let on_demand = |max, timeout| async move {
        LocalOrderer::start_cutting(network(), max, timeout, Cut::OnDemand)
    };
    conformance::cuts_by_count_and_by_timeout(on_demand).await;
    conformance::consumers_agree_and_resume(on_demand).await;
}

#[tokio::test]
async fn looking_ahead_cuts_nothing() {
    conformance::looking_ahead_cuts_nothing(|max, timeout| async move {
        LocalOrderer::start_cutting(network(), max, timeout, Cut::OnDemand)
    })
    .await;
}
