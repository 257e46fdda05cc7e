//! The client subcommands, on the SDK: `submit`, `query`, `status`, `verify-ledger`.
//!
//! Output is JSON on stdout (one object per command) so scripts can use it; errors go to stderr
//! with a non-zero exit code. `verify-ledger` exits 0 when the ledger verifies, 1 when it does
//! not (the report names the first bad block), 2 when it could not be read.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use chainify_client::{Client, Identity, TxState};
use chainify_core::config::NetworkConfig;
use chainify_core::tx::LedgerEntry;
use chainify_core::tx::Transaction;
use chainify_core::votes::{VoteContext, verify_ledger};
use chainify_core::{OrgId, Value};
use chainify_proto::pb;
use chainify_sql::json::{value_from_json, value_to_json};
use serde_json::{Value as Json, json};

use chainify_client::operator::{network_ca, read_ledger};

use crate::analyze::parse_block;
use crate::serve::runtime;

/// Which organization to talk to, and as which client.
#[derive(Debug, clap::Args)]
pub(crate) struct Target {
    /// The network file.
    #[arg(long)]
    network: PathBuf,
    /// The organization whose ChainifyService is used (its id; default 1).
    #[arg(long)]
    org: Option<u32>,
    /// Use this endpoint instead of the organization's; needs --org, the organization at the
    /// endpoint (queries are signed for it, and another refuses them).
    #[arg(long, requires = "org")]
    endpoint: Option<String>,
    /// The client id.
    #[arg(long, default_value = "client1")]
    client: String,
    /// The client's key (default: clients/<client>.pk8 beside the network file).
    #[arg(long)]
    key: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct SubmitArgs {
    #[command(flatten)]
    target: Target,
    /// One statement (with --params and --expect-rows) ...
    #[arg(long, conflicts_with = "tx")]
    sql: Option<String>,
    /// Its parameters as a JSON array, e.g. '[7, "alice", 12.50, {"hex": "00ff"}]'.
    #[arg(long, default_value = "[]")]
    params: String,
    /// The statement must affect exactly this many rows.
    #[arg(long)]
    expect_rows: Option<u64>,
    /// ... or a JSON file with one transaction: [{"sql": …, "params": […], "expect_rows": n}, …].
    #[arg(long)]
    tx: Option<PathBuf>,
    /// Wait until the block is agreed and print the outcome.
    #[arg(long)]
    wait: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct QueryArgs {
    #[command(flatten)]
    target: Target,
    /// One SELECT.
    #[arg(long)]
    sql: String,
    /// Its parameters as a JSON array.
    #[arg(long, default_value = "[]")]
    params: String,
}

#[derive(Debug, clap::Args)]
pub(crate) struct TxStatusArgs {
    #[command(flatten)]
    target: Target,
    /// The transaction id (64 hex digits).
    #[arg(long)]
    tx_id: String,
    /// Prove a committed outcome by its agreed block and certificate, checked against the
    /// network file's keys and agreement policy: it then rests on the policy's organizations,
    /// not on the one asked.
    #[arg(long)]
    prove: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// The network file (for its CA).
    #[arg(long)]
    network: Option<PathBuf>,
    /// Organization configuration files whose AdminService to ask (repeat).
    #[arg(long = "config")]
    configs: Vec<PathBuf>,
    /// AdminService endpoints to ask, as `ORG=host:port` (repeat), with --network for TLS:
    /// the organization's certificate must name it.
    #[arg(long = "admin", value_parser = parse_admin)]
    admins: Vec<(u32, String)>,
}

/// `ORG=host:port`: which organization's certificate the endpoint must present.
fn parse_admin(text: &str) -> Result<(u32, String), String> {
    let named = |(org, endpoint): (&str, &str)| {
        org.parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .map(|n| (n, endpoint.to_owned()))
    };
    text.split_once('=').and_then(named).ok_or_else(|| {
        format!(
            "{text:?} does not name its organization: write ORG=host:port (for example \
             1=127.0.0.1:7023), since TLS checks the organization's own certificate"
        )
    })
}

#[derive(Debug, clap::Args)]
pub(crate) struct VerifyArgs {
    /// The network file: its organizations' keys and agreement policy are what the
    /// certificates are checked against.
    #[arg(long)]
    network: PathBuf,
    /// Read the ledger of this organization over its CommitService ...
    #[arg(long, conflicts_with = "database")]
    org: Option<u32>,
    /// ... or straight from this database URL (only read: nothing is created or migrated).
    #[arg(long)]
    database: Option<String>,
    /// Also recompute the state digest from the database's shared tables (a full scan) and
    /// compare it with the ledger's newest block: the tables are what the ledger says.
    #[arg(long, requires = "database")]
    data: bool,
    /// Fail unless the ledger reaches this block (a truncated ledger).
    #[arg(long)]
    expect_height: Option<u64>,
    /// Fail unless the block at --expect-height (or the newest) has this hash (a fork).
    #[arg(long)]
    expect_hash: Option<String>,
}

async fn client(t: &Target) -> anyhow::Result<(Client, NetworkConfig)> {
    let network = NetworkConfig::load(&t.network)?;
    let org = OrgId(t.org.unwrap_or(1));
    let endpoint = match &t.endpoint {
        Some(e) => e.clone(),
        None => network
            .orgs
            .get(&org)
            .map(|o| o.chainify_endpoint.clone())
            .with_context(|| format!("--org {}: no such organization in the network", org.0))?,
    };
    let key = t.key.clone().unwrap_or_else(|| {
        t.network
            .parent()
            .unwrap_or(Path::new("."))
            .join(format!("clients/{}.pk8", t.client))
    });
    let identity = Identity::load(&t.client, &key)?;
    let mut connect = Client::connect(&endpoint, network.network_id.as_str(), org, identity);
    if let Some(ca) = network_ca(&network)? {
        connect = connect.tls_ca_pem(ca);
    }
    // Query answers are checked against the organization's own key.
    if network.signatures != chainify_core::crypto::Signatures::Off
        && let Some(info) = network.orgs.get(&org)
    {
        connect = connect.org_key(info.public_key);
    }
    Ok((connect.connect().await?, network))
}

fn params(text: &str) -> anyhow::Result<Vec<Value>> {
    let json: Json = serde_json::from_str(text).context("--params is not valid JSON")?;
    let Json::Array(items) = json else {
        bail!("--params must be a JSON array")
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| value_from_json(v).map_err(|e| anyhow::anyhow!("--params, ${}: {e}", i + 1)))
        .collect()
}

fn print(json: &Json) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{json:#}")?;
    Ok(())
}

fn outcome_json(o: &chainify_client::TxOutcome) -> Json {
    json!({
        "tx_id": o.tx_id.to_string(),
        "block": o.block.0,
        "index": o.index,
        "success": o.success,
        "agreed": o.agreed,
        "valid": o.valid,
        "reason": o.reason,
    })
}

pub(crate) fn submit(args: &SubmitArgs) -> anyhow::Result<()> {
    let tx: Transaction = match (&args.sql, &args.tx) {
        (Some(sql), None) => {
            let mut st = chainify_core::tx::Statement::new(sql.clone(), params(&args.params)?);
            st.expect_rows = args.expect_rows;
            Transaction {
                statements: vec![st],
            }
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let mut block =
                parse_block(&format!("[{text}]")).with_context(|| format!("{}", path.display()))?;
            block.pop().context("no transaction")?
        }
        _ => bail!("give --sql (one statement) or --tx FILE"),
    };
    runtime()?.block_on(async {
        let (client, _) = client(&args.target).await?;
        if args.wait {
            let o = client.submit_and_wait(tx).await?;
            print(&outcome_json(&o))
        } else {
            let id = client.submit(tx).await?;
            print(&json!({ "tx_id": id.to_string(), "ordered": true }))
        }
    })
}

pub(crate) fn query(args: &QueryArgs) -> anyhow::Result<()> {
    let params = params(&args.params)?;
    runtime()?.block_on(async {
        let (client, _) = client(&args.target).await?;
        let rows = client.query(&args.sql, params).await?;
        print(&json!({
            "height": rows.height,
            "columns": rows.columns,
            "rows": rows.rows.iter().map(|r| r.iter().map(value_to_json).collect::<Vec<_>>()).collect::<Vec<_>>(),
        }))
    })
}

pub(crate) fn tx_status(args: &TxStatusArgs) -> anyhow::Result<()> {
    let id: chainify_core::Digest = args
        .tx_id
        .parse()
        .map_err(|e| anyhow::anyhow!("--tx-id {:?}: {e}", args.tx_id))?;
    runtime()?.block_on(async {
        let (client, network) = client(&args.target).await?;
        let state = client.status(&chainify_core::TxId(id)).await?;
        print(&match state {
            TxState::Unknown => json!({ "state": "unknown" }),
            TxState::Pending { invalid_copy: None } => json!({ "state": "pending" }),
            TxState::Pending {
                invalid_copy: Some(copy),
            } => json!({ "state": "pending", "invalid_copy": outcome_json(&copy) }),
            TxState::Committed(o) if args.prove => {
                let org = OrgId(args.target.org.unwrap_or(1));
                let entry = chainify_client::operator::prove_outcome(&network, org, &o).await?;
                json!({
                    "state": "committed",
                    "outcome": outcome_json(&o),
                    "proof": {
                        "ledger_block_hash": entry.block.hash().to_string(),
                        "certified_by": entry.certificate.votes.iter().map(|v| v.org.0).collect::<Vec<_>>(),
                    },
                })
            }
            TxState::Committed(o) => json!({ "state": "committed", "outcome": outcome_json(&o) }),
        })
    })
}

pub(crate) fn status(args: &StatusArgs) -> anyhow::Result<()> {
    let mut targets: Vec<(String, OrgId, Option<Vec<u8>>)> = Vec::new();
    for path in &args.configs {
        let cfg = chainify_core::config::OrgConfig::load(path)?;
        targets.push((
            cfg.listen.admin.clone(),
            cfg.org_id,
            network_ca(&cfg.network)?,
        ));
    }
    let ca = match &args.network {
        Some(n) => network_ca(&NetworkConfig::load(n)?)?,
        None => None,
    };
    for (org, endpoint) in &args.admins {
        targets.push((endpoint.clone(), OrgId(*org), ca.clone()));
    }
    if targets.is_empty() {
        bail!("name the organizations to ask: --config org.toml or --admin ORG=host:port (repeat)");
    }
    runtime()?.block_on(async {
        let mut reports = Vec::new();
        for (endpoint, org, ca) in &targets {
            let channel = chainify_client::channel(endpoint, ca.as_deref(), &org.tls_name())?;
            let mut admin = pb::admin_service_client::AdminServiceClient::new(channel);
            let mut request = tonic::Request::new(pb::StatusRequest {});
            request.set_timeout(Duration::from_secs(5));
            match admin.status(request).await {
                Ok(r) => reports.push((endpoint.clone(), Ok(r.into_inner()))),
                Err(e) => reports.push((
                    endpoint.clone(),
                    Err(format!("{:?}: {}", e.code(), e.message())),
                )),
            }
        }
        let newest = reports
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok().map(|s| s.agreed_height))
            .max()
            .unwrap_or(0);
        let orgs: Vec<Json> = reports
            .iter()
            .map(|(endpoint, r)| match r {
                Ok(s) => json!({
                    "admin": endpoint,
                    "org": s.org_id,
                    "network": s.network_id,
                    "agreed_height": s.agreed_height,
                    "lag": newest - s.agreed_height,
                    // Who voted what for the next block (hash prefixes): late or dissenting orgs.
                    "pending_votes": s.pending_votes.iter().map(|(org, hash)| {
                        (format!("org{org}"), json!(hex_prefix(hash)))
                    }).collect::<serde_json::Map<_, _>>(),
                    "components": s.components.iter().map(|c| json!({
                        "component": c.component,
                        "height": c.height,
                        "lag": c.lag,
                        "recovery": c.recovery,
                    })).collect::<Vec<_>>(),
                }),
                Err(e) => json!({ "admin": endpoint, "error": e }),
            })
            .collect();
        print(&json!({ "newest_agreed": newest, "orgs": orgs }))?;
        if reports.iter().any(|(_, r)| r.is_err()) {
            bail!("some organizations did not answer");
        }
        Ok(())
    })
}

/// The exit code of `verify-ledger`: 0 every check passed, 1 one failed (the report says
/// which), 2 the ledger could not be read (an error naming the source).
pub(crate) fn verify(args: &VerifyArgs) -> anyhow::Result<std::process::ExitCode> {
    let network = NetworkConfig::load(&args.network)?;
    let expect_hash = args
        .expect_hash
        .as_deref()
        .map(|h| {
            h.parse::<chainify_core::Digest>()
                .map_err(|e| anyhow::anyhow!("--expect-hash {h}: {e}"))
        })
        .transpose()?;
    let (entries, data) = runtime()?.block_on(async {
        match (&args.org, &args.database) {
            (Some(org), None) => {
                let org = OrgId(*org);
                if !network.orgs.contains_key(&org) {
                    bail!("--org {}: no such organization in the network", org.0);
                }
                let entries = read_ledger(&network, org)
                    .await
                    .with_context(|| format!("reading the ledger of {org}"))?;
                Ok((entries, None))
            }
            (None, Some(url)) => read_database(url, args.data).await,
            _ => bail!("give --org N (over gRPC) or --database URL"),
        }
    })?;
    let ctx = VoteContext::of(&network);
    // An unsigned network's certificates prove nothing beyond the policy's count: say so.
    let signatures_checked = network.signatures.is_signed();
    let mut checks = vec!["chain", "certificates"];
    let mut report = match verify_ledger(entries.iter().map(|e| (&e.block, &e.certificate)), &ctx) {
        Ok(n) => {
            json!({ "ok": true, "blocks_checked": n, "signatures_checked": signatures_checked })
        }
        Err(fault) => json!({
            "signatures_checked": signatures_checked,
            "ok": false,
            "blocks_checked": fault.block.0.saturating_sub(1),
            "first_bad_block": fault.block.0,
            "problem": fault.problem,
        }),
    };
    let height = entries.len() as u64;
    report["height"] = json!(height);
    if let Some(last) = entries.last() {
        report["newest_hash"] = json!(last.block.hash().to_string());
    }
    let fail = |report: &mut serde_json::Value, problem: String| {
        if report["ok"] == json!(true) {
            report["ok"] = json!(false);
            report["problem"] = json!(problem);
        }
    };
    if let Some(want) = args.expect_height {
        checks.push("height");
        if height < want {
            fail(
                &mut report,
                format!("the ledger ends at block {height}, expected at least {want} (truncated)"),
            );
        }
    }
    if let Some(want) = expect_hash {
        checks.push("hash");
        let at = args.expect_height.unwrap_or(height);
        match entries
            .get(at.saturating_sub(1) as usize)
            .filter(|_| at > 0)
        {
            Some(e) if e.block.hash() == want => {}
            Some(e) => fail(
                &mut report,
                format!(
                    "block {at} has hash {}, expected {want} (a fork or a rewritten ledger)",
                    e.block.hash()
                ),
            ),
            None => fail(&mut report, format!("the ledger has no block {at}")),
        }
    }
    if let Some(check) = data {
        checks.push("data");
        report["data"] = json!({
            "applied_block": check.block.map(|b| b.0),
            "rows": check.rows,
            "scanned_state_digest": check.actual.to_string(),
            "pending_changes": check.pending,
            "differing_tables": check.differing,
        });
        for change in &check.changed_definitions {
            fail(&mut report, change.to_string());
        }
        match (entries.last(), check.block) {
            // Changes recorded but in no block: made outside chainify (or a block is being
            // executed). Their recorded before-images come from the audited database itself,
            // so they are not taken back: the tables are compared as they are.
            (_, _) if check.pending > 0 => fail(
                &mut report,
                format!(
                    "{} changes to the shared tables are recorded but in no block: made outside chainify, or a block is being executed (verify the data while the node is stopped or idle)",
                    check.pending
                ),
            ),
            (Some(last), Some(applied)) if applied == last.block.number => {
                if last.block.state_digest != check.actual {
                    let tables = if check.differing.is_empty() {
                        "the recorded state agrees with the rows, so it was changed too".to_owned()
                    } else {
                        format!("tables {}", check.differing.join(", "))
                    };
                    fail(
                        &mut report,
                        format!(
                            "the shared tables are not what ledger block {} says: state digest {} scanned, {} agreed ({tables})",
                            applied, check.actual, last.block.state_digest
                        ),
                    );
                }
            }
            (last, applied) => fail(
                &mut report,
                format!(
                    "the database has applied block {} but its ledger ends at {}; verify the data while the node is stopped or idle",
                    applied.map_or("none".into(), |b| b.to_string()),
                    last.map_or("none".into(), |l| l.block.number.to_string())
                ),
            ),
        }
    }
    report["checks"] = json!(checks);
    let ok = report["ok"] == json!(true);
    print(&report)?;
    Ok(if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}

/// The ledger in the database at `url` and, with `data`, the full scan of its shared tables;
/// opened read-only, so a wrong URL is an error rather than a new, empty database.
async fn read_database(
    url: &str,
    data: bool,
) -> anyhow::Result<(Vec<LedgerEntry>, Option<chainify_storage::StateCheck>)> {
    use chainify_storage::{AnyBackend, Store, StoreOptions, redact_url};
    let source = redact_url(url);
    let options = StoreOptions {
        read_only: true,
        max_connections: 2,
        ..StoreOptions::default()
    };
    let backend = AnyBackend::connect(url, &options)
        .await
        .with_context(|| format!("cannot open the ledger in {source}"))?;
    let store = Store::open(backend, options)
        .await
        .with_context(|| format!("cannot read the ledger in {source}"))?;
    let entries = read_entries(&store)
        .await
        .with_context(|| format!("reading the ledger in {source}"))?;
    let check = if data {
        Some(
            store
                .check_state()
                .await
                .with_context(|| format!("scanning the shared tables in {source}"))?,
        )
    } else {
        None
    };
    store.close().await;
    Ok((entries, check))
}

async fn read_entries(
    store: &chainify_storage::Store<chainify_storage::AnyBackend>,
) -> anyhow::Result<Vec<LedgerEntry>> {
    Ok(chainify_node::ledger::entries_from(store, chainify_core::BlockNumber(1)).await?)
}

/// The first 8 bytes of a hash in hex: enough to tell votes apart on a status line.
fn hex_prefix(hash: &[u8]) -> String {
    hash.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
