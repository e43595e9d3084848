//! Ordered subgroups of the world ([`World::new_group`]), each with its own control plane.

use std::sync::Arc;

use crate::control::frame::WireError;
use crate::control::{ControlPlane, GroupChannel, UniqueId};
use crate::error::{Error, ErrorKind, Result};

use super::environment::placeholder_id;
use super::World;

impl World {
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
            let mut created = self.groups_created.lock();
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

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::world::World;

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
}
