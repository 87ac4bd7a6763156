//! Runtime benchmarks (criterion): component compile vs cache load, instantiate from
//! `InstancePre` (+ init), a `discover` returning 256 devices, and an `allocate` call.
//! Numbers are recorded in docs/BENCHMARKS.md.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use devplug::runtime::caps::{Capabilities, Globs};
use devplug::runtime::state::{Roots, Sandbox};
use devplug::runtime::{BackendInstance, Runtime, RuntimeConfig};

fn chaos() -> Vec<u8> {
    let (wasm, _) = devplug::backends::embedded::test_program("chaos").expect("chaos");
    std::fs::read(wasm).expect("read chaos")
}

fn sandbox(root: &std::path::Path) -> Sandbox {
    let g = Globs {
        dev: vec!["null".into()],
        resources: vec!["test.devplug.io/*".into()],
        env: vec!["*".into()],
        ..Globs::default()
    };
    let caps = Capabilities::new(&g, &g).expect("caps");
    Sandbox::new("chaos", &caps, &Roots::fixture(root), 64 << 20)
}

fn benches(c: &mut Criterion) {
    let bytes = chaos();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("dev")).expect("dev");
    std::fs::write(dir.path().join("dev/null"), "c 1:3").expect("null");

    let rt = Runtime::new(RuntimeConfig::default()).expect("runtime");
    c.bench_function("compile component (no cache)", |b| b.iter(|| rt.compile(&bytes).expect("compile")));

    let cached = Runtime::new(RuntimeConfig { cache_dir: Some(dir.path().join("cache")), ..RuntimeConfig::default() })
        .expect("runtime");
    cached.compile(&bytes).expect("warm cache");
    c.bench_function("load component from cache", |b| b.iter(|| cached.compile(&bytes).expect("cache load")));

    c.bench_function("cache load + link + instantiate + init", |b| {
        b.iter(|| BackendInstance::load(&cached, &bytes, "devices=4".into(), sandbox(dir.path())).expect("load"))
    });

    let big = BackendInstance::load(&rt, &bytes, "devices=256".into(), sandbox(dir.path())).expect("load");
    c.bench_function("discover 256 devices", |b| b.iter(|| big.discover().expect("discover")));

    let small = BackendInstance::load(&rt, &bytes, "devices=4".into(), sandbox(dir.path())).expect("load");
    let ids = vec!["widget-1".to_string()];
    c.bench_function("allocate call (1 device)", |b| {
        b.iter(|| small.allocate("test.devplug.io/widget", &ids).expect("allocate"))
    });
}

criterion_group! {
    name = runtime;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1)).sample_size(30);
    targets = benches
}
criterion_main!(runtime);
