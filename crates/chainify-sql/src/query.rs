//! Read-only queries (`ChainifyService.Query`): one SELECT whose result columns have the same
//! type on every engine, so that every organization answers a query with the same typed rows.
//!
//! Result columns may be columns of the FROM tables (`*`, `t.*`, `col`, `t.col`, with an
//! alias), `COUNT(*)`/`COUNT(col)` (an integer) and `MIN`/`MAX` of a column (the column's
//! type). Anything else is refused: engines type expressions differently (PostgreSQL's
//! `SUM(bigint)` is NUMERIC, MySQL's DECIMAL, SQLite's INTEGER), and a result whose type depends
//! on the engine would make the organizations' answers differ.

use std::sync::Arc;

use chainify_core::Value;
use sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Select, SelectItem,
    SelectItemQualifiedWildcardKind, SetExpr, Statement, TableFactor,
};

use crate::ident::object_name;
use crate::reject::Rejection;
use crate::schema::{ColumnType, Table};
use crate::{AnalysisError, Analyzer, Effort, Halt, MissingGrant, StatementPlan, check_params};
use chainify_core::config::{ClientInfo, StatementKind};

/// A column of a query's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputColumn {
    /// Its name: the alias, the column name, or the aggregate as written in lower case.
    pub name: String,
    /// Its type, identical on every engine.
    pub ty: ColumnType,
}

/// Most rows a query may return; its rendered form asks the engine for one more, so that an
/// oversized result is told from a full one without reading it all.
pub const MAX_QUERY_ROWS: usize = 10_000;

/// A checked read-only query.
#[derive(Clone, Debug)]
pub struct QueryPlan {
    /// The query's text as given.
    pub sql: String,
    /// The statement's plan (grants, the parsed statement).
    pub plan: Arc<StatementPlan>,
    /// The query typed for its parameters and rendered for every engine with the row cap.
    pub typed: Arc<crate::Typed>,
    /// The result columns in order.
    pub columns: Vec<OutputColumn>,
}

impl QueryPlan {
    /// Checks that the client may read every table the query reads.
    pub fn check_grants(&self, client: &ClientInfo) -> Result<(), MissingGrant> {
        for (table, kind) in &self.plan.grants_needed {
            if !client.may(*kind, table) {
                return Err(MissingGrant {
                    statement: 1,
                    client: client.id.to_string(),
                    kind: *kind,
                    table: table.clone(),
                });
            }
        }
        Ok(())
    }
}

impl Analyzer {
    /// Checks a read-only query with its parameters and types its result columns. Errors name
    /// the construct (as statement 1).
    pub fn query(&self, sql: &str, params: &[Value]) -> Result<QueryPlan, AnalysisError> {
        Halt::full(self.query_in(sql, params, Effort::Any), 1)
    }

    /// [`Analyzer::query`] if it takes lookups only (see [`Analyzer::analyze_cached`]).
    pub fn query_cached(
        &self,
        sql: &str,
        params: &[Value],
    ) -> Option<Result<QueryPlan, AnalysisError>> {
        Halt::cached(self.query_in(sql, params, Effort::CachedOnly))
    }

    fn query_in(&self, sql: &str, params: &[Value], effort: Effort) -> Result<QueryPlan, Halt> {
        let err = |r: Rejection| r.at(1);
        let plan = self.plan_in(sql, effort)?.map_err(err)?;
        if plan.kind != StatementKind::Select {
            return Err(err(Rejection::statement(format!(
                "a query must be a single SELECT, not {}",
                plan.kind.to_string().to_uppercase()
            )))
            .into());
        }
        check_params(&plan, params).map_err(err)?;
        let columns = output_columns(self, &plan.statement).map_err(err)?;
        let typed = self
            .typed_in(&plan, params, Some(MAX_QUERY_ROWS as u64), effort)?
            .map_err(err)?;
        plan.portable.check_values(&typed, params).map_err(err)?;
        Ok(QueryPlan {
            sql: sql.to_owned(),
            plan,
            typed,
            columns,
        })
    }
}

