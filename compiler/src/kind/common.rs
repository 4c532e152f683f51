//! What every rule kind shares: the [`Kind`] trait, the settings every kind
//! has (`mode`, `expires`), the numbers the range checks read ([`Values`]),
//! the reading of a setting's words ([`Words`]) and a rule with its kind
//! ([`Rule`]). The kinds import this module; [`super`] only lists them.

use gov_lang::ast::{
    self, Duration, MatchExpr, Percent, RuleDef, Setting, Size, Span, Spanned, Status, Word,
};
use gov_proto::v1 as pb;

/// What the compiler knows of one rule kind.
pub(crate) trait Kind: Sync {
    /// The kind on the wire; its word is the kind's keyword.
    fn wire(&self) -> pb::RuleKind;

    /// `gov::missing-field`: the setting without which the rule enforces
    /// nothing, and the help, when it is missing.
    fn missing(&self, rule: &RuleDef) -> Option<(&'static str, &'static str)>;

    /// `gov::duplicate-setting`: the name under which `setting` may appear
    /// once in a rule; `None` when it may repeat.
    fn setting_key(&self, setting: &Setting) -> Option<&'static str>;

    /// The numbers of the rule that the range checks read
    /// (`gov::non-positive`, `gov::too-large`, `gov::invalid-status`), in
    /// the order written. `text` gives the source of a span.
    fn values(&self, rule: &RuleDef, text: &dyn Fn(Span) -> String, out: &mut Values);

    /// `gov::conflicting-rules`: what two rules of this kind on the same
    /// calls disagree on (quoting the settings as written), and the help.
    fn conflict(
        &self,
        a: &RuleDef,
        b: &RuleDef,
        text: &dyn Fn(Span) -> String,
    ) -> Option<(String, &'static str)>;

    /// The rule's `spec`, every value written out.
    fn lower(&self, rule: &RuleDef, l: &dyn LowerCx) -> pb::rule::Spec;

    /// The readable fields of a spec of this kind in a plan.
    fn fields(&self, spec: &pb::rule::Spec, out: &mut Vec<(String, String)>);

    /// Whether `setting` is one this kind reads (the decoder and the
    /// grammar agree on it).
    #[cfg(test)]
    fn decodes(&self, setting: &Setting) -> bool;

    /// Every source reference inside a spec of this kind (the header's is
    /// not one of them), always in the same order.
    fn sources(&self, _spec: &mut pb::rule::Spec, _f: &mut dyn FnMut(&mut Option<pb::SourceRef>)) {}
}

/// What a kind's lowering reads of the service it lowers (the lowering's
/// own context implements it).
pub(crate) trait LowerCx {
    /// Where `span` is, as the wire's source reference.
    fn source(&self, span: Span) -> pb::SourceRef;

    /// The named path captures `on` selects: (name, path prefix) pairs.
    fn captures(&self, on: &MatchExpr) -> Vec<(String, String)>;
}

/// A rule of any kind: its definition and what its kind means.
#[derive(Clone, Copy)]
pub(crate) struct Rule<'a> {
    pub def: &'a RuleDef,
    pub imp: &'static dyn Kind,
}

impl<'a> Rule<'a> {
    pub fn name(&self) -> &'a ast::Ident {
        &self.def.name
    }

    pub fn on(&self) -> &'a MatchExpr {
        &self.def.on
    }

    pub fn span(&self) -> Span {
        self.def.span
    }

    /// The kind's keyword (`bulkhead`, ...): the wire's word for it.
    pub fn kind(&self) -> &'static str {
        self.imp.wire().word()
    }
}

// === Settings every kind has ===

/// A rule's `mode` setting (`mode enforce`, `mode shadow [stamp]`), which
/// every kind's grammar accepts and the shared header lowers: no kind
/// decodes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RuleMode {
    /// `mode shadow`: evaluated, never rejecting or delaying.
    pub shadow: bool,
    /// `stamp`: a call it would refuse reaches the upstream marked.
    pub stamp: bool,
}

impl RuleMode {
    /// The rule's mode (`mode enforce` when it has no `mode`; the last one
    /// when written twice, which `gov::duplicate-setting` reports).
    pub(crate) fn of(rule: &RuleDef) -> Self {
        rule.settings
            .iter()
            .rev()
            .find_map(Self::decode)
            .unwrap_or_default()
    }

    /// The mode as written, with the span of its setting (`None`: not written).
    pub(crate) fn written(rule: &RuleDef) -> Option<(Self, Span)> {
        rule.settings
            .iter()
            .rev()
            .find_map(|s| Some((Self::decode(s)?, s.span)))
    }

    fn decode(setting: &Setting) -> Option<Self> {
        let mut w = Words::of(setting);
        w.expect("mode")?;
        let mode = if w.expect("enforce").is_some() {
            Self::default()
        } else {
            w.expect("shadow")?;
            Self {
                shadow: true,
                stamp: w.expect("stamp").is_some(),
            }
        };
        w.done().then_some(mode)
    }
}

