//! Whether the agent should get traffic ([`Health`]): written by the sidecar
//! (config loaded, draining) and the lifecycle (warmup and shutdown
//! registration), read by `/ready` and `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

/// Whether the agent should get traffic: a config is loaded and it is not draining.
#[derive(Debug, Default)]
pub struct Health {
    config_loaded: AtomicBool,
    draining: AtomicBool,
    /// Warmup/shutdown gate (`crate::lifecycle`): 0 open (no warmup), 1 held until
    /// registered, 2 registered, 3 deregistered.
    registration: AtomicU8,
    /// Why the control plane refuses this agent's credentials, while it does.
    control_plane_refused: std::sync::Mutex<Option<String>>,
    /// Refusals of this agent's credentials since start.
    control_plane_auth_failures: AtomicU64,
    /// When the agent's certificate expires (unix ms; 0: none yet).
    certificate_not_after_unix_ms: AtomicU64,
    /// Requests for a certificate (or reloads) that failed since start.
    certificate_failures: AtomicU64,
}

impl Health {
    /// Records that a config is in force.
    pub fn set_config_loaded(&self) {
        self.config_loaded.store(true, Ordering::Release);
    }

    /// Records that the agent is stopping: from here on `/ready` fails.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Holds `/ready` at 503 until [`Self::set_registered`] (warmup); only before
    /// the first registration.
    pub fn hold(&self) {
        let _ = self
            .registration
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The warmup registered the instance: `/ready` may say 200.
    pub fn set_registered(&self) {
        let _ = self
            .registration
            .compare_exchange(1, 2, Ordering::AcqRel, Ordering::Acquire);
        let _ = self
            .registration
            .compare_exchange(0, 2, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The shutdown deregistered the instance: `/ready` says 503, traffic still served.
    pub fn set_deregistered(&self) {
        self.registration.store(3, Ordering::Release);
    }

    /// Records a refusal of this agent's credentials by the control plane
    /// (`Some(reason)`), or that a stream was accepted (`None`).
    pub fn set_control_plane_refused(&self, reason: Option<&str>) {
        if reason.is_some() {
            self.control_plane_auth_failures
                .fetch_add(1, Ordering::Relaxed);
        }
        *self
            .control_plane_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = reason.map(str::to_owned);
    }

    /// Why the control plane refuses this agent, while it does.
    pub fn control_plane_refusal(&self) -> Option<String> {
        self.control_plane_refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Refusals of this agent's credentials since start.
    pub fn control_plane_auth_failures(&self) -> u64 {
        self.control_plane_auth_failures.load(Ordering::Relaxed)
    }

    /// Records what happened to the agent's certificate (`crate::identity`).
    pub fn on_certificate(&self, event: crate::identity::CertificateEvent) {
        match event {
            crate::identity::CertificateEvent::InForce { not_after_unix_ms } => self
                .certificate_not_after_unix_ms
                .store(not_after_unix_ms, Ordering::Relaxed),
            crate::identity::CertificateEvent::Failed => {
                self.certificate_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// When the agent's certificate expires (unix ms; 0: none yet), and the
    /// requests or reloads that failed.
    pub fn certificate(&self) -> (u64, u64) {
        (
            self.certificate_not_after_unix_ms.load(Ordering::Relaxed),
            self.certificate_failures.load(Ordering::Relaxed),
        )
    }

    /// Why the agent is not ready, or `None` when it is.
    pub fn not_ready_reason(&self) -> Option<&'static str> {
        if self.draining.load(Ordering::Acquire) {
            Some("draining")
        } else if self.registration.load(Ordering::Acquire) == 3 {
            Some("deregistered")
        } else if self.registration.load(Ordering::Acquire) == 1 {
            Some("warming up (not registered yet)")
        } else if !self.config_loaded.load(Ordering::Acquire) {
            Some("no config loaded")
        } else {
            None
        }
    }
}
