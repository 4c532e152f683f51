//! Who may call what. People present a named bearer token from govd's token
//! file (`name token role` lines); the role decides what the call may do:
//!
//! | role | may |
//! |---|---|
//! | `agent` | `Connect` only, as an agent of the services its line names |
//! | `viewer` | read: `Status`, `Watch`, `Audit` |
//! | `operator` | read, and `Release` |
//! | `admin` | everything, `Apply` (dry runs too: they cost a compile) |
//!
//! The audit log records the token's name, never what the client says it
//! is. Agents prove who they are on `Connect`: an `agent` line of the token
//! file (`name token agent SERVICE[,SERVICE...]`, the token's name is the
//! agent's identity), a client certificate (`--tls-client-ca`), or the
//! older `--agent-token-file` (one token for every service). Without any
//! token (`govd --insecure`, loopback only) every call is open and the
//! audit records the client's claim, marked unverified.

use tonic::{Request, Status};

/// What a role allows, least first: each role may do what the ones before
/// it may, except `Agent`, which may make no call people make.
// INVARIANT: `Agent` is the least role, so that `caller` refuses it for
// every call people make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Agent,
    Viewer,
    Operator,
    Admin,
}

/// One line of the token file.
#[derive(Clone)]
pub struct NamedToken {
    pub name: String,
    pub token: String,
    pub role: Role,
    /// An `agent` token: the services an agent presenting it may claim
    /// (empty for people).
    pub services: Vec<String>,
}

/// The configured tokens.
#[derive(Clone, Default)]
pub struct Tokens {
    /// People (`govc`, the TUI) and agents (`agent` lines). Empty: every
    /// call is open (`--insecure`).
    pub named: Vec<NamedToken>,
    /// The older `--agent-token-file`: one token any agent may present, for
    /// any service.
    pub agent: Option<String>,
}

/// Who an agent proved to be on `Connect`, and what it may claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentIdentity {
    /// As the audit log and the view name it: the token's name, the
    /// certificate's service, or `unverified` (`--insecure`).
    pub name: String,
    /// The services it may claim; `None`: any (`--insecure`, or the
    /// `--agent-token-file` token).
    pub services: Option<Vec<String>>,
    /// Proved by a client certificate (else by a token, or nothing).
    pub certificate: bool,
}

/// The identity of every agent of an open govd (`--insecure`).
pub const UNVERIFIED_AGENT: &str = "unverified";

/// The identity of an agent presenting the `--agent-token-file` token.
pub const SHARED_AGENT_TOKEN: &str = "agent-token-file";

/// Who made a call, as the audit log names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
}

// === impl Role ===

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    fn parse(word: &str) -> Option<Self> {
        match word {
            "agent" => Some(Role::Agent),
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// The roles that may do what `self` may, for refusal messages.
    fn at_least(self) -> &'static str {
        match self {
            Role::Agent => "an agent token",
            Role::Viewer => "the viewer, operator or admin role",
            Role::Operator => "the operator or admin role",
            Role::Admin => "the admin role",
        }
    }
}

impl std::fmt::Debug for NamedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a token.
        f.debug_struct("NamedToken")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("services", &self.services)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("named", &self.named)
            .field("agent", &self.agent.as_ref().map(|_| "<set>"))
            .finish()
    }
}

// === impl Tokens ===

impl Tokens {
    /// Whether people must present a token (false only with `--insecure`).
    pub fn required(&self) -> bool {
        !self.named.is_empty()
    }

