//! What a backend's `init` answers: its name, version and the resources it serves, each with the
//! kubelet options it wants.
//!
//! ```ignore
//! let info = Info::new("acme", env!("CARGO_PKG_VERSION"), [ResourceInfo::plain("acme.com/widget").with_preferred_allocation()]);
//! ```

use crate::{Info, ResourceInfo};

impl Info {
    /// Backend `name` at `version`, serving `resources`.
    pub fn new(name: &str, version: &str, resources: impl IntoIterator<Item = ResourceInfo>) -> Info {
        Info { name: name.to_owned(), version: version.to_owned(), resources: resources.into_iter().collect() }
    }
}

impl ResourceInfo {
    /// A resource kubelet allocates by itself: no preferred allocation, no pre-start call.
    pub fn plain(name: impl Into<String>) -> ResourceInfo {
        ResourceInfo { name: name.into(), preferred_allocation: false, pre_start_required: false }
    }

    /// Kubelet asks [`crate::Backend::preferred_allocation`] which devices to take.
    pub fn with_preferred_allocation(mut self) -> ResourceInfo {
        self.preferred_allocation = true;
        self
    }

    /// Kubelet calls [`crate::Backend::pre_start`] before each container starts.
    pub fn with_pre_start(mut self) -> ResourceInfo {
        self.pre_start_required = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_off_unless_asked_for() {
        let r = ResourceInfo::plain("a.io/b");
        assert!(!r.preferred_allocation && !r.pre_start_required);
        let r = r.with_pre_start();
        assert!(r.pre_start_required && !r.preferred_allocation);
        let info = Info::new("x", "1.0.0", [r.with_preferred_allocation()]);
        assert_eq!((info.name.as_str(), info.version.as_str()), ("x", "1.0.0"));
        assert!(info.resources[0].preferred_allocation && info.resources[0].pre_start_required);
    }
}
