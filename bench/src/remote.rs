//! `chainify bench --devnet DIR`: a network of processes (from `chainify devnet up`) driven the
//! way its users drive it — SDK clients over gRPC, each submitting and waiting for the agreed
//! outcome at its organization — with heights from the AdminServices, time per phase from the
//! Prometheus endpoints, and the ledgers compared over the CommitServices at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chainify_client::{Client, Identity};
use chainify_core::OrgId;
use chainify_core::config::{NetworkConfig, OrgConfig};
use chainify_node::metrics::Phase;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use crate::drive::{Counters, Generator};

/// A running devnet, as its files describe it.
#[allow(missing_debug_implementations)] // holds tasks and connections
pub struct Devnet {
    pub dir: PathBuf,
    pub network: NetworkConfig,
    configs: BTreeMap<OrgId, OrgConfig>,
    /// One AdminService connection per organization, kept across samples.
    admins: BTreeMap<OrgId, chainify_client::operator::AdminClient>,
}

impl Devnet {
    pub fn open(dir: &Path) -> anyhow::Result<Devnet> {
        let network = NetworkConfig::load(&dir.join("network.toml"))
            .with_context(|| format!("--devnet {}: not a network directory", dir.display()))?;
        let configs = network
            .orgs
            .keys()
            .map(|org| {
                let cfg = OrgConfig::load(&dir.join(format!("{org}/org.toml")))?;
                Ok((*org, cfg))
            })
            .collect::<anyhow::Result<BTreeMap<_, _>>>()?;
        let admins = configs
            .iter()
            .map(|(org, cfg)| Ok((*org, chainify_client::operator::admin_client(cfg)?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Devnet {
            dir: dir.to_owned(),
            network,
            configs,
            admins,
        })
    }

    /// The Smallbank accounts `devnet up` loaded.
    pub fn accounts(&self) -> anyhow::Result<u64> {
        let path = self.dir.join(crate::devnet::ACCOUNTS_FILE);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "{}: missing (was the network started with `chainify devnet up`?)",
                path.display()
            )
        })?;
        text.trim()
            .parse()
            .with_context(|| format!("{}: {:?} is not a number", path.display(), text.trim()))
    }

    /// The agreement policy as the network file writes it.
    pub fn policy(&self) -> String {
        std::fs::read_to_string(self.dir.join("network.toml"))
            .ok()
            .and_then(|t| toml::from_str::<chainify_core::config::NetworkFile>(&t).ok())
            .map_or_else(|| "?".into(), |f| f.agreement_policy)
    }

    /// Each organization's engine, from its database URL.
    pub fn engines(&self) -> Vec<String> {
        self.configs
            .values()
            .map(|c| {
                match c.database_url.split("://").next().unwrap_or("") {
                    "postgres" | "postgresql" => "postgres",
                    "mysql" | "mariadb" => "mariadb",
                    other => other,
                }
                .to_owned()
            })
            .collect()
    }

    /// Every organization's newest agreed block, from its AdminService.
    pub async fn heights(&self) -> anyhow::Result<BTreeMap<OrgId, u64>> {
        let mut out = BTreeMap::new();
        for (org, admin) in &self.admins {
            let status = chainify_client::operator::status(&mut admin.clone())
                .await
                .with_context(|| format!("{org}'s AdminService"))?;
            out.insert(*org, status.agreed_height);
        }
        Ok(out)
    }

    /// Sums and counts of every phase per organization, added over its processes' metrics
    /// endpoints, with the sum of its process ids (a restarted process counts afresh).
    pub async fn phases(&self) -> BTreeMap<OrgId, (u64, Vec<(f64, u64)>)> {
        let mut out = BTreeMap::new();
        for (org, cfg) in &self.configs {
            let mut sums = vec![(0.0, 0); Phase::ALL.len()];
            let listen = &cfg.listen;
            let endpoints = [
                Some(&listen.metrics),
                listen.metrics_execution.as_ref(),
                listen.metrics_chainify.as_ref(),
            ];
            for addr in endpoints.into_iter().flatten() {
                if let Some(text) = scrape(addr).await {
                    for (i, (s, c)) in phase_sums(&text).into_iter().enumerate() {
                        sums[i].0 += s;
                        sums[i].1 += c;
                    }
                }
            }
            let token = crate::devnet::processes(&self.dir)
                .iter()
                .filter_map(|p| {
                    crate::devnet::read_pid(&crate::devnet::pid_file(&self.dir, org.0, p))
                })
                .map(u64::from)
                .sum();
            out.insert(*org, (token, sums));
        }
        out
    }

    /// Whether every organization holds the same ledger (block hashes) up to the lowest
    /// height: the number of blocks compared, or what differs.
    pub async fn ledgers_agree(&self) -> anyhow::Result<Result<usize, String>> {
        let mut ledgers = Vec::new();
        for org in self.configs.keys() {
            ledgers.push((
                *org,
                chainify_client::operator::read_ledger(&self.network, *org)
                    .await
                    .with_context(|| format!("reading the ledger of {org}"))?,
            ));
        }
        let Some(shortest) = ledgers.iter().map(|(_, l)| l.len()).min() else {
            return Ok(Ok(0));
        };
        let (first, reference) = &ledgers[0];
        for (org, ledger) in &ledgers[1..] {
            for (a, b) in reference.iter().zip(ledger).take(shortest) {
                if a.block.hash() != b.block.hash() {
                    return Ok(Err(format!(
                        "{first} and {org} differ at block {}",
                        a.block.number
                    )));
                }
            }
        }
        Ok(Ok(shortest))
    }
}

