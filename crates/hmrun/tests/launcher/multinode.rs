//! hmrun as a per-host agent: a world spanning two "hosts" — two network namespaces, each with
//! its own host name (UTS namespace), joined by a veth pair with addresses from 198.18.0.0/15 —
//! with one `hmrun --nnodes 2` per host. Needs root (CI runs as root); where the namespaces
//! cannot be made, the test prints why and returns, visibly marked SKIPPED.

use std::io::Write;
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
        let wrapper = hm_testkit::namespace_hosts::wrapper(&self.namespaces[node], node);
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
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
            // Straight to the process's stderr: the test harness captures (and, for a passing
            // test, drops) what the print macros write, and a skip must show in every run.
            let _ = writeln!(
                std::io::stderr().lock(),
                "SKIPPED {test}: cannot make two namespace hosts here: {why}"
            );
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

/// The runtime across the two namespace hosts (`HYPER_MULTICORE_SHMEM_TRANSPORT=auto`), taken
/// from the lifecycle: each host's 2 PEs share a segment, the hosts reach each other through
/// UCX over TCP on the veth pair (`UCX_TLS=tcp,self`, `UCX_NET_DEVICES` = the host's veth end).
/// Every PE checks its routes and runs every data-plane operation across both routes
/// ([`every_operation`]); then a lifecycle restart to a larger heap (the heap registered anew,
/// worker addresses and keys exchanged again) replaces the one allocation kept across it, the
/// data plane runs again over the new heap, and the runtime is released.
#[test]
fn every_operation_and_a_restart_span_two_namespace_hosts() {
    if is_pe() {
        return operations_and_restart_across_hosts();
    }
    let test = "multinode::every_operation_and_a_restart_span_two_namespace_hosts";
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
    for line in node0
        .stdout_lines()
        .iter()
        .filter(|l| l.contains("REPORT "))
    {
        println!("{line}");
    }
    for (node, finished) in [(0, &node0), (1, &node1)] {
        assert_eq!(finished.code(), 0, "node {node}: {finished:?}");
        for local in 0..2 {
            let rank = node * 2 + local;
            for stage in ["before the restart", "after the restart"] {
                let line = format!("[{rank}] DATA PLANE OK on rank {rank} {stage}");
                assert!(
                    finished.stdout_lines().contains(&line),
                    "node {node} misses {line:?}: {finished:?}"
                );
            }
            let line = format!("[{rank}] RESTARTED AND RELEASED on rank {rank}");
            assert!(
                finished.stdout_lines().contains(&line),
                "node {node} misses {line:?}: {finished:?}"
            );
        }
    }
}

/// Heap per PE before and after the restart.
const HEAP_BEFORE: u64 = 8 << 20;
const HEAP_AFTER: u64 = 16 << 20;

fn operations_and_restart_across_hosts() {
    use hyper_multicore::lifecycle::{self, Replacement};
    use hyper_multicore::shmem::{AllocationSpec, Symmetric};
    lifecycle::acquire(None, Some(HEAP_BEFORE)).unwrap();
    let (rank, size, kept) = lifecycle::guarded("before the restart", |shmem| {
        every_operation(shmem);
        report_barrier_time(shmem);
        // One allocation lives across the restart, holding every rank's value.
        let kept = shmem.allocate::<u64>(shmem.size(), None)?;
        shmem.all_gather(&kept, &[7 + shmem.rank() as u64])?;
        Ok((shmem.rank(), shmem.size(), kept))
    })
    .unwrap();
    println!("DATA PLANE OK on rank {rank} before the restart");
    let replacement = Replacement {
        current: kept.region(),
        target: AllocationSpec::of::<u64>(2 * size, None),
        preserve: false,
    };
    let result = lifecycle::restart(HEAP_AFTER, &[replacement], None).unwrap();
    let replaced = result.allocation::<u64>(0).unwrap();
    lifecycle::guarded("after the restart", |shmem| {
        assert_eq!(shmem.heap_size(), HEAP_AFTER);
        assert_eq!(replaced.len(), 2 * size);
        let error = shmem.resolve(kept.id()).unwrap_err();
        assert!(
            error.to_string().contains("another runtime lifetime"),
            "{error}"
        );
        // The new heap is registered and its keys reached every PE: each writes its slot of
        // the replacement on every PE, across both routes.
        for pe in 0..size {
            let slot = replaced.view(size + rank..=size + rank)?;
            shmem.put(&slot, &[1000 + rank as u64], pe)?;
        }
        shmem.barrier()?;
        let mut seen = vec![0u64; size];
        for pe in 0..size {
            shmem.get(&mut seen, &replaced.view(size..)?, pe)?;
            assert_eq!(seen, (0..size as u64).map(|r| 1000 + r).collect::<Vec<_>>());
        }
        every_operation(shmem);
        shmem.barrier()?;
        Ok(())
    })
    .unwrap();
    println!("DATA PLANE OK on rank {rank} after the restart");
    lifecycle::guarded("free", |shmem| shmem.free(replaced)).unwrap();
    lifecycle::release().unwrap();
    println!("RESTARTED AND RELEASED on rank {rank}");
}

