//! Placement: where a job's tasks may run, and where they would rather run.
//!
//! - **Constraints** on the attributes executors register (`ember-executor --attribute
//!   rack=r1`): a job runs only on executors that meet all of its constraints. The language is
//!   four forms, one constraint each:
//!
//!   | form                      | an executor meets it when its attribute `key` ...        |
//!   |---------------------------|-----------------------------------------------------------|
//!   | `key=value`               | is `value`                                                |
//!   | `key!=value`              | is not `value`, or it has no attribute `key`              |
//!   | `key in (v1,v2,...)`      | is one of the values                                      |
//!   | `key not in (v1,v2,...)`  | is none of the values, or it has no attribute `key`       |
//!
//!   A key is letters, digits and `_ . - / :`; a value is any text without `,`, `(`, `)`, `=`
//!   or a control character, spaces around it trimmed.
//! - **Preferences** (Spark's locality preferences, for a whole job): executors by id, hosts
//!   by name and sites by name on which the job would rather run, and how long it waits for a
//!   slot there (Spark's `spark.locality.wait`, 3s) before it takes any executor.
//! - **Sites**: an executor's site is its attribute [`SITE`] (`ember-executor --site edge` is
//!   `--attribute site=edge`), so a job requires one with the constraint `site=edge` and
//!   prefers one with `prefer_sites`.
//!
//! This module holds what the CLI and the driver share: the wire form, the language, the
//! limits and the checks. The driver's use of it is in `driver::core::placement`.

use crate::ids::ExecutorId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The most constraints one job may have.
pub const MAX_CONSTRAINTS: usize = 16;
/// The most values in one `in` list, and the most preferred executors or hosts of one job.
pub const MAX_VALUES: usize = 64;
/// The longest constraint, in bytes.
pub const MAX_CONSTRAINT_LEN: usize = 2048;
/// The longest preferred host name, in bytes.
pub const MAX_HOST_LEN: usize = 255;
/// The attribute that names an executor's site.
pub const SITE: &str = "site";
/// The longest site name, in bytes.
pub const MAX_SITE_LEN: usize = 64;
/// How long a job waits for a slot on a preferred executor or host by default (Spark's
/// `spark.locality.wait`).
pub const DEFAULT_LOCALITY_WAIT_MS: u64 = 3000;
/// The longest locality wait: one day.
pub const MAX_LOCALITY_WAIT_MS: u64 = 24 * 3600 * 1000;

/// A job's placement on the wire: fields of `SubmitJob` (and, when any is set, `placement` in
/// a `JobSummary`). Every field may be left out; all empty means no placement at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Placement {
    /// Constraints on executor attributes, all of which must hold, as text (`rack=r1`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<String>,
    /// Executors the job would rather run on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prefer_executors: Vec<ExecutorId>,
    /// Hosts the job would rather run on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prefer_hosts: Vec<String>,
    /// Sites (the executors' [`SITE`] attribute) the job would rather run on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prefer_sites: Vec<String>,
    /// How long tasks wait for a preferred slot before they take any executor, in
    /// milliseconds; [`DEFAULT_LOCALITY_WAIT_MS`] if absent, 0 to take any at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locality_wait_ms: Option<u64>,
}

impl Placement {
    /// Whether nothing is set: the job may run anywhere, with no preference.
    pub fn is_empty(&self) -> bool {
        self.constraints.is_empty()
            && self.prefer_executors.is_empty()
            && self.prefer_hosts.is_empty()
            && self.prefer_sites.is_empty()
            && self.locality_wait_ms.is_none()
    }

    /// Whether the job prefers some executors, hosts or sites.
    pub fn has_preferences(&self) -> bool {
        !self.prefer_executors.is_empty()
            || !self.prefer_hosts.is_empty()
            || !self.prefer_sites.is_empty()
    }

    /// The locality wait, its default filled in.
    pub fn locality_wait_ms(&self) -> u64 {
        self.locality_wait_ms.unwrap_or(DEFAULT_LOCALITY_WAIT_MS)
    }

    /// Checks every field and parses the constraints; the first error names what is wrong.
    pub fn validate(&self) -> Result<Vec<Constraint>, String> {
        if self.constraints.len() > MAX_CONSTRAINTS {
            return Err(format!(
                "a job may have at most {MAX_CONSTRAINTS} constraints; this one has {}",
                self.constraints.len()
            ));
        }
        let constraints = self
            .constraints
            .iter()
            .map(|text| text.parse())
            .collect::<Result<Vec<Constraint>, String>>()?;
        for (what, count) in [
            ("prefer_executors", self.prefer_executors.len()),
            ("prefer_hosts", self.prefer_hosts.len()),
            ("prefer_sites", self.prefer_sites.len()),
        ] {
            if count > MAX_VALUES {
                return Err(format!("{what} lists {count}; the limit is {MAX_VALUES}"));
            }
        }
        for host in &self.prefer_hosts {
            validate_host(host)?;
        }
        for site in &self.prefer_sites {
            validate_site(site)?;
        }
        if let Some(wait) = self.locality_wait_ms.filter(|w| *w > MAX_LOCALITY_WAIT_MS) {
            return Err(format!(
                "locality_wait_ms is {wait}; the limit is {MAX_LOCALITY_WAIT_MS} (one day)"
            ));
        }
        Ok(constraints)
    }

