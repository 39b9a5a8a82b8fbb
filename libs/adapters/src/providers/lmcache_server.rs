//! Managed standalone LMCache server: the in-memory `lm://` remote tier.

use k8s_openapi::api::core::v1::{Container, ContainerPort, ResourceRequirements};

use ic_api::cachebackend::LmCacheServerSpec;

use super::common::{service_port, tcp_probe};
use super::{LMCACHE_SERVER_DEFAULT_IMAGE, LMCACHE_SERVER_PORT, Shape};

/// Container and Service port name.
const PORT_NAME: &str = "lm";

/// The server entrypoint the default image ships, listening on every
/// interface at the fixed port the Service and the `lm://` binding use.
pub(crate) fn default_command() -> Vec<String> {
    vec![
        "lmcache_server".to_owned(),
        "0.0.0.0".to_owned(),
        LMCACHE_SERVER_PORT.to_string(),
    ]
}

pub(crate) fn shape(spec: Option<&LmCacheServerSpec>, resources: ResourceRequirements) -> Shape {
    let image = spec
        .and_then(|s| s.image.clone())
        .unwrap_or_else(|| LMCACHE_SERVER_DEFAULT_IMAGE.to_owned());
    let command = spec
        .and_then(|s| s.command.clone())
        .unwrap_or_else(default_command);
    let container = Container {
        name: "lmcache-server".to_owned(),
        image: Some(image),
        command: Some(command),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.to_owned()),
            container_port: LMCACHE_SERVER_PORT,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(tcp_probe(PORT_NAME, 5, 5, 3)),
        liveness_probe: Some(tcp_probe(PORT_NAME, 30, 10, 6)),
        resources: Some(resources),
        ..Container::default()
    };
    Shape {
        container,
        service_ports: vec![service_port(PORT_NAME, LMCACHE_SERVER_PORT)],
        host_network: false,
    }
}
