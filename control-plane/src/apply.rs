//! The apply use case, in two halves:
//!
//! - [`prepare`] is pure: it checks the request against the [`Limits`],
//!   compiles the sources and plans them against the policy in force. It
//!   touches neither the state nor the disk, so a dry run (`govc plan`
//!   against govd) is `prepare` alone, without the apply lock.
//! - [`ControlPlane::apply`] runs it and, for a real change, writes the
//!   audit record and the new `state.json`, and only once both are on disk
//!   commits the policy to the in-memory state and pushes it to the agents.
//!   A refused write changes nothing: no agent is marked as sent a version
//!   it never got, and the same apply can simply be sent again.
//!
//! The gRPC method (`server.rs`) authenticates and converts; nothing else.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gov_compiler::SourceFile;
use gov_proto::v1 as pb;

use crate::control_plane::{ControlPlane, Inner};
use crate::convert::{self, now_unix_ms};
use crate::diagnostics::{removes_every_service, removes_every_service_warning, wire_diagnostics};
use crate::error::Error;
use crate::limits::Limits;

mod error;
use crate::change::{Change, Recheck};
use crate::state::{Outbox, State};
use crate::store::{AppliedPolicy, AuditEntry, CanarySpec, Fence, Source, StoredCanary};
pub use error::ApplyError;

/// Longest `Apply` wait honoured.
pub const MAX_APPLY_WAIT: Duration = Duration::from_secs(60);

/// An apply or a dry run, as the use case takes it (authenticated and
/// converted from the wire by `server.rs`).
#[derive(Clone, Debug)]
pub struct ApplyRequest {
    pub sources: Vec<Source>,
    /// For the audit log.
    pub who: String,
    /// Compile and plan only.
    pub dry_run: bool,
    /// Every rule of this apply in mode shadow (`govc apply --shadow`).
    pub shadow: bool,
    /// Apply a policy with no service although services are in force
    /// (`govc apply --remove-all-services`).
    pub allow_remove_all: bool,
    /// Refuse unless this version is in force (a saved plan). Empty: any.
    pub expect_version: String,
    /// This apply restores that version (`govc rollback`), for the audit.
    pub rollback_to: String,
    /// How long to wait for the agents' ACK/NACK (at most [`MAX_APPLY_WAIT`]).
    pub wait: Duration,
    /// A canary apply (`govc apply --canary`): to a share of the instances
    /// first (`crate::canary`).
    pub canary: Option<CanarySpec>,
}

/// The outcome of [`prepare`].
#[derive(Debug)]
pub enum Prepared {
    /// The policy has errors.
    Invalid {
        diagnostics: Vec<pb::Diagnostic>,
    },
    Planned(Box<Planned>),
}

/// A compiled policy and its plan against the policy in force.
#[derive(Debug)]
pub struct Planned {
    pub policy: AppliedPolicy,
    /// Only the services that change.
    pub plan: pb::Plan,
    pub changed: Vec<String>,
    /// Warnings.
    pub diagnostics: Vec<pb::Diagnostic>,
    /// Nothing was applied before: even a policy equal to nothing is
    /// applied, since it is what gives the agents their first config.
    pub first: bool,
    /// Made with `--shadow` (the audit says so).
    pub shadow: bool,
    /// A rollback to this version (the audit says so).
    pub rollback_to: String,
    /// A canary apply.
    pub canary: Option<CanarySpec>,
}

impl Planned {
    /// Applying would change nothing.
    pub fn is_noop(&self) -> bool {
        self.changed.is_empty() && !self.first
    }
}

/// Set when the client went away: the compile thread skips what is left.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Cancels when dropped: held by the request future, so a client that
/// goes away (tonic drops the future) stops the work behind it.
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Refuses a request that is malformed or over the limits.
pub fn validate(request: &ApplyRequest, limits: &Limits) -> Result<(), ApplyError> {
    if request.sources.is_empty() {
        return Err(ApplyError::NoSources);
    }
    if let Some(s) = request.sources.iter().find(|s| s.name.trim().is_empty()) {
        return Err(ApplyError::UnnamedSource {
            bytes: s.text.len(),
        });
    }
    Ok(limits.check_policy(&request.sources)?)
}

