//! What agents may make govd hold: instances per service, label bytes per
//! agent, the length of every string an agent sends (service, instance,
//! address, label, event reason), and how long govd remembers an instance
//! that went away. Checked on `Connect` before the hello touches the state,
//! so a flood of agents (or one agent with megabytes of labels) cannot grow
//! `state.json`, the status view or govd's memory without bound. Each
//! refusal is counted in `/metrics` by cap (`govd_agent_refusals_total`).

use std::time::Duration;

use gov_proto::v1 as pb;

/// The caps, with their `govd` flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentLimits {
    /// Instances known per service, connected or not
    /// (`--max-agents-per-service`).
    pub max_agents_per_service: usize,
    /// Label keys and values of one agent together
    /// (`--max-agent-label-bytes`).
    pub max_label_bytes: usize,
    /// One string an agent sends: service, instance, address, a label, an
    /// event reason (`--max-agent-string-bytes`).
    pub max_string_bytes: usize,
    /// An instance not heard from this long is forgotten: its name is free
    /// again (`--agent-retention`).
    pub retention: Duration,
}

/// Which cap refused something: the label of `govd_agent_refusals_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentCap {
    AgentsPerService,
    LabelBytes,
    StringBytes,
}

/// A hello over one of the caps: what the agent is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverCap {
    pub cap: AgentCap,
    pub message: String,
}

// === impl AgentLimits ===

impl Default for AgentLimits {
    fn default() -> Self {
        Self {
            max_agents_per_service: 1_000,
            max_label_bytes: 16 << 10,
            max_string_bytes: 512,
            retention: Duration::from_secs(24 * 3600),
        }
    }
}

impl AgentLimits {
    /// Whether `hello`'s strings and labels are within the caps.
    pub fn check_hello(&self, hello: &pb::Hello) -> Result<(), OverCap> {
        let max = self.max_string_bytes;
        for (what, value) in [
            ("service", &hello.service),
            ("instance", &hello.instance),
            ("address", &hello.address),
            ("last version", &hello.last_version),
        ] {
            if value.len() > max {
                return Err(OverCap {
                    cap: AgentCap::StringBytes,
                    message: format!(
                        "the hello's {what} is {} bytes, over govd's {max} (--max-agent-string-bytes)",
                        value.len()
                    ),
                });
            }
        }
        let mut total = 0_usize;
        for (key, value) in &hello.labels {
            if key.len() > max || value.len() > max {
                return Err(OverCap {
                    cap: AgentCap::StringBytes,
                    message: format!(
                        "the label `{}` is over govd's {max} bytes (--max-agent-string-bytes)",
                        truncated(key, 64)
                    ),
                });
            }
            total = total.saturating_add(key.len()).saturating_add(value.len());
        }
        if total > self.max_label_bytes {
            return Err(OverCap {
                cap: AgentCap::LabelBytes,
                message: format!(
                    "the agent's labels are {total} bytes, over govd's {} (--max-agent-label-bytes)",
                    self.max_label_bytes
                ),
            });
        }
        Ok(())
    }

    /// `event` with its reason cut to the cap (a trip is never dropped for
    /// its reason); whether it was cut.
    pub fn bound_event(&self, event: &mut pb::Event) -> bool {
        let mut cut = false;
        for s in [&mut event.reason, &mut event.rule, &mut event.key] {
            if s.len() > self.max_string_bytes {
                *s = truncated(s, self.max_string_bytes).to_owned();
                cut = true;
            }
        }
        cut
    }

    /// The retention in milliseconds.
    pub fn retention_ms(&self) -> u64 {
        u64::try_from(self.retention.as_millis()).unwrap_or(u64::MAX)
    }
}

// === impl AgentCap ===

impl AgentCap {
    pub const ALL: [AgentCap; 3] = [
        AgentCap::AgentsPerService,
        AgentCap::LabelBytes,
        AgentCap::StringBytes,
    ];

    pub fn label(self) -> &'static str {
        match self {
            AgentCap::AgentsPerService => "agents_per_service",
            AgentCap::LabelBytes => "label_bytes",
            AgentCap::StringBytes => "string_bytes",
        }
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
fn truncated(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> pb::Hello {
        pb::Hello {
            service: "order".into(),
            instance: "order-1".into(),
            address: "10.0.0.1:8080".into(),
            ..Default::default()
        }
    }

    #[test]
    fn strings_and_labels_over_the_caps_are_refused_with_the_flag() {
        let limits = AgentLimits {
            max_label_bytes: 100,
            max_string_bytes: 40,
            ..AgentLimits::default()
        };
        assert!(limits.check_hello(&hello()).is_ok());
        let mut long = hello();
        long.instance = "x".repeat(41);
        let over = limits.check_hello(&long).unwrap_err();
        assert_eq!(over.cap, AgentCap::StringBytes);
        assert!(
            over.message
                .contains("instance is 41 bytes, over govd's 40"),
            "{}",
            over.message
        );
        let mut labels = hello();
        for i in 0..4 {
            labels.labels.insert(format!("k{i}"), "v".repeat(30));
        }
        let over = limits.check_hello(&labels).unwrap_err();
        assert_eq!(over.cap, AgentCap::LabelBytes);
        assert!(
            over.message.contains("--max-agent-label-bytes"),
            "{}",
            over.message
        );
    }

    #[test]
    fn an_event_reason_is_cut_on_a_character_boundary_never_dropped() {
        let limits = AgentLimits {
            max_string_bytes: 5,
            ..AgentLimits::default()
        };
        let mut event = pb::Event {
            rule: "o/e".into(),
            reason: "ééé".into(),
            ..Default::default()
        };
        assert!(limits.bound_event(&mut event));
        assert_eq!(event.reason, "éé");
        assert!(!limits.bound_event(&mut event));
    }
}
