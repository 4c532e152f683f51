//! govd's `/metrics`: Prometheus text on its own listener (`govd
//! --metrics-listen`), so that a scrape never queues behind gRPC.
//!
//! Counters of what happens (applies, config pushes, ACKs and NACKs and the
//! time from a push to its answer) are atomics bumped where it happens; what
//! *is* (agents by sync state, tripped fuses, engaged limits) is the cluster
//! view computed when scraped, as `govc status` gets it, so the two agree.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;

use crate::encoded::EndpointsForm;
use gov_common::prom::{Encoder, le_label};
use gov_proto::v1 as pb;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::agent_limits::AgentCap;

/// Upper bounds of the push-to-answer histogram, in seconds (`+Inf` implied).
pub const ACK_BUCKETS_SECONDS: [f64; 9] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// Pushes remembered while waiting for their answer; beyond this the oldest
/// half is forgotten (agents that went away without answering).
const MAX_PENDING: usize = 10_000;

/// The counters (cheap: atomics, one small map of pending pushes).
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    applies: [AtomicU64; ApplyOutcome::ALL.len()],
    pushes: AtomicU64,
    /// Endpoint sets sent, and their bytes, whole and as deltas.
    endpoint_pushes: [AtomicU64; 2],
    endpoint_bytes: [AtomicU64; 2],
    acks: AtomicU64,
    nacks: AtomicU64,
    answered: Histogram,
    /// Hellos refused and strings cut, by [`AgentCap`].
    agent_refusals: [AtomicU64; AgentCap::ALL.len()],
    /// Instances forgotten after `--agent-retention`.
    agents_pruned: AtomicU64,
    /// New agent streams refused: their admission turn was too far away.
    admissions_refused: AtomicU64,
    /// Open connections by client, and those closed before proving anything.
    pub(crate) connections: std::sync::Arc<crate::connections::Registry>,
    /// Watch streams open by token, and those refused.
    pub(crate) watches: std::sync::Arc<crate::watches::Watches>,
    /// Nonce of each unanswered push, with when it was sent.
    pending: Mutex<HashMap<String, Instant>>,
}

/// How an apply (not a dry run) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ApplyOutcome {
    /// A new version is current and was pushed.
    Applied,
    /// The policy compiles to the version in force: nothing to do.
    Unchanged,
    /// The policy has errors: nothing changed.
    Invalid,
    /// Refused before or while committing (too large, state not writable, ...).
    Refused,
}

impl ApplyOutcome {
    const ALL: [ApplyOutcome; 4] = [
        ApplyOutcome::Applied,
        ApplyOutcome::Unchanged,
        ApplyOutcome::Invalid,
        ApplyOutcome::Refused,
    ];

    fn label(self) -> &'static str {
        match self {
            ApplyOutcome::Applied => "applied",
            ApplyOutcome::Unchanged => "unchanged",
            ApplyOutcome::Invalid => "invalid",
            ApplyOutcome::Refused => "refused",
        }
    }

    /// The outcome of `result`.
    pub(crate) fn of<E>(result: &Result<pb::ApplyResult, E>) -> Self {
        match result {
            Ok(r) if r.applied => ApplyOutcome::Applied,
            Ok(r) if r.plan.is_none() => ApplyOutcome::Invalid,
            Ok(_) => ApplyOutcome::Unchanged,
            Err(_) => ApplyOutcome::Refused,
        }
    }
}

/// A fixed-bucket histogram of durations.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; ACK_BUCKETS_SECONDS.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = ACK_BUCKETS_SECONDS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(ACK_BUCKETS_SECONDS.len());
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Relaxed);
        }
        self.sum_us
            .fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }

    fn render(&self, enc: &mut Encoder, name: &str) {
        let mut cumulative = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Relaxed);
            let le = ACK_BUCKETS_SECONDS
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| le_label(*b));
            enc.sample(&format!("{name}_bucket"), &[("le", &le)], cumulative);
        }
        let sum = Duration::from_micros(self.sum_us.load(Relaxed)).as_secs_f64();
        enc.sample(&format!("{name}_sum"), &[], sum);
        enc.sample(&format!("{name}_count"), &[], cumulative);
    }
}

// === impl Metrics ===

