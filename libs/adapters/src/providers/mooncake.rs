//! Managed Mooncake master: a host-network singleton behind a headless
//! Service, so the Service DNS name resolves to the node IP the transfer
//! mesh needs.

use k8s_openapi::api::core::v1::{Container, ContainerPort, ResourceRequirements};

use ic_api::cachebackend::MooncakeSpec;

use super::common::{service_port, tcp_probe};
use super::{
    MOONCAKE_DEFAULT_IMAGE, MOONCAKE_HTTP_METADATA_PORT, MOONCAKE_METRICS_PORT, MOONCAKE_RPC_PORT,
    Shape,
};

const RPC: &str = "rpc";
const HTTP_METADATA: &str = "http-metadata";
const METRICS: &str = "metrics";

/// The master launch line: RPC, Prometheus metrics and the embedded HTTP
/// metadata server on the fixed ports.
pub(crate) fn default_command() -> Vec<String> {
    vec![
        "mooncake_master".to_owned(),
        format!("--rpc_port={MOONCAKE_RPC_PORT}"),
        format!("--metrics_port={MOONCAKE_METRICS_PORT}"),
        "--enable_http_metadata_server=true".to_owned(),
        "--http_metadata_server_host=0.0.0.0".to_owned(),
        format!("--http_metadata_server_port={MOONCAKE_HTTP_METADATA_PORT}"),
    ]
}

fn host_port(name: &str, port: i32) -> ContainerPort {
    // hostNetwork pods get hostPort = containerPort from the apiserver anyway;
    // rendering it keeps the node-port reservation visible and drift-free.
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: port,
        host_port: Some(port),
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }
}

pub(crate) fn shape(spec: Option<&MooncakeSpec>, resources: ResourceRequirements) -> Shape {
    let image = spec
        .and_then(|s| s.image.clone())
        .unwrap_or_else(|| MOONCAKE_DEFAULT_IMAGE.to_owned());
    let command = spec
        .and_then(|s| s.command.clone())
        .unwrap_or_else(default_command);
    let container = Container {
        name: "mooncake-master".to_owned(),
        image: Some(image),
        command: Some(command),
        ports: Some(vec![
            host_port(RPC, MOONCAKE_RPC_PORT),
            host_port(HTTP_METADATA, MOONCAKE_HTTP_METADATA_PORT),
            host_port(METRICS, MOONCAKE_METRICS_PORT),
        ]),
        readiness_probe: Some(tcp_probe(RPC, 5, 5, 3)),
        liveness_probe: Some(tcp_probe(RPC, 30, 10, 6)),
        resources: Some(resources),
        ..Container::default()
    };
    Shape {
        container,
        // RPC first: the published endpoint is the Service's first port.
        service_ports: vec![
            service_port(RPC, MOONCAKE_RPC_PORT),
            service_port(HTTP_METADATA, MOONCAKE_HTTP_METADATA_PORT),
        ],
        host_network: true,
    }
}