/// Barriers timed for the record (`REPORT` lines; nothing is asserted about time): how long one
/// barrier of the 4 PEs on 2 hosts takes, mean of a batch, on rank 0.
fn report_barrier_time(shmem: &hyper_multicore::shmem::Shmem) {
    const BARRIERS: u32 = 2000;
    shmem.barrier().unwrap();
    let started = std::time::Instant::now();
    for _ in 0..BARRIERS {
        shmem.barrier().unwrap();
    }
    if shmem.rank() == 0 {
        let per_call = started.elapsed() / BARRIERS;
        println!(
            "REPORT BARRIER_US_PER_CALL {:.1}",
            per_call.as_secs_f64() * 1e6
        );
    }
    let started = std::time::Instant::now();
    for _ in 0..BARRIERS {
        shmem.try_quiet().unwrap();
    }
    let quiet = started.elapsed() / BARRIERS;
    let started = std::time::Instant::now();
    for _ in 0..BARRIERS {
        shmem.control().barrier().unwrap();
    }
    let plane = started.elapsed() / BARRIERS;
    if shmem.rank() == 0 {
        println!(
            "REPORT QUIET_US {:.1} PLANE_US {:.1}",
            quiet.as_secs_f64() * 1e6,
            plane.as_secs_f64() * 1e6
        );
    }
}

