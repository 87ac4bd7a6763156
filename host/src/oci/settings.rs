//! The `[registry]` section of the config and the registry client it makes.
//!
//! ```toml
//! [registry]
//! poll = "1m"                                   # how often followed tags are resolved again
//! auth_file = "/var/run/secrets/devplug/.dockerconfigjson"   # a docker config.json (imagePullSecret)
//! public_key = "/etc/devplug/cosign.pub"        # set: every image needs a valid signature by it
//! operator_key = "/etc/devplug/operator.pub"    # set: native code it signed is loaded, not compiled
//! ca_file = "/etc/devplug/registry-ca.pem"      # extra CA for a private registry
//! plain_http = ["127.0.0.1:5000"]               # registries spoken to over HTTP: loopback or listed
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistrySettings {
    #[serde(with = "humantime_serde")]
    pub poll: Duration,
    pub auth_file: Option<PathBuf>,
    pub public_key: Option<PathBuf>,
    /// The operator's public key: native code `devplug precompile` attached to a version and
    /// signed with it is loaded instead of compiling the version on the node. Never the
    /// backends' key (`public_key`): whoever can sign native code can run anything in devplug.
    pub operator_key: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    /// Registries (`host:port`) reached over plain HTTP. Only these: never a fallback.
    pub plain_http: Vec<String>,
    /// How long one pull may take before it counts as failed (the old version keeps serving).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for RegistrySettings {
    fn default() -> Self {
        RegistrySettings {
            poll: Duration::from_secs(60),
            auth_file: None,
            public_key: None,
            operator_key: None,
            ca_file: None,
            plain_http: Vec::new(),
            timeout: Duration::from_secs(60),
        }
    }
}

impl RegistrySettings {
    /// Check what can be checked without a network: poll bounds, the key and CA files parse.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.poll >= Duration::from_millis(100), "registry.poll must be at least 100ms");
        let backends = self.public_key.as_deref().map(crate::oci::signature::load_public_key).transpose()?;
        if let Some(k) = &self.operator_key {
            let operator = crate::oci::signature::load_public_key(k)
                .map_err(|e| anyhow::anyhow!("registry.operator_key: {e:#}"))?;
            anyhow::ensure!(
                backends != Some(operator),
                "registry.operator_key ({}) is the same key as registry.public_key: whoever signs backends could then hand nodes native code, which runs as devplug itself, outside the sandbox; give the operator a key of its own",
                k.display()
            );
        }
        if let Some(ca) = &self.ca_file {
            std::fs::read(ca).map_err(|e| anyhow::anyhow!("registry.ca_file {}: {e}", ca.display()))?;
        }
        if let Some(a) = &self.auth_file {
            read_auth_file(a)?;
        }
        Ok(())
    }

    /// The registry client.
    pub fn client(&self) -> anyhow::Result<Client> {
        let mut extra = Vec::new();
        if let Some(ca) = &self.ca_file {
            let data = std::fs::read(ca).map_err(|e| anyhow::anyhow!("registry.ca_file {}: {e}", ca.display()))?;
            extra.push(Certificate { encoding: CertificateEncoding::Pem, data });
        }
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.plain_http.clone()),
            extra_root_certificates: extra,
            connect_timeout: Some(Duration::from_secs(5)),
            read_timeout: Some(self.timeout),
            ..ClientConfig::default()
        };
        crate::tls::install_crypto();
        Client::try_from(config).map_err(|e| anyhow::anyhow!("registry client: {e}"))
    }

    /// The reader every pull, resolve and signature check goes through (byte-capped bodies).
    pub(crate) fn fetcher(&self) -> anyhow::Result<super::fetch::Fetcher> {
        let ca = match &self.ca_file {
            Some(ca) => Some(std::fs::read(ca).map_err(|e| anyhow::anyhow!("registry.ca_file {}: {e}", ca.display()))?),
            None => None,
        };
        super::fetch::Fetcher::new(self.plain_http.clone(), ca.as_deref(), self.timeout)
    }

    /// The credentials for `reference`'s registry from the auth file, else anonymous.
    pub(crate) fn auth_for(&self, reference: &Reference) -> anyhow::Result<RegistryAuth> {
        let Some(file) = &self.auth_file else { return Ok(RegistryAuth::Anonymous) };
        let auths = read_auth_file(file)?;
        let registry = reference.resolve_registry();
        Ok(auths
            .into_iter()
            .find(|(host, _)| host_matches(host, registry))
            .map(|(_, cred)| cred)
            .unwrap_or(RegistryAuth::Anonymous))
    }
}

