//! The world — every process of the job, as the launcher described it — and ordered subgroups
//! of it that run their own collectives.
//!
//! [`World::from_env`] reads, in order of preference:
//! 1. hmrun's variables (`HYPER_MULTICORE_RANK`, `HYPER_MULTICORE_WORLD_SIZE`,
//!    `HYPER_MULTICORE_LOCAL_RANK`, `HYPER_MULTICORE_WORLD_ID`),
//! 2. torchrun's (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`): root rank 0
//!    listens on `MASTER_PORT + 1` (or `HYPER_MULTICORE_SHMEM_BOOTSTRAP_ENDPOINT`), and the
//!    secret is derived from the master address, port and `TORCHELASTIC_RUN_ID`,
//! 3. nothing: a standalone world of one process.
//!
//! ```no_run
//! use hyper_multicore::world::World;
//! let world = World::from_env()?;
//! // Like torch.distributed.new_group, but only the members call it.
//! if world.rank() < 2 {
//!     let pair = world.new_group(&[0, 1])?;
//!     pair.control().barrier()?;
//! }
//! # Ok::<(), hyper_multicore::Error>(())
//! ```

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use crate::config::{self, Config};
use crate::control::frame::WireError;
use crate::control::{BootstrapListener, ControlPlane, UniqueId, SECRET_LEN};
use crate::error::{Error, ErrorKind, Result};

/// How the world was described.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Started by `hmrun` (or anything setting its variables).
    Hmrun,
    /// Started by torchrun (`RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`).
    Torchrun,
    /// No launcher: one process alone.
    Standalone,
}

/// Every process of the job, with a connected control plane over all of them.
#[derive(Debug)]
pub struct World {
    launcher: Launcher,
    local_rank: usize,
    config: Config,
    control: ControlPlane,
    groups_created: Mutex<HashMap<Vec<usize>, u64>>,
    /// Subgroups made by [`World::subgroup`], one per member list, freed with the world.
    subgroups: parking_lot::Mutex<HashMap<Vec<usize>, Arc<Group>>>,
}

impl World {
    /// Reads the world from the environment and connects its control plane (a collective call:
    /// every process of the job must make it).
    pub fn from_env() -> Result<World> {
        let config = Config::from_env()?;
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
            World::from_hmrun(&lookup, config)
        } else if lookup("RANK").is_some() && lookup("WORLD_SIZE").is_some() {
            World::from_torchrun(&lookup, config)
        } else {
            World::standalone(config)
        }
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
                None => bind_for(&id)?,
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

    fn from_torchrun(lookup: &impl Fn(&str) -> Option<String>, config: Config) -> Result<World> {
        let rank = required_number(lookup, "RANK")?;
        let size = required_number(lookup, "WORLD_SIZE")?;
        check_rank(rank, size, "RANK")?;
        let local_rank = optional_number(lookup, "LOCAL_RANK")?.unwrap_or(rank);
        let master_addr = lookup("MASTER_ADDR").ok_or_else(|| missing("MASTER_ADDR"))?;
        let master_port = required_number(lookup, "MASTER_PORT")?;
        let port = u16::try_from(master_port + 1).map_err(|_| {
            invalid(
                "MASTER_PORT",
                &master_port.to_string(),
                "must be below 65535",
            )
        })?;
        let endpoint = match config.bootstrap_endpoint {
            Some(endpoint) => endpoint,
            None => config::parse_endpoint(&format!("tcp://{master_addr}:{port}"))
                .map_err(|why| invalid("MASTER_ADDR", &master_addr, &why))?,
        };
        let run_id = lookup("TORCHELASTIC_RUN_ID").unwrap_or_default();
        let id = UniqueId::new(
            endpoint,
            derive_secret(&[&master_addr, &master_port.to_string(), &run_id]),
        );
        let listener = if rank == 0 && size > 1 {
            Some(bind_for(&id)?)
        } else {
            None
        };
        let control = ControlPlane::connect(rank, size, &id, listener, config.timeout)?;
        Ok(World::assemble(
            Launcher::Torchrun,
            local_rank,
            config,
            control,
        ))
    }

