//! How `govd` and `gov-agent` print a fatal error: its code, message, causes and
//! help on stderr, as miette's plain handler would, without pulling miette's
//! fancy renderer into the daemons (`govc` uses it).

/// Writes `error` to stderr (a closed stderr is ignored): `error[CODE]: message`, then each cause and the help.
pub fn plain(error: &(dyn miette::Diagnostic + 'static)) {
    crate::err!("{}", render(error));
}

fn render(error: &(dyn miette::Diagnostic + 'static)) -> String {
    let mut out = match error.code() {
        Some(code) => format!("error[{code}]: {error}\n"),
        None => format!("error: {error}\n"),
    };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        out.push_str(&format!("  caused by: {cause}\n"));
        source = cause.source();
    }
    if let Some(help) = error.help() {
        out.push_str(&format!("  help: {help}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn code_message_and_help_in_plain_text() {
        let text = super::render(&crate::path::PathError::AboveRoot);
        assert_eq!(
            text,
            "error[gov::path::above_root]: the path climbs above the root with `..`\n"
        );
    }
}
