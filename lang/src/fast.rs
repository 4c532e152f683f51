//! A hand-written parser for valid policies, about ten times faster than
//! the pest grammar.
//!
//! It accepts exactly the language of `gov.pest` and builds the same tree
//! with the same spans as the grammar and the builder in `parser.rs`; at the
//! first thing it does not expect it gives up (`None`) without saying why,
//! and the grammar parses the text again to explain the error. Diagnostics
//! therefore always come from the grammar. A differential test
//! (`tests/lang/fast.rs`) holds the two parsers to the same trees.
//!
//! Each method skips whitespace and comments before its token, records where
//! the last token ended (`end`) for spans, and leaves the position unchanged
//! when it returns `None` only where a caller tries an alternative.

use crate::ast::*;
use crate::parser::{MAX_EXPR_TERMS, MAX_NESTING, unescape};

/// Parses `src` if it is a valid policy.
pub(crate) fn parse(src: &str) -> Option<Policy> {
    let mut p = Fast {
        src,
        bytes: src.as_bytes(),
        pos: 0,
        end: 0,
        terms: 0,
        depth: 0,
        comments: Vec::new(),
    };
    let mut items = Vec::new();
    loop {
        p.skip();
        if p.pos == p.bytes.len() {
            break;
        }
        items.push(match p.peek_word() {
            "registry" => Item::Registry(p.registry()?),
            "service" => Item::Service(p.service()?),
            _ => return None,
        });
    }
    Some(Policy {
        items,
        comments: Comments(p.comments),
    })
}

struct Fast<'s> {
    src: &'s str,
    bytes: &'s [u8],
    pos: usize,
    /// The end of the last token taken.
    end: usize,
    /// Atoms of the current match expression.
    terms: usize,
    /// Open parentheses.
    depth: usize,
    /// Every comment, collected while skipping: in valid text every `#`
    /// outside a string starts one.
    comments: Vec<Comment>,
}

/// `[A-Za-z0-9_-]`, the `ident_char` rule, as a table: the hottest test.
static IDENT_CHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
        b += 1;
    }
    t
};

fn is_ident_char(b: u8) -> bool {
    IDENT_CHAR[usize::from(b)]
}

impl<'s> Fast<'s> {
    // === Tokens ===

    fn skip(&mut self) {
        while let Some(&b) = self.bytes.get(self.pos) {
            match b {
                b' ' | b'\t' | b'\r' | b'\n' => self.pos += 1,
                b'#' => {
                    let start = self.pos;
                    while let Some(&b) = self.bytes.get(self.pos) {
                        if b == b'\n' {
                            break;
                        }
                        self.pos += 1;
                    }
                    // As `parser::comments` reads them.
                    let text = self.src.get(start + 1..self.pos).unwrap_or("").trim_end();
                    self.comments.push(Comment {
                        text: text.to_owned(),
                        span: Span::new(start, start + 1 + text.len()),
                    });
                }
                _ => break,
            }
        }
    }

    fn byte(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    /// The run of word characters at the next token, not taken.
    fn peek_word(&mut self) -> &'s str {
        self.skip();
        let start = self.pos;
        let mut i = start;
        while self.bytes.get(i).is_some_and(|&b| is_ident_char(b)) {
            i += 1;
        }
        self.src.get(start..i).unwrap_or("")
    }

    fn take(&mut self, len: usize) -> Span {
        let span = Span::new(self.pos, self.pos + len);
        self.pos += len;
        self.end = self.pos;
        span
    }

    /// The keyword `word`, if it comes next.
    fn kw(&mut self, word: &str) -> Option<Span> {
        (self.peek_word() == word).then(|| self.take(word.len()))
    }

    /// Takes the next word, whatever it is.
    fn any_word(&mut self) -> Option<(&'s str, Span)> {
        let w = self.peek_word();
        (!w.is_empty()).then(|| (w, self.take(w.len())))
    }

