//! The canonical layout of a policy: `govc fmt`.
//!
//! Two-space indent, one statement per line, one blank line between
//! top-level items. Blank lines between statements are kept, collapsed to one.
//! Comments are kept: a comment on its own line stays above the statement it
//! precedes, a comment after a statement stays on its line, a comment before
//! a closing `}` stays at the end of the block. A comment inside a statement
//! (between its words) moves above the statement. Literals print as written,
//! except that `1min` prints as `1m` and `12.50%` as `12.5%`.
//!
//! The formatter reads the tree for what to print and the source text only
//! for where comments and blank lines were, so a generated tree (with empty
//! spans and no comments) formats without any source.

use crate::SyntaxError;
use crate::ast::*;
use crate::parser::parse;
use crate::scan::code_bytes;

/// Parses and formats one file.
pub fn format_source(name: &str, src: &str) -> Result<String, SyntaxError> {
    let policy = parse(name, src)?;
    Ok(format(&policy, src))
}

/// Prints `policy` in the canonical layout. `src` is the text it was parsed
/// from (for comments and blank lines); any text works for a tree without
/// comments.
pub fn format(policy: &Policy, src: &str) -> String {
    let mut f = Formatter {
        src,
        comments: &policy.comments.0,
        next: 0,
        prev_end: 0,
        fresh: true,
        indent: 0,
        out: String::new(),
    };
    for (i, item) in policy.items.iter().enumerate() {
        if i > 0 {
            f.out.push('\n');
            f.fresh = true;
        }
        match item {
            Item::Registry(r) => f.registry(r),
            Item::Service(s) => f.service(s),
        }
    }
    f.comments_before(usize::MAX);
    f.out
}

struct Formatter<'a> {
    src: &'a str,
    comments: &'a [Comment],
    /// The first comment not printed yet.
    next: usize,
    /// Where the last printed node or comment ended in `src`.
    prev_end: usize,
    /// Nothing printed yet in the current block (no blank line goes here).
    fresh: bool,
    indent: usize,
    out: String,
}

// === Layout ===

impl Formatter<'_> {
    /// Prints, each on its own line, the comments that start before `pos`.
    fn comments_before(&mut self, pos: usize) {
        while let Some(c) = self.comments.get(self.next) {
            if c.span.start >= pos {
                break;
            }
            self.next += 1;
            self.blank_line_before(c.span.start);
            self.start_line();
            self.out.push('#');
            self.out.push_str(&c.text);
            self.out.push('\n');
            self.prev_end = self.prev_end.max(c.span.end);
        }
    }

    /// One blank line if the source had at least one between the last
    /// printed thing and `start`.
    fn blank_line_before(&mut self, start: usize) {
        let blank = self
            .src
            .get(self.prev_end..start)
            .is_some_and(|gap| gap.bytes().filter(|&b| b == b'\n').count() >= 2);
        if blank && !self.fresh {
            self.out.push('\n');
        }
        self.fresh = false;
    }

    fn start_line(&mut self) {
        for _ in 0..self.indent {
            self.out.push_str("  ");
        }
    }

    /// Ends the current line; a comment that followed `end` on the same
    /// source line stays on it.
    fn end_line(&mut self, end: usize) {
        if let Some(c) = self.comments.get(self.next)
            && self
                .src
                .get(end..c.span.start)
                .is_some_and(|gap| gap.bytes().all(|b| b == b' ' || b == b'\t'))
        {
            self.next += 1;
            self.out.push_str(" #");
            self.out.push_str(&c.text);
            self.prev_end = self.prev_end.max(c.span.end);
        }
        self.out.push('\n');
        self.prev_end = self.prev_end.max(end);
    }

    /// A one-line statement.
    fn stmt(&mut self, span: Span, text: &str) {
        self.comments_before(span.end);
        self.blank_line_before(span.start);
        self.start_line();
        self.out.push_str(text);
        self.end_line(span.end);
    }

    /// `header { children }`; `span` covers the whole block.
    fn block<T>(
        &mut self,
        span: Span,
        header: &str,
        children: &[T],
        mut child: impl FnMut(&mut Self, &T),
    ) {
        let open = self.open_brace(span);
        self.comments_before(open);
        self.blank_line_before(span.start);
        self.start_line();
        self.out.push_str(header);
        let close = span.end.saturating_sub(1);
        let inner_comment = self
            .comments
            .get(self.next)
            .is_some_and(|c| c.span.start < close);
        if children.is_empty() && !inner_comment {
            self.out.push_str(" {}");
            self.end_line(span.end);
            return;
        }
        self.out.push_str(" {");
        self.end_line(open + 1);
        self.indent += 1;
        self.fresh = true;
        for c in children {
            child(self, c);
        }
        self.comments_before(close);
        self.indent -= 1;
        self.fresh = false;
        self.start_line();
        self.out.push('}');
        self.end_line(span.end);
    }

    /// Where the block's `{` is: the first one in code after the start.
    fn open_brace(&self, span: Span) -> usize {
        self.src
            .get(span.start..)
            .and_then(|rest| code_bytes(rest).find(|&(_, b)| b == b'{'))
            .map_or(span.start, |(i, _)| span.start + i)
    }
}