    /// `rack=r1, zone!=z3; prefers executors e1; prefers hosts h1; locality wait 3000 ms`:
    /// what `ember jobs` shows.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.constraints.is_empty() {
            parts.push(format!("runs where {}", self.constraints.join(", ")));
        }
        if !self.prefer_executors.is_empty() {
            let ids: Vec<&str> = self.prefer_executors.iter().map(|e| e.as_str()).collect();
            parts.push(format!("prefers executors {}", ids.join(", ")));
        }
        if !self.prefer_hosts.is_empty() {
            parts.push(format!("prefers hosts {}", self.prefer_hosts.join(", ")));
        }
        if !self.prefer_sites.is_empty() {
            parts.push(format!("prefers sites {}", self.prefer_sites.join(", ")));
        }
        if self.has_preferences() {
            parts.push(format!("locality wait {} ms", self.locality_wait_ms()));
        }
        parts.join("; ")
    }
}

fn validate_host(host: &str) -> Result<(), String> {
    if host.is_empty()
        || host.len() > MAX_HOST_LEN
        || host.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "preferred host {:?} is not valid: it must be 1 to {MAX_HOST_LEN} bytes without \
             spaces or control characters",
            crate::text::clip(host, 64)
        ));
    }
    Ok(())
}

/// One constraint on an executor attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constraint {
    pub key: String,
    pub op: Op,
    /// One value for `=` and `!=`; the list for `in` and `not in`.
    pub values: Vec<String>,
}

/// How a constraint compares the attribute with its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    In,
    NotIn,
}

impl Constraint {
    /// Whether an executor with `attributes` meets this constraint: one without the attribute
    /// fails `=` and `in`, and meets `!=` and `not in`.
    pub fn holds(&self, attributes: &BTreeMap<String, String>) -> bool {
        let value = attributes.get(&self.key);
        let listed = value.is_some_and(|v| self.values.iter().any(|x| x == v));
        match self.op {
            Op::Eq | Op::In => listed,
            Op::Ne | Op::NotIn => !listed,
        }
    }
}

impl fmt::Display for Constraint {
    /// The canonical text: `rack=r1`, `zone!=z3`, `os in (linux,freebsd)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = || self.values.join(",");
        match self.op {
            Op::Eq => write!(f, "{}={}", self.key, list()),
            Op::Ne => write!(f, "{}!={}", self.key, list()),
            Op::In => write!(f, "{} in ({})", self.key, list()),
            Op::NotIn => write!(f, "{} not in ({})", self.key, list()),
        }
    }
}

impl std::str::FromStr for Constraint {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let shown = || crate::text::clip(text, 80).into_owned();
        let refuse = |why: &str| {
            Err(format!(
                "constraint {:?} is not valid: {why} (write key=value, key!=value, \
                 key in (a,b) or key not in (a,b))",
                shown()
            ))
        };
        if text.len() > MAX_CONSTRAINT_LEN {
            return refuse(&format!("it is longer than {MAX_CONSTRAINT_LEN} bytes"));
        }
        let trimmed = text.trim();
        let key_len = trimmed
            .find(|c: char| !is_key_char(c))
            .unwrap_or(trimmed.len());
        let (key, rest) = trimmed.split_at(key_len);
        if key.is_empty() {
            return refuse("it must start with an attribute key (letters, digits, _ . - / :)");
        }
        let rest_trimmed = rest.trim_start();
        let (op, rest) = if let Some(value) = rest_trimmed.strip_prefix("!=") {
            (Op::Ne, value)
        } else if let Some(value) = rest_trimmed.strip_prefix('=') {
            (Op::Eq, value)
        } else if let Some(list) = word(rest_trimmed, "in") {
            (Op::In, list)
        } else if let Some(list) = word(rest_trimmed, "not").and_then(|r| word(r, "in")) {
            (Op::NotIn, list)
        } else {
            return refuse("after the key comes =, !=, in or not in");
        };
        let values: Vec<String> = match op {
            Op::Eq | Op::Ne => vec![rest.trim().to_string()],
            Op::In | Op::NotIn => {
                let list = rest.trim();
                let Some(inner) = list.strip_prefix('(').and_then(|l| l.strip_suffix(')')) else {
                    return refuse("the values of in and not in go in parentheses: (a,b)");
                };
                inner.split(',').map(|v| v.trim().to_string()).collect()
            }
        };
        if values.len() > MAX_VALUES {
            return refuse(&format!("it lists more than {MAX_VALUES} values"));
        }
        if values.iter().any(|v| {
            v.is_empty() || v.contains([',', '(', ')', '=']) || v.chars().any(char::is_control)
        }) {
            return refuse(
                "a value is empty or holds a comma, a parenthesis, = or a control character",
            );
        }
        Ok(Constraint {
            key: key.to_string(),
            op,
            values,
        })
    }
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ':')
}

