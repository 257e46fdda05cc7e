//! From a parsed statement to a [`StatementPlan`]: the portable-subset checks and the symbolic
//! read/write accesses.
//!
//! Soundness rests on two rules:
//! 1. Predicates are turned into a disjunction of conjunctions of *key-column atoms*; anything not
//!    understood (a non-key column, `NOT`, `<>`, a function, a column on the other side) becomes
//!    TRUE. Since AND and OR are monotone, replacing a sub-predicate by TRUE only widens.
//! 2. Every relation occurrence in the statement is counted by sqlparser's visitor; occurrences the
//!    precise analysis did not handle (some subquery form we do not walk) become whole-table reads.
//!    New SQL syntax can therefore cost precision, never soundness.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use chainify_core::Value;
use chainify_core::config::StatementKind;
use chainify_core::rwset::Resource;
use sqlparser::ast::{
    AssignmentTarget, BinaryOperator, Delete, Expr, FromTable, Insert, JoinConstraint,
    JoinOperator, ObjectName, Query, Select, SetExpr, Statement as SqlStatement, TableFactor,
    TableObject, TableWithJoins, UnaryOperator, Update, Value as SqlValue, Visit, Visitor,
    visit_relations,
};

use crate::ident::object_name;
use crate::plan::{Access, Atom, Conj, KeyPlan, Mode, Term};
use crate::reject::Rejection;
use crate::schema::{ColumnType, KeySpace, RefAction, Schema, Table};

/// Most conjunctions a predicate's normal form may have before it is treated as TRUE.
const MAX_CONJUNCTIONS: usize = 64;

/// The analysis of one SQL statement text, independent of its parameter values.
#[derive(Debug)]
pub struct StatementPlan {
    /// SELECT, INSERT, UPDATE or DELETE.
    pub kind: StatementKind,
    /// Every (table, kind) the statement needs a grant for: its target with the statement's kind,
    /// every other table it reads with `select`.
    pub grants_needed: Vec<(String, StatementKind)>,
    /// Highest placeholder number used (`$3` → 3).
    pub param_count: usize,
    /// The parsed statement.
    pub statement: SqlStatement,
    pub(crate) accesses: Vec<Access>,
    /// The statement in the portable subset, from which every engine's SQL is rendered.
    pub portable: crate::portable::Portable,
}

struct Scope<'a> {
    /// (alias or table name, table) for each table in FROM, then those of enclosing queries.
    tables: Vec<(String, &'a Table)>,
    /// Nesting level of each table: 0 for the query's own FROM, 1 for the enclosing query, ….
    levels: Vec<usize>,
}

impl Scope<'_> {
    /// Resolves a column reference to (table index in scope, key position) if it names a key column.
    fn key_column(&self, expr: &Expr) -> Option<(usize, usize)> {
        let (qualifier, column) = match expr {
            Expr::Identifier(id) => (None, id.value.to_lowercase()),
            Expr::CompoundIdentifier(parts) if parts.len() >= 2 => (
                Some(parts[parts.len() - 2].value.to_lowercase()),
                parts[parts.len() - 1].value.to_lowercase(),
            ),
            Expr::Nested(e) => return self.key_column(e),
            _ => return None,
        };
        // SQL binds a reference to the innermost level that has a matching table and column.
        let mut found = None;
        for (i, (alias, table)) in self.tables.iter().enumerate() {
            if let Some((j, _)) = found
                && self.levels[i] > self.levels[j]
            {
                break;
            }
            if qualifier.as_ref().is_some_and(|q| q != alias) {
                continue;
            }
            if let Some(col) = table.column(&column) {
                if found.is_some() {
                    return None; // ambiguous: SQL would reject it; we constrain nothing
                }
                found = Some((i, table.primary_key.iter().position(|c| *c == col)));
            }
        }
        found.and_then(|(i, pos)| pos.map(|p| (i, p)))
    }

    fn key_type(&self, (t, p): KeyCol) -> &ColumnType {
        let table = self.tables[t].1;
        &table.columns[table.primary_key[p]].ty
    }
}

/// A key column of a scope: (table index in scope, key position).
type KeyCol = (usize, usize);

/// One conjunct over the scope's key columns.
#[derive(Clone, Debug)]
enum ScopedAtom {
    /// An atom on one key column.
    On(KeyCol, Atom),
    /// Two key columns of the same type are equal (a join condition): atoms on one hold for the other.
    Same(KeyCol, KeyCol),
}

/// A conjunction of scoped atoms.
type ScopedConj = Vec<ScopedAtom>;

