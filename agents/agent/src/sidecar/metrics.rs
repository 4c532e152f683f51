//! `/metrics`: the Prometheus text exposition format, written by hand over the
//! engine's stats snapshot.
//!
//! A hand-written encoder is a screenful of code, needs no registry kept in sync with
//! the engine's rules (rules come and go with every config), and costs nothing on the
//! request path: the engine counts with atomics, and this module only reads a
//! snapshot when scraped. Names are snake_case in base units, counters end in
//! `_total`, and the only labels are the rule id (`service/name`), small closed
//! sets (`reason`, `le`), and the called services' endpoints (`service`,
//! `endpoint`: one series per endpoint the outbound directory holds now, so as many
//! as discovery gives, never one per request or per client).

use gov_common::prom::{Encoder, le_label};
use gov_engine::{Engine, FuseState, RejectReason, RuleKind, RuleStats};

use super::upstream::EndpointStats;

/// What `/metrics` reads.
pub(crate) struct Source {
    pub(crate) service: String,
    pub(crate) config: std::sync::Arc<super::ConfigStatus>,
    pub(crate) engine: Engine,
    /// Phase and slow-start weight (`crate::lifecycle`).
    pub(crate) lifecycle: tokio::sync::watch::Receiver<crate::lifecycle::State>,
    /// The proxy listeners by name (`inbound`, `outbound`).
    pub(crate) listeners: Vec<(&'static str, std::sync::Arc<super::serve::Connections>)>,
    /// The outbound listener's endpoints.
    pub(crate) directory: std::sync::Arc<super::upstream::Directory>,
    /// The latches kept in the state directory (`None` without one).
    pub(crate) latches: Option<std::sync::Arc<crate::latches::LatchStore>>,
    /// Whether the agent has a `--control-plane`.
    pub(crate) control_plane: bool,
    /// `--decision-log`.
    pub(crate) decision_log: Option<crate::decision_log::DecisionLog>,
    /// Mutual TLS between agents.
    pub(crate) mtls: std::sync::Arc<super::mtls::PeerTls>,
}

impl Source {
    /// Renders every series.
    pub(crate) fn render(&self, health: &crate::health::Health) -> String {
        let mut enc = Encoder::default();
        self.render_agent(&mut enc, health);
        self.render_listeners(&mut enc);
        self.render_identity(&mut enc);
        render_endpoints(&mut enc, &self.directory.stats());
        render_rules(&mut enc, &self.engine.stats().rules);
        gov_common::prom::render_process(&mut enc);
        enc.finish()
    }

