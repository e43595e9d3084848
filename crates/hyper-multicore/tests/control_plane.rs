//! The control plane across real processes: collectives on 1–8 PEs, peer loss, strangers at the
//! rendezvous, missing members, concurrent jobs and subgroups.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hm_testkit::{is_pe, open_fds, Job, Options};
use hyper_multicore::config::{Config, BOOTSTRAP_ENDPOINT, TIMEOUT_SEC};
use hyper_multicore::control::frame::{
    encode_header, write_frame, FrameDecoder, Kind, WireError, MAX_PAYLOAD,
};
use hyper_multicore::control::{ControlPlane, UniqueId};
use hyper_multicore::launch::JobPlan;
use hyper_multicore::world::World;
use hyper_multicore::ErrorKind;

fn pattern(rank: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + rank * 7) as u8).collect()
}

/// allgather / broadcast / barrier with 0 B and 1 MiB payloads, then 1000 rounds with the
/// open-descriptor count checked flat.
fn exercise_collectives() {
    let world = World::from_env().unwrap();
    let plane = world.control();
    let (rank, size) = (world.rank(), world.size());
    for len in [0, 1, 1 << 20] {
        let gathered = plane.allgather(&pattern(rank, len)).unwrap();
        assert_eq!(gathered.len(), size);
        for (peer, part) in gathered.iter().enumerate() {
            assert_eq!(
                part,
                &pattern(peer, len),
                "allgather slot {peer}, {len} bytes"
            );
        }
        let broadcast = plane.broadcast(&pattern(rank, len)).unwrap();
        assert_eq!(broadcast, pattern(0, len), "broadcast of {len} bytes");
        plane.barrier().unwrap();
    }
    let uneven = plane.allgather(&pattern(rank, rank * 1000)).unwrap();
    for (peer, part) in uneven.iter().enumerate() {
        assert_eq!(part, &pattern(peer, peer * 1000));
    }
    let fds_before = open_fds();
    for round in 0..1000u32 {
        let gathered = plane.allgather(&round.to_le_bytes()).unwrap();
        assert!(gathered.iter().all(|g| g == &round.to_le_bytes()));
        plane.barrier().unwrap();
        assert_eq!(
            plane.broadcast(&round.to_le_bytes()).unwrap(),
            round.to_le_bytes()
        );
    }
    let fds_after = open_fds();
    assert!(
        fds_after <= fds_before,
        "open descriptors grew over 1000 rounds: {fds_before} -> {fds_after}"
    );
}

macro_rules! collectives_test {
    ($name:ident, $pes:expr) => {
        #[test]
        fn $name() {
            if is_pe() {
                return exercise_collectives();
            }
            Job::launch(stringify!($name), $pes)
                .wait()
                .assert_all_succeeded();
        }
    };
}

collectives_test!(collectives_on_1_pe, 1);
collectives_test!(collectives_on_2_pes, 2);
collectives_test!(collectives_on_4_pes, 4);
collectives_test!(collectives_on_8_pes, 8);

