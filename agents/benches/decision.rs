//! Decision cost benchmark (being written).
fn main() {}
