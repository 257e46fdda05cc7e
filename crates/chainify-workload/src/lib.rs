//! Deterministic workload generators: the same seed gives the same transactions on every machine,
//! so benchmarks and tests are reproducible and every organization of a test network can generate
//! the same stream.
//!
//! [`Smallbank`] follows the chainifyDB evaluation (docs/design/overview.md §7): tables `accounts`,
//! `savings`, `checking`; the TransactSavings, DepositChecking, SendPayment and WriteCheck mix
//! chosen uniformly, optionally with Amalgamate and Balance; accounts drawn from a Zipf
//! distribution (s = 1.1 in the paper, with an optional shift v) or uniformly.
//!
//! [`Ycsb`] is the YCSB core workload on one table, `usertable`, with workloads A (50 % reads,
//! 50 % updates), B (95 % / 5 %) and C (reads only) and a configurable record size.
//!
//! Where it sits: pure (generators and SQL text, no I/O), above `chainify-core` only. Used by the
//! binary's `demo`, `bench` and `devnet`, the benchmarks, tests, and `chainify-storage`'s
//! conformance suite (its seeded [`Rng`]).

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
    /// Zipf–Mandelbrot over ranks: P(rank k) ∝ 1 / (k + 1 + v)^s (rank 0 hottest).
    Zipf {
        /// The exponent (the paper uses 1.1).
        s: f64,
        /// The shift (0: plain Zipf); larger values flatten the head.
        v: f64,
    },
}

impl std::str::FromStr for KeyDistribution {
    type Err = String;

