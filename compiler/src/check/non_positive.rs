//! `gov::non-positive`: a quantity that must be positive is zero or
//! negative (or negative where zero is allowed).
//!
//! Why: `max_concurrent 0` rejects every call, `calls 100 per 0s` divides by
//! zero, `every 0s` probes in a busy loop. These are typos, not policies.
//!
//! Zero is allowed for `max_wait` (fail at once), `queue` (no waiting),
//! `after` of a readiness probe, registry cache timings and a `>` count
//! threshold (`errors > 0`). Everything else must be above zero.
//!
//! Example: `max_concurrent 0`.
//!
//! Fix: write a positive value; to turn a rule off, delete it.

use gov_lang::ast::{Capacity, ServiceStmt, ShutdownStep, Span, WarmupStep};
use miette::SourceSpan;
use thiserror::Error;

use crate::kind::{Bound, Values};
use crate::resolve::{Ctx, Src};
use crate::units::millis;

#[derive(Debug, Error, miette::Diagnostic)]
#[error("`{what}` must be {bound}, found `{found}`")]
#[diagnostic(code("gov::non-positive"))]
pub struct NonPositive {
    pub what: String,
    pub bound: String,
    pub found: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "must be {bound}")]
    pub span: SourceSpan,
    #[help]
    pub help: String,
}

struct Sink<'c, 'a, D> {
    cx: &'c Ctx<'a>,
    file: usize,
    out: &'c mut Vec<D>,
}

impl<D: From<NonPositive>> Sink<'_, '_, D> {
    fn value(&mut self, what: &str, value: i64, span: Span, bound: Bound) {
        let bad = match bound {
            Bound::Positive => value <= 0,
            Bound::NotNegative => value < 0,
        };
        if !bad {
            return;
        }
        let (bound, help) = match bound {
            Bound::Positive => (
                "greater than zero",
                "write a value above zero; to turn a rule off, delete the rule",
            ),
            Bound::NotNegative => ("zero or more", "write zero or a positive value"),
        };
        let found = self.cx.files[self.file]
            .text
            .get(span.start..span.end)
            .unwrap_or_default();
        self.out.push(
            NonPositive {
                what: what.to_string(),
                bound: bound.to_string(),
                found: found.to_string(),
                src: self.cx.src(self.file),
                span: span.into(),
                help: help.to_string(),
            }
            .into(),
        );
    }

    fn duration(
        &mut self,
        what: &str,
        d: &gov_lang::ast::Spanned<gov_lang::ast::Duration>,
        bound: Bound,
    ) {
        self.value(what, millis(&d.node), d.span, bound);
    }
}

pub(crate) fn check<D: From<NonPositive>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    use Bound::{NotNegative, Positive};
    for (file, reg) in &cx.registries {
        let mut s = Sink {
            cx,
            file: *file,
            out,
        };
        for setting in &reg.settings {
            let key = cx.text(*file, setting.key.span);
            s.duration(key, &setting.value, NotNegative);
        }
    }
    for svc in &cx.services {
        let mut s = Sink {
            cx,
            file: svc.file,
            out,
        };
        for stmt in &svc.ast.body {
            match stmt {
                ServiceStmt::Capacity(Capacity::Workers { count, .. }) => {
                    s.value("capacity workers", count.node, count.span, Positive);
                }
                ServiceStmt::Capacity(Capacity::Instances { count, .. }) => {
                    s.value("capacity instances", count.node, count.span, Positive);
                }
                ServiceStmt::Capacity(Capacity::Amplification { count, .. }) => {
                    s.value("capacity amplification", count.node, count.span, Positive);
                }
                ServiceStmt::Capacity(Capacity::Rate { rate, .. }) => {
                    s.value(
                        "capacity rate",
                        rate.amount.node,
                        rate.amount.span,
                        Positive,
                    );
                    s.duration("capacity rate ... per", &rate.window, Positive);
                }
                ServiceStmt::Match(m) => {
                    if let Some(l) = &m.latency {
                        s.duration("latency", l, Positive);
                    }
                }
                ServiceStmt::Warmup(w) => {
                    for step in &w.steps {
                        match step {
                            WarmupStep::Ready {
                                every,
                                after,
                                timeout,
                                ..
                            } => {
                                s.duration("every", every, Positive);
                                if let Some(a) = after {
                                    s.duration("after", a, NotNegative);
                                }
                                if let Some(t) = timeout {
                                    s.duration("timeout", t, Positive);
                                }
                            }
                            WarmupStep::Ramp { over, .. } => s.duration("ramp", over, Positive),
                            WarmupStep::Register { .. } | WarmupStep::Start { .. } => {}
                        }
                    }
                }
                ServiceStmt::Shutdown(sd) => {
                    for step in &sd.steps {
                        match step {
                            ShutdownStep::Wait { duration, .. } => {
                                s.duration("wait", duration, Positive);
                            }
                            ShutdownStep::Drain { deadline, .. } => {
                                s.duration("drain", deadline, Positive);
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        for rule in &svc.rules {
            let mut values = Values::default();
            let text = |span| cx.text(svc.file, span).to_string();
            rule.imp.values(rule.def, &text, &mut values);
            crate::kind::header_values(rule.def, &mut values);
            for (what, value, span, bound) in values.bounded {
                s.value(&what, value, span, bound);
            }
        }
    }
}
