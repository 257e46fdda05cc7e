//! The portable intermediate form: what an engine runs is rendered from here, never copied from
//! the client's text.
//!
//! [`build`] turns an analysed statement's syntax tree into a small tree of the portable subset,
//! resolving every name once (innermost scope first, as SQL does; ambiguity refused) and
//! refusing every construct it does not represent. [`Portable::typed`] types that tree from the
//! schema and the parameters' types and renders it for each engine, caching one result per
//! parameter-type signature. Rendering is canonical: every table occurrence gets a generated
//! alias, every column is qualified, every operator is parenthesized, literals are re-spelled
//! from their values. Comments, optimizer hints, control characters or dialect quirks in the
//! client's text therefore never reach an engine, and a name can never bind differently there
//! (an output alias shadowing a column, a bare name in a subquery).
//!
//! The type rules accept an operator, function or comparison only for the types on which
//! PostgreSQL, MariaDB/MySQL and SQLite compute the same value and fail alike; where only the
//! spelling differs, each engine gets its own (`DIV`, `char_length`, `NULLS FIRST`, checked
//! integer arithmetic on SQLite). Everything else is refused with the reason. The table of
//! semantics is `docs/design/portable-sql.md`.

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use chainify_core::Value;
use sqlparser::ast::{
    AssignmentTarget, BinaryOperator, Delete, Distinct, Expr as SqlExpr, FromTable, FunctionArg,
    FunctionArgExpr, FunctionArgumentClause, FunctionArguments, GroupByExpr, Insert,
    JoinConstraint, JoinOperator, LimitClause, ObjectName, OrderByKind, Query, Select, SelectItem,
    SelectItemQualifiedWildcardKind, SetExpr, Statement as SqlStatement, TableFactor, TableObject,
    UnaryOperator, Update, Value as SqlValue,
};

use crate::analyze::{literal, placeholder_index};
use crate::ident::object_name;
use crate::reject::Rejection;
use crate::render::{Dialect, Rendered};
use crate::schema::{ColumnType, Limit, Schema, Table};

mod work;
pub use work::{MAX_DEGREE, Work};

/// Deepest expression nesting accepted (operators, function arguments, subqueries).
pub const MAX_DEPTH: usize = 48;

/// Most tables one FROM clause may join.
pub const MAX_FROM: usize = 4;

/// Most expression nodes one statement may have.
pub const MAX_TERMS: usize = 4_096;

/// Most entries one SELECT's target list may have (its outputs, plus the ORDER BY and GROUP BY
/// keys that are not outputs), and most ORDER BY or GROUP BY terms it may have. PostgreSQL
/// refuses a target list of more than 1 664 entries (SQLSTATE 54011), counting every sort or
/// group key that is not an output as a hidden entry; SQLite refuses more than 2 000 result
/// columns, ORDER BY or GROUP BY terms (`SQLITE_MAX_COLUMN`); MariaDB takes them all. Well
/// below the smallest, with room for hidden entries PostgreSQL may add.
pub const MAX_SELECT_ENTRIES: usize = 1_000;

/// Most bytes the sort keys of one SELECT may take in MariaDB's sort buffer: its GROUP BY
/// keys, ORDER BY keys and, under DISTINCT, its outputs, each counted by [`sort_key_bytes`].
/// MariaDB refuses to sort ("Out of sort memory", error 1038) when about 15 rows' keys do not
/// fit `sort_buffer_size` (2 MiB by default): measured on MariaDB 10.11, a GROUP BY or ORDER BY
/// of 136 keys of 1 024 bytes ran and 137 failed, where PostgreSQL and SQLite spill to disk.
/// A 32nd of the default buffer, under half of what failed.
pub const MAX_SORT_KEY_BYTES: u64 = (2 << 20) / 32;

/// Most bytes one row of a SELECT may take, each output counted at its bound
/// ([`Writer::row_bytes`]: a TEXT column [`MAX_STORED_TEXT`], a bytes column and the
/// parameters together [`MAX_BOUND_BYTES`], VARCHAR(n) 4n, computed text its growth bound, at
/// most [`MAX_TEXT_EXPR`]). PostgreSQL fails a row whose message (or a tuple it sorts) passes
/// 1 GB where the others return it, and each organization's driver holds a row it reads several
/// times over: 1 000 TEXT outputs would be a gigabyte. MariaDB sent rows of 100 MiB, past its
/// 16 MiB packet (the server splits a row into packets); a query's answer holds 32 MiB.
pub const MAX_ROW_BYTES: u64 = 16 << 20;

/// A value of a fixed-size type in a row, at most: a DECIMAL(65, 30) spelled as text (67
/// characters) with its length.
const FIXED_VALUE_BYTES: u64 = 80;

/// A text or bytes value's length in a row (MariaDB's longest length prefix is 9 bytes).
const VALUE_FRAMING: u64 = 9;

/// Most placeholders a rendering may bind. MySQL's `?` are positional, so a parameter is bound
/// again at every place its rendering uses it, and some spellings repeat an operand (MySQL's
/// guarded subtraction writes its right side three times): nesting multiplies the places.
/// MariaDB refuses a statement of more than 65 535 placeholders (error 1390), PostgreSQL takes
/// 65 535 parameters, SQLite numbers up to 32 766; PostgreSQL and SQLite bind each parameter
/// once, whose count `MAX_TERMS` bounds.
pub const MAX_PLACEHOLDERS: usize = 16_384;

/// Most bytes a statement's parameter values may add up to, counted at every place the statement
/// uses them (under MariaDB's default packet of 16 MiB with room for the text).
pub const MAX_BOUND_BYTES: usize = 4 << 20;

/// Most bytes of values constant folding may produce for one transaction (or query): each
/// operator's value counts once, so a long value rebuilt (by REPLACE or `||`) under nested
/// operators counts once for each of them, in every statement.
pub const MAX_FOLDED_BYTES: usize = 16 << 20;

/// Parameters as constant folding reads them, and what it may still produce.
struct Folding<'a> {
    params: &'a [Value],
    /// Bytes of values folding may still produce; it stops with a refusal past them.
    left: Cell<usize>,
    /// The value of each node already folded, by its address in the statement being checked:
    /// the check visits every operator and each folds everything under it, which without this
    /// folded a node once for every operator above it.
    folded: RefCell<rustc_hash::FxHashMap<usize, Option<Value>>>,
}

impl<'a> Folding<'a> {
    /// Folding for one statement, with `left` bytes it may still produce.
    fn new(params: &'a [Value], left: usize) -> Self {
        Folding {
            params,
            left: Cell::new(left),
            folded: RefCell::default(),
        }
    }
}

impl Folding<'_> {
    fn get(&self, i: usize) -> Option<&Value> {
        self.params.get(i)
    }

    /// Takes a produced value's bytes off what is left.
    fn charge(&self, v: &Value) -> Result<(), Rejection> {
        match self.left.get().checked_sub(v.payload_bytes()) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => Err(Rejection::limit(format!(
                "folding its constants produces more than the {MAX_FOLDED_BYTES} bytes of values a transaction may (a long value rebuilt under nested operators counts once for each)"
            ))),
        }
    }
}

/// The largest magnitude of a parameter in a filter's arithmetic ([`ValueCheck::Small`]).
const SMALL: u64 = 1 << 31;

/// Longest rendered statement: SQLite's checked arithmetic repeats an operand, so nesting could
/// otherwise grow the text.
const MAX_RENDERED_LEN: usize = 256 * 1024;

/// The value types of the portable subset.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Ty {
    /// 64-bit integers (every integer column, literal and parameter computes in 64 bits).
    Int,
    /// Exact decimals.
    Dec,
    /// UTF-8 text, compared byte-wise.
    Text,
    /// Booleans.
    Bool,
    /// Bytes.
    Bytes,
    /// A NULL literal or parameter: fits any type.
    Null,
}

impl Ty {
    fn of_value(v: &Value) -> Ty {
        match v {
            Value::Null => Ty::Null,
            Value::Int(_) => Ty::Int,
            Value::Decimal(_) => Ty::Dec,
            Value::Text(_) => Ty::Text,
            Value::Bool(_) => Ty::Bool,
            Value::Bytes(_) => Ty::Bytes,
        }
    }

    fn of_column(c: &ColumnType) -> Option<Ty> {
        Some(match c {
            ColumnType::Int => Ty::Int,
            ColumnType::Decimal { .. } => Ty::Dec,
            ColumnType::Text => Ty::Text,
            ColumnType::Bool => Ty::Bool,
            ColumnType::Bytes => Ty::Bytes,
            ColumnType::Float | ColumnType::Other(_) => return None,
        })
    }

    fn numeric(self) -> bool {
        matches!(self, Ty::Int | Ty::Dec)
    }

    fn name(self) -> &'static str {
        match self {
            Ty::Int => "integer",
            Ty::Dec => "decimal",
            Ty::Text => "text",
            Ty::Bool => "boolean",
            Ty::Bytes => "bytes",
            Ty::Null => "NULL",
        }
    }

    /// Whether values of the two types may be compared: both numeric, or the same type.
    fn comparable(self, other: Ty) -> bool {
        self == Ty::Null
            || other == Ty::Null
            || self == other
            || (self.numeric() && other.numeric())
    }

    /// The common type of CASE results, COALESCE arguments and the like.
    fn unify(self, other: Ty) -> Option<Ty> {
        match (self, other) {
            (Ty::Null, t) | (t, Ty::Null) => Some(t),
            (a, b) if a == b => Some(a),
            (Ty::Int, Ty::Dec) | (Ty::Dec, Ty::Int) => Some(Ty::Dec),
            _ => None,
        }
    }
}

/// A condition on a parameter's value, checked when the transaction is analysed (every
/// organization checks the same values, so the verdict is the same everywhere).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ValueCheck {
    /// A divisor: must be a positive integer (division by zero and `MIN / -1` fail differently
    /// on each engine).
    Positive(usize),
    /// LIMIT and OFFSET: a non-negative integer (SQLite reads a negative LIMIT as none).
    NonNegative(usize),
    /// An integer within bounds (SUBSTR's start and length: engines disagree on 0 and negative
    /// starts, and PostgreSQL takes 32 bits).
    Range(usize, i64, i64),
    /// An integer that takes part in arithmetic in a filter (WHERE, ON, HAVING): at most 2^31 in
    /// magnitude, so the arithmetic provably cannot overflow.
    Small(usize),
    /// A LIKE pattern: `\` escapes only `%`, `_` and `\`, and never ends the pattern; at most
    /// this many bytes.
    LikePattern(usize, u64),
    /// A query's LIMIT: a non-negative integer of at most the row cap (plus one).
    AtMost(usize, u64),
    /// A decimal in arithmetic stored into a DECIMAL(precision, scale) column: it fits the
    /// column (at most `scale` places, below 10^(precision − scale)).
    DecimalFits(usize, u8, u8),
    /// A text parameter of at most this many bytes (it is stored into a TEXT column, or text
    /// is computed from it).
    TextAtMost(usize, u64),
    /// An integer other than -2^63 (it is subtracted: MariaDB computes 0 - (-2^63) wrongly).
    NotMin(usize),
    /// Text that is not empty and does not end in a blank (it ends text computed into a
    /// VARCHAR column, where engines differ on trailing blanks past its length).
    EndsNonBlank(usize),
}

/// Text a statement computes: at most this many bytes anywhere. MariaDB yields NULL or fails
/// beyond its packet size (16 MiB), PostgreSQL would allocate up to 1 GB for one value.
pub const MAX_TEXT_EXPR: u64 = 4 << 20;

/// A text parameter, and a value stored into an unbounded TEXT column: at most 1 MiB. (So a
/// TEXT column read by an expression holds at most that much.)
pub const MAX_STORED_TEXT: u64 = 1 << 20;

/// A LIKE pattern: at most this many bytes (SQLite refuses more than 50 000).
pub const MAX_LIKE_PATTERN: u64 = 4 << 10;

/// A statement's LIKEs, each its text's bound times its pattern's length: at most this many byte
/// comparisons a row.
pub const MAX_LIKE_WORK: u64 = 1 << 24;

/// A parameter used as REPLACE's replacement (it multiplies the text): at most 4 KiB.
pub const MAX_REPLACEMENT: u64 = 4 << 10;

/// The most bytes REPLACE's text may hold. MariaDB's REPLACE takes time quadratic in its
/// matches (measured on 10.11: 64 KiB of matches 1.7 s, 256 KiB 23 s, a TEXT column's MiB about
/// six minutes, which `KILL QUERY` does not stop), where PostgreSQL and SQLite are linear: a
/// transaction holding one would stall MariaDB organizations alone. At 1 KiB a call costs
/// MariaDB well under a millisecond: a VARCHAR(256) column, or text bounded as much.
pub const MAX_REPLACE_SUBJECT: u64 = 1 << 10;

/// A cached typing: parameter types, row cap, result.
type TypedEntry = (Vec<Ty>, Option<u64>, Result<Arc<Typed>, Rejection>);

/// One statement in the portable subset, with names resolved.
#[derive(Debug)]
pub struct Portable {
    stmt: Stmt,
    /// Whether the statement has constant arithmetic or stores constants, which are checked
    /// with the parameters' values ([`Portable::check_values`]).
    has_constants: bool,
    /// The most bytes of text or bytes stored into each capped key column of the target
    /// table ([`crate::schema::Table::key_bytes`]).
    key_bytes: Vec<(String, u64)>,
    /// Typed and rendered forms by parameter-type signature and row cap (usually one).
    typed: Mutex<Vec<TypedEntry>>,
}

/// A statement typed for one parameter-type signature and rendered for every engine.
#[derive(Debug, PartialEq, Eq)]
pub struct Typed {
    /// PostgreSQL, MySQL/MariaDB and SQLite text, in [`Dialect`] order.
    rendered: [Rendered; 3],
    /// Conditions on parameter values.
    pub checks: Vec<ValueCheck>,
    /// The nested table scans it makes an engine do.
    pub work: Work,
}

impl Typed {
    /// The statement for `dialect`.
    pub fn rendered(&self, dialect: Dialect) -> &Rendered {
        &self.rendered[dialect_index(dialect)]
    }
}

fn dialect_index(d: Dialect) -> usize {
    match d {
        Dialect::Postgres => 0,
        Dialect::MySql => 1,
        Dialect::Sqlite => 2,
    }
}

impl Portable {
    /// Types the statement for these parameters' types and renders it (cached by signature).
    pub fn typed(&self, params: &[Value]) -> Result<Arc<Typed>, Rejection> {
        self.typed_capped(params, None)
    }

    /// As [`Portable::typed`], for a read-only query whose rendered form returns at most
    /// `row_cap + 1` rows (one more than allowed tells an oversized result from a full one).
    pub fn typed_capped(
        &self,
        params: &[Value],
        row_cap: Option<u64>,
    ) -> Result<Arc<Typed>, Rejection> {
        self.typed_counted(params, row_cap).0
    }

    /// As [`Portable::typed_capped`], with about how many bytes it newly cached (0 on a hit):
    /// the renderings are most of what a plan keeps (nested arithmetic renders to far more
    /// than its text), so the analyzer counts them against its cache's budget.
    pub(crate) fn typed_counted(
        &self,
        params: &[Value],
        row_cap: Option<u64>,
    ) -> (Result<Arc<Typed>, Rejection>, usize) {
        let mut cache = self.typed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = Self::find_typed(&cache, params, row_cap) {
            return (r, 0);
        }
        let sig: Vec<Ty> = params.iter().map(Ty::of_value).collect();
        let r = self.type_and_render(&sig, row_cap).map(Arc::new);
        let bytes = 512
            + match &r {
                Ok(t) => {
                    t.rendered
                        .iter()
                        .map(|r| r.sql.len() + 8 * r.bind_order.len())
                        .sum::<usize>()
                        + 64 * t.checks.len()
                }
                Err(_) => 256,
            };
        // A shape sees few signatures (NULL or not per parameter); bound them all the same.
        if cache.len() >= 16 {
            cache.clear();
        }
        cache.push((sig, row_cap, r.clone()));
        (r, bytes)
    }

    /// The typing for these parameters' types if it is cached; never types or renders.
    pub(crate) fn typed_if_cached(
        &self,
        params: &[Value],
        row_cap: Option<u64>,
    ) -> Option<Result<Arc<Typed>, Rejection>> {
        let cache = self.typed.lock().unwrap_or_else(|e| e.into_inner());
        Self::find_typed(&cache, params, row_cap)
    }

    /// The hot path (a cached shape): compares without allocating.
    fn find_typed(
        cache: &[TypedEntry],
        params: &[Value],
        row_cap: Option<u64>,
    ) -> Option<Result<Arc<Typed>, Rejection>> {
        cache
            .iter()
            .find(|(s, c, _)| {
                *c == row_cap
                    && s.len() == params.len()
                    && s.iter().zip(params).all(|(t, p)| *t == Ty::of_value(p))
            })
            .map(|(_, _, r)| r.clone())
    }

    fn type_and_render(&self, sig: &[Ty], row_cap: Option<u64>) -> Result<Typed, Rejection> {
        let mut used = std::collections::BTreeSet::new();
        walk_statement(&self.stmt, &mut |e| {
            if let E::Param(i) = e
                && sig.get(*i) != Some(&Ty::Null)
            {
                used.insert(*i);
            }
        });
        let numbers: Vec<usize> = used.into_iter().collect();
        let mut checks = Vec::new();
        let mut out: [Option<Rendered>; 3] = [None, None, None];
        for dialect in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
            let mut w = Writer::new(dialect, sig, numbers.clone(), row_cap);
            w.stmt(&self.stmt)?;
            if w.sql.len() > MAX_RENDERED_LEN {
                return Err(Rejection::limit(format!(
                    "the statement renders to {} bytes on {dialect:?}; at most {MAX_RENDERED_LEN} (nest less arithmetic)",
                    w.sql.len()
                )));
            }
            if w.bind_order.len() > MAX_PLACEHOLDERS {
                return Err(Rejection::limit(format!(
                    "the statement binds its parameters at {} places in its MySQL rendering; at most {MAX_PLACEHOLDERS} (MariaDB refuses more than 65535 placeholders; nest less arithmetic around parameters)",
                    w.bind_order.len()
                )));
            }
            let bind_order = if dialect == Dialect::MySql {
                w.bind_order
            } else {
                w.numbers
            };
            // Every dialect's checks: a rendering may rely on a value (MySQL's subtraction of
            // a parameter), and the verdict must be the same whichever engine runs it.
            for c in w.checks {
                if !checks.contains(&c) {
                    checks.push(c);
                }
            }
            out[dialect_index(dialect)] = Some(Rendered {
                sql: w.sql,
                bind_order,
            });
        }
        let [Some(pg), Some(my), Some(lite)] = out else {
            return Err(Rejection::internal("internal: a dialect was not rendered"));
        };
        Ok(Typed {
            rendered: [pg, my, lite],
            checks,
            work: work::of_statement(&self.stmt, sig),
        })
    }
}

impl Portable {
    /// Checks parameter values against a typed statement's conditions, refuses control
    /// characters in text, and evaluates what is constant: arithmetic that would overflow, and
    /// constants stored into a column they do not fit, are refused here. (PostgreSQL folds
    /// constants — parameters included — when it plans, and fails even where no row is
    /// touched; the others fail only on a row.) Errors name the parameter, value or column.
    pub fn check_values(&self, typed: &Typed, params: &[Value]) -> Result<(), Rejection> {
        let mut budget = MAX_FOLDED_BYTES;
        self.check_values_within(typed, params, &mut budget)
    }

    /// [`Portable::check_values`], with constant folding producing at most `budget` bytes of
    /// values (what it produces is taken off: a transaction's statements share one budget).
    pub fn check_values_within(
        &self,
        typed: &Typed,
        params: &[Value],
        budget: &mut usize,
    ) -> Result<(), Rejection> {
        check_bound_bytes(typed, params)?;
        check_parameters(typed, params)?;
        if self.has_constants {
            let folding = Folding::new(params, *budget);
            let checked = self.check_constants(&folding);
            *budget = folding.left.get();
            checked?;
        }
        Ok(())
    }

    fn check_constants(&self, params: &Folding<'_>) -> Result<(), Rejection> {
        let mut first_error = None;
        walk_statement(&self.stmt, &mut |e| {
            if first_error.is_none()
                && (is_operator(e) || is_comparison(e))
                && let Err(why) = eval(e, params)
            {
                first_error = Some(why);
            }
        });
        if let Some(why) = first_error {
            return Err(why);
        }
        for (table, column, limit, e) in stored_values(&self.stmt) {
            if let Some(v) = eval(e, params)? {
                self.fits_key(table, column, &v)?;
                limit.admits(&v).map_err(|what| {
                    let mut shown = v.to_string();
                    if shown.len() > 80 {
                        let cut = (0..=77)
                            .rev()
                            .find(|i| shown.is_char_boundary(*i))
                            .unwrap_or(0);
                        shown.truncate(cut);
                        shown.push('…');
                    }
                    Rejection::wrong_type(format!(
                        "the value {shown} does not fit column {column} of table {table} ({what})"
                    ))
                })?;
            }
        }
        Ok(())
    }
}

impl Portable {
    /// Whether `v`, stored into `column` of `table`, fits the column's share of its keys.
    fn fits_key(&self, table: &str, column: &str, v: &Value) -> Result<(), Rejection> {
        let Some((_, cap)) = self.key_bytes.iter().find(|(c, _)| c == column) else {
            return Ok(());
        };
        let n = match v {
            Value::Text(t) => t.len(),
            Value::Bytes(b) => b.len(),
            _ => 0,
        } as u64;
        if n > *cap {
            return Err(Rejection::limit(format!(
                "the value stored into key column {column} of table {table} holds {n} bytes; \
                 text or bytes in that key hold at most {cap} (PostgreSQL refuses a longer index \
                 entry, where the other engines store it)"
            )));
        }
        Ok(())
    }
}

/// Checks parameter values against a typed statement's conditions and refuses control
/// characters in text. Errors name the parameter.
/// Refuses parameter values that add up to more than [`MAX_BOUND_BYTES`] where the statement
/// uses them. MySQL is sent a value again at every place (its `?` are positional), and constant
/// folding holds all of an `IN` list's values at once, so a parameter repeated in a long list
/// made one small proposal or query cost gigabytes at every organization and exceed MariaDB's
/// packet limit, which aborted it there alone. The MySQL rendering is the count for every engine:
/// it names each place at least once, and the refusal must not depend on the engine.
fn check_bound_bytes(typed: &Typed, params: &[Value]) -> Result<(), Rejection> {
    let size = Value::payload_bytes;
    let places = &typed.rendered(Dialect::MySql).bind_order;
    let total = places
        .iter()
        .filter_map(|i| params.get(*i))
        .fold(0usize, |n, v| n.saturating_add(size(v)));
    if total > MAX_BOUND_BYTES {
        let (largest, bytes) = params
            .iter()
            .enumerate()
            .map(|(i, v)| (i, places.iter().filter(|p| **p == i).count() * size(v)))
            .max_by_key(|(_, b)| *b)
            .unwrap_or((0, 0));
        return Err(Rejection::limit(format!(
            "the parameters carry {total} bytes where the statement uses them, more than {MAX_BOUND_BYTES} (parameter ${} alone {bytes}, at {} places)",
            largest + 1,
            places.iter().filter(|p| **p == largest).count()
        )));
    }
    Ok(())
}

