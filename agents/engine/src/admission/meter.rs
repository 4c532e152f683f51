//! [`ByteMeter`]: an admitted call's byte limits, counted from another
//! place than its admission (a request body wrapper).

use std::sync::Arc;

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::snapshot::Snapshot;
use crate::state::Scope;

/// Counts streamed bytes for the byte limits of one admitted call.
#[derive(Clone, Debug)]
pub struct ByteMeter {
    pub(super) snap: Arc<Snapshot>,
    pub(super) scopes: SmallVec<[(u32, Scope); 2]>,
}

impl ByteMeter {
    /// Adds `n` request or response bytes.
    pub fn add(&self, n: u64) {
        let now = Instant::now();
        for (rule, scope) in &self.scopes {
            self.snap.states[*rule as usize].add_bytes(Some(scope), n, now);
        }
    }
}
