//! Multi-process tests of the UCX wrapper: every test re-executes this test binary as 2 PEs
//! (hm-testkit), which exchange worker addresses and packed rkeys over the world's control plane
//! and then drive UCX against each other's memfd mapping — under `UCX_TLS=tcp,self` (the
//! cross-host route, RMA and atomics emulated with active messages), `UCX_TLS=sm,self` and UCX's
//! default choice.

use std::os::unix::process::ExitStatusExt;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hm_testkit::{is_pe, Job, Options};
use rustix::fs::{ftruncate, memfd_create, MemfdFlags};

use super::*;
use crate::sys::mapping::SharedMapping;
use crate::world::World;

/// Bytes of the region each PE registers (a memfd mapping, like the heap).
const REGION: usize = 4 << 20;
/// Offsets inside the region.
const SMALL: usize = 0;
const WORD32: usize = 64;
const WORD64: usize = 128;
const LARGE: usize = 1 << 20;
const MIB: usize = 1 << 20;
/// The active-message id the tests use.
const AM_ID: u16 = 7;

/// The full test path of `name` in this module, as the test harness knows it.
fn path(name: &str) -> String {
    let module = module_path!();
    let module = module.split_once("::").map_or(module, |(_, rest)| rest);
    format!("{module}::{name}")
}

fn deadline(seconds: u64) -> Instant {
    Instant::now() + Duration::from_secs(seconds)
}

fn launch(name: &str, tls: Option<&str>) -> Job {
    let mut options = Options::default().env("HM_TEST_UCX_TLS_LABEL", tls.unwrap_or("default"));
    if let Some(tls) = tls {
        options = options.env("UCX_TLS", tls);
    }
    Job::launch_with(&path(name), 2, options)
}

/// One PE's UCX side, connected to the other PE. Field order is drop order: the progress thread
/// stops first, then the rkey, endpoint, worker, region and context go.
struct Pair {
    progress: Option<ProgressThread>,
    rkey: RemoteKey,
    endpoint: Endpoint,
    /// The peer's region base address.
    remote: u64,
    worker: Worker,
    region: MemoryRegion,
    mapping: Arc<SharedMapping>,
    _context: Context,
    world: World,
}

impl Pair {
    fn remote(&self, offset: usize) -> u64 {
        self.remote + offset as u64
    }
}

fn memfd_mapping(len: usize) -> Arc<SharedMapping> {
    let fd = memfd_create("hyper_multicore-ucx-test", MemfdFlags::CLOEXEC).expect("memfd");
    ftruncate(&fd, len as u64).expect("ftruncate");
    Arc::new(SharedMapping::map(&fd, len, 4096, 0).expect("map"))
}

fn encode(address: &[u8], base: u64, rkey: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&base.to_le_bytes());
    bytes.extend_from_slice(&(address.len() as u64).to_le_bytes());
    bytes.extend_from_slice(address);
    bytes.extend_from_slice(rkey);
    bytes
}

fn decode(bytes: &[u8]) -> (Vec<u8>, u64, Vec<u8>) {
    let base = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let len = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    (
        bytes[16..16 + len].to_vec(),
        base,
        bytes[16 + len..].to_vec(),
    )
}

/// Local setup → publish → exchange over the control plane → attach.
fn connect_pair(
    with_progress_thread: bool,
    on_am: Option<mpsc::Sender<(Vec<u8>, Vec<u8>)>>,
) -> Pair {
    let world = World::from_env().expect("world");
    assert_eq!(world.size(), 2);
    let context = Context::new().expect("context");
    let worker = Worker::new(&context).expect("worker");
    if let Some(sender) = on_am {
        worker
            .set_am_handler(AM_ID, move |header, data| {
                let _ = sender.send((header.to_vec(), data.to_vec()));
            })
            .expect("am handler");
    }
    let mapping = memfd_mapping(REGION);
    let region = MemoryRegion::register(&context, mapping.clone(), 0, REGION).expect("register");
    let progress = with_progress_thread.then(|| worker.start_progress_thread().expect("thread"));
    let mine = encode(
        &worker.address().unwrap(),
        region.base(),
        region.rkey_bytes(),
    );
    let all = world.control().allgather(&mine).expect("allgather");
    let peer = 1 - world.rank();
    let (address, remote, packed) = decode(&all[peer]);
    let endpoint = worker.connect(&address, peer).expect("connect");
    // Wire-up finished on both sides before a test may stop a side's progress, as the
    // transport does at attach: UCX 1.13 asserts (and aborts) when an endpoint is force-closed
    // with wire-up messages still pending (a test whose target never progresses did, now and
    // then: about 1 run in 35).
    endpoint.flush(deadline(10)).expect("wire-up");
    world.control().barrier().expect("barrier");
    let rkey = endpoint.unpack_rkey(&packed).expect("unpack");
    Pair {
        progress,
        rkey,
        endpoint,
        remote,
        worker,
        region,
        mapping,
        _context: context,
        world,
    }
}