fn check_parameters(typed: &Typed, params: &[Value]) -> Result<(), Rejection> {
    for (i, p) in params.iter().enumerate() {
        if let Value::Decimal(d) = p {
            sqlite_exact(d)
                .map_err(|why| Rejection::parameter(format!("parameter ${} ({d}) {why}", i + 1)))?;
        }
        if let Value::Text(s) = p
            && let Some(c) = s.chars().find(|c| is_refused_control(*c))
        {
            return Err(Rejection::parameter(format!(
                "parameter ${} contains the control character U+{:04X}; engines store or refuse it differently",
                i + 1,
                u32::from(c)
            )));
        }
    }
    for c in &typed.checks {
        let (i, ok, what) = match *c {
            ValueCheck::Positive(i) => (
                i,
                matches!(params.get(i), Some(Value::Int(n)) if *n > 0),
                "a positive integer (it divides)",
            ),
            ValueCheck::NonNegative(i) => (
                i,
                matches!(params.get(i), Some(Value::Int(n)) if *n >= 0),
                "a non-negative integer (LIMIT/OFFSET)",
            ),
            ValueCheck::Range(i, lo, hi) => (
                i,
                matches!(params.get(i), Some(Value::Int(n)) if (lo..=hi).contains(n)),
                "an integer within SUBSTR's bounds (start from 1, length from 0, at most 2147483647)",
            ),
            ValueCheck::Small(i) => (
                i,
                matches!(params.get(i), Some(Value::Int(n)) if n.unsigned_abs() <= SMALL)
                    || matches!(params.get(i), Some(Value::Null)),
                "an integer within ±2^31 (it takes part in arithmetic in a filter, which must not overflow)",
            ),
            ValueCheck::AtMost(i, cap) => (
                i,
                matches!(params.get(i), Some(Value::Int(n)) if *n >= 0 && n.unsigned_abs() <= cap),
                "a non-negative integer no larger than the query row cap",
            ),
            ValueCheck::DecimalFits(i, precision, scale) => (
                i,
                match params.get(i) {
                    Some(Value::Decimal(d)) => {
                        let n = d.normalized();
                        n.scale() <= scale
                            && n.mantissa().unsigned_abs()
                                < 10u128.pow(
                                    u32::from(precision) - u32::from(scale) + u32::from(n.scale()),
                                )
                    }
                    Some(Value::Null) => true,
                    _ => false,
                },
                "a decimal that fits the DECIMAL column it is computed into (SQLite computes in floating point)",
            ),
            ValueCheck::TextAtMost(i, max) => (
                i,
                match params.get(i) {
                    Some(Value::Text(t)) => t.len() as u64 <= max,
                    _ => true,
                },
                if max == MAX_REPLACEMENT {
                    "text of at most 4 KiB (it is REPLACE's replacement, which multiplies the text)"
                } else {
                    "text of at most 1 MiB (text is stored or computed from it)"
                },
            ),
            ValueCheck::EndsNonBlank(i) => (
                i,
                match params.get(i) {
                    Some(Value::Text(t)) => {
                        t.chars().last().is_some_and(|c| !c.is_ascii_whitespace())
                    }
                    _ => true,
                },
                "text that is not empty and does not end in a blank (it ends text computed into a VARCHAR column, and engines differ on storing trailing blanks past its length)",
            ),
            ValueCheck::NotMin(i) => (
                i,
                !matches!(params.get(i), Some(Value::Int(i64::MIN))),
                "an integer other than -9223372036854775808 (it is subtracted, and MariaDB computes 0 minus it wrongly)",
            ),
            ValueCheck::LikePattern(i, max) => (
                i,
                match params.get(i) {
                    Some(Value::Text(p)) => like_pattern_ok(p) && p.len() as u64 <= max,
                    Some(Value::Null) => true,
                    _ => false,
                },
                &*format!(
                    "a LIKE pattern of at most {max} bytes (for the text it matches) whose \\ \
                     escapes only %, _ or \\"
                ),
            ),
        };
        if !ok {
            let got = params
                .get(i)
                .map_or_else(|| "nothing".to_owned(), |v| v.to_string());
            return Err(Rejection::parameter(format!(
                "parameter ${} must be {what}, not {got}",
                i + 1
            )));
        }
    }
    Ok(())
}

/// Control characters refused in SQL text and text values: all of C0 but tab, newline and
/// carriage return, and DEL. (NUL ends strings in C APIs; PostgreSQL refuses it in text.)
pub fn is_refused_control(c: char) -> bool {
    (c < ' ' && !matches!(c, '\t' | '\n' | '\r')) || c == '\u{7f}'
}

/// Decimals are floating point on SQLite: one with more than 15 significant digits (or an integral
/// one beyond 2^53) would compare and compute differently there.
fn sqlite_exact(d: &chainify_core::Decimal) -> Result<(), &'static str> {
    let n = d.normalized();
    let digits = n
        .mantissa()
        .unsigned_abs()
        .checked_ilog10()
        .map_or(1, |l| l + 1);
    if digits > 15 {
        return Err("has more than 15 significant digits, which SQLite cannot hold exactly");
    }
    Ok(())
}

fn like_pattern_ok(p: &str) -> bool {
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && !matches!(chars.next(), Some('%' | '_' | '\\')) {
            return false;
        }
    }
    true
}

// ---------------------------------------------------------------------------------------------
// The tree.

#[derive(Debug)]
enum Stmt {
    Select(Box<Q>),
    Insert {
        table: String,
        columns: Vec<(String, Ty, Limit)>,
        source: Source,
    },
    Update {
        table: String,
        /// Column sets that identify at most one row (the primary key, each UNIQUE).
        lookups: Vec<Vec<String>>,
        sets: Vec<(String, Ty, Limit, E)>,
        selection: Option<E>,
    },
    Delete {
        table: String,
        lookups: Vec<Vec<String>>,
        selection: Option<E>,
    },
}

#[derive(Debug)]
enum Source {
    Values(Vec<Vec<E>>),
    Query(Box<Q>),
}

/// A table occurrence: its name and the alias rendered for it (`None`: the UPDATE or DELETE
/// target, rendered by its name).
#[derive(Debug, Clone)]
struct Occurrence {
    table: String,
    alias: Option<String>,
    /// The name the statement calls it by (its alias, or the table's name), for messages.
    shown: String,
    /// Columns in the table's primary key.
    key_arity: usize,
    /// Column sets that identify at most one row (the primary key, each UNIQUE).
    lookups: Vec<Vec<String>>,
}

impl Occurrence {
    fn qualifier(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.table)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JoinKind {
    Cross,
    Inner,
    Left,
}

#[derive(Debug)]
struct FromItem {
    occ: Occurrence,
    join: JoinKind,
    on: Option<E>,
}

#[derive(Debug)]
struct OrderItem {
    key: OrderKey,
    desc: bool,
    nulls_first: Option<bool>,
}

#[derive(Debug)]
enum OrderKey {
    /// An output column, 1-based.
    Output(usize),
    Expr(E),
}

#[derive(Debug)]
struct Q {
    distinct: bool,
    items: Vec<E>,
    from: Vec<FromItem>,
    selection: Option<E>,
    group_by: Vec<E>,
    having: Option<E>,
    order_by: Vec<OrderItem>,
    limit: Option<E>,
    offset: Option<E>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Cmp {
    fn sql(self) -> &'static str {
        match self {
            Cmp::Eq => "=",
            Cmp::Ne => "<>",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
    Abs,
    Coalesce,
    Nullif,
    Length,
    Substr,
    Trim,
    Ltrim,
    Rtrim,
    Replace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agg {
    CountStar,
    Count { distinct: bool },
    Min,
    Max,
}

/// A resolved column: which query level (0 = the innermost one it appears in), which occurrence
/// of that level, and the column.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ColRef {
    qualifier: String,
    column: String,
    ty: Ty,
    /// Depth of the query that owns the occurrence (0 = the statement's outermost query).
    owner: usize,
    /// Index of the occurrence in its query's FROM (for grouping and key checks).
    occurrence: usize,
    /// Whether the column is (part of) that table's primary key, and at which position.
    key_position: Option<usize>,
    /// The column's declared limit (its integer width, for overflow bounds).
    limit: Limit,
    /// Never NULL here: declared NOT NULL, and not on the optional side of a LEFT JOIN.
    not_null: bool,
}

#[derive(Debug)]
enum E {
    Col(ColRef),
    Param(usize),
    Lit(Value),
    Neg(Box<E>),
    Not(Box<E>),
    Arith(Arith, Box<E>, Box<E>),
    Cmp(Cmp, Box<E>, Box<E>),
    And(Box<E>, Box<E>),
    Or(Box<E>, Box<E>),
    Concat(Box<E>, Box<E>),
    IsNull(Box<E>, bool),
    Between {
        e: Box<E>,
        lo: Box<E>,
        hi: Box<E>,
        negated: bool,
    },
    InList {
        e: Box<E>,
        list: Vec<E>,
        negated: bool,
    },
    InQuery {
        e: Box<E>,
        q: Box<Q>,
        negated: bool,
    },
    Exists {
        q: Box<Q>,
        negated: bool,
    },
    Scalar(Box<Q>),
    Case {
        operand: Option<Box<E>>,
        whens: Vec<(E, E)>,
        otherwise: Option<Box<E>>,
    },
    Func(Func, Vec<E>),
    Agg(Agg, Option<Box<E>>),
    Like {
        e: Box<E>,
        pattern: Box<E>,
        negated: bool,
    },
}

// ---------------------------------------------------------------------------------------------
// Building the tree from the syntax tree.

/// Builds the portable form of an analysed statement.
pub(crate) fn build(st: &SqlStatement, schema: &Schema) -> Result<Portable, Rejection> {
    let mut b = Builder {
        schema,
        levels: Vec::new(),
        aliases: 0,
        terms: 0,
        depth: 0,
    };
    let stmt = match st {
        SqlStatement::Query(q) => Stmt::Select(Box::new(b.query(q)?)),
        SqlStatement::Insert(i) => b.insert(i)?,
        SqlStatement::Update(u) => b.update(u)?,
        SqlStatement::Delete(d) => b.delete(d)?,
        other => return Err(crate::determinism::statement_kind_rejection(other)),
    };
    if let Stmt::Update { sets, .. } = &stmt {
        check_update_order(sets)?;
    }
    // PostgreSQL folds more than literal-only trees (a CASE whose condition is a constant, a
    // COALESCE whose first argument is): any operator or stored value may turn out constant
    // once the parameters are known.
    let mut has_constants = matches!(stmt, Stmt::Update { .. } | Stmt::Insert { .. });
    walk_statement(&stmt, &mut |e| {
        if is_operator(e) {
            has_constants = true;
        }
    });
    let key_bytes = key_caps(&stmt, schema)?;
    Ok(Portable {
        stmt,
        has_constants,
        key_bytes,
        typed: Mutex::new(Vec::new()),
    })
}

/// What an INSERT or UPDATE stores: (table, column, the column's limit, the expression), every
/// row of a VALUES list, or a SELECT's outputs.
fn stored_values(stmt: &Stmt) -> Vec<(&str, &str, Limit, &E)> {
    match stmt {
        Stmt::Update { table, sets, .. } => sets
            .iter()
            .map(|(c, _, l, e)| (table.as_str(), c.as_str(), *l, e))
            .collect(),
        Stmt::Insert {
            table,
            columns,
            source,
        } => {
            let rows: Vec<&Vec<E>> = match source {
                Source::Values(rows) => rows.iter().collect(),
                Source::Query(q) => vec![&q.items],
            };
            rows.into_iter()
                .flat_map(|row| {
                    row.iter()
                        .zip(columns)
                        .map(|(e, (c, _, l))| (table.as_str(), c.as_str(), *l, e))
                })
                .collect()
        }
        Stmt::Select(_) | Stmt::Delete { .. } => Vec::new(),
    }
}

/// The caps on text and bytes stored into the target table's key columns
/// ([`Schema::key_bytes`]), by column. What a statement stores into such a column must be a
/// literal or a parameter, which [`Portable::check_values`] holds against the cap.
fn key_caps(stmt: &Stmt, schema: &Schema) -> Result<Vec<(String, u64)>, Rejection> {
    let table = match stmt {
        Stmt::Insert { table, .. } | Stmt::Update { table, .. } => table,
        Stmt::Select(_) | Stmt::Delete { .. } => return Ok(Vec::new()),
    };
    let Some(t) = schema.table(table) else {
        return Ok(Vec::new());
    };
    let caps: Vec<(String, u64)> = t
        .columns
        .iter()
        .zip(schema.key_bytes(&t.name))
        .filter_map(|(c, cap)| Some((c.name.clone(), cap?)))
        .collect();
    for (_, column, _, e) in stored_values(stmt) {
        if let Some((_, cap)) = caps.iter().find(|(c, _)| c == column)
            && !matches!(e, E::Lit(_) | E::Param(_))
        {
            return Err(Rejection::limit(format!(
                "the value stored into key column {column} of table {table} is computed; text or \
                 bytes in that key hold at most {cap} bytes (what a PostgreSQL index entry \
                 holds), and only a literal or a parameter is checked against that: store one, \
                 or declare the column VARCHAR(n) with n at most {}",
                cap / 4
            )));
        }
    }
    Ok(caps)
}

/// One query level's tables: (name the query uses, occurrence, table).
struct Level<'s> {
    tables: Vec<(String, Occurrence, &'s Table)>,
    /// Per occurrence: on the optional side of a LEFT JOIN (its columns may be NULL).
    left_joined: Vec<bool>,
    /// The level's output columns with their aliases, for ORDER BY.
    outputs: Vec<Option<String>>,
}

struct Builder<'s> {
    schema: &'s Schema,
    levels: Vec<Level<'s>>,
    aliases: usize,
    terms: usize,
    depth: usize,
}

fn plain_name(name: &str, what: &str) -> Result<String, Rejection> {
    let lower = name.to_lowercase();
    let mut chars = lower.chars();
    let ok = matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'));
    if ok {
        Ok(lower)
    } else {
        Err(Rejection::unsupported(format!(
            "{what} {name:?} is not a plain name (letters, digits and '_')"
        )))
    }
}

fn single_name(name: &ObjectName, what: &str) -> Result<String, Rejection> {
    let n = object_name(name);
    if n.contains('.') {
        return Err(Rejection::unsupported(format!(
            "{what} {n}: qualified names are not portable"
        )));
    }
    plain_name(&n, what)
}

fn boxed(e: E) -> Box<E> {
    Box::new(e)
}

impl<'s> Builder<'s> {
    fn table(&self, name: &ObjectName) -> Result<&'s Table, Rejection> {
        let n = single_name(name, "table")?;
        self.schema.table(&n).ok_or_else(|| {
            Rejection::unknown_name(format!("table {n} is not a registered shared table"))
        })
    }

    fn next_alias(&mut self) -> String {
        self.aliases += 1;
        format!("chainify_t{}", self.aliases)
    }

    fn target_level(
        &mut self,
        t: &'s Table,
        alias: Option<&sqlparser::ast::TableAlias>,
    ) -> Result<(), Rejection> {
        let name = match alias {
            Some(a) => {
                if !a.columns.is_empty() {
                    return Err(Rejection::unsupported(
                        "column aliases on a table are not portable",
                    ));
                }
                plain_name(&a.name.value, "alias")?
            }
            None => t.name.clone(),
        };
        self.levels.push(Level {
            tables: vec![(
                name.clone(),
                Occurrence {
                    table: t.name.clone(),
                    alias: None,
                    shown: name,
                    key_arity: t.primary_key.len(),
                    lookups: lookups_of(t),
                },
                t,
            )],
            left_joined: vec![false],
            outputs: Vec::new(),
        });
        Ok(())
    }

    fn update(&mut self, u: &Update) -> Result<Stmt, Rejection> {
        let TableFactor::Table { name, alias, .. } = &u.table.relation else {
            return Err(Rejection::unsupported("UPDATE must name one table"));
        };
        let t = self.table(name)?;
        self.target_level(t, alias.as_ref())?;
        let mut sets = Vec::new();
        for a in &u.assignments {
            let AssignmentTarget::ColumnName(col) = &a.target else {
                return Err(Rejection::unsupported(
                    "tuple assignments are not portable; assign columns one by one",
                ));
            };
            let col = crate::ident::column_name(col);
            let i = t.column(&col).ok_or_else(|| {
                Rejection::unknown_name(format!(
                    "UPDATE sets unknown column {col} of table {}",
                    t.name
                ))
            })?;
            let ty = Ty::of_column(&t.columns[i].ty).ok_or_else(|| {
                Rejection::wrong_type(format!(
                    "column {col} of table {} has no portable type",
                    t.name
                ))
            })?;
            let c = &t.columns[i];
            sets.push((c.name.clone(), ty, c.limit, self.expr(&a.value)?));
        }
        let selection = u.selection.as_ref().map(|e| self.expr(e)).transpose()?;
        self.levels.pop();
        // A key or UNIQUE column changed on several rows collides or not depending on the
        // order the engine visits them: only one row may be changed that way.
        let keyed = sets.iter().any(|(c, ..)| {
            t.column(c).is_some_and(|i| {
                t.primary_key.contains(&i) || t.uniques.iter().any(|u| u.contains(&i))
            })
        });
        if keyed && !pins_key(selection.as_ref(), 0, t.primary_key.len()) {
            return Err(Rejection::nondeterministic(format!(
                "UPDATE of a primary-key or UNIQUE column of {} must select one row by its whole primary key (several rows collide or not depending on the engine's row order)",
                t.name
            )));
        }
        Ok(Stmt::Update {
            table: t.name.clone(),
            lookups: lookups_of(t),
            sets,
            selection,
        })
    }

    fn delete(&mut self, d: &Delete) -> Result<Stmt, Rejection> {
        let from = match &d.from {
            FromTable::WithFromKeyword(f) | FromTable::WithoutKeyword(f) => f,
        };
        let [twj] = from.as_slice() else {
            return Err(Rejection::unsupported("DELETE must name one table"));
        };
        let TableFactor::Table { name, alias, .. } = &twj.relation else {
            return Err(Rejection::unsupported("DELETE must name one table"));
        };
        let t = self.table(name)?;
        self.target_level(t, alias.as_ref())?;
        let selection = d.selection.as_ref().map(|e| self.expr(e)).transpose()?;
        self.levels.pop();
        Ok(Stmt::Delete {
            table: t.name.clone(),
            lookups: lookups_of(t),
            selection,
        })
    }

    fn insert(&mut self, ins: &Insert) -> Result<Stmt, Rejection> {
        let TableObject::TableName(name) = &ins.table else {
            return Err(Rejection::unsupported(
                "INSERT into a table function is not portable",
            ));
        };
        let t = self.table(name)?;
        let mut columns = Vec::new();
        for c in &ins.columns {
            let n = crate::ident::column_name(c);
            let i = t.column(&n).ok_or_else(|| {
                Rejection::unknown_name(format!("INSERT into {} names unknown column {n}", t.name))
            })?;
            let ty = Ty::of_column(&t.columns[i].ty).ok_or_else(|| {
                Rejection::wrong_type(format!(
                    "column {n} of table {} has no portable type",
                    t.name
                ))
            })?;
            columns.push((t.columns[i].name.clone(), ty, t.columns[i].limit));
        }
        let source = ins.source.as_ref().ok_or_else(|| {
            Rejection::unsupported(format!("INSERT into {} has no VALUES or SELECT", t.name))
        })?;
        let source = match source.body.as_ref() {
            SetExpr::Values(v) => {
                if source.order_by.is_some() || source.limit_clause.is_some() {
                    return Err(Rejection::unsupported(
                        "VALUES with ORDER BY or LIMIT is not portable",
                    ));
                }
                let mut rows = Vec::new();
                for row in &v.rows {
                    rows.push(
                        row.content
                            .iter()
                            .map(|e| self.expr(e))
                            .collect::<Result<Vec<_>, _>>()?,
                    );
                }
                // MariaDB evaluates each row's subqueries after inserting the rows before it,
                // the others all before the statement (found by the review).
                if rows.len() > 1 {
                    let mut reads = false;
                    for e in rows.iter().flatten() {
                        walk_deep(e, &mut |x| {
                            if let E::Scalar(q) | E::Exists { q, .. } | E::InQuery { q, .. } = x {
                                reads |= q.from.iter().any(|f| f.occ.table == t.name);
                            }
                        });
                    }
                    if reads {
                        return Err(Rejection::unsupported(format!(
                            "a subquery in a VALUES row of several reads table {}, which the statement inserts into; MariaDB sees the rows inserted before it, the others do not (insert one row per statement)",
                            t.name
                        )));
                    }
                }
                Source::Values(rows)
            }
            _ => {
                let q = self.query(source)?;
                if q.items.len() != columns.len() {
                    return Err(Rejection::wrong_type(format!(
                        "INSERT into {} lists {} columns but its SELECT gives {}",
                        t.name,
                        columns.len(),
                        q.items.len()
                    )));
                }
                Source::Query(Box::new(q))
            }
        };
        Ok(Stmt::Insert {
            table: t.name.clone(),
            columns,
            source,
        })
    }

    fn query(&mut self, q: &Query) -> Result<Q, Rejection> {
        if q.with.is_some() {
            return Err(Rejection::unsupported(
                "WITH (common table expressions) is not supported",
            ));
        }
        let SetExpr::Select(s) = q.body.as_ref() else {
            return Err(Rejection::unsupported(
                "only a plain SELECT is portable here (no UNION, VALUES or parenthesized query)",
            ));
        };
        self.enter()?;
        self.levels.push(Level {
            tables: Vec::new(),
            left_joined: Vec::new(),
            outputs: Vec::new(),
        });
        let built = self.select(q, s);
        self.levels.pop();
        self.depth -= 1;
        built
    }

