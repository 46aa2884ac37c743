//! What a route's sender brings to it: the `fields` and `guard` sections its profile starts
//! with (`Sender::fields`, `Sender::guard`), filled into the parsed config tree before it is
//! read into [`crate::config::Config`], so a route states only what differs and
//! `check-config` prints the rules in force. A route without `guard` gets its sender's guard;
//! `guard: {}` has none.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::providers::Profile;

/// Fills each route's profile defaults into the parsed config: keys the route sets win.
/// Fails only for a `fields` section on a route whose sender names its events itself.
pub fn fill_route_defaults(tree: &mut Value) -> Result<(), String> {
    let Some(routes) = tree.get_mut("routes").and_then(Value::as_array_mut) else {
        return Ok(());
    };
    for (i, route) in routes.iter_mut().enumerate() {
        let Some(route) = route.as_object_mut() else {
            continue;
        };
        // A profile that is not one is left to the schema pass, which names its key.
        let Some(profile) = profile_of(route) else {
            continue;
        };
        let sender = profile.sender();
        match sender.fields() {
            Ok(defaults) => fill(route, "fields", defaults),
            Err(reason) if route.contains_key("fields") => {
                return Err(format!("routes[{i}].fields: {reason}"));
            }
            Err(_) => {}
        }
        if let Some(defaults) = sender.guard() {
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

/// The profile a route of the parsed tree names: the default when it names none.
fn profile_of(route: &Map<String, Value>) -> Option<Profile> {
    match route.get("profile") {
        None => Some(Profile::default()),
        Some(name) => Profile::deserialize(name).ok(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
