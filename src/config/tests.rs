//! The config's tests: parsing, every refusal of `validate`, printing, and the configuration
//! table of docs/configuration.md against the schema.

use std::path::Path;
use std::time::Duration;

use super::units::{duration, size};
use super::*;

const MINIMAL: &str = "
listen:
  addr: 127.0.0.1:8080
routes:
  - name: botix
    path: /webhooks/botix
    secrets:
      - secret_env: BOTIX_WEBHOOK_SECRET
";

fn err(text: &str) -> String {
    match Config::parse(text) {
        Ok(_) => panic!("config was accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn minimal_config_gets_spec_defaults() {
    let c = Config::parse(MINIMAL).expect("minimal config parses");
    assert_eq!(c.limits.max_body_bytes.get(), 65536);
    assert_eq!(c.dedup.ttl, Duration::from_secs(72 * 3600));
    assert_eq!(c.amqp.exchange, "webhooks");
    assert_eq!(c.amqp.routing_key, "{event}");
    assert_eq!(c.max_clock_skew, Duration::from_secs(300));
    assert_eq!(c.shutdown_grace, Duration::from_secs(25));
    assert_eq!(c.reload_poll, Duration::from_secs(2));
    assert_eq!(c.spool.max_bytes, 1 << 30);
    assert_eq!(c.routes[0].fields.as_ref().expect("fields").event_id, "/id");
    assert_eq!(c.routes[0].profile, Profile::Botix);
}

#[test]
fn unknown_key_is_named_with_its_path() {
    let text = format!("{MINIMAL}limits:\n  max_body_byts: 10\n");
    let e = err(&text);
    assert!(e.contains("limits.max_body_byts"), "{e}");
}

#[test]
fn unknown_nested_route_key_is_named() {
    let text = MINIMAL.replace("    path:", "    pth: x\n    path:");
    let e = err(&text);
    assert!(e.contains("routes[0].pth"), "{e}");
}

#[test]
fn durations_and_sizes_in_human_form() {
    let text = format!(
        "{MINIMAL}limits:\n  max_body_bytes: 1KiB\n  header_read_timeout: 250ms\ndedup:\n  ttl: 7d\nspool:\n  max_bytes: 2048\n"
    );
    let c = Config::parse(&text).expect("parses");
    assert_eq!(c.limits.max_body_bytes.get(), 1024);
    assert_eq!(c.limits.header_read_timeout, Duration::from_millis(250));
    assert_eq!(c.dedup.ttl, Duration::from_secs(7 * 86400));
    assert_eq!(c.spool.max_bytes, 2048);
}

#[test]
fn spool_stall_after_and_exchange_length_are_checked() {
    let c = Config::parse(MINIMAL).expect("minimal config parses");
    assert_eq!(c.spool.stall_after, Duration::from_secs(30));
    let c = Config::parse(&format!("{MINIMAL}spool:\n  stall_after: 2m\n")).expect("parses");
    assert_eq!(c.spool.stall_after, Duration::from_secs(120));
    let e = err(&format!("{MINIMAL}spool:\n  stall_after: 5s\n"));
    assert!(e.contains("spool.stall_after"), "{e}");
    let long = "x".repeat(256);
    let e = err(&format!("{MINIMAL}amqp:\n  exchange: {long}\n"));
    assert!(e.contains("amqp.exchange"), "{e}");
}

#[test]
fn bad_duration_is_rejected_with_its_key() {
    let e = err(&format!("{MINIMAL}dedup:\n  ttl: forever\n"));
    assert!(e.contains("dedup.ttl"), "{e}");
}

#[test]
fn secret_source_needs_exactly_one_key() {
    for (source, found) in [
        (
            "- secret_env: A\n        secret_file: /b",
            "found secret_env and secret_file",
        ),
        ("- {}", "found none"),
        ("- secret: ~", "found none"),
    ] {
        let text = MINIMAL.replace("- secret_env: BOTIX_WEBHOOK_SECRET", source);
        let e = err(&text);
        assert!(
            e.contains("routes[0].secrets[0]: exactly one of secret_env, secret_file, secret")
                && e.contains(found),
            "{e}"
        );
    }
}

#[test]
fn secret_sources_read_and_print_as_written_but_an_inline_value_never_prints() {
    let text = MINIMAL.replace(
        "- secret_env: BOTIX_WEBHOOK_SECRET",
        "- secret_env: A\n      - secret_file: /b\n      - secret: topsecretvalue",
    );
    let c = Config::parse(&text).expect("parses");
    assert_eq!(
        c.routes[0].secrets,
        [
            SecretSource::Env { var: "A".into() },
            SecretSource::File { path: "/b".into() },
            SecretSource::Inline {
                value: "topsecretvalue".into()
            },
        ]
    );
    let out = c.redacted_yaml();
    for line in ["secret_env: A", "secret_file: /b", "secret: \"[redacted]\""] {
        assert!(out.contains(line), "{line} missing in:\n{out}");
    }
    let debug = format!("{:?}", c.routes[0].secrets);
    assert!(
        !debug.contains("topsecretvalue") && debug.contains("/b"),
        "{debug}"
    );
}

#[test]
fn route_names_cannot_make_store_keys_ambiguous() {
    for name in ["bo:tix", "guard", "lock", r"a\0b"] {
        let text = MINIMAL.replace("name: botix", &format!("name: \"{name}\""));
        assert!(err(&text).contains("routes[0].name"), "{name}");
    }
}

#[test]
fn hardening_limits_have_defaults_and_are_checked() {
    let c = Config::parse(MINIMAL).expect("parses");
    let l = &c.limits;
    assert_eq!(l.idle_timeout, Duration::from_secs(60));
    assert_eq!(l.max_connection_age, Duration::from_secs(600));
    assert_eq!(l.h2_max_concurrent_streams.get(), 16);
    assert_eq!(l.max_unverified_body_bytes, 32 << 20);
    assert_eq!(
        (
            l.failed_verification_per_peer.per_second.get(),
            l.failed_verification_per_peer.burst.get()
        ),
        (5, 20)
    );
    assert_eq!(
        (
            l.failed_verification_ipv4_prefix,
            l.failed_verification_ipv6_prefix
        ),
        (32, 64)
    );
    assert_eq!(
        l.peer_address_header, None,
        "no proxy is trusted by default"
    );
    for (extra, named) in [
        (
            "  max_unverified_body_bytes: 1KiB\n",
            "max_unverified_body_bytes",
        ),
        (
            "  h2_max_concurrent_streams: 0\n",
            "h2_max_concurrent_streams",
        ),
        ("  idle_timeout: 0s\n", "timeouts"),
        (
            "  peer_address_header: \"bad header\"\n",
            "peer_address_header",
        ),
        (
            "  failed_verification_per_peer: {per_second: 0, burst: 1}\n",
            "failed_verification_per_peer",
        ),
        (
            "  failed_verification_ipv4_prefix: 0\n",
            "failed_verification_ipv4_prefix: must be 1 to 32",
        ),
        (
            "  failed_verification_ipv4_prefix: 33\n",
            "failed_verification_ipv4_prefix: must be 1 to 32",
        ),
        (
            "  failed_verification_ipv6_prefix: 0\n",
            "failed_verification_ipv6_prefix: must be 1 to 128",
        ),
        (
            "  failed_verification_ipv6_prefix: 129\n",
            "failed_verification_ipv6_prefix: must be 1 to 128",
        ),
    ] {
        let e = err(&format!("{MINIMAL}limits:\n{extra}"));
        assert!(e.contains(named), "{e}");
    }
}

#[test]
fn unsigned_header_fallbacks_are_opt_in() {
    let c = Config::parse(MINIMAL).expect("parses");
    assert!(
        !c.routes[0]
            .fields
            .as_ref()
            .expect("fields")
            .unsigned_header_fallbacks
    );
    let text = MINIMAL.replace(
        "    secrets:",
        "    fields:\n      unsigned_header_fallbacks: true\n    secrets:",
    );
    let c = Config::parse(&text).expect("parses");
    assert!(
        c.routes[0]
            .fields
            .as_ref()
            .expect("fields")
            .unsigned_header_fallbacks
    );
}

#[test]
fn an_empty_inline_secret_is_refused_naming_route_and_source() {
    let text = MINIMAL.replace(
        "- secret_env: BOTIX_WEBHOOK_SECRET",
        "- secret: long-enough-secret-1234\n      - secret: \"\"",
    );
    let e = err(&text);
    assert!(
        e.contains("routes[0].secrets[1].secret") && e.contains("route botix"),
        "{e}"
    );
}

#[test]
fn custom_profile_needs_its_scheme() {
    let text = MINIMAL.replace("    secrets:", "    profile: custom\n    secrets:");
    assert!(err(&text).contains("signature"));
}

#[test]
fn twilio_needs_a_public_url_and_only_twilio_takes_one() {
    let twilio = MINIMAL.replace("    secrets:", "    profile: twilio\n    secrets:");
    assert!(err(&twilio).contains("public_url: required"));
    let bad = twilio.replace(
        "    secrets:",
        "    public_url: https://h.example/t?x=1\n    secrets:",
    );
    assert!(err(&bad).contains("public_url"));
    let ok = twilio.replace(
        "    secrets:",
        "    public_url: https://h.example/t\n    secrets:",
    );
    let c = Config::parse(&ok).expect("parses");
    let route = &c.routes[0];
    assert_eq!(route.profile, Profile::Twilio);
    assert!(route.fields.is_none(), "Twilio reads its own fields");
    assert!(
        !c.redacted_yaml().contains("fields"),
        "{}",
        c.redacted_yaml()
    );
    let status = route.guard.status.as_ref().expect("Twilio's status rules");
    assert_eq!(
        (status.message_id.as_str(), status.status.as_str()),
        ("/MessageSid", "/MessageStatus")
    );
    assert_eq!(status.ranks["sent"], 3);
    assert_eq!(status.ranks["delivered"], 4);
    let keywords = route
        .guard
        .keywords
        .as_ref()
        .expect("Twilio's keyword rules");
    assert_eq!(keywords.text, "/Body");
    assert_eq!(keywords.stop, DEFAULT_STOP.to_vec());
    let elsewhere = MINIMAL.replace(
        "    secrets:",
        "    public_url: https://h.example/t\n    secrets:",
    );
    assert!(err(&elsewhere).contains("only allowed with profile twilio"));
}

#[test]
fn telnyx_routes_read_telnyx_fields_unless_told_otherwise() {
    let telnyx = MINIMAL.replace("    secrets:", "    profile: telnyx\n    secrets:");
    let c = Config::parse(&telnyx).expect("parses");
    let route = &c.routes[0];
    let fields = route.fields.as_ref().expect("fields");
    assert_eq!(fields.event_id, "/data/id");
    assert_eq!(fields.timestamp, "/data/occurred_at");
    let status = route.guard.status.as_ref().expect("status rules");
    assert_eq!(status.status, "/data/payload/to/0/status");
    assert_eq!(status.ranks["delivery_failed"], 3);
    let own = telnyx.replace(
        "    secrets:",
        "    fields:\n      event_id: /data/payload/id\n    guard: {}\n    secrets:",
    );
    let c = Config::parse(&own).expect("parses");
    let fields = c.routes[0].fields.as_ref().expect("fields");
    assert_eq!(fields.event_id, "/data/payload/id");
    assert_eq!(fields.event_type, "/data/event_type");
    assert!(c.routes[0].guard.status.is_none() && c.routes[0].guard.keywords.is_none());
}

/// Each refusal of `validate`, one config a row: what is wrong, and the key the error
/// must name. A row whose config is accepted, or refused for another key, fails.
#[test]
fn each_refusal_names_its_key() {
    let route = |extra: &str| MINIMAL.replace("    secrets:", &format!("{extra}    secrets:"));
    let second_route = |name: &str, path: &str| {
        format!(
            "{MINIMAL}  - name: \"{name}\"\n    path: {path}\n    secrets:\n      - secret: x\n"
        )
    };
    let rows: Vec<(&str, String, &str)> = vec![
        (
            "empty route name",
            MINIMAL.replace("name: botix", "name: \"\""),
            "routes[0].name",
        ),
        (
            "a second route with the first's name",
            second_route("botix", "/other"),
            "routes[1].name",
        ),
        (
            "a path without a leading slash",
            MINIMAL.replace("path: /webhooks/botix", "path: webhooks"),
            "routes[0].path",
        ),
        (
            "a signature block with the botix profile",
            route("    signature: {header: x-sig, encoding: hex}\n"),
            "routes[0].signature",
        ),
        (
            "a public_url with the botix profile",
            route("    public_url: https://example.org/hook\n"),
            "routes[0].public_url",
        ),
        (
            "a rate limit of zero per second",
            route("    rate_limit: {per_second: 0, burst: 5}\n"),
            "routes[0].rate_limit",
        ),
        (
            "a rate limit with no burst",
            route("    rate_limit: {per_second: 5, burst: 0}\n"),
            "routes[0].rate_limit",
        ),
        (
            "a zero body limit",
            format!("{MINIMAL}limits: {{max_body_bytes: 0}}\n"),
            "limits.max_body_bytes",
        ),
        (
            "no connections",
            format!("{MINIMAL}limits: {{max_connections: 0}}\n"),
            "limits.max_connections",
        ),
        (
            "a hot set under 1024 entries",
            format!("{MINIMAL}store: {{hot_entries: 1023}}\n"),
            "store.hot_entries",
        ),
        (
            "a spool cache under 1MiB",
            format!("{MINIMAL}store: {{cache: 1000KiB}}\n"),
            "store.cache",
        ),
        (
            "a journal segment under 64KiB",
            format!("{MINIMAL}store: {{journal_segment: 63KiB}}\n"),
            "store.journal_segment",
        ),
        (
            "a commit interval over 100ms",
            format!("{MINIMAL}store: {{commit_interval: 101ms}}\n"),
            "store.commit_interval",
        ),
        (
            "a hung thread's deadline no longer than the confirm timeout",
            format!("{MINIMAL}store: {{hung_after: 5s}}\namqp: {{confirm_timeout: 5s}}\n"),
            "store.hung_after",
        ),
        (
            "a header limit under 1KiB",
            format!("{MINIMAL}limits: {{max_header_bytes: 1000}}\n"),
            "limits.max_header_bytes",
        ),
        (
            "a lease no longer than the confirm timeout",
            format!("{MINIMAL}dedup: {{in_flight_lease: 5s}}\namqp: {{confirm_timeout: 5s}}\n"),
            "dedup.in_flight_lease",
        ),
        (
            "a lease no longer than the lock wait, the publish and the spool's fsync",
            format!("{MINIMAL}dedup: {{in_flight_lease: 15s, in_flight_wait: 5s}}\namqp: {{confirm_timeout: 5s}}\n"),
            "dedup.in_flight_lease: must be longer than 15s",
        ),
        (
            "a zero dedup ttl",
            format!("{MINIMAL}dedup: {{ttl: 0s}}\n"),
            "dedup.ttl: must be at least 1s",
        ),
        (
            "a dedup ttl under a second",
            format!("{MINIMAL}dedup: {{ttl: 999ms}}\n"),
            "dedup.ttl",
        ),
        (
            "the admin listener on the webhook address",
            format!("{MINIMAL}admin: {{addr: 127.0.0.1:8080}}\n"),
            "admin.addr",
        ),
        ("no HTTP/2 streams", format!("{MINIMAL}limits: {{h2_max_concurrent_streams: 0}}\n"), "limits.h2_max_concurrent_streams"),
        (
            "an unverified budget smaller than one body",
            format!("{MINIMAL}limits: {{max_body_bytes: 2KiB, max_unverified_body_bytes: 1KiB}}\n"),
            "limits.max_unverified_body_bytes",
        ),
        ("no header read time", format!("{MINIMAL}limits: {{header_read_timeout: 0s}}\n"), "limits: timeouts"),
        ("no body read time", format!("{MINIMAL}limits: {{body_read_timeout: 0s}}\n"), "limits: timeouts"),
        ("no idle time", format!("{MINIMAL}limits: {{idle_timeout: 0s}}\n"), "limits: timeouts"),
        ("no connection age", format!("{MINIMAL}limits: {{max_connection_age: 0s}}\n"), "limits: timeouts"),
        (
            "no failed verifications per second",
            format!("{MINIMAL}limits: {{failed_verification_per_peer: {{per_second: 0, burst: 5}}}}\n"),
            "limits.failed_verification_per_peer",
        ),
        (
            "no burst of failed verifications",
            format!("{MINIMAL}limits: {{failed_verification_per_peer: {{per_second: 5, burst: 0}}}}\n"),
            "limits.failed_verification_per_peer",
        ),
    ];
    for (what, text, key) in rows {
        let error = match Config::parse(&text) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => e.to_string(),
        };
        assert!(error.contains(key), "{what}: {error}");
    }
    // The limits' edges are allowed.
    let header_at_limit = format!("{MINIMAL}limits: {{max_header_bytes: 1024}}\n");
    assert!(Config::parse(&header_at_limit).is_ok());
    let store_at_limits =
        format!("{MINIMAL}store: {{hot_entries: 1024, cache: 1MiB, journal_segment: 64KiB, commit_interval: 100ms}}\n");
    assert!(Config::parse(&store_at_limits).is_ok());
    let shortest_ttl = format!("{MINIMAL}dedup: {{ttl: 1s}}\n");
    assert!(Config::parse(&shortest_ttl).is_ok());
    let shortest_lease = format!(
        "{MINIMAL}dedup: {{in_flight_lease: 15001ms, in_flight_wait: 5s}}\namqp: {{confirm_timeout: 5s}}\n"
    );
    assert!(Config::parse(&shortest_lease).is_ok());
    let commits_back_to_back = format!("{MINIMAL}store: {{commit_interval: 0s}}\n");
    assert!(Config::parse(&commits_back_to_back).is_ok());
    let budget_of_one_body =
        format!("{MINIMAL}limits: {{max_body_bytes: 2KiB, max_unverified_body_bytes: 2KiB}}\n");
    assert!(Config::parse(&budget_of_one_body).is_ok());
    // `sled`, the local backend's former name, is read as `local`, with a warning.
    let former = Config::parse(&format!("{MINIMAL}dedup: {{backend: sled}}\n")).expect("sled");
    assert_eq!(former.dedup.backend, Backend::Local);
    assert_eq!(
        former.deprecations().len(),
        1,
        "{:?}",
        former.deprecations()
    );
    let current = Config::parse(&format!("{MINIMAL}dedup: {{backend: local}}\n")).expect("local");
    assert_eq!(current.dedup.backend, Backend::Local);
    assert!(current.deprecations().is_empty());
    // A Redis URL is checked only where Redis is used, and both of its schemes pass.
    for (backend, url) in [
        ("local", "http://x"),
        ("redis", "redis://r:6379"),
        ("redis", "rediss://r:6380"),
    ] {
        let text = format!("{MINIMAL}dedup: {{backend: {backend}}}\nredis: {{url: \"{url}\"}}\n");
        assert!(Config::parse(&text).is_ok(), "{backend} with {url}");
    }
    // The admin listener may share port 0 (tests bind both on any free port).
    let both_any =
        MINIMAL.replace("127.0.0.1:8080", "127.0.0.1:0") + "admin: {addr: 127.0.0.1:0}\n";
    assert!(Config::parse(&both_any).is_ok());
}

#[test]
fn duplicate_paths_and_empty_routes_are_rejected() {
    assert!(err("listen:\n  addr: 127.0.0.1:1\nroutes: []\n").contains("at least one"));
    let twice = format!(
        "{MINIMAL}  - name: other\n    path: /webhooks/botix\n    secrets:\n      - secret: x\n"
    );
    assert!(err(&twice).contains("used twice"));
}

#[test]
fn yaml_1_1_booleans_in_keyword_lists_stay_words() {
    let text = format!(
        "{MINIMAL}    guard:\n      keywords:\n        events: [message.received]\n        start: [YES, ON, Si]\n"
    );
    let c = Config::parse(&text).expect("parses");
    let kw = c.routes[0].guard.keywords.as_ref().expect("keywords");
    assert_eq!(kw.start, vec!["YES", "ON", "Si"]);
    assert_eq!(kw.stop, DEFAULT_STOP.to_vec());
}

#[test]
fn redacted_yaml_hides_secrets_and_passwords() {
    let text = MINIMAL.replace(
        "- secret_env: BOTIX_WEBHOOK_SECRET",
        "- secret: topsecretvalue",
    );
    let c = Config::parse(&text).expect("parses");
    let out = c.redacted_yaml();
    assert!(!out.contains("topsecretvalue"), "{out}");
    assert!(!out.contains("guest:guest"), "{out}");
    assert!(out.contains("[redacted]"), "{out}");
}

#[test]
fn durations_print_as_written_and_defaults_as_documented() {
    let text = format!("{MINIMAL}dedup:\n  ttl: 72h\n  in_flight_lease: 1m\nmax_clock_skew: 90s\n");
    let out = Config::parse(&text).expect("parses").redacted_yaml();
    for line in [
        "ttl: 72h",
        "in_flight_lease: 1m",
        "max_clock_skew: 90s",
        "shutdown_grace: 25s",
        "confirm_timeout: 5s",
    ] {
        assert!(out.contains(line), "{line} missing in:\n{out}");
    }
    assert!(!out.contains("days"), "{out}");
    assert_eq!(duration::text(Duration::from_millis(1500)), "1500ms");
    assert_eq!(duration::text(Duration::from_secs(2 * 86400)), "2d");
}

#[test]
fn sizes_print_in_the_units_they_are_written_in() {
    let text = format!(
        "{MINIMAL}limits:\n  max_body_bytes: 64KiB\n  max_header_bytes: 1500\nspool:\n  max_bytes: 1GiB\nstore:\n  cache: 5MB\n"
    );
    let out = Config::parse(&text).expect("parses").redacted_yaml();
    for line in [
        "max_body_bytes: 64KiB",
        "max_header_bytes: 1500",
        "max_bytes: 1GiB",
        "cache: 5MB",
        "max_unverified_body_bytes: 32MiB",
    ] {
        assert!(out.contains(line), "{line} missing in:\n{out}");
    }
    // What is printed reads back as the same value.
    for bytes in [0, 1, 1023, 1024, 3 << 30, 5_000_000, 1_000_000_000_000] {
        assert_eq!(parse_size(&size::text(bytes)), Ok(bytes), "{bytes}");
    }
}

/// Every optional section set, so that every key of the schema is in the tree.
const EVERY_KEY: &str = "
listen:
  addr: 127.0.0.1:8443
  tls: {cert: /tls/crt, key: /tls/key}
amqp: {url_env: AMQP_URL, dropped_routing_key: 'dropped.{event}', queue: {name: events, type: classic, binding: 'message.#'}}
limits: {peer_address_header: x-forwarded-for}
redis: {url_env: REDIS_URL, sentinels: [s1.example:26379], master_name: main, sentinel_password_env: SENTINEL_PASSWORD, sentinel_password_file: /run/sentinel, cluster_nodes: [c1.example:7000]}
routes:
  - name: r
    path: /r
    profile: custom
    signature: {header: x-sig, prefix: 'sha256=', encoding: hex}
    rate_limit: {per_second: 1, burst: 1}
    secrets: [{secret_env: A}, {secret_file: /f}, {secret: s}]
    guard:
      status: {events: [a]}
      keywords: {events: [b], retention: 30d}
  - name: t
    path: /t
    profile: twilio
    public_url: https://hooks.example.com/t
    secrets: [{secret_env: T}]
  - name: e
    path: /e
    secrets: [{secret_env: E}]
    reconcile: {url: 'https://api.example/m', token_env: K}
  - name: f
    path: /f
    secrets: [{secret_env: F}]
    reconcile: {url: 'https://api.example/m', token_file: /k}
";

/// Only what is required, plus the sections whose keys have defaults of their own.
const DEFAULTS: &str = "
listen:
  addr: 127.0.0.1:8443
routes:
  - name: r
    path: /r
    secrets: [{secret_env: A}]
    guard:
      status: {events: [a]}
      keywords: {events: [b]}
    reconcile: {url: 'https://api.example/m', token_env: K}
";

/// (key, default cell) of each row of the table of docs/configuration.md.
fn documented_rows() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let doc = std::fs::read_to_string(path).expect("docs/configuration.md");
    let start = doc.find("\n## Every key").expect("an Every key section");
    let section = &doc[start + 1..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect()
}

/// The keys (paths such as `routes[].guard.status.ranks`) of a config tree; a documented
/// key is not descended into (ranks is a map of free keys).
fn keys_of(tree: &serde_json::Value, path: &str, documented: &[String], out: &mut Vec<String>) {
    use serde_json::Value;
    if !path.is_empty() && documented.iter().any(|k| k == path) {
        out.push(path.to_owned());
        return;
    }
    match tree {
        Value::Object(map) => {
            for (k, v) in map {
                let sub = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                keys_of(v, &sub, documented, out);
            }
        }
        Value::Array(items) if items.iter().any(Value::is_object) => {
            for item in items {
                keys_of(item, &format!("{path}[]"), documented, out);
            }
        }
        // Unset here; EVERY_KEY sets every optional key in some route.
        Value::Null => {}
        _ => out.push(path.to_owned()),
    }
}

/// The value at a documented key path; `[]` takes the first element.
fn at<'a>(tree: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    key.split('.')
        .try_fold(tree, |node, part| match part.strip_suffix("[]") {
            Some(name) => node.get(name)?.get(0),
            None => node.get(part),
        })
}

