//! What `ember up` starts on this machine: the nats-server's run directory (its config, made
//! from the one built into the binary, and its JetStream store), and the child processes,
//! each started with the NATS flags and credentials it needs.

use crate::cli::creds::{read_passwords, user_name, CLIENT_USER, DRIVER_USER};
use crate::connect::NatsArgs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tokio::process::{Child, Command};

/// The local server's config, built into the binary so that an installed `ember` has it too.
pub const DEFAULT_CONFIG: &str = include_str!("../../../nats.conf");

/// A directory of this run's own (the server's config and, unless kept elsewhere, its
/// JetStream store), removed when dropped.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    pub fn create() -> std::io::Result<Self> {
        let path = std::env::temp_dir().join(format!("ember-up-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path)?;
        Ok(Self { path })
    }

    /// Writes the built-in config with its JetStream store in `store` (this directory's own
    /// `jetstream` if none) and returns its path.
    pub fn write_config(&self, store: Option<&Path>) -> std::io::Result<PathBuf> {
        let store = store.map_or_else(|| self.path.join("jetstream"), Path::to_path_buf);
        std::fs::create_dir_all(&store)?;
        let path = self.path.join("nats.conf");
        std::fs::write(&path, config_with_store(DEFAULT_CONFIG, &store))?;
        Ok(path)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `config` with its `store_dir` line pointing at `store`.
pub fn config_with_store(config: &str, store: &Path) -> String {
    let quoted = format!("{:?}", store.display().to_string());
    config
        .lines()
        .map(|line| match line.trim_start().strip_prefix("store_dir:") {
            Some(_) => format!("  store_dir: {quoted}"),
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Starts Ember's binaries as children, each logged in with the NATS flags `ember up` was
/// given, or as its own user of a password file.
#[derive(Debug)]
pub struct Launcher {
    bin: PathBuf,
    nats: NatsArgs,
    passwords: Option<(PathBuf, BTreeMap<String, String>)>,
    /// The interpreter of the executors' Python workers, if not their default.
    python: Option<PathBuf>,
}

impl Launcher {
    /// Binaries are looked for beside the running one.
    pub fn new(nats: NatsArgs, password_file: Option<&Path>) -> anyhow::Result<Self> {
        let bin = std::env::current_exe()?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let passwords = match password_file {
            Some(path) if !path.is_file() => {
                anyhow::bail!("the password file {} does not exist", path.display())
            }
            Some(path) => Some((path.to_path_buf(), read_passwords(path)?)),
            None => None,
        };
        Ok(Self {
            bin,
            nats,
            passwords,
            python: None,
        })
    }

    /// Has every executor run its Python workers with `python`.
    pub fn with_python(mut self, python: Option<PathBuf>) -> Self {
        self.python = python;
        self
    }

    /// The flags a process logged in as the user of `name` (a role or an executor id) in the
    /// cluster connects with.
    pub fn nats_for(&self, name: &str) -> anyhow::Result<NatsArgs> {
        let mut nats = self.nats.clone();
        if let Some((path, passwords)) = &self.passwords {
            let user = user_name(&nats.cluster, name);
            let password = passwords.get(&user).ok_or_else(|| {
                anyhow::anyhow!(
                    "no password for user {user:?} in {} (make one with `ember creds --password-file`)",
                    path.display()
                )
            })?;
            nats.user = Some(user);
            nats.password = Some(password.clone());
        }
        Ok(nats)
    }

    /// The flags of `ember up`'s own connection (the `<cluster>.client` user of a password
    /// file).
    pub fn own_nats(&self) -> anyhow::Result<NatsArgs> {
        self.nats_for(CLIENT_USER)
    }

    pub fn driver(&self, extra: &[String]) -> anyhow::Result<Child> {
        self.spawn("ember-driver", DRIVER_USER, extra)
    }

    pub fn executor(&self, id: &str, cores: Option<u32>) -> anyhow::Result<Child> {
        let mut extra = vec!["--executor-id".to_string(), id.to_string()];
        if let Some(cores) = cores {
            extra.extend(["--cores".into(), cores.to_string()]);
        }
        if let Some(python) = &self.python {
            extra.extend(["--python".into(), python.display().to_string()]);
        }
        self.spawn("ember-executor", id, &extra)
    }

    /// Starts `name` logged in as `user`. Credentials go in the child's environment, where
    /// other users of the machine cannot read them, rather than on its command line.
    fn spawn(&self, name: &str, user: &str, extra: &[String]) -> anyhow::Result<Child> {
        let path = self.bin.join(name);
        let mut command = Command::new(&path);
        for (key, value) in child_env(&self.nats_for(user)?) {
            command.env(key, value);
        }
        command.args(extra).kill_on_drop(true);
        // Linux tells a child when `ember up` dies, even by SIGKILL, so none outlives it.
        #[cfg(target_os = "linux")]
        unsafe {
            // SAFETY: between fork and exec only prctl(2), which is async-signal-safe.
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                    .map_err(std::io::Error::from)
            });
        }
        command.spawn().map_err(|e| {
            anyhow::anyhow!(
                "could not start {}: {e} (build it with `cargo build --release`)",
                path.display()
            )
        })
    }
}

/// The `EMBER_*` variables that give a child the same NATS flags as `nats`.
pub fn child_env(nats: &NatsArgs) -> Vec<(&'static str, String)> {
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    [
        ("EMBER_NATS_URL", nats.nats_url.clone()),
        ("EMBER_CONTEXT", nats.context.clone()),
        ("EMBER_CLUSTER", Some(nats.cluster.clone())),
        ("EMBER_USER", nats.user.clone()),
        ("EMBER_PASSWORD", nats.password.clone()),
        ("EMBER_TOKEN", nats.token.clone()),
        ("EMBER_CREDS", path(&nats.creds)),
        ("EMBER_NKEY", path(&nats.nkey)),
        ("EMBER_TLS_CA", path(&nats.tls_ca)),
        ("EMBER_TLS_CERT", path(&nats.tls_cert)),
        ("EMBER_TLS_KEY", path(&nats.tls_key)),
    ]
    .into_iter()
    .filter_map(|(key, value)| value.map(|v| (key, v)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_config_gets_the_store_it_is_given_and_keeps_the_rest() {
        assert_eq!(DEFAULT_CONFIG.matches("store_dir:").count(), 1);
        let store = Path::new("/tmp/some where/js");
        let config = config_with_store(DEFAULT_CONFIG, store);
        assert!(
            config.contains("store_dir: \"/tmp/some where/js\""),
            "{config}"
        );
        assert!(!config.contains(".nats/jetstream"));
        assert!(config.contains("max_payload: 8MB"));
        assert!(config.contains("jetstream {"));
    }

    #[test]
    fn children_get_every_credential_flag_given_and_no_other() {
        let mut nats = NatsArgs {
            nats_url: Some("nats://h:1".into()),
            cluster: "c".into(),
            token: Some("t".into()),
            creds: Some("/x.creds".into()),
            tls_ca: Some("/ca.pem".into()),
            ..Default::default()
        };
        let env: BTreeMap<_, _> = child_env(&nats).into_iter().collect();
        assert_eq!(env.len(), 5, "{env:?}");
        assert_eq!(env["EMBER_TOKEN"], "t");
        assert_eq!(env["EMBER_CREDS"], "/x.creds");
        assert_eq!(env["EMBER_TLS_CA"], "/ca.pem");
        nats.user = Some("u".into());
        nats.password = Some("p".into());
        let env: BTreeMap<_, _> = child_env(&nats).into_iter().collect();
        assert_eq!(
            (env["EMBER_USER"].as_str(), env["EMBER_PASSWORD"].as_str()),
            ("u", "p")
        );
    }
}