/// Both PEs at once: put/get 8 B and 1 MiB, every atomic on u32 and u64, one active message
/// each way; then each checks what the other wrote into its own mapping, and both close.
fn rma_atomics_and_am_body() {
    let (sender, received) = mpsc::channel();
    let pair = connect_pair(true, Some(sender));
    let me = pair.world.rank() as u8;
    let ep = &pair.endpoint;
    let key = &pair.rkey;
    let d = || deadline(20);

    // 8 B put, remote completion, read back.
    let small = [0xA0 | me; 8];
    ep.put(&small, pair.remote(SMALL), key, d()).unwrap();
    ep.flush(d()).unwrap();
    let mut back = [0u8; 8];
    ep.get(&mut back, pair.remote(SMALL), key, d()).unwrap();
    assert_eq!(back, small);

    // Who carries out the atomics: the target's progress over TCP, CPU atomics on shared memory.
    let by_target = !ep.lanes().device_atomics;
    match std::env::var("HM_TEST_UCX_TLS_LABEL")
        .unwrap_or_default()
        .as_str()
    {
        "tcp,self" => assert!(by_target, "TCP has no atomic lane: the target applies them"),
        "sm,self" => assert!(!by_target, "shared memory does atomics without the target"),
        _ => println!("REPORT atomics by target progress: {by_target}"),
    }

    // 1 MiB put and get.
    let large: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 ^ me).collect();
    ep.put(&large, pair.remote(LARGE), key, d()).unwrap();
    pair.worker.flush(d()).unwrap();
    let mut large_back = vec![0u8; MIB];
    ep.get(&mut large_back, pair.remote(LARGE), key, d())
        .unwrap();
    assert!(large_back == large, "1 MiB get differs from the put");

    // Non-blocking forms.
    let request = ep
        .put_nb(vec![0x5A; 16], pair.remote(SMALL + 8), key)
        .unwrap();
    request.wait(d()).unwrap();
    ep.flush(d()).unwrap();
    let read = ep
        .get_nb(16, pair.remote(SMALL + 8), key)
        .unwrap()
        .wait(d())
        .unwrap();
    assert_eq!(read, vec![0x5A; 16]);
    drop(ep.put_nb(vec![1; 8], pair.remote(SMALL + 24), key).unwrap()); // orphaned
    ep.flush(d()).unwrap();

    // Atomics, u32.
    let w32 = pair.remote(WORD32);
    ep.atomic_set::<u32>(w32, key, 10, d()).unwrap();
    assert_eq!(ep.atomic_fetch::<u32>(w32, key, d()).unwrap(), 10);
    assert_eq!(ep.atomic_swap::<u32>(w32, key, 20, d()).unwrap(), 10);
    assert_eq!(
        ep.atomic_compare_swap::<u32>(w32, key, 20, 30, d())
            .unwrap(),
        20
    );
    assert_eq!(
        ep.atomic_compare_swap::<u32>(w32, key, 99, 40, d())
            .unwrap(),
        30
    );
    assert_eq!(ep.atomic_fetch_add::<u32>(w32, key, 5, d()).unwrap(), 30);
    ep.atomic_add::<u32>(w32, key, u32::MAX, d()).unwrap(); // wraps: -1
    ep.flush(d()).unwrap();
    assert_eq!(ep.atomic_fetch::<u32>(w32, key, d()).unwrap(), 34);

    // Atomics, u64 (values above 32 bits).
    let w64 = pair.remote(WORD64);
    let big = 1u64 << 40;
    ep.atomic_set::<u64>(w64, key, big, d()).unwrap();
    assert_eq!(ep.atomic_fetch::<u64>(w64, key, d()).unwrap(), big);
    assert_eq!(ep.atomic_swap::<u64>(w64, key, big + 1, d()).unwrap(), big);
    assert_eq!(
        ep.atomic_compare_swap::<u64>(w64, key, big + 1, big + 2, d())
            .unwrap(),
        big + 1
    );
    assert_eq!(
        ep.atomic_compare_swap::<u64>(w64, key, 0, 7, d()).unwrap(),
        big + 2
    );
    assert_eq!(
        ep.atomic_fetch_add::<u64>(w64, key, big, d()).unwrap(),
        big + 2
    );
    ep.atomic_add::<u64>(w64, key, 3, d()).unwrap();
    ep.flush(d()).unwrap();
    assert_eq!(ep.atomic_fetch::<u64>(w64, key, d()).unwrap(), 2 * big + 5);

    // Misuse is refused before UCX sees it.
    let unaligned = ep
        .atomic_fetch::<u64>(pair.remote(WORD64 + 4), key, d())
        .unwrap_err();
    assert_eq!(unaligned.kind(), ErrorKind::InvalidArgument);

    // One active message each way, delivered by the peer's progress thread.
    ep.am_send(AM_ID, &[me], b"hello over ucx", d()).unwrap();
    let (header, data) = received
        .recv_timeout(Duration::from_secs(20))
        .expect("an AM");
    assert_eq!(header, vec![1 - me]);
    assert_eq!(data, b"hello over ucx");

    // Each checks its own mapping, as written by the peer.
    pair.world.control().barrier().unwrap();
    let other = 1 - me;
    let mut bytes = [0u8; 8];
    pair.mapping.read(SMALL, &mut bytes);
    assert_eq!(bytes, [0xA0 | other; 8]);
    let mut large_here = vec![0u8; MIB];
    pair.mapping.read(LARGE, &mut large_here);
    assert!(large_here
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (i % 251) as u8 ^ other));
    let mut word = [0u8; 8];
    pair.mapping.read(WORD64, &mut word);
    assert_eq!(u64::from_ne_bytes(word), 2 * big + 5);
    pair.mapping.read(WORD32, &mut word[..4]);
    assert_eq!(u32::from_ne_bytes(word[..4].try_into().unwrap()), 34);
    let _ = &pair.region;

    // Orderly teardown: both close with a flush while both progress threads run.
    let Pair {
        progress,
        rkey,
        endpoint,
        world,
        ..
    } = pair;
    drop(rkey);
    endpoint.close(d()).unwrap();
    world.control().barrier().unwrap();
    drop(progress);
    println!("PE_OK");
}

