//! Network and organization configuration: TOML → serde structs with defaults → `validate()` →
//! runtime config. Every error names the file, the key and the value.
//!
//! The *network* file is shared by all organizations (orgs and their public keys and endpoints,
//! policies, clients and their grants, orderer and block settings); each organization also has an
//! *org* file (its id, database URL, key path, listen addresses, execution and checkpoint settings).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::crypto::{PublicKey, Signatures};
use crate::policy::{AgreementPolicy, PolicySpec};
use crate::{BlockNumber, ClientId, NetworkId, OrgId};

mod builder;

pub use builder::{NetworkBuilder, PortPlan, Service, all_grants};

/// A configuration file could not be read, parsed or validated.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Reading the file failed.
    #[error("cannot read {file}: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys or wrong types (toml's message names the key).
    #[error("{file}: {message}")]
    Parse {
        /// The file.
        file: PathBuf,
        /// toml's message.
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("{file}: {key} = {value}: {problem}")]
    Invalid {
        /// The file.
        file: PathBuf,
        /// The dotted key, e.g. `orgs[2].public_key`.
        key: String,
        /// The offending value as written.
        value: String,
        /// What is wrong.
        problem: String,
    },
}

/// Statement kinds a client may be granted.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatementKind {
    /// SELECT (and read-only queries).
    Select,
    /// INSERT.
    Insert,
    /// UPDATE.
    Update,
    /// DELETE.
    Delete,
}

impl fmt::Display for StatementKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StatementKind::Select => "select",
            StatementKind::Insert => "insert",
            StatementKind::Update => "update",
            StatementKind::Delete => "delete",
        })
    }
}

/// The orderer implementation.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrdererKind {
    /// In-process (embedded mode and tests).
    Local,
    /// The solo orderer served over gRPC.
    Solo,
    /// Apache Kafka (production).
    Kafka,
}

/// The network file as written (serde form).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkFile {
    /// Network id, part of everything signed.
    pub network_id: String,
    /// Agreement policy on LedgerBlock hashes: `any-K`, `all`, `majority` or `[[1,2],[1,3]]`.
    pub agreement_policy: String,
    /// Early-abort (endorsement) policy; defaults to the agreement policy.
    #[serde(default)]
    pub endorsement_policy: Option<String>,
    /// Block cutting.
    #[serde(default)]
    pub block: BlockFile,
    /// Orderer selection.
    #[serde(default)]
    pub orderer: OrdererFile,
    /// The organizations.
    pub orgs: Vec<OrgEntry>,
    /// The clients.
    #[serde(default)]
    pub clients: Vec<ClientEntry>,
    /// The shared tables every organization registers (digest tables and triggers).
    #[serde(default)]
    pub tables: Vec<String>,
    /// TLS between organizations and for clients; plaintext gRPC when absent.
    #[serde(default)]
    pub tls: Option<NetworkTlsFile>,
    /// `ed25519` (the default) or `off`: only to measure what signatures cost; an unsigned
    /// network trusts every client, organization and orderer.
    #[serde(default)]
    pub signatures: Signatures,
    /// From which block on an early-abort response may be signed with others under one
    /// signature (a Merkle tree's root, `chainify_core::batch`). A block's responses are read
    /// by the rule of its number, so every organization, now or replaying, reads a block
    /// alike: set it to a height the network has not reached, in every organization's copy.
    /// Files that name none keep single signatures; `chainify init` writes 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_batches_from: Option<u64>,
}

/// TLS settings shared by the network.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkTlsFile {
    /// PEM certificate of the network's certificate authority, which signs every server
    /// certificate (relative to the network file).
    pub ca: PathBuf,
}

/// Block cutting settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockFile {
    /// A block ends after this many transactions.
    #[serde(default = "default_max_block_txs")]
    pub max_block_txs: usize,
    /// ... or when its oldest pending transaction has waited this long.
    #[serde(default = "default_batch_timeout_ms")]
    pub batch_timeout_ms: u64,
    /// ... or, `on-demand`, as soon as an organization wants it and it holds a transaction.
    #[serde(default)]
    pub cut: CutRule,
}

