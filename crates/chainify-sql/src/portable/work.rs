//! How much work a statement can make an engine do, counted as whole-table scans nested in one
//! another: the degree of the polynomial in table size that bounds its work on every engine.
//!
//! A transaction runs on every organization, with no deadline that all of them would hit alike, so
//! one whose work grows with the square of a table (`FROM kv a, kv b`, a correlated subquery that
//! scans) would hold every organization for as long as it takes. The analysis refuses those
//! ([`MAX_DEGREE`]): it counts a table occurrence as a lookup, not a scan, only when equalities
//! fix its whole primary key or a whole UNIQUE constraint to parameters, literals, outer columns
//! or columns of occurrences joined before it, of exactly the column's type (the index is then
//! usable on every engine: PostgreSQL does not use a BIGINT key's index for a NUMERIC
//! comparison, MariaDB's join buffer joins unindexed equalities in quadratic time). An `IN` list
//! of several values is several lookups, which multiply across occurrences: a scan. Any other
//! occurrence is a scan. A scalar
//! or EXISTS subquery that names an enclosing query's column runs once per row of that query;
//! one that names none runs once. `IN (SELECT …)` runs per row (MariaDB runs it so in an UPDATE
//! or DELETE, PostgreSQL outside a WHERE's conjunction or past its hash memory), looked up by its
//! left side only as a conjunct of a WHERE and never under NOT. Several VALUES rows are a scan
//! their subqueries nest under. Engines may do better; never worse than this bound with an index
//! per key and UNIQUE constraint (tests/work.rs in chainify-storage measures it).

use super::{Cmp, ColRef, E, JoinKind, Limit, Q, Source, Stmt, Ty, for_own, walk_deep, walk_own};

/// The most nested scans a transaction's statement may make: one pass over a table (with key
/// lookups beside it) is linear in its size.
pub const MAX_DEGREE: u32 = 1;

/// The worst nesting of whole-table scans a statement makes an engine do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Scans nested in one another on the worst path (0: key lookups only).
    pub degree: u32,
    /// Those scans' table occurrences (`table` or `table alias`), outermost first.
    pub scans: Vec<String>,
}

impl Work {
    fn then(&self, inner: &Work) -> Work {
        Work {
            degree: self.degree + inner.degree,
            scans: self.scans.iter().chain(&inner.scans).cloned().collect(),
        }
    }

    fn worst(self, other: Work) -> Work {
        if other.degree > self.degree {
            other
        } else {
            self
        }
    }
}

/// The work of a statement whose parameters have the types `sig`.
pub(super) fn of_statement(s: &Stmt, sig: &[Ty]) -> Work {
    match s {
        Stmt::Select(q) => of_query(q, 0, sig, None),
        Stmt::Insert { source, .. } => match source {
            Source::Query(q) => of_query(q, 0, sig, None),
            // A row's subqueries run for that row: several rows are a scan they nest under
            // (MariaDB even runs them between the rows' inserts).
            Source::Values(rows) => {
                let scan = if rows.len() > 1 {
                    Work {
                        degree: 1,
                        scans: vec![format!("{} VALUES rows", rows.len())],
                    }
                } else {
                    Work::default()
                };
                let mut worst = scan.clone();
                for e in rows.iter().flatten() {
                    // No query holds the rows: their subqueries are the outermost level, and
                    // each runs for its row (one row: `scan` is no work).
                    each_subquery(e, 0, false, &mut |q, pin, _| {
                        let total = scan.then(&of_query(q, 0, sig, pin));
                        worst = std::mem::take(&mut worst).worst(total);
                    });
                }
                worst
            }
        },
        Stmt::Update {
            table,
            lookups,
            sets,
            selection,
        } => of_target(
            table,
            lookups,
            sets.iter().map(|s| &s.3),
            selection.as_ref(),
            sig,
        ),
        Stmt::Delete {
            table,
            lookups,
            selection,
        } => of_target(table, lookups, std::iter::empty(), selection.as_ref(), sig),
    }
}

/// An UPDATE's or DELETE's target (level 0, occurrence 0): a lookup when its WHERE fixes the key.
fn of_target<'a>(
    table: &str,
    lookups: &[Vec<String>],
    sets: impl Iterator<Item = &'a E>,
    selection: Option<&'a E>,
    sig: &[Ty],
) -> Work {
    let conjuncts: Vec<&E> = selection.map(conjuncts_of).unwrap_or_default();
    let target = if key_fixed(0, 0, lookups, &equalities(&conjuncts), &[], sig) {
        Work::default()
    } else {
        Work {
            degree: 1,
            scans: vec![table.to_owned()],
        }
    };
    let mut worst = target.clone();
    let own = sets
        .map(|e| (e, false))
        .chain(conjuncts.iter().map(|c| (*c, true)));
    for (e, conjunct) in own {
        add_subqueries(e, 1, conjunct, &target, sig, &mut worst);
    }
    worst
}

