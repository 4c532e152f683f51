//! The syntax tree of a `.gov` policy.
//!
//! Every node keeps the byte span of the text it came from so that every
//! diagnostic can point at the exact source. Spans never take part in
//! equality: two trees parsed from differently formatted text are equal when
//! they say the same thing (`parse(fmt(tree)) == tree`).
//!
//! The tree is a faithful picture of what was written, not of what is valid:
//! numbers are signed and zero is allowed so that the compiler, not the
//! parser, can say "must be positive" with a span and a help line.

use std::fmt;

pub use self::literals::*;
pub use self::span::*;

mod literals;
mod span;

// === Policy ===

/// One `.gov` file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    pub items: Vec<Item>,
    /// Every `# ...` comment with its span, in source order. Kept for the
    /// formatter; not part of the meaning, so ignored by equality.
    pub comments: Comments,
}

/// Comments, ignored by equality like spans.
#[derive(Clone, Debug, Default)]
pub struct Comments(pub Vec<Comment>);

impl PartialEq for Comments {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Comments {}
impl std::hash::Hash for Comments {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

/// `# text` (the text excludes the `#` and the line end).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Comment {
    pub text: String,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Item {
    Registry(Registry),
    Service(Service),
}

// === Registry ===

/// ```gov
/// registry eureka {
///   server_cache 30s
///   client_refresh 30s
///   balancer_refresh 30s
/// }
/// ```
/// The time a consumer may keep calling a deregistered instance is the sum
/// of the three caches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Registry {
    pub name: Ident,
    pub settings: Vec<RegistrySetting>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RegistrySetting {
    pub key: Spanned<RegistryKey>,
    pub value: Spanned<Duration>,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegistryKey {
    ServerCache,     // server_cache
    ClientRefresh,   // client_refresh
    BalancerRefresh, // balancer_refresh
}

// === Service ===

/// `service NAME { statement... }`
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Service {
    pub name: Ident,
    pub body: Vec<ServiceStmt>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ServiceStmt {
    Domain(DomainStmt),
    Registry(UsesRegistry),
    Consumer(ConsumerStmt),
    Paths(PathsStmt),
    Capacity(Capacity),
    Match(MatchDef),
    /// A bulkhead, a limit, a fuse: every rule kind.
    Rule(RuleDef),
    Warmup(Warmup),
    Shutdown(Shutdown),
    Outlier(Outlier),
}

/// `domain "trade"`: the service domain, the scope of `per domain` limits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DomainStmt {
    pub name: Str,
    pub span: Span,
}

/// `registry eureka`: the registry this service registers with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UsesRegistry {
    pub name: Ident,
    pub span: Span,
}

/// `consumer from SOURCE`: where the caller's identity comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConsumerStmt {
    pub source: ConsumerSource,
    pub span: Span,
}

/// What proves a caller's identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConsumerSource {
    /// `header "x-gov-consumer"`: whatever the client sends, which proves
    /// nothing; with `trusted from peer "gateway", ...` only what one of
    /// those verified calling services sends (anyone else's copy is removed).
    Header { header: Str, trusted: Vec<Str> },
    /// `peer on invalid reject|count`: the calling service named by the
    /// certificate of the agent-to-agent mutual TLS connection.
    Peer { on_invalid: Spanned<OnInvalid> },
    /// `jwt header "authorization" issuer "..." audience "..." keys "FILE"
    /// claim "client_id" on invalid reject|count`: a signed token's claim.
    Jwt(JwtSource),
}

/// A JWT consumer source.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JwtSource {
    /// The request header carrying the token (`Bearer ` optional).
    pub header: Str,
    pub issuer: Str,
    pub audience: Str,
    /// The JWKS file the agent reads the verification keys from.
    pub keys: Str,
    /// The claim that names the consumer.
    pub claim: Str,
    pub on_invalid: Spanned<OnInvalid>,
}

/// What a call with a missing, invalid or expired credential gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OnInvalid {
    /// Refused: 401 (gRPC `UNAUTHENTICATED`).
    Reject,
    /// Served without a consumer, and counted as a system error (`token
    /// invalid`) toward the service's fuses.
    Count,
}

impl OnInvalid {
    /// The word that declares it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnInvalid::Reject => "reject",
            OnInvalid::Count => "count",
        }
    }
}

/// `paths servlet case-insensitive`: how the service reads request paths, so
/// that the agent matches rules on the path the service will serve (the words,
/// at least one, are checked by the compiler).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PathsStmt {
    pub words: Vec<Ident>,
    pub span: Span,
}

/// What the service declares about itself; used by lints.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Capacity {
    /// `capacity workers 20`: the size of the service's own worker pool.
    Workers { count: Spanned<i64>, span: Span },
    /// `capacity instances 3`: how many instances normally run.
    Instances { count: Spanned<i64>, span: Span },
    /// `capacity rate 200 per 1s`: the request rate the service normally sees.
    Rate { rate: Rate<i64>, span: Span },
    /// `capacity amplification 4`: the most attempts one call at the top of
    /// any call path may cause at this service through the retries on the
    /// path.
    Amplification { count: Spanned<i64>, span: Span },
}

