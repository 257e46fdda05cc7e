//! PostgreSQL.

use std::str::FromStr;

use chainify_core::Value;
use chainify_sql::ColumnType;
use chainify_sql::render::Dialect;
use sqlx::Row;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{
    PgArgumentBuffer, PgArguments, PgConnectOptions, PgPool, PgPoolOptions, PgRow, PgTypeInfo,
};
use sqlx::query::Query;

use crate::StoreOptions;
use crate::backend::{
    Backend, DeferForeignKeys, Suspicion, catalog_error, classify, sqlx_backend_basics, sqlx_conn,
    typed_statement_text as statement_text,
};
use crate::catalog::{CatalogCheck, CatalogColumn, CatalogForeignKey, CatalogTable};
use crate::ddl::ReadType;
use crate::error::{DbError, DbErrorKind, StorageError, redact_url};
use crate::value::{decimal_param, parse_decimal};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// A PostgreSQL database.
#[derive(Debug)]
pub struct Postgres {
    pool: PgPool,
    url: String,
    suspicion: Suspicion,
}

impl Postgres {
    /// Connects a pool to `url` (`postgres://…`), pinning every connection to UTC, READ
    /// COMMITTED, standard strings, `x = NULL` as NULL (not `x IS NULL`) and generic plans.
    ///
    /// Generic plans fold only literals and evaluate parameters on the rows a statement touches,
    /// as MariaDB and SQLite do; a custom plan folds the parameters too, fails on a constant even
    /// where no row is touched (the analyser refuses those: `Portable::check_values`), and
    /// skips an operand next to a parameter that folds to NULL, which the others evaluate.
    /// Pinning one kind keeps the outcome from depending on a connection's history (by default
    /// five custom plans, then maybe a generic one); generic it is because it evaluates as the
    /// other engines do, and because custom plans cost a planning per run: about a fifth of the
    /// server's CPU in a block, the triggers' and foreign keys' internal statements included.
    /// Fails with the (redacted) URL when unreachable.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Postgres, StorageError> {
        let redacted = redact_url(url);
        let connect_err = |reason: String| StorageError::Connect {
            url: redacted.clone(),
            reason,
        };
        let lock_timeout = format!("{}ms", options.lock_timeout.as_millis());
        let connect = PgConnectOptions::from_str(url)
            .map_err(|e| connect_err(e.to_string()))?
            .options([
                ("TimeZone", "UTC"),
                ("DateStyle", "ISO"),
                ("default_transaction_isolation", "read committed"),
                ("standard_conforming_strings", "on"),
                // Rows read as text (several statements in one round trip) decode bytes only in
                // hex; a database or role may default to `escape`.
                ("bytea_output", "hex"),
                ("transform_null_equals", "off"),
                ("plan_cache_mode", "force_generic_plan"),
                // A database's or role's own settings would otherwise apply: a statement
                // timeout stops this organization's statements alone (queries set their own,
                // locally), and quoted names change what the catalog prints.
                ("statement_timeout", "0"),
                ("idle_in_transaction_session_timeout", "0"),
                ("quote_all_identifiers", "off"),
                ("lock_timeout", lock_timeout.as_str()),
                (
                    "default_transaction_read_only",
                    if options.read_only { "on" } else { "off" },
                ),
            ]);
        let suspicion = Suspicion::default();
        let suspect = suspicion.clone();
        let refusal = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        let refusal_in = refusal.clone();
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.connect_timeout)
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                let doubtful = suspect.doubts(meta.idle_for);
                Box::pin(async move { Suspicion::ping_if(doubtful, conn).await.map(|()| true) })
            })
            .after_connect(move |conn, _| {
                let refusal = refusal_in.clone();
                Box::pin(async move {
                    // A replica role (which a superuser may set for the database or role) fires
                    // no foreign-key trigger: this organization would accept rows the others
                    // refuse. Set back where chainify may (as a superuser), refused otherwise.
                    let role: String =
                        sqlx::query_scalar("SELECT current_setting('session_replication_role')")
                            .persistent(false)
                            .fetch_one(&mut *conn)
                            .await?;
                    if role != "origin"
                        && let Err(e) = sqlx::Executor::execute(&mut *conn, "SET session_replication_role = origin").await
                    {
                        let why = format!(
                            "the session starts with session_replication_role = {role}, under which PostgreSQL enforces no foreign key, and cannot be set back ({e}); reset it for chainify's database and role (ALTER DATABASE … RESET session_replication_role)"
                        );
                        *refusal.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
                        return Err(sqlx::Error::Protocol(why));
                    }
                    // PostgreSQL 17's limit on a whole transaction, where the server knows it
                    // (a startup option it does not know would refuse the connection): a
                    // database's or role's value would stop this organization's blocks alone.
                    sqlx::query(
                        "SELECT set_config('transaction_timeout', '0', false) \
                         WHERE current_setting('transaction_timeout', true) IS NOT NULL",
                    )
                    .persistent(false)
                    .execute(&mut *conn)
                    .await?;
                    Ok(())
                })
            })
            .connect_with(connect)
            .await
            .map_err(|e| {
                // The pool retries a refused session until its timeout: name why.
                let why = refusal.lock().unwrap_or_else(|e| e.into_inner()).take();
                connect_err(why.unwrap_or_else(|| e.to_string()))
            })?;
        Ok(Postgres {
            pool,
            url: redacted,
            suspicion,
        })
    }

    /// The underlying pool (tests, tools).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

