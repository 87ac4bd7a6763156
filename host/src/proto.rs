//! Generated gRPC code for the kubelet APIs (from `proto/`, by `build.rs`).

/// Device Plugin API v1beta1 (`/v1beta1.Registration`, `/v1beta1.DevicePlugin`).
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");

    /// The only version kubelet accepts in `RegisterRequest.version`.
    pub const VERSION: &str = "v1beta1";
    /// Kubelet's registration socket, inside the device-plugins dir.
    pub const KUBELET_SOCKET: &str = "kubelet.sock";
}

/// Pod resources API v1 (`/v1.PodResourcesLister`).
pub mod podresources {
    tonic::include_proto!("v1");
}

/// Kubelet's DRA plugin API (`/k8s.io.kubelet.pkg.apis.dra.{v1,v1beta1}.DRAPlugin`).
pub mod dra {
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }

    /// What a DRA plugin lists in `PluginInfo.supported_versions`: the gRPC services it serves,
    /// newest first (kubelet 1.34+ picks `v1.DRAPlugin`, 1.32-1.33 `v1beta1.DRAPlugin`).
    pub(crate) const SERVICES: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
}

/// Kubelet's DRA resource health API (KEP-4680), served on each DRA plugin's socket: `v1alpha1`
/// (kubelet 1.34-1.36) and `v1` (1.37).
pub mod dra_health {
    pub mod v1alpha1 {
        tonic::include_proto!("v1alpha1");
    }
    /// Its proto package is `v1`, like the pod resources API's: prost writes both into one file,
    /// so this module holds the pod resources types too (unused here).
    pub mod v1 {
        tonic::include_proto!("v1");
    }

    /// What a DRA plugin adds to `PluginInfo.supported_versions` for the health services it
    /// serves (kubelet picks its DRAPlugin service from the same list and ignores these).
    pub(crate) const SERVICES: [&str; 2] = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];
}

/// Plugin-watcher registration (`/pluginregistration.Registration`).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");

    /// `PluginInfo.type` for device plugins.
    pub const DEVICE_PLUGIN: &str = "DevicePlugin";
    /// `PluginInfo.type` for DRA drivers' kubelet plugins.
    pub const DRA_PLUGIN: &str = "DRAPlugin";
}
