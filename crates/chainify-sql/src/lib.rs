//! chainify-sql: the analysis of client SQL, with no I/O.
//!
//! For every statement of a transaction it
//! 1. parses the text (sqlparser) and enforces chainify's *portable subset* and the *determinism
//!    rules* (docs/design/overview.md §3, docs/design/portable-sql.md), naming the offending
//!    construct in every rejection and classifying it ([`RejectKind`], a stable code);
//! 2. derives a [`StatementPlan`]: which primary-key ranges of which shared tables (and which
//!    UNIQUE-key values) the statement reads and writes, with parameters left symbolic, including
//!    the implicit accesses of foreign-key checks and cascades;
//! 3. binds the plan to the statement's parameters into a [`ReadWriteSet`].
//!
//! Plans are cached by SQL text, so a block of thousands of transactions of a few shapes costs one
//! hash lookup and a bind per statement.
//!
//! **Invariant: the analysis never under-approximates.** Whatever it cannot bound precisely it
//! widens, up to the whole table; a missed conflict would be a silent divergence between
//! organizations, an extra one only costs parallelism.
//!
//! Where it sits: pure, above `chainify-core` only. `chainify-storage` runs the SQL it renders
//! per engine, `chainify-node` uses it for admission and the ExecutionServer, `chainify-net` for
//! queries, and the binary for `chainify analyze`.

mod analyze;
pub mod check;
mod determinism;
mod ident;
pub mod json;
mod plan;
pub mod portable;
mod query;
mod reject;
pub mod render;
pub mod schema;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use chainify_core::Value;
use chainify_core::rwset::ReadWriteSet;
use chainify_core::tx::Transaction;
use rustc_hash::FxBuildHasher;
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::{Parser, ParserError};

pub use analyze::StatementPlan;
pub use plan::MAX_KEY_VALUE_BYTES;
pub use portable::{
    MAX_BOUND_BYTES, MAX_DEGREE, MAX_DEPTH, MAX_FOLDED_BYTES, MAX_PLACEHOLDERS, MAX_ROW_BYTES,
    MAX_SELECT_ENTRIES, MAX_SORT_KEY_BYTES, MAX_TERMS, Typed, Work,
};
pub use query::{MAX_QUERY_ROWS, OutputColumn, QueryPlan};
pub use reject::{RejectKind, Rejection};
pub use schema::{ColumnType, Schema, SchemaError};

/// Why a transaction was rejected by analysis: which statement, what kind of rejection (with a
/// stable code) and what construct.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("statement {statement}: {reason}")]
pub struct AnalysisError {
    /// 1-based statement number within the transaction (0: the transaction as a whole).
    pub statement: usize,
    /// The class of the rejection.
    pub kind: RejectKind,
    /// What is wrong, naming the construct, table, column or parameter.
    pub reason: String,
}

impl AnalysisError {
    /// The stable code of the rejection's kind (`SQL001`…, see [`RejectKind`]).
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }
}

/// The analysis of a whole transaction.
#[derive(Debug, Clone)]
pub struct TxAnalysis {
    /// Union of the statements' read and write sets.
    pub rwset: ReadWriteSet,
    /// The plan of each statement, in order.
    pub plans: Vec<Arc<StatementPlan>>,
    /// Each statement typed for its parameters and rendered for every engine, in order.
    pub typed: Vec<Arc<Typed>>,
}

/// A statement needs a grant the client does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("statement {statement}: client {client} may not {kind} table {table}")]
pub struct MissingGrant {
    /// 1-based statement number.
    pub statement: usize,
    /// The client.
    pub client: String,
    /// The statement kind needed (`select` for tables only read).
    pub kind: chainify_core::config::StatementKind,
    /// The table.
    pub table: String,
}

