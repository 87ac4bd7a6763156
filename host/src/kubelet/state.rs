//! Where one resource's endpoint stands with kubelet, as `/status` and `devplug status` show it.

/// Where one resource stands with kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointState {
    Starting,
    WaitingForKubelet,
    Registered,
    /// Kubelet said no; retried with backoff.
    Refused(String),
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
