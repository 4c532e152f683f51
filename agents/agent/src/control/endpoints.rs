//! The endpoint sets one stream to govd brought (issue 35): a whole
//! `Endpoints` replaces a service's set; an `EndpointsDelta` changes it, and
//! only when this stream holds exactly the delta's base version. Anything
//! else is a mismatch the agent does not guess past: it answers `want_full`
//! and govd sends the whole set. Versions are one govd's and one stream's:
//! a new stream starts with none held (govd sends every set with the hello).

use std::collections::BTreeMap;

use gov_proto::v1 as proto;

/// The sets held on this stream, by service.
#[derive(Debug, Default)]
pub(crate) struct Held {
    sets: BTreeMap<String, Set>,
}

/// One service's set as this stream made it.
#[derive(Debug)]
struct Set {
    version: u64,
    /// By instance id.
    instances: BTreeMap<String, proto::Instance>,
}

impl Held {
    /// A pushed whole set: held, given to `apply` (the balancer), and the
    /// ACK that says so (govd counts it toward a `wait for gov`).
    pub(crate) fn on_full(
        &mut self,
        endpoints: proto::Endpoints,
        apply: impl Fn(&proto::Endpoints),
    ) -> proto::EndpointsAck {
        tracing::debug!(
            service = %endpoints.service,
            instances = endpoints.instances.len(),
            version = endpoints.version,
            "endpoints"
        );
        self.full(&endpoints);
        apply(&endpoints);
        ack(endpoints, false)
    }

    /// A pushed delta: onto the version held, the whole set it makes goes to
    /// `apply` and is ACKed; onto any other, nothing changes and the ACK asks
    /// for the whole set, naming the version held.
    pub(crate) fn on_delta(
        &mut self,
        delta: proto::EndpointsDelta,
        apply: impl Fn(&proto::Endpoints),
    ) -> proto::EndpointsAck {
        let (service, base) = (delta.service.clone(), delta.base_version);
        tracing::debug!(
            %service,
            upserted = delta.upserted.len(),
            removed = delta.removed.len(),
            base,
            version = delta.version,
            "endpoints delta"
        );
        match self.delta(delta) {
            Ok(endpoints) => {
                apply(&endpoints);
                ack(endpoints, false)
            }
            Err(version) => {
                tracing::warn!(%service, base, held = version, "an endpoints delta onto a set this agent does not hold; asking govd for the whole set");
                proto::EndpointsAck {
                    service,
                    version,
                    want_full: true,
                }
            }
        }
    }

    /// `endpoints` replaces its service's set.
    fn full(&mut self, endpoints: &proto::Endpoints) {
        let instances = endpoints
            .instances
            .iter()
            .map(|i| (i.instance.clone(), i.clone()))
            .collect();
        self.sets.insert(
            endpoints.service.clone(),
            Set {
                version: endpoints.version,
                instances,
            },
        );
    }

    /// `delta` applied onto its base: the whole set it makes. `Err` with the
    /// version held (0: none) when that is not the delta's base; the set held
    /// stays as it was.
    fn delta(&mut self, delta: proto::EndpointsDelta) -> Result<proto::Endpoints, u64> {
        let set = match self.sets.get_mut(&delta.service) {
            Some(set) if set.version == delta.base_version => set,
            Some(set) => return Err(set.version),
            None => return Err(0),
        };
        for id in &delta.removed {
            set.instances.remove(id);
        }
        for instance in delta.upserted {
            set.instances.insert(instance.instance.clone(), instance);
        }
        set.version = delta.version;
        Ok(proto::Endpoints {
            service: delta.service,
            instances: set.instances.values().cloned().collect(),
            version: delta.version,
        })
    }
}

fn ack(endpoints: proto::Endpoints, want_full: bool) -> proto::EndpointsAck {
    proto::EndpointsAck {
        service: endpoints.service,
        version: endpoints.version,
        want_full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: &str, weight: u32) -> proto::Instance {
        proto::Instance {
            instance: id.into(),
            address: format!("127.0.0.1:{}", 9000 + id.len()),
            phase: proto::Phase::Ready as i32,
            weight_milli_percent: weight,
            mtls: false,
        }
    }

    fn ids(e: &proto::Endpoints) -> Vec<(&str, u32)> {
        e.instances
            .iter()
            .map(|i| (i.instance.as_str(), i.weight_milli_percent))
            .collect()
    }

    fn delta(
        base: u64,
        version: u64,
        up: Vec<proto::Instance>,
        rm: &[&str],
    ) -> proto::EndpointsDelta {
        proto::EndpointsDelta {
            service: "inv".into(),
            version,
            base_version: base,
            upserted: up,
            removed: rm.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn a_delta_onto_its_base_makes_the_next_set() {
        let mut held = Held::default();
        held.full(&proto::Endpoints {
            service: "inv".into(),
            instances: vec![instance("a", 100_000), instance("b", 100_000)],
            version: 4,
        });
        // `c` joins warming, `a` leaves, `b` is unchanged.
        let set = held
            .delta(delta(4, 5, vec![instance("c", 10_000)], &["a"]))
            .unwrap();
        assert_eq!(set.version, 5);
        assert_eq!(ids(&set), [("b", 100_000), ("c", 10_000)]);
        // `c` ramps up: an upsert replaces it whole.
        let set = held
            .delta(delta(5, 6, vec![instance("c", 50_000)], &[]))
            .unwrap();
        assert_eq!(ids(&set), [("b", 100_000), ("c", 50_000)]);
        // A whole set replaces everything, deltas go on from it.
        held.full(&proto::Endpoints {
            service: "inv".into(),
            instances: vec![instance("d", 100_000)],
            version: 9,
        });
        let set = held.delta(delta(9, 10, vec![], &["d"])).unwrap();
        assert!(set.instances.is_empty());
    }

    #[test]
    fn a_delta_onto_another_version_is_refused_and_changes_nothing() {
        let mut held = Held::default();
        // Nothing held of the service: not a guess onto an empty set.
        assert_eq!(held.delta(delta(0, 1, vec![instance("a", 1)], &[])), Err(0));
        held.full(&proto::Endpoints {
            service: "inv".into(),
            instances: vec![instance("a", 100_000)],
            version: 3,
        });
        // A base behind or ahead of the one held.
        assert_eq!(held.delta(delta(2, 4, vec![], &["a"])), Err(3));
        assert_eq!(held.delta(delta(4, 5, vec![], &["a"])), Err(3));
        // What is held is unchanged: the delta onto 3 still applies.
        let set = held
            .delta(delta(3, 4, vec![instance("b", 100_000)], &[]))
            .unwrap();
        assert_eq!(ids(&set), [("a", 100_000), ("b", 100_000)]);
    }
}
