//! The test that tells most requests no rule matches before the thread's
//! snapshot cache is read (issue 39): what of each direction's router a
//! request must miss to match none of its rules ([`Router::miss_words`]:
//! the second bytes of its paths, the lengths of its gate's header names),
//! published by the engine as atomic words beside its generation.
//!
//! The words are read without the snapshot, so a decision may read them
//! while a new config is applied. An apply (serialised) widens every word
//! to the old config's and the new one's together, swaps the snapshot and
//! bumps the generation, then narrows every word to the new config's: at
//! any time every word holds at least what the config of the current
//! generation sets. A request is told "no rule" only when the generation
//! read before and after its words is the same: then every word it read
//! held that config's bits, and it misses them all, so that config matches
//! no rule for it (exactly what routing with it would find).

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Release};

use crate::config::{CompiledConfig, Direction};
use crate::request::RequestInfo;
use crate::route::Router;

/// The words of one direction's router.
#[derive(Debug, Default)]
struct Words {
    /// Bit `b & 63` of word `b >> 6`: a path whose second byte is `b` may
    /// meet one of the router's paths.
    seconds: [AtomicU64; 4],
    /// The length bits of the gate's names: a request with
    /// a header name of such a length may match a rule without a path.
    lens: AtomicU64,
}

/// The published words of both directions.
#[derive(Debug, Default)]
pub(crate) struct MissFilter {
    inbound: Words,
    outbound: Words,
}

impl MissFilter {
    /// The words of `config`.
    pub(crate) fn new(config: &CompiledConfig) -> Self {
        let filter = Self::default();
        filter.narrow(config);
        filter
    }

    fn words(&self, direction: Direction) -> &Words {
        match direction {
            Direction::Inbound => &self.inbound,
            Direction::Outbound => &self.outbound,
        }
    }

    /// Each word and what `config` sets in it, of both directions.
    fn each(&self, config: &CompiledConfig, mut f: impl FnMut(&AtomicU64, u64)) {
        for direction in [Direction::Inbound, Direction::Outbound] {
            let words = self.words(direction);
            let router: &Router = config.router(direction);
            let [a, b, c, d, lens] = router.miss_words();
            for (word, bits) in words.seconds.iter().zip([a, b, c, d]) {
                f(word, bits);
            }
            f(&words.lens, lens);
        }
    }

    /// Before the swap to `config`: every word also holds its bits.
    pub(crate) fn widen(&self, config: &CompiledConfig) {
        self.each(config, |word, bits| {
            word.fetch_or(bits, Release);
        });
    }

    /// After the swap to `config` (and the generation's bump): every word
    /// holds its bits alone.
    pub(crate) fn narrow(&self, config: &CompiledConfig) {
        self.each(config, |word, bits| word.store(bits, Release));
    }