#[test]
fn point_to_point_messages_arrive_in_order() {
    if is_pe() {
        let world = World::from_env().unwrap();
        let (rank, size) = (world.rank(), world.size());
        let plane = world.control();
        for peer in 0..size {
            for i in 0..50u32 {
                plane
                    .send(
                        peer,
                        7,
                        &[&(rank as u32).to_le_bytes()[..], &i.to_le_bytes()].concat(),
                    )
                    .unwrap();
            }
        }
        for peer in 0..size {
            for i in 0..50u32 {
                let message = plane.recv(peer, 7).unwrap();
                assert_eq!(
                    message,
                    [&(peer as u32).to_le_bytes()[..], &i.to_le_bytes()].concat()
                );
            }
        }
        assert_eq!(plane.try_recv(0, 8).unwrap(), None);
        plane.barrier().unwrap();
        return;
    }
    Job::launch("point_to_point_messages_arrive_in_order", 3)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn concurrent_jobs_with_different_secrets_never_cross_talk() {
    if is_pe() {
        let token = std::env::var("HM_TEST_TOKEN").unwrap();
        let world = World::from_env().unwrap();
        for _ in 0..200 {
            let tokens = world.control().allgather(token.as_bytes()).unwrap();
            assert!(
                tokens.iter().all(|t| t == token.as_bytes()),
                "foreign token in {tokens:?}"
            );
        }
        return;
    }
    let name = "concurrent_jobs_with_different_secrets_never_cross_talk";
    let a = Job::launch_with(name, 3, Options::default().env("HM_TEST_TOKEN", "job-a"));
    let b = Job::launch_with(name, 3, Options::default().env("HM_TEST_TOKEN", "job-b"));
    a.wait().assert_all_succeeded();
    b.wait().assert_all_succeeded();
}

/// Every rank loops over allgathers; `victim` SIGKILLs itself at round 5, so the others are
/// inside an allgather when it dies. Survivors print the error they got.
fn allgather_until_peer_dies() {
    let world = World::from_env().unwrap();
    let victim: usize = std::env::var("HM_TEST_VICTIM").unwrap().parse().unwrap();
    for round in 0u32.. {
        if round == 5 && world.rank() == victim {
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL)
                .unwrap();
        }
        let started = Instant::now();
        match world.control().allgather(&round.to_le_bytes()) {
            Ok(_) => continue,
            Err(error) => {
                println!("KIND {:?}", error.kind());
                println!("PEER {:?}", error.peer());
                println!("WAITED_MS {}", started.elapsed().as_millis());
                println!("MESSAGE {error}");
                // The plane stays broken: later calls fail the same way, without waiting.
                let again = world.control().barrier().unwrap_err();
                assert_eq!(again.kind(), ErrorKind::PeerLost);
                return;
            }
        }
    }
}

fn assert_survivors_saw_peer_lost(job: Job, pes: usize, victim: usize) {
    let result = job.wait();
    for rank in (0..pes).filter(|&r| r != victim) {
        let pe = result.pe(rank);
        assert!(pe.status.success(), "{}", result.describe());
        assert_eq!(
            pe.lines_with("KIND "),
            ["PeerLost"],
            "{}",
            result.describe()
        );
        assert_eq!(
            pe.lines_with("PEER "),
            [format!("Some({victim})")],
            "{}",
            result.describe()
        );
        let message = &pe.lines_with("MESSAGE ")[0];
        assert!(
            message.contains(&format!("peer rank {victim} was lost")),
            "{message}"
        );
        assert!(message.contains("allgather failed"), "{message}");
    }
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(result.pe(victim).status.signal(), Some(9));
}

#[test]
fn killing_a_member_during_allgather_names_it_on_every_survivor() {
    if is_pe() {
        return allgather_until_peer_dies();
    }
    let job = Job::launch_with(
        "killing_a_member_during_allgather_names_it_on_every_survivor",
        4,
        Options::default().env("HM_TEST_VICTIM", 2),
    );
    assert_survivors_saw_peer_lost(job, 4, 2);
}

#[test]
fn killing_the_root_during_allgather_names_it_on_every_survivor() {
    if is_pe() {
        return allgather_until_peer_dies();
    }
    let job = Job::launch_with(
        "killing_the_root_during_allgather_names_it_on_every_survivor",
        4,
        Options::default().env("HM_TEST_VICTIM", 0),
    );
    assert_survivors_saw_peer_lost(job, 4, 0);
}

/// The variable naming the rank a liveness test stops.
const VICTIM: &str = "HM_TEST_VICTIM";

