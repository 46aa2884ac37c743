//! Replay (`hookgate reconcile replay`) against the fake list API the reconciliation tests
//! use: the window's events published once more with `x-source: replay`, a stale status
//! still dropped, the API's pacing held, a dry run that publishes nothing, and the
//! command's errors and question.

use std::time::Duration;

use hookgate::reconcile::replay_walk::ReplayStatus;

use crate::reconcile::{
    five_listed, outbound, published, reconciling, source, start_walked, waits_for_reset,
    ADMIN_TOKEN, KEY,
};
use crate::require_broker;
use crate::util::fake_botix::FakeBotix;
use crate::util::*;

const PATH: &str = "/reconcile/botix/replay";

/// Asks for a replay with `query` and waits for its end; its last status.
async fn replay(gw: &Gateway, client: &reqwest::Client, query: &str) -> ReplayStatus {
    let path = format!("{PATH}?{query}");
    let (code, body) =
        admin_change(gw, client, reqwest::Method::POST, &path, Some(ADMIN_TOKEN)).await;
    assert_eq!(code, 202, "{body}");
    let asked: ReplayStatus = serde_json::from_str(&body).expect("status");
    assert!(asked.running, "{asked:?}");
    let deadline = tokio::time::Instant::now() + POLL_DEADLINE * 2;
    loop {
        let (code, body) = gw.admin_get(client, PATH).await;
        assert_eq!(code, 200, "{body}");
        let now: ReplayStatus = serde_json::from_str(&body).expect("status");
        if now.id == asked.id && !now.running {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replay did not end: {now:?}\n{}",
            gw.logs().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A gateway with the admin token whose route reconciles with `fake`, after its first walk.
async fn walked_with_token(
    dir: &tempfile::TempDir,
    mut cfg: GatewayConfig,
    fake: &FakeBotix,
    extra: &str,
) -> (Gateway, reqwest::Client) {
    cfg.admin_extra = admin_token_file(dir.path(), ADMIN_TOKEN);
    start_walked(&reconciling(cfg, fake, extra)).await
}

/// (event id, `x-source`) of each message, sorted.
fn ids_and_sources(got: &[Received]) -> Vec<(String, String)> {
    let mut seen: Vec<_> = got
        .iter()
        .map(|m| (m.message_id.clone().unwrap_or_default(), source(m)))
        .collect();
    seen.sort();
    seen
}

#[tokio::test]
async fn a_replay_publishes_the_window_again_with_x_source_replay_and_drops_a_stale_status() {
    require_broker!();
    let (dir, broker, cfg) = fixture().await;
    let fake = FakeBotix::start(KEY, 100, 60).await;
    fake.push(five_listed());
    let (gw, client) = walked_with_token(&dir, cfg, &fake, "").await;
    let walked = published(&client, &gw, &broker).await;
    assert_eq!(walked.len(), 4, "the walk published the four events");
    // The webhook brings msg_b's `delivered`; the API still lists its `sent`.
    let delivered = status_body("evt_b_delivered", "msg_b", "delivered");
    gw.accept_body(&client, "evt_b_delivered", &delivered).await;
    let _ = published(&client, &gw, &broker).await;

    // A replay needs the admin token, and a window within the lookback.
    let post = reqwest::Method::POST;
    let path = format!("{PATH}?since=3600");
    let (code, text) = admin_change(&gw, &client, post.clone(), &path, None).await;
    assert_eq!(code, 403, "{text}");
    let path = format!("{PATH}?since={}", 27 * 3600);
    let (code, text) = admin_change(&gw, &client, post.clone(), &path, Some(ADMIN_TOKEN)).await;
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("reaches past the route's lookback"), "{text}");
    let path = "/reconcile/nope/replay?since=3600";
    let (code, text) = admin_change(&gw, &client, post, path, Some(ADMIN_TOKEN)).await;
    assert_eq!((code, text.trim()), (404, "no route nope reconciles"));

    // A dry run counts the window's events and publishes nothing.
    let dry = replay(&gw, &client, "since=3600&dry_run=true").await;
    assert_eq!(dry.result.as_deref(), Some("complete"), "{dry:?}");
    assert_eq!(
        (dry.counts.listed, dry.counts.selected, dry.counts.published),
        (5, 4, 0)
    );
    let narrow = replay(&gw, &client, "since=3600&until=600&dry_run=true").await;
    assert_eq!(
        narrow.counts.selected, 0,
        "the events are younger than until"
    );
    assert!(
        published(&client, &gw, &broker).await.is_empty(),
        "a dry run published"
    );

    let done = replay(&gw, &client, "since=3600").await;
    assert_eq!(done.result.as_deref(), Some("complete"), "{done:?}");
    assert_eq!(
        (
            done.counts.selected,
            done.counts.published,
            done.counts.failed
        ),
        (4, 3, 0)
    );
    assert_eq!(
        done.counts.dropped,
        [("stale_status".to_owned(), 1)].into_iter().collect()
    );
    let got = published(&client, &gw, &broker).await;
    let replayed = |id: &str| (id.to_owned(), "replay".to_owned());
    assert_eq!(
        ids_and_sources(&got),
        vec![
            replayed("reconcile:msg_a:delivered"),
            replayed("reconcile:msg_c:received"),
            replayed("reconcile:msg_e:received"),
        ],
        "the delivered status and the STOP the guard holds as newest are published again, the stale sent is not"
    );
    assert!(
        got.iter().all(|m| m
            .header("x-request-id")
            .is_some_and(|r| r.starts_with("replay:botix:"))),
        "{got:?}"
    );

    // Only the asked event types.
    let received = replay(&gw, &client, "since=3600&events=message.received").await;
    assert_eq!(
        (received.counts.selected, received.counts.published),
        (2, 2)
    );
    let got = published(&client, &gw, &broker).await;
    assert_eq!(
        ids_and_sources(&got),
        vec![
            replayed("reconcile:msg_c:received"),
            replayed("reconcile:msg_e:received"),
        ]
    );
    // Each replay is counted in the record the walk left: a status by its event id, an
    // inbound message by its message id.
    for (id, deliveries) in [("reconcile:msg_a:delivered", 2), ("msg_c", 3)] {
        let path = format!("/inspect?route=botix&kind=event&id={id}");
        let get = reqwest::Method::GET;
        let (code, text) = admin_change(&gw, &client, get, &path, Some(ADMIN_TOKEN)).await;
        assert_eq!(code, 200, "{text}");
        let report: serde_json::Value = serde_json::from_str(&text).expect("json");
        let record = &report["answer"]["event"]["record"];
        assert_eq!(record["source"], "reconcile", "{id}: {record}");
        assert_eq!(
            record["sources"],
            serde_json::json!(["reconcile", "replay"]),
            "{id}"
        );
        assert_eq!(record["deliveries"], deliveries, "{id}: {record}");
    }
    broker.delete().await;
}

#[tokio::test]
async fn a_replay_waits_for_reset_as_a_walk_does() {
    require_broker!();
    let (dir, broker, cfg) = fixture().await;
    // Two requests per 2-second window; a walk of the eight messages takes four pages.
    let fake = FakeBotix::start(KEY, 2, 2).await;
    fake.push((0..8).map(|i| outbound(&format!("msg_{i}"), "delivered")));
    let (gw, client) = walked_with_token(&dir, cfg, &fake, "      min_remaining: 1\n").await;
    let walk = fake.log().len();
    assert_eq!(walk, 4);
    assert_eq!(
        published(&client, &gw, &broker).await.len(),
        8,
        "the walk's"
    );

    let done = replay(&gw, &client, "since=3600").await;
    assert_eq!(done.result.as_deref(), Some("complete"), "{done:?}");
    assert_eq!((done.counts.pages, done.counts.published), (4, 8));
    let log = fake.log();
    assert_eq!(log.len(), walk + 4, "{log:#?}");
    assert!(
        log.iter().all(|l| l.status == 200),
        "the replay ran into the limit: {log:#?}"
    );
    // From the walk's last answer on: the replay goes on with the key's rate limit.
    let waits = waits_for_reset(&log[walk - 1..], 1);
    assert!(waits >= 2, "the replay waited for {waits} resets: {log:#?}");
    let got = published(&client, &gw, &broker).await;
    assert_eq!(got.len(), 8);
    assert!(got.iter().all(|m| source(m) == "replay"));
    broker.delete().await;
}

/// The gateway's config with its real admin address, for the command to read.
fn cli_config(gw: &Gateway) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&gw.config_path).expect("config");
    let text = text.replacen(
        "admin:\n  addr: 127.0.0.1:0",
        &format!("admin:\n  addr: {}", gw.admin),
        1,
    );
    let path = gw.config_path.with_extension("cli.yaml");
    std::fs::write(&path, text).expect("write");
    path
}

