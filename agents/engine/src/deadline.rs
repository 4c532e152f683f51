//! Deadlines that travel (issue 33): the caller's deadline of a request, the
//! refusal of a call whose deadline is used up before it is admitted (doomed
//! work), and the remaining time written on the request forwarded.
//!
//! A gRPC call carries its deadline in `grpc-timeout`; any other request in
//! `gov-timeout`, with the same grammar (at most 8 digits and a unit `H M S
//! m u n`: `1500m`, `2S`), so one parser and one writer serve both and an app
//! that copies a header onto its own calls copies it as it came. A value that
//! is malformed, or a header sent more than once, is no deadline: the call
//! goes on under its rules, and the header is not forwarded (the agent writes
//! only the values it computed). The deadline counts from when the request
//! reached the agent, so time spent waiting for a permit uses it up: a call
//! whose deadline passes before it is admitted is refused (504,
//! `DEADLINE_EXCEEDED`) without taking a permit, and counted
//! ([`Engine::doomed_calls`](crate::Engine::doomed_calls)). An admitted
//! call's deadline is the shorter of its caller's and its rules' timeout
//! ([`crate::Admission::timeout`]), and that is what the request forwarded
//! carries ([`crate::Admission::forwarded_deadline`]), never more than was
//! received.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

use crate::config::Direction;
use crate::grpc::{GRPC_TIMEOUT, parse_timeout};
use crate::rejection::{DeadlineEnd, Rejection};
use crate::route::Headers;

/// `gov-timeout`: the caller's deadline of a plain HTTP request (gRPC calls
/// use `grpc-timeout`), in `grpc-timeout`'s grammar.
pub const GOV_TIMEOUT: HeaderName = HeaderName::from_static("gov-timeout");

/// The header a call's deadline travels in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadlineHeader {
    /// `grpc-timeout`, of a gRPC call ([`crate::grpc::GrpcCall`]).
    Grpc,
    /// `gov-timeout`, of any other request.
    Gov,
}

impl DeadlineHeader {
    /// The header of a request that is a gRPC call (`grpc`) or not.
    pub fn of(grpc: bool) -> Self {
        if grpc { Self::Grpc } else { Self::Gov }
    }

    /// Its name.
    pub fn name(self) -> HeaderName {
        match self {
            Self::Grpc => GRPC_TIMEOUT,
            Self::Gov => GOV_TIMEOUT,
        }
    }
}

/// The deadline a caller gave a request: when its time is up, if it sent one
/// well-formed value of its [`DeadlineHeader`] (`now` is read only then).
pub fn read(
    header: DeadlineHeader,
    headers: Headers<'_>,
    now: impl FnOnce() -> Instant,
) -> Option<Instant> {
    let name = header.name();
    let value = match headers {
        Headers::Map(map) => {
            let mut all = map.get_all(&name).iter();
            let first = all.next()?;
            if all.next().is_some() {
                return None;
            }
            first.as_bytes()
        }
        Headers::Raw(raw) => {
            let mut found = None;
            for h in raw.iter().filter(|h| h.name.len() == name.as_str().len()) {
                if h.name.eq_ignore_ascii_case(name.as_str()) {
                    if found.is_some() {
                        return None;
                    }
                    found = Some(h.value);
                }
            }
            found?
        }
    };
    now().checked_add(parse_timeout(value)?)
}

/// Whether a caller's deadline `at` has passed at `now` (a call with none
/// never has).
#[inline]
pub fn passed(at: Option<Instant>, now: Instant) -> bool {
    at.is_some_and(|at| now >= at)
}