/// When a block that has not filled up is cut (`block.cut`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CutRule {
    /// When an organization's block stream has nothing more of the log at hand and waits for the
    /// block being filled (Kafka and the in-process orderer: the consumer appends the time-to-cut
    /// marker itself), or after the batch timeout. No block waits on the timer while an
    /// organization is idle; under load a block holds what arrived while the organizations
    /// executed the last one.
    #[default]
    OnDemand,
    /// Only after the batch timeout (and the solo orderer always: its gRPC stream is read
    /// ahead, so it cannot tell when an organization wants a block).
    Timeout,
}

impl std::str::FromStr for CutRule {
    type Err = String;

    /// `on-demand` or `timeout`, as in the network file (command-line options).
    fn from_str(text: &str) -> Result<CutRule, String> {
        match text {
            "on-demand" => Ok(CutRule::OnDemand),
            "timeout" => Ok(CutRule::Timeout),
            other => Err(format!("{other:?}: on-demand or timeout")),
        }
    }
}

fn default_max_block_txs() -> usize {
    1024
}
fn default_batch_timeout_ms() -> u64 {
    100
}

impl Default for BlockFile {
    fn default() -> Self {
        BlockFile {
            max_block_txs: default_max_block_txs(),
            batch_timeout_ms: default_batch_timeout_ms(),
            cut: CutRule::default(),
        }
    }
}

/// Orderer settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrdererFile {
    /// `local`, `solo` or `kafka`.
    #[serde(default = "default_orderer_kind")]
    pub kind: OrdererKind,
    /// Endpoint of the solo orderer (`host:port`), required for `solo`.
    #[serde(default)]
    pub solo_endpoint: Option<String>,
    /// Kafka bootstrap servers (`host:port,…`), required for `kafka`.
    #[serde(default)]
    pub kafka_brokers: Option<String>,
    /// Kafka topic; defaults to the network id.
    #[serde(default)]
    pub kafka_topic: Option<String>,
    /// Replicas of the topic when chainify creates it: 1 for a single broker, 3 for a cluster
    /// of three (with the brokers' `min.insync.replicas = 2`, one broker may fail).
    #[serde(default = "default_kafka_replication")]
    pub kafka_replication: u16,
}

fn default_kafka_replication() -> u16 {
    1
}

fn default_orderer_kind() -> OrdererKind {
    OrdererKind::Local
}

impl Default for OrdererFile {
    fn default() -> Self {
        OrdererFile {
            kind: OrdererKind::Local,
            solo_endpoint: None,
            kafka_brokers: None,
            kafka_topic: None,
            kafka_replication: default_kafka_replication(),
        }
    }
}

/// One organization in the network file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrgEntry {
    /// 1-based id, as used in explicit policies.
    pub id: u32,
    /// Human-readable name.
    pub name: String,
    /// Ed25519 public key, 64 hex digits.
    pub public_key: String,
    /// ChainifyService + EndorsementService endpoint (`host:port`).
    pub chainify_endpoint: String,
    /// CommitService endpoint (`host:port`).
    pub commit_endpoint: String,
}

/// One client in the network file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientEntry {
    /// Client id used in proposals.
    pub id: String,
    /// Ed25519 public key, 64 hex digits.
    pub public_key: String,
    /// What the client may do.
    #[serde(default)]
    pub grants: Vec<GrantEntry>,
}

/// A grant: statement kinds on a table (`*` for every shared table).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantEntry {
    /// Table name or `*`.
    pub table: String,
    /// Allowed kinds.
    pub kinds: Vec<StatementKind>,
}

/// A validated organization of the network.
#[derive(Clone, Debug)]
pub struct OrgInfo {
    /// Its id.
    pub id: OrgId,
    /// Its name.
    pub name: String,
    /// Its signing key's public half.
    pub public_key: PublicKey,
    /// ChainifyService endpoint.
    pub chainify_endpoint: String,
    /// CommitService endpoint.
    pub commit_endpoint: String,
}

/// A validated client.
#[derive(Clone, Debug)]
pub struct ClientInfo {
    /// Its id.
    pub id: ClientId,
    /// Its public key.
    pub public_key: PublicKey,
    /// Allowed kinds per table (`*` for all tables).
    pub grants: BTreeMap<String, BTreeSet<StatementKind>>,
}

