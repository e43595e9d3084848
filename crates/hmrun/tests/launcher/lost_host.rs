//! A lost host, on four network-namespace hosts joined by one bridge (issue 42): each host is a
//! network namespace with its own host name (UTS namespace) and a veth pair to a bridge in a
//! fifth, "switch", namespace; `hmrun -n 2 --nnodes 4` runs on each. Every PE puts 8 KiB to its
//! right neighbour and passes a barrier, over and over (shared memory within a host, UCX between
//! hosts), with a peer timeout of [`PEER_TIMEOUT`] and the default 120 s wait deadline left in
//! place: a host's link cut at the switch, its processes SIGKILLed, or its processes frozen past
//! the peer timeout must end every PE on every host with `peer lost` naming the lost host and
//! its ranks (the cut-off host's PEs name root rank 0's host and every host they lost), and every
//! hmrun must exit non-zero. Nothing may be declared lost when a PE computes for 30 s without a
//! call, when a host's link is slow and drops 5% of its packets, or when a host is frozen for
//! less than the peer timeout. Needs root (CI runs as root); where the namespaces cannot be
//! made, each test prints why and returns, visibly marked SKIPPED.
//!
//! A host lost during the world's rendezvous (before the control plane is up) must end the
//! rendezvous on every host the same way, within the peer timeout.
//!
//! Nothing asserts a speed: a loss must end the waits with `peer lost` (not the 120 s timeout,
//! and within the test's watchdog); the times from fault to detection are printed (`DETECTED`
//! lines) for the benchmark report (`bench/liveness.sh`).

use std::io::Write;
use std::time::{Duration, Instant};

use hm_testkit::namespace_hosts::NamespaceHosts;
use hm_testkit::{is_pe, PE_VARIABLE};
use hyper_multicore::world::World;
use rustix::process::{kill_process, Pid, Signal};

use crate::support::{
    processes_with_marker, start_wrapped, wait_until_nothing_left, Finished, Job,
};

/// The same secret for every agent, so the world's rendezvous is authenticated.
const SECRET: &str = "4242424242424242424242424242a42a";
/// The peer timeout of these jobs, in seconds.
const PEER_TIMEOUT: &str = "2";
/// Hosts of a job, and PEs per host.
const HOSTS: usize = 4;
const PES_PER_HOST: usize = 2;
/// The host every fault strikes (not root rank 0's).
const VICTIM: usize = 2;

/// Starts host `h`'s agent for `test` with `envs` added.
fn agent(hosts: &NamespaceHosts, h: usize, test: &str, envs: &[(&str, &str)]) -> Job {
    let test_binary = std::env::current_exe().unwrap();
    let test_binary = test_binary.to_str().unwrap();
    let (count, pes, node_rank) = (
        hosts.count().to_string(),
        PES_PER_HOST.to_string(),
        h.to_string(),
    );
    let master = NamespaceHosts::address(0);
    let args = [
        "-n",
        &pes,
        "--nnodes",
        &count,
        "--node-rank",
        &node_rank,
        "--master-addr",
        &master,
        "--master-port",
        "29500",
        "--",
        test_binary,
        test,
        "--exact",
        // The start-up benchmark is an ignored test: its PEs run it all the same.
        "--include-ignored",
        "--nocapture",
        "-q",
    ];
    let mut all = vec![
        (PE_VARIABLE, "1"),
        ("HYPER_MULTICORE_SHMEM_SECRET", SECRET),
        ("HYPER_MULTICORE_SHMEM_PEER_TIMEOUT_SEC", PEER_TIMEOUT),
        ("UCX_TLS", "tcp,self"),
        ("UCX_NET_DEVICES", hosts.device(h)),
    ];
    all.extend_from_slice(envs);
    let wrapper = hosts.wrapper(h);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    start_wrapped(&format!("lost-host-{h}"), &wrapper, &args, &all)
}

/// Starts the job on every host.
fn start(hosts: &NamespaceHosts, test: &str, envs: &[(&str, &str)]) -> Vec<Job> {
    (0..hosts.count())
        .map(|h| agent(hosts, h, test, envs))
        .collect()
}

