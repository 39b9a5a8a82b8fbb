//! Generates the IndexService (and llm-d IndexerService) code with a vendored `protoc`, so building the
//! workspace needs no system protobuf installation.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Hand the path to prost-build directly (setting PROTOC would need the
    // edition-2024 `unsafe` set_var).
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    let root = "../../proto";
    let files = [
        format!("{root}/inferencecache/index/v1/index.proto"),
        // llm-d's remote indexer API, wire-identical with llm-d-kv-cache.
        format!("{root}/llmd/indexer.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={file}");
    }
    tonic_prost_build::configure()
        // A hand-written decoder for the packed hashes (src/packed.rs).
        .extern_path(
            ".inferencecache.index.v1.BlockHashes",
            "crate::packed::BlockHashes",
        )
        // A hand-written encoder for LookupRoute's candidates (src/score.rs).
        .extern_path(
            ".inferencecache.index.v1.CandidateScore",
            "crate::score::CandidateScore",
        )
        .build_client(true)
        .build_server(true)
        .compile_with_config(config, &files, &[root.to_owned()])?;
    Ok(())
}