fn error_kind(e: &dyn sqlx::error::DatabaseError) -> (DbErrorKind, Option<String>) {
    let code = e.code().map(|c| c.into_owned());
    (kind_of_code(code.as_deref()), code)
}

/// What an SQLSTATE means for a block.
fn kind_of_code(code: Option<&str>) -> DbErrorKind {
    match code {
        // serialization_failure, deadlock_detected, lock_not_available, query_canceled
        // (lock or statement timeout), too_many_connections.
        Some("40001" | "40P01" | "55P03" | "57014" | "53300") => DbErrorKind::Transient,
        // connection exceptions, admin/crash shutdown, cannot connect now.
        Some(c) if c.starts_with("08") || c.starts_with("57P") => DbErrorKind::Connection,
        // Insufficient resources (disk full, out of memory), system and internal errors: this
        // server's trouble, not the transaction's. Flagging the transaction would set this
        // organization apart from the others; the block fails and is run again instead.
        Some(c) if c.starts_with("53") || c.starts_with("58") || c.starts_with("XX") => {
            DbErrorKind::Connection
        }
        _ => DbErrorKind::Statement,
    }
}

fn db_err(e: sqlx::Error) -> DbError {
    classify(e, error_kind)
}

/// A NULL parameter whose type PostgreSQL infers from the context (type `unknown`), as it does
/// for a NULL literal, so `col = $1` works for every column type.
struct UntypedNull;

impl sqlx::Type<sqlx::Postgres> for UntypedNull {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(705))
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for UntypedNull {
    fn encode_by_ref(&self, _: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        Ok(IsNull::Yes)
    }
}

fn bind<'q>(
    q: Query<'q, sqlx::Postgres, PgArguments>,
    v: &Value,
) -> Query<'q, sqlx::Postgres, PgArguments> {
    match v {
        Value::Null => q.bind(UntypedNull),
        Value::Int(i) => q.bind(*i),
        Value::Decimal(d) => q.bind(decimal_param(*d)),
        Value::Text(s) => q.bind(s.clone()),
        Value::Bool(b) => q.bind(*b),
        Value::Bytes(b) => q.bind(b.clone()),
    }
}

