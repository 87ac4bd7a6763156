//! `devplug:backend@0.3.0` (`wit/since_v0.3.0`): 0.2.0 plus the `dra` export (`describe`,
//! `prepare`, `unprepare`) for resources served through Dynamic Resource Allocation. `types`
//! is unchanged, so it is 0.1.0's Rust types ([`super::wit`]).

use crate::model::dra as m;

/// This module's WIT package version.
pub const VERSION: &str = "0.3.0";

wasmtime::component::bindgen!({
    path: "../wit/since_v0.3.0",
    world: "devplug-backend",
    imports: { default: async | trappable },
    exports: { default: async },
    with: { "devplug:backend/types": super::wit_interface },
});

super::glue::since_0_2_0_glue!();

use exports::devplug::backend::dra as g;

fn counters(cs: Vec<g::Counter>) -> Vec<(String, String)> {
    cs.into_iter().map(|c| (c.name, c.value)).collect()
}

fn described(d: g::DeviceDescription) -> (String, String, m::Described) {
    let attributes = d
        .attributes
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                g::AttributeValue::Text(s) => m::AttributeValue::Text(s),
                g::AttributeValue::Integer(i) => m::AttributeValue::Int(i),
                g::AttributeValue::Flag(b) => m::AttributeValue::Bool(b),
                g::AttributeValue::Version(s) => m::AttributeValue::Version(s),
            };
            (k, v)
        })
        .collect();
    let consumes = d
        .consumes_counters
        .into_iter()
        .map(|u| m::CounterUse { name: u.counter_set, counters: counters(u.counters) })
        .collect();
    let desc = m::Described {
        attributes,
        capacity: d.capacity,
        consumes,
        allow_multiple_allocations: d.allow_multiple_allocations,
    };
    (d.resource, d.id, desc)
}

pub async fn describe(
    b: &DevplugBackend,
    store: &mut wasmtime::Store<HostState>,
) -> wasmtime::Result<GuestResult<m::PoolDescription>> {
    let r = b.devplug_backend_dra().call_describe(store).await?;
    Ok(r.map_err(answers::backend_error).map(|p| m::PoolDescription {
        counter_sets: p
            .counter_sets
            .into_iter()
            .map(|c| m::CounterSet { name: c.name, counters: counters(c.counters) })
            .collect(),
        devices: p.devices.into_iter().map(described).collect(),
    }))
}

/// `Ok(None)`: the backend answered `unsupported` (the host uses `allocate` instead).
pub async fn prepare(
    b: &DevplugBackend,
    store: &mut wasmtime::Store<HostState>,
    claim: &str,
    devices: &[m::ClaimDevice],
    config: &[String],
) -> wasmtime::Result<GuestResult<Option<crate::model::ContainerEdits>>> {
    let devices: Vec<g::ClaimDevice> = devices
        .iter()
        .map(|d| g::ClaimDevice { request: d.request.clone(), resource: d.resource.clone(), id: d.id.clone() })
        .collect();
    let r = b.devplug_backend_dra().call_prepare(store, claim, &devices, config).await?;
    Ok(match r {
        Ok(e) => Ok(Some(answers::edits(e))),
        Err(super::wit::BackendError::Unsupported) => Ok(None),
        Err(e) => Err(answers::backend_error(e)),
    })
}

pub async fn unprepare(
    b: &DevplugBackend,
    store: &mut wasmtime::Store<HostState>,
    claim: &str,
) -> wasmtime::Result<GuestResult<()>> {
    Ok(b.devplug_backend_dra().call_unprepare(store, claim).await?.map_err(answers::backend_error))
}
