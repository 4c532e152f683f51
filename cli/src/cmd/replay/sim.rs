//! One replay: the agents' own engine ([`gov_engine::Engine`]) deciding the
//! recorded calls of one agent again, in virtual time.
//!
//! A current-thread Tokio runtime with a paused clock runs the engine; the
//! clock is advanced to each event in order: a rule's epoch (the rule is
//! created then, so its windows line up with the live agent's), a call's
//! arrival (decided with `try_admit`), a call's outcome (recorded with its
//! status when the live agent recorded it, at the response head) and its
//! end (its recorded latency: the admission dropped, giving its permits
//! back), both less what the call waited live. A call that has to wait for
//! a permit waits in a task of its own, as it would in the agent.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::rc::Rc;
use std::time::Duration;

use gov_engine::{
    Admission, CompiledConfig, Decision, Engine, EventKind, Headers, Outcome, Pending, Rejection,
    RequestInfo, Target,
};
use gov_proto::decision_log as log;
use gov_proto::v1::TargetConfig;
use tokio::time::Instant;

use super::calls::{Call, Calls, Live, NONE};

/// What one call got in a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Got {
    Admitted,
    /// By this rule (an index into [`Outcomes::rules`]) for this reason (a [`gov_engine::RejectReason`] index).
    Rejected {
        rule: u32,
        reason: u8,
    },
}

/// The rules of a replayed config by name, and their indices.
#[derive(Debug, Default)]
struct RuleIds(std::collections::HashMap<std::sync::Arc<str>, u32>);

impl RuleIds {
    fn get(&self, name: &str) -> u32 {
        self.0.get(name).copied().unwrap_or(NONE)
    }
}

/// A latch, a trip or a release seen in a replay.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at_us: u64,
    pub kind: EventKind,
    pub rule: String,
    pub key: String,
    pub reason: String,
}

/// What a replay of one agent's calls produced.
#[derive(Debug, Default)]
pub struct Outcomes {
    /// The rules of the replayed config, in order: what `Got::Rejected` and
    /// `admitted_by` point into.
    pub rules: Vec<String>,
    /// By call index (of the calls replayed).
    pub got: Vec<(usize, Got)>,
    /// Per admitted call, the rules that admitted it and whether it waited.
    pub admitted_by: Vec<(usize, Vec<(u32, bool)>)>,
    pub events: Vec<Seen>,
    /// Calls whose end is not known (the live policy rejected them, this
    /// one admits them): ended at once, without an outcome.
    pub unknown_end: u64,
    /// Every move of an adaptive bulkhead's limit: (rule, Unix µs, limit),
    /// its first value when the rule starts deciding.
    pub limits: Vec<(u32, u64, u32)>,
}

/// What happens to a held call at a time in the replay; at one instant
/// an outcome comes before an end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Outcome,
    End,
}

/// An admitted call waiting for its end.
struct Held {
    admission: Admission,
    outcome: Option<Outcome>,
    response_bytes: u64,
}