    fn enter(&mut self) -> Result<(), Rejection> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Rejection::limit(format!(
                "the statement nests deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(())
    }

    fn select(&mut self, q: &Query, s: &Select) -> Result<Q, Rejection> {
        if s.top.is_some()
            || s.into.is_some()
            || !s.lateral_views.is_empty()
            || s.prewhere.is_some()
            || !s.named_window.is_empty()
            || s.qualify.is_some()
            || matches!(s.distinct, Some(Distinct::On(_)))
        {
            return Err(Rejection::unsupported(
                "SELECT clause is not in the portable subset",
            ));
        }
        let distinct = matches!(s.distinct, Some(Distinct::Distinct));
        // FROM: every occurrence named first, then the ON conditions. An ON may name only its
        // own table and those joined before it since the last comma: PostgreSQL and MariaDB
        // see no other, SQLite sees every table (found by the review).
        let mut pending_on: Vec<(usize, usize, &SqlExpr)> = Vec::new();
        let mut from = Vec::new();
        for twj in &s.from {
            let group = from.len();
            from.push(self.occurrence(&twj.relation, JoinKind::Cross)?);
            for j in &twj.joins {
                let (kind, constraint) = match &j.join_operator {
                    JoinOperator::Join(c) | JoinOperator::Inner(c) => (JoinKind::Inner, c),
                    JoinOperator::Left(c) | JoinOperator::LeftOuter(c) => (JoinKind::Left, c),
                    JoinOperator::CrossJoin(c) => (JoinKind::Cross, c),
                    _ => {
                        return Err(Rejection::unsupported(
                            "only INNER, LEFT and CROSS joins are portable",
                        ));
                    }
                };
                let item = self.occurrence(&j.relation, kind)?;
                match constraint {
                    JoinConstraint::On(e) => pending_on.push((group, from.len(), e)),
                    JoinConstraint::None if kind == JoinKind::Cross => {}
                    _ => {
                        return Err(Rejection::unsupported(
                            "joins need ON conditions (USING and NATURAL are not portable)",
                        ));
                    }
                }
                from.push(item);
            }
        }
        if from.len() > MAX_FROM {
            return Err(Rejection::limit(format!(
                "a FROM clause joins at most {MAX_FROM} tables (every organization would compute the whole product)"
            )));
        }
        let level = self.levels.len() - 1;
        for (group, i, e) in pending_on {
            let on = self.expr(e)?;
            let mut unseen = None;
            walk_deep(&on, &mut |x| {
                if let E::Col(c) = x
                    && c.owner == level
                    && !(group..=i).contains(&c.occurrence)
                    && unseen.is_none()
                {
                    unseen = Some(c.qualifier.clone());
                }
            });
            if let Some(t) = unseen {
                return Err(Rejection::unsupported(format!(
                    "an ON condition names {t}, which is not joined before it (PostgreSQL and MariaDB see only the tables joined so far, since the last comma)"
                )));
            }
            from[i].on = Some(on);
        }
        // Output columns, with wildcards expanded.
        let mut items = Vec::new();
        let mut outputs = Vec::new();
        for item in &s.projection {
            match item {
                SelectItem::Wildcard(opts) => {
                    if opts.opt_exclude.is_some()
                        || opts.opt_except.is_some()
                        || opts.opt_replace.is_some()
                        || opts.opt_rename.is_some()
                        || opts.opt_ilike.is_some()
                    {
                        return Err(Rejection::unsupported("SELECT * options are not portable"));
                    }
                    let level = self.levels.len() - 1;
                    for occurrence in 0..self.levels[level].tables.len() {
                        for c in self.level_columns(level, occurrence)? {
                            items.push(E::Col(c));
                            outputs.push(None);
                        }
                    }
                }
                SelectItem::QualifiedWildcard(
                    SelectItemQualifiedWildcardKind::ObjectName(n),
                    _,
                ) => {
                    let q = single_name(n, "table")?;
                    let level = self.levels.len() - 1;
                    let occurrence = self.levels[level]
                        .tables
                        .iter()
                        .position(|(name, _, _)| *name == q)
                        .ok_or_else(|| {
                            Rejection::unknown_name(format!("{q}.*: no table {q} in FROM"))
                        })?;
                    for c in self.level_columns(level, occurrence)? {
                        items.push(E::Col(c));
                        outputs.push(None);
                    }
                }
                SelectItem::UnnamedExpr(e) => {
                    items.push(self.expr(e)?);
                    outputs.push(None);
                }
                SelectItem::ExprWithAlias { expr, alias } => {
                    items.push(self.expr(expr)?);
                    outputs.push(Some(plain_name(&alias.value, "output alias")?));
                }
                _ => {
                    return Err(Rejection::unsupported(format!(
                        "SELECT item `{item}` is not portable"
                    )));
                }
            }
        }
        if let Some(l) = self.levels.last_mut() {
            l.outputs = outputs;
        }
        let selection = s.selection.as_ref().map(|e| self.expr(e)).transpose()?;
        let group_by = match &s.group_by {
            GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => exprs
                .iter()
                .map(|e| match self.expr(e)? {
                    c @ E::Col(_) => Ok(c),
                    _ => Err(Rejection::unsupported("GROUP BY takes columns only")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => {
                return Err(Rejection::unsupported(
                    "GROUP BY ALL and grouping modifiers are not portable",
                ));
            }
        };
        let having = s.having.as_ref().map(|e| self.expr(e)).transpose()?;
        let mut order_by = Vec::new();
        if let Some(ob) = &q.order_by {
            let OrderByKind::Expressions(exprs) = &ob.kind else {
                return Err(Rejection::unsupported("ORDER BY ALL is not portable"));
            };
            if ob.interpolate.is_some() {
                return Err(Rejection::unsupported(
                    "ORDER BY … INTERPOLATE is not portable",
                ));
            }
            for o in exprs {
                if o.with_fill.is_some() {
                    return Err(Rejection::unsupported(
                        "ORDER BY … WITH FILL is not portable",
                    ));
                }
                let desc = match &o.options.sort {
                    None | Some(sqlparser::ast::OrderBySort::Asc) => false,
                    Some(sqlparser::ast::OrderBySort::Desc) => true,
                    Some(sqlparser::ast::OrderBySort::Using(_)) => {
                        return Err(Rejection::unsupported("ORDER BY … USING is not portable"));
                    }
                };
                order_by.push(OrderItem {
                    key: self.order_key(&o.expr, items.len())?,
                    desc,
                    nulls_first: o.options.nulls_first,
                });
            }
        }
        let (limit, offset) = match &q.limit_clause {
            None => (None, None),
            Some(LimitClause::LimitOffset {
                limit,
                offset,
                limit_by,
            }) if limit_by.is_empty() => (
                limit.as_ref().map(|e| self.expr(e)).transpose()?,
                offset.as_ref().map(|o| self.expr(&o.value)).transpose()?,
            ),
            Some(_) => {
                return Err(Rejection::unsupported(
                    "LIMIT form is not portable; write LIMIT n OFFSET m",
                ));
            }
        };
        if q.fetch.is_some() || !q.locks.is_empty() {
            return Err(Rejection::unsupported(
                "FETCH and FOR UPDATE are not portable",
            ));
        }
        let built = Q {
            distinct,
            items,
            from,
            selection,
            group_by,
            having,
            order_by,
            limit,
            offset,
        };
        let level = self.levels.len() - 1;
        check_entries(&built, level + 1)?;
        check_grouping(&built, level)?;
        if built.distinct {
            for o in &built.order_by {
                if let OrderKey::Expr(E::Col(c)) = &o.key
                    && built.items.iter().any(|i| matches!(i, E::Col(x) if x == c))
                {
                    continue;
                }
                if matches!(o.key, OrderKey::Expr(_)) {
                    return Err(Rejection::unsupported(
                        "with SELECT DISTINCT, ORDER BY may only name output columns (PostgreSQL refuses the rest; the others pick a row)",
                    ));
                }
            }
        }
        if built.limit.is_some() || built.offset.is_some() {
            check_total_order(&built, level, &self.levels[level])?;
        }
        Ok(built)
    }

    /// ORDER BY: a bare name that is an output alias, or an integer, names an output column
    /// (as every engine reads it); anything else is an expression over the FROM tables.
    fn order_key(&mut self, e: &SqlExpr, outputs: usize) -> Result<OrderKey, Rejection> {
        let level = self.levels.len() - 1;
        if let SqlExpr::Identifier(id) = e {
            let name = id.value.to_lowercase();
            let by_alias: Vec<usize> = self.levels[level]
                .outputs
                .iter()
                .enumerate()
                .filter(|(_, a)| a.as_deref() == Some(name.as_str()))
                .map(|(i, _)| i + 1)
                .collect();
            match by_alias.as_slice() {
                [i] => return Ok(OrderKey::Output(*i)),
                [] => {}
                _ => {
                    return Err(Rejection::unknown_name(format!(
                        "ORDER BY {name}: several outputs are called {name}"
                    )));
                }
            }
        }
        if let SqlExpr::Value(v) = e
            && let SqlValue::Number(n, _) = &v.value
        {
            return match n.parse::<usize>() {
                Ok(i) if (1..=outputs).contains(&i) => Ok(OrderKey::Output(i)),
                _ => Err(Rejection::unknown_name(format!(
                    "ORDER BY {n}: there is no output column {n}"
                ))),
            };
        }
        let key = self.expr(e)?;
        if is_constant(&key) {
            return Err(Rejection::unsupported(format!(
                "ORDER BY {e}: a constant sort key is read as an ordinal by some engines and refused by others; name a column or an output"
            )));
        }
        Ok(OrderKey::Expr(key))
    }

    fn occurrence(&mut self, f: &TableFactor, join: JoinKind) -> Result<FromItem, Rejection> {
        let TableFactor::Table {
            name,
            alias,
            args: None,
            with_hints,
            version: None,
            partitions,
            sample: None,
            index_hints,
            with_ordinality: false,
            json_path: None,
            ..
        } = f
        else {
            return Err(Rejection::unsupported(format!(
                "FROM item `{f}` is not in the portable subset"
            )));
        };
        if !with_hints.is_empty() || !partitions.is_empty() || !index_hints.is_empty() {
            return Err(Rejection::unsupported("table hints are not portable"));
        }
        let t = self.table(name)?;
        let used = match alias {
            Some(a) if a.columns.is_empty() => plain_name(&a.name.value, "alias")?,
            Some(_) => {
                return Err(Rejection::unsupported(
                    "column aliases on a table are not portable",
                ));
            }
            None => t.name.clone(),
        };
        let level = self.levels.len() - 1;
        if self.levels[level].tables.iter().any(|(n, _, _)| *n == used) {
            return Err(Rejection::unknown_name(format!(
                "FROM names {used} twice; give each occurrence its own alias"
            )));
        }
        if let Some(target) = self.levels.first().and_then(|l| l.tables.first())
            && target.1.alias.is_none()
            && target.1.table == t.name
        {
            return Err(Rejection::unsupported(format!(
                "a subquery reads table {}, which the statement modifies; MySQL and MariaDB refuse that",
                t.name
            )));
        }
        let occ = Occurrence {
            table: t.name.clone(),
            alias: Some(self.next_alias()),
            shown: used.clone(),
            key_arity: t.primary_key.len(),
            lookups: lookups_of(t),
        };
        self.levels[level].tables.push((used, occ.clone(), t));
        self.levels[level].left_joined.push(join == JoinKind::Left);
        Ok(FromItem {
            occ,
            join,
            on: None,
        })
    }

    fn level_columns(&self, level: usize, occurrence: usize) -> Result<Vec<ColRef>, Rejection> {
        let (_, occ, t) = &self.levels[level].tables[occurrence];
        t.columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                Ok(ColRef {
                    qualifier: occ.qualifier().to_owned(),
                    column: c.name.clone(),
                    ty: Ty::of_column(&c.ty).ok_or_else(|| {
                        Rejection::wrong_type(format!(
                            "column {} of table {} has no portable type",
                            c.name, t.name
                        ))
                    })?,
                    owner: level,
                    occurrence,
                    key_position: t.primary_key.iter().position(|k| *k == i),
                    limit: c.limit,
                    not_null: c.not_null && !self.levels[level].left_joined[occurrence],
                })
            })
            .collect()
    }

    /// Resolves a column reference: the innermost level with a matching table (qualified) or
    /// column (bare); a bare name found in two tables of one level is ambiguous.
    fn column(&self, qualifier: Option<&str>, column: &str) -> Result<ColRef, Rejection> {
        let column = column.to_lowercase();
        let shown = match qualifier {
            Some(q) => format!("{q}.{column}"),
            None => column.clone(),
        };
        for level in (0..self.levels.len()).rev() {
            let mut found = None;
            for (occurrence, (name, occ, t)) in self.levels[level].tables.iter().enumerate() {
                if qualifier.is_some_and(|q| q != name) {
                    continue;
                }
                match t.column(&column) {
                    Some(i) => {
                        if found.is_some() {
                            return Err(Rejection::unknown_name(format!(
                                "column {shown} is ambiguous; qualify it with its table"
                            )));
                        }
                        let c = &t.columns[i];
                        found = Some(ColRef {
                            qualifier: occ.qualifier().to_owned(),
                            column: c.name.clone(),
                            ty: Ty::of_column(&c.ty).ok_or_else(|| {
                                Rejection::wrong_type(format!(
                                    "column {shown} has no portable type"
                                ))
                            })?,
                            owner: level,
                            occurrence,
                            key_position: t.primary_key.iter().position(|k| *k == i),
                            limit: c.limit,
                            not_null: c.not_null && !self.levels[level].left_joined[occurrence],
                        });
                    }
                    None if qualifier.is_some() => {
                        return Err(Rejection::unknown_name(format!(
                            "table {name} has no column {column}"
                        )));
                    }
                    None => {}
                }
            }
            if let Some(c) = found {
                return Ok(c);
            }
        }
        Err(Rejection::unknown_name(format!("unknown column {shown}")))
    }

    fn expr(&mut self, e: &SqlExpr) -> Result<E, Rejection> {
        self.terms += 1;
        if self.terms > MAX_TERMS {
            return Err(Rejection::limit(format!(
                "the statement has more than {MAX_TERMS} terms"
            )));
        }
        self.enter()?;
        let r = self.expr_inner(e);
        self.depth -= 1;
        r
    }

    fn exprs(&mut self, es: &[SqlExpr]) -> Result<Vec<E>, Rejection> {
        es.iter().map(|e| self.expr(e)).collect()
    }

    fn expr_inner(&mut self, e: &SqlExpr) -> Result<E, Rejection> {
        Ok(match e {
            SqlExpr::Identifier(id) => {
                if id.value.starts_with('@') {
                    return Err(Rejection::nondeterministic(format!(
                        "variable {} depends on the session",
                        id.value
                    )));
                }
                E::Col(self.column(None, &id.value)?)
            }
            SqlExpr::CompoundIdentifier(parts) => match parts.as_slice() {
                [q, c] => E::Col(self.column(Some(&q.value.to_lowercase()), &c.value)?),
                _ => {
                    return Err(Rejection::unsupported(format!(
                        "name {e} is not portable; write table.column"
                    )));
                }
            },
            SqlExpr::Nested(inner) => self.expr_inner(inner)?,
            SqlExpr::Value(v) => match &v.value {
                SqlValue::Placeholder(p) => E::Param(
                    placeholder_index(p).ok_or_else(|| {
                        Rejection::parameter(format!("placeholder {p} is not $1..$n"))
                    })? - 1,
                ),
                SqlValue::SingleQuotedString(s) => {
                    if let Some(c) = s.chars().find(|c| is_refused_control(*c)) {
                        return Err(Rejection::syntax(format!(
                            "a string literal contains the control character U+{:04X}",
                            u32::from(c)
                        )));
                    }
                    E::Lit(Value::Text(s.clone()))
                }
                other => E::Lit(literal(other).ok_or_else(|| {
                    Rejection::unsupported(format!("literal {other} is not portable"))
                })?),
            },
            SqlExpr::UnaryOp { op, expr } => match op {
                UnaryOperator::Plus => self.expr(expr)?,
                UnaryOperator::Minus => match self.expr(expr)? {
                    E::Lit(Value::Int(i)) => E::Lit(Value::Int(-i)),
                    E::Lit(Value::Decimal(d)) => E::Lit(Value::Decimal(
                        chainify_core::Decimal::new(-d.mantissa(), d.scale())
                            .ok_or_else(|| Rejection::limit("a decimal literal is out of range"))?,
                    )),
                    other => E::Neg(boxed(other)),
                },
                UnaryOperator::Not => E::Not(boxed(self.expr(expr)?)),
                other => {
                    return Err(Rejection::unsupported(format!(
                        "operator {other} is not portable"
                    )));
                }
            },
            SqlExpr::BinaryOp { left, op, right } => {
                let (l, r) = (self.expr(left)?, self.expr(right)?);
                let (l, r) = (boxed(l), boxed(r));
                match op {
                    BinaryOperator::Plus => E::Arith(Arith::Add, l, r),
                    BinaryOperator::Minus => E::Arith(Arith::Sub, l, r),
                    BinaryOperator::Multiply => E::Arith(Arith::Mul, l, r),
                    BinaryOperator::Divide => E::Arith(Arith::Div, l, r),
                    BinaryOperator::Modulo => E::Arith(Arith::Mod, l, r),
                    BinaryOperator::Eq => E::Cmp(Cmp::Eq, l, r),
                    BinaryOperator::NotEq => E::Cmp(Cmp::Ne, l, r),
                    BinaryOperator::Lt => E::Cmp(Cmp::Lt, l, r),
                    BinaryOperator::LtEq => E::Cmp(Cmp::Le, l, r),
                    BinaryOperator::Gt => E::Cmp(Cmp::Gt, l, r),
                    BinaryOperator::GtEq => E::Cmp(Cmp::Ge, l, r),
                    BinaryOperator::And => E::And(l, r),
                    BinaryOperator::Or => E::Or(l, r),
                    BinaryOperator::StringConcat => E::Concat(l, r),
                    other => {
                        return Err(Rejection::unsupported(format!(
                            "operator {other} is not portable"
                        )));
                    }
                }
            }
            SqlExpr::IsNull(x) => E::IsNull(boxed(self.expr(x)?), false),
            SqlExpr::IsNotNull(x) => E::IsNull(boxed(self.expr(x)?), true),
            SqlExpr::Between {
                expr,
                negated,
                low,
                high,
            } => E::Between {
                e: boxed(self.expr(expr)?),
                lo: boxed(self.expr(low)?),
                hi: boxed(self.expr(high)?),
                negated: *negated,
            },
            SqlExpr::InList {
                expr,
                list,
                negated,
            } => {
                if list.is_empty() {
                    return Err(Rejection::unsupported(
                        "IN () with an empty list is not portable",
                    ));
                }
                E::InList {
                    e: boxed(self.expr(expr)?),
                    list: self.exprs(list)?,
                    negated: *negated,
                }
            }
            SqlExpr::InSubquery {
                expr,
                subquery,
                negated,
            } => E::InQuery {
                e: boxed(self.expr(expr)?),
                q: Box::new(self.query(subquery)?),
                negated: *negated,
            },
            SqlExpr::Exists { subquery, negated } => E::Exists {
                q: Box::new(self.query(subquery)?),
                negated: *negated,
            },
            SqlExpr::Subquery(q) => E::Scalar(Box::new(self.query(q)?)),
            SqlExpr::Case {
                operand,
                conditions,
                else_result,
                ..
            } => E::Case {
                operand: operand
                    .as_ref()
                    .map(|o| self.expr(o))
                    .transpose()?
                    .map(boxed),
                whens: conditions
                    .iter()
                    .map(|w| Ok((self.expr(&w.condition)?, self.expr(&w.result)?)))
                    .collect::<Result<Vec<_>, Rejection>>()?,
                otherwise: else_result
                    .as_ref()
                    .map(|o| self.expr(o))
                    .transpose()?
                    .map(boxed),
            },
            SqlExpr::Like {
                negated,
                any: false,
                expr,
                pattern,
                escape_char: None,
            } => E::Like {
                e: boxed(self.expr(expr)?),
                pattern: boxed(self.expr(pattern)?),
                negated: *negated,
            },
            SqlExpr::Like { .. } => {
                return Err(Rejection::unsupported(
                    "LIKE … ESCAPE is not portable; \\ is the escape character",
                ));
            }
            SqlExpr::Substring {
                expr,
                substring_from: Some(from),
                substring_for,
                ..
            } => {
                let mut args = vec![self.expr(expr)?, self.expr(from)?];
                if let Some(f) = substring_for {
                    args.push(self.expr(f)?);
                }
                E::Func(Func::Substr, args)
            }
            SqlExpr::Trim {
                trim_where: None,
                trim_what: None,
                expr,
                trim_characters: None,
            } => E::Func(Func::Trim, vec![self.expr(expr)?]),
            SqlExpr::Trim { .. } => {
                return Err(Rejection::unsupported(
                    "TRIM removes spaces only; other forms are not portable",
                ));
            }
            SqlExpr::Function(f) => self.function(f)?,
            SqlExpr::Cast { .. } => {
                return Err(Rejection::unsupported(
                    "CAST is not portable: engines round, truncate and parse differently",
                ));
            }
            other => {
                let text = other.to_string();
                let head: String = text.chars().take(40).collect();
                return Err(Rejection::unsupported(format!(
                    "expression `{head}` is not in the portable subset"
                )));
            }
        })
    }

    fn function(&mut self, f: &sqlparser::ast::Function) -> Result<E, Rejection> {
        let name = object_name(&f.name);
        let shown = name.to_uppercase();
        if f.over.is_some() || f.filter.is_some() || !f.within_group.is_empty() {
            return Err(Rejection::unsupported(format!(
                "{shown}() with OVER/FILTER/WITHIN GROUP is not portable"
            )));
        }
        let FunctionArguments::List(list) = &f.args else {
            return Err(Rejection::unsupported(format!(
                "{shown} needs an argument list"
            )));
        };
        if list
            .clauses
            .iter()
            .any(|c| !matches!(c, FunctionArgumentClause::OrderBy(v) if v.is_empty()))
        {
            return Err(Rejection::unsupported(format!(
                "{shown}() argument clauses are not portable"
            )));
        }
        let distinct = match list.duplicate_treatment {
            None | Some(sqlparser::ast::DuplicateTreatment::All) => false,
            Some(sqlparser::ast::DuplicateTreatment::Distinct) => true,
        };
        let mut star = false;
        let mut args = Vec::new();
        for a in &list.args {
            match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => args.push(self.expr(e)?),
                FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => star = true,
                _ => {
                    return Err(Rejection::unsupported(format!(
                        "{shown}(): named or qualified-wildcard arguments are not portable"
                    )));
                }
            }
        }
        if star && (name != "count" || !args.is_empty() || distinct) {
            return Err(Rejection::unsupported(format!(
                "{shown}(*) is only portable as COUNT(*)"
            )));
        }
        if distinct && name != "count" {
            return Err(Rejection::unsupported(format!(
                "{shown}(DISTINCT …) is not portable"
            )));
        }
        let arity = |n: std::ops::RangeInclusive<usize>| -> Result<(), Rejection> {
            if n.contains(&args.len()) {
                Ok(())
            } else {
                Err(Rejection::unsupported(format!(
                    "{shown}() takes {} arguments, got {}",
                    fmt_range(&n),
                    args.len()
                )))
            }
        };
        let func = match name.as_str() {
            "count" if star => return Ok(E::Agg(Agg::CountStar, None)),
            "count" | "min" | "max" => {
                arity(1..=1)?;
                let agg = match name.as_str() {
                    "count" => Agg::Count { distinct },
                    "min" => Agg::Min,
                    _ => Agg::Max,
                };
                return Ok(E::Agg(agg, args.pop().map(boxed)));
            }
            "sum" | "avg" => {
                return Err(Rejection::unsupported(format!(
                    "{shown}() is not portable: PostgreSQL and MySQL compute it in decimals, SQLite in 64-bit integers that overflow"
                )));
            }
            "abs" => {
                arity(1..=1)?;
                Func::Abs
            }
            "coalesce" => {
                arity(1..=32)?;
                Func::Coalesce
            }
            "nullif" => {
                arity(2..=2)?;
                Func::Nullif
            }
            "length" | "char_length" | "character_length" => {
                arity(1..=1)?;
                Func::Length
            }
            "substr" | "substring" => {
                arity(2..=3)?;
                Func::Substr
            }
            "trim" => {
                arity(1..=1)?;
                Func::Trim
            }
            "ltrim" => {
                arity(1..=1)?;
                Func::Ltrim
            }
            "rtrim" => {
                arity(1..=1)?;
                Func::Rtrim
            }
            "replace" => {
                arity(3..=3)?;
                Func::Replace
            }
            "lower" | "upper" | "lcase" | "ucase" => {
                return Err(Rejection::unsupported(format!(
                    "{shown}() is not portable: engines map non-ASCII letters differently"
                )));
            }
            _ => {
                return Err(Rejection::unsupported(format!(
                    "{shown}() is not in chainify's portable function subset"
                )));
            }
        };
        Ok(E::Func(func, args))
    }
}

/// About how many bytes MariaDB's filesort takes for one sort key of type `ty`: what it sorts a
/// text or bytes value on (`max_sort_length`, 1 024 bytes; a VARCHAR(n) at most 4n), its
/// fixed-size types' width, and 8 more for its NULL flag and length (and MySQL's rendering's
/// `IS NULL` key).
fn sort_key_bytes(e: &E, ty: Ty) -> u64 {
    const MAX_SORT_LENGTH: u64 = 1024;
    8 + match (e, ty) {
        (E::Col(c), Ty::Text) => match c.limit {
            Limit::Chars(n) => (4 * u64::from(n)).min(MAX_SORT_LENGTH),
            _ => MAX_SORT_LENGTH,
        },
        (_, Ty::Text | Ty::Bytes | Ty::Null) => MAX_SORT_LENGTH,
        (_, Ty::Dec) => 32,
        (_, Ty::Int | Ty::Bool) => 8,
    }
}

/// A bound of the bytes a value takes in a row ([`Writer::value_bytes`]).
#[derive(Clone, Copy)]
struct ValueBytes {
    /// From columns, literals and computed text.
    fixed: u64,
    /// Whether parameters' values add to it (counted once a row, [`Writer::row_bytes`]).
    params: bool,
}

/// How a message names the SELECT at `depth` (1: the statement's own query).
fn select_name(depth: usize) -> String {
    match depth {
        0 | 1 => "the SELECT".to_owned(),
        d => format!(
            "a SELECT nested {} level{} deep",
            d - 1,
            if d == 2 { "" } else { "s" }
        ),
    }
}

/// Refuses a SELECT whose target list (outputs, and the ORDER BY and GROUP BY keys that are not
/// outputs, which PostgreSQL adds as hidden entries) or whose ORDER BY or GROUP BY has more
/// than [`MAX_SELECT_ENTRIES`] entries: PostgreSQL and SQLite would refuse it at their own
/// limits, MariaDB run it (found by an adversarial hunt: 1 700 outputs failed on PostgreSQL
/// alone).
fn check_entries(q: &Q, depth: usize) -> Result<(), Rejection> {
    let output =
        |e: &E| matches!(e, E::Col(c) if q.items.iter().any(|i| matches!(i, E::Col(x) if x == c)));
    let hidden = q.group_by.iter().filter(|g| !output(g)).count()
        + q.order_by
            .iter()
            .filter(|o| matches!(&o.key, OrderKey::Expr(e) if !output(e)))
            .count();
    let what = select_name(depth);
    let entries = q.items.len() + hidden;
    if entries > MAX_SELECT_ENTRIES {
        return Err(Rejection::limit(format!(
            "{what} has {entries} target-list entries ({} outputs and {hidden} ORDER BY or GROUP BY keys that are not outputs); at most {MAX_SELECT_ENTRIES} are accepted (PostgreSQL refuses more than 1664, counting such keys, SQLite more than 2000 result columns)",
            q.items.len()
        )));
    }
    for (clause, n) in [
        ("ORDER BY", q.order_by.len()),
        ("GROUP BY", q.group_by.len()),
    ] {
        if n > MAX_SELECT_ENTRIES {
            return Err(Rejection::limit(format!(
                "{what} has {n} {clause} terms; at most {MAX_SELECT_ENTRIES} are accepted (SQLite refuses more than 2000)"
            )));
        }
    }
    Ok(())
}

fn fmt_range(r: &std::ops::RangeInclusive<usize>) -> String {
    if r.start() == r.end() {
        r.start().to_string()
    } else {
        format!("{} to {}", r.start(), r.end())
    }
}

/// Walks an expression of query level `owner` without entering subqueries.
fn walk_own(e: &E, f: &mut dyn FnMut(&E) -> Result<bool, Rejection>) -> Result<(), Rejection> {
    // `f` returns false to skip the children (aggregates).
    if !f(e)? {
        return Ok(());
    }
    let mut each = |x: &E| walk_own(x, f);
    match e {
        E::Col(_) | E::Param(_) | E::Lit(_) | E::Exists { .. } | E::Scalar(_) => Ok(()),
        E::Neg(x) | E::Not(x) | E::IsNull(x, _) => each(x),
        E::Arith(_, a, b) | E::Cmp(_, a, b) | E::And(a, b) | E::Or(a, b) | E::Concat(a, b) => {
            each(a)?;
            each(b)
        }
        E::Between { e, lo, hi, .. } => {
            each(e)?;
            each(lo)?;
            each(hi)
        }
        E::InList { e, list, .. } => {
            each(e)?;
            list.iter().try_for_each(each)
        }
        E::InQuery { e, .. } => each(e),
        E::Case {
            operand,
            whens,
            otherwise,
        } => {
            if let Some(o) = operand {
                each(o)?;
            }
            for (w, t) in whens {
                each(w)?;
                each(t)?;
            }
            otherwise.as_deref().map_or(Ok(()), each)
        }
        E::Func(_, args) => args.iter().try_for_each(each),
        E::Agg(_, a) => a.as_deref().map_or(Ok(()), each),
        E::Like { e, pattern, .. } => {
            each(e)?;
            each(pattern)
        }
    }
}

fn has_aggregate(e: &E) -> bool {
    let mut found = false;
    let _ = walk_own(e, &mut |x| {
        if matches!(x, E::Agg(..)) {
            found = true;
        }
        Ok(true)
    });
    found
}

/// A grouped query (GROUP BY or an aggregate in its outputs) may show only grouped columns of
/// its own tables outside aggregates, in its subqueries too: engines pick different rows for the
/// others (or PostgreSQL refuses them). An aggregate over an outer query's column is refused:
/// PostgreSQL moves it to that outer query, which the others do not all do alike.
fn check_grouping(q: &Q, level: usize) -> Result<(), Rejection> {
    let mut outer = None;
    for_own(q, &mut |e| {
        walk_own(e, &mut |x| {
            if let E::Agg(_, Some(arg)) = x {
                walk_deep(arg, &mut |y| {
                    if let E::Col(c) = y
                        && c.owner < level
                        && outer.is_none()
                    {
                        outer = Some(format!("{}.{}", c.qualifier, c.column));
                    }
                });
            }
            Ok(true)
        })
    })?;
    if let Some(c) = outer {
        return Err(Rejection::unsupported(format!(
            "an aggregate over the outer query's column {c} is not portable (PostgreSQL computes it in the outer query)"
        )));
    }
    // SQLite groups a query only by GROUP BY or an aggregate in its outputs.
    let grouped = !q.group_by.is_empty() || q.items.iter().any(has_aggregate);
    for g in &q.group_by {
        if let E::Col(c) = g
            && c.owner != level
        {
            return Err(Rejection::unsupported(format!(
                "GROUP BY names {}.{} of an outer query (SQLite cannot see it there)",
                c.qualifier, c.column
            )));
        }
    }
    if !grouped {
        // Engines disagree on what such a query is: PostgreSQL groups it into one row,
        // MariaDB filters its rows, SQLite refuses it (found by the review).
        if q.having.is_some() {
            return Err(Rejection::unsupported(
                "HAVING without GROUP BY or an aggregate in the outputs is not portable",
            ));
        }
        let order_aggregate = q.order_by.iter().any(|o| match &o.key {
            OrderKey::Expr(e) => has_aggregate(e),
            OrderKey::Output(_) => false,
        });
        if order_aggregate {
            return Err(Rejection::unsupported(
                "an aggregate in ORDER BY needs GROUP BY or an aggregate in the outputs (engines group such a query differently)",
            ));
        }
    }
    for e in q
        .selection
        .iter()
        .chain(q.from.iter().filter_map(|f| f.on.as_ref()))
    {
        if has_aggregate(e) {
            return Err(Rejection::unsupported(
                "aggregates are not allowed in WHERE or ON",
            ));
        }
    }
    if !grouped {
        return Ok(());
    }
    let keys: Vec<&ColRef> = q
        .group_by
        .iter()
        .filter_map(|g| match g {
            E::Col(c) => Some(c),
            _ => None,
        })
        .collect();
    let ungrouped = |c: &ColRef| {
        Rejection::nondeterministic(format!(
            "column {}.{} is neither grouped nor aggregated; engines pick different rows for it",
            c.qualifier, c.column
        ))
    };
    let check = |e: &E| {
        walk_own(e, &mut |x| match x {
            E::Agg(..) => Ok(false),
            E::Col(c) if c.owner == level && !keys.contains(&c) => Err(ungrouped(c)),
            E::Scalar(sub) | E::Exists { q: sub, .. } | E::InQuery { q: sub, .. } => {
                // A subquery sees the group's columns as constants: only grouped ones are.
                let mut found = None;
                walk_query(sub, &mut |y| {
                    if let E::Col(c) = y
                        && c.owner == level
                        && !keys.contains(&c)
                        && found.is_none()
                    {
                        found = Some(ungrouped(c));
                    }
                });
                found.map_or(Ok(true), Err)
            }
            _ => Ok(true),
        })
    };
    for e in &q.items {
        check(e)?;
    }
    if let Some(h) = &q.having {
        check(h)?;
    }
    for o in &q.order_by {
        if let OrderKey::Expr(e) = &o.key {
            check(e)?;
        }
    }
    Ok(())
}

/// LIMIT and OFFSET are deterministic only when ORDER BY covers every table's full primary key
/// (resolved as the engines resolve it: an output alias is its expression).
fn check_total_order(q: &Q, level: usize, l: &Level<'_>) -> Result<(), Rejection> {
    let mut covered: Vec<(usize, usize)> = Vec::new();
    for o in &q.order_by {
        let e = match &o.key {
            OrderKey::Output(i) => &q.items[i - 1],
            OrderKey::Expr(e) => e,
        };
        if let E::Col(c) = e
            && c.owner == level
            && let Some(p) = c.key_position
        {
            covered.push((c.occurrence, p));
        }
    }
    let total = !l.tables.is_empty()
        && l.tables
            .iter()
            .enumerate()
            .all(|(i, (_, _, t))| (0..t.primary_key.len()).all(|p| covered.contains(&(i, p))));
    if total {
        Ok(())
    } else {
        Err(Rejection::nondeterministic(
            "LIMIT/OFFSET without an ORDER BY over the full primary key of every table is non-deterministic",
        ))
    }
}

/// Whether a scalar subquery yields at most one row: aggregates without GROUP BY, LIMIT 1, or
/// one table whose WHERE fixes its whole primary key by equalities.
fn at_most_one_row(q: &Q, level: usize) -> bool {
    if q.group_by.is_empty()
        && !q.items.is_empty()
        && q.items.iter().all(|e| matches!(e, E::Agg(..)))
    {
        return true;
    }
    if matches!(q.limit, Some(E::Lit(Value::Int(n))) if n <= 1) {
        return true;
    }
    if q.from.len() != 1 {
        return false;
    }
    pins_key(q.selection.as_ref(), level, key_arity(q))
}

/// Whether a WHERE's top-level conjuncts fix every one of `arity` key columns of level `level`'s
/// (only) table by equality with something that does not depend on that table.
fn pins_key(selection: Option<&E>, level: usize, arity: usize) -> bool {
    let mut fixed: Vec<usize> = Vec::new();
    let mut conjuncts: Vec<&E> = selection.into_iter().collect();
    while let Some(c) = conjuncts.pop() {
        match c {
            E::And(a, b) => {
                conjuncts.push(a);
                conjuncts.push(b);
            }
            E::Cmp(Cmp::Eq, a, b) => {
                for (col, other) in [(a, b), (b, a)] {
                    if let E::Col(c) = col.as_ref()
                        && c.owner == level
                        && let Some(p) = c.key_position
                        && !mentions_level(other, level)
                    {
                        fixed.push(p);
                    }
                }
            }
            _ => {}
        }
    }
    arity > 0 && (0..arity).all(|p| fixed.contains(&p))
}

/// The column sets of `t` whose values identify at most one row, each backed by an index on
/// every engine: the primary key and each UNIQUE constraint.
fn lookups_of(t: &Table) -> Vec<Vec<String>> {
    std::iter::once(&t.primary_key)
        .chain(&t.uniques)
        .filter(|set| !set.is_empty())
        .map(|set| set.iter().map(|&i| t.columns[i].name.clone()).collect())
        .collect()
}

fn key_arity(q: &Q) -> usize {
    q.from.first().map_or(0, |f| f.occ.key_arity)
}

fn mentions_level(e: &E, level: usize) -> bool {
    let mut found = false;
    let _ = walk_own(e, &mut |x| {
        if let E::Col(c) = x
            && c.owner == level
        {
            found = true;
        }
        // Subqueries are not entered: a correlated reference inside them may still name this
        // level, so treat them as mentioning it.
        if matches!(x, E::Scalar(_) | E::Exists { .. } | E::InQuery { .. }) {
            found = true;
        }
        Ok(true)
    });
    found
}

// ---------------------------------------------------------------------------------------------
// Typing and rendering.

/// Where an expression's value goes: stored into a column (DECIMAL arithmetic is rounded to the
/// column's scale there), or used by something else (compared, returned, passed on).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Stored,
    Other,
}

/// A rendered fragment: its text and, for MySQL, the parameters of its `?`s in order.
struct Piece {
    sql: String,
    binds: Vec<usize>,
}

struct Writer<'a> {
    dialect: Dialect,
    sig: &'a [Ty],
    sql: String,
    bind_order: Vec<usize>,
    /// PostgreSQL and SQLite: the parameter behind each placeholder number (`$1` is the first).
    numbers: Vec<usize>,
    checks: Vec<ValueCheck>,
    /// The query level being written (0 = outermost; UPDATE/DELETE targets are level 0).
    level: usize,
    /// Whether aggregates may appear here (a query's outputs, HAVING, ORDER BY).
    aggregates: bool,
    /// The row cap of a top-level read-only query.
    row_cap: Option<u64>,
    /// Inside a WHERE, ON or HAVING: engines choose which rows and conjuncts they evaluate
    /// there, so nothing in it may fail on some rows (integer arithmetic must not overflow).
    filter: bool,
    /// MySQL: the next query's integer outputs are written as BIGINT (`IN (SELECT …)`).
    widen_outputs: bool,
    /// Byte comparisons a row the statement's LIKEs may still make ([`MAX_LIKE_WORK`] in all).
    like_budget: u64,
}

