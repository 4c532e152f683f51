//! Helpers shared by the test modules.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use miette::{GraphicalReportHandler, GraphicalTheme};

/// The diagnostic as a user sees it (as `govc check` prints it, headed by
/// its primary label), without colour, at a fixed width.
pub fn render(err: &gov_lang::SyntaxError) -> String {
    let mut out = String::new();
    GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor())
        .with_width(100)
        .render_report(&mut out, &gov_lang::report::Focused::new(err))
        .expect("rendering into a string cannot fail");
    out
}

/// The recovering entry rule and the strict grammar agree on `src`: the same
/// tree with the same spans (compared through `Debug`, which shows spans), or
/// both refuse it, and the first error is the strict grammar's.
pub fn same_as_strict(src: &str) {
    let recovering = gov_lang::parse("recovering.gov", src);
    match gov_lang::parse_strict("recovering.gov", src) {
        Ok(tree) => {
            let got =
                recovering.unwrap_or_else(|e| panic!("recovery refused valid text ({e}):\n{src}"));
            assert_eq!(
                format!("{got:#?}"),
                format!("{tree:#?}"),
                "the entry rules disagree on:\n{src}"
            );
        }
        Err(e) => {
            let got = recovering.expect_err("recovery accepted what the grammar refuses");
            // The strict rule stops at the first error; recovery finds the
            // same one first, unless a number over 64 bits comes before it
            // (the strict run stops at the grammar's error before building).
            if !got.message().starts_with("number ") {
                assert_eq!(got.message(), e.message(), "first error differs on:\n{src}");
            }
        }
    }
}

/// Parses or panics with the rendered diagnostic; checks the recovering
/// entry rule against the strict grammar on the way.
pub fn parse_ok(name: &str, src: &str) -> gov_lang::ast::Policy {
    same_as_strict(src);
    match gov_lang::parse(name, src) {
        Ok(p) => p,
        Err(e) => panic!("{}", render(&e)),
    }
}

/// The comments of `tree`, in order, as written (`Comments` equality ignores them,
/// like spans, so tests compare these).
pub fn comment_texts(tree: &gov_lang::ast::Policy) -> Vec<&str> {
    tree.comments.0.iter().map(|c| c.text.as_str()).collect()
}