fn decode(row: &PgRow, types: &[ReadType]) -> Result<Vec<Value>, DbError> {
    let bad = |e: sqlx::Error| DbError {
        kind: DbErrorKind::Statement,
        code: None,
        message: format!("decoding a row: {e}"),
    };
    types
        .iter()
        .enumerate()
        .map(|(i, ty)| {
            Ok(match ty {
                // Any integer width (chainify's own queries read SMALLINT and INTEGER too).
                ReadType::Int => match row.try_get::<Option<i64>, _>(i) {
                    Ok(v) => v,
                    Err(_) => match row.try_get::<Option<i32>, _>(i) {
                        Ok(v) => v.map(i64::from),
                        Err(_) => row
                            .try_get::<Option<i16>, _>(i)
                            .map_err(bad)?
                            .map(i64::from),
                    },
                }
                .map(Value::Int),
                // Text when chainify cast it; a client query reads the engine's own type.
                ReadType::Decimal(scale) => match row.try_get::<Option<String>, _>(i) {
                    Ok(s) => s,
                    Err(_) => row
                        .try_get::<Option<bigdecimal::BigDecimal>, _>(i)
                        .map_err(bad)?
                        .map(|d| d.to_plain_string()),
                }
                .map(|s| parse_decimal(&s, *scale)),
                ReadType::Text => row
                    .try_get::<Option<String>, _>(i)
                    .map_err(bad)?
                    .map(Value::Text),
                ReadType::Bool => row
                    .try_get::<Option<bool>, _>(i)
                    .map_err(bad)?
                    .map(Value::Bool),
                ReadType::Bytes => row
                    .try_get::<Option<Vec<u8>>, _>(i)
                    .map_err(bad)?
                    .map(Value::Bytes),
            }
            .unwrap_or(Value::Null))
        })
        .collect()
}

sqlx_conn!(PgConn, sqlx::Postgres, begin: ["BEGIN"], snapshot: ["BEGIN ISOLATION LEVEL REPEATABLE READ"], read_snapshot: ["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"], limited_read: limited_read);

/// A read snapshot whose statements PostgreSQL stops after `limit` (`SET LOCAL` ends with the
/// transaction), in one round trip.
async fn limited_read(conn: &mut PgConn, limit: std::time::Duration) -> Result<(), DbError> {
    let text = format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL statement_timeout = {}",
        limit.as_millis().clamp(1, i32::MAX as u128)
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(text))
        .execute(&mut *conn.conn)
        .await
        .map_err(db_err)?;
    Ok(())
}

const COLUMNS: &str = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.typname::text, a.attnotnull, a.atttypmod, \
     CASE WHEN a.attidentity <> '' THEN 'GENERATED AS IDENTITY' \
          WHEN a.attgenerated <> '' THEN 'GENERATED ALWAYS AS (' || pg_get_expr(d.adbin, d.adrelid) || ')' \
          ELSE pg_get_expr(d.adbin, d.adrelid) END, \
     t.typtype = 'b' AND tn.nspname = 'pg_catalog' \
     FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
     JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_type t ON t.oid = a.atttypid \
     JOIN pg_namespace tn ON tn.oid = t.typnamespace \
     LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
     WHERE n.nspname = current_schema() AND c.relname = $1 AND c.relkind IN ('r', 'p') \
     AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";

/// Unique indexes and their key columns: the first `indnkeyatts` of `indkey`, which lists an
/// index's INCLUDE columns after them (they carry no uniqueness).
const INDEXES: &str = "SELECT i.indisprimary, i.indexprs IS NOT NULL, ic.relname::text, \
     (SELECT string_agg(a.attname::text, ',' ORDER BY k.ord) \
        FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord) \
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
       WHERE k.ord <= i.indnkeyatts) \
     FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid \
     JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_class ic ON ic.oid = i.indexrelid \
     WHERE n.nspname = current_schema() AND c.relname = $1 AND i.indisunique \
     ORDER BY ic.relname";

