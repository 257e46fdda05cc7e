//! Integrity of the digest triggers, checked in the catalog rather than trusted: they exist, fire
//! (PostgreSQL: `ENABLE ALWAYS`, so neither `DISABLE TRIGGER` nor a replica-role session escapes
//! unseen) and have the generated definition; no other trigger sits on a shared table.

use std::fmt;

use chainify_core::Value;

use crate::backend::{Backend, Conn};
use crate::ddl;
use crate::error::StorageError;
use crate::store::Store;

/// What is wrong with the triggers of a shared table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TriggerFault {
    /// A digest trigger is gone.
    Missing,
    /// A digest trigger exists but does not always fire (PostgreSQL's `tgenabled`).
    Disabled(String),
    /// A digest trigger's definition differs from the generated one.
    Altered,
    /// A trigger chainify did not create.
    Unexpected,
    /// A user's object that chainify's SQL could resolve to instead of the engine's own
    /// (PostgreSQL: a cast, operator, function or type on built-in types, or a search path;
    /// `trigger` names it, `table` is empty). No block runs while there is one.
    Shadows,
}

/// One finding of [`Store::check_triggers`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TriggerProblem {
    /// The shared table.
    pub table: String,
    /// The trigger.
    pub trigger: String,
    /// What is wrong.
    pub fault: TriggerFault,
}

impl fmt::Display for TriggerProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (table, trigger) = (&self.table, &self.trigger);
        match &self.fault {
            TriggerFault::Missing => write!(f, "digest trigger {trigger} on {table} is missing"),
            TriggerFault::Disabled(state) => write!(
                f,
                "digest trigger {trigger} on {table} is disabled (tgenabled = {state:?}, expected \"A\")"
            ),
            TriggerFault::Altered => write!(
                f,
                "digest trigger {trigger} on {table} differs from the generated definition"
            ),
            TriggerFault::Shadows => write!(
                f,
                "{trigger}: made in the database behind chainify, it could be used instead of PostgreSQL's own by chainify's statements and the clients' (a change hidden from the scan, a different result here); no block runs until it is removed"
            ),
            TriggerFault::Unexpected if table.starts_with("chainify_") => write!(
                f,
                "{trigger} on chainify's own table {table}: not created by chainify, and it works behind its back"
            ),
            TriggerFault::Unexpected => {
                // The PostgreSQL check also names rules, row-level security, inheritance
                // children and partitioned tables this way (see `ddl::trigger_catalog`).
                let other = [
                    "rule ",
                    "row level security",
                    "inheritance child ",
                    "not a plain table",
                ];
                if other.iter().any(|p| trigger.starts_with(p)) {
                    write!(
                        f,
                        "{trigger} on shared table {table} or its digest table: not created by chainify, and changes there escape or bypass the digest triggers"
                    )
                } else {
                    write!(
                        f,
                        "trigger {trigger} on shared table {table} or its digest table was not created by chainify"
                    )
                }
            }
        }
    }
}