fn four_hosts_or_skip(test: &str, tag: &str) -> Option<NamespaceHosts> {
    match NamespaceHosts::create(HOSTS, tag) {
        Ok(hosts) => Some(hosts),
        Err(why) => {
            // Straight to stderr: the harness drops what a passing test prints.
            let _ = writeln!(
                std::io::stderr().lock(),
                "SKIPPED {test}: cannot make four namespace hosts on a bridge here: {why}"
            );
            None
        }
    }
}

/// The variable telling a PE for how long to exchange (seconds); unset: until a fault ends it.
const RUN_FOR: &str = "HM_TEST_RUN_FOR";
/// The variable naming a world rank that computes for 30 s without calling the runtime.
const COMPUTING_RANK: &str = "HM_TEST_COMPUTING_RANK";

/// A PE's part: join the world and the runtime, print READY, then put 8 KiB to the right
/// neighbour, barrier and hear from root rank 0 whether to go on, until [`RUN_FOR`] has passed
/// on root rank 0 (then DONE, exit 0) or a call fails (then the runtime is dropped, `LOST` is
/// printed with the error and how long after the last good round it came, exit 1).
fn exchange() {
    let run_for = std::env::var(RUN_FOR)
        .ok()
        .map(|s| Duration::from_secs(s.parse().unwrap()));
    let computing: Option<usize> = std::env::var(COMPUTING_RANK)
        .ok()
        .map(|s| s.parse().unwrap());
    let world = World::from_env().unwrap();
    let shmem = hm_testkit::initialize_over(&world, Some(8 << 20)).unwrap();
    let (rank, size) = (shmem.rank(), shmem.size());
    let block = shmem.allocate::<u8>(8 << 10, None).unwrap();
    let data = vec![rank as u8; 8 << 10];
    shmem.barrier().unwrap();
    println!("READY");
    let started = Instant::now();
    let mut last_good = Instant::now();
    if computing == Some(rank) {
        let until = Instant::now() + Duration::from_secs(30);
        let mut spins = 0u64;
        while Instant::now() < until {
            spins = std::hint::black_box(spins.wrapping_add(1));
        }
        println!("COMPUTED");
    }
    let outcome = loop {
        let round = (|| {
            shmem.put(&block, &data, (rank + 1) % size)?;
            shmem.barrier()?;
            let go = !run_for.is_some_and(|limit| started.elapsed() >= limit);
            world.control().broadcast(&[u8::from(go)])
        })();
        match round {
            Ok(go) if go == [1] => last_good = Instant::now(),
            Ok(_) => break Ok(()),
            Err(error) => break Err(error),
        }
    };
    match outcome {
        Ok(()) => {
            shmem.free(block).unwrap();
            drop(shmem);
            println!("DONE");
        }
        Err(error) => {
            let after = last_good.elapsed();
            // The runtime tears down after a loss (what `release` does), without hanging.
            drop(block);
            drop(shmem);
            drop(world);
            println!(
                "LOST kind={:?} peer={:?} after_ms={}: {error}",
                error.kind(),
                error.peer(),
                after.as_millis()
            );
            std::process::exit(1);
        }
    }
}

/// Waits until every host's agent printed READY for both its PEs.
fn wait_until_ready(agents: &mut [Job]) {
    for agent in agents.iter_mut() {
        agent.wait_for_ranks_printing("READY", PES_PER_HOST);
    }
}

/// The processes of host `h`'s job (its agent and its PEs).
fn processes_of(agent: &Job) -> Vec<Pid> {
    processes_with_marker(agent.marker())
        .into_iter()
        .filter_map(|(pid, _)| Pid::from_raw(pid as i32))
        .collect()
}

