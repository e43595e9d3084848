//! Figures of a run: the time-to-error distribution of each series, and the whole run as JSON
//! (the source of the figures in `docs/reliability.md`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::abuse::AbuseReport;
use crate::points::Verdict;
use crate::soak::SoakReport;

/// Median and maximum of a series, ms.
#[derive(Debug, Clone, Serialize)]
pub struct Distribution {
    /// The series.
    pub series: String,
    /// Survivor errors measured.
    pub count: usize,
    /// Median, ms.
    pub median_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// Maximum, ms.
    pub max_ms: f64,
}

impl Distribution {
    /// The distribution of `values` (nearest-rank percentiles).
    pub fn of(series: &str, values: &[f64]) -> Option<Distribution> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank =
            |q: f64| sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
        Some(Distribution {
            series: series.into(),
            count: sorted.len(),
            median_ms: rank(0.5),
            p90_ms: rank(0.9),
            max_ms: *sorted.last().expect("non-empty"),
        })
    }
}

/// The time-to-error distributions: survivors' blocking time per series, and, where victims
/// kill themselves, the time from the death to each survivor's error.
pub fn distributions(verdicts: &[Verdict]) -> Vec<Distribution> {
    let mut waits: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut deaths: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for verdict in verdicts {
        waits
            .entry(&verdict.series)
            .or_default()
            .extend(&verdict.wait_ms);
        deaths
            .entry(&verdict.series)
            .or_default()
            .extend(&verdict.since_death_ms);
    }
    let mut out: Vec<Distribution> = waits
        .iter()
        .filter_map(|(series, values)| {
            Distribution::of(&format!("{series}: wait in the failing call"), values)
        })
        .collect();
    out.extend(deaths.iter().filter_map(|(series, values)| {
        Distribution::of(
            &format!("{series}: victim's death → survivor's error"),
            values,
        )
    }));
    out
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct RunReport {
    /// `--ci` or full.
    pub mode: String,
    /// PE counts of the fault-point jobs.
    pub pes: Vec<usize>,
    /// The runtime timeout given to PEs, s.
    pub runtime_timeout_s: f64,
    /// Every fault point's verdict.
    pub points: Vec<Verdict>,
    /// Time-to-error distributions.
    pub distributions: Vec<Distribution>,
    /// The soak.
    pub soak: Option<SoakReport>,
    /// The bootstrap abuse.
    pub abuse: Option<AbuseReport>,
    /// The host faults (`None`: not selected).
    pub hosts: Option<crate::host_faults::HostFaults>,
    /// Totals: (tried, survived, hangs, leaks).
    pub totals: (usize, usize, usize, usize),
    /// Wall time of the run, s.
    pub elapsed_s: f64,
}
