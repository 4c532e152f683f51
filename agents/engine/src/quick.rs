//! The test that tells most requests no rule matches before the thread's
//! snapshot cache is read (issue 39): what of each direction's router a
//! request must miss to match none of its rules, in one word
//! ([`Router::miss_word`]: the second bytes of its paths, the lengths of
//! its gate's header names), published by the engine per direction.
//!
//! A word is read without the snapshot, so a decision may read it while a
//! new config is applied. An apply (serialised) widens each word to the old
//! config's and the new one's together, swaps the snapshot, then narrows
//! the word to the new config's: whatever value a decision reads holds at
//! least the bits of a config that was current when it was written (the
//! old one's or, once swapped, the new one's), and a request that misses
//! them all matches no rule of that config, exactly what routing with it
//! would find.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Release};

use crate::config::{CompiledConfig, Direction};
use crate::request::RequestInfo;

/// The published words, by [`Direction`] (inbound, then outbound).
#[derive(Debug, Default)]
pub(crate) struct MissFilter {
    words: [AtomicU64; 2],
}

const DIRECTIONS: [Direction; 2] = [Direction::Inbound, Direction::Outbound];

impl MissFilter {
    /// The words of `config`.
    pub(crate) fn new(config: &CompiledConfig) -> Self {
        let filter = Self::default();
        filter.narrow(config);
        filter
    }

    #[inline]
    fn word(&self, direction: Direction) -> &AtomicU64 {
        &self.words[direction as usize]
    }

    /// Before the swap to `config`: each word also holds its bits.
    pub(crate) fn widen(&self, config: &CompiledConfig) {
        for d in DIRECTIONS {
            self.word(d).fetch_or(config.router(d).miss_word(), Release);
        }
    }

    /// After the swap to `config`: each word holds its bits alone.
    pub(crate) fn narrow(&self, config: &CompiledConfig) {
        for d in DIRECTIONS {
            self.word(d).store(config.router(d).miss_word(), Release);
        }
    }

    /// Whether `req` matches no rule of the current config (`false`: it
    /// may match one; route it).
    #[inline]
    pub(crate) fn misses(&self, req: &RequestInfo<'_>) -> bool {
        let word = self.word(req.direction).load(Acquire);
        // A path shorter than 2 bytes is routed (it may meet `/`).
        let Some(&b) = req.path.as_bytes().get(1) else {
            return false;
        };
        let lens = word >> 32;
        word >> (b & 31) & 1 == 0 && (lens == 0 || !req.headers.may_have(lens | lens << 32))
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

    fn misses(filter: &MissFilter, req: &RequestInfo<'_>) -> bool {
        filter.misses(req)
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
    fn a_request_with_more_names_than_are_scanned_is_routed() {
        let (filter, engine) = (MissFilter::new(&config(BENCH)), engine(BENCH));
        let get = Method::GET;
        let mut many = HeaderMap::new();
        for i in 0..17 {
            let name = http::HeaderName::from_bytes(format!("x-h{i:02}").as_bytes()).unwrap();
            many.insert(name, HeaderValue::from_static("1"));
        }
        let req = RequestInfo::inbound(&get, "/static/app.js", &many);
        assert!(!misses(&filter, &req));
        assert!(rules(&engine, &req).is_empty());
        many.insert("x-admin", HeaderValue::from_static("yes"));
        let req = RequestInfo::inbound(&get, "/static/app.js", &many);
        assert!(!misses(&filter, &req));
        assert_eq!(rules(&engine, &req), ["order/admin_timeout"]);
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
    fn while_a_config_is_applied_the_words_hold_both_configs_bits() {
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
