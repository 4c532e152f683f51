//! Endpoint deltas (issue 35): which agent gets a delta and which the whole
//! set, through the state's API as the streams drive it.

use gov_proto::v1 as pb;
use pb::agent_message::Msg as AgentMsg;
use pb::control_message::Msg;
use tokio::sync::mpsc;

use crate::state::{AgentKey, Outbox, State};

/// What one agent was sent: a whole set (version, ids) or a delta (base,
/// version, upserted ids, removed ids).
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    Full(u64, Vec<String>),
    Delta(u64, u64, Vec<String>, Vec<String>),
}

fn full(version: u64, ids: &[&str]) -> Sent {
    Sent::Full(version, ids.iter().map(|s| (*s).to_owned()).collect())
}

fn delta(base: u64, version: u64, up: &[&str], rm: &[&str]) -> Sent {
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    Sent::Delta(base, version, own(up), own(rm))
}

/// The endpoint messages of `out` to `instance`, in order.
fn sent_to(out: &Outbox, instance: &str) -> Vec<Sent> {
    out.iter()
        .filter(|o| o.key.1 == instance)
        .filter_map(|o| match o.msg.message().msg {
            Some(Msg::Endpoints(e)) => Some(Sent::Full(
                e.version,
                e.instances.into_iter().map(|i| i.instance).collect(),
            )),
            Some(Msg::EndpointsDelta(d)) => Some(Sent::Delta(
                d.base_version,
                d.version,
                d.upserted.into_iter().map(|i| i.instance).collect(),
                d.removed,
            )),
            _ => None,
        })
        .collect()
}

struct Fleet {
    s: State,
    tx: mpsc::Sender<Box<crate::encoded::Encoded>>,
    _rx: mpsc::Receiver<Box<crate::encoded::Encoded>>,
    streams: Vec<(AgentKey, u64)>,
}

impl Fleet {
    fn new() -> Self {
        let (tx, rx) = mpsc::channel(1024);
        Fleet {
            s: State::default(),
            tx,
            _rx: rx,
            streams: Vec::new(),
        }
    }

    /// A hello of `service/instance` (with an address when it is `inv`);
    /// what it was sent.
    fn hello(&mut self, service: &str, instance: &str, deltas: bool) -> Outbox {
        let hello = pb::Hello {
            service: service.into(),
            instance: instance.into(),
            address: if service == "inv" {
                format!("10.0.0.{}:80", instance.len())
            } else {
                String::new()
            },
            endpoint_deltas: deltas,
            ..Default::default()
        };
        let mut out = Vec::new();
        let (key, id) = self.s.hello(hello, self.tx.clone(), 1, &mut out);
        self.streams.retain(|(k, _)| *k != key);
        self.streams.push((key, id));
        out
    }

    fn stream(&self, instance: &str) -> (AgentKey, u64) {
        self.streams
            .iter()
            .find(|(k, _)| k.1 == instance)
            .cloned()
            .expect("a stream")
    }

    /// `msg` from `instance`, then the pushes it causes.
    fn says(&mut self, instance: &str, msg: AgentMsg) -> Outbox {
        let (key, id) = self.stream(instance);
        self.s.on_message(&key, id, msg, 2);
        let mut out = Vec::new();
        self.s.endpoint_pushes(&mut out);
        out
    }

    fn phase(&mut self, instance: &str, phase: pb::Phase) -> Outbox {
        let msg = AgentMsg::Lifecycle(pb::Lifecycle {
            phase: phase as i32,
            weight_milli_percent: 0,
        });
        self.says(instance, msg)
    }

    fn ack(&mut self, instance: &str, version: u64) -> Outbox {
        self.says(instance, ack(version, false))
    }
}

fn ack(version: u64, want_full: bool) -> AgentMsg {
    AgentMsg::EndpointsAck(pb::EndpointsAck {
        service: "inv".into(),
        version,
        want_full,
    })
}

/// Callers `new` (applies deltas) and `old` (an agent older than deltas),
/// instance `a` registered as version 1, acknowledged by both.
fn two_callers_one_instance() -> Fleet {
    let mut f = Fleet::new();
    f.hello("web", "new", true);
    f.hello("web", "old", false);
    f.hello("inv", "a", true);
    let out = f.phase("a", pb::Phase::Ready);
    assert_eq!(
        sent_to(&out, "new"),
        [full(1, &["a"])],
        "the first set is whole"
    );
    f.ack("new", 1);
    f.ack("old", 1);
    f.ack("a", 1);
    f
}

