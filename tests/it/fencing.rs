//! Leases in Redis under pauses (contract §3 "Backends"): a gateway frozen past its lease
//! cannot overwrite what another replica decided after it, a request id is claimed like an
//! event, and a lock whose reply was lost does not block its key for a lease.

use std::time::Duration;

use crate::redis::{redis_available, redis_connection, KeyPrefix, OwnRedis, REDIS_URL};
use crate::require_broker;
use crate::util::proxy::Proxy;
use crate::util::*;

/// `confirm_timeout: 3s`, `in_flight_wait: 1s`: a request may hold its claim for
/// 2 (the event's claim) + 1 + 2 (lock) + 2 (read) + 3 + 5 (spool fsync) + 2 (commit) + 2
/// (marks) = 19 s.
const LEASE: &str = "20s";
/// How long the lease lasts, for waiting it out.
const LEASE_SECS: u64 = 20;

/// Two gateways on one key prefix of the Redis at `url`; A publishes through `proxy`.
async fn pair_through(
    broker: &Broker,
    proxy: &Proxy,
    url: &str,
    prefix: &str,
    dirs: &[tempfile::TempDir; 2],
    lease: &str,
) -> (Gateway, Gateway) {
    let shared = format!(
        "dedup:\n  backend: redis\n  in_flight_lease: {lease}\n  in_flight_wait: 1s\nredis:\n  url: {url}\n  key_prefix: \"{prefix}\"\n"
    );
    let mut cfg_a = GatewayConfig::new(dirs[0].path(), &broker.exchange).with_spec_guard();
    cfg_a.amqp_url = proxy.amqp_url("");
    cfg_a.extra = shared.clone();
    let mut cfg_b = GatewayConfig::new(dirs[1].path(), &broker.exchange).with_spec_guard();
    cfg_b.extra = shared;
    let a = Gateway::start(&cfg_a).await;
    let b = Gateway::start(&cfg_b).await;
    let c = client(None);
    wait_broker_connected(&c, &a).await;
    wait_broker_connected(&c, &b).await;
    (a, b)
}

/// Delivers `body` to `gw` in the background, with a client that waits as long as a
/// frozen gateway may take; the answer comes out of the handle.
fn deliver_later(gw: &Gateway, body: &str, request_id: &str) -> tokio::task::JoinHandle<Answer> {
    deliver_in_task(
        &patient_client(),
        gw.url("/webhooks/botix"),
        body,
        request_id,
    )
}

/// A broker, a proxy to it, a fresh key prefix in the test Redis, the gateways'
/// directories, and two gateways A and B on that prefix with the guard; A publishes
/// through the proxy. In the order they are to be bound, so the gateways stop first.
async fn fenced_pair() -> (
    Broker,
    Proxy,
    KeyPrefix,
    [tempfile::TempDir; 2],
    Gateway,
    Gateway,
) {
    let broker = Broker::new().await;
    let proxy = Proxy::to_rabbitmq().await;
    let prefix = KeyPrefix::new();
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let (a, b) = pair_through(&broker, &proxy, REDIS_URL, &prefix, &dirs, LEASE).await;
    (broker, proxy, prefix, dirs, a, b)
}

/// Whether `key` exists, polled until it does (`present`) or does not, within `within`.
async fn key_becomes(url: &str, key: &str, present: bool, within: Duration) -> bool {
    let conn = redis_connection(url).await;
    eventually(within, || {
        let (mut conn, key) = (conn.clone(), key.to_owned());
        async move {
            let n: i64 = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap_or(-1);
            n == i64::from(present)
        }
    })
    .await
}