impl ClientInfo {
    /// Whether the client may run `kind` on `table`.
    pub fn may(&self, kind: StatementKind, table: &str) -> bool {
        [table, "*"]
            .iter()
            .any(|t| self.grants.get(*t).is_some_and(|k| k.contains(&kind)))
    }
}

/// The validated network configuration.
#[derive(Clone, Debug)]
pub struct NetworkConfig {
    /// Network id.
    pub network_id: NetworkId,
    /// Agreement policy on LedgerBlock hashes.
    pub agreement: AgreementPolicy,
    /// Endorsement (early-abort) policy.
    pub endorsement: AgreementPolicy,
    /// Block size cap.
    pub max_block_txs: usize,
    /// Time-to-cut.
    pub batch_timeout: std::time::Duration,
    /// Whether an organization that wants the block being filled cuts it.
    pub cut: CutRule,
    /// Orderer selection as written.
    pub orderer: OrdererFile,
    /// Organizations by id.
    pub orgs: BTreeMap<OrgId, OrgInfo>,
    /// Clients by id.
    pub clients: BTreeMap<ClientId, ClientInfo>,
    /// Shared tables, lower case, in the order given.
    pub tables: Vec<String>,
    /// The CA certificate path when the network uses TLS (resolved).
    pub tls_ca: Option<PathBuf>,
    /// Whether proposals, responses, votes and queries are signed and checked.
    pub signatures: Signatures,
    /// The first block whose responses may be signed as a batch
    /// ([`NetworkFile::response_batches_from`]).
    pub response_batches_from: Option<u64>,
}

/// Largest block size accepted (bounds memory per block and the success bitmap).
pub const MAX_BLOCK_TXS: usize = 65_536;

struct Check<'a> {
    file: &'a Path,
}

impl Check<'_> {
    fn err(
        &self,
        key: impl Into<String>,
        value: impl fmt::Display,
        problem: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_path_buf(),
            key: key.into(),
            value: value.to_string(),
            problem: problem.into(),
        }
    }

    fn endpoint(&self, key: String, value: &str) -> Result<(), ConfigError> {
        let ok = value.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0)
        });
        if ok {
            Ok(())
        } else {
            Err(self.err(
                key,
                format!("{value:?}"),
                "expected host:port with a port from 1 to 65535",
            ))
        }
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        file: path.to_path_buf(),
        message: e.to_string().trim_end().to_owned(),
    })
}

impl NetworkConfig {
    /// Reads and validates a network file.
    pub fn load(path: &Path) -> Result<NetworkConfig, ConfigError> {
        Self::from_toml(&read(path)?, path)
    }

    /// Parses and validates network TOML; `path` is used in messages only.
    pub fn from_toml(text: &str, path: &Path) -> Result<NetworkConfig, ConfigError> {
        parse::<NetworkFile>(path, text)?.validate(path)
    }

    /// Whether responses signed as a batch count from some block on: an origin accepts a
    /// peer's batch, since a peer batches only from that block ([`Self::batches_at`]).
    pub fn counts_batches(&self) -> bool {
        self.response_batches_from.is_some()
    }

    /// Whether responses of block `block` may be signed as a batch.
    pub fn batches_at(&self, block: BlockNumber) -> bool {
        self.response_batches_from
            .is_some_and(|from| block.0 >= from)
    }
}