impl<'a> Writer<'a> {
    /// A writer of one statement for `dialect`, its parameters typed by `sig` and numbered
    /// by `numbers`, under `row_cap` when it is a top-level query.
    fn new(dialect: Dialect, sig: &'a [Ty], numbers: Vec<usize>, row_cap: Option<u64>) -> Self {
        Writer {
            dialect,
            sig,
            sql: String::new(),
            bind_order: Vec::new(),
            numbers,
            checks: Vec::new(),
            level: 0,
            aggregates: false,
            row_cap,
            filter: false,
            widen_outputs: false,
            like_budget: MAX_LIKE_WORK,
        }
    }
}

fn quote(name: &str) -> String {
    format!("\"{name}\"")
}

impl Writer<'_> {
    fn push(&mut self, s: &str) {
        self.sql.push_str(s);
    }

    fn capture<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, Rejection>,
    ) -> Result<(T, Piece), Rejection> {
        let sql = std::mem::take(&mut self.sql);
        let binds = std::mem::take(&mut self.bind_order);
        let r = f(self);
        let piece = Piece {
            sql: std::mem::replace(&mut self.sql, sql),
            binds: std::mem::replace(&mut self.bind_order, binds),
        };
        Ok((r?, piece))
    }

    fn emit(&mut self, p: &Piece) {
        self.sql.push_str(&p.sql);
        self.bind_order.extend_from_slice(&p.binds);
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), Rejection> {
        match s {
            Stmt::Select(q) => {
                self.query(q, self.row_cap)?;
            }
            Stmt::Insert {
                table,
                columns,
                source,
            } => {
                let cols: Vec<String> = columns.iter().map(|(c, _, _)| quote(c)).collect();
                self.push(&format!(
                    "INSERT INTO {} ({}) ",
                    quote(table),
                    cols.join(", ")
                ));
                match source {
                    Source::Values(rows) => {
                        self.push("VALUES ");
                        for (r, row) in rows.iter().enumerate() {
                            if row.len() != columns.len() {
                                return Err(Rejection::wrong_type(format!(
                                    "VALUES row {} has {} values for {} columns",
                                    r + 1,
                                    row.len(),
                                    columns.len()
                                )));
                            }
                            self.push(if r == 0 { "(" } else { ", (" });
                            for (i, (e, (c, cty, limit))) in row.iter().zip(columns).enumerate() {
                                if i > 0 {
                                    self.push(", ");
                                }
                                let ty = self.expr(e, Use::Stored)?;
                                assignable(table, c, *cty, ty)?;
                                self.decimal_error(e, ty, *limit)?;
                                self.stored_text(e, ty, *limit, c)?;
                            }
                            self.push(")");
                        }
                    }
                    Source::Query(q) => {
                        let types = self.query(q, None)?;
                        for (((c, cty, limit), ty), e) in columns.iter().zip(types).zip(&q.items) {
                            assignable(table, c, *cty, ty)?;
                            self.stored_text(e, ty, *limit, c)?;
                        }
                    }
                }
            }
            Stmt::Update {
                table,
                sets,
                selection,
                ..
            } => {
                self.push(&format!("UPDATE {} SET ", quote(table)));
                self.level = 1;
                for (i, (c, cty, limit, e)) in sets.iter().enumerate() {
                    if i > 0 {
                        self.push(", ");
                    }
                    self.push(&format!("{} = ", quote(c)));
                    let ty = self.expr(e, Use::Stored)?;
                    assignable(table, c, *cty, ty)?;
                    self.decimal_error(e, ty, *limit)?;
                    self.stored_text(e, ty, *limit, c)?;
                }
                if let Some(w) = selection {
                    self.push(" WHERE ");
                    self.filter(w, "WHERE")?;
                }
            }
            Stmt::Delete {
                table, selection, ..
            } => {
                self.push(&format!("DELETE FROM {}", quote(table)));
                self.level = 1;
                if let Some(w) = selection {
                    self.push(" WHERE ");
                    self.filter(w, "WHERE")?;
                }
            }
        }
        Ok(())
    }

    /// The most bytes text expression `e` can hold; parameters in it are bounded by checks
    /// (`cap`, or [`MAX_REPLACEMENT`] as a REPLACE's replacement). A TEXT column holds at most
    /// [`MAX_STORED_TEXT`] (what chainify stores there is checked), VARCHAR(n) 4n bytes.
    fn text_bound(&mut self, e: &E, cap: u64) -> u64 {
        let mut checks = Vec::new();
        let n = self.text_bound_with(e, cap, &mut checks);
        self.checks.append(&mut checks);
        n
    }

    /// [`Writer::text_bound`], the checks it needs put into `checks`.
    fn text_bound_with(&self, e: &E, cap: u64, checks: &mut Vec<ValueCheck>) -> u64 {
        let max_of = |checks: &mut Vec<ValueCheck>, xs: &mut dyn Iterator<Item = &E>| {
            xs.map(|x| self.text_bound_with(x, cap, checks))
                .max()
                .unwrap_or(0)
        };
        match e {
            E::Lit(Value::Text(t)) => t.len() as u64,
            E::Lit(_) => 0,
            E::Param(i) => {
                if self.sig.get(*i) == Some(&Ty::Text) {
                    checks.push(ValueCheck::TextAtMost(*i, cap));
                    cap
                } else {
                    0
                }
            }
            E::Col(c) => match c.limit {
                Limit::Chars(n) => 4 * u64::from(n),
                _ => MAX_STORED_TEXT,
            },
            E::Concat(a, b) => {
                let a = self.text_bound_with(a, cap, checks);
                a.saturating_add(self.text_bound_with(b, cap, checks))
            }
            E::Func(Func::Replace, args) => self.replace_bound(args, cap, checks),
            E::Func(Func::Substr | Func::Trim | Func::Ltrim | Func::Rtrim, args) => args
                .first()
                .map_or(0, |a| self.text_bound_with(a, cap, checks)),
            E::Func(Func::Coalesce | Func::Nullif, args) => max_of(checks, &mut args.iter()),
            E::Case {
                whens, otherwise, ..
            } => max_of(
                checks,
                &mut whens.iter().map(|(_, t)| t).chain(otherwise.as_deref()),
            ),
            E::Scalar(q) => match q.items.as_slice() {
                [item] => self.text_bound_with(item, cap, checks),
                _ => MAX_STORED_TEXT,
            },
            E::Agg(Agg::Min | Agg::Max, Some(x)) => self.text_bound_with(x, cap, checks),
            _ => MAX_STORED_TEXT,
        }
    }

    /// [`Writer::replace_bound`] of a REPLACE being typed, its parameters checked.
    fn replace_bound_checked(&mut self, args: &[E]) -> u64 {
        let mut checks = Vec::new();
        let n = self.replace_bound(args, MAX_STORED_TEXT, &mut checks);
        self.checks.append(&mut checks);
        n
    }

    /// Refuses a REPLACE whose text may hold more than [`MAX_REPLACE_SUBJECT`] bytes; a
    /// parameter there is checked by value.
    fn replace_subject(&mut self, args: &[E]) -> Result<(), Rejection> {
        let Some(subject) = args.first() else {
            return Ok(());
        };
        let mut checks = Vec::new();
        let n = self.text_bound_with(subject, MAX_REPLACE_SUBJECT, &mut checks);
        if n > MAX_REPLACE_SUBJECT {
            return Err(Rejection::limit(format!(
                "REPLACE's text may hold {}; at most {} (MariaDB's REPLACE takes time quadratic in its matches, the others' linear): replace in a VARCHAR(n ≤ 256) column or text bounded as much",
                human_bytes(n),
                human_bytes(MAX_REPLACE_SUBJECT)
            )));
        }
        self.checks.append(&mut checks);
        Ok(())
    }

    /// REPLACE(a, b, c) holds at most |a| · max(1, |c|) bytes (every byte of `a` a match).
    fn replace_bound(&self, args: &[E], cap: u64, checks: &mut Vec<ValueCheck>) -> u64 {
        match args {
            [a, _, c] => {
                let a = self.text_bound_with(a, cap, checks);
                let c = self.text_bound_with(c, MAX_REPLACEMENT.min(cap), checks);
                a.saturating_mul(c.max(1))
            }
            _ => u64::MAX,
        }
    }

    /// The most bytes one row of `q` takes, its outputs (of types `types`) each counted by
    /// [`Writer::value_bytes`]; the parameters' values in it together at most
    /// [`MAX_BOUND_BYTES`], which they add up to at every place the statement uses them.
    fn row_bytes(&self, q: &Q, types: &[Ty]) -> u64 {
        let mut row = 0u64;
        let mut params = false;
        for (e, ty) in q.items.iter().zip(types) {
            let v = self.value_bytes(e, *ty);
            row = row.saturating_add(v.fixed);
            params |= v.params;
        }
        if params {
            row = row.saturating_add(MAX_BOUND_BYTES as u64);
        }
        row
    }

    /// The most bytes output `e` of type `ty` takes in a row: a fixed-size value
    /// [`FIXED_VALUE_BYTES`]; text and bytes their bound and [`VALUE_FRAMING`]. A TEXT column
    /// holds at most [`MAX_STORED_TEXT`] (what chainify stores there is checked), VARCHAR(n) 4n
    /// bytes, a bytes column what a statement's parameters carry ([`MAX_BOUND_BYTES`]); `||`
    /// and REPLACE at most [`MAX_TEXT_EXPR`] (their growth is checked). Parameters are not
    /// counted here but flagged: [`Writer::row_bytes`] counts them once for the whole row.
    fn value_bytes(&self, e: &E, ty: Ty) -> ValueBytes {
        match ty {
            Ty::Text | Ty::Bytes | Ty::Null => {
                let mut v = self.payload_bytes(e);
                v.fixed = v.fixed.saturating_add(VALUE_FRAMING);
                v
            }
            Ty::Int | Ty::Dec | Ty::Bool => ValueBytes {
                fixed: FIXED_VALUE_BYTES,
                params: false,
            },
        }
    }

    /// The most bytes text or bytes expression `e` holds, parameters flagged ([`Writer::value_bytes`]).
    fn payload_bytes(&self, e: &E) -> ValueBytes {
        let fixed = |fixed: u64| ValueBytes {
            fixed,
            params: false,
        };
        let max_of = |xs: &mut dyn Iterator<Item = &E>| {
            xs.map(|x| self.payload_bytes(x))
                .fold(fixed(0), |a, b| ValueBytes {
                    fixed: a.fixed.max(b.fixed),
                    params: a.params || b.params,
                })
        };
        match e {
            E::Lit(v) => fixed(v.payload_bytes() as u64),
            E::Param(i) => match self.sig.get(*i) {
                Some(Ty::Text | Ty::Bytes) => ValueBytes {
                    fixed: 0,
                    params: true,
                },
                _ => fixed(FIXED_VALUE_BYTES),
            },
            E::Col(c) => fixed(match (c.ty, c.limit) {
                (Ty::Text, Limit::Chars(n)) => 4 * u64::from(n),
                (Ty::Text, _) => MAX_STORED_TEXT,
                (Ty::Bytes, _) => MAX_BOUND_BYTES as u64,
                _ => FIXED_VALUE_BYTES,
            }),
            // Their growth was checked when typed, with the parameters in them checked
            // (`TextAtMost`) against the caps this bound counts.
            E::Concat(..) | E::Func(Func::Replace, _) => fixed(
                self.text_bound_with(e, MAX_STORED_TEXT, &mut Vec::new())
                    .min(MAX_TEXT_EXPR),
            ),
            E::Func(Func::Substr | Func::Trim | Func::Ltrim | Func::Rtrim, args) => {
                args.first().map_or(fixed(0), |a| self.payload_bytes(a))
            }
            E::Func(Func::Coalesce | Func::Nullif, args) => max_of(&mut args.iter()),
            E::Case {
                whens, otherwise, ..
            } => max_of(&mut whens.iter().map(|(_, t)| t).chain(otherwise.as_deref())),
            E::Scalar(q) => match q.items.as_slice() {
                [item] => self.payload_bytes(item),
                _ => fixed(MAX_TEXT_EXPR),
            },
            E::Agg(Agg::Min | Agg::Max, Some(x)) => self.payload_bytes(x),
            _ => fixed(MAX_TEXT_EXPR),
        }
    }

    /// A text value stored into an unbounded TEXT column: at most [`MAX_STORED_TEXT`]. One
    /// computed into VARCHAR(n) provably fits: a longer one does not fail alike (PostgreSQL
    /// cuts excess spaces silently, MariaDB spaces and tabs, SQLite fails; found by the
    /// review). A literal or parameter alone is checked by its value.
    fn stored_text(&mut self, e: &E, ty: Ty, limit: Limit, column: &str) -> Result<(), Rejection> {
        if ty != Ty::Text {
            return Ok(());
        }
        if let Limit::Chars(n) = limit {
            if matches!(e, E::Lit(_) | E::Param(_)) {
                return Ok(());
            }
            return if self.overlong_blank(e, u64::from(n)) {
                Err(Rejection::limit(format!(
                    "the text computed into VARCHAR({n}) column {column} may be longer than {n} characters and end in blanks, and engines differ on what they do then (PostgreSQL cuts trailing spaces, MariaDB spaces and tabs, SQLite fails); compute it from columns and literals that fit, or end it with a literal that is not blank"
                )))
            } else {
                Ok(())
            };
        }
        let n = self.text_bound(e, MAX_STORED_TEXT);
        if n > MAX_STORED_TEXT {
            return Err(Rejection::limit(format!(
                "the value stored into TEXT column {column} may reach {}; at most {} (declare VARCHAR(n) for text that grows)",
                human_bytes(n),
                human_bytes(MAX_STORED_TEXT)
            )));
        }
        Ok(())
    }

    /// DECIMAL arithmetic stored into a DECIMAL(p, s) column: SQLite computes it in floating
    /// point and rounds the result to s places. That is exact only when (1) no operand has more
    /// than s decimal places, so the exact result needs no rounding and no tie is decided by a
    /// float's error, and (2) the accumulated error (half an ulp of the largest intermediate per
    /// leaf and operation, plus the store's nudge of 4e-16) stays below half a unit of the
    /// s-th place.
    fn decimal_error(&mut self, e: &E, ty: Ty, limit: Limit) -> Result<(), Rejection> {
        let Limit::Decimal { precision, scale } = limit else {
            return Ok(());
        };
        let mut arithmetic = false;
        let _ = walk_own(e, &mut |x| {
            arithmetic |= matches!(x, E::Arith(..) | E::Neg(_));
            Ok(true)
        });
        if ty != Ty::Dec || !arithmetic {
            return Ok(());
        }
        let (largest, terms) = self.dec_span(e, precision, scale)?;
        let error = (f64::from(terms) * 1.12e-16 + 4e-16) * largest;
        if error * 10f64.powi(i32::from(scale)) >= 0.5 {
            return Err(Rejection::nondeterministic(format!(
                "DECIMAL arithmetic with values up to {largest:.3e} stored at {scale} decimal places may round differently on SQLite, which computes it in floating point; use smaller columns or parameters"
            )));
        }
        Ok(())
    }

    /// The largest magnitude any intermediate of stored DECIMAL arithmetic can take, and its
    /// number of leaves and operations. A decimal parameter must fit the stored column.
    fn dec_span(&mut self, e: &E, precision: u8, scale: u8) -> Result<(f64, u32), Rejection> {
        let places = |s: u8, what: String| {
            if s > scale {
                Err(Rejection::nondeterministic(format!(
                    "{what} has {s} decimal places, more than the {scale} of the column it is stored in: SQLite computes in floating point and would decide the rounding differently"
                )))
            } else {
                Ok(())
            }
        };
        let int = |w: &mut Self, x: &E| (int_bound(x, &mut w.checks) as f64, 1);
        Ok(match e {
            E::Arith(op, a, b) => {
                let (x, n) = self.dec_span(a, precision, scale)?;
                let (y, m) = self.dec_span(b, precision, scale)?;
                let r = match op {
                    Arith::Add | Arith::Sub => x + y,
                    Arith::Mul => x * y,
                    Arith::Div => x,
                    Arith::Mod => x.min(y),
                };
                (x.max(y).max(r), n + m + 1)
            }
            E::Neg(x) => {
                let (x, n) = self.dec_span(x, precision, scale)?;
                (x, n + 1)
            }
            E::Lit(Value::Decimal(d)) => {
                let n = d.normalized();
                places(n.scale(), format!("the literal {d}"))?;
                (
                    n.to_string()
                        .trim_start_matches('-')
                        .parse()
                        .unwrap_or(f64::MAX),
                    1,
                )
            }
            E::Col(c) => match c.limit {
                Limit::Decimal {
                    precision: p,
                    scale: s,
                } => {
                    places(s, format!("column {}", c.column))?;
                    (10f64.powi(i32::from(p) - i32::from(s)), 1)
                }
                _ => int(self, e),
            },
            E::Param(i) if self.sig.get(*i) == Some(&Ty::Dec) => {
                self.checks
                    .push(ValueCheck::DecimalFits(*i, precision, scale));
                (10f64.powi(i32::from(precision) - i32::from(scale)), 1)
            }
            E::Func(Func::Abs | Func::Coalesce, args) => {
                let mut span = (0f64, 1);
                for a in args {
                    let (x, n) = self.dec_span(a, precision, scale)?;
                    span = (span.0.max(x), span.1 + n);
                }
                span
            }
            // NULLIF(a, b) is `a` or NULL: b is only compared.
            E::Func(Func::Nullif, args) => match args.first() {
                Some(a) => {
                    let (x, n) = self.dec_span(a, precision, scale)?;
                    (x, n + 1)
                }
                None => int(self, e),
            },
            E::Case {
                whens, otherwise, ..
            } => {
                let mut span = (0f64, 1);
                for t in whens.iter().map(|(_, t)| t).chain(otherwise.as_deref()) {
                    let (x, n) = self.dec_span(t, precision, scale)?;
                    span = (span.0.max(x), span.1.max(n));
                }
                span
            }
            E::Scalar(q) => match q.items.as_slice() {
                [E::Col(_)] | [E::Agg(Agg::Min | Agg::Max, Some(_))] => {
                    let item = match &q.items[0] {
                        E::Agg(_, Some(x)) => x.as_ref(),
                        other => other,
                    };
                    self.dec_span(item, precision, scale)?
                }
                _ => int(self, e),
            },
            // The integer bound counts a decimal literal as 0 and a decimal parameter as any
            // small number, whatever its places: a decimal value under anything not matched
            // above would pass unchecked.
            _ => {
                let mut hidden = None;
                let _ = walk_own(e, &mut |x| {
                    match x {
                        E::Lit(Value::Decimal(d)) => hidden = Some(format!("the literal {d}")),
                        E::Param(i) if self.sig.get(*i) == Some(&Ty::Dec) => {
                            hidden = Some(format!("the decimal parameter ${}", i + 1));
                        }
                        _ => {}
                    }
                    Ok(hidden.is_none())
                });
                if let Some(what) = hidden {
                    return Err(Rejection::nondeterministic(format!(
                        "{what} is inside an expression whose DECIMAL result is not bounded for SQLite's floating point (stored into a column of scale {scale}); use it directly, in CASE, COALESCE, NULLIF, ABS or + - * /"
                    )));
                }
                int(self, e)
            }
        })
    }

    /// Something MariaDB evaluates only sometimes (a comparison's right side once the left is
    /// NULL, BETWEEN's bounds, IN's list, NULLIF's second argument): nothing in it may fail on
    /// some rows only.
    fn lazily<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, Rejection>,
    ) -> Result<T, Rejection> {
        let outer = self.filter;
        self.filter = true;
        let r = f(self);
        self.filter = outer;
        r
    }

    /// Which operands of a binary operator (arithmetic, `||`, a comparison) SQLite may skip:
    /// since 3.47 it evaluates first the operand without a subquery and, when that is NULL,
    /// skips the one holding it (the result is NULL either way), where PostgreSQL and MariaDB
    /// evaluate both and raise what fails in it. Such an operand is evaluated only sometimes.
    /// Returns whether `a` and whether `b` may be skipped.
    fn skippable(&self, a: &E, b: &E) -> (bool, bool) {
        let (sa, sb) = (has_subquery(a), has_subquery(b));
        (
            sa && !sb && may_be_null(b, self.sig),
            sb && may_be_null(a, self.sig),
        )
    }

    /// Whether `e` is a NULL constant (the literal, or a parameter whose value is NULL):
    /// PostgreSQL folds a comparison, `||`, BETWEEN, IN or LIKE with one to NULL when it plans,
    /// without evaluating the other operands, which MariaDB and SQLite evaluate (and fail in).
    fn null_const(&self, e: &E) -> bool {
        match e {
            E::Lit(Value::Null) => true,
            E::Param(i) => self.sig.get(*i).is_none_or(|t| *t == Ty::Null),
            _ => false,
        }
    }

    /// Whether text computed by `e` may be longer than `n` characters and end in blanks:
    /// stored into VARCHAR(n), engines then differ (a longer value that ends otherwise fails on
    /// all). Each branch of a CASE, COALESCE or NULLIF counts on its own.
    fn overlong_blank(&mut self, e: &E, n: u64) -> bool {
        match branches(e) {
            Some(yields) => yields.into_iter().any(|y| self.overlong_blank(y, n)),
            None => char_bound(e).is_none_or(|b| b > n) && self.may_end_blank(e),
        }
    }

    /// Whether text computed by `e` may end in a blank (an ASCII white space): unknown text
    /// may; a text parameter is checked to be neither empty nor end in one; a concatenation
    /// ends as its right side, or as its left one when the right may be empty.
    fn may_end_blank(&mut self, e: &E) -> bool {
        if let Some(yields) = branches(e) {
            return yields.into_iter().any(|y| self.may_end_blank(y));
        }
        match e {
            E::Lit(Value::Text(t)) => t.ends_with(|c: char| c.is_ascii_whitespace()),
            E::Lit(_) => false,
            E::Param(i) => {
                if self.sig.get(*i) == Some(&Ty::Text) {
                    self.checks.push(ValueCheck::EndsNonBlank(*i));
                }
                false
            }
            E::Concat(a, b) => {
                if self.may_end_blank(b) {
                    return true;
                }
                // A parameter was just checked to be non-empty; a literal is as it is.
                let empty = match &**b {
                    E::Lit(Value::Text(t)) => t.is_empty(),
                    E::Lit(_) | E::Param(_) => false,
                    _ => true,
                };
                empty && self.may_end_blank(a)
            }
            _ => true,
        }
    }

    /// A compared operand; with `widen` (MySQL, integers meeting decimals) an integer one is
    /// compared as a decimal; with `exact` (MySQL, decimal columns of different scales meeting)
    /// a decimal column is compared as DECIMAL(65, 30).
    fn emit_compared(&mut self, widen: bool, exact: bool, t: Ty, e: &E, piece: &Piece) {
        if widen && t == Ty::Int {
            self.push("CAST(");
            self.emit(piece);
            self.push(" AS DECIMAL(65, 0))");
        } else if exact && decimal_scale(e).is_some() {
            self.push("CAST(");
            self.emit(piece);
            self.push(" AS DECIMAL(65, 30))");
        } else {
            self.emit(piece);
        }
    }

    /// `f`, [`Writer::lazily`] when `lazy`.
    fn lazily_if<T>(
        &mut self,
        lazy: bool,
        f: impl FnOnce(&mut Self) -> Result<T, Rejection>,
    ) -> Result<T, Rejection> {
        if lazy { self.lazily(f) } else { f(self) }
    }

    /// A WHERE, ON or HAVING condition.
    fn filter(&mut self, e: &E, what: &str) -> Result<(), Rejection> {
        let outer = self.filter;
        self.filter = true;
        let r = self.condition(e, what);
        self.filter = outer;
        r
    }

    /// A boolean condition.
    fn condition(&mut self, e: &E, what: &str) -> Result<(), Rejection> {
        let ty = self.expr(e, Use::Other)?;
        if matches!(ty, Ty::Bool | Ty::Null) {
            Ok(())
        } else {
            Err(Rejection::wrong_type(format!(
                "{what} needs a boolean condition, not {} (engines read numbers as truth values differently)",
                ty.name()
            )))
        }
    }

    /// Writes a query; returns its output types.
    fn query(&mut self, q: &Q, row_cap: Option<u64>) -> Result<Vec<Ty>, Rejection> {
        let outer_aggregates = self.aggregates;
        let level = self.level;
        self.level += 1;
        let r = self.query_at(q, level, row_cap);
        self.level = level;
        self.aggregates = outer_aggregates;
        r
    }

    fn query_at(
        &mut self,
        q: &Q,
        level: usize,
        row_cap: Option<u64>,
    ) -> Result<Vec<Ty>, Rejection> {
        // Expressions of this query are at `level`; its subqueries one further in.
        self.level = level + 1;
        self.push("SELECT ");
        if q.distinct {
            self.push("DISTINCT ");
        }
        let mut types = Vec::new();
        self.aggregates = true;
        // Under LIMIT or OFFSET, PostgreSQL computes the outputs of rows it then sorts away or
        // skips, MariaDB and SQLite only those of the rows they return; under HAVING, MariaDB
        // computes the outputs of groups it then drops, PostgreSQL and SQLite only those of the
        // groups kept (found by the difftest): nothing in them may fail on some rows only.
        let outer = self.filter;
        self.filter |= q.limit.is_some() || q.offset.is_some() || q.having.is_some();
        let widen = std::mem::take(&mut self.widen_outputs) && self.dialect == Dialect::MySql;
        let items = (|| {
            for (i, e) in q.items.iter().enumerate() {
                if i > 0 {
                    self.push(", ");
                }
                if widen {
                    let (ty, piece) = self.capture(|w| w.expr(e, Use::Other))?;
                    let wide_column =
                        matches!(e, E::Col(c) if !matches!(c.limit, Limit::IntBits(b) if b < 64));
                    if ty == Ty::Int && !wide_column {
                        // Not AS SIGNED: MariaDB keeps a SMALLINT's narrow type through that
                        // cast (d.b NOT IN (SELECT CAST(g.s AS SIGNED) …) was TRUE for ±2⁶³−1
                        // beside a NULL; found by the difftest's SMALLINT column).
                        self.push("CAST(");
                        self.emit(&piece);
                        self.push(" AS DECIMAL(65, 0))");
                    } else if ty == Ty::Dec {
                        // Likewise for a decimal beyond the column's precision (found by the
                        // review); every portable decimal fits, exactly.
                        self.push("CAST(");
                        self.emit(&piece);
                        self.push(" AS DECIMAL(65, 30))");
                    } else {
                        self.emit(&piece);
                    }
                    types.push(ty);
                } else {
                    types.push(self.expr(e, Use::Other)?);
                }
            }
            Ok::<(), Rejection>(())
        })();
        self.filter = outer;
        items?;
        let row = self.row_bytes(q, &types);
        if row > MAX_ROW_BYTES {
            return Err(Rejection::limit(format!(
                "{} returns rows of up to {row} bytes ({}) from its {} outputs (a TEXT column counts {}, bytes {}, VARCHAR(n) 4n bytes, || and REPLACE their bound up to {}, the parameters {} together); at most {MAX_ROW_BYTES} bytes ({}) a row are accepted (PostgreSQL fails a row over 1 GB where the others return it, and every organization holds a row several times while it reads it)",
                select_name(level + 1),
                human_bytes(row),
                q.items.len(),
                human_bytes(MAX_STORED_TEXT),
                human_bytes(MAX_BOUND_BYTES as u64),
                human_bytes(MAX_TEXT_EXPR),
                human_bytes(MAX_BOUND_BYTES as u64),
                human_bytes(MAX_ROW_BYTES),
            )));
        }
        self.aggregates = false;
        for (i, f) in q.from.iter().enumerate() {
            let table = format!("{} AS {}", quote(&f.occ.table), quote(f.occ.qualifier()));
            match (i, f.join) {
                (0, _) => self.push(&format!(" FROM {table}")),
                (_, JoinKind::Cross) => self.push(&format!(" CROSS JOIN {table}")),
                (_, JoinKind::Inner) => self.push(&format!(" JOIN {table}")),
                (_, JoinKind::Left) => self.push(&format!(" LEFT JOIN {table}")),
            }
            if let Some(on) = &f.on {
                self.push(" ON ");
                self.filter(on, "ON")?;
            }
        }
        if let Some(w) = &q.selection {
            self.push(" WHERE ");
            self.filter(w, "WHERE")?;
        }
        // What MariaDB may sort: the GROUP BY keys, the ORDER BY keys and, under DISTINCT,
        // the outputs (each level of a statement sorts on its own).
        let mut sort_bytes: u64 = if q.distinct {
            q.items
                .iter()
                .zip(&types)
                .map(|(e, t)| sort_key_bytes(e, *t))
                .sum()
        } else {
            0
        };
        if !q.group_by.is_empty() {
            self.push(" GROUP BY ");
            for (i, g) in q.group_by.iter().enumerate() {
                if i > 0 {
                    self.push(", ");
                }
                let t = self.expr(g, Use::Other)?;
                sort_bytes += sort_key_bytes(g, t);
            }
        }
        if let Some(h) = &q.having {
            self.aggregates = true;
            self.push(" HAVING ");
            self.filter(h, "HAVING")?;
        }
        if !q.order_by.is_empty() {
            self.aggregates = true;
            self.push(" ORDER BY ");
            // Sort keys after HAVING, as the outputs: computed for the groups kept only.
            let lazy = q.having.is_some();
            for (i, o) in q.order_by.iter().enumerate() {
                if i > 0 {
                    self.push(", ");
                }
                let (key, t) = self.lazily_if(lazy, |w| w.order_item(q, o))?;
                sort_bytes += sort_key_bytes(key, t);
            }
        }
        self.aggregates = false;
        if sort_bytes > MAX_SORT_KEY_BYTES {
            return Err(Rejection::limit(format!(
                "{} sorts on keys of up to {sort_bytes} bytes a row (GROUP BY, ORDER BY{}; a TEXT key counts 1024 bytes, VARCHAR(n) 4n up to 1024); at most {MAX_SORT_KEY_BYTES} are accepted (MariaDB runs out of sort memory where the others sort)",
                select_name(level + 1),
                if q.distinct {
                    " and DISTINCT outputs"
                } else {
                    ""
                }
            )));
        }
        let cap = row_cap.map(|c| c.saturating_add(1));
        match (&q.limit, cap) {
            (None, None) => {}
            (None, Some(c)) => self.push(&format!(" LIMIT {c}")),
            (Some(l), cap) => {
                self.push(" LIMIT ");
                self.count(l, "LIMIT", cap)?;
            }
        }
        if let Some(o) = &q.offset {
            if q.limit.is_none() && cap.is_none() {
                return Err(Rejection::unsupported(
                    "OFFSET without LIMIT is not portable",
                ));
            }
            self.push(" OFFSET ");
            self.count(o, "OFFSET", None)?;
        }
        Ok(types)
    }

    /// A LIMIT or OFFSET: a non-negative integer literal or parameter (at most `cap`).
    fn count(&mut self, e: &E, what: &str, cap: Option<u64>) -> Result<(), Rejection> {
        match e {
            E::Lit(Value::Int(n)) if *n >= 0 => {
                let n = cap.map_or(*n, |c| (*n).min(i64::try_from(c).unwrap_or(i64::MAX)));
                self.push(&n.to_string());
                Ok(())
            }
            E::Param(i) if self.sig.get(*i) == Some(&Ty::Int) => {
                self.checks.push(match cap {
                    Some(c) => ValueCheck::AtMost(*i, c),
                    None => ValueCheck::NonNegative(*i),
                });
                self.param(*i);
                Ok(())
            }
            _ => Err(Rejection::wrong_type(format!(
                "{what} must be a non-negative integer literal or an integer parameter"
            ))),
        }
    }

    /// Renders one ORDER BY item; gives its key and the key's type.
    fn order_item<'q>(&mut self, q: &'q Q, o: &'q OrderItem) -> Result<(&'q E, Ty), Rejection> {
        let dir = if o.desc { " DESC" } else { " ASC" };
        // chainify's order: NULL is the smallest value (MySQL's and SQLite's default).
        let nulls_first = o.nulls_first.unwrap_or(!o.desc);
        let key = match &o.key {
            OrderKey::Output(i) => &q.items[i - 1],
            OrderKey::Expr(e) => e,
        };
        // A sort key may be evaluated for rows another engine never sorts (a top-N plan).
        let outer = self.filter;
        self.filter = true;
        let captured = self.capture(|w| w.expr(key, Use::Other));
        self.filter = outer;
        let (ty, piece) = captured?;
        if ty == Ty::Null {
            return Err(Rejection::unsupported("ORDER BY NULL is not portable"));
        }
        // MariaDB sorts on the first max_sort_length (1024) bytes only, and raising it runs out
        // of sort memory: text keys must be short enough, bytes are not sorted.
        let short_text = matches!(key, E::Col(c) if matches!(c.limit, Limit::Chars(n) if n <= 256));
        if ty == Ty::Bytes || (ty == Ty::Text && !short_text) {
            return Err(Rejection::nondeterministic(format!(
                "ORDER BY a {} value is not portable (MariaDB sorts on its first 1024 bytes only); sort by a VARCHAR(n) column with n ≤ 256",
                ty.name()
            )));
        }
        let own = match &o.key {
            OrderKey::Output(i) => Piece {
                sql: i.to_string(),
                binds: Vec::new(),
            },
            OrderKey::Expr(_) => Piece {
                sql: piece.sql.clone(),
                binds: piece.binds.clone(),
            },
        };
        match self.dialect {
            Dialect::Postgres | Dialect::Sqlite => {
                self.emit(&own);
                self.push(dir);
                self.push(if nulls_first {
                    " NULLS FIRST"
                } else {
                    " NULLS LAST"
                });
            }
            Dialect::MySql => {
                if nulls_first == o.desc {
                    // Not MySQL's default: sort on IS NULL first.
                    self.push("(");
                    self.emit(&piece);
                    self.push(" IS NULL)");
                    self.push(if nulls_first { " DESC, " } else { " ASC, " });
                }
                self.emit(&own);
                self.push(dir);
            }
        }
        Ok((key, ty))
    }

    /// A parameter. A NULL one is written as the literal NULL (typed like one, which the
    /// engines resolve from context alike; PostgreSQL cannot type a NULL parameter that no
    /// context types). PostgreSQL and SQLite number the bound ones densely in their order, so
    /// a parameter the statement does not use is not bound at all.
    fn param(&mut self, i: usize) {
        if self.sig.get(i) == Some(&Ty::Null) {
            self.sql.push_str("NULL");
            return;
        }
        let mut number = || match self.numbers.iter().position(|p| *p == i) {
            Some(n) => n + 1,
            None => {
                self.numbers.push(i);
                self.numbers.len()
            }
        };
        match self.dialect {
            Dialect::Postgres => {
                let n = number();
                let _ = write!(self.sql, "${n}");
            }
            Dialect::Sqlite => {
                let n = number();
                let _ = write!(self.sql, "?{n}");
            }
            Dialect::MySql => {
                self.sql.push('?');
                self.bind_order.push(i);
            }
        }
    }

    fn literal(&mut self, v: &Value) -> Ty {
        let text = match v {
            Value::Null => "NULL".to_owned(),
            Value::Int(i64::MIN) => "(-9223372036854775807 - 1)".to_owned(),
            Value::Int(i) if *i < 0 => format!("({i})"),
            Value::Int(i) => i.to_string(),
            Value::Decimal(d) if d.mantissa() < 0 => format!("({d})"),
            Value::Decimal(d) => d.to_string(),
            Value::Text(s) => format!("'{}'", s.replace('\'', "''")),
            Value::Bool(b) => match (self.dialect, b) {
                (Dialect::Sqlite, true) => "1".to_owned(),
                (Dialect::Sqlite, false) => "0".to_owned(),
                (_, true) => "TRUE".to_owned(),
                (_, false) => "FALSE".to_owned(),
            },
            Value::Bytes(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                match self.dialect {
                    // X'…' is a bit string in PostgreSQL.
                    Dialect::Postgres => format!("CAST('\\x{hex}' AS BYTEA)"),
                    _ => format!("X'{hex}'"),
                }
            }
        };
        self.sql.push_str(&text);
        Ty::of_value(v)
    }

    fn expr(&mut self, e: &E, use_: Use) -> Result<Ty, Rejection> {
        let ty = self.expr_inner(e, use_)?;
        // Some spellings repeat a piece (SQLite's overflow check, REPLACE's NULL guard): stop as
        // soon as the text outgrows the bound, before nesting multiplies it.
        if self.sql.len() > MAX_RENDERED_LEN {
            return Err(Rejection::limit(format!(
                "the statement renders to more than {MAX_RENDERED_LEN} bytes on {:?}; nest less",
                self.dialect
            )));
        }
        if ty == Ty::Null && !matches!(e, E::Lit(_) | E::Param(_)) {
            // PostgreSQL types such an expression as text (COALESCE(NULL, NULL) is text), which
            // then fails where another type is expected; the others take any NULL.
            return Err(Rejection::wrong_type(
                "an expression that is always NULL (COALESCE, CASE or NULLIF of NULLs) is not portable; write NULL",
            ));
        }
        Ok(ty)
    }

    fn expr_inner(&mut self, e: &E, use_: Use) -> Result<Ty, Rejection> {
        match e {
            E::Col(c) => {
                let _ = write!(self.sql, "{}.{}", quote(&c.qualifier), quote(&c.column));
                Ok(c.ty)
            }
            E::Param(i) => {
                let ty = *self.sig.get(*i).ok_or_else(|| {
                    Rejection::parameter(format!(
                        "uses ${} but {} parameters were given",
                        i + 1,
                        self.sig.len()
                    ))
                })?;
                self.param(*i);
                Ok(ty)
            }
            E::Lit(v) => {
                if let Value::Decimal(d) = v {
                    sqlite_exact(d).map_err(|why| {
                        Rejection::nondeterministic(format!("the literal {d} {why}"))
                    })?;
                }
                Ok(self.literal(v))
            }
            E::Arith(..) | E::Neg(_) => {
                let (ty, piece) = self.capture(|w| w.arith(e, use_))?;
                if ty == Ty::Int {
                    self.no_overflow_in_filter(e)?;
                }
                if ty == Ty::Int && self.dialect == Dialect::Sqlite {
                    // SQLite turns an overflowing integer result into a floating-point number
                    // where the others fail: fail here too (json() of a non-JSON text raises).
                    self.push("(");
                    self.emit(&piece);
                    self.push(" + json(CASE WHEN typeof(");
                    self.emit(&piece);
                    self.push(") = 'real' THEN 'integer overflow' ELSE '0' END))");
                } else {
                    self.emit(&piece);
                }
                Ok(ty)
            }
            E::Not(x) => {
                self.push("(NOT ");
                let ty = self.expr(x, Use::Other)?;
                self.push(")");
                bool_operand(ty, "NOT")?;
                Ok(Ty::Bool)
            }
            E::And(a, b) | E::Or(a, b) => {
                let op = if matches!(e, E::And(..)) { "AND" } else { "OR" };
                // Engines short-circuit AND and OR differently (SQLite evaluates both sides):
                // nothing under them may fail on some rows only.
                let outer = self.filter;
                self.filter = true;
                self.push("(");
                let ta = self.expr(a, Use::Other);
                let _ = write!(self.sql, " {op} ");
                let tb = self.expr(b, Use::Other);
                self.push(")");
                self.filter = outer;
                let (ta, tb) = (ta?, tb?);
                bool_operand(ta, op)?;
                bool_operand(tb, op)?;
                Ok(Ty::Bool)
            }
            E::Cmp(op, a, b) => {
                let skip_a = self.skippable(a, b).0 || self.null_const(b);
                let (ta, pa) = self.lazily_if(skip_a, |s| s.capture(|w| w.expr(a, Use::Other)))?;
                let (tb, pb) = self.lazily(|s| s.capture(|w| w.expr(b, Use::Other)))?;
                comparable(ta, tb, op.sql())?;
                // MariaDB's optimizer rounds a decimal compared with an integer key when it
                // turns the comparison into a key lookup (`e.k = d.k AND e.k = 2.675` matched
                // e.k = 3 under a LEFT JOIN; found by the difftest): compare as decimals there.
                let widen = self.dialect == Dialect::MySql
                    && matches!((ta, tb), (Ty::Int, Ty::Dec) | (Ty::Dec, Ty::Int));
                // Likewise between decimal columns of different scales: MariaDB carried
                // `g2.r = 1.0004` over `g1.k = g2.r` to `g1.k = 1.0004` and looked the
                // DECIMAL(5,3) key g1.k up by 1.000 (found by the difftest's third table).
                let exact = self.dialect == Dialect::MySql && scales_differ([&**a, &**b]);
                self.push("(");
                for (i, (t, e, piece)) in [(ta, a, &pa), (tb, b, &pb)].into_iter().enumerate() {
                    if i == 1 {
                        let _ = write!(self.sql, " {} ", op.sql());
                    }
                    self.emit_compared(widen, exact, t, e, piece);
                }
                self.push(")");
                Ok(Ty::Bool)
            }
            E::Concat(a, b) => {
                self.push("(");
                let skip_a = self.skippable(a, b).0 || self.null_const(b);
                let ta = self.lazily_if(skip_a, |w| w.expr(a, Use::Other))?;
                self.push(" || ");
                // MariaDB's CONCAT stops at the first NULL argument.
                let tb = self.lazily(|w| w.expr(b, Use::Other))?;
                self.push(")");
                for t in [ta, tb] {
                    if !matches!(t, Ty::Text | Ty::Null) {
                        return Err(Rejection::wrong_type(format!(
                            "|| joins text, not {} (engines convert other types differently)",
                            t.name()
                        )));
                    }
                }
                let n = self.text_bound(e, MAX_STORED_TEXT);
                text_growth(n, "||")?;
                Ok(Ty::Text)
            }
            E::IsNull(x, negated) => {
                self.push("(");
                self.expr(x, Use::Other)?;
                self.push(if *negated {
                    " IS NOT NULL)"
                } else {
                    " IS NULL)"
                });
                Ok(Ty::Bool)
            }
            E::Between { e, lo, hi, negated } => {
                self.push("(");
                let folded = self.null_const(lo) || self.null_const(hi);
                let t = self.lazily_if(folded, |w| w.expr(e, Use::Other))?;
                self.push(if *negated {
                    " NOT BETWEEN "
                } else {
                    " BETWEEN "
                });
                let tl = self.lazily(|w| w.expr(lo, Use::Other))?;
                self.push(" AND ");
                let th = self.lazily(|w| w.expr(hi, Use::Other))?;
                self.push(")");
                comparable(t, tl, "BETWEEN")?;
                comparable(t, th, "BETWEEN")?;
                Ok(Ty::Bool)
            }
            E::InList { e, list, negated } => {
                self.push("(");
                // SQLite also reads `x IN (c)` as `x = c`, and may skip `x` beside a NULL `c`.
                let folded = list.iter().any(|x| self.null_const(x))
                    || (list.len() == 1 && self.skippable(e, &list[0]).0);
                let left = self.lazily_if(folded, |s| s.capture(|w| w.expr(e, Use::Other)))?;
                let mut items = Vec::with_capacity(list.len());
                for x in list {
                    let item = self.lazily(|s| s.capture(|w| w.expr(x, Use::Other)))?;
                    comparable(left.0, item.0, "IN")?;
                    items.push(item);
                }
                // As for `=`: MariaDB rounds a decimal it looks an integer key up by (a single
                // item is read as `=`), so integers meet decimals as decimals there.
                let widen = self.dialect == Dialect::MySql
                    && std::iter::once(&left)
                        .chain(&items)
                        .any(|(t, _)| *t == Ty::Int)
                    && std::iter::once(&left)
                        .chain(&items)
                        .any(|(t, _)| *t == Ty::Dec);
                let exact = self.dialect == Dialect::MySql
                    && scales_differ(std::iter::once(&**e).chain(list.iter()));
                self.emit_compared(widen, exact, left.0, e, &left.1);
                self.push(if *negated { " NOT IN (" } else { " IN (" });
                for (i, ((t, piece), x)) in items.iter().zip(list).enumerate() {
                    if i > 0 {
                        self.push(", ");
                    }
                    self.emit_compared(widen, exact, *t, x, piece);
                }
                self.push("))");
                Ok(Ty::Bool)
            }
            E::InQuery { e, q, negated } => {
                if q.limit.is_some() {
                    return Err(Rejection::unsupported(
                        "LIMIT inside IN (subquery) is not supported by MySQL/MariaDB",
                    ));
                }
                self.push("(");
                // PostgreSQL compares the left side with each row of the subquery, so it never
                // evaluates it when the subquery is empty; the others do (found by the
                // difftest).
                let t = self.lazily(|w| w.expr(e, Use::Other))?;
                self.push(if *negated { " NOT IN (" } else { " IN (" });
                // MariaDB turns it into EXISTS with the comparison pushed down and stops at
                // the first match; the others compute every row of the subquery.
                // MariaDB decides that a value out of the range of the subquery column's type
                // matches nothing (FALSE) even when the subquery yields NULL (then NULL): compare
                // 64-bit integers there.
                self.widen_outputs = true;
                let types = self.lazily(|w| w.query(q, None))?;
                self.push("))");
                let [tq] = types.as_slice() else {
                    return Err(Rejection::wrong_type(format!(
                        "IN (subquery) needs one column, not {}",
                        types.len()
                    )));
                };
                if *tq == Ty::Null {
                    // PostgreSQL types the subquery's NULL as text and fails on the comparison.
                    return Err(Rejection::wrong_type(
                        "IN (SELECT NULL …) is never true; write the condition without it (a NULL parameter counts too)",
                    ));
                }
                comparable(t, *tq, "IN")?;
                Ok(Ty::Bool)
            }
            E::Exists { q, negated } => {
                self.push(if *negated {
                    "(NOT EXISTS ("
                } else {
                    "(EXISTS ("
                });
                // PostgreSQL computes the outputs of an aggregating subquery under EXISTS,
                // MariaDB and SQLite never do (found by the review).
                self.lazily(|w| w.query(q, None))?;
                self.push("))");
                Ok(Ty::Bool)
            }
            E::Scalar(q) => {
                if !at_most_one_row(q, self.level) {
                    return Err(Rejection::nondeterministic(
                        "a scalar subquery must return at most one row: select by the whole primary key, an aggregate, or LIMIT 1 (SQLite takes the first row where the others fail)",
                    ));
                }
                self.push("(");
                let types = self.query(q, None)?;
                self.push(")");
                match types.as_slice() {
                    [t] => Ok(*t),
                    _ => Err(Rejection::wrong_type(format!(
                        "a scalar subquery needs one column, not {}",
                        types.len()
                    ))),
                }
            }
            E::Case {
                operand,
                whens,
                otherwise,
            } => {
                self.push("(CASE");
                let top = match operand {
                    Some(o) => {
                        self.push(" ");
                        let t = self.expr(o, Use::Other)?;
                        if t == Ty::Null {
                            // PostgreSQL types the NULL as text and fails on other WHEN values.
                            return Err(Rejection::wrong_type(
                                "CASE NULL WHEN … always takes the ELSE branch; write that value (a NULL parameter counts too)",
                            ));
                        }
                        Some(t)
                    }
                    None => None,
                };
                let mut result = Ty::Null;
                let unify = |t: Ty, result: &mut Ty| -> Result<(), Rejection> {
                    *result = result.unify(t).ok_or_else(|| {
                        Rejection::wrong_type(format!(
                            "CASE mixes {} and {} results",
                            result.name(),
                            t.name()
                        ))
                    })?;
                    Ok(())
                };
                for (w, t) in whens {
                    self.push(" WHEN ");
                    match top {
                        Some(tt) => {
                            // MariaDB skips every WHEN value when the operand is NULL.
                            let tw = self.lazily(|s| s.expr(w, Use::Other))?;
                            if tw == Ty::Null {
                                // It never matches, and PostgreSQL and MariaDB fold the test
                                // away without evaluating the operand while SQLite evaluates
                                // it (an overflow there fails on one engine only).
                                return Err(Rejection::nondeterministic(
                                    "CASE … WHEN NULL never matches; test the value with IS NULL in a searched CASE (a NULL parameter counts too)",
                                ));
                            }
                            comparable(tt, tw, "CASE … WHEN")?;
                        }
                        None => self.condition(w, "CASE WHEN")?,
                    }
                    self.push(" THEN ");
                    let tt = self.expr(t, use_)?;
                    unify(tt, &mut result)?;
                }
                if let Some(o) = otherwise {
                    self.push(" ELSE ");
                    let to = self.expr(o, use_)?;
                    unify(to, &mut result)?;
                }
                self.push(" END)");
                Ok(result)
            }
            E::Func(f, args) => self.function(*f, args),
            E::Agg(a, arg) => {
                if !self.aggregates {
                    return Err(Rejection::unsupported(
                        "aggregates are only allowed in a query's outputs, HAVING and ORDER BY",
                    ));
                }
                // An aggregate's argument is a row-level expression.
                self.aggregates = false;
                let r = self.aggregate(*a, arg.as_deref());
                self.aggregates = true;
                r
            }
            E::Like {
                e,
                pattern,
                negated,
            } => {
                self.push("(");
                let folded = self.null_const(pattern);
                // MariaDB answers LIKE on an indexed column from an index range that ends at
                // U+FFFF: a key with a supplementary character (an emoji) right after the
                // pattern's prefix is missed (a hunt found 3 rows deleted where the others
                // deleted 4). An expression is never looked up in an index.
                let mysql = self.dialect == Dialect::MySql;
                if mysql {
                    self.push("CONCAT(");
                }
                let t = self.lazily_if(folded, |w| w.expr(e, Use::Other))?;
                if mysql {
                    self.push(", '')");
                }
                self.push(if *negated { " NOT LIKE " } else { " LIKE " });
                // An engine may compare every byte of the text with every byte of the pattern,
                // and SQLite refuses patterns over 50 000 bytes that the others take.
                // The statement's LIKEs share one budget: a thousand of them OR-ed on one row took
                // half a minute (found by the review).
                let subject = self.text_bound(e, MAX_STORED_TEXT).max(1);
                let max_pattern = (self.like_budget / subject).min(MAX_LIKE_PATTERN);
                let tp = match pattern.as_ref() {
                    E::Lit(Value::Text(p)) => {
                        if !like_pattern_ok(p) {
                            return Err(Rejection::unsupported(format!(
                                "LIKE pattern '{p}': \\ may only escape %, _ or \\"
                            )));
                        }
                        if p.len() as u64 > max_pattern {
                            return Err(Rejection::limit(format!(
                                "a LIKE pattern of {} bytes on text of up to {subject} bytes; at most {max_pattern} (an engine may compare every byte of the one with every byte of the other, and a statement's LIKEs share {MAX_LIKE_WORK} such comparisons a row)",
                                p.len()
                            )));
                        }
                        self.like_budget -= subject * p.len() as u64;
                        self.expr(pattern, Use::Other)?
                    }
                    E::Param(i) => {
                        self.checks.push(ValueCheck::LikePattern(*i, max_pattern));
                        self.like_budget -= subject * max_pattern;
                        self.expr(pattern, Use::Other)?
                    }
                    E::Lit(Value::Null) => self.expr(pattern, Use::Other)?,
                    _ => {
                        return Err(Rejection::wrong_type(
                            "a LIKE pattern must be a text literal or a parameter",
                        ));
                    }
                };
                self.push(" ESCAPE '\\')");
                for x in [t, tp] {
                    if !matches!(x, Ty::Text | Ty::Null) {
                        return Err(Rejection::wrong_type(format!(
                            "LIKE matches text, not {}",
                            x.name()
                        )));
                    }
                }
                Ok(Ty::Bool)
            }
        }
    }

    /// In a filter, integer arithmetic over columns must provably stay within 64 bits: an
    /// engine may evaluate it for rows (or conjuncts) another skips, and only some would fail.
    /// Constant parts are evaluated when the transaction is analysed instead.
    fn no_overflow_in_filter(&mut self, e: &E) -> Result<(), Rejection> {
        if !self.filter || is_constant(e) {
            return Ok(());
        }
        let mut checks = Vec::new();
        let bound = int_bound(e, &mut checks);
        if bound > u128::from(i64::MAX.unsigned_abs()) {
            return Err(Rejection::nondeterministic(
                "integer arithmetic that engines evaluate on different rows (in a WHERE, ON or HAVING, COUNT's argument, the left side of IN (SELECT …), a query under EXISTS, an operand some engine skips beside a NULL or a subquery, or outputs under LIMIT or HAVING) may overflow 64 bits; bound it (INTEGER columns, parameters within ±2^31) or compare without arithmetic (e.g. bal >= -$2 instead of bal + $2 >= 0)",
            ));
        }
        self.checks.extend(checks);
        Ok(())
    }

    /// Arithmetic without SQLite's overflow check (applied once, around the outermost integer
    /// operation, by [`Writer::expr`]).
    fn arith(&mut self, e: &E, use_: Use) -> Result<Ty, Rejection> {
        match e {
            E::Neg(x) => {
                // MariaDB types the negation of a parameter as unsigned and then lets
                // arithmetic on it overflow unchecked; a multiplication by -1 is checked.
                self.push(if self.dialect == Dialect::MySql {
                    "(-1 * "
                } else {
                    "(-"
                });
                let t = self.operand(x, use_)?;
                self.push(")");
                if !t.numeric() {
                    return Err(Rejection::wrong_type(format!(
                        "unary - takes a number, not {}",
                        t.name()
                    )));
                }
                Ok(t)
            }
            E::Arith(Arith::Sub, a, b) if self.dialect == Dialect::MySql => {
                // MariaDB returns 0 - (-2^63) as -2^63 instead of failing. When the right side
                // may be -2^63, subtract one more from both sides there: (a + 1) - (b + 1)
                // fails exactly when a - b overflows, and never with a zero on the left.
                let (skip_a, skip_b) = self.skippable(a, b);
                let (ta, pa) = self.lazily_if(skip_a, |s| s.capture(|w| w.operand(a, use_)))?;
                let (tb, pb) = self.lazily_if(skip_b, |s| s.capture(|w| w.operand(b, use_)))?;
                if ta == Ty::Int && tb == Ty::Int && self.may_be_min(b) {
                    self.push("(CASE WHEN ");
                    self.emit(&pb);
                    self.push(" = (-9223372036854775807 - 1) THEN ((");
                    self.emit(&pa);
                    self.push(" + 1) - (");
                    self.emit(&pb);
                    self.push(" + 1)) ELSE (");
                    self.emit(&pa);
                    self.push(" - ");
                    self.emit(&pb);
                    self.push(") END)");
                } else {
                    self.push("(");
                    self.emit(&pa);
                    self.push(" - ");
                    self.emit(&pb);
                    self.push(")");
                }
                self.arith_types(Arith::Sub, a, b, ta, tb, use_)
            }
            E::Arith(op, a, b) => {
                self.push("(");
                let (skip_a, skip_b) = self.skippable(a, b);
                let ta = self.lazily_if(skip_a, |w| w.operand(a, use_))?;
                self.push(match (op, self.dialect) {
                    (Arith::Add, _) => " + ",
                    (Arith::Sub, _) => " - ",
                    (Arith::Mul, _) => " * ",
                    (Arith::Div, Dialect::MySql) => " DIV ",
                    (Arith::Div, _) => " / ",
                    (Arith::Mod, _) => " % ",
                });
                let tb = self.lazily_if(skip_b, |w| w.operand(b, use_))?;
                self.push(")");
                self.arith_types(*op, a, b, ta, tb, use_)
            }
            other => self.expr(other, use_),
        }
    }

    /// Whether integer expression `e` may be -2^63. A bare parameter may not (checked with
    /// its value); one inside an expression counts as anything.
    fn may_be_min(&mut self, e: &E) -> bool {
        if let E::Param(i) = e {
            self.checks.push(ValueCheck::NotMin(*i));
            return false;
        }
        let mut params = Vec::new();
        int_bound(e, &mut params) >= 1 << 63 || !params.is_empty()
    }

    /// Checks the operand types of arithmetic `a op b` (written already).
    #[allow(clippy::too_many_arguments)]
    fn arith_types(
        &mut self,
        op: Arith,
        a: &E,
        b: &E,
        ta: Ty,
        tb: Ty,
        use_: Use,
    ) -> Result<Ty, Rejection> {
        {
            {
                let sym = match op {
                    Arith::Add => "+",
                    Arith::Sub => "-",
                    Arith::Mul => "*",
                    Arith::Div => "/",
                    Arith::Mod => "%",
                };
                for t in [ta, tb] {
                    if !matches!(t, Ty::Int | Ty::Dec | Ty::Null) {
                        return Err(Rejection::wrong_type(format!(
                            "operator {sym} takes numbers, not {}",
                            t.name()
                        )));
                    }
                }
                if ta == Ty::Null || tb == Ty::Null {
                    // MySQL types NULL arithmetic as floating point, and COALESCE or CASE
                    // around it then rounds 64-bit integers.
                    return Err(Rejection::wrong_type(format!(
                        "operator {sym} with a NULL operand is always NULL; write NULL (a NULL parameter counts too)"
                    )));
                }
                if ta == Ty::Dec || tb == Ty::Dec {
                    let why = "SQLite computes DECIMAL arithmetic in floating point";
                    if matches!(op, Arith::Div | Arith::Mod) {
                        return Err(Rejection::nondeterministic(format!(
                            "operator {sym} on DECIMAL values is not portable ({why})"
                        )));
                    }
                    if op == Arith::Mul && ta == Ty::Dec && tb == Ty::Dec {
                        return Err(Rejection::nondeterministic(format!(
                            "DECIMAL * DECIMAL is not portable ({why}); multiply by an integer"
                        )));
                    }
                    if use_ != Use::Stored {
                        return Err(Rejection::nondeterministic(format!(
                            "DECIMAL arithmetic ({sym}) is only portable in a value stored into a column, which rounds it to the column's scale ({why})"
                        )));
                    }
                    // Exact in floating point only within 15 digits: bound every operand.
                    for (operand, t) in [(a, ta), (b, tb)] {
                        match t {
                            Ty::Int => {
                                let mut checks = Vec::new();
                                if int_bound(operand, &mut checks) > 1_000_000_000_000_000 {
                                    return Err(Rejection::nondeterministic(format!(
                                        "an integer operand of DECIMAL arithmetic ({sym}) may exceed 15 digits ({why}); use INTEGER columns or parameters within ±2^31"
                                    )));
                                }
                                self.checks.extend(checks);
                            }
                            _ => {
                                if let E::Col(c) = operand
                                    && matches!(c.limit, Limit::Decimal { precision, .. } if precision > 15)
                                {
                                    return Err(Rejection::nondeterministic(format!(
                                        "DECIMAL arithmetic ({sym}) on column {} of more than 15 digits is not portable ({why})",
                                        c.column
                                    )));
                                }
                            }
                        }
                    }
                    return Ok(Ty::Dec);
                }
                if matches!(op, Arith::Div | Arith::Mod) {
                    match b {
                        E::Lit(Value::Int(n)) if *n > 0 => {}
                        E::Param(i) => self.checks.push(ValueCheck::Positive(*i)),
                        _ => {
                            return Err(Rejection::wrong_type(format!(
                                "the divisor of {sym} must be a positive integer literal or parameter (division by zero fails differently on each engine)"
                            )));
                        }
                    }
                }
                Ok(Ty::Int)
            }
        }
    }

    /// An arithmetic operand: nested arithmetic stays unchecked; PostgreSQL computes integer
    /// columns and literals in 64 bits like the other engines (an INTEGER column is 32-bit
    /// there, and `2147483647 + 1` would fail).
    fn operand(&mut self, x: &E, use_: Use) -> Result<Ty, Rejection> {
        match x {
            // On SQLite every integer operation is checked, not only the outermost: a NULL
            // operand above it (or ABS, a comparison) would hide an overflowed float.
            E::Arith(..) | E::Neg(_) if self.dialect == Dialect::Sqlite => self.expr(x, use_),
            E::Arith(..) | E::Neg(_) => self.arith(x, use_),
            // Parameters bind as 64-bit already.
            E::Param(_) => self.expr(x, use_),
            _ if self.dialect == Dialect::Postgres => {
                // Columns, literals, CASE, COALESCE, LENGTH, … may all be 32-bit there.
                let (ty, piece) = self.capture(|w| w.expr(x, use_))?;
                if ty == Ty::Int {
                    self.push("CAST(");
                    self.emit(&piece);
                    self.push(" AS BIGINT)");
                } else {
                    self.emit(&piece);
                }
                Ok(ty)
            }
            _ => self.expr(x, use_),
        }
    }

    fn function(&mut self, f: Func, args: &[E]) -> Result<Ty, Rejection> {
        match f {
            Func::Abs => {
                self.push("abs(");
                let t = self.operand(&args[0], Use::Other)?;
                self.push(")");
                if !t.numeric() {
                    return Err(Rejection::wrong_type(format!(
                        "ABS takes a number, not {}",
                        t.name()
                    )));
                }
                if t == Ty::Int {
                    self.no_overflow_in_filter(&args[0])?;
                }
                Ok(t)
            }
            Func::Coalesce | Func::Nullif => {
                self.push(if f == Func::Coalesce {
                    "coalesce("
                } else {
                    "nullif("
                });
                let mut result = Ty::Null;
                let mut first = None;
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        self.push(", ");
                    }
                    // COALESCE is lazy alike everywhere; NULLIF's second argument is not
                    // evaluated by MariaDB when the first is NULL.
                    let t = if f == Func::Nullif && i > 0 {
                        self.lazily(|w| w.expr(a, Use::Other))?
                    } else {
                        self.expr(a, Use::Other)?
                    };
                    first.get_or_insert(t);
                    result = result.unify(t).ok_or_else(|| {
                        Rejection::wrong_type(format!(
                            "{} mixes {} and {} arguments",
                            if f == Func::Coalesce {
                                "COALESCE"
                            } else {
                                "NULLIF"
                            },
                            result.name(),
                            t.name()
                        ))
                    })?;
                }
                self.push(")");
                if f == Func::Nullif {
                    return Ok(first.unwrap_or(Ty::Null));
                }
                Ok(result)
            }
            Func::Length => {
                let (t, piece) = self.capture(|w| w.expr(&args[0], Use::Other))?;
                let name = match (t, self.dialect) {
                    (Ty::Text, Dialect::Postgres | Dialect::MySql) => "char_length",
                    (Ty::Bytes, Dialect::Postgres) => "octet_length",
                    (Ty::Text | Ty::Bytes, _) => "length",
                    _ => {
                        return Err(Rejection::wrong_type(format!(
                            "LENGTH takes text or bytes, not {}",
                            t.name()
                        )));
                    }
                };
                self.push(name);
                self.push("(");
                self.emit(&piece);
                self.push(")");
                Ok(Ty::Int)
            }
            Func::Substr => {
                self.push("substr(");
                let t = self.expr(&args[0], Use::Other)?;
                if !matches!(t, Ty::Text | Ty::Null) {
                    return Err(Rejection::wrong_type(format!(
                        "SUBSTR takes text, not {}",
                        t.name()
                    )));
                }
                for (arg, lo, what) in [
                    (
                        args.get(1),
                        1,
                        "start must be an integer literal or parameter from 1",
                    ),
                    (
                        args.get(2),
                        0,
                        "length must be an integer literal or parameter from 0",
                    ),
                ] {
                    let Some(arg) = arg else { continue };
                    self.push(", ");
                    match arg {
                        E::Lit(Value::Int(n)) if (lo..=i64::from(i32::MAX)).contains(n) => {
                            self.expr(arg, Use::Other)?;
                        }
                        E::Param(i) if self.sig.get(*i) == Some(&Ty::Int) => {
                            self.checks
                                .push(ValueCheck::Range(*i, lo, i64::from(i32::MAX)));
                            // PostgreSQL's substr takes 32-bit integers; parameters bind as 64.
                            if self.dialect == Dialect::Postgres {
                                self.push("CAST(");
                                self.param(*i);
                                self.push(" AS INTEGER)");
                            } else {
                                self.param(*i);
                            }
                        }
                        _ => {
                            return Err(Rejection::wrong_type(format!(
                                "SUBSTR's {what} to 2147483647 (engines disagree on 0, negative and larger values)"
                            )));
                        }
                    }
                }
                self.push(")");
                Ok(Ty::Text)
            }
            Func::Replace if self.dialect != Dialect::Postgres => {
                // MariaDB returns the text unchanged when the pattern is absent, and SQLite when
                // it is empty, even with a NULL replacement; PostgreSQL returns NULL. The engines
                // agree on a NULL text or pattern, so only the replacement needs the guard.
                let mut pieces = Vec::new();
                for a in args {
                    // MariaDB stops at the first NULL argument, and the guard evaluates the
                    // others only when the replacement is not NULL.
                    let (t, p) = self.lazily(|s| s.capture(|w| w.expr(a, Use::Other)))?;
                    if !matches!(t, Ty::Text | Ty::Null) {
                        return Err(Rejection::wrong_type(format!(
                            "REPLACE takes text, not {}",
                            t.name()
                        )));
                    }
                    pieces.push(p);
                }
                self.push("(CASE WHEN ");
                self.emit(&pieces[2]);
                self.push(" IS NULL THEN NULL ELSE replace(");
                for (i, p) in pieces.iter().enumerate() {
                    if i > 0 {
                        self.push(", ");
                    }
                    self.emit(p);
                }
                self.push(") END)");
                let n = self.replace_bound_checked(args);
                text_growth(n, "REPLACE")?;
                self.replace_subject(args)?;
                Ok(Ty::Text)
            }
            Func::Trim | Func::Ltrim | Func::Rtrim | Func::Replace => {
                self.push(match f {
                    Func::Trim => "trim(",
                    Func::Ltrim => "ltrim(",
                    Func::Rtrim => "rtrim(",
                    _ => "replace(",
                });
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        self.push(", ");
                    }
                    // REPLACE's arguments are lazy on MariaDB (see above): the same rule here.
                    let t = if f == Func::Replace {
                        self.lazily(|w| w.expr(a, Use::Other))?
                    } else {
                        self.expr(a, Use::Other)?
                    };
                    if !matches!(t, Ty::Text | Ty::Null) {
                        return Err(Rejection::wrong_type(
                            format!("{f:?} takes text, not {}", t.name()).to_uppercase(),
                        ));
                    }
                }
                self.push(")");
                if f == Func::Replace {
                    let n = self.replace_bound_checked(args);
                    text_growth(n, "REPLACE")?;
                    self.replace_subject(args)?;
                }
                Ok(Ty::Text)
            }
        }
    }

    fn aggregate(&mut self, a: Agg, arg: Option<&E>) -> Result<Ty, Rejection> {
        match (a, arg) {
            (Agg::CountStar, _) => {
                self.push("count(*)");
                Ok(Ty::Int)
            }
            (Agg::Count { distinct }, Some(x)) => {
                self.push(if distinct {
                    "count(DISTINCT "
                } else {
                    "count("
                });
                // MariaDB only asks COUNT's argument whether it is NULL, and an overflow there
                // raises nothing; the others fail (found by the difftest).
                self.lazily(|w| w.expr(x, Use::Other))?;
                self.push(")");
                Ok(Ty::Int)
            }
            (Agg::Min | Agg::Max, Some(x)) => {
                self.push(if a == Agg::Min { "min(" } else { "max(" });
                let t = self.expr(x, Use::Other)?;
                self.push(")");
                if matches!(t, Ty::Bool | Ty::Null | Ty::Bytes) {
                    return Err(Rejection::wrong_type(format!(
                        "MIN/MAX of {} is not portable (PostgreSQL has none)",
                        t.name()
                    )));
                }
                Ok(t)
            }
            _ => Err(Rejection::internal("an aggregate is missing its argument")),
        }
    }
}

