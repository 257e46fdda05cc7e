//! A table as the engine's catalog describes it, and the (pure) rules that decide whether it can
//! be a shared table. Each backend fills a [`CatalogTable`] from its own catalog; everything after
//! that is engine-independent.

use chainify_core::{Decimal, Hasher, Value};
use chainify_sql::ColumnType;
use chainify_sql::check::check_problem;
use chainify_sql::render::Dialect;
use chainify_sql::schema::{Column, Declared, ForeignKey, Limit, Table};

use crate::error::RegistrationError;

/// Longest shared-table name: the generated names (`chainify_dg_<t>_ai`, …) must stay within
/// PostgreSQL's 63 and MySQL's 64 characters.
pub const MAX_TABLE_NAME: usize = 48;

/// A column as the catalog reports it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CatalogColumn {
    /// Name as stored in the catalog.
    pub name: String,
    /// The type as the engine prints it (reused verbatim for digest and snapshot tables).
    pub native_type: String,
    /// The portable classification of the type.
    pub ty: ColumnType,
    /// Declared NOT NULL (or implied by the primary key).
    pub not_null: bool,
    /// Declared precision of a DECIMAL, when the engine keeps one.
    pub precision: Option<u32>,
    /// Why this engine cannot store the type portably, when the generic rules are not enough
    /// (set by the backend: a case-insensitive MySQL collation, SQLite precision limits, …).
    pub engine_problem: Option<String>,
    /// How the engine fills the column when an INSERT leaves it out, as its catalog prints it:
    /// a default expression, or what generates the value (an identity or auto-increment
    /// column, a generated column, SQLite's rowid). `None`: no default (NULL).
    pub default: Option<String>,
}

/// A foreign key as the catalog reports it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CatalogForeignKey {
    /// Referencing columns, in order.
    pub columns: Vec<String>,
    /// Referenced table.
    pub parent: String,
    /// Referenced columns, in order.
    pub parent_columns: Vec<String>,
    /// ON DELETE action as the catalog spells it (`CASCADE`, `RESTRICT`, `NO ACTION`, …).
    pub on_delete: String,
    /// ON UPDATE action.
    pub on_update: String,
}

/// A CHECK constraint as the catalog reports it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CatalogCheck {
    /// Its name (SQLite keeps none for an unnamed one: then `CHECK (<clause>)`).
    pub name: String,
    /// The expression as the engine prints it.
    pub clause: String,
    /// The engine that printed it.
    pub dialect: Dialect,
}

/// A table as the catalog reports it.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct CatalogTable {
    /// Name.
    pub name: String,
    /// Columns in declaration order.
    pub columns: Vec<CatalogColumn>,
    /// Primary-key column names in key order (empty: none).
    pub primary_key: Vec<String>,
    /// UNIQUE constraints and unique indexes other than the primary key, by column names.
    pub uniques: Vec<Vec<String>>,
    /// Foreign keys.
    pub foreign_keys: Vec<CatalogForeignKey>,
    /// CHECK constraints, by name.
    pub checks: Vec<CatalogCheck>,
    /// Other tables with a foreign key to this one (`schema.table` outside the current
    /// schema): each must be a shared table too, or its key would refuse (or change) here what
    /// the other organizations do. Not part of the table's own definition (registering a child
    /// later adds one): checked against the shared tables as a whole.
    pub referenced_by: Vec<String>,
    /// Things the backend found that make the table unusable (an expression index, …).
    pub problems: Vec<String>,
}

impl CatalogTable {
    /// The columns of the primary key, in key order.
    pub fn key_columns(&self) -> impl Iterator<Item = &CatalogColumn> {
        self.primary_key
            .iter()
            .filter_map(|k| self.columns.iter().find(|c| &c.name == k))
    }

    /// A fingerprint of everything registration depends on, to notice a table that changed
    /// after it was registered: [`CatalogTable::fingerprint_v1`] and, since CHECK constraints
    /// are shared, the columns' defaults, the CHECK constraints and the problems found (a user
    /// trigger, a rule, a collation …).
    pub fn fingerprint(&self) -> String {
        let mut h = Hasher::new();
        let mut field = |s: &str| {
            h.update(&u32::try_from(s.len()).unwrap_or(u32::MAX).to_be_bytes());
            h.update(s.as_bytes());
        };
        field("chainify definition v2");
        field(&self.fingerprint_v1());
        for c in &self.columns {
            field(&c.name);
            field(c.default.as_deref().unwrap_or("\0no default"));
            field(c.engine_problem.as_deref().unwrap_or(""));
        }
        for c in &self.checks {
            field(&c.name);
            field(&c.clause);
        }
        for p in &self.problems {
            field(p);
        }
        h.finish().to_hex()
    }

