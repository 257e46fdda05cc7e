//! CHECK constraints of shared tables. Each engine evaluates a CHECK itself, in its own
//! functions, casts and arithmetic (MariaDB reads `length(s)` as `octet_length(s)`; SQLite
//! compares DECIMAL as floating point), and no rendering by chainify stands in between. So only
//! a subset whose every engine computes alike is shared: comparisons of a column with a literal
//! of its own type or with another column of the same type, `BETWEEN`, `IS [NOT] NULL`, and
//! `AND`, `OR`, `NOT` over those. Everything else is refused at registration, naming the piece.
//!
//! The clauses come from the local catalog, as each engine prints them (PostgreSQL adds casts
//! such as `(s)::text` and `(0)::numeric`, MariaDB backquotes names); SQLite keeps only the
//! `CREATE TABLE` text, from which [`sqlite_checks`] takes them.

use chainify_core::Decimal;
use sqlparser::ast::{
    BinaryOperator, CastKind, ColumnOption, DataType, Expr, Statement, TableConstraint,
    UnaryOperator, Value,
};
use sqlparser::dialect::{Dialect as SqlDialect, GenericDialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;

use crate::ColumnType;
use crate::render::Dialect;
use crate::schema::Column;

/// What a CHECK clause must stay within, for the refusal's hint.
const SUBSET: &str = "a shared CHECK may only compare a column with a literal of its type or with a column of the same type (=, <>, <, <=, >, >=, BETWEEN), test IS [NOT] NULL, and join those with AND, OR and NOT; enforce other rules in the transactions (a WHERE guard with expect_rows)";

/// Why `clause` (a CHECK's expression as the catalog of `dialect` prints it) is not one every
/// engine evaluates alike on a row of `columns`, or `None` when it is.
pub fn check_problem(columns: &[Column], clause: &str, dialect: Dialect) -> Option<String> {
    let expr = match parse_expr(clause, dialect) {
        Ok(expr) => expr,
        Err(e) => return Some(format!("cannot be read ({e}); {SUBSET}")),
    };
    Checker { columns, dialect }
        .condition(&expr)
        .err()
        .map(|why| format!("{why}; {SUBSET}"))
}

/// The CHECK constraints of a SQLite `CREATE TABLE` text: (name, expression), column
/// constraints first, in order. An error when the text cannot be read although it may declare
/// one (it is refused rather than taken as having none).
pub fn sqlite_checks(definition: &str) -> Result<Vec<(Option<String>, String)>, String> {
    let statements = Parser::parse_sql(&SQLiteDialect {}, definition).map_err(|e| e.to_string())?;
    let [Statement::CreateTable(create)] = statements.as_slice() else {
        return Err("not one CREATE TABLE statement".into());
    };
    let mut checks = Vec::new();
    for c in &create.columns {
        for option in &c.options {
            if let ColumnOption::Check(check) = &option.option {
                let name = option.name.as_ref().or(check.name.as_ref());
                checks.push((name.map(|n| n.value.clone()), check.expr.to_string()));
            }
        }
    }
    for constraint in &create.constraints {
        if let TableConstraint::Check(check) = constraint {
            checks.push((
                check.name.as_ref().map(|n| n.value.clone()),
                check.expr.to_string(),
            ));
        }
    }
    Ok(checks)
}

fn parse_expr(clause: &str, dialect: Dialect) -> Result<Expr, String> {
    let dialect: &dyn SqlDialect = match dialect {
        Dialect::Postgres => &PostgreSqlDialect {},
        // chainify's MySQL sessions run with ANSI_QUOTES, so the catalog prints `"name"`;
        // the generic dialect reads it, and backquotes too, as identifiers.
        Dialect::MySql => &GenericDialect {},
        Dialect::Sqlite => &SQLiteDialect {},
    };
    let mut parser = Parser::new(dialect)
        .try_with_sql(clause)
        .map_err(|e| e.to_string())?;
    let expr = parser.parse_expr().map_err(|e| e.to_string())?;
    match parser.peek_token().token {
        Token::EOF => Ok(expr),
        other => Err(format!("unexpected {other} after the expression")),
    }
}

/// One side of a comparison.
enum Operand<'a> {
    Column(&'a Column),
    Number(Decimal),
    Text(String),
}

struct Checker<'a> {
    columns: &'a [Column],
    dialect: Dialect,
}

