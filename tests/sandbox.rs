//! The sandbox and the runtime: a hostile backend tries every way out and is refused each time;
//! looping, memory-hungry and trapping backends are stopped and replaced by fresh instances; the
//! breaker; the compile cache; bad `.wasm` files get a clear error.

use devplug_test_support as support;

use std::sync::Arc;
use std::time::Duration;

use devplug::backends::{BackendSource, Origin};
use devplug::runtime::caps::{Capabilities, Globs};
use devplug::runtime::jail::Jail;
use devplug::runtime::state::{Roots, Sandbox};
use devplug::runtime::{BackendInstance, CacheOutcome, CallError, LoadError, Runtime, RuntimeConfig, Tier};
use support::binary::BIN;
use support::daemon::chaos_paths;
use support::fixtures::Machine;

fn chaos_bytes() -> Vec<u8> {
    std::fs::read(chaos_paths().0).unwrap()
}

fn sandbox(m: &Machine, name: &str, requested: &Globs, granted: &Globs, memory_cap: usize) -> Sandbox {
    let caps = Capabilities::new(requested, granted).unwrap();
    Sandbox::new(name, &caps, &Roots::fixture(m.root()), memory_cap)
}

fn runtime() -> Arc<Runtime> {
    Runtime::new(RuntimeConfig {
        discover_deadline: Duration::from_millis(500),
        call_deadline: Duration::from_millis(100),
        compile_worker: Some(BIN.into()),
        ..RuntimeConfig::default()
    })
    .unwrap()
}

fn load(rt: &Arc<Runtime>, m: &Machine, config: &str) -> Result<BackendInstance, LoadError> {
    load_on(rt, &Roots::fixture(m.root()), config)
}

/// The chaos backend with everything it requests granted, on `roots`.
fn load_on(rt: &Arc<Runtime>, roots: &Roots, config: &str) -> Result<BackendInstance, LoadError> {
    let manifest = devplug::backends::Manifest::parse(&std::fs::read_to_string(chaos_paths().1).unwrap()).unwrap();
    let granted = Globs {
        sysfs: vec!["**".into()],
        dev: vec!["null".into()],
        procfs: vec!["**".into()],
        resources: vec!["**".into()],
        annotations: vec!["**".into()],
        env: vec!["*".into()],
        ..Globs::default()
    };
    let caps = Capabilities::new(&manifest.requests, &granted).unwrap();
    BackendInstance::load(rt, &chaos_bytes(), config.into(), Sandbox::new("chaos", &caps, roots, 64 << 20))
}

/// A sysfs with traps laid for the hostile backend: absolute and relative symlinks out of the
/// root, a link to an ungranted part of sysfs, an ungranted class with a secret.
fn hostile_machine() -> Machine {
    let m = Machine::new();
    m.pci("0000:00:01.0", "0000:00:01.0", &[("vendor", "0x10de")]);
    let dev = "sys/devices/pci0000:00/0000:00:01.0/0000:00:01.0";
    m.link(&format!("{dev}/abs-link"), "/etc/passwd")
        .link(&format!("{dev}/abs-dir"), "/etc")
        .link(&format!("{dev}/rel-escape"), "../../../../../../../../etc/passwd")
        .link(&format!("{dev}/ungranted-link"), "../../../../class/secret/token")
        .link("sys/escape-link", "/etc")
        .file("sys/class/secret/token", "s3cret")
        .link("sys/class/secret/link", "token")
        .node("null", 'c', 1, 3)
        .node("kvm", 'c', 10, 232)
        .node("sda", 'b', 8, 0)
        .link("dev/stdin", "/proc/self/fd/0")
        .link("proc/driver/escape", "../../etc/passwd")
        .link("proc/driver/abs-escape", "/etc/passwd")
        .link("proc/driver/abs-dir", "/etc");
    m
}

#[test]
fn a_hostile_backend_is_refused_every_way_out() {
    let m = hostile_machine();
    let rt = runtime();
    let inst = load(&rt, &m, "mode=escape").unwrap();
    let found = inst.discover().unwrap();
    let attempts: Vec<&(String, String)> =
        found[0].devices.iter().flat_map(|d| &d.attributes).filter(|(k, _)| k.starts_with("attempt:")).collect();
    assert!(attempts.len() >= 70, "only {} attempts ran", attempts.len());
    let escaped: Vec<_> = attempts.iter().filter(|(_, v)| !v.starts_with("refused")).collect();
    assert!(escaped.is_empty(), "escapes: {escaped:#?}");
    // The batched calls refuse for the same reasons as the single ones.
    let verdict = |k: &str| attempts.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str()).unwrap();
    for path in ["bus/pci/devices/0000:00:01.0/rel-escape", "class/secret/token", "/etc/passwd"] {
        assert_eq!(verdict(&format!("attempt:sysfs.read {path}")), verdict(&format!("attempt:sysfs.read-many {path}")));
    }
    eprintln!("{} escape attempts, all refused", attempts.len());
    // The host is unaffected: a normal instance of the same component still works.
    let ok = load(&rt, &m, "devices=3").unwrap();
    assert_eq!(ok.discover().unwrap()[0].devices.len(), 3);
}