const FOREIGN_KEYS: &str = "SELECT \
     (SELECT string_agg(a.attname::text, ',' ORDER BY k.ord) FROM unnest(con.conkey) WITH ORDINALITY k(attnum, ord) \
        JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum), \
     pc.relname::text, \
     (SELECT string_agg(a.attname::text, ',' ORDER BY k.ord) FROM unnest(con.confkey) WITH ORDINALITY k(attnum, ord) \
        JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.attnum), \
     con.confdeltype::text, con.confupdtype::text \
     FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid \
     JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_class pc ON pc.oid = con.confrelid \
     WHERE con.contype = 'f' AND n.nspname = current_schema() AND c.relname = $1 \
     ORDER BY con.conname";

/// Tables with a foreign key to this one (schema-qualified outside the current schema).
const REFERENCED_BY: &str = "\
     SELECT DISTINCT CASE WHEN cn.nspname = current_schema() THEN c.relname::text \
                          ELSE cn.nspname::text || '.' || c.relname::text END \
     FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid \
     JOIN pg_namespace cn ON cn.oid = c.relnamespace \
     JOIN pg_class p ON p.oid = con.confrelid JOIN pg_namespace pn ON pn.oid = p.relnamespace \
     WHERE con.contype = 'f' AND pn.nspname = current_schema() AND p.relname = $1 AND c.oid <> p.oid \
     ORDER BY 1";

/// CHECK constraints: name and expression.
const CHECKS: &str = "\
     SELECT con.conname::text, pg_get_expr(con.conbin, con.conrelid) \
     FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid \
     JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE con.contype = 'c' AND n.nspname = current_schema() AND c.relname = $1 \
     ORDER BY con.conname";

