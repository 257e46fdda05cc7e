//! Why a statement is refused: a [`RejectKind`] with a stable code, and a text naming the
//! construct.
//!
//! Every refusal of the analysis is built by one constructor per kind, so each site states its
//! class; there is deliberately no conversion from a bare text.

/// The class of an analysis rejection, with a stable code ([`RejectKind::code`]).
///
/// **Contract:** a code never changes meaning and is never reused; new kinds with new codes may
/// be added (hence `#[non_exhaustive]`: match with a wildcard arm). The table of codes, with an
/// example of each, is in `docs/design/portable-sql.md` ("Rejection codes"). The reason text
/// that accompanies a code is for people and may be reworded.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RejectKind {
    /// `SQL001`: the text is malformed: it does not parse, is empty, holds more than one
    /// statement (or a transaction holds none), or contains a control character.
    Syntax,
    /// `SQL002`: a construct outside the portable subset (a clause, join form, operator,
    /// function, cast or literal form), refused wherever it appears.
    Unsupported,
    /// `SQL003`: a table, column, alias or output that is unknown, ambiguous or named twice.
    UnknownName,
    /// `SQL004`: a value, expression or column of a type (or form, or row width) not accepted
    /// where it is used.
    Type,
    /// `SQL005`: the wrong number, placeholder form or value of parameters.
    Parameter,
    /// `SQL006`: the result could differ between organizations or engines: the clock,
    /// randomness, the session or generated keys; rows an engine picks, orders or evaluates
    /// differently (LIMIT without a total ORDER BY, ungrouped columns, overflow-capable
    /// arithmetic in filters, `CASE … WHEN NULL`, several-row key updates); DECIMAL rounding
    /// bounds; constants PostgreSQL folds and fails on.
    Nondeterministic,
    /// `SQL007`: a size bound: text length, nesting depth, number of terms or joined tables,
    /// rendered length, text growth, number range.
    Limit,
    /// `SQL008`: a statement kind a transaction (or query) may not contain: DDL, transaction
    /// control, session settings, or anything but SELECT/INSERT/UPDATE/DELETE.
    Statement,
    /// `SQL009`: the analysis itself failed (not the statement's fault).
    Internal,
    /// `SQL010`: the analysis could not run at this organization now (no thread could be
    /// started for it): not a verdict on the statement, which every other organization may
    /// accept. A block holding it is run again rather than the transaction marked invalid.
    Unavailable,
}

impl RejectKind {
    /// Every kind, in code order.
    pub const ALL: [RejectKind; 10] = [
        RejectKind::Syntax,
        RejectKind::Unsupported,
        RejectKind::UnknownName,
        RejectKind::Type,
        RejectKind::Parameter,
        RejectKind::Nondeterministic,
        RejectKind::Limit,
        RejectKind::Statement,
        RejectKind::Internal,
        RejectKind::Unavailable,
    ];

    /// The stable code (`SQL001`…); see the type's contract.
    pub const fn code(&self) -> &'static str {
        match self {
            RejectKind::Syntax => "SQL001",
            RejectKind::Unsupported => "SQL002",
            RejectKind::UnknownName => "SQL003",
            RejectKind::Type => "SQL004",
            RejectKind::Parameter => "SQL005",
            RejectKind::Nondeterministic => "SQL006",
            RejectKind::Limit => "SQL007",
            RejectKind::Statement => "SQL008",
            RejectKind::Internal => "SQL009",
            RejectKind::Unavailable => "SQL010",
        }
    }
}

impl std::fmt::Display for RejectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

/// Why one statement is rejected (without the statement number; [`crate::AnalysisError`] adds
/// it). Displays as its reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Rejection {
    kind: RejectKind,
    reason: String,
}

impl Rejection {
    /// A rejection of `kind` (prefer the constructor named after the kind).
    pub(crate) fn new(kind: RejectKind, reason: impl Into<String>) -> Self {
        Rejection {
            kind,
            reason: reason.into(),
        }
    }

    /// [`RejectKind::Syntax`].
    pub(crate) fn syntax(reason: impl Into<String>) -> Self {
        Self::new(RejectKind::Syntax, reason)
    }

    /// [`RejectKind::Unsupported`].
    pub(crate) fn unsupported(reason: impl Into<String>) -> Self {
        Self::new(RejectKind::Unsupported, reason)
    }

    /// [`RejectKind::UnknownName`].
    pub(crate) fn unknown_name(reason: impl Into<String>) -> Self {
        Self::new(RejectKind::UnknownName, reason)
    }

    /// [`RejectKind::Type`].
    pub(crate) fn wrong_type(reason: impl Into<String>) -> Self {
        Self::new(RejectKind::Type, reason)
    }

    /// [`RejectKind::Parameter`].
    pub(crate) fn parameter(reason: impl Into<String>) -> Self {
        Self::new(RejectKind::Parameter, reason)
    }

    /// [`RejectKind::Nondeterministic`].
    pub(crate) fn nondeterministic(reason: impl Into<String>) -> Self {
        Self::new(RejectKind::Nondeterministic, reason)
    }

    /// [`RejectKind::Limit`].
    pub(crate) fn limit(reason: impl Into<String>) -> Self {
        Self::new(RejectKind::Limit, reason)
    }

    /// [`RejectKind::Statement`].
    pub(crate) fn statement(reason: impl Into<String>) -> Self {
        Self::new(RejectKind::Statement, reason)
    }

    /// [`RejectKind::Internal`].
    pub(crate) fn internal(reason: impl Into<String>) -> Self {
        Self::new(RejectKind::Internal, reason)
    }

    /// [`RejectKind::Unavailable`].
    pub(crate) fn unavailable(reason: impl Into<String>) -> Self {
        Self::new(RejectKind::Unavailable, reason)
    }

    /// The kind.
    pub fn kind(&self) -> RejectKind {
        self.kind
    }

    /// The kind's stable code.
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    /// What is wrong, naming the construct, table, column or parameter.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The rejection as statement `statement` (1-based) of a transaction.
    pub(crate) fn at(self, statement: usize) -> crate::AnalysisError {
        crate::AnalysisError {
            statement,
            kind: self.kind,
            reason: self.reason,
        }
    }
}
