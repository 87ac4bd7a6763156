//! What no grant changes in what a backend hands containers: the env keys a loader, libc,
//! shell or language runtime acts on (they pass only when the operator's grant names the exact
//! key), and the container paths no mount may cover or land in.

use crate::gate::clip;

/// Env keys a dynamic loader, libc, shell or language runtime acts on before or as the workload
/// runs (code to load, options to inject, where to find modules): a backend that could set them
/// could run code in every container that gets its devices. Refused unless the operator's grant
/// names the exact key.
const HOOK_ENV: &[&str] = &[
    "BASHOPTS",
    "BASH_ENV",
    "CLASSPATH",
    "DOTNET_STARTUP_HOOKS",
    "ENV",
    "GCONV_PATH",
    "GETCONF_DIR",
    "GIO_EXTRA_MODULES",
    "GIO_MODULE_DIR",
    "GLIBC_TUNABLES",
    "GTK_MODULES",
    "HOSTALIASES",
    "IFS",
    "JAVA_TOOL_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "LOCALDOMAIN",
    "LOCPATH",
    "LUA_CPATH",
    "LUA_PATH",
    "NIS_PATH",
    "NLSPATH",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PATH",
    "PERL5LIB",
    "PERL5OPT",
    "PERLLIB",
    "PROMPT_COMMAND",
    "PS4",
    "QT_PLUGIN_PATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "RUBYLIB",
    "RUBYOPT",
    "SHELLOPTS",
    "TMPDIR",
    "TZDIR",
    "_JAVA_OPTIONS",
];
/// Prefixes of the same kind: the loader's and libc's (`LD_`, `DYLD_`, `MALLOC_`), CUDA's
/// injection hooks, OpenSSL's config and engines, exported bash functions, .NET profilers, and
/// Python's startup knobs.
const HOOK_ENV_PREFIXES: &[&str] =
    &["LD_", "DYLD_", "MALLOC_", "CUDA_INJECTION", "OPENSSL_", "BASH_FUNC_", "CORECLR_", "COMPlus_", "PYTHON"];

/// Whether env key `k` is one of the known loader, libc, shell and runtime hooks above: those
/// need the operator's exact word even inside a granted prefix. Every other key is judged by
/// the grant alone, which admits exact keys and vendor prefixes only (`crate::gate::EnvGrant`).
pub fn hook_env(k: &str) -> bool {
    HOOK_ENV.contains(&k) || HOOK_ENV_PREFIXES.iter().any(|p| k.starts_with(p))
}

/// Container paths no mount may cover, whatever the grants: a container's root, kernel views,
/// the directories its programs and libraries come from.
const FORBIDDEN_MOUNT_TARGETS: &[&str] = &[
    "/",
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/usr",
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libexec",
    "/var/run",
    "/run",
];
/// Files no mount may cover: the loader's config and cache, and the user and group databases.
const FORBIDDEN_MOUNT_FILES: &[&str] = &[
    "/etc/ld.so.preload",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/passwd",
    "/etc/shadow",
    "/etc/group",
    "/etc/gshadow",
    "/etc/sudoers",
    "/etc/nsswitch.conf",
];
/// Trees no mount may land in: kernel views, the loader's config dir, and where Kubernetes puts
/// a pod's service-account token and other secrets.
const FORBIDDEN_MOUNT_TREES: &[&str] =
    &["/proc/", "/sys/", "/etc/ld.so.conf.d/", "/var/run/secrets/", "/run/secrets/", "/etc/sudoers.d/"];
/// Program directories whose shells and loader and libc files no mount may replace.
const PROGRAM_DIRS: &[&str] =
    &["/bin", "/sbin", "/usr/bin", "/usr/sbin", "/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64"];
/// Shells (and `env`, which scripts run through), by file name.
const SHELLS: &[&str] = &["sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "busybox", "env"];
/// File-name prefixes of the dynamic loader and the C library's parts.
const LOADER_FILES: &[&str] =
    &["ld-linux", "ld-musl", "ld.so", "libc.so", "libc-", "libc.musl", "libpthread", "libdl.", "libm.so", "librt."];

/// Why no mount may land on container path `p` (clean and absolute), if it is protected.
pub(super) fn protected_target(p: &str) -> Option<&'static str> {
    if FORBIDDEN_MOUNT_TARGETS.contains(&p) {
        return Some("a directory the container's programs or kernel views live in");
    }
    if FORBIDDEN_MOUNT_FILES.contains(&p) {
        return Some("the loader's configuration or the user and group databases");
    }
    if FORBIDDEN_MOUNT_TREES.iter().any(|t| p.starts_with(t)) {
        return Some("kernel views, the loader's configuration, or the pod's secrets");
    }
    let (dir, name) = p.rsplit_once('/')?;
    let dir = if dir.is_empty() { "/" } else { dir };
    // A program dir itself, or a dir inside one (`/usr/lib/x86_64-linux-gnu`), holds the shells,
    // the loader and libc.
    let in_program_dir = PROGRAM_DIRS.iter().any(|d| dir == *d || dir.starts_with(&format!("{d}/")));
    if in_program_dir && (SHELLS.contains(&name) || LOADER_FILES.iter().any(|f| name.starts_with(f))) {
        return Some("a shell, the dynamic loader or libc");
    }
    None
}

/// Absolute, and no `.`, `..`, empty component or NUL.
pub(super) fn clean_absolute(p: &str) -> Result<(), String> {
    let Some(rest) = p.strip_prefix('/') else {
        return Err(format!("{} is not an absolute path", clip(p)));
    };
    if p.contains('\0') {
        return Err(format!("{} contains NUL", clip(p)));
    }
    if p != "/" && rest.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(format!("{} is not clean ('.', '..' or an empty component)", clip(p)));
    }
    Ok(())
}
