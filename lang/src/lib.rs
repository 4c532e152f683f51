//! The `.gov` policy language: grammar, syntax tree with spans, parser and formatter.
//!
//! - [`parse`] turns one file into an [`ast::Policy`] or a [`SyntaxError`]
//!   (a miette diagnostic with the file name, a label at the offending token
//!   and, where one fits, a help line). Input over [`MAX_SOURCE_BYTES`],
//!   parentheses nested deeper than [`MAX_NESTING`] and match expressions of
//!   more than [`MAX_EXPR_TERMS`] terms are refused. [`parse_all`] reports
//!   every syntax error (up to [`MAX_SYNTAX_ERRORS`]): after an error it
//!   skips the statement (or item) that holds it and goes on.
//!   [`parse_partial`] gives the same errors and the tree of what parsed
//!   around them, with what was skipped, for the compiler to check.
//! - One parser: the pest grammar `src/gov.pest`, whose entry rule keeps
//!   broken statements and items as error nodes (see `parser.rs`), so one
//!   pass finds every error and the tree around them.
//! - [`format()`] prints a tree in the one canonical layout, keeping the
//!   comments of the source it came from; [`format_source`] does both.
//!
//! The grammar is `src/gov.pest`; the words that start match expressions or
//! statements (`path`, `method`, `header`, `consumer`, `calls`, `any`, `and`,
//! `or`, and every word of its `statement_word` rule: `service`, `match`,
//! `bulkhead`...) cannot be used as names.
//!
//! Rule kinds (`bulkhead`, `limit`, `fuse`) are named in the grammar only: a
//! rule is an [`ast::RuleDef`] whose settings keep their words and values
//! as written, so the tree, the parser and the formatter read every kind
//! the same way, and the compiler gives the settings their meaning.
//!
//! ```
//! let policy = gov_lang::parse("a.gov", "service a { capacity workers 4 }")?;
//! assert_eq!(policy.items.len(), 1);
//! let text = gov_lang::format(&policy, "service a { capacity workers 4 }");
//! assert_eq!(text, "service a {\n  capacity workers 4\n}\n");
//! # Ok::<(), gov_lang::SyntaxError>(())
//! ```

pub mod ast;
mod diagnostic;
mod fmt;
mod grammar;
mod parser;
pub mod report;
mod scan;

pub use diagnostic::SyntaxError;
pub use fmt::{format, format_source};
pub use grammar::{keywords, starts_statement};
pub use parser::{Parsed, Skipped, parse, parse_all, parse_partial, parse_strict};
pub use scan::{MAX_EXPR_TERMS, MAX_NESTING, MAX_SOURCE_BYTES, MAX_SYNTAX_ERRORS};
