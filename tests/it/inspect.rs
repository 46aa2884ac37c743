//! `hookgate inspect` (contract §12) after a support walk through the real binary and the
//! real broker: a signed delivery, its retry and re-send, a stale status, a STOP and a
//! repeated STOP, an event while the broker is away. Asked online (the command through the
//! admin API, and the endpoint itself on the Redis backend) and offline on the stopped
//! store; the errors a user meets on the way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::redis::{on_redis, redis_available, redis_connection, KeyPrefix, REDIS_URL};
use crate::require_broker;
use crate::util::cli::{hookgate, run_bounded};
use crate::util::gateway::{admin_change, admin_token_file};
use crate::util::proxy::Proxy;
use crate::util::*;

const ADMIN_TOKEN: &str = "inspect-admin-token";
const CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// The ids of one walk.
struct Walk {
    event: String,
    first_request: String,
    resent_request: String,
    message: String,
    delivered: String,
    stale: String,
    contact: String,
    channel: String,
    stop: String,
    stop_again: String,
    spooled: String,
    never_sent: String,
}

fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Walks a support case through `gw`; `proxy` carries its broker link and is cut for the
/// last event.
async fn support_walk(gw: &Gateway, client: &reqwest::Client, proxy: &Proxy) -> Walk {
    let run = unique("walk");
    let w = Walk {
        event: format!("evt_{run}"),
        first_request: request_id(),
        resent_request: request_id(),
        message: format!("msg_{run}"),
        delivered: format!("evt_{run}_delivered"),
        stale: format!("evt_{run}_sent"),
        contact: format!("+1555{}", &run[run.len() - 7..]),
        channel: "+15550002222".into(),
        stop: format!("evt_{run}_stop"),
        stop_again: format!("evt_{run}_stop_again"),
        spooled: format!("evt_{run}_spooled"),
        never_sent: format!("evt_{run}_never"),
    };
    let answer = |expect: &'static str| {
        move |(s, a): (u16, Value)| {
            assert_eq!((s, outcome(&a)), (200, expect.to_owned()), "{a}");
        }
    };
    // A signed delivery, the sender's retry under its request id, and a manual re-send
    // from the sender's dashboard under a new one.
    let body = event_body(&w.event);
    answer("accepted")(gw.deliver(client, &body, &w.first_request).await);
    answer("duplicate")(gw.deliver(client, &body, &w.first_request).await);
    answer("duplicate")(gw.deliver(client, &body, &w.resent_request).await);
    // A `sent` that arrives after the `delivered`.
    let now = wall_ms();
    let delivered = status_at(&w.delivered, &w.message, "delivered", now - 1000);
    answer("accepted")(gw.deliver(client, &delivered, &request_id()).await);
    let stale = status_at(&w.stale, &w.message, "sent", now - 2000);
    answer("dropped:stale_status")(gw.deliver(client, &stale, &request_id()).await);
    // A STOP, and the contact's second STOP.
    let stop = keyword_between(&w.stop, &w.contact, &w.channel, "STOP", now - 1000);
    answer("accepted")(gw.deliver(client, &stop, &request_id()).await);
    let again = keyword_between(&w.stop_again, &w.contact, &w.channel, "stop", now - 500);
    answer("dropped:repeated_stop")(gw.deliver(client, &again, &request_id()).await);
    // The broker goes away: the event is spooled before its 200.
    proxy.cut();
    answer("accepted")(
        gw.deliver(client, &event_body(&w.spooled), &request_id())
            .await,
    );
    proxy.restore();
    w
}

/// The questions asked after a walk: (label, kind, id, to).
fn questions(w: &Walk) -> Vec<(&'static str, &'static str, String, Option<String>)> {
    vec![
        ("event", "event", w.event.clone(), None),
        ("first request", "request", w.first_request.clone(), None),
        ("resent request", "request", w.resent_request.clone(), None),
        ("stale", "event", w.stale.clone(), None),
        ("message", "message", w.message.clone(), None),
        (
            "contact",
            "contact",
            w.contact.clone(),
            Some(w.channel.clone()),
        ),
        ("repeated stop", "event", w.stop_again.clone(), None),
        ("spooled", "event", w.spooled.clone(), None),
        ("never sent", "event", w.never_sent.clone(), None),
    ]
}

