//! A broker resource alarm: while memory or disk runs low, RabbitMQ blocks every connection
//! that publishes. This is a test binary of its own because the alarm is broker-wide: cargo
//! runs test binaries one after another, so it cannot stall the other tests' publishes.

// The harness of tests/it; this test uses part of it.
#[allow(unused_imports)]
#[path = "it/util/mod.rs"]
mod util;

use std::process::Command;

use util::*;

/// `rabbitmqctl -q ARGS`: its output, or `None` when it cannot be run or fails.
fn rabbitmqctl(args: &[&str]) -> Option<String> {
    let out = Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A memory alarm on the local broker (a high watermark of one byte). Dropping it restores
/// the watermark it replaced, also when the test fails.
struct MemoryAlarm {
    /// `0.4` (a share of memory) or `{absolute,N}` (bytes), as the broker reported it.
    previous: String,
}

impl MemoryAlarm {
    /// Refuses (panics) when an alarm is already set: an interrupted earlier run may have
    /// left the watermark at one byte, and taking that as "previous" would keep the broker
    /// blocked for good.
    fn raise() -> Option<Self> {
        assert!(
            !Self::active(),
            "the broker already has a memory alarm; reset it first: rabbitmqctl set_vm_memory_high_watermark 0.4"
        );
        let previous = rabbitmqctl(&["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."])?;
        rabbitmqctl(&["set_vm_memory_high_watermark", "absolute", "1"])?;
        Some(Self { previous })
    }

    fn active() -> bool {
        rabbitmqctl(&["eval", "rabbit_alarm:get_alarms()."]).is_some_and(|a| a.contains("memory"))
    }
}

impl Drop for MemoryAlarm {
    fn drop(&mut self) {
        let restored = match self
            .previous
            .strip_prefix("{absolute,")
            .and_then(|rest| rest.strip_suffix('}'))
        {
            Some(bytes) => rabbitmqctl(&["set_vm_memory_high_watermark", "absolute", bytes]),
            None => rabbitmqctl(&["set_vm_memory_high_watermark", &self.previous]),
        };
        if restored.is_none() {
            eprintln!(
                "!!!!! could not restore the broker's memory high watermark ({}): run `rabbitmqctl set_vm_memory_high_watermark {}` !!!!!",
                self.previous, self.previous
            );
        }
    }
}

async fn blocked_gauge(gw: &Gateway, client: &reqwest::Client) -> f64 {
    scrape(client, gw).await.get("hookgate_broker_blocked", &[])
}

#[tokio::test]
async fn while_the_broker_blocks_publishing_events_are_spooled_and_arrive_after_the_alarm() {
    if !broker_available() {
        return;
    }
    let (_dir, broker, mut cfg) = fixture().await;
    // Longer than the client's 30 s timeout: the publish held by the blocked connection
    // must be given up when the block is announced, not when its confirm times out.
    cfg.confirm_timeout = "120s".into();
    cfg.extra = "dedup:\n  in_flight_lease: 180s\nspool:\n  stall_after: 180s\n".into();
    // A writer stuck longer than the confirm's wait is what liveness reports as hung.
    cfg.store_extra = "  hung_after: 180s\n".into();
    let gw = Gateway::start(&cfg).await;
    let client = client(None);
    wait_broker_connected(&client, &gw).await;
    gw.accept(&client, "evt_before").await;

    let Some(alarm) = MemoryAlarm::raise() else {
        skip_or_fail("cannot raise a memory alarm with rabbitmqctl");
        return;
    };
    assert!(
        eventually(BROKER_TIMEOUT, || async { MemoryAlarm::active() }).await,
        "the broker did not raise its memory alarm"
    );
    // The broker holds this publish unconfirmed and blocks the connection; the publish is
    // given up at the block and spooled, so the sender gets its 200 without waiting.
    gw.accept(&client, "evt_held").await;
    let blocked = eventually(BROKER_TIMEOUT, || async {
        blocked_gauge(&gw, &client).await == 1.0
    })
    .await;
    assert!(blocked, "hookgate_broker_blocked never went to 1");
    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(status, 200, "{why}");
    assert!(why.contains("spooling"), "{why}");
    gw.accept(&client, "evt_spooled").await;

    drop(alarm);
    let unblocked = eventually(BROKER_TIMEOUT, || async {
        blocked_gauge(&gw, &client).await == 0.0
    })
    .await;
    assert!(
        unblocked,
        "hookgate_broker_blocked stayed 1 after the alarm cleared"
    );
    gw.accept(&client, "sentinel").await;
    let got: Vec<String> = broker
        .until("sentinel")
        .await
        .into_iter()
        .filter_map(|m| m.message_id)
        .collect();
    // The held publish is not lost either: the broker routes it once it reads the
    // connection again, so `evt_held` may arrive twice (consumers dedup on message_id).
    let mut once = got.clone();
    once.dedup();
    assert_eq!(
        once,
        ["evt_before", "evt_held", "evt_spooled"],
        "got {got:?}"
    );
    broker.delete().await;
}
