//! Agreement (and endorsement) policies: which sets of organizations must vote the same hash.
//!
//! A policy is a family of organization combinations; it is met for hash `H` when every member of
//! some combination voted `H` (Algorithm 1 of the chainifyDB paper). Thresholds (`any-k`, `all`,
//! `majority`) are kept symbolic so that evaluation stays linear in the number of votes instead of
//! enumerating `C(n, k)` combinations.
//!
//! Evaluating a set of votes yields [`Agreement::Agreed`], [`Agreement::Pending`] (some
//! combination can still be met by the organizations that have not voted) or
//! [`Agreement::Impossible`] (no combination can be met any more: the trigger for network-wide
//! recovery).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use crate::OrgId;

/// The policy as written in the network config.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum PolicySpec {
    /// `any-k`: any k organizations.
    AnyK(usize),
    /// `all`: every organization.
    All,
    /// `majority`: any ⌊n/2⌋+1 organizations.
    Majority,
    /// `[[1,2],[1,3]]`: one of the listed combinations.
    Combinations(Vec<Vec<u32>>),
}

impl FromStr for PolicySpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        match t {
            "all" => return Ok(PolicySpec::All),
            "majority" => return Ok(PolicySpec::Majority),
            _ => {}
        }
        if let Some(k) = t.strip_prefix("any-") {
            return k.parse::<usize>().map(PolicySpec::AnyK).map_err(|_| {
                format!("`{t}`: `any-` must be followed by a whole number, e.g. any-2")
            });
        }
        if t.starts_with('[') {
            return parse_combinations(t).map(PolicySpec::Combinations);
        }
        Err(format!(
            "`{t}` is not a policy; use any-K, all, majority or explicit combinations like [[1,2],[1,3]]"
        ))
    }
}

fn parse_combinations(t: &str) -> Result<Vec<Vec<u32>>, String> {
    let bad = || format!("`{t}` is not a list of combinations like [[1,2],[1,3]]");
    let inner = t
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .ok_or_else(bad)?
        .trim();
    let mut combos = Vec::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let r = rest.strip_prefix('[').ok_or_else(bad)?;
        let end = r.find(']').ok_or_else(bad)?;
        let combo = r[..end]
            .split(',')
            .map(|n| n.trim().parse::<u32>().map_err(|_| bad()))
            .collect::<Result<Vec<_>, _>>()?;
        combos.push(combo);
        rest = r[end + 1..].trim_start();
        rest = rest.strip_prefix(',').map_or(rest, str::trim_start);
    }
    Ok(combos)
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicySpec::AnyK(k) => write!(f, "any-{k}"),
            PolicySpec::All => f.write_str("all"),
            PolicySpec::Majority => f.write_str("majority"),
            PolicySpec::Combinations(c) => {
                let parts: Vec<String> = c
                    .iter()
                    .map(|combo| {
                        let ids: Vec<String> = combo.iter().map(u32::to_string).collect();
                        format!("[{}]", ids.join(","))
                    })
                    .collect();
                write!(f, "[{}]", parts.join(","))
            }
        }
    }
}

/// A policy resolved against the network's organizations.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct AgreementPolicy {
    orgs: BTreeSet<OrgId>,
    rule: Rule,
}

#[derive(Clone, PartialEq, Eq, Debug)]
enum Rule {
    /// Any `k` organizations.
    Threshold(usize),
    /// One of these combinations (each non-empty, no duplicates, all members known).
    Combinations(Vec<BTreeSet<OrgId>>),
}

/// The outcome of evaluating votes against a policy.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Agreement<H> {
    /// A combination voted `hash`; `voters` are *all* organizations that voted it (the certificate).
    Agreed {
        /// The agreed hash.
        hash: H,
        /// Every organization that voted `hash`.
        voters: BTreeSet<OrgId>,
    },
    /// No agreement yet, but the organizations that have not voted can still complete one.
    Pending,
    /// No combination can be met any more, whatever the missing votes.
    Impossible,
}

/// A policy that does not fit the network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy `{policy}`: {problem}")]
pub struct PolicyError {
    /// The policy as written.
    pub policy: String,
    /// What is wrong.
    pub problem: String,
}