impl NetworkFile {
    /// Checks every value; errors name the key and the value.
    pub fn validate(self, path: &Path) -> Result<NetworkConfig, ConfigError> {
        let c = Check { file: path };
        let network_id = NetworkId::new(&self.network_id)
            .map_err(|e| c.err("network_id", format!("{:?}", self.network_id), e.problem))?;
        if self.orgs.is_empty() {
            return Err(c.err("orgs", "[]", "at least one organization is required"));
        }
        let mut orgs = BTreeMap::new();
        let mut names = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for (i, o) in self.orgs.iter().enumerate() {
            let key = |field: &str| format!("orgs[{i}].{field}");
            if o.id == 0 {
                return Err(c.err(key("id"), o.id, "organization ids start at 1"));
            }
            if orgs.contains_key(&OrgId(o.id)) {
                return Err(c.err(key("id"), o.id, "another organization has this id"));
            }
            if o.name.is_empty() || !names.insert(o.name.clone()) {
                return Err(c.err(
                    key("name"),
                    format!("{:?}", o.name),
                    "names must be non-empty and unique",
                ));
            }
            let public_key: PublicKey = o.public_key.parse().map_err(|e| {
                c.err(
                    key("public_key"),
                    format!("{:?}", o.public_key),
                    format!("{e}"),
                )
            })?;
            if !keys.insert(public_key) {
                return Err(c.err(
                    key("public_key"),
                    &o.public_key,
                    "another organization or client has this key",
                ));
            }
            c.endpoint(key("chainify_endpoint"), &o.chainify_endpoint)?;
            c.endpoint(key("commit_endpoint"), &o.commit_endpoint)?;
            orgs.insert(
                OrgId(o.id),
                OrgInfo {
                    id: OrgId(o.id),
                    name: o.name.clone(),
                    public_key,
                    chainify_endpoint: o.chainify_endpoint.clone(),
                    commit_endpoint: o.commit_endpoint.clone(),
                },
            );
        }
        let org_ids: BTreeSet<OrgId> = orgs.keys().copied().collect();
        let policy = |key: &str, text: &str| -> Result<AgreementPolicy, ConfigError> {
            let spec: PolicySpec = text
                .parse()
                .map_err(|e: String| c.err(key, format!("{text:?}"), e))?;
            AgreementPolicy::new(&spec, &org_ids)
                .map_err(|e| c.err(key, format!("{text:?}"), e.problem))
        };
        let agreement = policy("agreement_policy", &self.agreement_policy)?;
        let endorsement = match &self.endorsement_policy {
            Some(p) => policy("endorsement_policy", p)?,
            None => agreement.clone(),
        };
        if self.response_batches_from == Some(0) {
            return Err(c.err(
                "response_batches_from",
                0,
                "must be a block number, 1 or more",
            ));
        }
        if self.block.max_block_txs == 0 || self.block.max_block_txs > MAX_BLOCK_TXS {
            return Err(c.err(
                "block.max_block_txs",
                self.block.max_block_txs,
                "must be between 1 and 65536",
            ));
        }
        if self.block.batch_timeout_ms == 0 || self.block.batch_timeout_ms > 60_000 {
            return Err(c.err(
                "block.batch_timeout_ms",
                self.block.batch_timeout_ms,
                "must be between 1 and 60000",
            ));
        }
        match self.orderer.kind {
            OrdererKind::Local => {}
            OrdererKind::Solo => match &self.orderer.solo_endpoint {
                Some(e) => c.endpoint("orderer.solo_endpoint".into(), e)?,
                None => {
                    return Err(c.err(
                        "orderer.solo_endpoint",
                        "(missing)",
                        "required when orderer.kind = \"solo\"",
                    ));
                }
            },
            OrdererKind::Kafka => match &self.orderer.kafka_brokers {
                Some(b) => {
                    for broker in b.split(',') {
                        c.endpoint("orderer.kafka_brokers".into(), broker.trim())?;
                    }
                    if self.orderer.kafka_replication == 0 {
                        return Err(c.err("orderer.kafka_replication", "0", "at least 1 replica"));
                    }
                }
                None => {
                    return Err(c.err(
                        "orderer.kafka_brokers",
                        "(missing)",
                        "required when orderer.kind = \"kafka\"",
                    ));
                }
            },
        }
        let mut clients = BTreeMap::new();
        for (i, cl) in self.clients.iter().enumerate() {
            let key = |field: &str| format!("clients[{i}].{field}");
            let id = ClientId::new(&cl.id)
                .map_err(|e| c.err(key("id"), format!("{:?}", cl.id), e.problem))?;
            if clients.contains_key(&id) {
                return Err(c.err(
                    key("id"),
                    format!("{:?}", cl.id),
                    "another client has this id",
                ));
            }
            let public_key: PublicKey = cl.public_key.parse().map_err(|e| {
                c.err(
                    key("public_key"),
                    format!("{:?}", cl.public_key),
                    format!("{e}"),
                )
            })?;
            if !keys.insert(public_key) {
                return Err(c.err(
                    key("public_key"),
                    &cl.public_key,
                    "another organization or client has this key",
                ));
            }
            let mut grants: BTreeMap<String, BTreeSet<StatementKind>> = BTreeMap::new();
            for (j, g) in cl.grants.iter().enumerate() {
                if g.table.is_empty() {
                    return Err(c.err(
                        key(&format!("grants[{j}].table")),
                        "\"\"",
                        "name a table or `*`",
                    ));
                }
                grants
                    .entry(g.table.to_lowercase())
                    .or_default()
                    .extend(g.kinds.iter().copied());
            }
            clients.insert(
                id.clone(),
                ClientInfo {
                    id,
                    public_key,
                    grants,
                },
            );
        }
        let mut tables: Vec<String> = Vec::new();
        for (i, t) in self.tables.iter().enumerate() {
            let lower = t.to_lowercase();
            let plain = !lower.is_empty()
                && lower.len() <= 48
                && lower
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
                && !lower.starts_with(|ch: char| ch.is_ascii_digit());
            if !plain {
                return Err(c.err(
                    format!("tables[{i}]"),
                    format!("{t:?}"),
                    "expected a plain table name (letters, digits, _; at most 48 characters)",
                ));
            }
            if tables.contains(&lower) {
                return Err(c.err(format!("tables[{i}]"), format!("{t:?}"), "listed twice"));
            }
            tables.push(lower);
        }
        let base = path.parent().unwrap_or(Path::new("."));
        Ok(NetworkConfig {
            tables,
            tls_ca: self.tls.map(|t| base.join(t.ca)),
            network_id,
            agreement,
            endorsement,
            max_block_txs: self.block.max_block_txs,
            batch_timeout: std::time::Duration::from_millis(self.block.batch_timeout_ms),
            cut: self.block.cut,
            orderer: self.orderer,
            orgs,
            clients,
            signatures: self.signatures,
            response_batches_from: self.response_batches_from,
        })
    }
}

