//! The engine's clock, read through `tokio::time` (paused in tests): each
//! read is turned once into nanoseconds since one process-wide base, so each
//! windowed rule works out its milliseconds from its epoch (kept in
//! nanoseconds since the same base) with integer arithmetic. The results are
//! those of `now.saturating_duration_since(epoch)`, exactly: both are whole
//! nanoseconds since the base.
//!
//! A read's nanoseconds come from the seconds and nanoseconds the instant
//! holds, as its `Hash` writes them (issue 39: `Instant` has no other way
//! to its fields, and a subtraction of two is a call into std of about 35
//! instructions); the base checks, once, that what `Hash` writes subtracts
//! as `Instant`s do, and where it does not every read subtracts the base.
//! The base is a whole second: a read's nanoseconds are its whole seconds
//! since the base, times 10^9, plus its own nanoseconds.

use std::hash::{Hash, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::Duration;

use tokio::time::Instant;

/// How long before the first read the base lies: every instant the engine
/// sees (a paused clock starts at the real time its runtime was built, and
/// only moves forward) is after it.
const BEFORE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

const NANOS_PER_SEC: u32 = 1_000_000_000;

/// The process-wide base, a whole second (issue 39: a read then adds its
/// nanoseconds to its whole seconds since the base, with nothing to
/// subtract or saturate), and its fields when reading them from an
/// instant's `Hash` subtracts as instants do (its nanoseconds 0 then).
struct Base {
    at: Instant,
    parts: Option<(i64, u32)>,
}

/// The base's seconds ([`Base::parts`], as a `u64`) negated, once the
/// base is set, when they hold; 0 before, or where they do not: what a read
/// adds to its seconds (issue 39: an add that leaves the read's seconds as
/// they are, one `lea`, where a subtraction overwrites them).
static TO_BASE_SECS: AtomicU64 = AtomicU64::new(0);

/// The whole seconds since the base below which a read goes to [`near`]:
/// [`SPAN_SECS_SET`] once [`TO_BASE_SECS`] is set, stored after it; 0 before,
/// or where the base's fields do not hold (issue 39: a read tests its
/// seconds since the base against this one word, which also tells it is
/// after the base).
static SPAN_SECS: AtomicU64 = AtomicU64::new(0);

/// [`SPAN_SECS`] once set: 2^33 s (272 years), whose nanoseconds, and a
/// second more, fit in a `u64`.
const SPAN_SECS_SET: u64 = 1 << 33;

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let now = Instant::now();
        let mut at = now.checked_sub(BEFORE).unwrap_or(now);
        // Back to its whole second, where the fields say which.
        if let Some(whole) =
            parts(at).and_then(|(_, n)| at.checked_sub(Duration::from_nanos(u64::from(n))))
        {
            at = whole;
        }
        let parts = parts(at).filter(|&p| p.1 == 0 && fits(p.0) && subtracts_as_instants(at, p));
        if let Some((secs, _)) = parts {
            TO_BASE_SECS.store((secs as u64).wrapping_neg(), Release);
            SPAN_SECS.store(SPAN_SECS_SET, Release);
        }
        Base { at, parts }
    })
}

/// What an instant's `Hash` writes: on Unix its seconds (`i64`) then its
/// nanoseconds (`u32`). Anything else is marked `odd`.
#[derive(Default)]
struct Parts {
    sec: i64,
    nsec: u32,
    writes: u8,
    odd: bool,
}

impl Hasher for Parts {
    fn finish(&self) -> u64 {
        0
    }

    fn write(&mut self, _: &[u8]) {
        self.odd = true;
    }

    #[inline]
    fn write_i64(&mut self, v: i64) {
        self.odd |= self.writes != 0;
        self.sec = v;
        self.writes += 1;
    }

    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.odd |= self.writes != 1;
        self.nsec = v;
        self.writes += 1;
    }
}

/// The seconds and nanoseconds `at` holds, when its `Hash` writes them as
/// [`Parts`] reads them.
fn parts(at: Instant) -> Option<(i64, u32)> {
    let mut p = Parts::default();
    at.hash(&mut p);
    (p.writes == 2 && !p.odd && p.nsec < NANOS_PER_SEC).then_some((p.sec, p.nsec))
}

