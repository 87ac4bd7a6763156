//! A real single-node Kubernetes cluster on this machine's loopback, for the deployment test
//! (tests/cluster.rs): etcd, kube-apiserver (`Node,RBAC`, NodeRestriction and ServiceAccount
//! admission, default gates), kube-controller-manager, kube-scheduler, containerd (CRI with CDI
//! and image volumes, runc) and kubelet, all from the `KUBEBUILDER_ASSETS` directory that
//! `scripts/kube-assets/build --node --containerd-git-dir …` fills.
//!
//! The facts it rests on (read in the kubernetes and containerd trees the assets are built from):
//! - pods reach the API server with no kube-proxy because the service range is 127.0.1.0/24 and
//!   the server listens on its first address, 127.0.1.1:443, which is the `kubernetes` Service's
//!   ClusterIP (`--endpoint-reconciler-type=none`: Endpoints refuse loopback addresses);
//! - kubelet runs cgroupfs without per-QoS cgroups and `failCgroupV1: false`, image GC and
//!   eviction off (nothing can be pulled here), every pod on the host network; a bridge CNI
//!   config only so containerd reports NetworkReady (no pod uses it);
//! - every component authenticates with a token of its own identity (`system:node:NODE` in
//!   `system:nodes` for kubelet, so the Node authorizer and NodeRestriction apply to it).
//!
//! Everything lives in one private directory, with three exceptions the binaries impose, each
//! put back on drop (which also runs when the test panics): kubelet sets six kernel tunables
//! (`protectKernelDefaults: false` is kubelet's default; the values are restored), links
//! container logs into `/var/log/containers`, and containerd's shims put their sockets in
//! `/run/containerd/s`. kubelet is started without `iptables` on its PATH, so it leaves the
//! machine's tables alone (it only adds chains "for the benefit of other components").
//!
//! Tearing down: kubelet stops, every task in containerd's `k8s.io` namespace is killed and
//! deleted (runc removes its cgroups), containerd stops, any shim of this containerd still alive
//! is killed by its executable, what is still mounted under the private directory is unmounted,
//! and the control plane goes with [`RealApiServer`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::envtest::{ASSETS, RealApiServer, Shape, random_token};

/// What a cluster needs from the assets directory.
const NEEDS: [&str; 8] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubelet",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
];

/// The node's name (kubelet's `--hostname-override`).
pub const NODE: &str = "devplug-e2e";

/// The kernel tunables kubelet sets at start.
const TUNABLES: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

const SHIM_SOCKETS: &str = "/run/containerd/s";
/// runc puts each container's cgroup under `<hierarchy>/k8s.io` (containerd's namespace).
const CGROUP_PARENT: &str = "k8s.io";
/// kubelet's root dir as clusters have it: the Device Plugin API is served in its
/// `device-plugins` whatever `--root-dir` says (`pluginapi.DevicePluginPath`), and the shipped
/// manifests name it. A private directory is bind-mounted here.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";
const CONTAINER_LOGS: &str = "/var/log/containers";

/// The assets directory when it holds a whole cluster and this process may run one; else
/// `None` after one line saying why `test` did not run.
pub fn assets(test: &str) -> Option<PathBuf> {
    let Some(dir) = std::env::var_os(ASSETS).filter(|d| !d.is_empty()).map(PathBuf::from) else {
        eprintln!(
            "{test}: did not run: {ASSETS} is not set (README.md, \"The real-cluster test\", says how to build the assets)"
        );
        return None;
    };
    // The pause image is built from kubernetes' own source, which the build leaves under src/.
    let missing: Vec<&str> = NEEDS.iter().copied().chain([PAUSE_SOURCE]).filter(|b| !dir.join(b).is_file()).collect();
    if !missing.is_empty() {
        eprintln!(
            "{test}: did not run: {ASSETS}={} has no {} (scripts/kube-assets/build --node --containerd-git-dir …)",
            dir.display(),
            missing.join(", ")
        );
        return None;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("{test}: did not run: kubelet and containerd need root");
        return None;
    }
    if !entries(Path::new(KUBELET_ROOT)).is_empty() {
        eprintln!("{test}: did not run: {KUBELET_ROOT} is in use (a kubelet runs on this machine)");
        return None;
    }
    Some(dir)
}

