//! The classes a config's named matches declare ([`crate::criticality`]),
//! compiled once with the config: a call's class is that of the most
//! critical match it meets.

use crate::criticality::Class;
use crate::route::{Cond, Direction, View};

/// The named matches of one direction that declare a class, by class.
#[derive(Debug, Default)]
struct Side {
    critical: Box<[Cond]>,
    /// Declared `default`: read only when a sheddable match exists.
    default: Box<[Cond]>,
    sheddable: Box<[Cond]>,
}

impl Side {
    fn of(&self, view: &View<'_>) -> Class {
        if self.critical.iter().any(|c| c.eval(view)) {
            return Class::Critical;
        }
        if self.sheddable.is_empty() || self.default.iter().any(|c| c.eval(view)) {
            return Class::Default;
        }
        if self.sheddable.iter().any(|c| c.eval(view)) {
            Class::Sheddable
        } else {
            Class::Default
        }
    }
}

/// The classes a config declares, compiled once with the config.
#[derive(Debug)]
pub struct Classes {
    /// Inbound calls (paths folded for a case-insensitive service).
    inbound: Side,
    outbound: Side,
    empty: bool,
}

impl Default for Classes {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Classes {
    /// The classes of `(class, inbound cond, outbound cond)` (the two
    /// conditions differ only for a case-insensitive service).
    pub(crate) fn new(matches: Vec<(Class, Cond, Cond)>) -> Self {
        let side = |pick: fn(&(Class, Cond, Cond)) -> &Cond| {
            let of = |class: Class| -> Box<[Cond]> {
                matches
                    .iter()
                    .filter(|m| m.0 == class)
                    .map(|m| pick(m).clone())
                    .collect()
            };
            Side {
                critical: of(Class::Critical),
                default: of(Class::Default),
                sheddable: of(Class::Sheddable),
            }
        };
        Self {
            empty: matches.is_empty(),
            inbound: side(|m| &m.1),
            outbound: side(|m| &m.2),
        }
    }

    /// Whether the config declares no class (every call is `default`).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.empty
    }

    /// The class of the call `view` describes.
    pub(crate) fn of(&self, direction: Direction, view: &View<'_>) -> Class {
        match direction {
            Direction::Inbound => self.inbound.of(view),
            Direction::Outbound => self.outbound.of(view),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderName, Method};

    fn class_of(classes: &Classes, consumer: &str, path: &str) -> Class {
        let mut h = HeaderMap::new();
        h.insert("x-consumer", consumer.parse().unwrap());
        let name = HeaderName::from_static("x-consumer");
        let view = View::new(
            &Method::GET,
            path,
            crate::route::Headers::Map(&h),
            &name,
            None,
        );
        classes.of(Direction::Inbound, &view)
    }

    #[test]
    fn the_most_critical_match_wins() {
        let c = |s: &str| Cond::Consumer(s.into());
        let p = |s: &str| Cond::PathPrefix(s.into());
        let classes = Classes::new(vec![
            (Class::Critical, c("crm"), c("crm")),
            (Class::Sheddable, p("/reports"), p("/reports")),
            (Class::Default, c("web"), c("web")),
        ]);
        assert_eq!(class_of(&classes, "crm", "/reports"), Class::Critical);
        assert_eq!(class_of(&classes, "batch", "/reports"), Class::Sheddable);
        assert_eq!(class_of(&classes, "web", "/reports"), Class::Default);
        assert_eq!(class_of(&classes, "batch", "/orders"), Class::Default);
        assert!(!classes.is_empty());
        assert!(Classes::default().is_empty());
    }

    /// The agent refuses a class it does not know and a class without an
    /// expression, and reads an unspecified one as no class.
    #[test]
    fn the_wire_classes_are_checked() {
        use crate::config::CompiledConfig;
        use gov_proto::v1 as proto;
        let config = |criticality: i32, expr: Option<proto::MatchExpr>| proto::TargetConfig {
            service: "order".into(),
            consumer_header: "x-consumer".into(),
            matches: vec![proto::Match {
                name: "crm".into(),
                expr,
                criticality,
                ..Default::default()
            }],
            ..Default::default()
        };
        let crm = Some(proto::MatchExpr {
            kind: Some(proto::match_expr::Kind::Consumer("crm".into())),
        });
        let critical = proto::Criticality::Critical as i32;
        let ok = CompiledConfig::try_from(&config(critical, crm.clone())).unwrap();
        assert!(!ok.classes.is_empty());
        let none = CompiledConfig::try_from(&config(0, None)).unwrap();
        assert!(none.classes.is_empty());
        let unknown = CompiledConfig::try_from(&config(9, crm)).unwrap_err();
        assert!(unknown.to_string().contains("criticality"), "{unknown}");
        let empty = CompiledConfig::try_from(&config(critical, None)).unwrap_err();
        assert!(empty.to_string().contains("expr"), "{empty}");
    }
}
