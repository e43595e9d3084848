//! hmrun as a per-host agent: a world spanning two "hosts" — two network namespaces, each with
//! its own host name (UTS namespace), joined by a veth pair with addresses from 198.18.0.0/15 —
//! with one `hmrun --nnodes 2` per host. Needs root (CI runs as root); where the namespaces
//! cannot be made, the test prints why and returns, visibly marked SKIPPED.

use std::process::Command;

use hm_testkit::{is_pe, PE_VARIABLE};
use hyper_multicore::world::World;
use hyper_multicore::ErrorKind;

use crate::support::{start_wrapped, wait_until_nothing_left, Job};

/// The same secret for both agents, so the world's rendezvous is authenticated.
const SECRET: &str = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";

/// Two namespace hosts, removed on drop.
struct TwoHosts {
    namespaces: [String; 2],
    /// Each host's end of the veth pair (its only network device besides `lo`).
    devices: [String; 2],
}

impl TwoHosts {
    /// Host 0 is 198.18.0.1 (named `hm-host-0`), host 1 is 198.18.0.2 (`hm-host-1`).
    fn create(tag: &str) -> Result<TwoHosts, String> {
        let id = format!("{}{tag}", std::process::id() % 100_000);
        let hosts = TwoHosts {
            namespaces: [format!("hm{id}h0"), format!("hm{id}h1")],
            devices: [format!("hv{id}a"), format!("hv{id}b")],
        };
        let [a, b] = &hosts.namespaces;
        let [va, vb] = &hosts.devices;
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", a],
            vec!["netns", "add", b],
            vec!["link", "add", va, "type", "veth", "peer", "name", vb],
            vec!["link", "set", va, "netns", a],
            vec!["link", "set", vb, "netns", b],
            vec!["-n", a, "addr", "add", "198.18.0.1/24", "dev", va],
            vec!["-n", b, "addr", "add", "198.18.0.2/24", "dev", vb],
            vec!["-n", a, "link", "set", va, "up"],
            vec!["-n", b, "link", "set", vb, "up"],
            vec!["-n", a, "link", "set", "lo", "up"],
            vec!["-n", b, "link", "set", "lo", "up"],
        ];
        for step in steps {
            let output = Command::new("ip")
                .args(&step)
                .output()
                .map_err(|e| format!("cannot run ip: {e}"))?;
            if !output.status.success() {
                return Err(format!(
                    "`ip {}` failed: {}",
                    step.join(" "),
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
        }
        Ok(hosts)
    }

    /// Starts `hmrun ARGS` on host `node`, under its own host name.
    fn hmrun(&self, node: usize, name: &str, args: &[&str], envs: &[(&str, &str)]) -> Job {
        let hostname = format!("hostname hm-host-{node} && exec \"$@\"");
        let wrapper = [
            "ip",
            "netns",
            "exec",
            &self.namespaces[node],
            "unshare",
            "--uts",
            "sh",
            "-c",
            &hostname,
            "sh",
        ];
        start_wrapped(name, &wrapper, args, envs)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for namespace in &self.namespaces {
            let _ = Command::new("ip")
                .args(["netns", "del", namespace])
                .output();
        }
    }
}

/// Starts one agent per host, 2 PEs each, every PE running `test` of this binary.
fn start_job(hosts: &TwoHosts, test: &str) -> [Job; 2] {
    start_job_with(hosts, test, |_| Vec::new())
}

/// [`start_job`] with extra environment variables per host.
fn start_job_with(
    hosts: &TwoHosts,
    test: &str,
    extra: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> [Job; 2] {
    let test_binary = std::env::current_exe().unwrap();
    let test_binary = test_binary.to_str().unwrap().to_string();
    [0usize, 1].map(|node| {
        let node_rank = node.to_string();
        let args = [
            "-n",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            &node_rank,
            "--master-addr",
            "198.18.0.1",
            "--master-port",
            "29500",
            "--",
            &test_binary,
            test,
            "--exact",
            "--nocapture",
            "-q",
        ];
        let extra = extra(node);
        let mut envs = vec![
            (PE_VARIABLE, "1"),
            ("HYPER_MULTICORE_SHMEM_SECRET", SECRET),
            ("HYPER_MULTICORE_SHMEM_TIMEOUT_SEC", "20"),
        ];
        envs.extend(extra.iter().map(|(name, value)| (*name, value.as_str())));
        hosts.hmrun(node, &format!("multinode-{node}"), &args, &envs)
    })
}

fn two_hosts_or_skip(test: &str, tag: &str) -> Option<TwoHosts> {
    match TwoHosts::create(tag) {
        Ok(hosts) => Some(hosts),
        Err(why) => {
            println!("SKIPPED {test}: cannot make two namespace hosts here: {why}");
            None
        }
    }
}

/// Joins the world and gathers every rank's host name.
fn hosts_of_the_world() -> (World, Vec<String>) {
    let world = World::from_env().unwrap();
    let name = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let names = world.control().allgather(name.as_bytes()).unwrap();
    let names = names
        .into_iter()
        .map(|n| String::from_utf8(n).unwrap())
        .collect();
    (world, names)
}

#[test]
fn a_world_spans_two_namespace_hosts() {
    if is_pe() {
        let (world, names) = hosts_of_the_world();
        world.control().barrier().unwrap();
        println!(
            "rank {} of {} sees {}",
            world.rank(),
            world.size(),
            names.join(",")
        );
        return;
    }
    let test = "multinode::a_world_spans_two_namespace_hosts";
    let Some(hosts) = two_hosts_or_skip(test, "w") else {
        return;
    };
    let [node0, node1] = start_job(&hosts, test);
    let (node0, node1) = (node0.finish(), node1.finish());
    let expected = "hm-host-0,hm-host-0,hm-host-1,hm-host-1";
    for (node, finished) in [(0, &node0), (1, &node1)] {
        assert_eq!(finished.code(), 0, "node {node}: {finished:?}");
        let lines = finished.stdout_lines();
        for local in 0..2 {
            let rank = node * 2 + local;
            let line = format!("[{rank}] rank {rank} of 4 sees {expected}");
            assert!(
                lines.contains(&line),
                "node {node} misses {line:?}: {finished:?}"
            );
        }
    }
}

#[test]
fn a_pe_killed_on_one_host_fails_the_job_on_both() {
    if is_pe() {
        let (world, _) = hosts_of_the_world();
        if world.rank() == 3 {
            let me = rustix::process::getpid();
            rustix::process::kill_process(me, rustix::process::Signal::KILL).unwrap();
        }
        let error = world.control().barrier().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::PeerLost, "{error}");
        println!("LOST peer={:?}", error.peer());
        std::process::exit(1);
    }
    let test = "multinode::a_pe_killed_on_one_host_fails_the_job_on_both";
    let Some(hosts) = two_hosts_or_skip(test, "k") else {
        return;
    };
    assert_host_1_loss_failed_both(start_job(&hosts, test));
}

/// The runtime across the two namespace hosts (`HYPER_MULTICORE_SHMEM_TRANSPORT=auto`): each
/// host's 2 PEs share a segment, the hosts reach each other through UCX over TCP on the veth
/// pair (`UCX_TLS=tcp,self`, `UCX_NET_DEVICES` = the host's veth end). Every PE checks its
/// routes, then puts, gets, signals, atomics and collectives across both routes.
#[test]
fn the_data_plane_spans_two_namespace_hosts() {
    if is_pe() {
        return data_plane_across_hosts();
    }
    let test = "multinode::the_data_plane_spans_two_namespace_hosts";
    let Some(hosts) = two_hosts_or_skip(test, "d") else {
        return;
    };
    let [node0, node1] = start_job_with(&hosts, test, |node| {
        vec![
            ("UCX_TLS", "tcp,self".to_string()),
            ("UCX_NET_DEVICES", hosts.devices[node].clone()),
        ]
    });
    let (node0, node1) = (node0.finish(), node1.finish());
    for (node, finished) in [(0, &node0), (1, &node1)] {
        assert_eq!(finished.code(), 0, "node {node}: {finished:?}");
        for local in 0..2 {
            let rank = node * 2 + local;
            let line = format!("[{rank}] DATA PLANE OK on rank {rank}");
            assert!(
                finished.stdout_lines().contains(&line),
                "node {node} misses {line:?}: {finished:?}"
            );
        }
    }
}

fn data_plane_across_hosts() {
    use hyper_multicore::shmem::{Comparison, ReduceOp, SignalOp};
    let world = World::from_env().unwrap();
    let shmem = hm_testkit::initialize_over(&world, Some(8 << 20)).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    let routes = shmem.debug_state().transport.unwrap().routes;
    let expected: Vec<&str> = (0..size)
        .map(|pe| if pe / 2 == rank / 2 { "shm" } else { "ucx" })
        .collect();
    assert_eq!(routes, expected);
    // put/get: every PE writes its slot of every PE's array.
    let slots = shmem.allocate::<u64>(size, None).unwrap();
    shmem.barrier().unwrap();
    for pe in 0..size {
        let mine = slots.view(rank..=rank).unwrap();
        shmem.put(&mine, &[100 + rank as u64], pe).unwrap();
    }
    shmem.barrier().unwrap();
    for pe in 0..size {
        let mut seen = vec![0u64; size];
        shmem.get(&mut seen, &slots, pe).unwrap();
        let all: Vec<u64> = (0..size as u64).map(|r| 100 + r).collect();
        assert_eq!(seen, all, "PE {pe}'s copy");
    }
    // put_signal around the ring, across hosts at 1 → 2 and 3 → 0.
    let data = shmem.allocate::<u64>(4, None).unwrap();
    let flag = shmem.allocate::<u64>(1, None).unwrap();
    shmem.barrier().unwrap();
    let next = (rank + 1) % size;
    let payload = [rank as u64; 4];
    shmem
        .put_signal(&data, &payload, &flag, 1, SignalOp::Set, next)
        .unwrap();
    shmem.wait_signal(&flag, 1, Comparison::Eq, None).unwrap();
    let mut got = [0u64; 4];
    shmem.get(&mut got, &data, rank).unwrap();
    assert_eq!(got, [((rank + size - 1) % size) as u64; 4]);
    // Atomics on rank 0's counter from both hosts.
    let counter = shmem.allocate::<u64>(1, None).unwrap();
    shmem.barrier().unwrap();
    shmem.atomic_fetch_add(&counter, 1, 0).unwrap();
    shmem.barrier().unwrap();
    assert_eq!(shmem.atomic_fetch(&counter, 0).unwrap(), size as u64);
    // Collectives.
    let gathered = shmem.allocate::<u64>(size, None).unwrap();
    shmem.all_gather(&gathered, &[rank as u64 * 3]).unwrap();
    let mut all = vec![0u64; size];
    shmem.get(&mut all, &gathered, rank).unwrap();
    assert_eq!(all, (0..size as u64).map(|r| r * 3).collect::<Vec<_>>());
    let sum = shmem.allocate::<u64>(1, None).unwrap();
    shmem.put(&sum, &[rank as u64 + 1], rank).unwrap();
    shmem.barrier().unwrap();
    shmem.all_reduce(&sum, &sum, ReduceOp::Sum).unwrap();
    let mut total = [0u64];
    shmem.get(&mut total, &sum, rank).unwrap();
    assert_eq!(total[0], (1..=size as u64).sum::<u64>());
    shmem.barrier().unwrap();
    for allocation in [sum, gathered, counter, flag, data, slots] {
        shmem.free(allocation).unwrap();
    }
    shmem.shutdown().unwrap();
    println!("DATA PLANE OK on rank {rank}");
}

/// kill -9 of a PE on host 1 while the runtime spans both hosts: the survivors' barrier (a
/// control-plane barrier after a UCX quiet) and signal waits end with peer lost naming a rank of
/// host 1, on both hosts.
#[test]
fn a_pe_killed_on_one_host_fails_the_runtime_on_both() {
    if is_pe() {
        let world = World::from_env().unwrap();
        let shmem = hm_testkit::initialize_over(&world, Some(8 << 20)).unwrap();
        let flag = shmem.allocate::<u64>(1, None).unwrap();
        shmem.barrier().unwrap();
        if shmem.rank() == 3 {
            let me = rustix::process::getpid();
            rustix::process::kill_process(me, rustix::process::Signal::KILL).unwrap();
        }
        let error = if shmem.rank() % 2 == 0 {
            shmem.barrier().unwrap_err()
        } else {
            let wait = Some(std::time::Duration::from_secs(60));
            let comparison = hyper_multicore::shmem::Comparison::Eq;
            shmem.wait_signal(&flag, 1, comparison, wait).unwrap_err()
        };
        assert_eq!(error.kind(), ErrorKind::PeerLost, "{error}");
        println!("LOST peer={:?}", error.peer());
        std::process::exit(1);
    }
    let test = "multinode::a_pe_killed_on_one_host_fails_the_runtime_on_both";
    let Some(hosts) = two_hosts_or_skip(test, "r") else {
        return;
    };
    let agents = start_job_with(&hosts, test, |node| {
        vec![
            ("UCX_TLS", "tcp,self".to_string()),
            ("UCX_NET_DEVICES", hosts.devices[node].clone()),
        ]
    });
    assert_host_1_loss_failed_both(agents);
}

/// Both agents of a job in which a PE of host 1 was killed failed, every survivor that reported
/// the loss before its agent stopped it names a rank of host 1 (rank 3, or rank 2 if host 1's
/// agent stopped it before root rank 0 noticed rank 3), host 0's ranks reported it (which of
/// them first is a race with host 0's agent stopping the other), and nothing is left.
fn assert_host_1_loss_failed_both(agents: [Job; 2]) {
    let [node0, node1] = agents.map(Job::finish);
    assert_ne!(node0.code(), 0, "{node0:?}");
    assert_ne!(node1.code(), 0, "{node1:?}");
    let lost: Vec<String> = [&node0, &node1]
        .iter()
        .flat_map(|f| f.stdout_lines())
        .filter(|l| l.contains("LOST"))
        .collect();
    let on_host_1 =
        |l: &String| l.ends_with("LOST peer=Some(3)") || l.ends_with("LOST peer=Some(2)");
    assert!(lost.iter().all(on_host_1), "{lost:?}");
    assert!(
        node0.stdout_lines().iter().any(|l| l.contains("LOST")),
        "{node0:?}"
    );
    wait_until_nothing_left(&node0.marker);
    wait_until_nothing_left(&node1.marker);
}
