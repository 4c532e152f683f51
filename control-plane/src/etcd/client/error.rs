//! What an etcd call can fail with, and which failures are worth another try.

use std::time::Duration;

/// An etcd call that failed.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum EtcdError {
    /// etcd, or the channel to it, answered with a gRPC status (a member
    /// unreachable is `Unavailable`, a call past its timeout `Cancelled`).
    #[error(transparent)]
    #[diagnostic(code(gov::govd::etcd::status))]
    Status(GrpcStatus),

    /// No answer within the time the caller gave.
    #[error("no answer within {0:?}")]
    #[diagnostic(code(gov::govd::etcd::timed_out))]
    TimedOut(Duration),

    /// An endpoint that cannot be dialled as written, or TLS settings tonic
    /// refuses.
    #[error("`{url}` is not an etcd endpoint")]
    #[diagnostic(code(gov::govd::etcd::endpoint))]
    Endpoint {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },

    /// A stream (a watch, a lease's keep-alive) that etcd or the channel
    /// closed.
    #[error("the {0} stream ended")]
    #[diagnostic(code(gov::govd::etcd::stream_ended))]
    Ended(&'static str),

    /// An answer that says no (a lease not granted or gone).
    #[error("{0}")]
    #[diagnostic(code(gov::govd::etcd::refused))]
    Refused(String),

    /// A request that cannot be made as asked (no endpoints, TLS settings
    /// for a plain endpoint, a write larger than one transaction).
    #[error("{0}")]
    #[diagnostic(code(gov::govd::etcd::invalid))]
    Invalid(String),
}

impl From<tonic::Status> for EtcdError {
    fn from(status: tonic::Status) -> Self {
        Self::Status(GrpcStatus(status))
    }
}

/// A gRPC status said as its code and message, its causes (the transport's,
/// down to the OS error) as sources: tonic's own `Display` repeats them.
#[derive(Debug)]
pub struct GrpcStatus(pub tonic::Status);

impl std::fmt::Display for GrpcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gRPC {:?}", self.0.code())?;
        if !self.0.message().is_empty() {
            write!(f, ": {}", self.0.message())?;
        }
        Ok(())
    }
}

impl std::error::Error for GrpcStatus {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

impl EtcdError {
    /// Whether the call may never have reached a member able to serve it,
    /// or its answer was lost: worth trying again. A refusal on the merits
    /// (a bad request, a permission, a compare that failed) is not.
    pub fn transient(&self) -> bool {
        match self {
            Self::Status(GrpcStatus(status)) => matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
                    | tonic::Code::Aborted
            ),
            Self::TimedOut(_) => true,
            Self::Endpoint { .. } | Self::Ended(_) | Self::Refused(_) | Self::Invalid(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_in_transit_are_tried_again() {
        for code in [
            tonic::Code::Unavailable,
            tonic::Code::DeadlineExceeded,
            tonic::Code::Cancelled,
            tonic::Code::Unknown,
            tonic::Code::Aborted,
        ] {
            assert!(
                EtcdError::from(tonic::Status::new(code, "x")).transient(),
                "{code:?}"
            );
        }
        for code in [
            tonic::Code::InvalidArgument,
            tonic::Code::PermissionDenied,
            tonic::Code::Unauthenticated,
            tonic::Code::NotFound,
            tonic::Code::FailedPrecondition,
            tonic::Code::ResourceExhausted,
        ] {
            assert!(
                !EtcdError::from(tonic::Status::new(code, "x")).transient(),
                "{code:?}"
            );
        }
        assert!(EtcdError::TimedOut(Duration::from_secs(1)).transient());
        assert!(!EtcdError::Ended("watch").transient());
        assert!(!EtcdError::Refused("lease 7 not found".into()).transient());
        assert!(!EtcdError::Invalid("no endpoints".into()).transient());
        let refused = EtcdError::from(tonic::Status::unavailable("tcp connect error"));
        assert_eq!(refused.to_string(), "gRPC Unavailable: tcp connect error");
    }
}
