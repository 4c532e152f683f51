//! Bearer tokens: operators present one for `Apply` (dry runs too: they
//! cost a compile) and `Release`, agents
//! their own on `Connect` (each only when configured). `Watch` and `Status`
//! are read-only and open.

use tonic::{Request, Status};

/// The configured tokens.
#[derive(Clone, Default)]
pub struct Tokens {
    pub operator: Option<String>,
    pub agent: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a token.
        f.debug_struct("Tokens")
            .field("operator", &self.operator.as_ref().map(|_| "<set>"))
            .field("agent", &self.agent.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Tokens {
    pub fn operator<T>(&self, request: &Request<T>) -> Result<(), Status> {
        check(
            self.operator.as_deref(),
            request,
            "an operator token (govc --token-file or GOV_TOKEN)",
        )
    }

    pub fn agent<T>(&self, request: &Request<T>) -> Result<(), Status> {
        check(
            self.agent.as_deref(),
            request,
            "the agent token (gov-agent --control-plane-token-file)",
        )
    }
}

fn check<T>(expected: Option<&str>, request: &Request<T>, what: &str) -> Result<(), Status> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let presented = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match presented {
        None => Err(Status::unauthenticated(format!("this call needs {what}"))),
        Some(token) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => Ok(()),
        Some(_) => Err(Status::permission_denied("the token is not valid")),
    }
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
    let text = std::fs::read_to_string(path).map_err(|source| crate::Error::TokenFile {
        path: path.display().to_string(),
        source,
    })?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    if token.is_empty() {
        return Err(crate::Error::EmptyToken {
            path: path.display().to_string(),
        });
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_only_when_configured() {
        let open = Tokens::default();
        assert!(open.operator(&Request::new(())).is_ok());
        let t = Tokens {
            operator: Some("s3cret".into()),
            agent: None,
        };
        assert_eq!(
            t.operator(&Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let mut wrong = Request::new(());
        authorize(&mut wrong, "nope").unwrap();
        assert_eq!(
            t.operator(&wrong).unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        let mut right = Request::new(());
        authorize(&mut right, "s3cret\n").unwrap();
        assert!(t.operator(&right).is_ok());
        assert!(t.agent(&Request::new(())).is_ok());
    }
}