/// A PE of a liveness test: rank 1 stops the rank [`VICTIM`] names (SIGSTOP) and never
/// continues it; the barrier of the others ends with `peer lost` (printed), and rank 1 then
/// kills the victim (which made no call the others' barrier could complete with).
fn stop_a_member() {
    use rustix::process::{kill_process, Pid, Signal};
    let world = World::from_env().unwrap();
    let plane = world.control();
    let victim: usize = std::env::var(VICTIM).unwrap().parse().unwrap();
    let pids = plane.allgather(&std::process::id().to_le_bytes()).unwrap();
    let pid = i32::from_le_bytes(pids[victim][..4].try_into().unwrap());
    let pid = Pid::from_raw(pid).unwrap();
    if world.rank() == victim {
        // Stopped (and then killed) while it waits here.
        std::thread::sleep(Duration::from_secs(120));
    }
    if world.rank() == 1 {
        kill_process(pid, Signal::STOP).unwrap();
        hm_testkit::wait_until_stopped(pid.as_raw_nonzero().get());
    }
    let outcome = plane.barrier();
    if world.rank() == 1 {
        kill_process(pid, Signal::KILL).unwrap();
    }
    let error = outcome.unwrap_err();
    println!("KIND {:?}", error.kind());
    println!("PEER {:?}", error.peer());
    println!("MESSAGE {error}");
}

/// Runs [`stop_a_member`] as `test` on PEs on `hosts` (simulated host names, by rank; a
/// plane's liveness beats across them as across hosts), with a 1 s peer timeout and a 60 s wait
/// timeout; every other PE must name `victim` lost, frozen, as seen by `witness` (a rank of its
/// host: its host still answers, so only the process is named).
fn assert_a_stopped_member_is_named(test: &str, hosts: &[&str], victim: usize, witness: usize) {
    use hyper_multicore::config::PEER_TIMEOUT_SEC;
    use hyper_multicore::control::TEST_HOST_VARIABLE;
    let mut options = Options::default()
        .env(PEER_TIMEOUT_SEC, 1)
        .env(TIMEOUT_SEC, 60)
        .env(VICTIM, victim);
    for (rank, host) in hosts.iter().enumerate() {
        options = options.rank_env(rank, TEST_HOST_VARIABLE, host);
    }
    let result = Job::launch_with(test, hosts.len(), options).wait();
    for rank in (0..hosts.len()).filter(|&rank| rank != victim) {
        let pe = result.pe(rank);
        assert!(pe.status.success(), "{}", result.describe());
        assert_eq!(
            pe.lines_with("KIND "),
            ["PeerLost"],
            "{}",
            result.describe()
        );
        assert_eq!(
            pe.lines_with("PEER "),
            [format!("Some({victim})")],
            "{}",
            result.describe()
        );
        let message = &pe.lines_with("MESSAGE ")[0];
        let named = format!(
            "rank {victim} on host {} is lost: rank {witness} of that host heard nothing",
            hosts[victim]
        );
        assert!(
            message.contains(&named) && message.contains("frozen or stopped"),
            "{message}"
        );
    }
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(result.pe(victim).status.signal(), Some(9));
}

/// Liveness on one host (the four-host tests in crates/hmrun need root): root rank 0, the
/// host's leader, finds rank 2 silent over the host's local liveness socket.
#[test]
fn a_member_stopped_past_the_peer_timeout_is_named_lost() {
    if is_pe() {
        return stop_a_member();
    }
    assert_a_stopped_member_is_named(
        "a_member_stopped_past_the_peer_timeout_is_named_lost",
        &["a", "a", "a"],
        2,
        0,
    );
}

/// On simulated hosts a a b b c c, rank 3 (not a leader) is stopped: its leader, rank 2, finds
/// it silent and reports it to root rank 0, which names it to everyone.
#[test]
fn a_member_stopped_on_another_host_is_named_by_its_host_s_leader() {
    if is_pe() {
        return stop_a_member();
    }
    assert_a_stopped_member_is_named(
        "a_member_stopped_on_another_host_is_named_by_its_host_s_leader",
        &["a", "a", "b", "b", "c", "c"],
        3,
        2,
    );
}