/// Checks the limits, compiles and plans against `current`. Pure: no state,
/// no disk. Stops after the compile when `cancel` is set.
pub fn prepare(
    request: &ApplyRequest,
    current: Option<&AppliedPolicy>,
    limits: &Limits,
    now_unix_ms: u64,
    cancel: &Cancel,
) -> Result<Prepared, ApplyError> {
    validate(request, limits)?;
    limits.check_statements(count_statements(&request.sources, limits, cancel)?)?;
    let files: Vec<SourceFile> = request
        .sources
        .iter()
        .map(|s| SourceFile::new(&s.name, &s.text))
        .collect();
    let compiled = gov_compiler::compile(&files);
    if cancel.is_cancelled() {
        return Err(ApplyError::Cancelled);
    }
    let mut compiled = match compiled {
        Ok(c) => c,
        Err(diagnostics) => {
            return Ok(Prepared::Invalid {
                diagnostics: wire_diagnostics(&diagnostics, &files, limits.max_diagnostics),
            });
        }
    };
    let diagnostics = wire_diagnostics(&compiled.warnings, &files, limits.max_diagnostics);
    if request.shadow {
        let exact: Vec<String> = compiled
            .bundle
            .targets
            .iter()
            .flat_map(|t| &t.rules)
            .filter(|r| match &r.spec {
                Some(pb::rule::Spec::Limit(l)) => {
                    l.scope() == pb::LimitScope::Cluster && l.sync() == pb::ClusterSync::Exact
                }
                _ => false,
            })
            .map(|r| format!("`{}`", r.name))
            .collect();
        if !exact.is_empty() {
            return Err(ApplyError::ShadowExactLimit {
                rules: exact.join(", "),
            });
        }
        gov_compiler::lower::shadow_all(&mut compiled.bundle);
    }
    let empty = pb::Bundle::default();
    let before = current.map_or(&empty, |c| &c.bundle);
    // A `for D` starts at the apply that introduced the rule; an apply
    // that keeps the rule's name and `for` keeps its instant.
    gov_compiler::lower::anchor_expiry(&mut compiled.bundle, before, now_unix_ms);
    let mut diagnostics = diagnostics;
    diagnostics.extend(crate::diagnostics::expired_for_warnings(
        &compiled.bundle,
        now_unix_ms,
    ));
    if !request.allow_remove_all
        && let Some(services) = removes_every_service(before, &compiled.bundle)
    {
        if !request.dry_run {
            return Err(ApplyError::RemovesEveryService { services });
        }
        diagnostics.insert(0, removes_every_service_warning(&services));
    }
    let plan = gov_compiler::plan(before, &compiled.bundle);
    let changed = plan
        .services
        .iter()
        .filter(|s| s.change != gov_compiler::plan::Change::Unchanged)
        .map(|s| s.service.clone())
        .collect();
    Ok(Prepared::Planned(Box::new(Planned {
        policy: AppliedPolicy {
            version: compiled.bundle.version.clone(),
            who: request.who.clone(),
            at_unix_ms: now_unix_ms,
            sources: request.sources.clone(),
            shadow_since: shadow_since(current, &compiled.bundle, now_unix_ms),
            bundle: compiled.bundle,
        },
        plan: convert::plan(&plan),
        changed,
        diagnostics,
        first: current.is_none(),
        shadow: request.shadow,
        rollback_to: request.rollback_to.clone(),
        canary: request.canary,
    })))
}

/// When each shadow rule of `bundle` went into shadow: kept from `current`
/// for a rule that was in shadow there already, else `now`.
fn shadow_since(
    current: Option<&AppliedPolicy>,
    bundle: &pb::Bundle,
    now_unix_ms: u64,
) -> std::collections::BTreeMap<String, u64> {
    bundle
        .targets
        .iter()
        .flat_map(|t| &t.rules)
        .filter(|r| r.mode() == pb::Mode::Shadow)
        .map(|r| {
            let since = current
                .and_then(|c| c.shadow_since.get(&r.name))
                .copied()
                .unwrap_or(now_unix_ms);
            (r.name.clone(), since)
        })
        .collect()
}

/// The statements in the service blocks of every file that parses (a file
/// that does not is left to the compiler, which reports it). Parsing is
/// linear; stops counting once over the limit or when `cancel` is set.
fn count_statements(
    sources: &[Source],
    limits: &Limits,
    cancel: &Cancel,
) -> Result<usize, ApplyError> {
    let mut statements = 0usize;
    for s in sources {
        if cancel.is_cancelled() {
            return Err(ApplyError::Cancelled);
        }
        let Ok(policy) = gov_lang::parse_all(&s.name, &s.text) else {
            continue;
        };
        statements += policy
            .items
            .iter()
            .map(|item| match item {
                gov_lang::ast::Item::Service(service) => service.body.len(),
                gov_lang::ast::Item::Registry(_) => 1,
            })
            .sum::<usize>();
        if statements > limits.max_statements {
            break;
        }
    }
    Ok(statements)
}

