//! `ChainifyService.Query`: a signed, granted, read-only SELECT on the organization's database
//! at an agreed block height.

use chainify_core::crypto::Signature;
use chainify_core::tx::QueryBody;
use chainify_core::{ClientId, Value};
use chainify_orderer::Orderer;
use chainify_proto::pb;
use chainify_storage::{Backend, StorageError};
use tonic::Status;

use crate::chainify::Shared;
use crate::invalid;

impl<B: Backend + 'static, O: Orderer + 'static> Shared<B, O> {
    pub(crate) async fn query(
        &self,
        request: pb::QueryRequest,
    ) -> Result<pb::QueryResponse, Status> {
        let mut params = Vec::with_capacity(request.params.len());
        for (i, p) in request.params.into_iter().enumerate() {
            params.push(Value::try_from(p).map_err(|e| invalid(&format!("params[{i}]"), &e))?);
        }
        let id = ClientId::new(&request.client_id)
            .map_err(|e| Status::invalid_argument(format!("client_id: {}", e.problem)))?;
        let client = self.network.clients.get(&id).ok_or_else(|| {
            Status::unauthenticated(format!(
                "unknown client {:?}: not in network {}",
                request.client_id, self.network.network_id
            ))
        })?;
        let signature = Signature::try_from(request.signature.as_slice()).map_err(|_| {
            Status::unauthenticated(format!(
                "signature: expected 64 bytes, got {}",
                request.signature.len()
            ))
        })?;
        let body = QueryBody {
            client: id,
            network: self.network.network_id.clone(),
            sql: request.sql,
            params,
        };
        body.verify(&client.public_key, &signature).map_err(|_| {
            Status::unauthenticated(format!(
                "the signature of the query by client {:?} does not verify for network {}",
                body.client.as_str(),
                self.network.network_id
            ))
        })?;
        let plan = self
            .analyzer
            .query(&body.sql, &body.params)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        plan.check_grants(client)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        let guard = tokio::time::timeout(self.settings.query_wait, self.gate.read())
            .await
            .map_err(|_| {
                Status::unavailable(format!(
                    "the node did not reach an agreed state within {:?} (recovering or \
                     waiting for agreement); try again",
                    self.settings.query_wait
                ))
            })?;
        let result = self
            .store
            .query_rows(&plan, &body.params)
            .await
            .map_err(|e| match e {
                StorageError::Query(_) | StorageError::Database { .. } => {
                    Status::invalid_argument(e.to_string())
                }
                other => Status::unavailable(other.to_string()),
            })?;
        let height = guard.height.map_or(0, |b| b.0);
        drop(guard);
        Ok(pb::QueryResponse {
            columns: result.columns,
            rows: result
                .rows
                .iter()
                .map(|r| pb::Row {
                    values: r.iter().map(pb::Value::from).collect(),
                })
                .collect(),
            block_height: height,
        })
    }
}