/// Every agent failed; each host's PEs that reported (at least one per host: an agent stops
/// its other PE once one fails) got `peer lost`; the survivors name the victim host and its
/// ranks (where the victim's processes were killed, a survivor may name only a victim rank, as
/// a UCX endpoint error does), the victim's PEs (where they could report) name root rank 0's
/// host and the hosts they lost. Prints the time from `fault` (named `what`) to the last agent's exit.
fn assert_victim_lost(agents: Vec<Job>, what: &str, fault: Instant, victim_reports: bool) {
    let mut finished: Vec<(Finished, Duration)> = Vec::new();
    for agent in agents {
        let done = agent.finish();
        finished.push((done, fault.elapsed()));
    }
    let victim_ranks = format!(
        "host hm-host-{VICTIM} (ranks [{}, {}])",
        VICTIM * PES_PER_HOST,
        VICTIM * PES_PER_HOST + 1
    );
    let last = finished.iter().map(|(_, after)| *after).max();
    print_detected(what, last.unwrap_or_default());
    // A killed host's sockets close: a survivor's UCX endpoint to it may fail before the
    // control plane's report arrives, and that error names the rank only.
    let victim_rank = |line: &str| {
        let first = VICTIM * PES_PER_HOST;
        (first..first + PES_PER_HOST).any(|rank| line.contains(&format!("peer=Some({rank})")))
    };
    let mut named_host = 0;
    for (h, (done, _)) in finished.iter().enumerate() {
        if h == VICTIM && !victim_reports {
            continue;
        }
        assert_ne!(done.code(), 0, "host {h}: {done:?}");
        let lost: Vec<String> = done
            .stdout_lines()
            .into_iter()
            .filter(|l| l.contains("LOST"))
            .collect();
        assert!(!lost.is_empty(), "host {h} reported no loss: {done:?}");
        for line in &lost {
            println!("host {h}: {line}");
            assert!(line.contains("LOST kind=PeerLost"), "host {h}: {line}");
            let named = if h == VICTIM {
                line.contains("host hm-host-0 of root rank 0 is lost")
                    && line.contains("hm-host-1 (ranks [2, 3])")
                    && line.contains("hm-host-3 (ranks [6, 7])")
            } else {
                named_host += usize::from(line.contains(&victim_ranks));
                line.contains(&victim_ranks) || (!victim_reports && victim_rank(line))
            };
            assert!(named, "host {h} does not name what it lost: {line}");
        }
    }
    assert!(named_host > 0, "no survivor named the lost host");
    for (done, _) in &finished {
        wait_until_nothing_left(&done.marker);
    }
}

/// Prints, for `bench/liveness.sh`, how long after fault `what` the agents that had to notice
/// it had all exited: a JSON line after `DETECTED `.
fn print_detected(what: &str, after: Duration) {
    println!(
        "DETECTED {{\"fault\":\"{what}\",\"peer_timeout_s\":{PEER_TIMEOUT},\"ms\":{}}}",
        after.as_millis()
    );
}

/// Every agent succeeded and no PE reported a loss.
fn assert_no_loss(agents: Vec<Job>) {
    for (h, agent) in agents.into_iter().enumerate() {
        let done = agent.finish();
        assert_eq!(done.code(), 0, "host {h}: {done:?}");
        let lines = [done.stdout_lines(), done.stderr_lines()].concat();
        assert!(
            !lines.iter().any(|l| l.contains("LOST")),
            "host {h}: {done:?}"
        );
        assert_eq!(
            crate::support::ranks_printing(&done.stdout, "DONE").len(),
            PES_PER_HOST,
            "host {h}: {done:?}"
        );
        wait_until_nothing_left(&done.marker);
    }
}

#[test]
fn a_host_whose_link_is_cut_is_named_lost_on_every_host() {
    if is_pe() {
        return exchange();
    }
    let test = "lost_host::a_host_whose_link_is_cut_is_named_lost_on_every_host";
    let Some(hosts) = four_hosts_or_skip(test, "c") else {
        return;
    };
    let mut agents = start(&hosts, test, &[]);
    wait_until_ready(&mut agents);
    hosts.cut(VICTIM);
    assert_victim_lost(agents, "link cut", Instant::now(), true);
}

#[test]
fn a_host_whose_processes_are_killed_is_named_lost_on_every_host() {
    if is_pe() {
        return exchange();
    }
    let test = "lost_host::a_host_whose_processes_are_killed_is_named_lost_on_every_host";
    let Some(hosts) = four_hosts_or_skip(test, "k") else {
        return;
    };
    let mut agents = start(&hosts, test, &[]);
    wait_until_ready(&mut agents);
    let fault = Instant::now();
    for pid in processes_of(&agents[VICTIM]) {
        let _ = kill_process(pid, Signal::KILL);
    }
    assert_victim_lost(agents, "processes killed", fault, false);
}

