//! Snapshot layers: which layers the kept checkpoints need, and how to get there. Pure; the
//! store carries the plan out (`checkpoint.rs`).
//!
//! A checkpoint copies a table whole once (a base layer) and afterwards only the keys changed
//! since the previous checkpoint (a delta layer on the same base). A snapshot is the newest row
//! of each key over the layers from its base to its own layer, so every layer between a kept
//! snapshot and its base must stay. When pruning leaves the base unneeded, the deltas up to the
//! oldest kept snapshot are folded into it (each fold costs the delta's rows, never the base's);
//! the base then holds that snapshot, and references to the folded layers move to the base.
//! Layers after the newest kept snapshot of their base, and bases no kept snapshot uses, are
//! dropped.

use std::collections::{BTreeMap, BTreeSet};

/// One snapshot layer of a table: `tag` is its block, `base` the block of the base layer its
/// rows start from (`tag` itself for a base layer).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) struct Layer {
    /// The layer's block.
    pub tag: i64,
    /// Its base layer's block.
    pub base: i64,
}

impl Layer {
    /// A base layer.
    pub(crate) fn base(tag: i64) -> Layer {
        Layer { tag, base: tag }
    }

    /// The parameters of [`crate::ddl::in_layers`] for this snapshot.
    pub(crate) fn params(self) -> [chainify_core::Value; crate::ddl::LAYER_PARAMS] {
        use chainify_core::Value::Int;
        [
            Int(self.tag),
            Int(self.base),
            Int(self.base),
            Int(self.tag),
            Int(self.tag),
        ]
    }
}

/// A step of a [`plan`], in the order given.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum Step {
    /// Delete layer `tag` of `table`.
    Drop {
        /// The table.
        table: String,
        /// The layer.
        tag: i64,
    },
    /// Fold delta layer `delta` of `table` into its base layer `base`; references to `delta`
    /// become references to `base`.
    Fold {
        /// The table.
        table: String,
        /// The base layer.
        base: i64,
        /// The delta layer folded into it.
        delta: i64,
    },
}