#[test]
fn the_real_proc_keeps_its_magic_links_and_other_processes_out_even_when_granted() {
    // The chaos backend requests `self/**`, `driver/**` and `sys/kernel/ostype` of /proc, all
    // granted here, on this machine's real /proc.
    let m = Machine::new();
    let roots = Roots { proc: "/proc".into(), ..Roots::fixture(m.root()) };
    let rt = runtime();
    let inst = load_on(&rt, &roots, "mode=escape").unwrap();
    let found = inst.discover().unwrap();
    let proc: Vec<&(String, String)> =
        found[0].devices.iter().flat_map(|d| &d.attributes).filter(|(k, _)| k.starts_with("attempt:procfs")).collect();
    assert!(proc.len() >= 13, "{proc:#?}");
    let escaped: Vec<_> = proc.iter().filter(|(_, v)| !v.starts_with("refused")).collect();
    assert!(escaped.is_empty(), "escapes through the real /proc: {escaped:#?}");
    for (what, verdict) in &proc {
        eprintln!("{what}: {verdict}");
    }
    // What is granted and requested reads fine: the refusals are not everything failing.
    let caps = Capabilities::new(
        &Globs { procfs: vec!["sys/kernel/ostype".into()], ..Globs::default() },
        &Globs { procfs: vec!["sys/**".into()], ..Globs::default() },
    )
    .unwrap();
    assert_eq!(Jail::new("/proc", caps.procfs).read("sys/kernel/ostype").unwrap(), "Linux");
}

#[test]
fn granted_paths_still_work_inside_the_sandbox() {
    // The hostile test must not pass merely because everything is refused: the same grants let a
    // well-formed read through.
    let m = hostile_machine();
    let caps = Capabilities::new(
        &Globs { sysfs: vec!["bus/pci/devices/*/vendor".into(), "devices/**/vendor".into()], ..Globs::default() },
        &Globs { sysfs: vec!["**".into()], ..Globs::default() },
    )
    .unwrap();
    let jail = Jail::new(m.sys(), caps.sysfs);
    assert_eq!(jail.read("bus/pci/devices/0000:00:01.0/vendor").unwrap(), "0x10de");
}

#[test]
fn a_looping_backend_is_stopped_at_its_deadline_and_the_next_call_works() {
    let m = Machine::generic_box();
    let rt = runtime();
    let inst = load(&rt, &m, "devices=2").unwrap();
    let other = load(&rt, &m, "devices=5").unwrap();
    let err = inst.allocate("test.devplug.io/widget", &["spin-0".into()]).unwrap_err();
    assert_eq!(err, CallError::Timeout(Duration::from_millis(100)));
    assert_eq!(other.discover().unwrap()[0].devices.len(), 5, "other backends keep serving");
    let edits = inst.allocate("test.devplug.io/widget", &["widget-1".into()]).unwrap();
    assert_eq!((edits.env[0].0.as_str(), edits.env[0].1.as_str()), ("CHAOS_IDS", "widget-1"));
    let s = &inst.stats;
    assert_eq!(s.timeouts.load(std::sync::atomic::Ordering::Relaxed), 1);
}

