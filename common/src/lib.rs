//! What gov's crates share beside the wire (`gov-proto`): duration and
//! instant spellings (the language's literals and the binaries' flags),
//! printing that survives a closed stream, the daemons' log set-up, fatal
//! error reports and stop signals, Prometheus text, and a gRPC client's TLS
//! files. Heavy dependencies sit behind features (`tls`, `daemon`), so the
//! language crate, which reads only durations and instants, pulls none of
//! them; `testing` holds helpers for the binaries' tests.

pub mod duration;
pub mod flag;
pub mod instant;
#[cfg(feature = "daemon")]
pub mod log;
pub mod prom;
pub mod report;
#[cfg(feature = "daemon")]
pub mod signal;
pub mod stdio;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "tls")]
pub mod tls;
