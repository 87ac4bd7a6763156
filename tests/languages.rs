//! Backends in other languages, built from source in the suite and loaded by the unmodified
//! host: `guests/examples/python-serial` (componentize-py) and `guests/examples/js-fusetun`
//! (componentize-js), found by `devplug discover` on a fixture and answering Allocate through the
//! kubelet stand-in.

use devplug_test_support as support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use devplug_standins::proto::deviceplugin as pb;
use support::binary::{Devplug, discover_backend, run, run_args, run_on_machine};
use support::fixtures::Machine;
use support::kubelet::Kubelet;

const T: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache")
}

/// A machine with two USB serial adapters, FUSE and TUN.
fn machine() -> Machine {
    let m = Machine::new();
    m.node("ttyUSB0", 'c', 188, 0)
        .node("ttyACM0", 'c', 166, 0)
        .node("fuse", 'c', 10, 229)
        .node("net/tun", 'c', 10, 200);
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_javascript_backends_are_discovered_and_allocate_through_kubelet() {
    let out = tokio::task::spawn_blocking(support::examples::built).await.unwrap();
    let m = machine();
    let s = |p: &Path| p.display().to_string();

    // discover, one backend at a time, as a vendor checks theirs.
    for (file, resource, ids) in [
        ("py-serial.wasm", "devplug.io/serial", vec!["ttyACM0", "ttyUSB0"]),
        ("js-fusetun.wasm", "devplug.io/js-tun", vec!["net_tun-0", "net_tun-1", "net_tun-2", "net_tun-3"]),
    ] {
        let (code, stdout, err) = discover_backend(&out.join(file), &m, &cache_dir());
        assert_eq!(code, 0, "{file}: {err}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let r = v["resources"].as_array().unwrap().iter().find(|r| r["name"] == resource).unwrap();
        let mut got: Vec<&str> = r["devices"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
        got.sort();
        assert_eq!(got, ids, "{file}");
        assert!(r["devices"].as_array().unwrap().iter().all(|d| d["health"] == "Healthy"));
    }

    // Both served by `devplug run`; kubelet allocates from each.
    let kdir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(kdir.path()).await;
    let mut args = run_args(kdir.path(), &out, &m);
    args.extend(["--cache-dir".into(), s(&cache_dir()), "--poll-interval".into(), "1s".into()]);
    let d = Devplug::spawn(&args);
    for (resource, id, env, want) in [
        ("devplug.io/serial", "ttyUSB0", "SERIAL_PORTS", "/dev/ttyUSB0"),
        ("devplug.io/js-fuse", "fuse-2", "JS_DEVICES", "fuse-2"),
    ] {
        let plugin = kubelet.wait_plugin(resource, T).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
        let req = pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec![id.into()] }],
        };
        let resp = plugin.client.clone().allocate(req).await.unwrap().into_inner();
        let c = &resp.container_responses[0];
        assert_eq!(c.envs.get(env).map(String::as_str), Some(want), "{resource}: {c:?}");
        assert_eq!(c.devices[0].container_path, format!("/dev/{}", id.split('-').next().unwrap()), "{resource}");
    }
}

