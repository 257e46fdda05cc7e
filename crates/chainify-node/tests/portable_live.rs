//! The construct classes that once made an organization diverge for good, live: three
//! organizations on PostgreSQL, MariaDB and SQLite (any-2). Every class is either refused by the
//! analysis a ChainifyServer runs at submission, with a message naming the statement and the
//! construct, or executed and agreed by all three. The refused ones are also ordered anyway (as a
//! colluding organization could): every organization marks them invalid alike. At the end the
//! ledgers and tables are identical, nobody recovered or raised an alarm, and every node runs.

use std::time::Duration;

use chainify_core::tx::{Statement, Transaction};
use chainify_core::{OrgId, Value};
use chainify_orderer::LocalOrderer;
use chainify_sql::Analyzer;
use chainify_storage::{AnyBackend, Backend, Conn, StoreOptions};
use chainify_testkit::cluster::Cluster;
use chainify_testkit::engines::*;
use chainify_testkit::smallbank::*;

const ITEMS: &str = "CREATE TABLE items (k BIGINT NOT NULL PRIMARY KEY, n INTEGER, price DECIMAL(10,2), label VARCHAR(16), note TEXT, flag BOOLEAN)";
const ROWS: [&str; 4] = [
    "INSERT INTO items (k, n, price, label, note, flag) VALUES (1, 7, 1.05, 'abc', 'ABC', TRUE)",
    "INSERT INTO items (k, n, price, label, note, flag) VALUES (2, -2147483648, 2.50, 'é東', 'a b ', FALSE)",
    "INSERT INTO items (k, n, price, label, note, flag) VALUES (3, 2147483647, NULL, 'Z', 'z', NULL)",
    "INSERT INTO items (k, n, price, label, note, flag) VALUES (4, NULL, 0.01, 'a%', NULL, TRUE)",
];

