//! A RabbitMQ cluster of the test's own: two or three nodes (`rabbitmq-server`) on free
//! loopback ports, each with its own data, log and config folders in a temporary
//! directory, joined with `rabbitmqctl join_cluster`. The machine's broker (5672), which
//! other tests share, is never named. The packaged `rabbitmq-server` and `rabbitmqctl`
//! switch to the `rabbitmq` user, so the nodes and the tool share that user's Erlang cookie.
//!
//! The real gateway publishes to the cluster with `amqp.urls` naming its nodes under a
//! steady load; nodes are stopped (the one it is connected to; with three, first the node
//! of the quorum queue's leader); it must move on, and every event answered 200 must reach
//! the queue at least once. A single node's memory alarm blocks the connections of one
//! gateway, or of two replicas on one Redis, past the lease.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Connection, ConnectionProperties};

use crate::util::broker::declare_topic_exchange;
use crate::util::shared_redis::{KeyPrefix, REDIS_URL};
use crate::util::{self, event_body, scrape, unique, Gateway, GatewayConfig};

/// How long a node may take to boot on a loaded machine.
const BOOT_DEADLINE: Duration = Duration::from_secs(90);
/// How long one `rabbitmqctl` command may take.
const CTL_DEADLINE: Duration = Duration::from_secs(60);
/// Requests started per second, and at most this many in flight: a steady, bounded load.
const LOAD_PER_SECOND: u64 = 100;
const LOAD_IN_FLIGHT: usize = 16;
/// Load before the node is stopped, and after publishing has resumed on the other.
const LOAD_BEFORE: Duration = Duration::from_secs(3);
const LOAD_AFTER: Duration = Duration::from_secs(3);
/// Upper bound for each wait on the gateway or the consumer.
const WAIT: Duration = Duration::from_secs(60);

/// Ports the machine's RabbitMQ tools use: the shared broker and its distribution port,
/// epmd, and the range `rabbitmqctl` takes for its own distribution.
fn reserved(port: u16) -> bool {
    matches!(port, 4369 | 5672 | 25672) || (35672..=35682).contains(&port)
}

/// `n` distinct free loopback ports, none of them reserved.
fn free_ports(n: usize) -> Vec<u16> {
    let mut held = Vec::new();
    while held.len() < n {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = listener.local_addr().expect("local addr").port();
        if !reserved(port) {
            held.push(listener);
        }
    }
    held.iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

/// Runs `command`, killing it after `deadline`: its output, or why it failed.
fn run(command: &mut Command, deadline: Duration) -> Result<String, String> {
    let out = std::env::temp_dir().join(format!("{}.out", unique("hgtest-cmd")));
    let file = std::fs::File::create(&out).map_err(|e| e.to_string())?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{command:?}: {e}"))?;
    let until = Instant::now() + deadline;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let output = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    match status {
        Some(s) if s.success() => Ok(output),
        Some(s) => Err(format!("{command:?} exited with {s}: {}", output.trim())),
        None => Err(format!(
            "{command:?} took over {deadline:?}: {}",
            output.trim()
        )),
    }
}

/// `rabbitmqctl -n node args...`: its output.
fn ctl(node: &str, args: &[&str]) -> Result<String, String> {
    run(
        Command::new("rabbitmqctl")
            .arg("-q")
            .arg("-n")
            .arg(node)
            .args(args),
        CTL_DEADLINE,
    )
}

fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1))
        .is_ok()
}

/// One node of the cluster.
struct Node {
    name: String,
    amqp_port: u16,
    /// The node's Erlang distribution port, kept for a restart.
    dist_port: u16,
    dir: PathBuf,
    /// The `rabbitmq-server` wrapper, which runs while the node does.
    wrapper: Child,
    stopped: bool,
}

impl Node {
    /// Writes the node's folders and config and starts it; does not wait for it.
    fn spawn(base: &Path, name: &str, ports: (u16, u16)) -> Result<Self, String> {
        let dir = base.join(name);
        for sub in ["mnesia", "log"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
        }
        // No management plugin; no disk alarm on a full developer disk.
        std::fs::write(dir.join("enabled_plugins"), "[].\n").map_err(|e| e.to_string())?;
        std::fs::write(
            dir.join("rabbitmq.conf"),
            "disk_free_limit.absolute = 1MB\nlog.console = false\n",
        )
        .map_err(|e| e.to_string())?;
        run(
            Command::new("chown")
                .arg("-R")
                .arg("rabbitmq:rabbitmq")
                .arg(base),
            CTL_DEADLINE,
        )?;
        let name = format!("{name}@localhost");
        let wrapper = Self::launch(&name, &dir, ports)?;
        Ok(Self {
            name,
            amqp_port: ports.0,
            dist_port: ports.1,
            dir,
            wrapper,
            stopped: false,
        })
    }

