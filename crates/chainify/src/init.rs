//! `chainify init --orgs N --out DIR`: keys and configuration for a local network.
//!
//! Layout: `DIR/network.toml` (shared), `DIR/orgN/org.toml` and `DIR/orgN/signing.pk8` per
//! organization, `DIR/clients/clientN.pk8` per client, and with TLS (the default) the network's
//! CA in `DIR/tls/ca.pem` (its key in `ca.key`) and each organization's server certificate in
//! `DIR/orgN/tls.pem` and `tls.key`. Endpoints are on 127.0.0.1 from `--base-port` on, ten
//! ports per organization; the solo orderer listens on the port after the last organization's.
//! Existing files are never overwritten.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use chainify_core::config::{
    CheckpointFile, CutRule, ExecutionFile, GrantEntry, NetworkBuilder, NetworkConfig, OrdererFile,
    OrdererKind, OrgConfig, OrgFile, OrgTlsFile, PortPlan, StatementKind, all_grants,
};
use chainify_core::crypto::{Signatures, SigningKey};
use chainify_core::policy::PolicySpec;

#[derive(Clone, Debug, clap::Args)]
pub(crate) struct InitArgs {
    /// Number of organizations.
    #[arg(long, default_value_t = 3)]
    pub(crate) orgs: u32,
    /// Number of clients (each granted every statement kind on every table).
    #[arg(long, default_value_t = 1)]
    pub(crate) clients: u32,
    /// Output directory (created; must not already contain a network).
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// Agreement policy: any-K, all, majority or [[1,2],[1,3]].
    #[arg(long, default_value = "majority")]
    pub(crate) policy: String,
    /// Network id.
    #[arg(long, default_value = "chainify-local")]
    pub(crate) network_id: String,
    /// First port; organization i uses base + 10·(i−1) … + 6.
    #[arg(long, default_value_t = 17100)]
    pub(crate) base_port: u16,
    /// The orderer: solo (a `chainify orderer` process), kafka, or local (one process only).
    #[arg(long, default_value = "solo")]
    pub(crate) orderer: String,
    /// Kafka bootstrap servers, with `--orderer kafka`.
    #[arg(long)]
    pub(crate) kafka_brokers: Option<String>,
    /// Kafka topic (default: the network id).
    #[arg(long)]
    pub(crate) kafka_topic: Option<String>,
    /// Replicas of the Kafka topic when chainify creates it (3 for a cluster of three).
    #[arg(long, default_value_t = 1)]
    pub(crate) kafka_replication: u16,
    /// Host name or address of each organization's machine, comma-separated, in order: the
    /// network's endpoints name them, certificates are issued for them, and the chainify and
    /// commit services listen on every interface (default: all on 127.0.0.1).
    #[arg(long, value_delimiter = ',')]
    pub(crate) hosts: Vec<String>,
    /// Database URL of each organization in order (repeat once per organization); default:
    /// an SQLite file in each organization's folder.
    #[arg(long = "database")]
    pub(crate) databases: Vec<String>,
    /// Shared tables, comma-separated (they must exist in every organization's database
    /// before its node starts).
    #[arg(long, value_delimiter = ',')]
    pub(crate) tables: Vec<String>,
    /// A block ends after this many transactions.
    #[arg(long, default_value_t = 1024)]
    pub(crate) block_txs: usize,
    /// ... or when its oldest transaction waited this long.
    #[arg(long, default_value_t = 100)]
    pub(crate) batch_timeout_ms: u64,
    /// ... or (`on-demand`, with Kafka) as soon as an organization waits for it.
    #[arg(long, default_value = "on-demand")]
    pub(crate) cut: CutRule,
    /// Take a checkpoint every this many blocks.
    #[arg(long, default_value_t = 100)]
    pub(crate) checkpoint_interval: u64,
    /// Restricts a client to these grants, `CLIENT:TABLE:KIND[+KIND…]` (repeat; TABLE may be
    /// `*`, KIND is select, insert, update or delete); clients never named get every kind on
    /// every table.
    #[arg(long = "grant")]
    pub(crate) grants: Vec<String>,
    /// Plaintext gRPC instead of TLS (not for networks beyond one machine).
    #[arg(long)]
    pub(crate) no_tls: bool,
    /// Sign and check nothing (`signatures = "off"`): only to measure what signatures cost; the
    /// network then trusts every client, organization and orderer.
    #[arg(long)]
    pub(crate) unsigned: bool,
}

