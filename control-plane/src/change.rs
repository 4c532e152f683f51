//! One change of govd's shared state, as the write protocol
//! (`transact.rs`) runs it: what it audits, what it stores, what it checks
//! after another replica wrote first, and what it commits.

use crate::error::Error;
use crate::store::{AuditEntry, Fence};

/// How often a change is written while other replicas write first (each
/// try takes in what they wrote).
pub(crate) const WRITE_ATTEMPTS: usize = 5;

/// What is left of a change once another replica's write is taken in.
#[derive(Debug)]
pub(crate) enum Recheck<E> {
    /// Still to make: written again on top.
    Again,
    /// In the stored state already (a write whose answer was lost landed,
    /// and taking it in made it): nothing left to commit.
    Done,
    /// No longer possible.
    Refused(E),
}

/// One change of the shared state; `E` is its use case's error.
pub(crate) struct Change<N, R, C, E> {
    /// The audit record of an operator's action, its `action` the bare word
    /// (`apply`, `release`, `canary-promote`, ...): written as
    /// `ACTION-intended` first, then as the outcome. `None`: latches agents
    /// reported (each audited as it was reported).
    pub audit: Option<AuditEntry>,
    pub fence: Fence,
    /// The stored state once the change is made, from the state now.
    pub next: N,
    /// After another replica's write is taken in.
    pub recheck: R,
    /// The change in memory, once stored: what it queues is sent.
    pub commit: C,
    /// The error of an intent that cannot be audited, of a state that
    /// cannot be stored.
    pub audit_failed: fn(Error) -> E,
    pub store_failed: fn(Error) -> E,
}
