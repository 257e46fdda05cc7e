//! The JSON forms of values and read/write sets, as printed by `chainify analyze` (a contract that
//! other tools rely on) and used by the golden tests.
//!
//! - A value: JSON `null`, boolean, integer, exact decimal number (`12.50`), string (text), or
//!   `{"hex": "00ff"}` (bytes).
//! - A key set per resource: `"all"`, or a list of ranges. A range that fixes the whole key is the
//!   key itself, a JSON array (`[5]`, `[1, "a"]`). Otherwise it is an object
//!   `{"prefix": [..], "lower": {"value": v, "inclusive": bool} | null, "upper": … | null}`: keys
//!   starting with `prefix` whose next column lies between the bounds (absent bounds: no interval).
//! - Resources are table names, or `table#unique(col,…)` for the value space of a UNIQUE constraint.

use std::ops::Bound;

use chainify_core::rwset::{KeyRange, KeySet, KeyValue, ReadWriteSet, Resource};
use chainify_core::{Decimal, Value};
use serde_json::{Map, Number, Value as Json, json};

/// A parameter value from JSON (`null`, bool, integer, decimal number, string, `{"hex": …}`).
pub fn value_from_json(j: &Json) -> Result<Value, String> {
    Ok(match j {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => {
            let text = n.to_string();
            match text.parse::<i64>() {
                Ok(i) => Value::Int(i),
                Err(_) => Value::Decimal(text.parse::<Decimal>().map_err(|e| e.to_string())?),
            }
        }
        Json::String(s) => Value::Text(s.clone()),
        Json::Object(o) if o.len() == 1 && o.get("hex").is_some_and(Json::is_string) => {
            let h = o.get("hex").and_then(Json::as_str).unwrap_or_default();
            Value::Bytes(
                crate::analyze::hex_bytes(h)
                    .ok_or_else(|| format!("{{\"hex\": {h:?}}} is not hex"))?,
            )
        }
        other => {
            return Err(format!(
                "{other} is not a parameter value (null, boolean, number, string or {{\"hex\": …}})"
            ));
        }
    })
}

/// A value as JSON.
pub fn value_to_json(v: &Value) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Int(i) => json!(i),
        Value::Decimal(d) => decimal_json(d),
        Value::Text(s) => json!(s),
        Value::Bool(b) => json!(b),
        Value::Bytes(b) => {
            json!({ "hex": b.iter().map(|x| format!("{x:02x}")).collect::<String>() })
        }
    }
}

fn decimal_json(d: &Decimal) -> Json {
    d.to_string()
        .parse::<Number>()
        .map_or_else(|_| json!(d.to_string()), Json::Number)
}

fn key_json(k: &KeyValue) -> Json {
    match k {
        KeyValue::Int(i) => json!(i),
        KeyValue::Decimal(d) => decimal_json(d),
        KeyValue::Text(s) => json!(s),
        KeyValue::Bytes(b) => value_to_json(&Value::Bytes(b.clone())),
        KeyValue::Bool(b) => json!(b),
    }
}

fn bound_json(b: &Bound<KeyValue>) -> Json {
    match b {
        Bound::Unbounded => Json::Null,
        Bound::Included(v) => json!({ "value": key_json(v), "inclusive": true }),
        Bound::Excluded(v) => json!({ "value": key_json(v), "inclusive": false }),
    }
}

fn range_json(r: &KeyRange, arity: usize) -> Json {
    let prefix = Json::Array(r.prefix.iter().map(key_json).collect());
    if r.is_point(arity) {
        return prefix;
    }
    let mut o = Map::new();
    o.insert("prefix".into(), prefix);
    if let Some((lo, hi)) = &r.next {
        o.insert("lower".into(), bound_json(lo));
        o.insert("upper".into(), bound_json(hi));
    }
    Json::Object(o)
}

fn keyset_json(k: &KeySet, arity: usize) -> Json {
    match k {
        KeySet::All => json!("all"),
        KeySet::Ranges(r) => {
            let mut items: Vec<Json> = r.iter().map(|x| range_json(x, arity)).collect();
            // Stable output whatever the analysis order.
            items.sort_by_key(|j| j.to_string());
            Json::Array(items)
        }
    }
}

fn side_json<'a>(m: impl Iterator<Item = (&'a Resource, &'a KeySet)>) -> Json {
    Json::Object(
        m.map(|(r, k)| (r.name.to_string(), keyset_json(k, r.arity)))
            .collect(),
    )
}

/// `{"reads": {...}, "writes": {...}}` for a read/write set.
pub fn rwset_json(s: &ReadWriteSet) -> (Json, Json) {
    (side_json(s.reads.iter()), side_json(s.writes.iter()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_values_from_json() {
        let v = |s: &str| value_from_json(&serde_json::from_str(s).unwrap());
        assert_eq!(v("null"), Ok(Value::Null));
        assert_eq!(v("-7"), Ok(Value::Int(-7)));
        // Exact decimal text is kept (serde_json's arbitrary_precision), scale included.
        assert_eq!(v("1.50"), Ok(Value::Decimal("1.50".parse().unwrap())));
        assert_eq!(
            v("9223372036854775808"),
            Ok(Value::Decimal("9223372036854775808".parse().unwrap()))
        );
        assert_eq!(v("\"5\""), Ok(Value::Text("5".into())));
        assert_eq!(v("{\"hex\": \"00ff\"}"), Ok(Value::Bytes(vec![0, 255])));
        assert!(v("{\"hex\": \"0\"}").unwrap_err().contains("is not hex"));
        assert!(v("[1]").unwrap_err().contains("is not a parameter value"));
        assert!(v("1e5").is_err());
    }

    #[test]
    fn values_round_trip_through_json() {
        for value in [
            Value::Null,
            Value::Int(i64::MIN),
            Value::Decimal("-0.125".parse().unwrap()),
            Value::Text("Zürich".into()),
            Value::Bool(false),
            Value::Bytes(vec![1, 2]),
        ] {
            assert_eq!(value_from_json(&value_to_json(&value)), Ok(value));
        }
    }
}