async fn replay_command(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = hookgate();
    cmd.args(["reconcile", "replay"])
        .args(args)
        .arg("--config")
        .arg(config);
    run_bounded(cmd, Duration::from_secs(60)).await
}

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_command_asks_above_its_threshold_and_refuses_without_a_terminal() {
    require_broker!();
    let (dir, broker, cfg) = fixture().await;
    let fake = FakeBotix::start(KEY, 100, 60).await;
    fake.push((0..3).map(|i| outbound(&format!("msg_{i}"), "delivered")));
    let (gw, client) = walked_with_token(&dir, cfg, &fake, "").await;
    // The webhook brings msg_2's `read`: its listed `delivered` is older.
    gw.accept_body(
        &client,
        "evt_2_read",
        &status_body("evt_2_read", "msg_2", "read"),
    )
    .await;
    let _ = published(&client, &gw, &broker).await;
    let config = cli_config(&gw);

    let since = ["--route", "botix", "--since", "1h"];
    let out = replay_command(&config, &[&since[..], &["--confirm-above", "2"]].concat()).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    println!("$ hookgate reconcile replay --route botix --since 1h --confirm-above 2 </dev/null\n{stdout}{stderr}");
    assert!(
        stdout.contains("3 events would be handed to the guard"),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "3 events are above --confirm-above 2 and there is no terminal to ask; add --yes"
        ),
        "{stderr}"
    );
    assert!(
        published(&client, &gw, &broker).await.is_empty(),
        "published without a yes"
    );

    let out = replay_command(&config, &since).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    println!("$ hookgate reconcile replay --route botix --since 1h\n{stdout}{stderr}");
    assert!(
        stdout.contains("listed 3, selected 3, published 2, dropped 1 (stale_status 1), failed 0"),
        "{stdout}"
    );
    let got = published(&client, &gw, &broker).await;
    assert_eq!(
        ids_and_sources(&got),
        vec![
            ("reconcile:msg_0:delivered".into(), "replay".into()),
            ("reconcile:msg_1:delivered".into(), "replay".into()),
        ]
    );

    let out = replay_command(&config, &[&since[..], &["--yes"]].concat()).await;
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(
        !text(&out).0.contains("dry run"),
        "--yes asks no count first"
    );
    assert_eq!(published(&client, &gw, &broker).await.len(), 2);
    broker.delete().await;
}