macro_rules! two_pe_test {
    ($name:ident, $tls:expr, $body:expr) => {
        #[test]
        fn $name() {
            if is_pe() {
                $body();
                return;
            }
            let result = launch(stringify!($name), $tls).wait();
            result.assert_all_succeeded();
            for pe in &result.pes {
                assert_eq!(pe.lines_with("PE_OK").len(), 1, "{}", result.describe());
                for line in pe.stdout.lines().filter(|l| l.starts_with("REPORT ")) {
                    println!("rank {}: {line}", pe.rank);
                }
            }
        }
    };
}

two_pe_test!(
    rma_atomics_and_am_over_tcp,
    Some("tcp,self"),
    rma_atomics_and_am_body
);
two_pe_test!(
    rma_atomics_and_am_over_shared_memory,
    Some("sm,self"),
    rma_atomics_and_am_body
);
two_pe_test!(
    rma_atomics_and_am_with_default_transports,
    None,
    rma_atomics_and_am_body
);

/// Rank 1 (the target) sits in a control-plane barrier — its main thread never calls UCX —
/// while rank 0 gets from and updates its memory; only rank 1's progress thread can serve the
/// AM-emulated operations over TCP.
fn busy_target_body(target_has_progress_thread: bool) {
    // The origin always has its progress thread; the target's is stopped when the test asks.
    let mut pair = connect_pair(true, None);
    if pair.world.rank() == 1 && !target_has_progress_thread {
        pair.progress = None;
    }
    pair.world.control().barrier().unwrap();
    if pair.world.rank() == 1 {
        pair.mapping.write(SMALL, &[42u8; 8]);
        pair.mapping.write(WORD64, &7u64.to_ne_bytes());
        pair.world.control().barrier().unwrap(); // values in place
                                                 // Busy: blocked on the control plane until the origin is done.
        pair.world.control().barrier().unwrap();
        if target_has_progress_thread {
            let mut word = [0u8; 8];
            pair.mapping.read(WORD64, &mut word);
            assert_eq!(u64::from_ne_bytes(word), 8, "the origin's fetch-add landed");
        }
        println!("PE_OK");
        return;
    }
    pair.world.control().barrier().unwrap();
    let ep = &pair.endpoint;
    let started = Instant::now();
    let mut bytes = [0u8; 8];
    let got = ep.get(&mut bytes, pair.remote(SMALL), &pair.rkey, deadline(3));
    if target_has_progress_thread {
        got.unwrap();
        assert_eq!(bytes, [42u8; 8]);
        let old = ep
            .atomic_fetch_add::<u64>(pair.remote(WORD64), &pair.rkey, 1, deadline(3))
            .unwrap();
        assert_eq!(old, 7);
        println!(
            "REPORT BUSY_PEER_GET_AND_FETCH_ADD_US {}",
            started.elapsed().as_micros()
        );
    } else {
        // Nobody serves the request: the deadline ends it, and the endpoint is closed.
        let error = got.expect_err("a get from a peer nobody progresses cannot complete");
        assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
        assert_eq!(error.peer(), Some(1));
        let again = ep.atomic_fetch::<u64>(pair.remote(WORD64), &pair.rkey, deadline(3));
        assert_eq!(again.unwrap_err().kind(), ErrorKind::Timeout);
        println!(
            "REPORT UNSERVED_GET_ENDED_AFTER_MS {}",
            started.elapsed().as_millis()
        );
    }
    pair.world.control().barrier().unwrap();
    println!("PE_OK");
}

two_pe_test!(
    get_from_a_busy_peer_completes_over_tcp,
    Some("tcp,self"),
    || busy_target_body(true)
);
two_pe_test!(
    get_from_a_busy_peer_completes_over_shared_memory,
    Some("sm,self"),
    || { busy_target_body(true) }
);
two_pe_test!(
    get_from_a_peer_nobody_progresses_ends_at_its_deadline,
    Some("tcp,self"),
    || busy_target_body(false)
);

