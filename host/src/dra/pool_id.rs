//! Which pool is meant: one driver's devices on one node. The publishing side names its
//! slices from it, the kubelet-plugin side checks that an allocation is in it, and the health
//! stream reports against it; one type so the three never disagree about a name.

/// One driver's pool on one node. The pool is named after the node, as upstream's drivers
/// name a node-local pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolId {
    pub driver: String,
    pub node: String,
}

impl PoolId {
    pub fn new(driver: &str, node: &str) -> Self {
        PoolId { driver: driver.to_owned(), node: node.to_owned() }
    }

    /// The pool's name in `spec.pool.name` and in every allocation result.
    pub fn pool(&self) -> &str {
        &self.node
    }
}

impl std::fmt::Display for PoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pool {} of driver {}", self.node, self.driver)
    }
}