/// Run a project's own command in `dir`, with devplug and the suite's tools on PATH.
fn project_cmd(dir: &Path, line: &str) {
    let bin_dir = support::binary::BIN.path().parent().unwrap().to_owned();
    let tools = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/devplug-tools/bin")).unwrap();
    let path = format!("{}:{}:{}", bin_dir.display(), tools.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("sh")
        .arg("-c")
        .arg(line)
        .current_dir(dir)
        .env("PATH", path)
        // Reused between runs: the new project's dependencies compile once per machine.
        .env("CARGO_TARGET_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("scaffold-target"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`{line}` in {} failed:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The text of the first fenced block of `lang` in `text`.
fn fenced<'a>(text: &'a str, lang: &str) -> &'a str {
    let start = text.find(&format!("```{lang}\n")).unwrap_or_else(|| panic!("no ```{lang} block")) + lang.len() + 4;
    &text[start..start + text[start..].find("```").unwrap()]
}

/// Issue 34: the vendor guide's commands as written (the registry's address and the project's
/// name substituted): its learn command prints requests that, granted, find the project's
/// devices; the key pair its openssl lines make is one `push --sign-key` takes, the signed push
/// pulls back verified, and its node config (image, grant, public key) lets a `devplug new`
/// project be pulled, verified and discovered on its fixture with nothing refused. A guide that
/// drifts from the code fails here.
fn the_guides_ship_commands_work(project: &Path) {
    let guide =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/writing-a-backend.md")).unwrap();
    let section = &guide[guide.find("## 5. Ship it").expect("the guide's section 5")..];
    let registry = support::registry::Registry::start(false);
    let ours = |t: &str| t.replace("127.0.0.1:5000", &registry.addr).replace("mydev", "demo");
    let commands: Vec<&str> =
        fenced(section, "sh").lines().filter(|l| l.starts_with("openssl ") || l.starts_with("devplug ")).collect();
    assert_eq!(commands.len(), 4, "key, public key, push, pull: {commands:?}");
    for line in commands {
        project_cmd(project, &ours(line));
    }
    // The guide's learn command (section 2), on the project: what it prints, granted, is enough.
    let learn_at = guide.find("### Learn the requests instead of guessing").expect("the guide's learn section");
    let learn = ours(&fenced(&guide[learn_at..], "sh").replace("\\\n", " "));
    let learn = learn.split('#').next().unwrap().trim().to_owned();
    assert!(learn.starts_with("devplug discover --learn-requests demo"), "{learn}");
    project_cmd(project, &format!("{learn} > learned.toml"));
    let learned = std::fs::read_to_string(project.join("learned.toml")).unwrap();
    assert!(learned.contains("\"demo[0-9]*\""), "the nodes it hands out: {learned}");
    std::fs::write(project.join("learned-grant.toml"), learned.replace("[requests]", "[backends.demo.grant]")).unwrap();
    project_cmd(
        project,
        "devplug discover --config learned-grant.toml --backend demo.wasm --sysfs-root tests/fixture/sys \
         --dev-root tests/fixture/dev --dev-fixtures --format json > learned.json",
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(project.join("learned.json")).unwrap()).unwrap();
    assert_eq!(v["resources"][0]["devices"].as_array().map(Vec::len), Some(2), "{v}");
    let node = ours(fenced(section, "toml"));
    std::fs::write(project.join("node.toml"), node).unwrap();
    project_cmd(
        project,
        "devplug discover --config node.toml --no-embedded --sysfs-root tests/fixture/sys --dev-root tests/fixture/dev \
         --dev-fixtures --format json > shipped.json",
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(project.join("shipped.json")).unwrap()).unwrap();
    assert_eq!(v["refused"].as_array().map(Vec::len), Some(0), "the guide's grant is enough: {v}");
    let demo = v["resources"].as_array().unwrap().iter().find(|r| r["name"] == "example.com/demo").unwrap();
    let ids: Vec<&str> = demo["devices"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["demo0", "demo1"], "{v}");
}

/// The documented path from a built project to kubelet, as a vendor ships it: `devplug pack`
/// the component with the project's `devplug.toml`, check the image with skopeo, unpack its
/// layer into a directory (what an image volume shows) and serve that with `devplug run`
/// (`default_grant = "requested"`) to the kubelet stand-in, which registers the resource and
/// gets the fixture's node for `demo0` from Allocate.
fn ship_and_serve(project: &Path, wasm: &Path, lang: &str) {
    let s = |p: &Path| p.display().to_string();
    let image = project.join("image");
    let (code, out, err) =
        run(&["pack", "--out", &s(&image), "--tag", "1.0.0", &s(wasm), &s(&project.join("devplug.toml"))]);
    assert_eq!(code, 0, "{lang}: pack: {err}");
    let stem = wasm.file_stem().unwrap().to_string_lossy().into_owned();
    assert!(out.contains(&format!("{stem}.toml")), "{lang}: the manifest is packed as {stem}.toml: {out}");
    let inspected = Command::new("skopeo").args(["inspect", &format!("oci:{}:1.0.0", s(&image))]).output().unwrap();
    assert!(inspected.status.success(), "{lang}: skopeo: {}", String::from_utf8_lossy(&inspected.stderr));
    let info: serde_json::Value = serde_json::from_slice(&inspected.stdout).unwrap();
    let layer = info["Layers"][0].as_str().unwrap().trim_start_matches("sha256:").to_owned();
    let blob = std::fs::read(image.join("blobs/sha256").join(layer)).unwrap();
    let volume = project.join("volume");
    tar::Archive::new(flate2::read::GzDecoder::new(blob.as_slice())).unpack(&volume).unwrap();
    assert!(volume.join(format!("{stem}.wasm")).exists() && volume.join(format!("{stem}.toml")).exists());

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let kdir = project.join("kubelet");
        let kubelet = Kubelet::start(&kdir).await;
        let fixture = project.join("tests/fixture");
        let args: Vec<String> = [
            "run",
            "--kubelet-dir",
            &s(&kdir),
            "--registration",
            "kubelet-socket",
            "--no-embedded",
            "--backends",
            &s(&volume),
            "--default-grant",
            "requested",
            "--sysfs-root",
            &s(&fixture.join("sys")),
            "--dev-root",
            &s(&fixture.join("dev")),
            "--dev-fixtures",
            "--cdi-dir",
            &s(&project.join("cdi")),
            "--metrics-addr",
            "127.0.0.1:0",
            "--cache-dir",
            &s(&cache_dir()),
        ]
        .map(str::to_owned)
        .to_vec();
        let d = Devplug::spawn(&args);
        let plugin =
            kubelet.wait_plugin("example.com/demo", T).await.unwrap_or_else(|e| panic!("{lang}: {e}\n{}", d.log()));
        let req = pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest { devices_ids: vec!["demo0".into()] }],
        };
        let resp = plugin.client.clone().allocate(req).await.unwrap().into_inner();
        let nodes: Vec<&str> = resp.container_responses[0].devices.iter().map(|n| n.host_path.as_str()).collect();
        assert_eq!(nodes, ["/dev/demo0"], "{lang}: {resp:?}");
    });
}