// === the use case ===

impl ControlPlane {
    /// Applies (or, with `dry_run`, plans) a policy: see the module doc.
    pub async fn apply(&self, request: ApplyRequest) -> Result<pb::ApplyResult, ApplyError> {
        let dry_run = request.dry_run;
        let result = self.apply_or_plan(request).await;
        if !dry_run {
            self.inner
                .metrics
                .on_apply(crate::metrics::ApplyOutcome::of(&result));
        }
        result
    }

    async fn apply_or_plan(&self, request: ApplyRequest) -> Result<pb::ApplyResult, ApplyError> {
        let inner = &self.inner;
        // For the log: how long govd took, whatever the client measures.
        let started = tokio::time::Instant::now();
        validate(&request, &inner.limits)?;
        let request = Arc::new(request);
        if request.dry_run {
            // A dry run changes nothing: no apply lock, so it never holds up
            // a real apply.
            let current = inner.lock().applied();
            check_expected(&request, current.as_deref())?;
            return Ok(match self.prepare(request, current.clone()).await? {
                Prepared::Invalid { diagnostics } => invalid(current.as_deref(), diagnostics),
                Prepared::Planned(p) => unchanged(current.as_deref(), *p),
            });
        }

        // One apply at a time: the plan is against the version it replaces.
        // INVARIANT: held until this apply is committed and pushed (or
        // refused), even if the client goes away meanwhile.
        let apply_guard = inner.apply_lock.clone().lock_owned().await;
        let current = inner.lock().applied();
        check_expected(&request, current.as_deref())?;
        let planned = match self.prepare(request.clone(), current.clone()).await? {
            Prepared::Invalid { diagnostics } => {
                tracing::info!(who = %request.who, elapsed_ms = started.elapsed().as_millis(), "apply refused: invalid policy");
                return Ok(invalid(current.as_deref(), diagnostics));
            }
            Prepared::Planned(p) if p.is_noop() => return Ok(unchanged(current.as_deref(), *p)),
            Prepared::Planned(p) => *p,
        };
        let (plan, diagnostics, changed) = (
            planned.plan.clone(),
            planned.diagnostics.clone(),
            planned.changed.clone(),
        );
        let version = planned.policy.version.clone();
        let planned_against = current
            .as_ref()
            .map_or(String::new(), |c| c.version.clone());
        // From here on the apply finishes even if the client goes away: what
        // is on disk must be in memory and pushed.
        let task = {
            let inner = inner.clone();
            tokio::spawn(async move {
                let recorded = record_and_push(&inner, planned, &planned_against).await;
                // Waiting for ACKs must not hold up the next apply.
                drop(apply_guard);
                recorded
            })
        };
        task.await
            .map_err(|e| ApplyError::Store(Error::Io(join_error(e))))??;
        tracing::info!(%version, elapsed_ms = started.elapsed().as_millis(), "apply stored and pushed");
        wait_settled(inner, &changed, request.wait).await;
        let (outcomes, canary) = {
            let state = inner.lock();
            let canary = state.canary().filter(|c| c.version() == version);
            (state.outcomes(&changed), canary.map(|c| c.view()))
        };
        Ok(pb::ApplyResult {
            applied: true,
            version,
            plan: Some(plan),
            diagnostics,
            outcomes,
            canary,
        })
    }

    /// Runs [`prepare`] on a blocking thread, at most
    /// `Limits::concurrent_compiles` at once. Dropping the returned future
    /// (the client went away) cancels the work left after the compile.
    async fn prepare(
        &self,
        request: Arc<ApplyRequest>,
        current: Option<Arc<AppliedPolicy>>,
    ) -> Result<Prepared, ApplyError> {
        let cancel = Cancel::default();
        let _cancel_on_drop = CancelOnDrop(cancel.clone());
        // The slot moves into the thread: a compile whose client left still
        // holds it until it stops, so abandoned compiles cannot pile up.
        let slot = self
            .inner
            .compile_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| ApplyError::Compiler(e.to_string()))?;
        let limits = self.inner.limits.clone();
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            prepare(
                &request,
                current.as_deref(),
                &limits,
                now_unix_ms(),
                &cancel,
            )
        })
        .await
        .map_err(|e| ApplyError::Compiler(e.to_string()))?
    }
}

