//! Managed Redis: an in-memory RESP store with persistence off, bounded by
//! `--maxmemory` at 80% of the container's memory and evicting `allkeys-lru`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerPort, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use ic_api::cachebackend::RedisSpec;

use super::common::{service_port, tcp_probe};
use super::{REDIS_DEFAULT_IMAGE, REDIS_PORT, RenderError, Shape};
use crate::quantity::{QuantityError, parse_exact};

/// Container and Service port name.
const PORT_NAME: &str = "redis";

/// `--maxmemory` in bytes for a memory quantity: `floor(bytes × 4 / 5)`,
/// never 0 for a positive quantity (Redis reads 0 as "unlimited"). Exact
/// integer arithmetic on the quantity as written
/// ([`ExactQuantity::floor_scaled`](crate::quantity::ExactQuantity::floor_scaled)).
pub fn redis_maxmemory_bytes(memory: &str) -> Result<u128, QuantityError> {
    let q = parse_exact(memory)?;
    let bytes = q.floor_scaled(4, 5)?;
    Ok(if bytes == 0 && q.is_positive() {
        1
    } else {
        bytes
    })
}

/// The memory quantity that sizes the keyspace: the limit, else the request
/// (an unbounded Redis would grow until the node evicts it), else none.
fn sizing_memory(res: &ResourceRequirements) -> Option<(&'static str, &str)> {
    fn memory(m: Option<&BTreeMap<String, Quantity>>) -> Option<&str> {
        m.and_then(|m| m.get("memory")).map(|q| q.0.as_str())
    }
    memory(res.limits.as_ref())
        .map(|q| ("limits", q))
        .or_else(|| memory(res.requests.as_ref()).map(|q| ("requests", q)))
}

pub(crate) fn shape(
    spec: Option<&RedisSpec>,
    resources: ResourceRequirements,
    field: &str,
) -> Result<Shape, RenderError> {
    let mut args: Vec<String> = [
        "redis-server",
        "--port",
        "6379",
        "--protected-mode",
        "no",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    if let Some((half, memory)) = sizing_memory(&resources) {
        let bytes =
            redis_maxmemory_bytes(memory).map_err(|source| RenderError::InvalidQuantity {
                field: format!("{field}.{half}.memory"),
                source,
            })?;
        args.push("--maxmemory".to_owned());
        args.push(bytes.to_string());
    }
    args.push("--maxmemory-policy".to_owned());
    args.push("allkeys-lru".to_owned());

    let image = spec
        .and_then(|s| s.image.clone())
        .unwrap_or_else(|| REDIS_DEFAULT_IMAGE.to_owned());
    let container = Container {
        name: "redis".to_owned(),
        image: Some(image),
        // args only: the image's entrypoint keeps dropping root before exec.
        args: Some(args),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.to_owned()),
            container_port: REDIS_PORT,
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(tcp_probe(PORT_NAME, 2, 5, 3)),
        liveness_probe: Some(tcp_probe(PORT_NAME, 15, 10, 6)),
        resources: Some(resources),
        ..Container::default()
    };
    Ok(Shape {
        container,
        service_ports: vec![service_port(PORT_NAME, REDIS_PORT)],
        host_network: false,
    })
}
