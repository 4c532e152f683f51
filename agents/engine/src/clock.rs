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

use std::hash::{Hash, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Duration;

use tokio::time::Instant;

/// How long before the first read the base lies: every instant the engine
/// sees (a paused clock starts at the real time its runtime was built, and
/// only moves forward) is after it.
const BEFORE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

const NANOS_PER_SEC: u32 = 1_000_000_000;

/// The process-wide base, and its fields when reading them from an
/// instant's `Hash` subtracts as instants do: its seconds and nanoseconds,
/// and both in nanoseconds (within [`NEAR_NS`]).
struct Base {
    at: Instant,
    parts: Option<((i64, u32), i64)>,
}

/// The largest magnitude of the base's fields in nanoseconds that
/// [`since_base`] subtracts from without overflow (2^62, 146 years from
/// the clock's zero).
const NEAR_NS: i64 = 1 << 62;

/// The base's fields in nanoseconds ([`Base::parts`]) once the base is
/// set, when they hold; 0 before, or where they do not (issue 39: a read
/// tests this one word, not the base's cell and then its fields).
static BASE_NS: AtomicI64 = AtomicI64::new(0);

/// The seconds below which a read's fields go to [`near`]: 2^31 (its
/// seconds fit an `i32`) once [`BASE_NS`] is set, stored after it; 0
/// before, or where the base's fields do not hold (issue 39: a read tests
/// its seconds against this one word, not the base and then their range).
static NEAR_SECS: AtomicU64 = AtomicU64::new(0);

/// [`NEAR_SECS`] once set: seconds from 0 to `i32::MAX`.
const NEAR_SECS_SET: u64 = 1 << 31;

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let now = Instant::now();
        let at = now.checked_sub(BEFORE).unwrap_or(now);
        let parts = parts(at)
            .filter(|&p| subtracts_as_instants(at, p))
            .and_then(|p| Some((p, in_ns(p).filter(|n| n.abs() <= NEAR_NS)?)));
        if let Some((_, from_ns)) = parts {
            BASE_NS.store(from_ns, Release);
            NEAR_SECS.store(NEAR_SECS_SET, Release);
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

/// The fields `p` in nanoseconds, when that fits.
fn in_ns(p: (i64, u32)) -> Option<i64> {
    p.0.checked_mul(i64::from(NANOS_PER_SEC))?
        .checked_add(i64::from(p.1))
}

/// [`since`] from the base's fields `from`, `from_ns` in nanoseconds (at
/// most [`NEAR_NS`] from zero): for an instant whose seconds fit in an
/// `i32` (68 years from the clock's zero), one compare and a subtraction
/// of nanoseconds that cannot overflow (issue 39: a read's conversion).
#[inline]
fn since_base(to: (i64, u32), from: (i64, u32), from_ns: i64) -> u64 {
    match i32::try_from(to.0) {
        Ok(secs) => near(secs, to.1, from_ns),
        Err(_) => since(to, from),
    }
}

/// Nanoseconds from `from_ns` (at most [`NEAR_NS`] from zero) to `secs`
/// seconds and `nsec` nanoseconds (0 when earlier).
#[inline]
fn near(secs: i32, nsec: u32, from_ns: i64) -> u64 {
    // At most 2^31 s (2.2e18 ns) plus a second from zero, less at most
    // 2^62 (4.6e18) ns: within an `i64`.
    let to_ns = i64::from(secs) * i64::from(NANOS_PER_SEC) + i64::from(nsec);
    u64::try_from(to_ns - from_ns).unwrap_or(0)
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
    let near_secs = NEAR_SECS.load(Acquire);
    let mut p = Parts::default();
    at.hash(&mut p);
    // Negative seconds, as a `u64`, are past 2^63: never below.
    if (p.sec as u64) < near_secs {
        // Below 2^31: an `i32`; the base is set (stored before
        // `NEAR_SECS`, which this read saw set).
        return near(p.sec as i32, p.nsec, BASE_NS.load(Relaxed));
    }
    ns_of_base(at)
}

/// [`ns`] before the base is set, of an instant whose seconds do not fit
/// in an `i32`, or where [`parts`] does not hold.
#[cold]
#[inline(never)]
fn ns_of_base(at: Instant) -> u64 {
    let base = base();
    if let Some((from, from_ns)) = base.parts {
        let mut p = Parts::default();
        at.hash(&mut p);
        return since_base((p.sec, p.nsec), from, from_ns);
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
        let from_ns = base().parts.map(|(_, n)| n);
        assert!(from_ns.is_some());
        assert_eq!(Some(BASE_NS.load(Acquire)), from_ns);
        assert_eq!(NEAR_SECS.load(Acquire), NEAR_SECS_SET);
        let now = Instant::now();
        assert_eq!(ns(now), ns_of_base(now));
    }

    /// Instants whose seconds are negative or past `i32::MAX` read as
    /// subtraction says, not through `near` (issue 39: `ns` tests their
    /// seconds with one unsigned compare).
    #[test]
    fn seconds_out_of_i32_read_as_subtraction_says() {
        let b = base();
        let now = Instant::now();
        let secs = parts(now).map_or(0, |p| p.0.unsigned_abs());
        for d in [1 << 31, (1 << 40) + 123, 1 << 32] {
            let d = Duration::from_secs(d);
            let at = [
                now.checked_add(d),
                now.checked_sub(d + Duration::from_secs(secs)),
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

    /// The difference from the base's fields in nanoseconds is the one of
    /// [`since`], within [`NEAR_NS`] and for any instant.
    #[test]
    fn nanoseconds_from_the_base_subtract_as_fields_do() {
        let secs = [
            i64::MIN,
            -(NEAR_NS / 1_000_000_000) - 1,
            -(NEAR_NS / 1_000_000_000),
            -3_155_760_000,
            i64::from(i32::MIN) - 1,
            i64::from(i32::MIN),
            -1,
            0,
            1,
            86_400,
            i64::from(i32::MAX),
            i64::from(i32::MAX) + 1,
            NEAR_NS / 1_000_000_000,
            i64::MAX,
        ];
        let nanos = [0, 1, 999_999_999];
        for &fs in &secs {
            for &fn_ in &nanos {
                let from = (fs, fn_);
                let Some(from_ns) = in_ns(from).filter(|n| n.abs() <= NEAR_NS) else {
                    continue;
                };
                for &ts in &secs {
                    for &tn in &nanos {
                        let to = (ts, tn);
                        assert_eq!(
                            since_base(to, from, from_ns),
                            since(to, from),
                            "{to:?} - {from:?}"
                        );
                    }
                }
            }
        }
    }
}
