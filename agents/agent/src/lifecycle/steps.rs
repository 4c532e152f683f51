//! What the agent requires of a config's warmup and shutdown steps before it
//! takes the config: every value, as the compiler writes them
//! (`gov_proto::compiled`). The lifecycle fills nothing in, so a step
//! without a value, or with one it cannot run (a zero period, an unknown
//! signal), refuses the whole config, naming the step and where it was
//! written, as the engine does for a rule.

use gov_proto::v1 as proto;
use proto::shutdown_step::Step as ShutdownStep;
use proto::warmup_step::Step as WarmupStep;

/// Full weight: 100% in milli-percent.
pub const FULL_WEIGHT: u32 = 100_000;

/// A warmup or shutdown step the agent cannot run.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{phase} step `{step}`{at}: {problem}")]
#[diagnostic(
    code(gov::agent::invalid_step),
    help("recompile the policy with `govc compile`; the compiler writes every value")
)]
pub struct InvalidStep {
    /// `warmup` or `shutdown`.
    pub phase: &'static str,
    /// The step's kind (`ready`, `ramp`, ...), or its text when known.
    pub step: String,
    /// ` at FILE:LINE` when the config says where the step was written.
    pub at: String,
    /// Lowercase, no trailing period.
    pub problem: String,
}

/// The answer to a step of a kind this agent does not know.
const UNKNOWN: &str =
    "the step is empty, or of a kind this agent does not know (upgrade the agent)";

/// Checks every warmup and shutdown step of `target`.
pub fn check(target: &proto::TargetConfig) -> Result<(), InvalidStep> {
    for s in target.warmup.iter().flat_map(|w| &w.steps) {
        let step = Step::new("warmup", s.source.as_ref(), warmup_kind(s.step.as_ref()));
        match &s.step {
            None => return Err(step.err(UNKNOWN)),
            Some(WarmupStep::Ready(probe)) => step.ready(probe)?,
            Some(WarmupStep::Register(_)) => {}
            Some(WarmupStep::Ramp(ramp)) => {
                step.positive("over_ms", ramp.over_ms)?;
                if ramp.from_milli_percent > FULL_WEIGHT {
                    return Err(step.err("`from_milli_percent` is above 100%"));
                }
            }
            Some(WarmupStep::Start(invoke)) => step.invoke(invoke)?,
        }
    }
    for s in target.shutdown.iter().flat_map(|sd| &sd.steps) {
        let step = Step::new(
            "shutdown",
            s.source.as_ref(),
            shutdown_kind(s.step.as_ref()),
        );
        match &s.step {
            None => return Err(step.err(UNKNOWN)),
            Some(ShutdownStep::Deregister(_)) => {}
            Some(ShutdownStep::Wait(wait)) => step.positive("duration_ms", wait.duration_ms)?,
            Some(ShutdownStep::Stop(invoke)) => step.invoke(invoke)?,
            Some(ShutdownStep::DrainMs(ms)) => step.positive("drain_ms", *ms)?,
            Some(ShutdownStep::WaitForGov(w)) => step.positive("timeout_ms", w.timeout_ms)?,
        }
    }
    Ok(())
}

fn warmup_kind(step: Option<&WarmupStep>) -> &'static str {
    match step {
        None => "?",
        Some(WarmupStep::Ready(_)) => "ready",
        Some(WarmupStep::Register(_)) => "register",
        Some(WarmupStep::Ramp(_)) => "ramp",
        Some(WarmupStep::Start(_)) => "start",
    }
}

fn shutdown_kind(step: Option<&ShutdownStep>) -> &'static str {
    match step {
        None => "?",
        Some(ShutdownStep::Deregister(_)) => "deregister",
        Some(ShutdownStep::Wait(_)) => "wait",
        Some(ShutdownStep::Stop(_)) => "stop",
        Some(ShutdownStep::DrainMs(_)) => "drain",
        Some(ShutdownStep::WaitForGov(_)) => "wait for gov",
    }
}

/// Names one step in every error.
struct Step {
    phase: &'static str,
    step: String,
    at: String,
}

impl Step {
    fn new(phase: &'static str, source: Option<&proto::SourceRef>, kind: &str) -> Self {
        let snippet = source.map(|s| s.snippet.trim()).filter(|s| !s.is_empty());
        let at = source
            .filter(|s| !s.file.is_empty())
            .map(|s| format!(" at {}:{}", s.file, s.line))
            .unwrap_or_default();
        Self {
            phase,
            step: snippet.unwrap_or(kind).to_owned(),
            at,
        }
    }

