//! The engines and what a statement rendered for one of them looks like. Rendering itself is
//! done from the portable form ([`crate::portable`]), never from the client's text.

/// A SQL engine family.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL and MariaDB.
    MySql,
    /// SQLite.
    Sqlite,
}

/// A statement ready to prepare on one engine.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Rendered {
    /// The SQL text for the engine.
    pub sql: String,
    /// For each placeholder the engine will bind, in bind order, the 0-based index of the
    /// statement's parameter it takes (`$2` → 1). For MySQL a parameter may appear several times.
    pub bind_order: Vec<usize>,
}
