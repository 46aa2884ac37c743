//! A full disk: nothing is answered 200 that is not on disk, and the gateway recovers with
//! no operator, including a gateway that starts while the disk is still full.

use std::time::Duration;

use crate::require_broker;
use crate::spool::{
    accept_numbered, accept_until_refused, assert_retry_later, spooling_behind_a_cut_proxy,
};
use crate::util::*;

/// How long a test waits for a drain or for readiness before it fails.
const DRAIN_DEADLINE: Duration = Duration::from_secs(90);

#[tokio::test]
async fn a_gateway_started_on_a_full_disk_comes_up_refuses_with_503_and_once_there_is_room_takes_deliveries_and_drains(
) {
    require_broker!();
    let Some((disk, _dir, broker, mut cfg)) = fixture_on_small_disk().await else {
        return;
    };
    let (proxy, mut gw, client) = spooling_behind_a_cut_proxy(&mut cfg).await;

    // The broker away: accepted events wait in the spool. Then the disk fills.
    let mut accepted = accept_numbered(&gw, &client, 3).await;
    disk.fill();
    let (more, refused_before) = accept_until_refused(&gw, &client, 3, 500).await;
    accepted.extend(more);

    // A crash, and a start while the disk is still full: the gateway comes up alive, not
    // ready, and answers 503, never a 200 for what it cannot keep.
    gw.kill9();
    let gw = Gateway::start(&cfg).await;
    assert_eq!(healthz(&client, &gw).await, 200, "alive on a full disk");
    let (status, why) = gw.admin_get(&client, "/readyz").await;
    assert_eq!(status, 503, "nothing can be made durable: {why}");
    let mut refused = vec![refused_before];
    for i in 600..603 {
        let id = format!("evt_{i:03}");
        let a = gw
            .deliver_answer(&client, &event_body(&id), &format!("req_{id}"))
            .await;
        assert_retry_later(&a, &format!("{id} on a full disk"));
        refused.push(id);
    }
    assert_eq!(healthz(&client, &gw).await, 200, "still alive");

    // Room again: deliveries are taken with no restart, then the broker comes back.
    disk.free();
    let (status, why) = gw
        .admin_until(&client, "/readyz", DRAIN_DEADLINE, |s, _| s == 200)
        .await;
    assert_eq!(status, 200, "ready once the disk has room: {why}");
    gw.accept(&client, "evt_after").await;
    accepted.push("evt_after".to_owned());
    proxy.restore();
    let (_, spool) = gw
        .admin_until(&client, "/spool", DRAIN_DEADLINE, |_, b| {
            b.contains("\"depth\":0")
        })
        .await;
    assert!(spool.contains("\"depth\":0"), "not drained: {spool}");
    gw.accept(&client, "sentinel").await;
    let got = ids(&broker.until_within("sentinel", DRAIN_DEADLINE).await);
    // A refused event may come back from what the crash left (it was never answered
    // 200); every accepted one arrives once, in the order it was accepted.
    let kept: Vec<String> = got
        .iter()
        .filter(|id| !refused.contains(id))
        .cloned()
        .collect();
    assert_eq!(
        kept, accepted,
        "every accepted event once, in order: {got:?}"
    );
    for id in &refused {
        assert!(
            got.iter().filter(|g| *g == id).count() <= 1,
            "{id} published twice: {got:?}"
        );
    }
    broker.delete().await;
}
