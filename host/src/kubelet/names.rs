//! The socket file names kubelet sees, derived from resource names.

use crate::model::names::name_chars;

/// The socket file for a resource: `devplug-nvidia.com_gpu.sock`. Kubelet wants it inside the
/// device-plugins dir and names it relative to that dir.
pub(crate) fn socket_file_name(resource: &str) -> String {
    format!("devplug-{}.sock", name_chars(resource))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_are_flat_and_stable() {
        assert_eq!(socket_file_name("nvidia.com/gpu"), "devplug-nvidia.com_gpu.sock");
        assert_eq!(socket_file_name("a.io/x y"), "devplug-a.io_x_y.sock");
    }
}
