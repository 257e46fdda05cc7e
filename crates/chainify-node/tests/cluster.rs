//! The Whatever-Voting pipeline end to end: organizations on PostgreSQL, MariaDB and SQLite,
//! each with its own node, behind the in-process orderer.

use std::time::Duration;

use chainify_core::{BlockNumber, OrgId};
use chainify_orderer::LocalOrderer;
use chainify_storage::{AnyBackend, Store};
use chainify_testkit::cluster::Cluster;
use chainify_testkit::engines::*;
use chainify_testkit::smallbank::*;

const ACCOUNTS: u64 = 200;
const WAIT: Duration = Duration::from_secs(120);

fn local(
    spec: &chainify_testkit::cluster::ClusterSpec,
) -> chainify_testkit::cluster::SharedOrderer<LocalOrderer> {
    shared(LocalOrderer::start(
        spec.network.network_id.clone(),
        spec.network.max_block_txs,
        spec.network.batch_timeout,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heterogeneous_orgs_agree_under_any_2_and_all_3() {
    for policy in ["any-2", "all"] {
        let test = format!("het_{}", policy.replace('-', ""));
        let urls = smallbank_dbs(&test, &["postgres", "mariadb", "sqlite"], ACCOUNTS).await;
        let mut spec = spec(&test, policy, &urls, 100);
        // Without pipelining (the paper's behaviour) and three blocks ahead.
        spec.settings.pipeline_depth = if policy == "any-2" { 0 } else { 3 };
        let orderer = local(&spec);
        let cluster = Cluster::start(spec, orderer).await.expect("start");
        let mut workload = smallbank(ACCOUNTS, 1);
        let ids = drive(&cluster, &mut workload, 3000).await;
        let orgs = cluster.orgs();
        cluster
            .wait_committed(&orgs, &ids, WAIT)
            .await
            .expect("committed");
        let blocks = cluster.check_consistent(&orgs).await.expect("consistent");
        assert!(blocks >= 30, "{policy}: {blocks} blocks");
        let oracle = smallbank_db("sqlite", &format!("{test}_oracle"), ACCOUNTS).await;
        cluster
            .check_against_serial(OrgId(1), &oracle)
            .await
            .expect("serial oracle");
        let succeeded = ids
            .iter()
            .filter(|id| cluster.outcome(OrgId(2), id).expect("outcome").success)
            .count();
        assert!(
            succeeded > 1500,
            "{policy}: {succeeded} of 3000 committed successfully"
        );
        for status in cluster.statuses().values() {
            assert!(status.alarms.is_empty(), "{status:?}");
            assert!(status.recoveries.is_empty(), "{status:?}");
        }
        cluster.shutdown().await.expect("shutdown");
    }
}

/// A direct UPDATE on one organization's database shows in its next vote; it recovers from its
/// checkpoint and agrees again while the others go on. Pipelined execution (two blocks ahead)
/// is discarded through the same recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_org_recovers_while_the_others_go_on() {
    let urls = smallbank_dbs("tamper", &["postgres", "mariadb", "sqlite"], ACCOUNTS).await;
    let mut spec = spec("tamper", "any-2", &urls, 50);
    spec.settings.pipeline_depth = 2;
    let orderer = local(&spec);
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let mut workload = smallbank(ACCOUNTS, 2);
    let orgs = cluster.orgs();
    let first = drive(&cluster, &mut workload, 400).await;
    cluster
        .wait_committed(&orgs, &first, WAIT)
        .await
        .expect("committed");
    cluster
        .tamper(
            OrgId(2),
            "UPDATE checking SET bal = bal + 1000 WHERE custid = 3",
        )
        .await
        .expect("tamper");
    let second = drive(&cluster, &mut workload, 400).await;
    cluster
        .wait_committed(&orgs, &second, WAIT)
        .await
        .expect("committed after the tampering");
    let statuses = cluster.statuses();
    let tampered = &statuses[&OrgId(2)];
    assert_eq!(tampered.recoveries.len(), 1, "{tampered:?}");
    let report = &tampered.recoveries[0];
    assert!(
        report.checkpoint.is_some_and(|c| c < report.block),
        "{report:?}"
    );
    for org in [OrgId(1), OrgId(3)] {
        assert!(statuses[&org].recoveries.is_empty(), "{:?}", statuses[&org]);
    }
    cluster.check_consistent(&orgs).await.expect("consistent");
    let oracle = smallbank_db("sqlite", "tamper_oracle", ACCOUNTS).await;
    cluster
        .check_against_serial(OrgId(2), &oracle)
        .await
        .expect("the repaired org equals a serial replay");
    cluster.shutdown().await.expect("shutdown");
}

/// Changes that bypass the digest triggers (PostgreSQL: the trigger disabled; SQLite: dropped)
/// on a table no block writes: the votes still agree, so only the integrity checks can see them.
/// The broken triggers are reinstalled before the next block, the full scan that follows
/// raises an alarm naming the table, and the organization repairs its tables from a checkpoint
/// verified against the agreed state digest; the honest organization raises nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_bypass_is_caught_within_one_check_interval() {
    let urls = smallbank_dbs("bypass", &["postgres", "mariadb", "sqlite"], ACCOUNTS).await;
    let mut spec = spec("bypass", "any-2", &urls, 50);
    spec.settings.state_check_interval = 3;
    let orderer = local(&spec);
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let mut workload = smallbank(ACCOUNTS, 3);
    let orgs = cluster.orgs();
    let first = drive(&cluster, &mut workload, 200).await;
    cluster
        .wait_committed(&orgs, &first, WAIT)
        .await
        .expect("committed");
    for status in cluster.statuses().values() {
        assert!(status.alarms.is_empty(), "{status:?}");
    }
    // Smallbank only reads `accounts`: no block repairs or records these rows.
    cluster
        .tamper(
            OrgId(1),
            "ALTER TABLE accounts DISABLE TRIGGER chainify_dg_accounts; \
             UPDATE accounts SET name = 'mallory' WHERE custid = 3",
        )
        .await
        .expect("tamper postgres");
    cluster
        .tamper(
            OrgId(3),
            "DROP TRIGGER chainify_dg_accounts_au; \
             UPDATE accounts SET name = 'mallory' WHERE custid = 4",
        )
        .await
        .expect("tamper sqlite");
    let caught = |org: OrgId| {
        let alarms = cluster.status(org).expect("status").alarms;
        let reinstalled = alarms
            .iter()
            .any(|a| a.contains("reinstalled the digest triggers of accounts"));
        let scanned = alarms
            .iter()
            .any(|a| a.contains("table(s) accounts differ from the state digest"));
        reinstalled && scanned
    };
    // A scan's finding comes with a later block: keep blocks coming, at most a few intervals.
    let mut rounds = 0;
    while !(caught(OrgId(1)) && caught(OrgId(3))) {
        rounds += 1;
        assert!(rounds <= 20, "not caught: {:?}", cluster.statuses());
        let more = drive(&cluster, &mut workload, 100).await;
        cluster
            .wait_committed(&orgs, &more, WAIT)
            .await
            .expect("committed after the tampering");
    }
    // Caught, then repaired: a verified full restore of a checkpoint and a replay.
    let repaired = |org: OrgId| cluster.status(org).expect("status").repairs_total >= 1;
    while !(repaired(OrgId(1)) && repaired(OrgId(3))) {
        rounds += 1;
        assert!(rounds <= 40, "not repaired: {:?}", cluster.statuses());
        let more = drive(&cluster, &mut workload, 100).await;
        cluster
            .wait_committed(&orgs, &more, WAIT)
            .await
            .expect("committed while repairing");
    }
    let last = drive(&cluster, &mut workload, 100).await;
    cluster
        .wait_committed(&orgs, &last, WAIT)
        .await
        .expect("committed after the repair");
    cluster
        .check_consistent(&orgs)
        .await
        .expect("the repaired organizations hold the same tables again");
    for org in &orgs {
        let check = cluster
            .store(*org)
            .expect("store")
            .check_state()
            .await
            .expect("scan");
        assert!(check.agrees(), "organization {org}: {check:?}");
    }
    let honest = cluster.status(OrgId(2)).expect("status");
    assert!(honest.alarms.is_empty(), "{honest:?}");
    assert_eq!(honest.repairs_total, 0);
    let metrics = cluster.metrics(OrgId(1)).expect("metrics");
    assert!(
        metrics
            .state_mismatches
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    for org in [OrgId(1), OrgId(3)] {
        let store = cluster.store(org).expect("store");
        assert_eq!(
            store.check_triggers().await.expect("catalog"),
            vec![],
            "organization {org}: the triggers are whole again"
        );
    }
    cluster.shutdown().await.expect("shutdown");
}

/// A broken digest trigger that cannot be reinstalled (a reader's snapshot holds the table, so
/// `DROP TRIGGER` times out on PostgreSQL and MariaDB) holds the block back instead of letting
/// it run unrecorded; the failure is reported, and once the reader is gone the trigger is
/// reinstalled and the blocks run with every change recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_that_cannot_be_reinstalled_holds_the_block_back() {
    use chainify_storage::ddl::ReadType;
    use chainify_storage::{Backend, Conn};
    let urls = smallbank_dbs("reinstall", &["postgres", "mariadb"], ACCOUNTS).await;
    let mut spec = spec("reinstall", "all", &urls, 50);
    // MariaDB's lock wait has a one-second minimum.
    spec.store_options.lock_timeout = Duration::from_secs(1);
    let orderer = local(&spec);
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let mut workload = smallbank(ACCOUNTS, 5);
    let orgs = cluster.orgs();
    let first = drive(&cluster, &mut workload, 40).await;
    cluster
        .wait_committed(&orgs, &first, WAIT)
        .await
        .expect("committed");
    cluster
        .tamper(
            OrgId(1),
            "ALTER TABLE savings DISABLE TRIGGER chainify_dg_savings",
        )
        .await
        .expect("tamper postgres");
    cluster
        .tamper(OrgId(2), "DROP TRIGGER chainify_dg_savings_au")
        .await
        .expect("tamper mariadb");
    let mut readers = Vec::new();
    for org in &orgs {
        let store = cluster.store(*org).expect("store");
        let mut reader = store.backend().acquire().await.expect("conn");
        reader.begin_read_snapshot().await.expect("begin");
        reader
            .query("SELECT COUNT(*) FROM savings", &[], &[ReadType::Int])
            .await
            .expect("read");
        readers.push(reader);
    }
    let held_at: Vec<_> = orgs
        .iter()
        .map(|o| cluster.status(*o).expect("status").executed)
        .collect();
    let more = drive(&cluster, &mut workload, 40).await;
    let failed = |org: OrgId| {
        cluster
            .status(org)
            .expect("status")
            .last_error
            .is_some_and(|e| e.contains("reinstall") || e.contains("lock"))
    };
    let mut waited = 0;
    while !orgs.iter().all(|o| failed(*o)) {
        waited += 1;
        assert!(
            waited <= 300,
            "no reinstall failed: {:?}",
            cluster.statuses()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now: Vec<_> = orgs
        .iter()
        .map(|o| cluster.status(*o).expect("status").executed)
        .collect();
    assert_eq!(now, held_at, "a block ran without its trigger");
    for reader in &mut readers {
        reader.rollback().await.expect("end");
    }
    drop(readers);
    cluster
        .wait_committed(&orgs, &more, WAIT)
        .await
        .expect("committed once the trigger is back");
    for org in &orgs {
        let status = cluster.status(*org).expect("status");
        for wanted in [
            "reinstalling the digest triggers of savings failed",
            "reinstalled the digest triggers of savings",
        ] {
            assert!(
                status.alarms.iter().any(|a| a.contains(wanted)),
                "organization {org}: no alarm {wanted:?}: {:?}",
                status.alarms
            );
        }
        let store = cluster.store(*org).expect("store");
        assert_eq!(store.check_triggers().await.expect("catalog"), vec![]);
        let check = store.check_state().await.expect("scan");
        assert!(check.agrees(), "organization {org}: {check:?}");
    }
    cluster
        .check_consistent(&orgs)
        .await
        .expect("the same tables");
    cluster.shutdown().await.expect("shutdown");
}

/// A trigger check that itself fails (here SQLite's catalog holds a foreign trigger whose text
/// is not UTF-8, so it cannot be read) holds the block back instead of letting it run with its
/// triggers unknown; once the catalog reads again, the blocks run and the failure is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_check_that_fails_holds_the_block_back() {
    let urls = smallbank_dbs("checkfails", &["sqlite"], ACCOUNTS).await;
    let spec = spec("checkfails", "any-1", &urls, 50);
    let orderer = local(&spec);
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let mut workload = smallbank(ACCOUNTS, 6);
    let orgs = cluster.orgs();
    let first = drive(&cluster, &mut workload, 20).await;
    cluster
        .wait_committed(&orgs, &first, WAIT)
        .await
        .expect("committed");
    // The trigger's string literal 'zz' becomes 'z\xFF': SQLite still parses the schema, but
    // the catalog text no longer decodes.
    cluster
        .tamper(
            OrgId(1),
            "CREATE TRIGGER zz_foreign AFTER UPDATE ON accounts BEGIN SELECT 'zz'; END; \
             PRAGMA writable_schema = ON; \
             UPDATE sqlite_master SET sql = replace(sql, 'zz''', 'z' || CAST(X'FF27' AS TEXT)) \
             WHERE name = 'zz_foreign'; \
             PRAGMA writable_schema = OFF",
        )
        .await
        .expect("tamper");
    let held_at = cluster.status(OrgId(1)).expect("status").executed;
    let more = drive(&cluster, &mut workload, 20).await;
    let mut waited = 0;
    while !cluster
        .status(OrgId(1))
        .expect("status")
        .last_error
        .is_some_and(|e| e.contains("checking the digest triggers"))
    {
        waited += 1;
        assert!(waited <= 300, "no failed check: {:?}", cluster.statuses());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        cluster.status(OrgId(1)).expect("status").executed,
        held_at,
        "a block ran with its triggers unknown"
    );
    cluster
        .tamper(OrgId(1), "DROP TRIGGER zz_foreign")
        .await
        .expect("untamper");
    cluster
        .wait_committed(&orgs, &more, WAIT)
        .await
        .expect("committed once the catalog reads again");
    let status = cluster.status(OrgId(1)).expect("status");
    assert!(
        status
            .alarms
            .iter()
            .any(|a| a.contains("checking the digest triggers failed")),
        "{:?}",
        status.alarms
    );
    cluster.shutdown().await.expect("shutdown");
}

/// chainify's record of applied blocks damaged behind it (MariaDB: every accumulator
/// overwritten with a byte that is none; SQLite: an applied block far ahead planted with
/// well-formed accumulators). The next block cannot run there, and running it again would
/// fail the same way for ever: the organization names the damage, repairs its tables from a
/// verified checkpoint (which rewrites the record) and agrees again, while the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_of_applied_blocks_is_repaired_not_retried_for_ever() {
    let urls = smallbank_dbs("damaged", &["postgres", "mariadb", "sqlite"], ACCOUNTS).await;
    let spec = spec("damaged", "any-2", &urls, 50);
    let orderer = local(&spec);
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let mut workload = smallbank(ACCOUNTS, 8);
    let orgs = cluster.orgs();
    let first = drive(&cluster, &mut workload, 300).await;
    cluster
        .wait_committed(&orgs, &first, WAIT)
        .await
        .expect("committed");
    let damages = [
        (
            OrgId(2),
            "UPDATE chainify_state SET lanes = X'00'",
            "chainify_state holds a bad accumulator",
        ),
        (
            OrgId(3),
            "INSERT INTO chainify_state (block, table_name, lanes) \
             SELECT block + 1000, table_name, lanes FROM chainify_state \
             WHERE block = (SELECT MAX(block) FROM chainify_applied_blocks); \
             INSERT INTO chainify_applied_blocks (block, digest, success, tx_count) \
             SELECT block + 1000, digest, success, tx_count FROM chainify_applied_blocks \
             WHERE block = (SELECT MAX(block) FROM chainify_applied_blocks)",
            "blocks must be applied in order",
        ),
    ];
    for (org, sql, named) in damages {
        cluster.tamper(org, sql).await.expect("damage");
        let more = drive(&cluster, &mut workload, 200).await;
        cluster
            .wait_committed(&orgs, &more, WAIT)
            .await
            .expect("committed by every organization after the damage");
        let status = cluster.status(org).expect("status");
        assert!(status.repairs_total >= 1, "organization {org}: {status:?}");
        assert!(
            status
                .alarms
                .iter()
                .any(|a| a.contains(named) && a.contains("repairing the tables from a checkpoint")),
            "organization {org}: {:?}",
            status.alarms
        );
    }
    let honest = cluster.status(OrgId(1)).expect("status");
    assert!(honest.alarms.is_empty(), "{honest:?}");
    assert_eq!(honest.repairs_total, 0);
    cluster.check_consistent(&orgs).await.expect("consistent");
    for org in &orgs {
        let check = cluster
            .store(*org)
            .expect("store")
            .check_state()
            .await
            .expect("scan");
        assert!(check.agrees(), "organization {org}: {check:?}");
    }
    cluster.shutdown().await.expect("shutdown");
}

/// Found by a hunt: a DBA's `=` for two VARCHARs (which PostgreSQL prefers to its own for
/// chainify's statements, the digest triggers and restores alike) holds every block back,
/// named, instead of making this organization compute otherwise with every check clean; once
/// it is removed, the blocks run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_that_shadows_the_built_in_one_holds_the_block_back() {
    let urls = smallbank_dbs("shadowed", &["postgres"], ACCOUNTS).await;
    let spec = spec("shadowed", "any-1", &urls, 50);
    let orderer = local(&spec);
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let mut workload = smallbank(ACCOUNTS, 9);
    let orgs = cluster.orgs();
    let first = drive(&cluster, &mut workload, 20).await;
    cluster
        .wait_committed(&orgs, &first, WAIT)
        .await
        .expect("committed");
    cluster
        .tamper(
            OrgId(1),
            "CREATE FUNCTION public.zz_eq(varchar, varchar) RETURNS boolean LANGUAGE sql \
             IMMUTABLE AS 'SELECT length($1) = length($2)'; \
             CREATE OPERATOR public.= (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.zz_eq)",
        )
        .await
        .expect("tamper");
    let held_at = cluster.status(OrgId(1)).expect("status").executed;
    let more = drive(&cluster, &mut workload, 20).await;
    let mut waited = 0;
    while !cluster
        .status(OrgId(1))
        .expect("status")
        .last_error
        .is_some_and(|e| e.contains("operator public.= (character varying, character varying)"))
    {
        waited += 1;
        assert!(waited <= 300, "not held: {:?}", cluster.statuses());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        cluster.status(OrgId(1)).expect("status").executed,
        held_at,
        "a block ran with the operator in place"
    );
    cluster
        .tamper(
            OrgId(1),
            "DROP OPERATOR public.= (varchar, varchar); DROP FUNCTION public.zz_eq(varchar, varchar)",
        )
        .await
        .expect("untamper");
    cluster
        .wait_committed(&orgs, &more, WAIT)
        .await
        .expect("committed once it is removed");
    let status = cluster.status(OrgId(1)).expect("status");
    assert!(
        status
            .alarms
            .iter()
            .any(|a| a.contains("could be used instead of PostgreSQL's own")),
        "{:?}",
        status.alarms
    );
    cluster.shutdown().await.expect("shutdown");
}