#[tokio::test]
async fn the_command_refuses_a_bad_request_before_asking_and_says_when_no_gateway_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    // An address nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let config = dir.path().join("hookgate.yaml");
    let yaml = format!(
        "listen:\n  addr: 127.0.0.1:0\nadmin:\n  addr: {closed}\nstore:\n  path: {}\namqp:\n  url: {AMQP_URL}\n  exchange: x\nroutes:\n  - name: botix\n    path: /b\n    secrets: [{{secret: {SECRET}}}]\n    reconcile:\n      url: http://127.0.0.1:9/public/v1/messages\n      token_env: BOTIX_API_KEY\n  - name: plain\n    path: /p\n    secrets: [{{secret: {SECRET}}}]\n",
        dir.path().join("store").display()
    );
    std::fs::write(&config, yaml).expect("config");
    for (args, code, needle) in [
        (
            &["--route", "nope", "--since", "1h"][..],
            64,
            "no route nope in the config",
        ),
        (
            &["--route", "plain", "--since", "1h"],
            64,
            "route plain has no reconcile: block",
        ),
        (
            &["--route", "botix", "--since", "6x"],
            64,
            "invalid duration",
        ),
        (
            &["--route", "botix", "--since", "6h", "--until", "7h"],
            64,
            "until 7h ago is not after since 6h ago",
        ),
        (
            &["--route", "botix", "--since", "30h"],
            64,
            "reaches past the route's lookback 1day 2h",
        ),
        (
            &[
                "--route",
                "botix",
                "--since",
                "1h",
                "--events",
                "message.sent",
            ],
            64,
            "not \"message.sent\"",
        ),
        (
            &["--route", "botix", "--since", "1h", "--yes"],
            1,
            "no gateway answered on the admin address",
        ),
    ] {
        let out = replay_command(&config, args).await;
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
