//! Typed SQL values: statement parameters and primary-key values.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// A typed value in chainify's portable type system. Parameters are bound as typed values and
/// never spliced into SQL text.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A 64-bit signed integer.
    Int(i64),
    /// A fixed-point decimal, kept with the scale it was written with.
    Decimal(Decimal),
    /// UTF-8 text (binary collation).
    Text(String),
    /// A boolean.
    Bool(bool),
    /// Raw bytes.
    Bytes(Vec<u8>),
}

impl Value {
    /// The bytes a text or byte string carries; 16 for any other value. What limits on values
    /// count (a statement's parameters, what constant folding builds, a batch of rows).
    pub fn payload_bytes(&self) -> usize {
        match self {
            Value::Text(t) => t.len(),
            Value::Bytes(b) => b.len(),
            _ => 16,
        }
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Int(_) => "integer",
            Value::Decimal(_) => "decimal",
            Value::Text(_) => "text",
            Value::Bool(_) => "boolean",
            Value::Bytes(_) => "bytes",
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Decimal(d) => write!(f, "{d}"),
            Value::Text(s) => write!(f, "'{}'", s.replace('\'', "''")),
            Value::Bool(b) => f.write_str(if *b { "TRUE" } else { "FALSE" }),
            Value::Bytes(b) => write!(f, "X'{}'", hex::encode(b)),
        }
    }
}

/// Largest number of significant digits a [`Decimal`] may have (the common maximum precision of
/// PostgreSQL NUMERIC with a declared scale, MariaDB DECIMAL(38) and our i128 mantissa).
pub const MAX_DECIMAL_DIGITS: u32 = 38;

const MANTISSA_LIMIT: u128 = 10u128.pow(MAX_DECIMAL_DIGITS);

/// An exact decimal `mantissa × 10^-scale` with at most 38 digits.
///
/// Equality and hashing are *representational* (`1.50` and `1.5` differ) because a signed
/// parameter must round-trip exactly; use [`Decimal::cmp_numeric`] or [`Decimal::normalized`] to
/// compare by value, as SQL does.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Decimal {
    mantissa: i128,
    scale: u8,
}

/// A decimal literal could not be represented.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid decimal {text:?}: {problem}")]
pub struct DecimalError {
    /// The rejected text.
    pub text: String,
    /// Why it was rejected.
    pub problem: &'static str,
}

impl Decimal {
    /// `mantissa × 10^-scale`; `None` when it has more than 38 digits or scale > 38.
    pub fn new(mantissa: i128, scale: u8) -> Option<Decimal> {
        (mantissa.unsigned_abs() < MANTISSA_LIMIT && u32::from(scale) <= MAX_DECIMAL_DIGITS)
            .then_some(Decimal { mantissa, scale })
    }

    /// The unscaled integer.
    pub fn mantissa(&self) -> i128 {
        self.mantissa
    }

    /// Digits after the decimal point.
    pub fn scale(&self) -> u8 {
        self.scale
    }

    /// The same number with trailing fractional zeros removed (`1.500` → `1.5`, `2.0` → `2`).
    pub fn normalized(self) -> Decimal {
        let Decimal {
            mut mantissa,
            mut scale,
        } = self;
        while scale > 0 && mantissa % 10 == 0 {
            mantissa /= 10;
            scale -= 1;
        }
        Decimal { mantissa, scale }
    }

    /// The value as an integer, when it has no fractional part and fits in 64 bits.
    pub fn to_i64_exact(self) -> Option<i64> {
        let n = self.normalized();
        if n.scale == 0 {
            i64::try_from(n.mantissa).ok()
        } else {
            None
        }
    }

    /// The same number at `scale` digits, when that loses nothing and stays within 38 digits.
    pub fn rescaled(self, scale: u8) -> Option<Decimal> {
        let n = self.normalized();
        if n.scale > scale {
            return None;
        }
        let factor = 10i128.checked_pow(u32::from(scale - n.scale))?;
        Decimal::new(n.mantissa.checked_mul(factor)?, scale)
    }

    /// The number at exactly `scale` digits, rounding half away from zero as PostgreSQL and
    /// MySQL do when a value is stored into `DECIMAL(p, scale)`; `None` when the result would
    /// exceed 38 digits.
    pub fn round_to(self, scale: u8) -> Option<Decimal> {
        if self.scale <= scale {
            let factor = 10i128.checked_pow(u32::from(scale - self.scale))?;
            return Decimal::new(self.mantissa.checked_mul(factor)?, scale);
        }
        let divisor = 10i128.pow(u32::from(self.scale - scale));
        let (quotient, remainder) = (self.mantissa / divisor, self.mantissa % divisor);
        let away = remainder.unsigned_abs() * 2 >= divisor.unsigned_abs();
        let rounded = if away {
            quotient + self.mantissa.signum()
        } else {
            quotient
        };
        Decimal::new(rounded, scale)
    }

    /// Numeric comparison (`1.5` equals `1.50`).
    pub fn cmp_numeric(&self, other: &Decimal) -> Ordering {
        match (self.mantissa.signum(), other.mantissa.signum()) {
            (a, b) if a != b => a.cmp(&b),
            (0, _) => Ordering::Equal,
            (1, _) => cmp_magnitude(self, other),
            _ => cmp_magnitude(other, self),
        }
    }
}