    fn assemble(
        launcher: Launcher,
        local_rank: usize,
        config: Config,
        control: ControlPlane,
    ) -> World {
        World {
            launcher,
            local_rank,
            config,
            control,
            groups_created: Mutex::new(HashMap::new()),
            subgroups: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// This process's rank in the world.
    pub fn rank(&self) -> usize {
        self.control.rank()
    }

    /// The number of processes in the world.
    pub fn size(&self) -> usize {
        self.control.size()
    }

    /// This process's rank among the processes on its host.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// How the world was described.
    pub fn launcher(&self) -> Launcher {
        self.launcher
    }

    /// The configuration read at start.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The world's control plane (collectives over every process).
    pub fn control(&self) -> &ControlPlane {
        &self.control
    }

    /// Forms the ordered subgroup `members` (world ranks) and connects its own control plane.
    ///
    /// Only the members call it, all with the same list, in the same order relative to their
    /// other `new_group` calls with that list. Group rank 0 (`members[0]`) creates a fresh unique
    /// ID and sends it to the others over the world plane; if it cannot, it sends the failure
    /// instead, and every member fails with an error naming group rank 0.
    pub fn new_group(&self, members: &[usize]) -> Result<Group> {
        const OP: &str = "new group";
        let group_rank = self.check_members(members)?;
        let tag = {
            let mut created = crate::control::lock_unpoisoned(&self.groups_created);
            let counter = created.entry(members.to_vec()).or_insert(0);
            *counter += 1;
            group_tag(members, *counter)
        };
        let (id, listener) = if group_rank == 0 {
            let created = if members.len() == 1 {
                Ok((placeholder_id(), None))
            } else {
                UniqueId::create(&self.config).map(|(id, l)| (id, Some(l)))
            };
            let message = match &created {
                Ok((id, _)) => Ok(id.to_bytes()),
                Err(error) => Err(WireError::from_error(error)),
            };
            let bytes = postcard::to_stdvec(&message).expect("a unique-ID message serializes");
            for &member in &members[1..] {
                self.control.send(member, tag, &bytes)?;
            }
            created.map_err(|e| group_root_failed(&e, members[0]).on_rank(0))?
        } else {
            let bytes = self.control.recv(members[0], tag)?;
            let message: std::result::Result<Vec<u8>, WireError> = postcard::from_bytes(&bytes)
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Protocol,
                        OP,
                        format!("group rank 0 sent a malformed unique ID: {e}"),
                    )
                })?;
            match message {
                Ok(id_bytes) => (UniqueId::from_bytes(&id_bytes)?, None),
                Err(wire) => {
                    return Err(group_root_failed(&wire.to_error(), members[0]).on_rank(group_rank))
                }
            }
        };
        let control = ControlPlane::connect(
            group_rank,
            members.len(),
            &id,
            listener,
            self.config.timeout,
        )?;
        Ok(Group {
            members: members.to_vec(),
            control,
        })
    }

    /// The subgroup `members`, formed by [`World::new_group`] on first use (a collective call over
    /// the members then) and reused afterwards: one per member list, freed with the world.
    pub fn subgroup(&self, members: &[usize]) -> Result<Arc<Group>> {
        let mut subgroups = self.subgroups.lock();
        if let Some(group) = subgroups.get(members) {
            return Ok(Arc::clone(group));
        }
        let group = Arc::new(self.new_group(members)?);
        subgroups.insert(members.to_vec(), Arc::clone(&group));
        Ok(group)
    }

    /// The member lists of the subgroups [`World::subgroup`] holds, in no particular order.
    pub fn cached_subgroups(&self) -> Vec<Vec<usize>> {
        self.subgroups.lock().keys().cloned().collect()
    }

    /// Validates a membership list (non-empty, inside the world, no rank twice, the caller a
    /// member) without any communication; returns the caller's rank in it.
    pub fn check_members(&self, members: &[usize]) -> Result<usize> {
        let bad = |message: String| {
            Error::new(ErrorKind::InvalidArgument, "new group", message).on_rank(self.rank())
        };
        if members.is_empty() {
            return Err(bad("a group needs at least one member".into()));
        }
        if let Some(&outside) = members.iter().find(|&&r| r >= self.size()) {
            return Err(bad(format!(
                "world rank {outside} is outside the world of {} ranks",
                self.size()
            )));
        }
        let mut seen = members.to_vec();
        seen.sort_unstable();
        if let Some(pair) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!(
                "world rank {} is listed twice in {members:?}",
                pair[0]
            )));
        }
        members
            .iter()
            .position(|&r| r == self.rank())
            .ok_or_else(|| {
                bad(format!(
                    "world rank {} is not a member of {members:?}; only members create a group",
                    self.rank()
                ))
            })
    }
}