    /// The caller of `request` if their role allows `need`; `call` names
    /// the call in the refusal. `claimed` is who the client says it is,
    /// used (marked unverified) only when no token is configured.
    pub fn caller<T>(
        &self,
        request: &Request<T>,
        need: Role,
        call: &str,
        claimed: &str,
    ) -> Result<Caller, Status> {
        if !self.required() {
            let claimed = claimed.trim();
            let claimed = if claimed.is_empty() {
                "unknown"
            } else {
                claimed
            };
            return Ok(Caller {
                name: format!("{claimed} (unverified)"),
            });
        }
        let Some(presented) = bearer(request) else {
            return Err(Status::unauthenticated(format!(
                "`{call}` needs a token with {} (govc --token-file FILE or GOV_TOKEN)",
                need.at_least()
            )));
        };
        let Some(token) = self.find(presented) else {
            return Err(Status::unauthenticated(
                "the token is not one govd knows (check govc --token-file or GOV_TOKEN against govd's token file)",
            ));
        };
        if token.role < need {
            return Err(Status::permission_denied(format!(
                "`{call}` needs {}; the token `{}` has the {} role",
                need.at_least(),
                token.name,
                token.role.as_str()
            )));
        }
        Ok(Caller {
            name: token.name.clone(),
        })
    }

    /// Whether agents must prove who they are: whenever any token is
    /// configured (only an open govd, `--insecure`, lets them in unproved).
    pub fn agents_required(&self) -> bool {
        self.required() || self.agent.is_some()
    }

    /// Who the agent calling with `request` is, by its bearer token. An
    /// open govd takes every agent (its identity is unverified); otherwise
    /// the token must be an `agent` line's or the `--agent-token-file` one.
    pub fn agent<T>(&self, request: &Request<T>) -> Result<AgentIdentity, Status> {
        if !self.agents_required() {
            return Ok(AgentIdentity {
                name: UNVERIFIED_AGENT.to_owned(),
                services: None,
                certificate: false,
            });
        }
        let Some(presented) = bearer(request) else {
            return Err(Status::unauthenticated(
                "govd requires agents to prove who they are: give this agent its service's agent token (gov-agent --control-plane-token-file FILE; govd's --token-file line `NAME TOKEN agent SERVICE`) or a client certificate",
            ));
        };
        if let Some(shared) = self.agent.as_deref()
            && constant_time_eq(presented.as_bytes(), shared.as_bytes())
        {
            return Ok(AgentIdentity {
                name: SHARED_AGENT_TOKEN.to_owned(),
                services: None,
                certificate: false,
            });
        }
        match self.find(presented) {
            Some(t) if t.role == Role::Agent => Ok(AgentIdentity {
                name: t.name.clone(),
                services: Some(t.services.clone()),
                certificate: false,
            }),
            Some(t) => Err(Status::permission_denied(format!(
                "the token `{}` has the {} role, for people; an agent needs a token of its own (`NAME TOKEN agent SERVICE` in govd's --token-file)",
                t.name,
                t.role.as_str()
            ))),
            None => Err(Status::unauthenticated(
                "the agent token is not one govd knows (check gov-agent --control-plane-token-file against govd's --token-file `agent` lines)",
            )),
        }
    }

    /// The token equal to `presented`. Every token is compared, so the time
    /// taken does not say which one (or which prefix) matched.
    fn find(&self, presented: &str) -> Option<&NamedToken> {
        self.named.iter().fold(None, |found, t| {
            let same = constant_time_eq(presented.as_bytes(), t.token.as_bytes());
            if same && found.is_none() {
                Some(t)
            } else {
                found
            }
        })
    }
}

// === impl AgentIdentity ===

impl AgentIdentity {
    /// The identity a client certificate for `service` proves.
    pub fn certificate(service: &str) -> Self {
        Self {
            name: service.to_owned(),
            services: Some(vec![service.to_owned()]),
            certificate: true,
        }
    }

    /// What the state keeps of it, to tell identities apart and to name
    /// the prover in audit records: ``token `NAME` ``, ``certificate for
    /// `NAME` `` or `unverified`.
    pub fn label(&self) -> String {
        if self.certificate {
            format!("certificate for `{}`", self.name)
        } else if self.name == UNVERIFIED_AGENT && self.services.is_none() {
            UNVERIFIED_AGENT.to_owned()
        } else {
            format!("token `{}`", self.name)
        }
    }

    /// How the audit log names it.
    pub fn who(&self) -> String {
        if self.certificate {
            format!("agent with a certificate for `{}`", self.name)
        } else {
            format!("agent with the token `{}`", self.name)
        }
    }