/// Traffic across hosts grows with hosts, not PEs: on simulated hosts a a b b c c, root rank 0
/// receives heartbeats from the other hosts' leaders (ranks 2 and 4) and from no other rank.
/// Root waits until each leader has beaten three times (a 1 s peer timeout: a beat every
/// 200 ms), while the others wait in a barrier.
#[test]
fn only_each_host_s_leader_beats_across_hosts() {
    use hyper_multicore::config::PEER_TIMEOUT_SEC;
    use hyper_multicore::control::TEST_HOST_VARIABLE;
    const HOSTS: [&str; 6] = ["a", "a", "b", "b", "c", "c"];
    if is_pe() {
        let world = World::from_env().unwrap();
        let plane = world.control();
        if world.rank() == 0 {
            let deadline = Instant::now() + Duration::from_secs(60);
            let beats = loop {
                let beats = plane.heartbeats_received();
                if beats[2] >= 3 && beats[4] >= 3 {
                    break beats;
                }
                assert!(Instant::now() < deadline, "leaders never beat: {beats:?}");
                std::thread::sleep(Duration::from_millis(20));
            };
            println!("BEATS {beats:?}");
        }
        plane.barrier().unwrap();
        return;
    }
    let mut options = Options::default().env(PEER_TIMEOUT_SEC, 1);
    for (rank, host) in HOSTS.iter().enumerate() {
        options = options.rank_env(rank, TEST_HOST_VARIABLE, host);
    }
    let result = Job::launch_with("only_each_host_s_leader_beats_across_hosts", 6, options).wait();
    result.assert_all_succeeded();
    let line = &result.pe(0).lines_with("BEATS ")[0];
    let beats: Vec<u64> = line
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(", ")
        .map(|count| count.parse().unwrap())
        .collect();
    for rank in [1, 3, 5] {
        assert_eq!(beats[rank], 0, "rank {rank} is no leader: {line}");
    }
}

#[test]
fn a_member_that_never_arrives_is_named_at_the_deadline() {
    if is_pe() {
        let error = World::from_env().unwrap_err();
        println!("KIND {:?}", error.kind());
        println!("MESSAGE {error}");
        return;
    }
    let result = Job::launch_with(
        "a_member_that_never_arrives_is_named_at_the_deadline",
        4,
        Options::default().env(TIMEOUT_SEC, 2).absent(3),
    )
    .wait();
    result.assert_all_succeeded();
    for pe in &result.pes {
        assert_eq!(pe.lines_with("KIND "), ["Timeout"], "{}", result.describe());
        let message = &pe.lines_with("MESSAGE ")[0];
        assert!(
            message.contains("ranks [3]") && message.contains("never arrived"),
            "{message}"
        );
    }
}

fn read_to_end_or_reset(stream: &mut TcpStream) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes);
    bytes
}

#[test]
fn strangers_are_dropped_and_the_rendezvous_goes_on() {
    if is_pe() {
        let world = World::from_env().unwrap();
        let ranks = world.control().allgather(&[world.rank() as u8]).unwrap();
        assert_eq!(ranks, vec![vec![0], vec![1], vec![2]]);
        return;
    }
    let plan = JobPlan::new(3, &Config::default()).unwrap();
    let endpoint = plan.id().endpoint();
    // Connected before any PE exists, so they sit in the listen queue ahead of the real ranks.
    let mut junk = TcpStream::connect(endpoint).unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut oversized = TcpStream::connect(endpoint).unwrap();
    oversized
        .write_all(&encode_header(Kind::Hello, 0, u32::MAX))
        .unwrap();
    let mut truncated = TcpStream::connect(endpoint).unwrap();
    truncated
        .write_all(&encode_header(Kind::Hello, 0, 100))
        .unwrap();
    truncated.write_all(&[0; 10]).unwrap();
    let mut silent = TcpStream::connect(endpoint).unwrap();
    let mut wrong_kind = TcpStream::connect(endpoint).unwrap();
    write_frame(&mut wrong_kind, Kind::Contribute, 0, &[b"not a hello"]).unwrap();
    let wrong_secret = std::thread::spawn(move || {
        let foreign = UniqueId::new(endpoint, [0x5a; 16]);
        ControlPlane::connect(1, 3, &foreign, None, Duration::from_secs(30)).unwrap_err()
    });

    let job = Job::launch_plan(
        "strangers_are_dropped_and_the_rendezvous_goes_on",
        &plan,
        Options::default(),
    );
    drop(plan);
    job.wait().assert_all_succeeded();

    let error = wrong_secret.join().unwrap();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert!(error.to_string().contains("wrong secret"), "{error}");
    // Junk is dropped without an answer; the silent one is dropped when the rendezvous ends.
    for stream in [&mut junk, &mut oversized, &mut silent] {
        assert_eq!(read_to_end_or_reset(stream), Vec::<u8>::new());
    }
    let answer = read_to_end_or_reset(&mut wrong_kind);
    assert!(String::from_utf8_lossy(&answer).contains("expected a hello"));
    let _ = read_to_end_or_reset(&mut truncated);
}

