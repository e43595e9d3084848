//! Output: one row per operation and PE count, as a human-readable table or as JSON lines.
//!
//! A JSON line holds `op`, `layer`, `bytes`, `pes`, `median_ns`, `min_ns`, `max_ns`, `trials`,
//! `batch_ops`, `ref_ns` (the median of the same-run reference, `null` where none applies),
//! `ref` (what the reference is) and `ratio` (`median_ns / ref_ns`).
//!
//! ```ignore
//! let mut report = Report::new(json);
//! report.row(&Row::new("barrier", "control", 0, 4, &timing, Some(("tcp loopback round trip", 41_000.0))))?;
//! ```

use std::io::Write;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::stats::Timing;

/// One measured operation.
#[derive(Debug, Serialize)]
pub struct Row<'a> {
    /// The operation, e.g. `barrier`.
    pub op: &'a str,
    /// Which part of the runtime it exercises, e.g. `control`, or `reference`.
    pub layer: &'a str,
    /// Payload bytes per rank.
    pub bytes: usize,
    /// PEs in the job.
    pub pes: usize,
    /// Median nanoseconds per operation.
    pub median_ns: f64,
    /// Fastest trial, nanoseconds per operation.
    pub min_ns: f64,
    /// Slowest trial, nanoseconds per operation.
    pub max_ns: f64,
    /// Trials (timed batches or launches).
    pub trials: usize,
    /// Operations per timed batch.
    pub batch_ops: u64,
    /// Median of the same-run reference in nanoseconds.
    pub ref_ns: Option<f64>,
    /// What the reference is.
    #[serde(rename = "ref")]
    pub reference: Option<&'a str>,
    /// `median_ns / ref_ns`.
    pub ratio: Option<f64>,
}

impl<'a> Row<'a> {
    /// A row for `timing`, compared with `reference` (its name and median) if given.
    pub fn new(
        op: &'a str,
        layer: &'a str,
        bytes: usize,
        pes: usize,
        timing: &Timing,
        reference: Option<(&'a str, f64)>,
    ) -> Row<'a> {
        let summary = timing.per_op;
        Row {
            op,
            layer,
            bytes,
            pes,
            median_ns: round(summary.median_ns),
            min_ns: round(summary.min_ns),
            max_ns: round(summary.max_ns),
            trials: summary.trials,
            batch_ops: timing.batch_ops,
            ref_ns: reference.map(|(_, ns)| round(ns)),
            reference: reference.map(|(name, _)| name),
            ratio: reference.map(|(_, ns)| (summary.median_ns / ns * 1e4).round() / 1e4),
        }
    }
}

/// Rounds nanoseconds to one decimal.
fn round(ns: f64) -> f64 {
    (ns * 10.0).round() / 10.0
}

/// Where rows go: a table (header first) or JSON lines, on stdout.
#[derive(Debug)]
pub struct Report {
    /// JSON lines instead of a table.
    json: bool,
    /// Whether the table header has been printed.
    header_printed: bool,
}

impl Report {
    /// A report printing JSON lines if `json`, else a table.
    pub fn new(json: bool) -> Report {
        Report {
            json,
            header_printed: false,
        }
    }

    /// Prints one row (as soon as it is measured, so a long run shows progress).
    pub fn row(&mut self, row: &Row<'_>) -> Result<()> {
        let mut out = std::io::stdout().lock();
        if self.json {
            let line = serde_json::to_string(row).context("serialize a report row")?;
            writeln!(out, "{line}").context("write the report")?;
        } else {
            if !self.header_printed {
                writeln!(
                    out,
                    "{:<9} {:<23} {:>5} {:>4} {:>10} {:>10} {:>10} {:>6} {:>7} {:>10} {:>7}",
                    "layer",
                    "op",
                    "bytes",
                    "PEs",
                    "median",
                    "min",
                    "max",
                    "trials",
                    "batch",
                    "ref",
                    "ratio"
                )
                .context("write the report")?;
                self.header_printed = true;
            }
            writeln!(
                out,
                "{:<9} {:<23} {:>5} {:>4} {:>10} {:>10} {:>10} {:>6} {:>7} {:>10} {:>7}",
                row.layer,
                row.op,
                row.bytes,
                row.pes,
                human(row.median_ns),
                human(row.min_ns),
                human(row.max_ns),
                row.trials,
                row.batch_ops,
                row.ref_ns.map_or_else(|| "-".to_string(), human),
                row.ratio
                    .map_or_else(|| "-".to_string(), |r| format!("{r:.3}x")),
            )
            .context("write the report")?;
        }
        out.flush().context("write the report")
    }
}

/// Nanoseconds with a readable unit.
fn human(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}
