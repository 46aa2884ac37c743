//! A change to a simulated file's data (a write or a length change) and where a write
//! reaches the platter: whole, torn, or at another offset. [`apply`] makes a change as
//! reads see it, [`land`] as the platter gets it.

/// A change to a file's data.
pub(super) enum Pending {
    Write {
        offset: u64,
        bytes: Vec<u8>,
        lands: Landing,
    },
    SetLen(u64),
}

/// Where a write reaches the platter. Reads see it whole where it was aimed (the page
/// cache) until a power cut; what a sync or a power cut keeps follows this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Landing {
    Whole,
    /// Only this many of its first bytes land (a torn write).
    Torn(usize),
    /// Its bytes land at this offset instead (a misdirected write).
    At(u64),
}

/// Applies a change to a file's data as reads see it.
pub(super) fn apply(data: &mut Vec<u8>, change: &Pending) {
    match change {
        Pending::Write { offset, bytes, .. } => write_bytes(data, *offset, bytes),
        Pending::SetLen(len) => data.resize(*len as usize, 0),
    }
}

/// Applies a change to what the platter holds: a damaged write lands torn or elsewhere.
pub(super) fn land(durable: &mut Vec<u8>, change: &Pending) {
    match change {
        Pending::Write {
            offset,
            bytes,
            lands,
        } => match *lands {
            Landing::Whole => write_bytes(durable, *offset, bytes),
            Landing::Torn(kept) => write_bytes(durable, *offset, &bytes[..kept.min(bytes.len())]),
            Landing::At(elsewhere) => write_bytes(durable, elsewhere, bytes),
        },
        Pending::SetLen(_) => apply(durable, change),
    }
}

pub(super) fn write_bytes(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let at = offset as usize;
    if data.len() < at + bytes.len() {
        data.resize(at + bytes.len(), 0);
    }
    data[at..at + bytes.len()].copy_from_slice(bytes);
}
