//! What every command that talks to `govd` shares: the `--control-plane`
//! and `--token-file` options, the connection (with a message that says
//! what to do when it fails), gRPC errors worded for operators, and
//! diagnostics that came over the wire rendered like local ones (with the
//! source snippet from the local file).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use gov_control_plane::client::{self, DEFAULT_URL};
use gov_proto::v1 as pb;
use miette::{LabeledSpan, NamedSource, Severity, SourceSpan};
use tonic::transport::Channel;

pub type Client = pb::control_plane_client::ControlPlaneClient<Channel>;

/// Where the control plane is and how to authenticate.
#[derive(Clone, Debug, clap::Args)]
pub struct RemoteArgs {
    /// The control plane URL, or its replicas comma-separated
    /// (`URL,URL`): the first that answers.
    #[arg(long, env = "GOV_CONTROL_PLANE", default_value = DEFAULT_URL, value_name = "URL")]
    pub control_plane: String,

    /// A file holding your token (from govd's token file) on its first line.
    /// Without it, the GOV_TOKEN environment variable (holding the token
    /// itself) is used if set.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// The CA (PEM) that signed govd's TLS certificate; use it with an
    /// `https://` --control-plane.
    #[arg(long, env = "GOV_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// Send the token over `http://` to a host that is not loopback anyway
    /// (a lab): anyone on the path can read and replay it.
    #[arg(long, env = "GOV_ALLOW_CLEARTEXT_TOKEN", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_cleartext_token: bool,
}

/// A failure talking to the control plane, already worded for the operator.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RemoteError {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Unreachable(#[from] client::Unreachable),

    #[error(transparent)]
    #[diagnostic(transparent)]
    Tls(#[from] gov_common::tls::TlsError),

    #[error("cannot read the token file `{path}`")]
    #[diagnostic(
        code(gov::govc::token_file),
        help("the file holds your token on its first line")
    )]
    TokenFile {
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("the control plane refused the call: {message}")]
    #[diagnostic(
        code(gov::govc::unauthenticated),
        help(
            "pass a token from govd's token file with --token-file FILE or GOV_TOKEN; `viewer` reads, `operator` also releases, `admin` also applies"
        )
    )]
    Unauthenticated { message: String },

    #[error("the control plane at `{url}` answered {code:?}: {message}")]
    #[diagnostic(code(gov::govc::rpc))]
    Rpc {
        url: String,
        code: tonic::Code,
        message: String,
    },

    #[error(
        "will not send your token in clear to `{url}`: it is `http://` to a host that is not loopback, where anyone on the path can read and replay it"
    )]
    #[diagnostic(
        code(gov::govc::cleartext_token),
        help(
            "use `https://` with --tls-ca CA.pem (govd with --tls-cert/--tls-key), or a loopback address (govd on this host, an SSH tunnel or a local TLS proxy); --allow-cleartext-token (GOV_ALLOW_CLEARTEXT_TOKEN) sends it anyway, for a lab"
        )
    )]
    CleartextToken { url: String },

    #[error("cannot start the async runtime")]
    #[diagnostic(code(gov::govc::runtime))]
    Runtime(#[source] std::io::Error),
}