pub(crate) fn literal(v: &SqlValue) -> Option<Value> {
    match v {
        SqlValue::Number(n, _) => {
            if n.contains('.') {
                n.parse().ok().map(Value::Decimal)
            } else {
                n.parse::<i64>()
                    .ok()
                    .map(Value::Int)
                    .or_else(|| n.parse().ok().map(Value::Decimal))
            }
        }
        SqlValue::SingleQuotedString(s) => Some(Value::Text(s.clone())),
        SqlValue::Boolean(b) => Some(Value::Bool(*b)),
        SqlValue::Null => Some(Value::Null),
        SqlValue::HexStringLiteral(h) => hex_bytes(h).map(Value::Bytes),
        _ => None,
    }
}

/// Decodes hex digits (an `X'…'` literal or a `{"hex": …}` JSON value).
pub(crate) fn hex_bytes(h: &str) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

pub(crate) fn placeholder_index(p: &str) -> Option<usize> {
    let n = p.strip_prefix('$')?;
    if n.starts_with('0') || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse::<usize>().ok().filter(|n| *n >= 1)
}

fn term(expr: &Expr) -> Term {
    match expr {
        Expr::Value(v) => match &v.value {
            SqlValue::Placeholder(p) => {
                placeholder_index(p).map_or(Term::Unknown, |n| Term::Param(n - 1))
            }
            other => literal(other).map_or(Term::Unknown, Term::Const),
        },
        Expr::Nested(e) => term(e),
        Expr::UnaryOp {
            op: UnaryOperator::Plus,
            expr,
        } => term(expr),
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match term(expr) {
            Term::Unknown => Term::Unknown,
            t => Term::Neg(Box::new(t)),
        },
        _ => Term::Unknown,
    }
}

/// The predicate as a disjunction of conjunctions; `vec![vec![]]` is TRUE.
fn dnf(expr: &Expr, scope: &Scope<'_>) -> Vec<ScopedConj> {
    let truth = || vec![Vec::new()];
    let atom = |col: &Expr, a: Atom| match scope.key_column(col) {
        Some(kc) => vec![vec![ScopedAtom::On(kc, a)]],
        None => truth(),
    };
    match expr {
        Expr::Nested(e) => dnf(e, scope),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            let (l, r) = (dnf(left, scope), dnf(right, scope));
            if l.len() * r.len() > MAX_CONJUNCTIONS {
                // Keep the narrower side: dropping a conjunct only widens.
                return if l.len() <= r.len() { l } else { r };
            }
            l.iter()
                .flat_map(|a| r.iter().map(move |b| a.iter().chain(b).cloned().collect()))
                .collect()
        }
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Or,
            right,
        } => {
            let mut l = dnf(left, scope);
            let r = dnf(right, scope);
            if l.len() + r.len() > MAX_CONJUNCTIONS {
                return truth();
            }
            l.extend(r);
            l
        }
        Expr::BinaryOp { left, op, right } => {
            let (col, value, flipped) = match (scope.key_column(left), scope.key_column(right)) {
                (Some(_), None) => (left, right, false),
                (None, Some(_)) => (right, left, true),
                // Equal key columns of one type (coercions differ between engines otherwise).
                (Some(a), Some(b))
                    if *op == BinaryOperator::Eq && scope.key_type(a) == scope.key_type(b) =>
                {
                    return vec![vec![ScopedAtom::Same(a, b)]];
                }
                _ => return truth(),
            };
            let t = term(value);
            let a = match (op, flipped) {
                (BinaryOperator::Eq, _) => Atom::Eq(t),
                (BinaryOperator::Lt, false) | (BinaryOperator::Gt, true) => Atom::Lt(t),
                (BinaryOperator::LtEq, false) | (BinaryOperator::GtEq, true) => Atom::Le(t),
                (BinaryOperator::Gt, false) | (BinaryOperator::Lt, true) => Atom::Gt(t),
                (BinaryOperator::GtEq, false) | (BinaryOperator::LtEq, true) => Atom::Ge(t),
                _ => return truth(),
            };
            atom(col, a)
        }
        Expr::InList {
            expr,
            list,
            negated: false,
        } => atom(expr, Atom::In(list.iter().map(term).collect())),
        Expr::Between {
            expr,
            negated: false,
            low,
            high,
        } => match scope.key_column(expr) {
            Some(kc) => vec![vec![
                ScopedAtom::On(kc, Atom::Ge(term(low))),
                ScopedAtom::On(kc, Atom::Le(term(high))),
            ]],
            None => truth(),
        },
        _ => truth(),
    }
}

/// The key columns equal to `col` within a conjunction (itself included), following `Same` links.
fn equal_columns(conj: &ScopedConj, col: KeyCol) -> Vec<KeyCol> {
    let mut class = vec![col];
    let mut i = 0;
    while i < class.len() {
        for a in conj {
            if let ScopedAtom::Same(x, y) = a {
                for (from, to) in [(x, y), (y, x)] {
                    if *from == class[i] && !class.contains(to) {
                        class.push(*to);
                    }
                }
            }
        }
        i += 1;
    }
    class
}

