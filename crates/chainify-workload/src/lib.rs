//! Deterministic workload generators: the same seed gives the same transactions on every machine,
//! so benchmarks and tests are reproducible and every organization of a test network can generate
//! the same stream.
//!
//! [`Smallbank`] follows the chainifyDB evaluation (DESIGN §7): tables `accounts`, `savings`,
//! `checking`; the TransactSavings, DepositChecking, SendPayment and WriteCheck mix chosen
//! uniformly; accounts drawn from a Zipf distribution (s = 1.1 in the paper) or uniformly.

use chainify_core::Value;
use chainify_core::tx::{Statement, Transaction};

/// SplitMix64: tiny, fast, and good enough for workload generation (not for keys).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform integer in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        // Multiply-shift keeps the bias below 2^-64·n, irrelevant for workloads.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// How account ids are drawn.
#[derive(Clone, Debug)]
pub enum KeyDistribution {
    /// Every account equally likely.
    Uniform,
    /// Zipf with exponent `s` over account ranks (rank 0 hottest).
    Zipf {
        /// The exponent (the paper uses 1.1).
        s: f64,
    },
}

/// Samples ranks in [0, n) from a distribution, by inverse CDF for Zipf.
#[derive(Clone, Debug)]
pub struct KeySampler {
    n: u64,
    /// Cumulative probabilities for Zipf; empty for uniform.
    cdf: Vec<f64>,
}

impl KeySampler {
    /// A sampler over `n ≥ 1` keys.
    pub fn new(n: u64, dist: &KeyDistribution) -> Self {
        let n = n.max(1);
        let cdf = match dist {
            KeyDistribution::Uniform => Vec::new(),
            KeyDistribution::Zipf { s } => {
                let mut acc = 0.0;
                let mut cdf: Vec<f64> = (1..=n)
                    .map(|k| {
                        acc += 1.0 / (k as f64).powf(*s);
                        acc
                    })
                    .collect();
                let total = acc;
                cdf.iter_mut().for_each(|c| *c /= total);
                cdf
            }
        };
        KeySampler { n, cdf }
    }

    /// A rank in [0, n).
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        if self.cdf.is_empty() {
            return rng.below(self.n);
        }
        let u = rng.next_f64();
        (self.cdf.partition_point(|c| *c < u) as u64).min(self.n - 1)
    }
}

/// The Smallbank schema (portable SQL; balances in cents).
pub const SMALLBANK_SCHEMA: &str = "\
CREATE TABLE accounts (custid BIGINT NOT NULL PRIMARY KEY, name VARCHAR(64) NOT NULL UNIQUE);
CREATE TABLE savings (custid BIGINT NOT NULL PRIMARY KEY, bal BIGINT NOT NULL, FOREIGN KEY (custid) REFERENCES accounts (custid));
CREATE TABLE checking (custid BIGINT NOT NULL PRIMARY KEY, bal BIGINT NOT NULL, FOREIGN KEY (custid) REFERENCES accounts (custid));
";

/// Initial balance of every Smallbank account, in cents.
pub const SMALLBANK_INITIAL_BALANCE: i64 = 100_000;

/// Portable `INSERT` statements that load accounts `1..=accounts` with
/// [`SMALLBANK_INITIAL_BALANCE`] in savings and checking, `rows_per_statement` rows at a time.
pub fn smallbank_load_sql(accounts: u64, rows_per_statement: usize) -> Vec<String> {
    let mut out = Vec::new();
    let ids: Vec<u64> = (1..=accounts).collect();
    for chunk in ids.chunks(rows_per_statement.max(1)) {
        let names: Vec<String> = chunk.iter().map(|i| format!("({i}, 'cust{i}')")).collect();
        let bals: Vec<String> = chunk
            .iter()
            .map(|i| format!("({i}, {SMALLBANK_INITIAL_BALANCE})"))
            .collect();
        out.push(format!(
            "INSERT INTO accounts (custid, name) VALUES {}",
            names.join(", ")
        ));
        out.push(format!(
            "INSERT INTO savings (custid, bal) VALUES {}",
            bals.join(", ")
        ));
        out.push(format!(
            "INSERT INTO checking (custid, bal) VALUES {}",
            bals.join(", ")
        ));
    }
    out
}

/// The four transaction kinds of the evaluation mix.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SmallbankKind {
    /// `savings[a] += v` unless the balance would go negative.
    TransactSavings,
    /// `checking[a] += v` (v > 0).
    DepositChecking,
    /// `checking[a] -= v; checking[b] += v` if `checking[a] ≥ v`.
    SendPayment,
    /// `checking[a] -= v` (+1 penalty if checking + savings < v).
    WriteCheck,
}

/// Smallbank transaction generator.
#[derive(Clone, Debug)]
pub struct Smallbank {
    accounts: u64,
    sampler: KeySampler,
    rng: Rng,
}

