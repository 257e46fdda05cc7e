//! The shared tables' schema as the analyser needs it: columns and their portable types, primary
//! key, UNIQUE constraints and foreign keys. Built from `CREATE TABLE` text ([`Schema::from_sql`],
//! for `chainify analyze` and tests) or programmatically from a database catalog (the storage
//! crate). Identifiers are case-folded to lower case.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sqlparser::ast::{
    ColumnOption, CreateTable, DataType, ExactNumberInfo, ForeignKeyConstraint, IndexColumn,
    ReferentialAction, Statement as SqlStatement, TableConstraint,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;

/// A column type as far as key comparison and portability are concerned.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ColumnType {
    /// SMALLINT, INT, INTEGER, BIGINT.
    Int,
    /// DECIMAL/NUMERIC with a declared scale (`None`: unconstrained NUMERIC).
    Decimal {
        /// Declared digits after the point.
        scale: Option<u8>,
    },
    /// TEXT, VARCHAR, CHAR.
    Text,
    /// BOOLEAN.
    Bool,
    /// BYTEA, BLOB, VARBINARY.
    Bytes,
    /// REAL, FLOAT, DOUBLE: allowed only with documented digest risk; never a portable key.
    Float,
    /// Anything else (dates, JSON, …): not portable.
    Other(String),
}

impl ColumnType {
    fn from_sql(t: &DataType) -> ColumnType {
        use DataType as D;
        match t {
            D::SmallInt(_)
            | D::Int(_)
            | D::Integer(_)
            | D::BigInt(_)
            | D::Int2(_)
            | D::Int4(_)
            | D::Int8(_)
            | D::TinyInt(_)
            | D::MediumInt(_) => ColumnType::Int,
            D::Decimal(info) | D::Numeric(info) | D::Dec(info) => ColumnType::Decimal {
                scale: match info {
                    ExactNumberInfo::PrecisionAndScale(_, s) => u8::try_from(*s).ok(),
                    ExactNumberInfo::Precision(_) => Some(0),
                    ExactNumberInfo::None => None,
                },
            },
            D::Text
            | D::Varchar(_)
            | D::Char(_)
            | D::Character(_)
            | D::CharVarying(_)
            | D::CharacterVarying(_)
            | D::String(_)
            | D::Nvarchar(_) => ColumnType::Text,
            D::Boolean | D::Bool => ColumnType::Bool,
            D::Bytea | D::Blob(_) | D::Varbinary(_) | D::Binary(_) => ColumnType::Bytes,
            D::Real
            | D::Float(_)
            | D::Double(_)
            | D::DoublePrecision
            | D::Float4
            | D::Float8
            | D::Float64 => ColumnType::Float,
            other => ColumnType::Other(other.to_string().to_lowercase()),
        }
    }

    /// Whether values of this type are stored and compared identically on every engine.
    pub fn is_portable(&self) -> bool {
        !matches!(
            self,
            ColumnType::Float | ColumnType::Other(_) | ColumnType::Decimal { scale: None }
        )
    }
}

impl fmt::Display for ColumnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ColumnType::Int => f.write_str("integer"),
            ColumnType::Decimal { scale: Some(s) } => write!(f, "decimal(scale {s})"),
            ColumnType::Decimal { scale: None } => f.write_str("numeric"),
            ColumnType::Text => f.write_str("text"),
            ColumnType::Bool => f.write_str("boolean"),
            ColumnType::Bytes => f.write_str("bytes"),
            ColumnType::Float => f.write_str("floating point"),
            ColumnType::Other(s) => f.write_str(s),
        }
    }
}

/// What a foreign key does to referencing rows when the referenced row is deleted or its key changes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum RefAction {
    /// RESTRICT / NO ACTION: the parent change is checked against children (a read of the child).
    #[default]
    Restrict,
    /// CASCADE / SET NULL / SET DEFAULT: the parent change modifies children (a write of the child).
    Modify,
}

impl From<Declared> for RefAction {
    fn from(a: Declared) -> Self {
        match a {
            Declared::NoAction | Declared::Restrict => RefAction::Restrict,
            Declared::Cascade | Declared::SetNull | Declared::SetDefault => RefAction::Modify,
        }
    }
}

/// A foreign key's action as declared. [`RefAction`] is what conflict analysis needs; the
/// registration rules also need when each is checked or applied.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Declared {
    /// NO ACTION (or nothing): checked once the statement's row changes are done (SQLite) or
    /// level by level as its actions cascade (PostgreSQL).
    #[default]
    NoAction,
    /// RESTRICT: SQLite checks it as each parent row changes.
    Restrict,
    /// CASCADE: the child rows are deleted, or their key columns updated, with the parent's.
    Cascade,
    /// SET NULL: the child rows' columns are updated to NULL.
    SetNull,
    /// SET DEFAULT: the child rows' columns are updated to their defaults.
    SetDefault,
}

impl From<Option<&ReferentialAction>> for Declared {
    fn from(a: Option<&ReferentialAction>) -> Self {
        match a {
            None | Some(ReferentialAction::NoAction) => Declared::NoAction,
            Some(ReferentialAction::Restrict) => Declared::Restrict,
            Some(ReferentialAction::Cascade) => Declared::Cascade,
            Some(ReferentialAction::SetNull) => Declared::SetNull,
            Some(ReferentialAction::SetDefault) => Declared::SetDefault,
        }
    }
}

impl Declared {
    /// The action as SQL spells it.
    pub fn sql(self) -> &'static str {
        match self {
            Declared::NoAction => "NO ACTION",
            Declared::Restrict => "RESTRICT",
            Declared::Cascade => "CASCADE",
            Declared::SetNull => "SET NULL",
            Declared::SetDefault => "SET DEFAULT",
        }
    }

    /// What the action does to a child row when its parent row goes through `parent`: nothing
    /// (a check), or the change it makes.
    fn applied(self, parent: Change) -> Option<Change> {
        match self {
            Declared::NoAction | Declared::Restrict => None,
            Declared::Cascade => Some(parent),
            Declared::SetNull | Declared::SetDefault => Some(Change::Update),
        }
    }
}

/// How one statement changes a table's rows.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Change {
    Delete,
    Update,
}

impl Change {
    /// Which of a foreign key's two actions the change of its parent fires.
    fn index(self) -> usize {
        match self {
            Change::Delete => 0,
            Change::Update => 1,
        }
    }

    fn sql(self) -> &'static str {
        match self {
            Change::Delete => "DELETE",
            Change::Update => "UPDATE",
        }
    }
}