    /// Whether `req` matches no rule of the config of generation `before`
    /// (read from `generation`, with `Acquire`, before this call; `false`:
    /// it may match one, route it).
    #[inline]
    pub(crate) fn misses(
        &self,
        before: u64,
        generation: &AtomicU64,
        req: &RequestInfo<'_>,
    ) -> bool {
        let words = self.words(req.direction);
        // A path shorter than 2 bytes is routed (it may meet `/`).
        let Some(&b) = req.path.as_bytes().get(1) else {
            return false;
        };
        if words.seconds[usize::from(b >> 6)].load(Acquire) >> (b & 63) & 1 != 0 {
            return false;
        }
        let lens = words.lens.load(Acquire);
        if lens != 0 && req.headers.may_have(lens) {
            return false;
        }
        generation.load(Acquire) == before
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test fixtures fail the test loudly")]

    use http::{HeaderMap, HeaderValue, Method};

    use super::*;
    use crate::{Decision, Engine};

    /// The benches' config: ten rules, one of them (`order/admin_timeout`)
    /// on a header alone, one outbound (`order/per_instance`) on its target.
    const BENCH: &str = include_str!("../benches/decision-config.yaml");

    fn config(yaml: &str) -> CompiledConfig {
        let mut target = serde_yaml::from_str(yaml).unwrap();
        gov_proto::compiled::fill(&mut target);
        CompiledConfig::try_from(&target).unwrap()
    }

    fn engine(yaml: &str) -> Engine {
        let engine = Engine::empty("order");
        engine.apply(config(yaml));
        engine
    }

    fn map(headers: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for &(k, v) in headers {
            map.insert(k, HeaderValue::from_static(v));
        }
        map
    }

    /// The rules `engine` admits `req` under.
    fn rules(engine: &Engine, req: &RequestInfo<'_>) -> Vec<String> {
        match engine.try_admit(req) {
            Decision::Admitted(a) => a.rules().map(|(r, _)| r.to_string()).collect(),
            _ => panic!("not admitted at once"),
        }
    }

    /// Whether `filter` of generation 0 tells `req` it matches nothing.
    fn misses(filter: &MissFilter, req: &RequestInfo<'_>) -> bool {
        filter.misses(0, &AtomicU64::new(0), req)
    }

    #[test]
    fn a_header_rule_still_matches_a_path_the_filter_misses() {
        let (filter, engine) = (MissFilter::new(&config(BENCH)), engine(BENCH));
        let get = Method::GET;
        let admin = map(&[("accept", "*/*"), ("x-admin", "yes")]);
        let req = RequestInfo::inbound(&get, "/static/app.js", &admin);
        assert!(!misses(&filter, &req));
        assert_eq!(rules(&engine, &req), ["order/admin_timeout"]);
        // A name of the gate's length that is not the gate's is routed,
        // and matches nothing.
        let referer = map(&[("referer", "x"), ("accept", "*/*")]);
        let req = RequestInfo::inbound(&get, "/static/app.js", &referer);
        assert!(!misses(&filter, &req));
        assert!(rules(&engine, &req).is_empty());
        let plain = map(&[("accept", "*/*"), ("user-agent", "t/1")]);
        let req = RequestInfo::inbound(&get, "/static/app.js", &plain);
        assert!(misses(&filter, &req));
        assert!(rules(&engine, &req).is_empty());
        // A path whose second byte some rule's path has is routed.
        let req = RequestInfo::inbound(&get, "/api/orders/7", &plain);
        assert!(!misses(&filter, &req));
        assert_eq!(rules(&engine, &req).len(), 3);
        // Parsed heads too.
        for (name, miss) in [("x-admin", false), ("X-Admin", false), ("accept", true)] {
            let raw = [httparse::Header {
                name,
                value: b"yes",
            }];
            let req = RequestInfo {
                headers: crate::Headers::Raw(&raw),
                ..RequestInfo::inbound(&get, "/static/app.js", &plain)
            };
            assert_eq!(misses(&filter, &req), miss, "{name}");
            assert_eq!(rules(&engine, &req).is_empty(), miss, "{name}");
        }
    }

    #[test]
    fn a_rule_without_a_path_or_a_gate_and_short_paths_are_always_routed() {
        let filter = MissFilter::new(&config(BENCH));
        let (get, plain) = (Method::GET, map(&[("accept", "*/*")]));
        // Outbound, `calls to inventory` reads no path and no header.
        let out = RequestInfo::outbound(&get, "/static/app.js", &plain, "inventory", None);
        assert!(!misses(&filter, &out));
        assert_eq!(rules(&engine(BENCH), &out), ["order/per_instance"]);
        let root = config(
            "service: order\nrules:\n- name: order/all\n  on: {path: {kind: PATH_KIND_PREFIX, value: /}}\n  bulkhead: {max_concurrent: 9}\n",
        );
        let filter = MissFilter::new(&root);
        for path in ["/", "", "/static/app.js", "/\u{e9}"] {
            let req = RequestInfo::inbound(&get, path, &plain);
            assert!(!misses(&filter, &req), "{path:?}");
        }
        let empty = MissFilter::new(&CompiledConfig::empty("order"));
        for path in ["/api", "/static/app.js"] {
            let req = RequestInfo::inbound(&get, path, &plain);
            assert!(misses(&empty, &req), "{path}");
        }
    }

    const STATIC: &str = "service: order\nrules:\n- name: order/assets\n  on: {path: {kind: PATH_KIND_PREFIX, value: /static}}\n  bulkhead: {max_concurrent: 9}\n";
    const API: &str = "service: order\nrules:\n- name: order/api\n  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}\n  bulkhead: {max_concurrent: 9}\n";

    #[test]
    fn while_a_config_is_applied_the_words_hold_both_and_a_new_generation_is_routed() {
        let (get, plain) = (Method::GET, map(&[("accept", "*/*")]));
        let assets = RequestInfo::inbound(&get, "/static/app.js", &plain);
        let api = RequestInfo::inbound(&get, "/api/orders/7", &plain);
        let filter = MissFilter::new(&config(API));
        assert!(misses(&filter, &assets) && !misses(&filter, &api));
        let next = config(STATIC);
        filter.widen(&next);
        assert!(!misses(&filter, &assets) && !misses(&filter, &api));
        filter.narrow(&next);
        assert!(!misses(&filter, &assets) && misses(&filter, &api));
        // Read across a swap (the generation moved): routed.
        assert!(!filter.misses(0, &AtomicU64::new(1), &api));
    }

    #[test]
    fn an_engine_routes_by_the_config_it_was_last_given() {
        let (get, plain) = (Method::GET, map(&[("accept", "*/*")]));
        let assets = RequestInfo::inbound(&get, "/static/app.js", &plain);
        let api = RequestInfo::inbound(&get, "/api/orders/7", &plain);
        let engine = engine(API);
        assert!(rules(&engine, &assets).is_empty());
        assert_eq!(rules(&engine, &api), ["order/api"]);
        engine.apply(config(STATIC));
        assert_eq!(rules(&engine, &assets), ["order/assets"]);
        assert!(rules(&engine, &api).is_empty());
        engine.apply(CompiledConfig::empty("order"));
        assert!(rules(&engine, &assets).is_empty());
    }
}
