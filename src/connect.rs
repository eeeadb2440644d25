//! How every binary reaches NATS: the shared flags (`--nats-url`, `--cluster`, credentials, a
//! `nats` CLI `--context`) and the connection options Ember needs (inbox prefix, subscription
//! capacity, event logging).

mod context;

pub use context::{Context, ContextError};

use crate::subjects::Subjects;
use crate::{
    CONNECT_TIMEOUT, DEFAULT_CLUSTER, DEFAULT_NATS_URL, PING_INTERVAL, REQUEST_TIMEOUT,
    SUBSCRIPTION_CAPACITY,
};
use async_nats::{Client, ConnectOptions, Event, ServerAddr};
use prometheus_client::metrics::counter::Counter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tracing::{info, warn};

/// The NATS flags every Ember binary takes. `Debug` leaves the password and token out, so the
/// flags can be logged.
#[derive(Clone, Default, clap::Args)]
pub struct NatsArgs {
    /// NATS server URL(s); several, comma-separated, for a cluster [default:
    /// nats://127.0.0.1:4222, or the --context's].
    #[arg(long, global = true, env = "EMBER_NATS_URL")]
    pub nats_url: Option<String>,
    /// A `nats` CLI context (a name from `nats context ls`, or a path to its JSON file): its
    /// servers, credentials, TLS files and inbox prefix, for whatever the flags here leave unset.
    #[arg(long, global = true, env = "EMBER_CONTEXT")]
    pub context: Option<String>,
    /// Cluster name: subjects live under `ember.<cluster>`, so clusters can share one NATS.
    #[arg(long, global = true, env = "EMBER_CLUSTER", default_value = DEFAULT_CLUSTER)]
    pub cluster: String,
    /// NATS user name (with --password).
    #[arg(long, global = true, env = "EMBER_USER")]
    pub user: Option<String>,
    /// NATS password (with --user).
    #[arg(long, global = true, env = "EMBER_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// NATS token.
    #[arg(long, global = true, env = "EMBER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// NATS credentials file (JWT and nkey seed).
    #[arg(long, global = true, env = "EMBER_CREDS")]
    pub creds: Option<PathBuf>,
    /// File holding an nkey seed (`SU...`) for servers that list users by nkey.
    #[arg(long, global = true, env = "EMBER_NKEY")]
    pub nkey: Option<PathBuf>,
    /// PEM file of the certificate authorities that signed the server's certificate; makes the
    /// connection require TLS.
    #[arg(long, global = true, env = "EMBER_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate, for servers that verify clients (with --tls-key).
    #[arg(long, global = true, env = "EMBER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, global = true, env = "EMBER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The prefix of this connection's reply subjects (a context's `inbox_prefix`).
    #[arg(skip)]
    pub inbox_prefix: Option<String>,
    /// Start TLS before the server's greeting (a context's `tls_first`).
    #[arg(skip)]
    pub tls_first: bool,
}

impl std::fmt::Debug for NatsArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |secret: &Option<String>| secret.as_ref().map(|_| "<hidden>");
        f.debug_struct("NatsArgs")
            .field("nats_url", &self.nats_url)
            .field("context", &self.context)
            .field("cluster", &self.cluster)
            .field("user", &self.user)
            .field("password", &hidden(&self.password))
            .field("token", &hidden(&self.token))
            .field("creds", &self.creds)
            .field("nkey", &self.nkey)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("inbox_prefix", &self.inbox_prefix)
            .field("tls_first", &self.tls_first)
            .finish()
    }
}

/// What a connection tells its owner, beside its log lines.
#[derive(Debug, Clone, Default)]
pub struct Watch {
    /// Counts the connection's slow-consumer events (each a message the client dropped because
    /// a subscription's queue was full).
    pub slow_consumers: Counter,
    /// Notified each time the connection is made again after it was lost.
    pub connected: Option<Arc<Notify>>,
    /// Counts the times the connection was lost (a leading driver stands down at each).
    pub lost: Option<Arc<tokio::sync::watch::Sender<u64>>>,
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
    #[error("could not read the nkey seed file {path}: {reason}")]
    Nkey { path: PathBuf, reason: String },
    #[error("--password needs --user (and --user needs --password)")]
    UserPassword,
    #[error(transparent)]
    Context(#[from] ContextError),
    /// The cause is kept as text, not as the error's source: a source would be printed
    /// again after the hint by whoever prints the chain.
    #[error("could not connect to NATS at {url}: {cause} (is nats-server running? `ember up` starts one)")]
    Connect { url: String, cause: String },
}

impl NatsArgs {
    /// The subjects of the chosen cluster.
    pub fn subjects(&self) -> Result<Subjects, ConnectError> {
        Subjects::new(&self.cluster).map_err(ConnectError::Cluster)
    }

    /// The server URL(s) to reach: `--nats-url`, else the context's, else the default.
    pub fn url(&self) -> &str {
        self.nats_url.as_deref().unwrap_or(DEFAULT_NATS_URL)
    }

    /// These flags with the `--context` read into them: a setting given as a flag (or its
    /// `EMBER_*` variable) wins over the context's. A context's user and password come as a
    /// pair, and only when no flag names another way to authenticate.
    pub fn resolved(&self) -> Result<NatsArgs, ConnectError> {
        let Some(name) = &self.context else {
            return Ok(self.clone());
        };
        let context = Context::load(name)?;
        let mut args = self.clone();
        args.context = None;
        args.nats_url = args.nats_url.or_else(|| Context::text(&context.url));
        let flags_authenticate = self.user.is_some()
            || self.password.is_some()
            || self.token.is_some()
            || self.creds.is_some()
            || self.nkey.is_some();
        if !flags_authenticate {
            args.user = Context::text(&context.user);
            args.password = Context::text(&context.password);
            args.token = Context::text(&context.token);
            args.creds = Context::file(&context.creds);
            args.nkey = Context::file(&context.nkey);
        }
        args.tls_ca = args.tls_ca.or_else(|| Context::file(&context.ca));
        if args.tls_cert.is_none() {
            args.tls_cert = Context::file(&context.cert);
            args.tls_key = Context::file(&context.key);
        }
        args.inbox_prefix = args
            .inbox_prefix
            .or_else(|| Context::text(&context.inbox_prefix));
        args.tls_first |= context.tls_first;
        Ok(args)
    }

