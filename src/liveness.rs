//! Whether the process can still do its job without a restart: any part marks it, and
//! `/healthz` answers 503 with the reason from then on, so an orchestrator restarts it.

use std::sync::{Arc, Mutex, PoisonError};

/// A shared flag with a reason: set once a part is in a state only a restart cures (a
/// thread that must run has ended, a store that cannot be set back to its last good
/// state). Cheap to clone; every clone sees the same flag.
///
/// A part marks it with [`Liveness::needs_restart`] and nothing else: it answers its own
/// callers as before (503s), and the restart comes from the liveness probe. A condition
/// that may pass by itself (a full disk, a broker away) belongs to readiness, not here.
#[derive(Clone, Default)]
pub struct Liveness {
    reason: Arc<Mutex<Option<String>>>,
}

impl Liveness {
    /// A live process.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the process as needing a restart. The first reason is kept (later ones follow
    /// from it more often than not); each is logged at ERROR once, here.
    pub fn needs_restart(&self, reason: impl Into<String>) {
        let reason = reason.into();
        tracing::error!(%reason, "hookgate needs a restart; /healthz answers 503");
        let mut kept = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.is_none() {
            *kept = Some(reason);
        }
    }

    /// Why the process needs a restart, or `None` while it does not.
    pub fn restart_reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_is_kept_and_every_clone_sees_it() {
        let liveness = Liveness::new();
        let part = liveness.clone();
        assert_eq!(liveness.restart_reason(), None);
        part.needs_restart("the state journal's writer thread ended");
        part.needs_restart("a later failure");
        assert_eq!(
            liveness.restart_reason().as_deref(),
            Some("the state journal's writer thread ended")
        );
    }
}