impl Smallbank {
    /// A generator over `accounts` accounts (ids 1..=accounts) with the given key distribution.
    pub fn new(accounts: u64, dist: &KeyDistribution, seed: u64) -> Self {
        Smallbank {
            accounts: accounts.max(2),
            sampler: KeySampler::new(accounts.max(2), dist),
            rng: Rng::new(seed),
        }
    }

    fn account(&mut self) -> i64 {
        // Scramble ranks so the hot accounts are not simply 1, 2, 3 (keeps range effects honest).
        let rank = self.sampler.sample(&mut self.rng);
        let id = (rank.wrapping_mul(0x9E37_79B9) % self.accounts) + 1;
        i64::try_from(id).unwrap_or(i64::MAX)
    }

    fn amount(&mut self) -> i64 {
        i64::try_from(self.rng.below(10_000) + 1).unwrap_or(1)
    }

    /// The next transaction and its kind.
    pub fn next_tx(&mut self) -> (SmallbankKind, Transaction) {
        let kind = match self.rng.below(4) {
            0 => SmallbankKind::TransactSavings,
            1 => SmallbankKind::DepositChecking,
            2 => SmallbankKind::SendPayment,
            _ => SmallbankKind::WriteCheck,
        };
        let a = self.account();
        let v = self.amount();
        let statements = match kind {
            SmallbankKind::TransactSavings => {
                let v = if self.rng.below(2) == 0 { v } else { -v };
                vec![
                    Statement::new(
                        "UPDATE savings SET bal = bal + $2 WHERE custid = $1 AND bal + $2 >= 0",
                        vec![Value::Int(a), Value::Int(v)],
                    )
                    .expect_rows(1),
                ]
            }
            SmallbankKind::DepositChecking => vec![
                Statement::new(
                    "UPDATE checking SET bal = bal + $2 WHERE custid = $1",
                    vec![Value::Int(a), Value::Int(v)],
                )
                .expect_rows(1),
            ],
            SmallbankKind::SendPayment => {
                let mut b = self.account();
                if b == a {
                    b = a % i64::try_from(self.accounts).unwrap_or(i64::MAX) + 1;
                }
                let params = vec![Value::Int(a), Value::Int(b), Value::Int(v)];
                vec![
                    Statement::new(
                        "UPDATE checking SET bal = bal - $3 WHERE custid = $1 AND bal >= $3",
                        params.clone(),
                    )
                    .expect_rows(1),
                    Statement::new("UPDATE checking SET bal = bal + $3 WHERE custid = $2", params).expect_rows(1),
                ]
            }
            SmallbankKind::WriteCheck => vec![
                Statement::new(
                    "UPDATE checking SET bal = bal - $2 - CASE WHEN bal + (SELECT bal FROM savings WHERE custid = $1) < $2 THEN 1 ELSE 0 END WHERE custid = $1",
                    vec![Value::Int(a), Value::Int(v)],
                )
                .expect_rows(1),
            ],
        };
        (kind, Transaction { statements })
    }

    /// `n` transactions.
    pub fn block(&mut self, n: usize) -> Vec<Transaction> {
        (0..n).map(|_| self.next_tx().1).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let d = KeyDistribution::Zipf { s: 1.1 };
        assert_eq!(
            Smallbank::new(1000, &d, 7).block(50),
            Smallbank::new(1000, &d, 7).block(50)
        );
        assert_ne!(
            Smallbank::new(1000, &d, 7).block(50),
            Smallbank::new(1000, &d, 8).block(50)
        );
    }

    #[test]
    fn zipf_is_skewed_and_uniform_is_not() {
        let mut rng = Rng::new(1);
        let zipf = KeySampler::new(1000, &KeyDistribution::Zipf { s: 1.1 });
        let uni = KeySampler::new(1000, &KeyDistribution::Uniform);
        let hot =
            |s: &KeySampler, rng: &mut Rng| (0..10_000).filter(|_| s.sample(rng) == 0).count();
        // Rank 0 has probability 1/H(1000, 1.1) ≈ 0.18 under Zipf and 0.001 uniformly.
        assert!(hot(&zipf, &mut rng) > 1000);
        assert!(hot(&uni, &mut rng) < 50);
        assert!((0..10_000).all(|_| zipf.sample(&mut rng) < 1000));
    }

    #[test]
    fn accounts_stay_in_range_and_payments_use_two_accounts() {
        let mut g = Smallbank::new(10, &KeyDistribution::Uniform, 3);
        for _ in 0..500 {
            let (kind, tx) = g.next_tx();
            for st in &tx.statements {
                let Value::Int(a) = st.params[0] else {
                    panic!("account must be an integer")
                };
                assert!((1..=10).contains(&a));
            }
            if kind == SmallbankKind::SendPayment {
                assert_ne!(tx.statements[0].params[0], tx.statements[0].params[1]);
            }
        }
    }
}
