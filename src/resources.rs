//! Custom resources beside cores (Spark's `spark.executor.resource.*` and
//! `spark.task.resource.*`): an executor registers each as a list of addresses (GPU 0, GPU 1,
//! ...), a job asks for a count of each per task, and each task is handed the addresses it got.
//! This module holds what the executor's flags, the CLI and the driver share: the names, the
//! limits, the flags' syntax and the checks.

use std::collections::BTreeMap;

/// A resource's addresses by name: what an executor registers, and what a task is handed.
pub type Addresses = BTreeMap<String, Vec<String>>;
/// How many of each resource a job asks for per task.
pub type Request = BTreeMap<String, u32>;

/// The most resources one executor may register, or one job ask for.
pub const MAX_RESOURCES: usize = 16;
/// The most addresses of one resource on one executor, and the most one task may ask for.
pub const MAX_ADDRESSES: u32 = 4096;
/// The longest resource name, in bytes.
pub const MAX_NAME_LEN: usize = 32;
/// The longest address, in bytes.
pub const MAX_ADDRESS_LEN: usize = 64;

/// The environment variable of a command task that lists the addresses of resource `name`.
pub fn env_name(name: &str) -> String {
    format!("EMBER_RESOURCE_{}", name.to_ascii_uppercase())
}

/// The environment variable of a command task that holds all its resources as JSON.
pub const ENV_ALL: &str = "EMBER_TASK_RESOURCES";

/// The resource whose addresses are the TCP ports an executor reserved for gang tasks
/// (`--gang-ports`): each task of a gang job holds one. Executors register it; no job asks for
/// it by name, and no `--resource` flag may name it.
pub const GANG_PORT: &str = "gang_port";

/// Why `GANG_PORT` may not be named where a user names resources.
fn gang_port_reserved(whose: &str) -> String {
    format!("resource {GANG_PORT} is reserved: {whose}")
}

/// A name is a lowercase letter, then lowercase letters, digits or `_`: it must make an
/// environment variable name once upper-cased.
pub fn validate_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if name.len() > MAX_NAME_LEN || !first_ok || !rest_ok {
        return Err(format!(
            "resource name {:?} is not valid: it must start with a lowercase letter and hold only \
             lowercase letters, digits and '_' (at most {MAX_NAME_LEN} bytes)",
            crate::text::clip(name, MAX_NAME_LEN + 8)
        ));
    }
    Ok(())
}