/// Where a root group's communication comes from (see [`GroupChannel::mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelMode {
    /// One process alone: no distributed world.
    Standalone,
    /// The launcher's world (hmrun, torchrun's environment) or a subgroup of it, over this
    /// crate's control plane.
    LauncherWorld,
    /// A torch.distributed process group (the Python front's channel), while it is alive.
    Torch,
    /// A channel whose distributed runtime was torn down (e.g. its torch process group was
    /// destroyed): it can no longer carry the root's collectives.
    Destroyed,
}

impl ChannelMode {
    /// Lower-case name, as errors show it.
    pub fn name(self) -> &'static str {
        match self {
            ChannelMode::Standalone => "standalone",
            ChannelMode::LauncherWorld => "launcher world",
            ChannelMode::Torch => "torch.distributed",
            ChannelMode::Destroyed => "destroyed",
        }
    }
}

/// The communication the managed lifecycle needs from a root group: its ordered membership and
/// an allgather with deadlines and peer-loss detection. Implemented by [`World`], [`Group`] and
/// [`ControlPlane`]; the Python front implements it over a torch `ProcessGroup`.
pub trait GroupChannel: Send + Sync + std::fmt::Debug {
    /// This process's rank in the group.
    fn rank(&self) -> usize;
    /// The number of members.
    fn size(&self) -> usize;
    /// The members' world ranks, in group-rank order.
    fn members(&self) -> Vec<usize>;
    /// True if the group belongs to a distributed world (false for a standalone process).
    fn distributed(&self) -> bool;
    /// Where the group's communication comes from, now. The lifecycle records it at the first
    /// acquire and refuses a later acquire, release or restart once it has changed (e.g. the
    /// torch process group was destroyed). Default: [`ChannelMode::LauncherWorld`] if
    /// [`distributed`](GroupChannel::distributed), else [`ChannelMode::Standalone`].
    fn mode(&self) -> ChannelMode {
        if self.distributed() {
            ChannelMode::LauncherWorld
        } else {
            ChannelMode::Standalone
        }
    }
    /// Every member's `data`, in group-rank order (a collective call).
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Returns once every member has called it.
    fn barrier(&self) -> Result<()> {
        self.allgather(&[]).map(drop)
    }
    /// Fails if the channel already knows it cannot work any more (a member died); checked
    /// while the lifecycle waits in a runtime's rendezvous.
    fn ensure_alive(&self) -> Result<()> {
        Ok(())
    }
}

impl GroupChannel for ControlPlane {
    fn rank(&self) -> usize {
        ControlPlane::rank(self)
    }
    fn size(&self) -> usize {
        ControlPlane::size(self)
    }
    fn members(&self) -> Vec<usize> {
        (0..ControlPlane::size(self)).collect()
    }
    fn distributed(&self) -> bool {
        ControlPlane::size(self) > 1
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        ControlPlane::allgather(self, data)
    }
    fn barrier(&self) -> Result<()> {
        ControlPlane::barrier(self)
    }
    fn ensure_alive(&self) -> Result<()> {
        self.broken().map_or(Ok(()), Err)
    }
}

impl GroupChannel for World {
    fn rank(&self) -> usize {
        World::rank(self)
    }
    fn size(&self) -> usize {
        World::size(self)
    }
    fn members(&self) -> Vec<usize> {
        (0..World::size(self)).collect()
    }
    fn distributed(&self) -> bool {
        self.launcher != Launcher::Standalone
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.control.allgather(data)
    }
    fn barrier(&self) -> Result<()> {
        self.control.barrier()
    }
    fn ensure_alive(&self) -> Result<()> {
        self.control.ensure_alive()
    }
}

impl GroupChannel for Group {
    fn rank(&self) -> usize {
        Group::rank(self)
    }
    fn size(&self) -> usize {
        Group::size(self)
    }
    fn members(&self) -> Vec<usize> {
        self.members.clone()
    }
    fn distributed(&self) -> bool {
        true
    }
    fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.control.allgather(data)
    }
    fn barrier(&self) -> Result<()> {
        self.control.barrier()
    }
    fn ensure_alive(&self) -> Result<()> {
        self.control.ensure_alive()
    }
}