/// What makes a table unusable beyond its columns' types: exclusion constraints and UNIQUE
/// NULLS NOT DISTINCT (no other engine has them), user triggers (they change rows the digest
/// triggers then record differently from the other engines), text columns whose collation is
/// not byte-wise, and a database whose default collation is not (literals and parameters
/// compare in it).
const EXTRAS: &str = "\
     SELECT 'an exclusion constraint, which the other engines do not have', con.conname::text \
       FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace \
      WHERE n.nspname = current_schema() AND c.relname = $1 AND con.contype = 'x' \
     UNION ALL \
     SELECT 'a DEFERRABLE constraint, which MySQL and MariaDB check at once and which would make an outcome depend on which transactions share a database transaction; declare it NOT DEFERRABLE', con.conname::text \
       FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace \
      WHERE n.nspname = current_schema() AND c.relname = $1 AND con.condeferrable \
     UNION ALL \
     SELECT 'a UNIQUE NULLS NOT DISTINCT index, which the other engines do not have', ic.relname::text \
       FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_class ic ON ic.oid = i.indexrelid \
      WHERE n.nspname = current_schema() AND c.relname = $1 \
        AND COALESCE((to_jsonb(i) ->> 'indnullsnotdistinct')::boolean, false) \
     UNION ALL \
     SELECT 'partitions or inheritance children (or is one), whose rows and triggers are their own: changes there fire no digest trigger of this table', c.relname::text \
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
      WHERE n.nspname = current_schema() AND c.relname = $1 \
        AND (c.relkind <> 'r' OR c.relhassubclass OR c.relispartition \
             OR EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)) \
     UNION ALL \
     SELECT 'an index on an expression or with a predicate (WHERE …), which PostgreSQL evaluates here alone on every change: where it fails, a row is refused here that the other organizations store', ic.relname::text \
       FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_class ic ON ic.oid = i.indexrelid \
      WHERE n.nspname = current_schema() AND c.relname = $1 AND NOT i.indisunique \
        AND (i.indexprs IS NOT NULL OR i.indpred IS NOT NULL) \
     UNION ALL \
     SELECT 'an index whose entries may be longer than PostgreSQL holds in one (it refuses an entry over 2 704 bytes, which the other engines store): beyond the keys, whose values chainify holds to 2 600 bytes, it covers unbounded text or bytes, or more than 2 600 bytes of declared width; index VARCHAR(n) of a small enough n', ic.relname::text \
       FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_class ic ON ic.oid = i.indexrelid \
      WHERE n.nspname = current_schema() AND c.relname = $1 \
        AND (SELECT COALESCE(SUM(CASE WHEN t.typname IN ('varchar', 'bpchar') AND a.atttypmod > 4 \
                                      THEN 4 * (a.atttypmod - 4) + 8 \
                                      WHEN t.typname IN ('text', 'varchar', 'bpchar', 'bytea') THEN 1000000 \
                                      ELSE 40 END), 0) \
               FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord) \
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
               JOIN pg_type t ON t.oid = a.atttypid \
              WHERE NOT i.indisunique OR k.ord > i.indnkeyatts) \
            > CASE WHEN i.indisunique THEN 80 ELSE 2600 END \
     UNION ALL \
     SELECT 'a rule, which rewrites statements where the other engines run them as written', r.rulename::text \
       FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class \
       JOIN pg_namespace n ON n.oid = c.relnamespace \
      WHERE n.nspname = current_schema() AND c.relname = $1 \
     UNION ALL \
     SELECT 'row-level security, which hides rows from some sessions where the other engines show them', c.relname::text \
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
      WHERE n.nspname = current_schema() AND c.relname = $1 AND (c.relrowsecurity OR c.relforcerowsecurity) \
     UNION ALL \
     SELECT 'a partial unique index (WHERE …): a change of the predicate''s columns can make rows collide, which conflict analysis does not follow', ic.relname::text \
       FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_class ic ON ic.oid = i.indexrelid \
      WHERE n.nspname = current_schema() AND c.relname = $1 AND i.indisunique AND i.indpred IS NOT NULL \
     UNION ALL \
     SELECT 'a unique index with a collation that is not byte-wise (' || co.collname::text || '), under which keys the analysis tells apart collide', ic.relname::text \
       FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_class ic ON ic.oid = i.indexrelid \
       JOIN unnest(i.indcollation::oid[]) AS k(coll) ON k.coll <> 0 \
       JOIN pg_collation co ON co.oid = k.coll \
      WHERE n.nspname = current_schema() AND c.relname = $1 AND i.indisunique \
        AND co.collname NOT IN ('C', 'POSIX', 'ucs_basic', 'default') \
     UNION ALL \
     SELECT 'a foreign-key trigger that does not fire (' || t.tgname::text || ', tgenabled ' || t.tgenabled::text || '): the foreign key is not enforced here', con.conname::text \
       FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace \
       JOIN pg_constraint con ON con.oid = t.tgconstraint \
      WHERE n.nspname = current_schema() AND c.relname = $1 AND t.tgisinternal AND t.tgenabled IN ('D', 'R') \
     UNION ALL \
     SELECT 'a foreign key MATCH ' || CASE con.confmatchtype WHEN 'f' THEN 'FULL' ELSE 'PARTIAL' END || ', which the other engines do not enforce (they match SIMPLE)', con.conname::text \
       FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace \
      WHERE n.nspname = current_schema() AND c.relname = $1 AND con.contype = 'f' AND con.confmatchtype <> 's' \
     UNION ALL \
     SELECT 'a user trigger, which would change rows differently from the other organizations; shared tables carry only chainify''s triggers', t.tgname::text \
       FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace \
      WHERE n.nspname = current_schema() AND c.relname = $1 AND NOT t.tgisinternal \
        AND t.tgname NOT LIKE 'chainify!_%' ESCAPE '!' \
     UNION ALL \
     SELECT 'a collation that is not byte-wise (' || co.collname::text || '); declare the column COLLATE \"C\"', a.attname::text \
       FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
       JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_collation co ON co.oid = a.attcollation \
      WHERE n.nspname = current_schema() AND c.relname = $1 AND a.attnum > 0 AND NOT a.attisdropped \
        AND co.collname NOT IN ('C', 'POSIX', 'ucs_basic', 'default') \
     UNION ALL \
     SELECT 'no replica identity (REPLICA IDENTITY NOTHING, or USING an index that is gone) while publication ' || p.pubname::text || ' publishes its updates or deletes: PostgreSQL refuses every UPDATE and DELETE of it here alone; set REPLICA IDENTITY DEFAULT', c.relname::text \
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
       JOIN pg_publication_tables pt ON pt.schemaname = n.nspname AND pt.tablename = c.relname \
       JOIN pg_publication p ON p.pubname = pt.pubname AND (p.pubupdate OR p.pubdelete) \
      WHERE n.nspname = current_schema() AND c.relname = $1 \
        AND (c.relreplident = 'n' \
             OR (c.relreplident = 'i' AND NOT EXISTS (SELECT 1 FROM pg_index ri \
                                                      WHERE ri.indrelid = c.oid AND ri.indisreplident))) \
     UNION ALL \
     SELECT 'the database''s default collation ' || d.datcollate::text || ', which compares text linguistically (literals and parameters compare in it); create the database with LC_COLLATE ''C'' or ''C.UTF-8''', current_database()::text \
       FROM pg_database d WHERE d.datname = current_database() \
        AND NOT (d.datcollate IN ('C', 'POSIX', 'C.UTF-8', 'C.utf8') \
                 AND COALESCE(to_jsonb(d) ->> 'datlocprovider', 'c') = 'c')";