/// Compares |a| and |b|: integer parts first, then fractions aligned to 38 digits (which always
/// fit in u128 because each fraction is below 10^scale ≤ 10^38).
fn cmp_magnitude(a: &Decimal, b: &Decimal) -> Ordering {
    let split = |d: &Decimal| {
        let m = d.mantissa.unsigned_abs();
        let p = 10u128.pow(u32::from(d.scale));
        let frac = (m % p) * 10u128.pow(MAX_DECIMAL_DIGITS - u32::from(d.scale));
        (m / p, frac)
    };
    split(a).cmp(&split(b))
}

impl FromStr for Decimal {
    type Err = DecimalError;

    /// Parses `[+-]digits[.digits]` (at least one digit, no exponent, at most 38 digits).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |problem| DecimalError {
            text: text.to_owned(),
            problem,
        };
        let (negative, body) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let (int_part, frac_part) = body.split_once('.').unwrap_or((body, ""));
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(err("no digits"));
        }
        if !int_part
            .bytes()
            .chain(frac_part.bytes())
            .all(|b| b.is_ascii_digit())
        {
            return Err(err("only digits, one '.' and a leading sign are allowed"));
        }
        let scale = u8::try_from(frac_part.len())
            .ok()
            .filter(|s| u32::from(*s) <= MAX_DECIMAL_DIGITS)
            .ok_or_else(|| err("more than 38 digits after the point"))?;
        let digits = int_part.trim_start_matches('0').to_owned() + frac_part;
        let digits = digits.trim_start_matches('0');
        if digits.len() > MAX_DECIMAL_DIGITS as usize {
            return Err(err("more than 38 significant digits"));
        }
        let magnitude: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| err("not a number"))?
        };
        Ok(Decimal {
            mantissa: if negative { -magnitude } else { magnitude },
            scale,
        })
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.mantissa.unsigned_abs();
        let sign = if self.mantissa < 0 { "-" } else { "" };
        if self.scale == 0 {
            return write!(f, "{sign}{m}");
        }
        let p = 10u128.pow(u32::from(self.scale));
        write!(
            f,
            "{sign}{}.{:0width$}",
            m / p,
            m % p,
            width = usize::from(self.scale)
        )
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int(i64::from(v))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Bytes(v)
    }
}

impl From<Decimal> for Value {
    fn from(v: Decimal) -> Self {
        Value::Decimal(v)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    #[test]
    fn parse_and_display_round_trip_with_scale() {
        for s in [
            "0",
            "1.50",
            "-12.345",
            "0.001",
            "99999999999999999999999999999999999999",
        ] {
            assert_eq!(d(s).to_string(), s);
        }
        assert_eq!(d("+007.10").to_string(), "7.10");
        assert_eq!(d(".5").to_string(), "0.5");
        assert_eq!(d("-0.0").to_string(), "0.0");
    }

    #[test]
    fn parse_errors_name_the_problem() {
        assert_eq!(
            d_err("1e5"),
            "invalid decimal \"1e5\": only digits, one '.' and a leading sign are allowed"
        );
        assert!(d_err("").contains("no digits"));
        assert!(d_err("-.").contains("no digits"));
        assert!(d_err(&"9".repeat(39)).contains("38 significant"));
        assert!(d_err("1.2.3").contains("only digits"));
    }

    fn d_err(s: &str) -> String {
        s.parse::<Decimal>().unwrap_err().to_string()
    }

    #[test]
    fn numeric_comparison_ignores_scale() {
        assert_eq!(d("1.5").cmp_numeric(&d("1.500")), Ordering::Equal);
        assert_eq!(d("-1.5").cmp_numeric(&d("-1.49")), Ordering::Less);
        assert_eq!(d("0.0").cmp_numeric(&d("-0")), Ordering::Equal);
        assert_eq!(d("10").cmp_numeric(&d("9.999")), Ordering::Greater);
        assert_eq!(d("5.0").to_i64_exact(), Some(5));
        assert_eq!(d("5.1").to_i64_exact(), None);
        assert_eq!(d("1.5").rescaled(3), Some(d("1.500")));
        assert_eq!(d("1.55").rescaled(1), None);
    }

    proptest! {
        #[test]
        fn cmp_numeric_agrees_with_scaled_integers(a in -10i128.pow(15)..10i128.pow(15), sa in 0u8..8,
                                                    b in -10i128.pow(15)..10i128.pow(15), sb in 0u8..8) {
            let (x, y) = (Decimal::new(a, sa).unwrap(), Decimal::new(b, sb).unwrap());
            let s = sa.max(sb);
            let ax = a * 10i128.pow(u32::from(s - sa));
            let by = b * 10i128.pow(u32::from(s - sb));
            prop_assert_eq!(x.cmp_numeric(&y), ax.cmp(&by));
            prop_assert_eq!(x.to_string().parse::<Decimal>().unwrap(), x);
        }
    }

    #[test]
    fn round_to_rounds_half_away_from_zero() {
        let r = |text: &str, scale| {
            text.parse::<Decimal>()
                .unwrap()
                .round_to(scale)
                .map(|d| d.to_string())
        };
        assert_eq!(r("1.005", 2).as_deref(), Some("1.01"));
        assert_eq!(r("-1.005", 2).as_deref(), Some("-1.01"));
        assert_eq!(r("1.0049", 2).as_deref(), Some("1.00"));
        assert_eq!(r("-0.004", 2).as_deref(), Some("0.00"));
        assert_eq!(r("2.5", 0).as_deref(), Some("3"));
        assert_eq!(r("7", 3).as_deref(), Some("7.000"));
        assert_eq!(r("1.50", 2).as_deref(), Some("1.50"));
        assert_eq!(r("99999999999999999999999999999999999999", 1), None);
    }
}