impl AgreementPolicy {
    /// Resolves `spec` for the organizations `orgs`.
    ///
    /// Rejects policies that admit two *disjoint* combinations: two such groups could agree on
    /// different blocks and fork the ledger.
    pub fn new(spec: &PolicySpec, orgs: &BTreeSet<OrgId>) -> Result<Self, PolicyError> {
        let err = |problem: String| PolicyError {
            policy: spec.to_string(),
            problem,
        };
        let n = orgs.len();
        if n == 0 {
            return Err(err("the network has no organizations".into()));
        }
        let rule = match spec {
            PolicySpec::AnyK(k) if *k == 0 || *k > n => {
                return Err(err(format!(
                    "k must be between 1 and the {n} organizations"
                )));
            }
            PolicySpec::AnyK(k) => Rule::Threshold(*k),
            PolicySpec::All => Rule::Threshold(n),
            PolicySpec::Majority => Rule::Threshold(n / 2 + 1),
            PolicySpec::Combinations(combos) => {
                if combos.is_empty() {
                    return Err(err("lists no combination".into()));
                }
                let mut sets = Vec::new();
                for combo in combos {
                    let set: BTreeSet<OrgId> = combo.iter().map(|&i| OrgId(i)).collect();
                    if set.is_empty() {
                        return Err(err("has an empty combination".into()));
                    }
                    if set.len() != combo.len() {
                        return Err(err(format!(
                            "combination {combo:?} names an organization twice"
                        )));
                    }
                    if let Some(unknown) = set.iter().find(|o| !orgs.contains(o)) {
                        return Err(err(format!(
                            "names organization {} which is not in the network",
                            unknown.0
                        )));
                    }
                    sets.push(set);
                }
                Rule::Combinations(sets)
            }
        };
        let policy = AgreementPolicy {
            orgs: orgs.clone(),
            rule,
        };
        if let Some((a, b)) = policy.disjoint_combinations() {
            return Err(err(format!(
                "combinations {:?} and {:?} share no organization, so they could agree on different blocks",
                ids(&a),
                ids(&b)
            )));
        }
        Ok(policy)
    }

    /// The organizations of the network.
    pub fn orgs(&self) -> &BTreeSet<OrgId> {
        &self.orgs
    }

    /// Whether the organizations in `set` together meet the policy.
    pub fn is_satisfied_by(&self, set: &BTreeSet<OrgId>) -> bool {
        match &self.rule {
            Rule::Threshold(k) => set.intersection(&self.orgs).count() >= *k,
            Rule::Combinations(c) => c.iter().any(|combo| combo.is_subset(set)),
        }
    }

    /// A smallest combination containing `org`, if any: the organizations a ChainifyServer asks
    /// for early-abort responses (lowest ids first, so every org picks deterministically).
    pub fn smallest_combination_with(&self, org: OrgId) -> Option<BTreeSet<OrgId>> {
        if !self.orgs.contains(&org) {
            return None;
        }
        match &self.rule {
            Rule::Threshold(k) => {
                let mut set = BTreeSet::from([org]);
                set.extend(self.orgs.iter().filter(|o| **o != org).take(k - 1));
                Some(set)
            }
            Rule::Combinations(c) => c
                .iter()
                .filter(|s| s.contains(&org))
                .min_by_key(|s| s.len())
                .cloned(),
        }
    }

    /// Two combinations with no organization in common, if the policy admits any.
    pub fn disjoint_combinations(&self) -> Option<(BTreeSet<OrgId>, BTreeSet<OrgId>)> {
        match &self.rule {
            Rule::Threshold(k) => (2 * k <= self.orgs.len()).then(|| {
                let a: BTreeSet<OrgId> = self.orgs.iter().take(*k).copied().collect();
                let b: BTreeSet<OrgId> = self.orgs.iter().skip(*k).take(*k).copied().collect();
                (a, b)
            }),
            Rule::Combinations(c) => c.iter().enumerate().find_map(|(i, a)| {
                c[i + 1..]
                    .iter()
                    .find(|b| a.is_disjoint(b))
                    .map(|b| (a.clone(), b.clone()))
            }),
        }
    }