#[test]
fn a_delta_goes_only_to_an_agent_that_applies_deltas_and_acked_its_base() {
    let mut f = two_callers_one_instance();
    f.hello("inv", "bb", true);
    let out = f.phase("bb", pb::Phase::Ready);
    assert_eq!(sent_to(&out, "new"), [delta(1, 2, &["bb"], &[])]);
    assert_eq!(sent_to(&out, "old"), [full(2, &["a", "bb"])]);
    // One delta encoding shared by every agent it goes to.
    let deltas: Vec<_> = out
        .iter()
        .filter(|o| matches!(o.msg.message().msg, Some(Msg::EndpointsDelta(_))))
        .collect();
    assert_eq!(
        deltas.len(),
        2,
        "to `new` and `a` (`bb` acked nothing: whole)"
    );
    assert!(
        deltas
            .windows(2)
            .all(|w| w[0].msg.shared().as_ptr() == w[1].msg.shared().as_ptr())
    );
    assert_eq!(sent_to(&out, "bb"), [full(2, &["a", "bb"])]);
    // `a` leaves: a removal in a delta.
    f.ack("new", 2);
    let out = f.phase("a", pb::Phase::Draining);
    assert_eq!(sent_to(&out, "new"), [delta(2, 3, &[], &["a"])]);
    assert_eq!(sent_to(&out, "old"), [full(3, &["bb"])]);
}

#[test]
fn a_lost_ack_gets_the_whole_set_and_so_does_an_agent_that_asks() {
    let mut f = two_callers_one_instance();
    f.hello("inv", "bb", true);
    let out = f.phase("bb", pb::Phase::Ready);
    assert_eq!(sent_to(&out, "new"), [delta(1, 2, &["bb"], &[])]);
    // Its ACK of 2 is lost (or not there yet): 3 is not a delta onto 2 for it.
    f.hello("inv", "ccc", true);
    let out = f.phase("ccc", pb::Phase::Ready);
    assert_eq!(sent_to(&out, "new"), [full(3, &["a", "bb", "ccc"])]);
    // An agent that could not apply a delta names the version it holds and
    // asks: the whole set of the version govd is at goes to it alone.
    let out = f.says("new", ack(2, true));
    assert_eq!(sent_to(&out, "new"), [full(3, &["a", "bb", "ccc"])]);
    assert!(
        sent_to(&out, "old").is_empty(),
        "only to the agent that asked"
    );
    f.ack("new", 3);
    // It holds 3 (acknowledged): asking again sends nothing.
    let out = f.says("new", ack(0, true));
    assert!(sent_to(&out, "new").is_empty());
    // Its acknowledgement never goes back for the ask: 4 is a delta onto 3.
    let out = f.phase("bb", pb::Phase::Draining);
    assert_eq!(sent_to(&out, "new"), [delta(3, 4, &[], &["bb"])]);
}

#[test]
fn a_reconnect_gets_the_whole_set_as_last_pushed_then_deltas_once_acked() {
    let mut f = two_callers_one_instance();
    f.hello("inv", "bb", true);
    f.phase("bb", pb::Phase::Ready);
    f.ack("new", 2);
    // A new stream of `new`: its versions start over, the hello brings the set.
    let out = f.hello("web", "new", true);
    assert_eq!(sent_to(&out, "new"), [full(2, &["a", "bb"])]);
    // Before it acknowledges on this stream: whole.
    f.hello("inv", "ccc", true);
    let out = f.phase("ccc", pb::Phase::Ready);
    assert_eq!(sent_to(&out, "new"), [full(3, &["a", "bb", "ccc"])]);
    f.ack("new", 3);
    let out = f.phase("ccc", pb::Phase::Draining);
    assert_eq!(sent_to(&out, "new"), [delta(3, 4, &[], &["ccc"])]);
    // A hello while a change waits unpushed gets the set of the version it
    // is labelled with (what a delta onto it assumes), not the live one.
    let (key, id) = f.stream("a");
    f.s.on_message(&key, id, lifecycle(pb::Phase::Draining), 3);
    let out = f.hello("web", "late", true);
    assert_eq!(sent_to(&out, "late"), [full(4, &["a", "bb"])]);
    // Its ACK comes before the next push (which sends the change waiting).
    let out = f.ack("late", 4);
    assert_eq!(sent_to(&out, "late"), [delta(4, 5, &[], &["a"])]);
}