/// Whether instants after `at` (whose fields are `at_parts`), read by
/// [`parts`], are as far from it as `Instant` subtraction says.
fn subtracts_as_instants(at: Instant, at_parts: (i64, u32)) -> bool {
    [
        1,
        999_999_999,
        1_000_000_000,
        1_500_000_001,
        86_400_000_000_123,
    ]
    .into_iter()
    .map(Duration::from_nanos)
    .all(|d| {
        at.checked_add(d).is_some_and(|later| {
            parts(later).is_some_and(|p| {
                since(p, at_parts) == later.saturating_duration_since(at).as_nanos() as u64
            })
        })
    })
}

/// Nanoseconds from the fields `from` to the fields `to` (0 when `to` is
/// earlier), saturated.
#[inline]
fn since(to: (i64, u32), from: (i64, u32)) -> u64 {
    /// Whole seconds whose nanoseconds fit in 63 bits (292 years).
    const FIT: u64 = 9_000_000_000;
    match to.0.checked_sub(from.0).map(u64::try_from) {
        // One compare on the hot path: the seconds apart are in range.
        Some(Ok(secs)) if secs < FIT => {
            (secs * u64::from(NANOS_PER_SEC) + u64::from(to.1)).saturating_sub(u64::from(from.1))
        }
        _ => since_far(to, from),
    }
}

/// Whether a base of `secs` seconds leaves the span after it within an
/// `i64` of seconds: then no instant's seconds wrap into it ([`near`]).
fn fits(secs: i64) -> bool {
    secs <= i64::MAX - SPAN_SECS_SET as i64
}

/// Nanoseconds from the base (whose seconds, as a `u64` and negated, are
/// `to_base`, which [`fits`], and nanoseconds 0) to `secs` seconds and `nsec` nanoseconds, when they
/// are less than `span` ([`SPAN_SECS_SET`] at most) whole seconds after it:
/// one subtraction and one compare (issue 39: a read's conversion).
#[inline]
fn near(secs: i64, nsec: u32, to_base: u64, span: u64) -> Option<u64> {
    // Seconds before the base wrap past any span.
    let whole = (secs as u64).wrapping_add(to_base);
    (whole < span).then(|| whole * u64::from(NANOS_PER_SEC) + u64::from(nsec))
}

/// [`since`] of instants 292 years or more apart, or in the wrong order.
#[cold]
fn since_far(to: (i64, u32), from: (i64, u32)) -> u64 {
    let secs = to.0.saturating_sub(from.0);
    let nanos = i64::from(to.1) - i64::from(from.1);
    match u64::try_from(secs) {
        Ok(secs) => secs
            .saturating_mul(u64::from(NANOS_PER_SEC))
            .saturating_add_signed(nanos),
        Err(_) => 0,
    }
}

/// Nanoseconds from the base to `at`.
#[inline]
pub(crate) fn ns(at: Instant) -> u64 {
    let span = SPAN_SECS.load(Acquire);
    let mut p = Parts::default();
    at.hash(&mut p);
    // The base is set when `span` is (stored before it, which this read
    // saw set).
    match near(p.sec, p.nsec, TO_BASE_SECS.load(Relaxed), span) {
        Some(ns) => ns,
        None => ns_of_base(at),
    }
}

/// [`ns`] before the base is set, of an instant before it or
/// [`SPAN_SECS_SET`] seconds or more after it, or where [`parts`] does not
/// hold.
#[cold]
#[inline(never)]
fn ns_of_base(at: Instant) -> u64 {
    let base = base();
    if let Some(from) = base.parts {
        let mut p = Parts::default();
        at.hash(&mut p);
        return since((p.sec, p.nsec), from);
    }
    slow_ns(base, at)
}