/// The audit detail of an apply made with `--shadow`.
const SHADOW_DETAIL: &str = "shadow: every rule of this apply in mode shadow (govc apply --shadow)";

/// What the audit says of an apply beyond its version: a rollback, shadow.
fn apply_detail(planned: &Planned) -> String {
    let mut parts = Vec::new();
    if !planned.rollback_to.is_empty() {
        parts.push(format!(
            "rollback to {} (govc rollback)",
            planned.rollback_to
        ));
    }
    if planned.shadow {
        parts.push(SHADOW_DETAIL.to_owned());
    }
    parts.join("; ")
}

/// Refuses a saved plan's apply when the version it was planned against is
/// no longer the one in force.
fn check_expected(
    request: &ApplyRequest,
    current: Option<&AppliedPolicy>,
) -> Result<(), ApplyError> {
    // `(none)`: planned when nothing was applied.
    let applied = current.map_or("(none)", |c| c.version.as_str());
    if request.expect_version.is_empty() || request.expect_version == applied {
        return Ok(());
    }
    Err(ApplyError::StalePlan {
        planned_against: request.expect_version.clone(),
        applied: applied.to_owned(),
    })
}

/// Makes `planned` durable (audit record, then the stored state), then
/// commits it to the state and pushes it to the agents of the changed
/// services: the write protocol (`transact.rs`). The stored write is a
/// compare-and-swap on the revision the state reflects: when another
/// replica wrote first, the state is reloaded, and the apply is refused if
/// the policy it was planned against is no longer the one in force (else,
/// another replica wrote latches: the write is tried again).
async fn record_and_push(
    inner: &Inner,
    planned: Planned,
    planned_against: &str,
) -> Result<(), ApplyError> {
    // A canary apply is audited as `canary-start`; every other step the same.
    let action = if planned.canary.is_some() {
        "canary-start"
    } else {
        "apply"
    };
    let mut entry = AuditEntry {
        at_unix_ms: now_unix_ms(),
        who: planned.policy.who.clone(),
        action: action.into(),
        version: planned.policy.version.clone(),
        targets: planned.changed.clone(),
        detail: apply_detail(&planned),
        ..AuditEntry::default()
    };
    let write = inner.write_lock.lock().await;
    // Another replica's apply may have been taken in since the plan.
    let conflict = superseded(&inner.lock(), planned_against);
    if let Some(conflict) = conflict {
        return Err(refuse(inner, entry, conflict).await);
    }
    let canary = match trial(inner, &planned) {
        Ok(canary) => canary,
        Err(refused) => return Err(refuse(inner, entry, refused).await),
    };
    if let Some(c) = &canary {
        entry.detail = canary_detail(&entry.detail, c);
    }
    let (who, version, changed) = (
        entry.who.clone(),
        entry.version.clone(),
        planned.changed.clone(),
    );
    let history = inner.history;
    let policy = &planned.policy;
    let change = Change {
        audit: Some(entry),
        fence: Fence::Any,
        next: |s: &State| match &canary {
            Some(c) => s.persisted_with_canary(c),
            None => s.persisted_with(policy, &changed, history),
        },
        recheck: |s: &State| {
            // This very version is in force: the write landed although its
            // answer was lost (and was sent again), and the reload
            // committed and pushed it.
            if s.version() == policy.version
                || s.canary().map(|c| c.version()) == Some(&policy.version)
            {
                return Recheck::Done;
            }
            superseded(s, planned_against).map_or(Recheck::Again, Recheck::Refused)
        },
        commit: |s: &mut State, out: &mut Outbox| {
            let pushed = out.len();
            match canary.clone() {
                Some(canary) => s.start_canary(canary, out),
                None => s.commit(Arc::new(policy.clone()), &changed, history, out),
            }
            out.len() - pushed
        },
        audit_failed: ApplyError::Audit,
        store_failed: ApplyError::Store,
    };
    let agents = inner.transact(write, change).await?.unwrap_or(0);
    tracing::info!(%who, %version, services = ?planned.changed, agents, "applied");
    Ok(())
}