    /// Whether it may claim to be an agent of `service`.
    pub fn may_claim(&self, service: &str) -> bool {
        self.services
            .as_ref()
            .is_none_or(|s| s.iter().any(|s| s == service))
    }
}

pub use gov_proto::spiffe::{certificate_service, spiffe_service};

/// How govd may start: with tokens, or `insecure` (no tokens) on a
/// loopback address only.
pub fn check_start(
    tokens: &Tokens,
    insecure: bool,
    listen: std::net::SocketAddr,
) -> Result<(), crate::Error> {
    if insecure && !listen.ip().is_loopback() {
        return Err(crate::Error::InsecureRemote {
            addr: listen.to_string(),
        });
    }
    if !insecure && !tokens.required() {
        return Err(crate::Error::NoAuth {
            addr: listen.to_string(),
        });
    }
    Ok(())
}

/// The warning govd logs at start when bearer tokens would cross the
/// network in clear: tokens configured, no TLS, and a `listen` address that
/// is not loopback (an unspecified address such as `0.0.0.0` listens on
/// every interface). Only a warning, not a refusal: deployments that
/// terminate TLS in front of govd on another host would stop at upgrade.
pub fn cleartext_warning(listen: std::net::SocketAddr, tls: bool, tokens: bool) -> Option<String> {
    if tls || !tokens || listen.ip().to_canonical().is_loopback() {
        return None;
    }
    Some(format!(
        "listening on {listen} without TLS: bearer tokens and configs travel in clear and anyone on the path can read and replay them; add --tls-cert/--tls-key, or listen on a loopback address behind a TLS proxy"
    ))
}

/// The bearer token of `request`, if it carries one.
fn bearer<T>(request: &Request<T>) -> Option<&str> {
    request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
}

/// Compares without an early exit, so timing does not reveal a prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Adds `authorization: Bearer TOKEN` to a request (clients).
pub fn authorize<T>(request: &mut Request<T>, token: &str) -> Result<(), Status> {
    let value = format!("Bearer {}", token.trim()).parse().map_err(|_| {
        Status::invalid_argument("the token has characters not allowed in a header")
    })?;
    request.metadata_mut().insert("authorization", value);
    Ok(())
}

/// Reads a token file (the token on its first line).
pub fn read_token_file(path: &std::path::Path) -> Result<String, crate::Error> {
    let text = read(path)?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    if token.is_empty() {
        return Err(crate::Error::EmptyToken {
            path: path.display().to_string(),
        });
    }
    Ok(token)
}

/// The name a token file of the older, single-token format gets: one
/// token on one line, allowed everything (it was the only token).
pub const SINGLE_TOKEN_NAME: &str = "admin";

/// Reads govd's token file: one `name token role` per line (`#` starts a
/// comment). A file holding only one token on one line (the older format)
/// is one admin token named `admin`.
pub fn read_named_tokens(path: &std::path::Path) -> Result<Vec<NamedToken>, crate::Error> {
    let path_text = path.display().to_string();
    parse_named_tokens(&read(path)?).map_err(|(line, problem)| {
        if line == 0 {
            crate::Error::EmptyToken { path: path_text }
        } else {
            crate::Error::TokenLine {
                path: path_text,
                line,
                problem,
            }
        }
    })
}

fn read(path: &std::path::Path) -> Result<String, crate::Error> {
    std::fs::read_to_string(path).map_err(|source| crate::Error::TokenFile {
        path: path.display().to_string(),
        source,
    })
}

