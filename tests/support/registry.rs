//! A real OCI registry for the tests: Debian's `docker-registry` (CNCF distribution 2.8) on
//! 127.0.0.1, storage in a private temp dir, optionally behind htpasswd basic auth. Stopped (and
//! its data removed) when dropped, so nothing outlives the test.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const USER: &str = "devplug";
pub const PASSWORD: &str = "s3cret-pass";

pub struct Registry {
    dir: tempfile::TempDir,
    pub addr: String,
    auth: bool,
    /// Serving HTTPS with a certificate from a CA of the test's own ([`Registry::ca`]).
    tls: bool,
    /// Keeping its access log (one line per request), for [`Registry::requests`].
    logged: bool,
    child: Option<Child>,
}

impl Registry {
    /// Start a registry; with `auth`, every request needs [`USER`]/[`PASSWORD`].
    pub fn start(auth: bool) -> Registry {
        let mut r = Registry::new(auth, false);
        if auth {
            let out =
                Command::new("htpasswd").args(["-Bbn", USER, PASSWORD]).output().expect("htpasswd (apache2-utils)");
            assert!(out.status.success(), "htpasswd: {}", String::from_utf8_lossy(&out.stderr));
            std::fs::write(r.dir.path().join("htpasswd"), out.stdout).unwrap();
        }
        r.run();
        r
    }

    /// A registry that keeps an access log, to count what its clients ask
    /// ([`Registry::requests`]).
    pub fn start_logged() -> Registry {
        let mut r = Registry::new(false, false);
        r.logged = true;
        r.run();
        r
    }

    /// Every request served so far, as `METHOD /path` (from the access log; empty unless
    /// started with [`Registry::start_logged`]).
    pub fn requests(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        log.lines()
            .filter_map(|l| {
                // Combined log format: `… "HEAD /v2/x/manifests/t HTTP/1.1" 200 …`.
                let request = l.split('"').nth(1)?;
                let mut words = request.split(' ');
                let (method, path) = (words.next()?, words.next()?);
                (method.chars().all(|c| c.is_ascii_uppercase()) && path.starts_with('/'))
                    .then(|| format!("{method} {path}"))
            })
            .collect()
    }

