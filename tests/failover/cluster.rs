//! Redis Cluster: three masters with a replica each, two hookgate replicas under load; a
//! master is killed mid-load and its replica takes over its slots.

use crate::redis_servers::*;
use crate::require_broker;
use crate::util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_load_loses_no_answered_event_and_both_replicas_recover() {
    require_broker!();
    let dirs: Vec<tempfile::TempDir> = (0..6).map(|_| tempfile::tempdir().expect("dir")).collect();
    let mut nodes = Vec::new();
    for dir in &dirs {
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
        ];
        let Some(node) = Server::start(dir.path(), free_port(), None, &args).await else {
            return;
        };
        nodes.push(node);
    }
    let addrs: Vec<String> = nodes.iter().map(Server::addr).collect();
    let created = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if !created.is_ok_and(|s| s.success()) {
        skip_or_fail("redis-cli --cluster create failed");
        return;
    }
    let all_ok = eventually(POLL_DEADLINE, || async {
        for n in &nodes {
            let info: Option<String> = n.query(redis::cmd("CLUSTER").arg("INFO")).await;
            if !info.is_some_and(|i| i.contains("cluster_state:ok")) {
                return false;
            }
        }
        true
    })
    .await;
    assert!(all_ok, "the cluster never became ok");
    // Which of the six is a master with a replica: kill the first master.
    let mut victim = None;
    for (i, n) in nodes.iter().enumerate() {
        let role: Option<Vec<redis::Value>> = n.query(&redis::cmd("ROLE")).await;
        if format!("{role:?}").contains("master") {
            victim = Some(i);
            break;
        }
    }
    let victim = victim.expect("a master");

    let broker = Broker::new().await;
    let seeds: Vec<String> = addrs.iter().take(3).cloned().collect();
    let redis_yaml = format!(
        "  url: redis://127.0.0.1:1/0\n  cluster_nodes: [{}]\n",
        seeds.join(", ")
    );
    let (a, b, _dirs) = two_gateways(&broker, &redis_yaml).await;
    let (left, right) = nodes.split_at_mut(victim);
    let killed = &mut right[0];
    let _ = left;
    let figures = load_through_failover("cluster", &a, &b, &broker, || killed.kill()).await;
    assert!(figures.answered_200 > 0, "{figures:?}");
    broker.delete().await;
}
