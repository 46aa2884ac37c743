//! What the Twilio and Telnyx profiles bring to a route: where their events' fields are, the
//! guard rules with their status ranks, and the form of Twilio's `public_url`.
//!
//! The defaults are filled into the parsed config tree before it is read into
//! [`crate::config::Config`], so a route states only what differs, and `check-config` prints
//! the rules in force. A route without `guard` gets its profile's guard; `guard: {}` has none.

use serde_json::{json, Map, Value};

/// The status ranks of the default profile, used when a route configures none.
pub const DEFAULT_RANKS: [(&str, u32); 8] = [
    ("queued", 0),
    ("accepted", 0),
    ("sending", 1),
    ("sent", 2),
    ("delivered", 3),
    ("undelivered", 3),
    ("failed", 3),
    ("read", 4),
];
/// The default profile's opt-out keywords.
pub const DEFAULT_STOP: [&str; 6] = ["STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT"];
/// The default profile's opt-in keywords.
pub const DEFAULT_START: [&str; 3] = ["START", "UNSTOP", "YES"];
/// The default profile's help keywords.
pub const DEFAULT_HELP: [&str; 2] = ["HELP", "INFO"];

/// Twilio's message statuses in the order a message goes through them. A scheduled or
/// Messaging Service message starts `scheduled` or `accepted`, then `queued`; `received`,
/// `canceled` and the failures are final like `delivered`; `read` (WhatsApp) comes last.
pub const TWILIO_RANKS: [(&str, u32); 12] = [
    ("accepted", 0),
    ("scheduled", 0),
    ("queued", 1),
    ("sending", 2),
    ("receiving", 2),
    ("sent", 3),
    ("delivered", 4),
    ("undelivered", 4),
    ("failed", 4),
    ("received", 4),
    ("canceled", 4),
    ("read", 5),
];

/// Telnyx's per-recipient message statuses (`data.payload.to[0].status`), in order.
pub const TELNYX_RANKS: [(&str, u32); 8] = [
    ("queued", 0),
    ("sending", 1),
    ("sent", 2),
    ("delivered", 3),
    ("delivery_unconfirmed", 3),
    ("delivery_failed", 3),
    ("sending_failed", 3),
    ("expired", 3),
];

/// The event type of a Twilio status callback (it carries `MessageStatus`).
pub const TWILIO_STATUS_EVENT: &str = "message.status";
/// The event type of an inbound Twilio message (no `MessageStatus`).
pub const TWILIO_RECEIVED_EVENT: &str = "message.received";

fn ranks(table: &[(&str, u32)]) -> Value {
    Value::Object(
        table
            .iter()
            .map(|(name, rank)| ((*name).to_owned(), json!(rank)))
            .collect(),
    )
}

/// The `fields` a profile reads its events with (the schema's for the others); none for Twilio,
/// whose event id and type are made of several form fields.
fn fields(profile: &str) -> Option<Value> {
    match profile {
        "twilio" => None,
        "telnyx" => Some(json!({
            "event_id": "/data/id",
            "event_type": "/data/event_type",
            "timestamp": "/data/occurred_at",
        })),
        // An empty section: the schema's defaults (`/id`, `/event`, `/timestamp`) fill it.
        _ => Some(json!({})),
    }
}

/// The `guard` a profile brings, if it has one.
fn guard(profile: &str) -> Option<Value> {
    match profile {
        // Form fields are read as one-token pointers: `/Body` is the field `Body`.
        "twilio" => Some(json!({
            "status": {
                "events": [TWILIO_STATUS_EVENT],
                "message_id": "/MessageSid",
                "status": "/MessageStatus",
                "ranks": ranks(&TWILIO_RANKS),
            },
            "keywords": {
                "events": [TWILIO_RECEIVED_EVENT],
                "text": "/Body",
                "contact": "/From",
                "channel": "/To",
            },
        })),
        "telnyx" => Some(json!({
            "status": {
                "events": ["message.sent", "message.finalized"],
                "message_id": "/data/payload/id",
                "status": "/data/payload/to/0/status",
                "ranks": ranks(&TELNYX_RANKS),
            },
            "keywords": {
                "events": ["message.received"],
                "text": "/data/payload/text",
                "contact": "/data/payload/from/phone_number",
                "channel": "/data/payload/to/0/phone_number",
            },
        })),
        _ => None,
    }
}