/// A rule's expiry (`expires T`, `for D`), which every kind's grammar
/// accepts and the shared header lowers: no kind decodes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RuleExpiry {
    /// `expires 2026-12-31T00:00Z`: milliseconds since the Unix epoch.
    At(Spanned<u64>),
    /// `for 2h`: from the apply that introduced the rule (govd anchors it).
    For(Spanned<Duration>),
}

impl RuleExpiry {
    /// The rule's expiry, with the span of its setting (`None`: it never
    /// expires; the last one when written twice, which
    /// `gov::duplicate-setting` reports).
    pub(crate) fn of(rule: &RuleDef) -> Option<(Self, Span)> {
        rule.settings
            .iter()
            .rev()
            .find_map(|s| Some((Self::decode(s)?, s.span)))
    }

    fn decode(setting: &Setting) -> Option<Self> {
        let mut w = Words::of(setting);
        let expiry = match w.key()?.node {
            "expires" => Self::At(w.instant()?),
            "for" => Self::For(w.duration()?),
            _ => return None,
        };
        w.done().then_some(expiry)
    }

    /// `(expires_at_unix_ms, for_ms)` on the wire: a `for` is anchored by
    /// govd's apply ([`crate::lower::anchor_expiry`]).
    pub(crate) fn wire(rule: &RuleDef) -> (u64, u64) {
        match Self::of(rule) {
            None => (0, 0),
            Some((Self::At(at), _)) => (at.node, 0),
            Some((Self::For(d), _)) => (0, crate::units::unsigned(crate::units::millis(&d.node))),
        }
    }
}

/// `gov::duplicate-setting`: the name under which a setting every kind has
/// may appear once; `None` for a kind's own setting.
pub(crate) fn header_key(setting: &Setting) -> Option<&'static str> {
    RuleMode::decode(setting)
        .map(|_| "mode")
        .or_else(|| RuleExpiry::decode(setting).map(|_| "expires or for"))
}

/// The numbers of the settings every kind has (`for D`), for the range
/// checks, after the kind's own ([`Kind::values`]).
pub(crate) fn header_values(rule: &RuleDef, out: &mut Values) {
    if let Some((RuleExpiry::For(d), _)) = RuleExpiry::of(rule) {
        out.bound_duration("for", &d, Bound::Positive);
        out.large("for", Large::Duration(d));
    }
}

// === Values ===

/// What a number must be (`gov::non-positive`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Bound {
    Positive,
    NotNegative,
}

/// A value the wire holds in a fixed width (`gov::too-large`).
#[derive(Clone, Debug)]
pub(crate) enum Large {
    /// At most `u32::MAX`.
    Count(Spanned<i64>),
    /// Must fit in milliseconds.
    Duration(Spanned<Duration>),
    /// Must fit in bytes.
    Size(Spanned<Size>),
}

/// The numbers of a rule that the range checks read.
#[derive(Default)]
pub(crate) struct Values {
    /// `(what, value, span, bound)`: durations in milliseconds, sizes in bytes.
    pub bounded: Vec<(String, i64, Span, Bound)>,
    pub large: Vec<(String, Large)>,
    /// HTTP status codes.
    pub statuses: Vec<Status>,
    /// Status ranges `from..to` with the span of the range.
    pub ranges: Vec<(Status, Status, Span)>,
    /// gRPC status names (`UNAVAILABLE`), checked against the code list;
    /// `true` for a rejection's (where `OK` makes no sense).
    pub grpc_codes: Vec<(Spanned<String>, bool)>,
}

impl Values {
    pub fn bound(&mut self, what: &str, value: i64, span: Span, bound: Bound) {
        self.bounded.push((what.to_string(), value, span, bound));
    }

    pub fn bound_duration(&mut self, what: &str, d: &Spanned<Duration>, bound: Bound) {
        self.bound(what, crate::units::millis(&d.node), d.span, bound);
    }

    pub fn large(&mut self, what: &str, value: Large) {
        self.large.push((what.to_string(), value));
    }
}

// === Reading settings ===

/// The words of one setting, read front to back by a kind's decoder. The
/// grammar gives every setting its shape, so a decoder that finds another
/// shape is out of step with `gov.pest` (a test decodes every example and
/// fixture to catch that).
pub(crate) struct Words<'a> {
    words: &'a [Spanned<Word>],
    /// The span of the whole setting.
    pub span: Span,
}

impl<'a> Words<'a> {
    pub fn of(s: &'a Setting) -> Self {
        Words {
            words: &s.words,
            span: s.span,
        }
    }

