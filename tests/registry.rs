//! Backends from a real OCI registry (Debian's `docker-registry`, distribution 2.8, on
//! 127.0.0.1): `devplug push`/`pull`/`sign` cross-checked with skopeo and openssl, and `devplug
//! run` following a tag under Allocate load, refusing what fails or does not verify, serving
//! from its cache with the registry down, and pulling through basic auth. A deliberately
//! hostile registry (`support::hostile_registry`) tries to flood a pull.

use devplug_test_support as support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use base64::Engine;

use support::binary::{BIN, Devplug, run_args};
use support::daemon::{WIDGET, chaos_build, chaos_manifest};
use support::fixtures::Machine;
use support::kubelet::Kubelet;
use support::load::{alloc, start_load};
use support::registry::{Registry, openssl_keypair};

const T: Duration = Duration::from_secs(30);

/// Write version `k` of the chaos backend (mode `mode`) as `dir/chaos.wasm` + `dir/chaos.toml`.
fn version(dir: &Path, k: u32, mode: &str) -> PathBuf {
    let v = dir.join(format!("v{k}-{mode}"));
    std::fs::create_dir_all(&v).unwrap();
    std::fs::write(v.join("chaos.wasm"), chaos_build(k)).unwrap();
    std::fs::write(v.join("chaos.toml"), chaos_manifest(k, mode)).unwrap();
    v.join("chaos.wasm")
}

