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
