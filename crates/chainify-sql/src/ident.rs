//! Identifier normalization: chainify folds every identifier to lower case (quoted or not), so
//! `Checking`, `checking` and `"CHECKING"` name the same table on every engine. Schemas whose
//! names differ only by case are rejected when loaded.

use sqlparser::ast::{ObjectName, ObjectNamePart};

/// The lower-case dotted form of a (possibly qualified) name.
pub(crate) fn object_name(name: &ObjectName) -> String {
    name.0
        .iter()
        .map(|part| match part {
            ObjectNamePart::Identifier(id) => id.value.to_lowercase(),
            other => other.to_string().to_lowercase(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The lower-case last part of a (possibly qualified) column name, quotes removed: an UPDATE's
/// assignment target or an INSERT's column.
pub(crate) fn column_name(name: &ObjectName) -> String {
    name.0
        .last()
        .map(|p| p.to_string().trim_matches('"').to_lowercase())
        .unwrap_or_default()
}
