//! A listed message as the event the webhook would have brought: an outbound message with
//! a status is a `message.status` event, an inbound one a `message.received` event, with
//! the body laid out at the route's own pointers. Pure.

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::config::{Fields, Route};
use crate::reconcile::api::{Direction, Listed};

/// The event type of a listed outbound message with a status.
pub const STATUS_EVENT: &str = "message.status";
/// The event type of a listed inbound message.
pub const RECEIVED_EVENT: &str = "message.received";
/// Starts every event id reconciliation makes, so it can never equal a sender's.
const ID_PREFIX: &str = "reconcile:";

/// Why a listed message makes no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// An outbound message without a status: nothing to report.
    NoStatus,
}

/// One event made of a listed message.
#[derive(Debug, Clone, PartialEq)]
pub struct Made {
    /// Its event id: `reconcile:<message id>:<status>` or `reconcile:<message id>:received`.
    pub id: String,
    /// `message.status` or `message.received`.
    pub event_type: &'static str,
    /// The body, in the webhook's shape.
    pub body: Bytes,
}

/// Where a route reads what an event carries: the body is written at these pointers.
#[derive(Debug, Clone)]
pub struct Layout {
    event_id: String,
    event_type: String,
    timestamp: String,
    message_id: Vec<String>,
    status: Option<String>,
    text: Option<String>,
    contact: Option<String>,
    channel: Option<String>,
}

impl Layout {
    /// The pointers of `route`.
    pub fn of(route: &Route) -> Self {
        let default_fields = Fields::default();
        let fields = route.fields.as_ref().unwrap_or(&default_fields);
        let mut message_id = vec![fields.message_id.clone()];
        if let Some(status) = &route.guard.status {
            message_id.push(status.message_id.clone());
        }
        Self {
            event_id: fields.event_id.clone(),
            event_type: fields.event_type.clone(),
            timestamp: fields.timestamp.clone(),
            message_id,
            status: route.guard.status.as_ref().map(|s| s.status.clone()),
            text: route.guard.keywords.as_ref().map(|k| k.text.clone()),
            contact: route.guard.keywords.as_ref().map(|k| k.contact.clone()),
            channel: route.guard.keywords.as_ref().map(|k| k.channel.clone()),
        }
    }
}

/// The event `item` stands for, laid out by `layout`.
pub fn make(item: &Listed, layout: &Layout) -> Result<Made, Skip> {
    let (event_type, id, timestamp) = kind_of(item)?;
    let data = data_of(item);
    let mut body = Value::Object(Map::new());
    // `data` first: a route may read its id or type from inside it.
    set(&mut body, "/data", Value::Object(data));
    set(&mut body, &layout.event_id, Value::from(id.as_str()));
    set(&mut body, &layout.event_type, Value::from(event_type));
    if let Some(ts) = timestamp {
        set(&mut body, &layout.timestamp, Value::from(ts));
    }
    // A route that reads these elsewhere finds them where it looks.
    for ptr in &layout.message_id {
        set(&mut body, ptr, Value::from(item.id.as_str()));
    }
    for (ptr, value) in [
        (&layout.status, &item.status),
        (&layout.text, &item.text),
        (&layout.contact, &item.from),
        (&layout.channel, &item.to),
    ] {
        if let (Some(ptr), Some(v)) = (ptr, value) {
            set(&mut body, ptr, Value::from(v.as_str()));
        }
    }
    Ok(Made {
        id,
        event_type,
        body: Bytes::from(body.to_string()),
    })
}

/// The event type of `item`, its event id, and the time it happened at.
fn kind_of(item: &Listed) -> Result<(&'static str, String, Option<&str>), Skip> {
    Ok(match item.direction {
        Direction::Outbound => {
            let status = item.status.as_deref().ok_or(Skip::NoStatus)?;
            (
                STATUS_EVENT,
                format!("{ID_PREFIX}{}:{status}", item.id),
                item.updated_at.as_deref().or(item.created_at.as_deref()),
            )
        }
        Direction::Inbound => (
            RECEIVED_EVENT,
            format!("{ID_PREFIX}{}:received", item.id),
            item.created_at.as_deref().or(item.updated_at.as_deref()),
        ),
    })
}