    /// `uniform`, `zipf` (s = 1.1), `zipf:S` or `zipf:S:V`.
    fn from_str(text: &str) -> Result<KeyDistribution, String> {
        let bad = |why: &str| format!("{text:?}: {why}; use uniform, zipf, zipf:S or zipf:S:V");
        let mut parts = text.split(':');
        match parts.next() {
            Some("uniform") if parts.next().is_none() => Ok(KeyDistribution::Uniform),
            Some("zipf") => {
                let number = |p: Option<&str>, default: f64| match p {
                    None => Ok(default),
                    Some(p) => p
                        .parse::<f64>()
                        .map_err(|_| bad(&format!("{p:?} is not a number"))),
                };
                let s = number(parts.next(), 1.1)?;
                let v = number(parts.next(), 0.0)?;
                if parts.next().is_some() {
                    return Err(bad("too many parts"));
                }
                if !(s.is_finite() && s > 0.0) {
                    return Err(bad("s must be above 0"));
                }
                if !(v.is_finite() && v >= 0.0) {
                    return Err(bad("v must be 0 or more"));
                }
                Ok(KeyDistribution::Zipf { s, v })
            }
            _ => Err(bad("unknown distribution")),
        }
    }
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
            KeyDistribution::Zipf { s, v } => {
                let mut acc = 0.0;
                let mut cdf: Vec<f64> = (1..=n)
                    .map(|k| {
                        acc += 1.0 / (k as f64 + v).powf(*s);
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

/// The transaction kinds of Smallbank: the evaluation's four, then the two optional ones.
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
    /// `checking[b] += savings[a] + checking[a]; savings[a] = checking[a] = 0`.
    Amalgamate,
    /// Reads `savings[a] + checking[a]`.
    Balance,
}

impl SmallbankKind {
    /// The evaluation's mix (chainifyDB, Fig. 7–10).
    pub const EVALUATION: [SmallbankKind; 4] = [
        SmallbankKind::TransactSavings,
        SmallbankKind::DepositChecking,
        SmallbankKind::SendPayment,
        SmallbankKind::WriteCheck,
    ];

    /// The full Smallbank mix.
    pub const FULL: [SmallbankKind; 6] = [
        SmallbankKind::TransactSavings,
        SmallbankKind::DepositChecking,
        SmallbankKind::SendPayment,
        SmallbankKind::WriteCheck,
        SmallbankKind::Amalgamate,
        SmallbankKind::Balance,
    ];
}

/// Smallbank transaction generator.
#[derive(Clone, Debug)]
pub struct Smallbank {
    accounts: u64,
    sampler: KeySampler,
    rng: Rng,
    mix: Vec<SmallbankKind>,
}

impl Smallbank {
    /// A generator over `accounts` accounts (ids 1..=accounts) with the given key distribution
    /// and the evaluation's mix.
    pub fn new(accounts: u64, dist: &KeyDistribution, seed: u64) -> Self {
        Smallbank {
            accounts: accounts.max(2),
            sampler: KeySampler::new(accounts.max(2), dist),
            rng: Rng::new(seed),
            mix: SmallbankKind::EVALUATION.to_vec(),
        }
    }

    /// The same generator choosing uniformly among `kinds` (at least one).
    pub fn with_mix(mut self, kinds: &[SmallbankKind]) -> Self {
        if !kinds.is_empty() {
            self.mix = kinds.to_vec();
        }
        self
    }

    /// A different second account.
    fn other_account(&mut self, a: i64) -> i64 {
        let b = self.account();
        if b == a {
            a % i64::try_from(self.accounts).unwrap_or(i64::MAX) + 1
        } else {
            b
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
        let kind = self.mix[self.rng.below(self.mix.len() as u64) as usize];
        let a = self.account();
        let v = self.amount();
        let statements = match kind {
            SmallbankKind::TransactSavings => {
                let v = if self.rng.below(2) == 0 { v } else { -v };
                vec![
                    Statement::new(
                        "UPDATE savings SET bal = bal + $2 WHERE custid = $1 AND bal >= -$2",
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
                let b = self.other_account(a);
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
            SmallbankKind::Amalgamate => {
                // Through savings[a], so that no statement reads the table it updates (MySQL
                // and MariaDB refuse that).
                let b = self.other_account(a);
                let only_a = || vec![Value::Int(a)];
                vec![
                    Statement::new("UPDATE savings SET bal = bal + (SELECT bal FROM checking WHERE custid = $1) WHERE custid = $1", only_a()).expect_rows(1),
                    Statement::new("UPDATE checking SET bal = 0 WHERE custid = $1", only_a()).expect_rows(1),
                    Statement::new("UPDATE checking SET bal = bal + (SELECT bal FROM savings WHERE custid = $1) WHERE custid = $2", vec![Value::Int(a), Value::Int(b)]).expect_rows(1),
                    Statement::new("UPDATE savings SET bal = 0 WHERE custid = $1", only_a()).expect_rows(1),
                ]
            }
            SmallbankKind::Balance => vec![Statement::new(
                "SELECT s.bal, c.bal FROM savings s JOIN checking c ON c.custid = s.custid WHERE s.custid = $1",
                vec![Value::Int(a)],
            )],
        };
        (kind, Transaction { statements })
    }

    /// `n` transactions.
    pub fn block(&mut self, n: usize) -> Vec<Transaction> {
        (0..n).map(|_| self.next_tx().1).collect()
    }
}

/// The YCSB core workloads this crate generates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YcsbWorkload {
    /// Update heavy: 50 % reads, 50 % updates.
    A,
    /// Read mostly: 95 % reads, 5 % updates.
    B,
    /// Read only.
    C,
}

impl YcsbWorkload {
    /// The share of reads.
    pub fn read_fraction(self) -> f64 {
        match self {
            YcsbWorkload::A => 0.5,
            YcsbWorkload::B => 0.95,
            YcsbWorkload::C => 1.0,
        }
    }
}

impl std::str::FromStr for YcsbWorkload {
    type Err = String;

    fn from_str(text: &str) -> Result<YcsbWorkload, String> {
        match text.to_ascii_lowercase().as_str() {
            "a" => Ok(YcsbWorkload::A),
            "b" => Ok(YcsbWorkload::B),
            "c" => Ok(YcsbWorkload::C),
            _ => Err(format!("{text:?}: YCSB workloads are a, b and c")),
        }
    }
}

/// The shape of a YCSB record: `fields` text fields of `field_length` characters (YCSB's
/// default is 10 × 100, a 1 KB record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct YcsbRecord {
    /// Fields per record (1 to 100).
    pub fields: usize,
    /// Characters per field (1 to 1000).
    pub field_length: usize,
}

impl Default for YcsbRecord {
    fn default() -> Self {
        YcsbRecord {
            fields: 10,
            field_length: 100,
        }
    }
}

impl YcsbRecord {
    /// Checks the bounds, naming the value out of range.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=100).contains(&self.fields) {
            return Err(format!("{} fields: choose 1 to 100", self.fields));
        }
        if !(1..=1000).contains(&self.field_length) {
            return Err(format!(
                "a field length of {}: choose 1 to 1000",
                self.field_length
            ));
        }
        Ok(())
    }

    fn columns(&self) -> Vec<String> {
        (0..self.fields).map(|i| format!("field{i}")).collect()
    }
}

/// The YCSB table, `usertable`, for `record`.
pub fn ycsb_schema(record: YcsbRecord) -> String {
    let fields: Vec<String> = record
        .columns()
        .iter()
        .map(|c| format!("{c} VARCHAR({}) NOT NULL", record.field_length))
        .collect();
    format!(
        "CREATE TABLE usertable (ycsb_key BIGINT NOT NULL PRIMARY KEY, {});\n",
        fields.join(", ")
    )
}

fn ycsb_value(rng: &mut Rng, length: usize) -> String {
    (0..length)
        .map(|_| char::from(b'a' + rng.below(26) as u8))
        .collect()
}

/// Portable `INSERT` statements that load records `1..=records` (values drawn from `seed`),
/// `rows_per_statement` rows at a time.
pub fn ycsb_load_sql(
    records: u64,
    record: YcsbRecord,
    rows_per_statement: usize,
    seed: u64,
) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let columns = record.columns().join(", ");
    let ids: Vec<u64> = (1..=records).collect();
    ids.chunks(rows_per_statement.max(1))
        .map(|chunk| {
            let rows: Vec<String> = chunk
                .iter()
                .map(|id| {
                    let values: Vec<String> = (0..record.fields)
                        .map(|_| format!("'{}'", ycsb_value(&mut rng, record.field_length)))
                        .collect();
                    format!("({id}, {})", values.join(", "))
                })
                .collect();
            format!(
                "INSERT INTO usertable (ycsb_key, {columns}) VALUES {}",
                rows.join(", ")
            )
        })
        .collect()
}

/// What a YCSB transaction does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YcsbOp {
    /// Reads a whole record.
    Read,
    /// Overwrites one field of a record.
    Update,
}

/// YCSB transaction generator: one operation per transaction.
#[derive(Clone, Debug)]
pub struct Ycsb {
    records: u64,
    sampler: KeySampler,
    rng: Rng,
    workload: YcsbWorkload,
    record: YcsbRecord,
    read_sql: String,
}

impl Ycsb {
    /// A generator over records `1..=records` of shape `record`.
    pub fn new(
        records: u64,
        dist: &KeyDistribution,
        workload: YcsbWorkload,
        record: YcsbRecord,
        seed: u64,
    ) -> Self {
        Ycsb {
            records: records.max(1),
            sampler: KeySampler::new(records.max(1), dist),
            rng: Rng::new(seed),
            workload,
            record,
            read_sql: format!(
                "SELECT {} FROM usertable WHERE ycsb_key = $1",
                record.columns().join(", ")
            ),
        }
    }

