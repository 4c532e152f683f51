//! `govc lsp`: a language server for `.gov` files, over stdio.
//!
//! - Diagnostics as you type: every open document is checked with the other
//!   `.gov` files of its directory as one policy (as `govc check dir/*.gov`
//!   sees it, so a service defined in a sibling file is not unknown), and its
//!   own diagnostics are published, each with its range on the primary label,
//!   its stable code, its help, and the other labels as related information.
//! - Formatting: the whole document in the canonical layout (`govc fmt`);
//!   nothing for a document with syntax errors.
//! - Go to definition and hover for match names (within their service) and
//!   registries (in the document or a sibling file).
//! - Completion: every keyword of the grammar, and the match names of the
//!   service under the cursor.
//!
//! Positions are UTF-8 byte columns when the client offers them
//! (`general.positionEncodings`), UTF-16 code units otherwise, as the
//! protocol requires.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr as _;

use gov_compiler::SourceFile;
use gov_lang::ast::{self, Item, MatchExpr, Policy, ServiceStmt, ShutdownStep, Span};
use lsp_server::{Connection, ErrorCode, Message, Notification, Request, RequestId, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidCloseTextDocument, DidOpenTextDocument, Notification as _,
    PublishDiagnostics,
};
use lsp_types::request::{Completion, Formatting, GotoDefinition, HoverRequest, Request as _};
use lsp_types::{
    CompletionItem, CompletionItemKind, CompletionOptions, CompletionParams, CompletionResponse,
    Diagnostic, DiagnosticRelatedInformation, DiagnosticSeverity, DidChangeTextDocumentParams,
    DidCloseTextDocumentParams, DidOpenTextDocumentParams, DocumentFormattingParams,
    GotoDefinitionParams, GotoDefinitionResponse, Hover, HoverContents, HoverParams,
    HoverProviderCapability, InitializeParams, Location, MarkupContent, MarkupKind, NumberOrString,
    OneOf, Position, PositionEncodingKind, PublishDiagnosticsParams, Range, ServerCapabilities,
    TextDocumentSyncCapability, TextDocumentSyncKind, TextEdit, Uri,
};
use miette::Diagnostic as _;

/// Run a language server on stdin and stdout (for editors).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Talk over stdin and stdout (the only transport; accepted because
    /// editors pass it).
    #[arg(long)]
    pub stdio: bool,
}

