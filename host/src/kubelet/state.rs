//! Where one resource's endpoint stands with kubelet, as `Endpoints::states` reports it (read
//! from its registration's [`crate::plugin_socket::Stage`]).

/// Where one resource stands with kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointState {
    Starting,
    WaitingForKubelet,
    Registered,
    /// Kubelet said no; retried with backoff.
    Refused(String),
}

/// The registration's stage as the kubelet layer reports it.
impl From<&crate::plugin_socket::Stage> for EndpointState {
    fn from(stage: &crate::plugin_socket::Stage) -> Self {
        use crate::plugin_socket::Stage;
        match stage {
            Stage::Starting => EndpointState::Starting,
            Stage::Serving | Stage::InfoAsked => EndpointState::WaitingForKubelet,
            Stage::Registered => EndpointState::Registered,
            Stage::Refused(why) => EndpointState::Refused(why.clone()),
        }
    }
}

/// The form `/status` and `devplug status` show (a wire format: keep it stable).
impl std::fmt::Display for EndpointState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndpointState::Starting => f.write_str("Starting"),
            EndpointState::WaitingForKubelet => f.write_str("WaitingForKubelet"),
            EndpointState::Registered => f.write_str("Registered"),
            EndpointState::Refused(why) => write!(f, "Refused: {why}"),
        }
    }
}
