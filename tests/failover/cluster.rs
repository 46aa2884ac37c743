//! Redis Cluster: three masters with a replica each, two hookgate replicas under load; a
//! master is killed mid-load and its replica takes over its slots.

use crate::redis_servers::*;
use crate::require_broker;
use crate::util::*;

/// A cluster node on a free port; a port taken between its choice and the node's start
/// (by another test's connection) is replaced by another, up to three times.
async fn cluster_node(dir: &std::path::Path, args: &[&str]) -> Option<Server> {
    let mut why = String::new();
    for _ in 0..3 {
        match Server::try_start(dir, free_cluster_port(), None, args).await {
            Ok(node) => return Some(node),
            Err(e) => {
                // The node's identity file, if it wrote one, is not carried to the next.
                let _ = std::fs::remove_file(dir.join("nodes.conf"));
                why = e;
            }
        }
    }
    skip_or_fail(&why);
    None
}

/// A Redis Cluster of `count` nodes in `dirs` (node timeout 1 s), `replicas` per master,
/// every node saying `cluster_state:ok`; `None` after a loud skip when it cannot be made.
async fn cluster(dirs: &[tempfile::TempDir], replicas: usize) -> Option<Vec<Server>> {
    let mut nodes = Vec::new();
    for dir in dirs {
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
        ];
        nodes.push(cluster_node(dir.path(), &args).await?);
    }
    let addrs: Vec<String> = nodes.iter().map(Server::addr).collect();
    let created = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if !created.is_ok_and(|s| s.success()) {
        skip_or_fail("redis-cli --cluster create failed");
        return None;
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
    Some(nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_load_loses_no_answered_event_and_both_replicas_recover() {
    require_broker!();
    let dirs: Vec<tempfile::TempDir> = (0..6).map(|_| tempfile::tempdir().expect("dir")).collect();
    let Some(mut nodes) = cluster(&dirs, 1).await else {
        return;
    };
    let addrs: Vec<String> = nodes.iter().map(Server::addr).collect();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_when_any_one_master_refuses_writes() {
    require_broker!();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let Some(nodes) = cluster(&dirs, 0).await else {
        return;
    };
    let broker = Broker::new().await;
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = GatewayConfig::new(dir.path(), &broker.exchange);
    let seeds: Vec<String> = nodes.iter().map(Server::addr).collect();
    cfg.extra = format!(
        "dedup:\n  backend: redis\nredis:\n  url: redis://127.0.0.1:1/0\n  key_prefix: \"{}:\"\n  cluster_nodes: [{}]\n",
        unique("hg-ready"),
        seeds.join(", ")
    );
    let gw = Gateway::start(&cfg).await;
    let c = client(None);
    let readyz = |want: u16| {
        let (c, gw) = (&c, &gw);
        async move {
            eventually(POLL_DEADLINE, || async move {
                gw.admin_get(c, "/readyz").await.0 == want
            })
            .await
        }
    };
    assert!(readyz(200).await, "never ready on a healthy cluster");
    // Each master in turn refuses writes (out of memory, `noeviction`): hookgate's keys
    // lie on every master, so readiness must fail for any one of them.
    for node in &nodes {
        let set = |limit: &str| {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("SET").arg("maxmemory").arg(limit);
            cmd
        };
        let refused: Option<String> = node.query(&set("1")).await;
        assert!(refused.is_some(), "CONFIG SET on {}", node.addr());
        let noticed = readyz(503).await;
        let restored: Option<String> = node.query(&set("0")).await;
        assert!(restored.is_some(), "CONFIG SET on {}", node.addr());
        assert!(noticed, "ready while master {} refuses writes", node.addr());
        assert!(
            readyz(200).await,
            "not ready again after {} took writes",
            node.addr()
        );
    }
    broker.delete().await;
}
