//! gov's one change to etcd-client 0.18.0 (see ../README.md): the protos are
//! parsed by protox instead of a system `protoc`, as gov's own are
//! (proto/build.rs), so that building gov needs no `protoc`. The generated
//! code is the same: tonic-prost-build emits it from the same descriptors.

#[cfg(feature = "build-server")]
fn should_build_server() -> bool {
    true
}

#[cfg(not(feature = "build-server"))]
fn should_build_server() -> bool {
    false
}

fn main() {
    let proto_root = "proto";
    println!("cargo:rerun-if-changed={proto_root}");

    let fds = protox::compile(
        [
            "proto/auth.proto",
            "proto/kv.proto",
            "proto/rpc.proto",
            "proto/v3election.proto",
            "proto/v3lock.proto",
        ],
        [proto_root],
    )
    .expect("Failed to parse proto files");
    tonic_prost_build::configure()
        .build_server(should_build_server())
        .compile_fds(fds)
        .expect("Failed to compile proto files");
}
