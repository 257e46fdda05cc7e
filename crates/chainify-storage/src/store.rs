//! The store: one organization's database with chainify installed. Opening applies the system
//! migrations and loads the registered shared tables; registration installs the generated digest
//! objects.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use chainify_core::Value;
use chainify_sql::Schema;

use crate::StoreOptions;
use crate::backend::{Backend, Conn};
use crate::catalog::CatalogTable;
use crate::ddl::{self, ReadType};
use crate::error::{DbError, DbErrorKind, RegistrationError, StorageError};

thread_local! {
    /// Set while a thread runs [`Store::off_runtime`] work: nested calls run in place.
    static OFF_RUNTIME: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is a worker of a multi-threaded runtime, outside
/// [`Store::off_runtime`] work: where a call must not hold the thread for long.
pub(crate) fn on_runtime_worker() -> bool {
    use tokio::runtime::{Handle, RuntimeFlavor};
    !OFF_RUNTIME.get()
        && Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread)
}

/// Marks the thread as running off-runtime work until dropped (also when the work panics).
struct OffRuntime;

impl OffRuntime {
    fn enter() -> OffRuntime {
        OFF_RUNTIME.set(true);
        OffRuntime
    }
}

impl Drop for OffRuntime {
    fn drop(&mut self) {
        OFF_RUNTIME.set(false);
    }
}

/// A database with chainify's system tables, its registered shared tables and their digest
/// objects.
#[derive(Debug)]
pub struct Store<B: Backend> {
    pub(crate) backend: B,
    pub(crate) options: StoreOptions,
    /// Registered shared tables by name.
    tables: RwLock<Arc<BTreeMap<String, CatalogTable>>>,
}

