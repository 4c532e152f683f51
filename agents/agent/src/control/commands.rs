//! What the agent does with govd's latch commands: a `Release` of a fuse or
//! a limit (an operator's, or one govd decided), and an `Arm` of a latch govd
//! holds for this instance that the agent lacks (it restarted without its
//! state directory).

use gov_engine::{Engine, Latch, Restored};
use gov_proto::v1 as proto;

use super::reach::now_unix_ms;

/// Releases the fuse or limit `r` names; a refusal is logged, never sent back.
pub(crate) fn release(engine: &Engine, r: &proto::ReleaseCommand) {
    let who = if r.who.is_empty() {
        "control plane"
    } else {
        r.who.as_str()
    };
    let result = match r.kind() {
        proto::ReleaseKind::Fuse => engine.release_fuse(&r.rule, who),
        // Empty: every key (a control plane older than the field, too).
        proto::ReleaseKind::Limit => {
            let key = (!r.key.is_empty()).then_some(r.key.as_str());
            engine.release_limit(&r.rule, key, who)
        }
    };
    match result {
        Ok(was) => {
            tracing::info!(rule = %r.rule, key = %r.key, who, was, "release command")
        }
        Err(error) => {
            tracing::warn!(rule = %r.rule, %error, "release command refused")
        }
    }
}

/// Re-arms `latch` in the engine, and logs what became of it.
pub(crate) fn arm(engine: &Engine, latch: &proto::Latch) {
    let rule = latch.rule.clone();
    let armed = Latch::try_from(latch)
        .map_err(|e| e.to_string())
        .and_then(|l| {
            engine
                .restore_latch(&l, now_unix_ms())
                .map_err(|e| e.to_string())
        });
    match armed {
        Ok(Restored::Armed) => {
            tracing::info!(%rule, key = %latch.key, reason = %latch.reason, "re-armed a latch the control plane holds for this agent")
        }
        Ok(Restored::Held) => {
            tracing::debug!(%rule, "the control plane re-armed a latch this agent holds")
        }
        Ok(Restored::Expired) => {
            tracing::info!(%rule, "the control plane re-armed a latch past its deadline; it ended")
        }
        Ok(Restored::KeyMissing) => tracing::warn!(
            %rule,
            "the control plane cannot re-arm a per-consumer or per-service limit without its key; it stays NOT ENFORCED here until released"
        ),
        Err(error) => {
            tracing::warn!(%rule, %error, "cannot re-arm the latch the control plane sent")
        }
    }
}