    /// Connects as `name`. `inbox_prefix`, for executors, keeps replies under their own id
    /// (and wins over a context's).
    pub async fn connect(
        &self,
        name: &str,
        inbox_prefix: Option<String>,
    ) -> Result<Client, ConnectError> {
        self.connect_watched(name, inbox_prefix, Watch::default())
            .await
    }

    /// [`Self::connect`], telling `watch` what the connection does.
    pub async fn connect_watched(
        &self,
        name: &str,
        inbox_prefix: Option<String>,
        watch: Watch,
    ) -> Result<Client, ConnectError> {
        let Watch {
            slow_consumers,
            connected,
            lost,
        } = watch;
        let args = self.resolved()?;
        let servers = parse_urls(args.url())?;
        let mut options = ConnectOptions::new()
            .name(name)
            .subscription_capacity(SUBSCRIPTION_CAPACITY)
            .ping_interval(PING_INTERVAL)
            .connection_timeout(CONNECT_TIMEOUT)
            .event_callback(move |event| {
                if let Event::SlowConsumer(_) = event {
                    slow_consumers.inc();
                }
                if let (Event::Connected, Some(connected)) = (&event, &connected) {
                    connected.notify_one();
                }
                if let (Event::Disconnected, Some(lost)) = (&event, &lost) {
                    lost.send_modify(|times| *times += 1);
                }
                async move { log_event(event) }
            });
        if let Some(prefix) = inbox_prefix.or_else(|| args.inbox_prefix.clone()) {
            options = options.custom_inbox_prefix(prefix);
        }
        options = args.authenticate(options).await?;
        options
            .connect(servers)
            .await
            .map_err(|error| ConnectError::Connect {
                url: args.url().to_string(),
                cause: error.to_string(),
            })
    }

    /// Adds the credentials and TLS settings these flags name to `options` (call it on
    /// [`Self::resolved`] flags for a context's): for programs that build their own
    /// [`ConnectOptions`] (an event callback of their own, say) and still want Ember's flags.
    pub async fn authenticate(
        &self,
        mut options: ConnectOptions,
    ) -> Result<ConnectOptions, ConnectError> {
        match (&self.user, &self.password) {
            (Some(user), Some(password)) => {
                options = options.user_and_password(user.clone(), password.clone());
            }
            (None, None) => {}
            _ => return Err(ConnectError::UserPassword),
        }
        if let Some(token) = &self.token {
            options = options.token(token.clone());
        }
        if let Some(path) = &self.nkey {
            options = options.nkey(read_seed(path)?);
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
        if let Some(ca) = &self.tls_ca {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            options = options
                .add_client_certificate(cert.clone(), key.clone())
                .require_tls(true);
        }
        if self.tls_first {
            options = options.tls_first();
        }
        Ok(options)
    }
}

/// Reads an nkey seed: the file's first line that looks like one, so a seed kept beside a
/// comment (as `nk -gen user` prints it) works. The seed itself never appears in an error.
fn read_seed(path: &Path) -> Result<String, ConnectError> {
    let bad = |reason: String| ConnectError::Nkey {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    text.lines()
        .map(str::trim)
        .find(|line| line.starts_with('S') && !line.contains(char::is_whitespace))
        .map(str::to_string)
        .ok_or_else(|| bad("no nkey seed (a line starting with 'S') in it".into()))
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

/// The connection `client` speaks through now; none while it is not connected.
pub fn connection_of(client: &Client) -> Option<crate::protocol::ConnectionId> {
    let info = client.server_info();
    (!info.server_id.is_empty()).then_some(crate::protocol::ConnectionId {
        server_id: info.server_id,
        client_id: info.client_id,
    })
}

/// Why what a client queued did not reach the server's socket: see [`flush`].
#[derive(Debug, thiserror::Error)]
pub enum Unsent {
    #[error("not sent within {0:?}")]
    TimedOut(Duration),
    #[error(transparent)]
    Failed(#[from] async_nats::client::FlushError),
}

/// Writes everything `client` has queued to the server's socket, waiting at most
/// [`REQUEST_TIMEOUT`]. The client's own flush waits while it is disconnected, for ever if the
/// server does not come back.
pub async fn flush(client: &Client) -> Result<(), Unsent> {
    match tokio::time::timeout(REQUEST_TIMEOUT, client.flush()).await {
        Ok(flushed) => Ok(flushed?),
        Err(_) => Err(Unsent::TimedOut(REQUEST_TIMEOUT)),
    }
}

/// What every Ember process logs when NATS drops messages for one of its subscriptions; `ember
/// bench` counts these lines.
pub const SLOW_CONSUMER: &str = "slow consumer: NATS dropped messages";

fn log_event(event: Event) {
    match event {
        Event::Connected => info!("connected to NATS"),
        Event::Disconnected => warn!("disconnected from NATS; reconnecting"),
        Event::SlowConsumer(sid) => warn!(sid, "{SLOW_CONSUMER}"),
        other => warn!(event = %other, "NATS"),
    }
}
