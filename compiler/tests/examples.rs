//! Every example compiles without warnings, and its compiled bundle (YAML,
//! as `govc compile` prints it) is a golden snapshot. Kept in its own test
//! binary: insta's `glob!` collects failures in a process-wide stack that
//! other snapshot tests running in parallel would write into.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use gov_compiler::{SourceFile, compile};

#[test]
fn every_example_compiles_to_a_golden_yaml() {
    insta::glob!("../../examples", "*.gov", |path| {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let compiled = compile(&[SourceFile::new(
            name,
            std::fs::read_to_string(path).unwrap(),
        )]);
        let compiled = match compiled {
            Ok(c) => c,
            Err(d) => panic!(
                "{}: {:?}",
                path.display(),
                d.iter().map(|d| d.to_string()).collect::<Vec<_>>()
            ),
        };
        assert!(
            compiled.warnings.is_empty(),
            "{}: {:?}",
            path.display(),
            compiled
                .warnings
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
        );
        insta::assert_snapshot!(serde_yaml::to_string(&compiled.bundle).unwrap());
    });
}
