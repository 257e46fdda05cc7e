//! Faults a benchmark injects on schedule (the paper's Fig. 8): an organization's database
//! changed behind chainify's back, or its node crashed and started again.

use chainify_core::OrgId;

/// One fault and when it happens, in seconds since the start of the run.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// `org`'s database is changed at `at`: it disagrees on its next block and recovers.
    Tamper { org: OrgId, at: f64 },
    /// `org`'s node is killed where it stands at `at` and started again `down` seconds later.
    Crash { org: OrgId, at: f64, down: f64 },
}

/// Seconds a crashed organization stays down when `--fail` does not say.
const DEFAULT_DOWN: f64 = 5.0;

impl Fault {
    /// Parses `--tamper ORG@SECONDS` or `--fail ORG@SECONDS[+DOWN]` for a network of `orgs`.
    pub fn parse(flag: &str, text: &str, orgs: usize) -> Result<Fault, String> {
        let bad = |why: &str| format!("{flag} {text:?}: {why}");
        let (org, rest) = text
            .split_once('@')
            .ok_or_else(|| bad("expected ORG@SECONDS, e.g. 2@10"))?;
        let org: u32 = org
            .trim_start_matches("org")
            .parse()
            .map_err(|_| bad("the organization is a number from 1"))?;
        if org == 0 || org as usize > orgs {
            return Err(bad(&format!("the network has organizations 1 to {orgs}")));
        }
        let seconds = |s: &str, what: &str| -> Result<f64, String> {
            match s.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
                _ => Err(bad(&format!("{what} {s:?} is not a number of seconds"))),
            }
        };
        let org = OrgId(org);
        match flag {
            "--tamper" => Ok(Fault::Tamper {
                org,
                at: seconds(rest, "the moment")?,
            }),
            _ => {
                let (at, down) = match rest.split_once('+') {
                    Some((at, down)) => (at, seconds(down, "the downtime")?),
                    None => (rest, DEFAULT_DOWN),
                };
                Ok(Fault::Crash {
                    org,
                    at: seconds(at, "the moment")?,
                    down,
                })
            }
        }
    }

    /// The organization it hits.
    pub fn org(&self) -> OrgId {
        match self {
            Fault::Tamper { org, .. } | Fault::Crash { org, .. } => *org,
        }
    }

    /// Whether two crashes keep their organizations down at the same time.
    pub fn overlaps(&self, other: &Fault) -> bool {
        match (self, other) {
            (
                Fault::Crash { at, down, .. },
                Fault::Crash {
                    at: at2,
                    down: down2,
                    ..
                },
            ) => *at < at2 + down2 && *at2 < at + down,
            _ => false,
        }
    }

    /// When it starts.
    pub fn at(&self) -> f64 {
        match self {
            Fault::Tamper { at, .. } | Fault::Crash { at, .. } => *at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crashes_overlap_while_both_organizations_are_down() {
        let crash = |org, at, down| Fault::Crash {
            org: OrgId(org),
            at,
            down,
        };
        assert!(crash(2, 5.0, 10.0).overlaps(&crash(3, 8.0, 1.0)));
        assert!(crash(3, 8.0, 1.0).overlaps(&crash(2, 5.0, 10.0)));
        assert!(!crash(2, 5.0, 3.0).overlaps(&crash(3, 8.0, 1.0)));
        let tamper = Fault::Tamper {
            org: OrgId(2),
            at: 8.0,
        };
        assert!(!tamper.overlaps(&crash(3, 5.0, 10.0)));
    }

    #[test]
    fn faults_parse_and_errors_name_the_flag_and_value() {
        assert_eq!(
            Fault::parse("--tamper", "2@10", 3),
            Ok(Fault::Tamper {
                org: OrgId(2),
                at: 10.0
            })
        );
        assert_eq!(
            Fault::parse("--fail", "org3@20.5+4", 3),
            Ok(Fault::Crash {
                org: OrgId(3),
                at: 20.5,
                down: 4.0
            })
        );
        assert_eq!(Fault::parse("--fail", "3@20", 3).map(|f| f.at()), Ok(20.0));
        for (flag, text, needle) in [
            ("--tamper", "2", "expected ORG@SECONDS"),
            ("--tamper", "x@1", "a number from 1"),
            ("--tamper", "4@1", "organizations 1 to 3"),
            ("--tamper", "0@1", "organizations 1 to 3"),
            ("--fail", "2@soon", "the moment \"soon\""),
            ("--fail", "2@1+-3", "the downtime \"-3\""),
            ("--tamper", "2@inf", "the moment"),
        ] {
            let e = Fault::parse(flag, text, 3).unwrap_err();
            assert!(
                e.starts_with(&format!("{flag} {text:?}")) && e.contains(needle),
                "{e}"
            );
        }
    }
}