/// The organization file as written.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrgFile {
    /// Which organization of the network this is.
    pub org_id: u32,
    /// Path of the network file (relative paths are relative to this file).
    pub network_config: PathBuf,
    /// Path of the PKCS#8 signing key (relative to this file).
    pub signing_key: PathBuf,
    /// Database URL: `postgres://…`, `mysql://…` or `sqlite://…`.
    pub database_url: String,
    /// Listen addresses.
    pub listen: ListenFile,
    /// Execution settings.
    #[serde(default)]
    pub execution: ExecutionFile,
    /// Checkpoint settings.
    #[serde(default)]
    pub checkpoint: CheckpointFile,
    /// This organization's TLS server identity; required when the network uses TLS.
    #[serde(default)]
    pub tls: Option<OrgTlsFile>,
}

/// An organization's TLS identity (paths relative to the org file).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrgTlsFile {
    /// PEM certificate chain, signed by the network's CA.
    pub cert: PathBuf,
    /// PEM private key of the certificate.
    pub key: PathBuf,
}

/// Listen addresses of an organization's components.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenFile {
    /// ChainifyService + EndorsementService.
    pub chainify: String,
    /// CommitService.
    pub commit: String,
    /// AdminService.
    pub admin: String,
    /// Prometheus metrics.
    pub metrics: String,
    /// ExecutionService, when the execution component runs as its own process (`chainify node
    /// --component execution`); the commit component reaches it here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<String>,
    /// Prometheus metrics of the execution component when it runs as its own process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_execution: Option<String>,
    /// Prometheus metrics of the chainify component when it runs as its own process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_chainify: Option<String>,
    /// Let the AdminService and the ExecutionService listen beyond loopback. They authenticate
    /// no caller (a checkpoint or a restore on demand, blocks to execute), so by default they
    /// must listen on a loopback address; set this only behind a network of your own that
    /// lets no one else reach them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expose_internal: bool,
}

