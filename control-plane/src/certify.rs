//! The `Certify` call (`identity`'s issuer behind gRPC): an agent's
//! service token must name the service its CSR asks for; each issue and
//! refusal is audited, as is a client certificate refused at the TLS
//! handshake (`tls_server.rs`).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use gov_proto::v1 as pb;

use crate::auth::{AgentIdentity, UNVERIFIED_AGENT};
use crate::control_plane::Inner;
use crate::convert::now_unix_ms;
use crate::identity::Csr;
use crate::store::AuditEntry;

/// `Certify`: the agent's token must name the service its CSR asks for.
pub(crate) async fn certify(
    inner: &Inner,
    request: Request<pb::CertifyRequest>,
) -> Result<Response<pb::CertifyResponse>, Status> {
    let Some(issuer) = inner.identity.as_deref() else {
        return Err(Status::failed_precondition(
            "this govd issues no certificates: start it with --identity-ca CERT,KEY, or give the agent --tls-cert and --tls-key instead of --identity",
        ));
    };
    if !request.metadata().contains_key("authorization") {
        return Err(Status::unauthenticated(
            "a certificate is issued only to an agent presenting its service's agent token (gov-agent --control-plane-token-file)",
        ));
    }
    let identity = inner.tokens().agent(&request)?;
    if identity.services.is_none() && identity.name == UNVERIFIED_AGENT {
        return Err(Status::permission_denied(
            "an open govd (--insecure) issues no certificates: give govd a --token-file with an `agent` line for this service",
        ));
    }
    let message = request.into_inner();
    let csr = Csr::parse(&message.csr_der).map_err(Status::invalid_argument)?;
    let target = format!(
        "{}/{}",
        gov_proto::printable::printable(&csr.service),
        gov_proto::printable::printable(&message.instance)
    );
    if !identity.may_claim(&csr.service) {
        let may = identity.services.as_deref().unwrap_or_default().join(", ");
        let detail = format!(
            "the CSR asks for service `{}`; the token names only: {may}",
            gov_proto::printable::printable(&csr.service)
        );
        refused(inner, &identity, target, detail).await;
        return Err(Status::permission_denied(format!(
            "the agent token `{}` may have certificates only for {may}, not `{}`; ask with this agent's own --service",
            identity.name,
            gov_proto::printable::printable(&csr.service)
        )));
    }
    let issued = match issuer.issue(&csr, &message.instance, now_unix_ms()) {
        Ok(issued) => issued,
        Err(reason) => {
            refused(inner, &identity, target, reason.clone()).await;
            return Err(Status::invalid_argument(reason));
        }
    };
    tracing::info!(who = %identity.label(), spiffe_id = %issued.spiffe_id, not_after_unix_ms = issued.not_after_unix_ms, "issued an agent certificate");
    inner
        .audit(entry(
            &identity,
            "certificate-issued",
            issued.spiffe_id.clone(),
            format!(
                "not after {} (unix ms), for {:?}",
                issued.not_after_unix_ms, issuer.lifetime
            ),
        ))
        .await;
    Ok(Response::new(pb::CertifyResponse {
        cert_chain_pem: issued.chain_pem,
        not_after_unix_ms: issued.not_after_unix_ms,
        spiffe_id: issued.spiffe_id,
    }))
}

/// A CSR refused: logged and audited (asking for another service's
/// identity is worth a record).
async fn refused(inner: &Inner, identity: &AgentIdentity, target: String, detail: String) {
    tracing::warn!(who = %identity.label(), %target, %detail, "refused a certificate");
    inner
        .audit(entry(identity, "certificate-refused", target, detail))
        .await;
}

fn entry(identity: &AgentIdentity, action: &str, target: String, detail: String) -> AuditEntry {
    AuditEntry {
        at_unix_ms: now_unix_ms(),
        who: identity.who(),
        action: action.to_owned(),
        intent: String::new(),
        version: String::new(),
        kind: String::new(),
        rule: String::new(),
        key: String::new(),
        targets: vec![target],
        detail,
    }
}

/// A client certificate refused at the TLS handshake: logged, counted in
/// `govd_connections_closed_total{reason="certificate_refused"}`, and
/// audited (`certificate-refused`, at a bounded rate: a flood of bad
/// certificates cannot flood the audit log, and the next record says how
/// many were not audited one by one).
pub(crate) fn on_refused_certificate(inner: &Arc<Inner>) -> crate::tls_server::OnRefused {
    let inner = inner.clone();
    let refusals = std::sync::Mutex::new(crate::tls_server::Refusals::new());
    Arc::new(move |refused: crate::tls_server::Refused| {
        let peer = refused
            .peer
            .map_or_else(|| "an unknown address".to_owned(), |p| p.to_string());
        tracing::warn!(%peer, reason = refused.reason, claimed = %refused.claimed, detail = %refused.detail, "refused a client certificate at the TLS handshake");
        inner
            .metrics
            .connections
            .count(crate::connections::Closed::CertificateRefused);
        let admitted = refusals.lock().unwrap_or_else(|e| e.into_inner()).admit();
        let Some(unaudited) = admitted else { return };
        let mut detail = format!(
            "at the TLS handshake: {}: {}",
            refused.reason, refused.detail
        );
        if unaudited > 0 {
            detail.push_str(&format!(
                " ({unaudited} more refused before this one were counted, not audited one by one)"
            ));
        }
        let entry = AuditEntry {
            at_unix_ms: now_unix_ms(),
            who: format!("unauthenticated peer {peer}"),
            action: "certificate-refused".into(),
            intent: String::new(),
            version: String::new(),
            kind: String::new(),
            rule: String::new(),
            key: String::new(),
            targets: vec![refused.claimed],
            detail,
        };
        let inner = inner.clone();
        tokio::spawn(async move { inner.audit(entry).await });
    })
}