/// The canary `planned` starts, if it is a canary apply: on a share of the
/// connected instances of each changed service. Refused while another
/// canary runs, or with no instance to try it on.
fn trial(inner: &Inner, planned: &Planned) -> Result<Option<StoredCanary>, ApplyError> {
    let state = inner.lock();
    if let Some(running) = state.canary() {
        return Err(ApplyError::CanaryRunning {
            version: running.version().to_owned(),
        });
    }
    let Some(spec) = planned.canary else {
        return Ok(None);
    };
    let instances =
        crate::state::canary_instances(state.agents(), &planned.changed, spec.share_percent);
    if instances.is_empty() {
        return Err(ApplyError::NoCanaryInstances {
            services: planned.changed.join(", "),
        });
    }
    let now = now_unix_ms();
    Ok(Some(StoredCanary {
        policy: planned.policy.clone(),
        previous: state.version().to_owned(),
        services: planned.changed.clone(),
        instances,
        started_unix_ms: now,
        ends_unix_ms: now.saturating_add(spec.window_ms),
        spec,
    }))
}

/// The audit detail of a canary's start: where and for how long.
fn canary_detail(detail: &str, c: &StoredCanary) -> String {
    let on: Vec<String> = c
        .instances
        .iter()
        .map(|(s, i)| format!("{s}/{i}"))
        .collect();
    let what = format!(
        "canary {}% for {}s on {}",
        c.spec.share_percent,
        c.spec.window_ms / 1000,
        on.join(", ")
    );
    if detail.is_empty() {
        what
    } else {
        format!("{detail}; {what}")
    }
}

/// The conflict, if the policy in force is no longer `planned_against`.
fn superseded(state: &State, planned_against: &str) -> Option<ApplyError> {
    (state.version() != planned_against).then(|| ApplyError::Conflict {
        planned_against: planned_against.to_owned(),
        applied: state.version().to_owned(),
    })
}

/// Records `entry` as refused for `error` (an apply that never took effect
/// is in the audit log too), and returns the error.
async fn refuse(inner: &Inner, mut entry: AuditEntry, error: ApplyError) -> ApplyError {
    tracing::warn!(error = %crate::error::one_line(&error), "apply refused");
    entry.action = "apply-refused".into();
    entry.detail = refused_detail(&entry.detail, &error);
    inner.audit(entry).await;
    error
}

/// The audit detail of a refused apply: what it was (`--shadow`), then why.
fn refused_detail(detail: &str, error: &ApplyError) -> String {
    let why = crate::error::one_line(error);
    if detail.is_empty() {
        why
    } else {
        format!("{detail}; {why}")
    }
}

/// Waits (at most `wait`, capped) until every connected agent of `changed`
/// has answered its last push.
async fn wait_settled(inner: &Inner, changed: &[String], wait: Duration) {
    if wait.is_zero() {
        return;
    }
    let mut sync = inner.sync.subscribe();
    let deadline = tokio::time::Instant::now() + wait.min(MAX_APPLY_WAIT);
    loop {
        if inner.lock().settled(changed) {
            return;
        }
        tokio::select! {
            r = sync.changed() => if r.is_err() { return },
            () = tokio::time::sleep_until(deadline) => return,
            () = inner.shutdown.cancelled() => return,
        }
    }
}

/// The answer to an invalid policy: nothing applied.
fn invalid(current: Option<&AppliedPolicy>, diagnostics: Vec<pb::Diagnostic>) -> pb::ApplyResult {
    pb::ApplyResult {
        applied: false,
        version: current.map(|c| c.version.clone()).unwrap_or_default(),
        plan: None,
        diagnostics,
        outcomes: Vec::new(),
        canary: None,
    }
}

/// The answer to a dry run or an apply that changes nothing.
fn unchanged(current: Option<&AppliedPolicy>, planned: Planned) -> pb::ApplyResult {
    pb::ApplyResult {
        applied: false,
        version: current.map(|c| c.version.clone()).unwrap_or_default(),
        plan: Some(planned.plan),
        diagnostics: planned.diagnostics,
        outcomes: Vec::new(),
        canary: None,
    }
}