/// An organization killed mid-block restarts, catches up and agrees; nothing is lost or
/// applied twice (its state equals a serial replay of the agreed blocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_killed_mid_block_restarts_and_catches_up() {
    let urls = smallbank_dbs("crash", &["postgres", "mariadb", "sqlite"], ACCOUNTS).await;
    let spec = spec("crash", "any-2", &urls, 50);
    let orderer = local(&spec);
    let mut cluster = Cluster::start(spec, orderer).await.expect("start");
    let mut workload = smallbank(ACCOUNTS, 3);
    let mut ids = drive(&cluster, &mut workload, 1500).await;
    cluster
        .wait_until("organization 1 at block 4", WAIT, |s| {
            s[&OrgId(1)].next_block.0 >= 4
        })
        .await
        .expect("progress");
    cluster.crash(OrgId(1)).await.expect("crash");
    let at_crash = cluster.status(OrgId(1)).expect("status").next_block;
    ids.extend(drive(&cluster, &mut workload, 300).await);
    cluster
        .wait_committed(&[OrgId(2), OrgId(3)], &ids, WAIT)
        .await
        .expect("the others go on under Any-2");
    cluster.restart(OrgId(1)).await.expect("restart");
    let orgs = cluster.orgs();
    cluster
        .wait_committed(&orgs, &ids, WAIT)
        .await
        .expect("caught up");
    assert!(at_crash.0 < 30, "crashed before the end ({at_crash})");
    cluster.check_consistent(&orgs).await.expect("consistent");
    let oracle = smallbank_db("sqlite", "crash_oracle", ACCOUNTS).await;
    cluster
        .check_against_serial(OrgId(1), &oracle)
        .await
        .expect("the restarted org equals a serial replay");
    for status in cluster.statuses().values() {
        assert!(status.alarms.is_empty(), "{status:?}");
    }
    cluster.shutdown().await.expect("shutdown");
}