/// Issue 42 (5): the claim every `devplug new` project carries (`claim.yaml`: a selector on
/// the typed `minor` its `describe` gives), allocated as kube-scheduler would and prepared by
/// `devplug try --dra`, from the project's directory as the guide runs it.
fn claim_through_try(project: &Path, wasm: &Path, lang: &str) {
    let s = |p: &Path| p.display().to_string();
    let tryd = project.join("try");
    std::fs::create_dir_all(&tryd).unwrap();
    std::fs::copy(wasm, tryd.join("demo.wasm")).unwrap();
    std::fs::copy(project.join("devplug.toml"), tryd.join("demo.toml")).unwrap();
    let fixture = project.join("tests/fixture");
    let args = [
        "try",
        "--no-embedded",
        "--backends-dir",
        &s(&tryd),
        "--default-grant",
        "requested",
        "--dra",
        "example.com/demo",
        "--sysfs-root",
        &s(&fixture.join("sys")),
        "--dev-root",
        &s(&fixture.join("dev")),
        "--dev-fixtures",
        "--cache-dir",
        &s(&cache_dir()),
    ];
    let mut t = support::binary::Interactive::spawn(&args);
    t.send(&format!("claim {}", s(&project.join("claim.yaml"))));
    let printed = t.wait_for("CDI spec ").join("\n");
    assert!(printed.contains("prepared demo-one"), "{lang}: {printed}");
    assert!(
        printed.contains("  dev demo.devplug.io demo1: CDI devplug.io/claim="),
        "{lang}: minor 1 is demo1: {printed}"
    );
    t.quit();
}

