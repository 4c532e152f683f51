//! [`Course`]: how far a call got, and whether its end has more to do than
//! give back plain holds, in one byte.

/// How far a call got. Recorded implies admitted: only an admitted call
/// is handed out to be recorded (a call no rule matched starts recorded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Progress {
    /// Refused, or waiting for a step (`Call::deciding`).
    Deciding,
    /// Every step passed: counted as admitted in every rule. Also while a
    /// decision runs its steps (from `Call::take`: nothing reads it then).
    Admitted,
    /// Its outcome was recorded (first call wins).
    Recorded,
}

/// A call's [`Progress`] (the low bits) and whether it is observed
/// ([`OBSERVED`]: it has a trace), keeps holds aside ([`ASIDE`]) or is
/// counted by fuses as a system error ([`SYSTEM_ERROR`]). Issue 39: the end
/// of most calls (at a progress, none of these) is told by one compare
/// ([`Course::plain_at`]), not by a test of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Course(u8);

/// The bits of [`Progress`].
const PROGRESS: u8 = 3;
/// The call has an observer (`Call::trace`).
const OBSERVED: u8 = 4;
/// Something was kept in `held`, `refused`, `waits` or `keyed`.
const ASIDE: u8 = 8;
/// Fuses count the call as a system error whatever its outcome.
const SYSTEM_ERROR: u8 = 16;

impl Course {
    /// At `progress`, observed by nothing, holding nothing aside.
    #[inline]
    pub(super) const fn at(progress: Progress) -> Self {
        Self(progress as u8)
    }

    #[inline]
    pub(super) fn is(self, progress: Progress) -> bool {
        self.0 & PROGRESS == progress as u8
    }

    #[inline]
    pub(super) fn set(&mut self, progress: Progress) {
        self.0 = self.0 & !PROGRESS | progress as u8;
    }

    /// At `progress`, and neither observed, nor holding anything aside,
    /// nor a system error.
    #[inline]
    pub(super) fn plain_at(self, progress: Progress) -> bool {
        self == Self::at(progress)
    }

    #[inline]
    pub(super) fn observed(&mut self) {
        self.0 |= OBSERVED;
    }

    #[inline]
    pub(super) fn count_as_system_error(&mut self) {
        self.0 |= SYSTEM_ERROR;
    }

    #[inline]
    pub(super) fn system_error(self) -> bool {
        self.0 & SYSTEM_ERROR != 0
    }

    #[inline]
    pub(super) fn aside(self) -> bool {
        self.0 & ASIDE != 0
    }

    #[inline]
    pub(super) fn set_aside(&mut self, aside: bool) {
        self.0 = if aside {
            self.0 | ASIDE
        } else {
            self.0 & !ASIDE
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The progress and the two flags are apart: setting one keeps the
    /// others, and a course is plain only without either flag.
    #[test]
    fn progress_and_flags_are_apart() {
        for p in [Progress::Deciding, Progress::Admitted, Progress::Recorded] {
            let mut c = Course::at(p);
            assert!(c.plain_at(p) && c.is(p) && !c.aside());
            c.set_aside(true);
            assert!(c.aside() && c.is(p) && !c.plain_at(p));
            c.observed();
            c.set_aside(false);
            assert!(!c.aside() && c.is(p) && !c.plain_at(p), "observed");
            c.set(Progress::Recorded);
            assert!(c.is(Progress::Recorded) && !c.plain_at(Progress::Recorded));
            let mut e = Course::at(p);
            e.count_as_system_error();
            assert!(e.system_error() && e.is(p) && !e.plain_at(p) && !e.aside());
            assert!(!c.system_error());
        }
    }
}
