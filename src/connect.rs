//! How every binary reaches NATS: the shared flags (`--nats-url`, `--cluster`, credentials) and
//! the connection options Ember needs (inbox prefix, subscription capacity, event logging).

use crate::subjects::Subjects;
use crate::{DEFAULT_CLUSTER, DEFAULT_NATS_URL, SUBSCRIPTION_CAPACITY};
use async_nats::{Client, ConnectOptions, Event, ServerAddr};
use std::path::PathBuf;
use tracing::{info, warn};

/// The NATS flags every Ember binary takes.
#[derive(Debug, Clone, clap::Args)]
pub struct NatsArgs {
    /// NATS server URL(s); several, comma-separated, for a cluster.
    #[arg(long, env = "EMBER_NATS_URL", default_value = DEFAULT_NATS_URL)]
    pub nats_url: String,
    /// Cluster name: subjects live under `ember.<cluster>`, so clusters can share one NATS.
    #[arg(long, env = "EMBER_CLUSTER", default_value = DEFAULT_CLUSTER)]
    pub cluster: String,
    /// NATS user name (with --password).
    #[arg(long, env = "EMBER_USER")]
    pub user: Option<String>,
    /// NATS password (with --user).
    #[arg(long, env = "EMBER_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// NATS token.
    #[arg(long, env = "EMBER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// NATS credentials file (JWT and nkey seed).
    #[arg(long, env = "EMBER_CREDS")]
    pub creds: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("invalid --nats-url {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("invalid --cluster: {0}")]
    Cluster(String),
    #[error("could not read the credentials file {path}: {source}")]
    Creds {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("could not connect to NATS at {url}: {source} (is nats-server running? `ember up` starts one)")]
    Connect {
        url: String,
        source: async_nats::ConnectError,
    },
}

impl NatsArgs {
    /// The subjects of the chosen cluster.
    pub fn subjects(&self) -> Result<Subjects, ConnectError> {
        Subjects::new(&self.cluster).map_err(ConnectError::Cluster)
    }

    /// Connects as `name`. `inbox_prefix`, for executors, keeps replies under their own id.
    pub async fn connect(
        &self,
        name: &str,
        inbox_prefix: Option<String>,
    ) -> Result<Client, ConnectError> {
        let servers = parse_urls(&self.nats_url)?;
        let mut options = ConnectOptions::new()
            .name(name)
            .subscription_capacity(SUBSCRIPTION_CAPACITY)
            .event_callback(|event| async move { log_event(event) });
        if let Some(prefix) = inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        if let (Some(user), Some(password)) = (&self.user, &self.password) {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &self.token {
            options = options.token(token.clone());
        }
        if let Some(path) = &self.creds {
            options =
                options
                    .credentials_file(path)
                    .await
                    .map_err(|source| ConnectError::Creds {
                        path: path.clone(),
                        source,
                    })?;
        }
        options
            .connect(servers)
            .await
            .map_err(|source| ConnectError::Connect {
                url: self.nats_url.clone(),
                source,
            })
    }
}

/// Parses a comma-separated list of server URLs.
pub fn parse_urls(urls: &str) -> Result<Vec<ServerAddr>, ConnectError> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|url| {
            url.parse::<ServerAddr>().map_err(|e| ConnectError::Url {
                url: url.to_string(),
                reason: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|servers| {
            if servers.is_empty() {
                Err(ConnectError::Url {
                    url: urls.to_string(),
                    reason: "no server given".into(),
                })
            } else {
                Ok(servers)
            }
        })
}

fn log_event(event: Event) {
    match event {
        Event::Connected => info!("connected to NATS"),
        Event::Disconnected => warn!("disconnected from NATS; reconnecting"),
        Event::SlowConsumer(sid) => warn!(sid, "slow consumer: NATS dropped messages"),
        other => warn!(event = %other, "NATS"),
    }
}