/// The scope of an UPDATE or DELETE (its one target table) and its WHERE clause in normal form
/// (TRUE without a WHERE).
fn target_predicate<'s>(
    alias: String,
    t: &'s Table,
    selection: Option<&Expr>,
) -> (Scope<'s>, Vec<ScopedConj>) {
    let scope = Scope {
        tables: vec![(alias, t)],
        levels: vec![0],
    };
    let conjs = selection.map_or_else(|| vec![Vec::new()], |e| dnf(e, &scope));
    (scope, conjs)
}

/// Projects a scoped DNF onto one table of the scope: its own atoms, plus the atoms of key columns
/// joined to its key columns by equality (`s.custid = c.custid AND c.custid = $1` bounds `s`).
fn project(conjs: &[ScopedConj], table: usize) -> Vec<Conj> {
    conjs
        .iter()
        .map(|c| {
            let mut atoms = Vec::new();
            for a in c {
                if let ScopedAtom::On(col, atom) = a {
                    for (t, p) in equal_columns(c, *col) {
                        if t == table {
                            atoms.push((p, atom.clone()));
                        }
                    }
                }
            }
            Conj { atoms }
        })
        .collect()
}

/// What a correlated subquery knows about the query around it: the enclosing scope's tables and
/// the enclosing predicate over them. A subquery in a WHERE, a SET or a projection only matters for
/// rows the enclosing predicate can select (the predicate with every unknown part read as TRUE is
/// monotone, so a row it rejects is rejected whatever the subquery yields).
#[derive(Clone)]
struct Outer<'s> {
    tables: Vec<(String, &'s Table)>,
    levels: Vec<usize>,
    conjs: Vec<ScopedConj>,
}

/// Conjoins two normal forms; `None` past [`MAX_CONJUNCTIONS`].
fn conjoin(a: &[ScopedConj], b: &[ScopedConj]) -> Option<Vec<ScopedConj>> {
    (a.len() * b.len() <= MAX_CONJUNCTIONS).then(|| {
        a.iter()
            .flat_map(|x| b.iter().map(move |y| x.iter().chain(y).cloned().collect()))
            .collect()
    })
}

/// Renumbers the scope indexes of a normal form by `offset` (the enclosing tables come after the
/// subquery's own in the subquery's scope).
fn shift(conjs: &[ScopedConj], offset: usize) -> Vec<ScopedConj> {
    let mv = |(t, p): KeyCol| (t + offset, p);
    conjs
        .iter()
        .map(|c| {
            c.iter()
                .map(|a| match a {
                    ScopedAtom::On(k, atom) => ScopedAtom::On(mv(*k), atom.clone()),
                    ScopedAtom::Same(x, y) => ScopedAtom::Same(mv(*x), mv(*y)),
                })
                .collect()
        })
        .collect()
}

/// Removes one occurrence of each of `these` from `all` (a multiset difference).
fn without(mut all: Vec<Query>, these: &[Query]) -> Vec<Query> {
    for q in these {
        if let Some(i) = all.iter().position(|x| x == q) {
            all.remove(i);
        }
    }
    all
}

/// Collects the subqueries directly inside a node (not those nested in other subqueries).
#[derive(Default)]
struct TopLevelQueries {
    depth: usize,
    found: Vec<Query>,
}

impl Visitor for TopLevelQueries {
    type Break = ();
    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        if self.depth == 0 {
            self.found.push(q.clone());
        }
        self.depth += 1;
        ControlFlow::Continue(())
    }
    fn post_visit_query(&mut self, _q: &Query) -> ControlFlow<()> {
        self.depth -= 1;
        ControlFlow::Continue(())
    }
}

fn subqueries<V: Visit>(node: &V) -> Vec<Query> {
    let mut v = TopLevelQueries::default();
    let _ = node.visit(&mut v);
    v.found
}

/// The result of [`Analysis::statement`].
pub(crate) struct Analyzed {
    pub(crate) kind: StatementKind,
    pub(crate) accesses: Vec<Access>,
    pub(crate) grants: Vec<(String, StatementKind)>,
}

pub(crate) struct Analysis<'s> {
    schema: &'s Schema,
    accesses: Vec<Access>,
    /// Relation occurrences handled precisely, by table name.
    handled: BTreeMap<String, usize>,
    grants: Vec<(String, StatementKind)>,
}

fn table_resource(t: &Table) -> (Resource, Vec<crate::schema::ColumnType>) {
    (
        Resource {
            name: Arc::from(t.name.as_str()),
            arity: t.primary_key.len(),
        },
        t.primary_key
            .iter()
            .map(|c| t.columns[*c].ty.clone())
            .collect(),
    )
}

