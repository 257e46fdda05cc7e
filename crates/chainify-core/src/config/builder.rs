//! One typed builder of network files: `chainify init` writes what it builds, devnet goes
//! through `init`, and the in-process cluster and the tests validate it in memory. One port
//! scheme for all of them ([`PortPlan`]).

use std::path::Path;

use super::{
    BlockFile, ClientEntry, ConfigError, CutRule, GrantEntry, ListenFile, NetworkConfig,
    NetworkFile, NetworkTlsFile, OrdererFile, OrgEntry, StatementKind,
};
use crate::crypto::{PublicKey, Signatures};

/// The services of one organization, each on its own port (the offset from the organization's
/// first port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// ChainifyService + EndorsementService.
    Chainify = 0,
    /// CommitService.
    Commit = 1,
    /// AdminService.
    Admin = 2,
    /// Prometheus metrics of the node.
    Metrics = 3,
    /// ExecutionService, when the execution component runs as its own process.
    Execution = 4,
    /// Metrics of the execution component in its own process.
    MetricsExecution = 5,
    /// Metrics of the chainify component in its own process.
    MetricsChainify = 6,
}

/// Ports from `base` on: organization `i` (1-based) uses `base + 10·(i−1)` plus its
/// [`Service`]'s offset, and the solo orderer the first port after the last organization's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortPlan {
    /// The first organization's first port.
    pub base: u16,
}

impl PortPlan {
    /// Ports set aside per organization.
    pub const PER_ORG: u32 = 10;

    /// The port of `service` of organization `org` (1-based). `u32` because a plan may run
    /// past 65535; [`PortPlan::check`] says so before anything listens.
    pub fn port(&self, org: u32, service: Service) -> u32 {
        u32::from(self.base) + Self::PER_ORG * (org.saturating_sub(1)) + service as u32
    }

    /// The solo orderer's port in a network of `orgs` organizations.
    pub fn orderer(&self, orgs: u32) -> u32 {
        self.port(orgs + 1, Service::Chainify)
    }

    /// Fails with the last port needed when `orgs` organizations and the orderer do not fit
    /// below 65536.
    pub fn check(&self, orgs: u32) -> Result<(), u32> {
        let last = self.orderer(orgs) + 1;
        if last > u32::from(u16::MAX) {
            return Err(last);
        }
        Ok(())
    }

    /// Where organization `org` listens: the chainify and commit services on `public` (what
    /// other machines reach), the rest on loopback.
    pub fn listen(&self, org: u32, public: &str) -> ListenFile {
        let at = |host: &str, service| format!("{host}:{}", self.port(org, service));
        ListenFile {
            chainify: at(public, Service::Chainify),
            commit: at(public, Service::Commit),
            admin: at("127.0.0.1", Service::Admin),
            metrics: at("127.0.0.1", Service::Metrics),
            execution: Some(at("127.0.0.1", Service::Execution)),
            metrics_execution: Some(at("127.0.0.1", Service::MetricsExecution)),
            metrics_chainify: Some(at("127.0.0.1", Service::MetricsChainify)),
            expose_internal: false,
        }
    }
}

/// Every statement kind on every shared table.
pub fn all_grants() -> Vec<GrantEntry> {
    vec![GrantEntry {
        table: "*".into(),
        kinds: vec![
            StatementKind::Select,
            StatementKind::Insert,
            StatementKind::Update,
            StatementKind::Delete,
        ],
    }]
}

/// Builds a [`NetworkFile`]: organizations get ids 1, 2, … in the order they are added, named
/// `orgN`, their endpoints from the [`PortPlan`].
#[derive(Clone, Debug)]
pub struct NetworkBuilder {
    file: NetworkFile,
    ports: PortPlan,
}

impl NetworkBuilder {
    /// A network `network_id` with agreement policy `agreement_policy` (`any-2`, `all`, …),
    /// default block cutting, the local orderer, plaintext and signatures on.
    pub fn new(network_id: &str, agreement_policy: &str, ports: PortPlan) -> NetworkBuilder {
        NetworkBuilder {
            file: NetworkFile {
                network_id: network_id.to_owned(),
                agreement_policy: agreement_policy.to_owned(),
                endorsement_policy: None,
                block: BlockFile::default(),
                orderer: OrdererFile::default(),
                orgs: Vec::new(),
                clients: Vec::new(),
                tables: Vec::new(),
                tls: None,
                signatures: Signatures::Ed25519Zip215,
                response_batches_from: Some(1),
            },
            ports,
        }
    }

    /// A block ends after `max_block_txs` transactions or when its oldest waited
    /// `batch_timeout_ms` (or on demand, unless [`NetworkBuilder::cut`] says otherwise).
    pub fn block(mut self, max_block_txs: usize, batch_timeout_ms: u64) -> Self {
        self.file.block = BlockFile {
            max_block_txs,
            batch_timeout_ms,
            cut: self.file.block.cut,
        };
        self
    }

