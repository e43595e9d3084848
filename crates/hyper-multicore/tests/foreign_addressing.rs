//! What fronts addressing the heap by raw address use (`shmem/foreign.rs`): `heap_address`,
//! `wait_words` over several words of this PE (woken by peers' atomics, ended by a lost peer,
//! refusing words that are not naturally aligned single words), `wait_word` on one located word,
//! and the refusal of a misaligned word by every atomic entry.

use hm_testkit::{is_pe, start_runtime, Job, Options};
use hyper_multicore::config::TRANSPORT;
use hyper_multicore::shmem::{AtomicOp, Comparison, Region, SignalOp, Symmetric};
use hyper_multicore::ErrorKind;

const HEAP: Option<u64> = Some(8 << 20);

/// A region as a symmetric `u64` (the checked entries take `impl Symmetric`).
struct Word(Region);

impl Symmetric<u64> for Word {
    fn region(&self) -> Region {
        self.0
    }
}

/// The one-word regions of `flags`.
fn words(flags: &impl Symmetric<u64>) -> Vec<Region> {
    let region = flags.region();
    (0..flags.len() as u64)
        .map(|i| Region {
            heap_offset: region.heap_offset + 8 * i,
            bytes: 8,
            ..region
        })
        .collect()
}

fn waits_over_several_words() {
    let (_world, shmem) = start_runtime(HEAP).unwrap();
    let flags = shmem.allocate::<u64>(4, None).unwrap();
    shmem.put(&flags, &[0; 4], shmem.rank()).unwrap();
    shmem.barrier().unwrap();
    // The heap starts at heap_address here: an allocation is at its offset from it.
    let own = shmem.ptr(&flags, shmem.rank()).unwrap().as_ptr() as usize;
    assert_eq!(
        own,
        shmem.heap_address() + flags.region().heap_offset as usize
    );

    let me = shmem.rank();
    let peer = 1 - me;
    let regions = words(&flags);
    // Each PE sets word 2 and then word 0 of its peer; each waits for both, then for any.
    let word = |i: usize| flags.view(i..i + 1).unwrap();
    shmem.atomic_set(&word(2), 5u64, peer).unwrap();
    shmem.atomic_fetch_add(&word(0), 7u64, peer).unwrap();
    shmem
        .wait_words::<u64>("wait all", &regions, |v| v[0] == 7 && v[2] == 5, None)
        .unwrap();
    let mut seen = Vec::new();
    shmem
        .wait_words::<u64>(
            "wait any",
            &regions,
            |v| {
                seen = v.to_vec();
                v.contains(&5)
            },
            None,
        )
        .unwrap();
    assert_eq!(seen, [7, 0, 5, 0]);

    // A word that is not one naturally aligned u64 is refused, naming the call.
    let odd = Region {
        heap_offset: regions[0].heap_offset + 4,
        ..regions[0]
    };
    let error = shmem
        .wait_words::<u64>("wait odd", &[odd], |_| true, None)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert!(error.to_string().contains("wait odd"), "{error}");

    // One located word: wait_word returns the value that satisfied it.
    let at = shmem.locate_region("locate", regions[2]).unwrap();
    let seen = shmem
        .wait_word::<u64>("wait one", &at, 4, Comparison::Gt, None)
        .unwrap();
    assert_eq!(seen, 5);

    // A word 4 bytes into the allocation: inside it, but not naturally aligned. Every entry
    // refuses it naming the alignment (the located ones did not check it and panicked).
    let odd_at = shmem.locate_region("locate", odd).unwrap();
    let refusals = [
        shmem.atomic_fetch_add(&Word(odd), 1u64, peer).map(drop),
        shmem.signal(&Word(odd), 1u64, SignalOp::Set, peer),
        shmem
            .atomic_located(&odd_at, AtomicOp::FetchAdd(1u64), peer)
            .map(drop),
        shmem.signal_located(&odd_at, 1u64, SignalOp::Add, peer),
        shmem
            .wait_word::<u64>("wait odd one", &odd_at, 0, Comparison::Ge, None)
            .map(drop),
    ];
    for refusal in refusals {
        let error = refusal.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
        assert!(
            error.to_string().contains("not naturally aligned"),
            "{error}"
        );
    }

    // A wait nobody ends: the peer dies, and the wait ends with a peer-lost error.
    shmem.barrier().unwrap();
    if me == 1 {
        std::process::exit(0);
    }
    let error = shmem
        .wait_words::<u64>("wait forever", &regions[1..2], |v| v[0] == 1, None)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::PeerLost, "{error}");
    println!("LOST {error}");
}

#[test]
fn wait_words_over_several_words_and_a_lost_peer() {
    if is_pe() {
        return waits_over_several_words();
    }
    let result = Job::launch(stringify!(wait_words_over_several_words_and_a_lost_peer), 2).wait();
    result.assert_all_succeeded();
    assert_eq!(result.pe(0).lines_with("LOST").len(), 1);
}

#[test]
fn wait_words_over_ucx() {
    if is_pe() {
        return waits_over_several_words();
    }
    let result = Job::launch_with(
        stringify!(wait_words_over_ucx),
        2,
        Options::default().env(TRANSPORT, "ucx"),
    )
    .wait();
    result.assert_all_succeeded();
    assert_eq!(result.pe(0).lines_with("LOST").len(), 1);
}
