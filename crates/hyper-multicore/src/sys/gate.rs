//! A cell read through a gate ([`Gated`]: the lifecycle's runtime, which guarded calls use):
//! entering costs two stores to this thread's own slot and one load of the gate word, no
//! lock-prefixed instruction (an `RwLock` read lock costs two, and they were most of the guarded
//! path's overhead on an 8-byte put).
//!
//! The gate word ([`GateWord`]) also carries its owner's holds (the lifecycle's: the process is
//! invalidated, a shared root manages the heap), so one load admits a call when the word is
//! zero. Any bit set sends the call to the general entry ([`Gated::enter`]), after the owner has
//! checked its holds itself.
//!
//! The protocol is an asymmetric Dekker handshake:
//!
//! ```text
//! reader (guarded call)                  writer (acquire, release, restart, invalidate)
//!   slot += 1                              take the RwLock's write lock
//!   compiler fence                         gate = closed
//!   if gate open: use the runtime          membarrier(PRIVATE_EXPEDITED)  (a full fence on
//!   else: slot -= 1, take the read lock       every thread of the process)
//!   slot -= 1 (release)                    wait until every thread's slot is 0 (acquire)
//!                                          … change the runtime …
//!                                          gate = open (release), drop the write lock
//! ```
//!
//! `membarrier` makes every running thread execute a full memory barrier before it returns, so
//! either the reader's load of the gate sees it closed or the writer's scan sees the reader's
//! slot raised. Where `membarrier` is unavailable (an old kernel, a seccomp filter) readers pay a
//! full fence instead. A reader already inside a guarded call (slot above zero) goes on even if
//! the gate closed meanwhile: the writer is waiting for it, as an `RwLock`'s recursive read
//! does. A reader that finds the gate closed takes the read lock, which waits for the writer.

use std::marker::PhantomData;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Once;
use std::time::Duration;