/// Checks what the answers say about the walk.
fn check_walk(w: &Walk, answers: &HashMap<&'static str, Value>) {
    let answer = |label: &str| &answers[label]["answer"];
    let record = |label: &str, kind: &str| answer(label)[kind]["record"].clone();

    let event = record("event", "event");
    assert_eq!(event["outcome"], "accepted", "{event}");
    assert_eq!(event["delivery"], "published", "{event}");
    assert_eq!(
        event["deliveries"], 3,
        "the delivery, its retry, the re-send: {event}"
    );
    assert_eq!(event["first_request_id"], w.first_request.as_str());
    assert_eq!(event["last_request_id"], w.resent_request.as_str());
    assert_eq!(event["source"], "webhook");
    assert_eq!(event["sources"], serde_json::json!(["webhook"]));
    for label in ["first request", "resent request"] {
        let request = &answer(label)["request"];
        assert_eq!(request["event_id"], w.event.as_str(), "{label}: {request}");
        assert_eq!(request["event"]["record"], event, "{label}");
    }

    let stale = record("stale", "event");
    assert_eq!(
        (&stale["outcome"], &stale["reason"]),
        (&"dropped".into(), &"stale_status".into())
    );
    let message = &answer("message")["message"];
    assert_eq!(message["status"], "delivered", "{message}");
    assert_eq!(message["set_by"]["event_id"], w.delivered.as_str());
    assert_eq!(message["set_by"]["what"], "delivered");
    assert_eq!(message["dropped"][0]["event_id"], w.stale.as_str());
    assert_eq!(message["dropped"][0]["what"], "sent");
    assert_eq!(message["dropped"][0]["reason"], "stale_status");

    let contact = &answer("contact")["contact"];
    assert_eq!(contact["opt"], "opted_out", "{contact}");
    assert_eq!(contact["last_keyword"]["event_id"], w.stop.as_str());
    assert_eq!(contact["last_keyword"]["what"], "STOP");
    assert_eq!(contact["dropped"][0]["event_id"], w.stop_again.as_str());
    assert_eq!(contact["dropped"][0]["reason"], "repeated_stop");
    let again = record("repeated stop", "event");
    assert_eq!(again["reason"], "repeated_stop", "{again}");

    let spooled = record("spooled", "event");
    assert_eq!(
        (&spooled["outcome"], &spooled["delivery"]),
        (&"accepted".into(), &"spooled".into())
    );

    let never = &answer("never sent")["event"];
    assert_eq!(never["mark"], Value::Null, "{never}");
    assert_eq!(answers["never sent"]["window"], "72h");
}

