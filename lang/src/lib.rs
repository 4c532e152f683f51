//! The `.gov` policy language: grammar, syntax tree with spans, parser and formatter.
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

pub use diagnostic::SyntaxError;
pub use fmt::{format, format_source};
pub use parser::{MAX_EXPR_TERMS, MAX_NESTING, MAX_SOURCE_BYTES, parse};
