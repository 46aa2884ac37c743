//! What a caller hands [`super::serve`] besides the prepared config: the bound listeners,
//! and the knobs tests turn.

use std::time::Duration;

use tokio::net::TcpListener;

use crate::clock::{system_clock, Clock};
use crate::liveness::Liveness;

/// The two listeners, bound by the caller (tests bind port 0).
pub struct Listeners {
    /// Webhook listener.
    pub webhooks: TcpListener,
    /// Admin listener.
    pub admin: TcpListener,
}

/// Knobs tests turn; production uses the defaults.
pub struct Options {
    /// The clock of freshness, dedup and guard decisions.
    pub clock: Clock,
    /// How often expired marks are swept.
    pub sweep_interval: Duration,
    /// Set by any part in a state only a restart cures; `/healthz` reports it.
    pub liveness: Liveness,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            clock: system_clock(),
            sweep_interval: Duration::from_secs(60),
            liveness: Liveness::new(),
        }
    }
}