impl<'a> Checker<'a> {
    /// A boolean condition of the subset.
    fn condition(&self, e: &Expr) -> Result<(), String> {
        match e {
            Expr::Nested(inner) => self.condition(inner),
            Expr::BinaryOp {
                left,
                op: BinaryOperator::And | BinaryOperator::Or,
                right,
            } => {
                self.condition(left)?;
                self.condition(right)
            }
            Expr::UnaryOp {
                op: UnaryOperator::Not,
                expr,
            } => self.condition(expr),
            Expr::IsNull(inner) | Expr::IsNotNull(inner) => match self.operand(inner)? {
                Operand::Column(_) => Ok(()),
                _ => Err(format!("`{e}` tests a literal")),
            },
            Expr::BinaryOp { left, op, right } if is_comparison(op) => {
                self.compare(e, &self.operand(left)?, &self.operand(right)?)
            }
            Expr::Between {
                expr, low, high, ..
            } => {
                let subject = self.operand(expr)?;
                self.compare(e, &subject, &self.operand(low)?)?;
                self.compare(e, &subject, &self.operand(high)?)
            }
            Expr::InList { .. } | Expr::AnyOp { .. } => Err(format!(
                "`{e}` is an IN list, which engines print and compare in their own ways; write it as comparisons joined by OR"
            )),
            Expr::Function(f) => Err(format!(
                "`{e}` calls {}(), which engines compute in their own ways",
                f.name
            )),
            _ => Err(format!("`{e}` is not a comparison")),
        }
    }

    /// A column, or a literal, under casts to its own type (PostgreSQL prints them).
    fn operand(&self, e: &Expr) -> Result<Operand<'a>, String> {
        match e {
            Expr::Nested(inner) => self.operand(inner),
            Expr::Identifier(id) => self.column(&id.value).map(Operand::Column),
            Expr::CompoundIdentifier(parts) if parts.len() == 2 => {
                self.column(&parts[1].value).map(Operand::Column)
            }
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => number(n).map(Operand::Number),
                Value::SingleQuotedString(s) => Ok(Operand::Text(s.clone())),
                _ => Err(format!("`{e}` is not a number or a quoted string")),
            },
            Expr::UnaryOp {
                op: op @ (UnaryOperator::Minus | UnaryOperator::Plus),
                expr,
            } => match self.operand(expr)? {
                Operand::Number(n) if *op == UnaryOperator::Minus => {
                    Decimal::new(-n.mantissa(), n.scale())
                        .map(Operand::Number)
                        .ok_or_else(|| format!("`{e}` is not a number"))
                }
                Operand::Number(n) => Ok(Operand::Number(n)),
                _ => Err(format!("`{e}` negates what is not a number literal")),
            },
            // Only the casts PostgreSQL prints itself, which change nothing: a text column to
            // unbounded text, a literal to an integer type it fits or to unbounded text. A cast
            // with a width or precision truncates or rounds on PostgreSQL (and MariaDB) and not
            // on SQLite; the other engines print none of their own.
            Expr::Cast {
                kind: CastKind::DoubleColon | CastKind::Cast,
                expr,
                data_type,
                ..
            } => {
                if self.dialect != Dialect::Postgres {
                    return Err(format!(
                        "`{e}` casts, which engines do in their own ways; compare the column as it is"
                    ));
                }
                let target = cast_target(data_type).ok_or_else(|| {
                    format!("`{e}` casts to {data_type}, which changes the value on some engines")
                })?;
                match (self.operand(expr)?, target) {
                    (Operand::Column(c), Cast::Text) if c.ty == ColumnType::Text => {
                        Ok(Operand::Column(c))
                    }
                    // PostgreSQL prints a negative literal quoted: '-1'::integer.
                    (Operand::Text(t), Cast::Int(bits)) => {
                        let n = number(&t).map_err(|_| format!("`{e}` casts text to a number"))?;
                        int_literal(&n, bits).map_err(|why| format!("`{e}`: {why}"))?;
                        Ok(Operand::Number(n))
                    }
                    (Operand::Number(n), Cast::Int(bits)) => {
                        int_literal(&n, bits).map_err(|why| format!("`{e}`: {why}"))?;
                        Ok(Operand::Number(n))
                    }
                    (Operand::Text(t), Cast::Text) => Ok(Operand::Text(t)),
                    _ => Err(format!("`{e}` casts to another type")),
                }
            }
            Expr::Function(f) => Err(format!(
                "`{e}` calls {}(), which engines compute in their own ways",
                f.name
            )),
            Expr::BinaryOp { .. } | Expr::UnaryOp { .. } => Err(format!(
                "`{e}` computes a value, which engines do in their own ways (SQLite keeps DECIMAL as floating point)"
            )),
            _ => Err(format!("`{e}` is neither a column nor a literal")),
        }
    }

    fn column(&self, name: &str) -> Result<&'a Column, String> {
        self.columns
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| format!("names {name}, which is not a column of the table"))
    }

    /// Whether comparing `a` with `b` (in `e`) gives the same answer on every engine.
    fn compare(&self, e: &Expr, a: &Operand<'_>, b: &Operand<'_>) -> Result<(), String> {
        // SQLite checks a DECIMAL as written, before chainify's trigger rounds it to the
        // column's scale, where the others check it rounded: 1.005 fails `d >= 1.01` on SQLite
        // alone. Only IS [NOT] NULL, which rounding never changes, is shared.
        for operand in [a, b] {
            if let Operand::Column(c) = operand
                && matches!(c.ty, ColumnType::Decimal { .. })
            {
                return Err(format!(
                    "`{e}` compares DECIMAL column {}, which SQLite checks before rounding it to the column's scale and the others after (only IS [NOT] NULL is shared for DECIMAL)",
                    c.name
                ));
            }
        }
        match (a, b) {
            (Operand::Column(x), Operand::Column(y)) => {
                match (family_of(&x.ty), family_of(&y.ty)) {
                    // Not an integer with a decimal: SQLite keeps the decimal as floating point.
                    (Some(fx), Some(fy)) if fx == fy => Ok(()),
                    _ => Err(format!(
                        "`{e}` compares {} and {}, which are not of one type",
                        x.name, y.name
                    )),
                }
            }
            (Operand::Column(c), literal) | (literal, Operand::Column(c)) => {
                literal_fits(c, literal).map_err(|why| format!("`{e}`: {why}"))
            }
            _ => Err(format!("`{e}` compares no column")),
        }
    }
}

