//! Criticality (Google's classes): a named match may be declared
//! `critical`, `default` or `sheddable`, and a call's class is that of the
//! most critical such match it meets in its service (`default` otherwise).
//!
//! The class is worked out once per call, in the decision's routing, and
//! only for a config that declares one (`config/classes.rs`; one load
//! otherwise): the critical matches are tried first, the rest only when a
//! sheddable match could lower the call's class. Bulkheads read it when a
//! call finds no permit (`state/bulkhead/queue.rs`): a sheddable call fails
//! fast, a critical one is served before the others and may displace a
//! lower-class waiter from a full queue. Limits without a key read it in
//! their scope (`state/limit.rs`): a sheddable call leaves the last tenth of
//! a window to the others.

/// A call's criticality, lowest first (so `max` is the most critical).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Refused at once when no permit is free; never waits.
    Sheddable,
    /// Waits as the bulkhead allows.
    #[default]
    Default,
    /// Waits as the bulkhead allows, served before lower classes.
    Critical,
}

impl Class {
    /// The word of the language and of `/metrics`.
    pub fn word(self) -> &'static str {
        match self {
            Class::Sheddable => "sheddable",
            Class::Default => "default",
            Class::Critical => "critical",
        }
    }
}