use parking_lot::{const_rwlock, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A value changed only under [`Exclusive`] and read through [`Gated::enter_clear`],
/// [`Gated::enter`] or a read lock.
pub(crate) struct Gated<T> {
    value: RwLock<T>,
    /// [`CLOSED`] while a writer is changing the value; zero when a call may pass at once.
    gate: GateWord,
}

/// The word a [`Gated`] is entered by: zero while calls may pass on one load. Bits 0 and 1 are
/// the gate's own ([`CLOSED`], [`FENCED`]); its owner sets and clears its holds, from
/// [`FIRST_HOLD`] up, with [`GateWord::hold`] and [`GateWord::release`].
pub(crate) struct GateWord(AtomicU32);

/// A writer holds the value (closed by [`Gated::exclusive`]).
const CLOSED: u32 = 1;
/// `membarrier` is not registered (yet) for this process: readers must fence, so none takes
/// the one-load entry. Cleared by the first general entry after the registration succeeded.
const FENCED: u32 = 2;
/// The lowest bit an owner may use for its holds.
pub(crate) const FIRST_HOLD: u32 = 4;

impl GateWord {
    /// A word with no hold set (and [`FENCED`] until `membarrier` is registered).
    const fn new() -> GateWord {
        GateWord(AtomicU32::new(FENCED))
    }

    /// Sets the owner's holds `bits`: later calls take the general entry.
    pub(crate) fn hold(&self, bits: u32) {
        debug_assert!(
            bits >= FIRST_HOLD,
            "the gate's own bits are not the owner's"
        );
        self.0.fetch_or(bits, Ordering::SeqCst);
    }

    /// Clears the owner's holds `bits`.
    pub(crate) fn release(&self, bits: u32) {
        debug_assert!(
            bits >= FIRST_HOLD,
            "the gate's own bits are not the owner's"
        );
        self.0.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Whether no bit is set: the gate admits a call on one load (an acquire load).
    #[inline]
    pub(crate) fn is_clear(&self) -> bool {
        self.0.load(Ordering::Acquire) == 0
    }

    /// Whether any of `bits` is set (an acquire load).
    #[inline]
    pub(crate) fn holds(&self, bits: u32) -> bool {
        self.0.load(Ordering::Acquire) & bits != 0
    }
}

/// Whether `membarrier(PRIVATE_EXPEDITED)` is registered for this process.
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);
static REGISTER: Once = Once::new();

/// The address of every registered thread's slot. Held locked while a writer reads them, and
/// by a thread's [`Registration`] when it removes its own on exit, so no address is read after
/// its thread has ended.
static SLOTS: Mutex<Vec<usize>> = parking_lot::const_mutex(Vec::new());

/// The bit of a slot that says it is in [`SLOTS`]; the other bits count how deeply the thread
/// is inside gated calls (one thread-local per call: in a shared library each is a call to the
/// dynamic loader).
const REGISTERED: usize = 1 << (usize::BITS - 1);

thread_local! {
    /// This thread's slot: [`REGISTERED`] and how deeply it is inside gated calls (of any
    /// [`Gated`]).
    static SLOT: AtomicUsize = const { AtomicUsize::new(0) };
    /// Removes this thread's slot from [`SLOTS`] when the thread ends.
    static REGISTRATION: Registration = const { Registration };
}

/// See `REGISTRATION`.
struct Registration;

impl Drop for Registration {
    fn drop(&mut self) {
        // Later gated calls of this ending thread take the read lock (`register` fails now).
        let _ = SLOT.try_with(|slot| {
            let address = slot as *const AtomicUsize as usize;
            let mut slots = SLOTS.lock();
            slot.fetch_and(!REGISTERED, Ordering::Relaxed);
            slots.retain(|&a| a != address);
        });
    }
}

/// Registers this thread's `slot` (once per thread; the first also registers the process for
/// `membarrier`). False if the thread is ending (its slot cannot be registered any more).
#[cold]
fn register(slot: &AtomicUsize) -> bool {
    REGISTER.call_once(|| {
        use rustix::thread::{membarrier, MembarrierCommand};
        let registered = membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok();
        ASYMMETRIC.store(registered, Ordering::Relaxed);
    });
    // The registration's destructor must be armed before the slot is listed.
    if REGISTRATION.try_with(|_| ()).is_err() {
        return false;
    }
    let mut slots = SLOTS.lock();
    slots.push(slot as *const AtomicUsize as usize);
    slot.fetch_or(REGISTERED, Ordering::Relaxed);
    true
}

/// The value of a [`Gated`] past its gate, on this thread: no writer changes it while this
/// lives; dropping it (also on unwinding) lowers this thread's slot again. Not `Send`: the slot
/// is this thread's.
pub(crate) struct Entered<'a, T> {
    value: &'a T,
    slot: &'a AtomicUsize,
    depth: usize,
    _thread: PhantomData<*const ()>,
}

impl<T> std::ops::Deref for Entered<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> Drop for Entered<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.slot.store(self.depth, Ordering::Release);
    }
}

/// This thread's slot, for as long as the thread lives.
#[inline]
fn this_threads_slot() -> &'static AtomicUsize {
    let slot = SLOT.with(|slot| slot as *const AtomicUsize);
    // SAFETY: `SLOT` is a const-initialised thread-local without a destructor, so its storage
    // stays valid until this thread ends; every borrow made from it here is held by a value
    // that is not `Send` (`Entered`) or ends within this call, so none outlives the thread.
    unsafe { &*slot }
}

/// Calls `check` on every registered slot, with the list locked (so every slot's thread is
/// alive, and none registers or leaves meanwhile).
fn each_slot(mut check: impl FnMut(&AtomicUsize) -> bool) -> bool {
    let slots = SLOTS.lock();
    slots.iter().all(|&address| {
        // SAFETY: `address` is a live thread's `SLOT`: registered by `register` and removed by
        // its thread's `Registration` destructor (which takes this lock) before the thread's
        // thread-locals are freed; the lock is held for the whole call. Only atomic access.
        let slot = unsafe { &*(address as *const AtomicUsize) };
        check(slot)
    })
}

impl<T> Gated<T> {
    /// A cell holding `value`, its gate open.
    pub(crate) const fn new(value: T) -> Gated<T> {
        Gated {
            value: const_rwlock(value),
            gate: GateWord::new(),
        }
    }

    /// The gate word, for the owner's holds.
    pub(crate) fn word(&self) -> &GateWord {
        &self.gate
    }

