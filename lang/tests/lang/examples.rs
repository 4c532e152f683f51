//! Every example in `examples/` parses.

use super::common::parse_ok;

#[test]
fn every_example_parses() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "gov") {
            let src = std::fs::read_to_string(&path).unwrap();
            let policy = parse_ok(&path.display().to_string(), &src);
            assert!(!policy.items.is_empty(), "{} has no items", path.display());
            count += 1;
        }
    }
    assert!(count > 0, "no examples found in {dir}");
}

#[test]
fn shop_reads_as_written() {
    use gov_lang::ast::*;
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/shop.gov"))
        .unwrap();
    let policy = parse_ok("shop.gov", &src);
    let Item::Service(order) = &policy.items[1] else {
        panic!("second item is not a service")
    };
    assert_eq!(order.name.node, "order");
    let writes = order
        .body
        .iter()
        .find_map(|s| match s {
            ServiceStmt::Match(m) if m.name.node == "writes" => Some(m),
            _ => None,
        })
        .unwrap();
    // `and` binds tighter than `or`; the parentheses are kept.
    let MatchExpr::And { lhs, rhs, span } = &writes.expr else {
        panic!("{:?}", writes.expr)
    };
    assert!(
        matches!(**lhs, MatchExpr::Group { ref inner, .. } if matches!(**inner, MatchExpr::Or { .. }))
    );
    assert!(
        matches!(**rhs, MatchExpr::Path { kind: PathKind::Prefix, ref value, .. } if value.node == "/orders")
    );
    assert_eq!(
        &src[span.start..span.end],
        "(method POST or method PUT) and path prefix \"/orders\""
    );
    assert_eq!(
        &src[writes.span.start..writes.span.end],
        "match writes = (method POST or method PUT) and path prefix \"/orders\""
    );
    assert!(policy.comments.0.len() > 10);
    assert!(policy.comments.0[0].text.starts_with(" shop.gov"));
}

/// Every example is in canonical form, formats idempotently and reads back
/// as the same tree.
#[test]
fn every_example_formats() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "gov") {
            continue;
        }
        let name = path.display().to_string();
        let src = std::fs::read_to_string(&path).unwrap();
        let tree = parse_ok(&name, &src);
        let once = gov_lang::format(&tree, &src);
        let again = parse_ok(&name, &once);
        assert_eq!(again, tree, "{name}: formatting changed the meaning");
        let twice = gov_lang::format(&again, &once);
        assert_eq!(twice, once, "{name}: formatting is not idempotent");
        assert_eq!(
            super::common::comment_texts(&again),
            super::common::comment_texts(&tree),
            "{name}: comments lost"
        );
    }
}
