//! The `.gov` policy language: grammar, syntax tree with spans, parser and formatter.

pub mod ast;