    /// A registry on HTTPS, its certificate (for IP 127.0.0.1) signed by a CA made here: no
    /// client trusts it unless given [`Registry::ca`].
    pub fn start_tls() -> Registry {
        let mut r = Registry::new(false, true);
        let d = r.dir.path().to_owned();
        let openssl = |args: &str| {
            let out = Command::new("openssl").args(args.split(' ')).current_dir(&d).output().expect("openssl");
            assert!(out.status.success(), "openssl {args}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let p256 = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
        openssl(&format!(
            "req -x509 {p256} -keyout ca.key -out ca.pem -days 2 -subj /CN=devplug-test-CA \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
        ));
        openssl(&format!("req {p256} -keyout server.key -out server.csr -subj /CN=127.0.0.1"));
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(
            "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext",
        );
        r.run();
        r
    }

    /// A registry not started yet, on a free port (bound, read and released: the registry binds
    /// it right after), its storage in a temp dir of its own.
    fn new(auth: bool, tls: bool) -> Registry {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        Registry { dir, addr: format!("127.0.0.1:{port}"), auth, tls, logged: false, child: None }
    }

    /// The CA that signed an HTTPS registry's certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn run(&mut self) {
        let d = self.dir.path();
        let mut yml = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: {}\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {}\n",
            !self.logged,
            d.join("data").display(),
            self.addr
        );
        if self.tls {
            yml.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                d.join("server.pem").display(),
                d.join("server.key").display()
            ));
        }
        if self.auth {
            yml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: devplug-tests\n    path: {}\n",
                d.join("htpasswd").display()
            ));
        }
        std::fs::write(d.join("config.yml"), yml).unwrap();
        // The access log goes to the registry's stdout (distribution's gorilla handler).
        let out = || match self.logged {
            true => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(d.join("access.log"))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
            false => Stdio::null(),
        };
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(d.join("config.yml"))
            .stdout(out())
            .stderr(out())
            .spawn()
            .expect("docker-registry (Debian package docker-registry; scripts/test installs it)");
        self.child = Some(child);
        // Ready once it answers on the port (401 with auth on; a 400 to plain HTTP with TLS on).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut s) = std::net::TcpStream::connect(&self.addr) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let req = format!("GET /v2/ HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.addr);
                let mut buf = String::new();
                if s.write_all(req.as_bytes()).is_ok() && s.read_to_string(&mut buf).is_ok() && buf.starts_with("HTTP/")
                {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "docker-registry did not come up on {}", self.addr);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop serving (the data stays, for [`Registry::restart`]).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Serve again on the same address with the same data.
    pub fn restart(&mut self) {
        self.stop();
        self.run();
    }

    /// `127.0.0.1:PORT/devplug/NAME:TAG`.
    pub fn reference(&self, name: &str, tag: &str) -> String {
        format!("{}/devplug/{name}:{tag}", self.addr)
    }

    /// A docker config.json with this registry's credentials.
    pub fn auth_file(&self) -> PathBuf {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
        let f = self.dir.path().join("auth.json");
        std::fs::write(&f, format!(r#"{{"auths":{{"{}":{{"auth":"{b64}"}}}}}}"#, self.addr)).unwrap();
        f
    }

    /// The registry's blob store (`docker/registry/v2/blobs/sha256/..`), to tamper with.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir.path().join("data/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Raw reads and writes of manifests and blobs, for tests that put into the registry what a
    /// hostile one would hold (no auth: for a registry started without it).
    pub fn raw(&self) -> Raw {
        let settings = devplug::oci::RegistrySettings { plain_http: vec![self.addr.clone()], ..Default::default() };
        Raw { client: settings.client().expect("a registry client") }
    }
}

/// See [`Registry::raw`]. References are whole (`127.0.0.1:PORT/devplug/NAME:TAG`).
pub struct Raw {
    client: oci_client::Client,
}

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

impl Raw {
    fn at(reference: &str) -> oci_client::Reference {
        reference.parse().unwrap_or_else(|e| panic!("{reference}: {e}"))
    }

    /// The manifest `reference` names, as JSON (written again it has other bytes: keys sorted),
    /// and its digest.
    pub async fn manifest(&self, reference: &str) -> (serde_json::Value, String) {
        let (body, digest) = self.manifest_bytes(reference).await;
        (serde_json::from_slice(&body).expect("a JSON manifest"), digest)
    }

    /// The manifest `reference` names, its bytes as stored, and its digest.
    pub async fn manifest_bytes(&self, reference: &str) -> (Vec<u8>, String) {
        let auth = oci_client::secrets::RegistryAuth::Anonymous;
        let (body, digest) = self
            .client
            .pull_manifest_raw(&Self::at(reference), &auth, &[OCI_MANIFEST])
            .await
            .unwrap_or_else(|e| panic!("{reference}: {e}"));
        (body.to_vec(), digest)
    }

    /// Store `manifest` under `reference` (a tag); its digest.
    pub async fn put_manifest(&self, reference: &str, manifest: &serde_json::Value) -> String {
        self.put_manifest_bytes(reference, serde_json::to_vec(manifest).expect("JSON")).await
    }

    /// Store these manifest bytes under `reference` (a tag); their digest.
    pub async fn put_manifest_bytes(&self, reference: &str, body: Vec<u8>) -> String {
        self.client
            .push_manifest_raw(&Self::at(reference), body.clone(), OCI_MANIFEST.parse().expect("a media type"))
            .await
            .unwrap_or_else(|e| panic!("{reference}: {e}"));
        use sha2::Digest;
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(&body)))
    }

    /// Blob `digest` of `reference`'s repository.
    pub async fn blob(&self, reference: &str, digest: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let layer = oci_client::manifest::OciDescriptor { digest: digest.to_owned(), ..Default::default() };
        self.client.pull_blob(&Self::at(reference), &layer, &mut out).await.unwrap_or_else(|e| panic!("{digest}: {e}"));
        out
    }

    /// Store `data` as a blob of `reference`'s repository; its digest.
    pub async fn put_blob(&self, reference: &str, data: Vec<u8>) -> String {
        use sha2::Digest;
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&data)));
        self.client.push_blob(&Self::at(reference), data, &digest).await.unwrap_or_else(|e| panic!("{digest}: {e}"));
        digest
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An ECDSA P-256 key pair made by openssl (not by devplug): (private PKCS#8 PEM, public PEM).
pub fn openssl_keypair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(format!("{name}.key"));
    let pubkey = dir.join(format!("{name}.pub"));
    let st = Command::new("openssl")
        .args(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"])
        .arg(&key)
        .status()
        .expect("openssl");
    assert!(st.success());
    let st =
        Command::new("openssl").args(["pkey", "-pubout", "-in"]).arg(&key).arg("-out").arg(&pubkey).status().unwrap();
    assert!(st.success());
    (key, pubkey)
}

/// Push chaos version `k` (built under `dir/vK`) to `reference` on `reg`, signed with `key`
/// through `devplug push`; the digest it got (the benches' way to move a tag).
pub fn push_chaos(reg: &Registry, reference: &str, dir: &Path, k: u32, key: &Path) -> anyhow::Result<String> {
    let v = dir.join(format!("v{k}"));
    std::fs::create_dir_all(&v)?;
    std::fs::write(v.join("chaos.wasm"), super::daemon::chaos_build(k))?;
    std::fs::write(v.join("chaos.toml"), super::daemon::chaos_manifest(k, "ok"))?;
    let out = Command::new(super::binary::BIN)
        .args(["push", reference])
        .arg(v.join("chaos.wasm"))
        .args(["--plain-http", &reg.addr, "--sign-key"])
        .arg(key)
        .output()?;
    anyhow::ensure!(out.status.success(), "push: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["digest"].as_str().unwrap_or_default().to_owned())
}