/// Issue 52 (1): what `--learn-requests` prints, used verbatim as the manifest, passes
/// `discover` on the machine it was learned on, and asks for no more than was used: a backend
/// that lists vfio-pci's directory is granted its names (`DIR/`), not the driver's write-only
/// control files beside the functions; the functions it read are `????:??:??.?`, never `*`; the
/// `pci` attribute it hands out brings the grant the host checks it against. The same backend in
/// the project's language (`tests/fixtures/backends/vfio`), built with the project's tools.
fn learned_requests_serve_as_the_manifest(project: &Path, lang: &str) {
    let (file, to, build) = match lang {
        "rust" => (
            "lib.rs",
            "src/lib.rs",
            "cargo build --release --target wasm32-wasip2 && cp \"$CARGO_TARGET_DIR/wasm32-wasip2/release/demo.wasm\" vfio.wasm",
        ),
        "python" => {
            ("app.py", "src/app.py", "componentize-py -d wit -w devplug-backend componentize app -p src -o vfio.wasm")
        }
        _ => (
            "backend.js",
            "backend.js",
            "node_modules/.bin/componentize-js --wit wit --world-name devplug-backend -d http -d fetch-event -o vfio.wasm backend.js",
        ),
    };
    std::fs::copy(repo().join("tests/fixtures/backends/vfio").join(file), project.join(to)).unwrap();
    project_cmd(project, build);
    let wasm = project.join("vfio.wasm");
    let wasm = wasm.to_str().unwrap();
    let machine = project.join("cx6dx-sriov");
    support::hardware::build("cx6dx-sriov", &machine);
    let (code, learned, err) =
        run_on_machine(&["discover", "--learn-requests", "vfio", "--backend", wasm], &machine, &cache_dir(), &[]);
    assert_eq!(code, 0, "{lang}: {err}");
    assert!(learned.contains("\"bus/pci/drivers/vfio-pci/\","), "{lang}: the listing, as names: {learned}");
    assert!(learned.contains("\"bus/pci/drivers/vfio-pci/????:??:??.?/vendor\","), "{lang}: {learned}");
    assert!(learned.contains("\"bus/pci/devices/????:??:??.?\","), "{lang}: the pci attribute's grant: {learned}");
    for control in ["bind", "unbind", "new_id", "remove_id", "uevent"] {
        assert!(!learned.contains(&format!("/{control}\"")), "{lang}: {control} requested: {learned}");
    }
    assert!(
        !learned.contains("/*\"") && !learned.contains("/*/"),
        "{lang}: a bare * is wider than what was seen: {learned}"
    );
    let manifest = project.join("learned.toml");
    std::fs::write(&manifest, &learned).unwrap();
    let (code, out, err) = run_on_machine(
        &["discover", "--backend", wasm, "--manifest", manifest.to_str().unwrap()],
        &machine,
        &cache_dir(),
        &["--format", "json"],
    );
    assert_eq!(code, 0, "{lang}: discover with the learned manifest: {err}\n{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["refused"], serde_json::json!([]), "{lang}: {v}");
    let r = v["resources"].as_array().unwrap().iter().find(|r| r["name"] == "example.com/vfio").unwrap();
    let devices = r["devices"].as_array().unwrap();
    let ids: Vec<&str> = devices.iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["0000:3b:00.6", "0000:3b:00.7", "0000:3b:01.0", "0000:3b:01.1"],
        "{lang}: the VFs on vfio-pci: {r}"
    );
    for d in devices {
        assert!(d.to_string().contains("/dev/vfio/"), "{lang}: its group's node: {d}");
    }
}