/// Each PE joins and reports the ranks it saw.
fn join_and_gather() {
    let world = World::from_env().unwrap();
    let ranks = world.control().allgather(&[world.rank() as u8]).unwrap();
    assert_eq!(ranks, vec![vec![0], vec![1], vec![2]]);
}

#[test]
fn a_group_size_mismatch_is_rejected_and_the_rendezvous_goes_on() {
    if is_pe() {
        return join_and_gather();
    }
    let plan = JobPlan::new(3, &Config::default()).unwrap();
    // Its hello is queued before any PE exists, so root rank 0 judges it during the rendezvous.
    let impostor = ControlPlane::start_joining(2, 4, plan.id(), Duration::from_secs(30)).unwrap();
    let job = Job::launch_plan(
        "a_group_size_mismatch_is_rejected_and_the_rendezvous_goes_on",
        &plan,
        Options::default(),
    );
    drop(plan);
    job.wait().assert_all_succeeded();
    let error = impostor.finish().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert!(error.to_string().contains("size mismatch"), "{error}");
}

#[test]
fn a_duplicate_rank_is_rejected_and_the_rendezvous_goes_on() {
    if is_pe() {
        return join_and_gather();
    }
    let plan = JobPlan::new(3, &Config::default()).unwrap();
    // Two claims of rank 1 are queued, in order, before any PE exists: the first keeps the
    // rank and stands in for PE 1 (not started); the second is turned away.
    let timeout = Duration::from_secs(30);
    let first_claim = ControlPlane::start_joining(1, 3, plan.id(), timeout).unwrap();
    let second_claim = ControlPlane::start_joining(1, 3, plan.id(), timeout).unwrap();
    let first_claimant = std::thread::spawn(move || {
        let plane = first_claim.finish().unwrap();
        plane.allgather(&[1]).unwrap()
    });
    let job = Job::launch_plan(
        "a_duplicate_rank_is_rejected_and_the_rendezvous_goes_on",
        &plan,
        Options::default().absent(1),
    );
    drop(plan);
    job.wait().assert_all_succeeded();
    assert_eq!(
        first_claimant.join().unwrap(),
        vec![vec![0], vec![1], vec![2]]
    );
    let error = second_claim.finish().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert!(error.to_string().contains("duplicate rank"), "{error}");
}

#[test]
fn a_member_leaving_mid_rendezvous_is_named_to_connections_not_yet_heard() {
    if is_pe() {
        let error = World::from_env().unwrap_err();
        println!("KIND {:?}", error.kind());
        println!("PEER {:?}", error.peer());
        return;
    }
    let plan = JobPlan::new(3, &Config::default()).unwrap();
    // Queued before any PE exists: rank 1's hello followed by its hang-up, then a connection that
    // has not said anything yet (a member whose hello is still on its way).
    let leaver = ControlPlane::start_joining(1, 3, plan.id(), Duration::from_secs(30)).unwrap();
    drop(leaver);
    let mut unheard = TcpStream::connect(plan.id().endpoint()).unwrap();
    let job = Job::launch_plan(
        "a_member_leaving_mid_rendezvous_is_named_to_connections_not_yet_heard",
        &plan,
        Options::default().absent(1).absent(2),
    );
    drop(plan);
    let result = job.wait();
    result.assert_all_succeeded();
    let root = &result.pes[0];
    assert_eq!(
        root.lines_with("KIND "),
        ["PeerLost"],
        "{}",
        result.describe()
    );
    assert_eq!(
        root.lines_with("PEER "),
        ["Some(1)"],
        "{}",
        result.describe()
    );
    // The unheard connection is told why root rank 0 gave up, not cut off with a bare reset.
    let mut decoder = FrameDecoder::new(MAX_PAYLOAD);
    decoder.push(&read_to_end_or_reset(&mut unheard));
    let frame = decoder.next_frame().unwrap().expect("a verdict frame");
    assert_eq!(frame.kind, Kind::Reject);
    let verdict = WireError::decode(&frame.payload).to_error();
    assert_eq!(verdict.kind(), ErrorKind::PeerLost, "{verdict}");
    assert_eq!(verdict.peer(), Some(1), "{verdict}");
}

