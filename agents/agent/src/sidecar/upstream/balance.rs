//! The endpoints of other services and the balancer of the outbound listener.
//!
//! The outbound balancer is power of two choices over peak-EWMA cost, as Finagle's
//! and Linkerd's: two endpoints drawn at random, the one with the lower latency
//! estimate times (requests outstanding + 1) wins. Peak-EWMA rather than least
//! outstanding requests because a sidecar sees few requests in flight per
//! endpoint: at one or two outstanding, a count cannot tell a 10x slower endpoint
//! from a fast one, and the slow one keeps its share of the tail; a latency
//! estimate can. The estimate jumps to a slower sample at once and forgets it over
//! about 10 s.
//!
//! Slow start: the weights choose the candidates before their costs are compared,
//! so no estimate can lift a ramping endpoint past its weight. One below the
//! heaviest weight of the set is only ever the first candidate, and only with
//! probability its weight over the heaviest: of `k` endpoints, one at 30% of the
//! heaviest gets at most 30% of `1/k` of the calls, less when it is the slower of
//! its pair. Dividing the cost by the weight (what this did before) did not bound
//! it: the warm endpoints' latency peaks made a fast new one at 10% the cheapest
//! of most pairs, and it took over half the calls (issue 31).
//!
//! Latency outliers: P2C alone still sends a 10x slower endpoint a few percent of
//! the calls (it wins a pair whenever the other endpoint's queue makes it look
//! dearer), and a few percent is enough to put its latency into p99. So, as Envoy's
//! outlier detection compares each host with the others' success rate, every
//! [`JUDGE_EVERY`] the balancer compares each endpoint's mean latency (a plain
//! moving average over about a second, not the peak) with the median of the
//! service's (upper median, of at least [`MIN_FOR_OUTLIERS`] estimates): one
//! above [`SLOW_FACTOR`] times it is *slow*, and leaves the pairs. It still gets one
//! request (a probe) when [`PROBE_EVERY`] has passed and none is outstanding, so its
//! estimate stays fresh and it returns when its latency does. Being above the
//! median, fewer than half the endpoints can be slow at once; and as the others
//! take its share their own latency (queueing included) rises, which lowers the
//! ratio: the rule cannot pile a service onto one endpoint.
//!
//! Passive health, as the config's outlier policy for the callee declares it
//! ([`Outliers`], its defaults the fixed rule of before): connect failures and
//! resets in a row (and the answers it names) eject an endpoint for a back-off
//! that grows with each ejection in a row (bounded); no ejection passes the
//! declared share of the set (without one, the last available endpoint is never
//! ejected), and if every endpoint is out anyway (a new set of ejected endpoints,
//! a share of 100%) the balancer uses them all (Envoy's panic threshold). The
//! retries that use this live with each path (`h1.rs`, `proxy.rs`).

use super::*;

mod endpoint;
mod outlier;

pub(crate) use endpoint::Endpoint;
pub use endpoint::PROBE_EVERY;
use outlier::Outlier;
pub use outlier::{InvalidOutlier, Outliers};

// === the endpoints of other services ===

/// The cost of an endpoint that has not answered yet while a request to it is
/// outstanding: a new endpoint takes one probe at a time until its first response
/// (Finagle's penalty).
const PENALTY: f64 = 1e15;

/// An endpoint whose mean latency is more than this many times the median of
/// its service's is slow: it gets probes only.
pub const SLOW_FACTOR: f64 = 3.0;

/// How often the median and the slow endpoints are judged again.
pub const JUDGE_EVERY: Duration = Duration::from_millis(100);

/// Fewer endpoints with an estimate than this: none is slow (the median of two is
/// one of the two).
pub const MIN_FOR_OUTLIERS: usize = 3;

/// The endpoints of the services the local service calls, for the outbound listener.
///
/// The whole table is one immutable value behind an [`ArcSwap`]: [`Directory::replace`]
/// swaps in a new one, and a request reads it without a lock or an allocation
/// (a guarded load, a hash lookup, two reference counts). The per-endpoint state that
/// must outlive a swap (requests outstanding, the latency estimate, ejection,
/// counters) lives in each `Endpoint`, which a new set reuses for an address the
/// old set had.
#[derive(Debug)]
pub struct Directory {
    balance: Balance,
    /// Time zero of the endpoints' clocks (ejection deadlines, estimate stamps).
    epoch: Instant,
    services: ArcSwap<HashMap<Box<str>, Arc<Service>>>,
    /// The outlier policy of each callee, from the config in force.
    outliers: ArcSwap<Outliers>,
    /// The endpoints that take mutual TLS between agents.
    mtls: crate::sidecar::mtls::Targets,
}

/// The endpoint set of one service, as one [`Directory::replace`] made it.
#[derive(Debug)]
struct Service {
    name: Arc<str>,
    balance: Balance,
    epoch: Instant,
    /// When its endpoints are ejected.
    outlier: Arc<Outlier>,
    endpoints: Box<[Arc<Endpoint>]>,
    /// The weight of each endpoint, in milli-percent, at least 1.
    // INVARIANT: as long as `endpoints`.
    weights: Box<[u32]>,
    /// Round robin's position.
    next: AtomicUsize,
    /// When the slow endpoints were last judged, nanoseconds after the epoch, plus
    /// one (0: never).
    judged_at: AtomicU64,
}

/// A request's hold on the endpoint picked for it: counts as outstanding until
/// dropped (when the response body has ended), and carries what the request
/// learned back to the balancer.
#[derive(Debug)]
pub(crate) struct Pick {
    service: Arc<Service>,
    // INVARIANT: an index into `service.endpoints`.
    index: usize,
    start: Instant,
}

/// One endpoint's counters, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EndpointStats {
    pub(crate) service: Arc<str>,
    pub(crate) endpoint: Arc<str>,
    pub(crate) weight_milli_percent: u32,
    pub(crate) requests: u64,
    pub(crate) outstanding: u64,
    pub(crate) ejections: u64,
    /// Ejections the outlier policy's share held back.
    pub(crate) withheld: u64,
    pub(crate) ejected: bool,
    pub(crate) slow: bool,
}

// === impl Directory ===

