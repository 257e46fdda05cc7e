//! The determinism rules (docs/design/overview.md §3): every honest organization must compute the
//! same result from the same statement, so anything that reads the clock, randomness, the session
//! or a sequence is rejected, with a message that names the construct.
//!
//! Functions are checked against an *allow*-list: an unknown function is rejected rather than
//! assumed deterministic.

use std::ops::ControlFlow;

use sqlparser::ast::{
    CastKind, DataType, Expr, FunctionArguments, Statement as SqlStatement, Value as SqlValue,
    ValueWithSpan, Visit, Visitor,
};

use crate::analyze::placeholder_index;
use crate::reject::{RejectKind, Rejection};

/// Deterministic functions that behave alike on PostgreSQL, MariaDB and SQLite (for the argument
/// types of the portable subset).
const ALLOWED_FUNCTIONS: &[&str] = &[
    "abs",
    "coalesce",
    "nullif",
    "lower",
    "upper",
    "length",
    "char_length",
    "substr",
    "substring",
    "trim",
    "ltrim",
    "rtrim",
    "replace",
    "count",
    "sum",
    "min",
    "max",
];

/// Why a function outside [`ALLOWED_FUNCTIONS`] is refused, and the kind of that refusal.
fn function_reason(name: &str) -> (RejectKind, &'static str) {
    use RejectKind::{Nondeterministic, Unsupported};
    match name {
        "now"
        | "current_timestamp"
        | "current_date"
        | "current_time"
        | "localtime"
        | "localtimestamp"
        | "sysdate"
        | "curdate"
        | "curtime"
        | "utc_timestamp"
        | "utc_date"
        | "utc_time"
        | "unix_timestamp"
        | "clock_timestamp"
        | "statement_timestamp"
        | "transaction_timestamp"
        | "timeofday"
        | "datetime"
        | "date"
        | "time"
        | "julianday"
        | "strftime"
        | "unixepoch" => (
            Nondeterministic,
            "reads the clock, which differs between organizations",
        ),
        "random" | "rand" | "uuid" | "uuid_short" | "gen_random_uuid" | "uuid_generate_v4"
        | "randomblob" | "random_bytes" => (Nondeterministic, "is random"),
        "nextval" | "currval" | "setval" | "lastval" | "last_insert_id" | "last_insert_rowid" => (
            Nondeterministic,
            "uses a sequence or generated key; give primary keys explicitly",
        ),
        "current_user" | "session_user" | "user" | "system_user" | "current_role"
        | "connection_id" | "pg_backend_pid" | "database" | "schema" | "current_schema"
        | "current_database" | "version" | "changes" | "total_changes" | "row_count"
        | "found_rows" | "txid_current" => (
            Nondeterministic,
            "depends on the session or the server, which differ between organizations",
        ),
        "sleep" | "pg_sleep" | "get_lock" | "release_lock" | "load_file" => {
            (Unsupported, "has side effects outside the database")
        }
        _ => (
            Unsupported,
            "is not in chainify's deterministic, portable function subset",
        ),
    }
}

/// Literals that PostgreSQL turns into the current time when cast to a date/time type.
const CLOCK_LITERALS: &[&str] = &["now", "today", "tomorrow", "yesterday"];

/// Walks the whole statement; returns the highest placeholder number or the first rejection.
pub(crate) fn check(st: &SqlStatement) -> Result<usize, Rejection> {
    let mut v = Checker::default();
    match st.visit(&mut v) {
        ControlFlow::Break(reason) => Err(reason),
        ControlFlow::Continue(()) => Ok(v.max_param),
    }
}

#[derive(Default)]
struct Checker {
    max_param: usize,
}

fn is_time_type(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Date
            | DataType::Time(..)
            | DataType::Timestamp(..)
            | DataType::Datetime(..)
            | DataType::Interval { .. }
            | DataType::TimestampNtz(..)
            | DataType::Date32
            | DataType::Datetime64(..)
    )
}

