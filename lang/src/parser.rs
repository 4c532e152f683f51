//! From source text to the syntax tree.
//!
//! One parser: the pest grammar (`gov.pest`). Its entry rule `file` parses
//! any text, keeping each statement (or item) that does not parse as an error
//! node, so one pass gives the tree of everything well-formed and the place
//! of every error. Each error node is then explained by running the strict
//! rule (`stmt_probe`, `item_probe`) from its start: pest's furthest failure
//! there says what was expected. [`parse`] refuses oversize input and
//! parentheses nested too deep before pest recurses into them. Pest types
//! stay inside this crate.

use std::cell::RefCell;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::Arc;

use pest::Parser as _;
use pest::error::InputLocation;
use pest::iterators::{Pair, Pairs};

use crate::ast::*;
use crate::diagnostic::SyntaxError;
use crate::grammar::{GovParser, Rule};
use crate::scan::*;

mod build;

/// Pest rule calls allowed per parse. A valid policy of [`MAX_SOURCE_BYTES`]
/// needs far fewer (about 15 calls per byte); the budget bounds the work a
/// hostile input can cause.
const CALL_LIMIT: usize = 200_000_000;

/// Parses one `.gov` file. `name` is used in diagnostics. On errors, the
/// first one; [`parse_all`] reports them all.
pub fn parse(name: &str, src: &str) -> Result<Policy, SyntaxError> {
    parse_up_to(name, src, 1).map_err(|(errors, _, _)| {
        errors
            .into_iter()
            .next()
            .unwrap_or_else(|| SyntaxError::internal(name, src, Span::new(0, 0)))
    })
}

/// Parses one `.gov` file and, on errors, reports every one of them (up to
/// [`MAX_SYNTAX_ERRORS`]), in the order of the text.
///
/// After an error the parser skips the statement that holds it, to the next
/// statement keyword or the `}` of its service (or the whole item, when the
/// item's own shape is broken), and goes on; errors next to each other are one.
pub fn parse_all(name: &str, src: &str) -> Result<Policy, Vec<SyntaxError>> {
    let parsed = parse_partial(name, src);
    match parsed.policy {
        Some(policy) if parsed.errors.is_empty() => Ok(policy),
        _ => Err(parsed.errors),
    }
}

/// What [`parse_partial`] found in one file.
#[derive(Debug)]
pub struct Parsed {
    /// The tree of what parsed: every item and statement, less those that
    /// hold a syntax error (see [`Parsed::skipped`]). `None` when the file
    /// was refused before parsing (too large, parentheses too deep) or was
    /// too complex for the parser's call and stack limits.
    pub policy: Option<Policy>,
    /// Every syntax error, in the order of the text.
    pub errors: Vec<SyntaxError>,
    /// The text skipped after each error, and what it would have defined.
    pub skipped: Vec<Skipped>,
}

/// A statement or an item skipped because it holds a syntax error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The word it starts with (`match`, `bulkhead`, `service`...), if any.
    pub keyword: Option<String>,
    /// The word after the keyword: for a definition, the name it defines.
    pub name: Option<String>,
    /// An item (at column 0) rather than a statement inside one.
    pub item: bool,
    pub span: Span,
}

/// Parses one `.gov` file as far as it goes: every syntax error (as
/// [`parse_all`]) and the tree of the rest, so that the compiler can check
/// what parsed. Statements (or items) that hold an error are left out of the
/// tree and listed in [`Parsed::skipped`].
pub fn parse_partial(name: &str, src: &str) -> Parsed {
    match parse_up_to(name, src, MAX_SYNTAX_ERRORS) {
        Ok(policy) => Parsed {
            policy: Some(policy),
            errors: Vec::new(),
            skipped: Vec::new(),
        },
        Err((errors, policy, regions)) => Parsed {
            policy,
            errors,
            skipped: regions
                .into_iter()
                .map(|(r, item)| skipped(src, r, item))
                .collect(),
        },
    }
}

