//! How much work a statement can make an engine do, counted as whole-table scans nested in one
//! another: the degree of the polynomial in table size that bounds its work on every engine.
//!
//! A transaction runs on every organization, with no deadline that all of them would hit alike, so
//! one whose work grows with the square of a table (`FROM kv a, kv b`, a correlated subquery that
//! scans) would hold every organization for as long as it takes. The analysis refuses those
//! ([`MAX_DEGREE`]): it counts a table occurrence as a lookup, not a scan, only when equalities
//! fix its whole primary key to parameters, literals, outer columns or columns of occurrences
//! joined before it, of exactly the key's type (the key's index is then usable on every engine:
//! PostgreSQL does not use a BIGINT key's index for a NUMERIC comparison, MariaDB's join buffer
//! joins unindexed equalities in quadratic time). Any other occurrence is a scan. A subquery that
//! names an enclosing query's column runs once per row of that query; one that names none runs
//! once. Engines may do better; never worse than this bound with an index per primary key.

use super::{Cmp, E, JoinKind, Q, Source, Stmt, Ty, decimal_scale, for_own, walk_deep, walk_own};

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
        Stmt::Select(q) => of_query(q, 0, sig),
        Stmt::Insert { source, .. } => match source {
            Source::Query(q) => of_query(q, 0, sig),
            // Rows given in the text: only their subqueries, each run once.
            Source::Values(rows) => {
                let mut worst = Work::default();
                for e in rows.iter().flatten() {
                    each_subquery(e, &mut |q| {
                        worst = std::mem::take(&mut worst).worst(of_query(q, 1, sig))
                    });
                }
                worst
            }
        },
        Stmt::Update {
            table,
            key_arity,
            sets,
            selection,
        } => of_target(
            table,
            *key_arity,
            sets.iter().map(|s| &s.3).chain(selection),
            selection.as_ref(),
            sig,
        ),
        Stmt::Delete {
            table,
            key_arity,
            selection,
        } => of_target(table, *key_arity, selection.iter(), selection.as_ref(), sig),
    }
}

/// An UPDATE's or DELETE's target (level 0, occurrence 0): a lookup when its WHERE fixes the key.
fn of_target<'a>(
    table: &str,
    key_arity: usize,
    exprs: impl Iterator<Item = &'a E>,
    selection: Option<&E>,
    sig: &[Ty],
) -> Work {
    let conjuncts: Vec<&E> = selection.map(conjuncts_of).unwrap_or_default();
    let target = if key_fixed(0, 0, key_arity, &conjuncts, &[], sig) {
        Work::default()
    } else {
        Work {
            degree: 1,
            scans: vec![table.to_owned()],
        }
    };
    let mut worst = target.clone();
    for e in exprs {
        each_subquery(e, &mut |q| {
            let inner = of_query(q, 1, sig);
            let total = if correlated(q, 1) {
                target.then(&inner)
            } else {
                inner
            };
            worst = std::mem::take(&mut worst).worst(total);
        });
    }
    worst
}

/// The work of query `q` at nesting level `level`, per evaluation.
fn of_query(q: &Q, level: usize, sig: &[Ty]) -> Work {
    let join = of_join(q, level, sig);
    let mut worst = join.clone();
    let _ = for_own(q, &mut |e| {
        each_subquery(e, &mut |s| {
            let inner = of_query(s, level + 1, sig);
            let total = if correlated(s, level + 1) {
                join.then(&inner)
            } else {
                inner
            };
            worst = std::mem::take(&mut worst).worst(total);
        });
        Ok(())
    });
    worst
}

/// The fewest scans any join order of `q`'s FROM needs (an occurrence on the optional side of a
/// LEFT JOIN comes after every occurrence before it, as the engines must join it).
fn of_join(q: &Q, level: usize, sig: &[Ty]) -> Work {
    let n = q.from.len();
    // Each conjunct with the occurrence it alone may fix (a LEFT JOIN's ON condition), or None
    // for those that fix any occurrence but one on an optional side (WHERE, inner ON).
    let mut conjuncts: Vec<(&E, Option<usize>)> = Vec::new();
    if let Some(w) = &q.selection {
        conjuncts.extend(conjuncts_of(w).into_iter().map(|c| (c, None)));
    }
    for (i, f) in q.from.iter().enumerate() {
        if let Some(on) = &f.on {
            let only = (f.join == JoinKind::Left).then_some(i);
            conjuncts.extend(conjuncts_of(on).into_iter().map(|c| (c, only)));
        }
    }
    let mut best: Option<Work> = None;
    let mut order: Vec<usize> = (0..n).collect();
    permutations(&mut order, 0, &mut |order| {
        let placed_after_predecessors = order.iter().enumerate().all(|(pos, &i)| {
            q.from[i].join != JoinKind::Left || order[..pos].iter().filter(|&&j| j < i).count() == i
        });
        if !placed_after_predecessors {
            return;
        }
        let mut work = Work::default();
        for (pos, &i) in order.iter().enumerate() {
            let usable: Vec<&E> = conjuncts
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
                q.from[i].occ.key_arity,
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

/// Whether `conjuncts` fix every one of the `arity` key columns of occurrence `occurrence` of
/// level `level` by equality with a value known before it is read: a parameter, a literal, a
/// column of an enclosing level or of an occurrence in `before`, of exactly the key's type.
fn key_fixed(
    level: usize,
    occurrence: usize,
    arity: usize,
    conjuncts: &[&E],
    before: &[usize],
    sig: &[Ty],
) -> bool {
    let mut fixed = vec![false; arity];
    fn key(e: &E, level: usize, occurrence: usize) -> Option<(usize, &E)> {
        match e {
            E::Col(c) if c.owner == level && c.occurrence == occurrence => {
                c.key_position.map(|p| (p, e))
            }
            _ => None,
        }
    }
    let known = |key: &E, other: &E| {
        let ty = match other {
            E::Col(c)
                if c.owner < level || (c.owner == level && before.contains(&c.occurrence)) =>
            {
                if decimal_scale(other) != decimal_scale(key) {
                    return false;
                }
                c.ty
            }
            E::Param(i) => sig.get(*i).copied().unwrap_or(Ty::Null),
            E::Lit(v) => Ty::of_value(v),
            _ => return false,
        };
        // `= NULL` finds nothing, by index or not.
        let E::Col(k) = key else { return false };
        ty == Ty::Null || ty == k.ty
    };
    for c in conjuncts {
        match c {
            E::Cmp(Cmp::Eq, a, b) => {
                for (col, other) in [(a, b), (b, a)] {
                    if let Some((p, k)) = key(col, level, occurrence)
                        && known(k, other)
                        && let Some(slot) = fixed.get_mut(p)
                    {
                        *slot = true;
                    }
                }
            }
            E::InList {
                e,
                list,
                negated: false,
            } if arity == 1 => {
                if let Some((p, k)) = key(e, level, occurrence)
                    && list
                        .iter()
                        .all(|x| matches!(x, E::Param(_) | E::Lit(_)) && known(k, x))
                    && let Some(slot) = fixed.get_mut(p)
                {
                    *slot = true;
                }
            }
            _ => {}
        }
    }
    arity > 0 && fixed.iter().all(|f| *f)
}

/// Calls `f` with each subquery directly inside `e` (not those nested in them).
fn each_subquery(e: &E, f: &mut dyn FnMut(&Q)) {
    let _ = walk_own(e, &mut |x| {
        if let E::Scalar(q) | E::Exists { q, .. } | E::InQuery { q, .. } = x {
            f(q);
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
