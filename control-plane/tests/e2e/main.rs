//! End-to-end: the real `govd`, `gov-agent` and `govc` binaries on loopback,
//! with a real hyper upstream, driven through builders that read like the
//! scenarios of issue 5.
//!
//! `govd` is this package's binary; `gov-agent` and `govc` belong to other
//! packages, so they are taken from the target directory next to this test
//! (`cargo test --workspace` builds them first). Alone:
//!
//! ```text
//! cargo build -j2 -p gov-agent -p govc && cargo test -j2 -p gov-control-plane --test e2e
//! ```
//!
//! The NACK scenario uses a genuinely unsupported setup, not a test hook: the
//! agents run without a shared counter store (no Redis configured), so the
//! engine refuses a config with a `scope cluster` limit, naming the rule.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly"
)]

mod support;

mod access;
mod agent_identity;
mod agents;
mod apply;
mod canary;
mod chaos;
mod day2;
mod etcd_client;
mod expiry;
mod failover;
mod floods;
mod identity;
mod latches;
mod mtls;
mod operability;
mod pki;
mod replicas;
mod restarts;
mod status_summary;
mod tls_stores;
mod unsaved;
mod warmup;

use pki::Pki;
use support::*;

// === policies ===

/// order: a bulkhead of 2 on /slow, a manual fuse on /fail (3 errors), a
/// limit of 3 calls per minute on /burst that latches for 2h; payment: one
/// wide bulkhead.
const V1: &str = r#"service order {
  match slow = path prefix "/slow"
  match failing = path prefix "/fail"
  match burst = path prefix "/burst"

  bulkhead slow_calls on slow {
    max_concurrent 2
  }

  fuse errors on failing {
    trip when errors >= 3 over 10s
    recover manual
  }

  limit bursty on burst {
    calls 3 per 1m
    release after 2h
  }
}

service payment {
  match all = path prefix "/"
  bulkhead pay on all {
    max_concurrent 50
  }
}
"#;

/// V1 with the order bulkhead raised to 4; payment unchanged.
fn v2() -> String {
    V1.replacen("max_concurrent 2", "max_concurrent 4", 1)
}

/// V2 plus a `scope cluster` limit, which agents cannot enforce.
fn cluster_limit() -> String {
    v2().replacen(
        "  limit bursty on burst {",
        "  limit shared on slow {\n    calls 100 per 1s\n    scope cluster sync exact\n  }\n\n  limit bursty on burst {",
        1,
    )
}

/// Refers to a match that does not exist.
const INVALID: &str = r#"service order {
  bulkhead slow_calls on slwo {
    max_concurrent 1
  }
}
"#;