// === Matches ===

/// `match NAME = EXPR [latency DURATION]`
///
/// `latency` declares how long the matched calls are expected to take (or
/// their timeout); the queueing lint compares it with bulkhead waits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MatchDef {
    pub name: Ident,
    pub expr: MatchExpr,
    pub latency: Option<Spanned<Duration>>,
    /// `critical`, `default` or `sheddable`; `None`: not declared (default).
    pub criticality: Option<Spanned<Criticality>>,
    pub span: Span,
}

/// A match's criticality (Google's classes), lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Criticality {
    Sheddable,
    Default,
    Critical,
}

impl Criticality {
    /// The keyword.
    pub fn word(self) -> &'static str {
        match self {
            Criticality::Sheddable => "sheddable",
            Criticality::Default => "default",
            Criticality::Critical => "critical",
        }
    }
}

/// A match expression. `and` binds tighter than `or`; parentheses group.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MatchExpr {
    /// `path exact "/a"` or `path prefix "/a" [segment "name"]`: with
    /// `segment`, the path segment after the prefix (up to the next `/`) is
    /// captured under that name, a key of limits (`per segment "name"`).
    Path {
        kind: PathKind,
        value: Str,
        segment: Option<Str>,
        span: Span,
    },
    /// `method GET` (one method; combine with `or`)
    Method { method: Ident, span: Span },
    /// `header "x-tenant" = "gold"`
    Header { name: Str, value: Str, span: Span },
    /// `consumer "crm"`
    Consumer { name: Str, span: Span },
    /// `calls to inventory`: outbound calls to another service (client side).
    CallsTo { service: Ident, span: Span },
    /// `grpc service "pkg.Svc"` or `grpc method "pkg.Svc/Method"`: the gRPC
    /// calls of a service or of one method (their HTTP/2 path).
    Grpc {
        kind: GrpcKind,
        name: Str,
        span: Span,
    },
    /// `any`: every call.
    Any { span: Span },
    /// A reference to a named match of the same service.
    Ref { name: Ident },
    And {
        lhs: Box<MatchExpr>,
        rhs: Box<MatchExpr>,
        span: Span,
    },
    Or {
        lhs: Box<MatchExpr>,
        rhs: Box<MatchExpr>,
        span: Span,
    },
    /// `( expr )`; kept so the formatter can print what was written.
    Group { inner: Box<MatchExpr>, span: Span },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrpcKind {
    /// `grpc service "pkg.Svc"`
    Service,
    /// `grpc method "pkg.Svc/Method"`
    Method,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathKind {
    Exact,
    Prefix,
}

impl MatchExpr {
    pub fn span(&self) -> Span {
        match self {
            MatchExpr::Path { span, .. }
            | MatchExpr::Method { span, .. }
            | MatchExpr::Header { span, .. }
            | MatchExpr::Consumer { span, .. }
            | MatchExpr::CallsTo { span, .. }
            | MatchExpr::Grpc { span, .. }
            | MatchExpr::Any { span }
            | MatchExpr::And { span, .. }
            | MatchExpr::Or { span, .. }
            | MatchExpr::Group { span, .. } => *span,
            MatchExpr::Ref { name } => name.span,
        }
    }
}

// === Rules ===

/// `KIND NAME on EXPR { SETTING... }`: a rule of any kind (`bulkhead`,
/// `limit`, `fuse`...).
///
/// The grammar (`gov.pest`) gives each kind its keyword and the shape of
/// each of its settings; the tree keeps a setting as the words and values
/// it was written with, so that the tree, the parser and the formatter name
/// no kind. What the settings mean is the compiler's (one module per kind).
///
/// ```gov
/// bulkhead slow_calls on slow {
///   max_concurrent 10
///   max_wait 10ms
/// }
/// fuse mdm on supplier {
///   trip when business_error_ratio > 50% over 1m min_calls 20
///   classify system connect_failure timeout status 401 403 500..599
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuleDef {
    /// The kind's keyword, as the grammar spells it.
    pub kind: Spanned<&'static str>,
    pub name: Ident,
    pub on: MatchExpr,
    pub settings: Vec<Setting>,
    pub span: Span,
}

/// One setting of a rule: its words and values in the order written
/// (`trip when errors >= 10 over 10s` is nine of them).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Setting {
    pub words: Vec<Spanned<Word>>,
    pub span: Span,
}

/// A word or a value of a [`Setting`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Word {
    /// A keyword or an operator (`max_concurrent`, `>=`).
    Key(&'static str),
    /// A name.
    Name(String),
    /// A string literal, unescaped.
    Str(String),
    Int(i64),
    Duration(Duration),
    Size(Size),
    Percent(Percent),
    /// A factor (`growth 2x`).
    Factor(i64),
    /// An instant (`expires 2026-12-31T00:00Z`).
    Instant(Instant),
    /// A status code or an inclusive range of them: `500`, `500..599`.
    Range {
        from: Status,
        /// `None` for a single code.
        to: Option<Status>,
    },
}