/// Fills each route's profile defaults into the parsed config: keys the route sets win.
/// Fails only for a `fields` section on a Twilio route, which has no use for one.
pub fn fill_route_defaults(tree: &mut Value) -> Result<(), String> {
    let Some(routes) = tree.get_mut("routes").and_then(Value::as_array_mut) else {
        return Ok(());
    };
    for (i, route) in routes.iter_mut().enumerate() {
        let Some(route) = route.as_object_mut() else {
            continue;
        };
        let profile = route
            .get("profile")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if profile == "twilio" && route.contains_key("fields") {
            return Err(format!(
                "routes[{i}].fields: not used with profile twilio: its event id is MessageSid \
                 with MessageStatus, its type message.status or message.received"
            ));
        }
        if let Some(defaults) = fields(&profile) {
            fill(route, "fields", defaults);
        }
        if let Some(defaults) = guard(&profile) {
            match route.get_mut("guard") {
                None => {
                    route.insert("guard".into(), defaults);
                }
                Some(Value::Object(given)) => {
                    for rules in ["status", "keywords"] {
                        if let (Some(Value::Object(set)), Some(default)) =
                            (given.get_mut(rules), defaults.get(rules))
                        {
                            fill_missing(set, default);
                        }
                    }
                }
                // Not a mapping: the schema pass reports it with its key path.
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// Inserts `defaults` under `key`, or its missing members if the route has the key.
fn fill(route: &mut Map<String, Value>, key: &str, defaults: Value) {
    match route.get_mut(key) {
        None => {
            route.insert(key.to_owned(), defaults);
        }
        Some(Value::Object(given)) => fill_missing(given, &defaults),
        Some(_) => {}
    }
}

fn fill_missing(given: &mut Map<String, Value>, defaults: &Value) {
    if let Some(defaults) = defaults.as_object() {
        for (k, v) in defaults {
            given.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
}

/// A URL Twilio can be told to request: `http(s)://host[:port]/path`, no query (the
/// request's own query is appended when checking), no fragment, no user info.
pub fn check_public_url(url: &str) -> Result<(), String> {
    let Some((_, rest)) = url
        .strip_prefix("https://")
        .map(|r| ("https", r))
        .or_else(|| url.strip_prefix("http://").map(|r| ("http", r)))
    else {
        return Err(format!("{url:?} must start with https:// or http://"));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("{url:?} needs a host and no user info"));
    }
    if url.contains(['?', '#']) || url.chars().any(char::is_whitespace) {
        return Err(format!(
            "{url:?} must have no query, fragment or white space (a request's query is appended to it)"
        ));
    }
    Ok(())
}

/// The forms of `public_url` a Twilio signature may have been made over: as configured,
/// and with the port left out or the scheme's default port written, since senders and
/// Twilio's own validators differ on whether the port is part of the signed URL.
pub fn public_url_forms(url: &str) -> Vec<String> {
    let (scheme, rest, default_port) = if let Some(r) = url.strip_prefix("https://") {
        ("https", r, "443")
    } else if let Some(r) = url.strip_prefix("http://") {
        ("http", r, "80")
    } else {
        return vec![url.to_owned()];
    };
    let (authority, path) = rest.find('/').map_or((rest, ""), |at| rest.split_at(at));
    // The port follows the last ':' unless that ':' is inside an IPv6 literal.
    let host = match authority.rfind(':') {
        Some(at) if !authority[at..].contains(']') => &authority[..at],
        _ => authority,
    };
    let mut forms = vec![url.to_owned()];
    for form in [
        format!("{scheme}://{host}{path}"),
        format!("{scheme}://{host}:{default_port}{path}"),
    ] {
        if !forms.contains(&form) {
            forms.push(form);
        }
    }
    forms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms_with_and_without_the_port() {
        assert_eq!(
            public_url_forms("https://hooks.example.com/webhooks/twilio"),
            [
                "https://hooks.example.com/webhooks/twilio",
                "https://hooks.example.com:443/webhooks/twilio"
            ]
        );
        assert_eq!(
            public_url_forms("http://10.0.0.1:8080/t"),
            [
                "http://10.0.0.1:8080/t",
                "http://10.0.0.1/t",
                "http://10.0.0.1:80/t"
            ]
        );
        assert_eq!(
            public_url_forms("https://[::1]/t"),
            ["https://[::1]/t", "https://[::1]:443/t"]
        );
    }

    #[test]
    fn public_url_must_be_a_plain_http_url() {
        assert!(check_public_url("https://hooks.example.com/webhooks/twilio").is_ok());
        assert!(check_public_url("http://hooks.example.com").is_ok());
        for bad in [
            "hooks.example.com/x",
            "ftp://h/x",
            "https:///x",
            "https://h/x?a=1",
            "https://h/x#f",
            "https://u:p@h/x",
            "https://h/a b",
        ] {
            assert!(check_public_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_a_route_sets_win_over_its_profile() {
        let mut tree = json!({"routes": [
            {"profile": "telnyx", "fields": {"event_id": "/x"},
             "guard": {"status": {"events": ["message.finalized"]}}},
            {"profile": "twilio"},
            {"profile": "twilio", "guard": {}},
            {"name": "botix"},
        ]});
        fill_route_defaults(&mut tree).expect("fills");
        let r = &tree["routes"];
        assert_eq!(r[0]["fields"]["event_id"], "/x");
        assert_eq!(r[0]["fields"]["event_type"], "/data/event_type");
        assert_eq!(
            r[0]["guard"]["status"]["events"],
            json!(["message.finalized"])
        );
        assert_eq!(r[0]["guard"]["status"]["ranks"]["delivery_failed"], 3);
        assert!(
            r[0]["guard"].get("keywords").is_none(),
            "the route chose its rules"
        );
        assert_eq!(r[1]["guard"]["keywords"]["text"], "/Body");
        assert_eq!(r[2]["guard"], json!({}));
        assert!(
            r[3].get("guard").is_none(),
            "botix has no guard unless configured"
        );
        assert_eq!(r[3]["fields"], json!({}), "the schema's defaults fill it");
        assert!(r[1].get("fields").is_none());
        let mut twilio_fields = json!({"routes": [{"profile": "twilio", "fields": {}}]});
        assert!(fill_route_defaults(&mut twilio_fields)
            .expect_err("refused")
            .contains("routes[0].fields"));
    }
}