/// What a column's declared type admits beyond its [`ColumnType`]: PostgreSQL and strict MySQL
/// refuse a value outside it, and chainify makes SQLite refuse it too.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Limit {
    /// No limit beyond the type's.
    #[default]
    None,
    /// A signed integer of this many bits (SMALLINT 16, INTEGER 32, BIGINT 64).
    IntBits(u8),
    /// DECIMAL(precision, scale): below 10^(precision − scale) after rounding to the scale.
    Decimal {
        /// Declared digits.
        precision: u8,
        /// Digits after the point.
        scale: u8,
    },
    /// VARCHAR(n): at most n characters.
    Chars(u32),
}

impl Limit {
    /// The limit of a declared type as an engine spells it (`integer`, `int(11)`,
    /// `character varying(12)`, `DECIMAL(10,2)`, `BIGINT`, …).
    pub fn of_declared(declared: &str, ty: &ColumnType) -> Limit {
        let lower = declared.trim().to_ascii_lowercase();
        let base = lower.split('(').next().unwrap_or("").trim();
        let first = base.split_whitespace().next().unwrap_or("");
        let args = declared_args(&lower);
        match ty {
            ColumnType::Int => Limit::IntBits(match first {
                "tinyint" => 8,
                "smallint" | "int2" => 16,
                "mediumint" => 24,
                "int" | "integer" | "int4" => 32,
                _ => 64,
            }),
            ColumnType::Decimal { scale: Some(s) } => match args.first() {
                Some(p) => Limit::Decimal {
                    precision: u8::try_from(*p).unwrap_or(u8::MAX),
                    scale: *s,
                },
                None => Limit::None,
            },
            ColumnType::Text if base.contains("char") => {
                args.first().map_or(Limit::None, |n| Limit::Chars(*n))
            }
            _ => Limit::None,
        }
    }
}

impl Limit {
    /// Whether a value fits this declared limit, as the engines store it (a decimal rounded to
    /// the scale first); `Err` says what the column takes.
    pub fn admits(self, v: &chainify_core::Value) -> Result<(), String> {
        use chainify_core::Value;
        match (v, self) {
            (Value::Int(i), Limit::IntBits(b)) if b < 64 => {
                let max = (1i64 << (b - 1)) - 1;
                if (-max - 1..=max).contains(i) {
                    Ok(())
                } else {
                    Err(format!("a {b}-bit integer"))
                }
            }
            (Value::Int(_) | Value::Decimal(_), Limit::Decimal { precision, scale }) => {
                let d = match v {
                    Value::Int(i) => chainify_core::Decimal::new(i128::from(*i), 0),
                    Value::Decimal(d) => Some(*d),
                    _ => None,
                };
                let bound = 10i128.checked_pow(u32::from(precision));
                match (d.and_then(|d| d.round_to(scale)), bound) {
                    (Some(r), Some(b)) if r.mantissa().abs() < b => Ok(()),
                    _ => Err(format!("DECIMAL({precision}, {scale})")),
                }
            }
            (Value::Text(s), Limit::Chars(n)) => {
                if s.chars().count() <= n as usize {
                    Ok(())
                } else {
                    Err(format!("at most {n} characters"))
                }
            }
            _ => Ok(()),
        }
    }
}

/// The numbers in a declared type's parentheses (`VARCHAR(20)` → `[20]`, `DECIMAL(12, 2)` →
/// `[12, 2]`).
pub fn declared_args(declared: &str) -> Vec<u32> {
    declared
        .split_once('(')
        .map(|(_, rest)| {
            rest.split(')')
                .next()
                .unwrap_or("")
                .split(',')
                .filter_map(|a| a.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A column.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Column {
    /// Lower-case name.
    pub name: String,
    /// Type.
    pub ty: ColumnType,
    /// What the declared type admits (width, precision, length).
    pub limit: Limit,
    /// Declared NOT NULL (primary-key columns always are): an operand that cannot be NULL
    /// never lets SQLite skip a subquery beside it (see `portable`'s `may_be_null`).
    pub not_null: bool,
}

/// A foreign key of a child table.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ForeignKey {
    /// Referencing columns (indexes into the child's columns).
    pub columns: Vec<usize>,
    /// Referenced table.
    pub parent: String,
    /// Referenced columns by name (the parent's primary key or one of its UNIQUE constraints).
    pub parent_columns: Vec<String>,
    /// The actions as declared, on delete and on update: which only check and which change
    /// rows, and how.
    pub declared: [Declared; 2],
}

impl ForeignKey {
    /// Effect of deleting a parent row.
    pub fn on_delete(&self) -> RefAction {
        self.declared[0].into()
    }

    /// Effect of changing a parent's referenced key.
    pub fn on_update(&self) -> RefAction {
        self.declared[1].into()
    }
}

/// A table.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Table {
    /// Lower-case name.
    pub name: String,
    /// Columns in declaration order.
    pub columns: Vec<Column>,
    /// Primary-key columns (indexes into `columns`), in key order; empty when the table has none.
    pub primary_key: Vec<usize>,
    /// UNIQUE constraints other than the primary key.
    pub uniques: Vec<Vec<usize>>,
    /// Foreign keys.
    pub foreign_keys: Vec<ForeignKey>,
}

impl Table {
    /// Index of a column by (case-insensitive) name.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns
            .iter()
            .position(|c| c.name.eq_ignore_ascii_case(name))
    }

    /// For each column, the most bytes a text or bytes value stored into it may hold (`None`:
    /// any value its type admits fits). A value in the primary key or a UNIQUE constraint is
    /// an entry of a B-tree index, which PostgreSQL refuses beyond 2 704 bytes (an
    /// incompressible value) where MariaDB and SQLite store it: one client's long key would
    /// abort a transaction on PostgreSQL alone, and one a little shorter still breaks the
    /// PostgreSQL snapshot tables' keys (8 bytes more). Each key's columns share
    /// [`MAX_KEY_BYTES`], the bounded ones first taking what they can hold; a column in several
    /// keys takes its smallest share. The same on every engine: it follows from the portable
    /// types alone.
    pub fn key_bytes(&self) -> Vec<Option<u64>> {
        let mut caps: Vec<Option<u64>> = vec![None; self.columns.len()];
        for key in std::iter::once(&self.primary_key).chain(&self.uniques) {
            for (i, share) in key_shares(&self.columns, key) {
                let c = &self.columns[i];
                if max_value_bytes(c).is_none_or(|max| max > share) {
                    caps[i] = Some(caps[i].map_or(share, |cap| cap.min(share)));
                }
            }
        }
        caps
    }

    /// Name of the unique-key space of constraint `i` (`table#unique(a,b)`).
    pub fn unique_space_name(&self, i: usize) -> String {
        let cols: Vec<&str> = self.uniques[i]
            .iter()
            .map(|c| self.columns[*c].name.as_str())
            .collect();
        format!("{}#unique({})", self.name, cols.join(","))
    }
}

/// The most bytes of one key's entry, its columns' data and [`KEY_COLUMN_OVERHEAD`] each:
/// within PostgreSQL's 2 704 for a B-tree entry, with its header and a snapshot's 8-byte block
/// column beside the key.
pub const MAX_KEY_BYTES: u64 = 2_600;

/// What a column costs in a key entry beside its data (a length header and alignment).
const KEY_COLUMN_OVERHEAD: u64 = 8;

/// What a value of a fixed-size type takes in a key, at most (an integer 8 bytes; a decimal of
/// at most 38 digits in PostgreSQL's base-10 000 groups, ~28).
const FIXED_KEY_BYTES: u64 = 32;

/// The most bytes a value of `c` holds, as declared (`None`: no bound but the type's).
fn max_value_bytes(c: &Column) -> Option<u64> {
    match (&c.ty, c.limit) {
        (ColumnType::Text, Limit::Chars(n)) => Some(4 * u64::from(n)),
        (ColumnType::Text | ColumnType::Bytes, _) => None,
        _ => Some(FIXED_KEY_BYTES),
    }
}

/// The bytes each text or bytes column of `key` may take: [`MAX_KEY_BYTES`] less the fixed
/// ones' and every column's overhead, shared out from the smallest declared bound up (a column
/// needing less than an equal share leaves the rest to the others).
fn key_shares(columns: &[Column], key: &[usize]) -> Vec<(usize, u64)> {
    let mut left = MAX_KEY_BYTES;
    let mut variable: Vec<(usize, Option<u64>)> = Vec::new();
    for &i in key {
        left = left.saturating_sub(KEY_COLUMN_OVERHEAD);
        match (&columns[i].ty, max_value_bytes(&columns[i])) {
            (ColumnType::Text | ColumnType::Bytes, max) => variable.push((i, max)),
            (_, max) => left = left.saturating_sub(max.unwrap_or(FIXED_KEY_BYTES)),
        }
    }
    // Unbounded last; ties by position, so that the shares do not depend on the sort.
    variable.sort_by_key(|&(i, max)| (max.is_none(), max, i));
    let mut shares = Vec::with_capacity(variable.len());
    let mut count = variable.len() as u64;
    for (i, max) in variable {
        let equal = left / count.max(1);
        let share = max.map_or(equal, |m| m.min(equal));
        shares.push((i, share));
        left -= share;
        count -= 1;
    }
    shares
}

/// A schema problem, naming the table and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The SQL text did not parse.
    #[error("schema does not parse: {0}")]
    Parse(String),
    /// A statement other than CREATE TABLE.
    #[error("schema statement {index}: only CREATE TABLE statements are allowed, found `{found}`")]
    NotCreateTable {
        /// 1-based statement number.
        index: usize,
        /// The statement's first words.
        found: String,
    },
    /// Something inside a table definition is wrong.
    #[error("table {table}: {problem}")]
    Table {
        /// The table.
        table: String,
        /// What is wrong.
        problem: String,
    },
}

