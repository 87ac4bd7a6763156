//! A real kube-apiserver (and its etcd) for the DRA tests, by the envtest convention: when
//! `KUBEBUILDER_ASSETS` names a directory holding `kube-apiserver` and `etcd` (build them once
//! with `scripts/kube-assets/build`), [`RealApiServer::from_env`] starts both on free loopback
//! ports with a serving certificate the server makes itself, a token of its own and the flags a
//! bare test cluster needs (scripts/kube-assets/build says how they were found), configured
//! as clusters run it: `Node,RBAC` authorization, ServiceAccount and NodeRestriction admission,
//! default feature gates. The test's own token is an admin's (`system:masters`); devplug runs
//! under the chart's ServiceAccount with a Pod-bound token ([`RealApiServer::pod_bound_token`]).
//! Without it, it says in one line that the test ran against the stand-in only.
//!
//! Both processes die with this value (and with the test process: they are in its group).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The envtest variable.
pub const ASSETS: &str = "KUBEBUILDER_ASSETS";

/// Where and how the server runs. The default is the DRA tests': free loopback port, no
/// controller-manager, a service range nothing routes.
pub struct Shape {
    pub address: &'static str,
    /// `None`: a free port.
    pub port: Option<u16>,
    pub service_range: &'static str,
    /// A kube-controller-manager will run (it lifts a new Node's not-ready taint).
    pub controllers: bool,
    /// More identities by token: (token, user name, comma-separated groups).
    pub users: Vec<(String, String, String)>,
}

impl Default for Shape {
    fn default() -> Self {
        Shape { address: "127.0.0.1", port: None, service_range: "10.0.0.0/24", controllers: false, users: Vec::new() }
    }
}