impl Directory {
    /// A directory of static endpoint lists (`--instances`), every endpoint at full
    /// weight. Call it inside the runtime when time may be paused (tests).
    pub(crate) fn new(balance: Balance, services: &[(String, Vec<Authority>)]) -> Self {
        let directory = Self {
            balance,
            epoch: Instant::now(),
            services: ArcSwap::from_pointee(HashMap::new()),
            outliers: ArcSwap::from_pointee(Outliers::default()),
            mtls: crate::sidecar::mtls::Targets::default(),
        };
        for (name, addrs) in services {
            directory.replace(name, addrs.iter().cloned().map(EndpointSpec::full));
            directory.mtls.set(name, addrs.clone(), Vec::new());
        }
        directory
    }

    /// Takes the outlier policies of a new config: every service's set ejects by
    /// its callee's policy from the next failure on (an endpoint ejected now
    /// stays so until its ejection ends).
    pub fn set_outliers(&self, outliers: Outliers) {
        if **self.outliers.load() == outliers {
            return;
        }
        self.outliers.store(Arc::new(outliers));
        let outliers = self.outliers.load_full();
        self.services.rcu(|current| {
            current
                .iter()
                .map(|(name, set)| (name.clone(), Arc::new(set.with(outliers.of(name)))))
                .collect::<HashMap<_, _>>()
        });
    }

    /// Which endpoints take mutual TLS between agents (from govd's sets).
    pub(crate) fn mtls_targets(&self) -> &crate::sidecar::mtls::Targets {
        &self.mtls
    }

    /// Replaces the endpoints of `service` at once: a request picks from the old set
    /// or the new, never a mix. An address in both keeps its state (requests
    /// outstanding, latency estimate, ejection, counters) and takes its new weight;
    /// an address only in the old set is forgotten (its requests in flight finish).
    /// A repeated address counts once. An empty set keeps the service known with no
    /// endpoint: its calls get 502.
    ///
    /// Returns the ids (`host:port`) of the endpoints the set no longer holds,
    /// so that per-instance state elsewhere (bulkhead scopes) can follow.
    pub fn replace(
        &self,
        service: &str,
        endpoints: impl IntoIterator<Item = EndpointSpec>,
    ) -> Vec<Arc<str>> {
        let mut specs: Vec<EndpointSpec> = Vec::new();
        for spec in endpoints {
            if !specs
                .iter()
                .any(|s| s.authority.as_str() == spec.authority.as_str())
            {
                specs.push(spec);
            }
        }
        let name: Arc<str> = Arc::from(service);
        let gone: Vec<Arc<str>> = self
            .services
            .load()
            .get(service)
            .map(|old| {
                old.endpoints
                    .iter()
                    .filter(|e| {
                        !specs
                            .iter()
                            .any(|s| s.authority.as_str() == e.authority.as_str())
                    })
                    .map(|e| e.id.clone())
                    .collect()
            })
            .unwrap_or_default();
        self.services.rcu(|current| {
            let old = current.get(service);
            let endpoints: Box<[Arc<Endpoint>]> = specs
                .iter()
                .map(|spec| {
                    old.and_then(|o| {
                        o.endpoints
                            .iter()
                            .find(|e| e.authority.as_str() == spec.authority.as_str())
                    })
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Endpoint::new(spec.authority.clone())))
                })
                .collect();
            let weights = specs
                .iter()
                .map(|s| s.weight_milli_percent.clamp(1, FULL_WEIGHT))
                .collect();
            let mut next = HashMap::clone(current);
            next.insert(
                Box::from(service),
                Arc::new(Service {
                    name: name.clone(),
                    balance: self.balance,
                    epoch: self.epoch,
                    outlier: self.outliers.load().of(service),
                    endpoints,
                    weights,
                    next: AtomicUsize::new(0),
                    judged_at: AtomicU64::new(0),
                }),
            );
            next
        });
        gone
    }

    /// Forgets `service`: its calls get 502 as an unknown service's do.
    pub fn remove(&self, service: &str) {
        self.services.rcu(|current| {
            let mut next = HashMap::clone(current);
            next.remove(service);
            next
        });
    }

    /// The endpoints of `service` with their weights, in order; `None` if unknown.
    pub fn endpoints(&self, service: &str) -> Option<Vec<EndpointSpec>> {
        let services = self.services.load();
        let set = services.get(service)?;
        Some(
            set.endpoints
                .iter()
                .zip(set.weights.iter())
                .map(|(e, w)| EndpointSpec {
                    authority: e.authority.clone(),
                    weight_milli_percent: *w,
                })
                .collect(),
        )
    }

    /// Picks an endpoint of `service` for one request; `None` when the service is
    /// unknown or has no endpoint.
    pub(crate) fn pick(&self, service: &str) -> Option<Pick> {
        let set = self.services.load().get(service)?.clone();
        set.pick(None, &mut rand::rng(), Instant::now())
    }

    /// Every endpoint's counters, by service then endpoint order.
    pub(crate) fn stats(&self) -> Vec<EndpointStats> {
        let services = self.services.load();
        let mut names: Vec<&Box<str>> = services.keys().collect();
        names.sort_unstable();
        let now = Instant::now();
        let mut out = Vec::new();
        for name in names {
            let Some(set) = services.get(&**name) else {
                continue;
            };
            let at = set.nanos(now);
            for (endpoint, weight) in set.endpoints.iter().zip(set.weights.iter()) {
                out.push(EndpointStats {
                    service: set.name.clone(),
                    endpoint: endpoint.id.clone(),
                    weight_milli_percent: *weight,
                    requests: endpoint.requests.load(Ordering::Relaxed),
                    outstanding: endpoint.outstanding.load(Ordering::Relaxed),
                    ejections: endpoint.ejections.load(Ordering::Relaxed),
                    withheld: endpoint.withheld.load(Ordering::Relaxed),
                    ejected: endpoint.ejected(at),
                    slow: endpoint.slow.load(Ordering::Relaxed),
                });
            }
        }
        out
    }
}

// === impl Service ===

impl Service {
    /// The same set (endpoints, weights) ejecting by `outlier`.
    fn with(&self, outlier: Arc<Outlier>) -> Self {
        Self {
            name: self.name.clone(),
            balance: self.balance,
            epoch: self.epoch,
            outlier,
            endpoints: self.endpoints.clone(),
            weights: self.weights.clone(),
            next: AtomicUsize::new(self.next.load(Ordering::Relaxed)),
            judged_at: AtomicU64::new(self.judged_at.load(Ordering::Relaxed)),
        }
    }

