//! Hostile input never panics the parser: arbitrary bytes, token soup built
//! from the grammar's own words, and a checked-in corpus of awkward files
//! replayed on every run. Whatever parses must also format idempotently.

use proptest::prelude::*;

/// Parses `src`; if it parses, formatting must read back as the same tree
/// and be idempotent. If not, error recovery must agree with `parse` on the
/// first error and stay within its bound.
fn check(src: &str) {
    super::common::same_as_strict(src);
    let tree = match gov_lang::parse_all("fuzz.gov", src) {
        Ok(tree) => tree,
        Err(errors) => {
            assert!((1..=gov_lang::MAX_SYNTAX_ERRORS).contains(&errors.len()));
            let first = gov_lang::parse("fuzz.gov", src).unwrap_err();
            assert_eq!(first.message(), errors[0].message());
            return;
        }
    };
    let text = gov_lang::format(&tree, src);
    let back = gov_lang::parse("fuzz.gov", &text).unwrap_or_else(|e| {
        panic!("formatted text does not parse: {e}\n--- input\n{src}\n--- formatted\n{text}")
    });
    assert_eq!(
        back, tree,
        "formatting changed the tree\n--- input\n{src}\n--- formatted\n{text}"
    );
    let again = gov_lang::format(&back, &text);
    assert_eq!(
        again, text,
        "formatting is not idempotent\n--- input\n{src}"
    );
    // `==` on trees ignores comments: compare them, in order, as written.
    assert_eq!(
        super::common::comment_texts(&back),
        super::common::comment_texts(&tree),
        "comments lost or changed\n--- input\n{src}\n--- formatted\n{text}"
    );
}

/// Words, literals and punctuation of the language, plus a few near misses.
const TOKENS: &[&str] = &[
    "registry",
    "service",
    "domain",
    "consumer",
    "from",
    "header",
    "capacity",
    "workers",
    "instances",
    "rate",
    "per",
    "match",
    "=",
    "latency",
    "path",
    "exact",
    "prefix",
    "method",
    "calls",
    "to",
    "any",
    "and",
    "or",
    "(",
    ")",
    "bulkhead",
    "on",
    "{",
    "}",
    "max_concurrent",
    "max_wait",
    "queue",
    "timeout",
    "reject",
    "with",
    "instance",
    "operation",
    "isolation",
    "semaphore",
    "pool",
    "limit",
    "bytes",
    "all",
    "action",
    "shape",
    "max_delay",
    "release",
    "after",
    "manual",
    "scope",
    "local",
    "cluster",
    "sync",
    "batch",
    "fuse",
    "trip",
    "when",
    "errors",
    "error_ratio",
    "business_errors",
    ">",
    ">=",
    "over",
    "min_calls",
    "slow_call_ratio",
    "slower",
    "than",
    "classify",
    "business",
    "system",
    "status",
    "500..599",
    "connect_failure",
    "reset",
    "recover",
    "probe",
    "warmup",
    "ready",
    "http",
    "GET",
    "is",
    "every",
    "register",
    "ramp",
    "start",
    "via",
    "signal",
    "SIGTERM",
    "shutdown",
    "deregister",
    "wait",
    "for",
    "stop",
    "drain",
    "server_cache",
    "client_refresh",
    "balancer_refresh",
    "business_error_ratio",
    "system_errors",
    "system_error_ratio",
    "0",
    "10",
    "-1",
    "99999999999999999999",
    "10ms",
    "1min",
    "2h",
    "10KiB",
    "5MB",
    "1s",
    "3m",
    "7h",
    "100B",
    "2kB",
    "1GB",
    "1GiB",
    "1MiB",
    "50%",
    "12.125%",
    "12.3456%",
    "\"/a\"",
    "\"a\\\"b\"",
    "\"#\"",
    "\"\\q\"",
    "\"open",
    "'x'",
    "#c\n",
    "\n",
    "\n\n",
    "\t",
    "x",
    "a-b",
    "_",
    "é",
    "\u{feff}",
    "..",
    "%",
    ".",
    "\r\n",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn token_soup_never_panics(
        tokens in proptest::collection::vec(proptest::sample::select(TOKENS), 0..60),
        sep in prop_oneof![Just(" "), Just("\n"), Just("")],
    ) {
        check(&tokens.join(sep));
    }
}

/// Arbitrary strings rarely parse; these start from every valid policy under
/// `examples/` and cut or duplicate a slice of it (about 60 places per file).
#[test]
fn mutated_examples_never_panic() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let mut files = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "gov") {
            continue;
        }
        files += 1;
        let src = std::fs::read_to_string(&path).unwrap();
        let bytes = src.as_bytes();
        let step = (bytes.len() / 60).max(1);
        for cut in (0..bytes.len()).step_by(step) {
            for len in [1, 7, 40] {
                let end = (cut + len).min(bytes.len());
                let mut removed = bytes[..cut].to_vec();
                removed.extend_from_slice(&bytes[end..]);
                check(&String::from_utf8_lossy(&removed));
                let mut doubled = bytes[..end].to_vec();
                doubled.extend_from_slice(&bytes[cut..]);
                check(&String::from_utf8_lossy(&doubled));
            }
        }
    }
    assert!(files >= 8, "only {files} examples in {dir}");
}

/// Every file in `tests/corpus/` is replayed.
#[test]
fn corpus_replays() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        check(&String::from_utf8_lossy(&bytes));
        count += 1;
    }
    assert!(count >= 10, "the corpus in {dir} looks incomplete");
}