/// Issue 42: a large component's first load is baseline-compiled (Winch) and its optimised code
/// compiled in the background for the next load. Baseline code is held to the same limits:
/// a spinning call is cut off at its deadline, a memory hog stops at the cap, a trap is
/// contained. (The chaos backend is small; `baseline_from = 0` makes it take the large path.)
#[test]
fn baseline_compiled_code_is_held_to_the_same_limits_and_replaced_by_optimised_code() {
    let m = Machine::generic_box();
    let cache = tempfile::tempdir().unwrap();
    let config = |background| RuntimeConfig {
        discover_deadline: Duration::from_millis(500),
        call_deadline: Duration::from_millis(100),
        cache_dir: Some(cache.path().join("c")),
        baseline_from: 0,
        optimize_in_background: background,
        compile_worker: Some(BIN.into()),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::new(config(false)).unwrap();
    let inst = load(&rt, &m, "devices=2").unwrap();
    assert_eq!((inst.tier(), inst.cache), (Tier::Baseline, CacheOutcome::Miss));
    assert_eq!(inst.allocate("r", &["spin-0".into()]).unwrap_err(), CallError::Timeout(Duration::from_millis(100)));
    let roomy = Runtime::new(RuntimeConfig { call_deadline: Duration::from_secs(10), ..config(false) }).unwrap();
    let hog = load(&roomy, &m, "devices=2").unwrap();
    assert_eq!(hog.tier(), Tier::Baseline);
    assert_eq!(hog.allocate("r", &["hog-0".into()]).unwrap_err(), CallError::MemoryCap(64 << 20));
    assert!(matches!(inst.allocate("r", &["trap-0".into()]).unwrap_err(), CallError::Trap(_)));
    assert_eq!(inst.discover().unwrap()[0].devices.len(), 2, "fresh instance after the faults");
    assert_eq!(load(&roomy, &m, "devices=2").unwrap().cache, CacheOutcome::Hit, "baseline code is cached too");
    // Issue 51: after it serves, the optimised code is compiled in the background, swapped
    // into the running instance (its calls then run optimised code) and cached; the next load
    // runs it from the cache.
    let rt = Runtime::new(config(true)).unwrap();
    let served = load(&rt, &m, "devices=2").unwrap();
    assert_eq!(served.tier(), Tier::Baseline);
    rt.finish_background_compiles();
    assert_eq!(served.tier(), Tier::Optimized, "swapped in without a reload");
    let entries = |suffix: &str| {
        std::fs::read_dir(cache.path().join("c"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(suffix))
            .count()
    };
    assert_eq!(entries("-baseline.cwasm"), 0, "the optimised entry replaces the baseline one");
    assert_eq!(entries(".cwasm"), 1);
    assert!(!served.optimizing());
    assert_eq!(served.discover().unwrap()[0].devices.len(), 2);
    assert_eq!(served.allocate("r", &["spin-0".into()]).unwrap_err(), CallError::Timeout(Duration::from_millis(100)));
    let next = load(&Runtime::new(config(true)).unwrap(), &m, "devices=3").unwrap();
    assert_eq!((next.tier(), next.cache), (Tier::Optimized, CacheOutcome::Hit));
    assert_eq!(next.discover().unwrap()[0].devices.len(), 3);
    // Without a cache (`--no-cache`, a `run` with no cache_dir) the path is the same: baseline
    // first, optimised swapped in.
    let bare = Runtime::new(RuntimeConfig { cache_dir: None, ..config(true) }).unwrap();
    let first = load(&bare, &m, "devices=2").unwrap();
    assert_eq!((first.tier(), first.cache), (Tier::Baseline, CacheOutcome::Disabled));
    bare.finish_background_compiles();
    assert_eq!(first.tier(), Tier::Optimized);
}

/// Issue 61 (2): a node that optimised a backend's version compiles the next version optimised
/// at once, from the incremental cache that compile left, instead of baseline first; one
/// backend's cache never serves another; a damaged cache is a whole compile, never a wrong one.
/// (`baseline_from = 0` makes the small chaos backend take the large path.)
#[test]
fn the_next_version_compiles_optimised_at_once_from_the_version_befores_functions() {
    let m = Machine::generic_box();
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().join("c");
    let rt = Runtime::new(RuntimeConfig {
        discover_deadline: Duration::from_secs(2),
        cache_dir: Some(dir.clone()),
        baseline_from: 0,
        compile_worker: Some(BIN.into()),
        ..RuntimeConfig::default()
    })
    .unwrap();
    let manifest = devplug::backends::Manifest::parse(&std::fs::read_to_string(chaos_paths().1).unwrap()).unwrap();
    let granted = Globs {
        sysfs: vec!["**".into()],
        dev: vec!["null".into()],
        resources: vec!["**".into()],
        env: vec!["*".into()],
        ..Globs::default()
    };
    let caps = Capabilities::new(&manifest.requests, &granted).unwrap();
    let load_as = |name: &str, k: u32| {
        let sandbox = Sandbox::new(name, &caps, &Roots::fixture(m.root()), 64 << 20);
        BackendInstance::load(&rt, &support::daemon::chaos_build(k), "devices=2".into(), sandbox).unwrap()
    };
    let incr = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".incr"))
            .count()
    };
    let first = load_as("chaos", 1);
    assert_eq!(first.tier(), Tier::Baseline, "no version before: the tiered path");
    rt.finish_background_compiles();
    assert_eq!(first.tier(), Tier::Optimized);
    assert_eq!(incr(), 1, "the background compile left the backend's incremental cache");
    let second = load_as("chaos", 2);
    assert_eq!((second.tier(), second.cache), (Tier::Optimized, CacheOutcome::Miss), "optimised at once");
    assert_eq!(second.discover().unwrap()[0].devices.len(), 2);
    assert_eq!(second.allocate("r", &["widget-1".into()]).unwrap().env[0].1.as_str(), "widget-1");
    let other = load_as("other", 3);
    assert_eq!(other.tier(), Tier::Baseline, "another backend's cache is not read");
    // A damaged cache: a whole compile, and code that works.
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(".incr") {
            std::fs::write(e.path(), b"\xff\xff\xff\xff not a cache").unwrap();
        }
    }
    let fourth = load_as("chaos", 4);
    assert_eq!(fourth.tier(), Tier::Optimized);
    assert_eq!(fourth.discover().unwrap()[0].devices.len(), 2);
    // A link planted at the cache's place is never followed: not read, and replaced by a file.
    let planted = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "incr"))
        .unwrap();
    let secret = cache.path().join("secret");
    std::fs::write(&secret, b"not devplug's").unwrap();
    std::fs::remove_file(&planted).unwrap();
    std::os::unix::fs::symlink(&secret, &planted).unwrap();
    let fifth = load_as("chaos", 5);
    assert_eq!(fifth.discover().unwrap()[0].devices.len(), 2);
    rt.finish_background_compiles();
    assert!(std::fs::symlink_metadata(&planted).unwrap().file_type().is_file(), "the link was replaced, not followed");
    assert_eq!(std::fs::read(&secret).unwrap(), b"not devplug's");
}

