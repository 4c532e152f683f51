//! The decision of a request the miss filter may not pass, with this
//! thread's cached snapshot of the engine ([`crate::snapshot`]): out of
//! line from [`Engine::try_admit`](crate::Engine::try_admit), which inlines
//! only the miss test into its callers.

use std::sync::atomic::Ordering::Acquire;

use super::Shared;
use crate::admission::Admission;
use crate::decision::{Decided, admit_matched, route};
use crate::request::RequestInfo;
use crate::snapshot::CACHE;

impl Shared {
    /// [`Engine::try_admit`](crate::Engine::try_admit) of a request the
    /// miss filter may not pass. Only the miss test is inlined into every
    /// caller: with several callers (as in gov-agent) an unmatched call
    /// pays no call of this. Of the engine's shared part (issue 39: the
    /// caller has its address at hand from the miss test, and passes it).
    #[inline]
    pub(super) fn try_admit_routed(&self, req: &RequestInfo<'_>) -> Decided {
        let generation = self.generation.load(Acquire);
        let mut scratch = None;
        // Route with this thread's cached config; take the snapshot only if
        // a rule matched (its config is the cached one: the plan's `PlanAt`
        // holds in it).
        let hit = CACHE.try_with(|cache| {
            // Borrowed mutably, though only read (issue 39: a test of one
            // borrow state, where a shared borrow counts readers; nothing a
            // decision does reads the cache again).
            let cache = cache.try_borrow_mut().ok()?;
            let entry = cache.find(generation)?;
            let Some(at) = route(&entry.config, req, &mut scratch) else {
                return Some(None);
            };
            // `None` (the snapshot was swapped and dropped since): load it.
            entry.snap.upgrade().map(|snap| Some((snap, at)))
        });
        match hit {
            Ok(Some(None)) => Decided::Admitted(Admission::unmatched()),
            Ok(Some(Some((snap, at)))) => admit_matched(snap, at, &scratch, req),
            // Its generation read again (issue 39: not kept across the
            // routing; it is still read before the snapshot is loaded).
            _ => self.try_admit_loaded(req),
        }
    }

    /// [`Engine::try_admit`](crate::Engine::try_admit) with the snapshot
    /// loaded (and cached for this thread): the first decision after a
    /// swap, or without the cache.
    #[cold]
    #[inline(never)]
    fn try_admit_loaded(&self, req: &RequestInfo<'_>) -> Decided {
        let generation = self.generation.load(Acquire);
        // The thread's stripe, from its first decision on (issue 39: not
        // asked for by every count).
        crate::stripe::lease();
        let snap = self.current.load_full();
        let _ = CACHE.try_with(|cache| {
            if let Ok(mut cache) = cache.try_borrow_mut() {
                cache.insert(self.id, generation, &snap);
            }
        });
        let mut scratch = None;
        match route(&snap.config, req, &mut scratch) {
            Some(at) => admit_matched(snap, at, &scratch, req),
            None => Decided::Admitted(Admission::unmatched()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::super::tests::{BULKHEAD, decide, engine};
    use super::*;
    use crate::Engine;
    use crate::outcome::Outcome;

    fn admitted(e: &Engine) -> (u64, u64) {
        let s = e.stats();
        let r = s.rules.iter().find(|r| &*r.rule == "order/slow_calls");
        r.map_or((0, 0), |r| (r.admitted, r.latency.iter().sum()))
    }

    /// Two permits: two governed admissions, a third refused.
    fn two_permits_then_refused(e: &Engine) {
        let held: Vec<_> = (0..2).filter_map(|_| decide(e, "/slow")).collect();
        assert_eq!(held.iter().filter(|a| a.is_governed()).count(), 2);
        assert!(decide(e, "/slow").is_none(), "the bulkhead is full");
        assert!(decide(e, "/other").is_some_and(|a| !a.is_governed()));
        for a in held {
            a.finish(Outcome::Status(200));
        }
    }

    /// A decision made while this thread's cache is borrowed (a decision
    /// inside another's routing: the cache is borrowed mutably by a
    /// decision) decides by the current rules without the cache, before and
    /// after a swap, and counts.
    #[test]
    fn a_decision_while_the_cache_is_borrowed_decides_by_the_current_rules() {
        let e = engine(BULKHEAD);
        CACHE.with(|cache| {
            let _held = cache.borrow();
            two_permits_then_refused(&e);
        });
        two_permits_then_refused(&e);
        CACHE.with(|cache| {
            let _held = cache.borrow_mut();
            two_permits_then_refused(&e);
            e.apply(crate::config::CompiledConfig::empty("order"));
            assert!(decide(&e, "/slow").is_some_and(|a| !a.is_governed()));
        });
        assert!(decide(&e, "/slow").is_some_and(|a| !a.is_governed()));
    }

    /// Calls decided on one thread and finished on threads that never
    /// decide (they count in the shared stripe, several at once) are all
    /// counted: the stats sum every stripe.
    #[test]
    fn calls_finished_on_threads_that_never_decide_are_all_counted() {
        const THREADS: usize = 4;
        const CALLS: usize = 10_000;
        let e = engine(&BULKHEAD.replace("max_concurrent: 2", "max_concurrent: 100000"));
        let calls: Vec<Vec<Admission>> = (0..THREADS)
            .map(|_| (0..CALLS).filter_map(|_| decide(&e, "/slow")).collect())
            .collect();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
        let threads: Vec<_> = calls
            .into_iter()
            .map(|calls| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    for a in calls {
                        a.finish(Outcome::Status(200));
                    }
                    assert!(!crate::stripe::current().is_owned());
                })
            })
            .collect();
        for t in threads {
            t.join().expect("the thread finishes its calls");
        }
        let total = (THREADS * CALLS) as u64;
        assert_eq!(admitted(&e), (total, total));
        assert_eq!(e.stats().rules[0].in_flight, 0);
    }

