//! Name resolution: the index of registries, services, matches and rules
//! that every check and the lowering read.
//!
//! Resolution never fails. The first definition of a name wins; later
//! duplicates are reported by the duplicate checks and otherwise ignored, and
//! unknown references resolve to [`Norm::Invalid`] so that one mistake gives
//! one diagnostic, not a cascade.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gov_lang::ast::{
    self, Capacity, MatchDef, MatchExpr, Policy, Rate, Registry, Service, ServiceStmt, Shutdown,
    Span, Spanned, Warmup,
};
use miette::NamedSource;

use crate::kind::{self, Rule};

/// The source of one file, shared by every diagnostic that points into it.
pub type Src = NamedSource<Arc<str>>;

/// One parsed file.
pub(crate) struct File<'a> {
    pub name: &'a str,
    pub text: &'a str,
    /// Made on the first diagnostic: a valid policy never copies its text.
    src: std::sync::OnceLock<Src>,
    pub policy: &'a Policy,
    /// Byte offset of each line start, for line and column numbers.
    pub lines: Vec<usize>,
}

impl<'a> File<'a> {
    pub fn new(name: &'a str, text: &'a str, policy: &'a Policy) -> Self {
        let lines = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        File {
            name,
            text,
            src: std::sync::OnceLock::new(),
            policy,
            lines,
        }
    }

    /// The named source for diagnostics (shared by all of this file's).
    pub fn src(&self) -> Src {
        self.src
            .get_or_init(|| NamedSource::new(self.name, Arc::<str>::from(self.text)))
            .clone()
    }
}

/// Everything the checks need, borrowed from the parsed files.
pub(crate) struct Ctx<'a> {
    pub files: Vec<File<'a>>,
    /// Every registry as written, in file order.
    pub registries: Vec<(usize, &'a Registry)>,
    /// Name -> index into `registries` of the first definition.
    pub registry_index: BTreeMap<&'a str, usize>,
    /// Every service as written, in file order.
    pub services: Vec<Svc<'a>>,
    /// Name -> index into `services` of the first definition.
    pub service_index: BTreeMap<&'a str, usize>,
    /// What syntax errors made the parser skip.
    pub skipped: Skipped,
}

/// Definitions skipped for syntax errors: a reference to one of these names
/// is not reported unknown, since its definition may be right there,
/// behind a typo.
#[derive(Debug, Default)]
pub(crate) struct Skipped {
    /// Something at the top level of a file whose name is not known was
    /// skipped, or a file gave no tree at all: any service or registry may
    /// be defined there, so the cross-file "unknown" checks stay quiet.
    pub unknown_items: bool,
    pub services: BTreeSet<String>,
    pub registries: BTreeSet<String>,
    /// Statements skipped inside services: (file, offset, name) of a
    /// `match`, or with no name when the statement's keyword is not known
    /// (a misspelt `mtch` may define any match).
    statements: Vec<(usize, usize, Option<String>)>,
}

/// One service and what it declares.
pub(crate) struct Svc<'a> {
    pub file: usize,
    pub ast: &'a Service,
    /// Name -> first definition.
    pub matches: BTreeMap<&'a str, &'a MatchDef>,
    /// Every rule in source order (duplicates included).
    pub rules: Vec<Rule<'a>>,
    /// The normalized `on` of each rule, computed once (same order as `rules`).
    pub norms: Vec<Norm<'a>>,
    pub workers: Option<&'a Spanned<i64>>,
    pub instances: Option<&'a Spanned<i64>>,
    pub rate: Option<&'a Rate<i64>>,
    /// `capacity amplification N`.
    pub amplification: Option<&'a Spanned<i64>>,
    pub registry: Option<&'a ast::UsesRegistry>,
    pub domain: Option<&'a ast::Str>,
    pub consumer: Option<&'a ast::ConsumerStmt>,
    /// `paths WORD`, the first one.
    pub paths: Option<&'a ast::PathsStmt>,
    pub warmup: Option<&'a Warmup>,
    pub shutdown: Option<&'a Shutdown>,
    /// Every `outlier` block in source order (duplicates included).
    pub outliers: Vec<&'a ast::Outlier>,
}

