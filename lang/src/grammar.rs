//! The pest parser generated from `gov.pest`. Its types never leave the crate:
//! `parser.rs` turns pairs into the syntax tree and `diagnostic.rs` turns pest
//! errors into [`crate::SyntaxError`].

#[derive(pest_derive::Parser)]
#[grammar = "gov.pest"]
pub(crate) struct GovParser;
