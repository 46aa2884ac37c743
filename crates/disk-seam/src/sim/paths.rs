//! Paths on the simulated disk: every path is absolute under `/`, and the parent of `/`
//! and of a bare name is `/`.

use std::io;
use std::path::{Path, PathBuf};

/// The root directory.
pub(super) fn root() -> PathBuf {
    PathBuf::from("/")
}

/// The directory holding `path`.
pub(super) fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => root(),
    }
}

/// `path` as an absolute path: a relative one is read as under `/`.
pub(super) fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_owned()
    } else {
        root().join(path)
    }
}

/// The error for a path no entry names.
pub(super) fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: not found", path.display()),
    )
}