    fn next(&mut self) -> Option<&'a Spanned<Word>> {
        let (first, rest) = self.words.split_first()?;
        self.words = rest;
        Some(first)
    }

    /// The next word if it is a keyword.
    pub fn key(&mut self) -> Option<Spanned<&'static str>> {
        match self.words.first() {
            Some(Spanned {
                node: Word::Key(k),
                span,
            }) => {
                self.words = &self.words[1..];
                Some(Spanned::new(*k, *span))
            }
            _ => None,
        }
    }

    /// Skips the keyword `k`; `None` if the next word is another.
    pub fn expect(&mut self, k: &str) -> Option<Span> {
        match self.words.first() {
            Some(Spanned {
                node: Word::Key(w),
                span,
            }) if *w == k => {
                self.words = &self.words[1..];
                Some(*span)
            }
            _ => None,
        }
    }

    pub fn string(&mut self) -> Option<Spanned<String>> {
        match self.next()? {
            Spanned {
                node: Word::Str(v),
                span,
            } => Some(Spanned::new(v.clone(), *span)),
            _ => None,
        }
    }

    pub fn int(&mut self) -> Option<Spanned<i64>> {
        match self.next()? {
            Spanned {
                node: Word::Int(n),
                span,
            } => Some(Spanned::new(*n, *span)),
            _ => None,
        }
    }

    pub fn duration(&mut self) -> Option<Spanned<Duration>> {
        match self.next()? {
            Spanned {
                node: Word::Duration(d),
                span,
            } => Some(Spanned::new(*d, *span)),
            _ => None,
        }
    }

    pub fn size(&mut self) -> Option<Spanned<Size>> {
        match self.next()? {
            Spanned {
                node: Word::Size(s),
                span,
            } => Some(Spanned::new(*s, *span)),
            _ => None,
        }
    }

    pub fn instant(&mut self) -> Option<Spanned<u64>> {
        match self.next()? {
            Spanned {
                node: Word::Instant(i),
                span,
            } => Some(Spanned::new(i.unix_ms, *span)),
            _ => None,
        }
    }

    /// The next word if it is a percentage.
    pub fn percent(&mut self) -> Option<Spanned<Percent>> {
        match self.words.first() {
            Some(Spanned {
                node: Word::Percent(p),
                span,
            }) => {
                self.words = &self.words[1..];
                Some(Spanned::new(*p, *span))
            }
            _ => None,
        }
    }

    /// The next word if it is a status code or range.
    pub fn range(&mut self) -> Option<(Status, Option<Status>, Span)> {
        match self.words.first() {
            Some(Spanned {
                node: Word::Range { from, to },
                span,
            }) => {
                self.words = &self.words[1..];
                Some((from.clone(), to.clone(), *span))
            }
            _ => None,
        }
    }

    /// The next word if it is a name.
    pub fn name(&mut self) -> Option<Spanned<String>> {
        match self.words.first() {
            Some(Spanned {
                node: Word::Name(n),
                span,
            }) => {
                self.words = &self.words[1..];
                Some(Spanned::new(n.clone(), *span))
            }
            _ => None,
        }
    }

    /// After `reject with`: `STATUS` or `grpc_status NAME`.
    pub fn reject(&mut self) -> Option<Reject> {
        if self.expect("grpc_status").is_some() {
            return Some(Reject::Grpc(self.name()?));
        }
        Some(Reject::Status(self.int()?))
    }

    /// Whether every word was read.
    pub fn done(&self) -> bool {
        self.words.is_empty()
    }
}

/// `reject with STATUS` or `reject with grpc_status NAME`, a setting every
/// kind that rejects shares.
#[derive(Clone, Debug)]
pub(crate) enum Reject {
    Status(Status),
    /// The answer to a gRPC call; an unknown name is
    /// `gov::unknown-grpc-status` and lowers as the kind's default.
    Grpc(Spanned<String>),
}

impl Reject {
    /// The name under which it may appear once in a rule.
    pub fn key(&self) -> &'static str {
        match self {
            Reject::Status(_) => "reject with",
            Reject::Grpc(_) => "reject with grpc_status",
        }
    }

    /// Hands its value to the range check or the gRPC name check.
    pub fn values(self, out: &mut Values) {
        match self {
            Reject::Status(s) => out.statuses.push(s),
            Reject::Grpc(name) => out.grpc_codes.push((name, true)),
        }
    }
}

impl Reject {
    /// The gRPC code it names (`None`: the status form, or an unknown
    /// name, which lowers as the kind's default).
    pub fn grpc(&self) -> Option<pb::GrpcCode> {
        match self {
            Reject::Grpc(name) => gov_proto::grpc::from_name(&name.node),
            Reject::Status(_) => None,
        }
    }
}

/// Decodes every setting of `rule` with `decode`; a setting the decoder
/// does not read to its end is left out (see [`Words`]).
pub(crate) fn decode<T>(rule: &RuleDef, decode: impl Fn(&mut Words<'_>) -> Option<T>) -> Vec<T> {
    rule.settings
        .iter()
        .filter_map(|s| {
            let mut w = Words::of(s);
            let t = decode(&mut w)?;
            w.done().then_some(t)
        })
        .collect()
}