    fn nanos(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Picks an endpoint other than `exclude`: among the endpoints neither ejected
    /// nor slow; else among those not ejected; else among all (the panic rule:
    /// traffic to a possibly bad endpoint beats no traffic at all). A slow endpoint
    /// due for a probe takes the request instead, when an endpoint that is not slow
    /// could have.
    ///
    /// Slow start: of `k` eligible endpoints, one at weight `w` below the
    /// heaviest eligible weight `w_top` is picked with probability at most
    /// `w / w_top / k` (its full share scaled by its relative weight), however
    /// its latency compares; within that bound the cheaper candidate wins.
    fn pick(
        self: &Arc<Self>,
        exclude: Option<usize>,
        rng: &mut impl Rng,
        now: Instant,
    ) -> Option<Pick> {
        let at = self.nanos(now);
        let n = self.endpoints.len();
        let latency = self.balance == Balance::PeakEwma;
        if latency {
            self.judge(at);
        }
        let slow = |e: &Endpoint| latency && e.slow.load(Ordering::Relaxed);
        // How many endpoints each tier holds: 0 neither ejected nor slow, 1 not
        // ejected, 2 any but `exclude`.
        let mut counts = [0_usize; 3];
        let mut probe = None;
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            if exclude == Some(i) {
                continue;
            }
            counts[2] += 1;
            if endpoint.ejected(at) {
                continue;
            }
            counts[1] += 1;
            if slow(endpoint) {
                if probe.is_none() && endpoint.probe_due(at) {
                    probe = Some(i);
                }
                continue;
            }
            counts[0] += 1;
        }
        let probe = probe
            .filter(|&i| counts[0] > 0 && self.endpoints.get(i).is_some_and(|e| e.claim_probe(at)));
        let tier = (0..3).find(|&t| counts[t] > 0)?;
        let eligible = |i: usize| {
            exclude != Some(i)
                && self
                    .endpoints
                    .get(i)
                    .is_some_and(|e| tier == 2 || (!e.ejected(at) && (tier == 1 || !slow(e))))
        };
        let weight = |i: usize| self.weights.get(i).copied().unwrap_or(1);
        // The heaviest eligible weight, and how many eligible endpoints have it:
        // those are at full share, the others ramp relative to them.
        let (mut top, mut heaviest) = (0, 0);
        for i in (0..n).filter(|&i| eligible(i)) {
            match weight(i).cmp(&top) {
                std::cmp::Ordering::Greater => (top, heaviest) = (weight(i), 1),
                std::cmp::Ordering::Equal => heaviest += 1,
                std::cmp::Ordering::Less => {}
            }
        }
        // The k-th eligible endpoint at the top weight other than `not`.
        let nth_heaviest = |k: usize, not: Option<usize>| {
            (0..n)
                .filter(|&i| Some(i) != not && eligible(i) && weight(i) == top)
                .nth(k)
        };
        // The first candidate: the next in turn or one at random, every eligible
        // endpoint alike. One below the top weight w_top at weight w stays a
        // candidate with probability w / w_top, else an endpoint at the top
        // weight takes its place.
        let first = match self.balance {
            Balance::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % counts[tier],
            Balance::PeakEwma => rng.random_range(0..counts[tier]),
        };
        let first = if counts[tier] == n {
            first
        } else {
            (0..n).filter(|&i| eligible(i)).nth(first)?
        };
        let first = if weight(first) == top || rng.random_range(0..top) < weight(first) {
            first
        } else {
            nth_heaviest(rng.random_range(0..heaviest), None)?
        };
        let index = match (probe, self.balance) {
            (Some(probe), _) => probe,
            (None, Balance::RoundRobin) => first,
            (None, Balance::PeakEwma) => {
                // INVARIANT: an endpoint below the top weight is only ever the first
                // candidate, which it is with probability at most its weight over
                // the top's divided by the eligible count: its share's bound. The
                // second comes from those at the top weight; the cheaper of the two
                // wins (a tie goes to the first).
                let others = heaviest - usize::from(weight(first) == top);
                if others == 0 {
                    first
                } else {
                    let second = nth_heaviest(rng.random_range(0..others), Some(first))?;
                    if self.cost(second, at) < self.cost(first, at) {
                        second
                    } else {
                        first
                    }
                }
            }
        };
        let endpoint = self.endpoints.get(index)?;
        endpoint.outstanding.fetch_add(1, Ordering::Relaxed);
        endpoint.requests.fetch_add(1, Ordering::Relaxed);
        Some(Pick {
            service: self.clone(),
            index,
            start: now,
        })
    }

    /// Judges which endpoints are slow, at most once per [`JUDGE_EVERY`]: those not
    /// ejected whose mean latency is above [`SLOW_FACTOR`] times the upper median of
    /// the means of the endpoints not ejected (none is when fewer than
    /// [`MIN_FOR_OUTLIERS`] have one). An endpoint that turns slow may be probed
    /// [`PROBE_EVERY`] later.
    fn judge(&self, at: u64) {
        let last = self.judged_at.load(Ordering::Relaxed);
        let every = u64::try_from(JUDGE_EVERY.as_nanos()).unwrap_or(u64::MAX);
        if last != 0 && at.saturating_sub(last - 1) < every {
            return;
        }
        // One picker judges; the others go on with the last judgement.
        if self
            .judged_at
            .compare_exchange(
                last,
                at.saturating_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        let mut estimates: Vec<f64> = self
            .endpoints
            .iter()
            .filter(|e| !e.ejected(at))
            .map(|e| e.mean())
            .filter(|rtt| *rtt > 0.0)
            .collect();
        let median = if estimates.len() >= MIN_FOR_OUTLIERS {
            let mid = estimates.len() / 2;
            *estimates.select_nth_unstable_by(mid, f64::total_cmp).1
        } else {
            0.0
        };
        let probe_after = u64::try_from(PROBE_EVERY.as_nanos()).unwrap_or(u64::MAX);
        for endpoint in &*self.endpoints {
            let rtt = endpoint.mean();
            let slow = median > 0.0 && !endpoint.ejected(at) && rtt > SLOW_FACTOR * median;
            if endpoint.slow.swap(slow, Ordering::Relaxed) == slow {
                continue;
            }
            if slow {
                endpoint
                    .probe_from
                    .store(at.saturating_add(probe_after), Ordering::Relaxed);
            }
            tracing::debug!(
                service = %self.name,
                endpoint = %endpoint.authority,
                estimate_ms = rtt / 1e6,
                median_ms = median / 1e6,
                slow,
                "endpoint latency judged"
            );
        }
    }

    /// Peak-EWMA cost: the latency estimate times the requests outstanding plus
    /// one. An endpoint without an estimate costs nothing while idle and
    /// [`PENALTY`] while its first request is out. The weight is not in it: it
    /// bounds how often an endpoint is a candidate at all (`pick`).
    fn cost(&self, index: usize, at: u64) -> f64 {
        let Some(endpoint) = self.endpoints.get(index) else {
            return f64::INFINITY;
        };
        let pending = endpoint.outstanding.load(Ordering::Relaxed) as f64;
        let rtt = endpoint.estimate(at);
        if rtt > 0.0 {
            rtt * (pending + 1.0)
        } else if pending > 0.0 {
            PENALTY + pending
        } else {
            0.0
        }
    }
}

// === impl Pick ===

impl Pick {
    /// The name of the service the endpoint belongs to.
    pub(crate) fn service(&self) -> &Arc<str> {
        &self.service.name
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        // INVARIANT: `index` came from `service.endpoints`, which never changes.
        &self.service.endpoints[self.index]
    }