/// What the text in `region` starts with.
fn skipped(src: &str, region: Range<usize>, item: bool) -> Skipped {
    let text = src.get(region.clone()).unwrap_or("");
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .unwrap_or("");
    let word = |w: &&str| {
        w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    let mut words = line.split(|c: char| c.is_whitespace() || c == '{' || c == '=');
    let mut words = words.by_ref().filter(|w| !w.is_empty());
    let keyword = words.next().filter(word).map(str::to_owned);
    let name = keyword
        .as_ref()
        .and(words.next())
        .filter(word)
        .map(str::to_owned);
    Skipped {
        keyword,
        name,
        item,
        span: Span::new(region.start, region.end),
    }
}

/// The errors, the tree of what parsed around them, and the regions skipped.
type Partial = (Vec<SyntaxError>, Option<Policy>, Vec<(Range<usize>, bool)>);

fn parse_up_to(name: &str, src: &str, max: usize) -> Result<Policy, Partial> {
    let fail = |e| Err((vec![e], None, Vec::new()));
    if src.len() > MAX_SOURCE_BYTES {
        return fail(SyntaxError::too_large(name, src.len(), MAX_SOURCE_BYTES));
    }
    if let Err(e) = check_nesting(name, src) {
        return fail(e);
    }
    pest::set_call_limit(NonZeroUsize::new(CALL_LIMIT));
    let mut pairs = match GovParser::parse(Rule::file, src) {
        Ok(pairs) => pairs,
        // `file` takes any text: only the call limit stops it.
        Err(e) => return fail(SyntaxError::from_pest(name, src, e)),
    };
    let builder = Builder {
        name,
        src,
        broken: RefCell::new(Vec::new()),
    };
    let Some(file) = pairs.next() else {
        return fail(builder.internal(Span::new(0, 0)));
    };
    let policy = match builder.policy(file) {
        Ok(policy) => policy,
        Err(e) => return fail(e),
    };
    let broken = builder.broken.into_inner();
    if broken.is_empty() {
        return Ok(policy);
    }
    let shared: Arc<str> = Arc::from(src);
    let mut errors = Vec::new();
    let mut regions = Vec::new();
    let mut last_end: Option<usize> = None;
    for b in broken {
        regions.push((b.region.clone(), b.item));
        // Errors with only space or comments between them are one: the
        // second starts where skipping the first stopped.
        let adjacent = !b.item
            && !starts_statement(src, b.region.start)
            && last_end.is_some_and(|end| {
                src.get(end..b.region.start).is_some_and(|between| {
                    code_bytes(between).all(|(_, c)| c.is_ascii_whitespace())
                })
            });
        last_end = Some(b.region.end);
        if adjacent || errors.len() >= max {
            continue;
        }
        let err = b
            .error
            .unwrap_or_else(|| explain(name, src, b.probe_from, b.item));
        errors.push(err.with_source(name, shared.clone()));
    }
    Err((errors, Some(policy), regions))
}

/// Whether the text at `at` starts with a word that starts a statement: an
/// error node there is a statement of its own, not the rest of the one before.
fn starts_statement(src: &str, at: usize) -> bool {
    let rest = src.get(at..).unwrap_or("");
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(rest.len());
    crate::grammar::starts_statement(rest.get(..end).unwrap_or(""))
}

/// What went wrong in the broken statement (or item) at `start`: the strict
/// rule's first failure from there.
fn explain(name: &str, src: &str, start: usize, item: bool) -> SyntaxError {
    let rest = src.get(start..).unwrap_or("");
    let rule = if item {
        Rule::item_probe
    } else {
        Rule::stmt_probe
    };
    match GovParser::parse(rule, rest) {
        Ok(_) => SyntaxError::internal(name, src, Span::new(start, start)),
        Err(mut e) => {
            e.location = match e.location {
                InputLocation::Pos(p) => InputLocation::Pos(p + start),
                InputLocation::Span((a, b)) => InputLocation::Span((a + start, b + start)),
            };
            SyntaxError::from_pest(name, src, e)
        }
    }
}

/// Parses with the strict grammar (no error nodes), for tests.
#[doc(hidden)]
pub fn parse_strict(name: &str, src: &str) -> Result<Policy, SyntaxError> {
    if src.len() > MAX_SOURCE_BYTES {
        return Err(SyntaxError::too_large(name, src.len(), MAX_SOURCE_BYTES));
    }
    check_nesting(name, src)?;
    pest::set_call_limit(NonZeroUsize::new(CALL_LIMIT));
    let mut pairs =
        GovParser::parse(Rule::policy, src).map_err(|e| SyntaxError::from_pest(name, src, e))?;
    let builder = Builder {
        name,
        src,
        broken: RefCell::new(Vec::new()),
    };
    let policy = pairs
        .next()
        .ok_or_else(|| builder.internal(Span::new(0, 0)))?;
    let policy = builder.policy(policy)?;
    match builder
        .broken
        .into_inner()
        .into_iter()
        .find_map(|b| b.error)
    {
        Some(e) => Err(e),
        None => Ok(policy),
    }
}

/// Refuses parentheses nested deeper than [`MAX_NESTING`] before pest
/// recurses into them.
fn check_nesting(name: &str, src: &str) -> Result<(), SyntaxError> {
    let mut depth = 0usize;
    for (pos, byte) in code_bytes(src) {
        match byte {
            b'(' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(SyntaxError::too_deep(name, src, Span::new(pos, pos + 1)));
                }
            }
            b')' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

// === Builder ===

/// Turns pairs into nodes. The grammar guarantees the shape of every pair, so
/// a mismatch is a bug in this file and reported as an internal error rather
/// than a panic.
struct Builder<'s> {
    name: &'s str,
    src: &'s str,
    /// The error nodes met so far, in text order.
    broken: RefCell<Vec<Broken>>,
}

/// A statement or item that did not parse (or did, but holds a value the
/// builder refuses, such as a number over 64 bits).
struct Broken {
    region: Range<usize>,
    item: bool,
    /// Where to run the strict rule to explain it: the statement before it,
    /// when there is one (`match m = a or` + `capacity ...` parses `match m =
    /// a` and breaks at `or`, but the mistake is at `capacity`, which only a
    /// run from `match` sees).
    probe_from: usize,
    /// Found by the builder; `None` for an error node, explained later.
    error: Option<SyntaxError>,
}

type P<'i> = Pair<'i, Rule>;

/// The span of a pair without trailing whitespace and comments. Pest skips
/// them before an optional or repeated element even when the element is
/// absent (`a ~ b?` is `a ~ skip ~ b?`), so a rule's own span may run on; the
/// end of its last token is where the construct really ends.
fn span_of(p: &P<'_>) -> Span {
    let span = p.as_span();
    let (start, end) = (span.start(), span.end());
    // Most pairs end at their last token, or run on over spaces only: trim
    // those. A comment in the run-on (rare) needs the walk below.
    let text = span.as_str();
    let trimmed = text.trim_end_matches([' ', '\t', '\r', '\n']);
    let last_line = trimmed.rsplit('\n').next().unwrap_or("");
    if !last_line.contains('#') || matches!(p.as_rule(), Rule::string | Rule::string_body) {
        return Span::new(start, start + trimmed.len());
    }
    let mut end = end;
    let mut cur = p.clone();
    // Strings and status ranges have no implicit whitespace; their last
    // inner pair is not their last character.
    while !matches!(cur.as_rule(), Rule::string | Rule::status_range)
        && let Some(last) = cur.clone().into_inner().last()
    {
        end = last.as_span().end();
        cur = last;
    }
    Span::new(start, end)
}

/// The children of a pair without punctuation.
struct Kids<'i> {
    pairs: Pairs<'i, Rule>,
    span: Span,
}