impl<B: Backend> Store<B> {
    /// Installs (or upgrades) chainify's system tables and loads the registered shared tables,
    /// checking that none changed since registration.
    /// With [`StoreOptions::read_only`] nothing is installed: a database without chainify's
    /// tables is an error naming it.
    pub async fn open(backend: B, options: StoreOptions) -> Result<Store<B>, StorageError> {
        if !options.read_only {
            backend.migrate().await?;
        }
        let store = Store {
            backend,
            options,
            tables: RwLock::new(Arc::new(BTreeMap::new())),
        };
        let registered = store
            .query(
                "reading the registered shared tables",
                "SELECT table_name, fingerprint FROM chainify_shared_tables ORDER BY table_name",
                &[],
                &[ReadType::Text, ReadType::Text],
            )
            .await
            .map_err(|e| match e {
                StorageError::Database { .. } if store.options.read_only => {
                    StorageError::Corrupt(format!(
                        "{} holds no chainify organization (no chainify_shared_tables): {e}",
                        store.backend.url()
                    ))
                }
                e => e,
            })?;
        let mut tables = BTreeMap::new();
        let mut upgrade = Vec::new();
        for row in registered {
            let (Value::Text(name), Value::Text(fingerprint)) = (&row[0], &row[1]) else {
                continue;
            };
            let Some(t) = store.backend.introspect(name).await? else {
                return Err(RegistrationError::Definition {
                    table: name.clone(),
                    problem: "is registered as a shared table but no longer exists".into(),
                }
                .into());
            };
            if &t.fingerprint() != fingerprint {
                // Registered by a version whose fingerprint saw less: unchanged in what it saw,
                // the table is held to the rules of this one and its fingerprint upgraded.
                if &t.fingerprint_v1() != fingerprint {
                    return Err(RegistrationError::Definition {
                        table: name.clone(),
                        problem: "changed since it was registered (columns, types, defaults, keys, CHECK or other constraints, triggers); the organizations must agree on schema changes: restore the definition".into(),
                    }
                    .into());
                }
                t.to_shared()?;
                upgrade.push(t.clone());
            }
            tables.insert(name.clone(), t);
        }
        if !store.options.read_only {
            let during = "upgrading a shared table's definition fingerprint";
            let dialect = store.backend.dialect();
            let sql = format!(
                "UPDATE chainify_shared_tables SET fingerprint = {} WHERE table_name = {}",
                ddl::placeholder(dialect, 1),
                ddl::placeholder(dialect, 2)
            );
            for t in &upgrade {
                let mut conn = store.acquire(during).await?;
                store.db(
                    conn.execute(
                        &sql,
                        &[&Value::Text(t.fingerprint()), &Value::Text(t.name.clone())],
                        false,
                    )
                    .await,
                    during,
                )?;
            }
        }
        if !store.options.read_only {
            store.upgrade_snapshot_tables(tables.values()).await?;
        }
        *store.tables.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tables);
        store.upgrade_digest_tables().await?;
        if !store.options.read_only {
            // Snapshot layers a crash or a failure left behind after their operation committed.
            store.settle_layers().await?;
        }
        Ok(store)
    }

    /// Gives snapshot tables created before snapshots had layers their tombstone column and key
    /// index ([`ddl::snapshot_upgrade`]).
    async fn upgrade_snapshot_tables(
        &self,
        tables: impl Iterator<Item = &CatalogTable>,
    ) -> Result<(), StorageError> {
        for t in tables {
            let during = format!("upgrading the snapshot table of {}", t.name);
            let cp = ddl::snapshot_table(&t.name);
            if !self.has_column(&cp, "chainify_cp_gone", &during).await? {
                let mut conn = self.acquire(&during).await?;
                for sql in ddl::snapshot_upgrade(t) {
                    self.db(conn.batch(&sql).await, &during)?;
                }
            }
        }
        Ok(())
    }

    /// Whether `table` exists and has `column`.
    async fn has_column(
        &self,
        table: &str,
        column: &str,
        during: &str,
    ) -> Result<bool, StorageError> {
        let found = self
            .query(
                during,
                ddl::has_column(self.backend.dialect()),
                &[&Value::Text(table.into()), &Value::Text(column.into())],
                &[ReadType::Int],
            )
            .await?;
        Ok(!matches!(
            found.first().and_then(|r| r.first()),
            Some(Value::Int(0)) | None
        ))
    }

    /// Turns digest tables of the first shape (a row a key, upserted) into logs
    /// ([`ddl::digest_upgrade`]), records pending in them kept, and reinstalls their triggers,
    /// in one transaction where the engine's DDL is transactional. A read-only store refuses
    /// such tables, which it could not read.
    async fn upgrade_digest_tables(&self) -> Result<(), StorageError> {
        let dialect = self.backend.dialect();
        for t in self.tables().values() {
            let during = format!("upgrading the digest table of {}", t.name);
            let set_aside = self
                .has_column(
                    &ddl::digest_table(&t.name),
                    ddl::UPSERTED_DIGEST_COLUMN,
                    &during,
                )
                .await?;
            // Set aside and not yet copied back: an upgrade on MySQL interrupted.
            let left = self
                .has_column(
                    &ddl::upserted_digest_table(&t.name),
                    "chainify_was",
                    &during,
                )
                .await?;
            if !set_aside && !left {
                continue;
            }
            if self.options.read_only {
                return Err(StorageError::Migration {
                    url: self.backend.url().to_owned(),
                    reason: format!(
                        "the digest table of {} has the shape of an earlier chainify (a row a key); open the organization's database writable once (start its node) to upgrade it",
                        t.name
                    ),
                });
            }
            let mut conn = self.acquire(&during).await?;
            let transactional = self.backend.transactional_ddl();
            if transactional {
                self.db(conn.begin().await, &during)?;
            }
            let statements = ddl::digest_upgrade(dialect, t, set_aside)
                .into_iter()
                .chain(ddl::artifacts(dialect, t).install);
            let mut result = Ok(());
            for sql in statements {
                result = self.db(conn.batch(&sql).await, &during);
                if result.is_err() {
                    break;
                }
            }
            if transactional {
                match result {
                    Ok(()) => result = self.db(conn.commit().await, &during),
                    Err(_) => {
                        let _ = conn.rollback().await;
                    }
                }
            }
            result?;
        }
        Ok(())
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The options the store runs with.
    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// The registered shared tables.
    pub fn tables(&self) -> Arc<BTreeMap<String, CatalogTable>> {
        self.tables
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The registered shared tables as the analyser's schema.
    pub fn schema(&self) -> Result<Schema, StorageError> {
        schema_of(self.tables().values())
    }

    /// Reads every shared table's definition from the catalog again and names what changed
    /// since the organization registered or opened it, table by table (empty: nothing). A
    /// change the DBA made behind chainify (a CHECK constraint, a default, a trigger) makes this
    /// organization compute otherwise than the others without touching a row, so neither the
    /// trigger check nor the scan would see it; nor can a restore repair it.
    pub async fn check_definitions(&self) -> Result<Vec<DefinitionChange>, StorageError> {
        let mut found = Vec::new();
        let tables = self.tables();
        for (name, registered) in tables.iter() {
            let changes = match self.backend.introspect(name).await? {
                None => vec!["the table no longer exists".to_owned()],
                Some(now) => {
                    let mut changes = now.changes_from(registered);
                    changes.extend(
                        now.referenced_by
                            .iter()
                            .filter(|child| !tables.contains_key(*child))
                            .map(|child| {
                                format!(
                                    "table {child}, which is not shared, references it by a foreign key"
                                )
                            }),
                    );
                    changes
                }
            };
            if !changes.is_empty() {
                found.push(DefinitionChange {
                    table: name.clone(),
                    changes,
                });
            }
        }
        found.extend(self.own_tables_engines().await?);
        Ok(found)
    }

    /// MariaDB: chainify's own tables stored by another engine than InnoDB. One moved to MyISAM
    /// keeps what a rolled-back transaction's triggers wrote there (the digest log) or loses a
    /// crash's last writes, and no restore moves it back: named as a changed definition.
    async fn own_tables_engines(&self) -> Result<Vec<DefinitionChange>, StorageError> {
        let dialect = self.backend.dialect();
        if dialect != chainify_sql::render::Dialect::MySql {
            return Ok(Vec::new());
        }
        let names: Vec<Value> = self
            .tables()
            .keys()
            .flat_map(|t| {
                [
                    ddl::digest_table(t),
                    ddl::snapshot_table(t),
                    ddl::dirty_table(t),
                ]
            })
            .chain(ddl::SYSTEM_TABLES.iter().map(|t| (*t).to_owned()))
            .map(Value::Text)
            .collect();
        let params: Vec<&Value> = names.iter().collect();
        let rows = self
            .query(
                "reading the storage engines of chainify's own tables",
                &format!(
                    "SELECT TABLE_NAME, COALESCE(ENGINE, 'unknown') FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({}) \
                     AND COALESCE(ENGINE, '') <> 'InnoDB' ORDER BY TABLE_NAME",
                    ddl::placeholders(dialect, names.len())
                ),
                &params,
                &[ReadType::Text, ReadType::Text],
            )
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| match <[Value; 2]>::try_from(r) {
                Ok([Value::Text(table), Value::Text(engine)]) => Some(DefinitionChange {
                    changes: vec![format!(
                        "it is stored by the {engine} engine, which keeps what a rolled-back transaction wrote (chainify's own tables must be InnoDB: ALTER TABLE {table} ENGINE=InnoDB)"
                    )],
                    table,
                }),
                _ => None,
            })
            .collect())
    }

    /// Fails, naming the changes, when a shared table's definition changed since registration
    /// ([`Store::check_definitions`]): rows restored or replayed into it would not come out as
    /// the other organizations' do.
    pub(crate) async fn require_definitions(&self, during: &str) -> Result<(), StorageError> {
        let changed = self.check_definitions().await?;
        if changed.is_empty() {
            return Ok(());
        }
        Err(StorageError::DefinitionChanged(format!(
            "{during}: {}; the organizations must agree on schema changes: restore the definition",
            changed
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )))
    }

    /// Registers shared tables: checks each against the rules (primary key, portable types,
    /// foreign keys only to shared tables), then generates and installs its digest table,
    /// snapshot table and triggers. Registering a registered, unchanged table again reinstalls
    /// its objects (repairing a dropped trigger). Either every table is installed or, on
    /// failure, none of the newly registered ones is left behind.
    pub async fn register(&self, names: &[&str]) -> Result<(), StorageError> {
        self.off_runtime(async {
            let current = self.tables();
            let mut offered = Vec::new();
            for name in names {
                let lower = name.to_lowercase();
                let t = self.backend.introspect(&lower).await?.ok_or_else(|| {
                    RegistrationError::UnknownTable {
                        table: (*name).to_owned(),
                        database: self.backend.url().to_owned(),
                    }
                })?;
                t.to_shared()?;
                if let Some(old) = current.get(&t.name)
                    && old.fingerprint() != t.fingerprint()
                {
                    return Err(RegistrationError::Definition {
                        table: t.name.clone(),
                        problem: format!(
                            "changed since it was registered ({}); re-registering a changed table is not supported",
                            t.changes_from(old).join("; ")
                        ),
                    }
                    .into());
                }
                offered.push(t);
            }
            let mut all: BTreeMap<String, CatalogTable> = (*current).clone();
            for t in &offered {
                all.insert(t.name.clone(), t.clone());
            }
            schema_of(all.values())?;

            let dialect = self.backend.dialect();
            let mut conn = self.acquire("registering shared tables").await?;
            if self.backend.transactional_ddl() {
                self.db(conn.begin().await, "registering shared tables")?;
                let outcome = self.install(&mut conn, &offered, &current, dialect).await;
                match outcome {
                    Ok(()) => self.db(conn.commit().await, "registering shared tables")?,
                    Err(e) => {
                        let _ = conn.rollback().await;
                        return Err(e);
                    }
                }
            } else if let Err(e) = self.install(&mut conn, &offered, &current, dialect).await {
                // No transactional DDL (MySQL): remove what this call created.
                for t in offered.iter().filter(|t| !current.contains_key(&t.name)) {
                    for sql in ddl::artifacts(dialect, t).uninstall {
                        let _ = conn.batch(&sql).await;
                    }
                    for system in ["chainify_shared_tables", "chainify_state"] {
                        let _ = conn
                            .execute(
                                &format!(
                                    "DELETE FROM {system} WHERE table_name = {}",
                                    ddl::placeholder(dialect, 1)
                                ),
                                &[&Value::Text(t.name.clone())],
                                false,
                            )
                            .await;
                    }
                }
                return Err(e);
            }
            *self.tables.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(all);
            Ok(())
        })
        .await
    }

    async fn install(
        &self,
        conn: &mut B::Conn,
        offered: &[CatalogTable],
        current: &BTreeMap<String, CatalogTable>,
        dialect: chainify_sql::render::Dialect,
    ) -> Result<(), StorageError> {
        for t in offered {
            let during = format!("installing the digest objects of table {}", t.name);
            for sql in ddl::artifacts(dialect, t).install {
                self.db(conn.batch(&sql).await, &during)?;
            }
            if !current.contains_key(&t.name) {
                self.insert_row(
                    conn,
                    "chainify_shared_tables (table_name, fingerprint, last_changed_block, last_snapshot_block)",
                    &[
                        &Value::Text(t.name.clone()),
                        &Value::Text(t.fingerprint()),
                        &Value::Int(-1),
                        &Value::Int(-1),
                    ],
                    &during,
                )
                .await?;
                self.record_registered_state(conn, t).await?;
            }
        }
        Ok(())
    }

    /// Runs `work` to its end where blocking a thread is harmless, when the backend runs its
    /// engine on the calling thread ([`Backend::calls_inline`]): a block's statements then cost
    /// one hand-off in all instead of one each, and a long scan holds no runtime worker. On a
    /// current-thread runtime (tests) and inside such work, it simply runs `work`.
    ///
    /// Two consequences for callers: `work` runs to its end once started (a timeout around it
    /// cannot cut it short), and other futures of the calling task (`join!`, `select!`) wait
    /// meanwhile, so none of them may be what `work` waits for; give such a future a task.
    pub(crate) async fn off_runtime<T>(&self, work: impl Future<Output = T>) -> T {
        if !self.backend.calls_inline() || !on_runtime_worker() {
            return work.await;
        }
        tokio::task::block_in_place(|| {
            let _mark = OffRuntime::enter();
            tokio::runtime::Handle::current().block_on(work)
        })
    }

    /// A connection, or an error naming the database.
    pub(crate) async fn acquire(&self, during: &str) -> Result<B::Conn, StorageError> {
        self.backend
            .acquire()
            .await
            .map_err(|e| self.lost(during, e))
    }

    /// Wraps a database error of chainify's own statements with the URL and the activity.
    /// Inserts one row into one of chainify's own tables: `into` names the table and its
    /// columns (`chainify_ledger (block, hash, …)`), one value per column.
    pub(crate) async fn insert_row(
        &self,
        conn: &mut B::Conn,
        into: &str,
        values: &[&Value],
        during: &str,
    ) -> Result<(), StorageError> {
        let sql = format!(
            "INSERT INTO {into} VALUES ({})",
            ddl::placeholders(self.backend.dialect(), values.len())
        );
        self.db(conn.execute(&sql, values, false).await, during)?;
        Ok(())
    }

    pub(crate) fn db<T>(&self, r: Result<T, DbError>, during: &str) -> Result<T, StorageError> {
        r.map_err(|e| match e.kind {
            DbErrorKind::Connection => self.lost(during, e),
            _ => StorageError::Database {
                url: self.backend.url().to_owned(),
                during: during.to_owned(),
                source: e,
            },
        })
    }

    pub(crate) fn lost(&self, during: &str, e: DbError) -> StorageError {
        self.backend.connection_lost();
        StorageError::ConnectionLost {
            url: self.backend.url().to_owned(),
            during: during.to_owned(),
            reason: e.to_string(),
        }
    }

    /// A one-off query on a pooled connection.
    pub(crate) async fn query(
        &self,
        during: &str,
        sql: &str,
        params: &[&Value],
        types: &[ReadType],
    ) -> Result<Vec<Vec<Value>>, StorageError> {
        let mut conn = self.acquire(during).await?;
        self.db(conn.query(sql, params, types).await, during)
    }

    /// Closes the connection pool.
    pub async fn close(&self) {
        self.backend.close().await;
    }
}

