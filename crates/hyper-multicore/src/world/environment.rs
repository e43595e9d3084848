//! Reading the world from a launcher's environment: hmrun's variables, torchrun's, Open MPI's or
//! Slurm's, else a standalone process. A missing or inconsistent variable is an error naming it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::config::{self, Config};
use crate::control::unique_id::world_secret;
use crate::control::{BootstrapListener, ControlPlane, UniqueId, SECRET_LEN};
use crate::error::{Error, ErrorKind, Result};

use super::{Launcher, World};

/// The variables through which a launcher other than hmrun describes a process's place.
struct LauncherVariables {
    launcher: Launcher,
    /// Global rank.
    rank: &'static str,
    /// Number of processes in the job.
    size: &'static str,
    /// Rank among the processes on this host.
    local_rank: &'static str,
    /// Number of processes on this host, where the launcher says.
    local_size: Option<&'static str>,
    /// Index of this host, where the launcher says.
    node_rank: Option<&'static str>,
    /// Public values naming the job: the fallback secret is derived from them.
    job: &'static [&'static str],
}

const TORCHRUN: LauncherVariables = LauncherVariables {
    launcher: Launcher::Torchrun,
    rank: "RANK",
    size: "WORLD_SIZE",
    local_rank: "LOCAL_RANK",
    local_size: Some("LOCAL_WORLD_SIZE"),
    node_rank: Some("GROUP_RANK"),
    job: &["TORCHELASTIC_RUN_ID"],
};

const OPEN_MPI: LauncherVariables = LauncherVariables {
    launcher: Launcher::OpenMpi,
    rank: "OMPI_COMM_WORLD_RANK",
    size: "OMPI_COMM_WORLD_SIZE",
    local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
    local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    node_rank: None,
    job: &["OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE"],
};

const SLURM: LauncherVariables = LauncherVariables {
    launcher: Launcher::Slurm,
    rank: "SLURM_PROCID",
    size: "SLURM_NTASKS",
    local_rank: "SLURM_LOCALID",
    local_size: None,
    node_rank: Some("SLURM_NODEID"),
    job: &["SLURM_JOB_ID", "SLURM_STEP_ID"],
};

impl World {
    /// Reads the world from the environment and connects its control plane (a collective call:
    /// every process of the job must make it).
    pub fn from_env() -> Result<World> {
        let config = Config::from_env()?;
        crate::logging::install_if_unset(&config);
        World::from_lookup(|name| std::env::var(name).ok(), config)
    }

    /// A world of one process.
    pub fn standalone(config: Config) -> Result<World> {
        let id = placeholder_id();
        let control = ControlPlane::connect(0, 1, &id, None, config.timeout)?;
        Ok(World::assemble(Launcher::Standalone, 0, config, control))
    }