    /// Runs `rabbitmq-server` for the node `name` whose folders are in `dir`; its output
    /// goes to `<short name>.out` beside them (appended, so a restart keeps the first
    /// boot's).
    fn launch(name: &str, dir: &Path, ports: (u16, u16)) -> Result<Child, String> {
        let short = name.trim_end_matches("@localhost");
        let base = dir.parent().unwrap_or(dir);
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(base.join(format!("{short}.out")))
            .map_err(|e| e.to_string())?;
        let errors = output.try_clone().map_err(|e| e.to_string())?;
        Command::new("rabbitmq-server")
            .env("RABBITMQ_NODENAME", name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", ports.0.to_string())
            .env("RABBITMQ_DIST_PORT", ports.1.to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_PID_FILE", dir.join("node.pid"))
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors)
            .spawn()
            .map_err(|e| format!("rabbitmq-server: {e}"))
    }

    /// Starts a stopped node again, with its own data: it rejoins its cluster. Does not
    /// wait for it.
    fn restart(&mut self) -> Result<(), String> {
        self.reap_wrapper();
        self.wrapper = Self::launch(&self.name, &self.dir, (self.amqp_port, self.dist_port))?;
        self.stopped = false;
        Ok(())
    }

    /// Waits until the node takes AMQP connections, or says why it will not.
    fn wait_ready(&mut self) -> Result<(), String> {
        let until = Instant::now() + BOOT_DEADLINE;
        while !port_open(self.amqp_port) {
            if let Ok(Some(status)) = self.wrapper.try_wait() {
                return Err(format!(
                    "node {} exited with {status}: {}",
                    self.name,
                    self.log_tail()
                ));
            }
            if Instant::now() >= until {
                return Err(format!(
                    "node {} did not open its port within {BOOT_DEADLINE:?}: {}",
                    self.name,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// The end of the node's output, to say why it failed.
    fn log_tail(&self) -> String {
        let out = self
            .dir
            .parent()
            .map(|base| base.join(format!("{}.out", self.name.trim_end_matches("@localhost"))))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        let tail: Vec<&str> = out.lines().rev().take(8).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    /// Stops the node (the whole Erlang VM).
    fn stop(&mut self) -> Result<(), String> {
        self.stopped = true;
        ctl(&self.name, &["stop"]).map(drop)
    }

    /// Makes sure the node is gone: `rabbitmqctl stop`, then SIGKILL to the pid it wrote.
    fn ensure_gone(&mut self) {
        if !self.stopped {
            let _ = self.stop();
        }
        let pid = std::fs::read_to_string(self.dir.join("node.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            // Gone already in the usual case: the error is expected then.
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        self.reap_wrapper();
    }

    /// Waits up to 10 s for the wrapper of a stopped node to exit, then kills and reaps it.
    fn reap_wrapper(&mut self) {
        let until = Instant::now() + Duration::from_secs(10);
        while matches!(self.wrapper.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.wrapper.kill();
        let _ = self.wrapper.wait();
    }
}

/// Two nodes joined in a cluster; both are stopped when it is dropped, also when the test
/// fails.
struct Cluster {
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
    /// This test's turn with nodes of its own: held until its nodes are gone (see
    /// [`NODE_TURN`]).
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// One test at a time runs RabbitMQ nodes of its own: on two cores, two tests that each boot
/// and stop nodes under load starve each other's gateways past the tests' deadlines.
static NODE_TURN: std::sync::LazyLock<Arc<tokio::sync::Mutex<()>>> =
    std::sync::LazyLock::new(|| Arc::new(tokio::sync::Mutex::new(())));

impl Cluster {
    /// Starts `n` nodes (`a`, `b`, `c`, …) at once and joins the others to the first.
    fn start(n: usize) -> Result<Self, String> {
        if let Err(e) = Command::new("rabbitmq-server")
            .arg("--help")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .and_then(|mut c| c.wait())
        {
            return Err(format!("rabbitmq-server cannot be run: {e}"));
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let tag = unique("x");
        let tag = &tag[2..10];
        let ports = free_ports(2 * n);
        let mut cluster = Self {
            nodes: Vec::new(),
            _dir: dir,
            _turn: None,
        };
        let base = cluster._dir.path().to_owned();
        for (i, letter) in ('a'..='z').take(n).enumerate() {
            cluster.nodes.push(Node::spawn(
                &base,
                &format!("hgtest-{letter}-{tag}"),
                (ports[2 * i], ports[2 * i + 1]),
            )?);
        }
        for node in &mut cluster.nodes {
            node.wait_ready()?;
        }
        let first = cluster.nodes[0].name.clone();
        for other in &mut cluster.nodes[1..] {
            ctl(&other.name, &["stop_app"])?;
            ctl(&other.name, &["join_cluster", &first])?;
            ctl(&other.name, &["start_app"])?;
            other.wait_ready()?;
        }
        Ok(cluster)
    }
}

impl Cluster {
    /// One node of the test's own, alone.
    fn single() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let tag = unique("x");
        let tag = &tag[2..10];
        let ports = free_ports(2);
        let mut cluster = Self {
            nodes: Vec::new(),
            _dir: dir,
            _turn: None,
        };
        let base = cluster._dir.path().to_owned();
        cluster.nodes.push(Node::spawn(
            &base,
            &format!("hgtest-alarm-{tag}"),
            (ports[0], ports[1]),
        )?);
        cluster.nodes[0].wait_ready()?;
        Ok(cluster)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.ensure_gone();
        }
    }
}

/// A connection to the node at `url` (`what` says which, if it fails) and a channel on it.
async fn open_channel(url: &str, what: &str) -> (Connection, lapin::Channel) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect(what);
    let channel = connection.create_channel().await.expect("channel");
    (connection, channel)
}

/// Declares the durable topic `exchange` and the durable quorum queue `queue` on
/// `channel`; with `initial_group_size`, the queue has that many members.
async fn declare_topic_and_quorum_queue(
    channel: &lapin::Channel,
    exchange: &str,
    queue: &str,
    initial_group_size: Option<i32>,
) {
    declare_topic_exchange(channel, exchange)
        .await
        .expect("exchange");
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    if let Some(size) = initial_group_size {
        args.insert(
            ShortString::from("x-quorum-initial-group-size"),
            AMQPValue::LongInt(size),
        );
    }
    channel
        .queue_declare(
            ShortString::from(queue),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await
        .expect("quorum queue");
}

/// Binds `queue` to `exchange` with `key` on `channel`.
async fn bind_on(channel: &lapin::Channel, exchange: &str, queue: &str, key: &str) {
    channel
        .queue_bind(
            ShortString::from(queue),
            ShortString::from(exchange),
            ShortString::from(key),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");
}

/// A consumer on one node: every message id it has received, in order.
struct Consumer {
    _connection: Connection,
    received: Arc<Mutex<Vec<String>>>,
}

impl Consumer {
    /// Declares `exchange` and a quorum queue bound to all its keys on the node at `url`,
    /// and consumes the queue.
    ///
    /// The queue has one member, on this node: a quorum queue needs a majority of its
    /// members, and of two members that is both, so with two nodes only a queue that lives
    /// on the surviving node stays writable when the other stops (a production cluster has
    /// three nodes and three members).
    async fn start(url: &str, exchange: &str) -> Self {
        let (connection, channel) = open_channel(url, "consumer connection").await;
        let queue = unique("failover-q");
        declare_topic_and_quorum_queue(&channel, exchange, &queue, Some(1)).await;
        bind_on(&channel, exchange, &queue, "#").await;
        Self::consume(connection, &channel, &queue).await
    }

    /// Consumes the existing queue `queue` on the node at `url`.
    async fn of(url: &str, queue: &str) -> Self {
        let (connection, channel) = open_channel(url, "consumer connection").await;
        Self::consume(connection, &channel, queue).await
    }

    /// Takes every message of `queue` (no acks: the test reads each once) into the list.
    async fn consume(connection: Connection, channel: &lapin::Channel, queue: &str) -> Self {
        let mut deliveries = channel
            .basic_consume(
                ShortString::from(queue),
                ShortString::from("failover"),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = received.clone();
        tokio::spawn(async move {
            while let Some(Ok(delivery)) = deliveries.next().await {
                let id = delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.as_str().to_owned())
                    .unwrap_or_default();
                sink.lock().expect("received").push(id);
            }
        });
        Self {
            _connection: connection,
            received,
        }
    }

    fn received(&self) -> Vec<String> {
        self.received.lock().expect("received").clone()
    }
}

/// The gateway's `hookgate_broker_node`, or `None` when it cannot be read.
async fn broker_node(client: &reqwest::Client, gw: &Gateway) -> Option<f64> {
    scrape(client, gw).await.find("hookgate_broker_node", &[])
}

/// Polls `check` every 50 ms for up to [`WAIT`]; the time it took, or `None`.
async fn within<F, Fut>(mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < WAIT {
        if check().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// One request of the load.
struct Sent {
    id: String,
    /// Of the type [`UNROUTABLE`].
    unroutable: bool,
    status: u16,
    answer: serde_json::Value,
    took: Duration,
}

/// Sends fresh events at [`LOAD_PER_SECOND`], at most [`LOAD_IN_FLIGHT`] at once, until
/// `stop`; with `unroutable_every` n, each n-th is of the type [`UNROUTABLE`].
async fn load(
    gw: Arc<Gateway>,
    client: reqwest::Client,
    stop: Arc<AtomicBool>,
    unroutable_every: Option<u64>,
) -> Vec<Sent> {
    let permits = Arc::new(tokio::sync::Semaphore::new(LOAD_IN_FLIGHT));
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / LOAD_PER_SECOND));
    let mut requests = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let permit = permits.clone().acquire_owned().await.expect("semaphore");
        let (gw, client) = (gw.clone(), client.clone());
        n += 1;
        let unroutable = unroutable_every.is_some_and(|every| n.is_multiple_of(every));
        let id = format!("evt-failover-{n}");
        let body = if unroutable {
            unroutable_body(&id)
        } else {
            event_body(&id)
        };
        requests.push(tokio::spawn(async move {
            let started = Instant::now();
            let (status, answer) = gw.deliver(&client, &body, &format!("req-{id}")).await;
            drop(permit);
            Sent {
                id,
                unroutable,
                status,
                answer,
                took: started.elapsed(),
            }
        }));
    }
    let mut answers = Vec::with_capacity(requests.len());
    for r in requests {
        answers.push(r.await.expect("request task"));
    }
    answers
}

/// How many log lines of the gateway have `message`.
fn logged(gw: &Gateway, message: &str) -> usize {
    gw.logs()
        .iter()
        .filter(|line| {
            serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v["message"] == message)
        })
        .count()
}

/// Starts a RabbitMQ cluster (or node) of the test's own with `start`, off the runtime;
/// `None`, after [`util::skip_or_fail`], when it cannot start on this machine.
async fn own_cluster(
    start: impl FnOnce() -> Result<Cluster, String> + Send + 'static,
    what: &str,
) -> Option<Cluster> {
    let turn = NODE_TURN.clone().lock_owned().await;
    match tokio::task::spawn_blocking(start)
        .await
        .expect("cluster start task")
    {
        Ok(mut cluster) => {
            cluster._turn = Some(turn);
            Some(cluster)
        }
        Err(why) => {
            util::skip_or_fail(&format!("{what} of the test's own cannot start: {why}"));
            None
        }
    }
}

/// The `amqp.urls` line (under `amqp:`) naming every node of `cluster`, in order.
fn urls_yaml(cluster: &Cluster) -> String {
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("'{}'", n.url()))
        .collect();
    format!("  urls: [{}]\n", urls.join(", "))
}

/// Starts the gateway of `cfg` and waits until it is connected to its broker.
async fn connected_gateway(cfg: &GatewayConfig, client: &reqwest::Client) -> Arc<Gateway> {
    let gw = Arc::new(Gateway::start(cfg).await);
    util::wait_broker_connected(client, &gw).await;
    gw
}

/// A load running in a task of its own, already [`LOAD_BEFORE`] long.
struct Running<T> {
    stop: Arc<AtomicBool>,
    /// When the load began.
    started: Instant,
    task: tokio::task::JoinHandle<T>,
}

impl<T: Send + 'static> Running<T> {
    /// Spawns the load `start` makes (it runs until its flag is set) and lets it run for
    /// [`LOAD_BEFORE`].
    async fn start<F>(start: impl FnOnce(Arc<AtomicBool>) -> F) -> Self
    where
        F: std::future::Future<Output = T> + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let task = tokio::spawn(start(stop.clone()));
        tokio::time::sleep(LOAD_BEFORE).await;
        Self {
            stop,
            started,
            task,
        }
    }

    /// Lets the load run for [`LOAD_AFTER`] more, stops it and gives its answers.
    async fn finish(self) -> T {
        tokio::time::sleep(LOAD_AFTER).await;
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("load")
    }
}

/// Raises (`true`) or clears the memory alarm of the node `name`: while it is raised, the
/// node blocks every connection that publishes.
fn memory_alarm(name: &str, raised: bool) {
    let watermark = if raised { "0.000001" } else { "0.4" };
    tokio::task::block_in_place(|| ctl(name, &["set_vm_memory_high_watermark", watermark])).expect(
        if raised {
            "memory alarm set"
        } else {
            "memory alarm cleared"
        },
    );
}

/// Waits until the spool of `gw` is empty: the time it took, or `None`.
async fn spool_drained(client: &reqwest::Client, gw: &Gateway) -> Option<Duration> {
    within(|| async { scrape(client, gw).await.find("hookgate_spool_depth", &[]) == Some(0.0) })
        .await
}

/// Delivers a fresh event through `gw`, which must answer 200: its id. Delivered after the
/// load and the spool, it closes the stream: what was confirmed before it is in the queue
/// before it.
async fn send_sentinel(client: &reqwest::Client, gw: &Gateway) -> String {
    let sentinel = unique("evt-sentinel");
    let (status, answer) = gw
        .deliver(client, &event_body(&sentinel), &unique("req"))
        .await;
    assert_eq!(status, 200, "sentinel: {answer}");
    sentinel
}

/// Waits until `consumer` has received every one of `sentinels`: the time it took, or
/// `None`.
async fn sentinels_arrive(consumer: &Consumer, sentinels: &[String]) -> Option<Duration> {
    within(|| {
        let got = consumer.received();
        let seen = sentinels.iter().all(|s| got.contains(s));
        async move { seen }
    })
    .await
}

/// Waits for the spool of `gw` to drain, then sends a sentinel through `gw` and waits
/// until `consumer` has it: the sentinel's id.
async fn close_stream(client: &reqwest::Client, gw: &Gateway, consumer: &Consumer) -> String {
    assert!(
        spool_drained(client, gw).await.is_some(),
        "the spool never drained"
    );
    let sentinel = send_sentinel(client, gw).await;
    let arrived = sentinels_arrive(consumer, std::slice::from_ref(&sentinel)).await;
    assert!(arrived.is_some(), "the sentinel never arrived");
    sentinel
}

/// How many copies of each message id `consumer` received, leaving out `sentinels`.
fn copies(consumer: &Consumer, sentinels: &[String]) -> BTreeMap<String, usize> {
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for id in consumer.received() {
        if !sentinels.contains(&id) {
            *copies.entry(id).or_default() += 1;
        }
    }
    copies
}

/// The answers other than 200, counted by status and body: the sender retries those.
fn other_answers(answers: &[Sent]) -> BTreeMap<String, usize> {
    let mut others: BTreeMap<String, usize> = BTreeMap::new();
    for a in answers.iter().filter(|a| a.status != 200) {
        *others
            .entry(format!("{} {}", a.status, a.answer))
            .or_insert(0) += 1;
    }
    others
}

/// The ids of `accepted` of which no copy arrived.
fn missing<'a>(accepted: &[&'a Sent], copies: &BTreeMap<String, usize>) -> Vec<&'a str> {
    accepted
        .iter()
        .filter(|a| !copies.contains_key(&a.id))
        .map(|a| a.id.as_str())
        .collect()
}

/// Fails, naming how many and the first five, unless nothing was `found` of `what`.
fn assert_none<T: std::fmt::Debug>(found: &[T], what: &str) {
    assert!(
        found.is_empty(),
        "{} {what}, e.g. {:?}",
        found.len(),
        &found[..found.len().min(5)]
    );
}

/// The longest any of `answers` took.
fn slowest(answers: &[Sent]) -> Duration {
    answers.iter().map(|a| a.took).max().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_cluster_node_moves_publishing_to_the_other_and_every_accepted_event_arrives() {
    let began = Instant::now();
    let Some(mut cluster) = own_cluster(|| Cluster::start(2), "a RabbitMQ cluster").await else {
        return;
    };
    let cluster_ready = began.elapsed();
    let exchange = unique("failover");
    let consumer = Consumer::start(&cluster.nodes[1].url(), &exchange).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), &exchange);
    cfg.amqp_url = String::new();
    cfg.amqp_extra = urls_yaml(&cluster);
    let client = util::client(None);
    let gw = connected_gateway(&cfg, &client).await;
    assert_eq!(
        broker_node(&client, &gw).await,
        Some(0.0),
        "the gateway starts on the first node of amqp.urls"
    );

    let sender = Running::start(|stop| load(gw.clone(), client.clone(), stop, None)).await;
    let load_started = sender.started;

    // The node the gateway is connected to goes away mid-load.
    let killed_at = load_started.elapsed();
    let stopping = Instant::now();
    let stopped = tokio::task::block_in_place(|| cluster.nodes[0].stop());
    let stop_took = stopping.elapsed();
    stopped.expect("rabbitmqctl stop of the first node");
    let resumed = within(|| async { broker_node(&client, &gw).await == Some(1.0) })
        .await
        .map(|_| stopping.elapsed());
    let Some(resumed) = resumed else {
        panic!(
            "the gateway never moved to the second node; logs:\n{}",
            gw.logs().join("\n")
        );
    };
    let answers = sender.finish().await;
    let load_time = load_started.elapsed();

    // Everything spooled meanwhile goes out, then a sentinel closes the stream: what was
    // confirmed before it is in the queue before it.
    let sentinel = close_stream(&client, &gw, &consumer).await;

    let copies = copies(&consumer, &[sentinel]);
    let accepted: Vec<&Sent> = answers.iter().filter(|a| a.status == 200).collect();
    let others = other_answers(&answers);
    let mut took: Vec<Duration> = answers.iter().map(|a| a.took).collect();
    took.sort();
    let median = took.get(took.len() / 2).copied().unwrap_or_default();
    let slowest = took.last().copied().unwrap_or_default();
    let missing = missing(&accepted, &copies);
    let messages: usize = copies.values().sum();
    let spooled = logged(&gw, "event spooled");
    let failed = logged(&gw, "publish failed; spooling");
    let moved = gw.logs().iter().any(|l| {
        serde_json::from_str::<serde_json::Value>(l)
            .is_ok_and(|v| v["message"] == "broker connected" && v["node"] == 1)
    });
    // The figures of the run, for the record: written to the process's stderr, which the
    // test harness does not capture, so every run shows them.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "rabbitmq failover: cluster ready in {cluster_ready:.1?}; load {LOAD_PER_SECOND}/s, at most {LOAD_IN_FLIGHT} in flight, for {load_time:.1?}; \
         node stopped at {killed_at:.1?} into the load (rabbitmqctl stop took {stop_took:.1?}); \
         publishing resumed on the other node {resumed:.1?} after the stop began; \
         requests {}, answered 200 {}, other answers {others:?}; answer time median {median:.1?}, slowest {slowest:.1?}; \
         events spooled {spooled} ({failed} logged as a failed publish; a publish cut off with its connection, and an event accepted while none was up or behind the spool, is not logged apart); \
         messages received {}, distinct {}, duplicates {}, missing {}; test took {:.1?}",
        answers.len(),
        accepted.len(),
        messages,
        copies.len(),
        messages - copies.len(),
        missing.len(),
        began.elapsed(),
    );
    assert!(moved, "no 'broker connected' log line names node 1");
    assert_none(&missing, "events answered 200 never arrived");
    assert!(
        accepted.len() > LOAD_PER_SECOND as usize,
        "too few events accepted for a test: {}",
        accepted.len()
    );
}

/// The type (and routing key) of the three-node test's unroutable events: the gateway's
/// queue is bound to `contact.#` only, until the test binds `orphan.#` after the failover.
const UNROUTABLE: &str = "orphan.updated";
/// One event in this many of the three-node test's load is of the type [`UNROUTABLE`].
const UNROUTABLE_EVERY: u64 = 10;
/// How often a `rabbitmqctl` query is repeated while the test waits for the cluster.
const CTL_POLL: Duration = Duration::from_millis(500);

/// A fresh event of the type [`UNROUTABLE`].
fn unroutable_body(id: &str) -> String {
    serde_json::json!({
        "id": id,
        "event": UNROUTABLE,
        "timestamp": util::rfc3339_from_now(0),
        "data": {"contact_id": 1}
    })
    .to_string()
}

/// A quorum queue as the node `ask` sees it: its leader's node and its members online.
fn quorum_state(ask: &str, queue: &str) -> Result<(String, Vec<String>), String> {
    let out = ctl(
        ask,
        &[
            "list_queues",
            "name",
            "leader",
            "online",
            "--formatter",
            "json",
        ],
    )?;
    let json = out.find('[').map_or("", |at| &out[at..]);
    let rows: serde_json::Value =
        serde_json::from_str(json.trim()).map_err(|e| format!("{e}: {out}"))?;
    let row = rows
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == queue)
        .ok_or_else(|| format!("no queue {queue}: {out}"))?;
    let online = row["online"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    Ok((
        row["leader"].as_str().unwrap_or_default().to_owned(),
        online,
    ))
}

/// Asks `ask` every [`CTL_POLL`] for the state of `queue` until `done` holds of it, for up
/// to [`WAIT`]: the state, or the last answer.
fn quorum_until(
    ask: &str,
    queue: &str,
    done: impl Fn(&(String, Vec<String>)) -> bool,
) -> Result<(String, Vec<String>), String> {
    let until = Instant::now() + WAIT;
    loop {
        let state = quorum_state(ask, queue);
        match state {
            Ok(state) if done(&state) => return Ok(state),
            _ if Instant::now() >= until => {
                return Err(format!("{queue} after {WAIT:?}: {state:?}"));
            }
            _ => std::thread::sleep(CTL_POLL),
        }
    }
}

/// Declares the durable topic `exchange` and the quorum queue `queue` through the node at
/// `url`, as a consumer that ran before the gateway would.
async fn declare_quorum_queue(url: &str, exchange: &str, queue: &str) {
    let (connection, channel) = open_channel(url, "declaring connection").await;
    declare_topic_and_quorum_queue(&channel, exchange, queue, None).await;
    let _ = connection.close(0, ShortString::from("declared")).await;
}

/// Binds `queue` to `exchange` with `key` through the node at `url`.
async fn bind(url: &str, exchange: &str, queue: &str, key: &str) {
    let (connection, channel) = open_channel(url, "binding connection").await;
    bind_on(&channel, exchange, queue, key).await;
    let _ = connection.close(0, ShortString::from("bound")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_on_three_nodes_keeps_every_accepted_event_when_its_leader_and_then_the_used_node_stop(
) {
    let began = Instant::now();
    let Some(mut cluster) = own_cluster(|| Cluster::start(3), "a RabbitMQ cluster").await else {
        return;
    };
    let cluster_ready = began.elapsed();
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
    let index_of = |name: &str| names.iter().position(|n| n == name);
    let exchange = unique("quorum");
    let queue = unique("quorum-q");
    // The queue exists before the gateway starts, declared through the second node: its
    // leader starts there (RabbitMQ puts it on the declaring node), its members on all
    // three, and the gateway connects to the first node, so the two are apart.
    declare_quorum_queue(&cluster.nodes[1].url(), &exchange, &queue).await;
    let (first_leader, _) = tokio::task::block_in_place(|| {
        quorum_until(&names[2], &queue, |(leader, online)| {
            !leader.is_empty() && online.len() == 3
        })
    })
    .expect("the quorum queue has a leader and three members online");
    let leader = index_of(&first_leader).expect("the leader is a node of the cluster");

    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), &exchange);
    cfg.amqp_url = String::new();
    cfg.amqp_extra = format!(
        "{}  queue:\n    name: {queue}\n    type: quorum\n    binding: 'contact.#'\n",
        urls_yaml(&cluster)
    );
    let client = util::client(None);
    let gw = connected_gateway(&cfg, &client).await;
    let first_used = broker_node(&client, &gw).await;

    let sender =
        Running::start(|stop| load(gw.clone(), client.clone(), stop, Some(UNROUTABLE_EVERY))).await;
    let load_started = sender.started;

    // 1. The node of the queue's leader stops; another member becomes the leader.
    let leader_stopped_at = load_started.elapsed();
    tokio::task::block_in_place(|| cluster.nodes[leader].stop())
        .expect("rabbitmqctl stop of the leader's node");
    let survivor = (leader + 2) % 3;
    let (second_leader, _) = tokio::task::block_in_place(|| {
        quorum_until(&names[survivor], &queue, |(l, _)| {
            !l.is_empty() && *l != first_leader
        })
    })
    .expect("a new leader after the leader's node stopped");
    let new_leader_at = load_started.elapsed();
    // It comes back, as in a rolling restart: a quorum queue of three members outlives one
    // node at a time, not two.
    tokio::task::block_in_place(|| {
        cluster.nodes[leader].restart()?;
        cluster.nodes[leader].wait_ready()
    })
    .expect("the leader's node starts again");
    tokio::task::block_in_place(|| {
        quorum_until(&names[survivor], &queue, |(_, online)| online.len() == 3)
    })
    .expect("the restarted node is a member online again");
    let leader_back_at = load_started.elapsed();

    // 2. The node the gateway is connected to stops (it may still be moving, when the
    // leader's node was its node).
    let connected =
        within(|| async { broker_node(&client, &gw).await.is_some_and(|n| n >= 0.0) }).await;
    assert!(connected.is_some(), "the gateway has no node");
    let used = broker_node(&client, &gw)
        .await
        .filter(|n| *n >= 0.0)
        .map(|n| n as usize)
        .expect("the gateway is connected");
    let used_stopped_at = load_started.elapsed();
    let stopping = Instant::now();
    tokio::task::block_in_place(|| cluster.nodes[used].stop())
        .expect("rabbitmqctl stop of the node the gateway uses");
    let resumed = within(|| async {
        broker_node(&client, &gw)
            .await
            .is_some_and(|n| n >= 0.0 && n as usize != used)
    })
    .await
    .map(|_| stopping.elapsed());
    let Some(resumed) = resumed else {
        panic!(
            "the gateway never moved off node {used}; logs:\n{}",
            gw.logs().join("\n")
        );
    };
    let moved_to = broker_node(&client, &gw).await;
    let answers = sender.finish().await;
    let load_time = load_started.elapsed();

    // Every unroutable event answered 200 waits in the held area: nothing is bound for it.
    let unroutable_accepted = answers
        .iter()
        .filter(|a| a.unroutable && a.status == 200)
        .count();
    let held_wait = within(|| async {
        scrape(&client, &gw)
            .await
            .find("hookgate_spool_held", &[])
            .is_some_and(|held| held >= unroutable_accepted as f64)
    })
    .await;
    let held = scrape(&client, &gw)
        .await
        .find("hookgate_spool_held", &[])
        .unwrap_or_default();
    assert!(
        held_wait.is_some(),
        "{unroutable_accepted} unroutable events answered 200, {held} held"
    );

    // A queue for them: the held entries go out, and the spool drains.
    let up = (used + 1..used + 3)
        .map(|i| i % 3)
        .find(|i| !cluster.nodes[*i].stopped)
        .expect("a node is up");
    bind(&cluster.nodes[up].url(), &exchange, &queue, "orphan.#").await;
    let drained = within(|| async {
        let m = scrape(&client, &gw).await;
        m.find("hookgate_spool_depth", &[]) == Some(0.0)
            && m.find("hookgate_spool_held", &[]) == Some(0.0)
    })
    .await;
    assert!(drained.is_some(), "the spool never drained");
    let sentinel = send_sentinel(&client, &gw).await;

    // A consumer on a node that is up reads the queue to the sentinel.
    let consumer = Consumer::of(&cluster.nodes[up].url(), &queue).await;
    let arrived = sentinels_arrive(&consumer, std::slice::from_ref(&sentinel)).await;
    assert!(arrived.is_some(), "the sentinel never arrived");

    let copies = copies(&consumer, &[sentinel]);
    let accepted: Vec<&Sent> = answers
        .iter()
        .filter(|a| a.status == 200 && a.answer["status"] == "accepted")
        .collect();
    let missing = missing(&accepted, &copies);
    let others = other_answers(&answers);
    let not_503: Vec<&String> = others.keys().filter(|k| !k.starts_with("503 ")).collect();
    let answered_503 = answers.iter().filter(|a| a.status == 503).count();
    let messages: usize = copies.values().sum();
    let twice = copies.values().filter(|n| **n > 1).count();
    let slowest = slowest(&answers);
    let spooled = logged(&gw, "event spooled");
    let failed = logged(&gw, "publish failed; spooling");
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "quorum failover: cluster of three ready in {cluster_ready:.1?}; gateway first on node {first_used:?}; \
         leader {first_leader} (node {leader}) stopped at {leader_stopped_at:.1?} into the load, new leader {second_leader} by {new_leader_at:.1?}, \
         back and online at {leader_back_at:.1?}; node {used} (the gateway's) stopped at {used_stopped_at:.1?}, \
         publishing on node {moved_to:?} {resumed:.1?} after the stop began; load {LOAD_PER_SECOND}/s for {load_time:.1?}; \
         requests {}, answered 200 accepted {}, 503 {answered_503}, other answers {others:?}; slowest answer {slowest:.1?}; \
         unroutable answered 200 {unroutable_accepted}, held {held} before their binding; \
         events spooled {spooled} ({failed} after a failed publish); messages {messages}, distinct {}, events with more than one copy {twice}, \
         accepted events missing {}; test took {:.1?}",
        answers.len(),
        accepted.len(),
        copies.len(),
        missing.len(),
        began.elapsed(),
    );
    assert_none(&missing, "events answered 200 never arrived");
    assert!(
        not_503.is_empty(),
        "answers besides 200 and 503: {not_503:?}"
    );
    assert!(
        unroutable_accepted > 0,
        "no unroutable event was accepted: the held area was not shown"
    );
    assert!(
        accepted.len() > LOAD_PER_SECOND as usize,
        "too few events accepted for a test: {}",
        accepted.len()
    );
}

