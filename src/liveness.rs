//! Whether the process can still do its job without a restart: any part marks it, and
//! `/healthz` answers 503 with the reason from then on, so an orchestrator restarts it. A
//! background thread that can hang (in an `fsync` of a failing disk, say) is watched by a
//! probe that reports it once it has been in one step longer than its deadline.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A check of a background part, asked at each `/healthz`: why the process needs a
/// restart (a thread stuck for longer than its deadline), or `None`.
pub type Probe = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// A shared flag with a reason: set once a part is in a state only a restart cures (a
/// thread that must run has ended, a store that cannot be set back to its last good
/// state), and the probes of the background threads. Cheap to clone; every clone sees the
/// same flag and probes.
///
/// A part marks it with [`Liveness::needs_restart`] and nothing else: it answers its own
/// callers as before (503s), and the restart comes from the liveness probe. A condition
/// that may pass by itself (a full disk, a broker away) belongs to readiness, not here.
#[derive(Clone, Default)]
pub struct Liveness {
    reason: Arc<Mutex<Option<String>>>,
    probes: Arc<Mutex<Vec<Probe>>>,
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

    /// Adds a probe, asked by every later [`Liveness::restart_reason`]. It should hold its
    /// part weakly: the probes live as long as the process.
    pub fn watch(&self, probe: impl Fn() -> Option<String> + Send + Sync + 'static) {
        self.probes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(probe));
    }

    /// Why the process needs a restart, or `None` while it does not: a reason a part
    /// marked, else the first probe that reports one.
    pub fn restart_reason(&self) -> Option<String> {
        let kept = self
            .reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        kept.or_else(|| {
            self.probes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .find_map(|probe| probe())
        })
    }
}

/// The reason a thread that has been in one step (`what`) for `busy` gives, once that is
/// longer than `deadline` (`store.hung_after`).
pub fn overdue(thread: &str, what: &str, busy: Duration, deadline: Duration) -> Option<String> {
    (busy > deadline).then(|| {
        format!(
            "the {thread} has been in one {what} for {} s (store.hung_after is {} s)",
            busy.as_secs(),
            deadline.as_secs()
        )
    })
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

    #[test]
    fn a_probe_reports_a_thread_past_its_deadline_and_stops_once_it_moves_again() {
        let liveness = Liveness::new();
        let busy = Arc::new(Mutex::new(Duration::from_secs(3)));
        let seen = busy.clone();
        liveness.watch(move || {
            let busy = *seen.lock().unwrap_or_else(PoisonError::into_inner);
            overdue("writer thread", "commit", busy, Duration::from_secs(120))
        });
        assert_eq!(liveness.restart_reason(), None, "within its deadline");
        *busy.lock().unwrap_or_else(PoisonError::into_inner) = Duration::from_secs(121);
        let reason = liveness.restart_reason().expect("past its deadline");
        assert!(reason.contains("writer thread"), "{reason}");
        assert!(reason.contains("121 s"), "{reason}");
        *busy.lock().unwrap_or_else(PoisonError::into_inner) = Duration::ZERO;
        assert_eq!(liveness.restart_reason(), None);
    }
}