impl RemoteArgs {
    /// The operator token: `--token-file` first, then `GOV_TOKEN`.
    pub fn token(&self) -> Result<Option<String>, RemoteError> {
        if let Some(path) = &self.token_file {
            let text = std::fs::read_to_string(path).map_err(|source| RemoteError::TokenFile {
                path: path.display().to_string(),
                source,
            })?;
            return Ok(Some(text.lines().next().unwrap_or("").trim().to_owned()));
        }
        Ok(std::env::var("GOV_TOKEN")
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty()))
    }

    /// Refuses, before any connection, to send `token` over `http://` to
    /// a --control-plane URL whose host is not loopback, unless
    /// --allow-cleartext-token.
    pub fn check_cleartext(&self, token: Option<&str>) -> Result<(), RemoteError> {
        if token.is_none() || self.allow_cleartext_token {
            return Ok(());
        }
        match self
            .control_plane
            .split(',')
            .map(str::trim)
            .find(|url| !url.is_empty() && gov_common::tls::cleartext_to_remote(url))
        {
            Some(url) => Err(RemoteError::CleartextToken {
                url: url.to_owned(),
            }),
            None => Ok(()),
        }
    }

    /// The TLS settings (`--tls-ca`) as the TUI and `connect` use them.
    pub fn tls(&self) -> Result<gov_common::tls::ClientTls, RemoteError> {
        Ok(gov_common::tls::ClientTls::read(
            &gov_common::tls::ClientTlsFiles {
                ca: self.tls_ca.clone(),
                ..Default::default()
            },
        )?)
    }

    pub async fn connect(&self) -> Result<Client, RemoteError> {
        self.check_cleartext(self.token()?.as_deref())?;
        let tls = self.tls()?;
        Ok(client::connect_tls(&self.control_plane, &tls, Duration::from_secs(5)).await?)
    }

    /// A request carrying the token when there is one.
    pub fn request<T>(&self, message: T) -> Result<tonic::Request<T>, RemoteError> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = self.token()? {
            gov_control_plane::auth::authorize(&mut request, &token).map_err(|s| {
                RemoteError::Unauthenticated {
                    message: s.message().to_owned(),
                }
            })?;
        }
        Ok(request)
    }

    /// Words a failed call.
    pub fn status(&self, status: tonic::Status) -> RemoteError {
        match status.code() {
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                RemoteError::Unauthenticated {
                    message: status.message().to_owned(),
                }
            }
            tonic::Code::Unavailable => RemoteError::Unreachable(client::Unreachable {
                url: self.control_plane.clone(),
                reason: status.message().to_owned(),
            }),
            code => RemoteError::Rpc {
                url: self.control_plane.clone(),
                code,
                message: status.message().to_owned(),
            },
        }
    }
}

/// Runs `f` on a fresh single-threaded runtime.
pub fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, RemoteError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RemoteError::Runtime)?;
    Ok(rt.block_on(f))
}

/// Prints an error the way every govc error is printed; exit 1.
pub fn fail(error: impl miette::Diagnostic + Send + Sync + 'static) -> ExitCode {
    gov_common::errln!("{:?}", miette::Report::new(error));
    ExitCode::FAILURE
}

// === diagnostics from the wire ===

/// A diagnostic `govd` sent, with its source snippet restored from the file
/// the user passed.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct WireDiagnostic {
    message: String,
    code: String,
    severity: Severity,
    help: Option<String>,
    src: Option<NamedSource<String>>,
    labels: Vec<LabeledSpan>,
}

impl miette::Diagnostic for WireDiagnostic {
    fn code<'a>(&'a self) -> Option<Box<dyn std::fmt::Display + 'a>> {
        (!self.code.is_empty()).then(|| Box::new(&self.code) as Box<dyn std::fmt::Display>)
    }
    fn severity(&self) -> Option<Severity> {
        Some(self.severity)
    }
    fn help<'a>(&'a self) -> Option<Box<dyn std::fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn std::fmt::Display>)
    }
    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        self.src.as_ref().map(|s| s as &dyn miette::SourceCode)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        (!self.labels.is_empty()).then(|| Box::new(self.labels.iter().cloned()) as Box<_>)
    }
}

