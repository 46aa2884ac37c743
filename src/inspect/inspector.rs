//! [`Inspector`]: answers a [`Query`] about one route from the decision records of the
//! dedup marks and the guard state.

use std::time::Duration;

use crate::config::{Config, Profile};
use crate::guard::stored::{read_keywords, read_status};
use crate::state::decision::{EventRecord, RequestRecord};
use crate::state::keys::StoreKey;

use super::lookup::Lookup;
use super::query::{check_shape, InspectError, Query};
use super::report::{
    Answer, ContactReport, EventReport, MarkReport, MessageReport, RecordReport, Report,
    RequestReport,
};

/// One route as inspect needs it.
#[derive(Debug, Clone)]
struct RouteFacts {
    name: String,
    profile: Profile,
}

/// Answers questions about the routes of a config.
#[derive(Debug, Clone)]
pub struct Inspector {
    routes: Vec<RouteFacts>,
    /// The dedup window: how long an event's marks and record are kept.
    window: Duration,
}

impl Inspector {
    /// The inspector of `config`'s routes.
    pub fn new(config: &Config) -> Self {
        Self {
            routes: config
                .routes
                .iter()
                .map(|r| RouteFacts {
                    name: r.name.clone(),
                    profile: r.profile,
                })
                .collect(),
            window: config.dedup.ttl,
        }
    }

    /// Whether `query` can be asked of `route`: the route exists and the ids have the
    /// shape of its sender's.
    pub fn check(&self, route: &str, query: &Query) -> Result<(), InspectError> {
        let facts = self
            .routes
            .iter()
            .find(|r| r.name == route)
            .ok_or_else(|| InspectError::NoRoute(route.to_owned()))?;
        check_shape(facts.profile, query)
    }

    /// Answers `query` about `route` from `store` at `now_ms`.
    pub async fn answer(
        &self,
        store: &impl Lookup,
        route: &str,
        query: &Query,
        now_ms: i64,
    ) -> Result<Report, InspectError> {
        self.check(route, query)?;
        let window = window_text(self.window);
        let body = match query {
            Query::Event(id) => Answer::Event(event_report(store, route, id, now_ms).await?),
            Query::Request(id) => {
                let key = StoreKey::request(route, id);
                let mark = store.mark(&key, now_ms).await?;
                let pointer = mark
                    .as_ref()
                    .and_then(|m| m.record.as_deref())
                    .and_then(RequestRecord::decode);
                let event = match &pointer {
                    Some(p) => Some(event_report(store, route, &p.event_id, now_ms).await?),
                    None => None,
                };
                Answer::Request(RequestReport {
                    request_id: id.clone(),
                    mark: mark.as_ref().map(MarkReport::of),
                    event_id: pointer.map(|p| p.event_id),
                    event,
                })
            }
            Query::Message(id) => {
                let key = StoreKey::guard(route, "status", &[id]);
                let stored = store.guard(&key).await?;
                let stored = stored
                    .as_deref()
                    .and_then(read_status)
                    .filter(|s| s.expires_ms.is_none_or(|e| e > now_ms));
                Answer::Message(MessageReport::of(id, stored))
            }
            Query::Contact { from, to } => {
                let key = StoreKey::guard(route, "keyword", &[from, to]);
                let stored = store.guard(&key).await?;
                let stored = stored
                    .as_deref()
                    .and_then(read_keywords)
                    .filter(|s| s.expires_ms.is_none_or(|e| e > now_ms));
                Answer::Contact(ContactReport::of(from, to, stored))
            }
        };
        Ok(body.with_context(route, &window))
    }
}

/// The report of the event `id`: its mark under its event id, or, on a route that
/// reconciles, under the inbound message id the event may have been deduplicated by.
async fn event_report(
    store: &impl Lookup,
    route: &str,
    id: &str,
    now_ms: i64,
) -> Result<EventReport, InspectError> {
    let mut by_message = false;
    let mut mark = store.mark(&StoreKey::event(route, id), now_ms).await?;
    if mark.is_none() {
        mark = store.mark(&StoreKey::message(route, id), now_ms).await?;
        by_message = mark.is_some();
    }
    let record = mark
        .as_ref()
        .and_then(|m| m.record.as_deref())
        .and_then(EventRecord::decode);
    Ok(EventReport {
        event_id: id.to_owned(),
        by_message_id: by_message,
        mark: mark.as_ref().map(MarkReport::of),
        record: record.as_ref().map(RecordReport::of),
        parked: None,
    })
}

/// The dedup window as an operator writes it: `72h`, `90m`, `45s`.
fn window_text(window: Duration) -> String {
    let secs = window.as_secs();
    if secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_written_as_an_operator_writes_it() {
        assert_eq!(window_text(Duration::from_secs(72 * 3600)), "72h");
        assert_eq!(window_text(Duration::from_secs(90 * 60)), "90m");
        assert_eq!(window_text(Duration::from_secs(45)), "45s");
    }
}
