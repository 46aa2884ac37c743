//! A journal batch: the records appended since the last commit, in the frame the journal
//! writes, and how a replay reads them back.
//!
//! A batch is its creation time (i64) and record count (u32), then its records: digest,
//! expiry (i64), value length (u32), value; little-endian.

use crate::wal::FRAME_HEAD;
use crate::Digest;

/// The open batch's buffer is allocated with room for this much; a batch grows beyond it
/// while a flush is slow.
const BATCH_CAPACITY: usize = 32 * 1024;
/// Batch header: created_ms (i64) and record count (u32), little-endian.
const HEADER_BYTES: usize = 12;
/// An open batch's buffer holds its frame's head, the batch header, then its records.
pub(super) const EMPTY_BATCH: usize = FRAME_HEAD + HEADER_BYTES;

/// Legacy batches read at a time.
pub(super) const LEGACY_PAGE: usize = 256;

/// Records appended since the last write.
pub(super) struct Open {
    pub(super) seq: u64,
    pub(super) buf: Vec<u8>,
    /// A caller waits for this batch: the writer commits it without gathering more.
    pub(super) asked: bool,
}

impl Open {
    pub(super) fn new(seq: u64) -> Self {
        // Room for a full batch up front: growing the buffer record by record copies it
        // again and again on the request path.
        Self::reusing(seq, Vec::with_capacity(BATCH_CAPACITY))
    }

    /// An empty batch in `buf`, a written batch's buffer whose capacity is kept.
    pub(super) fn reusing(seq: u64, mut buf: Vec<u8>) -> Self {
        buf.clear();
        buf.resize(EMPTY_BATCH, 0);
        Self {
            seq,
            buf,
            asked: false,
        }
    }

    /// This batch's buffer for a later batch, unless a slow flush grew it well past a
    /// batch's usual size: memory a burst took is given back.
    pub(super) fn into_reusable(self) -> Option<Vec<u8>> {
        (self.buf.capacity() <= 2 * BATCH_CAPACITY).then_some(self.buf)
    }

    /// Whether no record was appended.
    pub(super) fn is_empty(&self) -> bool {
        self.buf.len() == EMPTY_BATCH
    }

    /// Appends a record and returns the batch's sequence number.
    pub(super) fn append(
        &mut self,
        key: &Digest,
        expires_ms: i64,
        value: &[u8],
        now_ms: i64,
    ) -> u64 {
        let buf = &mut self.buf;
        let header = FRAME_HEAD;
        if buf.len() == EMPTY_BATCH {
            buf[header..header + 8].copy_from_slice(&now_ms.to_le_bytes());
        }
        buf.extend_from_slice(&key.0);
        buf.extend_from_slice(&expires_ms.to_le_bytes());
        buf.extend_from_slice(&(value.len() as u32).to_le_bytes());
        buf.extend_from_slice(value);
        let at = header + 8;
        let count = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) + 1;
        buf[at..at + 4].copy_from_slice(&count.to_le_bytes());
        self.seq
    }
}

/// The sequence number a legacy batch's key holds.
pub(super) fn decode_seq(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

/// A record of a batch: its key, expiry and value.
pub(super) type BatchRecord<'a> = (Digest, i64, &'a [u8]);

/// A batch's creation time and records; `None` if it is cut short or malformed.
pub(super) fn decode_batch(bytes: &[u8]) -> Option<(i64, Vec<BatchRecord<'_>>)> {
    let created_ms = i64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let count = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?);
    let mut rest = bytes.get(HEADER_BYTES..)?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
        rest = tail;
        Some(head)
    };
    let mut records = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let key = Digest(take(16)?.try_into().ok()?);
        let expires_ms = i64::from_le_bytes(take(8)?.try_into().ok()?);
        let value_len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        records.push((key, expires_ms, take(value_len)?));
    }
    Some((created_ms, records))
}