/// With one organization down, Any-2 keeps committing; All-3 waits and resumes when it
/// returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_2_goes_on_with_an_org_down_and_all_3_waits_for_it() {
    for policy in ["any-2", "all"] {
        let test = format!("down_{}", policy.replace('-', ""));
        let urls = smallbank_dbs(&test, &["postgres", "mariadb", "sqlite"], ACCOUNTS).await;
        let spec = spec(&test, policy, &urls, 50);
        let orderer = local(&spec);
        let mut cluster = Cluster::start(spec, orderer).await.expect("start");
        let mut workload = smallbank(ACCOUNTS, 4);
        let orgs = cluster.orgs();
        let first = drive(&cluster, &mut workload, 100).await;
        cluster
            .wait_committed(&orgs, &first, WAIT)
            .await
            .expect("committed");
        cluster.stop(OrgId(3)).await.expect("stop");
        let before = cluster.status(OrgId(1)).expect("status").next_block;
        let second = drive(&cluster, &mut workload, 300).await;
        let up = [OrgId(1), OrgId(2)];
        if policy == "any-2" {
            cluster
                .wait_committed(&up, &second, WAIT)
                .await
                .expect("Any-2 commits with two organizations");
        } else {
            let waited = cluster
                .wait_until(
                    "any progress without organization 3",
                    Duration::from_secs(3),
                    |s| s[&OrgId(1)].next_block > before || s[&OrgId(2)].next_block > before,
                )
                .await;
            assert!(
                waited.is_err(),
                "All-3 must not append without organization 3"
            );
        }
        cluster.restart(OrgId(3)).await.expect("restart");
        cluster
            .wait_committed(&orgs, &second, WAIT)
            .await
            .expect("everyone commits once organization 3 is back");
        cluster.check_consistent(&orgs).await.expect("consistent");
        cluster.shutdown().await.expect("shutdown");
    }
}

