//! `chainify init --orgs N --out DIR`: keys and configuration for a local network.
//!
//! Layout: `DIR/network.toml` (shared), `DIR/orgN/org.toml` and `DIR/orgN/signing.pk8` per
//! organization, `DIR/clients/clientN.pk8` per client. Endpoints are on 127.0.0.1 from
//! `--base-port` on, ten ports per organization. Existing files are never overwritten.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use chainify_core::config::{
    BlockFile, CheckpointFile, ClientEntry, ExecutionFile, GrantEntry, ListenFile, NetworkConfig,
    OrdererFile, OrgConfig, OrgEntry, OrgFile, StatementKind,
};
use chainify_core::crypto::SigningKey;
use chainify_core::policy::PolicySpec;

#[derive(Debug, clap::Args)]
pub(crate) struct InitArgs {
    /// Number of organizations.
    #[arg(long, default_value_t = 3)]
    orgs: u32,
    /// Number of clients (each granted every statement kind on every table).
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// Output directory (created; must not already contain a network).
    #[arg(long)]
    out: PathBuf,
    /// Agreement policy: any-K, all, majority or [[1,2],[1,3]].
    #[arg(long, default_value = "majority")]
    policy: String,
    /// Network id.
    #[arg(long, default_value = "chainify-local")]
    network_id: String,
    /// First port; organization i uses base + 10·(i−1) … + 3.
    #[arg(long, default_value_t = 17100)]
    base_port: u16,
}

fn write_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {} (init never overwrites)", path.display()))?;
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
    let last_port = u32::from(args.base_port) + 10 * args.orgs;
    if last_port > u32::from(u16::MAX) {
        bail!(
            "--base-port {}: {} organizations need ports up to {last_port}",
            args.base_port,
            args.orgs
        );
    }
    let out = &args.out;
    if out.join("network.toml").exists() {
        bail!(
            "{} already contains a network.toml; choose another --out",
            out.display()
        );
    }
    std::fs::create_dir_all(out.join("clients"))
        .with_context(|| format!("cannot create {}", out.display()))?;

    let port = |org: u32, offset: u32| u32::from(args.base_port) + 10 * (org - 1) + offset;
    let mut orgs = Vec::new();
    for i in 1..=args.orgs {
        let dir = out.join(format!("org{i}"));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let (key, der) = SigningKey::generate()?;
        write_new(&dir.join("signing.pk8"), &der)?;
        orgs.push(OrgEntry {
            id: i,
            name: format!("org{i}"),
            public_key: key.public_key().to_string(),
            chainify_endpoint: format!("127.0.0.1:{}", port(i, 0)),
            commit_endpoint: format!("127.0.0.1:{}", port(i, 1)),
        });
        let org = OrgFile {
            org_id: i,
            network_config: PathBuf::from("../network.toml"),
            signing_key: PathBuf::from("signing.pk8"),
            database_url: format!("sqlite://{}", dir.join("state.db").display()),
            listen: ListenFile {
                chainify: format!("127.0.0.1:{}", port(i, 0)),
                commit: format!("127.0.0.1:{}", port(i, 1)),
                admin: format!("127.0.0.1:{}", port(i, 2)),
                metrics: format!("127.0.0.1:{}", port(i, 3)),
            },
            execution: ExecutionFile::default(),
            checkpoint: CheckpointFile::default(),
        };
        write_new(&dir.join("org.toml"), toml::to_string(&org)?.as_bytes())?;
    }
    let mut clients = Vec::new();
    for c in 1..=args.clients {
        let (key, der) = SigningKey::generate()?;
        write_new(&out.join(format!("clients/client{c}.pk8")), &der)?;
        clients.push(ClientEntry {
            id: format!("client{c}"),
            public_key: key.public_key().to_string(),
            grants: vec![GrantEntry {
                table: "*".into(),
                kinds: vec![
                    StatementKind::Select,
                    StatementKind::Insert,
                    StatementKind::Update,
                    StatementKind::Delete,
                ],
            }],
        });
    }
    let network = chainify_core::config::NetworkFile {
        network_id: args.network_id.clone(),
        agreement_policy: args.policy.clone(),
        endorsement_policy: None,
        block: BlockFile::default(),
        orderer: OrdererFile::default(),
        orgs,
        clients,
    };
    let network_path = out.join("network.toml");
    write_new(&network_path, toml::to_string(&network)?.as_bytes())?;
    // What init writes must load: validate everything before reporting success.
    NetworkConfig::load(&network_path)?;
    for i in 1..=args.orgs {
        let cfg = OrgConfig::load(&out.join(format!("org{i}/org.toml")))?;
        SigningKey::load(&cfg.signing_key)?;
    }
    eprintln!(
        "wrote a {}-organization network to {}",
        args.orgs,
        out.display()
    );
    Ok(())
}
