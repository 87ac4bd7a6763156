//! First-party backend benchmarks (criterion): `discover` of each backend on its fixture machine
//! through the real sandbox (capability-checked sysfs reads), and the GPU + NIC backends on a
//! generated machine with 8 GPUs and 256 VFs (target: under 20 ms). Sizes are printed once.
//! Numbers are recorded in docs/BENCHMARKS.md.

use devplug_test_support::hardware;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use devplug::backends::BackendSource;
use devplug::runtime::caps::Capabilities;
use devplug::runtime::jail::{Jail, OpenDirs};
use devplug::runtime::state::{Roots, Sandbox};
use devplug::runtime::{BackendInstance, Runtime, RuntimeConfig};

fn load(rt: &Arc<Runtime>, src: &BackendSource, machine: &Path) -> BackendInstance {
    let caps = Capabilities::new(&src.manifest.requests, &src.manifest.requests).expect("caps");
    let sandbox = Sandbox::new(&src.name, &caps, &Roots::fixture(machine), 64 << 20);
    BackendInstance::load(rt, &src.bytes, String::new(), sandbox).expect("load")
}

fn benches(c: &mut Criterion) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs");
    // A compile cache, so the cold benchmark's setup (two loads per sample) does not compile.
    let cache = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(RuntimeConfig { cache_dir: Some(cache.path().to_owned()), ..RuntimeConfig::default() })
        .expect("runtime");
    let sources = BackendSource::embedded();
    let src = |name: &str| sources.iter().find(|s| s.name == name).expect("embedded backend");
    for s in &sources {
        println!("size of {}: {} KB", s.name, s.bytes.len() / 1024);
    }
    for (backend, machine) in [
        ("gpu", "dgx-h100"),
        ("gpu", "amd-mi300x"),
        ("nic", "cx6dx-sriov"),
        ("fpga", "alveo-u250"),
        ("generic", "plain"),
    ] {
        let inst = load(&rt, src(backend), &fixtures.join(machine));
        let n: usize = inst.discover().expect("discover").iter().map(|r| r.devices.len()).sum();
        c.bench_function(&format!("discover {backend} on {machine} ({n} devices)"), |b| {
            b.iter(|| inst.discover().expect("discover"))
        });
    }

    // One capability-checked attribute read, the unit every discover is made of.
    let gpu_src = src("gpu");
    let caps = Capabilities::new(&gpu_src.manifest.requests, &gpu_src.manifest.requests).expect("caps");
    let jail = Jail::new(fixtures.join("dgx-h100/sys"), caps.sysfs);
    c.bench_function("jail read of a sysfs attribute through bus/pci/devices", |b| {
        b.iter(|| jail.read("bus/pci/devices/0000:18:00.0/vendor").expect("read"))
    });
    let plain = |p: &Path| std::fs::read_to_string(p).expect("read");
    let direct = fixtures.join("dgx-h100/sys/bus/pci/devices/0000:18:00.0/vendor");
    c.bench_function("plain std::fs::read_to_string of the same attribute", |b| b.iter(|| plain(&direct)));

    let big = tempfile::tempdir().expect("tempdir");
    hardware::build_big(big.path());
    let gpu = load(&rt, src("gpu"), big.path());
    let nic = load(&rt, src("nic"), big.path());
    // The host side of a first discover's biggest step: four attributes of every PCI function,
    // one capability-checked read each vs one batched call.
    let nic_src = src("nic");
    let caps = Capabilities::new(&nic_src.manifest.requests, &nic_src.manifest.requests).expect("caps");
    let jail = Jail::new(big.path().join("sys"), caps.sysfs);
    let addrs = jail.list("bus/pci/devices").expect("list");
    let paths: Vec<String> = addrs
        .iter()
        .flat_map(|a| ["class", "vendor", "device", "numa_node"].map(|f| format!("bus/pci/devices/{a}/{f}")))
        .collect();
    println!("{} functions, {} attribute reads", addrs.len(), paths.len());
    c.bench_function("jail: 4 attributes of every function on the big machine, one read each", |b| {
        b.iter(|| paths.iter().map(|p| jail.read(p).is_ok()).filter(|ok| *ok).count())
    });
    c.bench_function("jail: the same attributes in one read_many", |b| {
        b.iter(|| {
            jail.read_many(&paths, &mut OpenDirs::default(), &mut devplug::runtime::limits::Meter::default())
                .iter()
                .filter(|r| r.is_ok())
                .count()
        })
    });
    let real: Vec<std::path::PathBuf> = paths.iter().map(|p| big.path().join("sys").join(p)).collect();
    c.bench_function("plain std::fs::read_to_string of the same attributes", |b| {
        b.iter(|| real.iter().filter(|p| std::fs::read_to_string(p).is_ok()).count())
    });
    let count = |i: &BackendInstance| i.discover().expect("discover").iter().map(|r| r.devices.len()).sum::<usize>();
    let (g, v) = (count(&gpu), count(&nic));
    assert_eq!((g, v), (8, 256), "the big machine has 8 GPUs and 256 VFs");
    // Steady state: what every health poll costs once the backends know the machine.
    c.bench_function("discover gpu + nic on 8 GPUs + 256 VFs (health poll)", |b| {
        b.iter(|| {
            gpu.discover().expect("gpu");
            nic.discover().expect("nic")
        })
    });
    // Cold: fresh instances that have read nothing yet (after a load or a swap).
    c.bench_function("discover gpu + nic on 8 GPUs + 256 VFs (first, cold)", |b| {
        b.iter_batched(
            || (load(&rt, src("gpu"), big.path()), load(&rt, src("nic"), big.path())),
            |(g, n)| {
                g.discover().expect("gpu");
                n.discover().expect("nic")
            },
            criterion::BatchSize::PerIteration,
        )
    });
}

criterion_group! {
    name = backends;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1)).sample_size(20);
    targets = benches
}
criterion_main!(backends);
