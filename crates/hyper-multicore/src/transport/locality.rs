//! Locality: which PEs share a host and so a segment. Every rank introduces its host identity
//! at initialize; [`Locality::new`] groups the ranks the same way on every rank.

use crate::config::TransportMode;

pub use crate::control::TEST_HOST_VARIABLE;

/// This host's identity: its name, boot ID (distinct per machine and boot) and network
/// namespace (the segment hand-off's abstract Unix socket is per network namespace, so PEs in
/// different ones cannot share a segment).
pub(crate) fn host_identity() -> String {
    #[cfg(feature = "fault-injection")]
    if let Ok(simulated) = std::env::var(TEST_HOST_VARIABLE) {
        return format!("simulated host {simulated}");
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let name = rustix::system::uname();
    let network = std::fs::read_link("/proc/self/ns/net").unwrap_or_default();
    format!(
        "{}@{}/{}",
        name.nodename().to_string_lossy(),
        boot.trim(),
        network.display()
    )
}

/// Which PEs share a segment: the locality groups of a root, identical on every rank.
///
/// PEs are grouped by host identity (name, boot ID, network namespace). `auto` and `shm`: one
/// group per host (the group's lowest rank creates the segment and hands it to the others);
/// `ucx`: every PE is its own group, so every pair goes through UCX.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Locality {
    /// The groups, each ascending by root rank, ordered by their lowest rank.
    pub(crate) groups: Vec<Vec<usize>>,
    /// Index in `groups` of every rank's group.
    pub(crate) group_of: Vec<usize>,
    /// Index of every rank's host (in order of first appearance).
    pub(crate) host_of: Vec<usize>,
}

impl Locality {
    /// The groups of a root whose ranks report `hosts` (in rank order), under `mode`.
    pub(crate) fn new(mode: TransportMode, hosts: &[&str]) -> Locality {
        let mut names: Vec<&str> = Vec::new();
        let host_of: Vec<usize> = hosts
            .iter()
            .map(|host| match names.iter().position(|n| n == host) {
                Some(index) => index,
                None => {
                    names.push(host);
                    names.len() - 1
                }
            })
            .collect();
        let group_of: Vec<usize> = match mode {
            TransportMode::Auto | TransportMode::Shm => host_of.clone(),
            TransportMode::Ucx => (0..hosts.len()).collect(),
        };
        let count = group_of.iter().max().map_or(0, |g| g + 1);
        let mut groups = vec![Vec::new(); count];
        for (rank, &group) in group_of.iter().enumerate() {
            groups[group].push(rank);
        }
        Locality {
            groups,
            group_of,
            host_of,
        }
    }

    /// How many PEs of the root run on `rank`'s host (its own included).
    pub(crate) fn local_pes(&self, rank: usize) -> usize {
        let host = self.host_of[rank];
        self.host_of.iter().filter(|&&h| h == host).count()
    }

    /// The members of `rank`'s group.
    pub(crate) fn members_of(&self, rank: usize) -> &[usize] {
        &self.groups[self.group_of[rank]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_and_shm_group_pes_by_host() {
        let hosts = ["a", "b", "a", "c", "b"];
        for mode in [TransportMode::Auto, TransportMode::Shm] {
            let locality = Locality::new(mode, &hosts);
            assert_eq!(locality.groups, vec![vec![0, 2], vec![1, 4], vec![3]]);
            assert_eq!(locality.members_of(4), &[1, 4]);
            assert_eq!(locality.local_pes(0), 2);
            assert_eq!(locality.local_pes(3), 1);
        }
    }

    #[test]
    fn ucx_makes_every_pe_its_own_group() {
        let locality = Locality::new(TransportMode::Ucx, &["a", "a", "a"]);
        assert_eq!(locality.groups, vec![vec![0], vec![1], vec![2]]);
        assert_eq!(locality.members_of(1), &[1]);
        // Still three PEs on the host (the waiting policy counts them).
        assert_eq!(locality.local_pes(1), 3);
    }

    #[test]
    fn one_host_is_one_group() {
        let locality = Locality::new(TransportMode::Auto, &["h"; 4]);
        assert_eq!(locality.groups, vec![vec![0, 1, 2, 3]]);
        assert_eq!(locality.group_of, vec![0; 4]);
    }
}