/// [`ns`] by `Instant` subtraction, where [`parts`] does not hold.
#[cold]
#[inline(never)]
fn slow_ns(base: &Base, at: Instant) -> u64 {
    // `as_nanos` without its 128-bit product: whole seconds since the base
    // (about a century, times 10^9, fits in 64 bits; saturated past that).
    let d = at.saturating_duration_since(base.at);
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

/// One clock read, as its nanoseconds since the base: one word to pass
/// and keep (issue 39: the instant beside it was two more, copied with
/// every step and record); [`Now::at`] gives the instant back, exactly.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now {
    ns: u64,
}

impl Now {
    /// Reads the clock.
    #[inline]
    pub(crate) fn read() -> Self {
        Self::from(Instant::now())
    }

    /// Whole milliseconds from `epoch_ns` (nanoseconds since the base) to
    /// this read; 0 before it.
    #[inline]
    pub(crate) fn ms_since(self, epoch_ns: u64) -> u64 {
        self.ns.saturating_sub(epoch_ns) / 1_000_000
    }

    /// Nanoseconds from the base to this read.
    #[inline]
    pub(crate) fn ns(self) -> u64 {
        self.ns
    }

    /// The read `ns` nanoseconds after the base.
    #[cfg(test)]
    pub(crate) fn from_ns(ns: u64) -> Self {
        Self { ns }
    }

    /// The instant of this read: the base plus its nanoseconds, which is
    /// the instant read for every instant at or after the base (all the
    /// engine sees: [`BEFORE`]).
    pub(crate) fn at(self) -> Instant {
        let base = base().at;
        base.checked_add(Duration::from_nanos(self.ns))
            .unwrap_or(base)
    }

    /// Nanoseconds from `earlier` to this read (0 if it is later).
    #[inline]
    pub(crate) fn nanos_since(self, earlier: Now) -> u64 {
        self.ns.saturating_sub(earlier.ns)
    }
}