/// Rank 1's main thread progresses its worker itself for a while (its progress thread stands
/// down), then stops and sits in a control-plane barrier: rank 0's get must still complete,
/// served by the progress thread once it saw the callers' progress stop.
fn progress_thread_takes_over_body() {
    let pair = connect_pair(true, None);
    if pair.world.rank() == 1 {
        pair.mapping.write(SMALL, &[24u8; 8]);
        let until = Instant::now() + Duration::from_millis(5);
        let mut calls = 0u64;
        while Instant::now() < until {
            pair.worker.progress();
            calls += 1;
            std::thread::yield_now();
        }
        assert!(calls > 0);
        pair.world.control().barrier().unwrap(); // values in place, the progress stopped
        pair.world.control().barrier().unwrap(); // busy until the origin is done
        println!("PE_OK");
        return;
    }
    pair.world.control().barrier().unwrap();
    let mut bytes = [0u8; 8];
    pair.endpoint
        .get(&mut bytes, pair.remote(SMALL), &pair.rkey, deadline(10))
        .expect("the target's progress thread never took over from its main thread");
    assert_eq!(bytes, [24u8; 8]);
    pair.world.control().barrier().unwrap();
    println!("PE_OK");
}

two_pe_test!(
    progress_thread_serves_again_once_its_caller_stops_progressing,
    Some("tcp,self"),
    progress_thread_takes_over_body
);

/// Rank 1's main thread says it serves its worker (`begin_serving`) and then never progresses
/// it, sitting in control-plane barriers: its progress thread stands down for as long, yet its
/// looks still progress the worker, so rank 0's get completes — a caller that says it serves
/// and is then descheduled (or forgets to end) delays peers by at most a stand-down.
fn serving_caller_that_stalls_body() {
    let pair = connect_pair(true, None);
    if pair.world.rank() == 1 {
        pair.mapping.write(SMALL, &[42u8; 8]);
        pair.worker.begin_serving();
        pair.world.control().barrier().unwrap(); // serving, never progressing
        pair.world.control().barrier().unwrap(); // the origin's get is done
        pair.worker.end_serving(true);
        println!("PE_OK");
        return;
    }
    pair.world.control().barrier().unwrap();
    // The first get may find the target's progress thread armed (it then stands down after
    // serving it); the later ones find it standing down.
    for _ in 0..10 {
        let mut bytes = [0u8; 8];
        pair.endpoint
            .get(&mut bytes, pair.remote(SMALL), &pair.rkey, deadline(10))
            .expect("a target that said it serves, then stalled, left the get unserved");
        assert_eq!(bytes, [42u8; 8]);
    }
    pair.world.control().barrier().unwrap();
    println!("PE_OK");
}

two_pe_test!(
    a_stalled_serving_caller_still_has_its_peers_served,
    Some("tcp,self"),
    serving_caller_that_stalls_body
);

/// Rank 1's main thread serves rank 0's stream of gets with its own looks, hands the worker
/// over (`end_serving(true)`, as a wait that served peers does as it ends) right after its last
/// looks, and then computes, never progressing again; its backstop look is set past the gets'
/// deadline. The gets that follow must all be served by its progress thread: the caller's
/// last looks, only microseconds old at the next get, must not count as a caller still polling
/// (the thread would serve that get, stand down again, and leave the rest unserved).
fn hand_over_after_serving_body() {
    const GETS: usize = 4000;
    let pair = connect_pair(true, None);
    let plane = pair.world.control();
    if pair.world.rank() == 1 {
        pair.worker.set_look_backstop(Duration::from_secs(60));
        pair.mapping.write(SMALL, &[44u8; 8]);
        pair.worker.begin_serving();
        plane.barrier().unwrap(); // rank 0 starts its gets
        let until = Instant::now() + Duration::from_millis(5);
        while Instant::now() < until {
            pair.worker.progress();
            std::thread::yield_now();
        }
        // Back to back, so that one of them records the time (every 16th call does).
        for _ in 0..16 {
            pair.worker.progress();
        }
        pair.worker.end_serving(true);
        plane.barrier().unwrap(); // computing until the origin's gets are done
        println!("PE_OK");
        return;
    }
    plane.barrier().unwrap();
    for get in 0..GETS {
        let mut bytes = [0u8; 8];
        pair.endpoint
            .get(&mut bytes, pair.remote(SMALL), &pair.rkey, deadline(5))
            .unwrap_or_else(|error| {
                panic!(
                    "get {get} of {GETS}: the target handed over, then left it unserved: {error}"
                )
            });
        assert_eq!(bytes, [44u8; 8]);
    }
    plane.barrier().unwrap();
    println!("PE_OK");
}

two_pe_test!(
    a_hand_over_right_after_serving_keeps_the_progress_thread_serving,
    Some("tcp,self"),
    hand_over_after_serving_body
);