    /// Like [`World::from_env`], reading variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, config: Config) -> Result<World> {
        if lookup(config::RANK).is_some() {
            return World::from_hmrun(&lookup, config);
        }
        // torchrun is recognised by both variables (a stray RANK alone is not a job); the other
        // launchers' names are their own.
        if lookup(TORCHRUN.rank).is_some() && lookup(TORCHRUN.size).is_some() {
            return World::from_launcher(&TORCHRUN, &lookup, config);
        }
        for launcher in [&OPEN_MPI, &SLURM] {
            if lookup(launcher.rank).is_some() {
                return World::from_launcher(launcher, &lookup, config);
            }
        }
        World::standalone(config)
    }

    fn from_hmrun(lookup: &impl Fn(&str) -> Option<String>, config: Config) -> Result<World> {
        let rank = required_number(lookup, config::RANK)?;
        let size = required_number(lookup, config::WORLD_SIZE)?;
        check_rank(rank, size, config::RANK)?;
        let local_rank = optional_number(lookup, config::LOCAL_RANK)?.unwrap_or(rank);
        let id_text = lookup(config::WORLD_ID).ok_or_else(|| missing(config::WORLD_ID))?;
        let id: UniqueId = id_text
            .parse()
            .map_err(|e: Error| invalid(config::WORLD_ID, &id_text, e.message()))?;
        let listener = if rank == 0 && size > 1 {
            Some(match optional_number(lookup, config::WORLD_LISTEN_FD)? {
                Some(fd) => {
                    let fd = i32::try_from(fd).map_err(|_| {
                        invalid(
                            config::WORLD_LISTEN_FD,
                            &fd.to_string(),
                            "not a file descriptor",
                        )
                    })?;
                    let listener = crate::sys::inherited_fd::take_inherited_listener(
                        fd,
                        config::WORLD_LISTEN_FD,
                    )?;
                    BootstrapListener::from_listener(listener, id.clone())?
                }
                None => BootstrapListener::bind(&id)?,
            })
        } else {
            None
        };
        let control = ControlPlane::connect(rank, size, &id, listener, config.timeout)?;
        Ok(World::assemble(
            Launcher::Hmrun,
            local_rank,
            config,
            control,
        ))
    }

    fn from_launcher(
        vars: &LauncherVariables,
        lookup: &impl Fn(&str) -> Option<String>,
        config: Config,
    ) -> Result<World> {
        let rank = required_number(lookup, vars.rank)?;
        let size = required_number(lookup, vars.size)?;
        check_rank(rank, size, vars.rank)?;
        let local_rank = optional_number(lookup, vars.local_rank)?.unwrap_or(rank);
        let local_size = vars
            .local_size
            .map(|name| optional_number(lookup, name).map(|n| n.map(|n| (name, n))))
            .transpose()?
            .flatten();
        let node_rank = vars
            .node_rank
            .map(|name| optional_number(lookup, name).map(|n| n.map(|n| (name, n))))
            .transpose()?
            .flatten();
        check_placement(vars, rank, local_rank, local_size, node_rank)?;
        let endpoint = world_endpoint(lookup, &config, vars)?;
        let mut public = vec![endpoint.to_string()];
        public.extend(vars.job.iter().map(|name| lookup(name).unwrap_or_default()));
        let what = format!("the endpoint {endpoint} and {:?}", vars.job);
        let secret = world_secret(lookup, &public, &what)?;
        let id = UniqueId::new(endpoint, secret);
        let listener = if rank == 0 && size > 1 {
            Some(BootstrapListener::bind(&id)?)
        } else {
            None
        };
        let control = ControlPlane::connect(rank, size, &id, listener, config.timeout)?;
        Ok(World::assemble(vars.launcher, local_rank, config, control))
    }
}

/// The local rank must be inside the host's process count, and where the launcher gives the
/// host's index and process count, the global rank must follow from them (torchrun's placement:
/// `rank = node × local size + local rank`).
fn check_placement(
    vars: &LauncherVariables,
    rank: usize,
    local_rank: usize,
    local_size: Option<(&str, usize)>,
    node_rank: Option<(&str, usize)>,
) -> Result<()> {
    if local_rank > rank {
        return Err(invalid(
            vars.local_rank,
            &local_rank.to_string(),
            &format!(
                "the local rank exceeds the global rank {rank} ({})",
                vars.rank
            ),
        ));
    }
    let Some((size_name, local_size)) = local_size else {
        return Ok(());
    };
    if local_rank >= local_size {
        return Err(invalid(
            vars.local_rank,
            &local_rank.to_string(),
            &format!("need a local rank below {size_name}={local_size}"),
        ));
    }
    if let Some((node_name, node)) = node_rank {
        if node * local_size + local_rank != rank {
            return Err(invalid(
                vars.rank,
                &rank.to_string(),
                &format!(
                    "it disagrees with {node_name}={node} × {size_name}={local_size} + {}={local_rank}; \
                     the launcher's variables are inconsistent",
                    vars.local_rank
                ),
            ));
        }
    }
    Ok(())
}

/// Where world rank 0 listens: the bootstrap endpoint if set, else `MASTER_ADDR` at
/// `MASTER_PORT + 1` (`MASTER_PORT` itself belongs to torch's store).
fn world_endpoint(
    lookup: &impl Fn(&str) -> Option<String>,
    config: &Config,
    vars: &LauncherVariables,
) -> Result<SocketAddr> {
    if let Some(endpoint) = config.bootstrap_endpoint {
        return Ok(endpoint);
    }
    let needed = |name: &str| {
        Error::new(
            ErrorKind::InvalidConfig,
            "read world environment",
            format!(
                "{name} is not set: under {:?} the world's rendezvous needs {} \
                 (tcp://<host of rank 0>:<port>) or MASTER_ADDR and MASTER_PORT",
                vars.launcher,
                config::BOOTSTRAP_ENDPOINT
            ),
        )
    };
    let master_addr = lookup("MASTER_ADDR").ok_or_else(|| needed("MASTER_ADDR"))?;
    let master_port =
        optional_number(lookup, "MASTER_PORT")?.ok_or_else(|| needed("MASTER_PORT"))?;
    let port = u16::try_from(master_port + 1).map_err(|_| {
        invalid(
            "MASTER_PORT",
            &master_port.to_string(),
            "must be below 65535",
        )
    })?;
    config::parse_endpoint(&format!("tcp://{master_addr}:{port}"))
        .map_err(|why| invalid("MASTER_ADDR", &master_addr, &why))
}

