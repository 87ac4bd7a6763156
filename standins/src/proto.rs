//! The kubelet APIs the stand-ins speak, generated from upstream's `.proto` files (`proto/`).

/// Device Plugin API v1beta1.
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");

    /// The only version kubelet's device manager accepts in `RegisterRequest.version`
    /// (`pkg/kubelet/apis/deviceplugin/v1beta1/constants.go`).
    pub const VERSION: &str = "v1beta1";
    /// Kubelet's registration socket in the device-plugins dir (same file).
    pub const KUBELET_SOCKET: &str = "kubelet.sock";
}

/// Plugin-watcher registration (`/pluginregistration.Registration`).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");

    /// `PluginInfo.type` of device plugins (`pluginregistration/v1/constants.go`).
    pub const DEVICE_PLUGIN: &str = "DevicePlugin";
    /// `PluginInfo.type` of DRA kubelet plugins (same file).
    pub const DRA_PLUGIN: &str = "DRAPlugin";
}

/// Kubelet's DRA plugin API.
pub mod dra {
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
}

/// Kubelet's DRA resource health API (KEP-4680), as kubelet 1.36 dials it.
pub mod dra_health {
    pub mod v1alpha1 {
        tonic::include_proto!("v1alpha1");
    }
}
