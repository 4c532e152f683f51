//! The order of the steps of a decision, apart from the primitives so that
//! routing (which orders a request's rules by it) and the primitives (which
//! each name theirs) both read it without reading each other.

/// The order of the steps of a decision: fuses (cheapest, and they refuse
/// everyone), then limits, then bulkheads (the only step that holds a
/// resource another call may be waiting for), then retry rules (which
/// refuse nothing: a call admitted by every other rule credits their
/// budgets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    Fuses,
    Limits,
    Bulkheads,
    Retries,
}