    fn render_listeners(&self, enc: &mut Encoder) {
        type Read = fn(&super::serve::Connections) -> u64;
        let families: [(&str, &str, &str, Read); 7] = [
            (
                "gov_agent_connections_open",
                "gauge",
                "Client connections open on the proxy listener.",
                super::serve::Connections::open,
            ),
            (
                "gov_agent_connections_over_cap_total",
                "counter",
                "Client connections closed at accept because the listener had --max-connections open.",
                super::serve::Connections::over_cap,
            ),
            (
                "gov_agent_connections_over_client_cap_total",
                "counter",
                "Client connections closed at accept because their address had --max-connections-per-client open.",
                super::serve::Connections::over_client_cap,
            ),
            (
                "gov_agent_requests_refused_total",
                "counter",
                "Requests refused as malformed or ambiguous (400, 431, 501) before reaching the engine.",
                super::serve::Connections::refused,
            ),
            (
                "gov_agent_calls_client_gone_total",
                "counter",
                "Admitted calls whose client left before the response ended; the upstream's answer is read to its end and the call's permits held meanwhile.",
                super::serve::Connections::client_gone,
            ),
            (
                "gov_agent_calls_client_gone_cut_total",
                "counter",
                "Calls whose client left that were still running at --client-gone-hold, then cut (their permits released).",
                super::serve::Connections::client_gone_cut,
            ),
            (
                "gov_agent_connections_closed_abandoning_total",
                "counter",
                "Client connections closed (HTTP/2: GOAWAY) for abandoning more admitted calls in a second than their budget (100).",
                super::serve::Connections::closed_abandoning,
            ),
        ];
        for (name, kind, help, read) in families {
            enc.family(name, kind, help);
            for (listener, conns) in &self.listeners {
                enc.sample(name, &[("listener", listener)], read(conns));
            }
        }
        type ReadForm = fn(&super::serve::Connections, usize) -> u64;
        let upgraded: [(&str, &str, &str, ReadForm); 2] = [
            (
                "gov_agent_upgraded_connections_open",
                "gauge",
                "Upgraded (WebSocket) connections open on the proxy listener, by the client's protocol (http1: Upgrade, h2: extended CONNECT); each holds its upgrade call's admission.",
                super::serve::Connections::upgraded_open,
            ),
            (
                "gov_agent_upgraded_connections_total",
                "counter",
                "Connections upgraded (WebSocket, 101 from the upstream) on the proxy listener, by the client's protocol.",
                super::serve::Connections::upgraded,
            ),
        ];
        for (name, kind, help, read) in upgraded {
            enc.family(name, kind, help);
            for (listener, conns) in &self.listeners {
                for (form, protocol) in super::serve::UPGRADE_FORMS.iter().enumerate() {
                    let labels = [("listener", *listener), ("protocol", *protocol)];
                    enc.sample(name, &labels, read(conns, form));
                }
            }
        }
        let name = "gov_agent_doomed_calls_total";
        enc.family(
            name,
            "counter",
            "Calls refused with 504 (DEADLINE_EXCEEDED) without taking a permit: their caller's deadline (grpc-timeout, gov-timeout) was used up on arrival or while they waited.",
        );
        for (listener, direction) in [
            ("inbound", gov_engine::Direction::Inbound),
            ("outbound", gov_engine::Direction::Outbound),
        ] {
            let doomed = self.engine.doomed_calls(direction);
            enc.sample(name, &[("listener", listener)], doomed);
        }
    }

    /// Mutual TLS between agents, and where consumers come from.
    fn render_identity(&self, enc: &mut Encoder) {
        let c = &self.mtls.counts;
        let name = "gov_agent_mtls_connections_total";
        enc.family(
            name,
            "counter",
            "Connections by mutual TLS between agents: inbound `verified` (an agent certificate), `anonymous` (TLS without one, --inbound-mtls permit), `plain` (permit), `refused` (plain under require, a failed handshake, a certificate naming no service); outbound `mtls` (to an agent that takes it) and `failed` (handshake, or a peer naming another service).",
        );
        for (listener, result, n) in [
            ("inbound", "verified", &c.verified),
            ("inbound", "anonymous", &c.tls_anonymous),
            ("inbound", "plain", &c.plain),
            ("inbound", "refused", &c.refused),
            ("outbound", "mtls", &c.outbound),
            ("outbound", "failed", &c.outbound_failed),
        ] {
            let n = n.load(std::sync::atomic::Ordering::Relaxed);
            enc.sample(name, &[("listener", listener), ("result", result)], n);
        }
        let name = "gov_agent_consumer_source";
        enc.family(
            name,
            "gauge",
            "Always 1; where the config in force reads consumers from (`header`: whatever the client sends; `trusted-header`, `peer`, `jwt`: verified) is in the label.",
        );
        let source = self.engine.config().consumer_source.name();
        enc.sample(name, &[("source", source)], 1_u64);
    }