/// Whether `endpoint`'s host is a loopback address (`127.x.x.x`, `::1`, `localhost`).
fn is_loopback_endpoint(endpoint: &str) -> bool {
    let Some((host, _)) = endpoint.rsplit_once(':') else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Execution settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionFile {
    /// Connections executing transactions in parallel (1 = serial).
    #[serde(default = "default_parallelism")]
    pub parallelism: usize,
}

fn default_parallelism() -> usize {
    8
}

impl Default for ExecutionFile {
    fn default() -> Self {
        ExecutionFile {
            parallelism: default_parallelism(),
        }
    }
}

/// Checkpoint settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointFile {
    /// Take a checkpoint every this many agreed blocks.
    #[serde(default = "default_checkpoint_interval")]
    pub interval_blocks: u64,
    /// Keep this many checkpoints.
    #[serde(default = "default_checkpoints_kept")]
    pub kept: usize,
    /// Compare the shared tables with the ledger's state digest by a full scan at start and
    /// every this many blocks (in the background; a scan first rests for four times the
    /// previous one's length, so scans take at most a fifth of the time).
    #[serde(default = "default_state_check_interval")]
    pub state_check_interval: u64,
    /// The most bytes of one table's rows (as held in memory) a state transfer takes from a
    /// peer before it counts the peer as lying: another organization's stream of rows has no
    /// end of its own. Raise it for shared tables larger than that.
    #[serde(default = "default_transfer_max_bytes")]
    pub transfer_max_bytes: u64,
}

fn default_transfer_max_bytes() -> u64 {
    4 << 30
}

fn default_state_check_interval() -> u64 {
    100
}

fn default_checkpoint_interval() -> u64 {
    100
}
fn default_checkpoints_kept() -> usize {
    3
}

impl Default for CheckpointFile {
    fn default() -> Self {
        CheckpointFile {
            interval_blocks: default_checkpoint_interval(),
            kept: default_checkpoints_kept(),
            state_check_interval: default_state_check_interval(),
            transfer_max_bytes: default_transfer_max_bytes(),
        }
    }
}

/// A validated organization configuration, with paths resolved.
#[derive(Clone, Debug)]
pub struct OrgConfig {
    /// This organization.
    pub org_id: OrgId,
    /// The network it belongs to.
    pub network: NetworkConfig,
    /// Resolved key path.
    pub signing_key: PathBuf,
    /// Database URL.
    pub database_url: String,
    /// Listen addresses.
    pub listen: ListenFile,
    /// Execution settings.
    pub execution: ExecutionFile,
    /// Checkpoint settings.
    pub checkpoint: CheckpointFile,
    /// TLS identity (resolved paths), present exactly when the network uses TLS.
    pub tls: Option<OrgTlsFile>,
}

impl OrgConfig {
    /// Reads the org file and the network file it names, and validates both.
    pub fn load(path: &Path) -> Result<OrgConfig, ConfigError> {
        let file: OrgFile = parse(path, &read(path)?)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let network = NetworkConfig::load(&base.join(&file.network_config))?;
        file.validate(path, network)
    }
}

