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

/// The fast parser and the grammar agree on `src`: the same tree with the
/// same spans (compared through `Debug`, which shows spans), or both refuse it.
pub fn same_as_grammar(src: &str) {
    let fast = gov_lang::parse_fast(src);
    match gov_lang::parse_with_grammar("grammar.gov", src) {
        Ok(tree) => {
            let fast = fast.unwrap_or_else(|| panic!("the fast parser refused valid text:\n{src}"));
            assert_eq!(
                format!("{fast:#?}"),
                format!("{tree:#?}"),
                "the parsers disagree on:\n{src}"
            );
        }
        Err(e) => assert!(
            fast.is_none(),
            "the fast parser accepted what the grammar refuses ({e}):\n{src}"
        ),
    }
}

/// Parses or panics with the rendered diagnostic; checks the fast parser
/// against the grammar on the way.
pub fn parse_ok(name: &str, src: &str) -> gov_lang::ast::Policy {
    same_as_grammar(src);
    match gov_lang::parse(name, src) {
        Ok(p) => p,
        Err(e) => panic!("{}", render(&e)),
    }
}