/// As [`serving_caller_that_stalls_body`], with the transport's wiring of slow requests: rank
/// 0's worker asks rank 1 over the control plane to serve once a get has waited
/// [`SLOW_REQUEST`], and rank 1's plane hands the request to its worker (`serve_now`), so its
/// standing-down progress thread takes over at once: rank 1's backstop look is set past the
/// gets' deadline, so nothing else serves them. Both sides count too: rank 0 must have asked,
/// and rank 1 must have heard.
fn serve_request_body() {
    use crate::control::Progress;
    use std::sync::atomic::AtomicUsize;

    /// Rank 1's spin work: a caller that never progresses, and counts the requests it hears.
    struct Stalled(Worker, Arc<AtomicUsize>);
    impl Progress for Stalled {
        fn progress(&self) -> usize {
            0
        }
        fn begin_serving(&self) {}
        fn end_serving(&self, _hand_over: bool) {}
        fn serve_requested(&self) {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.serve_now();
        }
    }

    let pair = connect_pair(true, None);
    let plane = pair.world.control();
    if pair.world.rank() == 1 {
        // Past the gets' deadline: only the requests can have the thread serve them.
        pair.worker.set_look_backstop(Duration::from_secs(60));
        let heard = Arc::new(AtomicUsize::new(0));
        let _work =
            plane.while_spinning(Arc::new(Stalled(pair.worker.clone(), Arc::clone(&heard))));
        pair.mapping.write(SMALL, &[43u8; 8]);
        pair.worker.begin_serving();
        plane.barrier().unwrap(); // serving, never progressing
        plane.barrier().unwrap(); // the origin's gets are done
        pair.worker.end_serving(true);
        assert!(
            heard.load(Ordering::SeqCst) > 0,
            "rank 0 asked to be served, but no request reached this worker"
        );
        println!("PE_OK");
        return;
    }
    let asked = Arc::new(AtomicUsize::new(0));
    let requester = plane.serve_requester().expect("two ranks");
    let counting = Arc::clone(&asked);
    pair.worker
        .on_slow_request(move |peer| {
            counting.fetch_add(1, Ordering::SeqCst);
            requester.request(peer.expect("a get waits for one peer"), SLOW_REQUEST);
            false
        })
        .unwrap();
    plane.barrier().unwrap();
    // The first get may find the target's progress thread armed; after serving it, the thread
    // stands down, as its caller says it serves: the later gets need the requests.
    for _ in 0..10 {
        let mut bytes = [0u8; 8];
        pair.endpoint
            .get(&mut bytes, pair.remote(SMALL), &pair.rkey, deadline(10))
            .expect("a target asked to serve left the get unserved");
        assert_eq!(bytes, [43u8; 8]);
    }
    assert!(
        asked.load(Ordering::SeqCst) > 0,
        "no get waited long enough to ask the target to serve"
    );
    plane.barrier().unwrap();
    println!("PE_OK");
}

two_pe_test!(
    a_peer_asked_to_serve_takes_over_from_its_stalled_caller,
    Some("tcp,self"),
    serve_request_body
);

/// The message rank 0's process must die with in [`panic_in_a_wait_body`].
const UNWIND_ABORT: &str = "a panic unwound out of the wait for a UCX ucx get";

/// Rank 0 gets from rank 1, whose caller says it serves but never progresses and whose progress
/// thread stands down past the gets' deadline, so a get waits; its slow-request hook panics.
/// UCX still holds the get's destination (this frame's stack): the process must abort, not
/// unwind and hand that memory back. Rank 1 then sees rank 0 lost.
fn panic_in_a_wait_body() {
    let pair = connect_pair(true, None);
    let plane = pair.world.control();
    if pair.world.rank() == 1 {
        pair.worker.set_look_backstop(Duration::from_secs(60));
        pair.worker.begin_serving();
        plane.barrier().unwrap(); // serving, never progressing
        let lost = plane.barrier(); // rank 0 aborts in its get
        pair.worker.end_serving(true);
        assert!(lost.is_err(), "rank 0 was to abort in its get");
        println!("PE_OK");
        return;
    }
    pair.worker
        .on_slow_request(|_| -> bool { panic!("a slow-request hook that fails") })
        .unwrap();
    plane.barrier().unwrap();
    // The first get may find the target's progress thread asleep armed, from the wire-up
    // traffic (it serves that get, then stands down: 4 runs in 40 did); the second finds it
    // standing down, and waits.
    for get in 1..=2 {
        let mut bytes = [0u8; 8];
        let outcome = pair
            .endpoint
            .get(&mut bytes, pair.remote(SMALL), &pair.rkey, deadline(10));
        println!("get {get} returned {outcome:?} instead of aborting");
    }
}

#[test]
fn a_panic_in_a_wait_aborts_rather_than_hand_back_memory_ucx_may_use() {
    if is_pe() {
        panic_in_a_wait_body();
        return;
    }
    let result = launch(
        "a_panic_in_a_wait_aborts_rather_than_hand_back_memory_ucx_may_use",
        Some("tcp,self"),
    )
    .wait();
    let origin = result.pe(0);
    assert_eq!(
        origin.status.signal(),
        Some(libc::SIGABRT),
        "{}",
        result.describe()
    );
    assert!(
        origin.stderr.contains(UNWIND_ABORT),
        "{}",
        result.describe()
    );
    assert_eq!(
        result.pe(1).lines_with("PE_OK").len(),
        1,
        "{}",
        result.describe()
    );
}