    /// Evaluates the votes (one per organization; votes of unknown organizations are ignored).
    ///
    /// When several hashes are agreed (impossible for an accepted policy, whose combinations
    /// intersect), the smallest hash wins so that the result is still deterministic.
    pub fn evaluate<H: Ord + Clone>(&self, votes: &BTreeMap<OrgId, H>) -> Agreement<H> {
        let mut by_hash: BTreeMap<&H, BTreeSet<OrgId>> = BTreeMap::new();
        for (org, h) in votes.iter().filter(|(o, _)| self.orgs.contains(o)) {
            by_hash.entry(h).or_default().insert(*org);
        }
        if let Some((hash, voters)) = by_hash
            .iter()
            .find(|(_, voters)| self.is_satisfied_by(voters))
        {
            return Agreement::Agreed {
                hash: (*hash).clone(),
                voters: voters.clone(),
            };
        }
        let missing: BTreeSet<OrgId> = self
            .orgs
            .iter()
            .filter(|o| !votes.contains_key(o))
            .copied()
            .collect();
        let possible = match &self.rule {
            Rule::Threshold(k) => {
                let best = by_hash.values().map(BTreeSet::len).max().unwrap_or(0);
                best + missing.len() >= *k
            }
            // A combination is still possible when the members that voted all voted one hash.
            Rule::Combinations(c) => c.iter().any(|combo| {
                let mut hashes = combo.iter().filter_map(|o| votes.get(o));
                match hashes.next() {
                    None => true,
                    Some(first) => hashes.all(|h| h == first),
                }
            }),
        };
        if possible {
            Agreement::Pending
        } else {
            Agreement::Impossible
        }
    }
}

