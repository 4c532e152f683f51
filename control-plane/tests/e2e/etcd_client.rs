//! govd's own etcd client (`gov_control_plane::etcd::client`) against real
//! members: a watch replays from its start revision and then follows, a
//! lease kept alive holds its key until revoked, and a transaction's
//! compares choose its side.

use std::time::Duration;

use gov_control_plane::etcd::client::pb::etcdserverpb::{
    Compare, RangeRequest, RequestOp, TxnRequest,
};
use gov_control_plane::etcd::client::{Client, ConnectOptions};

use super::replicas::Etcd;

fn options() -> ConnectOptions {
    ConnectOptions {
        timeout: Some(Duration::from_secs(5)),
        connect_timeout: Some(Duration::from_secs(5)),
        keep_alive: Some((Duration::from_secs(5), Duration::from_secs(5))),
        tls: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_watches_from_a_revision_and_keeps_a_lease_alive() {
    let etcd = Etcd::start().await;
    let client = Client::connect(&etcd.endpoints(), &options()).unwrap();

    // Puts, then a watch from the first: both replayed in order, then a
    // later put followed.
    let first = client.put("c/watched", "1").await.unwrap();
    let second = client.put("c/watched", "2").await.unwrap();
    assert!(second > first, "{first} then {second}");
    client.put("c/other", "x").await.unwrap();
    let mut watch = client.watch("c/watched", first).await.unwrap();
    let mut seen = Vec::new();
    let mut third = None;
    while seen.len() < 3 {
        let message = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("a watch answer within 10 s")
            .unwrap()
            .expect("the watch stream stays open");
        assert!(!message.canceled, "{message:?}");
        for event in &message.events {
            let kv = event.kv.as_ref().unwrap();
            assert_eq!(kv.key, b"c/watched");
            seen.push((kv.mod_revision, kv.value.clone()));
        }
        if seen.len() == 2 && third.is_none() {
            third = Some(client.put("c/watched", "3").await.unwrap());
        }
    }
    let third = third.unwrap();
    assert_eq!(
        seen,
        [
            (first, b"1".to_vec()),
            (second, b"2".to_vec()),
            (third, b"3".to_vec())
        ]
    );

    // A key on a lease: kept alive past its TTL, gone with the lease.
    let lease = client.lease_grant(2).await.unwrap();
    let take = TxnRequest::default()
        .when(vec![Compare::create_revision_is("c/leased", 0)])
        .and_then(vec![RequestOp::put("c/leased", "me", lease)])
        .or_else(vec![RequestOp::get("c/leased")]);
    let taken = client.txn(take.clone()).await.unwrap();
    assert!(taken.succeeded);
    assert!(taken.revision() > third);
    // The same compare now fails: the read of the other side answers.
    let again = client.txn(take).await.unwrap();
    assert!(!again.succeeded);
    let holder = again.ranges().next().unwrap().kvs[0].clone();
    assert_eq!(
        (holder.lease, holder.create_revision),
        (lease, taken.revision())
    );
    let mut keeper = client.lease_keep_alive(lease).await.unwrap();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(keeper.renew().await.unwrap() > 0);
    }
    let held = client.get("c/leased").await.unwrap();
    assert_eq!(held.kvs.len(), 1, "held past the 2 s TTL by the keep-alive");
    client.lease_revoke(lease).await.unwrap();
    assert!(client.get("c/leased").await.unwrap().kvs.is_empty());
    assert!(
        keeper.renew().await.unwrap() <= 0,
        "a revoked lease is gone"
    );
    assert!(client.lease_keep_alive(lease).await.is_err());

    // A prefix read, keys only.
    let keys = client
        .range(RangeRequest::prefix("c/").keys_only())
        .await
        .unwrap();
    let names: Vec<&[u8]> = keys.kvs.iter().map(|kv| kv.key.as_slice()).collect();
    assert_eq!(names, [&b"c/other"[..], &b"c/watched"[..]]);
    assert!(keys.kvs.iter().all(|kv| kv.value.is_empty()));
}