// === Items ===

impl Formatter<'_> {
    fn registry(&mut self, r: &Registry) {
        let header = format!("registry {}", r.name.node);
        self.block(r.span, &header, &r.settings, |f, s| {
            let key = match s.key.node {
                RegistryKey::ServerCache => "server_cache",
                RegistryKey::ClientRefresh => "client_refresh",
                RegistryKey::BalancerRefresh => "balancer_refresh",
            };
            f.stmt(s.span, &format!("{key} {}", s.value.node));
        });
    }

    fn service(&mut self, s: &Service) {
        let header = format!("service {}", s.name.node);
        self.block(s.span, &header, &s.body, Self::service_stmt);
    }

    fn service_stmt(&mut self, stmt: &ServiceStmt) {
        match stmt {
            ServiceStmt::Domain(d) => self.stmt(d.span, &format!("domain {}", quote(&d.name.node))),
            ServiceStmt::Registry(r) => self.stmt(r.span, &format!("registry {}", r.name.node)),
            ServiceStmt::Paths(p) => {
                let words: Vec<&str> = p.words.iter().map(|w| w.node.as_str()).collect();
                self.stmt(p.span, &format!("paths {}", words.join(" ")))
            }
            ServiceStmt::Consumer(c) => {
                let text = match &c.source {
                    ConsumerSource::Header { header, trusted } if trusted.is_empty() => {
                        format!("consumer from header {}", quote(&header.node))
                    }
                    ConsumerSource::Header { header, trusted } => {
                        let peers: Vec<String> = trusted.iter().map(|p| quote(&p.node)).collect();
                        format!(
                            "consumer from header {} trusted from peer {}",
                            quote(&header.node),
                            peers.join(", ")
                        )
                    }
                    ConsumerSource::Peer { on_invalid } => {
                        format!("consumer from peer on invalid {}", on_invalid.node.as_str())
                    }
                    ConsumerSource::Jwt(j) => format!(
                        "consumer from jwt header {} issuer {} audience {} keys {} claim {} on invalid {}",
                        quote(&j.header.node),
                        quote(&j.issuer.node),
                        quote(&j.audience.node),
                        quote(&j.keys.node),
                        quote(&j.claim.node),
                        j.on_invalid.node.as_str()
                    ),
                };
                self.stmt(c.span, &text)
            }
            ServiceStmt::Capacity(c) => {
                let (text, span) = match c {
                    Capacity::Workers { count, span } => {
                        (format!("capacity workers {}", count.node), span)
                    }
                    Capacity::Instances { count, span } => {
                        (format!("capacity instances {}", count.node), span)
                    }
                    Capacity::Rate { rate, span } => {
                        (format!("capacity rate {}", int_rate(rate)), span)
                    }
                    Capacity::Amplification { count, span } => {
                        (format!("capacity amplification {}", count.node), span)
                    }
                };
                self.stmt(*span, &text);
            }
            ServiceStmt::Match(m) => {
                let mut text = format!("match {} = {}", m.name.node, expr(&m.expr));
                if let Some(l) = &m.latency {
                    text.push_str(&format!(" latency {}", l.node));
                }
                if let Some(c) = &m.criticality {
                    text.push(' ');
                    text.push_str(c.node.word());
                }
                self.stmt(m.span, &text);
            }
            ServiceStmt::Rule(r) => {
                let header = format!("{} {} on {}", r.kind.node, r.name.node, expr(&r.on));
                self.block(r.span, &header, &r.settings, |f, s| {
                    f.stmt(s.span, &s.to_string());
                });
            }
            ServiceStmt::Outlier(o) => {
                let header = match &o.to {
                    Some(to) => format!("outlier to {}", to.node),
                    None => "outlier".to_owned(),
                };
                self.block(o.span, &header, &o.settings, |f, s| {
                    f.stmt(s.span, &s.to_string());
                });
            }
            ServiceStmt::Warmup(w) => {
                self.block(w.span, "warmup", &w.steps, |f, s| {
                    let (text, span) = warmup_step(s);
                    f.stmt(span, &text);
                });
            }
            ServiceStmt::Shutdown(s) => {
                self.block(s.span, "shutdown", &s.steps, |f, s| {
                    let (text, span) = shutdown_step(s);
                    f.stmt(span, &text);
                });
            }
        }
    }
}

