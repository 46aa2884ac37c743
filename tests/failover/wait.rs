//! `redis.wait_replicas` against servers of the test's own: a master and one replica on
//! loopback, the replica stopped with `SIGSTOP`. No write can then be acknowledged, so no
//! answer may be a 200, whatever happens to the gateway's connections; and the requests
//! waiting for the stopped replica wait side by side, not one behind another.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::redis_servers::*;
use crate::require_broker;
use crate::util::*;

/// A master and a replica in sync, in `dirs`.
async fn master_and_replica(dirs: &[tempfile::TempDir]) -> Option<(Server, Server)> {
    let master = Server::start(dirs[0].path(), free_port(), None, &[]).await?;
    let replica_args = ["--replicaof", "127.0.0.1", &master.port.to_string()].map(str::to_owned);
    let replica_args: Vec<&str> = replica_args.iter().map(String::as_str).collect();
    let replica = Server::start(dirs[1].path(), free_port(), None, &replica_args).await?;
    let synced = eventually(POLL_DEADLINE, || async {
        let info: Option<String> = replica.query(redis::cmd("INFO").arg("replication")).await;
        info.is_some_and(|i| i.contains("master_link_status:up"))
    })
    .await;
    assert!(synced, "the replica never synced with the master");
    Some((master, replica))
}

/// A gateway (real binary) on `master` with `wait_replicas: 1` and `wait_timeout`.
async fn gateway_waiting(
    broker: &Broker,
    dir: &tempfile::TempDir,
    master: &Server,
    wait_timeout: &str,
) -> Gateway {
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange).with_spec_guard();
    cfg.extra = format!(
        "dedup:\n  backend: redis\nredis:\n  url: redis://{}/0\n  key_prefix: \"{}:\"\n  wait_replicas: 1\n  wait_timeout: {wait_timeout}\n",
        master.addr(),
        unique("hg-wait")
    );
    let gw = Gateway::start(&cfg).await;
    wait_broker_connected(&client(None), &gw).await;
    gw
}

/// What the tests of a stopped replica run against: a master and its replica (stopped with
/// `SIGSTOP`), a broker and a gateway on the master waiting `wait_timeout` for the replica.
/// The folders live as long as it does.
struct StoppedReplica {
    master: Server,
    replica: Server,
    broker: Broker,
    gw: Gateway,
    _dirs: [tempfile::TempDir; 3],
}

impl StoppedReplica {
    /// Starts it all and stops the replica; `None` when the servers cannot start here.
    async fn start(wait_timeout: &str) -> Option<Self> {
        let dirs = [
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        ];
        let (master, replica) = master_and_replica(&dirs[..2]).await?;
        let broker = Broker::new().await;
        let gw = gateway_waiting(&broker, &dirs[2], &master, wait_timeout).await;
        replica.signal("STOP");
        Some(Self {
            master,
            replica,
            broker,
            gw,
            _dirs: dirs,
        })
    }
}

/// Sends `command` to `master` on a connection of its own every `period` until the flag
/// returned is set, folding each reply into `state` with `fold`; the handle gives the last
/// state.
async fn poll_master<R, T>(
    master: &Server,
    command: redis::Cmd,
    period: Duration,
    mut state: T,
    mut fold: impl FnMut(T, redis::RedisResult<R>) -> T + Send + 'static,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<T>)
where
    R: redis::FromRedisValue + Send + 'static,
    T: Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let mut conn = master.connect().await.expect("connection to the master");
    let stopped = stop.clone();
    let task = tokio::spawn(async move {
        while !stopped.load(Ordering::Relaxed) {
            state = fold(state, command.query_async(&mut conn).await);
            tokio::time::sleep(period).await;
        }
        state
    });
    (stop, task)
}

