//! The cross-rank argument check of collective allocate and free: each PE publishes its call
//! (sequence number, kind, arguments) in its double-buffered argument slot in shared memory, one
//! shared-memory barrier, then every PE reads every slot and compares — so arguments that differ
//! across ranks fail on every rank alike, and nothing is allocated or freed.
//!
//! The slots are protocol words like the barrier's: they go through [`crate::primitive`], and a
//! loom model below checks the double buffering (a fast PE publishing its next call never
//! overwrites a slot a slow PE is still reading).

use super::allocation::{AllocationId, Dtype};
use super::runtime::{Heap, Shmem};
use crate::error::{ErrorKind, Result};
use crate::transport::segment::Segment;

/// Every rank's words of one exchange: still in the argument slots (one host: read where they
/// lie, so the common all-equal check copies nothing), or gathered over the control plane.
/// With two PEs, the other's words usually came with the barrier (`carried`, see
/// [`Shmem::data_barrier_carrying`]): read from the cache line the barrier's wait brought in,
/// instead of from the other PE's slot.
enum CallWords<'a> {
    Slots {
        segment: &'a Segment,
        slot: usize,
        carried: Option<(usize, [u64; 4])>,
    },
    Gathered(Vec<[u64; 4]>),
}

impl CallWords<'_> {
    /// The words rank `pe` published.
    fn of(&self, pe: usize) -> [u64; 4] {
        match self {
            CallWords::Slots {
                carried: Some((from, words)),
                ..
            } if *from == pe => *words,
            CallWords::Slots { segment, slot, .. } => segment.pe_words(pe).arguments.read(*slot),
            CallWords::Gathered(all) => all[pe],
        }
    }
}

impl Shmem {
    /// Collective: every rank's `stamped` words (call number first) — through the argument
    /// slots and one shared-memory barrier on one host, else over the control plane. The heap
    /// lock is held: the sequence of these exchanges is the heap's.
    fn exchange_call_words(
        &self,
        heap: &mut Heap,
        operation: &str,
        stamped: [u64; 4],
    ) -> Result<CallWords<'_>> {
        if !self.transport.single_group() {
            // The argument slots are not shared by every rank: over the control plane.
            return self
                .gather_call_words(operation, stamped)
                .map(CallWords::Gathered);
        }
        let slot = (heap.checks % 2) as usize;
        self.transport
            .own_pe_words()
            .arguments
            .publish(slot, stamped);
        self.data_barrier_carrying(operation, Some(&stamped))?;
        // The call number tags the carried words (it is never 0); they may have been replaced
        // by the other PE's next call already, its slot not: a slot stays as published until
        // this PE has joined the next exchange's barrier.
        Ok(CallWords::Slots {
            segment: &self.segment,
            slot,
            carried: self.transport.carried(stamped[0]),
        })
    }

    /// Collective: every rank's three `words`, in rank order (a small agreement that needs no
    /// round over the root's channel: one shared-memory barrier on one host). Fails on every
    /// rank alike if some rank is in another collective heap call.
    pub(crate) fn exchange_words(&self, operation: &str, words: [u64; 3]) -> Result<Vec<[u64; 3]>> {
        let mut heap = self.heap.lock();
        heap.checks += 1;
        let stamped = [heap.checks, words[0], words[1], words[2]];
        let published = self.exchange_call_words(&mut heap, operation, stamped)?;
        let all: Vec<[u64; 4]> = (0..self.size).map(|pe| published.of(pe)).collect();
        if let Some(pe) = all.iter().position(|w| w[0] != heap.checks) {
            return Err(self.error(
                ErrorKind::InvalidArgument,
                operation,
                format!(
                    "root rank {pe} is in a different collective (call #{} instead of #{}); \
                     every rank must make the same collective calls in the same order",
                    all[pe][0], heap.checks
                ),
            ));
        }
        Ok(all.iter().map(|w| [w[1], w[2], w[3]]).collect())
    }

    /// Publishes this rank's `call`, waits for every rank, and compares: every rank reads the
    /// same slots, so a mismatch fails everywhere alike (and nothing is allocated or freed).
    pub(crate) fn check_same_call(
        &self,
        heap: &mut Heap,
        operation: &str,
        call: HeapCall,
    ) -> Result<()> {
        heap.checks += 1;
        let stamped = call.encode(heap.checks);
        let published = self.exchange_call_words(heap, operation, stamped)?;
        if (0..self.size).all(|pe| published.of(pe) == stamped) {
            return Ok(());
        }
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (pe, words) in (0..self.size).map(|pe| (pe, published.of(pe))) {
            let described = if words[0] == heap.checks {
                HeapCall::describe(&words)
            } else {
                format!(
                    "a different collective (call #{} instead of #{})",
                    words[0], heap.checks
                )
            };
            match groups.iter_mut().find(|(c, _)| *c == described) {
                Some((_, ranks)) => ranks.push(pe),
                None => groups.push((described, vec![pe])),
            }
        }
        let listing: Vec<String> = groups
            .iter()
            .map(|(call, ranks)| format!("root ranks {ranks:?} called {call}"))
            .collect();
        Err(self.error(
            ErrorKind::InvalidArgument,
            operation,
            format!(
                "arguments differ across ranks: {}; every rank must make the same allocate and \
                 free calls in the same order (nothing was allocated or freed)",
                listing.join(", ")
            ),
        ))
    }
}

