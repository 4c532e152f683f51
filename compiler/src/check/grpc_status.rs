//! `gov::unknown-grpc-status`: a gRPC status name that is not one of the
//! gRPC codes, in `classify business|system grpc_status NAME...` or
//! `reject with grpc_status NAME`.
//!
//! Why: a fuse that classifies `UNAVAILBLE` counts no call as an error and
//! never trips, and a rejection needs a code every gRPC client knows.
//!
//! Example: `classify system grpc_status UNAVAILBLE`.
//!
//! Fix: write one of the codes of grpc/doc/statuscodes.md in upper case
//! (`CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND
//! ALREADY_EXISTS PERMISSION_DENIED RESOURCE_EXHAUSTED FAILED_PRECONDITION
//! ABORTED OUT_OF_RANGE UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS
//! UNAUTHENTICATED`); `OK` is not a rejection.

use gov_proto::grpc;
use gov_proto::v1::GrpcCode;
use miette::SourceSpan;
use thiserror::Error;

use crate::kind::Values;
use crate::resolve::{Ctx, Src};
use crate::suggest;

#[derive(Debug, Error, miette::Diagnostic)]
#[error("unknown grpc status `{name}`")]
#[diagnostic(code("gov::unknown-grpc-status"))]
pub struct UnknownGrpcStatus {
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "{label}")]
    pub span: SourceSpan,
    pub label: String,
    #[help]
    pub help: String,
}

pub(crate) fn check<D: From<UnknownGrpcStatus>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        let mut values = Values::default();
        for rule in &svc.rules {
            let text = |span| cx.text(svc.file, span).to_string();
            rule.imp.values(rule.def, &text, &mut values);
        }
        for (name, rejects) in values.grpc_codes {
            let known = grpc::from_name(&name.node);
            let rejects_ok = rejects && known == Some(GrpcCode::Ok);
            if known.is_some() && !rejects_ok {
                continue;
            }
            let names = grpc::CODES.into_iter().skip(1).map(grpc::name);
            let (label, help) = if rejects_ok {
                (
                    "`OK` is not a rejection".to_string(),
                    "use a failure code such as `UNAVAILABLE` or `RESOURCE_EXHAUSTED`".to_string(),
                )
            } else {
                let help = match suggest::closest(&name.node, names.clone()) {
                    Some(code) => {
                        format!("did you mean `{code}`? grpc status names are upper case")
                    }
                    None => format!("use one of {}", names.collect::<Vec<_>>().join(", ")),
                };
                ("not a grpc status code".to_string(), help)
            };
            out.push(
                UnknownGrpcStatus {
                    name: name.node.clone(),
                    src: cx.src(svc.file),
                    span: name.span.into(),
                    label,
                    help,
                }
                .into(),
            );
        }
    }
}
