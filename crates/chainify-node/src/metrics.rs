//! Prometheus metrics of an organization's components, in the text exposition format
//! (version 0.0.4) that every Prometheus server scrapes.
//!
//! Per-phase latency histograms are recorded where each phase happens: the ChainifyServer
//! (endorse, order), the execution port (validate and analyse, execute, digest, checkpoint) and
//! the node (vote, append). Heights, lag, votes, states and counters are read from the node's
//! status when scraped, so they never drift from what `chainify status` shows.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chainify_commit::State;

use crate::NodeStatus;

/// Upper bounds of the latency buckets, in seconds.
pub const SECONDS_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Upper bounds of the block-size buckets, in transactions.
pub const BLOCK_TXS_BUCKETS: [f64; 9] =
    [1.0, 16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0];

/// A cumulative histogram with fixed buckets.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// Sum of the observations, in millionths.
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros
            .fetch_add((value.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The sum of the observations.
    pub fn sum(&self) -> f64 {
        self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&self.counts) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = |s: &str| {
            if s.is_empty() {
                String::new()
            } else {
                format!("{{{s}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {count}", braces(labels));
    }
}

/// The phases a transaction's block goes through, as the paper breaks them down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Admission at the origin: the checks, the ledger lookup and early abort at the other
    /// organizations (ChainifyServer).
    Endorse,
    /// Handing the transaction to the orderer (ChainifyServer).
    Order,
    /// Validating a block: signatures, endorsement policy, replays.
    Validate,
    /// Analysing a block's SQL: read/write sets, determinism rules, grants.
    Analyse,
    /// Running a block's transactions on the database.
    Execute,
    /// Reading back and hashing a block's changes.
    Digest,
    /// Taking a checkpoint.
    Checkpoint,
    /// From a block executed locally to its agreement.
    Vote,
    /// Appending an agreed block to the ledger.
    Append,
}

impl Phase {
    /// Every phase, in pipeline order.
    pub const ALL: [Phase; 9] = [
        Phase::Endorse,
        Phase::Order,
        Phase::Validate,
        Phase::Analyse,
        Phase::Execute,
        Phase::Digest,
        Phase::Checkpoint,
        Phase::Vote,
        Phase::Append,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Endorse => "endorse",
            Phase::Order => "order",
            Phase::Validate => "validate",
            Phase::Analyse => "analyse",
            Phase::Execute => "execute",
            Phase::Digest => "digest",
            Phase::Checkpoint => "checkpoint",
            Phase::Vote => "vote",
            Phase::Append => "append",
        }
    }
}

/// The metrics one process records.
#[derive(Debug)]
pub struct Metrics {
    phases: Vec<Histogram>,
    block_txs: Histogram,
    /// Times the digest triggers were found broken and reinstalled.
    pub trigger_repairs: AtomicU64,
    /// Full scans against the state digest completed.
    pub state_checks: AtomicU64,
    /// Full scans that found the tables differ from the state digest.
    pub state_mismatches: AtomicU64,
    /// Shared tables a full scan found with a definition changed since registration.
    pub definition_changes: AtomicU64,
    /// Blocks validated and analysed ahead, while the block before executed.
    pub prepared_ahead: AtomicU64,
    /// Transactions whose analysis an execution found made ahead.
    pub analysed_ahead: AtomicU64,
    /// Transactions that ran as barriers because their accesses cost the dependency graph more
    /// than their share of its work budget.
    pub graph_barriers: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            phases: Phase::ALL
                .iter()
                .map(|_| Histogram::new(&SECONDS_BUCKETS))
                .collect(),
            block_txs: Histogram::new(&BLOCK_TXS_BUCKETS),
            trigger_repairs: AtomicU64::new(0),
            state_checks: AtomicU64::new(0),
            state_mismatches: AtomicU64::new(0),
            definition_changes: AtomicU64::new(0),
            prepared_ahead: AtomicU64::new(0),
            analysed_ahead: AtomicU64::new(0),
            graph_barriers: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Records how long `phase` took once.
    pub fn observe(&self, phase: Phase, took: Duration) {
        self.phase(phase).observe(took.as_secs_f64());
    }

    /// The histogram of `phase`.
    pub fn phase(&self, phase: Phase) -> &Histogram {
        let i = Phase::ALL.iter().position(|p| *p == phase).unwrap_or(0);
        &self.phases[i]
    }

    /// Records the size of an executed block.
    pub fn observe_block(&self, txs: usize) {
        self.block_txs.observe(txs as f64);
    }