/// The lease of the blocked-connection test: longer than its bound, `in_flight_wait` 1 s +
/// `confirm_timeout` 2 s + 5 s for the spool's fsync (local backend) = 8 s.
const ALARM_LEASE: Duration = Duration::from_secs(9);
/// How long the node's memory alarm blocks the gateway's connection: past the lease.
const ALARM_FOR: Duration = Duration::from_secs(12);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_blocked_past_the_lease_answers_every_request_within_it() {
    let Some(node) = own_cluster(Cluster::single, "a RabbitMQ node").await else {
        return;
    };
    let exchange = unique("alarm");
    let consumer = Consumer::start(&node.nodes[0].url(), &exchange).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), &exchange);
    cfg.amqp_url = node.nodes[0].url();
    cfg.confirm_timeout = "2s".into();
    cfg.extra = format!(
        "dedup:\n  in_flight_wait: 1s\n  in_flight_lease: {}s\n",
        ALARM_LEASE.as_secs()
    );
    let client = util::client(None);
    let gw = connected_gateway(&cfg, &client).await;

    let sender = Running::start(|stop| load(gw.clone(), client.clone(), stop, None)).await;
    // A memory alarm on the node: the broker blocks the publishing connection, longer than
    // a claim's lease, while the load goes on.
    let name = &node.nodes[0].name;
    memory_alarm(name, true);
    tokio::time::sleep(ALARM_FOR).await;
    memory_alarm(name, false);
    let answers = sender.finish().await;

    close_stream(&client, &gw, &consumer).await;

    // The sentinel is counted too, as a message.
    let copies = copies(&consumer, &[]);
    let accepted: Vec<&Sent> = answers.iter().filter(|a| a.status == 200).collect();
    let late: Vec<(&str, u16, Duration)> = answers
        .iter()
        .filter(|a| a.took >= ALARM_LEASE)
        .map(|a| (a.id.as_str(), a.status, a.took))
        .collect();
    let missing = missing(&accepted, &copies).len();
    let twice = copies.values().filter(|n| **n > 1).count();
    let slowest = slowest(&answers);
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "blocked connection: {} requests, {} answered 200, {} answered later than the lease ({ALARM_LEASE:?}); slowest {slowest:.1?}; \
         messages {}, events with more than one copy {twice}, accepted events missing {missing}",
        answers.len(),
        accepted.len(),
        late.len(),
        copies.values().sum::<usize>(),
    );
    assert_none(&late, "requests were answered later than the lease");
    assert_eq!(missing, 0, "events answered 200 never arrived");
}