    /// The value past the gate on one load of the gate word, or `None` (then check the owner's
    /// holds and take [`Gated::enter`]) if this thread is not registered yet or the word has a
    /// bit set that matters: any, for a thread entering from outside; the owner's holds, for
    /// one already inside (a writer waits for it).
    #[inline(always)]
    pub(crate) fn enter_clear(&self) -> Option<Entered<'_, T>> {
        let slot = this_threads_slot();
        let depth = slot.load(Ordering::Relaxed);
        if depth & REGISTERED == 0 {
            return None;
        }
        slot.store(depth + 1, Ordering::Relaxed);
        // `FENCED` is clear when it matters, so a writer's `membarrier` orders this store
        // before its scan of the slots.
        compiler_fence(Ordering::SeqCst);
        let word = self.gate.0.load(Ordering::Acquire);
        let matters = if depth == REGISTERED {
            u32::MAX
        } else {
            !(CLOSED | FENCED)
        };
        // SAFETY: the slot was raised from `depth` just above, and the call is refused unless
        // the gate was open after that with `membarrier` registered (`FENCED` clear), or this
        // thread was already inside.
        unsafe { self.past_gate(slot, depth, word & matters != 0) }
    }

    /// The value past the gate for this thread, whose `slot` was raised from `depth`; if
    /// `refused`, `None` and the slot lowered again.
    ///
    /// # Safety
    ///
    /// Unless `refused`, either the gate was open (an acquire load) after the slot was raised,
    /// with the writer's barrier ordering that store before its scan of the slots (`membarrier`,
    /// or a full fence on both sides), or this thread was already inside (`depth` above
    /// [`REGISTERED`]): then a writer's scan sees the slot and waits for it, so no [`Exclusive`]
    /// changes the value until the [`Entered`] drops, and every change made before the gate
    /// opened is visible.
    #[inline(always)]
    unsafe fn past_gate<'a>(
        &'a self,
        slot: &'a AtomicUsize,
        depth: usize,
        refused: bool,
    ) -> Option<Entered<'a, T>> {
        if refused {
            slot.store(depth, Ordering::Release);
            return None;
        }
        // SAFETY: no writer changes the value while the slot stays raised (the caller's
        // contract above).
        let value = unsafe { &*self.value.data_ptr() };
        Some(Entered {
            value,
            slot,
            depth,
            _thread: PhantomData,
        })
    }

    /// The value past the gate, or `None` if a writer holds the gate closed (then read through
    /// [`Gated::read_recursive`] or [`Gated::try_read_recursive`]) or this thread is ending.
    /// Registers the thread; ignores the owner's holds (its caller checked them).
    #[inline]
    pub(crate) fn enter(&self) -> Option<Entered<'_, T>> {
        let slot = this_threads_slot();
        let mut depth = slot.load(Ordering::Relaxed);
        if depth & REGISTERED == 0 {
            if !register(slot) {
                return None;
            }
            depth |= REGISTERED;
        }
        if ASYMMETRIC.load(Ordering::Relaxed) && self.gate.holds(FENCED) {
            self.gate.0.fetch_and(!FENCED, Ordering::SeqCst);
        }
        slot.store(depth + 1, Ordering::Relaxed);
        if ASYMMETRIC.load(Ordering::Relaxed) {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        // SAFETY: the slot was raised from `depth` just above and fenced as the writer's
        // barrier requires (a compiler fence with `membarrier`, else a full fence); the call is
        // refused if this thread enters from outside and the gate was closed after that.
        unsafe { self.past_gate(slot, depth, depth == REGISTERED && self.gate.holds(CLOSED)) }
    }

    /// The read lock (waits while a writer holds the value).
    pub(crate) fn read_recursive(&self) -> RwLockReadGuard<'_, T> {
        self.value.read_recursive()
    }

    /// The read lock if no writer holds the value.
    pub(crate) fn try_read_recursive(&self) -> Option<RwLockReadGuard<'_, T>> {
        self.value.try_read_recursive()
    }

    /// Waits for the write lock, closes the gate and waits until no thread is inside.
    pub(crate) fn exclusive(&self) -> Exclusive<'_, T> {
        let lock = self.value.write();
        self.close();
        let mut pause = Duration::from_micros(10);
        while !each_slot(|slot| slot.load(Ordering::Acquire) & !REGISTERED == 0) {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        Exclusive {
            lock,
            gate: &self.gate,
        }
    }

    /// The value held exclusively if no writer holds it and no thread is inside now.
    pub(crate) fn try_exclusive(&self) -> Option<Exclusive<'_, T>> {
        let lock = self.value.try_write()?;
        self.close();
        if !each_slot(|slot| slot.load(Ordering::Acquire) & !REGISTERED == 0) {
            self.gate.0.fetch_and(!CLOSED, Ordering::Release);
            return None;
        }
        Some(Exclusive {
            lock,
            gate: &self.gate,
        })
    }

    /// Closes the gate; on return every thread that will pass it sees it closed or has
    /// raised a slot that `each_slot` shows.
    fn close(&self) {
        // A reader on the one-load entry saw `FENCED` cleared (after `ASYMMETRIC` was set) and
        // `CLOSED` clear: so this read-modify-write comes after that clearing in the word's
        // order and sees `ASYMMETRIC` set too — such a reader always meets a `membarrier`.
        self.gate.0.fetch_or(CLOSED, Ordering::SeqCst);
        if ASYMMETRIC.load(Ordering::Relaxed) {
            // Registered at the first slot, so it cannot fail (EPERM is only for an
            // unregistered process); readers rely on it, so a failure must not go unnoticed.
            rustix::thread::membarrier(rustix::thread::MembarrierCommand::PrivateExpedited)
                .expect("membarrier(PRIVATE_EXPEDITED) failed after its registration");
        } else {
            // Readers fence too: the symmetric handshake.
            fence(Ordering::SeqCst);
        }
    }
}