/// Issue 58 (2): a compile runs in a worker process whose memory and CPU the kernel bounds
/// (`RLIMIT_DATA`, `RLIMIT_CPU`), so a component built to make the compiler eat memory and time
/// (support/bomb.rs) is stopped at its budget, the error naming the bound; its baseline
/// (Winch) compile is milliseconds inside the same budget. On main before this, the optimised
/// compile ran inside the host, unbounded (47 to 571–627 MiB in 79–173 s).
#[test]
fn a_compile_bomb_is_stopped_by_the_kernel_at_its_budget() {
    use devplug::runtime::compile_worker::{self, CompileBudget, CompileError, DEFAULT_BUDGET, Job, Slot};
    let (exe, slot) = (BIN.path(), Slot::default());
    let bomb = support::bomb::armed(chaos_bytes());
    let optimised = Job { tier: Tier::Optimized, serial: true, idle: true, portable: false };
    let started = std::time::Instant::now();
    let baseline = Job { tier: Tier::Baseline, serial: false, idle: false, portable: false };
    let native = compile_worker::compile(exe, &slot, baseline, &bomb, &DEFAULT_BUDGET).unwrap();
    eprintln!("baseline: {:?} wall, {:?} CPU, peak {} MiB", started.elapsed(), native.cpu, native.peak_bytes >> 20);
    let tight = CompileBudget { memory_bytes: 160 << 20, cpu_base_secs: 600, cpu_secs_per_mib: 0 };
    let started = std::time::Instant::now();
    let err = compile_worker::compile(exe, &slot, optimised, &bomb, &tight).err();
    eprintln!("memory: {:?} after {:?}", err, started.elapsed());
    assert_eq!(err, Some(CompileError::Memory { mib: 160 }));
    let short = CompileBudget { memory_bytes: 8 << 30, cpu_base_secs: 3, cpu_secs_per_mib: 0 };
    let started = std::time::Instant::now();
    let err = compile_worker::compile(exe, &slot, optimised, &bomb, &short).err();
    eprintln!("cpu: {:?} after {:?}", err, started.elapsed());
    assert_eq!(err, Some(CompileError::Cpu { secs: 3 }));
    // What the bomb rides on compiles optimised well inside the default budget.
    let chaos = compile_worker::compile(exe, &slot, optimised, &chaos_bytes(), &DEFAULT_BUDGET).unwrap();
    assert!(chaos.peak_bytes < DEFAULT_BUDGET.memory_bytes, "{} MiB", chaos.peak_bytes >> 20);
    // One worker at a time, and a load's compile first: a background compile under way is
    // stopped (to run again later), so the two never add up past one bound.
    let roomy = CompileBudget { memory_bytes: 8 << 30, cpu_base_secs: 120, cpu_secs_per_mib: 0 };
    std::thread::scope(|s| {
        let background = s.spawn(|| compile_worker::compile(exe, &slot, optimised, &bomb, &roomy).err());
        while !slot.background_running() {
            std::thread::yield_now();
        }
        let fg = Job { tier: Tier::Optimized, serial: false, idle: false, portable: false };
        compile_worker::compile(exe, &slot, fg, &chaos_bytes(), &DEFAULT_BUDGET).unwrap();
        assert_eq!(background.join().unwrap(), Some(CompileError::Preempted));
    });
}

