//! Statement plans: what a statement reads and writes, with parameters left symbolic, so that a
//! plan is computed once per SQL text and *bound* to each transaction's parameters cheaply.
//!
//! Binding turns terms into typed key values (coercing by SQL semantics: `5.0` and `'5'` equal the
//! integer key 5) and predicates into [`KeySet`]s. Every step that cannot be decided exactly widens:
//! a value that cannot be coerced drops its constraint, a constraint that cannot be represented is
//! ignored, so a bound set always contains every key the statement can touch.

use std::borrow::Cow;
use std::ops::Bound;

use chainify_core::rwset::{KeyRange, KeySet, KeyValue, MAX_RANGES, ReadWriteSet, Resource};
use chainify_core::{Decimal, Value};

use crate::schema::ColumnType;

/// A value known when the plan is bound: a literal, a parameter, or unknown (a column, an
/// expression we do not evaluate).
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum Term {
    Const(Value),
    /// 0-based parameter index (`$1` is 0).
    Param(usize),
    /// `-term`, for negative parameters and literals.
    Neg(Box<Term>),
    Unknown,
}

impl Term {
    fn bind<'a>(&'a self, params: &'a [Value]) -> Option<Cow<'a, Value>> {
        match self {
            Term::Const(v) => Some(Cow::Borrowed(v)),
            Term::Param(i) => params.get(*i).map(Cow::Borrowed),
            Term::Neg(t) => match t.bind(params)?.as_ref() {
                Value::Int(i) => i.checked_neg().map(Value::Int),
                Value::Decimal(d) => Decimal::new(-d.mantissa(), d.scale()).map(Value::Decimal),
                _ => None,
            }
            .map(Cow::Owned),
            Term::Unknown => None,
        }
    }
}

/// A predicate on one key column.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum Atom {
    Eq(Term),
    In(Vec<Term>),
    Lt(Term),
    Le(Term),
    Gt(Term),
    Ge(Term),
}

/// A conjunction of atoms on key columns (by position in the key); atoms on other columns are
/// dropped when the plan is built, which can only widen.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub(crate) struct Conj {
    pub(crate) atoms: Vec<(usize, Atom)>,
}

/// How the keys of an access are computed at bind time.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum KeyPlan {
    All,
    /// Disjunction of conjunctions over the key columns.
    Dnf(Vec<Conj>),
    /// Explicit key tuples (INSERT rows, unique values, foreign-key lookups).
    Rows(Vec<Vec<Term>>),
    /// Keys after an UPDATE of key columns: the old keys (which must bind to full points) with the
    /// assigned positions replaced.
    Rekey {
        old: Vec<Conj>,
        assign: Vec<(usize, Term)>,
    },
}

/// Whether an access reads, writes or both (an UPDATE or DELETE reads and writes the same keys,
/// which are then bound once).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    Read,
    Write,
    ReadWrite,
}

/// One access to a resource.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Access {
    pub(crate) resource: Resource,
    /// Types of the key columns, for coercion.
    pub(crate) key_types: Vec<ColumnType>,
    pub(crate) mode: Mode,
    pub(crate) keys: KeyPlan,
}

impl Access {
    pub(crate) fn bind_into(&self, params: &[Value], out: &mut ReadWriteSet) {
        let keys = bind_keys(&self.keys, &self.key_types, params);
        match self.mode {
            Mode::Read => out.read_owned(&self.resource, keys),
            Mode::Write => out.write_owned(&self.resource, keys),
            Mode::ReadWrite => {
                out.read(&self.resource, &keys);
                out.write_owned(&self.resource, keys);
            }
        }
    }
}

/// Longest text or byte string bound as a key value.
pub const MAX_KEY_VALUE_BYTES: usize = 1024;

/// [`coerce`] for a value stored into the key column (an INSERT's row, an UPDATE's new key, a
/// child's foreign key looked up as stored): a decimal with more places than the column's scale
/// is stored rounded (5.0004 in DECIMAL(5,3) is the key 5.000), and a key set of the unrounded
/// value would miss the row written. Such a value constrains nothing.
fn coerce_stored(v: &Value, ty: &ColumnType) -> Result<Option<KeyValue>, ()> {
    let key = coerce(v, ty)?;
    if let (Some(KeyValue::Decimal(d)), ColumnType::Decimal { scale: Some(scale) }) = (&key, ty)
        && d.scale() > *scale
    {
        return Ok(None);
    }
    Ok(key)
}