    /// The next transaction and what it does.
    pub fn next_tx(&mut self) -> (YcsbOp, Transaction) {
        let rank = self.sampler.sample(&mut self.rng);
        let key = i64::try_from(rank.wrapping_mul(0x9E37_79B9) % self.records + 1).unwrap_or(1);
        let statement = if self.rng.next_f64() < self.workload.read_fraction() {
            (
                YcsbOp::Read,
                Statement::new(&self.read_sql, vec![Value::Int(key)]),
            )
        } else {
            let field = self.rng.below(self.record.fields as u64);
            let value = ycsb_value(&mut self.rng, self.record.field_length);
            (
                YcsbOp::Update,
                Statement::new(
                    format!("UPDATE usertable SET field{field} = $2 WHERE ycsb_key = $1"),
                    vec![Value::Int(key), Value::Text(value)],
                )
                .expect_rows(1),
            )
        };
        (
            statement.0,
            Transaction {
                statements: vec![statement.1],
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let d = KeyDistribution::Zipf { s: 1.1, v: 0.0 };
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
        let zipf = KeySampler::new(1000, &KeyDistribution::Zipf { s: 1.1, v: 0.0 });
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

    #[test]
    fn distributions_parse_or_name_the_problem() {
        assert!(matches!("uniform".parse(), Ok(KeyDistribution::Uniform)));
        assert!(matches!(
            "zipf".parse(),
            Ok(KeyDistribution::Zipf { s, v }) if s == 1.1 && v == 0.0
        ));
        assert!(matches!(
            "zipf:0.9:5".parse(),
            Ok(KeyDistribution::Zipf { s, v }) if s == 0.9 && v == 5.0
        ));
        for (bad, why) in [
            ("zipf:x", "\"x\" is not a number"),
            ("zipf:0", "s must be above 0"),
            ("zipf:1.1:-1", "v must be 0 or more"),
            ("zipf:1:2:3", "too many parts"),
            ("pareto", "unknown distribution"),
        ] {
            let e = bad.parse::<KeyDistribution>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_zipf_shift_flattens_the_head() {
        let hot = |v: f64| {
            let sampler = KeySampler::new(1000, &KeyDistribution::Zipf { s: 1.1, v });
            let mut rng = Rng::new(3);
            (0..20_000)
                .filter(|_| sampler.sample(&mut rng) == 0)
                .count()
        };
        let (plain, shifted) = (hot(0.0), hot(10.0));
        assert!(shifted * 5 < plain, "v = 10: {shifted}, v = 0: {plain}");
    }

    #[test]
    fn the_mixes_draw_exactly_their_kinds() {
        let d = KeyDistribution::Uniform;
        let kinds = |g: &mut Smallbank| {
            let mut seen: Vec<SmallbankKind> = (0..600).map(|_| g.next_tx().0).collect();
            seen.dedup();
            let mut set = Vec::new();
            for k in seen {
                if !set.contains(&k) {
                    set.push(k);
                }
            }
            set.len()
        };
        assert_eq!(kinds(&mut Smallbank::new(100, &d, 1)), 4);
        assert_eq!(
            kinds(&mut Smallbank::new(100, &d, 1).with_mix(&SmallbankKind::FULL)),
            6
        );
    }

    /// Every generated statement is in the portable subset the analyser accepts.
    #[test]
    fn generated_transactions_pass_the_analyser() {
        use chainify_sql::{Analyzer, Schema};
        let smallbank = Analyzer::new(Schema::from_sql(SMALLBANK_SCHEMA).unwrap());
        let mut g = Smallbank::new(50, &KeyDistribution::Uniform, 9).with_mix(&SmallbankKind::FULL);
        for _ in 0..300 {
            let (kind, tx) = g.next_tx();
            if let Err(e) = smallbank.analyze(&tx) {
                panic!("{kind:?}: {e}");
            }
        }
        let record = YcsbRecord {
            fields: 3,
            field_length: 8,
        };
        let ycsb = Analyzer::new(Schema::from_sql(&ycsb_schema(record)).unwrap());
        for workload in [YcsbWorkload::A, YcsbWorkload::B, YcsbWorkload::C] {
            let mut g = Ycsb::new(100, &KeyDistribution::Uniform, workload, record, 4);
            for _ in 0..200 {
                let (op, tx) = g.next_tx();
                if let Err(e) = ycsb.analyze(&tx) {
                    panic!("{workload:?} {op:?}: {e}");
                }
            }
        }
    }

    #[test]
    fn ycsb_workloads_read_their_share_and_write_whole_fields() {
        let record = YcsbRecord::default();
        let reads = |w: YcsbWorkload| {
            let mut g = Ycsb::new(1000, &KeyDistribution::Uniform, w, record, 2);
            (0..10_000)
                .filter(|_| g.next_tx().0 == YcsbOp::Read)
                .count()
        };
        let a = reads(YcsbWorkload::A);
        let b = reads(YcsbWorkload::B);
        assert!((4_700..=5_300).contains(&a), "A reads {a} of 10 000");
        assert!((9_300..=9_700).contains(&b), "B reads {b} of 10 000");
        assert_eq!(reads(YcsbWorkload::C), 10_000);
        let mut g = Ycsb::new(1000, &KeyDistribution::Uniform, YcsbWorkload::A, record, 2);
        let update = std::iter::repeat_with(|| g.next_tx())
            .find(|(op, _)| *op == YcsbOp::Update)
            .unwrap()
            .1;
        match &update.statements[0].params[1] {
            Value::Text(v) => assert_eq!(v.len(), 100),
            other => panic!("{other:?}"),
        }
        let load = ycsb_load_sql(25, record, 10, 1);
        assert_eq!(load.len(), 3);
        assert!(load[0].starts_with("INSERT INTO usertable (ycsb_key, field0, field1,"));
        assert_eq!(ycsb_load_sql(25, record, 10, 1), load, "deterministic");
        assert!(
            YcsbRecord {
                fields: 0,
                field_length: 5
            }
            .check()
            .unwrap_err()
            .contains("0 fields")
        );
        assert!(
            "d".parse::<YcsbWorkload>()
                .unwrap_err()
                .contains("a, b and c")
        );
    }
}