fn write_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    write_file(path, bytes, 0o644)
}

/// A private key: readable by its owner alone (0600), from its creation on.
fn write_secret(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    write_file(path, bytes, 0o600)
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| {
            format!(
                "cannot create {} (an existing file is never overwritten)",
                path.display()
            )
        })?;
    f.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))
}

pub(crate) fn run(args: &InitArgs) -> anyhow::Result<()> {
    if args.orgs == 0 || args.orgs > 64 {
        bail!(
            "--orgs {}: choose between 1 and 64 organizations",
            args.orgs
        );
    }
    let spec = args
        .policy
        .parse::<PolicySpec>()
        .map_err(|e| anyhow::anyhow!("--policy: {e}"))?;
    let ids = (1..=args.orgs).map(chainify_core::OrgId).collect();
    chainify_core::policy::AgreementPolicy::new(&spec, &ids)
        .map_err(|e| anyhow::anyhow!("--policy: {e}"))?;
    let ports = PortPlan {
        base: args.base_port,
    };
    if let Err(last_port) = ports.check(args.orgs) {
        bail!(
            "--base-port {}: {} organizations need ports up to {last_port}",
            args.base_port,
            args.orgs
        );
    }
    let orderer_kind = match args.orderer.as_str() {
        "solo" => OrdererKind::Solo,
        "kafka" => OrdererKind::Kafka,
        "local" => OrdererKind::Local,
        other => bail!("--orderer {other:?}: choose solo, kafka or local"),
    };
    if orderer_kind == OrdererKind::Kafka && args.kafka_brokers.is_none() {
        bail!("--orderer kafka needs --kafka-brokers host:port[,host:port…]");
    }
    if !args.hosts.is_empty() {
        if args.hosts.len() != args.orgs as usize {
            bail!(
                "--hosts names {} machines for {} organizations: name one per organization",
                args.hosts.len(),
                args.orgs
            );
        }
        for h in &args.hosts {
            if h.is_empty() || h.contains([':', '/', ' ', '@']) {
                bail!("--hosts: {h:?} is not a host name or IPv4 address");
            }
        }
        if orderer_kind != OrdererKind::Kafka {
            bail!(
                "--hosts with --orderer {}: organizations on several machines order through \
                 Kafka (--orderer kafka)",
                args.orderer
            );
        }
        if args.unsigned {
            bail!(
                "--unsigned with --hosts: an unsigned network trusts everyone; it is for \
                 benchmarks on one machine"
            );
        }
    }
    if orderer_kind == OrdererKind::Kafka && args.kafka_replication == 0 {
        bail!("--kafka-replication 0: at least 1 replica");
    }
    if !args.databases.is_empty() && args.databases.len() != args.orgs as usize {
        bail!(
            "--database given {} times for {} organizations: give one per organization, or none",
            args.databases.len(),
            args.orgs
        );
    }
    let mut restricted: std::collections::BTreeMap<String, Vec<GrantEntry>> = Default::default();
    for g in &args.grants {
        let parts: Vec<&str> = g.split(':').collect();
        let [client, table, kinds] = parts.as_slice() else {
            bail!("--grant {g:?}: expected CLIENT:TABLE:KIND[+KIND…]");
        };
        let kinds = kinds
            .split('+')
            .map(|k| match k {
                "select" => Ok(StatementKind::Select),
                "insert" => Ok(StatementKind::Insert),
                "update" => Ok(StatementKind::Update),
                "delete" => Ok(StatementKind::Delete),
                other => Err(anyhow::anyhow!(
                    "--grant {g:?}: {other:?} is not select, insert, update or delete"
                )),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        restricted
            .entry((*client).to_owned())
            .or_default()
            .push(GrantEntry {
                table: (*table).to_owned(),
                kinds,
            });
    }
    if let Some(unknown) = restricted
        .keys()
        .find(|c| !(1..=args.clients).any(|i| **c == format!("client{i}")))
    {
        bail!(
            "--grant names {unknown:?}, but the clients are client1 … client{}",
            args.clients
        );
    }
    let out = std::path::absolute(&args.out)?;
    if out.join("network.toml").exists() {
        bail!(
            "{} already contains a network.toml; choose another --out",
            out.display()
        );
    }
    // Everything is written into a staging directory beside --out and moved in only once it
    // all loads: a failure leaves nothing behind.
    let name = out
        .file_name()
        .with_context(|| format!("--out {}: name a directory", out.display()))?;
    let staging = out.with_file_name(format!(
        ".{}.init-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    if let Err(e) = write_network(args, orderer_kind, &restricted, &staging, &out) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    move_into(&staging, &out)?;
    eprintln!(
        "wrote a {}-organization network to {}",
        args.orgs,
        out.display()
    );
    Ok(())
}

/// Moves the contents of `from` into `to` (merging into directories that exist, such as an
/// organization directory holding its database already), never replacing a file, and removes
/// `from`.
fn move_into(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() && target.is_dir() {
            move_into(&entry.path(), &target)?;
        } else if target.exists() {
            bail!("{} exists already; choose another --out", target.display());
        } else {
            std::fs::rename(entry.path(), &target)
                .with_context(|| format!("cannot move {} into place", target.display()))?;
        }
    }
    std::fs::remove_dir(from).with_context(|| format!("cannot remove {}", from.display()))
}

/// Writes keys, certificates and configuration into `out`, for the network's final place
/// `final_out`, and checks that they load.
fn write_network(
    args: &InitArgs,
    orderer_kind: OrdererKind,
    restricted: &std::collections::BTreeMap<String, Vec<GrantEntry>>,
    out: &Path,
    final_out: &Path,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out.join("clients"))
        .with_context(|| format!("cannot create {}", out.display()))?;

    let ports = PortPlan {
        base: args.base_port,
    };
    let mut network = NetworkBuilder::new(&args.network_id, &args.policy, ports)
        .block(args.block_txs, args.batch_timeout_ms)
        .cut(args.cut)
        .tables(&args.tables)
        .signatures(if args.unsigned {
            Signatures::Off
        } else {
            Signatures::Ed25519Zip215
        });
    let host = |org: u32| {
        args.hosts
            .get(org as usize - 1)
            .map_or("127.0.0.1", String::as_str)
    };
    // What other machines reach listens on every interface; admin, metrics and the internal
    // execution service stay on loopback (an operator opens them deliberately).
    let public = if args.hosts.is_empty() {
        "127.0.0.1"
    } else {
        "0.0.0.0"
    };
    let certs = if args.no_tls {
        None
    } else {
        std::fs::create_dir_all(out.join("tls"))
            .with_context(|| format!("cannot create {}", out.join("tls").display()))?;
        // One certificate per organization, and one for the solo orderer.
        let mut hosts: Vec<Vec<String>> = args.hosts.iter().map(|h| vec![h.clone()]).collect();
        hosts.resize(args.orgs as usize, Vec::new());
        let certs = chainify_net::tls::issue_network_certs(&args.network_id, &hosts, &[])?;
        write_new(&out.join("tls/ca.pem"), certs.ca.cert_pem.as_bytes())?;
        write_secret(&out.join("tls/ca.key"), certs.ca.key_pem.as_bytes())?;
        write_new(
            &out.join("tls/orderer.pem"),
            certs.orderer.cert_pem.as_bytes(),
        )?;
        write_secret(
            &out.join("tls/orderer.key"),
            certs.orderer.key_pem.as_bytes(),
        )?;
        Some(certs)
    };
    for i in 1..=args.orgs {
        let dir = out.join(format!("org{i}"));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let (key, der) = SigningKey::generate()?;
        write_secret(&dir.join("signing.pk8"), &der)?;
        network.org(&key.public_key(), host(i));
        let org = OrgFile {
            org_id: i,
            network_config: PathBuf::from("../network.toml"),
            signing_key: PathBuf::from("signing.pk8"),
            database_url: match args.databases.get(i as usize - 1) {
                Some(url) => url.clone(),
                None => format!(
                    "sqlite://{}",
                    final_out.join(format!("org{i}/state.db")).display()
                ),
            },
            listen: ports.listen(i, public),
            execution: ExecutionFile::default(),
            checkpoint: CheckpointFile {
                interval_blocks: args.checkpoint_interval,
                ..CheckpointFile::default()
            },
            tls: match &certs {
                Some(certs) => {
                    let issued = &certs.orgs[i as usize - 1];
                    write_new(&dir.join("tls.pem"), issued.cert_pem.as_bytes())?;
                    write_secret(&dir.join("tls.key"), issued.key_pem.as_bytes())?;
                    Some(OrgTlsFile {
                        cert: PathBuf::from("tls.pem"),
                        key: PathBuf::from("tls.key"),
                    })
                }
                None => None,
            },
        };
        write_new(&dir.join("org.toml"), toml::to_string(&org)?.as_bytes())?;
    }
    for c in 1..=args.clients {
        let (key, der) = SigningKey::generate()?;
        write_secret(&out.join(format!("clients/client{c}.pk8")), &der)?;
        network.client(
            &format!("client{c}"),
            &key.public_key(),
            restricted
                .get(&format!("client{c}"))
                .cloned()
                .unwrap_or_else(all_grants),
        );
    }
    let solo_endpoint = (orderer_kind == OrdererKind::Solo).then(|| network.solo_endpoint());
    let mut network = network.orderer(OrdererFile {
        kind: orderer_kind,
        solo_endpoint,
        kafka_brokers: args.kafka_brokers.clone(),
        kafka_topic: args.kafka_topic.clone(),
        kafka_replication: args.kafka_replication,
    });
    if certs.is_some() {
        network = network.tls(Path::new("tls/ca.pem"));
    }
    let network = network.build();
    let network_path = out.join("network.toml");
    write_new(&network_path, toml::to_string(&network)?.as_bytes())?;
    // What init writes must load: validate everything before reporting success.
    NetworkConfig::load(&network_path)?;
    for i in 1..=args.orgs {
        let cfg = OrgConfig::load(&out.join(format!("org{i}/org.toml")))?;
        SigningKey::load(&cfg.signing_key)?;
    }
    Ok(())
}

#[derive(Clone, Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("for").required(true).args(["org", "orderer"])))]
pub(crate) struct IssueCertArgs {
    /// The network's CA certificate (`tls/ca.pem`).
    #[arg(long)]
    ca: PathBuf,
    /// The CA's private key (`tls/ca.key`).
    #[arg(long)]
    ca_key: PathBuf,
    /// For this organization: the certificate names `orgN.chainify.internal` ...
    #[arg(long)]
    org: Option<u32>,
    /// ... or for the solo orderer (`orderer.chainify.internal`).
    #[arg(long)]
    orderer: bool,
    /// Host names or addresses it is also reached at (repeat).
    #[arg(long = "host")]
    hosts: Vec<String>,
    /// Where to write the certificate (PEM; never overwritten).
    #[arg(long)]
    cert: PathBuf,
    /// Where to write its private key (PEM; never overwritten).
    #[arg(long)]
    key: PathBuf,
}

/// `chainify issue-cert`: one certificate from the network's CA, for a network whose
/// certificates predate organization names, a new host.
pub(crate) fn issue_cert(args: &IssueCertArgs) -> anyhow::Result<()> {
    let name = match args.org {
        Some(0) => bail!("--org 0: organizations are numbered from 1"),
        Some(n) => chainify_core::OrgId(n).tls_name(),
        None => chainify_core::ORDERER_TLS_NAME.to_owned(),
    };
    let read = |path: &Path| {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
    };
    let issued =
        chainify_net::tls::issue_cert(&read(&args.ca)?, &read(&args.ca_key)?, &name, &args.hosts)?;
    for path in [&args.cert, &args.key] {
        if path.exists() {
            bail!("{} exists (never overwritten)", path.display());
        }
    }
    write_new(&args.cert, issued.cert_pem.as_bytes())?;
    write_secret(&args.key, issued.key_pem.as_bytes())?;
    use std::io::Write;
    writeln!(std::io::stdout().lock(), "{}: {name}", args.cert.display())?;
    Ok(())
}