#[test]
fn disjoint_subgroups_run_collectives_at_the_same_time() {
    if is_pe() {
        let world = World::from_env().unwrap();
        // Ordered groups: group rank 0 of [1, 0] is world rank 1.
        let members: &[usize] = if world.rank() < 2 { &[1, 0] } else { &[3, 2] };
        let group = world.new_group(members).unwrap();
        assert_eq!(group.world_rank(group.rank()), Some(world.rank()));
        for round in 0..300u32 {
            let mine = [&round.to_le_bytes()[..], &[world.rank() as u8]].concat();
            let gathered = group.control().allgather(&mine).unwrap();
            for (group_rank, part) in gathered.iter().enumerate() {
                let expected = [&round.to_le_bytes()[..], &[members[group_rank] as u8]].concat();
                assert_eq!(part, &expected);
            }
        }
        let root = group.control().broadcast(&[world.rank() as u8]).unwrap();
        assert_eq!(root, vec![members[0] as u8]);
        world.control().barrier().unwrap();
        return;
    }
    Job::launch("disjoint_subgroups_run_collectives_at_the_same_time", 4)
        .wait()
        .assert_all_succeeded();
}

#[test]
fn a_group_root_that_cannot_create_the_id_fails_every_member() {
    if is_pe() {
        let world = World::from_env().unwrap();
        if world.rank() != 0 {
            let error = world.new_group(&[1, 2, 3]).unwrap_err();
            println!("ERROR {error}");
        }
        // The world plane is still fine.
        world.control().barrier().unwrap();
        return;
    }
    // Group rank 0 (world rank 1) is told to listen on a port this test already holds.
    let occupied = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("tcp://{}", occupied.local_addr().unwrap());
    let result = Job::launch_with(
        "a_group_root_that_cannot_create_the_id_fails_every_member",
        4,
        Options::default().rank_env(1, BOOTSTRAP_ENDPOINT, endpoint),
    )
    .wait();
    result.assert_all_succeeded();
    for rank in 1..4 {
        let errors = result.pe(rank).lines_with("ERROR ");
        assert_eq!(errors.len(), 1, "{}", result.describe());
        assert!(
            errors[0]
                .contains("group rank 0 (world rank 1) could not create the group's unique ID"),
            "{}",
            errors[0]
        );
    }
    drop(occupied);
}