/// A cluster process: its name (for logs) and the child.
struct Daemon {
    name: &'static str,
    child: Child,
}

pub struct Cluster {
    /// etcd, kube-apiserver, kube-scheduler; dropped after the node parts.
    pub api: RealApiServer,
    assets: PathBuf,
    rig: tempfile::TempDir,
    kcm: Option<Daemon>,
    containerd: Option<Daemon>,
    kubelet: Option<Daemon>,
    kubelet_token: String,
    tunables: Vec<(&'static str, String)>,
    shim_sockets_before: Option<Vec<PathBuf>>,
    container_logs_existed: bool,
    /// What this cluster made of KUBELET_ROOT's path (removed again, deepest first), and
    /// whether the private directory is mounted there.
    kubelet_root_made: Vec<PathBuf>,
    kubelet_root_mounted: bool,
    /// The cgroup hierarchies' `k8s.io` dirs that were not there before (removed when empty).
    cgroups_new: Vec<PathBuf>,
}

/// `<hierarchy>/k8s.io` in every cgroup hierarchy mounted at /sys/fs/cgroup (v1 and v2).
fn cgroup_parents() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![root.join(CGROUP_PARENT)];
    dirs.extend(entries(root).into_iter().filter(|d| d.is_dir()).map(|d| d.join(CGROUP_PARENT)));
    dirs
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).collect()
}

impl Cluster {
    /// Bring the cluster up and wait until its node is Ready.
    pub async fn up(assets: &Path) -> Cluster {
        let (kcm_token, scheduler_token, kubelet_token) = (random_token(), random_token(), random_token());
        let shape = Shape {
            address: "127.0.1.1",
            port: Some(443),
            service_range: "127.0.1.0/24",
            controllers: true,
            users: vec![
                (kcm_token.clone(), "system:kube-controller-manager".into(), String::new()),
                (scheduler_token.clone(), "system:kube-scheduler".into(), String::new()),
                (kubelet_token.clone(), format!("system:node:{NODE}"), "system:nodes".into()),
            ],
        };
        let mut api = RealApiServer::start(assets, &shape).await;
        assert!(api.start_scheduler_as("cluster", &scheduler_token), "kube-scheduler is among the assets");
        let rig = tempfile::Builder::new().prefix("devplug-cluster-").tempdir().expect("tempdir");
        let mut cluster = Cluster {
            api,
            assets: assets.to_owned(),
            rig,
            kcm: None,
            containerd: None,
            kubelet: None,
            kubelet_token,
            tunables: TUNABLES
                .iter()
                .filter_map(|t| std::fs::read_to_string(Path::new("/proc/sys").join(t)).ok().map(|v| (*t, v)))
                .collect(),
            shim_sockets_before: Path::new(SHIM_SOCKETS).exists().then(|| entries(Path::new(SHIM_SOCKETS))),
            container_logs_existed: Path::new(CONTAINER_LOGS).exists(),
            kubelet_root_made: Vec::new(),
            kubelet_root_mounted: false,
            cgroups_new: cgroup_parents().into_iter().filter(|d| !d.exists()).collect(),
        };
        for d in ["logs", "cdi", "cni", "kubelet", "pod-logs", "containerd"] {
            std::fs::create_dir_all(cluster.path(d)).expect("rig dir");
        }
        cluster.mount_kubelet_root();
        cluster.start_controller_manager(&kcm_token);
        cluster.start_containerd().await;
        cluster.start_kubelet();
        cluster.wait_node_ready(Duration::from_secs(120)).await;
        cluster
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.rig.path().join(p)
    }