impl Setting {
    /// The keyword the setting starts with.
    pub fn key(&self) -> Option<&'static str> {
        match self.words.first().map(|w| &w.node) {
            Some(Word::Key(k)) => Some(k),
            _ => None,
        }
    }
}

// === Outlier ejection ===

/// `outlier [to SERVICE] { SETTING... }`: when the outbound balancer ejects
/// an instance of a service this one calls (of every callee without `to`).
/// The settings are kept as words, as a rule's are; what they mean is the
/// compiler's.
///
/// ```gov
/// outlier to checkout {
///   consecutive_failures 5
///   eject 30s growth 2x max 5m
///   max_ejected 50%
///   on status 500..599
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Outlier {
    /// The callee; `None` for every callee without a block of its own.
    pub to: Option<Ident>,
    pub settings: Vec<Setting>,
    pub span: Span,
}

// === Warmup ===

/// Ordered steps, run top to bottom when an instance starts.
///
/// ```gov
/// warmup {
///   ready when http GET "/application/readiness" is 200 every 10s after 15s
///   register
///   ramp 60s from 10%
///   start consumers via http POST "/admin/consumers/start"
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Warmup {
    pub steps: Vec<WarmupStep>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WarmupStep {
    /// `ready when http METHOD "PATH" is STATUS every D [after D] [timeout D]`
    Ready {
        probe: HttpCall,
        status: Status,
        every: Spanned<Duration>,
        after: Option<Spanned<Duration>>,
        timeout: Option<Spanned<Duration>>,
        span: Span,
    },
    /// `register`: register with the registry (traffic may arrive from here on).
    Register { span: Span },
    /// `ramp D from P`: weight rises linearly from P to 100% over D.
    Ramp {
        over: Spanned<Duration>,
        from: Spanned<Percent>,
        span: Span,
    },
    /// `start NAME via ACTION`, usually `start consumers via ...`.
    Start {
        what: Ident,
        action: Action,
        span: Span,
    },
}

/// `http METHOD "PATH"`, called on the local service.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HttpCall {
    pub method: Ident,
    pub path: Str,
    pub span: Span,
}

/// How the agent asks the service to do something.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `http POST "/admin/consumers/stop"`
    Http(HttpCall),
    /// `signal SIGUSR1`
    Signal { signal: Ident, span: Span },
}

// === Shutdown ===

/// Ordered steps, run top to bottom on termination.
///
/// ```gov
/// shutdown {
///   deregister
///   wait for eureka
///   stop consumers via http POST "/admin/consumers/stop"
///   drain 30s
///   stop kafka via signal SIGTERM
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shutdown {
    pub steps: Vec<ShutdownStep>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ShutdownStep {
    /// `deregister`
    Deregister { span: Span },
    /// `wait D`
    Wait {
        duration: Spanned<Duration>,
        span: Span,
    },
    /// `wait for REGISTRY`: as long as the registry's consumer caches take.
    WaitFor { registry: Ident, span: Span },
    /// `stop NAME via ACTION`; `consumers` are the MQ consumers, any other
    /// name is a resource that in-flight requests may still need.
    Stop {
        what: Ident,
        action: Action,
        span: Span,
    },
    /// `drain D`: stop accepting, let in-flight and queued requests finish
    /// within D.
    Drain {
        deadline: Spanned<Duration>,
        span: Span,
    },
}

/// As written, in the canonical form of each value (`1min` prints `1m`).
impl fmt::Display for Word {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Word::Key(k) => f.write_str(k),
            Word::Name(n) => f.write_str(n),
            Word::Str(s) => {
                f.write_str("\"")?;
                for c in s.chars() {
                    if matches!(c, '"' | '\\') {
                        f.write_str("\\")?;
                    }
                    write!(f, "{c}")?;
                }
                f.write_str("\"")
            }
            Word::Int(n) => write!(f, "{n}"),
            Word::Duration(d) => write!(f, "{d}"),
            Word::Size(s) => write!(f, "{s}"),
            Word::Percent(p) => write!(f, "{p}"),
            Word::Factor(n) => write!(f, "{n}x"),
            Word::Instant(i) => f.write_str(&i.text),
            Word::Range { from, to: None } => write!(f, "{}", from.node),
            Word::Range { from, to: Some(to) } => write!(f, "{}..{}", from.node, to.node),
        }
    }
}

/// The words of a setting, one space apart: the canonical text of it.
impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, w) in self.words.iter().enumerate() {
            // `per header "x", consumer`: no space before a comma.
            if i > 0 && w.node != Word::Key(",") {
                f.write_str(" ")?;
            }
            write!(f, "{}", w.node)?;
        }
        Ok(())
    }
}
