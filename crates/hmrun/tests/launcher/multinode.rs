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
}

impl TwoHosts {
    /// Host 0 is 198.18.0.1 (named `hm-host-0`), host 1 is 198.18.0.2 (`hm-host-1`).
    fn create(tag: &str) -> Result<TwoHosts, String> {
        let id = format!("{}{tag}", std::process::id() % 100_000);
        let hosts = TwoHosts {
            namespaces: [format!("hm{id}h0"), format!("hm{id}h1")],
        };
        let [a, b] = &hosts.namespaces;
        let (va, vb) = (format!("hv{id}a"), format!("hv{id}b"));
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", a],
            vec!["netns", "add", b],
            vec!["link", "add", &va, "type", "veth", "peer", "name", &vb],
            vec!["link", "set", &va, "netns", a],
            vec!["link", "set", &vb, "netns", b],
            vec!["-n", a, "addr", "add", "198.18.0.1/24", "dev", &va],
            vec!["-n", b, "addr", "add", "198.18.0.2/24", "dev", &vb],
            vec!["-n", a, "link", "set", &va, "up"],
            vec!["-n", b, "link", "set", &vb, "up"],
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
        let envs = [
            (PE_VARIABLE, "1"),
            ("HYPER_MULTICORE_SHMEM_SECRET", SECRET),
            ("HYPER_MULTICORE_SHMEM_TIMEOUT_SEC", "20"),
        ];
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
    let [node0, node1] = start_job(&hosts, test);
    let (node0, node1) = (node0.finish(), node1.finish());
    assert_ne!(node0.code(), 0, "{node0:?}");
    assert_ne!(node1.code(), 0, "{node1:?}");
    // Every survivor that saw the loss before its hmrun stopped it names a rank of host 1: rank
    // 3, or rank 2 if host 1's hmrun stopped it before root rank 0 noticed rank 3. Host 0's
    // ranks see it (rank 0 routes the world's messages): the job failed there by the loss.
    let lost: Vec<String> = [&node0, &node1]
        .iter()
        .flat_map(|f| f.stdout_lines())
        .filter(|l| l.contains("LOST"))
        .collect();
    assert!(!lost.is_empty(), "{node0:?}\n{node1:?}");
    let on_host_1 =
        |l: &String| l.ends_with("LOST peer=Some(3)") || l.ends_with("LOST peer=Some(2)");
    assert!(lost.iter().all(on_host_1), "{lost:?}");
    assert!(
        node0
            .stdout_lines()
            .iter()
            .any(|l| l.starts_with("[0] LOST")),
        "{node0:?}"
    );
    wait_until_nothing_left(&node0.marker);
    wait_until_nothing_left(&node1.marker);
}
