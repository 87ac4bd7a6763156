//! The `devplug` binary as operators and vendors use it: `run` waiting for kubelet and exiting
//! cleanly on SIGTERM, `discover` on fixtures and on this machine, `inspect`.

use devplug_test_support as support;

use std::time::Duration;

use support::binary::{Devplug, run, run_args};
use support::daemon::{WIDGET, chaos_dir, chaos_paths};
use support::fixtures::Machine;
use support::kubelet::Kubelet;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_kubelet_registers_when_it_appears_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kdir = dir.path().join("device-plugins");
    let (m, backends) = (Machine::generic_box(), chaos_dir());
    let cfg = dir.path().join("devplug.toml");
    std::fs::write(&cfg, "[backends.chaos]\nconfig = \"devices=3\"\n").unwrap();
    let s = |p: &std::path::Path| p.display().to_string();
    let mut args = run_args(&kdir, backends.path(), &m);
    args.extend(["--config", &s(&cfg), "--poll-interval", "200ms"].map(str::to_owned));
    let mut d = Devplug::spawn(&args);
    d.wait_log("waiting for kubelet", T).unwrap();
    assert!(kdir.join("devplug-test.devplug.io_widget.sock").exists(), "serving before kubelet is there");
    let kubelet = Kubelet::start(&kdir).await;
    kubelet.wait_registered(WIDGET, 1, T).await.unwrap();
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 3).await.unwrap();
    let spec_file = m.root().join("cdi/devplug-test.devplug.io_widget.json");
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&spec_file).unwrap()).unwrap();
    assert_eq!(
        (spec["kind"].as_str(), spec["devices"].as_array().map(Vec::len)),
        (Some("test.devplug.io/widget"), Some(3))
    );
    let status = tokio::task::spawn_blocking(move || {
        let st = d.terminate(T);
        (st, d.log())
    })
    .await
    .unwrap();
    let (st, log) = (status.0.unwrap(), status.1);
    assert!(st.success(), "exit status {st:?}; log:\n{log}");
    assert!(!kdir.join("devplug-test.devplug.io_widget.sock").exists(), "socket removed on SIGTERM");
    assert!(!spec_file.exists(), "CDI spec removed on SIGTERM");
    assert_eq!(log.matches("waiting for kubelet").count(), 1, "said once, not once per retry:\n{log}");
    // Issue 60: its own streams closing as it stops is not kubelet restarting.
    assert!(!log.contains("kubelet went away"), "a stop read as kubelet's restart:\n{log}");
}