impl<'i> Kids<'i> {
    fn of(p: P<'i>) -> Self {
        let span = span_of(&p);
        Kids {
            pairs: p.into_inner(),
            span,
        }
    }

    fn next(&mut self, b: &Builder<'_>) -> Result<P<'i>, SyntaxError> {
        for p in self.pairs.by_ref() {
            if !matches!(
                p.as_rule(),
                Rule::lbrace
                    | Rule::rbrace
                    | Rule::lparen
                    | Rule::rparen
                    | Rule::equals
                    | Rule::range_dots
            ) {
                return Ok(p);
            }
        }
        Err(b.internal(self.span))
    }

    /// The next child, which must be `rule`.
    fn rule(&mut self, b: &Builder<'_>, rule: Rule) -> Result<P<'i>, SyntaxError> {
        let p = self.next(b)?;
        if p.as_rule() == rule {
            Ok(p)
        } else {
            Err(b.internal(span_of(&p)))
        }
    }

    /// Skips a keyword.
    fn kw(&mut self, b: &Builder<'_>) -> Result<(), SyntaxError> {
        self.next(b).map(drop)
    }

    /// The next child if it is `rule`.
    fn opt(&mut self, rule: Rule) -> Option<P<'i>> {
        let p = self.pairs.peek()?;
        if p.as_rule() == rule {
            self.pairs.next()
        } else {
            None
        }
    }

    fn rest(self) -> impl Iterator<Item = P<'i>> {
        self.pairs
            .filter(|p| !matches!(p.as_rule(), Rule::lbrace | Rule::rbrace | Rule::EOI))
    }
}

