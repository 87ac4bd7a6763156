//! The operator's decisions for device nodes two backends name: each resource's `owns`.

/// The config's `[resources."R"] owns = [...]`: device nodes (globs relative to `/dev`, as
/// `grant.dev` writes them) resource R keeps when another backend's devices name them too.
/// The other side's devices naming them are withheld; everything else of both backends stays.
#[derive(Clone, Debug, Default)]
pub struct Decisions {
    rules: Vec<(String, globset::GlobSet)>,
}

impl Decisions {
    /// Rules already compiled by the caller (the config layer vets the patterns as it vets
    /// grants).
    pub fn new(rules: Vec<(String, globset::GlobSet)>) -> Decisions {
        Decisions { rules }
    }

    /// Whether `resource`'s `owns` covers the node it names at `path` (a host path).
    pub fn owns(&self, resource: &str, path: &str) -> bool {
        let Some(rel) = path.strip_prefix("/dev/") else { return false };
        self.rules.iter().any(|(r, set)| r == resource && set.is_match(rel))
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}