fn bool_operand(t: Ty, op: &str) -> Result<(), Rejection> {
    if matches!(t, Ty::Bool | Ty::Null) {
        Ok(())
    } else {
        Err(Rejection::wrong_type(format!(
            "{op} takes booleans, not {} (engines read numbers as truth values differently)",
            t.name()
        )))
    }
}

fn comparable(a: Ty, b: Ty, op: &str) -> Result<(), Rejection> {
    if a.comparable(b) {
        Ok(())
    } else {
        Err(Rejection::wrong_type(format!(
            "{op} compares {} with {}; engines convert between them differently",
            a.name(),
            b.name()
        )))
    }
}

/// Whether a value of type `ty` may be stored into `column` of type `cty` alike everywhere.
fn assignable(table: &str, column: &str, cty: Ty, ty: Ty) -> Result<(), Rejection> {
    let ok = ty == Ty::Null || cty == ty || (cty == Ty::Dec && ty == Ty::Int);
    if ok {
        Ok(())
    } else {
        let why = if cty == Ty::Int && ty == Ty::Dec {
            " (engines round or refuse the fraction differently)"
        } else {
            " (engines convert between them differently)"
        };
        Err(Rejection::wrong_type(format!(
            "column {column} of table {table} is {}; a {} value cannot be stored portably{why}",
            cty.name(),
            ty.name()
        )))
    }
}