static GLOBAL_WORLD: Mutex<Option<Arc<World>>> = Mutex::new(None);

impl World {
    /// The process-wide world, created from the environment by the first call (a collective
    /// call then: every process of the job must make it). Later calls return the same world.
    pub fn global() -> Result<Arc<World>> {
        let mut global = crate::control::lock_unpoisoned(&GLOBAL_WORLD);
        if let Some(world) = global.as_ref() {
            return Ok(Arc::clone(world));
        }
        let world = Arc::new(World::from_env()?);
        *global = Some(Arc::clone(&world));
        Ok(world)
    }
}

/// An ordered subgroup of the world with its own control plane.
#[derive(Debug)]
pub struct Group {
    members: Vec<usize>,
    control: ControlPlane,
}

impl Group {
    /// The members' world ranks, in group-rank order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// This process's rank in the group.
    pub fn rank(&self) -> usize {
        self.control.rank()
    }

    /// The number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The world rank of group rank `group_rank`.
    pub fn world_rank(&self, group_rank: usize) -> Option<usize> {
        self.members.get(group_rank).copied()
    }

    /// The group's own control plane.
    pub fn control(&self) -> &ControlPlane {
        &self.control
    }
}

fn group_root_failed(cause: &Error, root_world_rank: usize) -> Error {
    Error::new(
        cause.kind(),
        "new group",
        format!(
            "group rank 0 (world rank {root_world_rank}) could not create the group's unique ID: {}",
            cause.message()
        ),
    )
    .with_peer(0)
}

/// A tag for the unique-ID message of the `counter`-th group with these members (FNV-1a).
fn group_tag(members: &[usize], counter: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for value in members.iter().map(|&m| m as u64).chain([u64::MAX, counter]) {
        for byte in value.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// A secret every torchrun rank derives alike from the launch parameters (FNV-1a, two lanes).
fn derive_secret(parts: &[&str]) -> [u8; SECRET_LEN] {
    let mut secret = [0u8; SECRET_LEN];
    for (lane, chunk) in secret.chunks_mut(8).enumerate() {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325 ^ (lane as u64 + 1);
        for part in parts {
            for byte in part.bytes().chain([0xff]) {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        chunk.copy_from_slice(&hash.to_le_bytes());
    }
    secret
}

/// The ID of a one-rank group: never connected to.
fn placeholder_id() -> UniqueId {
    UniqueId::new(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        [0; SECRET_LEN],
    )
}

fn bind_for(id: &UniqueId) -> Result<BootstrapListener> {
    let listener = std::net::TcpListener::bind(id.endpoint()).map_err(|e| {
        Error::backend(
            "read world environment",
            &format!(
                "world rank 0 cannot listen on {} (set {} to a free local tcp://host:port)",
                id.endpoint(),
                config::BOOTSTRAP_ENDPOINT
            ),
            e,
        )
    })?;
    BootstrapListener::from_listener(listener, id.clone())
}

fn missing(name: &str) -> Error {
    Error::new(
        ErrorKind::InvalidConfig,
        "read world environment",
        format!("{name} is not set; start the job with hmrun (or torchrun), or set {name}"),
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

    fn lookup_from(
        pairs: &'static [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
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
        let err = World::from_lookup(
            lookup_from(&[(config::RANK, "3"), (config::WORLD_SIZE, "2")]),
            Config::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains(config::RANK), "{err}");
        let err = World::from_lookup(
            lookup_from(&[(config::RANK, "0"), (config::WORLD_SIZE, "2")]),
            Config::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains(config::WORLD_ID), "{err}");
        let err = World::from_lookup(
            lookup_from(&[(config::RANK, "x"), (config::WORLD_SIZE, "2")]),
            Config::default(),
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    }

    #[test]
    fn group_membership_is_checked() {
        let world = World::standalone(Config::default()).unwrap();
        for (members, needle) in [
            (&[][..], "at least one"),
            (&[0, 0][..], "twice"),
            (&[1][..], "outside"),
        ] {
            let err = world.new_group(members).unwrap_err();
            assert!(err.to_string().contains(needle), "{err}");
        }
    }

    #[test]
    fn derived_secrets_depend_on_every_part() {
        assert_eq!(derive_secret(&["a", "1"]), derive_secret(&["a", "1"]));
        assert_ne!(derive_secret(&["a", "1"]), derive_secret(&["a1", ""]));
    }
}
