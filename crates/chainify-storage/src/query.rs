//! Read-only queries for clients (`ChainifyService.Query`) and transaction lookups.

use chainify_core::{BlockNumber, TxId, Value};
use chainify_sql::{MAX_QUERY_ROWS, QueryPlan};

use crate::ddl::ReadType;
use crate::{Backend, StorageError, Store};

/// The result of a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryResult {
    /// Column names.
    pub columns: Vec<String>,
    /// Rows of values typed as the columns are.
    pub rows: Vec<Vec<Value>>,
}

impl<B: Backend> Store<B> {
    /// Runs a checked read-only query with its parameters (never spliced into the text).
    pub async fn query_rows(
        &self,
        query: &QueryPlan,
        params: &[Value],
    ) -> Result<QueryResult, StorageError> {
        self.off_runtime(async {
            let rendered = query.typed.rendered(self.backend().dialect());
            let mut bound = Vec::with_capacity(rendered.bind_order.len());
            for &p in &rendered.bind_order {
                bound.push(params.get(p).ok_or_else(|| {
                    StorageError::Query(format!(
                        "uses ${} but {} parameters were given",
                        p + 1,
                        params.len()
                    ))
                })?);
            }
            // The rendered query asks for at most one row more than allowed (the cap is part of
            // its text), which tells an oversized result from a full one.
            let text = &rendered.sql;
            let types: Vec<ReadType> = query.columns.iter().map(|c| ReadType::of(&c.ty)).collect();
            let rows = self.query("running a query", text, &bound, &types).await?;
            if rows.len() > MAX_QUERY_ROWS {
                return Err(StorageError::Query(format!(
                    "the result has more than {MAX_QUERY_ROWS} rows; narrow the WHERE clause or page \
                     with ORDER BY … LIMIT"
                )));
            }
            Ok(QueryResult {
                columns: query.columns.iter().map(|c| c.name.clone()).collect(),
                rows,
            })
        })
        .await
    }

    /// The block an applied transaction is in (agreed or not yet), if any.
    pub async fn transaction_block(&self, id: &TxId) -> Result<Option<BlockNumber>, StorageError> {
        let rows = self
            .query(
                "looking up a transaction",
                &format!(
                    "SELECT block FROM chainify_tx_index WHERE tx_id = {}",
                    crate::ddl::placeholder(self.backend().dialect(), 1)
                ),
                &[&Value::Bytes(id.0.as_bytes().to_vec())],
                &[ReadType::Int],
            )
            .await?;
        Ok(match rows.first().and_then(|r| r.first()) {
            Some(Value::Int(b)) => u64::try_from(*b).ok().map(BlockNumber),
            _ => None,
        })
    }
}
