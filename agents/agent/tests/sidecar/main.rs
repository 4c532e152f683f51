//! Integration tests of the `gov-agent` sidecar on loopback: a real upstream server,
//! the agent in process (or the built binary), real HTTP clients.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

mod support;

mod adaptive;
mod balance;
mod client_gone;
mod criticality;
mod deadline;
mod decision_log;
mod differential;
mod enforce;
mod grpc;
mod h1;
mod h2_bounds;
mod h2spec;
mod hostile;
mod identity;
mod jwt;
mod keepalive;
mod keys;
mod latches;
mod limit_share;
mod memory;
mod mtls;
mod paths;
mod protocols;
mod proxy;
mod reload;
mod retry;
mod shadow;
mod share;
mod shutdown;
mod slow_fuse;
mod strict;
mod tomcat;
mod websocket;
mod workers;