/// Checks what an executor registers: at most [`MAX_RESOURCES`] besides [`GANG_PORT`], valid
/// names, 1 to [`MAX_ADDRESSES`] distinct, non-empty addresses each (port numbers for
/// [`GANG_PORT`]).
pub fn validate_addresses(resources: &Addresses) -> Result<(), String> {
    // Gang ports come besides the resources an executor is given.
    let given = resources.keys().filter(|name| *name != GANG_PORT).count();
    if given > MAX_RESOURCES {
        return Err(format!(
            "{given} resources registered; the limit is {MAX_RESOURCES} (besides {GANG_PORT})"
        ));
    }
    for (name, addresses) in resources {
        validate_name(name)?;
        if addresses.is_empty() || addresses.len() > MAX_ADDRESSES as usize {
            return Err(format!(
                "resource {name} must have between 1 and {MAX_ADDRESSES} addresses; it has {}",
                addresses.len()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for address in addresses {
            if address.is_empty()
                || address.len() > MAX_ADDRESS_LEN
                || address.contains(',')
                || address.chars().any(char::is_control)
            {
                return Err(format!(
                    "resource {name} has an address that is empty, longer than \
                     {MAX_ADDRESS_LEN} bytes, or holds a comma or a control character"
                ));
            }
            if !seen.insert(address) {
                return Err(format!("resource {name} lists address {address:?} twice"));
            }
            if name == GANG_PORT && !address.parse::<u16>().is_ok_and(|port| port > 0) {
                return Err(format!(
                    "resource {GANG_PORT} lists {address:?}, which is not a TCP port (1-65535)"
                ));
            }
        }
    }
    Ok(())
}

/// Checks what a job asks for per task: valid names, counts from 1 to [`MAX_ADDRESSES`].
pub fn validate_request(request: &Request) -> Result<(), String> {
    if request.len() > MAX_RESOURCES {
        return Err(format!(
            "a job may ask for at most {MAX_RESOURCES} resources; this one asks for {}",
            request.len()
        ));
    }
    for (name, count) in request {
        validate_name(name)?;
        if name == GANG_PORT {
            return Err(gang_port_reserved(
                "each task of a gang job (--gang) holds one of its executor's gang ports",
            ));
        }
        if *count == 0 || *count > MAX_ADDRESSES {
            return Err(format!(
                "resource {name}: a task may ask for between 1 and {MAX_ADDRESSES}; got {count}"
            ));
        }
    }
    Ok(())
}

/// Parses an executor's `--resource NAME=COUNT` (addresses `0` to `COUNT-1`) or
/// `--resource NAME=A,B,...` (those addresses; a single one as `NAME=A,`).
pub fn parse_executor_flag(text: &str) -> Result<(String, Vec<String>), String> {
    let (name, value) = split_flag(text)?;
    if name == GANG_PORT {
        return Err(gang_port_reserved(
            "an executor reserves its gang ports with --gang-ports",
        ));
    }
    let addresses: Vec<String> = if value.contains(',') {
        value
            .split(',')
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect()
    } else {
        let count = parse_count(&name, value)?;
        (0..count).map(|i| i.to_string()).collect()
    };
    let one: Addresses = [(name.clone(), addresses)].into();
    validate_addresses(&one)?;
    let addresses = one.into_values().next().unwrap_or_default();
    Ok((name, addresses))
}

/// Parses a job's `--resource NAME=COUNT`: how many of `NAME` each task needs.
pub fn parse_request_flag(text: &str) -> Result<(String, u32), String> {
    let (name, value) = split_flag(text)?;
    let count = parse_count(&name, value)?;
    Ok((name, count))
}

/// Gathers repeated flags into one map; a name given twice is an error.
pub fn gather<T>(flags: Vec<(String, T)>) -> Result<BTreeMap<String, T>, String> {
    let mut map = BTreeMap::new();
    for (name, value) in flags {
        if map.insert(name.clone(), value).is_some() {
            return Err(format!("--resource {name} is given more than once"));
        }
    }
    Ok(map)
}

fn split_flag(text: &str) -> Result<(String, &str), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=COUNT (e.g. gpu=2); got {text:?}"))?;
    validate_name(name)?;
    Ok((name.to_string(), value))
}

fn parse_count(name: &str, value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(count) if (1..=MAX_ADDRESSES).contains(&count) => Ok(count),
        _ => Err(format!(
            "resource {name}: the count must be a whole number from 1 to {MAX_ADDRESSES}; \
             got {value:?}"
        )),
    }
}

/// `gpu=1, mem_gb=4`: a request as the CLI and the waiting reasons show it.
pub fn show_request(request: &Request) -> String {
    request
        .iter()
        .map(|(name, count)| format!("{name}={count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executor_flags_give_counted_or_listed_addresses() {
        assert_eq!(
            parse_executor_flag("gpu=2").unwrap(),
            ("gpu".into(), vec!["0".into(), "1".into()])
        );
        assert_eq!(
            parse_executor_flag("gpu=0,3").unwrap(),
            ("gpu".into(), vec!["0".into(), "3".into()])
        );
        assert_eq!(
            parse_executor_flag("fpga=7,").unwrap(),
            ("fpga".into(), vec!["7".into()])
        );
        for bad in [
            "gpu", "GPU=1", "gpu=0", "gpu=-1", "gpu=x", "gpu=1,1", "=2", "gpu=,", "9a=1",
        ] {
            assert!(parse_executor_flag(bad).is_err(), "{bad} should be refused");
        }
        assert!(parse_executor_flag("gpu=4097").is_err());
        let reserved = parse_executor_flag("gang_port=41000,").unwrap_err();
        assert!(reserved.contains("--gang-ports"), "{reserved}");
    }

    #[test]
    fn request_flags_take_counts() {
        assert_eq!(
            parse_request_flag("mem_gb=4").unwrap(),
            ("mem_gb".into(), 4)
        );
        assert!(parse_request_flag("gpu=0").is_err());
        assert!(parse_request_flag("gpu=0,1").is_err());
        let twice = vec![("gpu".to_string(), 1), ("gpu".to_string(), 2)];
        assert!(gather(twice).unwrap_err().contains("more than once"));
    }

    #[test]
    fn requests_and_registrations_are_bounded() {
        let many: Request = (0..=MAX_RESOURCES).map(|i| (format!("r{i}"), 1)).collect();
        assert!(validate_request(&many).is_err());
        let long = "a".repeat(MAX_NAME_LEN + 1);
        assert!(validate_request(&[(long, 1)].into()).is_err());
        let empty: Addresses = [("gpu".to_string(), Vec::new())].into();
        assert!(validate_addresses(&empty).is_err());
        assert_eq!(env_name("mem_gb"), "EMBER_RESOURCE_MEM_GB");
        // Gang ports are registered by executors, as port numbers, and asked for by no job.
        let ports = |list: &[&str]| -> Addresses {
            [(
                GANG_PORT.to_string(),
                list.iter().map(|p| p.to_string()).collect(),
            )]
            .into()
        };
        assert!(validate_addresses(&ports(&["41000", "65535"])).is_ok());
        for bad in ["0", "65536", "http", "-1"] {
            assert!(validate_addresses(&ports(&[bad])).is_err(), "{bad}");
        }
        let asked = validate_request(&[(GANG_PORT.to_string(), 1)].into()).unwrap_err();
        assert!(asked.contains("reserved"), "{asked}");
    }
}