#[test]
fn a_host_frozen_past_the_peer_timeout_is_named_lost_on_every_host() {
    if is_pe() {
        return exchange();
    }
    let test = "lost_host::a_host_frozen_past_the_peer_timeout_is_named_lost_on_every_host";
    let Some(hosts) = four_hosts_or_skip(test, "f") else {
        return;
    };
    let mut agents = start(&hosts, test, &[]);
    wait_until_ready(&mut agents);
    let frozen = processes_of(&agents[VICTIM]);
    let fault = Instant::now();
    for &pid in &frozen {
        let _ = kill_process(pid, Signal::STOP);
    }
    let victim = agents.remove(VICTIM);
    // The survivors must notice on their own while the victim stays frozen.
    let survivors: Vec<Finished> = agents.into_iter().map(Job::finish).collect();
    let detected = fault.elapsed();
    for &pid in &frozen {
        let _ = kill_process(pid, Signal::CONT);
    }
    let victim = victim.finish();
    print_detected("host frozen", detected);
    assert_ne!(victim.code(), 0, "the thawed victim: {victim:?}");
    for (done, h) in survivors.iter().zip([0, 1, 3]) {
        assert_ne!(done.code(), 0, "host {h}: {done:?}");
        let lost: Vec<String> = done
            .stdout_lines()
            .into_iter()
            .filter(|l| l.contains("LOST"))
            .collect();
        assert!(!lost.is_empty(), "host {h} reported no loss: {done:?}");
        for line in &lost {
            assert!(line.contains("LOST kind=PeerLost"), "host {h}: {line}");
            assert!(
                line.contains("host hm-host-2 (ranks [4, 5]) is lost"),
                "host {h} does not name the frozen host: {line}"
            );
        }
        wait_until_nothing_left(&done.marker);
    }
    wait_until_nothing_left(&victim.marker);
}

#[test]
fn a_pe_computing_for_30_s_without_calls_is_not_lost() {
    if is_pe() {
        return exchange();
    }
    let test = "lost_host::a_pe_computing_for_30_s_without_calls_is_not_lost";
    let Some(hosts) = four_hosts_or_skip(test, "p") else {
        return;
    };
    let agents = start(&hosts, test, &[(RUN_FOR, "2"), (COMPUTING_RANK, "5")]);
    assert_no_loss(agents);
}

#[test]
fn a_slow_lossy_link_is_not_a_lost_host() {
    if is_pe() {
        return exchange();
    }
    let test = "lost_host::a_slow_lossy_link_is_not_a_lost_host";
    let Some(hosts) = four_hosts_or_skip(test, "l") else {
        return;
    };
    if let Err(why) = hosts.degrade(VICTIM) {
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED {test}: cannot make a slow lossy link here: {why}"
        );
        return;
    }
    let agents = start(&hosts, test, &[(RUN_FOR, "15")]);
    assert_no_loss(agents);
}

#[test]
fn a_host_frozen_for_less_than_the_peer_timeout_is_not_lost() {
    if is_pe() {
        return exchange();
    }
    let test = "lost_host::a_host_frozen_for_less_than_the_peer_timeout_is_not_lost";
    let Some(hosts) = four_hosts_or_skip(test, "s") else {
        return;
    };
    let mut agents = start(&hosts, test, &[(RUN_FOR, "6")]);
    wait_until_ready(&mut agents);
    let frozen = processes_of(&agents[VICTIM]);
    for &pid in &frozen {
        let _ = kill_process(pid, Signal::STOP);
    }
    // The fault itself: frozen for half the peer timeout.
    std::thread::sleep(Duration::from_secs(1));
    for &pid in &frozen {
        let _ = kill_process(pid, Signal::CONT);
    }
    assert_no_loss(agents);
}

/// A PE that only joins the world: prints `JOINED`, or `LOST` with the error and exits 1.
fn join_the_world() {
    match World::from_env() {
        Ok(_) => println!("JOINED"),
        Err(error) => {
            println!(
                "LOST kind={:?} peer={:?}: {error}",
                error.kind(),
                error.peer()
            );
            std::process::exit(1);
        }
    }
}