fn ids(set: &BTreeSet<OrgId>) -> Vec<u32> {
    set.iter().map(|o| o.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn orgs(n: u32) -> BTreeSet<OrgId> {
        (1..=n).map(OrgId).collect()
    }

    fn policy(s: &str, n: u32) -> AgreementPolicy {
        AgreementPolicy::new(&s.parse().unwrap(), &orgs(n)).unwrap()
    }

    fn votes(v: &[(u32, u8)]) -> BTreeMap<OrgId, u8> {
        v.iter().map(|&(o, h)| (OrgId(o), h)).collect()
    }

    #[test]
    fn parse_forms_and_errors() {
        assert_eq!("any-2".parse(), Ok(PolicySpec::AnyK(2)));
        assert_eq!(" all ".parse(), Ok(PolicySpec::All));
        assert_eq!(
            "[[1,2], [1,3]]".parse(),
            Ok(PolicySpec::Combinations(vec![vec![1, 2], vec![1, 3]]))
        );
        assert_eq!(
            PolicySpec::Combinations(vec![vec![1, 2], vec![1, 3]]).to_string(),
            "[[1,2],[1,3]]"
        );
        assert!(
            "any-x"
                .parse::<PolicySpec>()
                .unwrap_err()
                .contains("whole number")
        );
        assert!(
            "some"
                .parse::<PolicySpec>()
                .unwrap_err()
                .contains("not a policy")
        );
        assert!("[[1,2".parse::<PolicySpec>().is_err());
    }

    #[test]
    fn resolution_errors_name_the_problem() {
        let e = |s: &str, n| {
            AgreementPolicy::new(&s.parse().unwrap(), &orgs(n))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e("any-4", 3),
            "policy `any-4`: k must be between 1 and the 3 organizations"
        );
        assert!(e("[[1,5]]", 3).contains("organization 5 which is not in the network"));
        assert!(e("[[1,1]]", 3).contains("twice"));
        assert!(e("any-2", 4).contains("[1, 2] and [3, 4] share no organization"));
        assert!(e("[[1,2],[3]]", 3).contains("share no organization"));
    }

    #[test]
    fn any2_of_3() {
        let p = policy("any-2", 3);
        assert_eq!(p.evaluate(&votes(&[(1, 7)])), Agreement::Pending);
        assert_eq!(p.evaluate(&votes(&[(1, 7), (2, 8)])), Agreement::Pending);
        assert_eq!(
            p.evaluate(&votes(&[(1, 7), (2, 8), (3, 7)])),
            Agreement::Agreed {
                hash: 7,
                voters: BTreeSet::from([OrgId(1), OrgId(3)])
            }
        );
        assert_eq!(
            p.evaluate(&votes(&[(1, 7), (2, 8), (3, 9)])),
            Agreement::Impossible
        );
    }

    #[test]
    fn all_of_3_is_impossible_after_one_mismatch() {
        let p = policy("all", 3);
        assert_eq!(p.evaluate(&votes(&[(1, 7), (2, 7)])), Agreement::Pending);
        assert_eq!(p.evaluate(&votes(&[(1, 7), (2, 8)])), Agreement::Impossible);
    }

    #[test]
    fn explicit_combinations() {
        let p = policy("[[1,2],[1,3]]", 3);
        assert_eq!(p.evaluate(&votes(&[(2, 7), (3, 7)])), Agreement::Pending);
        assert!(matches!(
            p.evaluate(&votes(&[(1, 7), (3, 7)])),
            Agreement::Agreed { hash: 7, .. }
        ));
        assert_eq!(
            p.evaluate(&votes(&[(1, 7), (2, 8), (3, 9)])),
            Agreement::Impossible
        );
        assert_eq!(
            p.smallest_combination_with(OrgId(3)),
            Some(BTreeSet::from([OrgId(1), OrgId(3)]))
        );
        assert_eq!(
            policy("majority", 5)
                .smallest_combination_with(OrgId(4))
                .unwrap()
                .len(),
            3
        );
    }

    /// Expands a threshold policy into its explicit combinations: the reference semantics.
    fn brute_force(k: usize, n: u32, v: &BTreeMap<OrgId, u8>) -> Agreement<u8> {
        let all: Vec<OrgId> = (1..=n).map(OrgId).collect();
        let combos: Vec<BTreeSet<OrgId>> = (0u32..1 << n)
            .filter(|m| m.count_ones() as usize == k)
            .map(|m| {
                all.iter()
                    .enumerate()
                    .filter(|(i, _)| m & (1 << i) != 0)
                    .map(|(_, o)| *o)
                    .collect()
            })
            .collect();
        let p = AgreementPolicy {
            orgs: all.iter().copied().collect(),
            rule: Rule::Combinations(combos),
        };
        p.evaluate(v)
    }

    proptest! {
        #[test]
        fn threshold_matches_explicit_combinations(n in 1u32..7, k in 1usize..7,
                                                   raw in proptest::collection::vec(proptest::option::of(0u8..3), 7)) {
            prop_assume!(k <= n as usize);
            let v: BTreeMap<OrgId, u8> = raw.iter().take(n as usize).enumerate()
                .filter_map(|(i, h)| h.map(|h| (OrgId(i as u32 + 1), h))).collect();
            let p = AgreementPolicy { orgs: orgs(n), rule: Rule::Threshold(k) };
            prop_assert_eq!(p.evaluate(&v), brute_force(k, n, &v));
        }

        #[test]
        fn more_votes_never_undo_a_decision(n in 2u32..7, raw in proptest::collection::vec(0u8..3, 7), cut in 0usize..7) {
            let p = AgreementPolicy { orgs: orgs(n), rule: Rule::Threshold(n as usize / 2 + 1) };
            let full: BTreeMap<OrgId, u8> = raw.iter().take(n as usize).enumerate()
                .map(|(i, h)| (OrgId(i as u32 + 1), *h)).collect();
            let partial: BTreeMap<OrgId, u8> = full.iter().take(cut).map(|(o, h)| (*o, *h)).collect();
            let (before, after) = (p.evaluate(&partial), p.evaluate(&full));
            prop_assert_ne!(&after, &Agreement::Pending, "every org voted, so the outcome is decided");
            match before {
                Agreement::Agreed { hash, .. } => {
                    let same = matches!(after, Agreement::Agreed { hash: h, .. } if h == hash);
                    prop_assert!(same, "agreement changed after more votes");
                }
                Agreement::Impossible => prop_assert_eq!(after, Agreement::Impossible),
                Agreement::Pending => {}
            }
        }
    }
}