/// A match expression with references expanded, groups dropped and nested
/// `and`/`or` flattened: two rules are on "the same match" when their
/// `Norm`s are equal.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Norm<'a> {
    Any,
    /// `grpc method "pkg.Svc/M"` is `path exact "/pkg.Svc/M"`.
    PathExact(Cow<'a, str>),
    /// `grpc service "pkg.Svc"` is `path prefix "/pkg.Svc/"`.
    PathPrefix(Cow<'a, str>),
    /// As written: methods must be upper case (`gov::unknown-method`).
    Method(&'a str),
    /// The name in lower case (header names are case-insensitive).
    Header(Cow<'a, str>, &'a str),
    Consumer(&'a str),
    CallsTo(&'a str),
    And(Vec<Norm<'a>>),
    Or(Vec<Norm<'a>>),
    /// An unknown or cyclic reference (reported elsewhere).
    Invalid,
}

// === impl Ctx ===

impl<'a> Ctx<'a> {
    pub fn new(files: Vec<File<'a>>, skipped: Skipped) -> Self {
        let mut registries = Vec::new();
        let mut registry_index = BTreeMap::new();
        let mut services = Vec::new();
        let mut service_index = BTreeMap::new();
        for (file, f) in files.iter().enumerate() {
            for item in &f.policy.items {
                match item {
                    ast::Item::Registry(r) => {
                        registry_index
                            .entry(r.name.node.as_str())
                            .or_insert(registries.len());
                        registries.push((file, r));
                    }
                    ast::Item::Service(s) => {
                        service_index
                            .entry(s.name.node.as_str())
                            .or_insert(services.len());
                        services.push(Svc::new(file, s));
                    }
                }
            }
        }
        Ctx {
            files,
            registries,
            registry_index,
            services,
            service_index,
            skipped,
        }
    }

    /// Whether a match `name` of `svc` may have been defined in a statement
    /// skipped for a syntax error.
    pub fn match_skipped(&self, svc: &Svc<'_>, name: &str) -> bool {
        let span = svc.ast.span;
        self.skipped.statements.iter().any(|(file, at, skipped)| {
            *file == svc.file
                && span.start <= *at
                && *at < span.end
                && skipped.as_deref().is_none_or(|n| n == name)
        })
    }

    /// Whether no service or registry named `name` may hide in skipped text.
    pub fn service_surely_unknown(&self, name: &str) -> bool {
        !self.skipped.unknown_items && !self.skipped.services.contains(name)
    }

    pub fn registry_surely_unknown(&self, name: &str) -> bool {
        !self.skipped.unknown_items && !self.skipped.registries.contains(name)
    }

    pub fn src(&self, file: usize) -> Src {
        self.files[file].src()
    }

    /// The text of `span` in `file` as written: diagnostics quote the
    /// file (`60s`), never a normalised rendering of it (`1m`).
    pub fn text(&self, file: usize, span: Span) -> &'a str {
        self.files[file]
            .text
            .get(span.start..span.end)
            .unwrap_or("")
    }

    pub fn registry(&self, name: &str) -> Option<&'a Registry> {
        self.registry_index.get(name).map(|&i| self.registries[i].1)
    }

    /// The services that lowering sees: the first definition of each name.
    pub fn unique_services(&self) -> impl Iterator<Item = &Svc<'a>> {
        self.service_index.values().map(|&i| &self.services[i])
    }
}

// === impl Skipped ===

impl Skipped {
    /// Records what the parser skipped in file `file` (numbered among all
    /// files); `lost` when the file gave no tree at all.
    pub fn add(&mut self, file: usize, lost: bool, skipped: &[gov_lang::Skipped]) {
        self.unknown_items |= lost;
        for s in skipped {
            let keyword = s.keyword.as_deref();
            match (s.item, keyword, &s.name) {
                (true, Some("service"), Some(name)) => {
                    self.services.insert(name.clone());
                }
                (true, Some("registry"), Some(name)) => {
                    self.registries.insert(name.clone());
                }
                (true, ..) => self.unknown_items = true,
                (false, Some("match"), name) => {
                    self.statements.push((file, s.span.start, name.clone()));
                }
                // A rule, a setting or a block defines no match.
                (false, Some(k), _) if gov_lang::starts_statement(k) => {}
                (false, ..) => self.statements.push((file, s.span.start, None)),
            }
        }
    }

    /// Numbers files among those with a tree: `present[i]` is the new
    /// number of file `i`, `None` when it gave no tree.
    pub fn renumber(&mut self, present: &[Option<usize>]) {
        self.statements
            .retain_mut(|(file, ..)| match present.get(*file).copied().flatten() {
                Some(n) => {
                    *file = n;
                    true
                }
                None => false,
            });
    }
}

// === impl Svc ===

impl<'a> Svc<'a> {
    fn new(file: usize, ast: &'a Service) -> Self {
        let mut svc = Svc {
            file,
            ast,
            matches: BTreeMap::new(),
            rules: Vec::new(),
            norms: Vec::new(),
            workers: None,
            instances: None,
            rate: None,
            amplification: None,
            registry: None,
            domain: None,
            consumer: None,
            paths: None,
            warmup: None,
            shutdown: None,
            outliers: Vec::new(),
        };
        for stmt in &ast.body {
            match stmt {
                ServiceStmt::Domain(d) => {
                    svc.domain.get_or_insert(&d.name);
                }
                ServiceStmt::Registry(r) => {
                    svc.registry.get_or_insert(r);
                }
                ServiceStmt::Consumer(c) => {
                    svc.consumer.get_or_insert(c);
                }
                ServiceStmt::Paths(p) => {
                    svc.paths.get_or_insert(p);
                }
                ServiceStmt::Capacity(Capacity::Workers { count, .. }) => {
                    svc.workers.get_or_insert(count);
                }
                ServiceStmt::Capacity(Capacity::Instances { count, .. }) => {
                    svc.instances.get_or_insert(count);
                }
                ServiceStmt::Capacity(Capacity::Rate { rate, .. }) => {
                    svc.rate.get_or_insert(rate);
                }
                ServiceStmt::Capacity(Capacity::Amplification { count, .. }) => {
                    svc.amplification.get_or_insert(count);
                }
                ServiceStmt::Match(m) => {
                    svc.matches.entry(m.name.node.as_str()).or_insert(m);
                }
                ServiceStmt::Rule(def) => {
                    // INVARIANT: every kind the grammar accepts has a
                    // module (`kind::tests`), so none is left out here.
                    if let Some(imp) = kind::by_word(def.kind.node) {
                        svc.rules.push(Rule { def, imp });
                    }
                }
                ServiceStmt::Warmup(w) => {
                    svc.warmup.get_or_insert(w);
                }
                ServiceStmt::Shutdown(s) => {
                    svc.shutdown.get_or_insert(s);
                }
                ServiceStmt::Outlier(o) => svc.outliers.push(o),
            }
        }
        svc.norms = svc.rules.iter().map(|r| svc.normalize(r.on())).collect();
        svc
    }

    /// Every rule with its normalized match.
    pub fn rules_with_norms(&self) -> impl Iterator<Item = (&Rule<'a>, &Norm<'a>)> {
        self.rules.iter().zip(&self.norms)
    }

    pub fn name(&self) -> &'a str {
        &self.ast.name.node
    }

    /// How the service reads request paths: its `paths WORD...`, or the
    /// default. An unknown word (`gov::unknown-paths`) counts for nothing; of
    /// two dialects (`gov::conflicting-paths`) the first counts.
    pub fn reading(&self) -> gov_proto::path::Reading {
        let mut reading = gov_proto::path::Reading::default();
        let words = self.paths.iter().flat_map(|p| &p.words).rev();
        for word in words.map(|w| w.node.as_str()) {
            if word == gov_proto::path::CASE_INSENSITIVE {
                reading.case_insensitive = true;
            } else if let Some(dialect) = gov_proto::path::Dialect::from_word(word) {
                reading.dialect = dialect;
            }
        }
        reading
    }

    pub fn match_names(&self) -> Vec<&'a str> {
        self.matches.keys().copied().collect()
    }

    /// The path segments `expr` captures (`path prefix "/t/" segment
    /// "t"`), references expanded: `(name, prefix)`, in source order.
    pub fn captures(&self, expr: &'a MatchExpr) -> Vec<(String, String)> {
        let mut out = Vec::new();
        self.walk(expr, &mut Vec::new(), &mut |e| {
            if let MatchExpr::Path {
                value,
                segment: Some(name),
                ..
            } = e
            {
                out.push((name.node.clone(), value.node.clone()));
            }
        });
        out
    }

    /// Whether every call `expr` matches is a gRPC call: each alternative
    /// requires a `grpc service` or `grpc method`.
    pub fn grpc_only(&self, expr: &'a MatchExpr) -> bool {
        self.grpc(expr, &mut Vec::new())
    }

    fn grpc(&self, expr: &'a MatchExpr, stack: &mut Vec<&'a str>) -> bool {
        match expr {
            MatchExpr::Grpc { .. } => true,
            MatchExpr::And { lhs, rhs, .. } => self.grpc(lhs, stack) || self.grpc(rhs, stack),
            MatchExpr::Or { lhs, rhs, .. } => self.grpc(lhs, stack) && self.grpc(rhs, stack),
            MatchExpr::Group { inner, .. } => self.grpc(inner, stack),
            MatchExpr::Ref { name } => match self.matches.get(name.node.as_str()) {
                Some(def) if !stack.contains(&name.node.as_str()) => {
                    stack.push(&def.name.node);
                    let g = self.grpc(&def.expr, stack);
                    stack.pop();
                    g
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// Calls `f` on every atom of `expr`, references expanded once each.
    fn walk(
        &self,
        expr: &'a MatchExpr,
        stack: &mut Vec<&'a str>,
        f: &mut impl FnMut(&'a MatchExpr),
    ) {
        match expr {
            MatchExpr::And { lhs, rhs, .. } | MatchExpr::Or { lhs, rhs, .. } => {
                self.walk(lhs, stack, f);
                self.walk(rhs, stack, f);
            }
            MatchExpr::Group { inner, .. } => self.walk(inner, stack, f),
            MatchExpr::Ref { name } => {
                if let Some(def) = self.matches.get(name.node.as_str())
                    && !stack.contains(&name.node.as_str())
                {
                    stack.push(&def.name.node);
                    self.walk(&def.expr, stack, f);
                    stack.pop();
                }
            }
            atom => f(atom),
        }
    }

    /// The expression with references expanded.
    pub fn normalize(&self, expr: &'a MatchExpr) -> Norm<'a> {
        let mut stack = Vec::new();
        self.norm(expr, &mut stack)
    }

    fn norm(&self, expr: &'a MatchExpr, stack: &mut Vec<&'a str>) -> Norm<'a> {
        match expr {
            MatchExpr::Path {
                kind: ast::PathKind::Exact,
                value,
                ..
            } => Norm::PathExact(Cow::Borrowed(&value.node)),
            MatchExpr::Path {
                kind: ast::PathKind::Prefix,
                value,
                ..
            } => Norm::PathPrefix(Cow::Borrowed(&value.node)),
            // A gRPC call's HTTP/2 path is `/{service}/{method}`.
            MatchExpr::Grpc {
                kind: ast::GrpcKind::Service,
                name,
                ..
            } => Norm::PathPrefix(Cow::Owned(format!("/{}/", name.node))),
            MatchExpr::Grpc {
                kind: ast::GrpcKind::Method,
                name,
                ..
            } => Norm::PathExact(Cow::Owned(format!("/{}", name.node))),
            MatchExpr::Method { method, .. } => Norm::Method(&method.node),
            MatchExpr::Header { name, value, .. } => Norm::Header(lower(&name.node), &value.node),
            MatchExpr::Consumer { name, .. } => Norm::Consumer(&name.node),
            MatchExpr::CallsTo { service, .. } => Norm::CallsTo(&service.node),
            MatchExpr::Any { .. } => Norm::Any,
            MatchExpr::Group { inner, .. } => self.norm(inner, stack),
            MatchExpr::Ref { name } => {
                let Some(def) = self.matches.get(name.node.as_str()) else {
                    return Norm::Invalid;
                };
                if stack.contains(&name.node.as_str()) {
                    return Norm::Invalid;
                }
                stack.push(&def.name.node);
                let n = self.norm(&def.expr, stack);
                stack.pop();
                n
            }
            MatchExpr::And { lhs, rhs, .. } => {
                let mut parts = Vec::new();
                for side in [lhs, rhs] {
                    match self.norm(side, stack) {
                        Norm::And(inner) => parts.extend(inner),
                        other => parts.push(other),
                    }
                }
                Norm::And(parts)
            }
            MatchExpr::Or { lhs, rhs, .. } => {
                let mut parts = Vec::new();
                for side in [lhs, rhs] {
                    match self.norm(side, stack) {
                        Norm::Or(inner) => parts.extend(inner),
                        other => parts.push(other),
                    }
                }
                Norm::Or(parts)
            }
        }
    }

    /// The longest `latency` declared by a match the expression refers to.
    pub fn latency(&self, expr: &MatchExpr) -> Option<&'a Spanned<ast::Duration>> {
        let mut best: Option<&'a Spanned<ast::Duration>> = None;
        let mut seen = Vec::new();
        self.walk_refs(expr, &mut seen, &mut |def| {
            if let Some(l) = &def.latency
                && best
                    .is_none_or(|b| crate::units::millis(&b.node) < crate::units::millis(&l.node))
            {
                best = Some(l);
            }
        });
        best
    }

    fn walk_refs(
        &self,
        expr: &MatchExpr,
        seen: &mut Vec<&'a str>,
        f: &mut impl FnMut(&'a MatchDef),
    ) {
        match expr {
            MatchExpr::Ref { name } => {
                if let Some(def) = self.matches.get(name.node.as_str())
                    && !seen.contains(&def.name.node.as_str())
                {
                    seen.push(&def.name.node);
                    f(def);
                    self.walk_refs(&def.expr, seen, f);
                }
            }
            MatchExpr::And { lhs, rhs, .. } | MatchExpr::Or { lhs, rhs, .. } => {
                self.walk_refs(lhs, seen, f);
                self.walk_refs(rhs, seen, f);
            }
            MatchExpr::Group { inner, .. } => self.walk_refs(inner, seen, f),
            _ => {}
        }
    }
}

// === impl Norm ===

impl Norm<'_> {
    /// Outbound (client side): the expression selects calls to another service.
    pub fn is_outbound(&self) -> bool {
        match self {
            Norm::CallsTo(_) => true,
            Norm::And(parts) | Norm::Or(parts) => parts.iter().any(Norm::is_outbound),
            _ => false,
        }
    }

    pub fn is_valid(&self) -> bool {
        match self {
            Norm::Invalid => false,
            Norm::And(parts) | Norm::Or(parts) => parts.iter().all(Norm::is_valid),
            _ => true,
        }
    }
}

/// `s` in lower case, borrowed when it already is.
fn lower(s: &str) -> Cow<'_, str> {
    if s.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(s.to_ascii_lowercase())
    } else {
        Cow::Borrowed(s)
    }
}

/// How long consumers may keep calling a deregistered instance, in ms.
pub(crate) fn registry_expiry_ms(reg: &gov_lang::ast::Registry) -> i64 {
    reg.settings
        .iter()
        .map(|s| crate::units::millis(&s.value.node).max(0))
        .fold(0i64, i64::saturating_add)
}

/// Every `calls to` in an expression (references not followed).
pub(crate) fn calls_to<'e>(expr: &'e MatchExpr, out: &mut Vec<&'e ast::Ident>) {
    match expr {
        MatchExpr::CallsTo { service, .. } => out.push(service),
        MatchExpr::And { lhs, rhs, .. } | MatchExpr::Or { lhs, rhs, .. } => {
            calls_to(lhs, out);
            calls_to(rhs, out);
        }
        MatchExpr::Group { inner, .. } => calls_to(inner, out),
        _ => {}
    }
}

/// Every match reference in an expression.
pub(crate) fn refs<'e>(expr: &'e MatchExpr, out: &mut Vec<&'e ast::Ident>) {
    match expr {
        MatchExpr::Ref { name } => out.push(name),
        MatchExpr::And { lhs, rhs, .. } | MatchExpr::Or { lhs, rhs, .. } => {
            refs(lhs, out);
            refs(rhs, out);
        }
        MatchExpr::Group { inner, .. } => refs(inner, out),
        _ => {}
    }
}
