//! A payment between two Smallbank customers on a running network, through the SDK.
//!
//! Start a dev network, then run the example against it:
//!
//! ```text
//! cargo run -- devnet up --dir net
//! cargo run -p chainify-client --example payment -- net 1 7 12 250
//! ```
//!
//! Arguments: the network directory (as `chainify init` or `devnet up` wrote it), the
//! organization to talk to, the paying customer, the paid customer and the amount. It watches
//! the commit stream, submits the payment (both updates or neither; it fails if the payer lacks
//! the funds), waits for its agreed outcome, and reads both balances at the agreed height.

// An example program reports to its user on stdout.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::Duration;

use chainify_client::{Client, ClientError, Identity, Tx, Value};
use chainify_core::OrgId;
use chainify_core::config::NetworkConfig;
use futures_util::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, org, from, to, amount] = args.as_slice() else {
        return Err("usage: payment <network dir> <org> <from custid> <to custid> <amount>".into());
    };
    let dir = PathBuf::from(dir);
    let (org, from, to): (u32, i64, i64) = (org.parse()?, from.parse()?, to.parse()?);
    let amount: chainify_client::Decimal = amount.parse()?;

    let network = NetworkConfig::load(&dir.join("network.toml"))?;
    let endpoint = &network
        .orgs
        .get(&OrgId(org))
        .ok_or_else(|| format!("the network has no organization {org}"))?
        .chainify_endpoint;
    let identity = Identity::load("client1", dir.join("clients/client1.pk8"))?;
    let mut connect = Client::connect(endpoint, network.network_id.as_str(), OrgId(org), identity);
    if network.tls_ca.is_some() {
        connect = connect.tls_ca(dir.join("tls/ca.pem"))?;
    }
    // Query answers must be signed by the organization's own key (a network without
    // signatures, for measurement only, signs none).
    if network.signatures != chainify_core::crypto::Signatures::Off {
        connect = connect.org_key(network.orgs[&OrgId(org)].public_key);
    }
    let client = connect.connect().await?;

    // Every agreed block from now on, with each transaction's outcome.
    let height = client
        .query("SELECT COUNT(*) FROM checking", [])
        .await?
        .height;
    let mut commits = client.commits(height + 1).await?;
    let watcher = tokio::spawn(async move {
        while let Some(event) = commits.next().await {
            match event {
                Ok(e) => println!(
                    "block {} agreed: {} transactions",
                    e.block,
                    e.outcomes.len()
                ),
                Err(e) => return Err::<(), ClientError>(e),
            }
        }
        Ok(())
    });

    // The guard makes the debit update exactly one row, or the whole transaction rolls back.
    let payment = Tx::new()
        .statement(
            "UPDATE checking SET bal = bal - $2 WHERE custid = $1 AND bal >= $2",
            [Value::Int(from), Value::Decimal(amount)],
        )
        .expect_rows(1)
        .statement(
            "UPDATE checking SET bal = bal + $2 WHERE custid = $1",
            [Value::Int(to), Value::Decimal(amount)],
        )
        .expect_rows(1);
    let outcome = client.submit_and_wait(payment).await?;
    println!(
        "payment {}: block {}, index {}, {}",
        outcome.tx_id,
        outcome.block,
        outcome.index,
        if outcome.success {
            "paid".to_owned()
        } else {
            format!("refused: {}", outcome.reason)
        }
    );

    let rows = client
        .query(
            "SELECT custid, bal FROM checking WHERE custid = $1 OR custid = $2 ORDER BY custid",
            [Value::Int(from), Value::Int(to)],
        )
        .await?;
    println!("balances at block {}:", rows.height);
    for row in &rows.rows {
        println!("  {row:?}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    watcher.abort();
    Ok(())
}