impl Builder<'_> {
    fn internal(&self, span: Span) -> SyntaxError {
        SyntaxError::internal(self.name, self.src, span)
    }

    fn broken(&self, region: Range<usize>, item: bool, error: Option<SyntaxError>) {
        self.broken_after(region.start, region, item, error);
    }

    fn broken_after(
        &self,
        probe_from: usize,
        region: Range<usize>,
        item: bool,
        error: Option<SyntaxError>,
    ) {
        self.broken.borrow_mut().push(Broken {
            region,
            item,
            probe_from,
            error,
        });
    }

    fn policy(&self, p: P<'_>) -> Result<Policy, SyntaxError> {
        let mut items = Vec::new();
        for item in Kids::of(p).rest() {
            let region = item.as_span().start()..item.as_span().end();
            let built = match item.as_rule() {
                Rule::registry_def => self.registry(item).map(Item::Registry),
                Rule::service_def | Rule::service_body => self.service(item).map(Item::Service),
                Rule::item_error => {
                    self.broken(region, true, None);
                    continue;
                }
                _ => return Err(self.internal(span_of(&item))),
            };
            match built {
                Ok(item) => items.push(item),
                Err(e) => self.broken(region, true, Some(e)),
            }
        }
        Ok(Policy {
            items,
            comments: Comments(comments(self.src)),
        })
    }

    fn registry(&self, p: P<'_>) -> Result<Registry, SyntaxError> {
        let span = span_of(&p);
        let mut k = Kids::of(p);
        k.kw(self)?;
        let name = self.ident(k.rule(self, Rule::ident)?);
        let mut settings = Vec::new();
        for s in k.rest() {
            let span = span_of(&s);
            let mut k = Kids::of(s);
            let key_pair = k.next(self)?;
            let key = match key_pair.as_rule() {
                Rule::kw_server_cache => RegistryKey::ServerCache,
                Rule::kw_client_refresh => RegistryKey::ClientRefresh,
                Rule::kw_balancer_refresh => RegistryKey::BalancerRefresh,
                _ => return Err(self.internal(span_of(&key_pair))),
            };
            let key = Spanned::new(key, span_of(&key_pair));
            let value = self.duration(k.next(self)?)?;
            settings.push(RegistrySetting { key, value, span });
        }
        Ok(Registry {
            name,
            settings,
            span,
        })
    }

    fn service(&self, p: P<'_>) -> Result<Service, SyntaxError> {
        let span = span_of(&p);
        let mut k = Kids::of(p);
        k.kw(self)?;
        let name = self.ident(k.rule(self, Rule::ident)?);
        let mut body = Vec::new();
        let mut previous = None;
        for s in k.rest() {
            let region = s.as_span().start()..s.as_span().end();
            if s.as_rule() == Rule::stmt_error {
                let from = previous.unwrap_or(region.start);
                self.broken_after(from, region, false, None);
                previous = None;
                continue;
            }
            previous = Some(region.start);
            match self.service_stmt(s) {
                Ok(stmt) => body.push(stmt),
                Err(e) => self.broken(region, false, Some(e)),
            }
        }
        Ok(Service { name, body, span })
    }

    /// `header "x" [trusted from peers ...]`, `jwt ...` or `peer ...`: where a
    /// service's consumer comes from.
    fn consumer_source(&self, source: P<'_>) -> Result<ConsumerSource, SyntaxError> {
        let rule = source.as_rule();
        let mut s = Kids::of(source);
        s.kw(self)?;
        let on_invalid = |outcome: P<'_>| {
            Spanned::new(
                if outcome.as_rule() == Rule::kw_count {
                    OnInvalid::Count
                } else {
                    OnInvalid::Reject
                },
                span_of(&outcome),
            )
        };
        if rule == Rule::consumer_peer {
            s.kw(self)?;
            s.kw(self)?;
            Ok(ConsumerSource::Peer {
                on_invalid: on_invalid(s.next(self)?),
            })
        } else if rule == Rule::consumer_jwt {
            s.kw(self)?;
            let header = self.string(s.next(self)?);
            s.kw(self)?;
            let issuer = self.string(s.next(self)?);
            s.kw(self)?;
            let audience = self.string(s.next(self)?);
            s.kw(self)?;
            let keys = self.string(s.next(self)?);
            s.kw(self)?;
            let claim = self.string(s.next(self)?);
            s.kw(self)?;
            s.kw(self)?;
            let on_invalid = on_invalid(s.next(self)?);
            Ok(ConsumerSource::Jwt(JwtSource {
                header,
                issuer,
                audience,
                keys,
                claim,
                on_invalid,
            }))
        } else {
            let header = self.string(s.next(self)?);
            let mut trusted = Vec::new();
            if let Some(t) = s.opt(Rule::consumer_trusted) {
                let mut t = Kids::of(t);
                t.kw(self)?;
                t.kw(self)?;
                t.kw(self)?;
                while let Some(peer) = t.opt(Rule::string) {
                    trusted.push(self.string(peer));
                }
            }
            Ok(ConsumerSource::Header { header, trusted })
        }
    }

    fn service_stmt(&self, p: P<'_>) -> Result<ServiceStmt, SyntaxError> {
        let span = span_of(&p);
        let rule = p.as_rule();
        let mut k = Kids::of(p);
        Ok(match rule {
            Rule::domain_stmt => {
                k.kw(self)?;
                ServiceStmt::Domain(DomainStmt {
                    name: self.string(k.next(self)?),
                    span,
                })
            }
            Rule::paths_stmt => {
                k.kw(self)?;
                let mut words = vec![self.ident(k.next(self)?)];
                while let Some(word) = k.opt(Rule::ident) {
                    words.push(self.ident(word));
                }
                ServiceStmt::Paths(PathsStmt { words, span })
            }
            Rule::uses_registry => {
                k.kw(self)?;
                ServiceStmt::Registry(UsesRegistry {
                    name: self.ident(k.next(self)?),
                    span,
                })
            }
            Rule::consumer_stmt => {
                k.kw(self)?;
                k.kw(self)?;
                let source = self.consumer_source(k.next(self)?)?;
                ServiceStmt::Consumer(ConsumerStmt { source, span })
            }
            Rule::capacity_stmt => {
                k.kw(self)?;
                ServiceStmt::Capacity(self.capacity(k.next(self)?, span)?)
            }
            Rule::match_def => {
                k.kw(self)?;
                let name = self.ident(k.rule(self, Rule::ident)?);
                let expr = self.match_expr(k.rule(self, Rule::match_expr)?, &mut 0)?;
                let latency = match k.opt(Rule::latency) {
                    Some(l) => {
                        let mut k = Kids::of(l);
                        k.kw(self)?;
                        Some(self.duration(k.next(self)?)?)
                    }
                    None => None,
                };
                let criticality = match k.opt(Rule::criticality) {
                    Some(c) => {
                        let cs = c.as_span();
                        let span = Span::new(cs.start(), cs.end());
                        let class = match c.into_inner().next().map(|w| w.as_rule()) {
                            Some(Rule::kw_critical) => Criticality::Critical,
                            Some(Rule::kw_sheddable) => Criticality::Sheddable,
                            Some(Rule::kw_default) => Criticality::Default,
                            _ => return Err(self.internal(span)),
                        };
                        Some(Spanned::new(class, span))
                    }
                    None => None,
                };
                ServiceStmt::Match(MatchDef {
                    name,
                    expr,
                    latency,
                    criticality,
                    span,
                })
            }
            Rule::warmup_def => {
                k.kw(self)?;
                let steps = k
                    .rest()
                    .map(|s| self.warmup_step(s))
                    .collect::<Result<_, _>>()?;
                ServiceStmt::Warmup(Warmup { steps, span })
            }
            Rule::shutdown_def => {
                k.kw(self)?;
                let steps = k
                    .rest()
                    .map(|s| self.shutdown_step(s))
                    .collect::<Result<_, _>>()?;
                ServiceStmt::Shutdown(Shutdown { steps, span })
            }
            Rule::outlier_def => {
                k.kw(self)?;
                let to = match k.opt(Rule::outlier_to) {
                    Some(t) => {
                        let mut t = Kids::of(t);
                        t.kw(self)?;
                        Some(self.ident(t.rule(self, Rule::ident)?))
                    }
                    None => None,
                };
                let settings = self.settings(k)?;
                ServiceStmt::Outlier(Outlier { to, settings, span })
            }
            // Every other statement is a rule: the grammar's definition of
            // a kind (`KIND NAME on EXPR { SETTING... }`), read the same way
            // for every kind.
            _ => ServiceStmt::Rule(self.rule_def(k, span)?),
        })
    }
}

/// `\"` is `"` and `\\` is `\`; the grammar allows no other escape.
pub(crate) fn unescape(body: &str) -> String {
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}
