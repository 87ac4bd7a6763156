//! The process's TLS crypto: rustls with ring's provider, for every HTTPS client devplug builds
//! (registries through reqwest and oci-client, the API server through kube). reqwest is built
//! without a provider of its own (aws-lc's C build was the largest single step of a cold release
//! build), so this must run before any client is built; each constructor calls it.

/// Make ring rustls' process-wide crypto provider, once; later calls (and a provider some other
/// code installed first) leave it as it is.
pub(crate) fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err only when a provider is already installed: that one serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    /// Without a provider reqwest cannot build a client at all (not even for plain HTTP).
    #[test]
    fn a_registry_client_builds_once_the_crypto_is_installed() {
        super::install_crypto();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
        assert!(reqwest::Client::builder().build().is_ok());
    }
}
