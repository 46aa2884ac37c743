//! What a 200 stands for when hookgate is killed or the client goes away: guard state and
//! done marks are on disk before the answer, and a delivery past verification runs to the
//! end. The real binary, the real sled store, the real RabbitMQ.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::RngExt;
use tokio::io::AsyncWriteExt;

use crate::require_broker;
use crate::util::*;

/// An inbound SMS from one contact to one of our numbers, with `text`, at `ts_ms`.
fn keyword_at(event_id: &str, text: &str, ts_ms: i64) -> String {
    keyword_between(event_id, "+15550001111", "+15550002222", text, ts_ms)
}

async fn started(cfg: &GatewayConfig, client: &reqwest::Client) -> Gateway {
    let gw = Gateway::start(cfg).await;
    wait_broker_connected(client, &gw).await;
    gw
}

#[tokio::test]
async fn an_opt_in_answered_200_survives_kill_9_and_the_next_stop_is_heard() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    let cfg = cfg.with_spec_guard();
    let client = client(None);
    let base = wall_ms() - 60_000;
    let deliver = |gw: &Gateway, id: &str, text: &str, ts: i64| {
        let body = keyword_at(id, text, ts);
        let request_id = format!("req_{id}");
        let client = client.clone();
        let gw_addr = gw.url("/webhooks/botix");
        async move {
            let resp = client
                .post(gw_addr)
                .header("x-botix-signature", sign(SECRET, body.as_bytes()))
                .header("x-botix-request-id", request_id)
                .body(body)
                .send()
                .await
                .expect("request");
            let s = resp.status().as_u16();
            let a: serde_json::Value = resp.json().await.expect("json");
            (s, outcome(&a))
        }
    };

    let mut gw = started(&cfg, &client).await;
    assert_eq!(
        deliver(&gw, "kw_stop_1", "STOP", base).await,
        (200, "accepted".into())
    );
    // A clean stop writes the opt-out whatever the build; what follows is about the START.
    gw.stop().await;

    let mut gw = started(&cfg, &client).await;
    assert_eq!(
        deliver(&gw, "kw_start", "START", base + 2000).await,
        (200, "accepted".into())
    );
    // At once after the START's 200: its opt-in must already be on disk.
    gw.kill9();

    let gw = started(&cfg, &client).await;
    assert_eq!(
        deliver(&gw, "kw_stop_2", "STOP", base + 4000).await,
        (200, "accepted".into()),
        "the opt-out after the opt-in was dropped: the opt-in did not survive the crash"
    );
    // The START's done mark survived too: the sender's retry is not published again.
    let retry = keyword_at("kw_start", "START", base + 2000);
    let (s, a) = gw.deliver(&client, &retry, "req_kw_start_retry").await;
    assert_eq!((s, outcome(&a)), (200, "duplicate".into()));

    assert_eq!(
        ids_before_sentinel(&client, &gw, &broker).await,
        vec!["kw_stop_1", "kw_start", "kw_stop_2"]
    );
    broker.delete().await;
}

/// How one delivery was cut off.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// HTTP/2: the response future dropped, which resets the stream (RST_STREAM).
    ResetStream,
    /// HTTP/1.1: the whole request written, then the connection closed.
    CloseAfterRequest,
    /// HTTP/1.1: part of the body written, then the connection closed.
    CloseMidBody,
}