/// `devplug ARGS`: (success, stdout JSON or null, stderr).
fn devplug(args: &[&str]) -> (bool, serde_json::Value, String) {
    let out = Command::new(BIN).args(args).env("RUST_LOG", "warn").output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.success(), json, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn push(reg: &Registry, reference: &str, wasm: &Path, extra: &[&str]) -> String {
    let mut args = vec!["push", reference, wasm.to_str().unwrap(), "--plain-http", &reg.addr];
    args.extend(extra);
    let (ok, v, err) = devplug(&args);
    assert!(ok, "push {reference}: {err}");
    v["digest"].as_str().unwrap().to_owned()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn skopeo(args: &[&str]) -> std::process::Output {
    Command::new("skopeo").args(args).output().expect("skopeo (scripts/test installs it)")
}

#[test]
fn push_pull_sign_agree_with_skopeo_and_openssl_and_bad_artifacts_are_refused() {
    let reg = Registry::start(false);
    let work = tempfile::tempdir().unwrap();
    let (key, pubkey) = openssl_keypair(work.path(), "ops");
    let (_, other_pub) = openssl_keypair(work.path(), "other");
    let r1 = reg.reference("chaos", "1.0.1");
    let d1 = push(&reg, &r1, &version(work.path(), 1, "ok"), &[]);
    // Issue 52: the same component and manifest push to the same digest (the config's
    // `created` was the push time, so every push moved the tag and every node swapped).
    assert_eq!(push(&reg, &r1, &version(work.path(), 1, "ok"), &[]), d1, "a re-push moves nothing");
    // Pushing a backend into a repository named for another is allowed, and said (issue 28).
    let other = reg.reference("gpu", "1");
    let wasm = version(work.path(), 1, "ok");
    let (ok, v, err) = devplug(&["push", &other, wasm.to_str().unwrap(), "--plain-http", &reg.addr]);
    assert!(ok, "{err}");
    // Issue 52: an unsigned push says what nodes with a public key will do with it.
    let hint = v["hint"].as_str().unwrap_or_default();
    assert!(hint.contains("pushed unsigned") && hint.contains("devplug sign"), "{v}");
    let warning = v["warning"].as_str().unwrap_or_else(|| panic!("no warning: {v}"));
    assert!(warning.contains("[backends.chaos]") && warning.contains("[backends.gpu] would refuse it"), "{warning}");
    assert!(err.contains("pushing backend \"chaos\" into repository"), "{err}");

    // skopeo (containers/image) sees the same manifest, in the Wasm OCI artifact layout.
    let out = skopeo(&["inspect", "--raw", "--tls-verify=false", &format!("docker://{r1}")]);
    assert!(out.status.success(), "skopeo: {}", String::from_utf8_lossy(&out.stderr));
    let raw = out.stdout;
    assert_eq!(format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&raw))), d1);
    let m: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(m["config"]["mediaType"], "application/vnd.wasm.config.v0+json");
    assert_eq!(m["layers"][0]["mediaType"], "application/wasm");
    let toml = base64::engine::general_purpose::STANDARD
        .decode(m["annotations"]["io.devplug.backend.manifest"].as_str().unwrap())
        .unwrap();
    assert!(String::from_utf8(toml).unwrap().contains("version=1.0.1"));

    // `devplug discover --config` pulls what the config names, as `run` would, and shows it.
    let m = Machine::generic_box();
    let cfg = work.path().join("discover.toml");
    std::fs::write(
        &cfg,
        format!(
            "default_grant = \"requested\"\n[backends.chaos]\nimage = \"{r1}\"\n[registry]\nplain_http = [\"{}\"]\n",
            reg.addr
        ),
    )
    .unwrap();
    let root = m.root().display().to_string();
    let (ok, v, err) = devplug(&[
        "discover",
        "--config",
        cfg.to_str().unwrap(),
        "--sysfs-root",
        &format!("{root}/sys"),
        "--dev-root",
        &format!("{root}/dev"),
        "--dev-fixtures",
        "--format",
        "json",
    ]);
    assert!(ok, "{err}");
    let widget =
        v["resources"].as_array().unwrap().iter().find(|r| r["name"] == WIDGET).unwrap_or_else(|| panic!("{v}"));
    assert_eq!(widget["devices"].as_array().unwrap().len(), 5, "version 1.0.1 lists 5 devices: {widget}");

    // Unsigned: fine without a key, refused with one.
    let pull = |r: &str, extra: &[&str]| {
        let mut args = vec!["pull", r, "--plain-http", &reg.addr];
        args.extend(extra);
        devplug(&args)
    };
    let (ok, v, err) = pull(&r1, &[]);
    assert!(ok, "{err}");
    assert_eq!((v["digest"].as_str(), v["layout"].as_str()), (Some(d1.as_str()), Some("wasm-artifact")));
    let (ok, _, err) = pull(&r1, &["--public-key", pubkey.to_str().unwrap()]);
    assert!(!ok && err.contains("missing"), "an unsigned artifact verifies: {err}");

    // Signed with openssl's key: verifies with its public key, not with another.
    let (ok, _, err) = devplug(&["sign", &r1, "--key", key.to_str().unwrap(), "--plain-http", &reg.addr]);
    assert!(ok, "{err}");
    let (ok, v, err) = pull(&r1, &["--public-key", pubkey.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(v["signature"]["state"], "verified");
    let (ok, _, err) = pull(&r1, &["--public-key", other_pub.to_str().unwrap()]);
    assert!(!ok && err.contains("does not match the key"), "{err}");

    // openssl, not devplug, checks the signature devplug pushed (cosign's layout: the payload
    // blob, its base64 DER signature in the layer annotation).
    let sig_tag = format!("{}/devplug/chaos:{}.sig", reg.addr, d1.replace(':', "-"));
    let out = skopeo(&["inspect", "--raw", "--tls-verify=false", &format!("docker://{sig_tag}")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let sm: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let layer = &sm["layers"][0];
    assert_eq!(layer["mediaType"], "application/vnd.dev.cosign.simplesigning.v1+json");
    let sig_dir = work.path().join("sig");
    let out = skopeo(&[
        "copy",
        "--src-tls-verify=false",
        &format!("docker://{sig_tag}"),
        &format!("dir:{}", sig_dir.display()),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let payload = sig_dir.join(layer["digest"].as_str().unwrap().trim_start_matches("sha256:"));
    let sig_b64 = layer["annotations"]["dev.cosignproject.cosign/signature"].as_str().unwrap();
    std::fs::write(work.path().join("sig.der"), base64::engine::general_purpose::STANDARD.decode(sig_b64).unwrap())
        .unwrap();
    let st = Command::new("openssl")
        .args(["dgst", "-sha256", "-verify"])
        .arg(&pubkey)
        .arg("-signature")
        .arg(work.path().join("sig.der"))
        .arg(&payload)
        .output()
        .unwrap();
    assert!(st.status.success(), "openssl: {}", String::from_utf8_lossy(&st.stdout));
    let body: serde_json::Value = serde_json::from_slice(&std::fs::read(&payload).unwrap()).unwrap();
    assert_eq!(body["critical"]["image"]["docker-manifest-digest"], d1.as_str());

    // A blob that no longer matches its digest (tampered in the registry's storage) is refused.
    let r2 = reg.reference("tampered", "1");
    let d2 = push(&reg, &r2, &version(work.path(), 2, "ok"), &[]);
    let (ok, v, _) = pull(&r2, &[]);
    assert!(ok);
    assert_eq!(v["digest"].as_str(), Some(d2.as_str()));
    let wasm_layer = {
        let out = skopeo(&["inspect", "--raw", "--tls-verify=false", &format!("docker://{r2}")]);
        let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        m["layers"][0]["digest"].as_str().unwrap().to_owned()
    };
    let blob = reg.blob_path(&wasm_layer);
    let mut bytes = std::fs::read(&blob).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    let (ok, _, err) = pull(&r2, &[]);
    assert!(!ok && err.to_lowercase().contains("digest"), "a tampered blob was accepted: {err}");

    // The image `devplug pack` writes, copied in with skopeo, pulls too.
    let v3 = version(work.path(), 3, "ok");
    let layout = work.path().join("layout");
    let (ok, _, err) = devplug(&["pack", "--out", layout.to_str().unwrap(), "--tag", "3", v3.to_str().unwrap()]);
    assert!(ok, "{err}");
    let r3 = reg.reference("packed", "3");
    let out =
        skopeo(&["copy", "--dest-tls-verify=false", &format!("oci:{}:3", layout.display()), &format!("docker://{r3}")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (ok, v, err) = pull(&r3, &["--name", "chaos"]);
    assert!(ok, "{err}");
    assert_eq!(v["layout"], "devplug-pack");
    assert!(v["size"].as_u64().unwrap() > 1000);
    // Issue 42: without --name, an image holding one backend (in a repository named otherwise)
    // is that backend, under its own name.
    let (ok, v, err) = pull(&r3, &[]);
    assert!(ok, "{err}");
    assert_eq!(v["name"], "chaos", "{v}");
    // Two backends in one image: which one is for --name (or the config's key) to say.
    std::fs::copy(&v3, v3.with_file_name("second.wasm")).unwrap();
    let both = work.path().join("both");
    let (ok, _, err) = devplug(&[
        "pack",
        "--out",
        both.to_str().unwrap(),
        "--tag",
        "3",
        v3.to_str().unwrap(),
        v3.with_file_name("second.wasm").to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let r4 = reg.reference("two-backends", "3");
    let out =
        skopeo(&["copy", "--dest-tls-verify=false", &format!("oci:{}:3", both.display()), &format!("docker://{r4}")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (ok, _, err) = pull(&r4, &[]);
    assert!(!ok && err.contains("--name") && err.contains("second.wasm"), "{err}");
    assert!(pull(&r4, &["--name", "second"]).0);
}

/// `devplug run` following `reference` (config `extra` added), with its log.
fn run(kdir: &Path, work: &Path, m: &Machine, reg: &Registry, reference: &str, extra: &str) -> Devplug {
    let backends = work.join("empty");
    std::fs::create_dir_all(&backends).unwrap();
    let cfg = work.join("devplug.toml");
    std::fs::write(
        &cfg,
        format!(
            "[backends.chaos]\nimage = \"{reference}\"\n[registry]\npoll = \"1s\"\ntimeout = \"5s\"\nplain_http = [\"{}\"]\n{extra}",
            reg.addr
        ),
    )
    .unwrap();
    let mut args = run_args(kdir, &backends, m);
    let s = |p: &Path| p.display().to_string();
    args.extend(["--config".into(), s(&cfg), "--cache-dir".into(), s(&work.join("cache"))]);
    Devplug::spawn(&args)
}

/// The `--metrics-addr` the daemon bound, from its log.
fn metrics_addr(d: &Devplug) -> String {
    d.metrics_addr()
}

/// The first registry source in `/status`.
async fn source_status(addr: &str) -> serde_json::Value {
    let (code, body) = devplug::cli::http_get(addr, "/status").await.unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["sources"][0].clone()
}

/// Poll `/status` until the first source satisfies `pred`, bounded.
async fn wait_status(addr: &str, what: &str, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + T;
    loop {
        let s = source_status(addr).await;
        if pred(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn count(d: &Devplug, needle: &str) -> usize {
    d.log().matches(needle).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_tag_moves_under_allocate_load_and_bad_versions_are_refused_once() {
    let reg = Registry::start(false);
    let work = tempfile::tempdir().unwrap();
    let stable = reg.reference("chaos", "stable");
    push(&reg, &stable, &version(work.path(), 1, "ok"), &[]);
    let m = Machine::generic_box();
    let kdir = work.path().join("k");
    let kubelet = Kubelet::start(&kdir).await;
    let d = run(&kdir, work.path(), &m, &reg, &stable, "");
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 5).await.unwrap();
    let addr = metrics_addr(&d);

    // The tag moves while four clients allocate.
    let load = start_load(&plugin);
    let started = Instant::now();
    push(&reg, &stable, &version(work.path(), 2, "ok"), &[]);
    let t0 = Instant::now();
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 6).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    eprintln!("tag moved → new list on the stream: {:?} (poll 1s)", t0.elapsed());

    // A version whose init traps: refused once, the old one serves on, and the polls after it
    // see the same digest and leave it alone.
    let d2 = source_status(&addr).await["digest"].as_str().unwrap().to_owned();
    push(&reg, &stable, &version(work.path(), 3, "trap-init"), &[]);
    d.wait_log("backend refused", T).unwrap();
    let at_refusal = source_status(&addr).await["checks"].as_u64().unwrap();
    wait_status(&addr, "two more polls", |s| s["checks"].as_u64().unwrap() >= at_refusal + 2).await;
    let st = source_status(&addr).await;
    assert!(st["swap_error"].as_str().unwrap().contains("not swapped in"), "{st}");
    let r = plugin.client.clone().allocate(alloc("widget-1")).await.unwrap();
    assert_eq!(r.get_ref().container_responses[0].envs["CHAOS_VERSION"], "1.0.2", "the old version serves");

    // Moved back to the good digest (skopeo copies the manifest byte for byte): fine again.
    let out = skopeo(&[
        "copy",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        &format!("docker://{}/devplug/chaos@{d2}", reg.addr),
        &format!("docker://{stable}"),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_status(&addr, "the old digest back", |s| {
        s["digest"] == d2.as_str() && s["last_error"].is_null() && s["swap_error"].is_null()
    })
    .await;

    // And on to a new version.
    push(&reg, &stable, &version(work.path(), 4, "ok"), &[]);
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 8).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));

    // Issue 60 (7): the serving version pushed again under a new digest (its manifest with an
    // annotation more, as another tool writes it) was logged "pulled a new version" and swapped.
    // Same component and manifest: said so once, and nothing changes.
    let pulled_before = count(&d, "pulled a new version");
    let copy = work.path().join("again");
    let out =
        skopeo(&["copy", "--src-tls-verify=false", &format!("docker://{stable}"), &format!("dir:{}", copy.display())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let manifest = copy.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    m["annotations"]["org.example.pushed-by"] = serde_json::json!("another tool");
    std::fs::write(&manifest, serde_json::to_vec(&m).unwrap()).unwrap();
    let out =
        skopeo(&["copy", "--dest-tls-verify=false", &format!("dir:{}", copy.display()), &format!("docker://{stable}")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    d.wait_log("holding the serving version's component and manifest; nothing changes", T)
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    assert_eq!(count(&d, "pulled a new version"), pulled_before, "not news:\n{}", d.log());
    load.stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    for t in load.tasks {
        t.await.unwrap().unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    }
    let calls = load.calls.load(Ordering::Relaxed);
    let rate = calls as f64 / elapsed.as_secs_f64();
    assert!(rate >= 200.0, "the load was only {rate:.0} Allocate/s");
    assert_eq!(count(&d, "backend refused"), 1, "the failing digest is tried once:\n{}", d.log());
    assert_eq!(kubelet.registrations(), 1, "no re-registration:\n{}", d.log());
    eprintln!("{calls} Allocate calls ({rate:.0}/s) across the tag moves, none failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signatures_and_auth_are_enforced_and_a_restart_without_the_registry_serves_from_cache() {
    let mut reg = Registry::start(true);
    let work = tempfile::tempdir().unwrap();
    let (key, pubkey) = openssl_keypair(work.path(), "ops");
    let (other_key, _) = openssl_keypair(work.path(), "other");
    let auth = reg.auth_file();
    let auth_s = auth.to_str().unwrap().to_owned();
    let stable = reg.reference("chaos", "stable");
    let signed =
        |k: &Path| vec!["--auth-file".to_owned(), auth_s.clone(), "--sign-key".into(), k.display().to_string()];
    let with_ops = signed(&key);
    push(&reg, &stable, &version(work.path(), 1, "ok"), &refs(&with_ops));

    // A key `push` cannot sign with is refused before anything is published: no tag appears.
    let v9 = version(work.path(), 9, "ok");
    let (bad_key, unsigned) = (work.path().join("not-a-key.pem"), reg.reference("chaos", "unsigned"));
    std::fs::write(&bad_key, "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n").unwrap();
    let bad = [
        "push",
        unsigned.as_str(),
        v9.to_str().unwrap(),
        "--plain-http",
        reg.addr.as_str(),
        "--auth-file",
        auth_s.as_str(),
        "--sign-key",
        bad_key.to_str().unwrap(),
    ];
    let (ok, _, err) = devplug(&bad);
    assert!(!ok && err.contains("not an unencrypted PKCS#8"), "{err}");
    let (found, _, err) = devplug(&["pull", &unsigned, "--plain-http", &reg.addr, "--auth-file", &auth_s]);
    assert!(!found && err.contains("404"), "the refused push published nothing: {err}");

    // Without credentials the registry says no, and the error says so.
    let (ok, _, err) = devplug(&["pull", &stable, "--plain-http", &reg.addr]);
    assert!(!ok && err.contains("authorized"), "{err}");

    let m = Machine::generic_box();
    let kdir = work.path().join("k");
    let kubelet = Kubelet::start(&kdir).await;
    let policy = format!("public_key = \"{}\"\nauth_file = \"{auth_s}\"\n", pubkey.display());
    let mut d = run(&kdir, work.path(), &m, &reg, &stable, &policy);
    let plugin = kubelet.wait_registered(WIDGET, 1, T).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 5).await.unwrap();
    let addr = metrics_addr(&d);
    assert_eq!(source_status(&addr).await["signature"]["state"], "verified");
    let (_, metrics) = devplug::cli::http_get(&addr, "/metrics").await.unwrap();
    let line =
        metrics.lines().find(|l| l.starts_with("devplug_registry_source{")).unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        line.contains("backend=\"chaos\"") && line.contains("signature=\"verified\"") && line.contains(&stable),
        "{line}"
    );

    // Unsigned, then signed by a key the operator does not trust: refused, 1.0.1 serves on.
    push(&reg, &stable, &version(work.path(), 2, "ok"), &["--auth-file", &auth_s]);
    wait_status(&addr, "an unsigned version refused", |s| {
        s["last_error"].as_str().is_some_and(|e| e.contains("missing"))
    })
    .await;
    push(&reg, &stable, &version(work.path(), 3, "ok"), &refs(&signed(&other_key)));
    wait_status(&addr, "a foreign signature refused", |s| {
        s["last_error"].as_str().is_some_and(|e| e.contains("does not match the key"))
    })
    .await;
    let r = plugin.client.clone().allocate(alloc("widget-0")).await.unwrap();
    assert_eq!(r.get_ref().container_responses[0].envs["CHAOS_VERSION"], "1.0.1");
    // Refusals are logged once per digest and reason, not at every poll.
    let logged = count(&d, "refused:");
    let checks = source_status(&addr).await["checks"].as_u64().unwrap();
    wait_status(&addr, "two more polls", |s| s["checks"].as_u64().unwrap() >= checks + 2).await;
    assert_eq!(count(&d, "refused:"), logged, "a refusal logged again:\n{}", d.log());
    assert!((2..=3).contains(&logged), "{logged} refusals logged:\n{}", d.log());

    // Signed by the operator's key after the push (as CI pipelines sign): the signature is
    // looked for again each poll, so the same digest now loads.
    let (ok, _, err) =
        devplug(&["sign", &stable, "--key", key.to_str().unwrap(), "--plain-http", &reg.addr, "--auth-file", &auth_s]);
    assert!(ok, "{err}");
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 7).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));

    // Pushed and signed in one go: it serves.
    push(&reg, &stable, &version(work.path(), 4, "ok"), &refs(&with_ops));
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 8).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));

    // The registry goes away and devplug restarts: the cached, verified 1.0.4 serves at once.
    d.terminate(T).unwrap();
    reg.stop();
    let d = run(&kdir, work.path(), &m, &reg, &stable, &policy);
    d.wait_log("running from cache", T).unwrap();
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 8).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let addr = metrics_addr(&d);
    // `/status` answers from the start, before the first look at the registry has failed.
    let st = wait_status(&addr, "the unreachable registry reported", |s| s["last_error"].is_string()).await;
    assert_eq!(st["from_cache"], true, "{st}");

    // The registry is back: following resumes.
    reg.restart();
    push(&reg, &stable, &version(work.path(), 5, "ok"), &refs(&with_ops));
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 9).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let st = wait_status(&addr, "following again", |s| s["from_cache"] == false && s["last_error"].is_null()).await;
    assert_eq!(st["signature"]["state"], "verified");
}

/// The registry on HTTPS with a CA of its own: nothing is pulled until the operator's
/// `registry.ca_file` names that CA; a pinned digest pulls exactly that version.
#[test]
fn https_registries_are_trusted_through_ca_file_and_digests_pin() {
    let reg = Registry::start_tls();
    let work = tempfile::tempdir().unwrap();
    let cfg = work.path().join("devplug.toml");
    std::fs::write(&cfg, format!("[registry]\nca_file = \"{}\"\n", reg.ca().display())).unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let r = reg.reference("chaos", "1");
    let wasm = version(work.path(), 1, "ok");

    // Not trusted without the CA (and never downgraded to HTTP).
    let (ok, _, err) = devplug(&["push", &r, wasm.to_str().unwrap()]);
    assert!(!ok && err.to_lowercase().contains("certificate"), "pushed to an untrusted registry: {err}");
    let (ok, v, err) = devplug(&["push", &r, wasm.to_str().unwrap(), "--config", cfg_s]);
    assert!(ok, "{err}");
    let d1 = v["digest"].as_str().unwrap().to_owned();
    let (ok, _, err) = devplug(&["pull", &r]);
    assert!(!ok && err.to_lowercase().contains("certificate"), "{err}");

    // Pinned: the digest, whatever the tag does later.
    let (ok, v, err) = devplug(&["push", &r, version(work.path(), 2, "ok").to_str().unwrap(), "--config", cfg_s]);
    assert!(ok, "{err}");
    assert_ne!(v["digest"].as_str(), Some(d1.as_str()));
    let pinned = format!("{}/devplug/chaos@{d1}", reg.addr);
    let out = work.path().join("pinned");
    let (ok, v, err) = devplug(&["pull", &pinned, "--config", cfg_s, "--out", out.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(v["digest"].as_str(), Some(d1.as_str()));
    assert_eq!(std::fs::read(out.join("chaos.wasm")).unwrap(), chaos_build(1), "the bytes pushed, byte for byte");
    assert!(std::fs::read_to_string(out.join("chaos.toml")).unwrap().contains("version=1.0.1"));
    let missing = format!("{}/devplug/chaos@sha256:{}", reg.addr, "0".repeat(64));
    let (ok, _, err) = devplug(&["pull", &missing, "--config", cfg_s]);
    assert!(!ok && !err.is_empty(), "a digest the registry does not have pulls nothing");
}

/// A registry that sends a blob for ever, sends 64 MiB where the descriptor said 1,000 bytes, or
/// drips a byte every 100 ms: `devplug pull` stops at the descriptor's size or at
/// `registry.timeout` (the whole transfer, not each read), says which, and the registry could
/// push only what the socket buffers held before devplug stopped reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_registry_cannot_flood_a_pull() {
    use support::hostile_registry::{Blob, HostileRegistry, LAYER_SIZE};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("devplug.toml");
    std::fs::write(&config, "[registry]\ntimeout = \"2s\"\n").unwrap();
    let too_much = format!("more than the {LAYER_SIZE} bytes the descriptor announced");
    for (blob, needle) in [
        (Blob::Endless, too_much.as_str()),
        (Blob::LyingLength, too_much.as_str()),
        (Blob::Drip, "took longer than 2s (registry.timeout)"),
    ] {
        let reg = HostileRegistry::start(blob).await;
        let reference = format!("{}/evil:latest", reg.addr);
        let args =
            ["pull", reference.as_str(), "--plain-http", reg.addr.as_str(), "--config", config.to_str().unwrap()]
                .map(str::to_owned);
        let t0 = Instant::now();
        let (ok, _, err) = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            devplug(&args)
        })
        .await
        .unwrap();
        let took = t0.elapsed();
        let sent = reg.sent();
        eprintln!("{blob:?}: refused after {took:?}; the registry got {sent} body bytes into the socket");
        assert!(!ok, "{blob:?}: the pull succeeded");
        assert!(err.contains(needle), "{blob:?}: {err}");
        assert!(sent < 16 << 20, "{blob:?}: {sent} bytes left the registry before devplug stopped");
        assert!(took < Duration::from_secs(20), "{blob:?}: took {took:?}");
    }
}

/// A registry whose manifest, index or token server streams for ever: `devplug pull` reads each
/// body only to its cap (4 MiB for a manifest or index, 256 KiB for a token answer), says which
/// body and cap, and the registry got only what the socket buffers held before devplug stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_registry_cannot_flood_a_manifest_an_index_or_a_token() {
    use support::hostile_registry::{Attack, HostileRegistry};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("devplug.toml");
    std::fs::write(&config, "[registry]\ntimeout = \"20s\"\n").unwrap();
    for (attack, needle) in [
        (Attack::EndlessManifest, "manifest"),
        (Attack::EndlessIndex, "manifest"),
        (Attack::EndlessToken, "token from http://"),
    ] {
        let reg = HostileRegistry::attack(attack).await;
        let reference = format!("{}/evil:latest", reg.addr);
        let args =
            ["pull", reference.as_str(), "--plain-http", reg.addr.as_str(), "--config", config.to_str().unwrap()]
                .map(str::to_owned);
        let (ok, _, err) = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            devplug(&args)
        })
        .await
        .unwrap();
        let sent = reg.sent();
        eprintln!("{attack:?}: the registry got {sent} body bytes into the socket");
        assert!(!ok, "{attack:?}: the pull succeeded");
        assert!(err.contains(needle) && err.contains("the registry sent more than"), "{attack:?}: {err}");
        assert!(!err.contains("took longer"), "{attack:?}: cut by the cap, not the timeout: {err}");
        assert!(sent < 16 << 20, "{attack:?}: {sent} bytes left the registry before devplug stopped");
    }
}

/// A registry that does not answer (nothing listens on its port) is logged once when the outage
/// starts, then counted (`failing_checks` in `/status`), not logged at every poll (issue 28).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_outage_is_logged_once_and_counted() {
    let work = tempfile::tempdir().unwrap();
    let (m, kdir) = (Machine::generic_box(), work.path().join("kubelet"));
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let backends = work.path().join("empty");
    std::fs::create_dir_all(&backends).unwrap();
    let cfg = work.path().join("devplug.toml");
    std::fs::write(
        &cfg,
        format!("[backends.ghost]\nimage = \"{dead}/ghost:1\"\n[registry]\npoll = \"100ms\"\ntimeout = \"2s\"\nplain_http = [\"{dead}\"]\n"),
    )
    .unwrap();
    let mut args = run_args(&kdir, &backends, &m);
    args.extend(["--config".into(), cfg.display().to_string()]);
    let d = Devplug::spawn(&args);
    let addr = metrics_addr(&d);
    let s = wait_status(&addr, "five failed checks in a row", |s| s["failing_checks"].as_u64() >= Some(5)).await;
    assert!(s["last_error"].as_str().is_some(), "{s}");
    assert_eq!(count(&d, "registry check failed"), 1, "{}", d.log());
}

/// `devplug precompile` of `reference` with `key` (the vendor's signature checked with
/// `vendor`): its JSON answer, or its error.
fn precompile(
    reg: &Registry,
    reference: &str,
    key: &Path,
    vendor: &Path,
    extra: &[&str],
) -> Result<serde_json::Value, String> {
    let mut args = vec!["precompile", reference, "--plain-http", &reg.addr];
    let (k, v) = (key.display().to_string(), vendor.display().to_string());
    args.extend(["--key", &k, "--public-key", &v]);
    args.extend(extra);
    let (ok, out, err) = devplug(&args);
    if ok { Ok(out) } else { Err(err) }
}

/// Issue 61 (1): native code compiled once for the cluster, attached to the version in the
/// registry and signed with the operator's key, is what a node with that key loads (nothing
/// compiled on the node). Every other kind of native artifact is refused, or does not load,
/// with one line saying why, and the node compiles the version itself and serves it. The signed
/// code streams into an unnamed file of the node's cache, checked against its digest as it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_signed_native_code_is_loaded_and_every_other_artifact_falls_back_to_compiling() {
    let reg = Registry::start(false);
    let raw = reg.raw();
    let work = tempfile::tempdir().unwrap();
    let (vendor_key, vendor_pub) = openssl_keypair(work.path(), "vendor");
    let (op_key, op_pub) = openssl_keypair(work.path(), "operator");
    let (other_key, _) = openssl_keypair(work.path(), "other");
    let (stable, staging) = (reg.reference("chaos", "stable"), reg.reference("chaos", "staging"));
    let vendor_signed = ["--sign-key", vendor_key.to_str().unwrap()];

    // The backends' key is never the operator's: refused before anything is compiled.
    push(&reg, &staging, &version(work.path(), 1, "ok"), &vendor_signed);
    let err = precompile(&reg, &staging, &vendor_key, &vendor_pub, &[]).unwrap_err();
    assert!(err.contains("the backends' signing key"), "{err}");
    // An unsigned version is not compiled when the vendor's key is asked for.
    let unsigned = reg.reference("chaos", "unsigned");
    push(&reg, &unsigned, &version(work.path(), 9, "ok"), &[]);
    let err = precompile(&reg, &unsigned, &op_key, &vendor_pub, &[]).unwrap_err();
    assert!(err.contains("missing") && err.contains("not compiled"), "{err}");

    // Compiled once, attached, signed, then the followed tag promoted to it.
    let out = precompile(&reg, &staging, &op_key, &vendor_pub, &["--promote", "stable"]).unwrap();
    let v1 = out["digest"].as_str().unwrap().to_owned();
    assert_eq!(out["promoted"], stable);
    let native_tag = out["native"]["tag"].as_str().unwrap().to_owned();
    let fp16 = native_tag.rsplit_once(".native-").unwrap().1.to_owned();
    assert_eq!(native_tag, format!("{}/devplug/chaos:{}.native-{fp16}", reg.addr, v1.replace(':', "-")));
    let (artifact, _) = raw.manifest(&native_tag).await;
    assert_eq!(artifact["artifactType"], "application/vnd.devplug.native.v1");
    assert_eq!(artifact["subject"]["digest"], v1, "attached to the version: {artifact}");

    let m = Machine::generic_box();
    let kdir = work.path().join("k");
    let kubelet = Kubelet::start(&kdir).await;
    let policy = format!("public_key = \"{}\"\noperator_key = \"{}\"\n", vendor_pub.display(), op_pub.display());
    let d = run(&kdir, work.path(), &m, &reg, &stable, &policy);
    kubelet.wait_registered(WIDGET, 1, T).await.unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    kubelet.wait_devices(WIDGET, T, |l| l.len() == 5).await.unwrap();
    let addr = metrics_addr(&d);
    let s = wait_status(&addr, "the signed version", |s| s["digest"] == v1).await;
    assert_eq!(s["native"], "signed", "{s}");
    let loaded =
        d.log().lines().find(|l| l.contains("backend loaded") && l.contains("chaos")).unwrap_or_default().to_owned();
    assert!(loaded.contains("cache=Signed"), "loaded from the signed code, not compiled: {loaded}\n{}", d.log());

    // Each hostile case: version k pushed to staging, its native artifact made so, then the
    // followed tag moved to it; the node serves it compiled, and says why once.
    let tag_of = |digest: &str| format!("{}/devplug/chaos:{}.native-{fp16}", reg.addr, digest.replace(':', "-"));
    let sign = |reference: &str, key: &Path| {
        let (ok, _, err) = devplug(&["sign", reference, "--key", key.to_str().unwrap(), "--plain-http", &reg.addr]);
        assert!(ok, "{err}");
    };
    let staged = |k: u32| push(&reg, &staging, &version(work.path(), k, "ok"), &vendor_signed);
    let mut cases: Vec<(u32, &str, String)> = Vec::new();

    // Missing: never precompiled.
    cases.push((2, "missing", staged(2)));
    // Signed by another key.
    let d3 = staged(3);
    precompile(&reg, &staging, &other_key, &vendor_pub, &[]).unwrap();
    cases.push((3, "another key", d3));
    // For another digest: version 1's good artifact, copied under version 4's tag.
    let d4 = staged(4);
    raw.put_manifest(&tag_of(&d4), &artifact).await;
    cases.push((4, "another digest", d4));
    // For another engine: a good artifact re-annotated, and signed by the operator's key.
    let d5 = staged(5);
    precompile(&reg, &staging, &op_key, &vendor_pub, &[]).unwrap();
    let (mut m5, _) = raw.manifest(&tag_of(&d5)).await;
    m5["annotations"]["io.devplug.native.engine"] = serde_json::json!("0".repeat(64));
    let forged = raw.put_manifest(&tag_of(&d5), &m5).await;
    sign(&format!("{}/devplug/chaos@{forged}", reg.addr), &op_key);
    cases.push((5, "another engine", d5));
    // Truncated: the code cut in half, its manifest made to match and signed by the operator.
    let d6 = staged(6);
    precompile(&reg, &staging, &op_key, &vendor_pub, &[]).unwrap();
    let (mut m6, _) = raw.manifest(&tag_of(&d6)).await;
    let code = raw.blob(&staging, m6["layers"][0]["digest"].as_str().unwrap()).await;
    let half = code[..code.len() / 2].to_vec();
    m6["layers"][0]["size"] = serde_json::json!(half.len());
    m6["layers"][0]["digest"] = serde_json::json!(raw.put_blob(&staging, half).await);
    let forged = raw.put_manifest(&tag_of(&d6), &m6).await;
    sign(&format!("{}/devplug/chaos@{forged}", reg.addr), &op_key);
    cases.push((6, "truncated", d6));
    // Unsigned: a good artifact changed by one annotation, so no signature names it.
    let d7 = staged(7);
    precompile(&reg, &staging, &op_key, &vendor_pub, &[]).unwrap();
    let (mut m7, _) = raw.manifest(&tag_of(&d7)).await;
    m7["annotations"]["x"] = serde_json::json!("y");
    raw.put_manifest(&tag_of(&d7), &m7).await;
    cases.push((7, "unsigned", d7));
    // Tampered in the registry's storage: signed and bound, but its bytes are not its digest's.
    let d8 = staged(8);
    precompile(&reg, &staging, &op_key, &vendor_pub, &[]).unwrap();
    let (m8, _) = raw.manifest(&tag_of(&d8)).await;
    let stored = reg.blob_path(m8["layers"][0]["digest"].as_str().unwrap());
    let mut bytes = std::fs::read(&stored).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&stored, bytes).unwrap();
    cases.push((8, "tampered", d8));

    // Each staged push moved `staging` only: the node still serves version 1.
    assert_eq!(source_status(&addr).await["digest"], v1);
    let mut served = Vec::new();
    for (k, what, digest) in cases {
        let (m, _) = raw.manifest_bytes(&format!("{}/devplug/chaos@{digest}", reg.addr)).await;
        assert_eq!(raw.put_manifest_bytes(&stable, m).await, digest, "the same bytes under the followed tag");
        let s = wait_status(&addr, what, |s| s["digest"] == digest.as_str()).await;
        // Version k has 4 + k devices: kubelet sees them once it serves.
        kubelet
            .wait_devices(WIDGET, T, |l| l.len() == 4 + k as usize)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", d.log()));
        let said = s["native"].as_str().unwrap_or_default().to_owned();
        let expect = match what {
            "missing" => "no native code for this engine",
            "another key" => "does not match the key",
            "another digest" => "not to this version's manifest",
            "another engine" => "compiled for engine",
            "truncated" => "signed",
            "tampered" => "digest mismatch",
            _ => "is not signed",
        };
        assert!(said.contains(expect), "{what}: {said}");
        let why = if what == "truncated" { "does not load into this engine".to_owned() } else { said.clone() };
        assert_eq!(count(&d, &why), 1, "{what}: one line says why ({why})\n{}", d.log());
        served.push(k);
    }
    assert_eq!(served, [2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(count(&d, "cache=Signed"), 1, "only version 1 came from signed code\n{}", d.log());
}