/// `text` after the word `word` and the spaces after it, if it starts with that word.
fn word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let rest = text.strip_prefix(word)?;
    match rest.chars().next() {
        Some(c) if c.is_whitespace() || c == '(' => Some(rest.trim_start()),
        _ => None,
    }
}

/// Parses a `--constraint` flag, keeping its text as given once it is known to be valid.
pub fn parse_constraint_flag(text: &str) -> Result<String, String> {
    text.parse::<Constraint>()?;
    Ok(text.to_string())
}

/// Parses a `--prefer-host` flag.
pub fn parse_host_flag(text: &str) -> Result<String, String> {
    validate_host(text)?;
    Ok(text.to_string())
}

/// A site's name: 1 to [`MAX_SITE_LEN`] letters, digits, `_`, `-` and `.`, so that it reads the
/// same in a constraint (`site=edge-1`), a flag and a table.
pub fn validate_site(site: &str) -> Result<(), String> {
    let fits = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if site.is_empty() || site.len() > MAX_SITE_LEN || !site.chars().all(fits) {
        return Err(format!(
            "site {:?} is not valid: it must be 1 to {MAX_SITE_LEN} letters, digits, '_', '-' \
             or '.'",
            crate::text::clip(site, 64)
        ));
    }
    Ok(())
}

/// Parses a `--site` or `--prefer-site` flag.
pub fn parse_site_flag(text: &str) -> Result<String, String> {
    validate_site(text)?;
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_four_forms_parse_and_print_canonically() {
        for (text, canonical) in [
            ("rack=r1", "rack=r1"),
            (" zone != z3 ", "zone!=z3"),
            ("os in (linux, freebsd)", "os in (linux,freebsd)"),
            ("os not in(linux)", "os not in (linux)"),
            ("k8s.io/arch=amd64", "k8s.io/arch=amd64"),
            ("note=two words", "note=two words"),
        ] {
            let c: Constraint = text.parse().unwrap();
            assert_eq!(c.to_string(), canonical, "{text}");
            assert_eq!(canonical.parse::<Constraint>().unwrap(), c);
        }
    }

    #[test]
    fn malformed_constraints_are_refused_by_name() {
        for bad in [
            "",
            "rack",
            "=r1",
            "rack=",
            "rack==r1",
            "rack!=",
            "os in linux",
            "os in ()",
            "os in (a,,b)",
            "os in (a",
            "os inside (a)",
            "os not (a)",
            "rack r1",
            "ra ck=r1",
            "rack=r(1)",
            "rack=a,b",
        ] {
            let err = bad.parse::<Constraint>().unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
        let long = format!("k={}", "v".repeat(MAX_CONSTRAINT_LEN));
        assert!(long.parse::<Constraint>().is_err());
    }

    #[test]
    fn a_missing_attribute_fails_eq_and_in_and_meets_ne_and_not_in() {
        let linux = attrs(&[("os", "linux"), ("rack", "r1")]);
        let bare = attrs(&[]);
        let check =
            |text: &str, a: &BTreeMap<String, String>| text.parse::<Constraint>().unwrap().holds(a);
        assert!(check("rack=r1", &linux));
        assert!(!check("rack=r2", &linux));
        assert!(!check("rack=r1", &bare));
        assert!(!check("rack!=r1", &linux));
        assert!(check("rack!=r2", &linux));
        assert!(check("rack!=r1", &bare));
        assert!(check("os in (linux,freebsd)", &linux));
        assert!(!check("os in (freebsd)", &linux));
        assert!(!check("os in (linux)", &bare));
        assert!(!check("os not in (linux,freebsd)", &linux));
        assert!(check("os not in (freebsd)", &linux));
        assert!(check("os not in (linux)", &bare));
    }

    #[test]
    fn a_placement_is_checked_whole() {
        let mut p = Placement {
            constraints: vec!["rack=r1".into()],
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap().len(), 1);
        p.constraints.push("zone=".into());
        assert!(p.validate().unwrap_err().contains("\"zone=\""));
        p.constraints = vec!["a=b".into(); MAX_CONSTRAINTS + 1];
        assert!(p.validate().is_err());
        p.constraints.clear();
        p.prefer_hosts = vec!["two words".into()];
        assert!(p.validate().is_err());
        p.prefer_hosts = vec!["h1".into()];
        p.locality_wait_ms = Some(MAX_LOCALITY_WAIT_MS + 1);
        assert!(p.validate().is_err());
        p.locality_wait_ms = Some(0);
        assert!(p.validate().is_ok());
        assert_eq!(p.describe(), "prefers hosts h1; locality wait 0 ms");
        assert!(Placement::default().is_empty());
        p.prefer_sites = vec!["edge one".into()];
        assert!(p.validate().unwrap_err().contains("site \"edge one\""));
        p.prefer_sites = vec!["edge-1".into()];
        assert!(p.validate().is_ok());
        assert!(
            p.describe().contains("prefers sites edge-1"),
            "{}",
            p.describe()
        );
    }
}