impl Metrics {
    pub(crate) fn on_apply(&self, outcome: ApplyOutcome) {
        if let Some(c) = self.applies.get(outcome as usize) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// Messages about to be sent: config pushes start their clock.
    pub(crate) fn on_send(&self, msg: &crate::encoded::Encoded) {
        if let Some(form) = msg.endpoints_form() {
            let i = form as usize;
            if let (Some(n), Some(b)) = (self.endpoint_pushes.get(i), self.endpoint_bytes.get(i)) {
                n.fetch_add(1, Relaxed);
                b.fetch_add(u64::try_from(msg.len()).unwrap_or(u64::MAX), Relaxed);
            }
            return;
        }
        let Some(nonce) = msg.nonce() else {
            return;
        };
        self.pushes.fetch_add(1, Relaxed);
        if let Ok(mut pending) = self.pending.lock() {
            if pending.len() >= MAX_PENDING {
                let mut by_age: Vec<(String, Instant)> = pending.drain().collect();
                by_age.sort_by_key(|(_, at)| std::cmp::Reverse(*at));
                pending.extend(by_age.into_iter().take(MAX_PENDING / 2));
            }
            pending.insert(nonce.to_owned(), Instant::now());
        }
    }

    /// Something an agent sent was over `cap`.
    pub(crate) fn on_agent_refused(&self, cap: AgentCap) {
        if let Some(c) = self.agent_refusals.get(cap as usize) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// A new agent stream was refused by `--agent-admissions-per-second`.
    pub(crate) fn on_admission_refused(&self) {
        self.admissions_refused.fetch_add(1, Relaxed);
    }

    pub(crate) fn on_agents_pruned(&self, n: usize) {
        self.agents_pruned
            .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Relaxed);
    }

    /// A message from an agent: an ACK or NACK stops its push's clock.
    pub(crate) fn on_agent_message(&self, msg: &pb::agent_message::Msg) {
        let nonce = match msg {
            pb::agent_message::Msg::Ack(ack) => {
                self.acks.fetch_add(1, Relaxed);
                &ack.nonce
            }
            pb::agent_message::Msg::Nack(nack) => {
                self.nacks.fetch_add(1, Relaxed);
                &nack.nonce
            }
            _ => return,
        };
        let sent = self.pending.lock().ok().and_then(|mut p| p.remove(nonce));
        if let Some(sent) = sent {
            self.answered.observe(sent.elapsed());
        }
    }

    /// Every family, with the state of `view`; `leader`: this govd is the
    /// elected leader (a lone govd always is).
    pub(crate) fn render(&self, view: &pb::ClusterView, leader: bool) -> String {
        let mut enc = Encoder::default();
        render_view(&mut enc, view, leader);
        enc.family(
            "govd_applies_total",
            "counter",
            "Applies (not dry runs) by outcome: applied, unchanged, invalid, refused.",
        );
        for outcome in ApplyOutcome::ALL {
            let n = self
                .applies
                .get(outcome as usize)
                .map_or(0, |c| c.load(Relaxed));
            enc.sample("govd_applies_total", &[("result", outcome.label())], n);
        }
        enc.family(
            "govd_config_pushes_total",
            "counter",
            "Configs sent to agents (each answered by an ACK or a NACK).",
        );
        enc.sample("govd_config_pushes_total", &[], self.pushes.load(Relaxed));
        let forms = [
            (EndpointsForm::Full, "full"),
            (EndpointsForm::Delta, "delta"),
        ];
        enc.family(
            "govd_endpoint_pushes_total",
            "counter",
            "Endpoint sets sent to agents, by form: full (the whole set) or delta (one change onto the version the agent acknowledged).",
        );
        for (form, label) in forms {
            let n = self
                .endpoint_pushes
                .get(form as usize)
                .map_or(0, |c| c.load(Relaxed));
            enc.sample("govd_endpoint_pushes_total", &[("form", label)], n);
        }
        enc.family(
            "govd_endpoint_push_bytes_total",
            "counter",
            "Bytes of the endpoint sets sent to agents (encoded messages), by form.",
        );
        for (form, label) in forms {
            let n = self
                .endpoint_bytes
                .get(form as usize)
                .map_or(0, |c| c.load(Relaxed));
            enc.sample("govd_endpoint_push_bytes_total", &[("form", label)], n);
        }
        enc.family(
            "govd_config_acks_total",
            "counter",
            "ACKs received from agents.",
        );
        enc.sample("govd_config_acks_total", &[], self.acks.load(Relaxed));
        enc.family(
            "govd_config_nacks_total",
            "counter",
            "NACKs received from agents (a config they refused).",
        );
        enc.sample("govd_config_nacks_total", &[], self.nacks.load(Relaxed));
        enc.family(
            "govd_agent_refusals_total",
            "counter",
            "What agents sent over a cap, by cap: agents_per_service and label_bytes (hello refused), string_bytes (hello refused, or an event's reason cut).",
        );
        for cap in AgentCap::ALL {
            let n = self
                .agent_refusals
                .get(cap as usize)
                .map_or(0, |c| c.load(Relaxed));
            enc.sample("govd_agent_refusals_total", &[("limit", cap.label())], n);
        }
        enc.family(
            "govd_agent_admissions_refused_total",
            "counter",
            "New agent streams refused because their turn under --agent-admissions-per-second was more than 3 s away (each agent retries after its backoff).",
        );
        enc.sample(
            "govd_agent_admissions_refused_total",
            &[],
            self.admissions_refused.load(Relaxed),
        );
        enc.family(
            "govd_agents_pruned_total",
            "counter",
            "Disconnected instances forgotten after --agent-retention (audited as agents-pruned).",
        );
        enc.sample(
            "govd_agents_pruned_total",
            &[],
            self.agents_pruned.load(Relaxed),
        );
        enc.family(
            "govd_config_answer_seconds",
            "histogram",
            "Time from a config push to the agent's ACK or NACK.",
        );
        self.answered.render(&mut enc, "govd_config_answer_seconds");
        self.connections.render(&mut enc);
        self.watches.render(&mut enc);
        gov_common::prom::render_process(&mut enc);
        enc.finish()
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown`; each scrape's
/// text is `scrape()` ([`ControlPlane::metrics_text`] for govd).
///
/// [`ControlPlane::metrics_text`]: crate::ControlPlane::metrics_text
pub async fn serve_metrics<F>(listener: TcpListener, scrape: F, shutdown: CancellationToken)
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let scrape = scrape.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let scrape = scrape.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(&scrape, &req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
}

fn respond<B>(scrape: &impl Fn() -> String, req: &Request<B>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            scrape(),
        ),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "method not allowed\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: try /metrics\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

/// govd's build, leadership and store, and the agents, fuses and limits of
/// `view`.
fn render_view(enc: &mut Encoder, view: &pb::ClusterView, leader: bool) {
    enc.family(
        "govd_build_info",
        "gauge",
        "Always 1; govd's version is in the label.",
    );
    enc.sample(
        "govd_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1_u64,
    );
    enc.family(
        "govd_leader",
        "gauge",
        "1 while this govd is the elected leader (runs the release after timer); a lone govd always is.",
    );
    enc.sample("govd_leader", &[], u64::from(leader));
    let store = view.store.clone().unwrap_or_default();
    enc.family(
        "govd_store_reachable",
        "gauge",
        "1 while the store takes writes as far as this govd knows; 0 after a write of the state failed, or on etcd a call that needs the quorum (govd reads the leader key every 2s).",
    );
    enc.sample("govd_store_reachable", &[], u64::from(store.writable));
    enc.family(
        "govd_store_last_write_timestamp_seconds",
        "gauge",
        "Unix time of this govd's last successful write of the state; 0: none since it started.",
    );
    let last_write = Duration::from_millis(store.last_write_unix_ms).as_secs_f64();
    enc.sample("govd_store_last_write_timestamp_seconds", &[], last_write);
    enc.family(
        "govd_agents",
        "gauge",
        "Agents known to govd, by sync state (as govc status shows them).",
    );
    for state in pb::SyncState::STATES {
        let n = view.agents.iter().filter(|a| a.state() == state).count() as u64;
        enc.sample("govd_agents", &[("state", state.word())], n);
    }
    enc.family(
        "govd_fuses_tripped",
        "gauge",
        "Fuses govd holds tripped (open or half-open), by rule.",
    );
    for fuse in &view.fuses {
        enc.sample("govd_fuses_tripped", &[("rule", &fuse.rule)], 1_u64);
    }
    enc.family(
        "govd_fuse_tripped_seconds",
        "gauge",
        "How long each tripped fuse has been tripped, by rule.",
    );
    for fuse in &view.fuses {
        enc.sample(
            "govd_fuse_tripped_seconds",
            &[("rule", &fuse.rule)],
            view.at_unix_ms.saturating_sub(fuse.since_unix_ms) as f64 / 1000.0,
        );
    }
    enc.family(
        "govd_limits_engaged",
        "gauge",
        "Limits govd holds engaged, by rule.",
    );
    for limit in &view.limits {
        enc.sample("govd_limits_engaged", &[("rule", &limit.rule)], 1_u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(nonce: &str) -> crate::encoded::Encoded {
        crate::encoded::Encoded::new(&pb::ControlMessage {
            msg: Some(pb::control_message::Msg::Config(pb::Config {
                target: None,
                nonce: nonce.into(),
            })),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_push_answered_later_lands_in_its_bucket_and_counts_once() {
        let m = Metrics::default();
        m.on_send(&config("n1"));
        m.on_send(&config("n2"));
        tokio::time::advance(Duration::from_millis(30)).await;
        m.on_agent_message(&pb::agent_message::Msg::Ack(pb::Ack {
            version: "v".into(),
            nonce: "n1".into(),
            ..Default::default()
        }));
        m.on_agent_message(&pb::agent_message::Msg::Nack(pb::Nack {
            nonce: "n2".into(),
            ..Default::default()
        }));
        // An answer to an unknown push counts, but has no time.
        m.on_agent_message(&pb::agent_message::Msg::Ack(pb::Ack::default()));
        m.on_apply(ApplyOutcome::Applied);
        // Endpoint sets are counted apart, by form, with their bytes.
        let endpoints = |msg| crate::encoded::Encoded::new(&pb::ControlMessage { msg: Some(msg) });
        let full = endpoints(pb::control_message::Msg::Endpoints(pb::Endpoints {
            service: "inv".into(),
            ..Default::default()
        }));
        let delta = endpoints(pb::control_message::Msg::EndpointsDelta(
            pb::EndpointsDelta {
                service: "inv".into(),
                removed: vec!["a".into()],
                ..Default::default()
            },
        ));
        m.on_send(&full);
        m.on_send(&delta);
        m.on_send(&delta);
        let text = m.render(&pb::ClusterView::default(), true);
        let full_bytes = format!(
            "govd_endpoint_push_bytes_total{{form=\"full\"}} {}\n",
            full.len()
        );
        let delta_bytes = format!(
            "govd_endpoint_push_bytes_total{{form=\"delta\"}} {}\n",
            2 * delta.len()
        );
        for line in [full_bytes.as_str(), delta_bytes.as_str()] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        for line in [
            "govd_config_pushes_total 2\n",
            "govd_endpoint_pushes_total{form=\"full\"} 1\n",
            "govd_endpoint_pushes_total{form=\"delta\"} 2\n",
            "govd_config_acks_total 2\n",
            "govd_config_nacks_total 1\n",
            "govd_config_answer_seconds_bucket{le=\"0.025\"} 0\n",
            "govd_config_answer_seconds_bucket{le=\"0.05\"} 2\n",
            "govd_config_answer_seconds_count 2\n",
            "govd_config_answer_seconds_sum 0.06\n",
            "govd_applies_total{result=\"applied\"} 1\n",
            "govd_applies_total{result=\"refused\"} 0\n",
            "govd_agents{state=\"SYNCED\"} 0\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn outcomes_of_apply_results() {
        let applied = pb::ApplyResult {
            applied: true,
            ..Default::default()
        };
        let invalid = pb::ApplyResult::default();
        let unchanged = pb::ApplyResult {
            plan: Some(pb::Plan::default()),
            ..Default::default()
        };
        assert_eq!(ApplyOutcome::of::<()>(&Ok(applied)), ApplyOutcome::Applied);
        assert_eq!(ApplyOutcome::of::<()>(&Ok(invalid)), ApplyOutcome::Invalid);
        assert_eq!(
            ApplyOutcome::of::<()>(&Ok(unchanged)),
            ApplyOutcome::Unchanged
        );
        assert_eq!(
            ApplyOutcome::of(&Err::<pb::ApplyResult, _>(())),
            ApplyOutcome::Refused
        );
    }
}