/// The two-replica blocked-connection test's `dedup.in_flight_wait` and
/// `amqp.confirm_timeout`: short, so the bound on a claim's hold is short too.
const REPLICAS_IN_FLIGHT_WAIT: Duration = Duration::from_secs(1);
const REPLICAS_CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause of the sender before it retries a 503 through the other replica.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long the sender keeps retrying one event.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// Fresh events per second of the two-replica load: one request at a time per event,
/// each retried until it gets a 200.
const REPLICAS_PER_SECOND: u64 = 40;

/// The longest a request holds its claim with the Redis backend, as the config check
/// computes it for the test's settings (no `wait_replicas`).
fn replicas_bound() -> Duration {
    hookgate::config::Redis::default()
        .longest_hold(REPLICAS_IN_FLIGHT_WAIT, REPLICAS_CONFIRM_TIMEOUT)
}

/// One try of an event: the replica it went to, its answer and how long it took.
struct Try {
    replica: usize,
    status: u16,
    answer: serde_json::Value,
    took: Duration,
}

/// One delivery of the two-replica load and its tries.
struct Delivery {
    id: String,
    /// A repeat of an event sent earlier, as a sender sends whose own timeout fired.
    repeat: bool,
    /// When the first try was sent, from the start of the load.
    at: Duration,
    tries: Vec<Try>,
}