/// The shared tables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schema {
    tables: BTreeMap<String, Table>,
}

/// A foreign key's columns by name, for messages.
fn columns_of(t: &Table, fk: &ForeignKey) -> String {
    fk.columns
        .iter()
        .map(|c| t.columns.get(*c).map_or("?", |c| c.name.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one statement changes through cascading actions (see [`Schema::cascades_from`]).
#[derive(Default)]
struct Cascades<'s> {
    /// How each table's rows change, the statement's own table included.
    changes: BTreeMap<&'s str, BTreeSet<Change>>,
    /// For each table changed through its foreign keys: which keys (by index), each with the
    /// change of the parent that fires it.
    edges: BTreeMap<&'s str, BTreeSet<(usize, Change)>>,
}

impl Schema {
    /// An empty schema.
    pub fn new() -> Self {
        Schema::default()
    }

    /// Parses `CREATE TABLE` statements (PRIMARY KEY, UNIQUE, REFERENCES / FOREIGN KEY, inline or
    /// as table constraints) and validates the result.
    pub fn from_sql(sql: &str) -> Result<Schema, SchemaError> {
        let statements = Parser::parse_sql(&GenericDialect {}, sql)
            .map_err(|e| SchemaError::Parse(e.to_string()))?;
        let mut schema = Schema::new();
        for (i, st) in statements.iter().enumerate() {
            match st {
                SqlStatement::CreateTable(ct) => schema.add(table_from_create(ct)?)?,
                other => {
                    let text = other.to_string();
                    return Err(SchemaError::NotCreateTable {
                        index: i + 1,
                        found: text
                            .split_whitespace()
                            .take(3)
                            .collect::<Vec<_>>()
                            .join(" "),
                    });
                }
            }
        }
        resolve_implicit_references(&mut schema);
        schema.validate()?;
        Ok(schema)
    }

    /// Adds a table (not yet cross-validated: call [`Schema::validate`] after adding all).
    pub fn add(&mut self, table: Table) -> Result<(), SchemaError> {
        if self.tables.contains_key(&table.name) {
            return Err(SchemaError::Table {
                table: table.name,
                problem: "defined twice".into(),
            });
        }
        self.tables.insert(table.name.clone(), table);
        Ok(())
    }

    /// Checks foreign keys: the parent exists and the referenced columns are its primary key or
    /// one of its UNIQUE constraints, with as many columns as the foreign key.
    pub fn validate(&self) -> Result<(), SchemaError> {
        for t in self.tables.values() {
            for fk in &t.foreign_keys {
                let err = |problem: String| SchemaError::Table {
                    table: t.name.clone(),
                    problem,
                };
                let parent = self.tables.get(&fk.parent).ok_or_else(|| {
                    err(format!(
                        "foreign key references unknown table {}",
                        fk.parent
                    ))
                })?;
                if fk.parent_columns.len() != fk.columns.len() {
                    return Err(err(format!(
                        "foreign key to {} has {} columns but references {}",
                        fk.parent,
                        fk.columns.len(),
                        fk.parent_columns.len()
                    )));
                }
                if self.referenced_space(fk).is_none() {
                    return Err(err(format!(
                        "foreign key references {}({}), which is neither its primary key nor a UNIQUE constraint",
                        parent.name,
                        fk.parent_columns.join(", ")
                    )));
                }
                // SET DEFAULT moves child rows to a default key whose parent the engine looks up
                // and whose rows may then collide: the analysis follows neither, and MariaDB
                // silently keeps it as RESTRICT.
                if fk.declared.contains(&Declared::SetDefault) {
                    return Err(err(format!(
                        "foreign key ({}) has an ON DELETE or ON UPDATE SET DEFAULT action: MariaDB stores it as RESTRICT while the other engines move the child rows to the default, whose parent and keys the conflict analysis does not follow; use CASCADE, SET NULL, RESTRICT or NO ACTION",
                        columns_of(t, fk)
                    )));
                }
                // A child's key is stored at the child column's type and looked up in the
                // parent's: a coarser child (DECIMAL(5,1) under DECIMAL(5,3), INTEGER under
                // DECIMAL) stores 5.04 as 5.0 and looks up a parent the analysis did not name.
                // MariaDB refuses such keys too.
                for (c, pc) in fk.columns.iter().zip(&fk.parent_columns) {
                    let child = &t.columns[*c];
                    let parent_ty = parent.column(pc).map(|i| &parent.columns[i].ty);
                    if parent_ty != Some(&child.ty) {
                        return Err(err(format!(
                            "foreign key column {} is {} but references {}.{}, which is {}: a key is stored at the child's type and looked up at the parent's, so they must be the same type",
                            child.name,
                            child.ty,
                            parent.name,
                            pc,
                            parent_ty.map_or_else(|| "missing".to_owned(), ToString::to_string)
                        )));
                    }
                }
                // One statement changes rows of one table. A table referencing itself has that
                // statement change parents and children at once, and the engines check them at
                // different moments: MariaDB row by row, PostgreSQL at the end of the statement,
                // SQLite at the end for NO ACTION and row by row for RESTRICT. Deleting a row
                // that references itself, or a parent and its child together, then commits on
                // some engines and fails on others.
                if fk.parent == t.name {
                    return Err(err(format!(
                        "foreign key ({}) references the table itself: the engines check such a key at different moments within a statement (MariaDB row by row, PostgreSQL at the end), so deleting a row that references itself, or a parent and its child in one statement, succeeds on some and fails on others; keep the reference in a column without a foreign key, or in another table",
                        columns_of(t, fk)
                    )));
                }
                // A key change or delete whose action comes back through a cycle of tables to
                // the statement's own table changes rows there while the statement runs:
                // SQLite runs actions at once, PostgreSQL at the end of the statement, and
                // MariaDB refuses them at run time, so the engines would record, digest or even
                // commit it differently.
                let cyclic = self.reaches(&fk.parent, &t.name);
                for (event, action) in [("UPDATE", fk.on_update()), ("DELETE", fk.on_delete())] {
                    if action == RefAction::Modify && cyclic {
                        return Err(err(format!(
                            "foreign key to {} changes rows ON {event} (CASCADE, SET NULL or SET DEFAULT) within a cycle of foreign keys, where the action can come back to the table the statement changes and the engines apply it at different moments; declare it ON {event} RESTRICT or NO ACTION",
                            fk.parent
                        )));
                    }
                }
            }
        }
        self.check_cascade_diamonds()
    }

    /// Refuses the schemas where what one DELETE or UPDATE does through its cascading actions
    /// depends on the order the engine applies them in (PostgreSQL level by level as the actions
    /// cascade, each level in the order the constraints were created; SQLite as each row goes,
    /// in the order the tables were created):
    ///
    /// - a foreign key that only checks (NO ACTION or RESTRICT) a parent the statement changes,
    ///   in a table whose rows it also changes: PostgreSQL checks it once the level of the
    ///   parent's change is done, before deeper cascades have removed the referencing rows,
    ///   SQLite checks RESTRICT as each row goes and NO ACTION at the end of the statement, so
    ///   deleting a common ancestor committed on one and failed on the other (p ← c1 CASCADE,
    ///   c1 ← c2 CASCADE, c2 → p NO ACTION: PostgreSQL 15 fails, SQLite 3.40 commits);
    /// - a table whose rows two foreign keys change, one of them by updating them (SET NULL,
    ///   SET DEFAULT, or a CASCADE of an update): the update can fail (a NOT NULL, UNIQUE or
    ///   CHECK constraint) or reach further tables before the row is deleted or updated through
    ///   the other key, or find it gone after, so the statement's outcome would depend on the
    ///   order. Two keys that only delete the same rows agree in any order.
    fn check_cascade_diamonds(&self) -> Result<(), SchemaError> {
        for from in self.tables.keys() {
            for event in [Change::Delete, Change::Update] {
                let reach = self.cascades_from(from, event);
                for (table, edges) in &reach.edges {
                    let Some(t) = self.tables.get(*table) else {
                        continue;
                    };
                    // The first by columns: catalogs list a table's keys in different orders.
                    let check = t
                        .foreign_keys
                        .iter()
                        .filter_map(|fk| {
                            let change = reach
                                .changes
                                .get(fk.parent.as_str())
                                .into_iter()
                                .flatten()
                                .find(|c| fk.declared[c.index()].applied(**c).is_none())?;
                            Some((columns_of(t, fk), fk, *change))
                        })
                        .min_by(|a, b| a.0.cmp(&b.0));
                    if let Some((columns, fk, change)) = check {
                        let advice = if change == Change::Delete {
                            "declare it ON DELETE CASCADE too if every key that reaches the table only deletes its rows, or change the actions so that one statement cannot reach both"
                        } else {
                            "change the actions so that one statement cannot reach both"
                        };
                        return Err(SchemaError::Table {
                            table: t.name.clone(),
                            problem: format!(
                                "foreign key ({columns}) to {} only checks ON {} ({}) while {} {event_sql} of {from} can change both its rows and {}'s through CASCADE, SET NULL or SET DEFAULT: PostgreSQL checks it level by level as the actions cascade, SQLite as each row goes (RESTRICT) or at the end of the statement (NO ACTION), so the statement would commit on one and fail on the other; {advice}",
                                fk.parent,
                                change.sql(),
                                fk.declared[change.index()].sql(),
                                if event == Change::Update { "an" } else { "a" },
                                fk.parent,
                                event_sql = event.sql(),
                            ),
                        });
                    }
                    let updates = |(i, c): &(usize, Change)| {
                        t.foreign_keys[*i].declared[c.index()].applied(*c) == Some(Change::Update)
                    };
                    if edges.len() > 1 && edges.iter().any(updates) {
                        let describe = |(i, c): &(usize, Change)| {
                            let fk = &t.foreign_keys[*i];
                            format!(
                                "({}) to {} (ON {} {})",
                                columns_of(t, fk),
                                fk.parent,
                                c.sql(),
                                fk.declared[c.index()].sql()
                            )
                        };
                        // Sorted: catalogs list a table's keys in different orders.
                        let mut keys: Vec<String> = edges.iter().map(describe).collect();
                        keys.sort();
                        return Err(SchemaError::Table {
                            table: t.name.clone(),
                            problem: format!(
                                "its foreign keys {} can all change the same rows in one {} of {from}, at least one by updating them: the engines apply the actions in different orders, so an update that fails (NOT NULL, UNIQUE, CHECK), or reaches further tables, before or after the row is changed through the other key would commit on one engine and fail on another; change the actions so that one statement reaches the table through one key, or only deletes through each",
                                keys.join(" and "),
                                event.sql()
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// What one `event` on `from` changes through the foreign keys' actions, transitively,
    /// taking every update of a parent to change its referenced columns.
    fn cascades_from<'s>(&'s self, from: &'s str, event: Change) -> Cascades<'s> {
        let mut reach = Cascades::default();
        reach.changes.entry(from).or_default().insert(event);
        let mut pending = vec![(from, event)];
        while let Some((parent, change)) = pending.pop() {
            for t in self.tables.values() {
                for (i, fk) in t.foreign_keys.iter().enumerate() {
                    if fk.parent != parent {
                        continue;
                    }
                    let Some(applied) = fk.declared[change.index()].applied(change) else {
                        continue;
                    };
                    reach
                        .edges
                        .entry(t.name.as_str())
                        .or_default()
                        .insert((i, change));
                    if reach
                        .changes
                        .entry(t.name.as_str())
                        .or_default()
                        .insert(applied)
                    {
                        pending.push((t.name.as_str(), applied));
                    }
                }
            }
        }
        reach
    }

    /// Whether `to` is `from` or one of its parents, grandparents, … by foreign keys.
    fn reaches(&self, from: &str, to: &str) -> bool {
        let mut seen = BTreeSet::new();
        let mut pending = vec![from];
        while let Some(name) = pending.pop() {
            if name == to {
                return true;
            }
            if !seen.insert(name) {
                continue;
            }
            if let Some(t) = self.tables.get(name) {
                pending.extend(t.foreign_keys.iter().map(|fk| fk.parent.as_str()));
            }
        }
        false
    }

    /// A table by (case-insensitive) name.
    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables
            .get(name)
            .or_else(|| self.tables.get(&name.to_lowercase()))
    }

    /// All tables.
    pub fn tables(&self) -> impl Iterator<Item = &Table> {
        self.tables.values()
    }

    /// Which key space of the parent a foreign key points at: `None` for the primary key itself
    /// as `Some(KeySpace::Primary)`, or a unique constraint index.
    pub fn referenced_space(&self, fk: &ForeignKey) -> Option<KeySpace> {
        let parent = self.tables.get(&fk.parent)?;
        let cols: Option<Vec<usize>> = fk.parent_columns.iter().map(|c| parent.column(c)).collect();
        let cols = cols?;
        if cols == parent.primary_key {
            return Some(KeySpace::Primary);
        }
        parent
            .uniques
            .iter()
            .position(|u| *u == cols)
            .map(KeySpace::Unique)
    }

    /// [`Table::key_bytes`] of `table`, each column also held to the cap of every child column
    /// a foreign key ON UPDATE CASCADE copies it into (a parent key changed to a value that
    /// fits its own share would otherwise be written into a child's smaller one). Cascades do
    /// not cycle (registration refuses that), so this ends.
    pub fn key_bytes(&self, table: &str) -> Vec<Option<u64>> {
        let Some(t) = self.table(table) else {
            return Vec::new();
        };
        let mut caps = t.key_bytes();
        for (child, i) in self.children_of(&t.name) {
            let fk = &child.foreign_keys[i];
            if fk.declared[1] != Declared::Cascade || child.name == t.name {
                continue;
            }
            let child_caps = self.key_bytes(&child.name);
            for (c, parent_column) in fk.columns.iter().zip(&fk.parent_columns) {
                if let (Some(Some(cap)), Some(p)) = (child_caps.get(*c), t.column(parent_column)) {
                    caps[p] = Some(caps[p].map_or(*cap, |own| own.min(*cap)));
                }
            }
        }
        caps
    }

    /// Child tables with a foreign key to `parent`: (child, index of the foreign key).
    pub fn children_of<'a>(
        &'a self,
        parent: &'a str,
    ) -> impl Iterator<Item = (&'a Table, usize)> + 'a {
        self.tables.values().flat_map(move |t| {
            t.foreign_keys
                .iter()
                .enumerate()
                .filter(move |(_, fk)| fk.parent == parent)
                .map(move |(i, _)| (t, i))
        })
    }
}

/// A key space of a table: its primary key or one of its UNIQUE constraints.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum KeySpace {
    /// The primary key.
    Primary,
    /// UNIQUE constraint by index into [`Table::uniques`].
    Unique(usize),
}

fn index_columns(cols: &[IndexColumn]) -> Vec<String> {
    cols.iter()
        .map(|c| c.column.expr.to_string().trim_matches('"').to_lowercase())
        .collect()
}

fn table_from_create(ct: &CreateTable) -> Result<Table, SchemaError> {
    let name = crate::ident::object_name(&ct.name);
    let err = |problem: String| SchemaError::Table {
        table: name.clone(),
        problem,
    };
    let mut table = Table {
        name: name.clone(),
        columns: Vec::new(),
        primary_key: Vec::new(),
        uniques: Vec::new(),
        foreign_keys: Vec::new(),
    };
    let mut pending_fks: Vec<(Vec<String>, &ForeignKeyConstraint)> = Vec::new();
    let mut pks: Vec<Vec<String>> = Vec::new();
    let mut uniques: Vec<Vec<String>> = Vec::new();
    for col in &ct.columns {
        let cname = col.name.value.to_lowercase();
        if table.column(&cname).is_some() {
            return Err(err(format!("column {cname} is defined twice")));
        }
        let ty = ColumnType::from_sql(&col.data_type);
        table.columns.push(Column {
            name: cname.clone(),
            limit: Limit::of_declared(&col.data_type.to_string(), &ty),
            ty,
            not_null: col
                .options
                .iter()
                .any(|o| matches!(o.option, ColumnOption::NotNull)),
        });
        for opt in &col.options {
            match &opt.option {
                ColumnOption::PrimaryKey(_) => pks.push(vec![cname.clone()]),
                ColumnOption::Unique(_) => uniques.push(vec![cname.clone()]),
                ColumnOption::ForeignKey(fk) => pending_fks.push((vec![cname.clone()], fk)),
                _ => {}
            }
        }
    }
    for c in &ct.constraints {
        match c {
            TableConstraint::PrimaryKey(pk) => pks.push(index_columns(&pk.columns)),
            TableConstraint::Unique(u) => uniques.push(index_columns(&u.columns)),
            TableConstraint::ForeignKey(fk) => {
                pending_fks.push((
                    fk.columns.iter().map(|c| c.value.to_lowercase()).collect(),
                    fk,
                ));
            }
            _ => {}
        }
    }
    let resolve = |cols: &[String], what: &str| -> Result<Vec<usize>, SchemaError> {
        cols.iter()
            .map(|c| {
                table
                    .column(c)
                    .ok_or_else(|| err(format!("{what} names unknown column {c}")))
            })
            .collect()
    };
    if pks.len() > 1 {
        return Err(err("has more than one PRIMARY KEY".into()));
    }
    let primary_key = match pks.first() {
        Some(cols) => resolve(cols, "PRIMARY KEY")?,
        None => Vec::new(),
    };
    let mut unique_idx = Vec::new();
    for u in &uniques {
        let cols = resolve(u, "UNIQUE")?;
        if cols != primary_key && !unique_idx.contains(&cols) {
            unique_idx.push(cols);
        }
    }
    let mut fks = Vec::new();
    for (cols, fk) in &pending_fks {
        let columns = resolve(cols, "FOREIGN KEY")?;
        let parent = crate::ident::object_name(&fk.foreign_table);
        let mut parent_columns: Vec<String> = fk
            .referred_columns
            .iter()
            .map(|c| c.value.to_lowercase())
            .collect();
        if parent_columns.is_empty() {
            // `REFERENCES parent` without columns means the parent's primary key; resolved below.
            parent_columns.push(String::new());
        }
        fks.push(ForeignKey {
            columns,
            parent,
            parent_columns,
            declared: [fk.on_delete.as_ref().into(), fk.on_update.as_ref().into()],
        });
    }
    // Every engine keeps key columns non-NULL (registration refuses a nullable one on SQLite).
    for &k in &primary_key {
        table.columns[k].not_null = true;
    }
    table.primary_key = primary_key;
    table.uniques = unique_idx;
    table.foreign_keys = fks;
    Ok(table)
}

/// Fills in `REFERENCES parent` foreign keys that named no columns (the parent's primary key).
pub(crate) fn resolve_implicit_references(schema: &mut Schema) {
    let pk_names: BTreeMap<String, Vec<String>> = schema
        .tables
        .values()
        .map(|t| {
            (
                t.name.clone(),
                t.primary_key
                    .iter()
                    .map(|c| t.columns[*c].name.clone())
                    .collect(),
            )
        })
        .collect();
    for t in schema.tables.values_mut() {
        for fk in &mut t.foreign_keys {
            if fk.parent_columns.len() == 1
                && fk.parent_columns[0].is_empty()
                && let Some(pk) = pk_names.get(&fk.parent)
            {
                fk.parent_columns = pk.clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALLBANK: &str = "
        CREATE TABLE accounts (custid BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL UNIQUE);
        CREATE TABLE savings (custid BIGINT PRIMARY KEY REFERENCES accounts(custid), bal BIGINT NOT NULL);
        CREATE TABLE checking (custid BIGINT NOT NULL, bal BIGINT NOT NULL, PRIMARY KEY (custid),
                               FOREIGN KEY (custid) REFERENCES accounts (custid) ON DELETE CASCADE);";

    /// Each key's text and bytes columns share what a PostgreSQL index entry holds, the
    /// bounded ones first; a column that fits its share as declared needs no cap.
    #[test]
    fn key_columns_share_what_an_index_entry_holds() {
        let s = Schema::from_sql(
            "CREATE TABLE a (k TEXT PRIMARY KEY, v BIGINT, t TEXT);
             CREATE TABLE b (k VARCHAR(64) PRIMARY KEY, name VARCHAR(700) UNIQUE, x TEXT, y BYTEA,
                             z VARCHAR(100), UNIQUE (x, y), UNIQUE (z, y, k));
             CREATE TABLE c (id BIGINT NOT NULL, s TEXT NOT NULL, PRIMARY KEY (id, s));",
        )
        .unwrap();
        let caps = |t: &str| s.table(t).unwrap().key_bytes();
        // One text column: everything but its overhead; columns in no key: nothing.
        assert_eq!(caps("a"), vec![Some(2_592), None, None]);
        // name needs 2 800 bytes as declared, more than a key holds; x and y share one key
        // equally; in (z, y, k) z and k take what they need (400, 256), y the rest, which
        // is more than its share of (x, y), the smaller.
        assert_eq!(
            caps("b"),
            vec![None, Some(2_592), Some(1_292), Some(1_292), None]
        );
        // The integer's 32 bytes and both overheads come off.
        assert_eq!(caps("c"), vec![None, Some(2_552)]);
        // A key that cascades into a child's composite key takes the child's share.
        let s = Schema::from_sql(
            "CREATE TABLE p (k TEXT PRIMARY KEY, u TEXT UNIQUE);
             CREATE TABLE c (a TEXT NOT NULL, b TEXT NOT NULL, PRIMARY KEY (a, b),
                             FOREIGN KEY (a) REFERENCES p (k) ON UPDATE CASCADE);
             CREATE TABLE d (x TEXT NOT NULL, y TEXT NOT NULL, PRIMARY KEY (x, y),
                             FOREIGN KEY (x) REFERENCES p (u) ON UPDATE RESTRICT);",
        )
        .unwrap();
        assert_eq!(s.key_bytes("p"), vec![Some(1_292), Some(2_592)]);
        assert_eq!(s.key_bytes("c"), vec![Some(1_292), Some(1_292)]);
    }

    #[test]
    fn parses_smallbank() {
        let s = Schema::from_sql(SMALLBANK).unwrap();
        let acc = s.table("ACCOUNTS").unwrap();
        assert_eq!(acc.primary_key, vec![0]);
        assert_eq!(acc.uniques, vec![vec![1]]);
        assert_eq!(acc.unique_space_name(0), "accounts#unique(name)");
        let chk = s.table("checking").unwrap();
        assert_eq!(chk.foreign_keys[0].on_delete(), RefAction::Modify);
        assert_eq!(
            s.table("savings").unwrap().foreign_keys[0].on_delete(),
            RefAction::Restrict
        );
        assert_eq!(s.children_of("accounts").count(), 2);
    }

    #[test]
    fn column_types() {
        let s = Schema::from_sql(
            "CREATE TABLE t (a INT PRIMARY KEY, b DECIMAL(10,2), c NUMERIC, d TEXT, e BOOLEAN, f BYTEA, g DOUBLE PRECISION, h DATE)",
        )
        .unwrap();
        let types: Vec<String> = s
            .table("t")
            .unwrap()
            .columns
            .iter()
            .map(|c| c.ty.to_string())
            .collect();
        assert_eq!(
            types,
            [
                "integer",
                "decimal(scale 2)",
                "numeric",
                "text",
                "boolean",
                "bytes",
                "floating point",
                "date"
            ]
        );
    }

    #[test]
    fn errors_name_table_and_column() {
        let e = |sql: &str| Schema::from_sql(sql).unwrap_err().to_string();
        assert_eq!(
            e("CREATE TABLE t (a INT, PRIMARY KEY (b))"),
            "table t: PRIMARY KEY names unknown column b"
        );
        assert_eq!(
            e("CREATE TABLE t (a INT, a INT)"),
            "table t: column a is defined twice"
        );
        assert!(
            e("CREATE TABLE t (a INT REFERENCES nope(x))")
                .contains("table t: foreign key references unknown table nope")
        );
        assert!(
            e("CREATE TABLE p (a INT PRIMARY KEY, b INT); CREATE TABLE c (x INT REFERENCES p(b))")
                .contains("neither its primary key nor a UNIQUE constraint")
        );
        assert!(e("DROP TABLE t").contains("only CREATE TABLE"));
        assert!(e("CREATE TABLE").contains("does not parse"));
        assert!(e("CREATE TABLE t (a INT); CREATE TABLE T (b INT)").contains("defined twice"));
    }

    #[test]
    fn a_table_referencing_itself_is_refused_whatever_its_actions() {
        let e = |sql: &str| Schema::from_sql(sql).err().map(|e| e.to_string());
        for sql in [
            "CREATE TABLE n (id INT PRIMARY KEY, up INT REFERENCES n(id))",
            "CREATE TABLE n (id INT PRIMARY KEY, up INT REFERENCES n(id) ON DELETE RESTRICT ON UPDATE RESTRICT)",
            "CREATE TABLE n (id INT PRIMARY KEY, up INT REFERENCES n(id) ON UPDATE CASCADE)",
            "CREATE TABLE n (id INT PRIMARY KEY, code INT UNIQUE, up INT, FOREIGN KEY (up) REFERENCES n(code))",
        ] {
            let problem = e(sql).unwrap_or_default();
            assert!(
                problem.starts_with("table n: foreign key (up) references the table itself")
                    && problem.contains("MariaDB row by row, PostgreSQL at the end"),
                "{sql}: {problem}"
            );
        }
    }

    #[test]
    fn actions_that_can_come_back_through_a_cycle_are_refused() {
        let e = |sql: &str| Schema::from_sql(sql).err().map(|e| e.to_string());
        for (sql, event) in [
            (
                "CREATE TABLE a (id INT PRIMARY KEY, b INT UNIQUE REFERENCES b(id) ON UPDATE CASCADE); \
                 CREATE TABLE b (id INT PRIMARY KEY, a INT REFERENCES a(b))",
                "UPDATE",
            ),
            (
                "CREATE TABLE a (id INT PRIMARY KEY, b INT UNIQUE REFERENCES b(id)); \
                 CREATE TABLE b (id INT PRIMARY KEY, a INT REFERENCES a(b) ON DELETE SET NULL)",
                "DELETE",
            ),
            (
                "CREATE TABLE a (id INT PRIMARY KEY, b INT REFERENCES c(id)); \
                 CREATE TABLE b (id INT PRIMARY KEY, a INT REFERENCES a(id) ON DELETE CASCADE); \
                 CREATE TABLE c (id INT PRIMARY KEY, b INT REFERENCES b(id))",
                "DELETE",
            ),
        ] {
            let problem = e(sql).unwrap_or_default();
            assert!(
                problem.contains(&format!("changes rows ON {event}"))
                    && problem.contains("within a cycle of foreign keys")
                    && problem.contains(&format!("declare it ON {event} RESTRICT or NO ACTION")),
                "{sql}: {problem}"
            );
        }
        // Outside cycles the actions stay allowed, and so does a cycle that only checks.
        for sql in [
            "CREATE TABLE p (id INT PRIMARY KEY); CREATE TABLE c (id INT PRIMARY KEY, p INT REFERENCES p(id) ON UPDATE CASCADE ON DELETE CASCADE)",
            "CREATE TABLE a (id INT PRIMARY KEY, b INT UNIQUE REFERENCES b(id)); \
             CREATE TABLE b (id INT PRIMARY KEY, a INT REFERENCES a(b))",
        ] {
            assert_eq!(e(sql), None, "{sql}");
        }
    }

    #[test]
    fn a_check_on_rows_the_same_cascade_changes_is_refused() {
        let e = |sql: &str| Schema::from_sql(sql).err().map(|e| e.to_string());
        let p = "CREATE TABLE p (id INT PRIMARY KEY); ";
        for (sql, check) in [
            // Both children cascade from p; c2 checks c1 at once.
            (
                format!(
                    "{p}CREATE TABLE c1 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE); \
                     CREATE TABLE c2 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE, c1 INT REFERENCES c1(id) ON DELETE RESTRICT)"
                ),
                "(c1) to c1 only checks ON DELETE (RESTRICT)",
            ),
            // The review's case: c2 cascades from p one level below c1 and checks p, which
            // PostgreSQL does before that level (it fails, SQLite commits).
            (
                format!(
                    "{p}CREATE TABLE c1 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE); \
                     CREATE TABLE c2 (id INT PRIMARY KEY, c1 INT REFERENCES c1(id) ON DELETE CASCADE, p INT REFERENCES p(id))"
                ),
                "(p) to p only checks ON DELETE (NO ACTION)",
            ),
            // The same with a RESTRICT on p's updates: the delete is still checked.
            (
                format!(
                    "{p}CREATE TABLE c1 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE); \
                     CREATE TABLE c2 (id INT PRIMARY KEY, c1 INT REFERENCES c1(id) ON DELETE SET NULL, p INT REFERENCES p(id) ON UPDATE RESTRICT)"
                ),
                "(p) to p only checks ON DELETE (NO ACTION)",
            ),
            // Nulling c1's column is an update of c1, which c2 checks.
            (
                format!(
                    "{p}CREATE TABLE c1 (id INT PRIMARY KEY, p INT UNIQUE REFERENCES p(id) ON DELETE SET NULL); \
                     CREATE TABLE c2 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE, c1p INT REFERENCES c1(p) ON UPDATE RESTRICT)"
                ),
                "(c1p) to c1 only checks ON UPDATE (RESTRICT)",
            ),
            // Users, posts and comments that cascade from users, comments checking posts.
            (
                "CREATE TABLE users (id INT PRIMARY KEY); \
                 CREATE TABLE posts (id INT PRIMARY KEY, u INT REFERENCES users(id) ON DELETE CASCADE); \
                 CREATE TABLE c2 (id INT PRIMARY KEY, u INT REFERENCES users(id) ON DELETE CASCADE, post INT REFERENCES posts(id))".to_owned(),
                "(post) to posts only checks ON DELETE (NO ACTION)",
            ),
        ] {
            let problem = e(&sql).unwrap_or_default();
            assert!(
                problem.starts_with(&format!("table c2: foreign key {check} while a DELETE of "))
                    && problem.contains("can change both its rows and")
                    && problem.contains("PostgreSQL checks it level by level"),
                "{sql}: {problem}"
            );
        }
        // A check on rows no cascade of the same statement changes stays allowed, and so do
        // keys that all cascade.
        for sql in [
            format!(
                "{p}CREATE TABLE c1 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE); \
                 CREATE TABLE c2 (id INT PRIMARY KEY, c1 INT REFERENCES c1(id) ON DELETE RESTRICT)"
            ),
            format!(
                "{p}CREATE TABLE c1 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE RESTRICT); \
                 CREATE TABLE c2 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE, c1 INT REFERENCES c1(id) ON DELETE RESTRICT)"
            ),
            "CREATE TABLE users (id INT PRIMARY KEY); \
             CREATE TABLE posts (id INT PRIMARY KEY, u INT REFERENCES users(id) ON DELETE CASCADE); \
             CREATE TABLE comments (id INT PRIMARY KEY, u INT REFERENCES users(id) ON DELETE CASCADE, post INT REFERENCES posts(id) ON DELETE CASCADE)".to_owned(),
        ] {
            assert_eq!(e(&sql), None, "{sql}");
        }
    }

    #[test]
    fn a_table_two_keys_change_in_one_statement_by_an_update_is_refused() {
        let e = |sql: &str| Schema::from_sql(sql).err().map(|e| e.to_string());
        let p = "CREATE TABLE p (id INT PRIMARY KEY); ";
        for (sql, keys, event) in [
            // The note's race: c is deleted through one key and its column nulled through the
            // other (a NOT NULL one fails only if the SET NULL runs first).
            (
                format!(
                    "{p}CREATE TABLE c (id INT PRIMARY KEY, a INT REFERENCES p(id) ON DELETE CASCADE, b INT NOT NULL REFERENCES p(id) ON DELETE SET NULL)"
                ),
                "(a) to p (ON DELETE CASCADE) and (b) to p (ON DELETE SET NULL)",
                "DELETE",
            ),
            // Through two tables that both cascade from p.
            (
                format!(
                    "{p}CREATE TABLE c1 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE); \
                     CREATE TABLE c2 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE); \
                     CREATE TABLE c (id INT PRIMARY KEY, a INT REFERENCES c1(id) ON DELETE SET NULL, b INT REFERENCES c2(id) ON DELETE CASCADE)"
                ),
                "(a) to c1 (ON DELETE SET NULL) and (b) to c2 (ON DELETE CASCADE)",
                "DELETE",
            ),
            // Two updates through a key change of p.
            (
                format!(
                    "{p}CREATE TABLE c (id INT PRIMARY KEY, a INT REFERENCES p(id) ON UPDATE CASCADE, b INT REFERENCES p(id) ON UPDATE SET NULL)"
                ),
                "(a) to p (ON UPDATE CASCADE) and (b) to p (ON UPDATE SET NULL)",
                "UPDATE",
            ),
            // Nulling c1's unique column updates c through ON UPDATE one level below, while
            // the delete of p deletes c through its other key.
            (
                format!(
                    "{p}CREATE TABLE c1 (id INT PRIMARY KEY, p INT UNIQUE REFERENCES p(id) ON DELETE SET NULL); \
                     CREATE TABLE c (id INT PRIMARY KEY, a INT REFERENCES c1(p) ON UPDATE CASCADE, b INT REFERENCES p(id) ON DELETE CASCADE)"
                ),
                "(a) to c1 (ON UPDATE CASCADE) and (b) to p (ON DELETE CASCADE)",
                "DELETE",
            ),
        ] {
            let problem = e(&sql).unwrap_or_default();
            assert!(
                problem.starts_with(&format!("table c: its foreign keys {keys} can all change the same rows in one {event} of p"))
                    && problem.contains("the engines apply the actions in different orders"),
                "{sql}: {problem}"
            );
        }
        // Keys that only delete the same rows, and one key that updates, stay allowed, and so
        // does a table two keys reach through different statements.
        for sql in [
            format!(
                "{p}CREATE TABLE c1 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE); \
                 CREATE TABLE c2 (id INT PRIMARY KEY, p INT REFERENCES p(id) ON DELETE CASCADE); \
                 CREATE TABLE c (id INT PRIMARY KEY, a INT REFERENCES c1(id) ON DELETE CASCADE, b INT REFERENCES c2(id) ON DELETE CASCADE)"
            ),
            format!(
                "{p}CREATE TABLE c (id INT PRIMARY KEY, a INT REFERENCES p(id) ON DELETE SET NULL ON UPDATE CASCADE)"
            ),
            format!(
                "{p}CREATE TABLE q (id INT PRIMARY KEY); \
                 CREATE TABLE c (id INT PRIMARY KEY, a INT REFERENCES p(id) ON DELETE SET NULL, b INT REFERENCES q(id) ON DELETE SET NULL)"
            ),
        ] {
            assert_eq!(e(&sql), None, "{sql}");
        }
    }

    #[test]
    fn references_without_columns_mean_the_primary_key() {
        let s = Schema::from_sql(
            "CREATE TABLE p (a INT PRIMARY KEY); CREATE TABLE c (x INT PRIMARY KEY REFERENCES p)",
        )
        .unwrap();
        assert_eq!(
            s.table("c").unwrap().foreign_keys[0].parent_columns,
            vec!["a".to_string()]
        );
    }
}