    /// The response head arrived with `status`: a latency sample, and the
    /// endpoint is healthy, unless the callee's outlier policy counts the status
    /// as a failure (`on status 500..599`).
    pub(crate) fn responded(&self, status: u16) {
        let now = Instant::now();
        let endpoint = self.endpoint();
        endpoint.observe(
            now.saturating_duration_since(self.start).as_nanos() as f64,
            self.service.nanos(now),
        );
        if self.service.outlier.counts(status) {
            self.failed();
            return;
        }
        if endpoint.failures.load(Ordering::Relaxed) != 0 {
            endpoint.failures.store(0, Ordering::Relaxed);
        }
        if endpoint.ejected_in_a_row.load(Ordering::Relaxed) != 0 {
            endpoint.ejected_in_a_row.store(0, Ordering::Relaxed);
        }
    }

    /// The request timed out without a response head: the time it waited is a
    /// latency sample (an endpoint that hangs must not look fast).
    pub(crate) fn timed_out(&self) {
        let now = Instant::now();
        self.endpoint().observe(
            now.saturating_duration_since(self.start).as_nanos() as f64,
            self.service.nanos(now),
        );
    }

    /// The connection failed or was reset before a response head (or the answer
    /// is one the outlier policy counts). After the policy's failures in a row the
    /// endpoint is ejected for its ejection time, grown by its growth with each
    /// ejection in a row up to its ceiling; never when that would eject more than
    /// the policy's share of the set (without a share: when every other endpoint
    /// is ejected too). An ejection held back leaves the count of failures as it
    /// is: the next failure tries again.
    pub(crate) fn failed(&self) {
        let endpoint = self.endpoint();
        let policy = &self.service.outlier;
        let failures = endpoint
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if failures < policy.failures {
            return;
        }
        let at = self.service.nanos(Instant::now());
        if endpoint.ejected(at) {
            return;
        }
        let ejected = self
            .service
            .endpoints
            .iter()
            .filter(|e| e.ejected(at))
            .count();
        if !policy.may_eject(ejected, self.service.endpoints.len()) {
            endpoint.withheld.fetch_add(1, Ordering::Relaxed);
            return;
        }
        endpoint.failures.store(0, Ordering::Relaxed);
        let row = endpoint.ejected_in_a_row.fetch_add(1, Ordering::Relaxed);
        let backoff = policy.backoff(row);
        let until = at.saturating_add(u64::try_from(backoff.as_nanos()).unwrap_or(u64::MAX));
        endpoint.ejected_until.store(until, Ordering::Relaxed);
        endpoint.ejections.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            service = %self.service.name,
            endpoint = %endpoint.authority,
            ?backoff,
            "endpoint ejected after {} failures in a row",
            policy.failures
        );
    }

    /// Another endpoint of the same service for a second attempt; `None` when there
    /// is no other.
    pub(crate) fn retry(&self) -> Option<Pick> {
        self.service
            .pick(Some(self.index), &mut rand::rng(), Instant::now())
    }
}

/// Another hold on the same endpoint: it counts as one more request
/// outstanding there until dropped (a request extension must be `Clone`; the
/// proxy moves its pick through one and never clones it).
impl Clone for Pick {
    fn clone(&self) -> Self {
        self.endpoint().outstanding.fetch_add(1, Ordering::Relaxed);
        Self {
            service: self.service.clone(),
            index: self.index,
            start: self.start,
        }
    }
}

