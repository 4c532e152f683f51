//! The values the compiler writes where the `.gov` text leaves a setting
//! out, written once. The compiler puts them into every config it emits;
//! agents never fill them in (a config without them is refused, naming the
//! rule). Configs written by hand, in tests and examples, get them from
//! [`target`] and [`fill`], so that they are what `govc compile` would emit.
//! A kind's own defaults (its reject status and gRPC code, a fuse's
//! classes and recovery) live beside its word in `words.rs`, with its arm
//! of `Spec::fill`, so that a new kind does not touch this file.

use crate::v1::consumer_source::Kind as ConsumerKind;
use crate::v1::{
    Mode, OnInvalid, OutlierPolicy, Rule, TargetConfig, warmup_step::Step as WarmupStep,
};

/// The request header that carries the caller's identity.
pub const CONSUMER_HEADER: &str = "x-gov-consumer";

/// The most keys one keyed limit or bulkhead may track (`max_keys`, the
/// agent's `--max-keys-per-rule`): the compiler and the agents refuse more,
/// since each key holds memory in every agent.
pub const MAX_KEYS_PER_RULE: u32 = 1 << 20;

/// How long a `sync exact` limit's call waits for the shared store when
/// its text names no `timeout` (then its `fallback` decides the call).
pub const SYNC_EXACT_TIMEOUT_MS: u64 = 100;

/// A readiness probe's per-poll timeout when it says none: its period
/// (`every`), so that one slow answer never overlaps the next poll.
pub fn probe_timeout_ms(every_ms: u64) -> u64 {
    every_ms
}

/// Where `t` reads its consumers from, in the words of its `consumer from`
/// statement (`header "x-gov-consumer"` when it has none).
pub fn consumer_source_words(t: &TargetConfig) -> String {
    let word = |o: OnInvalid| {
        if o == OnInvalid::Count {
            "count"
        } else {
            "reject"
        }
    };
    let quoted = |s: &str| format!("{s:?}");
    match t.consumer_source.as_ref().and_then(|s| s.kind.as_ref()) {
        Some(ConsumerKind::Jwt(j)) => format!(
            "jwt header {} issuer {} audience {} keys {} claim {} on invalid {}",
            quoted(&j.header),
            quoted(&j.issuer),
            quoted(&j.audience),
            quoted(&j.keys_file),
            quoted(&j.claim),
            word(j.on_invalid())
        ),
        Some(ConsumerKind::Peer(p)) => format!("peer on invalid {}", word(p.on_invalid())),
        Some(ConsumerKind::TrustedHeader(h)) => {
            let peers: Vec<String> = h.peers.iter().map(|p| quoted(p)).collect();
            format!(
                "header {} trusted from peer {}",
                quoted(&t.consumer_header),
                peers.join(", ")
            )
        }
        None => format!("header {}", quoted(&t.consumer_header)),
    }
}

/// The outlier policy of every callee when the policy declares none (and
/// what a declared block leaves out): the agents' fixed rule before it could be
/// declared. 5 connect failures or resets in a row eject an instance for 1 s,
/// doubled with each ejection in a row up to 60 s; never the last instance
/// that is not ejected; an answer is never a failure.
pub fn outlier_defaults() -> OutlierPolicy {
    OutlierPolicy {
        consecutive_failures: 5,
        eject_ms: 1_000,
        growth: 2,
        max_eject_ms: 60_000,
        max_ejected_milli_percent: 0,
        status: Vec::new(),
    }
}

/// An empty config of `service` (no rules), as the compiler would emit it.
pub fn target(service: &str) -> TargetConfig {
    TargetConfig {
        service: service.to_owned(),
        consumer_header: CONSUMER_HEADER.to_owned(),
        ..TargetConfig::default()
    }
}

/// Writes the compiler's value into every field a hand-written config left
/// out (zero or absent), and leaves every written value as it is. For
/// tests and examples only: an agent refuses what this would fill.
pub fn fill(target: &mut TargetConfig) {
    if target.consumer_header.is_empty() {
        CONSUMER_HEADER.clone_into(&mut target.consumer_header);
    }
    for rule in &mut target.rules {
        fill_rule(rule);
    }
    let steps = target.warmup.iter_mut().flat_map(|w| &mut w.steps);
    for step in steps {
        if let Some(WarmupStep::Ready(probe)) = &mut step.step
            && probe.timeout_ms == 0
        {
            probe.timeout_ms = probe_timeout_ms(probe.every_ms);
        }
    }
}

fn fill_rule(rule: &mut Rule) {
    if rule.mode == Mode::Unspecified as i32 {
        rule.mode = Mode::Enforce as i32;
    }
    if let Some(spec) = &mut rule.spec {
        spec.fill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{Bulkhead, Fuse, RuleKind, rule::Spec};

    #[test]
    fn fill_writes_what_is_missing_and_keeps_what_is_written() {
        let mut t = TargetConfig {
            service: "order".into(),
            rules: vec![
                Rule {
                    name: "order/b".into(),
                    spec: Some(Spec::Bulkhead(Bulkhead {
                        max_concurrent: 1,
                        reject_status: 503,
                        ..Bulkhead::default()
                    })),
                    ..Rule::default()
                },
                Rule {
                    name: "order/f".into(),
                    spec: Some(Spec::Fuse(Fuse::default())),
                    ..Rule::default()
                },
            ],
            ..TargetConfig::default()
        };
        fill(&mut t);
        assert_eq!(t.consumer_header, CONSUMER_HEADER);
        assert!(t.rules.iter().all(|r| r.mode() == Mode::Enforce));
        assert_eq!(t.rules[0].bulkhead().map(|b| b.reject_status), Some(503));
        let f = t.rules[1].fuse().cloned().unwrap_or_default();
        assert_eq!(f.reject_status, RuleKind::Fuse.reject_status());
        assert_eq!(f.reject_grpc_status(), RuleKind::Fuse.reject_grpc());
        assert_eq!(f.business, Some(Fuse::default_business()));
        assert_eq!(f.system, Some(Fuse::default_system()));
        assert_eq!(f.recover, Some(Fuse::default_recovery()));
    }
}