/// The ID of a one-rank group: never connected to.
pub(super) fn placeholder_id() -> UniqueId {
    UniqueId::new(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        [0; SECRET_LEN],
    )
}

fn missing(name: &str) -> Error {
    Error::new(
        ErrorKind::InvalidConfig,
        "read world environment",
        format!(
            "{name} is not set; start the job with hmrun (or torchrun, srun, mpirun), or set \
             {name}"
        ),
    )
}

fn invalid(name: &str, value: &str, why: &str) -> Error {
    Error::new(
        ErrorKind::InvalidConfig,
        "read world environment",
        format!("{name}={value:?} is invalid: {why}"),
    )
}

fn optional_number(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>> {
    lookup(name)
        .map(|text| {
            text.trim()
                .parse::<usize>()
                .map_err(|_| invalid(name, &text, "expected a non-negative integer"))
        })
        .transpose()
}

fn required_number(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Result<usize> {
    optional_number(lookup, name)?.ok_or_else(|| missing(name))
}

fn check_rank(rank: usize, size: usize, name: &str) -> Result<()> {
    if size == 0 || rank >= size {
        return Err(invalid(
            name,
            &rank.to_string(),
            &format!("need 0 <= rank < world size ({size})"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup_from(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        }
    }

    fn error_of(pairs: &[(&str, &str)]) -> Error {
        World::from_lookup(lookup_from(pairs), Config::default()).unwrap_err()
    }

    #[test]
    fn no_launcher_means_standalone() {
        let world = World::from_lookup(|_| None, Config::default()).unwrap();
        assert_eq!(
            (world.rank(), world.size(), world.launcher()),
            (0, 1, Launcher::Standalone)
        );
        assert_eq!(
            world.control().allgather(b"x").unwrap(),
            vec![b"x".to_vec()]
        );
        let solo = world.new_group(&[0]).unwrap();
        solo.control().barrier().unwrap();
    }

    #[test]
    fn bad_launcher_variables_are_named() {
        let err = error_of(&[(config::RANK, "3"), (config::WORLD_SIZE, "2")]);
        assert!(err.to_string().contains(config::RANK), "{err}");
        let err = error_of(&[(config::RANK, "0"), (config::WORLD_SIZE, "2")]);
        assert!(err.to_string().contains(config::WORLD_ID), "{err}");
        let err = error_of(&[(config::RANK, "x"), (config::WORLD_SIZE, "2")]);
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    }

    #[test]
    fn every_launcher_is_recognised_and_its_missing_variables_named() {
        for (pairs, needle) in [
            (&[("SLURM_PROCID", "1")][..], "SLURM_NTASKS"),
            (&[("OMPI_COMM_WORLD_RANK", "1")][..], "OMPI_COMM_WORLD_SIZE"),
            (
                &[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")][..],
                "MASTER_ADDR",
            ),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "1"),
                    ("OMPI_COMM_WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "127.0.0.1"),
                ][..],
                "MASTER_PORT",
            ),
        ] {
            let err = error_of(pairs);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
            assert!(err.to_string().contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn inconsistent_placements_are_named() {
        let torchrun = [
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "1"),
        ];
        let err = error_of(&torchrun);
        assert!(err.to_string().contains("GROUP_RANK=1"), "{err}");
        assert!(err.to_string().contains("RANK=\"3\""), "{err}");
        let err = error_of(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]);
        assert!(
            err.to_string().contains("OMPI_COMM_WORLD_LOCAL_SIZE=2"),
            "{err}"
        );
    }

    #[test]
    fn a_launcher_world_of_one_needs_no_peer() {
        let world = World::from_lookup(
            lookup_from(&[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "1"),
                ("SLURM_LOCALID", "0"),
                ("SLURM_NODEID", "0"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29500"),
            ]),
            Config::default(),
        )
        .unwrap();
        assert_eq!((world.launcher(), world.size()), (Launcher::Slurm, 1));
    }
}