fn unique_resource(t: &Table, i: usize) -> (Resource, Vec<crate::schema::ColumnType>) {
    (
        Resource {
            name: Arc::from(t.unique_space_name(i)),
            arity: t.uniques[i].len(),
        },
        t.uniques[i]
            .iter()
            .map(|c| t.columns[*c].ty.clone())
            .collect(),
    )
}

impl<'s> Analysis<'s> {
    pub(crate) fn new(schema: &'s Schema) -> Self {
        Analysis {
            schema,
            accesses: Vec::new(),
            handled: BTreeMap::new(),
            grants: Vec::new(),
        }
    }

    fn table(&self, name: &ObjectName) -> Result<&'s Table, Rejection> {
        let n = object_name(name);
        let t = self.schema.table(&n).ok_or_else(|| {
            Rejection::unknown_name(format!("table {n} is not a registered shared table"))
        })?;
        if t.primary_key.is_empty() {
            return Err(Rejection::unknown_name(format!(
                "table {n} has no primary key; only tables with one can be shared"
            )));
        }
        Ok(t)
    }

    fn access(
        &mut self,
        (resource, key_types): (Resource, Vec<crate::schema::ColumnType>),
        write: bool,
        keys: KeyPlan,
    ) {
        let mode = if write { Mode::Write } else { Mode::Read };
        self.accesses.push(Access {
            resource,
            key_types,
            mode,
            keys,
        });
    }

    /// Reads and writes the same keys (the rows an UPDATE or DELETE selects), bound once.
    fn access_rw(
        &mut self,
        (resource, key_types): (Resource, Vec<crate::schema::ColumnType>),
        keys: KeyPlan,
    ) {
        self.accesses.push(Access {
            resource,
            key_types,
            mode: Mode::ReadWrite,
            keys,
        });
    }

    fn handle(&mut self, t: &Table, kind: StatementKind) {
        *self.handled.entry(t.name.clone()).or_default() += 1;
        if !self.grants.contains(&(t.name.clone(), kind)) {
            self.grants.push((t.name.clone(), kind));
        }
    }

    pub(crate) fn statement(mut self, st: &SqlStatement) -> Result<Analyzed, Rejection> {
        let kind = match st {
            SqlStatement::Query(q) => {
                self.query(q, None)?;
                StatementKind::Select
            }
            SqlStatement::Insert(i) => {
                self.insert(i)?;
                StatementKind::Insert
            }
            SqlStatement::Update(u) => {
                self.update(u)?;
                StatementKind::Update
            }
            SqlStatement::Delete(d) => {
                self.delete(d)?;
                StatementKind::Delete
            }
            other => return Err(crate::determinism::statement_kind_rejection(other)),
        };
        // Safety net: every relation occurrence not handled above is read whole.
        let mut total: BTreeMap<String, usize> = BTreeMap::new();
        let _ = visit_relations(st, |name| {
            *total.entry(object_name(name)).or_default() += 1;
            ControlFlow::<()>::Continue(())
        });
        for (name, n) in total {
            if n > self.handled.get(&name).copied().unwrap_or(0) {
                let t = self.table(&ObjectName::from(vec![sqlparser::ast::Ident::new(name)]))?;
                self.access(table_resource(t), false, KeyPlan::All);
                self.handle(t, StatementKind::Select);
            }
        }
        Ok(Analyzed {
            kind,
            accesses: self.accesses,
            grants: self.grants,
        })
    }

    fn subqueries_of<V: Visit>(&mut self, node: &V) -> Result<(), Rejection> {
        for q in subqueries(node) {
            self.query(&q, None)?;
        }
        Ok(())
    }

    /// Subqueries of a WHERE, SET or projection: analysed knowing the enclosing predicate.
    fn correlated_subqueries_of<V: Visit>(
        &mut self,
        node: &V,
        outer: &Outer<'s>,
    ) -> Result<Vec<Query>, Rejection> {
        let found = subqueries(node);
        for q in &found {
            self.query(q, Some(outer))?;
        }
        Ok(found)
    }

    fn query(&mut self, q: &Query, outer: Option<&Outer<'s>>) -> Result<(), Rejection> {
        if q.with.is_some() {
            return Err(Rejection::unsupported(
                "WITH (common table expressions) is not supported",
            ));
        }
        if q.fetch.is_some() {
            return Err(Rejection::unsupported(
                "FETCH is not portable; use LIMIT with a total ORDER BY",
            ));
        }
        if !q.locks.is_empty() {
            return Err(Rejection::unsupported(
                "FOR UPDATE/FOR SHARE is not needed: chainify already orders conflicting transactions",
            ));
        }
        if q.for_clause.is_some()
            || q.settings.is_some()
            || q.format_clause.is_some()
            || !q.pipe_operators.is_empty()
        {
            return Err(Rejection::unsupported(
                "query clause is not in the portable subset",
            ));
        }
        // Subqueries in ORDER BY and LIMIT expressions.
        if let Some(ob) = &q.order_by {
            self.subqueries_of(ob)?;
        }
        self.set_expr(&q.body, outer)
    }

    fn set_expr(&mut self, body: &SetExpr, outer: Option<&Outer<'s>>) -> Result<(), Rejection> {
        match body {
            SetExpr::Select(s) => self.select(s, outer),
            SetExpr::Query(q) => self.query(q, outer),
            SetExpr::SetOperation { left, right, .. } => {
                self.set_expr(left, outer)?;
                self.set_expr(right, outer)
            }
            SetExpr::Values(v) => self.subqueries_of(v),
            _ => Err(Rejection::unsupported(
                "only SELECT, VALUES and set operations are allowed in queries",
            )),
        }
    }

    /// The tables of a SELECT's FROM clause (with their aliases).
    fn scope(&self, select: &Select) -> Result<Scope<'s>, Rejection> {
        let mut tables = Vec::new();
        for twj in &select.from {
            self.collect_tables(twj, &mut tables)?;
        }
        let levels = vec![0; tables.len()];
        Ok(Scope { tables, levels })
    }

    fn collect_tables(
        &self,
        twj: &TableWithJoins,
        out: &mut Vec<(String, &'s Table)>,
    ) -> Result<(), Rejection> {
        for factor in std::iter::once(&twj.relation).chain(twj.joins.iter().map(|j| &j.relation)) {
            match factor {
                TableFactor::Table {
                    name,
                    alias,
                    args: None,
                    with_hints,
                    version: None,
                    partitions,
                    sample: None,
                    index_hints,
                    ..
                } if with_hints.is_empty() && partitions.is_empty() && index_hints.is_empty() => {
                    let t = self.table(name)?;
                    let a = alias
                        .as_ref()
                        .map_or_else(|| t.name.clone(), |a| a.name.value.to_lowercase());
                    out.push((a, t));
                }
                TableFactor::Derived { .. } => {} // analysed as a subquery
                TableFactor::NestedJoin {
                    table_with_joins,
                    alias: None,
                } => self.collect_tables(table_with_joins, out)?,
                other => {
                    return Err(Rejection::unsupported(format!(
                        "FROM item `{other}` is not in the portable subset"
                    )));
                }
            }
        }
        Ok(())
    }

    fn select(&mut self, s: &Select, outer: Option<&Outer<'s>>) -> Result<(), Rejection> {
        let unsupported = s.top.is_some()
            || s.into.is_some()
            || !s.lateral_views.is_empty()
            || s.prewhere.is_some()
            || !s.connect_by.is_empty()
            || !s.cluster_by.is_empty()
            || !s.distribute_by.is_empty()
            || !s.sort_by.is_empty()
            || !s.named_window.is_empty()
            || s.qualify.is_some()
            || s.value_table_mode.is_some()
            || matches!(s.distinct, Some(sqlparser::ast::Distinct::On(_)));
        if unsupported {
            return Err(Rejection::unsupported(
                "SELECT clause is not in the portable subset",
            ));
        }
        let mut scope = self.scope(s)?;
        let own = scope.tables.len();
        // Enclosing tables come after the own ones, one level further out: a reference binds to
        // the innermost level that has it, as in SQL.
        if let Some(o) = outer {
            scope.tables.extend(o.tables.iter().cloned());
            scope.levels.extend(o.levels.iter().map(|l| l + 1));
        }
        // WHERE and the ON conditions of inner joins restrict every table's contributing rows.
        let mut preds: Vec<&Expr> = s.selection.iter().collect();
        for twj in &s.from {
            for j in &twj.joins {
                if let JoinOperator::Join(JoinConstraint::On(e))
                | JoinOperator::Inner(JoinConstraint::On(e)) = &j.join_operator
                {
                    preds.push(e);
                }
            }
        }
        let mut conjs: Vec<ScopedConj> = vec![Vec::new()];
        for p in preds {
            let d = dnf(p, &scope);
            if conjs.len() * d.len() <= MAX_CONJUNCTIONS {
                conjs = conjs
                    .iter()
                    .flat_map(|a| d.iter().map(move |b| a.iter().chain(b).cloned().collect()))
                    .collect();
            }
        }
        if let Some(o) = outer
            && let Some(c) = conjoin(&conjs, &shift(&o.conjs, own))
        {
            conjs = c;
        }
        for (i, (_, t)) in scope.tables.iter().take(own).enumerate() {
            self.access(table_resource(t), false, KeyPlan::Dnf(project(&conjs, i)));
            self.handle(t, StatementKind::Select);
        }
        let context = Outer {
            tables: scope.tables.clone(),
            levels: scope.levels.clone(),
            conjs,
        };
        let mut done = self.correlated_subqueries_of(&s.selection, &context)?;
        done.extend(self.correlated_subqueries_of(&s.projection, &context)?);
        for q in without(subqueries(s), &done) {
            self.query(&q, None)?;
        }
        Ok(())
    }

    fn single_table(
        &self,
        twj: &TableWithJoins,
        what: &str,
    ) -> Result<(&'s Table, String), Rejection> {
        if !twj.joins.is_empty() {
            return Err(Rejection::unsupported(format!(
                "{what} of joined tables is not portable"
            )));
        }
        let mut tables = Vec::new();
        self.collect_tables(twj, &mut tables)?;
        match tables.pop() {
            Some((alias, t)) if tables.is_empty() => Ok((t, alias)),
            _ => Err(Rejection::unsupported(format!(
                "{what} must name one table"
            ))),
        }
    }

    fn update(&mut self, u: &Update) -> Result<(), Rejection> {
        if u.from.is_some() {
            return Err(Rejection::unsupported("UPDATE … FROM is not portable"));
        }
        if u.returning.is_some() || u.output.is_some() {
            return Err(Rejection::unsupported("RETURNING is not portable"));
        }
        if u.or.is_some() || !u.order_by.is_empty() || u.limit.is_some() {
            return Err(Rejection::unsupported(
                "UPDATE with OR/ORDER BY/LIMIT is not portable",
            ));
        }
        let (t, alias) = self.single_table(&u.table, "UPDATE")?;
        let mut assigned: Vec<(usize, Term)> = Vec::new();
        for a in &u.assignments {
            let AssignmentTarget::ColumnName(name) = &a.target else {
                return Err(Rejection::unsupported(
                    "tuple assignments are not portable; assign columns one by one",
                ));
            };
            let col_name = crate::ident::column_name(name);
            let col = t.column(&col_name).ok_or_else(|| {
                Rejection::unknown_name(format!(
                    "UPDATE sets unknown column {col_name} of table {}",
                    t.name
                ))
            })?;
            if assigned.iter().any(|(c, _)| *c == col) {
                return Err(Rejection::unknown_name(format!(
                    "UPDATE sets column {col_name} twice"
                )));
            }
            assigned.push((col, term(&a.value)));
        }
        let (scope, where_dnf) = target_predicate(alias, t, u.selection.as_ref());
        let old = project(&where_dnf, 0);
        self.handle(t, StatementKind::Update);
        self.access_rw(table_resource(t), KeyPlan::Dnf(old.clone()));
        let key_assign: Vec<(usize, Term)> = assigned
            .iter()
            .filter_map(|(c, term)| {
                t.primary_key
                    .iter()
                    .position(|k| k == c)
                    .map(|p| (p, term.clone()))
            })
            .collect();
        let changes = |cols: &[usize]| cols.iter().any(|c| assigned.iter().any(|(a, _)| a == c));
        if !key_assign.is_empty() {
            self.access(
                table_resource(t),
                true,
                KeyPlan::Rekey {
                    old,
                    assign: key_assign,
                },
            );
            self.parent_change(t, &t.primary_key.clone(), KeyPlan::All, |fk| fk.on_update())?;
        }
        for i in 0..t.uniques.len() {
            if changes(&t.uniques[i]) {
                // The old value is freed and is not known statically.
                self.access(unique_resource(t, i), true, KeyPlan::All);
                self.parent_change(t, &t.uniques[i].clone(), KeyPlan::All, |fk| fk.on_update())?;
            }
        }
        for fk in &t.foreign_keys {
            if changes(&fk.columns) {
                let row: Option<Vec<Term>> = fk
                    .columns
                    .iter()
                    .map(|c| {
                        assigned
                            .iter()
                            .find(|(a, _)| a == c)
                            .map(|(_, term)| term.clone())
                    })
                    .collect();
                self.parent_lookup(fk, row)?;
            }
        }
        let context = Outer {
            tables: scope.tables.clone(),
            levels: scope.levels.clone(),
            conjs: where_dnf,
        };
        self.correlated_subqueries_of(&u.assignments, &context)?;
        self.correlated_subqueries_of(&u.selection, &context)?;
        Ok(())
    }

    /// A child row's foreign key is checked against the parent: a read of the referenced key.
    fn parent_lookup(
        &mut self,
        fk: &crate::schema::ForeignKey,
        row: Option<Vec<Term>>,
    ) -> Result<(), Rejection> {
        let parent = self.schema.table(&fk.parent).ok_or_else(|| {
            Rejection::unknown_name(format!(
                "foreign key references unknown table {}",
                fk.parent
            ))
        })?;
        let keys = row.map_or(KeyPlan::All, |r| KeyPlan::Rows(vec![r]));
        match self.schema.referenced_space(fk) {
            Some(KeySpace::Primary) => self.access(table_resource(parent), false, keys),
            Some(KeySpace::Unique(i)) => {
                self.access(unique_resource(parent, i), false, keys);
                // The lookup also depends on which parent row holds the value.
                self.access(table_resource(parent), false, KeyPlan::All);
            }
            None => self.access(table_resource(parent), false, KeyPlan::All),
        }
        Ok(())
    }

    /// Deleting parent rows or changing their referenced columns checks (RESTRICT) or modifies
    /// (CASCADE, SET NULL, SET DEFAULT) the children that reference them, recursively for
    /// modifications. A modified child may have been deleted (CASCADE on delete) or updated (SET
    /// NULL or SET DEFAULT on delete, any action on update), so its own children are taken to
    /// react by either of their actions.
    fn parent_change(
        &mut self,
        parent: &Table,
        changed_cols: &[usize],
        parent_keys: KeyPlan,
        action: fn(&crate::schema::ForeignKey) -> RefAction,
    ) -> Result<(), Rejection> {
        fn either(fk: &crate::schema::ForeignKey) -> RefAction {
            if fk.on_delete() == RefAction::Modify || fk.on_update() == RefAction::Modify {
                RefAction::Modify
            } else {
                RefAction::Restrict
            }
        }
        type Action = fn(&crate::schema::ForeignKey) -> RefAction;
        let mut stack: Vec<(String, Vec<usize>, KeyPlan, Action)> = vec![(
            parent.name.clone(),
            changed_cols.to_vec(),
            parent_keys,
            action,
        )];
        let mut visited: Vec<String> = Vec::new();
        while let Some((pname, cols, keys, action)) = stack.pop() {
            let Some(p) = self.schema.table(&pname) else {
                continue;
            };
            for (child, fk_idx) in self.schema.children_of(&p.name).collect::<Vec<_>>() {
                let fk = &child.foreign_keys[fk_idx];
                let referenced: Vec<usize> = fk
                    .parent_columns
                    .iter()
                    .filter_map(|c| p.column(c))
                    .collect();
                if !referenced.iter().any(|c| cols.contains(c)) {
                    continue;
                }
                // Children keyed by the parent's key (FK = leading child key columns, referencing
                // the parent's primary key in order) inherit the parent's key predicate.
                let inherits = fk.parent_columns.len() <= child.primary_key.len()
                    && child.primary_key[..fk.columns.len()] == fk.columns[..]
                    && self.schema.referenced_space(fk) == Some(KeySpace::Primary)
                    && referenced == p.primary_key;
                let child_keys = match (&keys, inherits) {
                    (KeyPlan::Dnf(d), true) => KeyPlan::Dnf(d.clone()),
                    _ => KeyPlan::All,
                };
                let modify = action(fk) == RefAction::Modify;
                self.access(table_resource(child), modify, child_keys.clone());
                if modify {
                    for i in 0..child.uniques.len() {
                        self.access(unique_resource(child, i), true, KeyPlan::All);
                    }
                    if !visited.contains(&child.name) {
                        visited.push(child.name.clone());
                        // A cascaded change may in turn affect the child's children.
                        let all_cols: Vec<usize> = (0..child.columns.len()).collect();
                        stack.push((child.name.clone(), all_cols, KeyPlan::All, either));
                    }
                }
            }
        }
        Ok(())
    }

    fn delete(&mut self, d: &Delete) -> Result<(), Rejection> {
        if !d.tables.is_empty() || d.using.is_some() {
            return Err(Rejection::unsupported("multi-table DELETE is not portable"));
        }
        if d.returning.is_some() || d.output.is_some() {
            return Err(Rejection::unsupported("RETURNING is not portable"));
        }
        if !d.order_by.is_empty() || d.limit.is_some() {
            return Err(Rejection::unsupported(
                "DELETE with ORDER BY/LIMIT is not portable",
            ));
        }
        let from = match &d.from {
            FromTable::WithFromKeyword(f) | FromTable::WithoutKeyword(f) => f,
        };
        let [twj] = from.as_slice() else {
            return Err(Rejection::unsupported("DELETE must name one table"));
        };
        let (t, alias) = self.single_table(twj, "DELETE")?;
        let (scope, where_dnf) = target_predicate(alias, t, d.selection.as_ref());
        let keys = project(&where_dnf, 0);
        self.handle(t, StatementKind::Delete);
        self.access_rw(table_resource(t), KeyPlan::Dnf(keys.clone()));
        for i in 0..t.uniques.len() {
            self.access(unique_resource(t, i), true, KeyPlan::All);
        }
        let all_cols: Vec<usize> = (0..t.columns.len()).collect();
        self.parent_change(t, &all_cols, KeyPlan::Dnf(keys), |fk| fk.on_delete())?;
        let context = Outer {
            tables: scope.tables,
            levels: scope.levels,
            conjs: where_dnf,
        };
        self.correlated_subqueries_of(&d.selection, &context)?;
        Ok(())
    }

    fn insert(&mut self, ins: &Insert) -> Result<(), Rejection> {
        if ins.or.is_some() || ins.ignore || ins.replace_into || ins.overwrite {
            return Err(Rejection::unsupported(
                "INSERT OR/IGNORE/REPLACE is not portable",
            ));
        }
        if ins.on.is_some() {
            return Err(Rejection::unsupported(
                "INSERT … ON CONFLICT / ON DUPLICATE KEY UPDATE is not portable",
            ));
        }
        if ins.returning.is_some() || ins.output.is_some() {
            return Err(Rejection::unsupported("RETURNING is not portable"));
        }
        if !ins.assignments.is_empty() {
            return Err(Rejection::unsupported(
                "INSERT … SET is not portable; use a column list and VALUES",
            ));
        }
        if ins.partitioned.is_some()
            || !ins.after_columns.is_empty()
            || ins.priority.is_some()
            || ins.insert_alias.is_some()
            || ins.settings.is_some()
            || ins.format_clause.is_some()
            || ins.multi_table_insert_type.is_some()
            || !ins.multi_table_into_clauses.is_empty()
            || ins.table_alias.is_some()
        {
            return Err(Rejection::unsupported(
                "INSERT clause is not in the portable subset",
            ));
        }
        let TableObject::TableName(name) = &ins.table else {
            return Err(Rejection::unsupported(
                "INSERT into a table function is not portable",
            ));
        };
        let t = self.table(name)?;
        if ins.columns.is_empty() {
            return Err(Rejection::unsupported(format!(
                "INSERT into {} must list its columns",
                t.name
            )));
        }
        let mut cols = Vec::new();
        for c in &ins.columns {
            let n = crate::ident::column_name(c);
            let i = t.column(&n).ok_or_else(|| {
                Rejection::unknown_name(format!("INSERT into {} names unknown column {n}", t.name))
            })?;
            if cols.contains(&i) {
                return Err(Rejection::unknown_name(format!(
                    "INSERT into {} names column {n} twice",
                    t.name
                )));
            }
            cols.push(i);
        }
        if let Some(missing) = t.primary_key.iter().find(|k| !cols.contains(k)) {
            return Err(Rejection::nondeterministic(format!(
                "INSERT into {} must give primary key column {} (generated keys are not deterministic)",
                t.name, t.columns[*missing].name
            )));
        }
        self.handle(t, StatementKind::Insert);
        let source = ins.source.as_ref().ok_or_else(|| {
            Rejection::unsupported(format!("INSERT into {} has no VALUES or SELECT", t.name))
        })?;
        let rows = match source.body.as_ref() {
            SetExpr::Values(v)
                if source.order_by.is_none()
                    && source.limit_clause.is_none()
                    && source.with.is_none() =>
            {
                let mut rows = Vec::new();
                for (r, row) in v.rows.iter().enumerate() {
                    if row.content.len() != cols.len() {
                        return Err(Rejection::wrong_type(format!(
                            "VALUES row {} has {} values for {} columns",
                            r + 1,
                            row.content.len(),
                            cols.len()
                        )));
                    }
                    rows.push(row.content.iter().map(term).collect::<Vec<Term>>());
                }
                self.subqueries_of(v)?;
                Some(rows)
            }
            _ => {
                self.query(source, None)?;
                None
            }
        };
        // Key tuples of `key_cols` for every row, when every column is given.
        let tuples = |key_cols: &[usize]| -> Option<Vec<Vec<Term>>> {
            let rows = rows.as_ref()?;
            let pos: Option<Vec<usize>> = key_cols
                .iter()
                .map(|k| cols.iter().position(|c| c == k))
                .collect();
            let pos = pos?;
            Some(
                rows.iter()
                    .map(|r| pos.iter().map(|p| r[*p].clone()).collect())
                    .collect(),
            )
        };
        let plan = |rows: Option<Vec<Vec<Term>>>| rows.map_or(KeyPlan::All, KeyPlan::Rows);
        self.access(table_resource(t), true, plan(tuples(&t.primary_key)));
        for i in 0..t.uniques.len() {
            self.access(unique_resource(t, i), true, plan(tuples(&t.uniques[i])));
        }
        for fk in &t.foreign_keys {
            match tuples(&fk.columns) {
                Some(rows) => {
                    for row in rows {
                        self.parent_lookup(fk, Some(row))?;
                    }
                }
                None => self.parent_lookup(fk, None)?,
            }
        }
        Ok(())
    }
}