impl OrgFile {
    /// Checks every value against the network; relative paths resolve against `path`'s folder.
    pub fn validate(self, path: &Path, network: NetworkConfig) -> Result<OrgConfig, ConfigError> {
        let c = Check { file: path };
        let org_id = OrgId(self.org_id);
        if !network.orgs.contains_key(&org_id) {
            return Err(c.err(
                "org_id",
                self.org_id,
                "no organization with this id in the network file",
            ));
        }
        let scheme = self.database_url.split_once("://").map(|(s, _)| s);
        if !matches!(
            scheme,
            Some("postgres" | "postgresql" | "mysql" | "mariadb" | "sqlite")
        ) {
            return Err(c.err(
                "database_url",
                format!("{:?}", self.database_url),
                "expected a postgres://, mysql:// or sqlite:// URL",
            ));
        }
        for (key, addr) in [
            ("listen.chainify", &self.listen.chainify),
            ("listen.commit", &self.listen.commit),
            ("listen.admin", &self.listen.admin),
            ("listen.metrics", &self.listen.metrics),
        ] {
            c.endpoint(key.into(), addr)?;
        }
        for (key, addr) in [
            ("listen.execution", &self.listen.execution),
            ("listen.metrics_execution", &self.listen.metrics_execution),
            ("listen.metrics_chainify", &self.listen.metrics_chainify),
        ] {
            if let Some(addr) = addr {
                c.endpoint(key.into(), addr)?;
            }
        }
        if !self.listen.expose_internal {
            for (key, addr) in [
                ("listen.admin", Some(&self.listen.admin)),
                ("listen.execution", self.listen.execution.as_ref()),
            ] {
                if let Some(addr) = addr.filter(|a| !is_loopback_endpoint(a)) {
                    return Err(c.err(
                        key,
                        format!("{addr:?}"),
                        "must be a loopback address (127.0.0.1, [::1] or localhost): the service authenticates no caller; reach it through SSH or an authenticating proxy, or set listen.expose_internal = true behind a network of your own",
                    ));
                }
            }
        }
        if self.execution.parallelism == 0 || self.execution.parallelism > 1024 {
            return Err(c.err(
                "execution.parallelism",
                self.execution.parallelism,
                "must be between 1 and 1024",
            ));
        }
        if self.checkpoint.interval_blocks == 0 {
            return Err(c.err("checkpoint.interval_blocks", 0, "must be at least 1"));
        }
        if self.checkpoint.kept == 0 {
            return Err(c.err(
                "checkpoint.kept",
                0,
                "keep at least one checkpoint to recover from",
            ));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let tls = match (&network.tls_ca, self.tls) {
            (Some(_), Some(t)) => Some(OrgTlsFile {
                cert: base.join(t.cert),
                key: base.join(t.key),
            }),
            (None, None) => None,
            (Some(ca), None) => {
                return Err(c.err(
                    "tls",
                    "(missing)",
                    format!(
                        "the network uses TLS (CA {}); give this organization's tls.cert and tls.key",
                        ca.display()
                    ),
                ));
            }
            (None, Some(_)) => {
                return Err(c.err(
                    "tls",
                    "(present)",
                    "the network file has no [tls] section; add its CA or remove this one",
                ));
            }
        };
        Ok(OrgConfig {
            tls,
            org_id,
            network,
            signing_key: base.join(&self.signing_key),
            database_url: self.database_url,
            listen: self.listen,
            execution: self.execution,
            checkpoint: self.checkpoint,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PK1: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    const PK2: &str = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c";
    const PK3: &str = "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025";

    fn network(extra: &str) -> String {
        format!(
            r#"
network_id = "net"
agreement_policy = "any-2"
{extra}
[[orgs]]
id = 1
name = "a"
public_key = "{PK1}"
chainify_endpoint = "127.0.0.1:7001"
commit_endpoint = "127.0.0.1:7002"
[[orgs]]
id = 2
name = "b"
public_key = "{PK2}"
chainify_endpoint = "127.0.0.1:7011"
commit_endpoint = "127.0.0.1:7012"
[[orgs]]
id = 3
name = "c"
public_key = "{PK3}"
chainify_endpoint = "localhost:7021"
commit_endpoint = "localhost:7022"
"#
        )
    }

    fn load(text: &str) -> Result<NetworkConfig, ConfigError> {
        NetworkConfig::from_toml(text, Path::new("network.toml"))
    }

    #[test]
    fn valid_network_with_defaults() {
        let n = load(&network("")).unwrap();
        assert_eq!(n.orgs.len(), 3);
        assert_eq!(n.max_block_txs, 1024);
        assert_eq!(n.orderer.kind, OrdererKind::Local);
        assert_eq!(n.endorsement, n.agreement);
    }

    #[test]
    fn errors_name_key_and_value() {
        let e = load(&network("").replace(PK2, "xyz"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("network.toml: orgs[1].public_key = \"xyz\": public key is not hex"),
            "{e}"
        );
        let e = load(&network("").replace("any-2", "any-5"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "network.toml: agreement_policy = \"any-5\": k must be between 1 and the 3 organizations"
        );
        let e = load(&network("").replace("localhost:7022", "localhost"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("orgs[2].commit_endpoint = \"localhost\": expected host:port"),
            "{e}"
        );
        let e = load(&network("[block]\nmax_block_txs = 0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("block.max_block_txs = 0"), "{e}");
        let e = load(&network("signatures = \"none\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("signatures") && e.contains("none") && e.contains("`off`"),
            "{e}"
        );
        assert_eq!(
            load(&network("signatures = \"off\"")).unwrap().signatures,
            Signatures::Off
        );
        let e = load(&network("[orderer]\nkind = \"kafka\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("orderer.kafka_brokers"), "{e}");
        let e = load(&network("").replace("id = 3", "id = 2"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("orgs[2].id = 2: another organization has this id"),
            "{e}"
        );
    }

    #[test]
    fn blocks_are_cut_on_demand_unless_the_network_says_timeout() {
        assert_eq!(load(&network("")).unwrap().cut, CutRule::OnDemand);
        assert_eq!(
            load(&network("[block]\ncut = \"timeout\"")).unwrap().cut,
            CutRule::Timeout
        );
        let e = load(&network("[block]\ncut = \"never\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("never") && e.contains("on-demand") && e.contains("timeout"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        let e = load(&network("agreement = \"all\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `agreement`"), "{e}");
    }

    #[test]
    fn client_grants() {
        let text = format!(
            "{}\n[[clients]]\nid = \"alice\"\npublic_key = \"{}\"\n[[clients.grants]]\ntable = \"Checking\"\nkinds = [\"update\"]\n",
            network(""),
            "11".repeat(32)
        );
        let n = load(&text).unwrap();
        let alice = &n.clients[&ClientId::new("alice").unwrap()];
        assert!(alice.may(StatementKind::Update, "checking"));
        assert!(!alice.may(StatementKind::Delete, "checking"));
        assert!(!alice.may(StatementKind::Update, "savings"));
        let e = load(&text.replace(&"11".repeat(32), PK1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("clients[0].public_key") && e.contains("another organization or client"),
            "{e}"
        );
    }

    #[test]
    fn org_file_resolves_paths_and_checks_values() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("network.toml"), network("")).unwrap();
        let org = |url: &str, org_id: u32| {
            format!(
                "org_id = {org_id}\nnetwork_config = \"network.toml\"\nsigning_key = \"k.pk8\"\ndatabase_url = \"{url}\"\n\
                 [listen]\nchainify = \"127.0.0.1:1\"\ncommit = \"127.0.0.1:2\"\nadmin = \"127.0.0.1:3\"\nmetrics = \"127.0.0.1:4\"\n"
            )
        };
        let path = dir.path().join("org.toml");
        std::fs::write(&path, org("sqlite://x.db", 2)).unwrap();
        let cfg = OrgConfig::load(&path).unwrap();
        assert_eq!(cfg.org_id, OrgId(2));
        assert_eq!(cfg.signing_key, dir.path().join("k.pk8"));
        std::fs::write(&path, org("oracle://x", 2)).unwrap();
        let e = OrgConfig::load(&path).unwrap_err().to_string();
        assert!(e.contains("database_url = \"oracle://x\""), "{e}");
        std::fs::write(&path, org("sqlite://x.db", 9)).unwrap();
        let e = OrgConfig::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("org_id = 9: no organization with this id"),
            "{e}"
        );
        // The services that authenticate no caller stay on loopback unless exposed on purpose.
        let listening = |listen: &str| {
            std::fs::write(
                &path,
                org("sqlite://x.db", 2).replace("admin = \"127.0.0.1:3\"", listen),
            )
            .unwrap();
            OrgConfig::load(&path).map_err(|e| e.to_string())
        };
        for fine in [
            "admin = \"[::1]:3\"",
            "admin = \"localhost:3\"",
            "admin = \"127.0.0.9:3\"",
            "admin = \"127.0.0.1:3\"\nexecution = \"127.0.0.1:5\"",
            "admin = \"0.0.0.0:3\"\nexecution = \"10.0.0.2:5\"\nexpose_internal = true",
        ] {
            listening(fine).unwrap_or_else(|e| panic!("{fine}: {e}"));
        }
        for (exposed, key) in [
            ("admin = \"0.0.0.0:3\"", "listen.admin = \"0.0.0.0:3\""),
            ("admin = \"[::]:3\"", "listen.admin = \"[::]:3\""),
            ("admin = \"org2.example.net:3\"", "listen.admin"),
            (
                "admin = \"127.0.0.1:3\"\nexecution = \"10.0.0.2:5\"",
                "listen.execution = \"10.0.0.2:5\"",
            ),
        ] {
            let e = listening(exposed).expect_err(exposed);
            assert!(
                e.contains(key)
                    && e.contains("must be a loopback address")
                    && e.contains("expose_internal"),
                "{exposed}: {e}"
            );
        }
    }
}