/// The work of query `q` at nesting level `level`, per evaluation; `pin` is the left side of an
/// `IN (q)` by which the engines may look `q`'s output up.
fn of_query(q: &Q, level: usize, sig: &[Ty], pin: Option<&E>) -> Work {
    let join = of_join(q, level, sig, pin);
    let mut worst = join.clone();
    let where_conjuncts: Vec<&E> = q.selection.as_ref().map(conjuncts_of).unwrap_or_default();
    for c in &where_conjuncts {
        add_subqueries(c, level + 1, true, &join, sig, &mut worst);
    }
    let _ = for_own(q, &mut |e| {
        if !q.selection.as_ref().is_some_and(|w| std::ptr::eq(w, e)) {
            add_subqueries(e, level + 1, false, &join, sig, &mut worst);
        }
        Ok(())
    });
    worst
}

/// Makes `worst` the worse of itself and the work of each subquery directly inside `e` (at
/// `level`), nested under `outer` when it runs once per row of it.
fn add_subqueries(e: &E, level: usize, conjunct: bool, outer: &Work, sig: &[Ty], worst: &mut Work) {
    each_subquery(e, level, conjunct, &mut |q, pin, per_row| {
        let inner = of_query(q, level, sig, pin);
        let total = if per_row { outer.then(&inner) } else { inner };
        *worst = std::mem::take(worst).worst(total);
    });
}

/// The fewest scans any join order of `q`'s FROM needs (an occurrence on the optional side of a
/// LEFT JOIN comes after every occurrence before it, as the engines must join it).
fn of_join(q: &Q, level: usize, sig: &[Ty], pin: Option<&E>) -> Work {
    let n = q.from.len();
    // Each equality with the occurrence it alone may fix (a LEFT JOIN's ON condition), or None
    // for those that may fix any occurrence but one on an optional side (WHERE, inner ON, an
    // IN's left side).
    let mut fixing: Vec<((&E, &E), Option<usize>)> = Vec::new();
    if let Some(w) = &q.selection {
        fixing.extend(equalities(&conjuncts_of(w)).into_iter().map(|c| (c, None)));
    }
    for (i, f) in q.from.iter().enumerate() {
        if let Some(on) = &f.on {
            let only = (f.join == JoinKind::Left).then_some(i);
            fixing.extend(equalities(&conjuncts_of(on)).into_iter().map(|c| (c, only)));
        }
    }
    // `lhs IN (SELECT y …)` looks y up by lhs where y is rendered bare on every engine (MySQL
    // widens an integer narrower than BIGINT and every decimal output, which hides the key).
    if let (Some(lhs), [y @ E::Col(c)]) = (pin, q.items.as_slice())
        && match c.ty {
            Ty::Int => c.limit == Limit::IntBits(64),
            Ty::Dec | Ty::Null => false,
            Ty::Text | Ty::Bool | Ty::Bytes => true,
        }
    {
        fixing.push(((y, lhs), None));
    }
    let mut best: Option<Work> = None;
    let mut order: Vec<usize> = (0..n).collect();
    permutations(&mut order, 0, &mut |order| {
        let after_predecessors = order.iter().enumerate().all(|(pos, &i)| {
            q.from[i].join != JoinKind::Left || order[..pos].iter().filter(|&&j| j < i).count() == i
        });
        if !after_predecessors {
            return;
        }
        let mut work = Work::default();
        for (pos, &i) in order.iter().enumerate() {
            let usable: Vec<(&E, &E)> = fixing
                .iter()
                .filter(|(_, only)| match only {
                    Some(o) => *o == i,
                    None => q.from[i].join != JoinKind::Left,
                })
                .map(|(c, _)| *c)
                .collect();
            if !key_fixed(
                level,
                i,
                &q.from[i].occ.lookups,
                &usable,
                &order[..pos],
                sig,
            ) {
                let occ = &q.from[i].occ;
                work.degree += 1;
                work.scans.push(if occ.shown == occ.table {
                    occ.table.clone()
                } else {
                    format!("{} {}", occ.table, occ.shown)
                });
            }
        }
        if best.as_ref().is_none_or(|b| work.degree < b.degree) {
            best = Some(work);
        }
    });
    best.unwrap_or_default()
}

/// Calls `f` with every ordering of `items[k..]` after `items[..k]` (at most 4! here).
fn permutations(items: &mut Vec<usize>, k: usize, f: &mut dyn FnMut(&[usize])) {
    if k == items.len() {
        f(items);
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permutations(items, k + 1, f);
        items.swap(k, i);
    }
}

