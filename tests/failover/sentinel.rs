//! Redis Sentinel: one master, one replica, three sentinels, two hookgate replicas under
//! load; the master is killed mid-load and the sentinels promote the replica.

use crate::redis_servers::*;
use crate::require_broker;
use crate::util::*;

const MASTER: &str = "hgmain";

/// A sentinel's configuration: it rewrites the file, so it lives in the sentinel's folder.
fn sentinel_conf(dir: &std::path::Path, master_port: u16) -> std::path::PathBuf {
    let path = dir.join("sentinel.conf");
    std::fs::write(
        &path,
        format!(
            "sentinel monitor {MASTER} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER} 1000\n\
             sentinel failover-timeout {MASTER} 10000\n\
             sentinel parallel-syncs {MASTER} 1\n"
        ),
    )
    .expect("sentinel.conf");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_killed_mid_load_loses_no_answered_event_and_both_replicas_recover() {
    require_broker!();
    let dirs: Vec<tempfile::TempDir> = (0..5).map(|_| tempfile::tempdir().expect("dir")).collect();
    let master_port = free_port();
    let Some(mut master) = Server::start(dirs[0].path(), master_port, None, &[]).await else {
        return;
    };
    let replica_args = ["--replicaof", "127.0.0.1", &master_port.to_string()].map(str::to_owned);
    let replica_args: Vec<&str> = replica_args.iter().map(String::as_str).collect();
    let Some(replica) = Server::start(dirs[1].path(), free_port(), None, &replica_args).await
    else {
        return;
    };
    let mut sentinels = Vec::new();
    for dir in &dirs[2..] {
        let conf = sentinel_conf(dir.path(), master_port);
        let Some(s) = Server::start(dir.path(), free_port(), Some(&conf), &["--sentinel"]).await
        else {
            return;
        };
        sentinels.push(s);
    }
    // The replica is in sync and every sentinel knows it and the others.
    let synced = eventually(POLL_DEADLINE, || async {
        let info: Option<String> = replica.query(redis::cmd("INFO").arg("replication")).await;
        info.is_some_and(|i| i.contains("master_link_status:up"))
    })
    .await;
    assert!(synced, "the replica never synced with the master");
    for s in &sentinels {
        let known = eventually(POLL_DEADLINE, || async {
            let master: Option<Vec<(String, String)>> = s
                .query(redis::cmd("SENTINEL").arg("MASTER").arg(MASTER))
                .await
                .map(|flat: Vec<String>| {
                    flat.chunks(2)
                        .map(|kv| (kv[0].clone(), kv.get(1).cloned().unwrap_or_default()))
                        .collect()
                });
            master.is_some_and(|m| {
                m.iter().any(|(k, v)| k == "num-slaves" && v == "1")
                    && m.iter()
                        .any(|(k, v)| k == "num-other-sentinels" && v == "2")
            })
        })
        .await;
        assert!(
            known,
            "sentinel {} never saw the replica and the other sentinels",
            s.addr()
        );
    }

    let broker = Broker::new().await;
    let list: Vec<String> = sentinels.iter().map(Server::addr).collect();
    let redis_yaml = format!(
        "  url: redis://127.0.0.1:1/0\n  sentinels: [{}]\n  master_name: {MASTER}\n",
        list.join(", ")
    );
    let (a, b, _dirs) = two_gateways(&broker, &redis_yaml).await;
    let figures = load_through_failover("sentinel", &a, &b, &broker, || master.kill()).await;
    assert!(figures.answered_200 > 0, "{figures:?}");
    // The replica is the master now.
    let role: Option<Vec<redis::Value>> = replica.query(&redis::cmd("ROLE")).await;
    assert!(
        format!("{role:?}").contains("master"),
        "the replica was not promoted: {role:?}"
    );
    broker.delete().await;
}

/// Delivers `body` under a fresh request id until it gets an answer other than 503 (the
/// gateway answers 503 while it finds the new master), within [`POLL_DEADLINE`] × 3.
async fn settled(gw: &Gateway, body: &str) -> (u16, String) {
    let (last, _) = settled_after(gw, body).await;
    last
}

/// [`settled`]'s answer, and the answers of the 503s before it: an event whose done mark
/// stayed behind a 503 is a `duplicate` at its retry, which alone does not say whether the
/// first attempt dropped or accepted it.
async fn settled_after(gw: &Gateway, body: &str) -> ((u16, String), Vec<String>) {
    let c = client(None);
    let deadline = std::time::Instant::now() + POLL_DEADLINE * 3;
    let mut refused = Vec::new();
    loop {
        let (status, answer) = gw.deliver(&c, body, &unique("req")).await;
        if status != 503 || std::time::Instant::now() >= deadline {
            return ((status, outcome(&answer)), refused);
        }
        refused.push(answer.to_string());
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A master, `replicas` replicas and three sentinels in `dirs` (at least 4 + `replicas`
/// folders), every replica in sync and every sentinel knowing them and the others.
async fn sentinel_set(
    dirs: &[tempfile::TempDir],
    replicas: usize,
) -> Option<(Server, Vec<Server>, Vec<Server>)> {
    let master_port = free_port();
    let master = Server::start(dirs[0].path(), master_port, None, &[]).await?;
    let replica_args = ["--replicaof", "127.0.0.1", &master_port.to_string()].map(str::to_owned);
    let replica_args: Vec<&str> = replica_args.iter().map(String::as_str).collect();
    let mut copies = Vec::new();
    for dir in &dirs[1..=replicas] {
        copies.push(Server::start(dir.path(), free_port(), None, &replica_args).await?);
    }
    let mut sentinels = Vec::new();
    for dir in &dirs[replicas + 1..replicas + 4] {
        let conf = sentinel_conf(dir.path(), master_port);
        sentinels.push(Server::start(dir.path(), free_port(), Some(&conf), &["--sentinel"]).await?);
    }
    for r in &copies {
        let synced = eventually(POLL_DEADLINE, || async {
            let info: Option<String> = r.query(redis::cmd("INFO").arg("replication")).await;
            info.is_some_and(|i| i.contains("master_link_status:up"))
        })
        .await;
        assert!(synced, "replica {} never synced", r.addr());
    }
    let slaves = replicas.to_string();
    for s in &sentinels {
        let known = eventually(POLL_DEADLINE, || async {
            let flat: Option<Vec<String>> = s
                .query(redis::cmd("SENTINEL").arg("MASTER").arg(MASTER))
                .await;
            flat.is_some_and(|f| {
                let m: Vec<(&str, &str)> = f
                    .chunks(2)
                    .map(|kv| (kv[0].as_str(), kv.get(1).map_or("", String::as_str)))
                    .collect();
                m.contains(&("num-slaves", slaves.as_str()))
                    && m.contains(&("num-other-sentinels", "2"))
            })
        })
        .await;
        assert!(
            known,
            "sentinel {} never saw the replicas and the others",
            s.addr()
        );
    }
    Some((master, copies, sentinels))
}

/// The `wait_replicas` tests' servers: a master with two replicas watched by three
/// sentinels, a broker, and the `redis:` section's lines naming the sentinels with
/// `wait_replicas: 1`. The servers and their folders live as long as it does.
struct WaitedSentinels {
    master: Server,
    broker: Broker,
    /// The lines under `redis:`, each indented by two spaces and ending in a newline.
    redis_yaml: String,
    _replicas: Vec<Server>,
    _sentinels: Vec<Server>,
    _dirs: Vec<tempfile::TempDir>,
}

impl WaitedSentinels {
    /// Starts them all; `None` when the servers cannot start here.
    async fn start() -> Option<Self> {
        let dirs: Vec<tempfile::TempDir> =
            (0..6).map(|_| tempfile::tempdir().expect("dir")).collect();
        let (master, replicas, sentinels) = sentinel_set(&dirs, 2).await?;
        let broker = Broker::new().await;
        let list: Vec<String> = sentinels.iter().map(Server::addr).collect();
        let redis_yaml = format!(
            "  url: redis://127.0.0.1:1/0\n  sentinels: [{}]\n  master_name: {MASTER}\n  wait_replicas: 1\n  wait_timeout: 1s\n",
            list.join(", ")
        );
        Some(Self {
            master,
            broker,
            redis_yaml,
            _replicas: replicas,
            _sentinels: sentinels,
            _dirs: dirs,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_every_200_outlives_the_master_as_a_duplicate_and_every_opt_out_holds() {
    require_broker!();
    let Some(mut servers) = WaitedSentinels::start().await else {
        return;
    };
    let (master, broker) = (&mut servers.master, &servers.broker);
    let gw_dir = tempfile::tempdir().expect("dir");
    let mut cfg = GatewayConfig::new(gw_dir.path(), &broker.exchange).with_spec_guard();
    cfg.extra = format!(
        "dedup:\n  backend: redis\nredis:\n{}  key_prefix: \"{}:\"\n",
        servers.redis_yaml,
        unique("hg-sentinel-wait")
    );
    let gw = Gateway::start(&cfg).await;
    wait_broker_connected(&client(None), &gw).await;

    // Plain events, status chains and a STOP per contact, each answered 200 before the
    // master goes.
    let base = wall_ms() - 60_000;
    let mut bodies = Vec::new();
    for i in 0..10i64 {
        bodies.push(event_body(&format!("sw_plain_{i}")));
        bodies.push(status_at(
            &format!("sw_status_{i}"),
            &format!("sw_msg_{}", i / 2),
            ["sent", "delivered"][(i % 2) as usize],
            base + i,
        ));
        bodies.push(keyword_between(
            &format!("sw_stop_{i}"),
            &format!("+1555100{i:04}"),
            "+15551009999",
            "STOP",
            base + i,
        ));
    }
    for body in &bodies {
        let (status, outcome) = settled(&gw, body).await;
        assert_eq!((status, outcome.as_str()), (200, "accepted"), "{body}");
    }

    master.kill();
    assert!(
        both_ready(&[&gw], std::time::Duration::from_secs(45)).await,
        "the gateway was not ready again after the failover"
    );
    // Every event answered 200 is a duplicate on the promoted replica.
    let mut not_duplicate = Vec::new();
    for body in &bodies {
        let answer = settled(&gw, body).await;
        if answer != (200, "duplicate".to_owned()) {
            not_duplicate.push((body.clone(), answer));
        }
    }
    // And every opt-out holds: a later STOP of each contact is a repeated one. A STOP
    // answered 503 whose done mark stayed is a `duplicate` at its retry; what its first
    // attempt decided is then read from the broker: a STOP the guard let through was
    // published.
    let mut not_held = Vec::new();
    let mut after_refusal = Vec::new();
    for i in 0..10i64 {
        let id = format!("sw_stop_again_{i}");
        let again = keyword_between(
            &id,
            &format!("+1555100{i:04}"),
            "+15551009999",
            "STOP",
            base + 1_000 + i,
        );
        let (answer, refused) = settled_after(&gw, &again).await;
        match answer.1.as_str() {
            "dropped:repeated_stop" if answer.0 == 200 => {}
            "duplicate" if answer.0 == 200 && !refused.is_empty() => after_refusal.push(id),
            _ => not_held.push((i, answer, refused)),
        }
    }
    let last = unique("sw_last");
    assert_eq!(
        settled(&gw, &event_body(&last)).await,
        (200, "accepted".to_owned())
    );
    let published: Vec<String> = broker
        .until_within(&last, POLL_DEADLINE)
        .await
        .into_iter()
        .filter_map(|m| m.message_id)
        .filter(|id| id.starts_with("sw_stop_again_"))
        .collect();
    assert!(
        published.is_empty(),
        "STOPs published after the opt-out they repeat (answered a duplicate after a 503: {after_refusal:?}): {published:?}"
    );
    println!(
        "sentinel with two replicas, wait_replicas 1: {} events answered 200 before the kill; after it {} not duplicates, {} opt-outs lost, {} repeated STOPs a duplicate after a 503",
        bodies.len(),
        not_duplicate.len(),
        not_held.len(),
        after_refusal.len()
    );
    assert!(not_duplicate.is_empty(), "{not_duplicate:?}");
    assert!(not_held.is_empty(), "{not_held:?}");
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_and_two_replicas_the_master_killed_mid_load_loses_no_answered_event() {
    require_broker!();
    let Some(mut servers) = WaitedSentinels::start().await else {
        return;
    };
    let (master, broker) = (&mut servers.master, &servers.broker);
    let (a, b, _dirs) = two_gateways(broker, &servers.redis_yaml).await;
    let figures = load_through_failover("sentinel_wait", &a, &b, broker, || master.kill()).await;
    assert!(figures.answered_200 > 0, "{figures:?}");
    broker.delete().await;
}