/// `GET /metrics` over plain HTTP/1.0; `None` when nothing answers there.
async fn scrape(addr: &str) -> Option<String> {
    let within = Duration::from_secs(2);
    let mut stream = tokio::time::timeout(within, tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut body = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut body))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8(body).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.contains(" 200 ").then(|| body.to_owned())
}

/// The `chainify_phase_seconds` sums and counts of a scrape, in [`Phase::ALL`] order.
fn phase_sums(text: &str) -> Vec<(f64, u64)> {
    let mut out = vec![(0.0, 0); Phase::ALL.len()];
    for line in text.lines() {
        let (sum, rest) = if let Some(r) = line.strip_prefix("chainify_phase_seconds_sum{") {
            (true, r)
        } else if let Some(r) = line.strip_prefix("chainify_phase_seconds_count{") {
            (false, r)
        } else {
            continue;
        };
        let Some(name) = rest
            .split_once("phase=\"")
            .and_then(|(_, r)| r.split_once('"'))
            .map(|(n, _)| n)
        else {
            continue;
        };
        let Some(i) = Phase::ALL.iter().position(|p| p.name() == name) else {
            continue;
        };
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        if sum {
            out[i].0 = value;
        } else {
            out[i].1 = value as u64;
        }
    }
    out
}

/// Closed-loop SDK clients spread over the organizations' ChainifyServices.
#[allow(missing_debug_implementations)] // holds tasks and connections
pub struct RemoteLoad {
    pub counters: Arc<Counters>,
    /// Submissions that failed (overload, a peer's refusal, a deadline); the client goes on
    /// with its next transaction.
    pub refused: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    clients: Vec<JoinHandle<anyhow::Result<()>>>,
}

impl RemoteLoad {
    /// Connects one client per generator (client `i` to organization `i mod n`) as `client1`.
    pub async fn start(devnet: &Devnet, generators: Vec<Generator>) -> anyhow::Result<RemoteLoad> {
        let key = devnet.dir.join("clients/client1.pk8");
        let ca = chainify_client::operator::network_ca(&devnet.network)?;
        let orgs: Vec<(OrgId, &str)> = devnet
            .network
            .orgs
            .values()
            .map(|o| (o.id, o.chainify_endpoint.as_str()))
            .collect();
        let counters = Arc::new(Counters::default());
        let refused = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut clients = Vec::new();
        for (i, generator) in generators.into_iter().enumerate() {
            let (org, endpoint) = orgs[i % orgs.len()];
            let mut connect = Client::connect(
                endpoint,
                devnet.network.network_id.as_str(),
                org,
                Identity::load("client1", &key)?,
            );
            if let Some(ca) = &ca {
                connect = connect.tls_ca_pem(ca.clone());
            }
            let client = connect
                .connect()
                .await
                .with_context(|| format!("connecting to {endpoint}"))?;
            clients.push(tokio::spawn(remote_client(
                client,
                generator,
                counters.clone(),
                refused.clone(),
                stop.clone(),
            )));
        }
        Ok(RemoteLoad {
            counters,
            refused,
            stop,
            clients,
        })
    }

    /// Stops the clients after their transaction under way is agreed.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.await??;
        }
        Ok(())
    }
}

/// Submits one transaction at a time and waits for its agreed outcome.
async fn remote_client(
    client: Client,
    mut workload: Generator,
    counters: Arc<Counters>,
    refused: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut refusals_in_a_row = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let submitted = Instant::now();
        match client.submit_and_wait(workload.next_tx()).await {
            Ok(outcome) => {
                refusals_in_a_row = 0;
                counters.committed.fetch_add(1, Ordering::Relaxed);
                if outcome.success {
                    counters.succeeded.fetch_add(1, Ordering::Relaxed);
                }
                counters
                    .latencies_us
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(submitted.elapsed().as_micros() as u64);
            }
            Err(e) => {
                // Overload and a peer's refusal are answers the load must ride out; a network
                // that refuses everything for a minute is broken.
                refused.fetch_add(1, Ordering::Relaxed);
                refusals_in_a_row += 1;
                if refusals_in_a_row > 6000 {
                    bail!("every submission refused for a minute; the last: {e}");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_sums_read_the_prometheus_histogram() {
        let text = "# TYPE chainify_phase_seconds histogram\n\
            chainify_phase_seconds_bucket{phase=\"execute\",le=\"0.001\"} 3\n\
            chainify_phase_seconds_sum{phase=\"execute\"} 0.25\n\
            chainify_phase_seconds_count{phase=\"execute\"} 10\n\
            chainify_phase_seconds_sum{phase=\"vote\"} 1.5e-2\n\
            chainify_phase_seconds_count{phase=\"vote\"} 3\n\
            chainify_phase_seconds_sum{phase=\"unknown\"} 9\n\
            chainify_block_height{component=\"commit\"} 7\n";
        let sums = phase_sums(text);
        let at = |p: Phase| sums[Phase::ALL.iter().position(|q| *q == p).unwrap()];
        assert_eq!(at(Phase::Execute), (0.25, 10));
        assert_eq!(at(Phase::Vote), (0.015, 3));
        assert_eq!(at(Phase::Append), (0.0, 0));
    }
}