    /// The fingerprint stored by versions before CHECK constraints were shared: names, types,
    /// NOT NULL, keys and foreign keys. A table registered then is upgraded when it still has
    /// this one ([`crate::Store::open`]).
    pub fn fingerprint_v1(&self) -> String {
        let mut h = Hasher::new();
        let mut field = |s: &str| {
            h.update(&u32::try_from(s.len()).unwrap_or(u32::MAX).to_be_bytes());
            h.update(s.as_bytes());
        };
        field(&self.name);
        for c in &self.columns {
            field(&c.name);
            field(&c.native_type);
            field(if c.not_null { "not null" } else { "null" });
        }
        field(&self.primary_key.join(","));
        for u in &self.uniques {
            field(&u.join(","));
        }
        for f in &self.foreign_keys {
            field(&format!(
                "{}>{}({}) {} {}",
                f.columns.join(","),
                f.parent,
                f.parent_columns.join(","),
                f.on_delete,
                f.on_update
            ));
        }
        h.finish().to_hex()
    }

    /// How this definition differs from `registered`, the one the organization runs with, one
    /// finding per difference (empty: none), for an operator to undo.
    pub fn changes_from(&self, registered: &CatalogTable) -> Vec<String> {
        let mut changes = Vec::new();
        let shown =
            |d: &Option<String>| d.as_deref().map_or("none".to_owned(), |d| format!("`{d}`"));
        for r in &registered.columns {
            match self.columns.iter().find(|c| c.name == r.name) {
                None => changes.push(format!("column {} was dropped", r.name)),
                Some(c) => {
                    if c.native_type != r.native_type {
                        changes.push(format!(
                            "column {} has type {} instead of {}",
                            r.name, c.native_type, r.native_type
                        ));
                    }
                    if c.not_null != r.not_null {
                        let nn = |b: bool| if b { "NOT NULL" } else { "nullable" };
                        changes.push(format!(
                            "column {} is {} instead of {}",
                            r.name,
                            nn(c.not_null),
                            nn(r.not_null)
                        ));
                    }
                    if c.default != r.default {
                        changes.push(format!(
                            "column {}'s default is {} instead of {}",
                            r.name,
                            shown(&c.default),
                            shown(&r.default)
                        ));
                    }
                    if c.engine_problem != r.engine_problem
                        && let Some(p) = &c.engine_problem
                    {
                        changes.push(format!("column {}: {p}", r.name));
                    }
                }
            }
        }
        for c in &self.columns {
            if !registered.columns.iter().any(|r| r.name == c.name) {
                changes.push(format!("column {} was added", c.name));
            }
        }
        let order = |t: &CatalogTable| t.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        if changes.is_empty() && order(self) != order(registered) {
            changes.push("the columns are in another order".into());
        }
        if self.primary_key != registered.primary_key {
            changes.push(format!(
                "the primary key is ({}) instead of ({})",
                self.primary_key.join(", "),
                registered.primary_key.join(", ")
            ));
        }
        if self.uniques != registered.uniques {
            let list = |u: &[Vec<String>]| {
                u.iter()
                    .map(|cols| format!("({})", cols.join(", ")))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            changes.push(format!(
                "the unique constraints are [{}] instead of [{}]",
                list(&self.uniques),
                list(&registered.uniques)
            ));
        }
        if self.foreign_keys != registered.foreign_keys {
            changes.push("its foreign keys changed".into());
        }
        for r in &registered.checks {
            match self.checks.iter().find(|c| c.name == r.name) {
                None => changes.push(format!("CHECK constraint {} was dropped", r.name)),
                Some(c) if c.clause != r.clause => changes.push(format!(
                    "CHECK constraint {} is `{}` instead of `{}`",
                    r.name, c.clause, r.clause
                )),
                Some(_) => {}
            }
        }
        for c in &self.checks {
            if !registered.checks.iter().any(|r| r.name == c.name) {
                changes.push(format!(
                    "CHECK constraint {} `{}` was added",
                    c.name, c.clause
                ));
            }
        }
        for p in &self.problems {
            if !registered.problems.contains(p) {
                changes.push(p.clone());
            }
        }

        let same = CatalogTable {
            referenced_by: registered.referenced_by.clone(),
            ..self.clone()
        } == *registered;
        if changes.is_empty() && !same {
            changes.push("its definition changed".into());
        }
        changes
    }

    /// Checks the rules for shared tables and converts to the analyser's table description.
    pub fn to_shared(&self) -> Result<Table, RegistrationError> {
        let def = |problem: String| RegistrationError::Definition {
            table: self.name.clone(),
            problem,
        };
        if !is_plain_name(&self.name) {
            return Err(def(
                "shared table names must be lower case letters, digits and '_', starting with a letter or '_'".into(),
            ));
        }
        if self.name.starts_with("chainify_") {
            return Err(def(
                "names starting with chainify_ are reserved for chainify's own tables and aliases"
                    .into(),
            ));
        }
        if self.name.len() > MAX_TABLE_NAME {
            return Err(def(format!(
                "name has {} characters; shared table names have at most {MAX_TABLE_NAME} (the generated digest objects add a prefix)",
                self.name.len()
            )));
        }
        if let Some(p) = self.problems.first() {
            return Err(def(p.clone()));
        }
        if self.primary_key.is_empty() {
            return Err(RegistrationError::NoPrimaryKey {
                table: self.name.clone(),
            });
        }
        for c in &self.columns {
            if !is_plain_name(&c.name) {
                return Err(def(format!(
                    "column {:?}: column names must be lower case letters, digits and '_'",
                    c.name
                )));
            }
            let unsupported = |hint: &str| RegistrationError::UnsupportedType {
                table: self.name.clone(),
                column: c.name.clone(),
                ty: c.native_type.clone(),
                hint: hint.to_owned(),
            };
            match &c.ty {
                ColumnType::Float => {
                    return Err(unsupported(
                        "floating point is rounded differently by each engine; use DECIMAL(p, s)",
                    ));
                }
                ColumnType::Decimal { scale: None } => {
                    return Err(unsupported(
                        "declare the scale, e.g. DECIMAL(18, 2), so every engine stores the same digits",
                    ));
                }
                ColumnType::Other(_) => {
                    return Err(unsupported(
                        "portable types are integers, DECIMAL(p, s), VARCHAR/TEXT, BOOLEAN and bytes",
                    ));
                }
                _ => {}
            }
            if let Some(problem) = &c.engine_problem {
                return Err(unsupported(problem));
            }
            if let Some(problem) = c.default.as_deref().and_then(|d| default_problem(c, d)) {
                return Err(def(format!("column {}: {problem}", c.name)));
            }
        }
        let index = |name: &str| -> Result<usize, RegistrationError> {
            self.columns
                .iter()
                .position(|c| c.name == name)
                .ok_or_else(|| def(format!("constraint names unknown column {name}")))
        };
        let primary_key = self
            .primary_key
            .iter()
            .map(|k| index(k))
            .collect::<Result<Vec<_>, _>>()?;
        for k in &primary_key {
            let c = &self.columns[*k];
            if !c.not_null {
                return Err(def(format!(
                    "primary-key column {} must be declared NOT NULL (this engine would accept NULL keys)",
                    c.name
                )));
            }
        }
        let mut uniques = Vec::new();
        for u in &self.uniques {
            let cols = u.iter().map(|c| index(c)).collect::<Result<Vec<_>, _>>()?;
            if !uniques.contains(&cols) && cols != primary_key {
                uniques.push(cols);
            }
        }
        let foreign_keys = self
            .foreign_keys
            .iter()
            .map(|f| {
                let action = |spelled: &str, event: &str| {
                    declared(spelled).ok_or_else(|| {
                        def(format!(
                            "foreign key to {}: ON {event} action `{spelled}` is not one chainify knows (NO ACTION, RESTRICT, CASCADE, SET NULL, SET DEFAULT)",
                            f.parent
                        ))
                    })
                };
                let declared = [action(&f.on_delete, "DELETE")?, action(&f.on_update, "UPDATE")?];
                Ok(ForeignKey {
                    columns: f
                        .columns
                        .iter()
                        .map(|c| index(c))
                        .collect::<Result<_, _>>()?,
                    parent: f.parent.clone(),
                    parent_columns: f.parent_columns.clone(),
                    declared,
                })
            })
            .collect::<Result<Vec<_>, RegistrationError>>()?;
        let columns: Vec<Column> = self
            .columns
            .iter()
            .map(|c| Column {
                name: c.name.clone(),
                ty: c.ty.clone(),
                limit: Limit::of_declared(&c.native_type, &c.ty),
                not_null: c.not_null,
            })
            .collect();
        for check in &self.checks {
            if let Some(problem) = check_problem(&columns, &check.clause, check.dialect) {
                return Err(def(format!("CHECK constraint {}: {problem}", check.name)));
            }
        }
        Ok(Table {
            name: self.name.clone(),
            columns,
            primary_key,
            uniques,
            foreign_keys,
        })
    }
}

/// A default the engines may not fill in alike, or `None` for a literal every engine stores as
/// the same value: NULL, an integer or decimal within the column's type, TRUE or FALSE, or a
/// quoted string within its length, cast (PostgreSQL prints casts) only to the column's own
/// type. Anything else (a sequence, identity or auto-increment, a generated column, a function
/// such as `now()` or `random()`, an expression, a cast through another type such as
/// `'now'::timestamptz`, which PostgreSQL evaluates once, when the table is created) gives each
/// organization its own value, so their states and digests would part.
pub fn default_problem(column: &CatalogColumn, default: &str) -> Option<String> {
    let refuse = |why: &str| {
        Some(format!(
            "its default `{default}` {why}; give the value in every INSERT, or declare a literal default"
        ))
    };
    let Some((literal, casts)) = parse_literal(default) else {
        return refuse("is not a literal: each organization's engine would fill in its own value");
    };
    // The cast names PostgreSQL prints for a literal of each portable type.
    let own_type = |cast: &str| {
        let name = cast.split('(').next().unwrap_or("").trim();
        match &column.ty {
            ColumnType::Int => matches!(name, "integer" | "bigint" | "smallint"),
            ColumnType::Decimal { .. } => name == "numeric",
            ColumnType::Text => matches!(name, "text" | "character varying"),
            ColumnType::Bool => name == "boolean",
            _ => false,
        }
    };
    if let Some(cast) = casts.iter().find(|c| !own_type(c)) {
        return refuse(&format!(
            "goes through the type {cast}, whose value each engine, session or day may print otherwise"
        ));
    }
    let value = match &literal {
        Literal::Null => return None,
        Literal::Bare(v) | Literal::Quoted(v) => v.as_str(),
    };
    let limit = Limit::of_declared(&column.native_type, &column.ty);
    // The literal as the value it stores (a decimal with no more digits after the point than
    // the column keeps: engines round or refuse the others differently), then the column's
    // declared width, precision or length, as parameters are checked.
    let stored = match &column.ty {
        ColumnType::Int => match value
            .parse::<Decimal>()
            .ok()
            .and_then(Decimal::to_i64_exact)
        {
            Some(i) if !value.contains('.') => Value::Int(i),
            _ => return refuse("is not an integer of the column's type"),
        },
        ColumnType::Decimal { scale: Some(scale) } => match value.parse::<Decimal>() {
            Ok(d) if d.scale() <= *scale => Value::Decimal(d),
            _ => {
                return refuse(
                    "is not a decimal within the column's precision and scale (engines round or refuse it differently)",
                );
            }
        },
        // Bare only: SQLite would keep a quoted 'true' as text, which no boolean is.
        ColumnType::Bool => {
            let bare = matches!(&literal, Literal::Bare(_));
            return match value.to_ascii_lowercase().as_str() {
                "true" | "false" | "0" | "1" if bare => None,
                _ => refuse("is not TRUE or FALSE"),
            };
        }
        ColumnType::Text => {
            let Literal::Quoted(text) = &literal else {
                return refuse("is not a quoted string");
            };
            if text.chars().any(char::is_control) {
                return refuse(
                    "holds a control character, which engines store or refuse differently",
                );
            }
            // MySQL reads `'a\nb'` as a newline, the others as a backslash and an n (and MariaDB
            // prints its defaults escaped so).
            if text.contains('\\') {
                return refuse(
                    "holds a backslash, which MySQL reads as an escape and the others as a character",
                );
            }
            Value::Text(text.clone())
        }
        _ => return refuse("is not NULL: engines print and store such literals differently"),
    };
    limit.admits(&stored).err().and_then(|what| match stored {
        Value::Int(_) => refuse(&format!("is not an integer of the column's type ({what})")),
        Value::Decimal(_) => refuse(&format!(
            "is not a decimal within the column's precision and scale ({what})"
        )),
        _ => refuse(&format!(
            "is longer than the column ({what}; SQLite would store it whole, the others refuse it)"
        )),
    })
}

/// A default as a catalog prints it, reduced to its literal: `NULL`, a bare word or number, or
/// a quoted string (`''` unescaped), inside any parentheses.
enum Literal {
    Null,
    Bare(String),
    Quoted(String),
}

/// The literal of a default and the casts PostgreSQL prints after it (`'-5'::integer`,
/// `'ab'::character varying`), outermost last; `None` for anything but a literal.
fn parse_literal(text: &str) -> Option<(Literal, Vec<String>)> {
    let mut t = text.trim();
    while let Some(inner) = t.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
        t = inner.trim();
    }
    let (literal, rest) = if let Some(body) = t.strip_prefix('\'') {
        let mut value = String::new();
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        while let Some((i, ch)) = chars.next() {
            if ch == '\'' {
                if chars.peek().is_some_and(|&(_, next)| next == '\'') {
                    chars.next();
                    value.push('\'');
                } else {
                    end = Some(i + 1);
                    break;
                }
            } else {
                value.push(ch);
            }
        }
        (Literal::Quoted(value), &body[end?..])
    } else {
        let end = t.find("::").unwrap_or(t.len());
        let word = t[..end].trim();
        let plain = !word.is_empty()
            && word
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.'));
        if !plain {
            return None;
        }
        let literal = if word.eq_ignore_ascii_case("null") {
            Literal::Null
        } else {
            Literal::Bare(word.to_owned())
        };
        (literal, &t[end..])
    };
    // Only casts may follow, each to a type name (`::numeric(10,2)`, `::character varying`).
    let mut casts = Vec::new();
    for (i, part) in rest.split("::").enumerate() {
        let part = part.trim();
        if i == 0 {
            if !part.is_empty() {
                return None;
            }
            continue;
        }
        let name_like = !part.is_empty()
            && part.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b' ' | b'_' | b'(' | b')' | b',')
            });
        if !name_like {
            return None;
        }
        casts.push(part.to_owned());
    }
    Some((literal, casts))
}