    fn punct(&mut self, c: u8) -> Option<Span> {
        self.skip();
        (self.byte() == Some(c)).then(|| self.take(1))
    }

    fn ident(&mut self) -> Option<Ident> {
        let w = self.peek_word();
        let first = w.bytes().next()?;
        if !(first.is_ascii_alphabetic() || first == b'_') || crate::grammar::is_reserved(w) {
            return None;
        }
        let span = self.take(w.len());
        Some(Spanned::new(w.to_owned(), span))
    }

    fn string(&mut self) -> Option<Str> {
        self.skip();
        if self.byte() != Some(b'"') {
            return None;
        }
        let start = self.pos;
        let mut i = start + 1;
        let mut escaped = false;
        loop {
            match *self.bytes.get(i)? {
                b'"' => break,
                b'\\' => {
                    if !matches!(self.bytes.get(i + 1), Some(b'"' | b'\\')) {
                        return None;
                    }
                    escaped = true;
                    i += 2;
                }
                b'\n' | b'\r' => return None,
                _ => i += 1,
            }
        }
        let body = self.src.get(start + 1..i)?;
        let text = if escaped {
            unescape(body)
        } else {
            body.to_owned()
        };
        let span = self.take(i + 1 - start);
        Some(Spanned::new(text, span))
    }

    /// `-?[0-9]+` at the next token: its end, not taken.
    fn digits(&mut self) -> Option<usize> {
        self.skip();
        let mut i = self.pos;
        if self.bytes.get(i) == Some(&b'-') {
            i += 1;
        }
        let first = i;
        while self.bytes.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        (i > first).then_some(i)
    }

    fn number(&self, to: usize) -> Option<i64> {
        self.src.get(self.pos..to)?.parse().ok()
    }

    fn int(&mut self) -> Option<Spanned<i64>> {
        let to = self.digits()?;
        match self.bytes.get(to) {
            Some(&b) if is_ident_char(b) || b == b'%' => return None,
            Some(b'.') if self.bytes.get(to + 1).is_some_and(u8::is_ascii_digit) => return None,
            _ => {}
        }
        let n = self.number(to)?;
        let span = self.take(to - self.pos);
        Some(Spanned::new(n, span))
    }

    /// A number and the unit written right after it.
    fn with_unit(&mut self) -> Option<(i64, &'s str, usize)> {
        let to = self.digits()?;
        let mut end = to;
        while self.bytes.get(end).is_some_and(|&b| is_ident_char(b)) {
            end += 1;
        }
        let unit = self.src.get(to..end)?;
        Some((self.number(to)?, unit, end))
    }

    fn duration(&mut self) -> Option<Spanned<Duration>> {
        let (value, unit, end) = self.with_unit()?;
        let unit = match unit {
            "ms" => TimeUnit::Millis,
            "s" => TimeUnit::Seconds,
            "m" | "min" => TimeUnit::Minutes,
            "h" => TimeUnit::Hours,
            _ => return None,
        };
        let span = self.take(end - self.pos);
        Some(Spanned::new(Duration { value, unit }, span))
    }

    fn size(&mut self) -> Option<Spanned<Size>> {
        let (value, unit, end) = self.with_unit()?;
        let unit = match unit {
            "B" => SizeUnit::B,
            "kB" | "KB" => SizeUnit::KB,
            "MB" => SizeUnit::MB,
            "GB" => SizeUnit::GB,
            "KiB" => SizeUnit::KiB,
            "MiB" => SizeUnit::MiB,
            "GiB" => SizeUnit::GiB,
            _ => return None,
        };
        let span = self.take(end - self.pos);
        Some(Spanned::new(Size { value, unit }, span))
    }

