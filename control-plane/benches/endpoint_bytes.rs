//! Bytes govd queues to agents for one change of one instance in a service
//! of N instances (issue 35): the whole `Endpoints` set, which every agent
//! got before and an agent older than deltas still gets, against the
//! `EndpointsDelta` an agent that applies deltas gets once it acknowledged
//! the set before. govd's in-memory state (`State`) as its streams drive it,
//! with no network: the figure is the encoded messages queued (what goes on
//! each stream, before gRPC and HTTP/2 framing). Bytes do not depend on the
//! build profile (hence `--profile dev`).
//!
//! For each N: N instances of `inv` register (each an agent that applies
//! deltas, as in a real fleet every connected agent gets every push), with
//! two callers, `new` (applies deltas) and `old` (an agent older than
//! deltas: the whole set, as every agent before); every agent acknowledges
//! the set; then one instance joins, and then it leaves.
//!
//! ```text
//! cargo bench -j2 --profile dev -p gov-control-plane --bench endpoint_bytes -- [N...]
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly"
)]

use gov_control_plane::state::{AgentKey, Outbox, State};
use gov_proto::v1 as pb;
use pb::agent_message::Msg as AgentMsg;
use tokio::sync::mpsc;

struct Fleet {
    s: State,
    /// Every agent's stream: (key, connection).
    streams: Vec<(AgentKey, u64)>,
    tx: gov_control_plane::state::AgentTx,
    _rx: mpsc::Receiver<Box<gov_control_plane::encoded::Encoded>>,
}

fn lifecycle(phase: pb::Phase) -> AgentMsg {
    AgentMsg::Lifecycle(pb::Lifecycle {
        phase: phase as i32,
        weight_milli_percent: 0,
    })
}

fn ack(version: u64) -> AgentMsg {
    AgentMsg::EndpointsAck(pb::EndpointsAck {
        service: "inv".into(),
        version,
        want_full: false,
    })
}

impl Fleet {
    fn hello(&mut self, service: &str, instance: &str, deltas: bool) -> (AgentKey, u64) {
        let hello = pb::Hello {
            service: service.into(),
            instance: instance.into(),
            address: format!("10.{}.{}.7:8080", instance.len(), self.streams.len() % 250),
            endpoint_deltas: deltas,
            ..Default::default()
        };
        let mut out = Vec::new();
        let stream = self.s.hello(hello, self.tx.clone(), 1, &mut out);
        self.streams.push(stream.clone());
        stream
    }

    /// Every agent acknowledges `version`.
    fn all_ack(&mut self, version: u64) {
        for (key, id) in &self.streams {
            self.s.on_message(key, *id, ack(version), 2);
        }
    }

    /// `who` says `phase`; the pushes it causes.
    fn change(&mut self, who: &(AgentKey, u64), phase: pb::Phase) -> Outbox {
        self.s.on_message(&who.0, who.1, lifecycle(phase), 3);
        let mut out = Vec::new();
        self.s.endpoint_pushes(&mut out);
        out
    }
}

fn bytes_to(out: &Outbox, instance: &str) -> usize {
    out.iter()
        .filter(|o| o.key.1 == instance)
        .map(|o| o.msg.len())
        .sum()
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![10, 100, 1000]
    } else {
        sizes
    };
    println!(
        "| instances | change | to one agent: whole set (before) | delta (after) | to all agents: before | after |"
    );
    println!("|---|---|---|---|---|---|");
    for n in sizes {
        let (tx, rx) = mpsc::channel(8);
        let mut f = Fleet {
            s: State::default(),
            streams: Vec::new(),
            tx,
            _rx: rx,
        };
        f.hello("web", "old", false);
        f.hello("web", "new", true);
        for i in 0..n {
            let who = f.hello("inv", &format!("inv-{i:05}"), true);
            f.s.on_message(&who.0, who.1, lifecycle(pb::Phase::Ready), 2);
        }
        let mut out = Vec::new();
        f.s.endpoint_pushes(&mut out);
        let joining = f.hello("inv", "inv-joining", true);
        f.all_ack(1);
        let join = f.change(&joining, pb::Phase::Ready);
        f.all_ack(2);
        let leave = f.change(&joining, pb::Phase::Draining);
        for (what, out) in [("join", &join), ("leave", &leave)] {
            // Before: every agent got the whole set, as `old` still does.
            let before = bytes_to(out, "old") * f.streams.len();
            let after: usize = out.iter().map(|o| o.msg.len()).sum();
            println!(
                "| {n} | {what} | {} | {} | {before} | {after} |",
                bytes_to(out, "old"),
                bytes_to(out, "new"),
            );
        }
    }
}