fn output_columns(
    analyzer: &Analyzer,
    statement: &Statement,
) -> Result<Vec<OutputColumn>, Rejection> {
    let Statement::Query(query) = statement else {
        return Err(Rejection::statement("a query must be a single SELECT"));
    };
    let SetExpr::Select(select) = query.body.as_ref() else {
        return Err(Rejection::unsupported(
            "a query's result must come from one SELECT (no UNION, VALUES or nested query at the top)",
        ));
    };
    let tables = from_tables(analyzer, select)?;
    let mut out = Vec::new();
    for (i, item) in select.projection.iter().enumerate() {
        let n = i + 1;
        match item {
            SelectItem::Wildcard(_) => {
                for (_, t) in &tables {
                    out.extend(t.columns.iter().map(|c| OutputColumn {
                        name: c.name.clone(),
                        ty: c.ty.clone(),
                    }));
                }
            }
            SelectItem::QualifiedWildcard(kind, _) => {
                let q = match kind {
                    SelectItemQualifiedWildcardKind::ObjectName(name) => object_name(name),
                    SelectItemQualifiedWildcardKind::Expr(_) => {
                        return Err(Rejection::unsupported(format!(
                            "query output {n} ({item}): not a table's columns"
                        )));
                    }
                };
                let t = tables
                    .iter()
                    .find(|(alias, _)| *alias == q)
                    .map(|(_, t)| *t)
                    .ok_or_else(|| {
                        Rejection::unknown_name(format!(
                            "query output {n} ({item}): no table {q} in FROM"
                        ))
                    })?;
                out.extend(t.columns.iter().map(|c| OutputColumn {
                    name: c.name.clone(),
                    ty: c.ty.clone(),
                }));
            }
            SelectItem::UnnamedExpr(e) => {
                let (name, ty) = typed(&tables, e, n)?;
                out.push(OutputColumn { name, ty });
            }
            SelectItem::ExprWithAlias { expr, alias } => {
                let (_, ty) = typed(&tables, expr, n)?;
                out.push(OutputColumn {
                    name: alias.value.to_lowercase(),
                    ty,
                });
            }
            SelectItem::ExprWithAliases { .. } => {
                return Err(Rejection::unsupported(format!(
                    "query output {n} ({item}): only columns, COUNT, MIN and MAX are supported in query results"
                )));
            }
        }
    }
    for (i, c) in out.iter().enumerate() {
        if matches!(c.ty, ColumnType::Float | ColumnType::Other(_)) {
            return Err(Rejection::wrong_type(format!(
                "query output {} ({}): a {:?} column is not returned identically by every engine",
                i + 1,
                c.name,
                c.ty
            )));
        }
    }
    Ok(out)
}

/// The FROM tables with their aliases (or names).
fn from_tables<'a>(
    analyzer: &'a Analyzer,
    select: &Select,
) -> Result<Vec<(String, &'a Table)>, Rejection> {
    let mut out = Vec::new();
    for twj in &select.from {
        for factor in std::iter::once(&twj.relation).chain(twj.joins.iter().map(|j| &j.relation)) {
            match factor {
                TableFactor::Table { name, alias, .. } => {
                    let n = object_name(name);
                    let t = analyzer
                        .schema()
                        .table(&n)
                        .ok_or_else(|| Rejection::unknown_name(format!("no shared table {n}")))?;
                    let a = alias
                        .as_ref()
                        .map_or_else(|| t.name.clone(), |a| a.name.value.to_lowercase());
                    out.push((a, t));
                }
                other => {
                    return Err(Rejection::unsupported(format!(
                        "query FROM item `{other}`: only shared tables (with joins) are supported in queries"
                    )));
                }
            }
        }
    }
    Ok(out)
}

/// The column an expression names, as (name, type).
fn column(tables: &[(String, &Table)], expr: &Expr) -> Option<(String, ColumnType)> {
    let (qualifier, name) = match expr {
        Expr::Identifier(id) => (None, id.value.to_lowercase()),
        Expr::CompoundIdentifier(parts) if parts.len() == 2 => (
            Some(parts[0].value.to_lowercase()),
            parts[1].value.to_lowercase(),
        ),
        Expr::Nested(inner) => return column(tables, inner),
        _ => return None,
    };
    let mut found = tables
        .iter()
        .filter(|(alias, _)| qualifier.as_ref().is_none_or(|q| q == alias))
        .filter_map(|(_, t)| t.column(&name).map(|i| t.columns[i].ty.clone()));
    let ty = found.next()?;
    // Ambiguous unqualified names are rejected by the engines; refuse them here alike.
    if found.next().is_some() {
        return None;
    }
    Some((name, ty))
}

