//! The gRPC status codes by name: the one list (`GrpcCode` in
//! `config.proto`), read by the compiler (`classify ... grpc_status NAME`,
//! `reject with grpc_status NAME`, with did-you-mean), the agent (the
//! `grpc-message` of a rejection, `/metrics` labels) and the TUI.

use crate::v1::GrpcCode;

const PREFIX: &str = "GRPC_CODE_";

/// Every code, in wire order (`OK` is 0).
pub const CODES: [GrpcCode; 17] = [
    GrpcCode::Ok,
    GrpcCode::Cancelled,
    GrpcCode::Unknown,
    GrpcCode::InvalidArgument,
    GrpcCode::DeadlineExceeded,
    GrpcCode::NotFound,
    GrpcCode::AlreadyExists,
    GrpcCode::PermissionDenied,
    GrpcCode::ResourceExhausted,
    GrpcCode::FailedPrecondition,
    GrpcCode::Aborted,
    GrpcCode::OutOfRange,
    GrpcCode::Unimplemented,
    GrpcCode::Internal,
    GrpcCode::Unavailable,
    GrpcCode::DataLoss,
    GrpcCode::Unauthenticated,
];

/// The name as written in `.gov` and in `grpc-message`: `UNAVAILABLE`.
pub fn name(code: GrpcCode) -> &'static str {
    let full = code.as_str_name();
    full.strip_prefix(PREFIX).unwrap_or(full)
}

/// The code named `name` as written in `.gov` (`UNAVAILABLE`), exactly.
pub fn from_name(name: &str) -> Option<GrpcCode> {
    CODES.into_iter().find(|&c| self::name(c) == name)
}

/// The code of a wire number (`grpc-status: 14`), `None` beyond 16.
pub fn from_number(n: u32) -> Option<GrpcCode> {
    usize::try_from(n).ok().and_then(|i| CODES.get(i)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_in_wire_order_and_named_without_the_prefix() {
        for (i, code) in CODES.into_iter().enumerate() {
            assert_eq!(code as usize, i);
            assert_eq!(from_number(i as u32), Some(code));
            assert_eq!(from_name(name(code)), Some(code));
        }
        assert_eq!(name(GrpcCode::Unavailable), "UNAVAILABLE");
        assert_eq!(from_name("unavailable"), None);
        assert_eq!(from_number(17), None);
    }
}
