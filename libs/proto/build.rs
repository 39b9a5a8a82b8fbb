//! Generates the IndexService code with a vendored `protoc`, so building the
//! workspace needs no system protobuf installation.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Hand the path to prost-build directly (setting PROTOC would need the
    // edition-2024 `unsafe` set_var).
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    let root = "../../proto";
    let file = format!("{root}/inferencecache/index/v1/index.proto");
    println!("cargo:rerun-if-changed={file}");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(config, &[file.as_str()], &[root])?;
    Ok(())
}
