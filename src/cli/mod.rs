//! What the binaries share: logging, signals, flag parsers, and the `ember` subcommands. The
//! binaries in src/bin only parse flags and call into here.

pub mod creds;
pub mod sim;
pub mod submit;
pub mod up;
pub mod view;

/// The log filter of the driver and executors when `RUST_LOG` is not set.
pub const SERVICE_LOG: &str = "info,async_nats=warn";
/// The log filter of the `ember` CLI when `RUST_LOG` is not set.
pub const CLI_LOG: &str = "warn";

use std::collections::BTreeMap;

/// Installs the tracing subscriber on stderr: `RUST_LOG` filters (else `default`, such as
/// `info` for services and `warn` for the CLI); `json` picks JSON lines.
pub fn init_tracing(json: bool, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Completes on the first SIGINT or SIGTERM. The signals are awaited on a task of their own:
/// the serving loops may poll this future on every turn, and a poll of a one-shot receiver
/// costs far less than a poll of both signal streams. Call it inside the runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    let (signalled, signal) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        first_signal().await;
        let _ = signalled.send(());
    });
    async move {
        // An error means the task was dropped with the runtime: nothing is left to serve.
        let _ = signal.await;
    }
}

async fn first_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Parses `KEY=VALUE` (for `--log-url` and `--attribute`).
pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}

/// Collects repeated `KEY=VALUE` flags into a map.
pub fn to_map(pairs: &[(String, String)]) -> BTreeMap<String, String> {
    pairs.iter().cloned().collect()
}

/// Parses a duration such as `500ms`, `10s` or `2m`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (write e.g. 500ms, 10s, 2m)"))
}

/// A current-thread runtime: Ember's messaging is faster on one thread, and task work that
/// needs threads goes to tokio's blocking pool.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Formats epoch milliseconds as an RFC 3339 time (UTC, to the second).
pub fn format_time(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(time).to_string()
}