/// Issue 62 (4): a JavaScript or Python backend whose `discover` raises where it should have
/// returned a `backend-error` traps; the trap's error, which is what the operator reads, names
/// the runtime's exception and where it was raised, as a real componentize-js / componentize-py
/// component prints them (not a model of their output). The project is rebuilt with a
/// `JSON.parse` / `int()` of bad text at the top of its `discover`.
fn an_uncaught_exception_is_in_the_traps_error(project: &Path, lang: &str) {
    let (file, anchor, inserted, build, exception) = match lang {
        "js" => (
            "backend.js",
            "  discover() {\n",
            "    JSON.parse(\"{ not json\");\n",
            "npm run build --silent",
            "SyntaxError: JSON.parse: expected property name or '}'",
        ),
        _ => (
            "src/app.py",
            "    def discover(self):\n",
            "        int(\"not a number\")\n",
            "componentize-py -d wit -w devplug-backend componentize app -p src -o demo.wasm >/dev/null",
            "ValueError: invalid literal for int() with base 10: 'not a number'",
        ),
    };
    let path = project.join(file);
    let source = std::fs::read_to_string(&path).unwrap();
    assert!(source.contains(anchor), "{lang}: the scaffold's discover: {anchor:?}");
    std::fs::write(&path, source.replacen(anchor, &format!("{anchor}{inserted}"), 1)).unwrap();
    project_cmd(project, build);
    let out = Command::new(support::binary::BIN)
        .args(["discover", "--backend", "demo.wasm", "--manifest", "devplug.toml", "--sysfs-root", "tests/fixture/sys"])
        .args(["--dev-root", "tests/fixture/dev", "--dev-fixtures"])
        .current_dir(project)
        .output()
        .unwrap();
    let (code, out, err) = (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_ne!(code, Some(0), "{lang}: a discover that raises fails: {out}");
    let trap = err.lines().find(|l| l.contains("trap")).unwrap_or_else(|| panic!("{lang}: no trap in: {err}"));
    assert!(trap.contains(exception), "{lang}: the exception is in the trap's error: {trap}");
    // componentize-js prints the stack from its bindings' frame of the export (it has no frame
    // of backend.js), so that is where the place can point; Python names the backend's line.
    let place = if lang == "js" { "$discover@" } else { "app.py\", line 27, in discover)" };
    assert!(trap.contains(place), "{lang}: and where it was raised: {trap}");
    std::fs::write(&path, source).unwrap();
    project_cmd(project, build);
}

#[test]
fn devplug_new_backend_projects_build_and_pass_their_own_tests() {
    let tmp = tempfile::tempdir().unwrap();
    for (lang, steps, wasm) in [
        (
            "rust",
            vec![
                "cargo test",
                "cargo build --release --target wasm32-wasip2",
                "cp \"$CARGO_TARGET_DIR/wasm32-wasip2/release/demo.wasm\" demo.wasm",
                "devplug discover --backend demo.wasm --sysfs-root tests/fixture/sys --dev-root tests/fixture/dev \
                 --dev-fixtures --format json > found.json",
            ],
            "demo.wasm",
        ),
        ("python", vec!["./test.sh"], "demo.wasm"),
        ("js", vec!["npm install --no-save --no-audit --no-fund --silent", "npm test"], "demo.wasm"),
    ] {
        let dir = tmp.path().join(lang);
        let (code, out, err) = run(&["new", "backend", "demo", "--lang", lang, "--dir", dir.to_str().unwrap()]);
        assert_eq!(code, 0, "{lang}: {err}");
        assert!(out.contains("created"), "{out}");
        for step in steps {
            project_cmd(&dir, step);
        }
        ship_and_serve(&dir, &dir.join(wasm), lang);
        claim_through_try(&dir, &dir.join(wasm), lang);
        learned_requests_serve_as_the_manifest(&dir, lang);
        if lang != "rust" {
            an_uncaught_exception_is_in_the_traps_error(&dir, lang);
        }
        if lang == "rust" {
            the_guides_ship_commands_work(&dir);
        }
    }
    let found: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("rust/found.json")).unwrap()).unwrap();
    let ids: Vec<&str> =
        found["resources"][0]["devices"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["demo0", "demo1"]);
    // A second `new` into an existing directory is refused, nothing overwritten.
    let (code, _, err) = run(&["new", "backend", "demo", "--dir", tmp.path().join("rust").to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("already exists"), "{err}");
}