/// A key's raw value: guard state is stored in a binary form.
async fn get(url: &str, key: &str) -> Option<Vec<u8>> {
    let mut conn = redis_connection(url).await;
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("GET")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_frozen_past_its_lease_cannot_overwrite_the_opt_in_decided_after_it() {
    require_broker!();
    if !redis_available() {
        return;
    }
    let (broker, proxy, prefix, _dirs, a, b) = fenced_pair().await;
    let (contact, channel) = ("+15550007777", "+15550008888");
    let lock_key = format!("{prefix}lock:botix:keyword:{contact}:{channel}");
    let state_key = format!("{prefix}guard:botix:keyword:{contact}:{channel}");
    let base = wall_ms() - 60_000;

    // A decides STOP and holds the contact's lock while its publish waits for a confirm
    // that does not come; it is frozen there, as a container can be. The freeze waits for
    // the publish frame itself: frozen between its lock and its publish, A would rightly
    // give the STOP up unpublished when it wakes past its lease.
    proxy.black_hole_after_publishes(0);
    let stop = keyword_between("fz_stop", contact, channel, "STOP", base);
    let a_answer = deliver_later(&a, &stop, "req_fz_stop");
    assert!(
        eventually(POLL_DEADLINE, || async { proxy.tripped() }).await,
        "A never published the STOP"
    );
    a.signal("STOP");
    assert!(
        key_becomes(REDIS_URL, &lock_key, true, POLL_DEADLINE).await,
        "A published without holding the contact's lock"
    );
    // Its lease runs out while it sleeps.
    let freed = key_becomes(
        REDIS_URL,
        &lock_key,
        false,
        Duration::from_secs(LEASE_SECS + 10),
    )
    .await;
    if !freed {
        a.signal("CONT");
    }
    assert!(freed, "the frozen gateway's lock never expired");

    // B decides START on the same contact and gets its 200: the contact is opted in.
    let start = keyword_between("fz_start", contact, channel, "START", base + 1_000);
    let (status, answer) = b.deliver(&client(None), &start, "req_fz_start").await;
    assert_eq!(
        (status, outcome(&answer).as_str()),
        (200, "accepted"),
        "{answer}"
    );
    let decided = get(REDIS_URL, &state_key)
        .await
        .expect("B stored the START");
    assert_eq!(
        decided.first(),
        Some(&b'{'),
        "guard state in Redis is JSON, which replicas of earlier builds read"
    );

    // A wakes up: its publish times out and is spooled (it may still go out), but its
    // commit must not put back the STOP it decided before B's START.
    a.signal("CONT");
    let Answer {
        status: a_status,
        body: a_body,
        ..
    } = a_answer.await.expect("A's request");
    assert_eq!(
        get(REDIS_URL, &state_key).await,
        Some(decided),
        "the frozen gateway overwrote the newer guard state (A answered {a_status} {a_body})"
    );
    assert_eq!(a_status, 503, "A's commit was refused: {a_body}");
    // A's STOP left (spooled) before its commit was refused: its claims were kept and
    // marked, so the sender's retry is a duplicate, not a STOP decided and published again
    // after B's START.
    let (status, answer) = b.deliver(&client(None), &stop, "req_fz_stop").await;
    assert_eq!(
        (status, outcome(&answer).as_str()),
        (200, "duplicate"),
        "the retry of a STOP that left was decided again: {answer} (A answered {a_status} {a_body})"
    );
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_retries_under_one_request_id_with_different_bodies_publish_once() {
    require_broker!();
    if !redis_available() {
        return;
    }
    let (broker, proxy, prefix, _dirs, a, b) = fenced_pair().await;
    // A's publish waits for its whole confirm timeout (3 s) while it holds the request id.
    proxy.black_hole();
    let first = deliver_later(&a, &event_body("rq_body_1"), "req_shared");
    // A claims the request id, then the event: once the event's claim exists, A is
    // publishing.
    let event_key = format!("{prefix}botix:event:rq_body_1");
    assert!(
        key_becomes(REDIS_URL, &event_key, true, POLL_DEADLINE).await,
        "A never claimed the event"
    );
    // The same request id with another body, at the same time, on B.
    let (status, answer) = b
        .deliver(&client(None), &event_body("rq_body_2"), "req_shared")
        .await;
    assert_ne!(
        outcome(&answer),
        "accepted",
        "a concurrent retry under the same request id was published too ({status})"
    );
    let Answer {
        status: first_status,
        body: first_answer,
        ..
    } = first.await.expect("A's request");
    assert_eq!(first_status, 200, "{first_answer}");
    // Once A is done, the retry is a duplicate.
    let (status, answer) = b
        .deliver(&client(None), &event_body("rq_body_2"), "req_shared")
        .await;
    assert_eq!(
        (status, outcome(&answer).as_str()),
        (200, "duplicate"),
        "{answer}"
    );
    proxy.restore();
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_reply_was_lost_in_a_stalled_redis_does_not_block_its_key_for_a_lease() {
    require_broker!();
    let Some(own) = OwnRedis::start(false).await else {
        return;
    };
    let broker = Broker::new().await;
    let dir = tempfile::tempdir().expect("dir");
    let prefix = "hg-stall:";
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange).with_spec_guard();
    // A long lease: a lock left behind would block the contact for all of it.
    cfg.extra = format!(
        "dedup:\n  backend: redis\n  in_flight_lease: 120s\n  in_flight_wait: 3s\nredis:\n  url: {}\n  key_prefix: \"{prefix}\"\n",
        own.url()
    );
    let gw = Gateway::start(&cfg).await;
    let c = client(None);
    wait_broker_connected(&c, &gw).await;
    let (contact, channel) = ("+15550009999", "+15550001234");
    let lock_key = format!("{prefix}lock:botix:keyword:{contact}:{channel}");
    let base = wall_ms() - 60_000;

    // The test holds the contact's lock, so the gateway's request polls it with SET NX.
    let mut conn = redis_connection(&own.url()).await;
    let _: () = redis::cmd("SET")
        .arg(&lock_key)
        .arg("test")
        .query_async(&mut conn)
        .await
        .expect("SET");
    let stop = keyword_between("st_stop", contact, channel, "STOP", base);
    let pending = deliver_later(&gw, &stop, "req_st_stop");
    // Let it poll, then free the lock and stall Redis in one read of the server, so the
    // gateway's next SET NX waits in the stalled server past its 2 s deadline and is
    // applied when the server wakes.
    let claim_key = format!("{prefix}botix:event:st_stop");
    assert!(
        key_becomes(&own.url(), &claim_key, true, POLL_DEADLINE).await,
        "the gateway never claimed the event"
    );
    let mut stall = redis::pipe();
    stall
        .cmd("DEL")
        .arg(&lock_key)
        .ignore()
        .cmd("DEBUG")
        .arg("SLEEP")
        .arg(4)
        .ignore();
    // The test's connection gives up on the reply before the server wakes; the commands
    // were sent, which is all that matters here.
    let _ = stall.query_async::<()>(&mut conn).await;
    let Answer {
        status,
        body: answer,
        ..
    } = pending.await.expect("the request");
    assert_eq!(status, 503, "the SET NX's reply was lost: {answer}");

    // Redis answers again; the lock the lost SET NX took must not hold the contact.
    let released = key_becomes(&own.url(), &lock_key, false, Duration::from_secs(15)).await;
    assert!(
        released,
        "a lock whose reply was lost still holds the key: {:?}",
        get(&own.url(), &lock_key).await
    );
    let (status, answer) = gw.deliver(&c, &stop, "req_st_stop_2").await;
    assert_eq!(
        (status, outcome(&answer).as_str()),
        (200, "accepted"),
        "{answer}"
    );
    broker.delete().await;
}

/// A reconciler paused past its lease (its lease key expired, deleted here as Redis would
/// at its expiry; 30 s of a real pause) cannot move back the position the lease's next
/// holder saved: the position is written only under the writer's lease.
#[tokio::test]
async fn a_walker_paused_past_its_lease_cannot_overwrite_the_position_its_successor_saved() {
    use hookgate::reconcile::position::{Position, Positions, Walk};
    use hookgate::state::{BackendChoice, StateStore};
    use hookgate::store_error::StoreError;
    use redis::AsyncCommands;
    use std::sync::Arc;

    if !redis_available() {
        return;
    }
    let prefix = KeyPrefix::new();
    let dir = tempfile::tempdir().expect("dir");
    let config = hookgate::config::Config::parse(&format!(
        "listen:\n  addr: 127.0.0.1:0\ndedup:\n  backend: redis\nredis:\n  url: {REDIS_URL}\n  key_prefix: \"{prefix}\"\nroutes:\n  - name: botix\n    path: /b\n    secrets:\n      - secret_env: S\n"
    ))
    .expect("config");
    let store = durable_spool::Store::open(dir.path()).expect("store");
    let choice = BackendChoice::from_config(&config).expect("backend");
    let replica = || {
        let state = StateStore::open(
            &choice,
            &config,
            &store,
            Arc::new(|| 0),
            &hookgate::liveness::Liveness::new(),
        )
        .expect("state");
        Positions::new(Arc::new(state), "botix")
    };
    let (a, b) = (replica(), replica());
    let reached = |page: i64| Position {
        walk: Some(Walk {
            since_ms: 1_000,
            cursor: Some(format!("page-{page}")),
            started_ms: 2_000,
        }),
        last_try_start_ms: Some(2_000),
        ..Position::default()
    };

    assert!(a.lease().await.expect("lease"), "a free lease is taken");
    a.save(&reached(1), 1).await.expect("the holder saves");
    assert!(!b.lease().await.expect("lease"), "one holder at a time");

    let mut redis = redis_connection(REDIS_URL).await;
    let lease_key = format!("{prefix}lock:botix:reconcile:position");
    let expired: i64 = redis.del(&lease_key).await.expect("del");
    assert_eq!(expired, 1, "the lease is {lease_key}");
    assert!(b.lease().await.expect("lease"), "the next holder takes it");
    b.save(&reached(5), 5).await.expect("the next holder saves");

    let late = a.save(&reached(2), 6).await;
    assert!(
        matches!(late, Err(StoreError::LeaseLost(_))),
        "the paused walker's save: {late:?}"
    );
    assert_eq!(b.load("botix").await.expect("load"), reached(5));
    assert!(
        !a.lease().await.expect("lease"),
        "its lease is not given back"
    );
}
