//! `gov::too-large`: a number too large to mean anything or to be carried
//! to the agents: a count above 4294967295 (`max_concurrent`, `queue`,
//! `probe`), or a duration or size whose value overflows when converted to
//! milliseconds or bytes.
//!
//! Why: such a value would be cut or wrapped on the way to the agent and
//! enforce something other than what was written; it is almost always a
//! typo (an extra digit, `ms` meant but `h` written).
//!
//! Example: `max_concurrent 99999999999`.
//!
//! Fix: write the value you meant; a bulkhead that should not limit
//! anything is better deleted.

use gov_lang::ast::{self, ServiceStmt, ShutdownStep, Spanned, WarmupStep};
use miette::SourceSpan;
use thiserror::Error;

use crate::kind::{Large, Values};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("`{what}` is too large: `{found}`")]
#[diagnostic(code("gov::too-large"))]
pub struct TooLarge {
    pub what: String,
    pub found: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "{limit}")]
    pub span: SourceSpan,
    pub limit: String,
    #[help]
    pub help: String,
}

struct Sink<'c, 'a, D> {
    cx: &'c Ctx<'a>,
    file: usize,
    out: &'c mut Vec<D>,
}

impl<D: From<TooLarge>> Sink<'_, '_, D> {
    fn push(&mut self, what: &str, span: ast::Span, limit: &str, help: &str) {
        let found = self.cx.files[self.file]
            .text
            .get(span.start..span.end)
            .unwrap_or_default();
        self.out.push(
            TooLarge {
                what: what.to_string(),
                found: found.to_string(),
                src: self.cx.src(self.file),
                span: span.into(),
                limit: limit.to_string(),
                help: help.to_string(),
            }
            .into(),
        );
    }

    fn count(&mut self, what: &str, v: &Spanned<i64>) {
        if v.node > i64::from(u32::MAX) {
            self.push(
                what,
                v.span,
                "at most 4294967295",
                "write the value you meant",
            );
        }
    }

    fn duration(&mut self, what: &str, d: &Spanned<ast::Duration>) {
        if d.node.as_millis().is_none() {
            self.push(
                what,
                d.span,
                "overflows in milliseconds",
                "use a smaller value or unit",
            );
        }
    }

    fn size(&mut self, what: &str, s: &Spanned<ast::Size>) {
        if s.node.as_bytes().is_none() {
            self.push(
                what,
                s.span,
                "overflows in bytes",
                "use a smaller value or unit",
            );
        }
    }
}

pub(crate) fn check<D: From<TooLarge>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for (file, reg) in &cx.registries {
        let mut s = Sink {
            cx,
            file: *file,
            out,
        };
        for setting in &reg.settings {
            s.duration("registry cache time", &setting.value);
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
                ServiceStmt::Capacity(ast::Capacity::Rate { rate, .. }) => {
                    s.duration("rate window", &rate.window);
                }
                ServiceStmt::Match(m) => {
                    if let Some(l) = &m.latency {
                        s.duration("latency", l);
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
                                s.duration("every", every);
                                for d in after.iter().chain(timeout) {
                                    s.duration("duration", d);
                                }
                            }
                            WarmupStep::Ramp { over, .. } => s.duration("ramp", over),
                            WarmupStep::Register { .. } | WarmupStep::Start { .. } => {}
                        }
                    }
                }
                ServiceStmt::Shutdown(sd) => {
                    for step in &sd.steps {
                        match step {
                            ShutdownStep::Wait { duration, .. } => s.duration("wait", duration),
                            ShutdownStep::Drain { deadline, .. } => s.duration("drain", deadline),
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
            for (what, value) in &values.large {
                match value {
                    Large::Count(v) => s.count(what, v),
                    Large::Duration(d) => s.duration(what, d),
                    Large::Size(z) => s.size(what, z),
                }
            }
        }
    }
}