impl Drop for Pick {
    fn drop(&mut self) {
        self.endpoint().outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn authority(port: u16) -> Authority {
        format!("127.0.0.1:{port}").parse().unwrap()
    }

    fn inventory(balance: Balance, ports: &[u16]) -> Directory {
        let addrs = ports.iter().map(|p| authority(*p)).collect();
        Directory::new(balance, &[("inventory".to_owned(), addrs)])
    }

    fn set(directory: &Directory) -> Arc<Service> {
        directory.services.load().get("inventory").unwrap().clone()
    }

    /// A pick of endpoint `index`, as the balancer would make it.
    fn take(set: &Arc<Service>, index: usize) -> Pick {
        set.endpoints[index]
            .outstanding
            .fetch_add(1, Ordering::Relaxed);
        Pick {
            service: set.clone(),
            index,
            start: Instant::now(),
        }
    }

    fn pick(set: &Arc<Service>, rng: &mut StdRng) -> Pick {
        set.pick(None, rng, Instant::now()).unwrap()
    }

    fn ejected(directory: &Directory) -> Vec<bool> {
        directory.stats().iter().map(|s| s.ejected).collect()
    }

    /// The defaults: the fixed rule of before.
    const EJECT_AFTER: u32 = 5;
    const EJECT_BASE: Duration = Duration::from_secs(1);
    const EJECT_MAX: Duration = Duration::from_secs(60);

    /// `inventory` at `ports`, ejecting by `policy` (the defaults but what it sets).
    fn declared(ports: &[u16], policy: gov_proto::v1::OutlierPolicy) -> Directory {
        let dir = inventory(Balance::PeakEwma, ports);
        let target = gov_proto::v1::TargetConfig {
            outlier_targets: vec![gov_proto::v1::OutlierTarget {
                service: "inventory".into(),
                policy: Some(policy),
            }],
            ..gov_proto::v1::TargetConfig::default()
        };
        dir.set_outliers(Outliers::from_target(&target).unwrap());
        dir
    }

    fn policy() -> gov_proto::v1::OutlierPolicy {
        gov_proto::compiled::outlier_defaults()
    }

    /// `outlier to inventory { consecutive_failures 3  eject 30s growth 3x max 5m }`:
    /// 30 s, 90 s, 270 s, then 300 s each; a good answer starts over at 30 s.
    #[tokio::test(start_paused = true)]
    async fn a_declared_policy_ejects_after_its_failures_for_its_growing_bounded_time() {
        let dir = declared(
            &[9001, 9002, 9003],
            gov_proto::v1::OutlierPolicy {
                consecutive_failures: 3,
                eject_ms: 30_000,
                growth: 3,
                max_eject_ms: 300_000,
                ..policy()
            },
        );
        let set = set(&dir);
        let secs = Duration::from_secs;
        let eject = |set: &Arc<Service>| {
            for _ in 0..3 {
                take(set, 0).failed();
            }
        };
        take(&set, 0).failed();
        take(&set, 0).failed();
        assert_eq!(ejected(&dir), [false, false, false], "2 of 3 failures");
        take(&set, 0).responded(200);
        for (round, lasts) in [30, 90, 270, 300, 300].into_iter().enumerate() {
            eject(&set);
            assert_eq!(ejected(&dir), [true, false, false], "round {round}");
            tokio::time::advance(secs(lasts) - ms(1)).await;
            assert!(ejected(&dir)[0], "round {round}: out for {lasts} s");
            tokio::time::advance(ms(1)).await;
            assert!(!ejected(&dir)[0], "round {round}: back after {lasts} s");
        }
        // A good answer resets the growth and the failures counted.
        take(&set, 0).failed();
        take(&set, 0).responded(200);
        take(&set, 0).failed();
        take(&set, 0).failed();
        assert!(!ejected(&dir)[0], "the answer reset the count");
        take(&set, 0).failed();
        tokio::time::advance(secs(30)).await;
        assert!(!ejected(&dir)[0], "30 s again after a good answer");
        assert_eq!(dir.stats()[0].ejections, 6);
    }

    /// `max_ejected 50%` of four: two out at most, whatever fails; the third is
    /// held back (and counted) until one comes back.
    #[tokio::test(start_paused = true)]
    async fn a_declared_share_bounds_the_endpoints_out_at_once() {
        let dir = declared(
            &[9001, 9002, 9003, 9004],
            gov_proto::v1::OutlierPolicy {
                consecutive_failures: 1,
                eject_ms: 10_000,
                max_eject_ms: 10_000,
                max_ejected_milli_percent: 50_000,
                ..policy()
            },
        );
        let set = set(&dir);
        take(&set, 0).failed();
        tokio::time::advance(ms(5_000)).await;
        take(&set, 1).failed();
        take(&set, 2).failed();
        take(&set, 3).failed();
        assert_eq!(ejected(&dir), [true, true, false, false]);
        let withheld: Vec<u64> = dir.stats().iter().map(|s| s.withheld).collect();
        assert_eq!(withheld, [0, 0, 1, 1]);
        // The first is back: the next failure of the third ejects it.
        tokio::time::advance(ms(5_000)).await;
        assert_eq!(ejected(&dir), [false, true, false, false]);
        take(&set, 2).failed();
        assert_eq!(ejected(&dir), [false, true, true, false]);

        // One instance: half of it is none, it is never ejected.
        let one = declared(
            &[9001],
            gov_proto::v1::OutlierPolicy {
                consecutive_failures: 1,
                max_ejected_milli_percent: 50_000,
                ..policy()
            },
        );
        for _ in 0..10 {
            take(&set_of(&one), 0).failed();
        }
        assert_eq!(ejected(&one), [false]);
        // Nor by default; only a declared 100% ejects it (and the panic rule
        // still gives it the calls).
        let one = inventory(Balance::PeakEwma, &[9001]);
        for _ in 0..10 {
            take(&set_of(&one), 0).failed();
        }
        assert_eq!(ejected(&one), [false]);
        let one = declared(
            &[9001],
            gov_proto::v1::OutlierPolicy {
                consecutive_failures: 1,
                max_ejected_milli_percent: 100_000,
                ..policy()
            },
        );
        take(&set_of(&one), 0).failed();
        assert_eq!(ejected(&one), [true]);
        assert!(one.pick("inventory").is_some(), "the panic rule");
    }

    fn set_of(directory: &Directory) -> Arc<Service> {
        set(directory)
    }

    /// `on status 500..599`: answers in the range count as failures, others
    /// reset the count.
    #[tokio::test(start_paused = true)]
    async fn declared_statuses_count_as_failures() {
        let dir = declared(
            &[9001, 9002],
            gov_proto::v1::OutlierPolicy {
                consecutive_failures: 2,
                status: vec![gov_proto::v1::StatusRange { from: 500, to: 599 }],
                ..policy()
            },
        );
        let set = set(&dir);
        take(&set, 0).responded(503);
        take(&set, 0).responded(404);
        take(&set, 0).responded(502);
        assert_eq!(ejected(&dir), [false, false]);
        take(&set, 0).failed();
        assert_eq!(ejected(&dir), [true, false]);
        // Without the declaration a 5xx is an answer.
        let plain = inventory(Balance::PeakEwma, &[9001, 9002]);
        for _ in 0..10 {
            take(&set_of(&plain), 0).responded(503);
        }
        assert_eq!(ejected(&plain), [false, false]);
    }

    /// A new config's policy applies to the sets already there, and to a set
    /// made later; a callee it does not name takes its service-wide policy.
    #[tokio::test(start_paused = true)]
    async fn a_new_policy_applies_to_the_sets_in_place() {
        let dir = inventory(Balance::PeakEwma, &[9001, 9002]);
        let target = gov_proto::v1::TargetConfig {
            outlier: Some(gov_proto::v1::OutlierPolicy {
                consecutive_failures: 1,
                ..policy()
            }),
            ..gov_proto::v1::TargetConfig::default()
        };
        dir.set_outliers(Outliers::from_target(&target).unwrap());
        take(&set(&dir), 0).failed();
        assert_eq!(ejected(&dir), [true, false]);
        dir.replace(
            "billing",
            [
                EndpointSpec::full(authority(9101)),
                EndpointSpec::full(authority(9102)),
            ],
        );
        let billing = dir.services.load().get("billing").unwrap().clone();
        assert_eq!(billing.outlier.failures, 1);
        dir.set_outliers(Outliers::default());
        assert_eq!(set(&dir).outlier.failures, EJECT_AFTER);
        let inventory: Vec<bool> = dir
            .stats()
            .iter()
            .filter(|s| &*s.service == "inventory")
            .map(|s| s.ejected)
            .collect();
        assert_eq!(inventory, [true, false], "an ejection in course stays");
    }

    #[tokio::test(start_paused = true)]
    async fn round_robin_cycles_through_endpoints() {
        let dir = inventory(Balance::RoundRobin, &[9001, 9002]);
        let picked: Vec<_> = (0..4)
            .map(|_| dir.pick("inventory").unwrap().endpoint().id.clone())
            .collect();
        assert_eq!(
            picked.iter().map(|s| &**s).collect::<Vec<_>>(),
            [
                "127.0.0.1:9001",
                "127.0.0.1:9002",
                "127.0.0.1:9001",
                "127.0.0.1:9002"
            ]
        );
        assert!(dir.pick("billing").is_none());
    }

    /// A pick cloned (a request extension must be `Clone`) is one more hold on
    /// its endpoint: each counts as outstanding until dropped.
    #[tokio::test(start_paused = true)]
    async fn a_cloned_pick_holds_its_endpoint_until_both_are_dropped() {
        let dir = inventory(Balance::RoundRobin, &[9001, 9002]);
        let outstanding =
            |dir: &Directory| -> Vec<u64> { dir.stats().iter().map(|s| s.outstanding).collect() };
        let first = dir.pick("inventory").unwrap();
        assert_eq!(&**first.service(), "inventory");
        let clone = first.clone();
        assert_eq!(clone.index, first.index);
        assert_eq!(outstanding(&dir).iter().sum::<u64>(), 2);
        drop(first);
        assert_eq!(outstanding(&dir).iter().sum::<u64>(), 1);
        drop(clone);
        assert_eq!(outstanding(&dir), [0, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn peak_ewma_prefers_the_faster_endpoint_until_its_queue_costs_more() {
        let dir = inventory(Balance::PeakEwma, &[9001, 9002]);
        let set = set(&dir);
        let mut rng = StdRng::seed_from_u64(7);
        // Neither has answered yet: the second request goes to the other one.
        let first = pick(&set, &mut rng);
        let second = pick(&set, &mut rng);
        assert_ne!(first.index, second.index);
        let (fast, slow) = if first.index == 0 {
            (first, second)
        } else {
            (second, first)
        };
        tokio::time::advance(ms(1)).await;
        fast.responded(200);
        tokio::time::advance(ms(9)).await;
        slow.responded(200);
        drop((fast, slow));

        // Idle, the faster one wins every time.
        for _ in 0..50 {
            assert_eq!(pick(&set, &mut rng).index, 0);
        }
        // 1 ms x (k + 1) outstanding stays under 10 ms x 1 for ten requests; the
        // eleventh goes to the slow endpoint.
        let held: Vec<Pick> = (0..10).map(|_| pick(&set, &mut rng)).collect();
        assert!(held.iter().all(|p| p.index == 0));
        assert_eq!(pick(&set, &mut rng).index, 1);
    }

    /// A closed-loop load on paused time: `per_ms` calls each millisecond until
    /// `calls` were made, each answered after `latency(index, rng)` ms; returns
    /// how many calls each endpoint got.
    async fn simulate(
        set: &Arc<Service>,
        rng: &mut StdRng,
        calls: usize,
        per_ms: usize,
        latency: impl Fn(usize, &mut StdRng) -> u64,
    ) -> Vec<usize> {
        let mut got = vec![0; set.endpoints.len()];
        let mut held: Vec<(u64, Pick)> = Vec::new();
        let mut made = 0;
        let mut t = 0;
        while made < calls || !held.is_empty() {
            let (due, later): (Vec<_>, Vec<_>) = held.into_iter().partition(|(at, _)| *at <= t);
            held = later;
            for (_, p) in due {
                p.responded(200);
            }
            for _ in 0..per_ms.min(calls - made) {
                let p = pick(set, rng);
                got[p.index] += 1;
                held.push((t + latency(p.index, rng), p));
                made += 1;
            }
            tokio::time::advance(ms(1)).await;
            t += 1;
        }
        got
    }

    fn weighted(ports: &[(u16, u32)]) -> Directory {
        let dir = inventory(Balance::PeakEwma, &[]);
        dir.replace(
            "inventory",
            ports.iter().map(|(port, weight)| EndpointSpec {
                authority: authority(*port),
                weight_milli_percent: *weight,
            }),
        );
        dir
    }

    /// The issue 31 case: two warm endpoints whose latency has peaks (one call
    /// in five takes 30 ms) and a new one, fast, ramping. Whatever the
    /// estimates say, the new one gets at most its weight times the third it
    /// gets at full weight (1.25 x that, plus one point, for the sampling), and,
    /// being the fastest, about that much.
    #[tokio::test(start_paused = true)]
    async fn a_ramping_endpoint_gets_at_most_its_weight_of_a_full_share() {
        for percent in [10, 30, 60] {
            let dir = weighted(&[
                (9001, FULL_WEIGHT),
                (9002, FULL_WEIGHT),
                (9003, FULL_WEIGHT / 100 * percent),
            ]);
            let set = set(&dir);
            let mut rng = StdRng::seed_from_u64(31);
            let calls = 4000;
            let got = simulate(&set, &mut rng, calls, 4, |index, rng| match index {
                2 => 1,
                _ if rng.random_range(0..5) == 0 => 30,
                _ => 2,
            })
            .await;
            let share = got[2] as f64 / calls as f64;
            let full = 1.0 / 3.0 * f64::from(percent) / 100.0;
            assert!(
                share <= 1.25 * full + 0.01,
                "at {percent}%: {share:.3} of the calls, its bound {:.3} ({got:?})",
                1.25 * full + 0.01
            );
            assert!(
                share >= 0.75 * full - 0.01,
                "at {percent}%: {share:.3} of the calls, starved ({got:?})"
            );
        }
    }

    /// Within its bound the latency still decides: a ramping endpoint slower
    /// than the others (cold) gets well under its weight's share.
    #[tokio::test(start_paused = true)]
    async fn a_ramping_endpoint_slower_than_the_others_gets_less_than_its_bound() {
        let dir = weighted(&[
            (9001, FULL_WEIGHT),
            (9002, FULL_WEIGHT),
            (9003, FULL_WEIGHT / 2),
        ]);
        let set = set(&dir);
        let mut rng = StdRng::seed_from_u64(5);
        let calls = 4000;
        let got = simulate(&set, &mut rng, calls, 4, |index, _| match index {
            2 => 5,
            _ => 2,
        })
        .await;
        let share = got[2] as f64 / calls as f64;
        assert!(share < 0.5 / 3.0 * 0.6, "{share:.3} of the calls ({got:?})");
        assert!(got[2] > 0, "a ramping endpoint gets calls");
    }

    /// The weights are relative to the heaviest endpoint's: a set whose
    /// endpoints all ramp alike (a whole fleet started at once) shares its
    /// calls as a set at full weight does.
    #[tokio::test(start_paused = true)]
    async fn endpoints_ramping_alike_share_the_calls_evenly() {
        let dir = weighted(&[(9001, 10_000), (9002, 10_000), (9003, 10_000)]);
        let set = set(&dir);
        let mut rng = StdRng::seed_from_u64(8);
        let got = simulate(&set, &mut rng, 3000, 3, |_, _| 2).await;
        assert!(got.iter().all(|n| (800..=1200).contains(n)), "{got:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_in_a_row_eject_for_a_doubling_bounded_backoff() {
        let dir = inventory(Balance::PeakEwma, &[9001, 9002]);
        let set = set(&dir);
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 1..EJECT_AFTER {
            take(&set, 0).failed();
        }
        assert_eq!(ejected(&dir), [false, false]);
        take(&set, 0).failed();
        assert_eq!(ejected(&dir), [true, false]);
        assert_eq!(dir.stats()[0].ejections, 1);
        for _ in 0..20 {
            assert_eq!(pick(&set, &mut rng).index, 1);
        }
        tokio::time::advance(EJECT_BASE).await;
        assert_eq!(ejected(&dir), [false, false]);

        // Ejected again before a response: twice as long.
        for _ in 0..EJECT_AFTER {
            take(&set, 0).failed();
        }
        tokio::time::advance(EJECT_BASE).await;
        assert_eq!(ejected(&dir), [true, false]);
        tokio::time::advance(EJECT_BASE).await;
        assert_eq!(ejected(&dir), [false, false]);

        // A response resets the back-off.
        take(&set, 0).responded(200);
        for _ in 0..EJECT_AFTER {
            take(&set, 0).failed();
        }
        tokio::time::advance(EJECT_BASE).await;
        assert_eq!(ejected(&dir), [false, false]);

        // Bounded: after many ejections in a row, at most `EJECT_MAX`.
        for _ in 0..20 {
            for _ in 0..EJECT_AFTER {
                take(&set, 0).failed();
            }
            assert_eq!(ejected(&dir), [true, false]);
            tokio::time::advance(EJECT_MAX).await;
            assert_eq!(ejected(&dir), [false, false]);
        }
        assert_eq!(dir.stats()[0].ejections, 23);
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_available_endpoint_stays_and_all_ejected_are_used_anyway() {
        let dir = inventory(Balance::PeakEwma, &[9001, 9002]);
        let set = set(&dir);
        for _ in 0..EJECT_AFTER {
            take(&set, 0).failed();
        }
        for _ in 0..3 * EJECT_AFTER {
            take(&set, 1).failed();
        }
        assert_eq!(ejected(&dir), [true, false]);

        // The set shrinks to the ejected endpoint alone: it is used anyway.
        dir.replace("inventory", [EndpointSpec::full(authority(9001))]);
        assert_eq!(ejected(&dir), [true]);
        let p = dir.pick("inventory").unwrap();
        assert_eq!(&*p.endpoint().id, "127.0.0.1:9001");
        assert!(p.retry().is_none(), "no other endpoint to retry on");
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_goes_to_another_endpoint() {
        let dir = inventory(Balance::PeakEwma, &[9001, 9002, 9003]);
        for _ in 0..50 {
            let first = dir.pick("inventory").unwrap();
            let again = first.retry().unwrap();
            assert_ne!(first.index, again.index);
        }
        let stats = dir.stats();
        assert_eq!(stats.iter().map(|s| s.requests).sum::<u64>(), 100);
        assert!(stats.iter().all(|s| s.outstanding == 0));
    }

    #[tokio::test(start_paused = true)]
    async fn replace_swaps_the_set_and_keeps_what_it_knew_of_kept_addresses() {
        let dir = inventory(Balance::RoundRobin, &[9001, 9002]);
        let held = dir.pick("inventory").unwrap();
        assert_eq!(&*held.endpoint().id, "127.0.0.1:9001");

        let half = EndpointSpec {
            authority: authority(9001),
            weight_milli_percent: FULL_WEIGHT / 2,
        };
        let gone = dir.replace(
            "inventory",
            [
                half.clone(),
                EndpointSpec::full(authority(9003)),
                half.clone(),
            ],
        );
        // What left the set (for the per-instance bulkheads to follow).
        assert_eq!(gone, [Arc::<str>::from("127.0.0.1:9002")]);
        assert_eq!(
            dir.endpoints("inventory").unwrap(),
            [half, EndpointSpec::full(authority(9003))]
        );
        let stats = dir.stats();
        let counts: Vec<_> = stats
            .iter()
            .map(|s| (&*s.endpoint, s.requests, s.outstanding))
            .collect();
        assert_eq!(counts, [("127.0.0.1:9001", 1, 1), ("127.0.0.1:9003", 0, 0)]);
        drop(held);
        assert_eq!(dir.stats()[0].outstanding, 0);

        let gone = dir.replace("inventory", []);
        assert_eq!(gone.len(), 2, "{gone:?}");
        assert!(dir.pick("inventory").is_none());
        assert_eq!(dir.endpoints("inventory"), Some(Vec::new()));
        dir.remove("inventory");
        assert_eq!(dir.endpoints("inventory"), None);
    }

    fn slow_flags(directory: &Directory) -> Vec<bool> {
        directory.stats().iter().map(|s| s.slow).collect()
    }

    /// One request to each endpoint, answered after its latency in `ms` (in
    /// order, time advancing by each).
    async fn sample(set: &Arc<Service>, latencies: &[u64]) {
        for (index, latency) in latencies.iter().enumerate() {
            let p = take(set, index);
            tokio::time::advance(ms(*latency)).await;
            p.responded(200);
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= b.abs() * 1e-6
    }

    #[tokio::test(start_paused = true)]
    async fn the_estimate_takes_a_slower_sample_at_once_and_forgets_it_over_ten_seconds() {
        let dir = inventory(Balance::PeakEwma, &[9001]);
        let set = set(&dir);
        let e = &set.endpoints[0];
        let now = || set.nanos(Instant::now());
        assert_eq!(e.estimate(now()), 0.0, "no estimate before a sample");
        sample(&set, &[2]).await;
        assert!(close(e.estimate(now()), 2e6));
        // The peak: a slower sample replaces the estimate.
        sample(&set, &[20]).await;
        assert!(close(e.estimate(now()), 20e6));
        // Without samples it decays: 1/e after 10 s.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(close(e.estimate(now()), 20e6 / std::f64::consts::E));
        // A faster sample moves it by how long it went without one: after 10 s
        // (plus the sample's 2 ms) the old estimate weighs about 1/e.
        sample(&set, &[2]).await;
        let w = (-10.002_f64 / 10.0).exp();
        assert!(close(e.estimate(now()), 20e6 * w + 2e6 * (1.0 - w)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_latency_outlier_leaves_the_pairs_and_gets_one_probe_a_second() {
        let dir = inventory(Balance::PeakEwma, &[9001, 9002, 9003]);
        let set = set(&dir);
        let mut rng = StdRng::seed_from_u64(5);
        sample(&set, &[2, 2, 20]).await;
        assert_eq!(slow_flags(&dir), [false, false, false], "not judged yet");
        tokio::time::advance(JUDGE_EVERY).await;

        // Ten calls held on each fast endpoint: 2 ms x 11 costs more than the slow
        // one's 20 ms x 1, so P2C alone would send it calls now. Slow, it gets none.
        let mut held = Vec::new();
        for _ in 0..200 {
            let p = pick(&set, &mut rng);
            assert_ne!(p.index, 2, "a call went to the slow endpoint");
            held.push(p);
        }
        assert_eq!(slow_flags(&dir), [false, false, true]);

        // One probe once `PROBE_EVERY` has passed; none while it is outstanding,
        // and none again until `PROBE_EVERY` after it.
        for round in 0..3 {
            tokio::time::advance(PROBE_EVERY).await;
            let probe = pick(&set, &mut rng);
            assert_eq!(probe.index, 2, "round {round}: the probe");
            for _ in 0..100 {
                held.push(pick(&set, &mut rng));
            }
            tokio::time::advance(ms(20)).await;
            probe.responded(200);
            for _ in 0..100 {
                held.push(pick(&set, &mut rng));
            }
            assert!(held.iter().all(|p| p.index != 2));
            assert_eq!(slow_flags(&dir), [false, false, true]);
            // The fast ones keep answering fast.
            held.clear();
            sample(&set, &[2, 2]).await;
        }
        assert_eq!(dir.stats()[2].requests, 3, "3 probes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_endpoint_whose_probes_answer_fast_returns() {
        let dir = inventory(Balance::PeakEwma, &[9001, 9002, 9003]);
        let set = set(&dir);
        let mut rng = StdRng::seed_from_u64(9);
        sample(&set, &[2, 2, 20]).await;
        tokio::time::advance(JUDGE_EVERY).await;
        drop(pick(&set, &mut rng));
        assert_eq!(slow_flags(&dir), [false, false, true]);
        let mut seconds = 0;
        while slow_flags(&dir)[2] {
            assert!(seconds < 60, "still slow after 60 s of fast probes");
            seconds += 1;
            tokio::time::advance(PROBE_EVERY).await;
            let probe = pick(&set, &mut rng);
            assert_eq!(probe.index, 2, "after {seconds} s: the probe");
            tokio::time::advance(ms(2)).await;
            probe.responded(200);
            sample(&set, &[2, 2]).await;
            tokio::time::advance(JUDGE_EVERY).await;
            drop(pick(&set, &mut rng));
        }
        // The mean forgets 20 ms over about a second: back within 3x of 2 ms
        // after a few fast probes, not at the first.
        assert!((2..=10).contains(&seconds), "back after {seconds} s");
        // Back in the pairs: its peak estimate (which the pairs use) still well above
        // the others', it wins a pair once their queues cost more (while slow it won
        // none, as above).
        let held: Vec<Pick> = (0..300).map(|_| pick(&set, &mut rng)).collect();
        let to_it = held.iter().filter(|p| p.index == 2).count();
        assert!(to_it >= 10, "{to_it} of 300 held calls once back");
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_minority_above_the_median_can_be_slow() {
        let cases: [(&[u64], &[bool]); 4] = [
            // Two: the median of two is one of them.
            (&[2, 20], &[false, false]),
            // The slow ones are the majority: the median is slow.
            (&[2, 20, 20], &[false, false, false]),
            (&[2, 2, 2, 20, 20], &[false, false, false, true, true]),
            // Within 3x of the median is not an outlier.
            (&[2, 2, 5], &[false, false, false]),
        ];
        for (latencies, want) in cases {
            let ports: Vec<u16> = (0..latencies.len()).map(|i| 9001 + i as u16).collect();
            let dir = inventory(Balance::PeakEwma, &ports);
            let set = set(&dir);
            sample(&set, latencies).await;
            tokio::time::advance(JUDGE_EVERY).await;
            drop(set.pick(None, &mut StdRng::seed_from_u64(1), Instant::now()));
            assert_eq!(slow_flags(&dir), want, "latencies {latencies:?}");
        }
        // Round robin is blind to latency: nothing is judged.
        let dir = inventory(Balance::RoundRobin, &[9001, 9002, 9003]);
        let set = set(&dir);
        sample(&set, &[2, 2, 20]).await;
        tokio::time::advance(JUDGE_EVERY).await;
        let picked: Vec<usize> = (0..3)
            .map(|_| dir.pick("inventory").unwrap().index)
            .collect();
        assert_eq!(picked, [0, 1, 2]);
        assert_eq!(slow_flags(&dir), [false, false, false]);
    }

    #[test]
    fn balance_parses_its_two_names() {
        assert_eq!("peak-ewma".parse(), Ok(Balance::PeakEwma));
        assert_eq!("round-robin".parse(), Ok(Balance::RoundRobin));
        assert!("random".parse::<Balance>().is_err());
    }
}
