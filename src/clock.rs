//! The wall clock, as one injectable function, so tests can move time without sleeping.

use std::sync::Arc;

/// Unix time in milliseconds; injected so tests can move time without sleeping.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The wall clock.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    })
}
