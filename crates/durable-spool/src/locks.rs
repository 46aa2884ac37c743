//! Locks: a mutex taken whatever a panic left in it, and a lock on a file waited for while
//! it may be on its way out.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long an open waits for a lock that may be on its way out (see
/// [`crate::store::Store::open`]).
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// The mutex's guard; a panic while it was held leaves plain counts and flags, still valid.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Retries `open` while it fails with a lock `locked` says may be on its way out, up to
/// [`LOCK_WAIT`].
pub(crate) fn wait_for_lock<T, E>(
    mut open: impl FnMut() -> Result<T, E>,
    locked: impl Fn(&E) -> bool,
) -> Result<T, E> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match open() {
            Err(e) if locked(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}
