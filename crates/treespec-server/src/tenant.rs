//! Tenants: who a request's lessons belong to.
//!
//! Everything a request teaches the server — the suffix drafter's global history and learned
//! prices, and the KV prefixes a later request may reuse — changes how fast a later request is
//! answered, and a client that can time its own requests (or read their `treespec` statistics)
//! can tell what others sent (docs/SECURITY.md). So each API key is a tenant, and what one tenant
//! teaches only ever speeds up that tenant's own requests; sharing across tenants is the
//! operator's explicit choice (`--share-history all`). Without keys there is one tenant.

use std::fmt;

/// The tenant of a request: [`Tenant::SHARED`] or one API key's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Tenant(u64);

impl Tenant {
    /// The tenant of a server without keys, and of every key under `--share-history all`.
    pub const SHARED: Tenant = Tenant(0);

    /// The tenant of `key`: a 64-bit fingerprint of it (FNV-1a, never 0), stable across
    /// restarts, so that a tenant's history file keeps its name.
    pub fn of_key(key: &str) -> Tenant {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in b"treespec-tenant:".iter().chain(key.as_bytes()) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Tenant(h.max(1))
    }

    /// Whether this is the shared tenant.
    pub fn is_shared(self) -> bool {
        self == Self::SHARED
    }

    /// The scope of the tenant's cached KV prefixes (a backend reuses a prefix only within one).
    pub fn scope(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_shared() {
            write!(f, "shared")
        } else {
            write!(f, "{:016x}", self.0)
        }
    }
}

/// The API keys a server accepts, each a tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiKeys {
    keys: Vec<(String, Tenant)>,
    /// Every key shares one tenant (`--share-history all`).
    shared: bool,
}

impl ApiKeys {
    /// `keys` (empty: no authentication, one tenant); `shared`: every key is one tenant.
    pub fn new(keys: impl IntoIterator<Item = String>, shared: bool) -> Self {
        let mut keys: Vec<(String, Tenant)> = keys
            .into_iter()
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .map(|k| {
                let t = if shared { Tenant::SHARED } else { Tenant::of_key(&k) };
                (k, t)
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        keys.retain(|(k, _)| seen.insert(k.clone()));
        Self { keys, shared }
    }

    /// Keys as llama-server takes them: comma-separated.
    pub fn parse_list(list: &str) -> Vec<String> {
        list.split(',').map(str::trim).filter(|k| !k.is_empty()).map(String::from).collect()
    }

    /// Keys from a file: one a line; blank lines and lines starting with `#` are skipped.
    pub fn parse_file(text: &str) -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect()
    }

    /// The keys' tenants (each once).
    pub fn tenants(&self) -> impl Iterator<Item = Tenant> + '_ {
        let mut seen = std::collections::HashSet::new();
        self.keys.iter().map(|(_, t)| *t).filter(move |t| seen.insert(*t))
    }

    /// Whether requests must carry a key.
    pub fn required(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The tenant of a request carrying `given` (None: no key was sent). `None` back: refused.
    /// Every key is compared in constant time, so timing does not tell which one nearly matched.
    pub fn tenant(&self, given: Option<&str>) -> Option<Tenant> {
        if !self.required() {
            return Some(Tenant::SHARED);
        }
        let given = given?;
        let mut found = None;
        for (key, tenant) in &self.keys {
            if Self::same_key(given, key) {
                found = Some(*tenant);
            }
        }
        found
    }

    /// Whether `given` is `key`, compared in constant time.
    pub fn same_key(given: &str, key: &str) -> bool {
        constant_time_eq(given.as_bytes(), key.as_bytes())
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_tenants_unless_shared() {
        let keys = ApiKeys::new(ApiKeys::parse_list("alpha, beta,,alpha"), false);
        assert_eq!(keys.len(), 2);
        let (a, b) = (keys.tenant(Some("alpha")).unwrap(), keys.tenant(Some("beta")).unwrap());
        assert_ne!(a, b);
        assert!(!a.is_shared() && !b.is_shared());
        assert_eq!(a, Tenant::of_key("alpha"), "stable across restarts");
        assert_eq!(keys.tenant(Some("gamma")), None);
        assert_eq!(keys.tenant(None), None);
        assert_eq!(keys.tenant(Some("alph")), None);
        let shared = ApiKeys::new(["alpha".to_string(), "beta".to_string()], true);
        assert_eq!(shared.tenant(Some("alpha")), Some(Tenant::SHARED));
        assert_eq!(shared.tenant(Some("beta")), Some(Tenant::SHARED));
        assert_eq!(shared.tenant(Some("x")), None);
        let open = ApiKeys::default();
        assert_eq!(open.tenant(None), Some(Tenant::SHARED));
        assert_eq!(open.tenant(Some("anything")), Some(Tenant::SHARED));
    }

    #[test]
    fn key_files_skip_blanks_and_comments() {
        let keys = ApiKeys::parse_file("# team keys\nalpha\n\n  beta  \n#gamma\n");
        assert_eq!(keys, vec!["alpha".to_string(), "beta".to_string()]);
    }
}