/// The `n`-th delivery of load task `task`: plain events, status chains and STOP/START of
/// one contact per task, every fourth one a retry of the one before under its request id.
fn delivery(task: usize, n: usize) -> (String, String) {
    let i = if n % 4 == 3 { n - 1 } else { n };
    let now = wall_ms() + i as i64;
    let body = match i % 3 {
        0 => event_body(&format!("w{task}_{i}")),
        1 => status_at(
            &format!("w{task}_{i}"),
            &format!("msg_{task}_{}", i / 12),
            ["sent", "delivered", "read"][(i / 3) % 3],
            now,
        ),
        _ => keyword_between(
            &format!("w{task}_{i}"),
            &format!("+1555000{task:04}"),
            "+15550009999",
            ["STOP", "START"][(i / 3) % 2],
            now,
        ),
    };
    (body, format!("req_w{task}_{i}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_and_connections_killed_every_50ms_leave_no_200_answered() {
    require_broker!();
    let Some(servers) = StoppedReplica::start("200ms").await else {
        return;
    };

    // Every 50 ms, every normal client of the master is killed (this one skips itself).
    let mut kill = redis::cmd("CLIENT");
    kill.arg("KILL").arg("TYPE").arg("normal");
    let (stop_killing, kills) = poll_master(
        &servers.master,
        kill,
        Duration::from_millis(50),
        0u32,
        |kills, killed: redis::RedisResult<i64>| kills + u32::from(killed.is_ok_and(|n| n > 0)),
    )
    .await;
    const TASKS: usize = 8;
    const EACH: usize = 60;
    let answers: Arc<Mutex<Vec<(u16, String)>>> = Arc::default();
    let mut load = Vec::new();
    for task in 0..TASKS {
        let (c, url, answers) = (
            patient_client(),
            servers.gw.url("/webhooks/botix"),
            answers.clone(),
        );
        load.push(tokio::spawn(async move {
            for n in 0..EACH {
                let (body, request_id) = delivery(task, n);
                let answer = c
                    .post(&url)
                    .header("x-botix-signature", sign(SECRET, body.as_bytes()))
                    .header("x-botix-request-id", request_id)
                    .body(body)
                    .send()
                    .await;
                let (status, outcome) = match answer {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let body: serde_json::Value = r.json().await.unwrap_or_default();
                        (status, outcome(&body))
                    }
                    Err(e) => (0, e.to_string()),
                };
                answers.lock().expect("lock").push((status, outcome));
            }
        }));
    }
    for task in load {
        task.await.expect("load task");
    }
    stop_killing.store(true, Ordering::Relaxed);
    let kills = kills.await.expect("killer");
    let answers = answers.lock().expect("lock").clone();
    let count = |s: u16| answers.iter().filter(|(status, _)| *status == s).count();
    println!(
        "{} deliveries, {kills} kills that closed connections: {} x 200, {} x 503, {} other",
        answers.len(),
        count(200),
        count(503),
        answers.len() - count(200) - count(503)
    );
    assert!(kills > 0, "no connection was ever killed");
    let ok: Vec<_> = answers.iter().filter(|(s, _)| *s == 200).collect();
    assert!(
        ok.is_empty(),
        "200 answered while no replica could acknowledge: {ok:?}"
    );
    assert_eq!(count(503), answers.len(), "{answers:?}");

    // The replica back, the same path answers 200: the 503s were the replica's.
    servers.replica.signal("CONT");
    let c = client(None);
    let (body, request_id) = delivery(99, 0);
    let back = eventually(POLL_DEADLINE, || {
        let (c, gw, body, request_id) = (&c, &servers.gw, body.clone(), request_id.clone());
        async move { gw.deliver(c, &body, &request_id).await.0 == 200 }
    })
    .await;
    assert!(back, "no 200 once the replica was back");
    servers.broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_makes_fifty_concurrent_deliveries_wait_side_by_side_not_in_line() {
    require_broker!();
    let Some(servers) = StoppedReplica::start("1500ms").await else {
        return;
    };

    // The master's own count of clients blocked (in WAIT), sampled while the deliveries
    // run: requests that wait one behind another on one connection never show more than
    // one at a time.
    let mut info = redis::cmd("INFO");
    info.arg("clients");
    let (done, sampler) = poll_master(
        &servers.master,
        info,
        Duration::from_millis(20),
        0usize,
        |most, info: redis::RedisResult<String>| {
            let blocked = info.ok().and_then(|i| {
                i.lines()
                    .find_map(|l| l.strip_prefix("blocked_clients:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
            });
            most.max(blocked.unwrap_or(0))
        },
    )
    .await;
    const DELIVERIES: usize = 50;
    let c = patient_client();
    let mut running = Vec::new();
    for i in 0..DELIVERIES {
        let (c, gw_url) = (c.clone(), servers.gw.url("/webhooks/botix"));
        running.push(tokio::spawn(async move {
            let body = event_body(&format!("side_{i}"));
            c.post(&gw_url)
                .header("x-botix-signature", sign(SECRET, body.as_bytes()))
                .header("x-botix-request-id", format!("req_side_{i}"))
                .body(body)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }));
    }
    let mut statuses = Vec::new();
    for r in running {
        statuses.push(r.await.expect("delivery"));
    }
    done.store(true, Ordering::Relaxed);
    let most_blocked = sampler.await.expect("sampler");
    println!("{DELIVERIES} deliveries: statuses {statuses:?}; at most {most_blocked} clients blocked in WAIT at once");
    assert!(
        statuses.iter().all(|s| *s == 503),
        "a stopped replica cannot acknowledge: {statuses:?}"
    );
    assert!(
        most_blocked >= DELIVERIES / 2,
        "at most {most_blocked} of {DELIVERIES} requests waited for the replica at once: the others waited in line behind them"
    );
    servers.replica.signal("CONT");
    servers.broker.delete().await;
}