/// Hosts 0, 1 and 2 start their agents, host 3 never does, so the world's rendezvous waits for
/// host 3's PEs; once root rank 0 has heard both of host 2's PEs arrive, host 2's link is cut.
/// Root rank 0 gives up naming host 2 and tells host 1's PEs; host 2's PEs give up naming root
/// rank 0's host — all with `peer lost`, not the 120 s deadline's timeout.
#[test]
fn a_host_lost_during_the_rendezvous_is_named_on_every_host() {
    if is_pe() {
        return join_the_world();
    }
    let test = "lost_host::a_host_lost_during_the_rendezvous_is_named_on_every_host";
    let Some(hosts) = four_hosts_or_skip(test, "r") else {
        return;
    };
    let debug = [("HYPER_MULTICORE_SHMEM_LOG_LEVEL", "debug")];
    let mut agents: Vec<Job> = (0..3)
        .map(|h| agent(&hosts, h, test, if h == 0 { &debug } else { &[] }))
        .collect();
    for rank in [VICTIM * PES_PER_HOST, VICTIM * PES_PER_HOST + 1] {
        agents[0].wait_for_stderr(&format!(
            "rank {rank} of host hm-host-{VICTIM} arrived at the rendezvous"
        ));
    }
    hosts.cut(VICTIM);
    let fault = Instant::now();
    let finished: Vec<Finished> = agents.into_iter().map(Job::finish).collect();
    print_detected("link cut during the rendezvous", fault.elapsed());
    for (h, done) in finished.iter().enumerate() {
        assert_ne!(done.code(), 0, "host {h}: {done:?}");
        let lost: Vec<String> = done
            .stdout_lines()
            .into_iter()
            .filter(|l| l.contains("LOST"))
            .collect();
        assert!(!lost.is_empty(), "host {h} reported no loss: {done:?}");
        for line in &lost {
            println!("host {h}: {line}");
            assert!(line.contains("LOST kind=PeerLost"), "host {h}: {line}");
            let named = if h == VICTIM {
                "host hm-host-0 of root rank 0 (198.18.0.1:29501) is lost during the rendezvous"
                    .to_string()
            } else {
                format!("on host hm-host-{VICTIM} is lost during the rendezvous")
            };
            assert!(
                line.contains(&named),
                "host {h} does not name what it lost: {line}"
            );
        }
        wait_until_nothing_left(&done.marker);
    }
}

/// A PE of the start-up benchmark: joins the world and the runtime, passes a barrier, prints
/// READY and leaves.
fn start_and_leave() {
    let world = World::from_env().unwrap();
    let shmem = hm_testkit::initialize_over(&world, Some(8 << 20)).unwrap();
    shmem.barrier().unwrap();
    println!("READY");
}

/// Benchmark (`bench/startup_hosts.sh` runs it; not part of the test command): how job start
/// grows with hosts. For each count of hosts in `HM_BENCH_HOSTS` (default 2,4,8,16), `HM_BENCH_ROUNDS`
/// times (default 3): namespace hosts on a bridge, `hmrun -n 2` on each, and the time from
/// starting the agents until every PE has joined the world and the runtime and passed a first
/// barrier, printed as a `STARTUP` JSON line.
#[test]
#[ignore = "a benchmark: bench/startup_hosts.sh runs it"]
fn job_start_on_namespace_hosts() {
    if is_pe() {
        return start_and_leave();
    }
    let test = "lost_host::job_start_on_namespace_hosts";
    let counts: Vec<usize> = std::env::var("HM_BENCH_HOSTS")
        .unwrap_or_else(|_| "2,4,8,16".into())
        .split(',')
        .map(|count| count.trim().parse().unwrap())
        .collect();
    let rounds: usize =
        std::env::var("HM_BENCH_ROUNDS").map_or(3, |rounds| rounds.parse().unwrap());
    for count in counts {
        for _ in 0..rounds {
            let Ok(hosts) = NamespaceHosts::create(count, &format!("b{count}")) else {
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "SKIPPED {test}: cannot make {count} namespace hosts on a bridge here"
                );
                return;
            };
            let started = Instant::now();
            let mut agents = start(&hosts, test, &[]);
            wait_until_ready(&mut agents);
            let ms = started.elapsed().as_millis();
            for (h, agent) in agents.into_iter().enumerate() {
                let done = agent.finish();
                assert_eq!(done.code(), 0, "host {h}: {done:?}");
                wait_until_nothing_left(&done.marker);
            }
            println!("STARTUP {{\"hosts\":{count},\"pes_per_host\":{PES_PER_HOST},\"ms\":{ms}}}");
        }
    }
}