/// `https://index.docker.io/v1/` and `registry:5000` name hosts the way docker's config does.
fn host_matches(entry: &str, registry: &str) -> bool {
    let host = entry.trim_start_matches("https://").trim_start_matches("http://");
    let host = host.split('/').next().unwrap_or(host);
    host == registry || (registry == "index.docker.io" && host == "docker.io")
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    /// A bearer token for the registry itself (what `docker login` stores for token-only logins).
    registrytoken: Option<String>,
}

/// A docker `config.json` (the `.dockerconfigjson` of an imagePullSecret): host → credentials
/// (user and password, or a registry token).
fn read_auth_file(path: &Path) -> anyhow::Result<Vec<(String, RegistryAuth)>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("registry.auth_file {}: {e}", path.display()))?;
    let cfg: DockerConfig = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("registry.auth_file {}: not a docker config.json: {e}", path.display()))?;
    let mut out = Vec::new();
    for (host, a) in cfg.auths {
        if let Some(token) = a.registrytoken {
            out.push((host, RegistryAuth::Bearer(token)));
            continue;
        }
        let pair = match (a.auth, a.username, a.password) {
            (Some(b64), _, _) => {
                let raw = base64::engine::general_purpose::STANDARD.decode(b64.trim()).map_err(|e| {
                    anyhow::anyhow!("registry.auth_file {}: {host}: auth is not base64: {e}", path.display())
                })?;
                let text = String::from_utf8(raw)
                    .map_err(|_| anyhow::anyhow!("registry.auth_file {}: {host}: auth is not UTF-8", path.display()))?;
                let (u, p) = text.split_once(':').ok_or_else(|| {
                    anyhow::anyhow!("registry.auth_file {}: {host}: auth is not user:password", path.display())
                })?;
                (u.to_owned(), p.to_owned())
            }
            (None, Some(u), Some(p)) => (u, p),
            _ => continue,
        };
        out.push((host, RegistryAuth::Basic(pair.0, pair.1)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 61: the operator's key signs native code, which runs as devplug itself; the key
    /// that signs backends may not be it (whoever publishes a backend could then run anything).
    #[test]
    fn the_operator_key_must_be_its_own() {
        use p256::pkcs8::{EncodePublicKey, LineEnding};
        let d = tempfile::tempdir().unwrap();
        let write = |name: &str, seed: u8| {
            let key = p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap();
            let pem = key.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
            let path = d.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let (vendor, copy, operator) = (write("vendor.pub", 7), write("copy.pub", 7), write("operator.pub", 9));
        let s = |public: &Path, op: &Path| RegistrySettings {
            public_key: Some(public.to_owned()),
            operator_key: Some(op.to_owned()),
            ..RegistrySettings::default()
        };
        assert!(s(&vendor, &operator).validate().is_ok());
        let e = s(&vendor, &copy).validate().unwrap_err().to_string();
        assert!(e.starts_with("registry.operator_key") && e.contains("same key as registry.public_key"), "{e}");
        std::fs::write(d.path().join("bad.pub"), "not a key").unwrap();
        let e = s(&vendor, &d.path().join("bad.pub")).validate().unwrap_err().to_string();
        assert!(e.starts_with("registry.operator_key:"), "{e}");
    }

    #[test]
    fn auth_files_give_basic_credentials_per_host() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("config.json");
        let b64 = base64::engine::general_purpose::STANDARD.encode("ann:s3cret");
        std::fs::write(&f, format!(r#"{{"auths":{{"127.0.0.1:5000":{{"auth":"{b64}"}},"https://other.io/v2/":{{"username":"u","password":"p"}},"tok.io":{{"registrytoken":"t0k"}}}}}}"#)).unwrap();
        let s = RegistrySettings { auth_file: Some(f.clone()), ..RegistrySettings::default() };
        let r: Reference = "127.0.0.1:5000/devplug/gpu:1".parse().unwrap();
        assert_eq!(s.auth_for(&r).unwrap(), RegistryAuth::Basic("ann".into(), "s3cret".into()));
        let r: Reference = "other.io/x:1".parse().unwrap();
        assert_eq!(s.auth_for(&r).unwrap(), RegistryAuth::Basic("u".into(), "p".into()));
        let r: Reference = "tok.io/x:1".parse().unwrap();
        assert_eq!(s.auth_for(&r).unwrap(), RegistryAuth::Bearer("t0k".into()));
        let r: Reference = "third.io/x:1".parse().unwrap();
        assert_eq!(s.auth_for(&r).unwrap(), RegistryAuth::Anonymous);
        std::fs::write(&f, "{not json").unwrap();
        assert!(s.validate().unwrap_err().to_string().contains("not a docker config.json"));
    }
}