    fn render_agent(&self, enc: &mut Encoder, health: &crate::health::Health) {
        enc.family(
            "gov_agent_build_info",
            "gauge",
            "Always 1; the agent's version is in the label.",
        );
        enc.sample(
            "gov_agent_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1_u64,
        );
        if self.control_plane {
            enc.family(
                "gov_agent_control_plane_connected",
                "gauge",
                "1 while the agent has a stream to the control plane, else 0 (it enforces its last good config).",
            );
            enc.sample(
                "gov_agent_control_plane_connected",
                &[],
                u64::from(self.config.control_plane_connected()),
            );
            enc.family(
                "gov_agent_config_unsaved",
                "gauge",
                "1 while the config in force could not be saved in --state-dir (a restart without the control plane goes back to the last saved one), else 0.",
            );
            enc.sample(
                "gov_agent_config_unsaved",
                &[],
                u64::from(self.config.unsaved()),
            );
        }
        enc.family(
            "gov_agent_ready",
            "gauge",
            "1 when the agent has a config and is not draining, else 0.",
        );
        enc.sample(
            "gov_agent_ready",
            &[],
            u64::from(health.not_ready_reason().is_none()),
        );
        enc.family(
            "gov_agent_config_info",
            "gauge",
            "The config in force: always 1, the version is in the label.",
        );
        let version = self.config.version().unwrap_or_default();
        enc.sample(
            "gov_agent_config_info",
            &[("service", &self.service), ("version", &version)],
            1_u64,
        );
        render_credentials(enc, health);
        self.render_lifecycle(enc);
        self.render_stores(enc);
        let (applied, refused) = self.config.counts();
        enc.family(
            "gov_agent_config_reloads_total",
            "counter",
            "Configs applied and refused since start.",
        );
        enc.sample(
            "gov_agent_config_reloads_total",
            &[("result", "applied")],
            applied,
        );
        enc.sample(
            "gov_agent_config_reloads_total",
            &[("result", "refused")],
            refused,
        );
    }

