//! Read-only queries for clients (`ChainifyService.Query`) and transaction lookups.

use std::time::{Duration, Instant};

use chainify_core::{BlockNumber, TxId, Value};
use chainify_sql::{MAX_QUERY_ROWS, QueryPlan};

use crate::backend::Conn;
use crate::ddl::ReadType;
use crate::{Backend, StorageError, Store};

/// The most bytes a query's answer may hold unless the caller says otherwise
/// ([`ReadSnapshot::max_answer_bytes`]), counted as [`crate::backend::row_bytes`] counts them:
/// half the 64 MiB of a gRPC message the answer travels in, so its encoding always fits.
pub const MAX_ANSWER_BYTES: usize = 32 << 20;

/// The result of a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryResult {
    /// Column names.
    pub columns: Vec<String>,
    /// Rows of values typed as the columns are.
    pub rows: Vec<Vec<Value>>,
}

/// A read-only snapshot of the database, fixed when it was taken, for a client query
/// ([`Store::read_snapshot`]). It holds back no writer, so the node may execute blocks while the
/// query runs; the engine stops any statement of it that runs longer than its limit.
pub struct ReadSnapshot<'s, B: Backend> {
    store: &'s Store<B>,
    conn: B::Conn,
    limit: Duration,
    /// The most bytes the answer may hold: reading stops past it.
    max_bytes: usize,
    /// Before the limit began (SQLite's deadline counts from the snapshot, the others' from
    /// each statement).
    taken: Instant,
    height: Option<BlockNumber>,
}

impl<B: Backend> std::fmt::Debug for ReadSnapshot<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadSnapshot")
            .field("limit", &self.limit)
            .field("max_bytes", &self.max_bytes)
            .field("height", &self.height)
            .finish_non_exhaustive()
    }
}

/// A connection held for a client query, before its snapshot is taken ([`Store::query_conn`]):
/// waiting for the pool happens here, not while the caller holds back block execution.
pub struct QueryConn<'s, B: Backend> {
    store: &'s Store<B>,
    conn: B::Conn,
}

impl<B: Backend> std::fmt::Debug for QueryConn<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryConn").finish_non_exhaustive()
    }
}

impl<B: Backend> Store<B> {
    /// Takes a connection for a client query, ready to take its snapshot without waiting.
    pub async fn query_conn(&self) -> Result<QueryConn<'_, B>, StorageError> {
        let mut conn = self.acquire("taking a connection for a query").await?;
        conn.ready_to_read().await;
        Ok(QueryConn { store: self, conn })
    }

    /// Takes a read snapshot of the database as it is now, in which every statement may run for
    /// at most `limit` ([`Store::query_conn`], then [`QueryConn::snapshot`]).
    pub async fn read_snapshot(
        &self,
        limit: Duration,
    ) -> Result<ReadSnapshot<'_, B>, StorageError> {
        self.query_conn().await?.snapshot(limit).await
    }
}

impl<'s, B: Backend> QueryConn<'s, B> {
    /// Takes a read snapshot of the database as it is now, in which every statement may run for
    /// at most `limit`. Once this returns, what the snapshot sees is fixed: a caller holding
    /// back block execution (the node's read gate) may let it go.
    pub async fn snapshot(self, limit: Duration) -> Result<ReadSnapshot<'s, B>, StorageError> {
        let QueryConn { store, mut conn } = self;
        store
            .off_runtime(async {
                let during = "taking a snapshot for a query";
                let taken = Instant::now();
                store.db(conn.begin_limited_read(limit).await, during)?;
                // The first read fixes the snapshot (PostgreSQL's and SQLite's are taken there).
                let height = store.newest_applied(&mut conn, during).await?;
                Ok((taken, height))
            })
            .await
            .map(|(taken, height)| ReadSnapshot {
                store,
                conn,
                limit,
                max_bytes: MAX_ANSWER_BYTES,
                taken,
                height,
            })
    }
}

impl<B: Backend> ReadSnapshot<'_, B> {
    /// The newest block applied in the snapshot.
    pub fn height(&self) -> Option<BlockNumber> {
        self.height
    }

    /// Sets the most bytes the answer may hold (as [`crate::backend::row_bytes`] counts them;
    /// [`MAX_ANSWER_BYTES`] unless set): reading stops past it and the query is refused with
    /// [`StorageError::QueryTooLarge`].
    pub fn max_answer_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// Runs a checked read-only query with its parameters (never spliced into the text). Its
    /// rows are read one at a time and counted: an answer past the byte bound is refused as
    /// soon as it passes it, holding no more than the bound and one row.
    pub async fn query_rows(
        mut self,
        query: &QueryPlan,
        params: &[Value],
    ) -> Result<QueryResult, StorageError> {
        let store = self.store;
        store
            .off_runtime(async {
                let rendered = query.typed.rendered(store.backend().dialect());
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
                // The rendered query asks for at most one row more than allowed (the cap is
                // part of its text), which tells an oversized result from a full one.
                let types: Vec<ReadType> =
                    query.columns.iter().map(|c| ReadType::of(&c.ty)).collect();
                let rows = match self
                    .conn
                    .query_bounded(&rendered.sql, &bound, &types, self.max_bytes)
                    .await
                {
                    Ok(Some(rows)) => rows,
                    // The rest of the answer is left unread: the connection is dropped with the
                    // snapshot, which closes it (or, in process, rolls back) instead of waiting
                    // for the engine to send the rest.
                    Ok(None) => {
                        return Err(StorageError::QueryTooLarge {
                            limit: self.max_bytes,
                        });
                    }
                    // Each engine's own word for it, once the limit has passed: PostgreSQL's
                    // query_canceled, MariaDB's and MySQL's statement time, SQLite's interrupt.
                    Err(e)
                        if self.taken.elapsed() >= self.limit
                            && matches!(e.code.as_deref(), Some("57014" | "1969" | "3024" | "9")) =>
                    {
                        return Err(StorageError::QueryTimeout { limit: self.limit });
                    }
                    Err(e) => return store.db(Err(e), "running a query"),
                };
                // Dropped instead when this fails: closed, or rolled back before reuse.
                let _ = self.conn.rollback().await;
                if rows.len() > MAX_QUERY_ROWS {
                    return Err(StorageError::Query(format!(
                        "the result has more than {MAX_QUERY_ROWS} rows; narrow the WHERE clause or \
                         page with ORDER BY … LIMIT"
                    )));
                }
                Ok(QueryResult {
                    columns: query.columns.iter().map(|c| c.name.clone()).collect(),
                    rows,
                })
            })
            .await
    }
}

impl<B: Backend> Store<B> {
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