/// Every data-plane operation, each across both routes (2 PEs per host: every PE has one peer
/// on `shm` and two on `ucx`); frees what it allocates.
fn every_operation(shmem: &hyper_multicore::shmem::Shmem) {
    use hyper_multicore::shmem::{Comparison, ReduceOp, SignalOp};
    let (rank, size) = (shmem.rank(), shmem.size());
    let routes = shmem.debug_state().transport.unwrap().routes;
    let expected: Vec<&str> = (0..size)
        .map(|pe| if pe / 2 == rank / 2 { "shm" } else { "ucx" })
        .collect();
    assert_eq!(routes, expected);
    let next = (rank + 1) % size;
    let previous = (rank + size - 1) % size;

    // put/get, blocking and non-blocking: every PE writes its slot of every PE's array.
    let slots = shmem.allocate::<u64>(size, None).unwrap();
    let nbi = shmem.allocate::<u64>(size, None).unwrap();
    shmem.barrier().unwrap();
    for pe in 0..size {
        let mine = slots.view(rank..=rank).unwrap();
        shmem.put(&mine, &[100 + rank as u64], pe).unwrap();
        let mine = nbi.view(rank..=rank).unwrap();
        shmem.put_nbi(&mine, &[200 + rank as u64], pe).unwrap();
    }
    shmem.quiet();
    shmem.barrier().unwrap();
    for pe in 0..size {
        let mut seen = vec![0u64; size];
        shmem.get(&mut seen, &slots, pe).unwrap();
        assert_eq!(seen, (0..size as u64).map(|r| 100 + r).collect::<Vec<_>>());
        let mut seen = vec![0u64; size];
        shmem.get_nbi(&mut seen, &nbi, pe).unwrap();
        shmem.quiet();
        assert_eq!(seen, (0..size as u64).map(|r| 200 + r).collect::<Vec<_>>());
    }

    // Atomics, 64 and 32 bit: add and fetch-add on rank 0's counters from every PE; set, then
    // compare-swap and swap, on the next PE's word around the ring (across hosts at 1 → 2 and
    // 3 → 0); fetch everywhere.
    let counter64 = shmem.allocate::<u64>(1, None).unwrap();
    let counter32 = shmem.allocate::<u32>(1, None).unwrap();
    let ring64 = shmem.allocate::<u64>(1, None).unwrap();
    let ring32 = shmem.allocate::<u32>(1, None).unwrap();
    shmem.barrier().unwrap();
    shmem.atomic_add(&counter64, 1u64, 0).unwrap();
    shmem.atomic_fetch_add(&counter64, 1u64, 0).unwrap();
    shmem.atomic_add(&counter32, 1u32, 0).unwrap();
    shmem.atomic_fetch_add(&counter32, 1u32, 0).unwrap();
    shmem.atomic_set(&ring64, rank as u64, next).unwrap();
    shmem.atomic_set(&ring32, rank as u32, next).unwrap();
    shmem.barrier().unwrap();
    assert_eq!(shmem.atomic_fetch(&counter64, 0).unwrap(), 2 * size as u64);
    assert_eq!(shmem.atomic_fetch(&counter32, 0).unwrap(), 2 * size as u32);
    assert_eq!(shmem.atomic_fetch(&ring64, rank).unwrap(), previous as u64);
    assert_eq!(shmem.atomic_fetch(&ring32, rank).unwrap(), previous as u32);
    shmem.barrier().unwrap();
    let swapped = shmem
        .atomic_compare_swap(&ring64, rank as u64, 50 + rank as u64, next)
        .unwrap();
    assert_eq!(swapped, rank as u64);
    let failed = shmem.atomic_compare_swap(&ring32, 999u32, 1, next).unwrap();
    assert_eq!(
        failed, rank as u32,
        "a failed compare-swap returns the value and stores nothing"
    );
    assert_eq!(
        shmem.atomic_swap(&ring32, 60 + rank as u32, next).unwrap(),
        rank as u32
    );
    shmem.barrier().unwrap();
    assert_eq!(
        shmem.atomic_fetch(&ring64, rank).unwrap(),
        50 + previous as u64
    );
    assert_eq!(
        shmem.atomic_fetch(&ring32, rank).unwrap(),
        60 + previous as u32
    );

    // Signals: put_signal (Set) around the ring; Add on rank 0's word from every PE, 64 and 32
    // bit; and a plain remote atomic waking a PE that waits on the word (host 1's rank 2 adds
    // to host 0's rank 1).
    let data = shmem.allocate::<u64>(4, None).unwrap();
    let flag = shmem.allocate::<u64>(1, None).unwrap();
    let sum64 = shmem.allocate::<u64>(1, None).unwrap();
    let sum32 = shmem.allocate::<u32>(1, None).unwrap();
    let woken = shmem.allocate::<u64>(1, None).unwrap();
    shmem.barrier().unwrap();
    shmem
        .put_signal(&data, &[rank as u64; 4], &flag, 1, SignalOp::Set, next)
        .unwrap();
    shmem.wait_signal(&flag, 1, Comparison::Eq, None).unwrap();
    let mut got = [0u64; 4];
    shmem.get(&mut got, &data, rank).unwrap();
    assert_eq!(got, [previous as u64; 4]);
    shmem.signal(&sum64, 1u64, SignalOp::Add, 0).unwrap();
    shmem.signal(&sum32, 1u32, SignalOp::Add, 0).unwrap();
    if rank == 0 {
        shmem
            .wait_signal(&sum64, size as u64, Comparison::Eq, None)
            .unwrap();
        shmem
            .wait_signal(&sum32, size as u32, Comparison::Ge, None)
            .unwrap();
    }
    match rank {
        1 => {
            let seen = shmem
                .wait_signal(&woken, 1u64, Comparison::Eq, None)
                .unwrap();
            assert_eq!(seen, 1);
        }
        2 => shmem.atomic_add(&woken, 1u64, 1).unwrap(),
        _ => {}
    }
    shmem.barrier().unwrap();

    // Collectives, each with a root or blocks on the other host.
    let gathered = shmem.allocate::<u64>(size, None).unwrap();
    shmem.all_gather(&gathered, &[rank as u64 * 3]).unwrap();
    let mut all = vec![0u64; size];
    shmem.get(&mut all, &gathered, rank).unwrap();
    assert_eq!(all, (0..size as u64).map(|r| r * 3).collect::<Vec<_>>());
    let broadcast = shmem.allocate::<u32>(3, None).unwrap();
    let root = size - 1;
    let source = if rank == root {
        vec![9u32, 8, 7]
    } else {
        Vec::new()
    };
    shmem.broadcast(&broadcast, &source, root).unwrap();
    let mut got = [0u32; 3];
    shmem.get(&mut got, &broadcast, rank).unwrap();
    assert_eq!(got, [9, 8, 7]);
    let exchanged = shmem.allocate::<u64>(2 * size, None).unwrap();
    let source: Vec<u64> = (0..2 * size as u64)
        .map(|i| 1000 * rank as u64 + i)
        .collect();
    shmem.all_to_all(&exchanged, &source).unwrap();
    let mut got = vec![0u64; 2 * size];
    shmem.get(&mut got, &exchanged, rank).unwrap();
    let expected: Vec<u64> = (0..size as u64)
        .flat_map(|from| (0..2).map(move |j| 1000 * from + 2 * rank as u64 + j))
        .collect();
    assert_eq!(got, expected, "block j came from PE j's block {rank}");
    let reduced = shmem.allocate::<u64>(2, None).unwrap();
    shmem
        .put(&reduced, &[rank as u64 + 1, 10 * rank as u64], rank)
        .unwrap();
    shmem.barrier().unwrap();
    shmem.all_reduce(&reduced, &reduced, ReduceOp::Sum).unwrap();
    let mut total = [0u64; 2];
    shmem.get(&mut total, &reduced, rank).unwrap();
    let n = size as u64;
    assert_eq!(total, [n * (n + 1) / 2, 10 * n * (n - 1) / 2]);
    let maximum = shmem.allocate::<i32>(1, None).unwrap();
    shmem.put(&maximum, &[-(rank as i32)], rank).unwrap();
    shmem.barrier().unwrap();
    shmem.all_reduce(&maximum, &maximum, ReduceOp::Min).unwrap();
    let mut least = [0i32];
    shmem.get(&mut least, &maximum, rank).unwrap();
    assert_eq!(least, [-(size as i32 - 1)]);
    shmem.barrier().unwrap();
    shmem.free(maximum).unwrap();
    shmem.free(reduced).unwrap();
    shmem.free(exchanged).unwrap();
    shmem.free(broadcast).unwrap();
    shmem.free(gathered).unwrap();
    shmem.free(woken).unwrap();
    shmem.free(sum32).unwrap();
    shmem.free(sum64).unwrap();
    shmem.free(flag).unwrap();
    shmem.free(data).unwrap();
    shmem.free(ring32).unwrap();
    shmem.free(ring64).unwrap();
    shmem.free(counter32).unwrap();
    shmem.free(counter64).unwrap();
    shmem.free(nbi).unwrap();
    shmem.free(slots).unwrap();
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
/// A global exit spans hosts: world rank `HM_TEST_EXITER` calls `lifecycle::global_exit` with
/// `HM_TEST_STATUS` while every other rank waits in the runtime's barrier (shared memory within
/// a host, UCX between the hosts); no other rank may get past it.
fn global_exit_across_hosts() {
    use hyper_multicore::lifecycle;
    let exiter: usize = std::env::var("HM_TEST_EXITER").unwrap().parse().unwrap();
    let status: i32 = std::env::var("HM_TEST_STATUS").unwrap().parse().unwrap();
    lifecycle::acquire(None, Some(HEAP_BEFORE)).unwrap();
    let rank = lifecycle::guarded("barrier", |shmem| {
        shmem.barrier()?;
        Ok(shmem.rank())
    })
    .unwrap();
    println!("READY {rank}");
    // Every rank has said it is ready once this barrier lets the exiter through.
    lifecycle::guarded("barrier", |shmem| shmem.barrier()).unwrap();
    if rank == exiter {
        lifecycle::global_exit(status);
    }
    let outcome = lifecycle::guarded("barrier", |shmem| shmem.barrier());
    println!("PAST THE BARRIER: {outcome:?}");
    std::process::exit(99);
}

/// `shmem_global_exit` across two hosts: a member on host 1 (world rank 3) ends the job with 7,
/// then root rank 0 (host 0) with 0; each time every PE on both hosts ends with the status (none
/// reports a lost peer), and both agents exit with it.
#[test]
fn a_global_exit_ends_every_pe_on_both_hosts_with_its_status() {
    if is_pe() {
        return global_exit_across_hosts();
    }
    let test = "multinode::a_global_exit_ends_every_pe_on_both_hosts_with_its_status";
    let Some(hosts) = two_hosts_or_skip(test, "x") else {
        return;
    };
    for (exiter, status) in [(3, 7), (0, 0)] {
        let [node0, node1] = start_job_with(&hosts, test, |node| {
            vec![
                ("UCX_TLS", "tcp,self".to_string()),
                ("UCX_NET_DEVICES", hosts.devices[node].clone()),
                ("HM_TEST_EXITER", exiter.to_string()),
                ("HM_TEST_STATUS", status.to_string()),
            ]
        });
        let (node0, node1) = (node0.finish(), node1.finish());
        for (node, finished) in [(0, &node0), (1, &node1)] {
            let context = format!("rank {exiter} exiting {status}, node {node}: {finished:?}");
            assert_eq!(finished.code(), status, "{context}");
            let ready = finished
                .stdout_lines()
                .iter()
                .filter(|l| l.contains("READY "))
                .count();
            assert_eq!(ready, 2, "{context}");
            let lines = [finished.stdout_lines(), finished.stderr_lines()].concat();
            assert!(
                !lines.iter().any(|l| l.contains("PAST THE")
                    || l.contains("lost")
                    || l.contains("panicked")),
                "{context}"
            );
            wait_until_nothing_left(&finished.marker);
        }
    }
}

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