/// The steps that leave exactly the layers the `referenced` snapshots (table, layer) need,
/// given every `layers` (table, layer) of the database. A referenced layer without a record is
/// a base layer (snapshots taken before layers existed are recorded by a migration; this keeps
/// a lost record from losing rows).
pub(crate) fn plan(
    layers: &BTreeMap<(String, i64), i64>,
    referenced: &BTreeSet<(String, i64)>,
) -> Vec<Step> {
    // table → base → layers of that chain, ascending.
    let mut chains: BTreeMap<&str, BTreeMap<i64, BTreeSet<i64>>> = BTreeMap::new();
    for ((table, tag), base) in layers {
        chains
            .entry(table)
            .or_default()
            .entry(*base)
            .or_default()
            .insert(*tag);
    }
    let mut steps = Vec::new();
    for (table, bases) in chains {
        for (base, tags) in bases {
            let used: Vec<i64> = tags
                .iter()
                .copied()
                .filter(|tag| referenced.contains(&(table.to_owned(), *tag)))
                .collect();
            let (Some(&oldest), Some(&newest)) = (used.first(), used.last()) else {
                steps.extend(tags.iter().rev().map(|tag| Step::Drop {
                    table: table.to_owned(),
                    tag: *tag,
                }));
                continue;
            };
            steps.extend(
                tags.iter()
                    .rev()
                    .filter(|t| **t > newest)
                    .map(|tag| Step::Drop {
                        table: table.to_owned(),
                        tag: *tag,
                    }),
            );
            // The base layer itself is not in use when the oldest snapshot is a later layer:
            // every delta up to that one goes into it, oldest first.
            steps.extend(
                tags.iter()
                    .filter(|t| **t > base && **t <= oldest)
                    .map(|delta| Step::Fold {
                        table: table.to_owned(),
                        base,
                        delta: *delta,
                    }),
            );
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A model database: the rows of each layer (key → value, `None` a tombstone), the layers'
    /// bases, and the references of the checkpoints.
    #[derive(Clone, Debug, Default)]
    struct Model {
        rows: BTreeMap<i64, BTreeMap<u8, Option<u8>>>,
        layers: BTreeMap<(String, i64), i64>,
        refs: BTreeMap<i64, i64>,
    }

    impl Model {
        /// The snapshot of layer `tag`: the newest entry of each key from its base on.
        fn view(&self, tag: i64) -> BTreeMap<u8, u8> {
            let base = self.layers[&("t".to_owned(), tag)];
            let mut out = BTreeMap::new();
            for (_, rows) in self.rows.range(base..=tag) {
                for (k, v) in rows {
                    match v {
                        Some(v) => out.insert(*k, *v),
                        None => out.remove(k),
                    };
                }
            }
            out
        }

        fn apply(&mut self, steps: &[Step]) {
            for step in steps {
                match step {
                    Step::Drop { tag, .. } => {
                        self.rows.remove(tag);
                        self.layers.remove(&("t".to_owned(), *tag));
                    }
                    Step::Fold { base, delta, .. } => {
                        let d = self.rows.remove(delta).unwrap_or_default();
                        let b = self.rows.entry(*base).or_default();
                        for (k, v) in d {
                            match v {
                                Some(v) => b.insert(k, Some(v)),
                                None => b.remove(&k),
                            };
                        }
                        self.layers.remove(&("t".to_owned(), *delta));
                        for r in self.refs.values_mut() {
                            if *r == *delta {
                                *r = *base;
                            }
                        }
                    }
                }
            }
        }
    }

    /// A block's changes: key, new value or deleted.
    type Changes = Vec<(u8, Option<u8>)>;

    /// Builds a history of blocks: each changes some keys and may take a checkpoint (a delta
    /// of the keys changed since the previous checkpoint, or whole), prune the oldest
    /// checkpoint, or restore the oldest kept one (dropping the newer ones). After each the
    /// plan runs, and every kept snapshot must read as before.
    fn history(ops: &[(u8, Changes)]) {
        let mut m = Model::default();
        let mut table: BTreeMap<u8, u8> = BTreeMap::new();
        let mut dirty: BTreeSet<u8> = BTreeSet::new();
        for (block, (op, changes)) in ops.iter().enumerate() {
            let block = i64::try_from(block).unwrap_or(0);
            for (k, v) in changes {
                dirty.insert(*k);
                match v {
                    Some(v) => table.insert(*k, *v),
                    None => table.remove(k),
                };
            }
            match op % 5 {
                0 | 1 => {
                    let prev = m.refs.values().next_back().copied();
                    match prev {
                        Some(p) if op % 5 == 0 => {
                            let base = m.layers[&("t".to_owned(), p)];
                            let delta = dirty.iter().map(|k| (*k, table.get(k).copied())).collect();
                            m.rows.insert(block, delta);
                            m.layers.insert(("t".to_owned(), block), base);
                        }
                        _ => {
                            m.rows
                                .insert(block, table.iter().map(|(k, v)| (*k, Some(*v))).collect());
                            m.layers.insert(("t".to_owned(), block), block);
                        }
                    }
                    m.refs.insert(block, block);
                    dirty.clear();
                }
                2 => {
                    if m.refs.len() > 1
                        && let Some((&oldest, _)) = m.refs.iter().next()
                    {
                        m.refs.remove(&oldest);
                    }
                }
                3 => {
                    if let Some((&oldest, &tag)) = m.refs.iter().next() {
                        m.refs.retain(|c, _| *c <= oldest);
                        table = m.view(tag);
                        dirty.clear();
                    }
                }
                _ => {}
            }
            let referenced = m.refs.values().map(|t| ("t".to_owned(), *t)).collect();
            let before: Vec<_> = m.refs.values().map(|t| m.view(*t)).collect();
            let steps = plan(&m.layers, &referenced);
            m.apply(&steps);
            let after: Vec<_> = m.refs.values().map(|t| m.view(*t)).collect();
            assert_eq!(before, after, "a plan changed a kept snapshot: {steps:?}");
            // Only what the kept snapshots need is left.
            let needed: BTreeSet<i64> = m
                .refs
                .values()
                .flat_map(|t| {
                    let base = m.layers[&("t".to_owned(), *t)];
                    m.layers
                        .range(("t".to_owned(), base)..=("t".to_owned(), *t))
                        .map(|((_, tag), _)| *tag)
                        .collect::<Vec<_>>()
                })
                .collect();
            let left: BTreeSet<i64> = m.layers.keys().map(|(_, t)| *t).collect();
            assert_eq!(left, needed);
            assert!(m.rows.keys().all(|t| left.contains(t)));
            // A plan run twice does nothing the second time.
            assert!(
                plan(
                    &m.layers,
                    &m.refs.values().map(|t| ("t".to_owned(), *t)).collect()
                )
                .is_empty()
            );
            // The newest checkpoint plus the keys changed since holds the table as it is.
            if let Some(newest) = m.refs.values().next_back() {
                let mut now = m.view(*newest);
                now.retain(|k, _| !dirty.contains(k));
                let mut expected = table.clone();
                expected.retain(|k, _| !dirty.contains(k));
                assert_eq!(now, expected);
            }
        }
    }

    proptest! {
        #[test]
        fn plans_keep_every_kept_snapshot_and_nothing_else(
            ops in proptest::collection::vec(
                (0u8..5, proptest::collection::vec((0u8..12, proptest::option::of(0u8..5)), 0..6)),
                1..40,
            )
        ) {
            history(&ops);
        }
    }

    #[test]
    fn a_base_no_snapshot_uses_takes_in_the_deltas_up_to_the_oldest_kept() {
        let t = |s: &str| s.to_owned();
        let layers = BTreeMap::from([
            ((t("a"), 0), 0),
            ((t("a"), 10), 0),
            ((t("a"), 20), 0),
            ((t("a"), 30), 0),
            ((t("a"), 40), 0),
            ((t("b"), 5), 5),
        ]);
        let referenced = BTreeSet::from([(t("a"), 20), (t("a"), 30)]);
        assert_eq!(
            plan(&layers, &referenced),
            vec![
                Step::Drop {
                    table: t("a"),
                    tag: 40
                },
                Step::Fold {
                    table: t("a"),
                    base: 0,
                    delta: 10
                },
                Step::Fold {
                    table: t("a"),
                    base: 0,
                    delta: 20
                },
                Step::Drop {
                    table: t("b"),
                    tag: 5
                },
            ]
        );
        // Nothing to do when every layer is in use.
        let all: BTreeSet<_> = layers.keys().cloned().collect();
        assert!(plan(&layers, &all).is_empty());
    }
}