fn tx(sql: &str, params: Vec<Value>) -> Transaction {
    Transaction {
        statements: vec![Statement::new(sql, params)],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_construct_class_is_refused_or_agreed_on_three_engines() {
    let urls = smallbank_dbs("portable_live", &["postgres", "mariadb", "sqlite"], 20).await;
    for url in &urls {
        let backend = AnyBackend::connect(url, &StoreOptions::default())
            .await
            .expect("connect");
        let mut conn = backend.acquire().await.expect("conn");
        // MySQL's TEXT holds 64 KiB; LONGTEXT is the one that matches the others' TEXT.
        let items = if url.starts_with("mysql") {
            ITEMS.replace(" TEXT", " LONGTEXT")
        } else {
            ITEMS.to_owned()
        };
        conn.batch(&items).await.expect("items");
        for r in ROWS {
            conn.batch(r).await.expect("row");
        }
        drop(conn);
        backend.close().await;
    }
    let mut spec = chainify_testkit::cluster::ClusterSpec::generate(
        "portable_live",
        "any-2",
        8,
        Duration::from_millis(100),
        &urls,
        &["accounts", "savings", "checking", "items"],
    )
    .expect("spec");
    spec.settings.checkpoint_interval = 4;
    let orderer = shared(LocalOrderer::start(
        spec.network.network_id.clone(),
        spec.network.max_block_txs,
        spec.network.batch_timeout,
    ));
    let cluster = Cluster::start(spec, orderer).await.expect("start");
    let analyzer = Analyzer::new(
        cluster
            .store(OrgId(1))
            .expect("store")
            .schema()
            .expect("schema"),
    );
    let long_or = (0..3_000)
        .map(|i| format!("k = {i}"))
        .collect::<Vec<_>>()
        .join(" OR ");
    // (class, statement, parameters, refused because …: None when it must be accepted)
    let cases: Vec<(&str, String, Vec<Value>, Option<&str>)> = vec![
        ("integer division", "UPDATE items SET n = n / 2 WHERE k = 1".into(), vec![], None),
        ("division by zero", "UPDATE items SET n = n / 0 WHERE k = 1".into(), vec![], Some("divisor")),
        ("division by a zero parameter", "UPDATE items SET n = n / $1 WHERE k = 1".into(), vec![Value::Int(0)], Some("parameter $1 must be a positive integer")),
        ("overflow of a 32-bit INTEGER", "UPDATE items SET n = n + $1 WHERE k = 1".into(), vec![Value::Int(3_000_000_000)], None),
        ("overflow of a 32-bit INTEGER by a constant", "UPDATE items SET n = 3000000000 WHERE k = 99".into(), vec![], Some("does not fit column n")),
        ("ABS of the smallest integer", "UPDATE items SET n = ABS($1) WHERE k = 1".into(), vec![Value::Int(i64::MIN)], Some("overflows")),
        ("ABS of the smallest 32-bit integer", "UPDATE items SET n = ABS(n) WHERE k = 2".into(), vec![], None),
        ("CAST rounding", "UPDATE items SET n = CAST(price AS INTEGER) WHERE k = 1".into(), vec![], Some("CAST")),
        ("LENGTH of non-ASCII text", "UPDATE items SET n = LENGTH(label) WHERE k = 2".into(), vec![], None),
        ("CHAR_LENGTH", "UPDATE items SET n = CHAR_LENGTH(note) + 1 WHERE k = 2".into(), vec![], None),
        ("SUBSTR with a zero start", "UPDATE items SET label = SUBSTR(label, 0, 2) WHERE k = 1".into(), vec![], Some("SUBSTR's start")),
        ("SUBSTR with a negative start", "UPDATE items SET label = SUBSTR(label, $1) WHERE k = 1".into(), vec![Value::Int(-1)], Some("parameter $1")),
        ("SUBSTR of non-ASCII text", "UPDATE items SET note = SUBSTR(label, 2) WHERE k = 2".into(), vec![], None),
        ("UPPER of non-ASCII text", "UPDATE items SET label = UPPER(label) WHERE k = 2".into(), vec![], Some("UPPER")),
        ("LIKE with an escaped %", "UPDATE items SET flag = (label LIKE 'a\\%') WHERE k = 4".into(), vec![], None),
        ("LIKE pattern ending in a backslash", "UPDATE items SET flag = (label LIKE $1) WHERE k = 4".into(), vec![Value::Text("a\\".into())], Some("LIKE pattern")),
        ("COALESCE over mixed types", "UPDATE items SET note = COALESCE(note, n) WHERE k = 4".into(), vec![], Some("COALESCE mixes")),
        ("a parameter compared with a literal", "UPDATE items SET flag = ($1 = 'ABC') WHERE k = 3".into(), vec![Value::Text("abc".into())], None),
        ("a text range", "UPDATE items SET n = 5 WHERE label > 'Z' AND k < 10".into(), vec![], None),
        ("NULL ordering under ORDER BY … LIMIT", "UPDATE checking SET bal = (SELECT i.k FROM items i ORDER BY i.price DESC, i.k LIMIT 1) WHERE custid = 1".into(), vec![], None),
        ("GROUP BY with a column neither grouped nor aggregated", "SELECT k, COUNT(*) FROM items GROUP BY label".into(), vec![], Some("neither grouped nor aggregated")),
        ("NUL in a text parameter", "UPDATE items SET note = $1 WHERE k = 1".into(), vec![Value::Text("a\0b".into())], Some("U+0000")),
        ("NUL in the SQL text", "UPDATE items SET n = 1 WHERE k = 1\0 OR TRUE".into(), vec![], Some("U+0000")),
        ("-- without a space", "UPDATE items SET n = 11 WHERE k = 1 --OR TRUE".into(), vec![], None),
        ("a MySQL /*! */ hint", "UPDATE items SET n = 12 WHERE k = 1 /*! AND FALSE */".into(), vec![], None),
        ("a nested block comment", "UPDATE items SET n = 13 WHERE k = 1 /* a /* b */ OR TRUE */".into(), vec![], None),
        ("# (a comment only on MySQL)", "UPDATE items SET n = 14 WHERE k = 1 # OR TRUE".into(), vec![], Some("parse")),
        ("a 50 KB OR chain", format!("UPDATE items SET n = 1 WHERE {long_or}"), vec![], Some("deeper than")),
        ("text compared with a number", "UPDATE items SET n = 1 WHERE label = 5".into(), vec![], Some("compares text with integer")),
        ("arithmetic in a filter that could overflow", "UPDATE checking SET bal = 0 WHERE bal * 3 > 10".into(), vec![], Some("may overflow")),
        // The second review: NULL parameters no context types, parameters not used at all.
        ("a NULL parameter under IS NULL", "UPDATE items SET n = 21 WHERE $1 IS NULL AND k = 4".into(), vec![Value::Null], None),
        ("a NULL parameter counted", "UPDATE checking SET bal = (SELECT COUNT($1) FROM items) WHERE custid = 3".into(), vec![Value::Null], None),
        ("an unused NULL parameter", "UPDATE items SET n = 22 WHERE k = $2".into(), vec![Value::Null, Value::Int(3)], None),
        ("an unused trailing parameter", "UPDATE items SET n = 23 WHERE k = $1".into(), vec![Value::Int(4), Value::Text("x".into())], Some("but 2 were given")),
        ("outputs under LIMIT that may overflow", "UPDATE checking SET bal = (SELECT i.k + 1 FROM items i ORDER BY i.k LIMIT 1) WHERE custid = 2".into(), vec![], Some("may overflow")),
        ("a decimal operand finer than the column", "UPDATE items SET price = price + 0.005 WHERE k = 1".into(), vec![], Some("decimal places")),
        ("decimal arithmetic within the bound", "UPDATE items SET price = price - $1 + 0.25 WHERE k = 2".into(), vec![Value::Decimal("10.5".parse().expect("decimal"))], None),
    ];
    let mut submitted = Vec::new();
    for (class, sql, params, refused) in &cases {
        let t = tx(sql, params.clone());
        match (analyzer.analyze(&t), refused) {
            (Ok(_), None) => {}
            (Err(e), Some(why)) => {
                let m = e.to_string();
                assert!(m.starts_with("statement 1: "), "{class}: {m}");
                assert!(m.contains(why), "{class}: expected `{why}` in: {m}");
            }
            (Ok(_), Some(why)) => panic!("{class}: accepted, expected a refusal naming `{why}`"),
            (Err(e), None) => panic!("{class}: refused: {e}"),
        }
        // Ordered anyway: accepted ones run, refused ones are invalid everywhere alike. The
        // refused ones are forged past the origin's admission, which refuses them first.
        if refused.is_some() {
            let forged = cluster.forge(t);
            submitted.push(forged.proposal.tx_id());
            cluster.submit_raw(forged).await.expect("submit");
        } else {
            submitted.push(cluster.submit(t).await.expect("submit"));
        }
    }
    let orgs = cluster.orgs();
    cluster
        .wait_committed(&orgs, &submitted, Duration::from_secs(120))
        .await
        .expect("every transaction appended at every organization");
    cluster
        .check_consistent(&orgs)
        .await
        .expect("identical ledgers and tables");
    for ((class, _, _, refused), id) in cases.iter().zip(&submitted) {
        let outcomes: Vec<bool> = orgs
            .iter()
            .map(|o| cluster.outcome(*o, id).expect("outcome").success)
            .collect();
        assert!(
            outcomes.windows(2).all(|w| w[0] == w[1]),
            "{class}: {outcomes:?}"
        );
        if refused.is_some() {
            assert!(!outcomes[0], "{class}: a refused statement committed");
        }
    }
    // The accepted integer division and the commented statements did what was analysed.
    let items = cluster.dump(OrgId(3), "items").await.expect("dump");
    assert_eq!(items[0][1], Value::Int(13), "{:?}", items[0]);
    // The NULL parameters were typed alike everywhere: the statements committed.
    assert_eq!(items[3][1], Value::Int(21), "{:?}", items[3]);
    assert_eq!(items[2][1], Value::Int(22), "{:?}", items[2]);
    for (org, status) in cluster.statuses() {
        assert!(status.alarms.is_empty(), "{org}: {status:?}");
        assert!(status.recoveries.is_empty(), "{org}: {status:?}");
        assert!(cluster.is_running(org), "{org} stopped");
    }
    cluster.shutdown().await.expect("shutdown");
}