/// Rank 1's main thread sits in a control-plane barrier while rank 0 adds to a word of its
/// memory with a non-fetching atomic, flushed: rank 1's progress hook must run after UCX
/// applied it (on the progress thread), with the new value already visible to the hook. A
/// second hook is refused.
fn progress_hook_body() {
    let pair = connect_pair(true, None);
    let rank = pair.world.rank();
    if rank == 1 {
        pair.mapping.write(WORD64, &5u64.to_ne_bytes());
        let mapping = Arc::clone(&pair.mapping);
        let (sender, seen) = mpsc::channel();
        pair.worker
            .on_progress(move || {
                let mut word = [0u8; 8];
                mapping.read(WORD64, &mut word);
                let _ = sender.send(u64::from_ne_bytes(word));
            })
            .unwrap();
        let again = pair.worker.on_progress(|| {}).unwrap_err();
        assert_eq!(again.kind(), ErrorKind::InvalidState, "{again}");
        pair.world.control().barrier().unwrap(); // hook in place
        pair.world.control().barrier().unwrap(); // rank 0's add flushed
        let until = deadline(60);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let value = seen
                .recv_timeout(left)
                .expect("the progress hook never ran with the peer's add applied");
            if value == 8 {
                break;
            }
        }
    } else {
        pair.world.control().barrier().unwrap();
        pair.endpoint
            .atomic_add::<u64>(pair.remote(WORD64), &pair.rkey, 3, deadline(10))
            .unwrap();
        pair.endpoint.flush(deadline(10)).unwrap();
        pair.world.control().barrier().unwrap();
    }
    pair.world.control().barrier().unwrap();
    println!("PE_OK");
}

two_pe_test!(
    progress_hook_sees_a_peer_atomic_over_tcp,
    Some("tcp,self"),
    progress_hook_body
);

/// A worker flush completes what only a flush completes at the peer — a put, a posted atomic —
/// and returns at once when nothing was issued since the last flush that completed. Over TCP the peer's progress applies every operation, so with rank 1 stopped
/// (SIGSTOP) a flush with nothing issued returns Ok, and one after each of those operations
/// ends at its deadline; continued, rank 1 completes them and the next flush returns Ok.
fn flush_waits_for_what_was_issued_body() {
    use rustix::process::{kill_process, Pid, Signal};
    let pair = connect_pair(true, None);
    let rank = pair.world.rank();
    if rank == 1 {
        pair.mapping
            .write(SMALL, &u64::from(std::process::id()).to_ne_bytes());
    }
    pair.world.control().barrier().unwrap(); // rank 1's process ID written
    if rank == 0 {
        let mut pid = [0u8; 8];
        pair.endpoint
            .get(&mut pid, pair.remote(SMALL), &pair.rkey, deadline(10))
            .unwrap();
        let pid = i32::try_from(u64::from_ne_bytes(pid)).unwrap();
        let peer = Pid::from_raw(pid).expect("rank 1's process ID");
        let short = || Instant::now() + Duration::from_millis(300);
        let issue: [(&str, &dyn Fn()); 2] = [
            ("a put", &|| {
                pair.endpoint
                    .put(&[1u8; 8], pair.remote(SMALL), &pair.rkey, deadline(10))
                    .unwrap();
            }),
            ("a posted atomic add", &|| {
                pair.endpoint
                    .atomic_add::<u64>(pair.remote(WORD64), &pair.rkey, 1, deadline(10))
                    .unwrap();
            }),
        ];
        for (what, issue) in issue {
            kill_process(peer, Signal::STOP).unwrap();
            hm_testkit::wait_until_stopped(pid);
            pair.worker
                .flush(short())
                .unwrap_or_else(|e| panic!("a flush with nothing issued, before {what}: {e}"));
            issue();
            let outcome = pair.worker.flush(short());
            kill_process(peer, Signal::CONT).unwrap();
            let error = outcome.expect_err(&format!(
                "the flush after {what} returned while its target was stopped"
            ));
            assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
            pair.worker
                .flush(deadline(10))
                .unwrap_or_else(|e| panic!("the flush after {what}, target continued: {e}"));
        }
    }
    pair.world.control().barrier().unwrap();
    println!("PE_OK");
}

two_pe_test!(
    a_flush_waits_for_what_was_issued_over_tcp,
    Some("tcp,self"),
    flush_waits_for_what_was_issued_body
);