impl TxAnalysis {
    /// Checks every (table, kind) the transaction needs against the client's grants: each
    /// statement's target with the statement's kind, every other table its text reads (FROM,
    /// subqueries) with `select`. Foreign-key checks and cascades are implied by the write and need
    /// no grant of their own.
    pub fn check_grants(
        &self,
        client: &chainify_core::config::ClientInfo,
    ) -> Result<(), MissingGrant> {
        for (i, plan) in self.plans.iter().enumerate() {
            for (table, kind) in &plan.grants_needed {
                if !client.may(*kind, table) {
                    return Err(MissingGrant {
                        statement: i + 1,
                        client: client.id.to_string(),
                        kind: *kind,
                        table: table.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Most distinct statement texts kept in the plan cache; the cache is cleared when full (the
/// working set of an application is a handful of shapes).
pub const PLAN_CACHE_CAPACITY: usize = 16_384;

/// Most bytes the plan cache keeps, as estimated: clients choose the texts, so the count alone
/// let them fill gigabytes (an 83-byte statement of nested arithmetic kept ~450 KB of typed
/// renderings, a 19 KB `IN` list 2 MB of syntax tree). A plan counts its text
/// [`PLAN_BYTES_PER_TEXT_BYTE`] times over (its syntax tree and portable form) and the
/// renderings it caches as they are made.
pub const PLAN_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// What a plan is counted per byte of its text (measured: ~110 for a list of literals).
pub const PLAN_BYTES_PER_TEXT_BYTE: usize = 128;

/// Longest SQL text accepted, in bytes.
pub const MAX_SQL_LEN: usize = 64 * 1024;

/// Stack for analysing a new statement shape. The parser, the checks and the analysis walk the
/// syntax tree recursively; a hostile statement must be refused (it nests deeper than
/// [`MAX_DEPTH`]) rather than overflow a small worker stack while being walked. What is
/// accepted is shallow enough for any thread.
const ANALYSIS_STACK: usize = 64 * 1024 * 1024;

type PlanResult = Result<Arc<StatementPlan>, Rejection>;

/// How much work an analysis may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effort {
    /// Parse, analyse and type whatever is not cached.
    Any,
    /// Lookups only: stop with [`Miss`] at the first text or typing not cached.
    CachedOnly,
}

/// A [`Effort::CachedOnly`] analysis needed more than lookups.
#[derive(Debug)]
struct Miss;

/// Why an analysis stopped: a refusal, or (looking up only) a miss.
#[derive(Debug)]
enum Halt {
    Refused(AnalysisError),
    Miss,
}

impl From<Miss> for Halt {
    fn from(Miss: Miss) -> Halt {
        Halt::Miss
    }
}

impl From<AnalysisError> for Halt {
    fn from(e: AnalysisError) -> Halt {
        Halt::Refused(e)
    }
}

impl Halt {
    /// The answer of an analysis allowed any work (`statement` for the impossible miss).
    fn full<T>(r: Result<T, Halt>, statement: usize) -> Result<T, AnalysisError> {
        r.map_err(|halt| match halt {
            Halt::Refused(e) => e,
            Halt::Miss => Rejection::internal("an analysis was not made").at(statement),
        })
    }

    /// The answer of a lookups-only analysis: `None` on a miss.
    fn cached<T>(r: Result<T, Halt>) -> Option<Result<T, AnalysisError>> {
        match r {
            Ok(t) => Some(Ok(t)),
            Err(Halt::Refused(e)) => Some(Err(e)),
            Err(Halt::Miss) => None,
        }
    }
}

/// Plans (and rejections) by statement text, with the bytes of text kept.
#[derive(Debug, Default)]
struct PlanCache {
    plans: HashMap<Box<str>, PlanResult, FxBuildHasher>,
    bytes: usize,
}

/// Analyses transactions against a schema, caching plans by SQL text. Cheap to share between
/// threads (`&self` methods; the cache takes a read lock on hits).
#[derive(Debug)]
pub struct Analyzer {
    schema: Schema,
    cache: RwLock<PlanCache>,
    /// The most bytes of text the cache keeps ([`PLAN_CACHE_BYTES`]).
    cache_bytes: usize,
    /// The most whole-table scans a transaction's statement may nest.
    max_degree: u32,
    /// Stack bytes of the thread each new text is analysed on.
    analysis_stack: usize,
}

impl Analyzer {
    /// An analyzer for the given shared tables.
    pub fn new(schema: Schema) -> Self {
        Analyzer {
            schema,
            cache: RwLock::new(PlanCache::default()),
            cache_bytes: PLAN_CACHE_BYTES,
            max_degree: portable::MAX_DEGREE,
            analysis_stack: ANALYSIS_STACK,
        }
    }

    /// Analyses each new text on a thread of `bytes` of stack instead of the default
    /// 64 MiB; never less, which the nesting bounds are measured against.
    pub fn with_analysis_stack(mut self, bytes: usize) -> Self {
        self.analysis_stack = bytes.max(ANALYSIS_STACK);
        self
    }

    /// Lets a transaction's statement nest up to `degree` whole-table scans instead of
    /// [`MAX_DEGREE`] (a join of small tables in tools and tests comparing the engines; a
    /// network's organizations must all use the same, or they would disagree on what to
    /// refuse).
    pub fn with_nested_scans(mut self, degree: u32) -> Self {
        self.max_degree = degree;
        self
    }

    /// Keeps at most `bytes` of statement text in the plan cache instead of
    /// [`PLAN_CACHE_BYTES`].
    pub fn with_plan_cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The (cached) plan of one statement text, or why it is rejected.
    pub fn plan(&self, sql: &str) -> Result<Arc<StatementPlan>, Rejection> {
        match self.plan_in(sql, Effort::Any) {
            Ok(planned) => planned,
            Err(Miss) => Err(Rejection::internal("a plan was not made")),
        }
    }

    /// [`Analyzer::plan`]; with [`Effort::CachedOnly`], [`Miss`] instead of parsing.
    fn plan_in(&self, sql: &str, effort: Effort) -> Result<PlanResult, Miss> {
        // Refused before the cache: such a text is never kept (a client sending megabytes of
        // distinct texts would otherwise fill it).
        if let Err(refused) = Self::check_text(sql) {
            return Ok(Err(refused));
        }
        if let Some(hit) = self
            .cache
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .plans
            .get(sql)
        {
            return Ok(hit.clone());
        }
        if effort == Effort::CachedOnly {
            return Err(Miss);
        }
        let result = self.plan_uncached(sql).map(Arc::new);
        // An analysis that could not run (no thread under memory pressure, a panic) is not
        // kept: the next transaction with the text tries again instead of being refused here
        // alone for as long as the cache holds it.
        if matches!(&result, Err(r) if matches!(r.kind(), RejectKind::Internal | RejectKind::Unavailable))
        {
            return Ok(result);
        }
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        let bytes = sql.len() * PLAN_BYTES_PER_TEXT_BYTE;
        if cache.plans.len() >= PLAN_CACHE_CAPACITY || cache.bytes + bytes > self.cache_bytes {
            cache.plans.clear();
            cache.bytes = 0;
        }
        if cache.plans.insert(sql.into(), result.clone()).is_none() {
            cache.bytes += bytes;
        }
        Ok(result)
    }

    /// Types `plan` for these parameters (its renderings cached with it, and counted against
    /// the cache's budget); with [`Effort::CachedOnly`], [`Miss`] instead of typing.
    fn typed_in(
        &self,
        plan: &StatementPlan,
        params: &[Value],
        row_cap: Option<u64>,
        effort: Effort,
    ) -> Result<Result<Arc<portable::Typed>, Rejection>, Miss> {
        if effort == Effort::CachedOnly {
            return plan.portable.typed_if_cached(params, row_cap).ok_or(Miss);
        }
        let (typed, added) = plan.portable.typed_counted(params, row_cap);
        if added > 0 {
            let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
            cache.bytes += added;
            if cache.bytes > self.cache_bytes {
                cache.plans.clear();
                cache.bytes = 0;
            }
        }
        Ok(typed)
    }

    /// The statement texts the cache holds, and the bytes counted for them.
    pub fn cached(&self) -> (usize, usize) {
        let cache = self.cache.read().unwrap_or_else(|e| e.into_inner());
        (cache.plans.len(), cache.bytes)
    }

    /// Refuses a text too long or with a control character, before it is parsed or cached.
    fn check_text(sql: &str) -> Result<(), Rejection> {
        if sql.len() > MAX_SQL_LEN {
            return Err(Rejection::limit(format!(
                "SQL text has {} bytes; at most {MAX_SQL_LEN} are accepted",
                sql.len()
            )));
        }
        if let Some((at, c)) = sql
            .char_indices()
            .find(|(_, c)| portable::is_refused_control(*c))
        {
            return Err(Rejection::syntax(format!(
                "SQL text contains the control character U+{:04X} at byte {at}",
                u32::from(c)
            )));
        }
        Ok(())
    }

    fn plan_uncached(&self, sql: &str) -> Result<StatementPlan, Rejection> {
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("chainify-analyse".into())
                .stack_size(self.analysis_stack)
                .spawn_scoped(scope, || self.plan_on_this_stack(sql))
                .map_err(|e| {
                    Rejection::unavailable(format!(
                        "no thread for the analysis at this organization ({e}); not a verdict on the statement, try again"
                    ))
                })?
                .join()
                .unwrap_or_else(|_| Err(Rejection::internal("the analysis failed unexpectedly")))
        })
    }

    fn plan_on_this_stack(&self, sql: &str) -> Result<StatementPlan, Rejection> {
        let mut statements = Parser::new(&GenericDialect {})
            .with_recursion_limit(MAX_DEPTH)
            .try_with_sql(sql)
            .and_then(|mut p| p.parse_statements())
            .map_err(|e| {
                let reason = format!("does not parse: {e}");
                match e {
                    ParserError::RecursionLimitExceeded => Rejection::limit(reason),
                    _ => Rejection::syntax(reason),
                }
            })?;
        let statement = match statements.len() {
            1 => statements.remove(0),
            0 => return Err(Rejection::syntax("is empty")),
            n => {
                return Err(Rejection::syntax(format!(
                    "contains {n} SQL statements; give one per statement entry"
                )));
            }
        };
        // (Every walk here runs on the analysis stack; the portable form bounds depth and size
        // for whoever holds the plan afterwards.)
        let param_count = determinism::check(&statement)?;
        let portable = portable::build(&statement, &self.schema)?;
        let a = analyze::Analysis::new(&self.schema).statement(&statement)?;
        Ok(StatementPlan {
            kind: a.kind,
            grants_needed: a.grants,
            param_count,
            statement,
            accesses: a.accesses,
            portable,
        })
    }

    /// Analyses a transaction: plans every statement, checks parameter counts and binds the
    /// read/write sets.
    pub fn analyze(&self, tx: &Transaction) -> Result<TxAnalysis, AnalysisError> {
        Halt::full(self.analyze_in(tx, Effort::Any), 0)
    }

    /// [`Analyzer::analyze`] if it takes lookups only: `None` where a statement would have to
    /// be parsed or typed for new parameter types. A caller on an async worker runs the full
    /// analysis elsewhere then: a new shape of up to [`MAX_SQL_LEN`] bytes takes milliseconds
    /// to parse, and each new parameter signature ~0.2 ms to type and render, per statement.
    pub fn analyze_cached(&self, tx: &Transaction) -> Option<Result<TxAnalysis, AnalysisError>> {
        Halt::cached(self.analyze_in(tx, Effort::CachedOnly))
    }

    fn analyze_in(&self, tx: &Transaction, effort: Effort) -> Result<TxAnalysis, Halt> {
        if tx.statements.is_empty() {
            return Err(Rejection::syntax("the transaction has no statements")
                .at(0)
                .into());
        }
        let mut rwset = ReadWriteSet::default();
        let mut plans = Vec::with_capacity(tx.statements.len());
        let mut typed = Vec::with_capacity(tx.statements.len());
        let mut folding = portable::MAX_FOLDED_BYTES;
        for (i, st) in tx.statements.iter().enumerate() {
            let err = |r: Rejection| r.at(i + 1);
            let plan = self.plan_in(&st.sql, effort)?.map_err(err)?;
            check_params(&plan, &st.params).map_err(err)?;
            // A SELECT in a transaction is capped like a query: an engine reads at most one row
            // more than allowed, and the executor fails the transaction beyond the cap.
            let cap = (plan.kind == chainify_core::config::StatementKind::Select)
                .then_some(MAX_QUERY_ROWS as u64);
            let t = self
                .typed_in(&plan, &st.params, cap, effort)?
                .map_err(err)?;
            check_work(&t.work, self.max_degree).map_err(err)?;
            plan.portable
                .check_values_within(&t, &st.params, &mut folding)
                .map_err(err)?;
            bind_into(&plan, &st.params, &mut rwset);
            plans.push(plan);
            typed.push(t);
        }
        Ok(TxAnalysis {
            rwset,
            plans,
            typed,
        })
    }
}

/// A transaction runs to its end on every organization: refuse one whose work grows faster
/// than its tables (queries run under a deadline instead).
fn check_work(work: &portable::Work, max_degree: u32) -> Result<(), Rejection> {
    if work.degree <= max_degree {
        return Ok(());
    }
    Err(Rejection::limit(format!(
        "reads all of {}: its work grows with the product of the tables' sizes, and every \
         organization would run it to the end; fix the whole primary key (or a UNIQUE \
         constraint) of all but one of them by equality, with the key's own type (ON b.k = a.x, \
         WHERE k = $1)",
        work.scans.join(", and for each of those rows all of ")
    )))
}

fn check_params(plan: &StatementPlan, params: &[Value]) -> Result<(), Rejection> {
    if params.len() != plan.param_count {
        return Err(Rejection::parameter(format!(
            "uses {} parameter{} ($1..${}) but {} {} given",
            plan.param_count,
            if plan.param_count == 1 { "" } else { "s" },
            plan.param_count,
            params.len(),
            if params.len() == 1 { "was" } else { "were" }
        )));
    }
    Ok(())
}

/// Binds a plan's accesses to parameter values, adding them to `out`.
pub fn bind_into(plan: &StatementPlan, params: &[Value], out: &mut ReadWriteSet) {
    for a in &plan.accesses {
        a.bind_into(params, out);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use chainify_core::config::{ClientInfo, StatementKind};
    use chainify_core::crypto::SigningKey;
    use chainify_core::tx::Statement;
    use chainify_core::{ClientId, Value};

    use super::*;

    fn client(grants: &[(&str, &[StatementKind])]) -> ClientInfo {
        ClientInfo {
            id: ClientId::new("alice").unwrap(),
            public_key: SigningKey::from_seed(&[1; 32]).public_key(),
            grants: grants
                .iter()
                .map(|(t, k)| (t.to_string(), k.iter().copied().collect::<BTreeSet<_>>()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn grants_cover_targets_and_tables_read() {
        let an = Analyzer::new(
            Schema::from_sql("CREATE TABLE c (k INT PRIMARY KEY, v INT); CREATE TABLE s (k INT PRIMARY KEY, v INT)").unwrap(),
        );
        let tx = Transaction {
            statements: vec![
                Statement::new("UPDATE c SET v = v + 1 WHERE k = $1", vec![Value::Int(1)]),
                Statement::new(
                    "UPDATE c SET v = (SELECT v FROM s WHERE k = $1) WHERE k = $1",
                    vec![Value::Int(1)],
                ),
            ],
        };
        let a = an.analyze(&tx).unwrap();
        let writer = client(&[("c", &[StatementKind::Update])]);
        let err = a.check_grants(&writer).unwrap_err();
        assert_eq!(
            err.to_string(),
            "statement 2: client alice may not select table s"
        );
        assert!(
            a.check_grants(&client(&[
                ("c", &[StatementKind::Update]),
                ("s", &[StatementKind::Select])
            ]))
            .is_ok()
        );
        assert!(
            a.check_grants(&client(&[(
                "*",
                &[StatementKind::Update, StatementKind::Select]
            )]))
            .is_ok()
        );
        assert!(
            a.check_grants(&client(&[("c", &[StatementKind::Select])]))
                .is_err()
        );
    }
}