    thread_local! {
        /// An admission dropped at thread exit.
        static AT_EXIT: RefCell<Option<(Engine, Option<Admission>)>> = const { RefCell::new(None) };
    }

    /// Decides, finishes and drops admissions in a thread-local destructor
    /// (after this thread's cache and stripe lease may be gone): decisions
    /// by the rules, every call counted.
    struct DecideAtExit(Engine);

    impl Drop for DecideAtExit {
        fn drop(&mut self) {
            two_permits_then_refused(&self.0);
        }
    }

    thread_local! {
        static DECIDER: RefCell<Option<DecideAtExit>> = const { RefCell::new(None) };
    }

    #[test]
    fn a_thread_decides_and_counts_in_its_thread_local_destructors() {
        let e = engine(BULKHEAD);
        let in_thread = e.clone();
        std::thread::spawn(move || {
            // Tokio's context first: with the clock paused by another test
            // in this process, a clock read asks it, so it must outlive the
            // destructor that decides (thread-local destructors run last
            // registered first).
            let _ = tokio::runtime::Handle::try_current();
            // Registered before the cache and the lease: destroyed after
            // them (and, for the other, before them).
            DECIDER.with(|d| *d.borrow_mut() = Some(DecideAtExit(in_thread.clone())));
            two_permits_then_refused(&in_thread);
            let held = decide(&in_thread, "/slow");
            AT_EXIT.with(|x| *x.borrow_mut() = Some((in_thread, held)));
        })
        .join()
        .expect("the thread exits");
        // 2 + 1 held + 2 at exit.
        assert_eq!(admitted(&e).0, 5);
        assert_eq!(e.stats().rules[0].in_flight, 0);
        two_permits_then_refused(&e);
    }

    /// The config of version `n`: its rules on `/p0` .. `/p{n % 4}`, each
    /// named by the version and its path (the nodes and plans of two
    /// versions differ in number and order).
    fn version(n: usize) -> gov_proto::v1::TargetConfig {
        let mut yaml = format!("service: order\nversion: v{n}\nrules:\n");
        for j in (0..=n % 4).rev() {
            yaml.push_str(&format!(
                "- {{name: order/v{n}_p{j}, on: {{path: {{kind: PATH_KIND_PREFIX, value: /p{j}}}}}, bulkhead: {{max_concurrent: 100000}}}}\n"
            ));
        }
        let mut target: gov_proto::v1::TargetConfig =
            serde_yaml::from_str(&yaml).expect("the test config parses");
        gov_proto::compiled::fill(&mut target);
        target
    }

    /// Decisions racing config swaps each name the rule of the config
    /// they were decided with (issue 39: a thread routes with its cached
    /// config and decides with the snapshot it cached with it, never one
    /// of another generation).
    #[test]
    fn decisions_racing_swaps_name_the_rules_of_their_own_config() {
        const SWAPS: usize = 2_000;
        let e = engine(BULKHEAD);
        e.apply_target(&version(0)).expect("the config applies");
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let deciders: Vec<_> = (0..2)
            .map(|_| {
                let (e, done) = (e.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut seen = std::collections::HashSet::new();
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        for path in ["/p0/x", "/p1"] {
                            let a = decide(&e, path).expect("admitted");
                            let Some(v) = a.config_version() else {
                                // `/p1` in a version with one rule.
                                assert_eq!(path, "/p1");
                                continue;
                            };
                            let n: usize = v[1..].parse().expect("a version");
                            let rules: Vec<String> =
                                a.rules().map(|(r, _)| r.to_string()).collect();
                            assert_eq!(rules, [format!("order/{v}_{}", &path[1..3])]);
                            seen.insert(n);
                        }
                    }
                    seen.len()
                })
            })
            .collect();
        for n in 1..=SWAPS {
            e.apply_target(&version(n)).expect("the config applies");
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        for d in deciders {
            assert!(d.join().expect("every decision names its rules") > 1);
        }
    }

    /// A thread that decided with a config decides with the next one once
    /// told of the swap by another thread (its cached snapshot is of an
    /// older generation: not used).
    #[test]
    fn a_thread_decides_with_a_config_swapped_on_another() {
        let e = engine(BULKHEAD);
        let (to_decider, told) = std::sync::mpsc::channel::<()>();
        let (to_swapper, heard) = std::sync::mpsc::channel::<Option<String>>();
        let in_thread = e.clone();
        let decider = std::thread::spawn(move || {
            // The last call is held: its snapshot (the one cached) lives on.
            let mut held = None;
            for () in told {
                let a = decide(&in_thread, "/p0").expect("admitted");
                to_swapper
                    .send(a.rules().next().map(|(r, _)| r.to_string()))
                    .expect("sent");
                held = Some(a);
            }
            drop(held);
        });
        for n in 0..20 {
            e.apply_target(&version(n)).expect("the config applies");
            to_decider.send(()).expect("sent");
            assert_eq!(heard.recv().expect("heard"), Some(format!("order/v{n}_p0")));
        }
        drop(to_decider);
        decider.join().expect("the decider ends");
    }
}