/// An organization cut off from the votes executes but cannot append; once the partition heals
/// it gets the certificates and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_org_catches_up_when_healed() {
    let urls = smallbank_dbs("partition", &["sqlite", "sqlite", "sqlite"], ACCOUNTS).await;
    let spec = spec("partition", "any-2", &urls, 25);
    let orderer = local(&spec);
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let mut workload = smallbank(ACCOUNTS, 5);
    let orgs = cluster.orgs();
    cluster.partition(OrgId(2));
    let ids = drive(&cluster, &mut workload, 300).await;
    cluster
        .wait_committed(&[OrgId(1), OrgId(3)], &ids, WAIT)
        .await
        .expect("the others agree");
    assert_eq!(
        cluster.status(OrgId(2)).expect("status").next_block.0,
        1,
        "nothing is appended without agreement"
    );
    cluster.heal(OrgId(2));
    cluster
        .wait_committed(&orgs, &ids, WAIT)
        .await
        .expect("caught up");
    cluster.check_consistent(&orgs).await.expect("consistent");
    cluster.shutdown().await.expect("shutdown");
}

/// Under All-3 a tampered organization makes agreement impossible: every organization raises an
/// alarm, recovers, and the network waits without appending the block
/// (docs/design/overview.md §2.5). The repaired organization's tables equal the others'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_3_cannot_agree_with_a_tampered_org_and_waits() {
    let urls = smallbank_dbs("impossible", &["sqlite", "sqlite", "sqlite"], ACCOUNTS).await;
    let spec = spec("impossible", "all", &urls, 25);
    let orderer = local(&spec);
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let mut workload = smallbank(ACCOUNTS, 6);
    let orgs = cluster.orgs();
    let first = drive(&cluster, &mut workload, 50).await;
    cluster
        .wait_committed(&orgs, &first, WAIT)
        .await
        .expect("committed");
    cluster
        .tamper(OrgId(3), "DELETE FROM checking WHERE custid = 7")
        .await
        .expect("tamper");
    drive(&cluster, &mut workload, 25).await;
    cluster
        .wait_until("every organization waits", WAIT, |s| {
            s.values()
                .all(|s| matches!(s.state, chainify_commit::State::Waiting { .. }))
        })
        .await
        .expect("waiting");
    for status in cluster.statuses().values() {
        assert_eq!(
            status.state,
            chainify_commit::State::Waiting {
                block: BlockNumber(3)
            },
            "{status:?}"
        );
        assert!(
            status
                .alarms
                .iter()
                .any(|a| a.contains("no agreement is possible")),
            "{status:?}"
        );
        assert_eq!(
            status.next_block.0, 3,
            "block 3 is not appended: {status:?}"
        );
    }
    let blocks = cluster.check_consistent(&orgs).await.expect("consistent");
    assert_eq!(blocks, 2);
    cluster.shutdown().await.expect("shutdown");
}