    /// The state of what the agent keeps outside the process: the cluster
    /// store, the latch file, the decision log.
    fn render_stores(&self, enc: &mut Encoder) {
        if let Some(store) = self.engine.cluster_store() {
            enc.family(
                "gov_agent_cluster_store_up",
                "gauge",
                "1 while Redis answers; 0 while `scope cluster` limits count locally.",
            );
            enc.sample("gov_agent_cluster_store_up", &[], u64::from(store.is_up()));
            enc.family(
                "gov_agent_cluster_fallback_total",
                "counter",
                "`sync exact` calls decided by their limit's `fallback` because Redis did not answer within the limit's `timeout`, or was down.",
            );
            for (fallback, n) in store.fallbacks() {
                enc.sample(
                    "gov_agent_cluster_fallback_total",
                    &[("fallback", fallback.word())],
                    n,
                );
            }
        }
        if let Some(latches) = &self.latches {
            enc.family(
                "gov_agent_latches_persisted",
                "gauge",
                "1 when the state directory holds every latch in force; 0 while writing it fails (latches are enforced in memory only).",
            );
            enc.sample(
                "gov_agent_latches_persisted",
                &[],
                u64::from(latches.persisted()),
            );
            enc.family(
                "gov_agent_latch_write_errors_total",
                "counter",
                "Failed writes of the latch file in the state directory.",
            );
            enc.sample(
                "gov_agent_latch_write_errors_total",
                &[],
                latches.write_errors(),
            );
        }
        if let Some(log) = &self.decision_log {
            let c = log.counters();
            for (name, help, value) in [
                (
                    "gov_agent_decision_log_written_total",
                    "Decision log records written.",
                    c.written(),
                ),
                (
                    "gov_agent_decision_log_dropped_total",
                    "Decision log records dropped because the writer was behind (calls are never held for the log).",
                    c.dropped(),
                ),
                (
                    "gov_agent_decision_log_write_errors_total",
                    "Decision log records lost to a failed open, write or rotation of the file.",
                    c.errors(),
                ),
                (
                    "gov_agent_decision_log_rotations_total",
                    "Decision log files rotated by size.",
                    c.rotations(),
                ),
            ] {
                enc.family(name, "counter", help);
                enc.sample(name, &[], value);
            }
        }
    }
}

/// The agent's credentials towards govd: refusals and its certificate.
fn render_credentials(enc: &mut Encoder, health: &crate::health::Health) {
    enc.family(
        "gov_agent_control_plane_auth_failures_total",
        "counter",
        "Times the control plane refused this agent's token or certificate.",
    );
    enc.sample(
        "gov_agent_control_plane_auth_failures_total",
        &[],
        health.control_plane_auth_failures(),
    );
    enc.family(
        "gov_agent_control_plane_refused",
        "gauge",
        "1 while the control plane refuses this agent's credentials (see /ready for why), else 0.",
    );
    enc.sample(
        "gov_agent_control_plane_refused",
        &[],
        u64::from(health.control_plane_refusal().is_some()),
    );
    let (not_after_ms, failures) = health.certificate();
    if not_after_ms > 0 || failures > 0 {
        enc.family(
            "gov_agent_certificate_not_after_timestamp_seconds",
            "gauge",
            "When the agent's certificate (issued by govd with --identity, or --tls-cert) expires, in seconds since the Unix epoch; 0 before the first.",
        );
        enc.sample(
            "gov_agent_certificate_not_after_timestamp_seconds",
            &[],
            not_after_ms / 1000,
        );
        enc.family(
            "gov_agent_certificate_failures_total",
            "counter",
            "Requests to govd for a certificate (--identity), or reloads of --tls-cert/--tls-key, that failed; each is retried and the certificate in force kept.",
        );
        enc.sample("gov_agent_certificate_failures_total", &[], failures);
    }
}

/// The per-rule series, one family at a time (the text format wants the samples of
/// a family together).
impl Source {
    fn render_lifecycle(&self, enc: &mut Encoder) {
        use gov_proto::v1::Phase;
        let state = *self.lifecycle.borrow();
        enc.family(
            "gov_agent_lifecycle_phase",
            "gauge",
            "1 for the instance's current lifecycle phase, 0 for the others.",
        );
        // The phase words of `govc status` and the TUI (`Phase::word`).
        for phase in [
            Phase::Starting,
            Phase::Warming,
            Phase::Ready,
            Phase::Draining,
            Phase::Stopped,
        ] {
            enc.sample(
                "gov_agent_lifecycle_phase",
                &[("phase", phase.word())],
                u64::from(state.phase == phase),
            );
        }
        enc.family(
            "gov_agent_instance_weight_ratio",
            "gauge",
            "Slow-start weight reported to the control plane (1 = full traffic share).",
        );
        enc.sample(
            "gov_agent_instance_weight_ratio",
            &[],
            f64::from(state.weight_milli_percent) / f64::from(crate::lifecycle::FULL_WEIGHT),
        );
    }
}

/// The outbound endpoints' series (none without an outbound directory).
fn render_endpoints(enc: &mut Encoder, endpoints: &[EndpointStats]) {
    if endpoints.is_empty() {
        return;
    }
    type Read = fn(&EndpointStats) -> u64;
    let families: [(&str, &str, &str, Read); 6] = [
        (
            "gov_agent_endpoint_requests_total",
            "counter",
            "Requests the outbound balancer sent to the endpoint (each attempt).",
            |e| e.requests,
        ),
        (
            "gov_agent_endpoint_outstanding",
            "gauge",
            "Requests to the endpoint whose response has not ended.",
            |e| e.outstanding,
        ),
        (
            "gov_agent_endpoint_ejections_total",
            "counter",
            "Times the endpoint was ejected after failures in a row (its callee's outlier policy).",
            |e| e.ejections,
        ),
        (
            "gov_agent_endpoint_ejections_withheld_total",
            "counter",
            "Failures past the outlier policy's count that did not eject the endpoint: its max_ejected share (or the last available endpoint) held it back.",
            |e| e.withheld,
        ),
        (
            "gov_agent_endpoint_ejected",
            "gauge",
            "1 while the endpoint is ejected (the balancer skips it), else 0.",
            |e| u64::from(e.ejected),
        ),
        (
            "gov_agent_endpoint_slow",
            "gauge",
            "1 while the endpoint is a latency outlier (mean over 3x the median: probes only), else 0.",
            |e| u64::from(e.slow),
        ),
    ];
    for (name, kind, help, read) in families {
        enc.family(name, kind, help);
        for e in endpoints {
            enc.sample(
                name,
                &[("service", &e.service), ("endpoint", &e.endpoint)],
                read(e),
            );
        }
    }
    enc.family(
        "gov_agent_endpoint_weight_ratio",
        "gauge",
        "The endpoint's slow-start weight as the balancer uses it (1 = full share).",
    );
    for e in endpoints {
        enc.sample(
            "gov_agent_endpoint_weight_ratio",
            &[("service", &e.service), ("endpoint", &e.endpoint)],
            f64::from(e.weight_milli_percent) / f64::from(crate::lifecycle::FULL_WEIGHT),
        );
    }
}

/// Each rule's counts: in flight, waiting, admitted, rejected by reason,
/// gRPC outcomes, shadow rejections, retries; then its state.
fn render_rules(enc: &mut Encoder, rules: &[RuleStats]) {
    enc.family(
        "gov_agent_rule_in_flight",
        "gauge",
        "Calls admitted by the rule and not finished yet.",
    );
    for r in rules {
        enc.sample(
            "gov_agent_rule_in_flight",
            &[("rule", &r.rule)],
            r.in_flight,
        );
    }
    enc.family(
        "gov_agent_bulkhead_limit",
        "gauge",
        "A bulkhead's permits now: max_concurrent, or an adaptive bulkhead's current limit.",
    );
    for r in rules.iter().filter(|r| r.kind == RuleKind::Bulkhead) {
        enc.sample("gov_agent_bulkhead_limit", &[("rule", &r.rule)], r.capacity);
    }
    enc.family(
        "gov_agent_rule_waiting",
        "gauge",
        "Calls waiting for the rule (a bulkhead permit or a shaping delay).",
    );
    for r in rules {
        enc.sample("gov_agent_rule_waiting", &[("rule", &r.rule)], r.waiting);
    }
    enc.family(
        "gov_agent_rule_admitted_total",
        "counter",
        "Calls the rule admitted.",
    );
    for r in rules {
        enc.sample(
            "gov_agent_rule_admitted_total",
            &[("rule", &r.rule)],
            r.admitted,
        );
    }
    enc.family(
        "gov_agent_rule_rejected_total",
        "counter",
        "Calls the rule rejected, by reason (only the reasons of the rule's kind).",
    );
    for r in rules {
        for reason in RejectReason::ALL
            .into_iter()
            .filter(|reason| reason.kind() == r.kind)
        {
            enc.sample(
                "gov_agent_rule_rejected_total",
                &[("rule", &r.rule), ("reason", reason.as_str())],
                r.rejected(reason),
            );
        }
    }
    enc.family(
        "gov_agent_rule_grpc_calls_total",
        "counter",
        "gRPC calls the rule admitted, by the grpc-status they ended with (codes seen only).",
    );
    for r in rules {
        for (code, &n) in gov_proto::grpc::CODES.iter().zip(&r.grpc) {
            if n > 0 {
                enc.sample(
                    "gov_agent_rule_grpc_calls_total",
                    &[("rule", &r.rule), ("code", gov_proto::grpc::name(*code))],
                    n,
                );
            }
        }
    }
    enc.family(
        "gov_agent_shadow_rejected_total",
        "counter",
        "Calls a rule in mode shadow would have rejected (they went on), by reason.",
    );
    for r in rules
        .iter()
        .filter(|r| r.shadow || r.shadow_rejected.iter().any(|&n| n > 0))
    {
        for reason in RejectReason::ALL
            .into_iter()
            .filter(|reason| reason.kind() == r.kind)
        {
            enc.sample(
                "gov_agent_shadow_rejected_total",
                &[("rule", &r.rule), ("reason", reason.as_str())],
                r.shadow_rejected[reason as usize],
            );
        }
    }
    enc.family(
        "gov_agent_retries_total",
        "counter",
        "Retries of retry rules, by outcome: sent, or refused by the rule's budget.",
    );
    for r in rules.iter().filter(|r| r.kind == RuleKind::Retry) {
        for (outcome, n) in [("sent", r.retries), ("budget_exhausted", r.retries_refused)] {
            enc.sample(
                "gov_agent_retries_total",
                &[("rule", &r.rule), ("outcome", outcome)],
                n,
            );
        }
    }
    render_rule_states(enc, rules);
}

/// Each rule's latency histogram, fuse state, engaged limit and keys.
fn render_rule_states(enc: &mut Encoder, rules: &[RuleStats]) {
    enc.family(
        "gov_agent_rule_latency_seconds",
        "histogram",
        "Latency of admitted calls until the response head, per rule.",
    );
    for r in rules {
        let mut cumulative = 0;
        for (i, count) in r.latency.iter().enumerate() {
            cumulative += count;
            // The engine's buckets, in seconds; `+Inf` after the last.
            let le = gov_engine::LATENCY_BUCKETS_MS.get(i).map_or_else(
                || "+Inf".to_owned(),
                |ms| le_label(std::time::Duration::from_millis(*ms).as_secs_f64()),
            );
            enc.sample(
                "gov_agent_rule_latency_seconds_bucket",
                &[("rule", &r.rule), ("le", &le)],
                cumulative,
            );
        }
        enc.sample(
            "gov_agent_rule_latency_seconds_sum",
            &[("rule", &r.rule)],
            r.latency_sum.as_secs_f64(),
        );
        enc.sample(
            "gov_agent_rule_latency_seconds_count",
            &[("rule", &r.rule)],
            cumulative,
        );
    }
    enc.family(
        "gov_agent_fuse_state",
        "gauge",
        "Fuse state: 0 closed, 1 open (tripped), 2 half-open.",
    );
    for r in rules {
        if let Some(state) = r.fuse {
            let value: u64 = match state {
                FuseState::Closed => 0,
                FuseState::Open => 1,
                FuseState::HalfOpen => 2,
            };
            enc.sample("gov_agent_fuse_state", &[("rule", &r.rule)], value);
        }
    }
    enc.family(
        "gov_agent_limit_engaged",
        "gauge",
        "1 while the limit is engaged (rejecting until released), else 0.",
    );
    for r in rules.iter().filter(|r| r.kind == RuleKind::Limit) {
        enc.sample(
            "gov_agent_limit_engaged",
            &[("rule", &r.rule)],
            u64::from(r.limit_engaged),
        );
    }
    let keyed = || {
        rules
            .iter()
            .filter(|r| matches!(r.kind, RuleKind::Limit | RuleKind::Bulkhead))
    };
    enc.family(
        "gov_agent_rule_keys",
        "gauge",
        "Keys (consumers, services, instance scopes) the limit or bulkhead tracks now.",
    );
    for r in keyed() {
        enc.sample("gov_agent_rule_keys", &[("rule", &r.rule)], r.keys);
    }
    enc.family(
        "gov_agent_rule_keys_overflowed_total",
        "counter",
        "Calls of a new key that found max_keys engaged keys and went to the overflow.",
    );
    for r in keyed() {
        enc.sample(
            "gov_agent_rule_keys_overflowed_total",
            &[("rule", &r.rule)],
            r.keys_overflowed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_series_carry_service_and_endpoint_labels() {
        let mut enc = Encoder::default();
        render_endpoints(&mut enc, &[]);
        assert_eq!(enc.finish(), "", "no endpoints, no families");

        let mut enc = Encoder::default();
        let stats = EndpointStats {
            service: "inventory".into(),
            endpoint: "127.0.0.1:9001".into(),
            weight_milli_percent: 50_000,
            requests: 7,
            outstanding: 2,
            ejections: 1,
            withheld: 3,
            ejected: true,
            slow: false,
        };
        render_endpoints(&mut enc, &[stats]);
        let text = enc.finish();
        for line in [
            "gov_agent_endpoint_requests_total{service=\"inventory\",endpoint=\"127.0.0.1:9001\"} 7\n",
            "gov_agent_endpoint_outstanding{service=\"inventory\",endpoint=\"127.0.0.1:9001\"} 2\n",
            "gov_agent_endpoint_ejections_total{service=\"inventory\",endpoint=\"127.0.0.1:9001\"} 1\n",
            "gov_agent_endpoint_ejected{service=\"inventory\",endpoint=\"127.0.0.1:9001\"} 1\n",
            "gov_agent_endpoint_ejections_withheld_total{service=\"inventory\",endpoint=\"127.0.0.1:9001\"} 3\n",
            "gov_agent_endpoint_slow{service=\"inventory\",endpoint=\"127.0.0.1:9001\"} 0\n",
            "gov_agent_endpoint_weight_ratio{service=\"inventory\",endpoint=\"127.0.0.1:9001\"} 0.5\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