/// Coerces a bound value to a key column's type, by SQL comparison semantics. `Err(())` means the
/// value compares equal to nothing (NULL); `Ok(None)` means we cannot say which keys it equals.
fn coerce(v: &Value, ty: &ColumnType) -> Result<Option<KeyValue>, ()> {
    // A long text or byte string is no key here: a key value is copied into every combination
    // of the access's IN lists and compared with every earlier range of its block, so one long
    // parameter beside `b IN (1, …, 1024)` cost half a gigabyte at every organization. Treated
    // as undecidable, the access covers the keys around it instead (a wider set, never a
    // narrower one).
    if v.payload_bytes() > MAX_KEY_VALUE_BYTES {
        return Ok(None);
    }
    Ok(match (v, ty) {
        (Value::Null, _) => return Err(()),
        (Value::Int(i), ColumnType::Int) => Some(KeyValue::Int(*i)),
        (Value::Int(i), ColumnType::Decimal { .. }) => {
            Decimal::new(i128::from(*i), 0).map(|d| KeyValue::Decimal(d.normalized()))
        }
        (Value::Decimal(d), ColumnType::Int) => d.to_i64_exact().map(KeyValue::Int),
        (Value::Decimal(d), ColumnType::Decimal { .. }) => Some(KeyValue::Decimal(d.normalized())),
        // A numeric string compares as a number against numeric columns on every engine; anything
        // else (e.g. MySQL's '5abc' = 5) is engine-specific, so it constrains nothing.
        (Value::Text(s), ColumnType::Int | ColumnType::Decimal { .. }) => {
            return match s.trim().parse::<Decimal>() {
                Ok(d) => coerce(&Value::Decimal(d), ty),
                Err(_) => Ok(None),
            };
        }
        (Value::Text(s), ColumnType::Text) => Some(KeyValue::Text(s.clone())),
        (Value::Bytes(b), ColumnType::Bytes) => Some(KeyValue::Bytes(b.clone())),
        (Value::Bool(b), ColumnType::Bool) => Some(KeyValue::Bool(*b)),
        _ => None,
    })
}

/// The constraint on one key column within a conjunction.
struct ColumnConstraint {
    /// `Some` once an equality or IN list was seen: the allowed values.
    points: Option<Vec<KeyValue>>,
    lo: Bound<KeyValue>,
    hi: Bound<KeyValue>,
    /// A NULL comparison or contradictory equalities: the conjunction matches no row.
    empty: bool,
}

impl ColumnConstraint {
    fn new() -> Self {
        ColumnConstraint {
            points: None,
            lo: Bound::Unbounded,
            hi: Bound::Unbounded,
            empty: false,
        }
    }

    fn restrict_points(&mut self, mut values: Vec<KeyValue>) {
        self.points = Some(match self.points.take() {
            None => values,
            // Sorted for lookups: two IN lists of thousands of values on one column would
            // otherwise compare every pair, for every transaction at every organization.
            Some(old) => {
                values.sort_unstable();
                old.into_iter()
                    .filter(|v| values.binary_search(v).is_ok())
                    .collect()
            }
        });
    }

    fn tighten_lo(&mut self, b: Bound<KeyValue>) {
        let tighter = match (&self.lo, &b) {
            (Bound::Unbounded, _) => true,
            (_, Bound::Unbounded) => false,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Included(x)) => x > a,
            (Bound::Included(a), Bound::Excluded(x)) => x >= a,
            (Bound::Excluded(a), Bound::Excluded(x)) => x > a,
        };
        if tighter {
            self.lo = b;
        }
    }

    fn tighten_hi(&mut self, b: Bound<KeyValue>) {
        let tighter = match (&self.hi, &b) {
            (Bound::Unbounded, _) => true,
            (_, Bound::Unbounded) => false,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Included(x)) => x < a,
            (Bound::Included(a), Bound::Excluded(x)) => x <= a,
            (Bound::Excluded(a), Bound::Excluded(x)) => x < a,
        };
        if tighter {
            self.hi = b;
        }
    }

    fn in_interval(&self, v: &KeyValue) -> bool {
        let above = match &self.lo {
            Bound::Unbounded => true,
            Bound::Included(l) => v >= l,
            Bound::Excluded(l) => v > l,
        };
        let below = match &self.hi {
            Bound::Unbounded => true,
            Bound::Included(h) => v <= h,
            Bound::Excluded(h) => v < h,
        };
        above && below
    }

    fn has_interval(&self) -> bool {
        !matches!((&self.lo, &self.hi), (Bound::Unbounded, Bound::Unbounded))
    }
}

