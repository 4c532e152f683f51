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
    /// The transport's root cause (the OS error, the handshake's), unless
    /// the status's message says it already: tonic's chain in between
    /// (`transport error`, `tcp connect error` twice) only repeats it.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let mut root = std::error::Error::source(&self.0)?;
        while let Some(next) = root.source() {
            root = next;
        }
        let said = root.to_string();
        (!self.0.message().contains(&said) && said != "transport error").then_some(root)
    }
}

impl GrpcStatus {
    /// The status's message and its causes, lower-cased, to tell failures
    /// apart by what they say.
    fn text(&self) -> String {
        let mut text = self.0.message().to_lowercase();
        let mut source = std::error::Error::source(&self.0);
        while let Some(cause) = source {
            text.push(' ');
            text.push_str(&cause.to_string().to_lowercase());
            source = cause.source();
        }
        text
    }
}

impl EtcdError {
    /// What to do about this failure, for the operator who started govd:
    /// a handshake refused, an endpoint that is not etcd's gRPC, a name
    /// that does not resolve each say so instead of "is etcd up?". `tls`:
    /// the store is `etcds://`; `client_cert`: govd has a client certificate
    /// (a member that wants one and gets none closes the connection after
    /// a TLS 1.3 handshake, with no reason).
    pub fn advice(&self, tls: bool, client_cert: bool) -> &'static str {
        const REACH: &str = "check that a majority of the etcd members in --store are up and \
                             reachable from this host";
        let Self::Status(status) = self else {
            return REACH;
        };
        let text = status.text();
        if text.contains("unknownissuer") || text.contains("invalid peer certificate") {
            "the members' certificates are not signed by the CA given with --etcd-ca (or do \
             not name the host written in --store): give --etcd-ca the CA that signed them"
        } else if text.contains("certificaterequired") || text.contains("badcertificate") {
            if client_cert {
                "the members refused govd's client certificate: check that --etcd-cert is \
                 signed by a CA they trust (their --trusted-ca-file) and is for client auth"
            } else {
                "the members ask for a client certificate (etcd's --client-cert-auth): give \
                 govd --etcd-cert and --etcd-key, signed by a CA they trust"
            }
        } else if text.contains("tls handshake eof") || text.contains("invalidcontenttype") {
            "the endpoint does not speak TLS: write --store etcd://... for members that \
             serve plain gRPC, or point etcds:// at their TLS client URLs"
        } else if text.contains("h2 protocol error") {
            "the endpoint does not answer as etcd's gRPC: check that --store names the \
             members' client URLs (port 2379 by default)"
        } else if text.contains("broken pipe")
            || text.contains("connection closed")
            || text.contains("connection reset")
        {
            // A reset is a close with our bytes unread (a TLS member given
            // plain gRPC's preface does either, as timing has it).
            match (tls, client_cert) {
                (false, _) => {
                    "the endpoint closed the connection: check that --store names the \
                     members' client URLs (port 2379 by default), as etcds://... with \
                     --etcd-ca if they serve TLS, and that a majority of them are up"
                }
                (true, false) => {
                    "the members closed the connection after the TLS handshake: if they run \
                     with --client-cert-auth, give govd --etcd-cert and --etcd-key, signed by a \
                     CA they trust; otherwise check that a majority of them are up"
                }
                (true, true) => {
                    "the members closed the connection after the TLS handshake: check that \
                     they trust the CA that signed --etcd-cert, and that a majority of them are up"
                }
            }
        } else if text.contains("dns error") {
            "a host in --store does not resolve from this host: check its name"
        } else {
            REACH
        }
    }

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

    /// A plain connection a TLS member drops is said as such whether it was
    /// closed or reset (which of the two comes depends on timing).
    #[test]
    fn a_connection_closed_or_reset_by_the_endpoint_gets_the_same_advice() {
        for kind in [
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::BrokenPipe,
        ] {
            let error = EtcdError::from(tonic::Status::from_error(Box::new(std::io::Error::from(
                kind,
            ))));
            let advice = error.advice(false, false);
            assert!(advice.contains("etcds://"), "{kind:?}: {advice}");
            assert!(
                error.advice(true, false).contains("--etcd-cert"),
                "{kind:?}"
            );
        }
    }
}