/// Replays `order` (indices into `calls`, sorted by arrival) of one agent
/// under `target`, the rules created at `epochs` (Unix µs) when they come
/// before the first call.
pub fn replay(
    target: &TargetConfig,
    calls: &Calls,
    order: &[usize],
    epochs: &BTreeMap<String, u64>,
) -> Result<Outcomes, gov_engine::InvalidConfig> {
    let full = CompiledConfig::try_from(target)?;
    let Some(&first) = order.first() else {
        return Ok(Outcomes::default());
    };
    let start_us = calls.list[first].t_us;
    // Rules created before the first call, oldest first.
    let mut staged: Vec<(u64, &str)> = target
        .rules
        .iter()
        .filter_map(|r| {
            let t = *epochs.get(&r.name)?;
            (t <= start_us).then_some((t, r.name.as_str()))
        })
        .collect();
    staged.sort();
    let t0_us = staged.first().map_or(start_us, |s| s.0);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(_) => return Ok(Outcomes::default()),
    };
    let staged_configs = staged
        .iter()
        .map(|&(t, _)| {
            let mut subset = target.clone();
            subset
                .rules
                .retain(|r| staged.iter().any(|&(u, name)| u <= t && name == r.name));
            CompiledConfig::try_from(&subset).map(|c| (t, c))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // The adaptive bulkheads, whose limit the replay follows.
    let adaptive: Vec<String> = target
        .rules
        .iter()
        .filter(|r| {
            matches!(&r.spec, Some(gov_proto::v1::rule::Spec::Bulkhead(b)) if b.adaptive.is_some())
        })
        .map(|r| r.name.clone())
        .collect();
    Ok(runtime.block_on(run(full, staged_configs, calls, order, t0_us, &adaptive)))
}

async fn run(
    full: CompiledConfig,
    staged: Vec<(u64, CompiledConfig)>,
    calls: &Calls,
    order: &[usize],
    t0_us: u64,
    adaptive: &[String],
) -> Outcomes {
    let base = Instant::now();
    let at = |t_us: u64| base + Duration::from_micros(t_us.saturating_sub(t0_us));
    let ids = Rc::new(RuleIds(
        full.rules
            .iter()
            .enumerate()
            .map(|(i, r)| (r.name.clone(), u32::try_from(i).unwrap_or(NONE)))
            .collect(),
    ));
    let out = Rc::new(RefCell::new(Outcomes {
        rules: full.rules.iter().map(|r| r.name.to_string()).collect(),
        ..Outcomes::default()
    }));
    let engine = Engine::empty(&full.service);
    let consumer_header = full.consumer_header.clone();
    let mut full = Some(full);
    let mut events = engine.subscribe();
    for (t, config) in staged {
        advance_to(at(t)).await;
        engine.apply(config);
    }
    let mut steps: BinaryHeap<Reverse<(Instant, Step, usize)>> = BinaryHeap::new();
    let mut held: Vec<Option<Held>> = Vec::new();
    // Slots of `held` whose call ended, for the next admitted call.
    let mut free: Vec<usize> = Vec::new();
    let local = tokio::task::LocalSet::new();
    let mut limits = Limits::new(&ids, adaptive);
    local
        .run_until(async {
            for &i in order {
                let call = &calls.list[i];
                let arrival = at(call.t_us);
                // Every outcome and end before this arrival, in time order.
                while let Some(Reverse((when, step, slot))) = steps.peek().copied() {
                    if when > arrival {
                        break;
                    }
                    steps.pop();
                    advance_to(when).await;
                    take_step(&mut held, &mut free, step, slot);
                    tokio::task::yield_now().await;
                    drain_events(&mut events, &out, t0_us, base);
                    limits.sample(&engine, t0_us, base, &out);
                }
                advance_to(arrival).await;
                if let Some(full) = full.take() {
                    engine.apply(full);
                }
                drain_events(&mut events, &out, t0_us, base);
                limits.sample(&engine, t0_us, base, &out);
                let mut raw = [httparse::EMPTY_HEADER; 9];
                let n = call_headers(calls, call, consumer_header.as_str(), &mut raw);
                let info = request_info(calls, call, &raw[..n]);
                let outcome = outcome_of(call);
                match engine.try_admit(&info) {
                    Decision::Admitted(admission) => {
                        admitted(&out, &ids, i, &admission);
                        let hold = hold_for(call, &out);
                        let h = Some(Held {
                            admission,
                            outcome,
                            response_bytes: call.response_bytes,
                        });
                        let slot = hold_slot(&mut held, &mut free, h);
                        steps.push(Reverse((arrival + hold.outcome, Step::Outcome, slot)));
                        steps.push(Reverse((arrival + hold.end, Step::End, slot)));
                        if let Some(h) = held[slot].as_ref() {
                            h.admission.add_bytes(call.request_bytes);
                        }
                    }
                    Decision::Rejected(r) => rejected(&out, &ids, i, &r),
                    Decision::Wait(pending) => {
                        let out = out.clone();
                        let hold = hold_for(call, &out);
                        let (req, resp) = (call.request_bytes, call.response_bytes);
                        let ids = ids.clone();
                        tokio::task::spawn_local(async move {
                            let waited = Waited {
                                i,
                                outcome,
                                hold,
                                req,
                                resp,
                            };
                            wait_for(pending, waited, &out, &ids).await;
                        });
                        tokio::task::yield_now().await;
                    }
                }
                drain_events(&mut events, &out, t0_us, base);
            }
            // The calls still held end in time order; then the waiters finish.
            while let Some(Reverse((when, step, slot))) = steps.pop() {
                advance_to(when).await;
                take_step(&mut held, &mut free, step, slot);
                tokio::task::yield_now().await;
                drain_events(&mut events, &out, t0_us, base);
                limits.sample(&engine, t0_us, base, &out);
            }
        })
        .await;
    // Waiters left: let their timers run out (the runtime advances the
    // paused clock itself when it is idle).
    local.await;
    drain_events(&mut events, &out, t0_us, base);
    limits.last = None;
    limits.sample(&engine, t0_us, base, &out);
    Rc::try_unwrap(out)
        .map(RefCell::into_inner)
        .unwrap_or_else(|rc| std::mem::take(&mut *rc.borrow_mut()))
}

/// What the engine judges of a recorded call, with its headers.
fn request_info<'c>(
    calls: &'c Calls,
    call: &Call,
    raw: &'c [httparse::Header<'c>],
) -> RequestInfo<'c> {
    RequestInfo {
        direction: call.direction,
        method: &calls.methods[call.method as usize],
        path: calls.strings.get(call.path),
        // Recorded calls keep no query, and no token's claims.
        query: "",
        claims: &[],
        headers: Headers::Raw(raw),
        target: (call.target != NONE).then(|| Target {
            service: calls.strings.get(call.target),
            instance: (call.upstream != NONE).then(|| calls.strings.get(call.upstream)),
        }),
    }
}

