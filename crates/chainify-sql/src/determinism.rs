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

use crate::analyze::{Reject, placeholder_index};

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

fn function_reason(name: &str) -> &'static str {
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
        | "unixepoch" => "reads the clock, which differs between organizations",
        "random" | "rand" | "uuid" | "uuid_short" | "gen_random_uuid" | "uuid_generate_v4"
        | "randomblob" | "random_bytes" => "is random",
        "nextval" | "currval" | "setval" | "lastval" | "last_insert_id" | "last_insert_rowid" => {
            "uses a sequence or generated key; give primary keys explicitly"
        }
        "current_user" | "session_user" | "user" | "system_user" | "current_role"
        | "connection_id" | "pg_backend_pid" | "database" | "schema" | "current_schema"
        | "current_database" | "version" | "changes" | "total_changes" | "row_count"
        | "found_rows" | "txid_current" => {
            "depends on the session or the server, which differ between organizations"
        }
        "sleep" | "pg_sleep" | "get_lock" | "release_lock" | "load_file" => {
            "has side effects outside the database"
        }
        _ => "is not in chainify's deterministic, portable function subset",
    }
}

/// Literals that PostgreSQL turns into the current time when cast to a date/time type.
const CLOCK_LITERALS: &[&str] = &["now", "today", "tomorrow", "yesterday"];

/// Walks the whole statement; returns the highest placeholder number or the first rejection.
pub(crate) fn check(st: &SqlStatement) -> Result<usize, Reject> {
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
    type Break = Reject;

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<Reject> {
        match e {
            Expr::Function(f) => {
                let name = crate::ident::object_name(&f.name);
                let display = name.to_uppercase();
                if !ALLOWED_FUNCTIONS.contains(&name.as_str()) {
                    return ControlFlow::Break(format!("{display}() {}", function_reason(&name)));
                }
                if f.over.is_some() {
                    return ControlFlow::Break(format!(
                        "window function {display}() OVER (…) is not supported"
                    ));
                }
                if f.filter.is_some()
                    || !f.within_group.is_empty()
                    || !matches!(f.parameters, FunctionArguments::None)
                {
                    return ControlFlow::Break(format!(
                        "{display}() with FILTER/WITHIN GROUP is not portable"
                    ));
                }
            }
            Expr::Identifier(id) if id.value.starts_with('@') => {
                return ControlFlow::Break(format!("variable {} depends on the session", id.value));
            }
            Expr::Cast {
                data_type, kind, ..
            } => {
                if is_time_type(data_type) {
                    return ControlFlow::Break(format!(
                        "cast to {data_type} is not in the portable subset"
                    ));
                }
                if !matches!(kind, CastKind::Cast) {
                    return ControlFlow::Break("only CAST(x AS type) casts are portable".into());
                }
            }
            Expr::TypedString(ts) if is_time_type(&ts.data_type) => {
                return ControlFlow::Break(format!(
                    "{} literals are not in the portable subset",
                    ts.data_type
                ));
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_value(&mut self, v: &ValueWithSpan) -> ControlFlow<Reject> {
        match &v.value {
            SqlValue::Number(n, _) if n.contains(['e', 'E']) => {
                return ControlFlow::Break(format!(
                    "floating-point literal {n} is not portable; write an exact decimal"
                ));
            }
            SqlValue::Placeholder(p) => match placeholder_index(p) {
                Some(n) => self.max_param = self.max_param.max(n),
                None => {
                    return ControlFlow::Break(format!(
                        "placeholder {p} is not supported; number parameters $1, $2, …"
                    ));
                }
            },
            SqlValue::SingleQuotedString(s)
                if CLOCK_LITERALS.contains(&s.trim().to_lowercase().as_str()) =>
            {
                return ControlFlow::Break(format!(
                    "the literal '{s}' is read as the current time by PostgreSQL; pass times as parameters"
                ));
            }
            SqlValue::Number(..)
            | SqlValue::SingleQuotedString(_)
            | SqlValue::Boolean(_)
            | SqlValue::Null
            | SqlValue::HexStringLiteral(_) => {}
            other => {
                return ControlFlow::Break(format!("literal {other} is not portable"));
            }
        }
        ControlFlow::Continue(())
    }
}

/// The rejection for a statement that is not SELECT/INSERT/UPDATE/DELETE.
pub(crate) fn statement_kind_rejection(st: &SqlStatement) -> Reject {
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
        | SqlStatement::ReleaseSavepoint { .. } => {
            format!(
                "{head}: transaction control is not allowed inside a transaction (chainify commits each transaction)"
            )
        }
        SqlStatement::CreateTable(_)
        | SqlStatement::AlterTable(_)
        | SqlStatement::Drop { .. }
        | SqlStatement::CreateIndex(_)
        | SqlStatement::CreateView(_)
        | SqlStatement::Truncate(_) => format!("{head}: DDL is not allowed inside a transaction"),
        SqlStatement::Set(_) => {
            format!("{head}: session settings are not allowed (chainify pins them)")
        }
        _ => format!("{head}: only SELECT, INSERT, UPDATE and DELETE are allowed"),
    }
}