/// The gateway's config with its real admin address, for the command to read.
fn cli_config(gw: &Gateway) -> PathBuf {
    let text = std::fs::read_to_string(&gw.config_path).expect("config");
    let text = text.replacen(
        "admin:\n  addr: 127.0.0.1:0",
        &format!("admin:\n  addr: {}", gw.admin),
        1,
    );
    let path = gw.config_path.with_extension("cli.yaml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// `hookgate --config CONFIG inspect ARGS…`: (exit code, stdout, stderr).
async fn inspect(config: &Path, args: &[&str]) -> (i32, String, String) {
    let mut cmd = hookgate();
    cmd.arg("--config").arg(config).arg("inspect").args(args);
    let out = run_bounded(cmd, CLI_TIMEOUT).await;
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every question of the walk through the command, as JSON; `store` reads it offline.
async fn ask_command(
    config: &Path,
    w: &Walk,
    store: Option<&Path>,
) -> HashMap<&'static str, Value> {
    let mut answers = HashMap::new();
    for (label, kind, id, to) in questions(w) {
        let mut args: Vec<String> = Vec::new();
        if let Some(store) = store {
            args.extend(["--store".into(), store.display().to_string()]);
        }
        args.extend([kind.into(), id]);
        args.extend(to);
        args.extend(["--output".into(), "json".into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = inspect(config, &args).await;
        assert_eq!(code, 0, "{label}: {err}");
        answers.insert(label, serde_json::from_str(&out).expect("json"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_support_walk_is_answered_online_and_offline_alike() {
    require_broker!();
    let (dir, broker, cfg) = fixture().await;
    let proxy = Proxy::to_rabbitmq().await;
    let mut cfg = cfg.with_spec_guard();
    cfg.amqp_url = proxy.amqp_url("heartbeat=30");
    cfg.confirm_timeout = "1s".into();
    cfg.admin_extra = admin_token_file(dir.path(), ADMIN_TOKEN);
    let mut gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    let config = cli_config(&gw);

    let w = support_walk(&gw, &client, &proxy).await;
    let online = ask_command(&config, &w, None).await;
    check_walk(&w, &online);

    // The text a support engineer reads.
    let (code, text, err) = inspect(&config, &["request", &w.resent_request]).await;
    assert_eq!(code, 0, "{err}");
    for line in [
        format!("request {} on route botix", w.resent_request),
        "accepted, published (the broker confirmed it)".into(),
        "3 (2 answered as duplicate); sources: webhook".into(),
        format!("first {}, latest {}", w.first_request, w.resent_request),
    ] {
        assert!(text.contains(&line), "{line:?} not in\n{text}");
    }
    assert!(err.contains("the running gateway"), "{err}");
    let (_, text, _) = inspect(&config, &["event", &w.never_sent]).await;
    assert!(text.contains("not seen within the window of 72h"), "{text}");
    let (_, text, _) = inspect(&config, &["contact", &w.contact, &w.channel]).await;
    assert!(text.contains("opted out since"), "{text}");
    assert!(
        text.contains(&format!("{} STOP at", w.stop_again)),
        "{text}"
    );

    // Errors: an id of the wrong shape, the running gateway's store read directly.
    let (code, _, err) = inspect(&config, &["request", &w.event]).await;
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("not a botix request id"), "{err}");
    let (code, _, err) = inspect(&config, &["event", &w.first_request]).await;
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("inspect request"), "{err}");
    // The endpoint refuses what it cannot answer, and names the unknown route.
    for (path, status, says) in [
        (
            "/inspect?route=botix&kind=event",
            400,
            "route, kind and id are required",
        ),
        (
            "/inspect?route=other&kind=event&id=e",
            404,
            "no route named \"other\"",
        ),
        ("/inspect?route=botix&kind=events&id=e", 400, "unknown kind"),
        (
            "/inspect?route=botix&kind=event&id=e&x=1",
            400,
            "unknown parameter",
        ),
    ] {
        let get = reqwest::Method::GET;
        let (s, body) = admin_change(&gw, &client, get, path, Some(ADMIN_TOKEN)).await;
        assert_eq!(s, status, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }
    let store = cfg.store.display().to_string();
    let (code, _, err) = inspect(&config, &["--store", &store, "event", &w.event]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("held by another process"), "{err}");

    // The sentinel: every accepted event reached the broker (the spooled one once the link
    // came back).
    let published = ids_before_sentinel(&client, &gw, &broker).await;
    for id in [&w.event, &w.delivered, &w.stop, &w.spooled] {
        assert!(published.contains(id), "{id} not published: {published:?}");
    }

    gw.stop().await;
    let offline = ask_command(&config, &w, Some(&cfg.store)).await;
    for (label, answer) in &online {
        assert_eq!(
            &offline[label], answer,
            "{label}: offline differs from online"
        );
    }
    // With no gateway answering, the command reads the config's store by itself.
    let (code, text, err) = inspect(&config, &["event", &w.event]).await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("read-only"), "{err}");
    assert!(text.contains("deliveries   3"), "{text}");
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_no_queue_took_is_recorded_as_held_in_the_spool() {
    require_broker!();
    let dir = tempfile::tempdir().expect("tempdir");
    // Only `contact.#` has a queue: an `orphan.updated` is returned unroutable and kept in
    // the spool's held area.
    let broker = Broker::unbound().await;
    broker.bind("contact.#").await;
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    cfg.admin_extra = admin_token_file(dir.path(), ADMIN_TOKEN);
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    let config = cli_config(&gw);

    let run = unique("held");
    let (held, routed) = (format!("evt_{run}_orphan"), format!("evt_{run}_contact"));
    let orphan = serde_json::json!({
        "id": held, "event": "orphan.updated", "timestamp": rfc3339_from_now(0), "data": {}
    })
    .to_string();
    for (id, body) in [(&held, orphan), (&routed, event_body(&routed))] {
        let (status, answer) = gw.deliver(&client, &body, &request_id()).await;
        assert_eq!(
            (status, outcome(&answer)),
            (200, "accepted".to_owned()),
            "{id}: {answer}"
        );
    }
    for (id, delivery, text) in [
        (&held, "held", "accepted, held in the spool"),
        (&routed, "published", "accepted, published"),
    ] {
        let (code, out, err) = inspect(&config, &["event", id, "--output", "json"]).await;
        assert_eq!(code, 0, "{err}");
        let answer: Value = serde_json::from_str(&out).expect("json");
        let record = &answer["answer"]["event"]["record"];
        assert_eq!(record["outcome"], "accepted", "{record}");
        assert_eq!(record["delivery"], delivery, "{record}");
        let (code, out, err) = inspect(&config, &["event", id]).await;
        assert_eq!(code, 0, "{err}");
        assert!(out.contains(text), "{out}");
    }
    drop(gw);
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_backend_keeps_the_same_records() {
    require_broker!();
    if !redis_available() {
        return;
    }
    let (dir, broker, cfg) = fixture().await;
    let proxy = Proxy::to_rabbitmq().await;
    let prefix = KeyPrefix::new();
    let mut cfg = on_redis(cfg.with_spec_guard(), REDIS_URL, &prefix);
    cfg.amqp_url = proxy.amqp_url("heartbeat=30");
    cfg.confirm_timeout = "1s".into();
    cfg.admin_extra = admin_token_file(dir.path(), ADMIN_TOKEN);
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;

    let w = support_walk(&gw, &client, &proxy).await;
    // A done mark written before marks carried records (the value `d` alone).
    let old = unique("evt_old");
    let old_key = format!("{}botix:event:{old}", &*prefix);
    let mut conn = redis_connection(REDIS_URL).await;
    let set: redis::RedisResult<()> = redis::cmd("SET")
        .arg(&old_key)
        .arg("d")
        .arg("PX")
        .arg(600_000)
        .query_async(&mut conn)
        .await;
    set.expect("set an old mark");
    let (s, a) = gw.deliver(&client, &event_body(&old), &request_id()).await;
    assert_eq!(
        (s, outcome(&a)),
        (200, "duplicate".into()),
        "an old mark still counts"
    );
    let kept: Option<Vec<u8>> = redis::cmd("GET")
        .arg(&old_key)
        .query_async(&mut conn)
        .await
        .expect("get");
    assert_eq!(
        kept.as_deref(),
        Some(&b"d"[..]),
        "a duplicate leaves an old mark as it is"
    );

    let mut answers = HashMap::new();
    let mut asked = questions(&w);
    asked.push(("old mark", "event", old.clone(), None));
    for (label, kind, id, to) in asked {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query
            .append_pair("route", "botix")
            .append_pair("kind", kind)
            .append_pair("id", &id);
        if let Some(to) = &to {
            query.append_pair("to", to);
        }
        let path = format!("/inspect?{}", query.finish());
        let get = reqwest::Method::GET;
        let (status, body) = admin_change(&gw, &client, get.clone(), &path, None).await;
        assert_eq!(status, 403, "the endpoint needs the admin token: {body}");
        let (status, body) = admin_change(&gw, &client, get, &path, Some(ADMIN_TOKEN)).await;
        assert_eq!(status, 200, "{label}: {body}");
        answers.insert(label, serde_json::from_str(&body).expect("json"));
    }
    check_walk(&w, &answers);
    let old_mark = &answers["old mark"]["answer"]["event"];
    assert_eq!(old_mark["mark"]["state"], "done", "{old_mark}");
    assert_eq!(old_mark["record"], Value::Null, "{old_mark}");
    assert!(old_mark["mark"]["kept_until"].is_string(), "{old_mark}");
    ids_before_sentinel(&client, &gw, &broker).await;
    broker.delete().await;
}