/// Parses the token file's text; an error is (1-based line, problem).
fn parse_named_tokens(text: &str) -> Result<Vec<NamedToken>, (usize, String)> {
    let lines: Vec<(usize, Vec<&str>)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.split('#').next().unwrap_or("")))
        .map(|(n, l)| (n, l.split_whitespace().collect::<Vec<_>>()))
        .filter(|(_, words)| !words.is_empty())
        .collect();
    if let [(_, words)] = lines.as_slice()
        && let [token] = words.as_slice()
    {
        return Ok(vec![NamedToken {
            name: SINGLE_TOKEN_NAME.to_owned(),
            token: (*token).to_owned(),
            role: Role::Admin,
            services: Vec::new(),
        }]);
    }
    let mut tokens: Vec<NamedToken> = Vec::new();
    for (n, words) in lines {
        let (name, token, role, services) = match words.as_slice() {
            [name, token, role] => (name, token, role, None),
            [name, token, role, services] => (name, token, role, Some(*services)),
            _ => {
                return Err((
                    n,
                    format!(
                        "expected `name token role` (or `name token agent SERVICE[,SERVICE...]`), found {} word(s)",
                        words.len()
                    ),
                ));
            }
        };
        let Some(role) = Role::parse(role) else {
            return Err((
                n,
                format!("unknown role `{role}` (roles: admin, operator, viewer, agent)"),
            ));
        };
        let services = match (role, services) {
            (Role::Agent, None) => {
                return Err((
                    n,
                    format!(
                        "the agent token `{name}` names no service: write `{name} TOKEN agent SERVICE[,SERVICE...]`"
                    ),
                ));
            }
            (Role::Agent, Some(list)) => agent_services(list).map_err(|p| (n, p))?,
            (_, None) => Vec::new(),
            (_, Some(_)) => {
                return Err((
                    n,
                    format!(
                        "only an `agent` token names services; a {} token is `name token role`",
                        role.as_str()
                    ),
                ));
            }
        };
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c))
        {
            return Err((
                n,
                format!("the name `{name}` may only hold letters, digits and `._@-`"),
            ));
        }
        if tokens.iter().any(|t| t.name == *name) {
            return Err((n, format!("the name `{name}` is given twice")));
        }
        if tokens.iter().any(|t| t.token == *token) {
            return Err((
                n,
                "this token is given to two names (each name needs its own token)".into(),
            ));
        }
        tokens.push(NamedToken {
            name: (*name).to_owned(),
            token: (*token).to_owned(),
            role,
            services,
        });
    }
    if tokens.is_empty() {
        return Err((0, "the file names no token".into()));
    }
    Ok(tokens)
}