/// What a CASE, COALESCE or NULLIF may yield (NULLIF: its first argument, counted with the
/// rest for simplicity); `None` for any other expression.
fn branches(e: &E) -> Option<Vec<&E>> {
    match e {
        E::Func(Func::Coalesce | Func::Nullif, args) => Some(args.iter().collect()),
        E::Case {
            whens, otherwise, ..
        } => Some(
            whens
                .iter()
                .map(|(_, t)| t)
                .chain(otherwise.as_deref())
                .collect(),
        ),
        _ => None,
    }
}

/// The most characters a text expression can hold, when that is known without parameter
/// values: literals, VARCHAR columns, and what concatenation, SUBSTR, TRIM, COALESCE, NULLIF,
/// CASE, MIN, MAX and single-output subqueries make of them.
fn char_bound(e: &E) -> Option<u64> {
    if let Some(yields) = branches(e) {
        return yields
            .into_iter()
            .map(char_bound)
            .try_fold(0, |m, b| b.map(|b| m.max(b)));
    }
    match e {
        E::Lit(Value::Text(t)) => Some(t.chars().count() as u64),
        E::Lit(_) => Some(0),
        E::Col(c) => match c.limit {
            Limit::Chars(n) => Some(u64::from(n)),
            _ => None,
        },
        E::Concat(a, b) => Some(char_bound(a)?.saturating_add(char_bound(b)?)),
        E::Func(Func::Substr, args) => {
            let whole = char_bound(args.first()?);
            match args.get(2) {
                Some(E::Lit(Value::Int(l))) => {
                    let l = u64::try_from(*l).unwrap_or(0);
                    Some(whole.map_or(l, |w| w.min(l)))
                }
                _ => whole,
            }
        }
        E::Func(Func::Trim | Func::Ltrim | Func::Rtrim, args) => char_bound(args.first()?),
        E::Scalar(q) => match q.items.as_slice() {
            [item] => char_bound(item),
            _ => None,
        },
        E::Agg(Agg::Min | Agg::Max, Some(x)) => char_bound(x),
        _ => None,
    }
}

