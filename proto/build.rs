//! Generates the gov wire types from `proto/gov/v1/*.proto` without a system
//! `protoc`: protox parses the files, tonic-prost-build emits the prost types
//! and, with the `grpc` feature, the tonic client/server; pbjson-build emits serde impls (proto3 JSON
//! mapping) from the same descriptor set.

use std::path::PathBuf;

use prost::Message;

const PROTOS: &[&str] = &["proto/gov/v1/config.proto", "proto/gov/v1/control.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("reasons.rs"), reasons(&fds)?)?;

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

/// The readers of `Rejections` (`src/rejections.rs`), generated from the
/// message and the `RejectReason` enum, so that a reason is declared once, in
/// `control.proto`: its count in `Rejections` and its value in `RejectReason`,
/// with the same name and number. Refuses to build when the two disagree.
fn reasons(fds: &prost_types::FileDescriptorSet) -> Result<String, Box<dyn std::error::Error>> {
    let file = fds
        .file
        .iter()
        .find(|f| f.name() == "gov/v1/control.proto")
        .ok_or("control.proto is not among the compiled files")?;
    let message = file
        .message_type
        .iter()
        .find(|m| m.name() == "Rejections")
        .ok_or("control.proto has no `Rejections` message")?;
    let reasons = file
        .enum_type
        .iter()
        .find(|e| e.name() == "RejectReason")
        .ok_or("control.proto has no `RejectReason` enum")?;
    let fields: Vec<&str> = message.field.iter().map(|f| f.name()).collect();
    let values: Vec<(&str, i32)> = reasons
        .value
        .iter()
        .filter(|v| v.number() != 0)
        .map(|v| (v.name(), v.number()))
        .collect();
    let expected: Vec<(String, i32)> = message
        .field
        .iter()
        .map(|f| {
            let name = format!("REJECT_REASON_{}", f.name().to_uppercase());
            (name, f.number())
        })
        .collect();
    let got: Vec<(String, i32)> = values.iter().map(|(n, i)| ((*n).to_owned(), *i)).collect();
    if got != expected
        || message
            .field
            .iter()
            .any(|f| f.r#type() != prost_types::field_descriptor_proto::Type::Uint64)
    {
        return Err(format!(
            "control.proto: every `Rejections` field must be a uint64 with a `RejectReason` value of the same \
             name and number, in the same order (REJECT_REASON_<FIELD> = <field number>); \
             fields {expected:?}, values {got:?}"
        )
        .into());
    }
    let variant = |field: &str| -> String {
        field
            .split('_')
            .flat_map(|w| {
                let mut chars = w.chars();
                chars
                    .next()
                    .map(|c| c.to_ascii_uppercase())
                    .into_iter()
                    .chain(chars)
            })
            .collect()
    };
    let n = fields.len();
    let list =
        |f: &dyn Fn(&str) -> String| fields.iter().map(|x| f(x)).collect::<Vec<_>>().join(" ");
    Ok(format!(
        r#"// Generated by proto/build.rs from control.proto's `Rejections` and `RejectReason`.

/// How many reasons a rule's calls are rejected for.
pub const REASONS: usize = {n};

/// Each reason's name (`/metrics`, the decision log), in the message's order.
pub const NAMES: [&str; REASONS] = [{names}];

/// Each reason's name for people (the TUI): the name with spaces.
pub const LABELS: [&str; REASONS] = [{labels}];

impl Rejections {{
    /// Each count with its reason's name, in the message's order.
    pub fn by_reason(&self) -> [(&'static str, u64); REASONS] {{
        [{by_reason}]
    }}

    /// Adds `other`'s counts, reason by reason (saturating).
    pub fn add(&mut self, other: &Rejections) {{
        {add}
    }}

    /// The counts in the message's order ([`RejectReason::index`]).
    pub fn from_counts(counts: [u64; REASONS]) -> Self {{
        let [{fields}] = counts;
        Rejections {{ {fields} }}
    }}
}}

impl RejectReason {{
    /// Every reason a call is rejected for, in index order (not `Unspecified`).
    pub const ALL: [RejectReason; REASONS] = [{all}];

    /// The reason's place in [`Rejections::from_counts`] and [`NAMES`];
    /// `None` for `Unspecified`.
    pub fn index(self) -> Option<usize> {{
        (self as usize).checked_sub(1)
    }}

    /// The reason's name ([`NAMES`]); `unspecified` for `Unspecified`.
    pub fn name(self) -> &'static str {{
        self.index().map_or("unspecified", |i| NAMES[i])
    }}
}}
"#,
        names = list(&|f| format!("\"{f}\",")),
        labels = list(&|f| format!("\"{}\",", f.replace('_', " "))),
        by_reason = list(&|f| format!("(\"{f}\", self.{f}),")),
        add = list(&|f| format!("self.{f} = self.{f}.saturating_add(other.{f});")),
        fields = list(&|f| format!("{f},")),
        all = list(&|f| format!("RejectReason::{},", variant(f))),
    ))
}