/// Sends [`REPLICAS_PER_SECOND`] deliveries a second until `stop`: fresh events to the two
/// replicas in turn, and every third a repeat of a recent event through the replica the
/// event did not first go to. Each delivery is retried through the other replica after
/// every 503 (after [`RETRY_PAUSE`]), until an answer that is not a 503 or [`RETRY_FOR`]
/// has passed.
async fn load_with_retries(
    gws: [Arc<Gateway>; 2],
    client: reqwest::Client,
    stop: Arc<AtomicBool>,
) -> Vec<Delivery> {
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / REPLICAS_PER_SECOND));
    let load_started = Instant::now();
    let mut deliveries = Vec::new();
    let (mut n, mut events) = (0usize, 0usize);
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        n += 1;
        let (event, repeat) = if n % 3 == 0 && events > 0 {
            (events.saturating_sub(1 + n % 7), true)
        } else {
            events += 1;
            (events - 1, false)
        };
        let first = if repeat { (event + 1) % 2 } else { event % 2 };
        let (gws, client) = (gws.clone(), client.clone());
        let id = format!("evt-replicas-{event}");
        let at = load_started.elapsed();
        deliveries.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut tries = Vec::new();
            let mut replica = first;
            loop {
                let began = Instant::now();
                let (status, answer) = gws[replica]
                    .deliver(&client, &event_body(&id), &unique("req"))
                    .await;
                tries.push(Try {
                    replica,
                    status,
                    answer,
                    took: began.elapsed(),
                });
                if status != 503 || started.elapsed() >= RETRY_FOR {
                    break;
                }
                replica = 1 - replica;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Delivery {
                id,
                repeat,
                at,
                tries,
            }
        }));
    }
    let mut out = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        out.push(d.await.expect("delivery task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_blocked_past_the_lease_with_retries_through_a_second_replica_answers_within_the_bound(
) {
    if !util::local_port_open(6379) {
        util::skip_or_fail("Redis is not reachable on 127.0.0.1:6379");
        return;
    }
    let began = Instant::now();
    let Some(node) = own_cluster(Cluster::single, "a RabbitMQ node").await else {
        return;
    };
    let node_ready = began.elapsed();
    let bound = replicas_bound();
    let lease = bound + Duration::from_secs(1);
    // The block lasts past the lease, so a claim taken before it would have ended during it.
    let alarm_for = lease + Duration::from_secs(3);
    let exchange = unique("alarm-replicas");
    let consumer = Consumer::start(&node.nodes[0].url(), &exchange).await;
    // A prefix of the test's own on the machine's Redis; its keys go when it is dropped.
    let prefix = KeyPrefix::new();
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let client = util::client(None);
    let mut gws = Vec::new();
    for dir in &dirs {
        let mut cfg = GatewayConfig::new(dir.path(), &exchange);
        cfg.amqp_url = node.nodes[0].url();
        cfg.confirm_timeout = format!("{}s", REPLICAS_CONFIRM_TIMEOUT.as_secs());
        cfg.extra = format!(
            "dedup:\n  backend: redis\n  in_flight_wait: {}s\n  in_flight_lease: {}s\nredis:\n  url: {REDIS_URL}\n  key_prefix: \"{prefix}\"\n",
            REPLICAS_IN_FLIGHT_WAIT.as_secs(),
            lease.as_secs()
        );
        gws.push(connected_gateway(&cfg, &client).await);
    }
    let gws = [gws[0].clone(), gws[1].clone()];

    let sender = Running::start(|stop| load_with_retries(gws.clone(), client.clone(), stop)).await;
    let load_started = sender.started;
    // A memory alarm on the node blocks both replicas' connections past the lease.
    let name = &node.nodes[0].name;
    let alarm_at = load_started.elapsed();
    memory_alarm(name, true);
    tokio::time::sleep(alarm_for).await;
    let cleared_at = load_started.elapsed();
    memory_alarm(name, false);
    let deliveries = sender.finish().await;

    // Both spools drain; then a sentinel through each replica closes its stream.
    for gw in &gws {
        assert!(
            spool_drained(&client, gw).await.is_some(),
            "a spool never drained"
        );
    }
    let mut sentinels = Vec::new();
    for gw in &gws {
        sentinels.push(send_sentinel(&client, gw).await);
    }
    let arrived = sentinels_arrive(&consumer, &sentinels).await;
    assert!(arrived.is_some(), "a sentinel never arrived");

    let copies = copies(&consumer, &sentinels);
    let tries: Vec<&Try> = deliveries.iter().flat_map(|d| &d.tries).collect();
    let late: Vec<(&str, usize, u16, Duration)> = deliveries
        .iter()
        .flat_map(|d| d.tries.iter().map(move |t| (d.id.as_str(), t)))
        .filter(|(_, t)| t.took > bound)
        .map(|(id, t)| (id, t.replica, t.status, t.took))
        .collect();
    let mut answered: BTreeMap<&str, bool> = BTreeMap::new();
    for d in &deliveries {
        *answered.entry(d.id.as_str()).or_default() |= d.tries.iter().any(|t| t.status == 200);
    }
    let accepted: Vec<&str> = answered
        .iter()
        .filter(|(_, a)| **a)
        .map(|(id, _)| *id)
        .collect();
    let unanswered: Vec<&str> = answered
        .iter()
        .filter(|(_, a)| !**a)
        .map(|(id, _)| *id)
        .collect();
    let missing: Vec<&&str> = accepted
        .iter()
        .filter(|id| !copies.contains_key(**id))
        .collect();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for t in &tries {
        let outcome = t.answer["status"].as_str().unwrap_or_default();
        *statuses
            .entry(format!("{} {outcome}", t.status))
            .or_default() += 1;
    }
    let repeats = deliveries.iter().filter(|d| d.repeat).count();
    let retried = deliveries.iter().filter(|d| d.tries.len() > 1).count();
    let mut per_event: BTreeMap<usize, usize> = BTreeMap::new();
    for id in &accepted {
        *per_event
            .entry(copies.get(*id).copied().unwrap_or(0))
            .or_default() += 1;
    }
    // The events with more than one copy, with when each was first sent.
    let twice: Vec<(&str, usize, Duration)> = copies
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| {
            let first = deliveries
                .iter()
                .filter(|d| d.id == *id)
                .map(|d| d.at)
                .min()
                .unwrap_or_default();
            (id.as_str(), *n, first)
        })
        .collect();
    // The alarm blocked both replicas' connections.
    let blocked: Vec<usize> = gws
        .iter()
        .map(|gw| logged(gw, "broker blocked the connection; spooling"))
        .collect();
    let spooled: Vec<usize> = gws.iter().map(|gw| logged(gw, "event spooled")).collect();
    let slowest = tries.iter().map(|t| t.took).max().unwrap_or_default();
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "blocked connection, two replicas: node ready in {node_ready:.1?}; bound {bound:?}, lease {lease:?}, memory alarm from {alarm_at:.1?} to {cleared_at:.1?} into the load; \
         blocks logged by each replica {blocked:?}, events spooled by each {spooled:?}; \
         {} deliveries ({repeats} repeats of an earlier event through the other replica), {} requests ({statuses:?}), \
         {retried} deliveries retried through the other replica after a 503; slowest answer {slowest:.1?}, later than the bound {}; \
         events {}, answered 200 {}, never {}; copies per accepted event {per_event:?} (copies: events), more than one {twice:.1?} (event, copies, first sent); \
         messages {}, accepted events missing {}; test took {:.1?}",
        deliveries.len(),
        tries.len(),
        late.len(),
        answered.len(),
        accepted.len(),
        unanswered.len(),
        copies.values().sum::<usize>(),
        missing.len(),
        began.elapsed(),
    );
    assert_none(
        &late,
        &format!("answers came later than the bound {bound:?}"),
    );
    let not_503: Vec<&String> = statuses
        .keys()
        .filter(|k| !k.starts_with("200 ") && !k.starts_with("503 "))
        .collect();
    assert!(
        not_503.is_empty(),
        "answers besides 200 and 503: {not_503:?}"
    );
    assert!(
        blocked.iter().all(|n| *n > 0),
        "the alarm did not block both replicas' connections: {blocked:?}"
    );
    assert!(
        unanswered.is_empty(),
        "events never answered 200 within {RETRY_FOR:?} of retries: {unanswered:?}"
    );
    assert!(
        missing.is_empty(),
        "events answered 200 never arrived: {missing:?}"
    );
}