fn lifecycle(phase: pb::Phase) -> AgentMsg {
    AgentMsg::Lifecycle(pb::Lifecycle {
        phase: phase as i32,
        weight_milli_percent: 0,
    })
}

#[test]
fn a_removal_sent_as_a_delta_ends_once_every_caller_acked_it() {
    let mut f = two_callers_one_instance();
    f.hello("inv", "bb", true);
    f.phase("bb", pb::Phase::Ready);
    for who in ["new", "old", "a", "bb"] {
        f.ack(who, 2);
    }
    let out = f.phase("a", pb::Phase::Draining);
    assert_eq!(sent_to(&out, "new"), [delta(2, 3, &[], &["a"])]);
    let waiting = |f: &Fleet| {
        let a = f.s.agent(&f.stream("a").0).expect("a");
        f.s.removal_waiting_on(a)
    };
    assert_eq!(waiting(&f), ["inv/bb", "web/new", "web/old"]);
    f.ack("new", 3);
    f.ack("old", 3);
    assert_eq!(waiting(&f), ["inv/bb"]);
    // An ask for the whole set is not an acknowledgement of the set without `a`.
    let out = f.says("bb", ack(2, true));
    assert_eq!(sent_to(&out, "bb"), [full(3, &["bb"])]);
    assert_eq!(waiting(&f), ["inv/bb"]);
    let out = f.ack("bb", 3);
    assert!(waiting(&f).is_empty());
    let told = out.iter().any(|o| {
        o.key.1 == "a"
            && matches!(
                o.msg.message().msg,
                Some(Msg::Command(pb::Command {
                    kind: Some(pb::command::Kind::Deregistered(pb::Deregistered {
                        version: 3
                    }))
                }))
            )
    });
    assert!(told, "`a` hears its removal is acknowledged");
}

#[test]
fn a_stream_that_comes_after_the_last_instance_left_gets_the_empty_set() {
    let mut f = two_callers_one_instance();
    let out = f.phase("a", pb::Phase::Draining);
    // The empty set is smaller than a delta that removes `a`: whole.
    assert_eq!(sent_to(&out, "new"), [full(2, &[])]);
    // A caller connecting now (or again) is told the set is empty: it drops
    // what it kept, and the removal can count its acknowledgement.
    let out = f.hello("web", "late", true);
    assert_eq!(sent_to(&out, "late"), [full(2, &[])]);
    let waiting = |f: &Fleet| {
        let a = f.s.agent(&f.stream("a").0).expect("a");
        f.s.removal_waiting_on(a)
    };
    assert_eq!(waiting(&f), ["web/late", "web/new", "web/old"]);
    f.ack("new", 2);
    f.ack("old", 2);
    assert_eq!(waiting(&f), ["web/late"]);
    f.ack("late", 2);
    assert!(waiting(&f).is_empty());
}

/// Bytes on the wire to one caller for one instance joining a set of `n`:
/// the whole set (what an agent without deltas gets, and every agent got
/// before issue 35) and the delta.
fn bytes_for_one_join(n: usize) -> (usize, usize) {
    let mut f = Fleet::new();
    f.hello("web", "new", true);
    f.hello("web", "old", false);
    for i in 0..n {
        let id = format!("inv-{i:05}");
        f.hello("inv", &id, false);
        let (key, conn) = f.stream(&id);
        f.s.on_message(&key, conn, lifecycle(pb::Phase::Ready), 2);
    }
    let mut out = Vec::new();
    f.s.endpoint_pushes(&mut out);
    f.ack("new", 1);
    f.hello("inv", "inv-joining", false);
    let out = f.phase("inv-joining", pb::Phase::Ready);
    let len = |who: &str| {
        out.iter()
            .filter(|o| o.key.1 == who)
            .map(|o| o.msg.len())
            .sum::<usize>()
    };
    (len("old"), len("new"))
}

#[test]
fn one_join_costs_a_callers_stream_bytes_independent_of_the_set() {
    let (full_10, delta_10) = bytes_for_one_join(10);
    let (full_1000, delta_1000) = bytes_for_one_join(1000);
    assert!(
        full_1000 > 50 * full_10 && full_1000 > 20_000,
        "{full_10} {full_1000}"
    );
    // The delta carries one instance whatever the set: same size to a byte
    // or two (the version varints).
    assert!(delta_1000 <= delta_10 + 2, "{delta_10} {delta_1000}");
    assert!(delta_10 < full_10 / 5, "{delta_10} {full_10}");
}
