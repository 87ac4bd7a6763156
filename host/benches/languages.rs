//! The same kind of backend in Rust, Python and JavaScript, side by side (criterion): component
//! size, cold compile, instantiate + `init` from the compile cache, `discover` and `allocate`
//! call latency through the real sandbox. The Rust one is the embedded `generic` backend; the
//! others are `guests/examples/{python-serial,js-fusetun}`, built here with
//! `guests/examples/build.sh` (tools on PATH or in ~/.cache/devplug-tools/bin).
//! Numbers go in docs/BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use devplug::backends::BackendSource;
use devplug::runtime::caps::{Capabilities, Globs};
use devplug::runtime::state::{Roots, Sandbox};
use devplug::runtime::{BackendInstance, Runtime, RuntimeConfig};

fn sandbox(root: &Path, name: &str) -> Sandbox {
    let g = Globs { dev: vec!["**".into()], resources: vec!["*/*".into()], env: vec!["*".into()], ..Globs::default() };
    let caps = Capabilities::new(&g, &g).expect("caps");
    // CPython in wasm needs more than the Rust backends' default cap.
    Sandbox::new(name, &caps, &Roots::fixture(root), 256 << 20)
}

fn build_examples(out: &Path) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo");
    let tools = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/devplug-tools/bin")).expect("HOME");
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
    let st = std::process::Command::new(repo.join("guests/examples/build.sh"))
        .arg(out)
        .env("PATH", path)
        .status()
        .expect("run build.sh");
    assert!(st.success(), "guests/examples/build.sh failed");
}

fn benches(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("tempdir");
    for (rel, desc) in
        [("dev/ttyUSB0", "c 188:0"), ("dev/fuse", "c 10:229"), ("dev/net/tun", "c 10:200"), ("dev/kvm", "c 10:232")]
    {
        let p = root.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, desc).expect("node");
    }
    std::fs::create_dir_all(root.path().join("sys")).expect("sys");
    let out = root.path().join("examples");
    build_examples(&out);
    let generic = BackendSource::embedded().into_iter().find(|s| s.name == "generic").expect("generic");
    let backends: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        ("rust (generic)", generic.bytes.into_owned(), "devplug.io/kvm", "kvm-0"),
        ("python (py-serial)", std::fs::read(out.join("py-serial.wasm")).expect("py"), "devplug.io/serial", "ttyUSB0"),
        ("js (js-fusetun)", std::fs::read(out.join("js-fusetun.wasm")).expect("js"), "devplug.io/js-fuse", "fuse-0"),
    ];
    let cache = root.path().join("cache");
    for (label, bytes, resource, id) in &backends {
        println!("size of {label}: {} KB", bytes.len() / 1024);
        let cold = Runtime::new(RuntimeConfig::default()).expect("runtime");
        let t0 = Instant::now();
        cold.compile(bytes).expect("compile");
        println!("cold compile of {label}: {:?}", t0.elapsed());
        let rt =
            Runtime::new(RuntimeConfig { cache_dir: Some(cache.clone()), ..RuntimeConfig::default() }).expect("rt");
        rt.compile(bytes).expect("warm the cache");
        let load = || BackendInstance::load(&rt, bytes, String::new(), sandbox(root.path(), label)).expect("load");
        c.bench_function(&format!("{label}: instantiate + init (cached compile)"), |b| b.iter(load));
        let inst = load();
        c.bench_function(&format!("{label}: discover"), |b| b.iter(|| inst.discover().expect("discover")));
        let ids = vec![(*id).to_owned()];
        c.bench_function(&format!("{label}: allocate"), |b| {
            b.iter(|| inst.allocate(resource, &ids).expect("allocate"))
        });
    }
}

criterion_group! {
    name = languages;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1)).sample_size(20);
    targets = benches
}
criterion_main!(languages);
