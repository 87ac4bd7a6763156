//! Build script: the kubelet gRPC code from the repository's `proto/` (upstream's `.proto` files,
//! compiled by protox), generated here a second time so the stand-ins speak the protocol with
//! code of their own and do not depend on devplug.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("..");
    let proto = root.join("proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let files = [
        "deviceplugin/v1beta1/api.proto",
        "pluginregistration/v1/api.proto",
        "dra/v1/api.proto",
        "dra/v1beta1/api.proto",
        "dra-health/v1alpha1/api.proto",
    ];
    let fds = protox::compile(files, [&proto])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;
    Ok(())
}