fn column(
    name: String,
    printed: String,
    typname: &str,
    not_null: bool,
    typmod: i32,
) -> CatalogColumn {
    let (ty, precision, problem) = match typname {
        "int2" | "int4" | "int8" => (ColumnType::Int, None, None),
        "numeric" if typmod < 0 => (ColumnType::Decimal { scale: None }, None, None),
        "numeric" => {
            let m = typmod - 4;
            let (precision, scale) = ((m >> 16) & 0xffff, m & 0xffff);
            match u8::try_from(scale).ok().filter(|s| *s <= 38) {
                Some(s) => (
                    ColumnType::Decimal { scale: Some(s) },
                    u32::try_from(precision).ok(),
                    None,
                ),
                None => (
                    ColumnType::Decimal { scale: None },
                    None,
                    Some("scales outside 0..=38 are not portable".to_owned()),
                ),
            }
        }
        "text" | "varchar" => (ColumnType::Text, None, None),
        "bpchar" => (
            ColumnType::Text,
            None,
            Some("CHAR(n) pads and compares trailing spaces differently on each engine; use VARCHAR(n) or TEXT".to_owned()),
        ),
        "bool" => (ColumnType::Bool, None, None),
        "bytea" => (ColumnType::Bytes, None, None),
        "float4" | "float8" => (ColumnType::Float, None, None),
        // Everything else (money, timestamps, json, arrays, domains, …) is engine-specific.
        _ => (ColumnType::Other(printed.clone()), None, None),
    };
    CatalogColumn {
        name,
        native_type: printed,
        ty,
        not_null,
        precision,
        engine_problem: problem,
        default: None,
    }
}

impl Backend for Postgres {
    type Conn = PgConn;

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn concurrent_writers(&self) -> bool {
        true
    }

    fn transactional_ddl(&self) -> bool {
        true
    }

