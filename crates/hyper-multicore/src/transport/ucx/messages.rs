//! The UCX transport's active messages: their ids, their headers (built here and read back
//! here, each reader refusing what does not fit the heap) and the mailbox of two-rank
//! exchanges.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::super::interface::{Rmw, SignalOp, Width};
use super::super::word_of;
#[cfg(test)]
use super::super::words_header;

/// The active message that rings the receiving PE's doorbell.
pub(super) const DOORBELL_AM: u16 = 1;
/// The active message of a two-rank exchange ([`UcxTransport::send_exchange`]): header
/// (source rank, tag, sequence), the data as its payload.
pub(super) const EXCHANGE_AM: u16 = 2;
/// The active message of a put on a [`Path::Messages`] path: header the offset in the target's
/// heap ([`put_header`]), the bytes as payload.
pub(super) const PUT_AM: u16 = 3;
/// The active message of a signal or a non-fetching atomic (set, add) on a [`Path::Messages`]
/// path: header ([`update_header`]) the word's offset, the value, its width and whether it
/// adds; no payload.
pub(super) const UPDATE_AM: u16 = 4;
/// The request of a get on a [`Path::Messages`] path whose one lane carries every active
/// message: header ([`get_request`]) the offset and length in the target's heap and the
/// requester's landing token; no payload. The target answers with [`GET_REPLY_AM`]s.
pub(super) const GET_AM: u16 = 5;
/// A part of a get's answer: header the landing token and the part's place in the buffer
/// (little-endian), the heap's bytes as payload (at most [`MESSAGE_CHUNK`] each).
pub(super) const GET_REPLY_AM: u16 = 6;
/// What identifies a two-rank exchange's message: (source rank, tag, sequence).
pub(super) type ExchangeKey = (u64, u64, u64);

/// The messages of two-rank exchanges that arrived and were not taken yet, with their keys
/// (source rank, tag, sequence); and how many exchanges this PE started with each (peer, tag).
#[derive(Debug, Default)]
pub(super) struct Mailbox {
    /// A list, not a map: it holds one message or two at a time (one per exchange in flight),
    /// which a scan finds sooner than a hash does.
    arrived: Mutex<Vec<(ExchangeKey, Vec<u8>)>>,
    /// How many messages `arrived` holds: a waiter's look is one load while it is zero.
    unclaimed: AtomicUsize,
    /// How many exchanges this PE started with each (peer, tag): the next one's sequence.
    pub(super) started: Mutex<FxHashMap<(usize, u64), u64>>,
}

impl Mailbox {
    /// Files a peer's message (called by the exchange handler).
    pub(super) fn post(&self, key: ExchangeKey, data: &[u8]) {
        self.arrived.lock().push((key, data.to_vec()));
        // SeqCst: the count precedes the read of the sleeper count in the handler's `ring`.
        self.unclaimed.fetch_add(1, Ordering::SeqCst);
    }

    /// The message filed under `key`, taken out.
    pub(super) fn take(&self, key: ExchangeKey) -> Option<Vec<u8>> {
        if self.unclaimed.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let message = {
            let mut arrived = self.arrived.lock();
            let at = arrived.iter().position(|(filed, _)| *filed == key)?;
            arrived.swap_remove(at).1
        };
        self.unclaimed.fetch_sub(1, Ordering::SeqCst);
        Some(message)
    }
}

/// The (source rank, tag, sequence) of an exchange message's header, if it is one.
pub(super) fn exchange_key(header: &[u8]) -> Option<ExchangeKey> {
    let header: &[u8; 24] = header.try_into().ok()?;
    Some((word_of(header, 0), word_of(header, 1), word_of(header, 2)))
}

/// The (offset, length, token) of a get request, if its header is one and the range lies in a
/// heap of `heap_len` bytes.
pub(super) fn get_request(header: &[u8], heap_len: usize) -> Option<(usize, usize, u64)> {
    let header: &[u8; 24] = header.try_into().ok()?;
    let offset = usize::try_from(word_of(header, 0)).ok()?;
    let len = usize::try_from(word_of(header, 1)).ok()?;
    (offset.checked_add(len)? <= heap_len).then_some((offset, len, word_of(header, 2)))
}

