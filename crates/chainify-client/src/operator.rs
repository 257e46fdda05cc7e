//! What an operator's tools read from an organization: its status over the AdminService and its
//! ledger over the CommitService, and the proof of a transaction's outcome from it. `chainify
//! status`, `verify-ledger`, `tx-status --prove`, `devnet` and `bench --devnet` use it.

use std::time::Duration;

use chainify_core::OrgId;
use chainify_core::config::{NetworkConfig, OrgConfig};
use chainify_core::tx::{LedgerEntry, TxOutcome};
use chainify_core::votes::VoteContext;
use chainify_proto::pb;
use futures_util::StreamExt;
use tonic::transport::Channel;

use crate::{ClientError, channel};

/// A client of an organization's AdminService.
pub type AdminClient = pb::admin_service_client::AdminServiceClient<Channel>;

/// The network's CA certificate (PEM), when it uses TLS.
pub fn network_ca(network: &NetworkConfig) -> Result<Option<Vec<u8>>, ClientError> {
    network
        .tls_ca
        .as_ref()
        .map(|p| {
            std::fs::read(p)
                .map_err(|e| ClientError::Setup(format!("CA certificate {}: {e}", p.display())))
        })
        .transpose()
}

/// A client of the AdminService of the organization configured by `org` (connecting on first
/// use).
pub fn admin_client(org: &OrgConfig) -> Result<AdminClient, ClientError> {
    let ca = network_ca(&org.network)?;
    Ok(AdminClient::new(channel(
        &org.listen.admin,
        ca.as_deref(),
        &org.org_id.tls_name(),
    )?))
}

/// The organization's status, within 2 s.
pub async fn status(admin: &mut AdminClient) -> Result<pb::StatusResponse, ClientError> {
    let mut request = tonic::Request::new(pb::StatusRequest {});
    request.set_timeout(Duration::from_secs(2));
    Ok(admin.status(request).await?.into_inner())
}

/// `org`'s whole ledger, over its CommitService.
pub async fn read_ledger(
    network: &NetworkConfig,
    org: OrgId,
) -> Result<Vec<LedgerEntry>, ClientError> {
    read_entries(network, org, 1, 0).await
}

/// Blocks `from..=to` of `org`'s ledger (`to` 0: to its newest), over its CommitService.
pub async fn read_entries(
    network: &NetworkConfig,
    org: OrgId,
    from: u64,
    to: u64,
) -> Result<Vec<LedgerEntry>, ClientError> {
    let info = network.orgs.get(&org).ok_or_else(|| {
        ClientError::Setup(format!("organization {} is not in the network", org.0))
    })?;
    let channel = channel(
        &info.commit_endpoint,
        network_ca(network)?.as_deref(),
        &org.tls_name(),
    )?;
    let mut commit = pb::commit_service_client::CommitServiceClient::new(channel)
        .max_decoding_message_size(256 * 1024 * 1024);
    let mut stream = commit
        .get_ledger(pb::GetLedgerRequest {
            from_block: from,
            to_block: to,
            // Anyone's read: a place of the caller's address.
            auth: None,
        })
        .await?
        .into_inner();
    let mut entries = Vec::new();
    while let Some(e) = stream.next().await {
        let n = from + entries.len() as u64;
        entries.push(LedgerEntry::try_from(e?).map_err(|e| {
            ClientError::Protocol(format!("ledger entry {n} of {org} is malformed: {e}"))
        })?);
    }
    Ok(entries)
}

/// Proves `outcome`, as any organization reported it, by the agreed block organization `from`
/// serves: the block certified under the network's agreement policy must hold the transaction
/// at the outcome's index with the outcome's success ([`chainify_core::votes::prove_outcome`]).
/// Returns that ledger entry, which shows the outcome to anyone holding the network file; `from`
/// need not be trusted, nor the organization that reported the outcome. The abort reason is
/// not proven.
pub async fn prove_outcome(
    network: &NetworkConfig,
    from: OrgId,
    outcome: &TxOutcome,
) -> Result<LedgerEntry, ClientError> {
    let b = outcome.block.0;
    let entry = read_entries(network, from, b, b)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| {
            ClientError::Protocol(format!(
                "organization {} has no agreed block {b} to prove transaction {} by",
                from.0, outcome.tx_id
            ))
        })?;
    chainify_core::votes::prove_outcome(&entry, &VoteContext::of(network), outcome)
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    Ok(entry)
}