/// The value written for `remaining`, in the finest unit that holds it in
/// 8 digits, rounded down (so never more than the time left): `1499871u`,
/// `250000m`, `0u`.
pub fn format(remaining: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let units: [(u128, char); 5] = [
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    let nanos = remaining.as_nanos();
    let (n, unit) = units
        .iter()
        .map(|&(per, unit)| (nanos / per, unit))
        .find(|&(n, _)| n <= MAX)
        .unwrap_or((MAX, 'H'));
    HeaderValue::from_str(&format!("{n}{unit}")).unwrap_or(HeaderValue::from_static("0u"))
}

/// Writes the deadline of a forwarded request into `headers`: every copy
/// the caller sent of `header` is removed, and `remaining` written when the
/// call has a caller's deadline (`None`: none, or a malformed one).
pub fn write(headers: &mut HeaderMap, header: DeadlineHeader, remaining: Option<Duration>) {
    let name = header.name();
    match remaining {
        Some(left) => {
            headers.insert(name, format(left));
        }
        None => {
            if headers.contains_key(&name) {
                headers.remove(&name);
            }
        }
    }
}

/// The calls refused as doomed, by direction (inbound, outbound).
#[derive(Debug, Default)]
pub(crate) struct Doomed([AtomicU64; 2]);

impl Doomed {
    /// Counts a doomed call of `direction` and returns its refusal.
    #[cold]
    pub(crate) fn refuse(&self, direction: Direction) -> Rejection {
        self.0[direction as usize].fetch_add(1, Relaxed);
        Rejection::caller_deadline(DeadlineEnd::BeforeAdmission)
    }

    pub(crate) fn count(&self, direction: Direction) -> u64 {
        self.0[direction as usize].load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn raw<'a>(pairs: &'a [(&'a str, &'a str)]) -> Vec<httparse::Header<'a>> {
        pairs
            .iter()
            .map(|(k, v)| httparse::Header {
                name: k,
                value: v.as_bytes(),
            })
            .collect()
    }

    /// Both header forms read the same: one well-formed value is a deadline
    /// from `now`; a malformed, repeated, negative or oversize one is none.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_is_one_well_formed_value() {
        let now = Instant::now();
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<Duration>);
        let cases: [Case<'_>; 10] = [
            (
                &[("gov-timeout", "1500m")],
                Some(Duration::from_millis(1500)),
            ),
            (&[("Gov-Timeout", "2S")], Some(Duration::from_secs(2))),
            (&[("gov-timeout", "0m")], Some(Duration::ZERO)),
            (
                &[("gov-timeout", "99999999H")],
                Some(Duration::from_secs(99_999_999 * 3600)),
            ),
            (&[], None),
            (&[("gov-timeout", "-5m")], None),
            (&[("gov-timeout", "123456789m")], None),
            (&[("gov-timeout", "1.5S")], None),
            (&[("gov-timeout", "1S"), ("gov-timeout", "1S")], None),
            // The other header is not this call's.
            (&[("grpc-timeout", "1S")], None),
        ];
        for (pairs, want) in cases {
            let want = want.map(|d| now + d);
            let h = map(pairs);
            assert_eq!(
                read(DeadlineHeader::Gov, Headers::Map(&h), || now),
                want,
                "{pairs:?}"
            );
            let r = raw(pairs);
            assert_eq!(
                read(DeadlineHeader::Gov, Headers::Raw(&r), || now),
                want,
                "{pairs:?}"
            );
        }
        let h = map(&[("grpc-timeout", "100m"), ("gov-timeout", "1S")]);
        assert_eq!(
            read(DeadlineHeader::Grpc, Headers::Map(&h), || now),
            Some(now + Duration::from_millis(100))
        );
        let huge = "9".repeat(10_000) + "m";
        let h = map(&[("gov-timeout", &huge)]);
        assert_eq!(read(DeadlineHeader::Gov, Headers::Map(&h), || now), None);
    }

    /// Time passes on the deadline read: it is used up at its instant.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_is_used_up_as_time_passes() {
        let h = map(&[("gov-timeout", "250m")]);
        let at = read(DeadlineHeader::Gov, Headers::Map(&h), Instant::now);
        assert!(!passed(at, Instant::now()));
        tokio::time::advance(Duration::from_millis(249)).await;
        assert!(!passed(at, Instant::now()));
        assert_eq!(
            at.unwrap().saturating_duration_since(Instant::now()),
            Duration::from_millis(1)
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(passed(at, Instant::now()));
        assert!(!passed(None, Instant::now()));
    }

    /// Written in the finest unit that fits, rounded down; what is written
    /// reads back as at most the time left.
    #[test]
    fn values_are_written_in_the_finest_unit_rounded_down() {
        for (left, text) in [
            (Duration::from_nanos(999), "0u"),
            (Duration::from_micros(1_499_871), "1499871u"),
            (Duration::from_nanos(1_499_871_999), "1499871u"),
            (Duration::from_secs(100), "100000m"),
            (Duration::from_secs(3 * 24 * 3600), "259200S"),
            (Duration::from_secs(99_999_999 * 3600), "99999999H"),
            (Duration::MAX, "99999999H"),
        ] {
            let v = format(left);
            assert_eq!(v, text, "{left:?}");
            let back = parse_timeout(v.as_bytes()).unwrap();
            assert!(back <= left, "{left:?} wrote {text}");
        }
    }

    #[test]
    fn writing_replaces_every_copy_or_removes_them() {
        let mut h = map(&[
            ("gov-timeout", "5S"),
            ("gov-timeout", "x"),
            ("grpc-timeout", "1S"),
        ]);
        write(
            &mut h,
            DeadlineHeader::Gov,
            Some(Duration::from_millis(1200)),
        );
        assert_eq!(h.get_all("gov-timeout").iter().count(), 1);
        assert_eq!(h["gov-timeout"], "1200000u");
        assert_eq!(h["grpc-timeout"], "1S");
        write(&mut h, DeadlineHeader::Gov, None);
        assert!(h.get("gov-timeout").is_none());
    }
}