impl Visitor for Checker {
    type Break = Rejection;

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<Rejection> {
        match e {
            Expr::Function(f) => {
                let name = crate::ident::object_name(&f.name);
                let display = name.to_uppercase();
                if !ALLOWED_FUNCTIONS.contains(&name.as_str()) {
                    let (kind, why) = function_reason(&name);
                    return ControlFlow::Break(Rejection::new(kind, format!("{display}() {why}")));
                }
                if f.over.is_some() {
                    return ControlFlow::Break(Rejection::unsupported(format!(
                        "window function {display}() OVER (…) is not supported"
                    )));
                }
                if f.filter.is_some()
                    || !f.within_group.is_empty()
                    || !matches!(f.parameters, FunctionArguments::None)
                {
                    return ControlFlow::Break(Rejection::unsupported(format!(
                        "{display}() with FILTER/WITHIN GROUP is not portable"
                    )));
                }
            }
            Expr::Identifier(id) if id.value.starts_with('@') => {
                return ControlFlow::Break(Rejection::nondeterministic(format!(
                    "variable {} depends on the session",
                    id.value
                )));
            }
            Expr::Cast {
                data_type, kind, ..
            } => {
                if is_time_type(data_type) {
                    return ControlFlow::Break(Rejection::unsupported(format!(
                        "cast to {data_type} is not in the portable subset"
                    )));
                }
                if !matches!(kind, CastKind::Cast) {
                    return ControlFlow::Break(Rejection::unsupported(
                        "only CAST(x AS type) casts are portable",
                    ));
                }
            }
            Expr::TypedString(ts) if is_time_type(&ts.data_type) => {
                return ControlFlow::Break(Rejection::unsupported(format!(
                    "{} literals are not in the portable subset",
                    ts.data_type
                )));
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_value(&mut self, v: &ValueWithSpan) -> ControlFlow<Rejection> {
        match &v.value {
            SqlValue::Number(n, _) if n.contains(['e', 'E']) => {
                return ControlFlow::Break(Rejection::unsupported(format!(
                    "floating-point literal {n} is not portable; write an exact decimal"
                )));
            }
            SqlValue::Placeholder(p) => match placeholder_index(p) {
                Some(n) => self.max_param = self.max_param.max(n),
                None => {
                    return ControlFlow::Break(Rejection::parameter(format!(
                        "placeholder {p} is not supported; number parameters $1, $2, …"
                    )));
                }
            },
            SqlValue::SingleQuotedString(s)
                if CLOCK_LITERALS.contains(&s.trim().to_lowercase().as_str()) =>
            {
                return ControlFlow::Break(Rejection::nondeterministic(format!(
                    "the literal '{s}' is read as the current time by PostgreSQL; pass times as parameters"
                )));
            }
            SqlValue::Number(..)
            | SqlValue::SingleQuotedString(_)
            | SqlValue::Boolean(_)
            | SqlValue::Null
            | SqlValue::HexStringLiteral(_) => {}
            other => {
                return ControlFlow::Break(Rejection::unsupported(format!(
                    "literal {other} is not portable"
                )));
            }
        }
        ControlFlow::Continue(())
    }
}

/// The rejection for a statement that is not SELECT/INSERT/UPDATE/DELETE.
pub(crate) fn statement_kind_rejection(st: &SqlStatement) -> Rejection {
    let text = st.to_string();
    let head: String = text
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
        .to_uppercase();
    match st {
        SqlStatement::StartTransaction { .. }
        | SqlStatement::Commit { .. }
        | SqlStatement::Rollback { .. }
        | SqlStatement::Savepoint { .. }
        | SqlStatement::ReleaseSavepoint { .. } => Rejection::statement(format!(
            "{head}: transaction control is not allowed inside a transaction (chainify commits each transaction)"
        )),
        SqlStatement::CreateTable(_)
        | SqlStatement::AlterTable(_)
        | SqlStatement::Drop { .. }
        | SqlStatement::CreateIndex(_)
        | SqlStatement::CreateView(_)
        | SqlStatement::Truncate(_) => {
            Rejection::statement(format!("{head}: DDL is not allowed inside a transaction"))
        }
        SqlStatement::Set(_) => Rejection::statement(format!(
            "{head}: session settings are not allowed (chainify pins them)"
        )),
        _ => Rejection::statement(format!(
            "{head}: only SELECT, INSERT, UPDATE and DELETE are allowed"
        )),
    }
}
