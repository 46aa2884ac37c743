//! The wall clock, as one injectable function, so tests can move time without sleeping.

use std::sync::Arc;

/// Unix time in milliseconds; injected so tests can move time without sleeping.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The wall clock.
pub fn system_clock() -> Clock {
    Arc::new(now_ms)
}

/// Unix time in milliseconds, by the wall clock (0 before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Unix time in whole seconds, by the wall clock (0 before 1970).
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