impl WireDiagnostic {
    /// `files` are the `(name, text)` pairs that were sent.
    pub fn new(d: &pb::Diagnostic, files: &[(String, String)]) -> Self {
        let severity = match d.severity() {
            pb::Severity::Error => Severity::Error,
            pb::Severity::Warning => Severity::Warning,
            pb::Severity::Advice => Severity::Advice,
        };
        let text = files
            .iter()
            .find(|(n, _)| *n == d.file)
            .map(|(_, t)| t.clone());
        let mut labels = Vec::new();
        let mut message = d.message.clone();
        if let Some(text) = &text {
            if d.line > 0 {
                let at = offset(text, d.line, d.column);
                labels.push(LabeledSpan::new_primary_with_span(
                    None,
                    SourceSpan::from((at, 0)),
                ));
            }
            for l in d.labels.iter().filter(|l| l.file == d.file && l.line > 0) {
                let at = offset(text, l.line, l.column);
                let label = (!l.message.is_empty()).then(|| l.message.clone());
                labels.push(LabeledSpan::new_with_span(label, SourceSpan::from((at, 0))));
            }
        } else if !d.file.is_empty() {
            message = format!("{message} (at {}:{}:{})", d.file, d.line, d.column);
        }
        for l in d
            .labels
            .iter()
            .filter(|l| l.file != d.file && !l.file.is_empty())
        {
            message.push_str(&format!(
                "\n  {}: {}:{}:{}",
                l.message, l.file, l.line, l.column
            ));
        }
        WireDiagnostic {
            message,
            code: d.code.clone(),
            severity,
            help: (!d.help.is_empty()).then(|| d.help.clone()),
            src: text.map(|t| NamedSource::new(&d.file, t)),
            labels,
        }
    }
}

/// Byte offset of 1-based `line`, `column` (characters) in `text`.
fn offset(text: &str, line: u32, column: u32) -> usize {
    let mut at = 0;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i + 1 == line as usize {
            let col = (column.max(1) - 1) as usize;
            return at
                + l.char_indices()
                    .nth(col)
                    .map_or(l.trim_end_matches('\n').len(), |(b, _)| b);
        }
        at += l.len();
    }
    text.len()
}

/// Formats milliseconds the way people read durations: `950ms`, `12s`, `3m05s`,
/// `1h59m`, `3d04h`: the TUI's format, so that both print the same.
pub fn human_ms(ms: u64) -> String {
    gov_tui::duration(ms)
}

/// The name of a sync state as `istioctl proxy-status` prints it.
pub fn sync_name(state: pb::SyncState) -> &'static str {
    state.word()
}

/// Prints rows as left-aligned columns separated by two spaces.
pub fn table(rows: &[Vec<String>]) -> String {
    // Cells carry what agents wrote (names, addresses, reasons): a terminal
    // escape or a line break is shown, never obeyed.
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| gov_proto::printable::printable(c).into_owned())
                .collect()
        })
        .collect();
    let rows = rows.as_slice();
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_lines_and_characters() {
        let text = "ab\ncdé f\n";
        assert_eq!(offset(text, 1, 1), 0);
        assert_eq!(offset(text, 2, 1), 3);
        assert_eq!(&text[offset(text, 2, 5)..], "f\n");
        assert_eq!(human_ms(950), "950ms");
        assert_eq!(human_ms(7_199_000), "1h59m");
        assert_eq!(human_ms(185_000), "3m05s");
    }

    #[test]
    fn the_token_is_refused_to_any_remote_replica_unless_allowed() {
        let remote = |url: &str, allow: bool| RemoteArgs {
            control_plane: url.to_owned(),
            token_file: None,
            tls_ca: None,
            allow_cleartext_token: allow,
        };
        let token = Some("t");
        let two = "http://127.0.0.1:7070, http://10.0.0.2:7070";
        match remote(two, false).check_cleartext(token) {
            Err(RemoteError::CleartextToken { url }) => assert_eq!(url, "http://10.0.0.2:7070"),
            other => panic!("{other:?}"),
        }
        // No token, nothing to leak; the flag is the lab's way round.
        assert!(remote(two, false).check_cleartext(None).is_ok());
        assert!(remote(two, true).check_cleartext(token).is_ok());
        let local = "http://127.0.0.1:7070,http://[::1]:7071";
        assert!(remote(local, false).check_cleartext(token).is_ok());
        let tls = "https://10.0.0.1:7070,https://10.0.0.2:7070";
        assert!(remote(tls, false).check_cleartext(token).is_ok());
    }
}