impl<B: Backend> Store<B> {
    /// Compares every shared table's triggers in the catalog with the generated ones.
    pub async fn check_triggers(&self) -> Result<Vec<TriggerProblem>, StorageError> {
        let dialect = self.backend().dialect();
        let during = "checking the digest triggers in the catalog";
        let tables = self.tables();
        if tables.is_empty() {
            return Ok(Vec::new());
        }
        // One query for every shared table, its digest table and chainify's own tables: this
        // runs before every block.
        let names: Vec<Value> = tables
            .values()
            .flat_map(|t| {
                [
                    t.name.clone(),
                    ddl::digest_table(&t.name),
                    ddl::snapshot_table(&t.name),
                    ddl::dirty_table(&t.name),
                ]
            })
            .chain(ddl::SYSTEM_TABLES.iter().map(|t| (*t).to_owned()))
            .map(Value::Text)
            .collect();
        let (sql, types) = ddl::trigger_catalog(dialect, names.len());
        let params: Vec<&Value> = names.iter().collect();
        let mut conn = self.acquire(during).await?;
        let rows = self.db(conn.query(&sql, &params, &types).await, during)?;
        drop(conn);
        // (table, trigger, enabled, definition). A row that does not read as text (SQLite:
        // a trigger whose stored text is not UTF-8) fails the check: a trigger nobody can read
        // must not pass for none.
        let found: Vec<[String; 4]> = rows
            .into_iter()
            .map(|r| match <[Value; 4]>::try_from(r) {
                Ok(
                    [
                        Value::Text(t),
                        Value::Text(n),
                        Value::Text(e),
                        Value::Text(d),
                    ],
                ) => Ok([t, n, e, d]),
                Ok(row) => Err(StorageError::Corrupt(format!(
                    "{during}: a trigger the catalog lists does not read as text: {:?}",
                    row.iter()
                        .map(|v| match v {
                            Value::Text(t) => t.clone(),
                            Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
                            other => format!("{other:?}"),
                        })
                        .collect::<Vec<_>>()
                ))),
                Err(row) => Err(StorageError::Corrupt(format!(
                    "{during}: the catalog answered {} columns",
                    row.len()
                ))),
            })
            .collect::<Result<_, _>>()?;
        let mut problems = Vec::new();
        for t in tables.values() {
            let problem = |trigger: &str, fault| TriggerProblem {
                table: t.name.clone(),
                trigger: trigger.to_owned(),
                fault,
            };
            let on_table: Vec<&[String; 4]> = found.iter().filter(|f| f[0] == t.name).collect();
            let expected = ddl::artifacts(dialect, t).triggers;
            for e in &expected {
                match on_table.iter().find(|[_, n, _, _]| *n == e.name) {
                    None => problems.push(problem(&e.name, TriggerFault::Missing)),
                    Some([_, _, enabled, _]) if enabled != "A" => {
                        problems.push(problem(&e.name, TriggerFault::Disabled(enabled.clone())));
                    }
                    Some([_, _, _, definition]) if definition.trim() != e.definition.trim() => {
                        problems.push(problem(&e.name, TriggerFault::Altered));
                    }
                    Some(_) => {}
                }
            }
            for [_, name, _, _] in &on_table {
                if !expected.iter().any(|e| e.name == *name) {
                    problems.push(problem(name, TriggerFault::Unexpected));
                }
            }
            // A trigger on the digest table could rewrite or drop what the digest triggers
            // record: none belongs there.
            let dg = ddl::digest_table(&t.name);
            for [_, name, _, _] in found.iter().filter(|f| f[0] == dg) {
                problems.push(problem(name, TriggerFault::Unexpected));
            }
        }
        // Objects that shadow the engine's own: rows without a table (`ddl::trigger_catalog`).
        problems.extend(
            found
                .iter()
                .filter(|f| f[0].is_empty())
                .map(|[_, name, _, _]| TriggerProblem {
                    table: String::new(),
                    trigger: name.clone(),
                    fault: TriggerFault::Shadows,
                }),
        );
        // chainify creates no trigger on its own tables: one there (say, on chainify_state,
        // keeping a planted accumulator in step with every block) works behind its back.
        for [table, name, _, _] in &found {
            let own = tables.values().any(|t| {
                *table == ddl::snapshot_table(&t.name) || *table == ddl::dirty_table(&t.name)
            }) || ddl::SYSTEM_TABLES.contains(&table.as_str());
            if own {
                problems.push(TriggerProblem {
                    table: table.clone(),
                    trigger: name.clone(),
                    fault: TriggerFault::Unexpected,
                });
            }
        }
        Ok(problems)
    }

    /// Installs the digest objects of `tables` again (enables, recreates and redefines their
    /// triggers; leaves recorded changes and snapshots alone). A user trigger is not removed.
    pub async fn reinstall_triggers(&self, tables: &[&str]) -> Result<(), StorageError> {
        self.off_runtime(async {
            let dialect = self.backend().dialect();
            let during = "reinstalling the digest triggers";
            let all = self.tables();
            let mut conn = self.acquire(during).await?;
            let transactional = self.backend().transactional_ddl();
            if transactional {
                self.db(conn.begin().await, during)?;
            }
            let result = async {
                for name in tables {
                    let t = all.get(*name).ok_or_else(|| {
                        StorageError::Corrupt(format!("{name} is not a registered shared table"))
                    })?;
                    for sql in ddl::artifacts(dialect, t).install {
                        self.db(conn.batch(&sql).await, during)?;
                    }
                }
                Ok(())
            }
            .await;
            if transactional {
                match &result {
                    Ok(()) => self.db(conn.commit().await, during)?,
                    Err(_) => {
                        let _ = conn.rollback().await;
                    }
                }
            }
            result
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unexpected_objects_are_named_for_what_they_are() {
        let unexpected = |trigger: &str| {
            TriggerProblem {
                table: "kv".into(),
                trigger: trigger.into(),
                fault: TriggerFault::Unexpected,
            }
            .to_string()
        };
        assert_eq!(
            unexpected("audit"),
            "trigger audit on shared table kv or its digest table was not created by chainify"
        );
        let rule = unexpected("rule hide");
        assert!(
            rule.starts_with("rule hide on shared table kv or its digest table: not created"),
            "{rule}"
        );
        assert!(unexpected("row level security").starts_with("row level security on"));
    }
}