fn apply_atom(c: &mut ColumnConstraint, atom: &Atom, ty: &ColumnType, params: &[Value]) {
    let one = |t: &Term| t.bind(params).map(|v| coerce(&v, ty));
    match atom {
        Atom::Eq(t) => match one(t) {
            Some(Err(())) => c.empty = true,
            Some(Ok(Some(k))) => c.restrict_points(vec![k]),
            _ => {}
        },
        Atom::In(list) => {
            let mut values = Vec::with_capacity(list.len());
            for t in list {
                match one(t) {
                    Some(Err(())) => {} // `x IN (NULL, …)`: NULL matches nothing.
                    Some(Ok(Some(k))) => values.push(k),
                    _ => return, // one unknown member: the list constrains nothing.
                }
            }
            c.restrict_points(values);
        }
        Atom::Lt(t) | Atom::Le(t) | Atom::Gt(t) | Atom::Ge(t) => match one(t) {
            Some(Err(())) => c.empty = true,
            Some(Ok(Some(k))) => match atom {
                Atom::Lt(_) => c.tighten_hi(Bound::Excluded(k)),
                Atom::Le(_) => c.tighten_hi(Bound::Included(k)),
                Atom::Gt(_) => c.tighten_lo(Bound::Excluded(k)),
                _ => c.tighten_lo(Bound::Included(k)),
            },
            _ => {}
        },
    }
}

/// Binds one conjunction into ranges, appending to `out`. Equalities on leading key columns
/// extend the prefix (a cross product for IN lists, capped at [`MAX_RANGES`]); the first column
/// with only an interval ends the range; anything after is unconstrained.
fn bind_conj(conj: &Conj, types: &[ColumnType], params: &[Value], out: &mut KeySet) {
    // Fast path for the OLTP shape: one equality per key column, in key order.
    if conj.atoms.len() == types.len()
        && conj
            .atoms
            .iter()
            .enumerate()
            .all(|(i, (p, a))| *p == i && matches!(a, Atom::Eq(_)))
    {
        let mut key = Vec::with_capacity(types.len());
        for ((_, atom), ty) in conj.atoms.iter().zip(types) {
            let Atom::Eq(t) = atom else { break };
            match t.bind(params).map(|v| coerce(&v, ty)) {
                Some(Ok(Some(k))) => key.push(k),
                Some(Err(())) => return, // NULL: no row matches
                _ => break,              // not decidable here: take the general path
            }
        }
        if key.len() == types.len() {
            out.insert(KeyRange::point(key));
            return;
        }
    }
    let mut cols: Vec<ColumnConstraint> =
        (0..types.len()).map(|_| ColumnConstraint::new()).collect();
    for (pos, atom) in &conj.atoms {
        apply_atom(&mut cols[*pos], atom, &types[*pos], params);
    }
    if cols.iter().any(|c| c.empty) {
        return;
    }
    let mut prefixes: Vec<Vec<KeyValue>> = vec![Vec::new()];
    let mut next = None;
    for c in &cols {
        if let Some(points) = &c.points {
            let points: Vec<&KeyValue> = points.iter().filter(|v| c.in_interval(v)).collect();
            if points.is_empty() {
                return; // contradiction: no key satisfies the conjunction
            }
            if prefixes.len() * points.len() > MAX_RANGES {
                break;
            }
            prefixes = prefixes
                .iter()
                .flat_map(|p| {
                    points
                        .iter()
                        .map(move |v| [p.as_slice(), std::slice::from_ref(*v)].concat())
                })
                .collect();
        } else {
            if c.has_interval() {
                next = Some((c.lo.clone(), c.hi.clone()));
            }
            break;
        }
    }
    for prefix in prefixes {
        out.insert(KeyRange {
            prefix,
            next: next.clone(),
        });
    }
}

fn bind_dnf(dnf: &[Conj], types: &[ColumnType], params: &[Value]) -> KeySet {
    let mut set = KeySet::empty();
    for conj in dnf {
        bind_conj(conj, types, params, &mut set);
        if set == KeySet::All {
            break;
        }
    }
    set
}

/// Binds an explicit key tuple; `None` when some component is unknown (the caller widens).
fn bind_row(row: &[Term], types: &[ColumnType], params: &[Value]) -> Option<Option<Vec<KeyValue>>> {
    let mut key = Vec::with_capacity(row.len());
    for (t, ty) in row.iter().zip(types) {
        match coerce_stored(t.bind(params)?.as_ref(), ty) {
            Ok(Some(k)) => key.push(k),
            Ok(None) => return None,
            Err(()) => return Some(None), // a NULL component: no key (and no FK check)
        }
    }
    Some(Some(key))
}