    /// `12.5%`; the position is unchanged when there is none.
    fn percent(&mut self) -> Option<Spanned<Percent>> {
        let to = self.digits()?;
        let whole = self.number(to)?;
        let mut i = to;
        let mut frac = 0i64;
        if self.bytes.get(i) == Some(&b'.') {
            i += 1;
            let mut n = 0;
            while n < 3
                && let Some(&d) = self.bytes.get(i).filter(|d| d.is_ascii_digit())
            {
                frac = frac * 10 + i64::from(d - b'0');
                i += 1;
                n += 1;
            }
            if n == 0 {
                return None;
            }
            frac *= [1, 100, 10, 1][n];
        }
        if self.bytes.get(i) != Some(&b'%') {
            return None;
        }
        let frac = if self.bytes.get(self.pos) == Some(&b'-') {
            -frac
        } else {
            frac
        };
        let milli = whole.checked_mul(1000)?.checked_add(frac)?;
        let span = self.take(i + 1 - self.pos);
        Some(Spanned::new(Percent { milli }, span))
    }

    /// `{ ITEM* }`, calling `item` until the `}`.
    fn block<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        self.punct(b'{')?;
        let mut out = Vec::new();
        loop {
            if self.punct(b'}').is_some() {
                return Some(out);
            }
            out.push(item(self)?);
        }
    }

    // === Items ===

    fn registry(&mut self) -> Option<Registry> {
        let start = self.kw("registry")?.start;
        let name = self.ident()?;
        let settings = self.block(|p| {
            let (word, key_span) = p.any_word()?;
            let key = match word {
                "server_cache" => RegistryKey::ServerCache,
                "client_refresh" => RegistryKey::ClientRefresh,
                "balancer_refresh" => RegistryKey::BalancerRefresh,
                _ => return None,
            };
            let value = p.duration()?;
            Some(RegistrySetting {
                key: Spanned::new(key, key_span),
                span: Span::new(key_span.start, p.end),
                value,
            })
        })?;
        Some(Registry {
            name,
            settings,
            span: Span::new(start, self.end),
        })
    }

    fn service(&mut self) -> Option<Service> {
        let start = self.kw("service")?.start;
        let name = self.ident()?;
        let body = self.block(Self::statement)?;
        Some(Service {
            name,
            body,
            span: Span::new(start, self.end),
        })
    }

    fn statement(&mut self) -> Option<ServiceStmt> {
        let (word, kw) = self.any_word()?;
        let start = kw.start;
        let span = |p: &Self| Span::new(start, p.end);
        Some(match word {
            "domain" => {
                let name = self.string()?;
                ServiceStmt::Domain(DomainStmt {
                    name,
                    span: span(self),
                })
            }
            "registry" => {
                let name = self.ident()?;
                ServiceStmt::Registry(UsesRegistry {
                    name,
                    span: span(self),
                })
            }
            "consumer" => {
                self.kw("from")?;
                self.kw("header")?;
                let header = self.string()?;
                ServiceStmt::Consumer(ConsumerStmt {
                    header,
                    span: span(self),
                })
            }
            "capacity" => {
                let (which, _) = self.any_word()?;
                ServiceStmt::Capacity(match which {
                    "workers" => {
                        let count = self.int()?;
                        Capacity::Workers {
                            count,
                            span: span(self),
                        }
                    }
                    "instances" => {
                        let count = self.int()?;
                        Capacity::Instances {
                            count,
                            span: span(self),
                        }
                    }
                    "rate" => {
                        let rate = self.rate(Self::int)?;
                        Capacity::Rate {
                            rate,
                            span: span(self),
                        }
                    }
                    _ => return None,
                })
            }
            "match" => {
                let name = self.ident()?;
                self.punct(b'=')?;
                let expr = self.expr()?;
                let latency = match self.kw("latency") {
                    Some(_) => Some(self.duration()?),
                    None => None,
                };
                ServiceStmt::Match(MatchDef {
                    name,
                    expr,
                    latency,
                    span: span(self),
                })
            }
            "bulkhead" => {
                let (name, on) = self.header()?;
                let settings = self.block(Self::bulkhead_setting)?;
                ServiceStmt::Bulkhead(Bulkhead {
                    name,
                    on,
                    settings,
                    span: span(self),
                })
            }
            "limit" => {
                let (name, on) = self.header()?;
                let settings = self.block(Self::limit_setting)?;
                ServiceStmt::Limit(Limit {
                    name,
                    on,
                    settings,
                    span: span(self),
                })
            }
            "fuse" => {
                let (name, on) = self.header()?;
                let settings = self.block(Self::fuse_setting)?;
                ServiceStmt::Fuse(Fuse {
                    name,
                    on,
                    settings,
                    span: span(self),
                })
            }
            "warmup" => {
                let steps = self.block(Self::warmup_step)?;
                ServiceStmt::Warmup(Warmup {
                    steps,
                    span: span(self),
                })
            }
            "shutdown" => {
                let steps = self.block(Self::shutdown_step)?;
                ServiceStmt::Shutdown(Shutdown {
                    steps,
                    span: span(self),
                })
            }
            _ => return None,
        })
    }

    /// `NAME on EXPR`
    fn header(&mut self) -> Option<(Ident, MatchExpr)> {
        let name = self.ident()?;
        self.kw("on")?;
        Some((name, self.expr()?))
    }

    /// `AMOUNT per WINDOW`
    fn rate<T>(&mut self, amount: impl Fn(&mut Self) -> Option<Spanned<T>>) -> Option<Rate<T>> {
        let amount = amount(self)?;
        self.kw("per")?;
        let window = self.duration()?;
        Some(Rate { amount, window })
    }

    // === Matches ===

    fn expr(&mut self) -> Option<MatchExpr> {
        self.terms = 0;
        self.or_expr()
    }

    fn or_expr(&mut self) -> Option<MatchExpr> {
        let mut lhs = self.and_expr()?;
        while self.kw("or").is_some() {
            let rhs = self.and_expr()?;
            let span = lhs.span().join(rhs.span());
            lhs = MatchExpr::Or {
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
                span,
            };
        }
        Some(lhs)
    }

    fn and_expr(&mut self) -> Option<MatchExpr> {
        let mut lhs = self.atom()?;
        while self.kw("and").is_some() {
            let rhs = self.atom()?;
            let span = lhs.span().join(rhs.span());
            lhs = MatchExpr::And {
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
                span,
            };
        }
        Some(lhs)
    }

    fn atom(&mut self) -> Option<MatchExpr> {
        self.skip();
        let start = self.pos;
        if self.byte() == Some(b'(') {
            self.take(1);
            self.depth += 1;
            if self.depth > MAX_NESTING {
                return None;
            }
            let inner = self.or_expr()?;
            self.punct(b')')?;
            self.depth -= 1;
            return Some(MatchExpr::Group {
                inner: Box::new(inner),
                span: Span::new(start, self.end),
            });
        }
        self.terms += 1;
        if self.terms > MAX_EXPR_TERMS {
            return None;
        }
        let span = |p: &Self| Span::new(start, p.end);
        Some(match self.peek_word() {
            "path" => {
                self.take(4);
                let kind = match self.any_word()?.0 {
                    "exact" => PathKind::Exact,
                    "prefix" => PathKind::Prefix,
                    _ => return None,
                };
                let value = self.string()?;
                MatchExpr::Path {
                    kind,
                    value,
                    span: span(self),
                }
            }
            "method" => {
                self.take(6);
                let method = self.ident()?;
                MatchExpr::Method {
                    method,
                    span: span(self),
                }
            }
            "header" => {
                self.take(6);
                let name = self.string()?;
                self.punct(b'=')?;
                let value = self.string()?;
                MatchExpr::Header {
                    name,
                    value,
                    span: span(self),
                }
            }
            "consumer" => {
                self.take(8);
                let name = self.string()?;
                MatchExpr::Consumer {
                    name,
                    span: span(self),
                }
            }
            "calls" => {
                self.take(5);
                self.kw("to")?;
                let service = self.ident()?;
                MatchExpr::CallsTo {
                    service,
                    span: span(self),
                }
            }
            "any" => MatchExpr::Any { span: self.take(3) },
            _ => MatchExpr::Ref {
                name: self.ident()?,
            },
        })
    }

    // === Bulkheads, limits, fuses ===

    fn bulkhead_setting(&mut self) -> Option<BulkheadSetting> {
        let (word, kw) = self.any_word()?;
        let span = |p: &Self| Span::new(kw.start, p.end);
        Some(match word {
            "max_concurrent" => {
                let value = self.int()?;
                BulkheadSetting::MaxConcurrent {
                    value,
                    span: span(self),
                }
            }
            "max_wait" => {
                let value = self.duration()?;
                BulkheadSetting::MaxWait {
                    value,
                    span: span(self),
                }
            }
            "queue" => {
                let value = self.int()?;
                BulkheadSetting::Queue {
                    value,
                    span: span(self),
                }
            }
            "timeout" => {
                let value = self.duration()?;
                BulkheadSetting::Timeout {
                    value,
                    span: span(self),
                }
            }
            "reject" => {
                self.kw("with")?;
                let status = self.int()?;
                BulkheadSetting::RejectWith {
                    status,
                    span: span(self),
                }
            }
            "per" => {
                let (which, which_span) = self.any_word()?;
                let key = match which {
                    "operation" => Spanned::new(BulkheadKey::Operation, which_span),
                    "instance" => match self.kw("path") {
                        Some(path) => {
                            Spanned::new(BulkheadKey::InstancePath, which_span.join(path))
                        }
                        None => Spanned::new(BulkheadKey::Instance, which_span),
                    },
                    _ => return None,
                };
                BulkheadSetting::Per {
                    key,
                    span: span(self),
                }
            }
            "isolation" => {
                let (which, which_span) = self.any_word()?;
                let mode = match which {
                    "semaphore" => Isolation::Semaphore,
                    "pool" => Isolation::Pool,
                    _ => return None,
                };
                BulkheadSetting::Isolation {
                    mode: Spanned::new(mode, which_span),
                    span: span(self),
                }
            }
            _ => return None,
        })
    }

    fn limit_setting(&mut self) -> Option<LimitSetting> {
        let (word, kw) = self.any_word()?;
        let span = |p: &Self| Span::new(kw.start, p.end);
        Some(match word {
            "calls" => {
                let rate = self.rate(Self::int)?;
                LimitSetting::Calls {
                    rate,
                    span: span(self),
                }
            }
            "bytes" => {
                let rate = self.rate(Self::size)?;
                LimitSetting::Bytes {
                    rate,
                    span: span(self),
                }
            }
            "per" => {
                let (which, which_span) = self.any_word()?;
                let key = match which {
                    "all" => LimitKey::All,
                    "domain" => LimitKey::Domain,
                    "service" => LimitKey::Service,
                    "consumer" => LimitKey::Consumer,
                    _ => return None,
                };
                LimitSetting::Per {
                    key: Spanned::new(key, which_span),
                    span: span(self),
                }
            }
            "action" => {
                let (which, which_span) = self.any_word()?;
                let action = match which {
                    "reject" => LimitAction::Reject { span: which_span },
                    "shape" => {
                        self.kw("max_delay")?;
                        let max_delay = self.duration()?;
                        LimitAction::Shape {
                            max_delay,
                            span: Span::new(which_span.start, self.end),
                        }
                    }
                    _ => return None,
                };
                LimitSetting::Action {
                    action,
                    span: span(self),
                }
            }
            "reject" => {
                self.kw("with")?;
                let status = self.int()?;
                LimitSetting::RejectWith {
                    status,
                    span: span(self),
                }
            }
            "release" => {
                let (which, which_span) = self.any_word()?;
                let release = match which {
                    "after" => {
                        let after = self.duration()?;
                        Release::After {
                            after,
                            span: Span::new(which_span.start, self.end),
                        }
                    }
                    "manual" => Release::Manual { span: which_span },
                    _ => return None,
                };
                LimitSetting::Release {
                    release,
                    span: span(self),
                }
            }
            "scope" => {
                let (which, which_span) = self.any_word()?;
                let scope = match which {
                    "local" => LimitScope::Local { span: which_span },
                    "cluster" => {
                        let sync = match self.kw("sync") {
                            None => None,
                            Some(_) => {
                                let (mode, mode_span) = self.any_word()?;
                                Some(match mode {
                                    "exact" => ClusterSync::Exact { span: mode_span },
                                    "batch" => {
                                        let every = self.duration()?;
                                        ClusterSync::Batch {
                                            every,
                                            span: Span::new(mode_span.start, self.end),
                                        }
                                    }
                                    _ => return None,
                                })
                            }
                        };
                        LimitScope::Cluster {
                            sync,
                            span: Span::new(which_span.start, self.end),
                        }
                    }
                    _ => return None,
                };
                LimitSetting::Scope {
                    scope,
                    span: span(self),
                }
            }
            _ => return None,
        })
    }

    fn fuse_setting(&mut self) -> Option<FuseSetting> {
        let (word, kw) = self.any_word()?;
        let span = |p: &Self| Span::new(kw.start, p.end);
        Some(match word {
            "trip" => {
                self.kw("when")?;
                let (m, m_span) = self.any_word()?;
                let metric = match m {
                    "business_errors" => TripMetric::BusinessErrors,
                    "business_error_ratio" => TripMetric::BusinessErrorRatio,
                    "system_errors" => TripMetric::SystemErrors,
                    "system_error_ratio" => TripMetric::SystemErrorRatio,
                    "errors" => TripMetric::Errors,
                    "error_ratio" => TripMetric::ErrorRatio,
                    _ => return None,
                };
                self.skip();
                let op = if self.bytes.get(self.pos..self.pos + 2) == Some(b">=") {
                    Spanned::new(CompareOp::Ge, self.take(2))
                } else if self.byte() == Some(b'>') {
                    Spanned::new(CompareOp::Gt, self.take(1))
                } else {
                    return None;
                };
                let threshold = match self.percent() {
                    Some(p) => Spanned::new(Threshold::Percent(p.node), p.span),
                    None => {
                        let n = self.int()?;
                        Spanned::new(Threshold::Count(n.node), n.span)
                    }
                };
                self.kw("over")?;
                let window = self.duration()?;
                let min_calls = match self.kw("min_calls") {
                    Some(_) => Some(self.int()?),
                    None => None,
                };
                FuseSetting::Trip(Trip {
                    metric: Spanned::new(metric, m_span),
                    op,
                    threshold,
                    window,
                    min_calls,
                    span: span(self),
                })
            }
            "classify" => {
                let (c, c_span) = self.any_word()?;
                let class = match c {
                    "business" => ErrorClass::Business,
                    "system" => ErrorClass::System,
                    _ => return None,
                };
                let mut items = Vec::new();
                loop {
                    let i_span = match self.peek_word() {
                        "status" => self.take(6),
                        "connect_failure" => {
                            items.push(ClassifyItem::ConnectFailure {
                                span: self.take(15),
                            });
                            continue;
                        }
                        "timeout" => {
                            items.push(ClassifyItem::Timeout { span: self.take(7) });
                            continue;
                        }
                        "reset" => {
                            items.push(ClassifyItem::Reset { span: self.take(5) });
                            continue;
                        }
                        _ => break,
                    };
                    let mut codes = vec![self.status_range()?];
                    while self.digits().is_some() {
                        codes.push(self.status_range()?);
                    }
                    items.push(ClassifyItem::Status {
                        codes,
                        span: Span::new(i_span.start, self.end),
                    });
                }
                if items.is_empty() {
                    return None;
                }
                FuseSetting::Classify(Classify {
                    class: Spanned::new(class, c_span),
                    items,
                    span: span(self),
                })
            }
            "recover" => {
                let recover = match self.any_word()?.0 {
                    "manual" => Recover::Manual,
                    "after" => {
                        let after = self.duration()?;
                        self.kw("probe")?;
                        let probes = self.int()?;
                        Recover::After { after, probes }
                    }
                    _ => return None,
                };
                FuseSetting::Recover {
                    recover,
                    span: span(self),
                }
            }
            "reject" => {
                self.kw("with")?;
                let status = self.int()?;
                FuseSetting::RejectWith {
                    status,
                    span: span(self),
                }
            }
            _ => return None,
        })
    }

    /// `500` or `500..599`, with nothing between the parts.
    fn status_range(&mut self) -> Option<StatusRange> {
        let from = self.int()?;
        let to = if self.bytes.get(self.pos..self.pos + 2) == Some(b"..")
            && self
                .bytes
                .get(self.pos + 2)
                .is_some_and(|&b| b == b'-' || b.is_ascii_digit())
        {
            self.take(2);
            Some(self.int()?)
        } else {
            None
        };
        Some(StatusRange {
            span: Span::new(from.span.start, self.end),
            from,
            to,
        })
    }

    // === Warmup and shutdown ===

    fn warmup_step(&mut self) -> Option<WarmupStep> {
        let (word, kw) = self.any_word()?;
        let span = |p: &Self| Span::new(kw.start, p.end);
        Some(match word {
            "ready" => {
                self.kw("when")?;
                let probe = self.http_call()?;
                self.kw("is")?;
                let status = self.int()?;
                self.kw("every")?;
                let every = self.duration()?;
                let after = match self.kw("after") {
                    Some(_) => Some(self.duration()?),
                    None => None,
                };
                let timeout = match self.kw("timeout") {
                    Some(_) => Some(self.duration()?),
                    None => None,
                };
                WarmupStep::Ready {
                    probe,
                    status,
                    every,
                    after,
                    timeout,
                    span: span(self),
                }
            }
            "register" => WarmupStep::Register { span: kw },
            "ramp" => {
                let over = self.duration()?;
                self.kw("from")?;
                let from = self.percent()?;
                WarmupStep::Ramp {
                    over,
                    from,
                    span: span(self),
                }
            }
            "start" => {
                let what = self.ident()?;
                self.kw("via")?;
                let action = self.action()?;
                WarmupStep::Start {
                    what,
                    action,
                    span: span(self),
                }
            }
            _ => return None,
        })
    }

    fn shutdown_step(&mut self) -> Option<ShutdownStep> {
        let (word, kw) = self.any_word()?;
        let span = |p: &Self| Span::new(kw.start, p.end);
        Some(match word {
            "deregister" => ShutdownStep::Deregister { span: kw },
            "wait" => match self.kw("for") {
                Some(_) => {
                    let registry = self.ident()?;
                    ShutdownStep::WaitFor {
                        registry,
                        span: span(self),
                    }
                }
                None => {
                    let duration = self.duration()?;
                    ShutdownStep::Wait {
                        duration,
                        span: span(self),
                    }
                }
            },
            "stop" => {
                let what = self.ident()?;
                self.kw("via")?;
                let action = self.action()?;
                ShutdownStep::Stop {
                    what,
                    action,
                    span: span(self),
                }
            }
            "drain" => {
                let deadline = self.duration()?;
                ShutdownStep::Drain {
                    deadline,
                    span: span(self),
                }
            }
            _ => return None,
        })
    }

    fn action(&mut self) -> Option<Action> {
        if self.peek_word() == "signal" {
            let start = self.take(6).start;
            let signal = self.ident()?;
            return Some(Action::Signal {
                signal,
                span: Span::new(start, self.end),
            });
        }
        Some(Action::Http(self.http_call()?))
    }

    fn http_call(&mut self) -> Option<HttpCall> {
        let start = self.kw("http")?.start;
        let method = self.ident()?;
        let path = self.string()?;
        Some(HttpCall {
            method,
            path,
            span: Span::new(start, self.end),
        })
    }
}
