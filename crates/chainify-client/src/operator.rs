//! What an operator's tools read from an organization: its status over the AdminService and its
//! whole ledger over the CommitService. `chainify status`, `verify-ledger`, `devnet` and
//! `bench --devnet` use it.

use std::time::Duration;

use chainify_core::OrgId;
use chainify_core::config::{NetworkConfig, OrgConfig};
use chainify_core::tx::LedgerEntry;
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
            from_block: 1,
            to_block: 0,
        })
        .await?
        .into_inner();
    let mut entries = Vec::new();
    while let Some(e) = stream.next().await {
        let n = entries.len() + 1;
        entries.push(LedgerEntry::try_from(e?).map_err(|e| {
            ClientError::Protocol(format!("ledger entry {n} of {org} is malformed: {e}"))
        })?);
    }
    Ok(entries)
}