/// Whether `literal` compares with column `c` alike everywhere: an integer literal (no point:
/// SQLite reads `…993.0` as floating point) within 64 bits for an integer column; for text, a
/// string without a quote, a backslash (MySQL reads it as an escape) or a control character.
fn literal_fits(c: &Column, literal: &Operand<'_>) -> Result<(), String> {
    match (&c.ty, literal) {
        (ColumnType::Int, Operand::Number(n)) => int_literal(n, 64),
        (ColumnType::Text, Operand::Text(s)) => {
            if s.chars()
                .any(|ch| ch == '\'' || ch == '\\' || ch.is_control())
            {
                Err(
                    "the string holds a quote, a backslash or a control character, which engines print or read differently"
                        .into(),
                )
            } else {
                Ok(())
            }
        }
        _ => Err(format!(
            "the literal is not of column {}'s type, or the type is not compared alike",
            c.name
        )),
    }
}

/// Whether `n` is written as an integer (no decimal point) within `bits` bits.
fn int_literal(n: &Decimal, bits: u8) -> Result<(), String> {
    let fits = n.scale() == 0
        && n.to_i64_exact().is_some_and(|i| {
            bits >= 64 || (-(1i64 << (bits - 1))..(1i64 << (bits - 1))).contains(&i)
        });
    if fits {
        Ok(())
    } else {
        Err(format!("{n} is not an integer literal within {bits} bits"))
    }
}

fn number(text: &str) -> Result<Decimal, String> {
    text.parse::<Decimal>().map_err(|e| e.to_string())
}

fn is_comparison(op: &BinaryOperator) -> bool {
    matches!(
        op,
        BinaryOperator::Eq
            | BinaryOperator::NotEq
            | BinaryOperator::Lt
            | BinaryOperator::LtEq
            | BinaryOperator::Gt
            | BinaryOperator::GtEq
    )
}

