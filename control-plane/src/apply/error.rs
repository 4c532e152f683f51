//! Why an apply was refused (`apply.rs`).

use crate::canary::CanaryError;
use crate::error::Error;
use crate::limits::TooLarge;

/// Why an apply was refused. Nothing was applied in every case.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ApplyError {
    #[error("no sources: send at least one `.gov` file")]
    #[diagnostic(code(gov::govd::no_sources))]
    NoSources,

    #[error("a source has no file name ({bytes} bytes)")]
    #[diagnostic(code(gov::govd::unnamed_source))]
    UnnamedSource { bytes: usize },

    #[error(transparent)]
    #[diagnostic(transparent)]
    TooLarge(#[from] TooLarge),

    #[error("the compiler failed: {0}")]
    #[diagnostic(
        code(gov::govd::compiler),
        help("this is a bug in govd: report it with the policy")
    )]
    Compiler(String),

    #[error("cannot record the apply in the audit log; nothing was applied")]
    #[diagnostic(
        code(gov::govd::audit),
        help(
            "make --state-dir writable (or free disk space), or bring the etcd members of --store back, then apply again"
        )
    )]
    Audit(#[source] Error),

    #[error("cannot store the policy; nothing was applied")]
    #[diagnostic(
        code(gov::govd::store),
        help(
            "make --state-dir writable (or free disk space), or bring the etcd members of --store back, then apply again"
        )
    )]
    Store(#[source] Error),

    #[error(
        "`--shadow` cannot put {rules} in mode shadow: with `scope cluster sync exact` every call waits for the cluster store, and a shadow rule never delays a call; nothing was applied"
    )]
    #[diagnostic(
        code(gov::govd::shadow_exact_limit),
        help(
            "count the limit with `sync batch 100ms` while it is in shadow, or apply without `--shadow`"
        )
    )]
    ShadowExactLimit { rules: String },

    #[error(
        "another replica applied `{applied}` while this apply was planned against `{planned_against}`; nothing was applied"
    )]
    #[diagnostic(
        code(gov::govd::apply_conflict),
        help(
            "run `govc plan` to see the change against the policy in force now, then apply again"
        )
    )]
    Conflict {
        planned_against: String,
        applied: String,
    },

    #[error(
        "this policy has no service, so applying it removes the rules of every service ({services}) from every agent; nothing was applied"
    )]
    #[diagnostic(
        code(gov::govd::removes_every_service),
        help(
            "check that you passed the right files (`govc plan` shows the change); to remove every service on purpose, apply with `govc apply --remove-all-services`"
        )
    )]
    RemovesEveryService { services: String },

    #[error(
        "the saved plan was made against version `{planned_against}`, but `{applied}` is in force now; nothing was applied"
    )]
    #[diagnostic(
        code(gov::govd::stale_plan),
        help(
            "someone applied since the plan was saved: make it again (`govc plan FILES --out PLAN`), review it, and apply that"
        )
    )]
    StalePlan {
        planned_against: String,
        applied: String,
    },

    #[error("the client went away before the apply was prepared")]
    #[diagnostic(code(gov::govd::cancelled))]
    Cancelled,

    #[error(transparent)]
    #[diagnostic(transparent)]
    Canary(#[from] CanaryError),

    #[error("a canary of version `{version}` is running; nothing was applied")]
    #[diagnostic(
        code(gov::govd::canary_running),
        help(
            "wait for it to be promoted or rolled back (`govc status`), or end it now with `govc canary abort` or `govc canary promote`, then apply again"
        )
    )]
    CanaryRunning { version: String },

    #[error(
        "no agent of the services this apply changes ({services}) is connected, so a canary has no instance to try the version on; nothing was applied"
    )]
    #[diagnostic(
        code(gov::govd::canary_without_instances),
        help("start the services' agents first, or apply without `--canary`")
    )]
    NoCanaryInstances { services: String },
}