/// A PE of a torchrun-style world (the lookup hides hmrun's variables): `RANK`, `WORLD_SIZE`,
/// `MASTER_ADDR`, `MASTER_PORT`, and the secret variable if the test set one. Barriers once.
fn join_torchrun_world() -> hyper_multicore::Result<()> {
    use hyper_multicore::config::{RANK, SECRET};
    hyper_multicore::logging::install()?;
    let rank = std::env::var(RANK).unwrap();
    let master_port = std::env::var("HM_TEST_MASTER_PORT").unwrap();
    let lookup = |name: &str| match name {
        "RANK" => Some(rank.clone()),
        "WORLD_SIZE" => Some("2".to_string()),
        "MASTER_ADDR" => Some("127.0.0.1".to_string()),
        "MASTER_PORT" => Some(master_port.clone()),
        "TORCHELASTIC_RUN_ID" => Some("public-run-id".to_string()),
        SECRET => std::env::var(SECRET).ok(),
        _ => None,
    };
    let config = Config {
        timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let world = World::from_lookup(lookup, config)?;
    world.control().barrier()
}

/// Options for a torchrun-style job: a free port for the root's listener (`MASTER_PORT + 1`).
fn torchrun_options() -> Options {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    Options::default().env("HM_TEST_MASTER_PORT", port - 1)
}

#[test]
fn torchrun_worlds_authenticate_with_the_secret_variable() {
    if is_pe() {
        join_torchrun_world().unwrap();
        return;
    }
    let secret = "0123456789abcdef0123456789abcdef";
    let options = torchrun_options().env(hyper_multicore::config::SECRET, secret);
    let job = Job::launch_with(
        stringify!(torchrun_worlds_authenticate_with_the_secret_variable),
        2,
        options,
    )
    .wait();
    job.assert_all_succeeded();
    for pe in &job.pes {
        assert!(!pe.stderr.contains("UNAUTHENTICATED"), "{}", job.describe());
    }
}

#[test]
fn torchrun_worlds_with_different_secrets_never_meet() {
    if is_pe() {
        let error = join_torchrun_world().unwrap_err();
        println!("error: {error}");
        std::process::exit(3);
    }
    let options = torchrun_options()
        .rank_env(0, hyper_multicore::config::SECRET, "00".repeat(16))
        .rank_env(1, hyper_multicore::config::SECRET, "11".repeat(16));
    let job = Job::launch_with(
        stringify!(torchrun_worlds_with_different_secrets_never_meet),
        2,
        options,
    )
    .wait();
    let member = job.pe(1).lines_with("error: ").join("\n");
    assert!(member.contains("wrong secret"), "{}", job.describe());
    let root = job.pe(0).lines_with("error: ").join("\n");
    assert!(root.contains("ranks [1]"), "{}", job.describe());
}

#[test]
fn torchrun_worlds_without_a_secret_warn_that_they_are_unauthenticated() {
    if is_pe() {
        join_torchrun_world().unwrap();
        return;
    }
    let job = Job::launch_with(
        stringify!(torchrun_worlds_without_a_secret_warn_that_they_are_unauthenticated),
        2,
        torchrun_options(),
    )
    .wait();
    job.assert_all_succeeded();
    for pe in &job.pes {
        let warning = pe.stderr.lines().find(|l| l.contains("UNAUTHENTICATED"));
        let warning = warning.unwrap_or_else(|| panic!("no warning: {}", job.describe()));
        assert!(
            warning.starts_with(&format!("[pe {}]", pe.rank)),
            "{warning}"
        );
    }
}

/// Another user on the same host cannot join a job's rendezvous, even with the right secret:
/// rank 1 connects from a thread running as uid 65534 (Linux credentials are per thread at the
/// system-call level), and root rank 0 refuses it by the owner of its socket.
#[test]
fn a_local_member_of_another_user_is_refused() {
    if is_pe() {
        let joined = std::thread::spawn(|| {
            if std::env::var("HYPER_MULTICORE_RANK").as_deref() == Ok("1") {
                rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(65534))
                    .expect("drop to uid 65534");
            }
            World::from_env().map(drop)
        })
        .join()
        .unwrap();
        if let Err(error) = joined {
            println!("error: {error}");
            std::process::exit(3);
        }
        return;
    }
    if !rustix::process::getuid().is_root() {
        println!("SKIPPED a_local_member_of_another_user_is_refused: needs root to run a PE as another user");
        return;
    }
    let options = Options::default().env(TIMEOUT_SEC, 3);
    let job = Job::launch_with(
        stringify!(a_local_member_of_another_user_is_refused),
        2,
        options,
    )
    .wait();
    let member = job.pe(1).lines_with("error: ").join("\n");
    assert!(
        member.contains("belongs to uid 65534"),
        "{}",
        job.describe()
    );
    assert!(!job.pe(0).status.success(), "{}", job.describe());
}

