//! The gov wire API: the compiled config schema (`TargetConfig`, what one
//! service's agents enforce) and the control-plane protocol (`ControlPlane`
//! service), generated from `proto/gov/v1/*.proto` at build time.
//!
//! The `.proto` files are the reference for what every field means. All
//! messages implement serde `Serialize`/`Deserialize` with the proto3 JSON
//! mapping (pbjson): enums as their names (`BULKHEAD_KEY_INSTANCE`), oneofs
//! flattened into their parent, snake_case field names on output and both
//! snake_case and camelCase on input, 64-bit integers as plain numbers.
//! This is the format of `govc compile -o yaml|json` and `gov-agent --config`.
//!
//! Only the wire and what reads or writes it: the utilities every binary
//! shares (durations, flags, logs, TLS files) are `gov-common`.

pub mod compiled;
pub mod decision_log;
pub mod grpc;
pub mod path;
pub mod printable;
pub mod rejections;
mod rule;
#[cfg(feature = "x509")]
pub mod spiffe;
mod words;

/// Generated types of package `gov.v1`, with the tonic client and server when the
/// `grpc` feature is on (the default).
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
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/gov.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/gov.v1.serde.rs"));
}

/// Upper bounds (inclusive, milliseconds) of `RuleStats.latency_buckets`; one
/// more bucket counts everything above the last. The one table of them: the
/// engine counts into them, `/metrics` and the TUI label them from here.
pub const LATENCY_BOUNDS_MS: [u64; 7] = [10, 20, 50, 100, 200, 500, 1000];

/// The encoded `FileDescriptorSet` of every gov `.proto` file (with imports),
/// for gRPC reflection and tools.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/gov_descriptor.bin"));