/// A collective heap call, as published for the cross-rank argument check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeapCall {
    Allocate {
        bytes: u64,
        alignment: u64,
        dtype: Dtype,
    },
    Free(AllocationId),
}

impl HeapCall {
    const ALLOCATE: u64 = 1;
    const FREE: u64 = 2;

    /// Four words: call number, kind (high byte) and dtype, then two arguments.
    fn encode(self, sequence: u64) -> [u64; 4] {
        match self {
            HeapCall::Allocate {
                bytes,
                alignment,
                dtype,
            } => {
                let dtype = Dtype::ALL.iter().position(|d| *d == dtype).unwrap_or(0) as u64;
                [sequence, Self::ALLOCATE << 56 | dtype, bytes, alignment]
            }
            HeapCall::Free(id) => [sequence, Self::FREE << 56, id.index, id.generation],
        }
    }

    /// Words published by some rank, described for an error message.
    fn describe(words: &[u64; 4]) -> String {
        match words[1] >> 56 {
            Self::ALLOCATE => {
                let dtype = Dtype::ALL
                    .get((words[1] & 0xff) as usize)
                    .map_or("?", |d| d.name());
                format!(
                    "allocate({} bytes of {dtype}, alignment {})",
                    words[2], words[3]
                )
            }
            Self::FREE => format!(
                "free(allocation {} of generation {:#x})",
                words[2], words[3]
            ),
            _ => "an unknown heap call".into(),
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! The double-buffered argument slots and the words carried with the barrier, under every
    //! interleaving of two PEs making three collective calls in a row: each PE must read, for
    //! call `n`, the other PE's words of call `n` — a fast PE's call `n + 1` goes to the other
    //! slot, and its call `n + 2` cannot start before the slow PE left call `n` (it waits in
    //! call `n + 1`'s barrier); its call `n + 1` may overwrite the carried words, which the
    //! slow PE must then notice and read from the slot instead.
    //!
    //! `RUSTFLAGS="--cfg loom" cargo test -p hyper-multicore --lib --release loom_tests`

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use loom::sync::Arc;
    use loom::thread;

    use crate::sys::segment_words::ArgumentSlots;
    use crate::transport::sync::{
        dissemination_barrier, AbortWord, BarrierWords, Deadline, TestWords, WaitPolicy,
    };

    /// Some interleaving read the carried words, and some had to read the slot.
    static READ_CARRIED: AtomicBool = AtomicBool::new(false);
    static READ_SLOT: AtomicBool = AtomicBool::new(false);

    struct Header {
        barrier: TestWords,
        abort: AbortWord,
        slots: [ArgumentSlots; 2],
    }

    /// PE `pe`'s words of call `call` (each PE's differ, so a mix-up shows).
    fn words(pe: usize, call: u64) -> [u64; 4] {
        [call, 1 << 56, call * 10 + pe as u64, 64]
    }

    fn pe(header: &Header, me: usize) {
        let policy = WaitPolicy {
            spin: false,
            deadline: Deadline::After(Duration::from_secs(3600)),
        };
        let other = 1 - me;
        for call in 1..=3u64 {
            let slot = (call % 2) as usize;
            let mine = words(me, call);
            header.slots[me].publish(slot, mine);
            let epoch = call as u32;
            let outcome = dissemination_barrier(
                &header.barrier,
                me,
                2,
                epoch,
                &header.abort,
                &policy,
                Some(&mine),
            );
            assert_eq!(outcome, Ok(()));
            let theirs = match header.barrier.flags(me).carried(call) {
                Some(carried) => {
                    READ_CARRIED.store(true, Ordering::Relaxed);
                    carried
                }
                None => {
                    READ_SLOT.store(true, Ordering::Relaxed);
                    header.slots[other].read(slot)
                }
            };
            assert_eq!(theirs, words(other, call), "call {call}, PE {me}");
            assert_eq!(header.slots[me].read(slot), mine, "call {call}, PE {me}");
        }
    }

    #[test]
    fn loom_argument_slots_two_pes_three_calls() {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(2);
        }
        builder.check(|| {
            let header = Arc::new(Header {
                barrier: TestWords::new(2),
                abort: AbortWord::new(),
                slots: [ArgumentSlots::new(), ArgumentSlots::new()],
            });
            let peer = {
                let header = header.clone();
                thread::spawn(move || pe(&header, 1))
            };
            pe(&header, 0);
            peer.join().unwrap();
        });
        assert!(
            READ_CARRIED.load(Ordering::Relaxed),
            "no run read carried words"
        );
        assert!(
            READ_SLOT.load(Ordering::Relaxed),
            "no run had to read a slot"
        );
    }
}