/// A PE of a global-exit job: after a first barrier, the ranks in `HM_TEST_EXITERS` (comma
/// separated) call `lifecycle::global_exit` with `HM_TEST_STATUS` plus their rank, while every
/// other rank waits in a barrier of the world plane (`HM_TEST_OTHERS=barrier`) or computes
/// without a call (`compute`: sleeps in 1 ms steps, for two minutes at most). Nothing of either
/// may return: a PE that gets past its part says so and exits 99.
fn global_exit_pe() {
    let world = World::global().unwrap();
    let variable = |name: &str| std::env::var(name).unwrap();
    let exiters: Vec<usize> = variable("HM_TEST_EXITERS")
        .split(',')
        .map(|rank| rank.parse().unwrap())
        .collect();
    let status: i32 = variable("HM_TEST_STATUS").parse().unwrap();
    world.control().barrier().unwrap();
    let rank = world.rank();
    if exiters.contains(&rank) {
        hyper_multicore::lifecycle::global_exit(status + rank as i32);
    }
    if variable("HM_TEST_OTHERS") == "barrier" {
        let outcome = world.control().barrier();
        println!("PAST THE BARRIER: {outcome:?}");
    } else {
        for _ in 0..120_000 {
            std::thread::sleep(Duration::from_millis(1));
        }
        println!("PAST THE COMPUTATION");
    }
    std::process::exit(99);
}

/// Launches a global-exit job of `pes` PEs (see [`global_exit_pe`]) and returns every PE's
/// exit code, checking that no PE wrote an error or got past its part.
fn global_exit_codes(test: &str, pes: usize, exiters: &str, status: i32, others: &str) -> Vec<i32> {
    let options = Options::default()
        .env("HM_TEST_EXITERS", exiters)
        .env("HM_TEST_STATUS", status)
        .env("HM_TEST_OTHERS", others)
        // Far beyond the test's watchdog: only the global exit can end the job in time.
        .env(TIMEOUT_SEC, 600);
    let job = Job::launch_with(test, pes, options).wait();
    for pe in &job.pes {
        assert!(!pe.stdout.contains("PAST THE"), "{}", job.describe());
        assert!(
            !pe.stderr.contains("ERROR") && !pe.stderr.contains("panicked"),
            "{}",
            job.describe()
        );
    }
    job.pes
        .iter()
        .map(|pe| {
            pe.status
                .code()
                .unwrap_or_else(|| panic!("rank {} was killed: {}", pe.rank, job.describe()))
        })
        .collect()
}

#[test]
fn a_member_s_global_exit_ends_every_pe_waiting_in_a_barrier_with_its_status() {
    if is_pe() {
        return global_exit_pe();
    }
    let test =
        stringify!(a_member_s_global_exit_ends_every_pe_waiting_in_a_barrier_with_its_status);
    // Rank 2 (a member of the plane, not its root) exits with 5 + 2.
    assert_eq!(global_exit_codes(test, 4, "2", 5, "barrier"), [7; 4]);
}

#[test]
fn root_rank_0_s_global_exit_ends_every_computing_pe_with_its_status() {
    if is_pe() {
        return global_exit_pe();
    }
    let test = stringify!(root_rank_0_s_global_exit_ends_every_computing_pe_with_its_status);
    assert_eq!(global_exit_codes(test, 3, "0", 0, "compute"), [0; 3]);
}

#[test]
fn global_exits_at_once_end_every_pe_with_one_of_their_statuses() {
    if is_pe() {
        return global_exit_pe();
    }
    let test = stringify!(global_exits_at_once_end_every_pe_with_one_of_their_statuses);
    // Ranks 1 and 3 exit with 11 and 13 at once: root rank 0 picks the first it hears of.
    let codes = global_exit_codes(test, 4, "1,3", 10, "barrier");
    assert!(
        (codes[0] == 11 || codes[0] == 13) && codes.iter().all(|&code| code == codes[0]),
        "{codes:?}"
    );
}
