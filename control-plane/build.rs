//! Generates the etcd v3 client stubs govd uses for `--store etcd://`
//! (`proto/etcd/`: the KV, Watch and Lease calls it makes) without a system
//! `protoc`, as gov-proto does for gov's own protos: protox parses the files,
//! tonic-prost-build emits the prost types and the tonic clients.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["proto/etcd/rpc.proto"], ["proto/etcd"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        // Clients are made on govd's own balanced channel (etcd/client.rs),
        // never from a URL.
        .build_transport(false)
        .compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    Ok(())
}
