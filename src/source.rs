//! Which path brought an event: a sender's delivery, reconciliation with the sender's list
//! API, or an operator's replay. Read from the request id, whose prefix hookgate sets for
//! the events it makes itself and refuses from a sender, so the source survives the spool
//! (whose record holds the request id) with no field of its own. A message carries it as
//! `x-source`; a decision record keeps it.

/// Starts the request id of every event reconciliation makes, and no sender's.
pub const RECONCILE_REQUEST_PREFIX: &str = "reconcile:";
/// Starts the request id of every event a replay publishes, and no sender's.
pub const REPLAY_REQUEST_PREFIX: &str = "replay:";

/// Which path brought an event (its `x-source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A sender's delivery.
    Webhook,
    /// Reconciliation with the sender's list API.
    Reconcile,
    /// An operator's replay.
    Replay,
}

impl Source {
    /// Every source, in the order of their stored codes.
    pub const ALL: [Source; 3] = [Source::Webhook, Source::Reconcile, Source::Replay];

    /// The source of the event whose request id is `request_id`.
    pub fn of(request_id: &str) -> Self {
        if request_id.starts_with(RECONCILE_REQUEST_PREFIX) {
            Source::Reconcile
        } else if request_id.starts_with(REPLAY_REQUEST_PREFIX) {
            Source::Replay
        } else {
            Source::Webhook
        }
    }

    /// The `x-source` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Webhook => "webhook",
            Source::Reconcile => "reconcile",
            Source::Replay => "replay",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_is_read_from_the_request_ids_prefix() {
        assert_eq!(Source::of("req_1"), Source::Webhook);
        assert_eq!(Source::of("reconcile:botix:1"), Source::Reconcile);
        assert_eq!(Source::of("replay:botix:1"), Source::Replay);
        assert_eq!(Source::of("reconcile:replay:1"), Source::Reconcile);
    }
}