fn typed(
    tables: &[(String, &Table)],
    expr: &Expr,
    n: usize,
) -> Result<(String, ColumnType), Rejection> {
    let unsupported = || {
        Rejection::unsupported(format!(
            "query output {n} ({expr}): only columns, COUNT, MIN and MAX are supported in query results"
        ))
    };
    if let Some(c) = column(tables, expr) {
        return Ok(c);
    }
    let Expr::Function(f) = expr else {
        return Err(unsupported());
    };
    let fname = object_name(&f.name);
    let FunctionArguments::List(list) = &f.args else {
        return Err(unsupported());
    };
    if f.filter.is_some() || f.over.is_some() || !f.within_group.is_empty() || list.args.len() != 1
    {
        return Err(unsupported());
    }
    let arg = match &list.args[0] {
        FunctionArg::Unnamed(a) => a,
        _ => return Err(unsupported()),
    };
    let label = expr.to_string().to_lowercase();
    match (fname.as_str(), arg) {
        ("count", FunctionArgExpr::Wildcard) => Ok((label, ColumnType::Int)),
        ("count", FunctionArgExpr::Expr(e)) if column(tables, e).is_some() => {
            Ok((label, ColumnType::Int))
        }
        ("min" | "max", FunctionArgExpr::Expr(e)) => match column(tables, e) {
            Some((_, ty)) => Ok((label, ty)),
            None => Err(unsupported()),
        },
        ("sum" | "avg", _) => Err(Rejection::unsupported(format!(
            "query output {n} ({expr}): {} is typed differently by each engine (PostgreSQL: \
             NUMERIC, MySQL: DECIMAL, SQLite: INTEGER or REAL); compute it from the rows",
            fname.to_uppercase()
        ))),
        _ => Err(unsupported()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Schema;

    fn analyzer() -> Analyzer {
        Analyzer::new(
            Schema::from_sql(
                "CREATE TABLE accounts (custid BIGINT NOT NULL PRIMARY KEY, name VARCHAR(64) NOT NULL UNIQUE);
                 CREATE TABLE checking (custid BIGINT NOT NULL PRIMARY KEY, bal DECIMAL(12,2) NOT NULL, flag BOOLEAN, note BYTEA,
                   FOREIGN KEY (custid) REFERENCES accounts (custid));",
            )
            .unwrap(),
        )
    }

    fn cols(q: &QueryPlan) -> Vec<(&str, ColumnType)> {
        q.columns
            .iter()
            .map(|c| (c.name.as_str(), c.ty.clone()))
            .collect()
    }

    #[test]
    fn result_columns_are_typed_from_the_schema() {
        let a = analyzer();
        let q = a
            .query("SELECT * FROM checking WHERE custid = $1", &[Value::Int(1)])
            .unwrap();
        assert_eq!(
            cols(&q),
            [
                ("custid", ColumnType::Int),
                ("bal", ColumnType::Decimal { scale: Some(2) }),
                ("flag", ColumnType::Bool),
                ("note", ColumnType::Bytes),
            ]
        );
        let q = a
            .query(
                "SELECT a.name, c.bal AS balance, COUNT(*), MAX(c.bal), MIN(a.name) FROM accounts a JOIN checking c ON a.custid = c.custid GROUP BY a.name, c.bal ORDER BY a.name",
                &[],
            )
            .unwrap();
        assert_eq!(
            cols(&q),
            [
                ("name", ColumnType::Text),
                ("balance", ColumnType::Decimal { scale: Some(2) }),
                ("count(*)", ColumnType::Int),
                ("max(c.bal)", ColumnType::Decimal { scale: Some(2) }),
                ("min(a.name)", ColumnType::Text),
            ]
        );
        let q = a
            .query("SELECT c.* FROM checking c ORDER BY c.custid", &[])
            .unwrap();
        assert_eq!(q.columns.len(), 4);
        assert_eq!(
            q.plan.grants_needed,
            [("checking".to_owned(), StatementKind::Select)]
        );
    }

    #[test]
    fn everything_else_is_refused_naming_the_construct() {
        let a = analyzer();
        let reason = |sql: &str, params: &[Value]| a.query(sql, params).unwrap_err().to_string();
        assert!(reason("UPDATE checking SET bal = 1 WHERE custid = 1", &[]).contains("not UPDATE"));
        assert!(
            reason("SELECT bal + 1 FROM checking WHERE custid = 1", &[])
                .contains("query output 1 (bal + 1)")
        );
        assert!(reason("SELECT SUM(bal) FROM checking", &[]).contains("SUM() is not portable"));
        assert!(reason("SELECT custid FROM checking WHERE custid = $1", &[]).contains("parameter"));
        assert!(reason("SELECT custid FROM nowhere", &[]).contains("nowhere"));
        assert!(reason("SELECT custid FROM checking; SELECT 1", &[]).contains("2 SQL statements"));
        assert!(
            reason("SELECT custid, RANDOM() FROM checking", &[])
                .to_lowercase()
                .contains("random")
        );
        let e = a
            .query("SELECT 1, COUNT(*) FROM checking", &[])
            .unwrap_err();
        assert_eq!(e.statement, 1);
        assert!(e.reason.contains("query output 1 (1)"), "{e}");
        // An unqualified name in two FROM tables is ambiguous.
        assert!(
            reason("SELECT custid FROM accounts, checking", &[])
                .contains("column custid is ambiguous")
        );
    }

    #[test]
    fn grants_are_checked_for_every_table_read() {
        let a = analyzer();
        let q = a
            .query(
                "SELECT a.name FROM accounts a JOIN checking c ON a.custid = c.custid",
                &[],
            )
            .unwrap();
        let client = ClientInfo {
            id: chainify_core::ClientId::new("c").unwrap(),
            public_key: chainify_core::crypto::SigningKey::from_seed(&[1; 32]).public_key(),
            grants: [("accounts".to_owned(), [StatementKind::Select].into())].into(),
        };
        let e = q.check_grants(&client).unwrap_err();
        assert_eq!(e.table, "checking");
    }
}