/// Whether an expression is a constant: no column, subquery or aggregate (parameters are
/// constants: PostgreSQL folds them into custom plans, and folding them here refuses at least
/// what either kind of plan would fail on).
fn is_constant(e: &E) -> bool {
    let mut constant = true;
    let _ = walk_own(e, &mut |x| {
        if matches!(
            x,
            E::Col(_) | E::Scalar(_) | E::Exists { .. } | E::InQuery { .. } | E::Agg(..)
        ) {
            constant = false;
        }
        Ok(true)
    });
    constant
}

/// The largest magnitude an integer expression can take (parameters in it must be small:
/// their [`ValueCheck::Small`] checks are added to `checks`).
fn int_bound(e: &E, checks: &mut Vec<ValueCheck>) -> u128 {
    const ANY: u128 = 1 << 63;
    match e {
        E::Lit(Value::Int(v)) => u128::from(v.unsigned_abs()),
        E::Lit(_) => 0,
        E::Param(i) => {
            checks.push(ValueCheck::Small(*i));
            u128::from(SMALL)
        }
        E::Col(c) => match c.limit {
            Limit::IntBits(b) if b < 64 => 1 << (b - 1),
            _ => ANY,
        },
        E::Neg(x) => int_bound(x, checks),
        E::Arith(op, a, b) => {
            let (x, y) = (int_bound(a, checks), int_bound(b, checks));
            match op {
                Arith::Add | Arith::Sub => x.saturating_add(y),
                Arith::Mul => x.saturating_mul(y),
                Arith::Div => x,
                Arith::Mod => x.min(y),
            }
        }
        E::Func(Func::Length, _) => 1 << 31,
        E::Func(Func::Abs | Func::Coalesce | Func::Nullif, args) => {
            args.iter().map(|a| int_bound(a, checks)).max().unwrap_or(0)
        }
        E::Case {
            whens, otherwise, ..
        } => whens
            .iter()
            .map(|(_, t)| t)
            .chain(otherwise.as_deref())
            .map(|t| int_bound(t, checks))
            .max()
            .unwrap_or(0),
        E::Agg(Agg::Min | Agg::Max, Some(x)) => int_bound(x, checks),
        E::Scalar(q) => match q.items.as_slice() {
            [E::Col(_) | E::Agg(Agg::Min | Agg::Max, _)] => int_bound(&q.items[0], checks),
            _ => ANY,
        },
        _ => ANY,
    }
}

/// The declared scale of a DECIMAL column.
fn decimal_scale(e: &E) -> Option<u8> {
    match e {
        E::Col(c) => match c.limit {
            Limit::Decimal { scale, .. } => Some(scale),
            _ => None,
        },
        _ => None,
    }
}

/// Whether two of these operands are DECIMAL columns of different scales.
fn scales_differ<'a>(operands: impl IntoIterator<Item = &'a E>) -> bool {
    let mut scales = operands.into_iter().filter_map(decimal_scale);
    let Some(first) = scales.next() else {
        return false;
    };
    scales.any(|s| s != first)
}

/// Whether `e` holds a subquery (scalar, EXISTS or IN) of its own.
fn has_subquery(e: &E) -> bool {
    let mut found = false;
    let _ = walk_own(e, &mut |x| {
        found |= matches!(x, E::Scalar(_) | E::Exists { .. } | E::InQuery { .. });
        Ok(!found)
    });
    found
}

/// Whether `e` may be NULL on some row, given the parameters' types (a NULL parameter is typed
/// [`Ty::Null`]): only literals, non-NULL parameters, NOT NULL columns and arithmetic of those
/// are known not to be.
fn may_be_null(e: &E, sig: &[Ty]) -> bool {
    match e {
        E::Lit(v) => matches!(v, Value::Null),
        E::Param(i) => sig.get(*i).is_none_or(|t| *t == Ty::Null),
        E::Col(c) => !c.not_null,
        E::Neg(x) => may_be_null(x, sig),
        E::Func(Func::Abs, args) => args.iter().any(|a| may_be_null(a, sig)),
        E::Arith(_, a, b) | E::Concat(a, b) => may_be_null(a, sig) || may_be_null(b, sig),
        _ => true,
    }
}

/// An operator node (something that computes, and so may fail).
fn is_operator(e: &E) -> bool {
    matches!(
        e,
        E::Neg(_) | E::Arith(..) | E::Concat(..) | E::Func(Func::Abs | Func::Replace, _)
    )
}

/// A comparison (strict in PostgreSQL: a constant operand that folds to NULL folds it whole),
/// a simple CASE among them (its operand compared with each WHEN).
fn is_comparison(e: &E) -> bool {
    matches!(
        e,
        E::Cmp(..)
            | E::Between { .. }
            | E::InList { .. }
            | E::Like { .. }
            | E::Case {
                operand: Some(_),
                ..
            }
    )
}

/// Visits every expression of the statement, subqueries included.
fn walk_statement(s: &Stmt, f: &mut dyn FnMut(&E)) {
    match s {
        Stmt::Select(q) => walk_query(q, f),
        Stmt::Insert { source, .. } => match source {
            Source::Values(rows) => rows.iter().flatten().for_each(|e| walk_deep(e, f)),
            Source::Query(q) => walk_query(q, f),
        },
        Stmt::Update {
            sets, selection, ..
        } => {
            for (_, _, _, e) in sets {
                walk_deep(e, f);
            }
            if let Some(w) = selection {
                walk_deep(w, f);
            }
        }
        Stmt::Delete { selection, .. } => {
            if let Some(w) = selection {
                walk_deep(w, f);
            }
        }
    }
}

fn walk_query(q: &Q, f: &mut dyn FnMut(&E)) {
    let _ = for_own(q, &mut |e| {
        walk_deep(e, f);
        Ok(())
    });
}

/// Calls `f` on each of the query's own top-level expressions (its subqueries are inside them).
fn for_own(q: &Q, f: &mut dyn FnMut(&E) -> Result<(), Rejection>) -> Result<(), Rejection> {
    let order = q.order_by.iter().filter_map(|o| match &o.key {
        OrderKey::Expr(e) => Some(e),
        OrderKey::Output(_) => None,
    });
    q.items
        .iter()
        .chain(q.from.iter().filter_map(|x| x.on.as_ref()))
        .chain(q.selection.iter())
        .chain(q.group_by.iter())
        .chain(q.having.iter())
        .chain(order)
        .chain(q.limit.iter())
        .chain(q.offset.iter())
        .try_for_each(f)
}

fn walk_deep(e: &E, f: &mut dyn FnMut(&E)) {
    let _ = walk_own(e, &mut |x| {
        f(x);
        match x {
            E::Scalar(q) | E::Exists { q, .. } | E::InQuery { q, .. } => walk_query(q, f),
            _ => {}
        }
        Ok(true)
    });
}

/// MySQL evaluates an UPDATE's assignments left to right, each seeing the ones before; the
/// others see the old row. Refuse what would tell them apart.
fn check_update_order(sets: &[(String, Ty, Limit, E)]) -> Result<(), Rejection> {
    for (i, (_, _, _, e)) in sets.iter().enumerate() {
        let mut clash = None;
        walk_deep(e, &mut |x| {
            if let E::Col(c) = x
                && c.owner == 0
                && sets[..i].iter().any(|(name, ..)| *name == c.column)
            {
                clash = Some(c.column.clone());
            }
        });
        if let Some(c) = clash {
            return Err(Rejection::nondeterministic(format!(
                "UPDATE reads column {c} after assigning it; MySQL sees the new value there, the others the old one"
            )));
        }
    }
    Ok(())
}

/// Whether a strict function or operator (every one here but COALESCE and NULLIF) has a NULL
/// constant among its arguments: PostgreSQL then folds it to NULL when it plans, whatever the
/// other arguments are (`replace(x, col, NULL)`, `col + NULL`, `col = NULL`), and a constant
/// around it may be folded and checked in turn.
fn strict_null(args: &[&Option<Value>]) -> bool {
    args.iter().any(|a| matches!(a, Some(Value::Null)))
}

/// Refuses a strict operator or function (`e`) with an argument that folds to NULL beside one
/// that is not constant and may fail: PostgreSQL folds the whole to NULL when it plans and
/// never computes the other argument, while MariaDB and SQLite compute it and may fail there
/// (`(b + 9223372036854775807) + NULLIF(1, 1)` overflows on them). A NULL literal or parameter
/// beside arithmetic is refused earlier, by type; this catches constants that become NULL only
/// once folded (NULLIF, a CASE without ELSE).
fn skips_an_operand(e: &E, args: &[(&E, &Option<Value>)]) -> Result<(), Rejection> {
    // A NULL literal or parameter is the renderer's (`null_const`): it makes every engine skip
    // the other side, or the statement is refused by type.
    let folds_to_null = args.iter().any(|(a, v)| {
        matches!(v, Some(Value::Null)) && !matches!(a, E::Lit(Value::Null) | E::Param(_))
    });
    if folds_to_null && args.iter().any(|(a, v)| v.is_none() && may_fail(a)) {
        return Err(Rejection::nondeterministic(format!(
            "a constant operand of {} is always NULL here, so PostgreSQL never computes its other operand, which MariaDB and SQLite compute and may fail on; write NULL",
            describe(e)
        )));
    }
    Ok(())
}

/// Whether computing `e` on a row may fail: it holds an operator or a function, or a subquery
/// or aggregate (not looked into here). A column or a constant alone cannot.
fn may_fail(e: &E) -> bool {
    let mut may = false;
    let _ = walk_own(e, &mut |x| {
        if is_operator(x)
            || matches!(
                x,
                E::Func(..) | E::Scalar(_) | E::Exists { .. } | E::InQuery { .. } | E::Agg(..)
            )
        {
            may = true;
        }
        Ok(true)
    });
    may
}