impl From<Instant> for Now {
    #[inline]
    fn from(at: Instant) -> Self {
        Self { ns: ns(at) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Milliseconds and durations as `saturating_duration_since` gives them.
    #[tokio::test(start_paused = true)]
    async fn reads_subtract_as_instants_do() {
        let epoch = Instant::now();
        let epoch_ns = ns(epoch);
        for step_ns in [
            0,
            1,
            999_999,
            1_000_000,
            1_000_001,
            1_999_999_999,
            7_000_000_123,
        ] {
            tokio::time::advance(Duration::from_nanos(step_ns)).await;
            let now = Now::read();
            let d = now.at().saturating_duration_since(epoch);
            assert_eq!(now.ms_since(epoch_ns), d.as_millis() as u64);
            assert_eq!(now.nanos_since(Now::from(epoch)), d.as_nanos() as u64);
        }
        let now = Now::read();
        let later = Now::from(now.at() + Duration::from_millis(5));
        assert_eq!(now.ms_since(later.ns()), 0);
        assert_eq!(now.nanos_since(later), 0);
    }

    /// A read's instant is the one read, from its nanoseconds alone.
    #[test]
    fn a_read_gives_its_instant_back() {
        let now = Instant::now();
        for step_ns in [0, 1, 999_999_999, 1_000_000_000, 86_400_000_000_123] {
            let at = now + Duration::from_nanos(step_ns);
            assert_eq!(Now::from(at).at(), at);
        }
        assert_eq!(Now::from(base().at).at(), base().at);
    }

    /// The fields an instant's `Hash` writes give what subtraction does,
    /// at and before the base too.
    #[test]
    fn fields_and_subtraction_agree() {
        let b = base();
        let now = Instant::now();
        for step_ns in [0, 1, 999_999_999, 1_000_000_000, 123_456_789_012] {
            let at = now + Duration::from_nanos(step_ns);
            assert_eq!(ns(at), slow_ns(b, at));
        }
        assert_eq!(ns(b.at), 0);
        if let Some(earlier) = b.at.checked_sub(Duration::from_nanos(1)) {
            assert_eq!(ns(earlier), 0);
            assert_eq!(slow_ns(b, earlier), 0);
        }
    }

    /// On Unix (the agent's platforms) reads take the fields, not the
    /// subtraction: a std whose `Instant` hashes otherwise fails here, and
    /// its reads cost a subtraction each (issue 39).
    #[cfg(unix)]
    #[test]
    fn on_unix_reads_take_the_fields() {
        let from = base().parts;
        assert_eq!(from.map(|(_, n)| n), Some(0), "a whole second");
        let to_base = TO_BASE_SECS.load(Acquire);
        assert_eq!(Some(to_base), from.map(|(s, _)| (s as u64).wrapping_neg()));
        assert_eq!(SPAN_SECS.load(Acquire), SPAN_SECS_SET);
        let now = Instant::now();
        assert_eq!(ns(now), ns_of_base(now));
        let p = parts(now).unwrap();
        assert!(near(p.0, p.1, to_base, SPAN_SECS_SET).is_some());
    }

    /// Instants before the base, or its span or more after it, read as
    /// subtraction says, not through `near` (issue 39: `ns` tests their
    /// seconds since the base with one unsigned compare).
    #[test]
    fn seconds_out_of_the_span_read_as_subtraction_says() {
        let b = base();
        let now = Instant::now();
        let since = Duration::from_nanos(ns(now));
        for d in [
            SPAN_SECS_SET - 1,
            SPAN_SECS_SET,
            SPAN_SECS_SET + 1,
            1 << 31,
            1 << 32,
            (1 << 40) + 123,
        ] {
            let d = Duration::from_secs(d);
            let at = [
                b.at.checked_add(d),
                b.at.checked_add(d - Duration::from_nanos(1)),
                now.checked_add(d),
                now.checked_sub(d + since),
                now.checked_sub(since + Duration::from_nanos(1)),
            ];
            for at in at.into_iter().flatten() {
                assert_eq!(ns(at), slow_ns(b, at), "{:?}", parts(at));
            }
        }
    }

    /// The one-compare difference of fields is the saturated one.
    #[test]
    fn fields_subtract_saturated() {
        let cases = [
            ((5, 10), (5, 10)),
            ((5, 9), (5, 10)),
            ((6, 0), (5, 999_999_999)),
            ((4, 0), (5, 0)),
            ((8_999_999_999, 5), (0, 7)),
            ((9_000_000_000, 5), (0, 7)),
            ((i64::MAX, 999_999_999), (0, 0)),
            ((i64::MAX, 0), (i64::MIN, 0)),
            ((i64::MIN, 0), (i64::MAX, 0)),
        ];
        for (to, from) in cases {
            assert_eq!(since(to, from), since_far(to, from), "{to:?} - {from:?}");
        }
        assert_eq!(since((6, 0), (5, 999_999_999)), 1);
        assert_eq!(since((5, 9), (5, 10)), 0);
        assert_eq!(since((i64::MAX, 0), (0, 0)), u64::MAX);
    }

    /// The nanoseconds from a base of a whole second are the ones of
    /// [`since`] when `near` gives them, and `near` gives them for every
    /// instant from the base to its span.
    #[test]
    fn nanoseconds_from_the_base_subtract_as_fields_do() {
        let span = SPAN_SECS_SET as i64;
        let secs = [
            i64::MIN,
            -span - 1,
            -3_155_760_000,
            i64::from(i32::MIN) - 1,
            -1,
            0,
            1,
            86_400,
            i64::from(i32::MAX),
            i64::from(i32::MAX) + 1,
            span - 1,
            span,
            span + 1,
            i64::MAX - span,
            i64::MAX - span + 1,
            i64::MAX - 1,
            i64::MAX,
        ];
        let nanos = [0, 1, 999_999_999];
        for &fs in secs.iter().filter(|&&s| fits(s)) {
            for &ts in &secs {
                for &tn in &nanos {
                    let near = near(ts, tn, (fs as u64).wrapping_neg(), SPAN_SECS_SET);
                    let want = since((ts, tn), (fs, 0));
                    let within = i128::from(ts) - i128::from(fs);
                    assert_eq!(near.is_some(), (0..i128::from(span)).contains(&within));
                    if let Some(near) = near {
                        assert_eq!(near, want, "{ts}.{tn} - {fs}");
                    }
                }
            }
        }
        // Before the base is set nothing is near.
        assert_eq!(near(0, 0, 0, 0), None);
    }
}