/// The value of a [`Gated`] held exclusively: no gated call runs while it lives.
pub(crate) struct Exclusive<'a, T> {
    lock: RwLockWriteGuard<'a, T>,
    gate: &'a GateWord,
}

impl<T> std::ops::Deref for Exclusive<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.lock
    }
}

impl<T> std::ops::DerefMut for Exclusive<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.lock
    }
}

impl<T> Drop for Exclusive<'_, T> {
    fn drop(&mut self) {
        // Changes are visible to every reader that sees the gate open (release); readers that
        // found it closed wait on the read lock, released just after.
        self.gate.0.fetch_and(!CLOSED, Ordering::Release);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! The gate's handshake under every interleaving of a reader and a writer, in its symmetric
    //! form (a `SeqCst` fence on both sides: what `membarrier` provides on the reader's side):
    //! the reader never reads the value while the writer changes it (loom reports such an
    //! overlap of the `UnsafeCell` accesses), and a reader that passes sees the writer's
    //! earlier change.
    //!
    //! `RUSTFLAGS="--cfg loom" cargo test -p hyper-multicore --lib --release loom_tests`

    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
    use loom::sync::Arc;
    use loom::thread;

    struct Model {
        slot: AtomicUsize,
        gate: AtomicBool,
        value: UnsafeCell<u64>,
    }

    fn reader(model: &Model) -> Option<u64> {
        model.slot.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let seen = model.gate.load(Ordering::Acquire).then(|| {
            // SAFETY: the handshake under test; loom flags an overlap with the writer.
            model.value.with(|value| unsafe { *value })
        });
        model.slot.store(0, Ordering::Release);
        seen
    }

    fn writer(model: &Model, value: u64) {
        model.gate.store(false, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        while model.slot.load(Ordering::Acquire) != 0 {
            thread::yield_now();
        }
        // SAFETY: the handshake under test; loom flags an overlap with the reader.
        model.value.with_mut(|slot| unsafe { *slot = value });
        model.gate.store(true, Ordering::Release);
    }

    #[test]
    fn a_reader_never_overlaps_a_writer() {
        loom::model(|| {
            let model = Arc::new(Model {
                slot: AtomicUsize::new(0),
                gate: AtomicBool::new(true),
                value: UnsafeCell::new(0),
            });
            let shared = Arc::clone(&model);
            let read = thread::spawn(move || {
                let first = reader(&shared);
                let second = reader(&shared);
                (first, second)
            });
            writer(&model, 1);
            let (first, second) = read.join().unwrap();
            // Values only move forward: a read after one that saw the change sees it too.
            if first == Some(1) {
                assert_ne!(second, Some(0));
            }
        });
    }
}