/// Blocks the orderer cuts while the block before executes (full ones here, cut on demand) are
/// taken ahead, their signatures checked and their SQL analysed meanwhile; the execution uses
/// those analyses and the result is the serial one on every engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_cut_meanwhile_are_prepared_ahead_and_change_nothing() {
    let urls = smallbank_dbs("ahead", &["postgres", "mariadb", "sqlite"], ACCOUNTS).await;
    let spec = spec("ahead", "any-2", &urls, 16);
    let orderer = shared(LocalOrderer::start_cutting(
        spec.network.network_id.clone(),
        spec.network.max_block_txs,
        spec.network.batch_timeout,
        chainify_orderer::Cut::OnDemand,
    ));
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let mut workload = smallbank(ACCOUNTS, 7);
    let ids = drive(&cluster, &mut workload, 1500).await;
    let orgs = cluster.orgs();
    cluster
        .wait_committed(&orgs, &ids, WAIT)
        .await
        .expect("committed");
    cluster.check_consistent(&orgs).await.expect("consistent");
    let oracle = smallbank_db("sqlite", "ahead_oracle", ACCOUNTS).await;
    cluster
        .check_against_serial(OrgId(3), &oracle)
        .await
        .expect("serial oracle");
    for org in &orgs {
        let m = cluster.metrics(*org).expect("running");
        let blocks = m.prepared_ahead.load(std::sync::atomic::Ordering::Relaxed);
        let analysed = m.analysed_ahead.load(std::sync::atomic::Ordering::Relaxed);
        assert!(blocks >= 5, "{org}: {blocks} blocks prepared ahead");
        assert!(
            analysed >= 5 * 16,
            "{org}: {analysed} transactions analysed ahead in {blocks} blocks"
        );
    }
    for status in cluster.statuses().values() {
        assert!(status.alarms.is_empty(), "{status:?}");
    }
    cluster.shutdown().await.expect("shutdown");
}

