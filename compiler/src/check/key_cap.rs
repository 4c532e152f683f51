//! `gov::key-cap`: `max_keys` above what an agent tracks (1048576), or
//! `max_keys`/`overflow` on a rule that has no key (a limit `per all` or
//! `per domain`, a bulkhead `per operation`).
//!
//! Why: each key holds memory in every agent, and the agents refuse a
//! config above the bound; on a rule without a key the setting does
//! nothing, which is almost always a forgotten `per consumer`.
//!
//! Example: `limit l on orders { calls 10 per 1s  max_keys 100 }`.
//!
//! Fix: key the rule (`per consumer`, `per service`; a bulkhead `per
//! instance`), or remove the setting; keep `max_keys` at or below 1048576.

use miette::SourceSpan;
use thiserror::Error;

use crate::kind::bulkhead::{Bulkhead, BulkheadKey, BulkheadSetting};
use crate::kind::keys::{KeySetting, MAX_MAX_KEYS};
use crate::kind::limit::{Limit, LimitKey, LimitSetting};
use crate::resolve::{Ctx, Src};

#[derive(Debug, Error, miette::Diagnostic)]
#[error("`{setting}` on {kind} `{name}`, which has no key")]
#[diagnostic(
    code("gov::key-cap"),
    help(
        "key the rule (a limit `per consumer` or `per service`, a bulkhead `per instance`), or remove `{setting}`"
    )
)]
pub struct Unkeyed {
    pub setting: &'static str,
    pub kind: &'static str,
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "the rule has one counter (or permit pool) for every call")]
    pub span: SourceSpan,
}

#[derive(Debug, Error, miette::Diagnostic)]
#[error("`max_keys {found}` on `{name}` is more keys than an agent tracks")]
#[diagnostic(
    code("gov::key-cap"),
    help("at most 1048576: each key holds memory in every agent")
)]
pub struct TooManyKeys {
    pub found: i64,
    pub name: String,
    #[source_code]
    pub src: Src,
    #[label(primary, "at most 1048576")]
    pub span: SourceSpan,
}

pub(crate) fn check<D: From<Unkeyed> + From<TooManyKeys>>(cx: &Ctx<'_>, out: &mut Vec<D>) {
    for svc in &cx.services {
        for rule in &svc.rules {
            let (kind, name, keyed, settings): (_, _, _, Vec<KeySetting>) =
                if let Some(l) = Limit::of(rule) {
                    let per = l.settings.iter().rev().find_map(|s| match s {
                        LimitSetting::Per { key, .. } => Some(key.node),
                        _ => None,
                    });
                    let keyed = matches!(
                        per,
                        Some(LimitKey::Consumer | LimitKey::Service | LimitKey::Parts)
                    );
                    let keys = l.settings.iter().filter_map(|s| match s {
                        LimitSetting::Keys(k) => Some(k.clone()),
                        _ => None,
                    });
                    ("limit", l.name.node.clone(), keyed, keys.collect())
                } else if let Some(b) = Bulkhead::of(rule) {
                    let per = b.settings.iter().rev().find_map(|s| match s {
                        BulkheadSetting::Per { key, .. } => Some(key.node),
                        _ => None,
                    });
                    let keyed = !matches!(per, None | Some(BulkheadKey::Operation));
                    let keys = b.settings.iter().filter_map(|s| match s {
                        BulkheadSetting::Keys(k) => Some(k.clone()),
                        _ => None,
                    });
                    ("bulkhead", b.name.node.clone(), keyed, keys.collect())
                } else {
                    continue;
                };
            for s in &settings {
                if !keyed {
                    out.push(
                        Unkeyed {
                            setting: s.key(),
                            kind,
                            name: name.clone(),
                            src: cx.src(svc.file),
                            span: s.span().into(),
                        }
                        .into(),
                    );
                } else if let KeySetting::MaxKeys { value, .. } = s
                    && value.node > MAX_MAX_KEYS
                {
                    out.push(
                        TooManyKeys {
                            found: value.node,
                            name: name.clone(),
                            src: cx.src(svc.file),
                            span: value.span.into(),
                        }
                        .into(),
                    );
                }
            }
        }
    }
}
