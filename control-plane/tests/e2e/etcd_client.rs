//! govd's own etcd client (`gov_control_plane::etcd::client`) against real
//! members: a watch replays from its start revision and then follows, a
//! watch of a compacted revision is canceled with the compaction's
//! revision, a lease kept alive holds its key until revoked, and a
//! transaction's compares choose its side.

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

    // Compacted past a watch's start revision: etcd cancels the watch and
    // says up to where (govd's follower then reads the key again and
    // watches from there).
    compact(&etcd.endpoints()[0], third).await;
    let mut stale = client.watch("c/watched", first).await.unwrap();
    let mut canceled = None;
    for _ in 0..3 {
        let message = tokio::time::timeout(Duration::from_secs(10), stale.message())
            .await
            .expect("a watch answer within 10 s")
            .unwrap()
            .expect("the watch stream stays open");
        assert!(message.events.is_empty(), "{message:?}");
        if message.canceled {
            canceled = Some(message);
            break;
        }
    }
    let canceled = canceled.expect("the watch of a compacted revision is canceled");
    assert_eq!(canceled.compact_revision, third);

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

/// A paged read in a transaction is read whole, page by page, as of the
/// transaction's revision: every key once, in order, none written after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paged_read_is_read_whole_at_the_transactions_revision() {
    use gov_control_plane::etcd::client::PAGE;
    let etcd = Etcd::start().await;
    let client = Client::connect(&etcd.endpoints(), &options()).unwrap();
    let count = usize::try_from(PAGE).unwrap() * 2 + 500;
    let puts: Vec<RequestOp> = (0..count)
        .map(|i| RequestOp::put(format!("p/{i:05}"), "x", 0))
        .collect();
    for batch in puts.chunks(100) {
        client
            .txn(TxnRequest::default().and_then(batch.to_vec()))
            .await
            .unwrap();
    }
    client.put("q/after", "outside the prefix").await.unwrap();
    let read = TxnRequest::default().and_then(vec![
        RequestOp::get("q/after"),
        RequestOp::range(RangeRequest::prefix("p/").paged()),
    ]);
    let got = client.txn_whole(read).await.unwrap();
    let mut ranges = got.ranges();
    assert_eq!(ranges.next().unwrap().kvs.len(), 1);
    let whole = ranges.next().unwrap();
    assert!(!whole.more);
    let keys: Vec<String> = whole
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect();
    let expected: Vec<String> = (0..count).map(|i| format!("p/{i:05}")).collect();
    assert_eq!(keys, expected, "every key once, in order");
    // Written after the transaction: not in a read at its revision.
    client.put("p/99999", "later").await.unwrap();
    let at = RangeRequest::prefix("p/").paged();
    let last = whole.kvs.last().unwrap();
    let rest = client
        .range(at.after(&last.key, got.revision()))
        .await
        .unwrap();
    assert!(rest.kvs.is_empty(), "{:?}", rest.kvs.len());
}

/// Compacts etcd's history up to `revision` through the member's JSON
/// gateway (`/v3/kv/compaction`: govd itself never compacts, so its client
/// has no such call).
async fn compact(endpoint: &str, revision: i64) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let host = endpoint.strip_prefix("http://").unwrap();
    let body = format!(r#"{{"revision":"{revision}","physical":true}}"#);
    let request = format!(
        "POST /v3/kv/compaction HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .expect("the compaction answered within 10 s")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
