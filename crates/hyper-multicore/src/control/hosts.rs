//! Which host every rank of a control plane runs on, so that a loss names hosts and ranks, and
//! liveness beats across hosts once per host.
//!
//! Each member says its node name (the kernel's `uname` node name) in its hello; root rank 0
//! adds its own and sends the whole map, by rank, in every member's welcome. Errors name hosts
//! from it, and each host's lowest rank is its leader: the only rank of the host that beats
//! across hosts (see `liveness.rs` and `host_watch.rs`).
//!
//! ```text
//! ranks 0 1 2 3 on hosts a a b b:  host_of(2) = "b", ranks_on("b") = [2, 3], leader_of(3) = 2
//! ```

use serde::{Deserialize, Serialize};

/// The node name of every rank of a plane, by rank.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostMap {
    names: Vec<String>,
}

/// Test-only: a simulated host name replacing this process's host identity, so one machine
/// can run a group spanning "hosts" (shared memory within each, UCX between them; the control
/// plane's liveness beats across them as across hosts). Read only by builds with the
/// `fault-injection` cargo feature (the test harness).
pub const TEST_HOST_VARIABLE: &str = "HYPER_MULTICORE_TEST_HOST";

/// This machine's node name, as a member states it in its hello.
pub(crate) fn this_host() -> String {
    #[cfg(feature = "fault-injection")]
    if let Ok(simulated) = std::env::var(TEST_HOST_VARIABLE) {
        return simulated;
    }
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

impl HostMap {
    /// A map from every rank's node name, by rank.
    pub(crate) fn new(names: Vec<String>) -> HostMap {
        HostMap { names }
    }

    /// The serialized form carried by a welcome frame.
    pub(crate) fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a host map always serializes")
    }

    /// Parses a welcome's payload; `None` if it is not a map of `size` ranks.
    pub(crate) fn decode(bytes: &[u8], size: usize) -> Option<HostMap> {
        postcard::from_bytes::<HostMap>(bytes)
            .ok()
            .filter(|map| map.names.len() == size)
    }

    /// The number of ranks in the map.
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// The node name of `rank` (`"?"` for a rank the map does not hold).
    pub(crate) fn host_of(&self, rank: usize) -> &str {
        self.names.get(rank).map_or("?", String::as_str)
    }

    /// The ranks on `host`, ascending.
    pub(crate) fn ranks_on(&self, host: &str) -> Vec<usize> {
        (0..self.names.len())
            .filter(|&rank| self.names[rank] == host)
            .collect()
    }

    /// The leader of `rank`'s host: its lowest rank.
    pub(crate) fn leader_of(&self, rank: usize) -> usize {
        let host = self.host_of(rank);
        (0..self.names.len())
            .find(|&other| self.names[other] == host)
            .unwrap_or(rank)
    }

    /// `host` and its ranks: `"host b (ranks [2, 3])"`.
    pub(crate) fn describe(&self, host: &str) -> String {
        format!("host {host} (ranks {:?})", self.ranks_on(host))
    }

    /// Every host except `host`, each with its ranks, in the order of their lowest rank:
    /// `"b (ranks [2, 3]), c (ranks [4])"`.
    pub(crate) fn hosts_except(&self, host: &str) -> String {
        let mut seen: Vec<&str> = Vec::new();
        for name in &self.names {
            if name != host && !seen.contains(&name.as_str()) {
                seen.push(name);
            }
        }
        seen.iter()
            .map(|name| format!("{name} (ranks {:?})", self.ranks_on(name)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> HostMap {
        HostMap::new(["a", "a", "b", "b", "c"].map(String::from).to_vec())
    }

    #[test]
    fn a_map_names_each_rank_s_host_and_each_host_s_ranks() {
        let map = map();
        assert_eq!(map.host_of(3), "b");
        assert_eq!(map.host_of(9), "?");
        assert_eq!(map.ranks_on("b"), [2, 3]);
        assert_eq!(
            [0, 1, 2, 3, 4].map(|rank| map.leader_of(rank)),
            [0, 0, 2, 2, 4]
        );
        assert_eq!(map.describe("b"), "host b (ranks [2, 3])");
        assert_eq!(map.hosts_except("b"), "a (ranks [0, 1]), c (ranks [4])");
    }

    #[test]
    fn a_map_travels_and_is_checked_against_the_group_size() {
        let map = map();
        assert_eq!(HostMap::decode(&map.encode(), 5), Some(map.clone()));
        assert_eq!(HostMap::decode(&map.encode(), 4), None);
        assert_eq!(HostMap::decode(b"\xff", 5), None);
    }
}