/// A comparison of two evaluated sides as PostgreSQL folds it: NULL when either is a NULL
/// constant, its truth when both are constants, `None` (not folded) otherwise.
fn cmp_fold(op: Cmp, x: &Option<Value>, y: &Option<Value>) -> Option<Option<bool>> {
    match (x, y) {
        (Some(Value::Null), _) | (_, Some(Value::Null)) => Some(None),
        (Some(x), Some(y)) => Some(cmp_truth(op, x, y)),
        _ => None,
    }
}

/// AND (or OR) of two folded truths as PostgreSQL simplifies it: a deciding constant settles it
/// whatever the other side is; otherwise both must be constants.
fn bool_fold(and: bool, x: Option<Option<bool>>, y: Option<Option<bool>>) -> Option<Value> {
    match (x, y) {
        (Some(Some(b)), _) | (_, Some(Some(b))) if b != and => Some(Value::Bool(b)),
        (Some(x), Some(y)) => Some(from_truth(match (x, y) {
            (Some(x), Some(y)) => Some(if and { x && y } else { x || y }),
            _ => None,
        })),
        _ => None,
    }
}

/// Evaluates a constant expression as PostgreSQL folds it when it plans; `Ok(None)` when it is
/// not one this evaluator knows. Folding more than PostgreSQL only refuses more.
fn eval(e: &E, params: &Folding<'_>) -> Result<Option<Value>, Rejection> {
    // Each node is folded, and charged, once.
    let node = std::ptr::from_ref(e) as usize;
    if let Some(v) = params.folded.borrow().get(&node) {
        return Ok(v.clone());
    }
    let v = eval_node(e, params)?;
    if let Some(v) = &v {
        params.charge(v)?;
    }
    params.folded.borrow_mut().insert(node, v.clone());
    Ok(v)
}

/// [`eval`] of one node; its operands through [`eval`], each charged.
fn eval_node(e: &E, params: &Folding<'_>) -> Result<Option<Value>, Rejection> {
    let overflow = || {
        Rejection::nondeterministic(format!(
            "the constant expression overflows ({})",
            describe(e)
        ))
    };
    Ok(Some(match e {
        E::Lit(v) => v.clone(),
        E::Param(i) => match params.get(*i) {
            Some(v) => v.clone(),
            None => return Ok(None),
        },
        E::Neg(x) => match eval(x, params)? {
            Some(Value::Int(v)) => Value::Int(v.checked_neg().ok_or_else(overflow)?),
            Some(Value::Decimal(d)) => Value::Decimal(
                chainify_core::Decimal::new(-d.mantissa(), d.scale()).ok_or_else(overflow)?,
            ),
            Some(Value::Null) => Value::Null,
            _ => return Ok(None),
        },
        E::Func(Func::Abs, args) => match eval(&args[0], params)? {
            Some(Value::Int(v)) => Value::Int(v.checked_abs().ok_or_else(overflow)?),
            Some(Value::Decimal(d)) => Value::Decimal(
                chainify_core::Decimal::new(d.mantissa().abs(), d.scale()).ok_or_else(overflow)?,
            ),
            Some(Value::Null) => Value::Null,
            _ => return Ok(None),
        },
        E::Arith(op, a, b) => {
            let (x, y) = (eval(a, params)?, eval(b, params)?);
            skips_an_operand(e, &[(a, &x), (b, &y)])?;
            if strict_null(&[&x, &y]) {
                return Ok(Some(Value::Null));
            }
            let (Some(x), Some(y)) = (x, y) else {
                return Ok(None);
            };
            match (x, y) {
                (Value::Null, _) | (_, Value::Null) => Value::Null,
                (Value::Int(x), Value::Int(y)) => Value::Int(
                    match op {
                        Arith::Add => x.checked_add(y),
                        Arith::Sub => x.checked_sub(y),
                        Arith::Mul => x.checked_mul(y),
                        Arith::Div => x.checked_div(y),
                        Arith::Mod => x.checked_rem(y),
                    }
                    .ok_or_else(overflow)?,
                ),
                (x, y) => {
                    let dec = |v: Value| match v {
                        Value::Int(i) => chainify_core::Decimal::new(i128::from(i), 0),
                        Value::Decimal(d) => Some(d),
                        _ => None,
                    };
                    let (Some(x), Some(y)) = (dec(x), dec(y)) else {
                        return Ok(None);
                    };
                    Value::Decimal(match op {
                        Arith::Add | Arith::Sub => {
                            let s = x.scale().max(y.scale());
                            let (x, y) = (
                                x.rescaled(s).ok_or_else(overflow)?,
                                y.rescaled(s).ok_or_else(overflow)?,
                            );
                            let m = if *op == Arith::Add {
                                x.mantissa().checked_add(y.mantissa())
                            } else {
                                x.mantissa().checked_sub(y.mantissa())
                            };
                            chainify_core::Decimal::new(m.ok_or_else(overflow)?, s)
                                .ok_or_else(overflow)?
                        }
                        Arith::Mul => chainify_core::Decimal::new(
                            x.mantissa()
                                .checked_mul(y.mantissa())
                                .ok_or_else(overflow)?,
                            x.scale().checked_add(y.scale()).ok_or_else(overflow)?,
                        )
                        .ok_or_else(overflow)?,
                        Arith::Div | Arith::Mod => return Ok(None),
                    })
                }
            }
        }
        E::Concat(a, b) => {
            let (x, y) = (eval(a, params)?, eval(b, params)?);
            // No text operand of the subset can fail today; `||` is strict all the same.
            skips_an_operand(e, &[(a, &x), (b, &y)])?;
            match (x, y) {
                (Some(Value::Text(x)), Some(Value::Text(y))) => {
                    const_text_fits(x.len().saturating_add(y.len()))?;
                    Value::Text(x + &y)
                }
                (Some(Value::Null), _) | (_, Some(Value::Null)) => Value::Null,
                _ => return Ok(None),
            }
        }
        E::Func(Func::Coalesce, args) => {
            for a in args {
                match eval(a, params)? {
                    Some(Value::Null) => continue,
                    other => return Ok(other),
                }
            }
            Value::Null
        }
        // A CASE folds to the branch of its first constant-true condition, as long as every
        // condition before it is a constant false.
        E::Case {
            operand: None,
            whens,
            otherwise,
        } => {
            for (w, t) in whens {
                match eval(w, params)? {
                    Some(Value::Bool(true)) => return eval(t, params),
                    Some(Value::Bool(false) | Value::Null) => {}
                    _ => return Ok(None),
                }
            }
            match otherwise {
                Some(o) => return eval(o, params),
                None => Value::Null,
            }
        }
        E::Case {
            operand: Some(o),
            whens,
            otherwise,
        } => {
            let top = eval(o, params)?;
            // PostgreSQL compares the operand with each WHEN as `o = w`: a WHEN that folds to
            // NULL drops its arm, and with no arm left it never computes the operand, which
            // MariaDB and SQLite compute.
            if top.is_none() && may_fail(o) {
                for (w, _) in whens {
                    let v = eval(w, params)?;
                    skips_an_operand(e, &[(o, &top), (w, &v)])?;
                }
            }
            let Some(top) = top else {
                return Ok(None);
            };
            // Every `NULL = w` folds to NULL: the ELSE, whatever the WHENs are.
            let whens = if matches!(top, Value::Null) {
                &[][..]
            } else {
                &whens[..]
            };
            for (w, t) in whens {
                let Some(v) = eval(w, params)? else {
                    return Ok(None);
                };
                if compare(&top, &v).is_some_and(|o| o.is_eq()) {
                    return eval(t, params);
                }
            }
            match otherwise {
                Some(o) => return eval(o, params),
                None => Value::Null,
            }
        }
        E::Not(x) => match eval(x, params)?.as_ref().and_then(truth) {
            Some(t) => from_truth(t.map(|b| !b)),
            None => return Ok(None),
        },
        E::And(a, b) | E::Or(a, b) => {
            let (x, y) = (eval(a, params)?, eval(b, params)?);
            // Three-valued logic; a known deciding side settles it even if the other is not
            // a constant.
            return Ok(bool_fold(
                matches!(e, E::And(..)),
                x.as_ref().and_then(truth),
                y.as_ref().and_then(truth),
            ));
        }
        E::Cmp(op, a, b) => {
            let (x, y) = (eval(a, params)?, eval(b, params)?);
            skips_an_operand(e, &[(a, &x), (b, &y)])?;
            match cmp_fold(*op, &x, &y) {
                Some(t) => from_truth(t),
                None => return Ok(None),
            }
        }
        E::IsNull(x, negated) => match eval(x, params)? {
            Some(v) => Value::Bool(matches!(v, Value::Null) != *negated),
            None => return Ok(None),
        },
        E::Between {
            e: x,
            lo,
            hi,
            negated,
        } => {
            // PostgreSQL rewrites it as `x >= lo AND x <= hi` (NOT: `x < lo OR x > hi`) and
            // folds those: a deciding half settles it, a NULL half makes it NULL or unknown.
            let (xv, l, h) = (eval(x, params)?, eval(lo, params)?, eval(hi, params)?);
            skips_an_operand(e, &[(x, &xv), (lo, &l), (hi, &h)])?;
            let x = xv;
            return Ok(if *negated {
                bool_fold(false, cmp_fold(Cmp::Lt, &x, &l), cmp_fold(Cmp::Gt, &x, &h))
            } else {
                bool_fold(true, cmp_fold(Cmp::Ge, &x, &l), cmp_fold(Cmp::Le, &x, &h))
            });
        }
        E::InList {
            e: x,
            list,
            negated,
        } => {
            // PostgreSQL rewrites it as ORed `x = item` (the constant items as one `= ANY`).
            let xv = eval(x, params)?;
            let items = list
                .iter()
                .map(|i| eval(i, params))
                .collect::<Result<Vec<_>, _>>()?;
            let pairs: Vec<(&E, &Option<Value>)> = std::iter::once((&**x, &xv))
                .chain(list.iter().zip(&items))
                .collect();
            skips_an_operand(e, &pairs)?;
            let x = xv;
            // `NULL = item` folds to NULL for every item, and so does their OR; so does a
            // single `x = NULL`.
            if matches!(x, Some(Value::Null)) || matches!(items[..], [Some(Value::Null)]) {
                return Ok(Some(Value::Null));
            }
            let Some(x) = x else {
                return Ok(None);
            };
            // A constant item equal to a constant subject settles it, whatever the others are.
            if items
                .iter()
                .flatten()
                .any(|v| cmp_truth(Cmp::Eq, &x, v) == Some(true))
            {
                return Ok(Some(Value::Bool(!*negated)));
            }
            let mut found = Some(false);
            for v in items {
                let Some(v) = v else {
                    return Ok(None);
                };
                found = match (found, cmp_truth(Cmp::Eq, &x, &v)) {
                    (Some(true), _) | (_, Some(true)) => Some(true),
                    (Some(false), Some(false)) => Some(false),
                    _ => None,
                };
            }
            from_truth(if *negated { found.map(|b| !b) } else { found })
        }
        E::Like {
            e: x,
            pattern,
            negated,
        } => {
            let (v, p) = (eval(x, params)?, eval(pattern, params)?);
            skips_an_operand(e, &[(x, &v), (pattern, &p)])?;
            match (v, p) {
                (Some(Value::Text(t)), Some(Value::Text(p))) => {
                    let chars: Vec<char> = t.chars().collect();
                    let pat: Vec<char> = p.chars().collect();
                    Value::Bool(like(&chars, &pat) != *negated)
                }
                (Some(Value::Null), _) | (_, Some(Value::Null)) => Value::Null,
                _ => return Ok(None),
            }
        }
        E::Func(f, args) => {
            let evaluated = args
                .iter()
                .map(|a| eval(a, params))
                .collect::<Result<Vec<_>, _>>()?;
            if *f != Func::Nullif {
                let pairs: Vec<(&E, &Option<Value>)> = args.iter().zip(&evaluated).collect();
                skips_an_operand(e, &pairs)?;
            }
            if strict_null(&evaluated.iter().collect::<Vec<_>>()) {
                // NULLIF with a NULL constant on either side is its first argument.
                return Ok(if *f == Func::Nullif {
                    evaluated.into_iter().next().flatten()
                } else {
                    Some(Value::Null)
                });
            }
            let Some(vals) = evaluated.into_iter().collect::<Option<Vec<Value>>>() else {
                return Ok(None);
            };
            if vals.iter().any(|v| matches!(v, Value::Null)) && *f != Func::Nullif {
                Value::Null
            } else {
                match (f, vals.as_slice()) {
                    (Func::Nullif, [a, b]) => {
                        if compare(a, b).is_some_and(|o| o.is_eq()) {
                            Value::Null
                        } else {
                            a.clone()
                        }
                    }
                    (Func::Length, [Value::Text(t)]) => {
                        Value::Int(i64::try_from(t.chars().count()).unwrap_or(i64::MAX))
                    }
                    (Func::Length, [Value::Bytes(b)]) => {
                        Value::Int(i64::try_from(b.len()).unwrap_or(i64::MAX))
                    }
                    (Func::Substr, [Value::Text(t), Value::Int(start), rest @ ..]) => {
                        let skip = usize::try_from(*start - 1).unwrap_or(0);
                        let take = match rest {
                            [Value::Int(n)] => usize::try_from(*n).unwrap_or(0),
                            _ => usize::MAX,
                        };
                        Value::Text(t.chars().skip(skip).take(take).collect())
                    }
                    (Func::Trim, [Value::Text(t)]) => Value::Text(t.trim_matches(' ').into()),
                    (Func::Ltrim, [Value::Text(t)]) => {
                        Value::Text(t.trim_start_matches(' ').into())
                    }
                    (Func::Rtrim, [Value::Text(t)]) => Value::Text(t.trim_end_matches(' ').into()),
                    (Func::Replace, [Value::Text(a), Value::Text(b), Value::Text(c)]) => {
                        if b.is_empty() {
                            Value::Text(a.clone())
                        } else {
                            // The result's size first: nested REPLACEs of parameters grow
                            // geometrically.
                            let n = a.matches(b.as_str()).count();
                            const_text_fits(
                                (a.len() - n * b.len()).saturating_add(n.saturating_mul(c.len())),
                            )?;
                            Value::Text(a.replace(b.as_str(), c))
                        }
                    }
                    _ => return Ok(None),
                }
            }
        }
        _ => return Ok(None),
    }))
}

fn truth(v: &Value) -> Option<Option<bool>> {
    match v {
        Value::Bool(b) => Some(Some(*b)),
        Value::Null => Some(None),
        _ => None,
    }
}

fn from_truth(t: Option<bool>) -> Value {
    t.map_or(Value::Null, Value::Bool)
}

fn cmp_truth(op: Cmp, x: &Value, y: &Value) -> Option<bool> {
    let o = compare(x, y)?;
    Some(match op {
        Cmp::Eq => o.is_eq(),
        Cmp::Ne => o.is_ne(),
        Cmp::Lt => o.is_lt(),
        Cmp::Le => o.is_le(),
        Cmp::Gt => o.is_gt(),
        Cmp::Ge => o.is_ge(),
    })
}

/// SQL LIKE with `\` escaping `%`, `_` and `\` (patterns are checked to escape nothing else).
/// Greedy with backtracking to the last `%`: O(text × pattern) at worst, whatever the pattern.
fn like(text: &[char], pat: &[char]) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum Tok {
        Any,
        One,
        Lit(char),
    }
    let mut toks = Vec::with_capacity(pat.len());
    let mut i = 0;
    while i < pat.len() {
        toks.push(match pat[i] {
            '%' => Tok::Any,
            '_' => Tok::One,
            '\\' if i + 1 < pat.len() => {
                i += 1;
                Tok::Lit(pat[i])
            }
            c => Tok::Lit(c),
        });
        i += 1;
    }
    let (mut t, mut p) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match toks.get(p) {
            Some(Tok::Any) => {
                star = Some((p, t));
                p += 1;
            }
            Some(Tok::One) => {
                t += 1;
                p += 1;
            }
            Some(Tok::Lit(c)) if *c == text[t] => {
                t += 1;
                p += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    toks[p..].iter().all(|x| *x == Tok::Any)
}

/// Longest text a constant expression may build while being checked.
const MAX_CONST_TEXT: usize = 1 << 20;

/// `||` and REPLACE grow text: refused when the result may exceed [`MAX_TEXT_EXPR`] bytes.
fn text_growth(n: u64, what: &str) -> Result<(), Rejection> {
    if n > MAX_TEXT_EXPR {
        return Err(Rejection::limit(format!(
            "{what} may build {} of text; at most {} (MariaDB cannot compute more, PostgreSQL would hold it in memory)",
            human_bytes(n),
            human_bytes(MAX_TEXT_EXPR)
        )));
    }
    Ok(())
}

/// `n` bytes for a message: "1.5 MiB", "512 KiB", "12 bytes", "unbounded".
fn human_bytes(n: u64) -> String {
    match n {
        u64::MAX => "an unbounded size".to_owned(),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1 << 20)),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} bytes"),
    }
}

fn const_text_fits(len: usize) -> Result<(), Rejection> {
    if len > MAX_CONST_TEXT {
        return Err(Rejection::limit(format!(
            "a constant text expression builds more than {MAX_CONST_TEXT} bytes"
        )));
    }
    Ok(())
}

/// Compares two constants of comparable types.
fn compare(x: &Value, y: &Value) -> Option<std::cmp::Ordering> {
    let dec = |v: &Value| match v {
        Value::Int(i) => chainify_core::Decimal::new(i128::from(*i), 0),
        Value::Decimal(d) => Some(*d),
        _ => None,
    };
    match (x, y) {
        (Value::Null, _) | (_, Value::Null) => None,
        (Value::Int(a), Value::Int(b)) => Some(a.cmp(b)),
        (Value::Text(a), Value::Text(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
        (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
        (Value::Bytes(a), Value::Bytes(b)) => Some(a.cmp(b)),
        _ => Some(dec(x)?.cmp_numeric(&dec(y)?)),
    }
}

/// A short description of an expression for messages.
fn describe(e: &E) -> &'static str {
    match e {
        E::Neg(_) => "a negation",
        E::Arith(Arith::Add, ..) => "an addition",
        E::Arith(Arith::Sub, ..) => "a subtraction",
        E::Arith(Arith::Mul, ..) => "a multiplication",
        E::Arith(..) => "a division",
        E::Func(Func::Abs, _) => "ABS",
        E::Case {
            operand: Some(_), ..
        } => "a CASE on a value",
        _ => "an expression",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No statement reaches `dec_span`'s fallback with a decimal inside today (every form that
    /// could is matched or refused earlier); the fallback must still not count one as 0.
    #[test]
    fn a_decimal_the_bound_does_not_follow_is_refused() {
        let sig = [Ty::Dec];
        let mut w = Writer::new(Dialect::Sqlite, &sig, Vec::new(), None);
        let lit = || E::Lit(Value::Decimal("2.675".parse().unwrap()));
        let e = w
            .dec_span(&E::Agg(Agg::Max, Some(Box::new(lit()))), 10, 2)
            .unwrap_err();
        assert!(e.to_string().contains("the literal 2.675"), "{e}");
        let e = w
            .dec_span(&E::Func(Func::Length, vec![E::Param(0)]), 10, 2)
            .unwrap_err();
        assert!(e.to_string().contains("the decimal parameter $1"), "{e}");
        // An integer under it is bounded as before.
        let (largest, _) = w
            .dec_span(&E::Func(Func::Length, vec![E::Lit(Value::Int(3))]), 10, 2)
            .unwrap();
        assert!(largest >= 1.0, "{largest}");
    }

    fn folding(params: &[Value]) -> Folding<'_> {
        Folding::new(params, usize::MAX)
    }

    /// The plain recursive definition of LIKE, the oracle for the linear matcher.
    fn like_reference(text: &[char], pat: &[char]) -> bool {
        match pat.split_first() {
            None => text.is_empty(),
            Some(('%', rest)) => (0..=text.len()).any(|i| like_reference(&text[i..], rest)),
            Some(('_', rest)) => !text.is_empty() && like_reference(&text[1..], rest),
            Some(('\\', rest)) => match rest.split_first() {
                Some((c, rest)) => text.first() == Some(c) && like_reference(&text[1..], rest),
                None => false,
            },
            Some((c, rest)) => text.first() == Some(c) && like_reference(&text[1..], rest),
        }
    }

    fn chars(s: &str) -> Vec<char> {
        s.chars().collect()
    }

    #[test]
    fn like_matches_sql_semantics_and_stays_linear() {
        for (t, p, want) in [
            ("abc", "a%", true),
            ("abc", "a_c", true),
            ("a%b", "a\\%b", true),
            ("axb", "a\\%b", false),
            ("", "%", true),
            ("ab", "a", false),
            ("é東", "_東", true),
            ("a_b", "a\\_b", true),
        ] {
            assert_eq!(like(&chars(t), &chars(p)), want, "{t} LIKE {p}");
        }
        // A pattern that is exponential for naive backtracking.
        let text = chars(&"a".repeat(5_000));
        let pat = chars(&format!("{}b", "%a".repeat(40)));
        assert!(!like(&text, &pat));
    }

    proptest::proptest! {
        #[test]
        fn like_agrees_with_its_definition(t in "[ab%_\\\\]{0,8}", p in "[ab%_]{0,6}|[ab%_]{0,3}\\\\[%_\\\\][ab%]{0,2}") {
            proptest::prop_assert_eq!(like(&chars(&t), &chars(&p)), like_reference(&chars(&t), &chars(&p)));
        }
    }

    fn int(v: i64) -> E {
        E::Lit(Value::Int(v))
    }

    #[test]
    fn constants_fold_as_postgres_folds_them() {
        let add = E::Arith(Arith::Add, Box::new(int(i64::MAX)), Box::new(E::Param(0)));
        assert!(eval(&add, &folding(&[Value::Int(1)])).is_err());
        assert_eq!(
            eval(&add, &folding(&[Value::Int(-1)])).unwrap(),
            Some(Value::Int(i64::MAX - 1))
        );
        // CASE with a constant condition folds to its branch, even beside a column.
        let col = E::Col(ColRef {
            qualifier: "t".into(),
            column: "c".into(),
            ty: Ty::Text,
            owner: 0,
            occurrence: 0,
            key_position: None,
            limit: Limit::None,
            not_null: false,
        });
        let case = E::Case {
            operand: None,
            whens: vec![(E::Lit(Value::Bool(false)), col)],
            otherwise: Some(Box::new(E::Func(
                Func::Substr,
                vec![E::Lit(Value::Text("xxxxxxxxxxxxxxx".into())), int(3)],
            ))),
        };
        assert_eq!(
            eval(&case, &folding(&[])).unwrap(),
            Some(Value::Text("xxxxxxxxxxxxx".into()))
        );
        assert!(
            Limit::Chars(12)
                .admits(&Value::Text("xxxxxxxxxxxxx".into()))
                .is_err()
        );
        assert!(Limit::IntBits(32).admits(&Value::Int(1 << 31)).is_err());
        assert!(
            Limit::IntBits(32)
                .admits(&Value::Int((1 << 31) - 1))
                .is_ok()
        );
        let dec = |s: &str| Value::Decimal(s.parse().unwrap());
        let two = Limit::Decimal {
            precision: 4,
            scale: 2,
        };
        assert!(two.admits(&dec("99.99")).is_ok());
        // Rounded first, as the engines do: 99.995 is 100.00, too large.
        assert!(two.admits(&dec("99.995")).is_err());
    }
}
