//! Converting between chainify's typed values and what the engines store, so that an honest
//! row reads back as the same [`Value`]s on every engine (the input of the block digest).
//!
//! Normalization rules (the canonical row image):
//! - integers of every width are `Value::Int` (64-bit);
//! - decimals are `Value::Decimal` at exactly the column's declared scale (`1.5` in a
//!   `DECIMAL(10,2)` is `1.50`), rounded half away from zero like PostgreSQL and MySQL store them;
//! - text is its UTF-8 bytes, booleans are `Value::Bool` (MySQL and SQLite store 0/1), bytes are
//!   bytes, NULL is `Value::Null`.
//!
//! A stored value that does not fit its declared type (possible on SQLite, whose columns accept
//! anything) is read as the closest faithful value instead of failing: its digest then differs
//! from the honest engines' and the vote, not a crash, deals with it.

use bigdecimal::BigDecimal;
use bigdecimal::num_bigint::BigInt;
use chainify_core::{Decimal, Value};

/// A decimal parameter for engines that bind exact NUMERIC values.
pub(crate) fn decimal_param(d: Decimal) -> BigDecimal {
    BigDecimal::new(BigInt::from(d.mantissa()), i64::from(d.scale()))
}

/// A decimal read back as text, at `scale`; text that is not a decimal stays text. A value
/// with more places than the scale (only SQLite can hold one, written behind chainify's
/// triggers) is kept as it is rather than rounded, so it digests differently from the
/// honest value instead of hiding behind it.
pub(crate) fn parse_decimal(text: &str, scale: u8) -> Value {
    // Not trimmed: the engines' casts to text never pad, and text with blanks around a number
    // is not that number to an engine.
    let Ok(d) = text.parse::<Decimal>() else {
        return Value::Text(text.to_owned());
    };
    match d.round_to(scale) {
        Some(r) if r.cmp_numeric(&d) == std::cmp::Ordering::Equal => Value::Decimal(r),
        _ => Value::Decimal(d),
    }
}

/// A floating-point number as SQLite stores DECIMAL values, at `scale`: its shortest decimal
/// representation (what was written, for up to 15 significant digits), rounded to the scale.
pub(crate) fn decimal_from_f64(x: f64, scale: u8) -> Value {
    if !x.is_finite() {
        return Value::Text(x.to_string());
    }
    // Rust's `Display` for f64 is the shortest representation that round-trips, never in
    // exponent form.
    parse_decimal(&x.to_string(), scale)
}

/// An integer stored in a DECIMAL column (SQLite stores integral numbers as integers).
pub(crate) fn decimal_from_i64(i: i64, scale: u8) -> Value {
    Decimal::new(i128::from(i), 0)
        .and_then(|d| d.round_to(scale))
        .map_or(Value::Int(i), Value::Decimal)
}

/// A boolean stored as an integer: 0 and 1 are booleans, anything else stays an integer (and
/// so digests differently from an engine with a real boolean type).
pub(crate) fn bool_from_i64(i: i64) -> Value {
    match i {
        0 => Value::Bool(false),
        1 => Value::Bool(true),
        other => Value::Int(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> Value {
        Value::Decimal(s.parse().unwrap())
    }

    #[test]
    fn decimals_read_back_at_the_declared_scale() {
        assert_eq!(parse_decimal("1.5", 2), dec("1.50"));
        // More places than the scale only get there behind the triggers' back: kept, so the
        // digest differs from the honest rounded value instead of matching it.
        assert_eq!(parse_decimal("-0.005", 2), dec("-0.005"));
        assert_eq!(parse_decimal("1.040", 2), dec("1.04"));
        assert_eq!(parse_decimal("12", 0), dec("12"));
        assert_eq!(parse_decimal("abc", 2), Value::Text("abc".into()));
        assert_eq!(decimal_from_f64(1.005, 2), dec("1.005"));
        assert_eq!(decimal_from_f64(1.01, 2), dec("1.01"));
        assert_eq!(decimal_from_f64(0.3, 2), dec("0.30"));
        assert_ne!(decimal_from_f64(0.1 + 0.2, 2), dec("0.30"));
        assert_eq!(
            decimal_from_f64(-123456789012.35, 2),
            dec("-123456789012.35")
        );
        assert_eq!(decimal_from_f64(1e15, 2), dec("1000000000000000.00"));
        assert_eq!(decimal_from_i64(-7, 3), dec("-7.000"));
        assert_eq!(decimal_from_f64(f64::NAN, 2), Value::Text("NaN".into()));
    }

    #[test]
    fn exact_parameters() {
        let d: Decimal = "-12345678901234567890.123".parse().unwrap();
        assert_eq!(decimal_param(d).to_string(), "-12345678901234567890.123");
    }

    #[test]
    fn integer_booleans() {
        assert_eq!(bool_from_i64(0), Value::Bool(false));
        assert_eq!(bool_from_i64(1), Value::Bool(true));
        assert_eq!(bool_from_i64(2), Value::Int(2));
    }
}
