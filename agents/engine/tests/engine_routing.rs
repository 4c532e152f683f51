//! Routing against a reference: random rules (exact paths and prefixes of
//! both directions, some past the eight bytes a prefix entry compares in
//! one word, more exact paths than are scanned, header gates of one and of
//! several names, methods, expiring rules, case-insensitive services, more
//! than 64 rules) and
//! random requests (paths at a rule's length and one byte either side,
//! header names in any case, more headers than are scanned, raw headers):
//! the rules a decision names are exactly those whose match, evaluated by
//! hand, holds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::time::{SystemTime, UNIX_EPOCH};

use gov_engine::route::Headers;
use gov_engine::{Decision, Engine, RequestInfo, Target};
use gov_proto::v1 as proto;
use gov_proto::v1::match_expr::Kind;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use proptest::prelude::*;

/// Header names the rules read, and one they never do.
const NAMES: [&str; 4] = ["x-admin", "x-tenant", "accept", "x-other"];

/// Pieces of paths: segments whose lengths put texts on either side of
/// eight bytes, and bytes a hostile client sends.
const PIECES: [&str; 15] = [
    "/api",
    "/orders",
    "/7",
    "/a",
    "x",
    "/",
    "%2f",
    ";v=1",
    "/..",
    "A",
    "//",
    "/api/orders",
    // 64 bytes: a path this much longer than an exact path has its length's
    // bit in a set of lengths.
    "/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde",
    // Not ASCII: folded by no case-insensitive service.
    "\u{e9}",
    "/\u{c9}",
];

#[derive(Clone, Debug)]
struct RuleSpec {
    /// 0 prefix, 1 exact, 2 header, 3 POST and prefix, 4 header and exact,
    /// 5 POST alone, 6 header or prefix.
    kind: u8,
    text: String,
    header: usize,
    outbound: bool,
    /// 0 none, 1 expires in the future, 2 expired.
    expiry: u8,
    /// The bulkhead's deadline on a call (0: none; some equal).
    timeout_ms: u64,
}

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(0..PIECES.len(), 0..4).prop_map(|ps| {
        let mut t = String::from("/");
        for p in ps {
            t.push_str(PIECES[p]);
        }
        t
    })
}

fn rule_spec() -> impl Strategy<Value = RuleSpec> {
    (
        prop_oneof![
            3 => Just(0u8),
            4 => Just(1u8),
            1 => Just(2u8),
            1 => Just(3u8),
            2 => Just(4u8),
            1 => Just(5u8),
            1 => Just(6u8),
        ],
        text(),
        0..3usize,
        proptest::bool::weighted(0.2),
        prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
        prop_oneof![Just(0u64), (1u64..4).prop_map(|t| t * 100_000)],
    )
        .prop_map(
            |(kind, text, header, outbound, expiry, timeout_ms)| RuleSpec {
                kind,
                text,
                header,
                outbound,
                expiry,
                timeout_ms,
            },
        )
}

fn path_expr(exact: bool, p: &str) -> proto::MatchExpr {
    let kind = if exact {
        proto::PathKind::Exact
    } else {
        proto::PathKind::Prefix
    };
    expr(Kind::Path(proto::PathMatch {
        kind: kind as i32,
        value: p.into(),
    }))
}

fn expr(k: Kind) -> proto::MatchExpr {
    proto::MatchExpr { kind: Some(k) }
}

fn header_expr(n: usize) -> proto::MatchExpr {
    expr(Kind::Header(proto::HeaderMatch {
        name: NAMES[n].into(),
        value: "yes".into(),
    }))
}

fn and(items: Vec<proto::MatchExpr>) -> proto::MatchExpr {
    expr(Kind::And(proto::MatchList { exprs: items }))
}

fn now_ms() -> u64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(d.as_millis()).unwrap()
}