// === Statements as text ===

fn warmup_step(s: &WarmupStep) -> (String, Span) {
    match s {
        WarmupStep::Ready {
            probe,
            status,
            every,
            after,
            timeout,
            span,
        } => {
            let mut text = format!(
                "ready when {} is {} every {}",
                http_call(probe),
                status.node,
                every.node
            );
            if let Some(a) = after {
                text.push_str(&format!(" after {}", a.node));
            }
            if let Some(t) = timeout {
                text.push_str(&format!(" timeout {}", t.node));
            }
            (text, *span)
        }
        WarmupStep::Register { span } => ("register".to_owned(), *span),
        WarmupStep::Ramp { over, from, span } => {
            (format!("ramp {} from {}", over.node, from.node), *span)
        }
        WarmupStep::Start {
            what,
            action: a,
            span,
        } => (format!("start {} via {}", what.node, action(a)), *span),
    }
}

fn shutdown_step(s: &ShutdownStep) -> (String, Span) {
    match s {
        ShutdownStep::Deregister { span } => ("deregister".to_owned(), *span),
        ShutdownStep::Wait { duration, span } => (format!("wait {}", duration.node), *span),
        ShutdownStep::WaitFor { registry, span } => (format!("wait for {}", registry.node), *span),
        ShutdownStep::Stop {
            what,
            action: a,
            span,
        } => (format!("stop {} via {}", what.node, action(a)), *span),
        ShutdownStep::Drain { deadline, span } => (format!("drain {}", deadline.node), *span),
    }
}

fn action(a: &Action) -> String {
    match a {
        Action::Http(call) => http_call(call),
        Action::Signal { signal, .. } => format!("signal {}", signal.node),
    }
}

fn http_call(c: &HttpCall) -> String {
    format!("http {} {}", c.method.node, quote(&c.path.node))
}

fn int_rate(rate: &Rate<i64>) -> String {
    format!("{} per {}", rate.amount.node, rate.window.node)
}

/// A match expression on one line, parentheses as written.
fn expr(e: &MatchExpr) -> String {
    match e {
        MatchExpr::Path {
            kind,
            value,
            segment,
            ..
        } => {
            let kind = match kind {
                PathKind::Exact => "exact",
                PathKind::Prefix => "prefix",
            };
            match segment {
                Some(name) => format!(
                    "path {kind} {} segment {}",
                    quote(&value.node),
                    quote(&name.node)
                ),
                None => format!("path {kind} {}", quote(&value.node)),
            }
        }
        MatchExpr::Method { method, .. } => format!("method {}", method.node),
        MatchExpr::Header { name, value, .. } => {
            format!("header {} = {}", quote(&name.node), quote(&value.node))
        }
        MatchExpr::Consumer { name, .. } => format!("consumer {}", quote(&name.node)),
        MatchExpr::CallsTo { service, .. } => format!("calls to {}", service.node),
        MatchExpr::Grpc { kind, name, .. } => {
            let kind = match kind {
                GrpcKind::Service => "service",
                GrpcKind::Method => "method",
            };
            format!("grpc {kind} {}", quote(&name.node))
        }
        MatchExpr::Any { .. } => "any".to_owned(),
        MatchExpr::Ref { name } => name.node.clone(),
        MatchExpr::And { lhs, rhs, .. } => format!("{} and {}", expr(lhs), expr(rhs)),
        MatchExpr::Or { lhs, rhs, .. } => format!("{} or {}", expr(lhs), expr(rhs)),
        MatchExpr::Group { inner, .. } => format!("({})", expr(inner)),
    }
}

/// A string literal: `a"b` prints as `"a\"b"`.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}