#[test]
fn a_memory_hog_hits_the_cap_and_a_trap_is_contained() {
    let m = Machine::generic_box();
    // Growing to the cap touches 64 MiB: on a loaded machine that can take longer than the
    // suite's 100 ms call deadline, and the deadline is not what this test is about.
    let rt =
        Runtime::new(RuntimeConfig { call_deadline: Duration::from_secs(10), ..RuntimeConfig::default() }).unwrap();
    let inst = load(&rt, &m, "devices=2").unwrap();
    assert_eq!(inst.allocate("r", &["hog-0".into()]).unwrap_err(), CallError::MemoryCap(64 << 20));
    assert!(inst.allocate("r", &["widget-0".into()]).is_ok(), "fresh instance after the cap");
    match inst.allocate("r", &["trap-0".into()]).unwrap_err() {
        // Issue 58 (5): the host's own cause first and whole, then the backend's words, marked
        // as its own (they were first, and a long backend line clipped the host's cause away).
        CallError::Trap(msg) => {
            let (host, backend) = msg
                .split_once("; the backend said (its own words, not devplug's): ")
                .unwrap_or_else(|| panic!("{msg}"));
            assert!(host.contains("wasm") && !host.contains("chaos"), "the host speaks first: {msg}");
            assert!(
                backend.contains("its last words: ") && backend.contains("chaos: trapping in allocate for trap-0"),
                "{msg}"
            );
        }
        e => panic!("{e:?}"),
    }
    assert!(inst.allocate("r", &["widget-0".into()]).is_ok(), "fresh instance after the trap");
    let s = &inst.stats;
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!((s.memory_cap_hits.load(Relaxed), s.traps.load(Relaxed)), (1, 1));
}

#[test]
fn repeated_faults_open_the_breaker_until_a_call_succeeds() {
    let m = Machine::generic_box();
    let rt = runtime();
    let inst = load(&rt, &m, "devices=2").unwrap();
    for _ in 0..3 {
        assert!(inst.allocate("r", &["trap-0".into()]).unwrap_err().is_fault());
    }
    assert!(inst.breaker_open());
    assert_eq!(inst.allocate("r", &["widget-0".into()]).unwrap_err(), CallError::BreakerOpen);
    // Health polling keeps calling discover; its success closes the breaker.
    assert_eq!(inst.discover().unwrap()[0].devices.len(), 2);
    assert!(!inst.breaker_open());
    assert!(inst.allocate("r", &["widget-0".into()]).is_ok());
}

#[test]
fn init_that_spins_or_traps_fails_the_load_with_the_reason() {
    let m = Machine::generic_box();
    let rt = runtime();
    let e = load(&rt, &m, "mode=spin-init").err().unwrap();
    assert!(matches!(e, LoadError::Init(CallError::Timeout(_))), "{e}");
    let e = load(&rt, &m, "mode=trap-init").err().unwrap();
    assert!(matches!(e, LoadError::Init(CallError::Trap(_))), "{e}");
    let e = load(&rt, &m, "colour=blue").err().unwrap();
    assert!(e.to_string().contains("unknown setting"), "{e}");
}

#[test]
fn bad_wasm_files_get_a_one_line_reason() {
    let m = Machine::generic_box();
    let rt = runtime();
    let sb = || sandbox(&m, "bad", &Globs::default(), &Globs::default(), 1 << 20);
    let chaos = chaos_bytes();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage", b"#!/bin/sh\necho hi\n".to_vec(), "not a Wasm file"),
        ("core module", b"\0asm\x01\0\0\0".to_vec(), "core Wasm module, not a component"),
        ("truncated", chaos[..chaos.len() / 2].to_vec(), "invalid component"),
        ("empty component", b"\0asm\x0d\0\x01\0".to_vec(), "not a devplug backend"),
    ];
    for (what, bytes, needle) in cases {
        let e =
            BackendInstance::load(&rt, &bytes, String::new(), sb()).err().unwrap_or_else(|| panic!("{what} loaded"));
        let msg = e.to_string();
        assert!(msg.contains(needle), "{what}: {msg}");
        assert!(!msg.contains('\n'), "{what}: one line please: {msg}");
    }
}