    /// The histograms in the exposition format.
    pub fn render(&self, out: &mut String) {
        header(
            out,
            "chainify_phase_seconds",
            "histogram",
            "Time spent per phase of the pipeline (endorse and order per transaction, the others per block).",
        );
        for phase in Phase::ALL {
            self.phase(phase).render(
                out,
                "chainify_phase_seconds",
                &format!("phase=\"{}\"", phase.name()),
            );
        }
        header(
            out,
            "chainify_block_transactions",
            "histogram",
            "Transactions per executed block.",
        );
        self.block_txs
            .render(out, "chainify_block_transactions", "");
        for (name, help, value) in [
            (
                "chainify_trigger_repairs_total",
                "Times the digest triggers were found missing, disabled or altered and reinstalled.",
                &self.trigger_repairs,
            ),
            (
                "chainify_graph_barriers_total",
                "Transactions that ran as barriers (after every earlier one of their block, before every later one) because their accesses cost the dependency graph more than their share of its work budget.",
                &self.graph_barriers,
            ),
            (
                "chainify_state_checks_total",
                "Full scans of the shared tables compared with the state digest.",
                &self.state_checks,
            ),
            (
                "chainify_state_mismatches_total",
                "Full scans that found the shared tables differ from the state digest.",
                &self.state_mismatches,
            ),
            (
                "chainify_definition_changes_total",
                "Shared tables a full scan found changed (a CHECK, a default, a column, a trigger) since registration.",
                &self.definition_changes,
            ),
            (
                "chainify_blocks_prepared_ahead_total",
                "Blocks validated and analysed while the block before executed.",
                &self.prepared_ahead,
            ),
            (
                "chainify_transactions_analysed_ahead_total",
                "Transactions whose execution found their analysis made ahead.",
                &self.analysed_ahead,
            ),
        ] {
            sample(
                out,
                name,
                "counter",
                help,
                value.load(Ordering::Relaxed) as f64,
            );
        }
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Writes one sample of a metric with its header.
pub fn sample(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// Writes a labelled metric: its header and one sample per `(labels, value)`.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
    header(out, name, kind, help);
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

/// The node's heights, lag, state, votes and counters, as of `status`.
pub fn render_status(out: &mut String, status: &NodeStatus) {
    let agreed = status.next_block.0.saturating_sub(1) as f64;
    let executed = status.executed.map_or(0, |b| b.0) as f64;
    family(
        out,
        "chainify_block_height",
        "gauge",
        "Newest block per component: executed locally, or agreed and appended to the ledger.",
        &[
            ("component=\"execution\"".into(), executed),
            ("component=\"commit\"".into(), agreed),
        ],
    );
    sample(
        out,
        "chainify_executed_ahead_blocks",
        "gauge",
        "Blocks executed and waiting for their agreement.",
        (executed - agreed).max(0.0),
    );
    let state = match &status.state {
        State::Running => "running",
        State::Recovering { .. } => "recovering",
        State::Waiting { .. } => "waiting",
        State::Halted { .. } => "halted",
    };
    family(
        out,
        "chainify_state",
        "gauge",
        "The commit engine's state (1 for the current one).",
        &["running", "recovering", "waiting", "halted"]
            .map(|s| (format!("state=\"{s}\""), if s == state { 1.0 } else { 0.0 })),
    );
    sample(
        out,
        "chainify_pending_votes",
        "gauge",
        "Votes counted for the next block to append.",
        status.pending_votes.len() as f64,
    );
    for (name, help, value) in [
        (
            "chainify_recoveries_total",
            "Recoveries that ended in an agreed append.",
            status.recoveries_total,
        ),
        (
            "chainify_repairs_total",
            "Tables repaired after a full scan found them different from the agreed state.",
            status.repairs_total,
        ),
        (
            "chainify_state_transfers_total",
            "States adopted from another organization (repair, equivocation, fast join).",
            status.state_transfers_total,
        ),
        (
            "chainify_alarms_total",
            "Alarms raised (disagreement, impossible agreement, failed recovery).",
            status.alarms_total,
        ),
        (
            "chainify_rejected_votes_total",
            "Votes not counted (forged, misdirected, equivocating, duplicate).",
            status.rejected_votes,
        ),
        (
            "chainify_rejected_certificates_total",
            "Certificates not accepted.",
            status.rejected_certificates,
        ),
        (
            "chainify_invalid_transactions_total",
            "Transactions flagged invalid by validation.",
            status.invalid_transactions,
        ),
        (
            "chainify_execution_errors_total",
            "Failed attempts to execute a block (retried).",
            status.execution_errors,
        ),
        (
            "chainify_dropped_messages_total",
            "Peer messages dropped because the inbox was full.",
            status.dropped_messages,
        ),
    ] {
        sample(out, name, "counter", help, value as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "phase=\"vote\"");
        assert_eq!(
            out,
            "x_seconds_bucket{phase=\"vote\",le=\"0.1\"} 1\n\
             x_seconds_bucket{phase=\"vote\",le=\"1\"} 3\n\
             x_seconds_bucket{phase=\"vote\",le=\"+Inf\"} 4\n\
             x_seconds_sum{phase=\"vote\"} 4.25\n\
             x_seconds_count{phase=\"vote\"} 4\n"
        );
    }

    #[test]
    fn every_phase_is_exposed_and_recorded_apart() {
        let m = Metrics::default();
        m.observe(Phase::Vote, Duration::from_millis(30));
        m.observe(Phase::Vote, Duration::from_millis(40));
        m.observe(Phase::Execute, Duration::from_millis(5));
        let mut out = String::new();
        m.render(&mut out);
        for phase in Phase::ALL {
            assert!(
                out.contains(&format!(
                    "chainify_phase_seconds_count{{phase=\"{}\"}}",
                    phase.name()
                )),
                "{out}"
            );
        }
        assert!(
            out.contains("chainify_phase_seconds_count{phase=\"vote\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("chainify_phase_seconds_count{phase=\"execute\"} 1\n"),
            "{out}"
        );
        assert_eq!(
            out.matches("# TYPE chainify_phase_seconds histogram")
                .count(),
            1
        );
    }

    #[test]
    fn status_shows_heights_state_and_counters() {
        let mut status = NodeStatus::new(chainify_core::OrgId(1), chainify_core::BlockNumber(8));
        status.executed = Some(chainify_core::BlockNumber(9));
        status.rejected_votes = 3;
        let mut out = String::new();
        render_status(&mut out, &status);
        assert!(
            out.contains("chainify_block_height{component=\"commit\"} 7\n"),
            "{out}"
        );
        assert!(
            out.contains("chainify_block_height{component=\"execution\"} 9\n"),
            "{out}"
        );
        assert!(out.contains("chainify_executed_ahead_blocks 2\n"), "{out}");
        assert!(
            out.contains("chainify_state{state=\"running\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("chainify_state{state=\"halted\"} 0\n"),
            "{out}"
        );
        assert!(out.contains("chainify_rejected_votes_total 3\n"), "{out}");
    }
}
