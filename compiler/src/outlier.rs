//! `outlier [to SERVICE] { ... }`: what the settings of an outlier block mean,
//! their lowering to `TargetConfig.outlier` and `outlier_targets`, and their
//! words in a plan.
//!
//! A callee's block takes what it leaves out from the service-wide block
//! (`outlier { ... }`), and that from gov-proto's defaults
//! ([`gov_proto::compiled::outlier_defaults`]); the compiler writes every
//! value. The first block of a service (or for a callee) counts; the others
//! are reported (`gov::duplicate-setting`).

use gov_lang::ast::{self, Span, Word};
use gov_proto::v1 as pb;

use crate::units::{fmt_milli_percent, millis, u32_of, unsigned};

/// An outlier block's settings, decoded; what it leaves out is `None`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Decl {
    /// `consecutive_failures N`
    pub failures: Option<(i64, Span)>,
    /// `eject D`, in milliseconds.
    pub eject: Option<(i64, Span)>,
    /// `growth Nx`
    pub growth: Option<(i64, Span)>,
    /// `max D`, in milliseconds.
    pub max: Option<(i64, Span)>,
    /// `max_ejected P%`, in milli-percent.
    pub share: Option<(i64, Span)>,
    /// `on status A..B ...`: each range (a single code has `to == from`).
    pub status: Vec<(i64, i64, Span)>,
}

impl Decl {
    pub(crate) fn of(block: &ast::Outlier) -> Self {
        let mut d = Decl::default();
        for setting in &block.settings {
            let key = setting.key().unwrap_or_default();
            let seen = match key {
                "consecutive_failures" => d.failures.is_some(),
                "eject" => d.eject.is_some(),
                "max_ejected" => d.share.is_some(),
                "on" => !d.status.is_empty(),
                _ => false,
            };
            // The first counts (`gov::duplicate-setting` reports the others).
            if seen {
                continue;
            }
            let mut words = setting.words.iter().peekable();
            while let Some(w) = words.next() {
                let next = words.peek().map(|n| (&n.node, n.span));
                match (&w.node, next) {
                    (Word::Key("consecutive_failures"), Some((Word::Int(n), span))) => {
                        d.failures = Some((*n, span));
                    }
                    (Word::Key("eject"), Some((Word::Duration(t), span))) => {
                        d.eject = Some((millis(t), span));
                    }
                    (Word::Key("growth"), Some((Word::Factor(n), span))) => {
                        d.growth = Some((*n, span));
                    }
                    (Word::Key("max"), Some((Word::Duration(t), span))) => {
                        d.max = Some((millis(t), span));
                    }
                    (Word::Key("max_ejected"), Some((Word::Percent(p), span))) => {
                        d.share = Some((p.milli, span));
                    }
                    (Word::Range { from, to }, _) => {
                        let to = to.as_ref().map_or(from.node, |t| t.node);
                        d.status.push((from.node, to, w.span));
                    }
                    _ => {}
                }
            }
        }
        d
    }

    /// `base` with what this block declares written over it.
    pub(crate) fn over(&self, base: &pb::OutlierPolicy) -> pb::OutlierPolicy {
        let mut p = base.clone();
        if let Some((n, _)) = self.failures {
            p.consecutive_failures = u32_of(n);
        }
        if let Some((ms, _)) = self.eject {
            p.eject_ms = unsigned(ms);
            // The ceiling is never below the ejection it bounds: a block that
            // sets `eject` above the inherited ceiling raises it.
            if self.max.is_none() {
                p.max_eject_ms = p.max_eject_ms.max(p.eject_ms);
            }
        }
        if let Some((n, _)) = self.growth {
            p.growth = u32_of(n);
        }
        if let Some((ms, _)) = self.max {
            p.max_eject_ms = unsigned(ms);
        }
        if let Some((milli, _)) = self.share {
            p.max_ejected_milli_percent = u32_of(milli);
        }
        if !self.status.is_empty() {
            p.status = self
                .status
                .iter()
                .map(|&(from, to, _)| pb::StatusRange {
                    from: u32_of(from),
                    to: u32_of(to),
                })
                .collect();
        }
        p
    }
}

/// The service-wide policy (`None` without an `outlier { }` block) and one
/// policy per callee, sorted by callee.
pub(crate) fn lower(
    blocks: &[&ast::Outlier],
) -> (Option<pb::OutlierPolicy>, Vec<pb::OutlierTarget>) {
    let wide = blocks
        .iter()
        .find(|b| b.to.is_none())
        .map(|b| Decl::of(b).over(&gov_proto::compiled::outlier_defaults()));
    let base = wide
        .clone()
        .unwrap_or_else(gov_proto::compiled::outlier_defaults);
    let mut targets: Vec<pb::OutlierTarget> = Vec::new();
    for b in blocks {
        let Some(to) = &b.to else { continue };
        if targets.iter().any(|t| t.service == to.node) {
            continue;
        }
        targets.push(pb::OutlierTarget {
            service: to.node.clone(),
            policy: Some(Decl::of(b).over(&base)),
        });
    }
    targets.sort_by(|a, b| a.service.cmp(&b.service));
    (wide, targets)
}

/// A policy in `.gov` words, for plans: `consecutive_failures 5 eject 1s
/// growth 2x max 1m` (and `max_ejected P%`, `on status ...` when set).
pub(crate) fn words(p: &pb::OutlierPolicy) -> String {
    let mut s = format!(
        "consecutive_failures {} eject {} growth {}x max {}",
        p.consecutive_failures,
        crate::units::fmt_ms(p.eject_ms),
        p.growth,
        crate::units::fmt_ms(p.max_eject_ms)
    );
    if p.max_ejected_milli_percent > 0 {
        s.push_str(&format!(
            " max_ejected {}",
            fmt_milli_percent(i64::from(p.max_ejected_milli_percent))
        ));
    }
    if !p.status.is_empty() {
        s.push_str(" on status");
        for r in &p.status {
            if r.to == r.from || r.to == 0 {
                s.push_str(&format!(" {}", r.from));
            } else {
                s.push_str(&format!(" {}..{}", r.from, r.to));
            }
        }
    }
    s
}

/// The plan's fields of `t`'s outlier policies: `outlier` and `outlier to
/// SERVICE`, each as its words.
pub(crate) fn fields(t: &pb::TargetConfig, out: &mut Vec<(String, String)>) {
    if let Some(p) = &t.outlier {
        out.push(("outlier".into(), words(p)));
    }
    for target in &t.outlier_targets {
        if let Some(p) = &target.policy {
            out.push((format!("outlier to {}", target.service), words(p)));
        }
    }
}