    /// kubelet's root directory (the chart's `kubeletDir`), as kubelet and pods see it.
    pub fn kubelet_dir(&self) -> PathBuf {
        PathBuf::from(KUBELET_ROOT)
    }

    /// The directory containerd reads CDI specs from (the chart's `cdiDir`).
    pub fn cdi_dir(&self) -> PathBuf {
        self.path("cdi")
    }

    /// An admin's kubeconfig, written into the private directory (for helm).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        let p = self.path("admin.kubeconfig");
        self.api.write_kubeconfig(&p);
        p
    }

    fn spawn(&self, name: &'static str, bin: &Path, args: &[String], path_env: &str) -> Daemon {
        let log = std::fs::File::create(self.path(&format!("logs/{name}.log"))).expect("log file");
        let child = Command::new(bin)
            .args(args)
            .env_clear()
            .env("PATH", path_env)
            .env("HOME", self.rig.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} ({}): {e}", bin.display()));
        Daemon { name, child }
    }

    /// The log of `name` (kubelet, containerd, kube-controller-manager) so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("logs/{name}.log"))).unwrap_or_default()
    }

    /// The last 40 lines of [`log`](Self::log).
    pub fn tail(&self, name: &str) -> String {
        let log = self.log(name);
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The private `kubelet` directory at kubelet's usual root, so nothing of this test lands in
    /// the machine's own.
    fn mount_kubelet_root(&mut self) {
        let mut missing: Vec<PathBuf> =
            Path::new(KUBELET_ROOT).ancestors().filter(|a| !a.exists()).map(Path::to_owned).collect();
        missing.reverse();
        for d in &missing {
            std::fs::create_dir(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            self.kubelet_root_made.insert(0, d.clone());
        }
        let st = Command::new("mount").arg("--bind").arg(self.path("kubelet")).arg(KUBELET_ROOT).status();
        assert!(st.is_ok_and(|s| s.success()), "mount --bind over {KUBELET_ROOT} failed");
        self.kubelet_root_mounted = true;
    }

    fn start_controller_manager(&mut self, token: &str) {
        let kubeconfig = self.path("kcm.kubeconfig");
        std::fs::write(&kubeconfig, self.api.kubeconfig_with(token)).expect("kubeconfig");
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--use-service-account-credentials".into(),
            format!("--service-account-private-key-file={}", self.api.service_account_key().display()),
            format!("--root-ca-file={}", self.api.ca().display()),
            "--controllers=*".into(),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ];
        let bin = self.assets.join("kube-controller-manager");
        self.kcm = Some(self.spawn("kube-controller-manager", &bin, &args, "/usr/bin:/bin"));
    }

    fn containerd_socket(&self) -> PathBuf {
        self.path("containerd/containerd.sock")
    }

    async fn start_containerd(&mut self) {
        let r = |p: &str| self.path(p).display().to_string();
        let config = format!(
            r#"version = 3
root = '{root}'
state = '{state}'
imports = []
[grpc]
  address = '{socket}'
[ttrpc]
  address = '{socket}.ttrpc'
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{pause}'
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ['{cdi}']
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
      Root = '{runc}'
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = '{cni}'
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.internal.v1.opt']
  path = '{opt}'
"#,
            root = r("containerd/root"),
            state = r("containerd/state"),
            socket = self.containerd_socket().display(),
            pause = PAUSE,
            cdi = self.cdi_dir().display(),
            runc = r("containerd/runc"),
            cni = r("cni"),
            opt = r("containerd/opt"),
        );
        std::fs::write(self.path("containerd/config.toml"), config).expect("containerd config");
        // Only so containerd reports NetworkReady: every pod here is on the host network.
        std::fs::write(
            self.path("cni/10-devplug-e2e.conflist"),
            r#"{"cniVersion": "1.0.0", "name": "devplug-e2e", "plugins": [{"type": "bridge", "bridge": "dpe2e0",
               "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.254.254.0/24"}]]}}]}"#,
        )
        .expect("CNI config");
        let args = vec!["--config".into(), r("containerd/config.toml")];
        let path_env = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", self.assets.display());
        self.containerd = Some(self.spawn("containerd", &self.assets.join("containerd"), &args, &path_env));
        let end = Instant::now() + Duration::from_secs(60);
        while !self.ctr(&["version"]).status.success() {
            assert!(Instant::now() < end, "containerd did not answer within 60 s:\n{}", self.tail("containerd"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `ctr` against this containerd, in the CRI's `k8s.io` namespace.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new(self.assets.join("ctr"))
            .arg("--address")
            .arg(self.containerd_socket())
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr")
    }

    /// Import an image archive (docker or OCI) into the CRI's namespace.
    pub fn import(&self, archive: &Path) {
        let out = self.ctr(&["images", "import", &archive.display().to_string()]);
        assert!(out.status.success(), "ctr images import {}:\n{}", archive.display(), super::podman::text(&out));
    }

    fn start_kubelet(&mut self) {
        let kubeconfig = self.path("kubelet.kubeconfig");
        std::fs::write(&kubeconfig, self.api.kubeconfig_with(&self.kubelet_token)).expect("kubeconfig");
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
authorization: {{mode: Webhook}}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
podLogsDir: {logs}
evictionHard: {{memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: /etc/resolv.conf
"#,
            port = free_port(),
            socket = self.containerd_socket().display(),
            logs = self.path("pod-logs").display(),
        );
        std::fs::write(self.path("kubelet.yaml"), config).expect("kubelet config");
        let args = vec![
            format!("--config={}", self.path("kubelet.yaml").display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", self.kubelet_dir().display()),
            format!("--hostname-override={NODE}"),
            "--v=3".into(),
        ];
        // No /usr/sbin: kubelet would add its iptables chains to the machine's tables.
        self.kubelet = Some(self.spawn("kubelet", &self.assets.join("kubelet"), &args, "/usr/bin:/bin"));
    }

    /// Stop kubelet (SIGTERM, as systemd stops it) and start it again with the same config;
    /// running containers are containerd's and keep running. The log of the run before goes to
    /// `logs/kubelet.before-restart.log`, so [`log`](Self::log) is the new run's.
    pub async fn restart_kubelet(&mut self) {
        if let Some(mut k) = self.kubelet.take() {
            stop(&mut k);
            let old = self.log("kubelet");
            std::fs::write(self.path("logs/kubelet.before-restart.log"), old).expect("keep the log");
        }
        self.start_kubelet();
        self.wait_node_ready(Duration::from_secs(120)).await;
    }

    async fn wait_node_ready(&self, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            let (code, node) = self.api.send("GET", &format!("/api/v1/nodes/{NODE}"), None).await;
            let ready = code == 200
                && node["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if ready {
                return;
            }
            assert!(
                Instant::now() < end,
                "node {NODE} not Ready within {timeout:?}: {}\nkubelet:\n{}\ncontainerd:\n{}",
                node["status"]["conditions"],
                self.tail("kubelet"),
                self.tail("containerd")
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Create `object` (POST to `collection`) as the admin; the stored object.
    pub async fn create(&self, collection: &str, object: &Value) -> Value {
        let (code, answer) = self.api.send("POST", collection, Some(object)).await;
        assert_eq!(code, 201, "create {}: {answer}", object["metadata"]["name"]);
        answer
    }

    pub async fn get(&self, path: &str) -> Value {
        let (code, answer) = self.api.send("GET", path, None).await;
        assert_eq!(code, 200, "GET {path}: {answer}");
        answer
    }

    /// Namespace `ns`, once kube-controller-manager has made its `default` ServiceAccount
    /// (ServiceAccount admission refuses pods until then).
    pub async fn namespace(&self, ns: &str) {
        let (code, answer) = self
            .api
            .send(
                "POST",
                "/api/v1/namespaces",
                Some(&json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } })),
            )
            .await;
        assert!(code == 201 || code == 409, "create Namespace {ns}: {answer}");
        let end = Instant::now() + Duration::from_secs(60);
        while self.api.send("GET", &format!("/api/v1/namespaces/{ns}/serviceaccounts/default"), None).await.0 != 200 {
            assert!(
                Instant::now() < end,
                "no default ServiceAccount in {ns} after 60 s:\n{}",
                self.tail("kube-controller-manager")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Pod `ns/name`, waiting until `done` says of it `Some(…)`, or panicking after `timeout`
    /// with the pod and what kubelet said.
    pub async fn wait_pod<T>(&self, ns: &str, name: &str, timeout: Duration, done: impl Fn(&Value) -> Option<T>) -> T {
        let end = Instant::now() + timeout;
        loop {
            let (code, pod) = self.api.send("GET", &format!("/api/v1/namespaces/{ns}/pods/{name}"), None).await;
            if code == 200
                && let Some(t) = done(&pod)
            {
                return t;
            }
            assert!(
                Instant::now() < end,
                "pod {ns}/{name} not as wanted within {timeout:?}: {}\nits log:\n{}\nkubelet:\n{}",
                pod["status"],
                self.pod_log(ns, name),
                self.tail("kubelet")
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Every container log kubelet kept of pods named `name` in `ns` (all their restarts).
    pub fn pod_log(&self, ns: &str, name: &str) -> String {
        let prefix = format!("{ns}_{name}_");
        let mut out = String::new();
        for dir in entries(&self.path("pod-logs")) {
            if !dir.file_name().is_some_and(|f| f.to_string_lossy().starts_with(&prefix)) {
                continue;
            }
            for container in entries(&dir) {
                let mut files = entries(&container);
                files.sort();
                for f in files {
                    out.push_str(&std::fs::read_to_string(&f).unwrap_or_default());
                }
            }
        }
        out
    }

    /// The host PID of a running container (`containerd://ID` from a pod's status), read from
    /// containerd: `/proc/PID/root` is the container's own view of its files.
    pub fn container_pid(&self, container_id: &str) -> Option<u32> {
        let id = container_id.strip_prefix("containerd://")?;
        let out = self.ctr(&["tasks", "ls"]);
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next() == Some(id)).then(|| cols.next().and_then(|p| p.parse().ok())).flatten()
        })
    }

    /// The pod-resources socket kubelet serves (what it says each container holds).
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.kubelet_dir().join("pod-resources/kubelet.sock")
    }

    fn teardown(&mut self) {
        if let Some(mut k) = self.kubelet.take() {
            stop(&mut k);
        }
        if self.containerd.is_some() {
            let tasks = self.ctr(&["tasks", "ls", "-q"]);
            let ids: Vec<String> = String::from_utf8_lossy(&tasks.stdout).lines().map(str::to_owned).collect();
            for id in &ids {
                let _ = self.ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
            }
            for id in &ids {
                let _ = self.ctr(&["tasks", "rm", "-f", id]);
            }
            let containers = self.ctr(&["containers", "ls", "-q"]);
            for id in String::from_utf8_lossy(&containers.stdout).lines() {
                let _ = self.ctr(&["containers", "rm", id]);
            }
        }
        if let Some(mut c) = self.containerd.take() {
            stop(&mut c);
        }
        // Shims outlive containerd by design; any of ours still alive goes now.
        let shim = self.assets.join("containerd-shim-runc-v2");
        for p in entries(Path::new("/proc")) {
            let pid = p.file_name().and_then(|f| f.to_str()).and_then(|f| f.parse::<i32>().ok());
            if let Some(pid) = pid
                && std::fs::read_link(p.join("exe")).is_ok_and(|e| e == shim)
            {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
        if let Some(mut k) = self.kcm.take() {
            stop(&mut k);
        }
        // Deepest first: kubelet's volume mounts, containerd's overlay and shm mounts.
        let rig = self.rig.path().to_owned();
        let mut mounts: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|m| PathBuf::from(m.replace("\\040", " ")))
            .filter(|m| m.starts_with(&rig) || self.kubelet_root_mounted && m.starts_with(KUBELET_ROOT))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        for m in mounts {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
        for d in &self.kubelet_root_made {
            let _ = std::fs::remove_dir(d);
        }
        for link in entries(Path::new(CONTAINER_LOGS)) {
            if std::fs::read_link(&link).is_ok_and(|t| t.starts_with(&rig)) {
                let _ = std::fs::remove_file(&link);
            }
        }
        if !self.container_logs_existed {
            let _ = std::fs::remove_dir(CONTAINER_LOGS);
        }
        match &self.shim_sockets_before {
            Some(before) => {
                for s in entries(Path::new(SHIM_SOCKETS)) {
                    if !before.contains(&s) {
                        let _ = std::fs::remove_file(s);
                    }
                }
            }
            None => {
                let _ = std::fs::remove_dir_all(SHIM_SOCKETS);
                let _ = std::fs::remove_dir("/run/containerd");
            }
        }
        // Empty by now (runc removed each container's own); rmdir refuses anything else.
        for d in &self.cgroups_new {
            let _ = std::fs::remove_dir(d);
        }
        for (t, v) in &self.tunables {
            let p = Path::new("/proc/sys").join(t);
            if std::fs::read_to_string(&p).ok().as_deref() != Some(v.as_str()) {
                let _ = std::fs::write(&p, v.trim());
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.teardown();
        // A failed run's logs outlive the private directory (any run's, with
        // DEVPLUG_KEEP_CLUSTER_LOGS set).
        if std::thread::panicking() || std::env::var_os("DEVPLUG_KEEP_CLUSTER_LOGS").is_some() {
            let keep = super::paths::target_tmpdir().join("cluster-logs");
            let _ = std::fs::remove_dir_all(&keep);
            let copied = ["logs", "pod-logs"].iter().all(|d| {
                Command::new("cp").arg("-r").arg(self.path(d)).arg(keep.join(d)).status().is_ok_and(|s| s.success())
                    || std::fs::create_dir_all(&keep).is_ok()
                        && Command::new("cp")
                            .arg("-r")
                            .arg(self.path(d))
                            .arg(keep.join(d))
                            .status()
                            .is_ok_and(|s| s.success())
            });
            if copied {
                eprintln!("the cluster's logs are kept in {}", keep.display());
            }
        }
    }
}

/// SIGTERM, then SIGKILL after 30 s.
fn stop(d: &mut Daemon) {
    let pid = nix::unistd::Pid::from_raw(d.child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        if d.child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("{} did not stop on SIGTERM within 30 s; killed", d.name);
    let _ = d.child.kill();
    let _ = d.child.wait();
}

/// Where kubernetes' pause program is in the assets' source tree.
pub const PAUSE_SOURCE: &str = "src/build/pause/linux/pause.c";

/// The pause image the sandboxes run (containerd's pinned sandbox image).
pub const PAUSE: &str = "localhost/devplug-e2e/pause:1.0";

/// A test pod: on the host network, its image never pulled, quick to stop, no token; `extra`
/// is merged into its spec, and its container uses every claim `extra` names.
pub fn pod(name: &str, image: &str, script: &str, limits: BTreeMap<&str, &str>, extra: Value) -> Value {
    let mut spec = json!({
        "hostNetwork": true,
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "c", "image": image, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", script],
            "resources": { "limits": limits },
        }],
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    // A container gets a pod's claims only by naming them.
    let claims: Vec<Value> =
        spec["resourceClaims"].as_array().into_iter().flatten().map(|c| json!({ "name": c["name"] })).collect();
    if !claims.is_empty() {
        spec["containers"][0]["resources"]["claims"] = Value::Array(claims);
    }
    json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name }, "spec": spec })
}
