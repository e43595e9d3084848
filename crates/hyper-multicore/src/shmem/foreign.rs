//! What a front that addresses the symmetric heap by raw address needs (the OpenSHMEM C API,
//! `crates/hyper-multicore-shmem-c`): where this PE's own heap starts, and a wait over several
//! words of it at once (the C API's `wait_until_all/any/some` and `_vector` forms).
//!
//! ```no_run
//! # fn demo(shmem: &hyper_multicore::shmem::Shmem) -> hyper_multicore::Result<()> {
//! use hyper_multicore::shmem::Symmetric;
//! let flags = shmem.allocate::<u64>(4, None)?;
//! let words: Vec<_> = (0..4).map(|i| flags.view(i..i + 1).map(|v| v.region())).collect::<Result<_, _>>()?;
//! // Returns once any of the four flags of this PE is non-zero.
//! shmem.wait_words::<u64>("wait_until_any", &words, |values| values.iter().any(|&v| v != 0), None)?;
//! let start = shmem.heap_address(); // the address of heap offset 0 on this PE
//! # let _ = start; Ok(()) }
//! ```

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::allocation::Region;
use super::data::{AtomicWord, Comparison, Located};
use super::runtime::Shmem;
use crate::error::{ErrorKind, Result};
use crate::transport::sync::{Deadline, WaitPolicy};

impl Shmem {
    /// The address at which this PE's own heap starts in this process: the allocation at heap
    /// offset `o` is at `heap_address() + o` here. Valid until the runtime is shut down, dropped
    /// or restarted; never read or write through it while other PEs may write (see
    /// [`Shmem::ptr`]).
    pub fn heap_address(&self) -> usize {
        self.transport
            .local_ptr(self.rank, 0)
            .expect("every transport maps this PE's own heap")
            .as_ptr() as usize
    }

    /// Waits until this PE's own copy of the word `at` (one naturally aligned `W`, located
    /// before: see [`Located`]) compares `comparison` to `value`; returns the word's value then.
    /// The one-word form of [`Shmem::wait_words`] (a C `wait_until`), as cheap as
    /// [`Shmem::wait_signal`], with errors naming `operation`; `timeout` defaults to the
    /// configured timeout.
    pub fn wait_word<W: AtomicWord>(
        &self,
        operation: &str,
        at: &Located,
        value: W,
        comparison: Comparison,
        timeout: Option<Duration>,
    ) -> Result<W> {
        let offset = self.located_word::<W>(operation, at, self.rank)?;
        let deadline = Deadline::After(timeout.unwrap_or(self.config.timeout));
        self.wait_own_word(operation, offset, value, comparison, deadline)
    }

    /// Waits until `ready` holds for the current values of this PE's own copies of `words`
    /// (each a one-element, naturally aligned region of `W`), read atomically and passed in the
    /// order given. Writers wake the wait with atomics and signals (plain puts are noticed
    /// within a sleep slice). `timeout` defaults to the configured timeout; a lost peer ends the
    /// wait with a peer-lost error. `operation` names the call in errors.
    pub fn wait_words<W: AtomicWord>(
        &self,
        operation: &str,
        words: &[Region],
        mut ready: impl FnMut(&[W]) -> bool,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let width = std::mem::size_of::<W>();
        for &word in words {
            self.check_region(operation, word)?;
            if word.bytes as usize != width || word.heap_offset % width as u64 != 0 {
                return Err(self.error(
                    ErrorKind::InvalidArgument,
                    operation,
                    format!(
                        "a waited word must be one naturally aligned {width}-byte word; got {} \
                         bytes at heap offset {}",
                        word.bytes, word.heap_offset
                    ),
                ));
            }
        }
        // Each word is located once, not on every look of the wait; a few (one, in every
        // `wait_until` of the C API) in arrays on the stack: the wait sits on ping-pong paths.
        let transport = &self.transport;
        let locate = |word: &Region| -> OwnWord<'_> {
            let offset = word.heap_offset as usize;
            match width {
                4 => OwnWord::W32(transport.own_word32(offset)),
                _ => OwnWord::W64(transport.own_word64(offset)),
            }
        };
        const INLINE: usize = 8;
        let (mut inline_words, mut inline_values) = ([None; INLINE], [W::from_bits(0); INLINE]);
        let (mut spilled_words, mut spilled_values) = (Vec::new(), Vec::new());
        let (own, values): (&mut [Option<OwnWord<'_>>], &mut [W]) = if words.len() <= INLINE {
            (
                &mut inline_words[..words.len()],
                &mut inline_values[..words.len()],
            )
        } else {
            spilled_words.resize(words.len(), None);
            spilled_values.resize(words.len(), W::from_bits(0));
            (&mut spilled_words, &mut spilled_values)
        };
        for (slot, word) in own.iter_mut().zip(words) {
            *slot = Some(locate(word));
        }
        let own: &[Option<OwnWord<'_>>] = own;
        let look = |values: &mut [W]| {
            for (value, word) in values.iter_mut().zip(own.iter().flatten()) {
                *value = word.load();
            }
        };
        look(values);
        if ready(values) {
            return Ok(());
        }
        let policy = WaitPolicy {
            spin: self.spin,
            deadline: Deadline::After(timeout.unwrap_or(self.config.timeout)),
        };
        let outcome = transport.wait_own(
            || {
                look(values);
                ready(values)
            },
            &policy,
        );
        self.wait_outcome(operation, outcome, || {
            format!("the words are {values:?}, and the condition does not hold")
        })
    }
}

/// One word of this PE's own heap, located.
#[derive(Clone, Copy)]
enum OwnWord<'a> {
    W32(&'a AtomicU32),
    W64(&'a AtomicU64),
}

impl OwnWord<'_> {
    /// Its value (zero-extended), read atomically.
    #[inline]
    fn load<W: AtomicWord>(self) -> W {
        match self {
            OwnWord::W32(word) => W::from_bits(u64::from(word.load(Ordering::SeqCst))),
            OwnWord::W64(word) => W::from_bits(word.load(Ordering::SeqCst)),
        }
    }
}