/// The header of a put message: the offset in the target's heap, little-endian.
pub(super) fn put_header(offset: usize) -> [u8; 8] {
    (offset as u64).to_le_bytes()
}

/// The heap offset of a put message of `len` bytes, if its header is one and the bytes fit in
/// a heap of `heap_len` bytes.
pub(super) fn put_offset(header: &[u8], len: usize, heap_len: usize) -> Option<usize> {
    let header: &[u8; 8] = header.try_into().ok()?;
    let offset = usize::try_from(word_of(header, 0)).ok()?;
    (offset.checked_add(len)? <= heap_len).then_some(offset)
}

/// The header of an update message: offset and value (little-endian), then one byte: bit 0 for
/// a 64-bit word, bit 1 to add rather than set.
pub(super) fn update_header(offset: usize, width: Width, op: SignalOp, value: u64) -> [u8; 17] {
    let mut header = [0u8; 17];
    header[..8].copy_from_slice(&(offset as u64).to_le_bytes());
    header[8..16].copy_from_slice(&value.to_le_bytes());
    header[16] = u8::from(width == Width::W64) | u8::from(op == SignalOp::Add) << 1;
    header
}

/// The word (heap offset, width) and operation of an update message, if its header is one and
/// names an aligned word inside a heap of `heap_len` bytes.
pub(super) fn update_of(header: &[u8], heap_len: usize) -> Option<(usize, Width, Rmw)> {
    let header: &[u8; 17] = header.try_into().ok()?;
    let offset = usize::try_from(word_of(header, 0)).ok()?;
    let (value, kind) = (word_of(header, 1), header[16]);
    if kind > 0b11 {
        return None;
    }
    let (width, size) = if kind & 1 == 1 {
        (Width::W64, 8)
    } else {
        (Width::W32, 4)
    };
    let fits = offset % size == 0 && offset.checked_add(size)? <= heap_len;
    fits.then_some((
        offset,
        width,
        Rmw::update(
            if kind & 2 == 2 {
                SignalOp::Add
            } else {
                SignalOp::Set
            },
            value,
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_header_reads_back_inside_the_heap_only() {
        let header = put_header(4096);
        assert_eq!(put_offset(&header, 100, 8192), Some(4096));
        assert_eq!(
            put_offset(&header, 4096, 8192),
            Some(4096),
            "up to the heap's end"
        );
        assert_eq!(put_offset(&header, 4097, 8192), None, "past the heap's end");
        assert_eq!(
            put_offset(&put_header(usize::MAX), 1, usize::MAX),
            None,
            "overflow"
        );
        assert_eq!(put_offset(&header[..7], 1, 8192), None);
        assert_eq!(put_offset(&[0u8; 9], 1, 8192), None);
    }

    #[test]
    fn a_update_header_reads_back_for_aligned_words_inside_the_heap_only() {
        for (width, size) in [(Width::W32, 4), (Width::W64, 8)] {
            for op in [SignalOp::Set, SignalOp::Add] {
                let header = update_header(64, width, op, 0xDEAD_BEEF);
                let rmw = Rmw::update(op, 0xDEAD_BEEF);
                assert_eq!(update_of(&header, 64 + size), Some((64, width, rmw)));
                assert_eq!(
                    update_of(&header, 64 + size - 1),
                    None,
                    "past the heap's end"
                );
            }
            let misaligned = update_header(size / 2, width, SignalOp::Set, 1);
            assert_eq!(update_of(&misaligned, 4096), None);
        }
        let mut unknown = update_header(0, Width::W64, SignalOp::Set, 1);
        unknown[16] = 4;
        assert_eq!(update_of(&unknown, 4096), None);
        assert_eq!(update_of(&[0u8; 16], 4096), None);
        assert_eq!(update_of(&[0u8; 18], 4096), None);
    }

    #[test]
    fn an_exchange_header_reads_back_and_other_lengths_are_refused() {
        let header = words_header([3, u64::from_be_bytes(*b"hm-lbarr"), 17]);
        assert_eq!(
            exchange_key(&header),
            Some((3, u64::from_be_bytes(*b"hm-lbarr"), 17))
        );
        assert_eq!(exchange_key(&header[..16]), None);
        assert_eq!(exchange_key(&[0u8; 25]), None);
        assert_eq!(exchange_key(&[]), None);
    }
}