/// Whether the node `name` has a memory alarm raised.
fn memory_alarm_raised(name: &str) -> bool {
    tokio::task::block_in_place(|| ctl(name, &["eval", "rabbit_alarm:get_alarms()."]))
        .is_ok_and(|alarms| alarms.contains("memory"))
}

/// The gateway's `hookgate_broker_blocked`.
async fn broker_blocked(client: &reqwest::Client, gw: &Gateway) -> Option<f64> {
    scrape(client, gw)
        .await
        .find("hookgate_broker_blocked", &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_node_blocks_publishing_events_are_spooled_and_arrive_in_order_after_the_alarm() {
    let Some(node) = own_cluster(Cluster::single, "a RabbitMQ node").await else {
        return;
    };
    let exchange = unique("blocked");
    let consumer = Consumer::start(&node.nodes[0].url(), &exchange).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = GatewayConfig::new(dir.path(), &exchange);
    cfg.amqp_url = node.nodes[0].url();
    // Longer than the client's 30 s timeout: the publish the blocked connection holds must
    // be given up when the block is announced, not when its confirm times out.
    cfg.confirm_timeout = "120s".into();
    cfg.extra = "dedup:\n  in_flight_lease: 180s\nspool:\n  stall_after: 180s\n".into();
    // A writer stuck longer than the confirm's wait is what liveness reports as hung.
    cfg.store_extra = "  hung_after: 180s\n".into();
    let client = util::client(None);
    let gw = connected_gateway(&cfg, &client).await;
    gw.accept(&client, "evt_before").await;

    let name = &node.nodes[0].name;
    memory_alarm(name, true);
    assert!(
        within(|| async { memory_alarm_raised(name) })
            .await
            .is_some(),
        "the node did not raise its memory alarm"
    );
    // The node holds this publish unconfirmed and blocks the connection; the publish is
    // given up at the block and spooled, so the sender gets its 200 without waiting.
    gw.accept(&client, "evt_held").await;
    let blocked = within(|| async { broker_blocked(&client, &gw).await == Some(1.0) }).await;
    assert!(blocked.is_some(), "hookgate_broker_blocked never went to 1");
    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(status, 200, "{why}");
    assert!(why.contains("spooling"), "{why}");
    gw.accept(&client, "evt_spooled").await;

    memory_alarm(name, false);
    let unblocked = within(|| async { broker_blocked(&client, &gw).await == Some(0.0) }).await;
    assert!(
        unblocked.is_some(),
        "hookgate_broker_blocked stayed 1 after the alarm cleared"
    );
    let sentinel = close_stream(&client, &gw, &consumer).await;
    // The held publish is not lost either: the node routes it once it reads the connection
    // again, so `evt_held` may arrive twice (consumers dedup on message_id).
    let mut once = consumer.received();
    once.dedup();
    assert_eq!(
        once,
        ["evt_before", "evt_held", "evt_spooled", sentinel.as_str()],
        "got {:?}",
        consumer.received()
    );
}