/// Whether the `documented` default (the text between backticks) is `actual`.
fn same_default(documented: &str, actual: &serde_json::Value) -> bool {
    use serde_json::Value;
    if actual.as_str() == Some(documented) {
        return true;
    }
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    let Ok(written) = serde_saphyr::from_str_with_options::<Value>(documented, options) else {
        return false;
    };
    match (&written, actual) {
        (Value::String(w), Value::String(a)) => match (parse_duration(w), parse_duration(a)) {
            (Ok(w), Ok(a)) => w == a,
            _ => false,
        },
        (Value::String(w), Value::Number(a)) => parse_size(w).ok() == a.as_u64(),
        _ => written == *actual,
    }
}

/// The configuration table and the schema cannot drift: every key of the schema
/// has a row, every row is a key, and every default in the table is the default the code
/// applies.
#[test]
fn the_configuration_table_matches_the_schema_and_its_defaults() {
    let rows = documented_rows();
    let documented: Vec<String> = rows.iter().map(|(k, _)| k.clone()).collect();
    let every = Config::parse(EVERY_KEY)
        .expect("EVERY_KEY parses")
        .to_tree()
        .expect("tree");
    let mut keys = Vec::new();
    keys_of(&every, "", &documented, &mut keys);
    // Several broker nodes exclude one: their keys come from a config of their own.
    let cluster = Config::parse(
        "listen: {addr: 127.0.0.1:8443}\namqp: {urls_env: AMQP_URLS}\nroutes: [{name: r, path: /r, secrets: [{secret_env: A}]}]\n",
    )
    .expect("the cluster keys parse")
    .to_tree()
    .expect("tree");
    keys_of(&cluster, "", &documented, &mut keys);
    keys.sort();
    keys.dedup();
    let mut problems = Vec::new();
    for key in &keys {
        if !documented.contains(key) {
            problems.push(format!("{key}: in the schema, not in the table"));
        }
    }
    let defaults = Config::parse(DEFAULTS)
        .expect("DEFAULTS parses")
        .to_tree()
        .expect("tree");
    for (key, cell) in &rows {
        if !keys.contains(key) {
            problems.push(format!("{key}: in the table, not in the schema"));
            continue;
        }
        let actual = at(&defaults, key).filter(|v| !v.is_null());
        match (cell.as_str(), actual) {
            ("required" | "one of two" | "one of three", _) | ("unset", None) => {}
            ("unset", Some(v)) => problems.push(format!("{key}: documented unset, code {v}")),
            (cell, actual) => match (cell.strip_prefix('`').and_then(|c| c.strip_suffix('`')), actual) {
                (Some(doc), Some(v)) if same_default(doc, v) => {}
                (Some(doc), v) => problems.push(format!("{key}: documented {doc}, code {v:?}")),
                (None, _) => problems.push(format!(
                    "{key}: the default cell must be required, unset, one of three or one `value`, not {cell:?}"
                )),
            },
        }
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md:\n{}",
        problems.join("\n")
    );
    assert!(rows.len() > 40, "only {} rows found", rows.len());
}

#[test]
fn every_shipped_config_file_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("config dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
    }
    assert!(seen >= 1, "no config files found in {}", dir.display());
}