/// Type families a comparison may stay within.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Family {
    Int,
    Number,
    Text,
}

fn family_of(ty: &ColumnType) -> Option<Family> {
    match ty {
        ColumnType::Int => Some(Family::Int),
        ColumnType::Decimal { scale: Some(_) } => Some(Family::Number),
        ColumnType::Text => Some(Family::Text),
        _ => None,
    }
}

/// What a cast PostgreSQL prints may convert to without changing a value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cast {
    /// An integer type of this many bits.
    Int(u8),
    /// Unbounded text.
    Text,
}

/// The cast's target, when it is one that may change nothing (no length, no precision).
fn cast_target(t: &DataType) -> Option<Cast> {
    match t {
        DataType::SmallInt(None) | DataType::Int2(None) => Some(Cast::Int(16)),
        DataType::Int(None) | DataType::Integer(None) | DataType::Int4(None) => Some(Cast::Int(32)),
        DataType::BigInt(None) | DataType::Int8(None) => Some(Cast::Int(64)),
        DataType::Text | DataType::CharacterVarying(None) | DataType::Varchar(None) => {
            Some(Cast::Text)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Limit;

    fn columns() -> Vec<Column> {
        let col = |name: &str, ty: ColumnType, limit: Limit| Column {
            name: name.into(),
            ty,
            limit,
            not_null: false,
        };
        vec![
            col("k", ColumnType::Int, Limit::IntBits(64)),
            col("v", ColumnType::Int, Limit::IntBits(64)),
            col(
                "d",
                ColumnType::Decimal { scale: Some(2) },
                Limit::Decimal {
                    precision: 6,
                    scale: 2,
                },
            ),
            col(
                "e",
                ColumnType::Decimal { scale: Some(2) },
                Limit::Decimal {
                    precision: 6,
                    scale: 2,
                },
            ),
            col("s", ColumnType::Text, Limit::Chars(8)),
            col("t", ColumnType::Text, Limit::None),
            col("b", ColumnType::Bool, Limit::None),
            col("y", ColumnType::Bytes, Limit::None),
        ]
    }

    fn problem(clause: &str, dialect: Dialect) -> Option<String> {
        check_problem(&columns(), clause, dialect)
    }

    #[test]
    fn clauses_as_the_catalogs_print_them_are_shared() {
        // Printed by PostgreSQL 15 (pg_get_expr) and MariaDB 10.11 (CHECK_CLAUSE) for the same
        // constraints.
        for clause in [
            "(d IS NULL)",
            "(k > '-1'::integer)",
            "(v > '3000000000'::bigint)",
            "((s)::text <> ''::text)",
            "(t > 'x'::text)",
            "((v >= 0) AND (v <= 10))",
            "(NOT (v = 3))",
            "(v <= k)",
            "((s)::text < (t)::text)",
            "(b IS NOT NULL)",
            "(y IS NULL)",
        ] {
            assert_eq!(problem(clause, Dialect::Postgres), None, "{clause}");
        }
        for clause in [
            "`k` > -1",
            "`v` between 0 and 10",
            "`d` is null or `v` >= 0",
            "`s` <> '' and `t` > 'x'",
            "\"v\" > -2 and \"d\" is null",
            "`v` <= `k`",
            "`v` not between -5 and +5",
        ] {
            assert_eq!(problem(clause, Dialect::MySql), None, "{clause}");
        }
        assert_eq!(
            problem("\"v\" > 0 AND d IS NOT NULL", Dialect::Sqlite),
            None
        );
    }

    #[test]
    fn what_engines_compute_apart_is_refused_by_name() {
        for (clause, dialect, named) in [
            // MariaDB prints length() as octet_length(): bytes, not characters.
            (
                "(length((s)::text) < 4)",
                Dialect::Postgres,
                "calls length()",
            ),
            (
                "octet_length(`s`) < 4",
                Dialect::MySql,
                "calls octet_length()",
            ),
            (
                "((s)::text = ANY ((ARRAY['a'::character varying])::text[]))",
                Dialect::Postgres,
                "IN list",
            ),
            ("`s` in ('a','b')", Dialect::MySql, "IN list"),
            // SQLite keeps DECIMAL as floating point: 0.1 + 0.2 is not 0.3 there.
            ("d + e = 0.3", Dialect::Sqlite, "computes a value"),
            // SQLite checks a DECIMAL before chainify rounds it: 1.005 fails there alone.
            ("d >= 1.01", Dialect::Sqlite, "compares DECIMAL column d"),
            (
                "(d <> '-2.5'::numeric)",
                Dialect::Postgres,
                "casts to NUMERIC",
            ),
            ("`d` <= `e`", Dialect::MySql, "compares DECIMAL column d"),
            ("v = d", Dialect::Sqlite, "compares DECIMAL column d"),
            ("v > 0.5", Dialect::Sqlite, "0.5 is not an integer literal"),
            // SQLite reads a literal with a point as floating point (2^53 + 1 is 2^53).
            (
                "`v` <> 9007199254740993.0",
                Dialect::MySql,
                "9007199254740993.0 is not an integer literal",
            ),
            (
                "v < 99999999999999999999",
                Dialect::Sqlite,
                "within 64 bits",
            ),
            (
                "(k > '3000000000'::integer)",
                Dialect::Postgres,
                "within 32 bits",
            ),
            // Casts with a width truncate or round on PostgreSQL and MariaDB, not on SQLite.
            (
                "((v)::integer > 0)",
                Dialect::Postgres,
                "casts to another type",
            ),
            (
                "(((s)::character varying(2))::text <> 'ab'::text)",
                Dialect::Postgres,
                "casts to CHARACTER VARYING(2)",
            ),
            (
                "CAST(v AS INTEGER) > 0",
                Dialect::Sqlite,
                "casts, which engines do",
            ),
            (
                "CAST(`s` AS CHAR(2)) <> 'ab'",
                Dialect::MySql,
                "casts, which engines do",
            ),
            ("s <> 'it''s'", Dialect::Sqlite, "a quote"),
            ("`s` <> 'a\\\\n'", Dialect::MySql, "a backslash"),
            ("s > 5", Dialect::Sqlite, "not of column s's type"),
            (
                "b = TRUE",
                Dialect::Sqlite,
                "not a number or a quoted string",
            ),
            (
                "y = x'00'",
                Dialect::Sqlite,
                "not a number or a quoted string",
            ),
            ("1 = 1", Dialect::Sqlite, "compares no column"),
            ("NULL IS NULL", Dialect::Sqlite, "not a number"),
            ("w > 0", Dialect::Sqlite, "names w, which is not a column"),
            ("v > 0 v", Dialect::Sqlite, "cannot be read"),
            ("v", Dialect::Sqlite, "is not a comparison"),
            ("(v)::double precision > 0", Dialect::Postgres, "casts to"),
            (
                "(v)::text > '0'",
                Dialect::Postgres,
                "casts to another type",
            ),
            (
                "v > (SELECT 0)",
                Dialect::Sqlite,
                "neither a column nor a literal",
            ),
        ] {
            let p = problem(clause, dialect).unwrap_or_else(|| panic!("{clause} was shared"));
            assert!(p.contains(named), "{clause}: {p}");
            assert!(p.contains("enforce other rules in the transactions"), "{p}");
        }
    }

    #[test]
    fn sqlite_definitions_yield_their_checks() {
        let checks = sqlite_checks(
            "CREATE TABLE t (k BIGINT NOT NULL PRIMARY KEY CHECK (k > 0), \"v\" BIGINT CONSTRAINT pos CHECK(v>=0), CONSTRAINT lohi CHECK (v <= k), CHECK (k < 100))",
        )
        .expect("readable");
        assert_eq!(
            checks,
            vec![
                (None, "k > 0".to_owned()),
                (Some("pos".to_owned()), "v >= 0".to_owned()),
                (Some("lohi".to_owned()), "v <= k".to_owned()),
                (None, "k < 100".to_owned()),
            ]
        );
        assert_eq!(
            sqlite_checks("CREATE TABLE t (k BIGINT NOT NULL PRIMARY KEY)"),
            Ok(vec![])
        );
        assert!(sqlite_checks("CREATE TABLE t (k BIGINT CHECK (").is_err());
    }
}