fn join_error(e: tokio::task::JoinError) -> crate::error::StateIo {
    crate::error::StateIo::new("write", std::path::Path::new("."), std::io::Error::other(e))
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    use super::*;

    /// The state directory as written (what a restart reads).
    fn disk(dir: &std::path::Path) -> crate::store::DirStore {
        crate::store::DirStore::open(dir).unwrap()
    }
    use crate::control_plane::Options;

    fn policy(max: u32) -> Vec<Source> {
        vec![Source {
            name: "p.gov".into(),
            text: format!(
                "service order {{\n  match all = path prefix \"/\"\n  bulkhead b on all {{\n    max_concurrent {max}\n  }}\n}}\n"
            ),
        }]
    }

    fn request(sources: Vec<Source>) -> ApplyRequest {
        ApplyRequest {
            sources,
            who: "alice".into(),
            dry_run: false,
            shadow: false,
            allow_remove_all: false,
            expect_version: String::new(),
            rollback_to: String::new(),
            canary: None,
            wait: Duration::ZERO,
        }
    }

    /// Makes the next `state.json` write fail the way a full or read-only
    /// disk does, through the store's real code: its temp file cannot be
    /// created (a directory has its name). Works for root too.
    fn break_state_writes(dir: &std::path::Path) -> std::path::PathBuf {
        // An apply's commit point: the policy's file.
        let blocker = dir.join(format!(".policy.json.tmp.{}", std::process::id()));
        std::fs::create_dir(&blocker).unwrap();
        blocker
    }

    /// The version and nonce of a pushed config.
    fn config_version(msg: &pb::ControlMessage) -> (String, String) {
        match &msg.msg {
            Some(pb::control_message::Msg::Config(c)) => {
                (c.target.clone().unwrap().version, c.nonce.clone())
            }
            other => panic!("not a config: {other:?}"),
        }
    }

    #[test]
    fn a_policy_without_services_removes_them_only_when_asked() {
        let (limits, cancel) = (Limits::default(), Cancel::default());
        let Ok(Prepared::Planned(first)) = prepare(&request(policy(5)), None, &limits, 1, &cancel)
        else {
            panic!("the first policy plans")
        };
        let empty = || {
            request(vec![Source {
                name: "empty.gov".into(),
                text: "\n".into(),
            }])
        };
        // An apply of it is refused, naming the services it would remove.
        let refused = prepare(&empty(), Some(&first.policy), &limits, 2, &cancel).unwrap_err();
        assert!(
            matches!(&refused, ApplyError::RemovesEveryService { services } if services == "`order`"),
            "{refused:?}"
        );
        // A dry run plans it, with a warning that says so.
        let dry = ApplyRequest {
            dry_run: true,
            ..empty()
        };
        let Ok(Prepared::Planned(planned)) =
            prepare(&dry, Some(&first.policy), &limits, 2, &cancel)
        else {
            panic!("a dry run plans")
        };
        assert_eq!(
            planned.diagnostics[0].code,
            "gov::govd::removes_every_service"
        );
        assert_eq!(planned.changed, ["order"]);
        // With the flag it is planned, without a warning.
        let allowed = ApplyRequest {
            allow_remove_all: true,
            ..empty()
        };
        let Ok(Prepared::Planned(planned)) =
            prepare(&allowed, Some(&first.policy), &limits, 2, &cancel)
        else {
            panic!("allowed")
        };
        assert!(planned.diagnostics.is_empty(), "{:?}", planned.diagnostics);
        assert_eq!(planned.changed, ["order"]);
        // Nothing in force: an empty policy removes nothing.
        assert!(matches!(
            prepare(&empty(), None, &limits, 1, &cancel),
            Ok(Prepared::Planned(_))
        ));
    }

    #[test]
    fn a_shadow_apply_puts_every_rule_in_shadow_and_remembers_since_when() {
        let (limits, cancel) = (Limits::default(), Cancel::default());
        let shadow = |sources| ApplyRequest {
            shadow: true,
            ..request(sources)
        };
        let planned = |r: &ApplyRequest, current: Option<&AppliedPolicy>, now| {
            let Ok(Prepared::Planned(p)) = prepare(r, current, &limits, now, &cancel) else {
                panic!("the policy compiles");
            };
            p
        };
        let first = planned(&shadow(policy(1)), None, 1_000);
        let rules = || first.policy.bundle.targets.iter().flat_map(|t| &t.rules);
        assert!(rules().all(|r| r.mode() == pb::Mode::Shadow));
        assert!(first.shadow);
        assert_eq!(
            first.policy.shadow_since.values().collect::<Vec<_>>(),
            [&1_000]
        );
        // Still in shadow after a change: since the first shadow apply.
        let again = planned(&shadow(policy(2)), Some(&first.policy), 5_000);
        assert!(!again.is_noop());
        assert_eq!(first.policy.shadow_since, again.policy.shadow_since);
        // Enforced: no longer in shadow.
        let enforced = planned(&request(policy(2)), Some(&again.policy), 9_000);
        assert!(enforced.policy.shadow_since.is_empty());
        assert_ne!(enforced.policy.version, again.policy.version);

        // A limit counted exactly in the cluster store cannot be in shadow.
        let exact = vec![Source {
            name: "x.gov".into(),
            text: "service order {\n  limit l on any {\n    calls 5 per 1s\n    scope cluster sync exact\n  }\n}\n".into(),
        }];
        assert!(matches!(
            prepare(&request(exact.clone()), None, &limits, 1, &cancel),
            Ok(Prepared::Planned(_))
        ));
        let err = prepare(&shadow(exact), None, &limits, 1, &cancel).unwrap_err();
        assert!(crate::error::one_line(&err).contains("`order/l`"), "{err}");
    }

    #[test]
    fn prepare_plans_against_the_given_policy_and_refuses_oversized_ones() {
        let limits = Limits::default();
        let cancel = Cancel::default();
        let Ok(Prepared::Planned(first)) = prepare(&request(policy(1)), None, &limits, 1, &cancel)
        else {
            panic!("the policy compiles");
        };
        assert!(first.first && !first.is_noop());
        assert_eq!(first.changed, ["order"]);
        let Ok(Prepared::Planned(same)) = prepare(
            &request(policy(1)),
            Some(&first.policy),
            &limits,
            2,
            &cancel,
        ) else {
            panic!("the policy compiles");
        };
        assert!(same.is_noop());

        let small = Limits {
            max_policy_bytes: 10,
            ..Limits::default()
        };
        let err = prepare(&request(policy(1)), None, &small, 1, &cancel).unwrap_err();
        assert!(matches!(err, ApplyError::TooLarge(_)), "{err}");
        assert!(
            crate::error::one_line(&err).contains("--max-policy-bytes"),
            "{err}"
        );
        // The policy has 2 statements (a match and a bulkhead).
        let few = Limits {
            max_statements: 1,
            ..Limits::default()
        };
        let err = prepare(&request(policy(1)), None, &few, 1, &cancel).unwrap_err();
        let message = crate::error::one_line(&err);
        assert!(
            message.contains("more than 1 statements") && message.contains("GOV_MAX_STATEMENTS"),
            "{message}"
        );
        let two = Limits {
            max_statements: 2,
            ..Limits::default()
        };
        assert!(prepare(&request(policy(1)), None, &two, 1, &cancel).is_ok());
        // A client that went away gets nothing planned.
        cancel.cancel();
        assert!(matches!(
            prepare(&request(policy(1)), None, &limits, 1, &cancel),
            Err(ApplyError::Cancelled)
        ));
    }

    #[test]
    fn diagnostics_on_the_wire_are_capped_with_a_note() {
        let text = "service a {\n".to_owned()
            + &(0..5)
                .map(|i| format!("  bulkhead b{i} on nope{i} {{\n    max_concurrent 1\n  }}\n"))
                .collect::<String>()
            + "}\n";
        let limits = Limits {
            max_diagnostics: 2,
            ..Limits::default()
        };
        let sources = vec![Source {
            name: "bad.gov".into(),
            text,
        }];
        let Ok(Prepared::Invalid { diagnostics }) =
            prepare(&request(sources), None, &limits, 1, &Cancel::default())
        else {
            panic!("the policy is invalid");
        };
        assert_eq!(diagnostics.len(), 3);
        let note = &diagnostics[2];
        assert_eq!(note.code, "gov::govd::diagnostics-truncated");
        assert!(note.message.starts_with("3 more"), "{}", note.message);
    }

    #[tokio::test]
    async fn a_refused_store_changes_no_sync_state_and_the_same_apply_works_once_the_disk_is_back()
    {
        let dir = tempfile::tempdir().unwrap();
        let cp = ControlPlane::open(Options::new(dir.path()), CancellationToken::new()).unwrap();
        let (tx, mut agent) = mpsc::channel(8);
        let hello = pb::Hello {
            service: "order".into(),
            instance: "a".into(),
            ..Default::default()
        };
        let (key, id) = cp.inner.lock().hello(hello, tx, 1, &mut Vec::new());
        let first = cp.apply(request(policy(1))).await.unwrap();
        assert!(first.applied);
        let (v1, nonce) = config_version(&agent.try_recv().unwrap().message());
        assert_eq!(cp.status().agents[0].state(), pb::SyncState::Stale);
        let ack = pb::agent_message::Msg::Ack(pb::Ack {
            version: v1.clone(),
            nonce,
            ..Default::default()
        });
        cp.inner.lock().on_message(&key, id, ack, 2);
        assert_eq!(cp.status().agents[0].state(), pb::SyncState::Synced);

        let blocker = break_state_writes(dir.path());
        let err = cp.apply(request(policy(2))).await.unwrap_err();
        assert!(matches!(err, ApplyError::Store(_)), "{err}");
        let message = crate::error::one_line(&err);
        assert!(message.contains("nothing was applied"), "{message}");
        assert!(message.contains("--state-dir"), "{message}");
        // Nothing was sent, nothing changed: the agent is still SYNCED on v1.
        assert!(agent.try_recv().is_err());
        let view = cp.status();
        assert_eq!(view.version, first.version);
        assert_eq!(view.agents[0].state(), pb::SyncState::Synced);
        assert_eq!(view.agents[0].version, v1);
        // The attempt and its refusal are in the audit log.
        let actions: Vec<String> = disk(dir.path())
            .read_audit()
            .unwrap()
            .into_iter()
            .map(|e| e.action)
            .collect();
        assert_eq!(
            actions,
            ["apply-intended", "apply", "apply-intended", "apply-refused"]
        );

        // The disk is back: the same apply is a change, and it is pushed.
        std::fs::remove_dir(&blocker).unwrap();
        let second = cp.apply(request(policy(2))).await.unwrap();
        assert!(second.applied, "{second:?}");
        assert_ne!(second.version, first.version);
        let (v2, _) = config_version(&agent.try_recv().unwrap().message());
        assert_ne!(v2, v1);
        assert_eq!(
            disk(dir.path()).load().unwrap().applied.unwrap().version,
            second.version
        );
    }

    #[tokio::test]
    async fn an_apply_that_cannot_be_audited_is_refused_and_not_stored() {
        let dir = tempfile::tempdir().unwrap();
        let cp = ControlPlane::open(Options::new(dir.path()), CancellationToken::new()).unwrap();
        // The audit log cannot be opened for appending.
        std::fs::create_dir(disk(dir.path()).audit_path()).unwrap();
        let err = cp.apply(request(policy(1))).await.unwrap_err();
        assert!(matches!(err, ApplyError::Audit(_)), "{err}");
        assert!(disk(dir.path()).load().unwrap().applied.is_none());
        assert_eq!(cp.status().version, "");
    }

    #[tokio::test]
    async fn a_dry_run_does_not_wait_for_the_apply_lock() {
        let dir = tempfile::tempdir().unwrap();
        let cp = ControlPlane::open(Options::new(dir.path()), CancellationToken::new()).unwrap();
        let _held = cp.inner.apply_lock.lock().await;
        let mut dry = request(policy(1));
        dry.dry_run = true;
        let planned = tokio::time::timeout(Duration::from_secs(30), cp.apply(dry))
            .await
            .expect("a dry run must not wait for the apply lock")
            .unwrap();
        assert!(!planned.applied);
        assert_eq!(planned.plan.unwrap().services.len(), 1);
    }

    #[tokio::test]
    async fn an_apply_whose_client_leaves_during_the_write_is_still_committed_and_pushed() {
        let dir = tempfile::tempdir().unwrap();
        let cp = ControlPlane::open(Options::new(dir.path()), CancellationToken::new()).unwrap();
        let (tx, mut agent) = mpsc::channel(8);
        let hello = pb::Hello {
            service: "order".into(),
            instance: "a".into(),
            ..Default::default()
        };
        cp.inner.lock().hello(hello, tx, 1, &mut Vec::new());
        // The disk is slow: the write waits until we let it go.
        let write = cp.inner.write_lock.lock().await;
        let client = {
            let cp = cp.clone();
            tokio::spawn(async move { cp.apply(request(policy(1))).await })
        };
        // Once the compile is done (its slot is back) the apply is waiting
        // for the write; then the client goes away.
        let slots = cp.inner.limits.concurrent_compiles;
        for _ in 0..600 {
            if cp.inner.compile_slots.available_permits() == slots
                && cp.inner.apply_lock.try_lock().is_err()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        client.abort();
        assert!(client.await.unwrap_err().is_cancelled());
        drop(write);

        // The apply finishes anyway: on disk, in memory, and at the agent.
        let pushed = tokio::time::timeout(Duration::from_secs(30), agent.recv())
            .await
            .expect("the config is pushed")
            .unwrap()
            .message();
        let (version, _) = config_version(&pushed);
        let stored = disk(dir.path()).load().unwrap().applied.unwrap();
        assert_eq!(cp.status().version, stored.version);
        assert_eq!(stored.bundle.targets[0].version, version);
        // And the next apply is not blocked.
        let next = tokio::time::timeout(Duration::from_secs(30), cp.apply(request(policy(2))))
            .await
            .expect("the apply lock was released")
            .unwrap();
        assert!(next.applied);
    }
}
