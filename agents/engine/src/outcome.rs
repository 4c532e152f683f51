//! How an admitted call ended, as fuses classify it.

use http::StatusCode;

/// The end of an admitted call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The upstream answered with this status.
    Status(u16),
    /// A gRPC call ended with this `grpc-status` (its HTTP status was 200),
    /// read from its trailers or a trailers-only response.
    Grpc(gov_proto::v1::GrpcCode),
    /// The upstream could not be connected to.
    ConnectFailure,
    /// The call exceeded its timeout.
    Timeout,
    /// The upstream closed the connection mid-response.
    Reset,
}

impl From<StatusCode> for Outcome {
    fn from(s: StatusCode) -> Self {
        Outcome::Status(s.as_u16())
    }
}