    async fn introspect(&self, table: &str) -> Result<Option<CatalogTable>, StorageError> {
        let err = |during: &str| catalog_error(&self.url, during, db_err);
        let rows = sqlx::query(COLUMNS)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err("reading the columns of a table"))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut t = CatalogTable {
            name: table.to_owned(),
            ..CatalogTable::default()
        };
        for r in rows {
            let typname: String = r.try_get(2).map_err(err("decoding a column"))?;
            let mut c = column(
                r.try_get(0).map_err(err("decoding a column"))?,
                r.try_get(1).map_err(err("decoding a column"))?,
                &typname,
                r.try_get(3).map_err(err("decoding a column"))?,
                r.try_get(4).map_err(err("decoding a column"))?,
            );
            c.default = r.try_get(5).map_err(err("decoding a column"))?;
            let built_in: bool = r.try_get(6).map_err(err("decoding a column"))?;
            if !built_in {
                // A domain carries its own default and checks, which the column's catalog
                // entry does not show (and may shadow a built-in type's name).
                c.engine_problem = Some(
                    "a domain or a type outside pg_catalog; declare the column with a built-in type".into(),
                );
            }
            t.columns.push(c);
        }
        let indexes = sqlx::query(INDEXES)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err("reading the indexes of a table"))?;
        for r in indexes {
            let primary: bool = r.try_get(0).map_err(err("decoding an index"))?;
            let on_expression: bool = r.try_get(1).map_err(err("decoding an index"))?;
            let index_name: String = r.try_get(2).map_err(err("decoding an index"))?;
            let cols: Option<String> = r.try_get(3).map_err(err("decoding an index"))?;
            if on_expression {
                t.problems.push(format!(
                    "unique index {index_name} is on an expression, which conflict analysis cannot bound"
                ));
                continue;
            }
            let cols: Vec<String> = cols
                .unwrap_or_default()
                .split(',')
                .map(str::to_owned)
                .collect();
            if primary {
                t.primary_key = cols;
            } else {
                t.uniques.push(cols);
            }
        }
        let extras = sqlx::query(EXTRAS)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err(
                "reading the constraints, triggers and collations of a table",
            ))?;
        for r in extras {
            let what: String = r.try_get(0).map_err(err("decoding a constraint"))?;
            let name: String = r.try_get(1).map_err(err("decoding a constraint"))?;
            t.problems.push(format!("{name} has {what}"));
        }
        t.referenced_by = sqlx::query_scalar(REFERENCED_BY)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err("reading the foreign keys to a table"))?;
        let checks = sqlx::query(CHECKS)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err("reading the CHECK constraints of a table"))?;
        for r in checks {
            t.checks.push(CatalogCheck {
                name: r.try_get(0).map_err(err("decoding a CHECK constraint"))?,
                clause: r.try_get(1).map_err(err("decoding a CHECK constraint"))?,
                dialect: Dialect::Postgres,
            });
        }
        let fks = sqlx::query(FOREIGN_KEYS)
            .bind(table)
            .fetch_all(&self.pool)
            .await
            .map_err(err("reading the foreign keys of a table"))?;
        for r in fks {
            let split = |s: Option<String>| -> Vec<String> {
                s.unwrap_or_default()
                    .split(',')
                    .map(str::to_owned)
                    .collect()
            };
            t.foreign_keys.push(CatalogForeignKey {
                columns: split(r.try_get(0).map_err(err("decoding a foreign key"))?),
                parent: r.try_get(1).map_err(err("decoding a foreign key"))?,
                parent_columns: split(r.try_get(2).map_err(err("decoding a foreign key"))?),
                on_delete: r.try_get(3).map_err(err("decoding a foreign key"))?,
                on_update: r.try_get(4).map_err(err("decoding a foreign key"))?,
            });
        }
        Ok(Some(t))
    }

    fn foreign_keys_deferred(&self) -> DeferForeignKeys {
        // Checked at the end of each statement; a restore orders its statements parents first.
        DeferForeignKeys::default()
    }

    sqlx_backend_basics!(PgConn);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_own_trouble_fails_the_block_instead_of_aborting_the_transaction() {
        for code in [
            "53100", "53200", "53000", "58030", "XX000", "XX001", "08006", "57P01",
        ] {
            assert_eq!(kind_of_code(Some(code)), DbErrorKind::Connection, "{code}");
        }
        for code in ["40001", "40P01", "55P03", "57014", "53300"] {
            assert_eq!(kind_of_code(Some(code)), DbErrorKind::Transient, "{code}");
        }
        for code in ["23505", "23503", "22003", "42P01", "54001"] {
            assert_eq!(kind_of_code(Some(code)), DbErrorKind::Statement, "{code}");
        }
        assert_eq!(kind_of_code(None), DbErrorKind::Statement);
    }
}
