//! The runtime's log output: a `tracing` subscriber filtered by
//! `HYPER_MULTICORE_SHMEM_LOG_LEVEL`, writing to stderr with the PE's rank at the start of every
//! line (`[pe 3] 2026-12-01T07:00:00Z DEBUG hyper_multicore::lifecycle: …`).
//!
//! Who installs it:
//! - the library, when a process joins a world ([`crate::world::World::from_env`]), but only when
//!   the application installed no global subscriber of its own (the application's choice wins;
//!   an application that wants its own must install it before the first runtime call);
//! - `hmrun` ([`install_as`]) and the Python front ([`install`]), always.
//!
//! ```
//! // An application that wants the runtime's format and filter up front:
//! let installed = hyper_multicore::logging::install()?;
//! # let _ = installed;
//! # Ok::<(), hyper_multicore::Error>(())
//! ```

use std::fmt;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use tracing::level_filters::LevelFilter;
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::Config;
use crate::error::Result;

/// Sentinel of [`RANK`]: the rank is not known (yet).
const UNKNOWN_RANK: usize = usize::MAX;

/// The world rank shown in every line, once known.
static RANK: AtomicUsize = AtomicUsize::new(UNKNOWN_RANK);

/// The prefix of a process that is not a PE (a launcher), set by [`install_as`].
static TOOL: OnceLock<String> = OnceLock::new();

/// Launcher variables that carry the world rank, in order of preference (hmrun, torchrun, Slurm,
/// Open MPI): the rank is shown from the first line on, before a world is joined.
const RANK_VARIABLES: &[&str] = &[
    crate::config::RANK,
    "RANK",
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
];

/// Installs the runtime's subscriber as the process's global default, with the level of
/// `HYPER_MULTICORE_SHMEM_LOG_LEVEL` (default `warn`). Returns `Ok(false)` when a global
/// subscriber was already installed (by the application, or by an earlier call): that one stays.
///
/// Errors: the variable holds an invalid level (the error names it).
pub fn install() -> Result<bool> {
    let config = Config::from_env()?;
    Ok(install_with_level(&config.log_level))
}

/// [`install`] for a process that is not a PE, such as a launcher: every line starts with
/// `[name]` instead of the rank.
pub fn install_as(name: &str) -> Result<bool> {
    let _ = TOOL.set(name.to_string());
    install()
}

/// The library's own call: installs the subscriber only when the application installed none,
/// never failing the caller (a bad level is reported by the configuration reader anyway).
pub(crate) fn install_if_unset(config: &Config) {
    if !tracing::dispatcher::has_been_set() {
        install_with_level(&config.log_level);
    }
}

/// Records this process's world rank for the prefix of every later line.
pub(crate) fn set_rank(rank: usize) {
    RANK.store(rank, Ordering::Relaxed);
}

fn install_with_level(level: &str) -> bool {
    if RANK.load(Ordering::Relaxed) == UNKNOWN_RANK {
        if let Some(rank) = RANK_VARIABLES
            .iter()
            .find_map(|name| std::env::var(name).ok()?.trim().parse::<usize>().ok())
        {
            set_rank(rank);
        }
    }
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_max_level(level_filter(level))
        .event_format(RankPrefixed(tracing_subscriber::fmt::format()))
        .finish();
    tracing::subscriber::set_global_default(subscriber).is_ok()
}

/// The filter of one of [`crate::config::LOG_LEVELS`] (already validated by the configuration).
fn level_filter(level: &str) -> LevelFilter {
    match level {
        "off" => LevelFilter::OFF,
        "error" => LevelFilter::ERROR,
        "info" => LevelFilter::INFO,
        "debug" => LevelFilter::DEBUG,
        "trace" => LevelFilter::TRACE,
        _ => LevelFilter::WARN,
    }
}

/// The default line format behind a `[pe N] ` prefix.
struct RankPrefixed<F>(F);

impl<S, N, F> FormatEvent<S, N> for RankPrefixed<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        context: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        match RANK.load(Ordering::Relaxed) {
            UNKNOWN_RANK => match TOOL.get() {
                Some(name) => write!(writer, "[{name}] ")?,
                None => write!(writer, "[pe ?] ")?,
            },
            rank => write!(writer, "[pe {rank}] ")?,
        }
        self.0.format_event(context, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configured_level_has_its_filter() {
        let filters: Vec<LevelFilter> = crate::config::LOG_LEVELS
            .iter()
            .map(|l| level_filter(l))
            .collect();
        assert_eq!(
            filters,
            [
                LevelFilter::OFF,
                LevelFilter::ERROR,
                LevelFilter::WARN,
                LevelFilter::INFO,
                LevelFilter::DEBUG,
                LevelFilter::TRACE
            ]
        );
    }
}