/// Records the engine's events so far, at the replay's time (`t0_us` at
/// `base`).
fn drain_events(
    events: &mut tokio::sync::broadcast::Receiver<gov_engine::Event>,
    out: &RefCell<Outcomes>,
    t0_us: u64,
    base: Instant,
) {
    while let Ok(e) = events.try_recv() {
        let at_us = t0_us + micros(Instant::now().saturating_duration_since(base));
        out.borrow_mut().events.push(Seen {
            at_us,
            kind: e.kind,
            rule: e.rule.to_string(),
            key: e.key.to_string(),
            reason: e.reason,
        });
    }
}

/// Keeps an admitted call in a free slot of `held` (or a new one).
fn hold_slot(held: &mut Vec<Option<Held>>, free: &mut Vec<usize>, h: Option<Held>) -> usize {
    match free.pop() {
        Some(slot) => {
            held[slot] = h;
            slot
        }
        None => {
            held.push(h);
            held.len() - 1
        }
    }
}

/// Call `i` was rejected by `r`.
fn rejected(out: &RefCell<Outcomes>, ids: &RuleIds, i: usize, r: &Rejection) {
    let rule = ids.get(&r.rule);
    out.borrow_mut().got.push((
        i,
        Got::Rejected {
            rule,
            reason: r.reason as u8,
        },
    ));
}

/// A call that waits for a permit: its index, what it will count, how long
/// it holds once admitted, and its bytes each way.
struct Waited {
    i: usize,
    outcome: Option<Outcome>,
    hold: Hold,
    req: u64,
    resp: u64,
}

/// Waits for a waiting call's permit, then holds it as an admitted call
/// does; or records its rejection.
async fn wait_for(pending: Pending, w: Waited, out: &RefCell<Outcomes>, ids: &RuleIds) {
    match pending.wait().await {
        Ok(admission) => {
            let by = admission
                .rules()
                .map(|(rule, wait)| (ids.get(rule), wait.is_some()))
                .collect();
            {
                let mut o = out.borrow_mut();
                o.got.push((w.i, Got::Admitted));
                o.admitted_by.push((w.i, by));
            }
            admission.add_bytes(w.req);
            let mut h = Held {
                admission,
                outcome: w.outcome,
                response_bytes: w.resp,
            };
            tokio::time::sleep(w.hold.outcome).await;
            h.record();
            tokio::time::sleep(w.hold.end - w.hold.outcome).await;
            end_call(h);
        }
        Err(r) => rejected(out, ids, w.i, &r),
    }
}

fn admitted(out: &RefCell<Outcomes>, ids: &RuleIds, i: usize, admission: &Admission) {
    let by = admission
        .rules()
        .map(|(rule, wait)| (ids.get(rule), wait.is_some()))
        .collect();
    let mut o = out.borrow_mut();
    o.got.push((i, Got::Admitted));
    o.admitted_by.push((i, by));
}

/// When a held call's outcome is counted and when it gives its permits
/// back, from its admission.
#[derive(Clone, Copy, Debug)]
struct Hold {
    outcome: Duration,
    end: Duration,
}

