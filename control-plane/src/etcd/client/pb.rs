//! The etcd v3 messages and tonic clients that `build.rs` generates from
//! `proto/etcd/` (etcd's packages `etcdserverpb` and `mvccpb`).

#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unused_qualifications,
    unreachable_pub
)]
pub mod mvccpb {
    include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
}

#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unused_qualifications,
    unreachable_pub
)]
pub mod etcdserverpb {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
}