#[test]
fn discover_prints_what_a_backend_sees_and_names_broken_files() {
    let m = Machine::generic_box();
    let (wasm, manifest) = chaos_paths();
    let bdir = tempfile::tempdir().unwrap();
    let chaos = bdir.path().join("chaos.wasm");
    std::fs::copy(&wasm, &chaos).unwrap();
    std::fs::copy(&manifest, bdir.path().join("chaos.toml")).unwrap();
    let (code, out, err) = run(&[
        "discover",
        "--backend",
        chaos.to_str().unwrap(),
        "--sysfs-root",
        m.sys().to_str().unwrap(),
        "--dev-root",
        m.dev().to_str().unwrap(),
        "--dev-fixtures",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["resources"][0]["name"], WIDGET);
    let ids: Vec<&str> =
        v["resources"][0]["devices"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["widget-0", "widget-1", "widget-2", "widget-3"]);
    assert_eq!(v["backends"][0]["wit_version"], "0.3.0");

    // `--no-embedded` as `run` takes it: with a config and no --backend, nothing embedded loads.
    let cdir = tempfile::tempdir().unwrap();
    let cfg = cdir.path().join("devplug.toml");
    std::fs::write(&cfg, "default_grant = \"requested\"\n").unwrap();
    let dev = m.dev();
    let base = ["discover", "--config", cfg.to_str().unwrap(), "--dev-root", dev.to_str().unwrap(), "--dev-fixtures"];
    let (code, out, err) = run(&[&base[..], &["--no-embedded", "--format", "json"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["backends"], serde_json::json!([]), "{v}");
    let (code, out, _) = run(&[&base[..], &["--format", "json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(code == 0 && v["backends"].as_array().unwrap().len() == 4, "without it the embedded four load: {v}");

    let junk = bdir.path().join("junk.wasm");
    std::fs::write(&junk, b"definitely not wasm").unwrap();
    let (code, out, err) = run(&["discover", "--backend", junk.to_str().unwrap(), "--format", "table"]);
    assert_eq!(code, 1);
    assert!(out.contains("junk.wasm") && out.contains("not a Wasm file"), "{out}\n{err}");
    // With `--log-format json` every line on stderr is a JSON record, the failure summary too
    // (issue 33: a collector must never meet a line it cannot parse).
    let (code, _, err) =
        run(&["--log-format", "json", "discover", "--backend", junk.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, 1);
    assert!(!err.trim().is_empty());
    for line in err.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["message"].is_string() || v["fields"].is_object(), "{line}");
    }
    assert!(err.contains("not a Wasm file"), "{err}");
    // Issue 41: a record that carries a backend's words names the backend in a field, not only
    // inside its message.
    let named = err
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["message"].as_str().is_some_and(|m| m.contains("not a Wasm file")))
        .unwrap_or_else(|| panic!("no record of the failure: {err}"));
    assert_eq!(named["backend"], "junk", "{named}");
}

#[test]
fn inspect_shows_version_exports_and_requested_capabilities() {
    let (wasm, manifest) = chaos_paths();
    let bdir = tempfile::tempdir().unwrap();
    let chaos = bdir.path().join("chaos.wasm");
    std::fs::copy(&wasm, &chaos).unwrap();
    std::fs::copy(&manifest, bdir.path().join("chaos.toml")).unwrap();
    let (code, out, err) = run(&["inspect", chaos.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["wit_version"], "0.3.0");
    assert_eq!(v["supported"], true);
    assert_eq!(v["exports"][0], "devplug:backend/backend@0.3.0");
    assert_eq!(v["exports"][1], "devplug:backend/dra@0.3.0");
    assert_eq!(v["size"].as_u64().unwrap(), std::fs::metadata(&chaos).unwrap().len());
    assert_eq!(v["manifest"]["requests"]["dev"][0], "null");
}

/// Issue 60: an embedded backend is inspected by its name (`devplug inspect nic` failed with
/// "No such file or directory", though docs/security.md says inspect shows its requests).
#[test]
fn an_embedded_backend_is_inspected_by_its_name() {
    let cwd = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(support::binary::BIN)
        .args(["inspect", "nic", "--format", "json"])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["file"].as_str(), v["manifest"]["name"].as_str()), (Some("embedded:nic"), Some("nic")), "{v}");
    assert!(v["manifest"]["requests"]["sysfs"].as_array().is_some_and(|a| !a.is_empty()), "{v}");
    let (code, _, err) = run(&["inspect", "nothing-here"]);
    assert_ne!(code, 0);
    assert!(err.contains("an embedded backend is inspected by its name: ") && err.contains("nic"), "{err}");
}

/// Issue 52 (5): a request the host never grants (`env = ["QAT*"]`: a grant takes `KEY`,
/// `VENDOR_*` or `STEM#`) passed `inspect` with no warning and `discover` with exit 0, and was
/// refused at the first Allocate. Both warn now, naming what to write; `discover --strict`
/// fails on it.
#[test]
fn requests_no_grant_can_hold_are_warned_about_and_fail_discover_strict() {
    let (wasm, manifest) = chaos_paths();
    let bdir = tempfile::tempdir().unwrap();
    let chaos = bdir.path().join("chaos.wasm");
    std::fs::copy(&wasm, &chaos).unwrap();
    let text =
        std::fs::read_to_string(&manifest).unwrap().replace("env = [\"CHAOS_*\"]", "env = [\"CHAOS_*\", \"QAT*\"]");
    assert!(text.contains("\"QAT*\""), "the chaos manifest's env line moved: {text}");
    std::fs::write(bdir.path().join("chaos.toml"), &text).unwrap();
    let (code, out, err) = run(&["inspect", chaos.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let warnings = v["warnings"].to_string();
    assert!(warnings.contains("QAT*") && warnings.contains("QAT#"), "{v}");
    let m = support::fixtures::Machine::generic_box();
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache");
    let (code, _, err) = support::binary::discover_backend(&chaos, &m, &cache);
    assert_eq!(code, 0, "a warning, not a failure: {err}");
    assert!(err.contains("backend chaos's manifest") && err.contains("QAT#"), "{err}");
    let mut strict = vec!["discover", "--strict", "--backend", chaos.to_str().unwrap()];
    let (sys, dev) = (m.sys().display().to_string(), m.dev().display().to_string());
    let cache = cache.display().to_string();
    strict.extend(["--sysfs-root", &sys, "--dev-root", &dev, "--dev-fixtures", "--cache-dir", &cache]);
    let (code, _, err) = run(&strict);
    assert_ne!(code, 0, "--strict fails on it: {err}");
    assert!(err.contains("failing as --strict asks"), "{err}");
}

/// Issue 50 (1): `try`'s stand-ins start with errors, not panics: a kubelet dir it cannot
/// create is said as such, with a non-zero exit and no panic.
#[test]
fn try_says_why_its_local_kubelet_cannot_start() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let under_a_file = file.path().join("kubelet");
    let (code, _, err) = run(&["try", "--no-embedded", "--kubelet-dir", under_a_file.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("start the local kubelet: create the kubelet dir"), "{err}");
}

#[test]
fn discover_on_this_machine_lists_what_is_really_there() {
    let (code, out, err) = run(&["discover", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let count = |name: &str| {
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| r["devices"].as_array().unwrap().len())
    };
    // The embedded generic backend shares each node 16 ways when it exists, and lists nothing
    // when it does not: assert exactly what this machine has.
    use std::os::unix::fs::FileTypeExt;
    let is_char = |p: &str| std::fs::metadata(p).map(|m| m.file_type().is_char_device()).unwrap_or(false);
    for node in ["/dev/kvm", "/dev/net/tun", "/dev/fuse"] {
        if !is_char(node) {
            eprintln!("no {node} on this machine: this test only checks that devplug lists none");
        }
    }
    assert_eq!(count("devplug.io/kvm"), Some(if is_char("/dev/kvm") { 16 } else { 0 }));
    assert_eq!(count("devplug.io/tun"), Some(if is_char("/dev/net/tun") { 16 } else { 0 }));
    assert_eq!(count("devplug.io/fuse"), Some(if is_char("/dev/fuse") { 16 } else { 0 }));
}

#[test]
fn discover_on_this_machine_finds_its_real_pci_nics() {
    // Every NIC pool is opt-in (handing the node's own uplink to a pod by default would be a
    // bad surprise), so ask for all network functions and compare with what sysfs says.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("devplug.toml");
    std::fs::write(
        &cfg,
        "[backends.nic]\nconfig = '''\n[[pool]]\nname = \"devplug.io/nic\"\nfunctions = \"any\"\n'''\n",
    )
    .unwrap();
    let (code, out, err) = run(&["discover", "--config", cfg.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["errors"], serde_json::json!([]), "{out}");
    let nics = v["resources"].as_array().unwrap().iter().find(|r| r["name"] == "devplug.io/nic").cloned();
    let listed: Vec<(String, String)> = nics
        .iter()
        .flat_map(|r| r["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| (d["id"].as_str().unwrap().to_owned(), d["attributes"]["netdev"].as_str().unwrap_or("").to_owned()))
        .collect();
    // What the kernel says: interfaces whose device path runs through a PCI function of class 02.
    let mut expected = Vec::new();
    for e in std::fs::read_dir("/sys/class/net").unwrap().flatten() {
        let Ok(real) = std::fs::canonicalize(e.path()) else { continue };
        let pci =
            real.to_string_lossy().split('/').rfind(|p| p.len() == 12 && p.as_bytes()[4] == b':').map(str::to_owned);
        if let Some(addr) = pci {
            let class = std::fs::read_to_string(format!("/sys/bus/pci/devices/{addr}/class")).unwrap_or_default();
            if class.trim().starts_with("0x02") {
                expected.push((addr, e.file_name().to_string_lossy().into_owned()));
            }
        }
    }
    expected.sort();
    if expected.is_empty() {
        eprintln!("no PCI NIC on this machine: this test only checks that devplug lists none");
    }
    let mut listed = listed;
    listed.sort();
    assert_eq!(listed, expected, "devplug's NICs vs /sys/class/net");
}

/// Every `devplug …` line in the README's and the docs' shell blocks is a command this binary
/// accepts (subcommand and flags), so the documentation cannot drift from the CLI.
/// `devplug discover | head`: the reader leaves early; the command ends without a panic.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    let m = Machine::generic_box();
    // A pipe whose reader is gone before the command writes anything: every write fails.
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(support::binary::BIN)
        .args(["discover", "--format", "json", "--dev-fixtures"])
        .arg("--sysfs-root")
        .arg(m.sys())
        .arg("--dev-root")
        .arg(m.dev())
        .arg("--proc-root")
        .arg(m.root().join("proc"))
        .stdout(std::process::Stdio::from(writer))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(13), "ended by SIGPIPE, as `ls | head` does: {:?} {err}", out.status);
}

#[test]
fn every_documented_command_line_parses() {
    use clap::Parser;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut docs = vec![root.join("README.md")];
    docs.extend(std::fs::read_dir(root.join("docs")).unwrap().flatten().map(|e| e.path()));
    let mut checked = 0;
    for doc in docs.iter().filter(|p| p.extension().is_some_and(|e| e == "md")) {
        let text = std::fs::read_to_string(doc).unwrap();
        let mut in_sh = false;
        let mut joined = String::new();
        for line in text.lines() {
            if line.starts_with("```") {
                in_sh = line.trim() == "```sh" && !in_sh;
                continue;
            }
            if !in_sh {
                continue;
            }
            joined.push_str(line.trim_end_matches('\\'));
            if line.ends_with('\\') {
                continue;
            }
            let cmd = std::mem::take(&mut joined);
            let cmd = cmd.split(" # ").next().unwrap().trim();
            if !cmd.starts_with("devplug ") {
                continue;
            }
            let words: Vec<String> =
                cmd.replace('…', "x").replace("rust|python|js", "rust").split_whitespace().map(str::to_owned).collect();
            if let Err(e) = devplug::cli::Cli::try_parse_from(&words) {
                panic!("{}: `{cmd}` is not a valid devplug command:\n{e}", doc.display());
            }
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} documented commands found");
}

/// `devplug try` (issue 28): devplug against a local kubelet, driven on stdin as a person would.
/// A backend registers, its devices print, `allocate RESOURCE 1` prints the container edits the
/// backend and the host decided, an unknown ID is refused with kubelet's error, `quit` ends it.
#[test]
fn try_serves_a_local_kubelet_and_allocates_on_command() {
    let m = Machine::generic_box();
    // `--backends`, the spelling up to 0.2.0 (`--backends-dir` now), still works.
    let (_dir, mut t) = support::binary::try_chaos(&m, "--backends", &[]);
    t.wait_for("registered test.devplug.io/widget (preferred allocation: yes, pre-start: yes)");
    t.wait_for("test.devplug.io/widget: 4 devices, 4 healthy: widget-0 widget-1 widget-2 widget-3");
    t.send("allocate test.devplug.io/widget 1");
    let printed = t.wait_for("\"resource\": \"test.devplug.io/widget\"").join("\n");
    assert!(printed.contains("\"CHAOS_IDS\": \"widget-"), "{printed}");
    assert!(printed.contains("\"container_path\": \"/dev/null\""), "{printed}");
    t.send("allocate test.devplug.io/widget nosuch");
    let lines = t.wait_for("allocate failed");
    assert!(lines.last().unwrap().contains("unknown device IDs: nosuch"), "{lines:?}");
    t.quit();
}

/// Issue 42: the vendor guide's `try` as the kubelet of a running `run`, its two commands as
/// written (paths and the backend swapped for the test's): the `run` registers with `try`'s
/// kubelet, and `try` allocates its devices.
#[test]
fn try_is_the_kubelet_of_a_running_devplug_as_the_guide_says() {
    let m = Machine::generic_box();
    let work = tempfile::tempdir().unwrap();
    let (try_line, run_line) =
        support::guide::try_and_run("### `try` as the kubelet of a running devplug", work.path(), &m, &[]);
    let try_args: Vec<&str> = try_line.split_whitespace().skip(1).collect();
    assert_eq!(try_args[0], "try");
    let mut t = support::binary::Interactive::spawn(&try_args);
    t.wait_for("local kubelet at");
    let run_args: Vec<&str> = run_line.split_whitespace().skip(1).collect();
    assert_eq!(run_args[0], "run");
    let mut d = support::binary::Devplug::spawn(&run_args);
    t.wait_for("registered test.devplug.io/widget");
    t.wait_for("test.devplug.io/widget: 4 devices, 4 healthy");
    t.send("allocate test.devplug.io/widget 1");
    let printed = t.wait_for("\"resource\": \"test.devplug.io/widget\"").join("\n");
    assert!(printed.contains("\"CHAOS_IDS\": \"widget-"), "{printed}");
    t.quit();
    assert!(d.terminate(std::time::Duration::from_secs(30)).is_ok());
    let (code, _, err) = run(&["run", "--kubelet-only"]);
    assert!(code != 0 && err.contains("is for `devplug try`"), "{err}");
}

/// `devplug config --defaults` prints the config reference, and docs/config.md is that same
/// text (issue 28): `DEVPLUG_BLESS=1 cargo test --test cli` rewrites the page after the
/// reference changes.
#[test]
fn the_config_reference_command_and_page_agree() {
    let (code, out, err) = run(&["config", "--defaults"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, devplug::config::REFERENCE);
    let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.md");
    let want = devplug::config::reference_page();
    if std::env::var_os("DEVPLUG_BLESS").is_some() {
        std::fs::write(&page, &want).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&page).unwrap_or_default(),
        want,
        "docs/config.md is stale (DEVPLUG_BLESS=1 to rewrite)"
    );
}

/// The Python/JavaScript API page documents the WIT version `devplug new` builds against, not an
/// older one (issue 28): the scaffolded JS backend's imports and the page name the same version.
#[test]
fn the_language_api_page_names_the_version_new_backends_use() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let page = std::fs::read_to_string(repo.join("docs/api-python-js.md")).unwrap();
    let js = std::fs::read_to_string(repo.join("host/templates/js/backend.js")).unwrap();
    let newest = devplug::cli::scaffold::wit_version(devplug::cli::scaffold::Lang::Js);
    assert!(devplug::runtime::bindings::SUPPORTED.contains(&newest), "{newest} is not loaded");
    assert!(js.contains(&format!("@{newest}\"")), "the JS template imports another version than {newest}");
    assert!(page.contains(&format!("`devplug:backend@{newest}`")), "docs/api-python-js.md does not name {newest}");
    assert!(!page.contains("devplug:backend/sysfs@0.1.0"), "the page still shows 0.1.0 imports");
    for call in ["read_many", "readMany", "procfs.read"] {
        assert!(page.contains(call), "the page does not show {call}");
    }
}

/// Issue 41: two backends' resources handing out the same device node (a vendor's backend and
/// devplug's own serving one GPU's render node) was only an ERROR about a lost resource name.
/// Issue 49: the backend whose first discover finished first kept the node, so a small hostile
/// backend won the race. Now a contested node is refused to both sides whatever the order (the
/// backends run here in both name orders), `discover` names both resources and the node, says
/// what to do, and exits non-zero; nodes every side declares shared (`shared-node`) pass.
#[test]
fn a_node_two_backends_hand_out_is_refused_to_both_whatever_loads_first() {
    let m = Machine::generic_box();
    m.node("zero", 'c', 1, 5).node("full", 'c', 1, 7);
    let (wasm, manifest) = chaos_paths();
    let text = std::fs::read_to_string(manifest)
        .unwrap()
        .replace("name = \"chaos\"\n", "")
        .replace("dev = [\"null\", \"zero\"]", "dev = [\"null\", \"zero\", \"full\"]");
    for hostile_first in [false, true] {
        let (legit, hostile) = ("legit", "hostile");
        let order = if hostile_first { [hostile, legit] } else { [legit, hostile] };
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, config: &str| {
            std::fs::copy(&wasm, dir.path().join(format!("{name}.wasm"))).unwrap();
            std::fs::write(dir.path().join(format!("{name}.toml")), format!("config = \"{config}\"\n{text}")).unwrap();
        };
        // The legitimate backend's widget-1 is /dev/zero; the hostile one names it too.
        write(legit, "resource=legit.devplug.io/gpu devices=3 nodes=full,zero,null exclusive");
        write(hostile, "resource=hostile.devplug.io/gpu devices=2 names=own,taken nodes=null,zero");
        let s = |p: &std::path::Path| p.display().to_string();
        let root = m.root();
        let args = [
            "discover".to_owned(),
            "--no-embedded".into(),
            "--backend".into(),
            s(&dir.path().join(format!("{}.wasm", order[0]))),
            "--backend".into(),
            s(&dir.path().join(format!("{}.wasm", order[1]))),
            "--sysfs-root".into(),
            s(&root.join("sys")),
            "--dev-root".into(),
            s(&root.join("dev")),
            "--dev-fixtures".into(),
            "--format".into(),
            "json".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = run(&args);
        assert_ne!(code, 0, "a conflict fails discover:\n{out}\n{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
        let ids = |r: &str| -> Vec<String> {
            v["resources"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|x| x["name"] == r)
                .flat_map(|x| x["devices"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().to_owned()))
                .collect()
        };
        // /dev/zero and /dev/null (shared by the hostile side, not by the legitimate one) are
        // contested: only the legitimate /dev/full device is left, on either order.
        assert_eq!(ids("legit.devplug.io/gpu"), ["widget-0"], "{} first: {out}", order[0]);
        assert!(ids("hostile.devplug.io/gpu").is_empty(), "{out}");
        assert!(
            err.contains("/dev/zero") && err.contains("legit.devplug.io/gpu") && err.contains("hostile.devplug.io/gpu"),
            "{err}"
        );
        assert!(err.contains("owns = [") && err.contains("shared-node"), "says what to do: {err}");
    }
}

/// Issue 58 (1): udev makes `/dev/char/195:0` for `/dev/nvidia0`. A backend granted
/// `char/*` named it as its device's node and handed the embedded gpu backend's GPU to a second
/// container, with nothing logged: ownership compared path strings. On a copy of the DGX
/// fixture with that alias, the second name is contested exactly as the first: the GPU and the
/// alias device are both refused, and the error names both resources, both names and the node's
/// numbers.
#[test]
fn a_second_name_of_a_gpus_node_is_the_same_node() {
    let m = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/dgx-h100");
    let st = std::process::Command::new("cp").arg("-a").arg(&fixture).arg(m.path().join("dgx")).status().unwrap();
    assert!(st.success());
    let root = m.path().join("dgx");
    std::fs::create_dir_all(root.join("dev/char")).unwrap();
    std::fs::write(root.join("dev/char/195:0"), "c 195:0\n").unwrap();
    let (wasm, manifest) = chaos_paths();
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(manifest)
        .unwrap()
        .replace("name = \"chaos\"\n", "")
        .replace("dev = [\"null\", \"zero\"]", "dev = [\"null\", \"zero\", \"nvidia*\", \"char/*\"]");
    std::fs::copy(&wasm, dir.path().join("alias.wasm")).unwrap();
    std::fs::write(
        dir.path().join("alias.toml"),
        format!("config = \"resource=alias.devplug.io/gpu devices=1 nodes=char/195:0 exclusive\"\n{text}"),
    )
    .unwrap();
    let cache = m.path().join("cache");
    let backend = dir.path().join("alias.wasm").display().to_string();
    let (code, out, err) = support::binary::run_on_machine(
        &["discover", "--embedded", "--backend", &backend, "--format", "json"],
        &root,
        &cache,
        &[],
    );
    assert_ne!(code, 0, "a contested node fails discover:\n{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let devices = |r: &str| -> usize {
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["name"] == r)
            .map(|x| x["devices"].as_array().unwrap().len())
            .sum()
    };
    assert_eq!(devices("nvidia.com/gpu"), 7, "the GPU behind /dev/nvidia0 is refused, the other 7 serve: {out}");
    assert_eq!(devices("alias.devplug.io/gpu"), 0, "{out}");
    for want in ["/dev/char/195:0", "/dev/nvidia0", "char 195:0", "nvidia.com/gpu", "alias.devplug.io/gpu"] {
        assert!(err.contains(want), "{want} not named:\n{err}");
    }
}

/// Issue 49: the generic backend served one path under two of its resources (`alpha`, `beta`
/// both `/dev/kvm`) with no error. `discover` with such a config now fails, naming both
/// resources and the node; declared shared on both, they serve.
#[test]
fn the_generic_backend_refuses_one_path_under_two_resources() {
    let m = Machine::generic_box();
    let dir = tempfile::tempdir().unwrap();
    let two = "[[resource]]\nname = \"x.io/alpha\"\npaths = [\"kvm\"]\n[[resource]]\nname = \"x.io/beta\"\npaths = [\"kvm\"]\n";
    let discover = |generic: &str| {
        let cfg = dir.path().join("devplug.toml");
        std::fs::write(&cfg, format!("[backends.generic]\nconfig = '''\n{generic}'''\n")).unwrap();
        let s = |p: std::path::PathBuf| p.display().to_string();
        let args = [
            "discover".to_owned(),
            "--config".into(),
            s(cfg),
            "--sysfs-root".into(),
            s(m.root().join("sys")),
            "--dev-root".into(),
            s(m.root().join("dev")),
            "--dev-fixtures".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args)
    };
    let (code, out, err) = discover(two);
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(err.contains("x.io/alpha") && err.contains("x.io/beta") && err.contains("/dev/kvm"), "{err}");
    let (code, out, err) = discover(&two.replace("paths = [\"kvm\"]\n", "paths = [\"kvm\"]\nshared = true\n"));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("x.io/alpha") && out.contains("x.io/beta"), "{out}");
}

/// Issue 42: `devplug allocate` needed `--resource` even when the device IDs name the
/// resource; the one resource whose devices they are is taken, and IDs of two resources still
/// ask for it.
#[test]
fn allocate_finds_the_resource_its_ids_name() {
    let m = Machine::generic_box();
    let root = m.root();
    let s = |p: std::path::PathBuf| p.display().to_string();
    let base = [
        "allocate".to_owned(),
        "--dev-root".into(),
        s(root.join("dev")),
        "--sysfs-root".into(),
        s(root.join("sys")),
        "--dev-fixtures".into(),
    ];
    let args =
        |ids: &[&str]| -> Vec<String> { base.iter().cloned().chain(ids.iter().map(|i| (*i).to_owned())).collect() };
    let one = args(&["kvm-0"]);
    let (code, out, err) = run(&one.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["resource"], "devplug.io/kvm", "{v}");
    assert_eq!(v["devices"][0]["container_path"], "/dev/kvm", "{v}");
    let two = args(&["kvm-0", "fuse-0"]);
    let (code, _, err) = run(&two.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ne!(code, 0);
    assert!(err.contains("--resource"), "{err}");
}

/// Issue 42: `try --help` named neither `claim` nor `unprepare`; every stdin command is listed.
#[test]
fn try_help_lists_every_command() {
    let (code, out, err) = run(&["try", "--help"]);
    assert_eq!(code, 0, "{err}");
    for command in [
        "allocate",
        "list",
        "quit",
        "slices",
        "claim FILE",
        "claim DRIVER DEVICE",
        "unprepare CLAIM",
        "--node-name",
        "--dra",
    ] {
        assert!(out.contains(command), "{command} missing from try --help:\n{out}");
    }
}

/// Issue 43: flags are held to the config's rules: a poll interval the file could not set, or
/// `--dra` for a resource the file keeps without CDI, is refused before anything starts, naming
/// the rule.
#[test]
fn flags_are_validated_as_the_config_is() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = dir.path().join("kubelet");
    let k = kubelet.to_str().unwrap();
    let (code, _, err) = support::binary::run(&["run", "--kubelet-dir", k, "--poll-interval", "10ms"]);
    assert_ne!(code, 0);
    assert!(err.contains("poll_interval must be at least 100ms") && err.contains("flags"), "{err}");
    let cfg = dir.path().join("devplug.toml");
    std::fs::write(&cfg, "write_cdi = false\nallocate = [\"device-specs\"]\n").unwrap();
    let c = cfg.to_str().unwrap();
    let (code, _, err) = support::binary::run(&["run", "--config", c, "--kubelet-dir", k, "--dra", "devplug.io/kvm"]);
    assert_ne!(code, 0);
    assert!(err.contains("api = \"dra\"") && err.contains("write_cdi"), "{err}");
    assert!(!kubelet.join("devplug.sock").exists() && std::fs::read_dir(&kubelet).map_or(true, |d| d.count() == 0));
}

/// A backends dir holding chaos as `name` with `config`, its manifest's `dev` request widened by
/// `dev`.
fn chaos_as(name: &str, config: &str, dev: &str) -> tempfile::TempDir {
    let (wasm, manifest) = chaos_paths();
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(manifest)
        .unwrap()
        .replace("name = \"chaos\"\n", "")
        .replace("dev = [\"null\", \"zero\"]", &format!("dev = [\"null\", \"zero\", {dev}]"));
    std::fs::copy(&wasm, dir.path().join(format!("{name}.wasm"))).unwrap();
    std::fs::write(dir.path().join(format!("{name}.toml")), format!("config = \"{config}\"\n{text}")).unwrap();
    dir
}

/// The nic backend's pools for an EC2 p5: the EFAs (RDMA-capable, Amazon) and the ENA.
const P5_NIC_POOLS: &str = r#"
default_grant = "requested"
[backends.nic]
config = '''
[[pool]]
name = "devplug.io/efa"
vendors = ["1d0f"]
rdma = true
functions = "any"

[[pool]]
name = "devplug.io/ena"
vendors = ["1d0f"]
functions = "any"
'''
"#;

/// Issue 60 (1, 2): a vendor's EFA backend (a Rust backend, chaos standing in) beside the
/// embedded nic backend pooling the same EFAs on a p5 fixture. Undecided, the 32 contested
/// `uverbs` nodes are one message (not 32 ERRORs, 32 discover lines), naming the one config line
/// that settles it, unclipped; both sides' devices naming them are withheld and discover fails.
/// With that line, the vendor's resource serves all 32, only the nic backend's EFA pool loses
/// them: its ENA pool, the gpu backend's GPUs and both grants are untouched, and discover passes.
#[test]
fn two_backends_on_one_node_are_settled_by_one_owns_line() {
    let m = tempfile::tempdir().unwrap();
    let root = m.path().join("p5");
    support::hardware::build_p5_efa(&root);
    let nodes: Vec<String> = (0..32).map(|n| format!("infiniband/uverbs{n}")).collect();
    let names: Vec<String> = (0..32).map(|n| format!("efa-{n}")).collect();
    let vendor = chaos_as(
        "efa",
        &format!(
            "resource=efa.devplug.io/efa devices=32 names={} nodes={} exclusive",
            names.join(","),
            nodes.join(",")
        ),
        "\"infiniband/uverbs*\"",
    );
    let backend = vendor.path().join("efa.wasm").display().to_string();
    let discover = |config: &str| {
        let file = m.path().join("devplug.toml");
        std::fs::write(&file, config).unwrap();
        let file = file.display().to_string();
        let (code, out, err) = support::binary::run_on_machine(
            &["discover", "--embedded", "--backend", &backend, "--config", &file, "--format", "json"],
            &root,
            &m.path().join("cache"),
            &[],
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
        (code, v, err)
    };
    let count = |v: &serde_json::Value, r: &str| -> usize {
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["name"] == r)
            .map(|x| x["devices"].as_array().unwrap().len())
            .sum()
    };

    let (code, v, err) = discover(P5_NIC_POOLS);
    assert_ne!(code, 0, "an undecided contest fails discover:\n{err}");
    // One ERROR in the log and one line in discover's report, for 32 nodes.
    let told: Vec<&str> = err.lines().filter(|l| l.contains("both hand out") && l.starts_with("devplug: ")).collect();
    let logged = err.lines().filter(|l| l.contains("both hand out") && l.contains(" ERROR ")).count();
    assert_eq!((told.len(), logged), (1, 1), "one contest, one message:\n{err}");
    let remedy = r#"owns = ["infiniband/uverbs*"] under [resources."efa.devplug.io/efa"]"#;
    assert!(
        told[0].contains(remedy) && told[0].contains("32 device nodes") && told[0].contains("64 devices withheld"),
        "{}",
        told[0]
    );
    assert!(!told[0].contains("sha256"), "the message is whole: {}", told[0]);
    assert_eq!((count(&v, "efa.devplug.io/efa"), count(&v, "devplug.io/efa")), (0, 0), "{v}");
    assert_eq!((count(&v, "devplug.io/ena"), count(&v, "nvidia.com/gpu")), (1, 8));
    assert_eq!(v["contests"].as_array().map(Vec::len), Some(1), "{}", v["contests"]);

    // The one line, under the vendor's resource.
    let (code, v, err) = discover(&format!(
        "{P5_NIC_POOLS}\n[resources.\"efa.devplug.io/efa\"]\n{}\n",
        &remedy[..remedy.find(" under").unwrap()]
    ));
    assert_eq!(code, 0, "a decided contest is no failure:\n{err}");
    assert_eq!((count(&v, "efa.devplug.io/efa"), count(&v, "devplug.io/efa")), (32, 0), "{v}");
    assert_eq!((count(&v, "devplug.io/ena"), count(&v, "nvidia.com/gpu")), (1, 8));
    assert_eq!(v["contests"][0]["owner"], "efa.devplug.io/efa");
    assert_eq!(v["contests"][0]["withheld"], 32);
    assert!(!err.contains("both hand out"), "{err}");

    // The other way round: the nic backend's pool keeps them, each EFA judged by its RDMA port
    // (ACTIVE, as the efa driver reports it) rather than by a netdev it does not have.
    let (code, v, err) =
        discover(&format!("{P5_NIC_POOLS}\n[resources.\"devplug.io/efa\"]\nowns = [\"infiniband/uverbs*\"]\n"));
    assert_eq!(code, 0, "{err}");
    assert_eq!((count(&v, "efa.devplug.io/efa"), count(&v, "devplug.io/efa")), (0, 32), "{v}");
    let efas: Vec<&serde_json::Value> = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["name"] == "devplug.io/efa")
        .flat_map(|x| x["devices"].as_array().unwrap())
        .collect();
    assert!(
        efas.iter().all(
            |d| d["health"] == "Healthy" && d["attributes"]["rdma"].as_str().is_some_and(|r| r.starts_with("efa_"))
        ),
        "{efas:?}"
    );

    // A pattern that is not a grant-style glob is refused with the key and the form to use.
    let (code, _, err) = run_on_config(&m, "[resources.\"devplug.io/efa\"]\nowns = [\"/dev/infiniband/*\"]\n");
    assert_ne!(code, 0);
    assert!(err.contains("resources.\"devplug.io/efa\".owns") && err.contains("grant.dev does"), "{err}");
}

/// `devplug config --check`-like: `discover --no-embedded` with `config` as the config file.
fn run_on_config(m: &tempfile::TempDir, config: &str) -> (i32, String, String) {
    let file = m.path().join("bad.toml");
    std::fs::write(&file, config).unwrap();
    run(&["discover", "--no-embedded", "--config", &file.display().to_string()])
}

/// Issue 60 (4): a function with an RDMA device and no netdev (an InfiniBand HCA without IPoIB)
/// was Healthy whatever its port said. Now its ports' state decides, as the IB core prints it:
/// ACTIVE serves; INIT (no subnet manager) and DOWN (no cable) are Unhealthy with the reason.
#[test]
fn rdma_only_functions_are_judged_by_their_port_state() {
    let m = tempfile::tempdir().unwrap();
    let root = m.path().join("ib");
    support::hardware::build_ib_hcas(&root);
    let file = m.path().join("devplug.toml");
    std::fs::write(
        &file,
        "[backends.nic]\nconfig = '''\n[[pool]]\nname = \"devplug.io/ib\"\nfunctions = \"any\"\n'''\n",
    )
    .unwrap();
    let file = file.display().to_string();
    let (code, out, err) = support::binary::run_on_machine(
        &["discover", "--embedded", "--config", &file, "--format", "json"],
        &root,
        &m.path().join("cache"),
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let devices: Vec<(String, String, String)> = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["name"] == "devplug.io/ib")
        .flat_map(|x| x["devices"].as_array().unwrap())
        .map(|d| {
            let s = |x: &serde_json::Value| x.as_str().unwrap_or_default().to_owned();
            (s(&d["attributes"]["rdma"]), s(&d["health"]), s(&d["attributes"]["unhealthy"]))
        })
        .collect();
    assert_eq!(
        devices,
        [
            ("mlx5_0".to_owned(), "Healthy".to_owned(), String::new()),
            ("mlx5_1".to_owned(), "Unhealthy".to_owned(), "RDMA port 1 of mlx5_1 is 2: INIT".to_owned()),
            ("mlx5_2".to_owned(), "Unhealthy".to_owned(), "RDMA port 1 of mlx5_2 is 1: DOWN".to_owned()),
        ],
        "{out}"
    );
}

/// Issue 63 (3): the node name is checked once, with one message, whichever command asks: `dra
/// slices` and `try --dra` refuse a name the API server would refuse for a Node, saying what to
/// set, before doing anything else.
#[test]
fn every_command_refuses_a_bad_node_name_in_the_same_words() {
    let want = r#"node name "Not_A_Node" is not a DNS subdomain"#;
    let (code, _, err) = run(&["dra", "slices", "--no-embedded", "--node-name", "Not_A_Node"]);
    assert!(code != 0 && err.contains(want) && err.contains("set NODE_NAME or --node-name"), "{err}");
    let (code, _, err) = run(&["try", "--no-embedded", "--dra", "x.io/y", "--node-name", "Not_A_Node"]);
    assert!(code != 0 && err.contains(want) && err.contains("set NODE_NAME or --node-name"), "{err}");
}