/// The event's `data`: the listed message's fields, those it has.
fn data_of(item: &Listed) -> Map<String, Value> {
    let mut data = Map::new();
    data.insert("message_id".into(), Value::from(item.id.as_str()));
    let direction = match item.direction {
        Direction::Inbound => "inbound",
        Direction::Outbound => "outbound",
    };
    data.insert("direction".into(), Value::from(direction));
    for (name, value) in [
        ("status", &item.status),
        ("from", &item.from),
        ("to", &item.to),
        ("text", &item.text),
        ("created_at", &item.created_at),
        ("updated_at", &item.updated_at),
    ] {
        if let Some(v) = value {
            data.insert(name.into(), Value::from(v.as_str()));
        }
    }
    data
}

/// Writes `value` at JSON Pointer `ptr`, making the objects on the way; a member on the
/// way that is not an object is left as it is.
fn set(root: &mut Value, ptr: &str, value: Value) {
    let Some(path) = ptr.strip_prefix('/') else {
        return;
    };
    let tokens: Vec<String> = path
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let Some((last, on_the_way)) = tokens.split_last() else {
        return;
    };
    let mut here = root;
    for token in on_the_way {
        let Value::Object(map) = here else { return };
        here = map
            .entry(token.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if let Value::Object(map) = here {
        map.insert(last.clone(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn route(extra: &str) -> Route {
        let text = format!(
            "listen:\n  addr: 127.0.0.1:0\nroutes:\n  - name: b\n    path: /b\n    secrets: [{{secret_env: S}}]\n{extra}"
        );
        Config::parse(&text).expect("config").routes.remove(0)
    }

    fn listed(direction: Direction, status: Option<&str>) -> Listed {
        Listed {
            id: "msg_1".into(),
            direction,
            status: status.map(str::to_owned),
            from: Some("+15550001".into()),
            to: Some("+15550002".into()),
            text: Some("STOP".into()),
            created_at: Some("2026-11-29T10:00:00Z".into()),
            updated_at: Some("2026-11-29T10:05:00Z".into()),
        }
    }

    fn json(made: &Made) -> Value {
        serde_json::from_slice(&made.body).expect("json")
    }

    #[test]
    fn an_outbound_status_is_a_status_event_at_its_update_time() {
        let made = make(
            &listed(Direction::Outbound, Some("delivered")),
            &Layout::of(&route("")),
        )
        .expect("made");
        assert_eq!(made.event_type, STATUS_EVENT);
        assert_eq!(made.id, "reconcile:msg_1:delivered");
        let v = json(&made);
        assert_eq!(v["event"], "message.status");
        assert_eq!(v["timestamp"], "2026-11-29T10:05:00Z");
        assert_eq!(v["data"]["message_id"], "msg_1");
        assert_eq!(v["data"]["status"], "delivered");
    }

    #[test]
    fn an_inbound_message_is_a_received_event_at_its_creation_time() {
        let made = make(&listed(Direction::Inbound, None), &Layout::of(&route(""))).expect("made");
        assert_eq!(made.event_type, RECEIVED_EVENT);
        let v = json(&made);
        assert_eq!(v["timestamp"], "2026-11-29T10:00:00Z");
        assert_eq!(
            (&v["data"]["from"], &v["data"]["to"], &v["data"]["text"]),
            (
                &Value::from("+15550001"),
                &Value::from("+15550002"),
                &Value::from("STOP")
            )
        );
    }

    #[test]
    fn an_outbound_message_without_a_status_makes_no_event() {
        assert_eq!(
            make(&listed(Direction::Outbound, None), &Layout::of(&route(""))),
            Err(Skip::NoStatus)
        );
    }

    #[test]
    fn a_route_with_its_own_pointers_finds_the_values_there() {
        let r = route(
            "    fields: {event_id: /meta/id, message_id: /msg}\n    guard:\n      keywords: {events: [message.received], text: /body, contact: /who/from}\n",
        );
        let v = json(&make(&listed(Direction::Inbound, None), &Layout::of(&r)).expect("made"));
        assert_eq!(v["meta"]["id"], "reconcile:msg_1:received");
        assert_eq!(v["msg"], "msg_1");
        assert_eq!(v["body"], "STOP");
        assert_eq!(v["who"]["from"], "+15550001");
    }
}
