//! Generates the gov wire types from `proto/gov/v1/*.proto` without a system
//! `protoc`: protox parses the files, tonic-prost-build emits the prost types
//! and, with the `grpc` feature, the tonic client/server; pbjson-build emits serde impls (proto3 JSON
//! mapping) from the same descriptor set.

use std::path::PathBuf;

use prost::Message;

#[path = "build/kinds.rs"]
mod kinds;
#[path = "build/reasons.rs"]
mod reasons;

const PROTOS: &[&str] = &["proto/gov/v1/config.proto", "proto/gov/v1/control.proto"];

/// What the build's generators return: the Rust source, or why the protos
/// cannot be built.
type Generated = Result<String, Box<dyn std::error::Error>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files(PROTOS)?;
    let fds = compiler.file_descriptor_set();
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let pool = compiler.descriptor_pool();
    std::fs::write(out.join("reasons.rs"), reasons::reasons(&pool)?)?;
    std::fs::write(out.join("kinds.rs"), kinds::kinds(&pool)?)?;

    // compile_fds() does not write a descriptor set: write it ourselves, for
    // pbjson below and for gRPC reflection.
    let descriptor_bytes = fds.encode_to_vec();
    std::fs::write(out.join("gov_descriptor.bin"), &descriptor_bytes)?;

    // Without the `grpc` feature only the messages are generated (no tonic code).
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        // BTreeMap keeps label maps in a stable order in YAML output.
        .btree_map(".")
        // The `Connect` RPC would clash with the generated
        // `ControlPlaneClient::connect(url)` constructor; build clients with
        // `ControlPlaneClient::new(Channel)` instead.
        .build_transport(false)
        .compile_fds(fds)?;

    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_bytes)?
        // snake_case names in output (YAML reads like the .proto); both
        // snake_case and camelCase are accepted on input.
        .preserve_proto_field_names()
        .btree_map(["."])
        .build(&[".gov.v1"])?;

    // proto3 JSON writes 64-bit integers as strings ("10"), which makes
    // `govc compile -o yaml` hard to read (`max_wait_ms: '10'`). Write them as
    // numbers; the generated deserializers accept both forms, so any proto3
    // JSON is still read back.
    let serde_path = out.join("gov.v1.serde.rs");
    let generated = std::fs::read_to_string(&serde_path)?;
    std::fs::write(&serde_path, numbers_not_strings(&generated))?;

    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    Ok(())
}

/// Rewrites pbjson's `ToString::to_string(&x).as_str()` (64-bit integers as
/// strings) into `&x`, and `.map(ToString::to_string)` on repeated ones away.
fn numbers_not_strings(src: &str) -> String {
    const OPEN: &str = "ToString::to_string(&";
    const CLOSE: &str = ").as_str()";
    let mut out = String::with_capacity(src.len());
    for line in src.lines() {
        let line = line.replace(".map(ToString::to_string)", "");
        match (line.find(OPEN), line.rfind(CLOSE)) {
            (Some(start), Some(end)) if end > start => {
                out.push_str(&line[..start]);
                out.push('&');
                out.push_str(&line[start + OPEN.len()..end]);
                out.push_str(&line[end + CLOSE.len()..]);
            }
            _ => out.push_str(&line),
        }
        out.push('\n');
    }
    out
}

/// A proto name in snake case (`bulkhead_full`, `RESOURCE_EXHAUSTED`) as
/// prost names its Rust variant (`BulkheadFull`, `ResourceExhausted`).
fn variant(name: &str) -> String {
    name.split('_')
        .flat_map(|w| {
            let mut chars = w.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase())
                .into_iter()
                .chain(chars.map(|c| c.to_ascii_lowercase()))
        })
        .collect()
}