fn bind_keys(plan: &KeyPlan, types: &[ColumnType], params: &[Value]) -> KeySet {
    match plan {
        KeyPlan::All => KeySet::All,
        KeyPlan::Dnf(dnf) => bind_dnf(dnf, types, params),
        KeyPlan::Rows(rows) => {
            let mut set = KeySet::empty();
            for row in rows {
                match bind_row(row, types, params) {
                    Some(Some(key)) => set.insert(KeyRange::point(key)),
                    Some(None) => {}
                    None => return KeySet::All,
                }
            }
            set
        }
        KeyPlan::Rekey { old, assign } => {
            let KeySet::Ranges(ranges) = bind_dnf(old, types, params) else {
                return KeySet::All;
            };
            let mut set = KeySet::empty();
            for r in ranges {
                if !r.is_point(types.len()) {
                    return KeySet::All;
                }
                let mut key = r.prefix;
                for (pos, t) in assign {
                    match t.bind(params).map(|v| coerce_stored(&v, &types[*pos])) {
                        Some(Ok(Some(k))) => key[*pos] = k,
                        Some(Err(())) => return KeySet::empty(), // NULL key: the UPDATE fails
                        _ => return KeySet::All,
                    }
                }
                set.insert(KeyRange::point(key));
            }
            set
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(conjs: Vec<Vec<(usize, Atom)>>, types: &[ColumnType], params: &[Value]) -> KeySet {
        let dnf: Vec<Conj> = conjs.into_iter().map(|atoms| Conj { atoms }).collect();
        bind_dnf(&dnf, types, params)
    }

    fn int(i: i64) -> Term {
        Term::Const(Value::Int(i))
    }

    #[test]
    fn coercion_follows_sql_semantics() {
        let d = |s: &str| Value::Decimal(s.parse().unwrap());
        assert_eq!(
            coerce(&d("5.0"), &ColumnType::Int),
            Ok(Some(KeyValue::Int(5)))
        );
        assert_eq!(coerce(&d("5.5"), &ColumnType::Int), Ok(None));
        assert_eq!(
            coerce(&Value::Text(" 5 ".into()), &ColumnType::Int),
            Ok(Some(KeyValue::Int(5)))
        );
        assert_eq!(
            coerce(&Value::Text("5abc".into()), &ColumnType::Int),
            Ok(None)
        );
        assert_eq!(coerce(&Value::Int(5), &ColumnType::Text), Ok(None));
        assert_eq!(coerce(&Value::Null, &ColumnType::Int), Err(()));
    }

    #[test]
    fn composite_conjunction_builds_prefix_then_interval() {
        let types = [ColumnType::Int, ColumnType::Int, ColumnType::Int];
        let set = bind(
            vec![vec![
                (0, Atom::In(vec![int(1), int(2)])),
                (1, Atom::Ge(int(10))),
                (2, Atom::Eq(int(3))),
            ]],
            &types,
            &[],
        );
        let KeySet::Ranges(r) = set else {
            panic!("expected ranges")
        };
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].prefix, vec![KeyValue::Int(1)]);
        assert_eq!(
            r[0].next,
            Some((Bound::Included(KeyValue::Int(10)), Bound::Unbounded))
        );
    }

    #[test]
    fn contradictions_and_nulls_match_nothing_unknowns_widen() {
        let types = [ColumnType::Int];
        assert!(
            bind(
                vec![vec![(0, Atom::Eq(int(1))), (0, Atom::Eq(int(2)))]],
                &types,
                &[]
            )
            .is_empty()
        );
        assert!(
            bind(
                vec![vec![(0, Atom::Eq(int(1))), (0, Atom::Gt(int(1)))]],
                &types,
                &[]
            )
            .is_empty()
        );
        assert!(
            bind(
                vec![vec![(0, Atom::Eq(Term::Const(Value::Null)))]],
                &types,
                &[]
            )
            .is_empty()
        );
        assert_eq!(
            bind(vec![vec![(0, Atom::Eq(Term::Unknown))]], &types, &[]),
            KeySet::All
        );
        assert_eq!(
            bind(
                vec![vec![(0, Atom::Eq(Term::Param(0)))], vec![]],
                &types,
                &[Value::Int(1)]
            ),
            KeySet::All
        );
        // A missing parameter binds to nothing known: widen.
        assert_eq!(
            bind(vec![vec![(0, Atom::Eq(Term::Param(3)))]], &types, &[]),
            KeySet::All
        );
    }

    #[test]
    fn rekey_replaces_assigned_positions() {
        let types = [ColumnType::Int, ColumnType::Text];
        let plan = KeyPlan::Rekey {
            old: vec![Conj {
                atoms: vec![
                    (0, Atom::Eq(int(1))),
                    (1, Atom::Eq(Term::Const(Value::Text("a".into())))),
                ],
            }],
            assign: vec![(0, Term::Neg(Box::new(Term::Param(0))))],
        };
        let set = bind_keys(&plan, &types, &[Value::Int(7)]);
        assert_eq!(
            set,
            KeySet::Ranges(vec![KeyRange::point(vec![
                KeyValue::Int(-7),
                KeyValue::Text("a".into())
            ])])
        );
        let partial = KeyPlan::Rekey {
            old: vec![Conj {
                atoms: vec![(0, Atom::Eq(int(1)))],
            }],
            assign: vec![(0, int(2))],
        };
        assert_eq!(bind_keys(&partial, &types, &[]), KeySet::All);
    }
}