fn rule(i: usize, s: &RuleSpec) -> proto::Rule {
    let post = || expr(Kind::Method("POST".into()));
    let mut on = match s.kind {
        0 => path_expr(false, &s.text),
        1 => path_expr(true, &s.text),
        2 => header_expr(s.header),
        3 => and(vec![post(), path_expr(false, &s.text)]),
        4 => and(vec![header_expr(s.header), path_expr(true, &s.text)]),
        5 => post(),
        _ => expr(Kind::Or(proto::MatchList {
            exprs: vec![header_expr(s.header), path_expr(false, &s.text)],
        })),
    };
    if s.outbound {
        on = and(vec![expr(Kind::CallsTo("inv".into())), on]);
    }
    proto::Rule {
        name: format!("svc/r{i}"),
        on: Some(on),
        direction: if s.outbound {
            proto::Direction::Outbound as i32
        } else {
            proto::Direction::Inbound as i32
        },
        mode: proto::Mode::Enforce as i32,
        expires_at_unix_ms: match s.expiry {
            0 => 0,
            1 => now_ms() + 3_600_000,
            _ => now_ms() - 3_600_000,
        },
        spec: Some(proto::rule::Spec::Bulkhead(proto::Bulkhead {
            max_concurrent: 1000,
            timeout_ms: s.timeout_ms,
            reject_status: proto::RuleKind::Bulkhead.reject_status(),
            reject_grpc_status: proto::RuleKind::Bulkhead.reject_grpc() as i32,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A request of the property: its path, method, headers and direction.
#[derive(Clone, Debug)]
struct Req {
    path: String,
    post: bool,
    /// Which of [`NAMES`] it sends with the value `yes`, and whether in
    /// upper case (raw headers only: a map's names are lower case).
    headers: Vec<(usize, bool)>,
    /// Headers besides, to pass the number of names scanned.
    extra: usize,
    raw: bool,
    /// Outbound to `inv` (or to `other`).
    outbound: Option<bool>,
}

/// The path of a request: a random one, or a rule's text cut or grown by
/// one or two bytes.
fn req(rules: usize) -> impl Strategy<Value = (Req, Option<(usize, i8)>)> {
    (
        text(),
        proptest::option::of((0..rules.max(1), -2i8..=2)),
        proptest::bool::ANY,
        proptest::collection::vec((0..NAMES.len(), proptest::bool::ANY), 0..3),
        prop_oneof![3 => Just(0usize), 1 => 15usize..20],
        proptest::bool::ANY,
        proptest::option::weighted(0.3, proptest::bool::ANY),
    )
        .prop_map(|(path, near, post, headers, extra, raw, outbound)| {
            (
                Req {
                    path,
                    post,
                    headers,
                    extra,
                    raw,
                    outbound,
                },
                near,
            )
        })
}

fn eval_path(exact: bool, text: &str, path: &str) -> bool {
    if exact {
        path == text
    } else {
        path.starts_with(text)
    }
}

/// Whether rule `s` matches `r` (with the service's case folding), by hand.
fn expected(s: &RuleSpec, r: &Req, insensitive: bool) -> bool {
    if s.expiry == 2 || s.outbound != (r.outbound.is_some()) {
        return false;
    }
    if s.outbound && r.outbound != Some(true) {
        return false;
    }
    let fold = insensitive && !s.outbound;
    let (text, path) = if fold {
        (s.text.to_ascii_lowercase(), r.path.to_ascii_lowercase())
    } else {
        (s.text.clone(), r.path.clone())
    };
    // A header's first value: the names are sent once each (repeats keep
    // the first, which is also `yes`).
    let has = |n: usize| r.headers.iter().any(|&(h, _)| h == n);
    match s.kind {
        0 => eval_path(false, &text, &path),
        1 => eval_path(true, &text, &path),
        2 => has(s.header),
        3 => r.post && eval_path(false, &text, &path),
        4 => has(s.header) && eval_path(true, &text, &path),
        5 => r.post,
        _ => has(s.header) || eval_path(false, &text, &path),
    }
}

/// The rules `e` names for `r`, sorted, and the call's deadline in
/// seconds (decided twice: the second decision reads this thread's cached
/// snapshot).
fn decided(e: &Engine, r: &Req) -> [(Vec<String>, Option<u64>); 2] {
    let method = if r.post { Method::POST } else { Method::GET };
    let mut map = HeaderMap::new();
    let mut raw_names: Vec<String> = Vec::new();
    for i in 0..r.extra {
        let name = format!("x-h{i:02}");
        map.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_static("1"),
        );
        raw_names.push(name);
    }
    for &(n, upper) in &r.headers {
        map.append(NAMES[n], HeaderValue::from_static("yes"));
        raw_names.push(if upper {
            NAMES[n].to_ascii_uppercase()
        } else {
            NAMES[n].to_string()
        });
    }
    let raw: Vec<httparse::Header<'_>> = raw_names
        .iter()
        .map(|n| httparse::Header {
            name: n,
            value: if n.starts_with("x-h") { b"1" } else { b"yes" },
        })
        .collect();
    let mut info = RequestInfo::inbound(&method, &r.path, &map);
    if r.raw {
        info.headers = Headers::Raw(&raw);
    }
    if let Some(inv) = r.outbound {
        info.direction = gov_engine::Direction::Outbound;
        info.target = Some(Target {
            service: if inv { "inv" } else { "other" },
            instance: None,
        });
    }
    std::array::from_fn(|_| {
        let Decision::Admitted(a) = e.try_admit(&info) else {
            panic!("a bulkhead of 1000 refused a call");
        };
        let mut names: Vec<String> = a.rules().map(|(n, _)| n.to_string()).collect();
        names.sort();
        (names, a.timeout().map(|t| t.as_secs()))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]
    #[test]
    fn a_decision_names_exactly_the_rules_that_match(
        specs in proptest::collection::vec(rule_spec(), 0..90),
        reqs in proptest::collection::vec(req(90), 1..8),
        insensitive in proptest::bool::ANY,
        flip in proptest::bool::ANY,
    ) {
        // Mostly outbound rules, for as many outbound exact paths.
        let specs: Vec<RuleSpec> = specs
            .into_iter()
            .map(|s| RuleSpec { outbound: s.outbound != flip, ..s })
            .collect();
        let t = proto::TargetConfig {
            service: "svc".into(),
            rules: specs.iter().enumerate().map(|(i, s)| rule(i, s)).collect(),
            paths: if insensitive {
                proto::PathDialect::StrictCaseInsensitive as i32
            } else {
                proto::PathDialect::Strict as i32
            },
            ..gov_proto::compiled::target("svc")
        };
        let e = Engine::empty("svc");
        let applied = e.apply_target(&t);
        prop_assume!(applied.is_ok(), "{:?}", applied.err());
        for (mut r, near) in reqs {
            if let Some((i, delta)) = near
                && let Some(s) = specs.get(i)
            {
                let mut p = s.text.clone();
                match delta {
                    d if d < 0 => {
                        // Bytes off, down to a character's boundary.
                        let mut at = p.len().saturating_sub(d.unsigned_abs() as usize).max(1);
                        while !p.is_char_boundary(at) {
                            at -= 1;
                        }
                        p.truncate(at);
                    }
                    0 => {}
                    d => p.push_str(&"/x"[..d as usize]),
                }
                r.path = p;
            }
            let matched = || specs.iter().enumerate().filter(|(_, s)| expected(s, &r, insensitive));
            let mut names: Vec<String> = matched().map(|(i, _)| format!("svc/r{i}")).collect();
            names.sort();
            // The shortest deadline of a matched rule.
            let deadline = matched().filter_map(|(_, s)| (s.timeout_ms > 0).then_some(s.timeout_ms)).min();
            let want = (names, deadline.map(|ms| ms / 1000));
            let [first, cached] = decided(&e, &r);
            prop_assert_eq!(&first, &want, "{:?}", r);
            prop_assert_eq!(&cached, &want, "{:?} (cached)", r);
        }
    }
}