/// How long an admitted call holds its permits (its recorded latency) and
/// when its outcome was counted (at the end when the record does not say),
/// less what it waited live. A call the live policy rejected has no known
/// end.
fn hold_for(call: &Call, out: &RefCell<Outcomes>) -> Hold {
    if let Live::Rejected { .. } = call.live {
        out.borrow_mut().unknown_end += 1;
        return Hold {
            outcome: Duration::ZERO,
            end: Duration::ZERO,
        };
    }
    let end = call.latency_us.saturating_sub(call.live_wait_us);
    let outcome = call
        .outcome_us
        .map_or(end, |o| o.saturating_sub(call.live_wait_us).min(end));
    Hold {
        outcome: Duration::from_micros(outcome),
        end: Duration::from_micros(end),
    }
}

/// Counts the outcome of the call held in `slot`, or ends it.
fn take_step(held: &mut [Option<Held>], free: &mut Vec<usize>, step: Step, slot: usize) {
    match step {
        Step::Outcome => {
            if let Some(h) = held.get_mut(slot).and_then(Option::as_mut) {
                h.record();
            }
        }
        Step::End => {
            if let Some(h) = held.get_mut(slot).and_then(Option::take) {
                end_call(h);
                free.push(slot);
            }
        }
    }
}

fn outcome_of(call: &Call) -> Option<Outcome> {
    match call.outcome {
        log::Outcome::Response => match call.grpc_status {
            Some(n) => gov_proto::grpc::from_number(n).map(Outcome::Grpc),
            None => call.status.map(Outcome::Status),
        },
        log::Outcome::ConnectFailure => Some(Outcome::ConnectFailure),
        log::Outcome::Timeout => Some(Outcome::Timeout),
        log::Outcome::Reset => Some(Outcome::Reset),
        log::Outcome::Rejected | log::Outcome::Abandoned => None,
    }
}

impl Held {
    /// Records the call's outcome (once: the engine keeps the first).
    fn record(&mut self) {
        if let Some(outcome) = self.outcome.take() {
            self.admission.record(outcome);
        }
    }
}

fn end_call(mut h: Held) {
    h.admission.add_bytes(h.response_bytes);
    h.record();
    drop(h.admission);
}

/// The consumer header and the logged headers of `call` in `raw`; how many.
fn call_headers<'a>(
    calls: &'a Calls,
    call: &Call,
    consumer_header: &'a str,
    raw: &mut [httparse::Header<'a>],
) -> usize {
    let mut n = 0;
    if call.consumer != NONE {
        raw[0] = httparse::Header {
            name: consumer_header,
            value: calls.strings.get(call.consumer).as_bytes(),
        };
        n = 1;
    }
    for &(name, value) in calls.headers_of(call) {
        if n == raw.len() {
            break;
        }
        raw[n] = httparse::Header {
            name: calls.strings.get(name),
            value: calls.strings.get(value).as_bytes(),
        };
        n += 1;
    }
    n
}

/// The adaptive bulkheads' limits as last seen, to record each move once.
struct Limits {
    /// (rule name, its index, the limit last seen).
    rules: Vec<(String, u32, Option<u32>)>,
    /// The last look: a limit moves at most once per window (100 ms), so a
    /// look every [`LOOK_EVERY`] sees each move, at most that late.
    last: Option<Instant>,
}

const LOOK_EVERY: Duration = Duration::from_millis(5);

impl Limits {
    fn new(ids: &RuleIds, adaptive: &[String]) -> Self {
        Self {
            rules: adaptive
                .iter()
                .map(|name| (name.clone(), ids.get(name), None))
                .collect(),
            last: None,
        }
    }

    /// Records the limits that moved since the last look (the engine's
    /// stats: the limit a bulkhead enforces now).
    fn sample(&mut self, engine: &Engine, t0_us: u64, base: Instant, out: &RefCell<Outcomes>) {
        let now = Instant::now();
        if self.rules.is_empty() || self.last.is_some_and(|l| now - l < LOOK_EVERY) {
            return;
        }
        self.last = Some(now);
        let stats = engine.stats();
        let at_us = t0_us.saturating_add(micros(now.saturating_duration_since(base)));
        for (name, id, seen) in &mut self.rules {
            let Some(s) = stats.rules.iter().find(|s| &*s.rule == name.as_str()) else {
                continue;
            };
            let limit = u32::try_from(s.capacity).unwrap_or(u32::MAX);
            if *seen != Some(limit) {
                *seen = Some(limit);
                out.borrow_mut().limits.push((*id, at_us, limit));
            }
        }
    }
}

async fn advance_to(at: Instant) {
    let now = Instant::now();
    if at > now {
        tokio::time::advance(at - now).await;
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
