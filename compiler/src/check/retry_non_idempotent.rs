//! `gov::lint::retry-non-idempotent` (warning): a retry rule retries a
//! method that is not idempotent (`POST`, `PATCH`, `CONNECT`).
//!
//! An attempt that failed on the way back (a reset, a timeout, a 502 from
//! a proxy in between) may have done its work upstream; sent again, a
//! non-idempotent call does it twice: two orders, two payments. RFC 9110
//! (section 9.2.2) lets a client retry only idempotent methods on its own.
//! The default `methods` of a retry rule are `GET HEAD OPTIONS PUT DELETE`;
//! the lint fires on the others when written.
//!
//! Example: `retry r on calls to pay { methods GET POST  budget 10% min 5
//! per 1s }`.
//!
//! Fix: drop the method from `methods`; or make the upstream idempotent for
//! it (an idempotency key it checks) and retry only the outcomes that
//! cannot have reached it (`on connect_failure`).

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::retry::{Retry, RetrySetting};
use crate::resolve::{Ctx, Src};

/// The methods RFC 9110 does not define as idempotent.
const NOT_IDEMPOTENT: &[&str] = &["POST", "PATCH", "CONNECT"];

#[derive(Debug, Error, miette::Diagnostic)]
#[error("retry `{name}` retries `{method}`, which is not idempotent: a retried call may run twice")]
#[diagnostic(
    code("gov::lint::retry-non-idempotent"),
    severity(Warning),
    help(
        "remove `{method}` from `methods`, or make the upstream idempotent for it (an idempotency key it checks) and retry only `on connect_failure`, which never reached it"
    )
)]
pub struct RetryNonIdempotent {
    pub name: String,
    pub method: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "not idempotent")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<RetryNonIdempotent>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let Some(retry) = Retry::of(rule) else {
                continue;
            };
            for setting in &retry.settings {
                let RetrySetting::Methods { names } = setting else {
                    continue;
                };
                for m in names {
                    let method = m.node.to_ascii_uppercase();
                    if NOT_IDEMPOTENT.contains(&method.as_str()) {
                        out.push(
                            RetryNonIdempotent {
                                name: retry.name.node.clone(),
                                method,
                                src: cx.src(svc.file),
                                span: m.span.into(),
                            }
                            .into(),
                        );
                    }
                }
            }
        }
    }
}