/// The top-level AND-ed conditions of `e`.
fn conjuncts_of(e: &E) -> Vec<&E> {
    let mut out = Vec::new();
    let mut stack = vec![e];
    while let Some(c) = stack.pop() {
        match c {
            E::And(a, b) => {
                stack.push(a);
                stack.push(b);
            }
            other => out.push(other),
        }
    }
    out
}

/// The equalities among `conjuncts`: `a = b`, and `a IN (b)` with one value (a longer list is
/// several lookups, which multiply across occurrences: it fixes nothing).
fn equalities<'a>(conjuncts: &[&'a E]) -> Vec<(&'a E, &'a E)> {
    let mut out = Vec::new();
    for c in conjuncts {
        match c {
            E::Cmp(Cmp::Eq, a, b) => out.push((&**a, &**b)),
            E::InList {
                e,
                list,
                negated: false,
            } if list.len() == 1 => out.push((&**e, &list[0])),
            _ => {}
        }
    }
    out
}

/// Whether `equalities` fix every column of one of `lookups` (the primary key or a UNIQUE
/// constraint) of occurrence `occurrence` of level `level` to a value known before it is read: a
/// parameter, a literal, a column of an enclosing level or of an occurrence in `before`, of
/// exactly the column's type.
fn key_fixed(
    level: usize,
    occurrence: usize,
    lookups: &[Vec<String>],
    equalities: &[(&E, &E)],
    before: &[usize],
    sig: &[Ty],
) -> bool {
    fn own(e: &E, level: usize, occurrence: usize) -> Option<&ColRef> {
        match e {
            E::Col(c) if c.owner == level && c.occurrence == occurrence => Some(c),
            _ => None,
        }
    }
    let scale = |c: &ColRef| match c.limit {
        Limit::Decimal { scale, .. } => Some(scale),
        _ => None,
    };
    let known = |col: &ColRef, other: &E| {
        let ty = match other {
            E::Col(c)
                if c.owner < level || (c.owner == level && before.contains(&c.occurrence)) =>
            {
                if scale(c) != scale(col) {
                    return false;
                }
                c.ty
            }
            E::Param(i) => sig.get(*i).copied().unwrap_or(Ty::Null),
            E::Lit(v) => Ty::of_value(v),
            _ => return false,
        };
        // `= NULL` finds nothing, by index or not.
        ty == Ty::Null || ty == col.ty
    };
    let mut fixed: Vec<&str> = Vec::new();
    for (a, b) in equalities {
        for (col, other) in [(*a, *b), (*b, *a)] {
            if let Some(c) = own(col, level, occurrence)
                && known(c, other)
            {
                fixed.push(&c.column);
            }
        }
    }
    lookups
        .iter()
        .any(|set| !set.is_empty() && set.iter().all(|n| fixed.contains(&n.as_str())))
}

/// Calls `f(q, pin, per_row)` with each subquery `q` (at level `level`) directly inside `e`, not
/// those nested in them. `IN (q)` runs per row of the query around it, looked up by its left
/// side (`pin`) only when it is `e` itself and `e` is a conjunct of a WHERE (`conjunct`). A
/// scalar or EXISTS subquery runs per row when it names a column around it, else once.
fn each_subquery(e: &E, level: usize, conjunct: bool, f: &mut dyn FnMut(&Q, Option<&E>, bool)) {
    let _ = walk_own(e, &mut |x| {
        match x {
            E::InQuery { e: lhs, q, negated } => {
                // Only an uncorrelated, ungrouped subquery is looked up by its left side:
                // PostgreSQL runs a correlated one as a plain SubPlan and SQLite rebuilds its
                // list per row (neither pushes lhs = y in); MariaDB's IN->EXISTS puts the
                // equality into HAVING when the subquery groups.
                let pin = (conjunct
                    && !negated
                    && std::ptr::eq(x, e)
                    && !correlated(q, level)
                    && q.group_by.is_empty()
                    && q.having.is_none())
                .then_some(&**lhs);
                f(q, pin, true);
            }
            E::Scalar(q) | E::Exists { q, .. } => f(q, None, correlated(q, level)),
            _ => {}
        }
        Ok(true)
    });
}

/// Whether subquery `q` at level `level` names a column of an enclosing level (so it runs once
/// per row there), here or in a subquery of its own.
fn correlated(q: &Q, level: usize) -> bool {
    let mut found = false;
    let _ = for_own(q, &mut |e| {
        walk_deep(e, &mut |x| {
            if let E::Col(c) = x {
                found |= c.owner < level;
            }
        });
        Ok(())
    });
    found
}
