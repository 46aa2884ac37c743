//! The faults a test injects into the simulated disk: errors an operation returns
//! ([`Fault`], by [`OpKind`]), damage a write suffers ([`WriteDamage`]), and the record of a
//! flipped bit ([`Flip`]).

use std::io;
use std::path::PathBuf;

/// Linux's number for "no space left on device".
pub const ENOSPC: i32 = 28;
/// Linux's number for "input/output error".
pub const EIO: i32 = 5;

/// The kinds of operation a fault can be injected into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// A write, a length change, or the creation of a file or directory.
    Write,
    /// A sync of a file's data or of a directory.
    Sync,
    /// A rename.
    Rename,
    /// A removal.
    Remove,
}

/// An injected error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// ENOSPC: the disk is full.
    NoSpace,
    /// EIO: the device failed.
    Io,
}

impl Fault {
    pub(super) fn error(self) -> io::Error {
        io::Error::from_raw_os_error(match self {
            Fault::NoSpace => ENOSPC,
            Fault::Io => EIO,
        })
    }
}

/// A bit flipped in a file's synced data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flip {
    /// The file, as named when the bit flipped.
    pub path: PathBuf,
    /// The byte.
    pub offset: u64,
    /// The bit flipped, as a mask.
    pub mask: u8,
}

/// Damage the next write to a file whose path holds a text suffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteDamage {
    /// Only a prefix of it reaches the platter, though its sync succeeds.
    Tear,
    /// It reaches the platter at another offset of the file, though its sync succeeds.
    Misdirect,
}