/// The last block in `store`'s ledger (0 before the first).
async fn ledger_end(store: &Store<AnyBackend>) -> u64 {
    store
        .ledger_tail()
        .await
        .expect("the ledger reads")
        .map_or(0, |(b, _)| b.0)
}

/// What a node tells the world waits for its ledger, whether the append runs in the node's
/// loop or beside the next block: a read at an agreed height sees exactly the blocks of that
/// height, in the database and in the ledger; the height a status reports and every commit
/// event are already in the ledger. Checked while blocks of eight transactions stream through
/// an organization on PostgreSQL, then one on MariaDB, alone under Any-1, where each block is
/// appended as soon as it has executed. Each check must have seen the blocks go by, not just
/// the start and the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_node_reports_never_runs_ahead_of_its_ledger() {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    for engine in ["postgres", "mariadb"] {
        let test = format!("reports_{engine}");
        let urls = smallbank_dbs(&test, &[engine], ACCOUNTS).await;
        let spec = spec(&test, "any-1", &urls, 8);
        let orderer = local(&spec);
        let cluster = Arc::new(Cluster::start(spec, orderer).await.expect("start"));
        let org = OrgId(1);
        let store = cluster.store(org).expect("store");
        let done = Arc::new(AtomicBool::new(false));

        // Reads at a height: the heights they saw.
        let gate = cluster.read_gate(org).expect("running");
        let (db, stop) = (store.clone(), done.clone());
        let reads = tokio::spawn(async move {
            let mut heights = BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                let guard = gate.read().await;
                let applied = db
                    .last_applied_block()
                    .await
                    .expect("reads")
                    .map_or(0, |b| b.0);
                let ledger = ledger_end(&db).await;
                let height = guard.height.map_or(0, |b| b.0);
                drop(guard);
                assert_eq!(
                    applied, height,
                    "{org}: a read at height {height} saw block {applied} applied"
                );
                assert_eq!(
                    ledger, height,
                    "{org}: a read at height {height} with the ledger at {ledger}"
                );
                heights.insert(height);
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            heights
        });
        // The reported height: the heights it reported.
        let (db, stop, c) = (store.clone(), done.clone(), cluster.clone());
        let statuses = tokio::spawn(async move {
            let mut heights = BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                let reported = c
                    .status(org)
                    .expect("status")
                    .next_block
                    .0
                    .saturating_sub(1);
                let ledger = ledger_end(&db).await;
                assert!(
                    reported <= ledger,
                    "{org}: reports block {reported} agreed, its ledger ends at {ledger}"
                );
                heights.insert(reported);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            heights
        });
        // Commit events, from the first block on, each checked as it arrives.
        let mut sub = cluster
            .feed(org)
            .expect("running")
            .subscribe(BlockNumber(1));
        let (db, stop) = (store.clone(), done.clone());
        let events = tokio::spawn(async move {
            let mut blocks: Vec<u64> = Vec::new();
            loop {
                // Once the load is done, up to the ledger's end.
                if stop.load(Ordering::Relaxed)
                    && blocks.last().copied().unwrap_or(0) >= ledger_end(&db).await
                {
                    break;
                }
                let Ok(next) = tokio::time::timeout(Duration::from_millis(200), sub.next()).await
                else {
                    continue;
                };
                let block = next
                    .expect("the feed goes on")
                    .expect("the feed reads")
                    .block
                    .number
                    .0;
                let ledger = ledger_end(&db).await;
                assert!(
                    block <= ledger,
                    "{org}: block {block}'s commit event came with the ledger at {ledger}"
                );
                blocks.push(block);
            }
            blocks
        });

        let mut workload = smallbank(ACCOUNTS, 11);
        let ids = drive(&cluster, &mut workload, 1200).await;
        cluster
            .wait_committed(&[org], &ids, WAIT)
            .await
            .expect("committed");
        done.store(true, Ordering::Relaxed);
        let reads = reads.await.expect("the reads held");
        let statuses = statuses.await.expect("the statuses held");
        let events = events.await.expect("the commit events held");
        let blocks = cluster.check_consistent(&[org]).await.expect("consistent") as u64;
        assert!(blocks >= 100, "{engine}: {blocks} blocks");
        // Seen while the blocks went by.
        assert!(
            reads.len() >= 10,
            "{engine}: reads at heights {reads:?} of {blocks}"
        );
        assert!(
            statuses.len() >= 10,
            "{engine}: reported heights {statuses:?} of {blocks}"
        );
        assert_eq!(
            events,
            (1..=blocks).collect::<Vec<_>>(),
            "{engine}: every block's event once, in order"
        );
        let status = cluster.status(org).expect("status");
        assert!(
            status.alarms.is_empty() && status.recoveries.is_empty(),
            "{status:?}"
        );
        let cluster = Arc::into_inner(cluster).expect("the checkers are done");
        cluster.shutdown().await.expect("shutdown");
    }
}