/// A token no one else can guess.
pub fn random_token() -> String {
    let mut b = [0u8; 24];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").expect("urandom"), &mut b)
        .expect("random bytes");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub struct RealApiServer {
    etcd: Child,
    apiserver: Child,
    scheduler: Option<Child>,
    assets: PathBuf,
    /// A client of this server, made once it is ready.
    client: Option<kube::Client>,
    dir: tempfile::TempDir,
    pub url: String,
    pub token: String,
}

impl Drop for RealApiServer {
    fn drop(&mut self) {
        for child in self.scheduler.iter_mut().chain([&mut self.apiserver, &mut self.etcd]) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}

impl RealApiServer {
    /// The real server when `KUBEBUILDER_ASSETS` is set (a broken one fails the test, naming
    /// what is missing), else `None` after one line saying `test` ran against the stand-in only.
    pub async fn from_env(test: &str) -> Option<RealApiServer> {
        let Some(dir) = std::env::var_os(ASSETS).filter(|d| !d.is_empty()) else {
            eprintln!(
                "{test}: ran against the API-server stand-in only ({ASSETS} is not set; scripts/kube-assets/build makes the real one)"
            );
            return None;
        };
        let assets = PathBuf::from(dir);
        for bin in ["kube-apiserver", "etcd"] {
            assert!(assets.join(bin).is_file(), "{ASSETS}={} holds no {bin}", assets.display());
        }
        let server = Self::start(&assets, &Shape::default()).await;
        eprintln!("{test}: runs against the stand-in and a real kube-apiserver ({}/kube-apiserver)", assets.display());
        Some(server)
    }

    /// Start etcd and kube-apiserver from `assets` in `shape`, and wait until the server is ready.
    pub async fn start(assets: &Path, shape: &Shape) -> RealApiServer {
        let mut server = Self::spawn(assets, shape);
        server.wait_ready().await;
        server.client = Some(server.try_client().await.expect("a client of the real API server"));
        server
    }

    fn spawn(assets: &Path, shape: &Shape) -> RealApiServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let (client, peer) = (free_port(), free_port());
        let secure = shape.port.unwrap_or_else(free_port);
        let etcd = Command::new(assets.join("etcd"))
            .args(["--data-dir", &d.join("etcd").to_string_lossy()])
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .arg("--unsafe-no-fsync")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("etcd.log")).expect("etcd log"))
            .spawn()
            .expect("start etcd");
        // The service-account keys the server insists on, and a token only this run knows.
        let key = d.join("sa.key");
        let ok = Command::new("openssl")
            .args(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out"])
            .arg(&key)
            .status()
            .is_ok_and(|s| s.success())
            && Command::new("openssl")
                .args(["ec", "-pubout", "-in"])
                .arg(&key)
                .arg("-out")
                .arg(d.join("sa.pub"))
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        assert!(ok, "openssl made no service-account key for the real API server");
        let token = random_token();
        let mut tokens = format!("{token},devplug-test,devplug-test,\"system:masters\"\n");
        for (secret, user, groups) in &shape.users {
            tokens.push_str(&format!("{secret},{user},{user},\"{groups}\"\n"));
        }
        std::fs::write(d.join("tokens.csv"), tokens).expect("token file");
        let apiserver = Command::new(assets.join("kube-apiserver"))
            .arg(format!("--etcd-servers=http://127.0.0.1:{client}"))
            .arg(format!("--secure-port={secure}"))
            .arg(format!("--bind-address={}", shape.address))
            .arg(format!("--advertise-address={}", shape.address))
            .arg(format!("--cert-dir={}", d.join("certs").display()))
            .arg(format!("--token-auth-file={}", d.join("tokens.csv").display()))
            .arg("--authorization-mode=Node,RBAC")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", d.join("sa.pub").display()))
            .arg(format!("--service-account-signing-key-file={}", key.display()))
            .arg("--enable-admission-plugins=NodeRestriction")
            // Without a controller-manager nothing would lift a new Node's not-ready taint (the
            // tests make the service accounts they use themselves).
            .args(if shape.controllers { None } else { Some("--disable-admission-plugins=TaintNodesByCondition") })
            .args(["--endpoint-reconciler-type=none", "--enable-priority-and-fairness=false"])
            .arg(format!("--service-cluster-ip-range={}", shape.service_range))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("apiserver.log")).expect("apiserver log"))
            .spawn()
            .expect("start kube-apiserver");
        RealApiServer {
            etcd,
            apiserver,
            scheduler: None,
            assets: assets.to_owned(),
            client: None,
            url: format!("https://{}:{secure}", shape.address),
            token,
            dir,
        }
    }

    /// The server's self-made serving certificate and its CA (what clients trust).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("certs/apiserver.crt")
    }

    /// The service-account signing key (what kube-controller-manager signs tokens with).
    pub fn service_account_key(&self) -> PathBuf {
        self.dir.path().join("sa.key")
    }

    /// The server's log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default()
    }

    /// `curl`-free readiness: `/readyz` through the kube client, until the deadline.
    async fn wait_ready(&self) {
        let end = Instant::now() + Duration::from_secs(120);
        loop {
            if self.ca().exists()
                && let Ok(client) = self.try_client().await
            {
                let req = http::Request::get("/readyz").body(Vec::new()).expect("request");
                if client.request_text(req).await.is_ok_and(|t| t.trim() == "ok") {
                    return;
                }
            }
            assert!(
                Instant::now() < end,
                "the real kube-apiserver was not ready within 120 s; its log: {}",
                std::fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A kubeconfig for this server: its CA (the self-made serving certificate) and token.
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_with(&self.token)
    }

    /// A kubeconfig for this server and `token`.
    pub fn kubeconfig_with(&self, token: &str) -> String {
        use base64::Engine;
        let ca = std::fs::read(self.ca()).expect("the server's certificate");
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: devplug\n  user:\n    token: {}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: devplug\ncurrent-context: real\n",
            self.url,
            base64::engine::general_purpose::STANDARD.encode(ca),
            token
        )
    }

    pub fn write_kubeconfig(&self, path: &Path) {
        std::fs::write(path, self.kubeconfig()).expect("write kubeconfig");
    }

    async fn try_client(&self) -> kube::Result<kube::Client> {
        self.client_with(&self.token).await
    }

    /// A client that sends `token`.
    pub async fn client_with(&self, token: &str) -> kube::Result<kube::Client> {
        let kc =
            kube::config::Kubeconfig::from_yaml(&self.kubeconfig_with(token)).map_err(kube::Error::InferKubeconfig)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(kube::Error::InferKubeconfig)?;
        kube::Client::try_from(cfg)
    }

    pub fn client(&self) -> kube::Client {
        self.client.clone().expect("made when the server was ready")
    }

    /// `method path` with a JSON body; (status, answer).
    pub async fn send(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.send_with(&self.client(), method, path, "application/json", body).await
    }

    /// [`send`](Self::send) as the holder of `token`, with `content_type`.
    pub async fn send_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let client = self.client_with(token).await.expect("a client for the token");
        self.send_with(&client, method, path, content_type, body).await
    }

    async fn send_with(
        &self,
        client: &kube::Client,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .body(body.map_or_else(kube::client::Body::empty, |b| {
                kube::client::Body::from(serde_json::to_vec(b).expect("JSON"))
            }))
            .expect("request");
        let resp = client.send(req).await.expect("the real API server answers");
        let code = resp.status().as_u16();
        let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// Start kube-scheduler (`kube-scheduler` beside the other assets, which
    /// scripts/kube-assets/build makes too) against this server; `false` (with one line
    /// saying so) when the assets have none.
    pub fn start_scheduler(&mut self, test: &str) -> bool {
        let token = self.token.clone();
        self.start_scheduler_as(test, &token)
    }

    /// [`start_scheduler`](Self::start_scheduler) with the identity `token` names.
    pub fn start_scheduler_as(&mut self, test: &str, token: &str) -> bool {
        let bin = self.assets.join("kube-scheduler");
        if !bin.is_file() {
            eprintln!("{test}: no kube-scheduler in {ASSETS}; the scheduler's part did not run");
            return false;
        }
        let kubeconfig = self.dir.path().join("scheduler.kubeconfig");
        std::fs::write(&kubeconfig, self.kubeconfig_with(token)).expect("write kubeconfig");
        let child = Command::new(bin)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--leader-elect=false", "--secure-port=0"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("scheduler.log")).expect("scheduler log"))
            .spawn()
            .expect("start kube-scheduler");
        self.scheduler = Some(child);
        true
    }

    /// What kubelet reports of a node the scheduler may use: Ready, room for pods.
    pub async fn make_node_ready(&self, name: &str) {
        let path = format!("/api/v1/nodes/{name}");
        let (_, mut node) = self.send("GET", &path, None).await;
        node["status"] = serde_json::json!({
            "capacity": { "cpu": "8", "memory": "16Gi", "pods": "110" },
            "allocatable": { "cpu": "8", "memory": "16Gi", "pods": "110" },
            "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready",
                "lastHeartbeatTime": "2026-11-28T00:00:00Z", "lastTransitionTime": "2026-11-28T00:00:00Z" }],
        });
        let (code, answer) = self.send("PUT", &format!("{path}/status"), Some(&node)).await;
        assert_eq!(code, 200, "{answer}");
    }

    /// A Node named `name` (what kubelet registers).
    pub async fn create_node(&self, name: &str) -> String {
        let node = serde_json::json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": name } });
        let (code, answer) = self.send("POST", "/api/v1/nodes", Some(&node)).await;
        assert_eq!(code, 201, "create Node {name}: {answer}");
        answer["metadata"]["uid"].as_str().unwrap_or_default().to_owned()
    }

    /// The ResourceSlices of `node` and `driver`.
    pub async fn slices(&self, node: &str, driver: &str) -> Vec<Value> {
        let path = format!(
            "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{node}%2Cspec.driver%3D{driver}"
        );
        let (code, answer) = self.send("GET", &path, None).await;
        assert_eq!(code, 200, "{answer}");
        answer["items"].as_array().cloned().unwrap_or_default()
    }

    /// What the scheduler does to a claim: create it (one `exactly` request per result) and
    /// write its allocation through `/status`. Returns its UID.
    pub async fn allocate_claim(&self, namespace: &str, name: &str, results: &[(&str, &str, &str, &str)]) -> String {
        self.namespace(namespace).await;
        let mut requests: Vec<&str> = results.iter().map(|(r, ..)| *r).collect();
        requests.dedup();
        let claim = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": name, "namespace": namespace },
            "spec": { "devices": { "requests": requests.iter().map(|r| serde_json::json!({
                "name": r, "exactly": { "deviceClassName": "devplug", "allocationMode": "ExactCount", "count": 1 }
            })).collect::<Vec<_>>() } },
        });
        let base = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims");
        let (code, mut stored) = self.send("POST", &base, Some(&claim)).await;
        assert_eq!(code, 201, "create ResourceClaim {namespace}/{name}: {stored}");
        stored["status"] = serde_json::json!({ "allocation": { "devices": { "results": results.iter().map(|(request, driver, pool, device)| serde_json::json!({
            "request": request, "driver": driver, "pool": pool, "device": device
        })).collect::<Vec<_>>() } } });
        // As kube-scheduler does for devices of a node-local pool: the allocation is for the
        // node its slices name.
        if let Some((_, driver, pool, _)) = results.first() {
            let path = format!("/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3D{driver}");
            let (_, slices) = self.send("GET", &path, None).await;
            let node = slices["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["spec"]["pool"]["name"] == *pool)
                .and_then(|s| s["spec"]["nodeName"].as_str().map(str::to_owned));
            if let Some(node) = node {
                stored["status"]["allocation"]["nodeSelector"] = serde_json::json!({ "nodeSelectorTerms": [
                    { "matchFields": [{ "key": "metadata.name", "operator": "In", "values": [node] }] }
                ] });
            }
        }
        let (code, answer) = self.send("PUT", &format!("{base}/{name}/status"), Some(&stored)).await;
        assert_eq!(code, 200, "allocate ResourceClaim {namespace}/{name}: {answer}");
        answer["metadata"]["uid"].as_str().unwrap_or_default().to_owned()
    }

    /// Create ResourceClaim `namespace/name` asking for `devices` (its `spec.devices`) and a pod
    /// of the same name that uses it, for kube-scheduler to allocate.
    pub async fn claim_with_pod(&self, namespace: &str, name: &str, devices: &Value) {
        self.namespace(namespace).await;
        let claim = serde_json::json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": name, "namespace": namespace }, "spec": { "devices": devices } });
        let path = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims");
        let (code, answer) = self.send("POST", &path, Some(&claim)).await;
        assert_eq!(code, 201, "{answer}");
        let pod = serde_json::json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name, "namespace": namespace },
            "spec": { "resourceClaims": [{ "name": "c", "resourceClaimName": name }],
                      "containers": [{ "name": "c", "image": "busybox", "resources": { "claims": [{ "name": "c" }] } }] } });
        let (code, answer) = self.send("POST", &format!("/api/v1/namespaces/{namespace}/pods"), Some(&pod)).await;
        assert_eq!(code, 201, "{answer}");
    }

    /// Wait (up to `timeout`) until kube-scheduler has decided on pod `namespace/name`: `Ok` once
    /// it is scheduled, `Err(the PodScheduled condition)` once no allocation of its claims fits.
    pub async fn scheduling(&self, namespace: &str, name: &str, timeout: std::time::Duration) -> Result<(), Value> {
        let end = std::time::Instant::now() + timeout;
        loop {
            let (_, pod) = self.send("GET", &format!("/api/v1/namespaces/{namespace}/pods/{name}"), None).await;
            let scheduled =
                pod["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "PodScheduled");
            match scheduled {
                Some(c) if c["status"] == "True" => return Ok(()),
                Some(c)
                    if c["status"] == "False"
                        && c["message"].as_str().unwrap_or("").contains("cannot allocate all claims") =>
                {
                    return Err(c.clone());
                }
                _ => {}
            }
            assert!(std::time::Instant::now() < end, "{namespace}/{name}: kube-scheduler decided nothing: {pod}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Namespace `ns` and its `default` ServiceAccount (ServiceAccount admission gives a pod
    /// that names none that one, and refuses the pod while it is missing; no controller-manager
    /// makes it here).
    pub async fn namespace(&self, ns: &str) {
        let namespace = serde_json::json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } });
        let (code, answer) = self.send("POST", "/api/v1/namespaces", Some(&namespace)).await;
        assert!(code == 201 || code == 409, "create Namespace {ns}: {answer}");
        let sa = serde_json::json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": { "name": "default", "namespace": ns } });
        let (code, answer) = self.send("POST", &format!("/api/v1/namespaces/{ns}/serviceaccounts"), Some(&sa)).await;
        assert!(code == 201 || code == 409, "create ServiceAccount {ns}/default: {answer}");
    }

    /// Create `objects` as the admin (the chart's RBAC, policy, ServiceAccount, DeviceClasses:
    /// the kinds devplug's DRA side depends on; workloads are not started here).
    pub async fn apply(&self, objects: &[Value]) {
        for o in objects {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or("default");
            let path = match o["kind"].as_str().unwrap_or("") {
                "ServiceAccount" => format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                "ClusterRole" => "/apis/rbac.authorization.k8s.io/v1/clusterroles".into(),
                "ClusterRoleBinding" => "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".into(),
                "ValidatingAdmissionPolicy" => {
                    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies".into()
                }
                "ValidatingAdmissionPolicyBinding" => {
                    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings".into()
                }
                "DeviceClass" => "/apis/resource.k8s.io/v1/deviceclasses".into(),
                _ => continue,
            };
            if o["kind"] == "ServiceAccount" {
                self.namespace(ns).await;
            }
            let (code, answer) = self.send("POST", &path, Some(o)).await;
            assert!(code == 201 || code == 409, "create {} {}: {answer}", o["kind"], o["metadata"]["name"]);
        }
    }

    /// A token of ServiceAccount `ns/sa` bound to Pod `pod` on node `node`, from the TokenRequest
    /// API as kubelet gets a projected token: the server authenticates it as that account with
    /// the node's name in its extra `authentication.kubernetes.io/node-name`.
    pub async fn pod_bound_token(&self, ns: &str, sa: &str, node: &str, pod: &str) -> String {
        let spec = serde_json::json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": pod, "namespace": ns },
            "spec": { "nodeName": node, "serviceAccountName": sa, "containers": [{ "name": "devplug", "image": "devplug" }] } });
        let (code, created) = self.send("POST", &format!("/api/v1/namespaces/{ns}/pods"), Some(&spec)).await;
        assert_eq!(code, 201, "create Pod {ns}/{pod}: {created}");
        let request = serde_json::json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": { "expirationSeconds": 3600, "boundObjectRef": { "apiVersion": "v1", "kind": "Pod", "name": pod,
                "uid": created["metadata"]["uid"] } } });
        let (code, answer) =
            self.send("POST", &format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"), Some(&request)).await;
        assert_eq!(code, 201, "TokenRequest for {ns}/{sa}: {answer}");
        answer["status"]["token"].as_str().expect("a token").to_owned()
    }

    /// Wait until the ValidatingAdmissionPolicy named `policy` refuses what it should: a
    /// dry-run create, as `token`, of a slice of another node (the server loads new policies
    /// asynchronously). Nothing is stored by a dry run.
    pub async fn wait_policy(&self, token: &str, policy: &str, driver: &str) {
        let probe = serde_json::json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": { "name": "policy-probe" },
            "spec": { "driver": driver, "nodeName": "policy-probe-node", "pool": { "name": "p", "generation": 1, "resourceSliceCount": 1 } } });
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let (code, answer) = self
                .send_as(
                    token,
                    "POST",
                    "/apis/resource.k8s.io/v1/resourceslices?dryRun=All",
                    "application/json",
                    Some(&probe),
                )
                .await;
            if code == 403 && answer["message"].as_str().unwrap_or("").contains(policy) {
                return;
            }
            assert!(Instant::now() < end, "the policy {policy} never took effect: {code} {answer}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A claim as stored.
    pub async fn claim(&self, namespace: &str, name: &str) -> Value {
        let (code, answer) = self
            .send("GET", &format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"), None)
            .await;
        assert_eq!(code, 200, "{answer}");
        answer
    }
}