/// Rank 1 kills itself with SIGKILL after the exchange; rank 0's operations on its endpoint must
/// end with an error (PeerLost or Backend) within their deadline.
fn killed_peer_body() {
    let pair = connect_pair(true, None);
    pair.world.control().barrier().unwrap();
    if pair.world.rank() == 1 {
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        std::thread::sleep(Duration::from_secs(60));
        unreachable!("SIGKILL did not kill");
    }
    let started = Instant::now();
    let give_up = started + Duration::from_secs(30);
    let mut bytes = [0u8; 8];
    // Shared memory gives no peer-failure detection in UCX 1.13: there the deadline ends it.
    let wait = if pair.endpoint.detects_peer_failure() {
        10
    } else {
        3
    };
    println!(
        "REPORT DETECTS_PEER_FAILURE {}",
        pair.endpoint.detects_peer_failure()
    );
    let error = loop {
        let outcome = pair
            .endpoint
            .get(&mut bytes, pair.remote(SMALL), &pair.rkey, deadline(wait))
            .and_then(|()| pair.endpoint.flush(deadline(wait)));
        match outcome {
            Ok(()) => {
                assert!(
                    Instant::now() < give_up,
                    "operations kept succeeding on a dead peer"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => break error,
        }
    };
    println!(
        "REPORT DEAD_PEER_ERROR_AFTER_MS {} {error}",
        started.elapsed().as_millis()
    );
    assert!(
        matches!(
            error.kind(),
            ErrorKind::PeerLost | ErrorKind::Backend | ErrorKind::Timeout
        ),
        "{error}"
    );
    // Every later operation fails too (speed is not asserted: benchmarks measure it).
    let again = pair
        .endpoint
        .atomic_fetch::<u64>(pair.remote(WORD64), &pair.rkey, deadline(10));
    assert!(again.is_err());
    println!("PE_OK");
}

macro_rules! killed_peer_test {
    ($name:ident, $tls:expr) => {
        #[test]
        fn $name() {
            if is_pe() {
                killed_peer_body();
                return;
            }
            let result = launch(stringify!($name), $tls).wait();
            let origin = result.pe(0);
            assert!(origin.status.success(), "{}", result.describe());
            assert_eq!(origin.lines_with("PE_OK").len(), 1, "{}", result.describe());
            assert!(!result.pe(1).status.success(), "rank 1 was to be killed");
            for line in origin.stdout.lines().filter(|l| l.starts_with("REPORT ")) {
                println!("rank 0: {line}");
            }
        }
    };
}

killed_peer_test!(a_killed_peer_fails_operations_over_tcp, Some("tcp,self"));
killed_peer_test!(
    a_killed_peer_fails_operations_over_shared_memory,
    Some("sm,self")
);

/// One process, an endpoint to its own worker (UCX's `self` transport): the local accessors,
/// the worker's sleep/arm interface and non-blocking completion.
fn loopback_round() {
    let context = Context::new().expect("context");
    assert!(!Context::version().expect("libucp loads").is_empty());
    let worker = Worker::new(&context).expect("worker");
    assert!(worker.max_am_header() > 0);
    let region = MemoryRegion::allocate(&context, 64 << 10).expect("allocate");
    assert!(region.len() >= 64 << 10 && !region.is_empty());
    region.write(0, b"local bytes");
    let endpoint = worker
        .connect(&worker.address().unwrap(), 0)
        .expect("connect to self");
    assert!(endpoint.failure().is_none());
    assert_eq!(endpoint.peer(), 0);
    let key = endpoint.unpack_rkey(region.rkey_bytes()).expect("unpack");
    let mut read = [0u8; 11];
    endpoint
        .get(&mut read, region.base(), &key, deadline(10))
        .unwrap();
    assert_eq!(&read, b"local bytes");
    let request = endpoint
        .put_nb(b"via request".to_vec(), region.base() + 100, &key)
        .unwrap();
    let until = deadline(10);
    while !request.is_complete() {
        assert!(Instant::now() < until, "a loopback put did not complete");
        std::thread::yield_now();
    }
    assert_eq!(request.wait(deadline(10)).unwrap(), b"via request");
    worker.fence().unwrap();
    endpoint.flush(deadline(10)).unwrap();
    region.read(100, &mut read);
    assert_eq!(&read, b"via request");
    // Arm until nothing is pending, then the event fd is a valid descriptor to sleep on.
    let until = deadline(10);
    while !worker.arm().unwrap() {
        while worker.progress() != 0 {}
        assert!(Instant::now() < until, "the worker never armed");
    }
    assert!(rustix::fs::fstat(worker.event_fd()).is_ok());
    drop(key);
    endpoint.close(deadline(10)).unwrap();
}

/// Runs `body` alone in a child process (thread and descriptor counts are process-wide, and the
/// test harness runs other tests on other threads).
fn in_own_process(name: &str, body: impl FnOnce()) {
    if is_pe() {
        body();
        println!("PE_OK");
        return;
    }
    let result = Job::launch(&path(name), 1).wait();
    result.assert_all_succeeded();
    assert_eq!(
        result.pe(0).lines_with("PE_OK").len(),
        1,
        "{}",
        result.describe()
    );
    for line in result
        .pe(0)
        .stdout
        .lines()
        .filter(|l| l.starts_with("REPORT "))
    {
        println!("{line}");
    }
}

#[test]
fn loopback_endpoint_works_and_teardown_leaves_no_threads_or_descriptors() {
    in_own_process(
        "loopback_endpoint_works_and_teardown_leaves_no_threads_or_descriptors",
        loopback_without_leaks,
    );
}

fn loopback_without_leaks() {
    let pristine = (hm_testkit::thread_count(), hm_testkit::open_fds());
    // The first round lets UCX set up its process-wide state (logging, memory hooks).
    loopback_round();
    let (threads, fds) = (hm_testkit::thread_count(), hm_testkit::open_fds());
    println!(
        "REPORT threads/fds before any UCX {pristine:?}, after the first context {:?}",
        (threads, fds)
    );
    for _ in 0..3 {
        loopback_round();
    }
    assert_eq!(hm_testkit::open_fds(), fds, "descriptors leaked");
    assert_eq!(
        hm_testkit::thread_count_settled(threads),
        threads,
        "threads leaked"
    );
}

#[test]
fn progress_thread_stops_and_joins_on_drop() {
    in_own_process(
        "progress_thread_stops_and_joins_on_drop",
        progress_thread_cycles,
    );
}

fn progress_thread_cycles() {
    let context = Context::new().expect("context");
    let worker = Worker::new(&context).expect("worker");
    let before = (hm_testkit::thread_count(), hm_testkit::open_fds());
    for _ in 0..5 {
        let thread = worker.start_progress_thread().expect("start");
        drop(thread);
    }
    let threads = hm_testkit::thread_count_settled(before.0);
    assert_eq!((threads, hm_testkit::open_fds()), before);
}

/// Not a timed assertion: prints median latencies (µs) of 8 B put + flush, 8 B get and u64
/// fetch-add from rank 0 to rank 1, whose main thread waits in a control-plane barrier (its
/// progress thread serves). `HM_UCX_BENCH_ITERS` sets the sample count (default 200).
fn latency_body() {
    let pair = connect_pair(true, None);
    pair.world.control().barrier().unwrap();
    if pair.world.rank() == 0 {
        let iterations: usize = std::env::var("HM_UCX_BENCH_ITERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200);
        let ep = &pair.endpoint;
        let key = &pair.rkey;
        let mut bytes = [0u8; 8];
        let measure = |name: &str, op: &mut dyn FnMut()| {
            for _ in 0..iterations / 10 + 10 {
                op(); // warm-up: connection set-up, caches
            }
            let mut samples: Vec<f64> = (0..iterations)
                .map(|_| {
                    let started = Instant::now();
                    op();
                    started.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            samples.sort_by(f64::total_cmp);
            let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
            println!(
                "REPORT {} {name}: median {:.1} us (p10 {:.1}, p90 {:.1}, n {})",
                std::env::var("HM_TEST_UCX_TLS_LABEL").unwrap_or_default(),
                at(0.5),
                at(0.1),
                at(0.9),
                samples.len()
            );
        };
        measure("put 8 B + flush", &mut || {
            ep.put(&[1u8; 8], pair.remote(SMALL), key, deadline(10))
                .unwrap();
            ep.flush(deadline(10)).unwrap();
        });
        measure("get 8 B", &mut || {
            ep.get(&mut bytes, pair.remote(SMALL), key, deadline(10))
                .unwrap();
        });
        measure("fetch-add u64", &mut || {
            ep.atomic_fetch_add::<u64>(pair.remote(WORD64), key, 1, deadline(10))
                .unwrap();
        });
    }
    pair.world.control().barrier().unwrap();
    println!("PE_OK");
}

two_pe_test!(latency_report_over_tcp, Some("tcp,self"), latency_body);
two_pe_test!(
    latency_report_over_shared_memory,
    Some("sm,self"),
    latency_body
);
two_pe_test!(latency_report_with_default_transports, None, latency_body);

#[test]
fn lane_lists_tell_what_the_devices_do_from_what_the_target_emulates() {
    let tcp = "#\n# UCP endpoint\n#\n#   lane[0]:  2:tcp/lo.0 md[1]  -> md[1]/tcp/sysdev[255] am \
               am_bw#0 keepalive wireup\n#\n#   am_send: 0..<egr/short>..8185..(inf)\n\
               #\n#                  rma_bw: mds rndv_rkey_size 9\n";
    let shared = "#   lane[0]:  1:sysv/memory.0 md[1] -> md[1]/sysv/sysdev[255] amo#0 am am_bw#0\n\
                  #   lane[1]:  3:cma/memory.0 md[3]  -> md[3]/cma/sysdev[255] rma_bw#0\n";
    let device =
        "#   lane[1]:  8:rc_mlx5/mlx5_0:1 md[4] -> md[4]/ib/sysdev[255] rma_bw#0 amo wireup\n";
    let rma_only =
        "#   lane[0]:  1:tcp/lo.0 md[1] -> md[1] am\n#   lane[1]:  2:x md[2] -> md[2] rma#0\n";
    assert_eq!(
        Lanes::listed_in(tcp),
        Lanes {
            device_rma: false,
            device_atomics: false,
            one_message_lane: true,
        }
    );
    // Two TCP devices: the large messages' fragments may take either lane.
    let two_devices = "#   lane[0]:  2:tcp/lo.0 md[1] -> md[1] am am_bw#0 wireup\n\
                       #   lane[1]:  3:tcp/eth0 md[1] -> md[1] am_bw#1\n";
    let lanes = Lanes::listed_in(two_devices);
    assert!(lanes.all_by_target_progress() && !lanes.one_message_lane);
    assert!(Lanes::listed_in(tcp).all_by_target_progress());
    for (text, rma, atomics) in [
        (shared, true, true),
        (device, true, true),
        (rma_only, true, false),
    ] {
        let lanes = Lanes::listed_in(text);
        assert_eq!(
            (lanes.device_rma, lanes.device_atomics),
            (rma, atomics),
            "{text}"
        );
        assert!(!lanes.all_by_target_progress());
    }
    // A usage name that merely starts like one (or text outside a lane line) is not a lane's.
    let lookalikes =
        Lanes::listed_in("#   lane[0]: 2:tcp/lo.0 md[1] -> md[1] amount rmax am\n# amo#0 rma\n");
    assert!(lookalikes.all_by_target_progress());
}

#[test]
fn the_library_variable_is_the_configured_one() {
    assert_eq!(crate::config::UCX_LIBRARY, ffi::LIBRARY_VARIABLE);
}