/// Why the server stopped before the client said `exit`.
#[derive(Debug, thiserror::Error)]
enum LspError {
    #[error("protocol error: {0}")]
    Protocol(#[from] lsp_server::ProtocolError),
    #[error("malformed `initialize` parameters: {0}")]
    Initialize(#[from] serde_json::Error),
    #[error("the client closed the connection")]
    Disconnected,
}

pub fn run(_args: Args) -> ExitCode {
    let (connection, io) = Connection::stdio();
    let served = serve(&connection);
    drop(connection);
    let joined = io.join();
    match (served, joined) {
        (Ok(()), Ok(())) => ExitCode::SUCCESS,
        (Err(e), _) => {
            gov_common::errln!("govc lsp: {e}");
            ExitCode::FAILURE
        }
        (Ok(()), Err(e)) => {
            gov_common::errln!("govc lsp: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The open documents and how positions are counted.
struct Server {
    docs: HashMap<String, String>,
    utf8: bool,
}

fn serve(connection: &Connection) -> Result<(), LspError> {
    let (id, params) = connection.initialize_start()?;
    let params: InitializeParams = serde_json::from_value(params)?;
    let utf8 = params
        .capabilities
        .general
        .and_then(|g| g.position_encodings)
        .is_some_and(|encodings| encodings.contains(&PositionEncodingKind::UTF8));
    let encoding = if utf8 {
        PositionEncodingKind::UTF8
    } else {
        PositionEncodingKind::UTF16
    };
    let capabilities = ServerCapabilities {
        position_encoding: Some(encoding),
        text_document_sync: Some(TextDocumentSyncCapability::Kind(TextDocumentSyncKind::FULL)),
        definition_provider: Some(OneOf::Left(true)),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        completion_provider: Some(CompletionOptions::default()),
        document_formatting_provider: Some(OneOf::Left(true)),
        ..ServerCapabilities::default()
    };
    let result = serde_json::json!({
        "capabilities": capabilities,
        "serverInfo": { "name": "govc", "version": env!("CARGO_PKG_VERSION") },
    });
    connection.initialize_finish(id, result)?;
    let mut server = Server {
        docs: HashMap::new(),
        utf8,
    };
    for message in &connection.receiver {
        match message {
            Message::Request(req) => {
                if connection.handle_shutdown(&req)? {
                    return Ok(());
                }
                let response = server.request(req);
                send(connection, Message::Response(response))?;
            }
            Message::Notification(note) => {
                for out in server.notification(note) {
                    send(connection, Message::Notification(out))?;
                }
            }
            Message::Response(_) => {}
        }
    }
    Ok(())
}

fn send(connection: &Connection, message: Message) -> Result<(), LspError> {
    connection
        .sender
        .send(message)
        .map_err(|_| LspError::Disconnected)
}

// === impl Server ===

impl Server {
    fn request(&mut self, req: Request) -> Response {
        let id = req.id.clone();
        let result = match req.method.as_str() {
            Formatting::METHOD => parse(req)
                .map(|p: DocumentFormattingParams| to_value(self.format(&p.text_document.uri))),
            GotoDefinition::METHOD => parse(req).map(|p: GotoDefinitionParams| {
                let at = p.text_document_position_params;
                to_value(self.definition(&at.text_document.uri, at.position))
            }),
            HoverRequest::METHOD => parse(req).map(|p: HoverParams| {
                let at = p.text_document_position_params;
                to_value(self.hover(&at.text_document.uri, at.position))
            }),
            Completion::METHOD => parse(req).map(|p: CompletionParams| {
                let at = p.text_document_position;
                to_value(self.completion(&at.text_document.uri, at.position))
            }),
            other => Err(Response::new_err(
                id.clone(),
                ErrorCode::MethodNotFound as i32,
                format!("`{other}` is not supported"),
            )),
        };
        match result {
            Ok(value) => Response {
                id,
                result: Some(value),
                error: None,
            },
            Err(response) => response,
        }
    }

    /// Keeps the documents and answers each change with diagnostics.
    fn notification(&mut self, note: Notification) -> Vec<Notification> {
        let uri = match note.method.as_str() {
            DidOpenTextDocument::METHOD => {
                let Ok(p) = note.extract::<DidOpenTextDocumentParams>(DidOpenTextDocument::METHOD)
                else {
                    return Vec::new();
                };
                let uri = p.text_document.uri;
                self.docs
                    .insert(uri.as_str().to_owned(), p.text_document.text);
                uri
            }
            DidChangeTextDocument::METHOD => {
                let Ok(p) =
                    note.extract::<DidChangeTextDocumentParams>(DidChangeTextDocument::METHOD)
                else {
                    return Vec::new();
                };
                let uri = p.text_document.uri;
                // Full sync: the last change holds the whole text.
                if let Some(change) = p.content_changes.into_iter().next_back() {
                    self.docs.insert(uri.as_str().to_owned(), change.text);
                }
                uri
            }
            DidCloseTextDocument::METHOD => {
                let Ok(p) =
                    note.extract::<DidCloseTextDocumentParams>(DidCloseTextDocument::METHOD)
                else {
                    return Vec::new();
                };
                self.docs.remove(p.text_document.uri.as_str());
                // Clear what the closed document showed.
                return vec![publish(p.text_document.uri, Vec::new())];
            }
            _ => return Vec::new(),
        };
        let diagnostics = self.diagnostics(&uri);
        vec![publish(uri, diagnostics)]
    }

    fn text(&self, uri: &Uri) -> Option<&str> {
        self.docs.get(uri.as_str()).map(String::as_str)
    }

    /// The document and the other `.gov` files of its directory (open ones
    /// as the editor has them), the document first.
    fn policy_of(&self, uri: &Uri) -> Vec<(Uri, SourceFile)> {
        let Some(text) = self.text(uri) else {
            return Vec::new();
        };
        let path = file_path(uri);
        let name = path
            .as_ref()
            .map_or_else(|| uri.as_str().to_owned(), |p| p.display().to_string());
        let mut files = vec![(uri.clone(), SourceFile::new(name, text))];
        let Some(dir) = path.as_deref().and_then(Path::parent) else {
            return files;
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return files;
        };
        let mut siblings: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "gov") && Some(p) != path.as_ref())
            .collect();
        siblings.sort();
        for sibling in siblings {
            let Some(sibling_uri) = file_uri(&sibling) else {
                continue;
            };
            let text = match self.text(&sibling_uri) {
                Some(open) => open.to_owned(),
                None => match std::fs::read_to_string(&sibling) {
                    Ok(text) => text,
                    Err(_) => continue,
                },
            };
            files.push((
                sibling_uri,
                SourceFile::new(sibling.display().to_string(), text),
            ));
        }
        files
    }

    fn diagnostics(&self, uri: &Uri) -> Vec<Diagnostic> {
        let files = self.policy_of(uri);
        let Some((_, own)) = files.first() else {
            return Vec::new();
        };
        let sources: Vec<SourceFile> = files.iter().map(|(_, f)| f.clone()).collect();
        let checked = gov_compiler::check(&sources);
        let lines = Lines::new(&own.text, self.utf8);
        checked
            .diagnostics
            .iter()
            .filter(|d| file_of(d).is_none_or(|name| name == own.name))
            .map(|d| to_lsp(d, uri, &lines))
            .collect()
    }

    fn format(&self, uri: &Uri) -> Option<Vec<TextEdit>> {
        let text = self.text(uri)?;
        let formatted = gov_lang::format_source("document.gov", text).ok()?;
        if formatted == text {
            return Some(Vec::new());
        }
        let lines = Lines::new(text, self.utf8);
        let range = Range::new(lines.position(0), lines.position(text.len()));
        Some(vec![TextEdit::new(range, formatted)])
    }

    /// The definition under the cursor, in this document or a sibling.
    fn target(&self, uri: &Uri, position: Position) -> Option<Found> {
        let files = self.policy_of(uri);
        let (_, own) = files.first()?;
        let offset = Lines::new(&own.text, self.utf8).offset(position);
        let policy = gov_lang::parse_partial(&own.name, &own.text).policy?;
        match reference_at(&policy, offset)? {
            Reference::Match(service, name) => {
                let def = policy.items.iter().find_map(|item| match item {
                    Item::Service(s) if s.name.node == service => match_def(s, &name),
                    _ => None,
                })?;
                Some(Found {
                    uri: uri.clone(),
                    text: own.text.clone(),
                    name: def.name.span,
                    whole: def.span,
                    note: None,
                })
            }
            Reference::Registry(name) => files.iter().find_map(|(file_uri, file)| {
                let policy = gov_lang::parse_partial(&file.name, &file.text).policy?;
                policy.items.iter().find_map(|item| match item {
                    Item::Registry(r) if r.name.node == name => Some(Found {
                        uri: file_uri.clone(),
                        text: file.text.clone(),
                        name: r.name.span,
                        whole: r.span,
                        note: Some(registry_note(r)),
                    }),
                    _ => None,
                })
            }),
        }
    }

    fn definition(&self, uri: &Uri, position: Position) -> Option<GotoDefinitionResponse> {
        let found = self.target(uri, position)?;
        let lines = Lines::new(&found.text, self.utf8);
        Some(GotoDefinitionResponse::Scalar(Location::new(
            found.uri,
            lines.range(found.name),
        )))
    }

    fn hover(&self, uri: &Uri, position: Position) -> Option<Hover> {
        let found = self.target(uri, position)?;
        let source = found.text.get(found.whole.start..found.whole.end)?;
        let mut value = format!("```gov\n{source}\n```");
        if let Some(note) = found.note {
            value.push_str("\n\n");
            value.push_str(&note);
        }
        Some(Hover {
            contents: HoverContents::Markup(MarkupContent {
                kind: MarkupKind::Markdown,
                value,
            }),
            range: None,
        })
    }

    fn completion(&self, uri: &Uri, position: Position) -> Option<CompletionResponse> {
        let text = self.text(uri)?;
        let offset = Lines::new(text, self.utf8).offset(position);
        let mut items: Vec<CompletionItem> = gov_lang::keywords()
            .into_iter()
            .map(|k| CompletionItem {
                label: k,
                kind: Some(CompletionItemKind::KEYWORD),
                ..CompletionItem::default()
            })
            .collect();
        if let Some(policy) = gov_lang::parse_partial("document.gov", text).policy {
            for item in &policy.items {
                let Item::Service(s) = item else { continue };
                if !(s.span.start <= offset && offset <= s.span.end) {
                    continue;
                }
                for stmt in &s.body {
                    if let ServiceStmt::Match(m) = stmt {
                        items.push(CompletionItem {
                            label: m.name.node.clone(),
                            kind: Some(CompletionItemKind::REFERENCE),
                            detail: Some(format!("match of service `{}`", s.name.node)),
                            ..CompletionItem::default()
                        });
                    }
                }
            }
        }
        Some(CompletionResponse::Array(items))
    }
}

/// A definition found for the text under the cursor.
struct Found {
    uri: Uri,
    text: String,
    /// Its name, where "go to definition" lands.
    name: Span,
    /// The whole definition, shown on hover.
    whole: Span,
    note: Option<String>,
}

/// A name under the cursor that refers to a definition.
enum Reference {
    /// A match of the service named first.
    Match(String, String),
    Registry(String),
}

/// What the name at `offset` refers to (a definition's own name refers to
/// itself).
fn reference_at(policy: &Policy, offset: usize) -> Option<Reference> {
    let on = |span: Span| span.start <= offset && offset <= span.end;
    for item in &policy.items {
        match item {
            Item::Registry(r) if on(r.name.span) => {
                return Some(Reference::Registry(r.name.node.clone()));
            }
            Item::Registry(_) => {}
            Item::Service(s) if on(s.span) => {
                let service = s.name.node.clone();
                let mut refs = Vec::new();
                for stmt in &s.body {
                    match stmt {
                        ServiceStmt::Match(m) => {
                            refs.push(&m.name);
                            match_refs(&m.expr, &mut refs);
                        }
                        ServiceStmt::Rule(r) => match_refs(&r.on, &mut refs),
                        ServiceStmt::Registry(u) if on(u.name.span) => {
                            return Some(Reference::Registry(u.name.node.clone()));
                        }
                        ServiceStmt::Shutdown(sd) => {
                            for step in &sd.steps {
                                if let ShutdownStep::WaitFor { registry, .. } = step
                                    && on(registry.span)
                                {
                                    return Some(Reference::Registry(registry.node.clone()));
                                }
                            }
                        }
                        _ => {}
                    }
                }
                return refs
                    .into_iter()
                    .find(|r| on(r.span))
                    .map(|r| Reference::Match(service, r.node.clone()));
            }
            Item::Service(_) => {}
        }
    }
    None
}

/// Every match name an expression refers to.
fn match_refs<'a>(expr: &'a MatchExpr, out: &mut Vec<&'a ast::Ident>) {
    match expr {
        MatchExpr::Ref { name } => out.push(name),
        MatchExpr::And { lhs, rhs, .. } | MatchExpr::Or { lhs, rhs, .. } => {
            match_refs(lhs, out);
            match_refs(rhs, out);
        }
        MatchExpr::Group { inner, .. } => match_refs(inner, out),
        _ => {}
    }
}

/// The first definition of match `name` in service `s`.
fn match_def<'a>(s: &'a ast::Service, name: &str) -> Option<&'a ast::MatchDef> {
    s.body.iter().find_map(|stmt| match stmt {
        ServiceStmt::Match(m) if m.name.node == name => Some(m),
        _ => None,
    })
}

/// How long consumers of a registry may keep calling a deregistered
/// instance: the sum of its settings (what `wait for` waits).
fn registry_note(r: &ast::Registry) -> String {
    let total = r
        .settings
        .iter()
        .map(|s| s.value.node.as_millis().unwrap_or(i64::MAX).max(0))
        .fold(0i64, i64::saturating_add);
    format!(
        "`wait for {}` waits {} (the sum of its settings).",
        r.name.node,
        gov_compiler::units::fmt_millis(total)
    )
}

/// The file a diagnostic points into, by the name of its source.
fn file_of(d: &gov_compiler::Diagnostic) -> Option<String> {
    let source = d.source_code()?;
    let contents = source.read_span(&(0, 0).into(), 0, 0).ok()?;
    contents.name().map(str::to_owned)
}

fn to_lsp(d: &gov_compiler::Diagnostic, uri: &Uri, lines: &Lines<'_>) -> Diagnostic {
    let labels: Vec<miette::LabeledSpan> = d.labels().into_iter().flatten().collect();
    let primary = labels.iter().find(|l| l.primary()).or(labels.first());
    let span = |l: &miette::LabeledSpan| Span::new(l.offset(), l.offset() + l.len());
    let range = primary.map_or_else(|| lines.range(Span::new(0, 0)), |l| lines.range(span(l)));
    let mut message = d.to_string();
    if let Some(help) = d.help() {
        message.push_str(&format!("\nhelp: {help}"));
    }
    let related: Vec<DiagnosticRelatedInformation> = labels
        .iter()
        .filter(|l| !l.primary() && Some(*l) != primary)
        .map(|l| DiagnosticRelatedInformation {
            location: Location::new(uri.clone(), lines.range(span(l))),
            message: l.label().unwrap_or("here").to_owned(),
        })
        .collect();
    Diagnostic {
        range,
        severity: Some(if d.is_warning() {
            DiagnosticSeverity::WARNING
        } else {
            DiagnosticSeverity::ERROR
        }),
        code: Some(NumberOrString::String(d.code_str())),
        source: Some("govc".to_owned()),
        message,
        related_information: (!related.is_empty()).then_some(related),
        ..Diagnostic::default()
    }
}

fn publish(uri: Uri, diagnostics: Vec<Diagnostic>) -> Notification {
    Notification::new(
        PublishDiagnostics::METHOD.to_owned(),
        PublishDiagnosticsParams {
            uri,
            diagnostics,
            version: None,
        },
    )
}

/// The parameters of a request, or the error response for bad ones.
fn parse<P: serde::de::DeserializeOwned>(req: Request) -> Result<P, Response> {
    let id: RequestId = req.id.clone();
    serde_json::from_value(req.params).map_err(|e| {
        Response::new_err(
            id,
            ErrorCode::InvalidParams as i32,
            format!("invalid parameters: {e}"),
        )
    })
}

fn to_value<T: serde::Serialize>(value: T) -> serde_json::Value {
    // Serialising the protocol's own types cannot fail; `null` is a valid
    // "no result" for every request served here.
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

/// The local path of a `file:` URI, percent-decoded.
fn file_path(uri: &Uri) -> Option<PathBuf> {
    let rest = uri.as_str().strip_prefix("file://")?;
    let bytes = rest.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = |j: usize| bytes.get(j).and_then(|c| (*c as char).to_digit(16));
        match (b, hex(i + 1), hex(i + 2)) {
            (b'%', Some(h), Some(l)) => {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok().map(PathBuf::from)
}

/// The `file:` URI of a local path, percent-encoded.
fn file_uri(path: &Path) -> Option<Uri> {
    let mut uri = String::from("file://");
    for b in path.to_str()?.bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    Uri::from_str(&uri).ok()
}

/// Offsets to protocol positions and back, in UTF-8 bytes or UTF-16 units.
struct Lines<'a> {
    text: &'a str,
    starts: Vec<usize>,
    utf8: bool,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str, utf8: bool) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Lines { text, starts, utf8 }
    }

    fn position(&self, offset: usize) -> Position {
        let offset = offset.min(self.text.len());
        let line = self
            .starts
            .partition_point(|&s| s <= offset)
            .saturating_sub(1);
        let start = self.starts.get(line).copied().unwrap_or(0);
        let before = self.text.get(start..offset).unwrap_or("");
        let column = if self.utf8 {
            before.len()
        } else {
            before.encode_utf16().count()
        };
        Position::new(
            u32::try_from(line).unwrap_or(u32::MAX),
            u32::try_from(column).unwrap_or(u32::MAX),
        )
    }

    fn range(&self, span: Span) -> Range {
        Range::new(self.position(span.start), self.position(span.end))
    }

    /// The offset of a position; past the end of its line, the line's end.
    fn offset(&self, position: Position) -> usize {
        let line = usize::try_from(position.line).unwrap_or(usize::MAX);
        let Some(&start) = self.starts.get(line) else {
            return self.text.len();
        };
        let end = self
            .starts
            .get(line + 1)
            .map_or(self.text.len(), |&n| n - 1);
        let text = self.text.get(start..end).unwrap_or("");
        let want = usize::try_from(position.character).unwrap_or(usize::MAX);
        let mut units = 0;
        for (i, c) in text.char_indices() {
            if units >= want {
                return start + i;
            }
            units += if self.utf8 {
                c.len_utf8()
            } else {
                c.len_utf16()
            };
        }
        end
    }
}