/// An action as the catalogs spell it: the SQL words (MySQL, SQLite; MariaDB reports a key
/// declared without one as RESTRICT, which it checks row by row as it does NO ACTION) or
/// PostgreSQL's `confdeltype` letters. `None` for a spelling chainify does not know, which
/// registration refuses rather than guess whether it writes the children.
fn declared(action: &str) -> Option<Declared> {
    let a = action.trim().to_ascii_uppercase().replace('_', " ");
    Some(match a.as_str() {
        "" | "NO ACTION" | "A" => Declared::NoAction,
        "RESTRICT" | "R" => Declared::Restrict,
        "CASCADE" | "C" => Declared::Cascade,
        "SET NULL" | "N" => Declared::SetNull,
        "SET DEFAULT" | "D" => Declared::SetDefault,
        _ => return None,
    })
}

/// `[a-z_][a-z0-9_]*`: needs no quoting on any engine and means the same everywhere.
pub fn is_plain_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

pub use chainify_sql::schema::declared_args;

/// Classifies a type name in the SQL spelling most engines share (`INTEGER`, `DECIMAL(10,2)`,
/// `VARCHAR(20)`, …). Returns the type and the declared precision of a decimal.
pub fn classify_declared_type(declared: &str) -> (ColumnType, Option<u32>) {
    let upper = declared.trim().to_ascii_uppercase();
    let (base, args) = match upper.split_once('(') {
        Some((b, rest)) => (b.trim(), rest.trim_end_matches(')').trim()),
        None => (upper.as_str(), ""),
    };
    let nums: Vec<u32> = args
        .split(',')
        .filter_map(|a| a.trim().parse().ok())
        .collect();
    let words: Vec<&str> = base.split_whitespace().collect();
    let first = words.first().copied().unwrap_or("");
    let ty = match first {
        "INT" | "INTEGER" | "BIGINT" | "SMALLINT" | "TINYINT" | "MEDIUMINT" | "INT2" | "INT4"
        | "INT8" => ColumnType::Int,
        "DECIMAL" | "NUMERIC" | "DEC" => {
            let scale = match nums.as_slice() {
                [_, s] => u8::try_from(*s).ok(),
                [_] => Some(0),
                _ => None,
            };
            ColumnType::Decimal { scale }
        }
        "TEXT" | "VARCHAR" | "CLOB" => ColumnType::Text,
        "CHARACTER" if words.get(1) == Some(&"VARYING") => ColumnType::Text,
        "BOOLEAN" | "BOOL" => ColumnType::Bool,
        "BLOB" | "BYTEA" | "VARBINARY" => ColumnType::Bytes,
        "REAL" | "FLOAT" | "DOUBLE" => ColumnType::Float,
        _ => ColumnType::Other(declared.trim().to_lowercase()),
    };
    let precision = match ty {
        ColumnType::Decimal { .. } => nums.first().copied(),
        _ => None,
    };
    (ty, precision)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chainify_sql::schema::RefAction;

    /// A NOT NULL column of the declared type (also used by the `ddl` tests).
    pub(crate) fn col(name: &str, native: &str) -> CatalogColumn {
        let (ty, precision) = classify_declared_type(native);
        CatalogColumn {
            name: name.into(),
            native_type: native.into(),
            ty,
            not_null: true,
            precision,
            engine_problem: None,
            default: None,
        }
    }

    /// Literal defaults as each engine's catalog prints them pass; what an engine computes, or
    /// a literal another engine would store otherwise, is refused with the default named.
    #[test]
    fn only_literal_defaults_every_engine_stores_alike_pass() {
        let ok = [
            ("BIGINT", "0"),
            ("BIGINT", "-5"),
            ("bigint", "'-5'::integer"),
            ("INTEGER", "(2147483647)"),
            ("BIGINT", "NULL"),
            ("bigint", "NULL::bigint"),
            ("DECIMAL(5,2)", "1.25"),
            ("numeric(5,2)", "'-999.9'::numeric"),
            ("DECIMAL(5,2)", "(0.5)"),
            ("BOOLEAN", "true"),
            ("BOOLEAN", "1"),
            ("BOOLEAN", "FALSE"),
            ("VARCHAR(5)", "'ab''c'"),
            ("character varying(3)", "'é東😀'::character varying"),
            ("TEXT", "''"),
            ("TEXT", "'::'::text"),
        ];
        for (ty, default) in ok {
            assert_eq!(
                default_problem(&col("v", ty), default),
                None,
                "{ty} {default}"
            );
        }
        let refused = [
            ("BIGINT", "nextval('t_v_seq'::regclass)", "is not a literal"),
            ("BIGINT", "GENERATED AS IDENTITY", "is not a literal"),
            ("BIGINT", "AUTO_INCREMENT", "is not a literal"),
            (
                "BIGINT",
                "GENERATED ALWAYS AS ((v + 1))",
                "is not a literal",
            ),
            ("BIGINT", "(`v` * 2)", "is not a literal"),
            ("BIGINT", "random()", "is not a literal"),
            ("TEXT", "CURRENT_TIMESTAMP", "is not a literal"),
            ("TEXT", "now", "is not a quoted string"),
            ("TEXT", "now()", "is not a literal"),
            (
                "SMALLINT",
                "40000",
                "is not an integer of the column's type",
            ),
            ("BIGINT", "1.5", "is not an integer"),
            ("BIGINT", "1e3", "is not an integer"),
            ("DECIMAL(5,2)", "1.005", "precision and scale"),
            ("DECIMAL(5,2)", "1000", "precision and scale"),
            ("BOOLEAN", "2", "is not TRUE or FALSE"),
            ("VARCHAR(3)", "'abcd'", "longer than the column"),
            ("TEXT", "'a' || 'b'", "is not a literal"),
            ("TEXT", "'a'::text || 'b'::text", "is not a literal"),
            ("TEXT", "'unterminated", "is not a literal"),
            ("TEXT", "'tab\there'", "control character"),
            ("BYTEA", "'\\x0102'::bytea", "goes through the type bytea"),
            (
                "TEXT",
                "'2026-11-29 02:39:05+00'::timestamp with time zone",
                "goes through the type timestamp with time zone",
            ),
            (
                "TEXT",
                "'1 day 02:00:00'::interval",
                "goes through the type interval",
            ),
            ("BIGINT", "'5'::text", "goes through the type text"),
            ("BOOLEAN", "'true'", "is not TRUE or FALSE"),
            ("BOOLEAN", "'1'", "is not TRUE or FALSE"),
            ("VARCHAR(5)", "'a\\nb'", "holds a backslash"),
            ("TEXT", "", "is not a literal"),
            ("TEXT", "abc", "is not a quoted string"),
        ];
        for (ty, default, why) in refused {
            let problem = default_problem(&col("v", ty), default)
                .unwrap_or_else(|| panic!("{ty} {default} passed"));
            assert!(
                problem.contains(why) && problem.contains(default),
                "{ty} {default}: {problem}"
            );
        }
        // Registration names the table and the column.
        let mut t = table();
        t.columns[1].default = Some("now()".into());
        let e = t.to_shared().expect_err("refused").to_string();
        assert!(
            e.contains("checking") && e.contains("column bal: its default `now()`"),
            "{e}"
        );
    }

    fn table() -> CatalogTable {
        CatalogTable {
            name: "checking".into(),
            columns: vec![col("custid", "BIGINT"), col("bal", "DECIMAL(18,2)")],
            primary_key: vec!["custid".into()],
            uniques: vec![vec!["custid".into()]],
            foreign_keys: vec![CatalogForeignKey {
                columns: vec!["custid".into()],
                parent: "accounts".into(),
                parent_columns: vec!["custid".into()],
                on_delete: "CASCADE".into(),
                on_update: "NO ACTION".into(),
            }],
            checks: vec![],
            referenced_by: vec![],
            problems: vec![],
        }
    }

    #[test]
    fn check_constraints_are_shared_only_when_every_engine_computes_them_alike() {
        let mut t = table();
        t.checks.push(CatalogCheck {
            name: "checking_custid_check".into(),
            clause: "(custid > '-1'::integer)".into(),
            dialect: Dialect::Postgres,
        });
        t.to_shared().expect("a comparison with a literal");
        t.checks.push(CatalogCheck {
            name: "checking_bal_check".into(),
            clause: "(bal >= (0)::numeric)".into(),
            dialect: Dialect::Postgres,
        });
        let e = t.to_shared().unwrap_err().to_string();
        assert!(
            e.starts_with("table checking: CHECK constraint checking_bal_check: `"),
            "{e}"
        );
        t.checks.pop();
        t.checks.push(CatalogCheck {
            name: "CONSTRAINT_1".into(),
            clause: "octet_length(`bal`) < 4".into(),
            dialect: Dialect::MySql,
        });
        let e = t.to_shared().unwrap_err().to_string();
        assert!(
            e.starts_with("table checking: CHECK constraint CONSTRAINT_1: `octet_length("),
            "{e}"
        );
        assert!(e.contains("calls octet_length()"), "{e}");
    }

    #[test]
    fn a_good_table_converts() {
        let t = table().to_shared().unwrap();
        assert_eq!(t.primary_key, vec![0]);
        assert!(t.uniques.is_empty(), "a UNIQUE equal to the key is dropped");
        assert_eq!(t.columns[1].ty, ColumnType::Decimal { scale: Some(2) });
        assert_eq!(t.foreign_keys[0].on_delete(), RefAction::Modify);
        assert_eq!(t.foreign_keys[0].on_update(), RefAction::Restrict);
        assert_eq!(
            t.foreign_keys[0].declared,
            [Declared::Cascade, Declared::NoAction]
        );
    }

    #[test]
    fn every_catalog_spelling_of_an_action_is_read_and_others_are_refused() {
        // PostgreSQL's letters, and the words MySQL and SQLite use.
        for (spellings, action) in [
            (["a", "NO ACTION", ""], Declared::NoAction),
            (["r", "RESTRICT", "restrict"], Declared::Restrict),
            (["c", "CASCADE", "cascade"], Declared::Cascade),
            (["n", "SET NULL", "SET_NULL"], Declared::SetNull),
            (["d", "SET DEFAULT", "set default"], Declared::SetDefault),
        ] {
            for spelled in spellings {
                let mut t = table();
                t.foreign_keys[0].on_update = spelled.into();
                let fk = &t.to_shared().unwrap().foreign_keys[0];
                assert_eq!(fk.declared[1], action, "{spelled:?}");
                assert_eq!(fk.on_update(), RefAction::from(action), "{spelled:?}");
            }
        }
        let mut t = table();
        t.foreign_keys[0].on_delete = "SET SOMETHING".into();
        assert_eq!(
            t.to_shared().unwrap_err().to_string(),
            "table checking: foreign key to accounts: ON DELETE action `SET SOMETHING` is not one chainify knows (NO ACTION, RESTRICT, CASCADE, SET NULL, SET DEFAULT)"
        );
    }

    #[test]
    fn each_rule_names_table_and_column() {
        let mut t = table();
        t.primary_key.clear();
        assert_eq!(
            t.to_shared().unwrap_err().to_string(),
            "table checking has no primary key; shared tables need one (rows are identified by it in read/write sets and digests)"
        );
        for (native, needle) in [
            ("DOUBLE PRECISION", "floating point"),
            ("NUMERIC", "declare the scale"),
            ("TIMESTAMP", "portable types are"),
        ] {
            let mut t = table();
            t.columns[1] = col("bal", native);
            let msg = t.to_shared().unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!(
                    "table checking column bal: unsupported type {native}:"
                )),
                "{msg}"
            );
            assert!(msg.contains(needle), "{msg}");
        }
        let mut t = table();
        t.columns[0].not_null = false;
        assert!(
            t.to_shared()
                .unwrap_err()
                .to_string()
                .contains("primary-key column custid must be declared NOT NULL")
        );
        let mut t = table();
        t.name = "Checking".into();
        assert!(
            t.to_shared()
                .unwrap_err()
                .to_string()
                .contains("lower case")
        );
        let mut t = table();
        t.name = "t".repeat(49);
        assert!(
            t.to_shared()
                .unwrap_err()
                .to_string()
                .contains("at most 48")
        );
        let mut t = table();
        t.columns[1].engine_problem = Some("collation utf8mb4_general_ci ignores case".into());
        assert!(t.to_shared().unwrap_err().to_string().ends_with(
            "unsupported type DECIMAL(18,2): collation utf8mb4_general_ci ignores case"
        ));
    }

    #[test]
    fn fingerprint_sees_definition_changes() {
        let a = table().fingerprint();
        assert_eq!(a, table().fingerprint());
        assert_ne!(a, table().fingerprint_v1(), "the versions are told apart");
        let mut t = table();
        t.columns[1].native_type = "DECIMAL(18,3)".into();
        assert_ne!(t.fingerprint(), a);
        let mut t = table();
        t.uniques.push(vec!["bal".into()]);
        assert_ne!(t.fingerprint(), a);
        // What the first version did not see: a default, a CHECK, a problem found.
        let v1 = table().fingerprint_v1();
        let mut t = table();
        t.columns[1].default = Some("0".into());
        assert_eq!(t.fingerprint_v1(), v1);
        assert_ne!(t.fingerprint(), a);
        let mut t = table();
        t.checks.push(CatalogCheck {
            name: "pos".into(),
            clause: "bal >= 0".into(),
            dialect: Dialect::Sqlite,
        });
        assert_eq!(t.fingerprint_v1(), v1);
        assert_ne!(t.fingerprint(), a);
        let mut t = table();
        t.problems.push("bump is a user trigger".into());
        assert_ne!(t.fingerprint(), a);
    }

    #[test]
    fn changes_are_named_for_the_operator() {
        let registered = table();
        assert_eq!(table().changes_from(&registered), Vec::<String>::new());
        let mut t = table();
        t.columns[1].default = Some("0".into());
        t.checks.push(CatalogCheck {
            name: "pos".into(),
            clause: "bal >= 0".into(),
            dialect: Dialect::Sqlite,
        });
        t.columns.push(CatalogColumn {
            name: "note".into(),
            ..t.columns[1].clone()
        });
        t.problems.push("bump is a user trigger".into());
        assert_eq!(
            t.changes_from(&registered),
            vec![
                "column bal's default is `0` instead of none".to_owned(),
                "column note was added".into(),
                "CHECK constraint pos `bal >= 0` was added".into(),
                "bump is a user trigger".into(),
            ]
        );
        assert_eq!(
            registered.changes_from(&t),
            vec![
                "column bal's default is none instead of `0`".to_owned(),
                "column note was dropped".into(),
                "CHECK constraint pos was dropped".into(),
            ]
        );
        let mut t = table();
        t.columns.swap(0, 1);
        assert_eq!(
            t.changes_from(&registered),
            vec!["the columns are in another order".to_owned()]
        );
    }

    #[test]
    fn declared_types() {
        assert_eq!(classify_declared_type("bigint"), (ColumnType::Int, None));
        assert_eq!(
            classify_declared_type("numeric(12, 3)"),
            (ColumnType::Decimal { scale: Some(3) }, Some(12))
        );
        assert_eq!(
            classify_declared_type("character varying(20)").0,
            ColumnType::Text
        );
        assert_eq!(classify_declared_type("BLOB").0, ColumnType::Bytes);
        assert_eq!(
            classify_declared_type("datetime").0,
            ColumnType::Other("datetime".into())
        );
    }
}
