//! Helpers shared by the test modules.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use miette::{GraphicalReportHandler, GraphicalTheme};

/// The diagnostic as a user sees it, without colour or unicode, at a fixed width.
pub fn render(err: &gov_lang::SyntaxError) -> String {
    let mut out = String::new();
    GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor())
        .with_width(100)
        .render_report(&mut out, err)
        .expect("rendering into a string cannot fail");
    out
}

/// Parses or panics with the rendered diagnostic.
pub fn parse_ok(name: &str, src: &str) -> gov_lang::ast::Policy {
    match gov_lang::parse(name, src) {
        Ok(p) => p,
        Err(e) => panic!("{}", render(&e)),
    }
}