    fn err(&self, problem: impl Into<String>) -> InvalidStep {
        InvalidStep {
            phase: self.phase,
            step: self.step.clone(),
            at: self.at.clone(),
            problem: problem.into(),
        }
    }

    fn positive(&self, field: &str, value: u64) -> Result<(), InvalidStep> {
        if value == 0 {
            return Err(self.err(format!("`{field}` is missing (it must be > 0)")));
        }
        Ok(())
    }

    fn ready(&self, probe: &proto::ReadyProbe) -> Result<(), InvalidStep> {
        let call = probe
            .probe
            .as_ref()
            .ok_or_else(|| self.err("`probe` (the HTTP call) is missing"))?;
        self.http("probe", call)?;
        if probe.status == 0 {
            return Err(self.err("`status` is missing"));
        }
        if !(100..=599).contains(&probe.status) {
            return Err(self.err(format!("`status` {} is not an HTTP status", probe.status)));
        }
        self.positive("every_ms", probe.every_ms)?;
        self.positive("timeout_ms", probe.timeout_ms)
    }

    fn invoke(&self, invoke: &proto::Invoke) -> Result<(), InvalidStep> {
        match invoke.action.as_ref().and_then(|a| a.kind.as_ref()) {
            None => Err(self.err("`action` is missing")),
            Some(proto::action::Kind::Http(call)) => self.http("action.http", call),
            Some(proto::action::Kind::Signal(name)) => {
                if signal_named(name).is_none() {
                    return Err(self.err(format!("signal `{name}` is not one a service may be sent (HUP, INT, QUIT, USR1, USR2, TERM, ...)")));
                }
                Ok(())
            }
        }
    }

    fn http(&self, field: &str, call: &proto::HttpCall) -> Result<(), InvalidStep> {
        if call.method.is_empty() {
            return Err(self.err(format!("`{field}.method` is missing")));
        }
        if http::Method::from_bytes(call.method.as_bytes()).is_err() {
            return Err(self.err(format!(
                "`{field}.method` `{}` is not an HTTP method",
                call.method
            )));
        }
        if !call.path.starts_with('/') {
            return Err(self.err(format!(
                "`{field}.path` `{}` does not start with `/`",
                call.path
            )));
        }
        Ok(())
    }
}

/// The signal called `name`, with or without `SIG`, in any case: those a
/// service may be asked to act on.
pub(super) fn signal_named(name: &str) -> Option<rustix::process::Signal> {
    use rustix::process::Signal;
    let upper = name.to_ascii_uppercase();
    Some(match upper.strip_prefix("SIG").unwrap_or(&upper) {
        "HUP" => Signal::HUP,
        "INT" => Signal::INT,
        "QUIT" => Signal::QUIT,
        "USR1" => Signal::USR1,
        "USR2" => Signal::USR2,
        "TERM" => Signal::TERM,
        "KILL" => Signal::KILL,
        "CONT" => Signal::CONT,
        "STOP" => Signal::STOP,
        "TSTP" => Signal::TSTP,
        "ALRM" => Signal::ALARM,
        "WINCH" => Signal::WINCH,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_the_step_by_its_text_and_place() {
        let target = proto::TargetConfig {
            warmup: Some(proto::Warmup {
                steps: vec![proto::WarmupStep {
                    source: Some(proto::SourceRef {
                        file: "order.gov".into(),
                        line: 12,
                        column: 5,
                        snippet: "ready when http GET \"/ready\" is 200 every 5s".into(),
                    }),
                    step: Some(WarmupStep::Start(proto::Invoke {
                        what: "consumers".into(),
                        action: Some(proto::Action {
                            kind: Some(proto::action::Kind::Signal("SIGNOPE".into())),
                        }),
                    })),
                }],
                source: None,
            }),
            ..proto::TargetConfig::default()
        };
        let error = check(&target).map(|()| "accepted".to_owned());
        assert_eq!(
            error.map_err(|e| e.to_string()),
            Err("warmup step `ready when http GET \"/ready\" is 200 every 5s` at order.gov:12: signal `SIGNOPE` is not one a service may be sent (HUP, INT, QUIT, USR1, USR2, TERM, ...)".to_owned())
        );
        assert!(check(&proto::TargetConfig::default()).is_ok());
    }
}