/// A shared table whose definition changed behind chainify ([`Store::check_definitions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefinitionChange {
    /// The table.
    pub table: String,
    /// What changed, one finding each.
    pub changes: Vec<String>,
}

impl std::fmt::Display for DefinitionChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "table {} changed since it was registered: {}",
            self.table,
            self.changes.join(", ")
        )
    }
}

/// The analyser's schema of a set of catalog tables.
fn schema_of<'a>(tables: impl Iterator<Item = &'a CatalogTable>) -> Result<Schema, StorageError> {
    let tables: Vec<&CatalogTable> = tables.collect();
    // A table that is not shared must not hold a foreign key to one: its key would refuse a
    // DELETE (or change rows) here that the other organizations apply.
    for t in &tables {
        if let Some(child) = t
            .referenced_by
            .iter()
            .find(|c| !tables.iter().any(|s| &s.name == *c))
        {
            return Err(RegistrationError::Definition {
                table: t.name.clone(),
                problem: format!(
                    "table {child} references it by a foreign key but is not shared: its key would refuse or change here what the other organizations apply; share {child} too or drop the key"
                ),
            }
            .into());
        }
    }
    let mut schema = Schema::new();
    for t in tables {
        schema
            .add(t.to_shared()?)
            .map_err(|e| RegistrationError::Definition {
                table: t.name.clone(),
                problem: e.to_string(),
            })?;
    }
    schema.validate().map_err(|e| match e {
        chainify_sql::SchemaError::Table { table, problem }
            if problem.starts_with("foreign key references unknown table") =>
        {
            RegistrationError::Definition {
                table,
                problem: format!(
                    "{problem} (a foreign key may only reference another shared table; register both together)"
                ),
            }
        }
        chainify_sql::SchemaError::Table { table, problem } => {
            RegistrationError::Definition { table, problem }
        }
        other => RegistrationError::Definition {
            table: String::new(),
            problem: other.to_string(),
        },
    })?;
    Ok(schema)
}

/// Tables ordered so that every parent comes before its children (foreign keys among shared
/// tables); cycles, which the engines' own constraints make rare, keep name order.
pub(crate) fn parents_first(tables: &BTreeMap<String, CatalogTable>) -> Vec<&CatalogTable> {
    let mut done: Vec<&CatalogTable> = Vec::with_capacity(tables.len());
    let mut pending: Vec<&CatalogTable> = tables.values().collect();
    while !pending.is_empty() {
        let ready = pending.iter().position(|t| {
            t.foreign_keys.iter().all(|fk| {
                fk.parent == t.name
                    || !tables.contains_key(&fk.parent)
                    || done.iter().any(|d| d.name == fk.parent)
            })
        });
        match ready {
            Some(i) => done.push(pending.remove(i)),
            None => done.append(&mut pending),
        }
    }
    done
}