/// Sends `body` and cuts it off `after` the request went out (or part-way through it).
/// Returns whether an answer came before the cut.
async fn cut_off(
    gw: &Gateway,
    h2: &reqwest::Client,
    cut: Cut,
    body: String,
    request_id: String,
    after: Duration,
) -> bool {
    let signature = sign(SECRET, body.as_bytes());
    match cut {
        Cut::ResetStream => {
            let send = h2
                .post(gw.url("/webhooks/botix"))
                .header("x-botix-signature", signature)
                .header("x-botix-request-id", request_id)
                .body(body)
                .send();
            tokio::time::timeout(after, send).await.is_ok()
        }
        Cut::CloseAfterRequest | Cut::CloseMidBody => {
            let head = format!(
                "POST /webhooks/botix HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-botix-signature: {signature}\r\nx-botix-request-id: {request_id}\r\n\r\n",
                gw.addr,
                body.len()
            );
            let sent = match cut {
                Cut::CloseMidBody => &body[..body.len() / 2],
                _ => &body[..],
            };
            let mut stream = tokio::net::TcpStream::connect(gw.addr)
                .await
                .expect("connect");
            stream
                .write_all(format!("{head}{sent}").as_bytes())
                .await
                .expect("write");
            tokio::time::sleep(after).await;
            drop(stream);
            false
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_cut_off_at_random_points_are_published_once_and_leave_their_state() {
    require_broker!();
    let (_dir, broker, cfg) = fixture().await;
    let cfg = cfg.with_spec_guard();
    let client = client(None);
    let gw = started(&cfg, &client).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("h2 client");
    let base = wall_ms() - 60_000;
    let n = 60;
    let mut rng = rand::rng();
    let plan: Vec<(Cut, Duration)> = (0..n)
        .map(|i| {
            let cut = match i % 3 {
                0 => Cut::ResetStream,
                1 => Cut::CloseAfterRequest,
                _ => Cut::CloseMidBody,
            };
            (cut, Duration::from_micros(rng.random_range(0..8_000)))
        })
        .collect();

    // All at once, so the cuts land while others are publishing.
    let answered: Vec<bool> =
        futures_util::future::join_all(plan.iter().enumerate().map(|(i, (cut, after))| {
            let body = status_at(
                &format!("evt_cut_{i}"),
                &format!("msg_cut_{i}"),
                "delivered",
                base + 2000,
            );
            cut_off(&gw, &h2, *cut, body, format!("req_cut_{i}"), *after)
        }))
        .await;

    // The sender's retries: a retry of a published event is a duplicate (it may wait for
    // the first attempt, still running after its client left), of an unpublished one
    // accepted. Either way the queue holds each event once.
    let mut retried = BTreeMap::new();
    for (i, how) in plan.iter().enumerate() {
        let body = status_at(
            &format!("evt_cut_{i}"),
            &format!("msg_cut_{i}"),
            "delivered",
            base + 2000,
        );
        let (s, a) = gw.deliver(&client, &body, &format!("req_retry_{i}")).await;
        assert_eq!(s, 200, "retry of evt_cut_{i} ({how:?}): {a}");
        retried.insert(i, outcome(&a));
    }
    // The guard state of every published status was stored: a late `sent` is stale.
    for (i, how) in plan.iter().enumerate() {
        let late = status_at(
            &format!("evt_late_{i}"),
            &format!("msg_cut_{i}"),
            "sent",
            base + 1000,
        );
        let (s, a) = gw.deliver(&client, &late, &format!("req_late_{i}")).await;
        assert_eq!(
            (s, outcome(&a)),
            (200, "dropped:stale_status".into()),
            "late status of msg_cut_{i} ({how:?}, retry {})",
            retried[&i]
        );
    }

    let mut got = ids_before_sentinel(&client, &gw, &broker).await;
    got.sort();
    let mut expected: Vec<String> = (0..n).map(|i| format!("evt_cut_{i}")).collect();
    expected.sort();
    assert_eq!(got, expected, "each event exactly once");
    // Not a vacuous run: some deliveries were cut off after they were published.
    let cut_after_publish = (0..n)
        .filter(|&i| !answered[i] && retried[&i] == "duplicate")
        .count();
    assert!(
        cut_after_publish > 0,
        "no delivery was cut off after its publish: {retried:?}"
    );
    broker.delete().await;
}

/// Whether `since` has passed and a run file was written at `since` or later: a flush of
/// the hot set after it, which asks the merge thread to rewrite and merge what is due.
fn a_run_written_since(store: &std::path::Path, since: std::time::SystemTime) -> bool {
    if std::time::SystemTime::now() < since {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(store.join("state-runs")) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|entry| {
        entry.path().extension().is_some_and(|e| e == "run")
            && entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|at| at >= since)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opt_out_and_a_status_outlive_three_ttls_of_housekeeping_and_kill_9() {
    require_broker!();
    let (_dir, broker, mut cfg) = fixture().await;
    let ttl = Duration::from_secs(3);
    cfg.extra
        .push_str(&format!("dedup:\n  ttl: {}s\n", ttl.as_secs()));
    cfg.store_extra
        .push_str("  hot_entries: 1024\n  journal_segment: 64KiB\n");
    let cfg = cfg.with_spec_guard();
    let client = client(None);
    let mut gw = started(&cfg, &client).await;
    let now = wall_ms();
    let stop = keyword_at("kw_longrun_stop_1", "STOP", now);
    let (s, a) = gw.deliver(&client, &stop, "req_longrun_stop_1").await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()), "{a}");
    // Within the clock skew ahead of now, so a `sent` sent after the restart is older.
    let delivered_at = now + 200_000;
    let delivered = status_at("st_longrun_1", "msg-longrun-1", "delivered", delivered_at);
    let (s, a) = gw.deliver(&client, &delivered, "req_st_longrun_1").await;
    assert_eq!((s, outcome(&a)), (200, "accepted".into()), "{a}");

    // Distinct events until a run is flushed three ttls after the opt-out: meanwhile every
    // flush asked for the runs' housekeeping, and the run holding the opt-out was rewritten
    // alone (its marks expire, its guard state does not) once its ttl had passed.
    let since = std::time::SystemTime::now() + 3 * ttl;
    let store = cfg.store.clone();
    let mut sent = 0usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    while !a_run_written_since(&store, since) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no run was written within 40 s of traffic ({sent} events)"
        );
        let round = (0..16).map(|i| {
            let id = format!("evt_longrun_{}", sent + i);
            let gw = &gw;
            let client = &client;
            async move {
                let (s, a) = gw
                    .deliver(client, &event_body(&id), &format!("req_{id}"))
                    .await;
                assert_eq!((s, outcome(&a)), (200, "accepted".into()), "{id}: {a}");
            }
        });
        futures_util::future::join_all(round).await;
        sent += 16;
    }
    assert!(sent >= 1024, "only {sent} events: no run was written");
    gw.kill9();

    let gw = started(&cfg, &client).await;
    let stop_again = keyword_at("kw_longrun_stop_2", "STOP", wall_ms());
    let (s, a) = gw.deliver(&client, &stop_again, "req_longrun_stop_2").await;
    assert_eq!(
        (s, outcome(&a)),
        (200, "dropped:repeated_stop".into()),
        "the opt-out was forgotten after {sent} events and a restart"
    );
    let late = status_at("st_longrun_2", "msg-longrun-1", "sent", wall_ms());
    let (s, a) = gw.deliver(&client, &late, "req_st_longrun_2").await;
    assert_eq!(
        (s, outcome(&a)),
        (200, "dropped:stale_status".into()),
        "the status was forgotten after {sent} events and a restart"
    );
    broker.delete().await;
}