#[test]
fn a_second_start_loads_from_the_compile_cache() {
    let m = Machine::generic_box();
    let cache = tempfile::tempdir().unwrap();
    let cfg = RuntimeConfig { cache_dir: Some(cache.path().join("c")), ..RuntimeConfig::default() };
    let granted = Globs {
        dev: vec!["null".into()],
        resources: vec!["test.devplug.io/*".into()],
        env: vec!["CHAOS_*".into()],
        ..Globs::default()
    };
    let first = Runtime::new(cfg.clone()).unwrap();
    let a =
        BackendInstance::load(&first, &chaos_bytes(), String::new(), sandbox(&m, "c", &granted, &granted, 64 << 20))
            .unwrap();
    assert_eq!(a.cache, CacheOutcome::Miss);
    let second = Runtime::new(cfg).unwrap();
    let b =
        BackendInstance::load(&second, &chaos_bytes(), String::new(), sandbox(&m, "c", &granted, &granted, 64 << 20))
            .unwrap();
    assert_eq!(b.cache, CacheOutcome::Hit);
    assert_eq!(second.cache_hits.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(b.discover().unwrap()[0].devices.len(), 4, "the cached code runs");
    // A corrupt cache entry (even one rewritten in place while in use) is discarded and
    // recompiled, not trusted.
    for e in std::fs::read_dir(cache.path().join("c")).unwrap().flatten() {
        std::fs::write(e.path(), b"garbage").unwrap();
    }
    let third =
        Runtime::new(RuntimeConfig { cache_dir: Some(cache.path().join("c")), ..RuntimeConfig::default() }).unwrap();
    let c =
        BackendInstance::load(&third, &chaos_bytes(), String::new(), sandbox(&m, "c", &granted, &granted, 64 << 20))
            .unwrap();
    assert_eq!(c.cache, CacheOutcome::Miss);
}

#[test]
fn embedded_backends_have_valid_manifests_and_origin() {
    let all = BackendSource::embedded();
    assert!(all.iter().any(|s| s.name == "generic"));
    assert!(all.iter().all(|s| s.origin == Origin::Embedded));
}

#[test]
fn a_backend_blocked_in_a_wasi_sleep_is_cut_off_at_its_deadline() {
    let m = Machine::generic_box();
    let rt = runtime();
    let inst = load(&rt, &m, "devices=2").unwrap();
    let t0 = std::time::Instant::now();
    let err = inst.allocate("test.devplug.io/widget", &["sleep-0".into()]).unwrap_err();
    let took = t0.elapsed();
    assert_eq!(err, CallError::Timeout(Duration::from_millis(100)));
    // The guest asked for a minute; the call ends at its deadline (the exact overrun is measured
    // in the benchmarks, not asserted here).
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(inst.allocate("test.devplug.io/widget", &["widget-0".into()]).is_ok(), "a fresh instance serves next");
    let e = load(&rt, &m, "mode=sleep-init").err().unwrap();
    assert!(matches!(e, LoadError::Init(CallError::Timeout(_))), "{e}");
}

#[test]
fn a_backend_that_faults_every_other_call_still_trips_the_breaker() {
    let m = Machine::generic_box();
    let rt = runtime();
    let inst = load(&rt, &m, "devices=2").unwrap();
    for round in 0..3 {
        assert!(!inst.breaker_open(), "round {round}");
        assert!(inst.allocate("r", &["trap-0".into()]).unwrap_err().is_fault());
        if round < 2 {
            assert!(inst.allocate("r", &["widget-0".into()]).is_ok());
        }
    }
    assert!(inst.breaker_open(), "three faults in the last five calls");
}

#[test]
fn a_trap_says_what_the_guest_said_when_it_panicked() {
    let m = Machine::generic_box();
    let rt = runtime();
    let inst = load(&rt, &m, "devices=2").unwrap();
    match inst.allocate("r", &["trap-7".into()]).unwrap_err() {
        CallError::Trap(msg) => assert!(msg.contains("chaos: trapping in allocate for trap-7"), "{msg}"),
        e => panic!("{e:?}"),
    }
}