/// The services of an `agent` line: `SERVICE[,SERVICE...]`.
fn agent_services(list: &str) -> Result<Vec<String>, String> {
    let mut services = Vec::new();
    for service in list.split(',') {
        if service.is_empty()
            || !service
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
        {
            return Err(format!(
                "`{service}` is not a service name (letters, digits, `_` and `-`; services separated by `,`)"
            ));
        }
        if !services.iter().any(|s| s == service) {
            services.push(service.to_owned());
        }
    }
    Ok(services)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_token(token: &str) -> Request<()> {
        let mut request = Request::new(());
        authorize(&mut request, token).unwrap();
        request
    }

    fn tokens() -> Tokens {
        Tokens {
            named: parse_named_tokens(
                "# people\nalice s3cret-a admin\nbob s3cret-b operator # on call\n\ncarol s3cret-c viewer\n",
            )
            .unwrap(),
            agent: None,
        }
    }

    #[test]
    fn roles_allow_what_they_say_and_the_audit_gets_the_name() {
        let t = tokens();
        let who = |token: &str, need: Role| {
            t.caller(&with_token(token), need, "Call", "mallory")
                .map(|c| c.name)
                .map_err(|s| (s.code(), s.message().to_owned()))
        };
        assert_eq!(who("s3cret-a", Role::Admin).unwrap(), "alice");
        assert_eq!(who("s3cret-b\n", Role::Operator).unwrap(), "bob");
        assert_eq!(who("s3cret-b", Role::Viewer).unwrap(), "bob");
        assert_eq!(who("s3cret-c", Role::Viewer).unwrap(), "carol");
        let (code, message) = who("s3cret-b", Role::Admin).unwrap_err();
        assert_eq!(code, tonic::Code::PermissionDenied);
        assert_eq!(
            message,
            "`Call` needs the admin role; the token `bob` has the operator role"
        );
        let (code, message) = who("s3cret-c", Role::Operator).unwrap_err();
        assert_eq!(code, tonic::Code::PermissionDenied);
        assert!(message.contains("operator or admin role"), "{message}");
        assert_eq!(
            who("s3cret", Role::Viewer).unwrap_err().0,
            tonic::Code::Unauthenticated
        );
        let missing = t
            .caller(&Request::new(()), Role::Viewer, "Status", "")
            .unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert!(missing.message().contains("`Status` needs a token"));
    }

    #[test]
    fn without_tokens_every_call_is_open_and_the_claim_is_marked() {
        let open = Tokens::default();
        let caller = open
            .caller(&Request::new(()), Role::Admin, "Apply", "dave")
            .unwrap();
        assert_eq!(caller.name, "dave (unverified)");
        let caller = open
            .caller(&Request::new(()), Role::Admin, "Apply", " ")
            .unwrap();
        assert_eq!(caller.name, "unknown (unverified)");
        assert_eq!(
            open.agent(&Request::new(())).unwrap().name,
            UNVERIFIED_AGENT
        );
    }

    #[test]
    fn a_single_token_file_is_one_admin() {
        let t = parse_named_tokens("\n  0123456789abcdef  \n").unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].name, SINGLE_TOKEN_NAME);
        assert_eq!(t[0].token, "0123456789abcdef");
        assert_eq!(t[0].role, Role::Admin);
    }

    #[test]
    fn bad_token_files_say_which_line_and_what() {
        let bad = |text: &str| parse_named_tokens(text).unwrap_err();
        assert_eq!(bad("").1, "the file names no token");
        assert_eq!(bad("a t1 admin\nb t2\n").0, 2);
        assert!(bad("a t1 root\n").1.contains("unknown role `root`"));
        assert!(bad("a t1 admin\na t2 viewer\n").1.contains("given twice"));
        assert!(bad("a t1 admin\nb t1 viewer\n").1.contains("two names"));
        assert!(bad("a/b t1 admin\n").1.contains("may only hold"));
        // Two lines of one word each: not the single-token format.
        assert_eq!(bad("t1\nt2\n").0, 1);
    }

    #[test]
    fn govd_starts_with_tokens_or_insecure_on_loopback() {
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        let none = Tokens::default();
        assert!(matches!(
            check_start(&none, false, addr("127.0.0.1:7070")),
            Err(crate::Error::NoAuth { .. })
        ));
        assert!(check_start(&none, true, addr("127.0.0.1:7070")).is_ok());
        assert!(check_start(&none, true, addr("[::1]:7070")).is_ok());
        assert!(matches!(
            check_start(&none, true, addr("0.0.0.0:7070")),
            Err(crate::Error::InsecureRemote { .. })
        ));
        assert!(check_start(&tokens(), false, addr("0.0.0.0:7070")).is_ok());
    }

    #[test]
    fn tokens_in_clear_on_a_non_loopback_address_are_warned_of() {
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        for remote in [
            "0.0.0.0:7070",
            "10.0.0.1:7070",
            "[::]:7070",
            "[2001:db8::1]:7070",
        ] {
            let warning = cleartext_warning(addr(remote), false, true).unwrap();
            assert!(warning.contains(remote), "{warning}");
            assert!(warning.contains("in clear"), "{warning}");
            assert!(warning.contains("--tls-cert/--tls-key"), "{warning}");
            // With TLS, or with no token to leak, nothing to warn of.
            assert_eq!(cleartext_warning(addr(remote), true, true), None);
            assert_eq!(cleartext_warning(addr(remote), false, false), None);
        }
        for local in [
            "127.0.0.1:7070",
            "127.1.2.3:7070",
            "[::1]:7070",
            "[::ffff:127.0.0.1]:7070",
        ] {
            assert_eq!(cleartext_warning(addr(local), false, true), None, "{local}");
        }
    }

    #[test]
    fn the_shared_agent_token_is_checked_only_when_configured() {
        let t = Tokens {
            named: Vec::new(),
            agent: Some("agent-secret".into()),
        };
        assert_eq!(
            t.agent(&Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            t.agent(&with_token("nope")).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let shared = t.agent(&with_token("agent-secret")).unwrap();
        assert_eq!(shared.name, SHARED_AGENT_TOKEN);
        assert!(shared.may_claim("anything"));
    }

    #[test]
    fn an_agent_token_names_its_services_and_claims_only_those() {
        let t = Tokens {
            named: parse_named_tokens(
                "alice s3cret-a admin\nshop-agents s3cret-shop agent order,payment\ncrm s3cret-crm agent crm\n",
            )
            .unwrap(),
            agent: None,
        };
        let shop = t.agent(&with_token("s3cret-shop")).unwrap();
        assert_eq!(shop.name, "shop-agents");
        assert!(shop.may_claim("order") && shop.may_claim("payment"));
        assert!(!shop.may_claim("crm") && !shop.may_claim("orde"));
        // Without a token, with a stranger's, or with a person's: refused.
        let missing = t.agent(&Request::new(())).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert!(
            missing.message().contains("prove who they are"),
            "{}",
            missing.message()
        );
        assert_eq!(
            t.agent(&with_token("s3cret")).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let person = t.agent(&with_token("s3cret-a")).unwrap_err();
        assert_eq!(person.code(), tonic::Code::PermissionDenied);
        assert!(
            person.message().contains("`alice` has the admin role"),
            "{}",
            person.message()
        );
        // An agent token makes no call people make.
        let status = t
            .caller(&with_token("s3cret-crm"), Role::Viewer, "Status", "")
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().contains("has the agent role"),
            "{}",
            status.message()
        );
        // A govd with no token at all (`--insecure`) takes any agent, unverified.
        let open = Tokens::default().agent(&with_token("whatever")).unwrap();
        assert_eq!(open.name, UNVERIFIED_AGENT);
        assert!(open.may_claim("order"));
        let certified = AgentIdentity::certificate("order");
        assert!(certified.may_claim("order") && !certified.may_claim("crm"));
    }

    #[test]
    fn a_spiffe_id_names_its_service_once_at_the_end_or_is_refused() {
        let service = |uri: &str| spiffe_service(uri, uri.strip_prefix("spiffe://").unwrap());
        assert_eq!(
            service("spiffe://prod.example/service/order").unwrap(),
            "order"
        );
        assert_eq!(
            service("spiffe://prod.example/ns/shop/sa/order/service/order-v2").unwrap(),
            "order-v2"
        );
        for (uri, why) in [
            ("spiffe://d/service/order/service/crm", "more than once"),
            (
                "spiffe://d/service/crm/ns/x/service/order",
                "more than once",
            ),
            ("spiffe://d/service/order/", "empty"),
            ("spiffe://d//service/order", "empty"),
            ("spiffe://d/ns/../service/order", "`..`"),
            ("spiffe://d/service/order?x=1", "query"),
            ("spiffe://d/service/ord%65r", "percent"),
            ("spiffe://d/ns/shop", "no service"),
            ("spiffe://d/service", "no service"),
            ("spiffe://d/service/or.der", "not a service name"),
            ("spiffe://d/service/\x1b[2J", "not a service name"),
        ] {
            let error = service(uri).unwrap_err();
            assert!(error.contains(why), "{uri}: {error}");
        }
    }

    #[test]
    fn bad_agent_lines_say_what_to_write() {
        let bad = |text: &str| parse_named_tokens(text).unwrap_err().1;
        assert!(
            bad("a t1 agent\n").contains("`a TOKEN agent SERVICE"),
            "{}",
            bad("a t1 agent\n")
        );
        assert!(bad("a t1 admin order\n").contains("only an `agent` token names services"));
        assert!(bad("a t1 agent order,,crm\n").contains("is not a service name"));
        assert!(bad("a t1 agent or/der\n").contains("is not a service name"));
        let t = parse_named_tokens("a t1 agent order,crm,order\n").unwrap();
        assert_eq!(t[0].services, ["order", "crm"]);
    }
}