    /// When a block that has not filled up is cut.
    pub fn cut(mut self, rule: CutRule) -> Self {
        self.file.block.cut = rule;
        self
    }

    /// An endorsement policy other than the agreement policy.
    pub fn endorsement_policy(mut self, policy: &str) -> Self {
        self.file.endorsement_policy = Some(policy.to_owned());
        self
    }

    /// The orderer.
    pub fn orderer(mut self, orderer: OrdererFile) -> Self {
        self.file.orderer = orderer;
        self
    }

    /// The shared tables.
    pub fn tables(mut self, tables: &[String]) -> Self {
        self.file.tables = tables.to_vec();
        self
    }

    /// TLS, with the network's CA certificate at `ca` (relative to the network file).
    pub fn tls(mut self, ca: &Path) -> Self {
        self.file.tls = Some(NetworkTlsFile { ca: ca.to_owned() });
        self
    }

    /// The signature rule, or off (default: `ed25519-zip215`).
    pub fn signatures(mut self, signatures: Signatures) -> Self {
        self.file.signatures = signatures;
        self
    }

    /// From which block responses may be signed as batches (default: 1; `None`: never).
    pub fn response_batches_from(mut self, from: Option<u64>) -> Self {
        self.file.response_batches_from = from;
        self
    }

    /// Adds the next organization, reached at `host`; returns its id.
    pub fn org(&mut self, public_key: &PublicKey, host: &str) -> u32 {
        let id = self.file.orgs.len() as u32 + 1;
        self.file.orgs.push(OrgEntry {
            id,
            name: format!("org{id}"),
            public_key: public_key.to_string(),
            chainify_endpoint: format!("{host}:{}", self.ports.port(id, Service::Chainify)),
            commit_endpoint: format!("{host}:{}", self.ports.port(id, Service::Commit)),
        });
        id
    }

    /// Adds a client with `grants` ([`all_grants`] for everything).
    pub fn client(&mut self, id: &str, public_key: &PublicKey, grants: Vec<GrantEntry>) {
        self.file.clients.push(ClientEntry {
            id: id.to_owned(),
            public_key: public_key.to_string(),
            grants,
        });
    }

    /// The solo orderer's endpoint in this plan, once every organization is added.
    pub fn solo_endpoint(&self) -> String {
        format!(
            "127.0.0.1:{}",
            self.ports.orderer(self.file.orgs.len() as u32)
        )
    }

    /// The network file (serde form), to write.
    pub fn build(self) -> NetworkFile {
        self.file
    }

    /// The validated network, for use in memory; `name` stands for the file in messages.
    pub fn config(self, name: &str) -> Result<NetworkConfig, ConfigError> {
        self.file.validate(Path::new(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::SigningKey;

    fn key() -> PublicKey {
        SigningKey::generate().expect("key").0.public_key()
    }

    #[test]
    fn organizations_get_ids_names_and_ports_in_order_and_the_result_validates() {
        let mut b = NetworkBuilder::new("net", "any-2", PortPlan { base: 7010 }).block(64, 20);
        assert_eq!(b.org(&key(), "127.0.0.1"), 1);
        assert_eq!(b.org(&key(), "10.0.0.2"), 2);
        b.client("client", &key(), all_grants());
        assert_eq!(b.solo_endpoint(), "127.0.0.1:7030");
        let file = b.clone().build();
        assert_eq!(file.orgs[1].name, "org2");
        assert_eq!(file.orgs[1].chainify_endpoint, "10.0.0.2:7020");
        assert_eq!(file.orgs[1].commit_endpoint, "10.0.0.2:7021");
        let config = b.config("generated").expect("valid");
        assert_eq!(config.orgs.len(), 2);
        assert_eq!(config.max_block_txs, 64);
    }

    #[test]
    fn the_plan_refuses_ports_past_65535_and_puts_internal_services_on_loopback() {
        let plan = PortPlan { base: 65000 };
        assert!(plan.check(40).is_ok());
        assert_eq!(plan.check(60), Err(65000 + 10 * 60 + 1));
        let listen = PortPlan { base: 17100 }.listen(2, "0.0.0.0");
        assert_eq!(listen.chainify, "0.0.0.0:17110");
        assert_eq!(listen.admin, "127.0.0.1:17112");
        assert_eq!(listen.metrics_chainify.as_deref(), Some("127.0.0.1:17116"));
    }

    #[test]
    fn a_policy_naming_an_organization_not_added_is_refused_by_name() {
        let mut b = NetworkBuilder::new("net", "[[1,3]]", PortPlan { base: 7010 });
        b.org(&key(), "127.0.0.1");
        let err = b
            .config("generated")
            .expect_err("org 3 missing")
            .to_string();
        assert!(err.contains("agreement_policy"), "{err}");
    }
}
