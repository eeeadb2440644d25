//! What the binaries share: logging, signals, flag parsers, and each binary's command line
//! (`ember-driver`'s in [`driver`], `ember-executor`'s in [`executor`], `ember`'s in [`command`]
//! and its subcommands). The binaries in src/bin only parse flags and call into here.

pub mod backoff;
pub mod command;
pub mod creds;
pub mod driver;
pub mod durations;
pub mod events;
pub mod executor;
pub mod limits;
pub mod objects;
pub mod results;
pub mod sim;
pub mod speculation;
pub mod status;
pub mod submit;
pub mod timeouts;
pub mod up;
pub mod view;

/// The log filter of the driver and executors when `RUST_LOG` is not set.
pub const SERVICE_LOG: &str = "info,async_nats=warn";
/// The log filter of the `ember` CLI when `RUST_LOG` is not set.
pub const CLI_LOG: &str = "warn";

pub use durations::{parse_age, parse_duration, parse_lease, parse_wait, show_duration};
use std::collections::BTreeMap;

/// Installs the tracing subscriber on stderr: `RUST_LOG` filters (else `default`, such as
/// `info` for services and `warn` for the CLI); `json` picks JSON lines. Colours only on a
/// terminal: a log sent to a file or a journal holds no escape codes.
pub fn init_tracing(json: bool, default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
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
    signalled(false)
}

/// Completes on the first SIGINT, SIGTERM or SIGHUP: for a command that follows a terminal
/// (`ember events`), whose terminal closing stops it as Ctrl-C does, so that it removes what it
/// holds on the server rather than die with it there. Call it inside the runtime.
pub fn stop_or_hangup_signal() -> impl std::future::Future<Output = ()> {
    signalled(true)
}

/// Completes when standard input ends (or cannot be read): for a process whose parent holds
/// a pipe to it, the parent's end, however it ended. Whatever is read is ignored.
pub fn stdin_ended() -> impl std::future::Future<Output = ()> {
    let (ended, end) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buffer = [0u8; 512];
        let mut stdin = std::io::stdin().lock();
        while matches!(stdin.read(&mut buffer), Ok(n) if n > 0) {}
        let _ = ended.send(());
    });
    async move {
        let _ = end.await;
    }
}

fn signalled(hangup: bool) -> impl std::future::Future<Output = ()> {
    let (signalled, signal) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        first_signal(hangup).await;
        let _ = signalled.send(());
    });
    async move {
        // An error means the task was dropped with the runtime: nothing is left to serve.
        let _ = signal.await;
    }
}

async fn first_signal(hangup: bool) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        // A signal that is not asked for, or whose handler cannot be set, never comes: a
        // handler left on SIGHUP would keep it from ending the driver and the executors.
        let received = |kind: SignalKind, asked: bool| async move {
            match asked.then(|| signal(kind)) {
                Some(Ok(mut signals)) => {
                    signals.recv().await;
                }
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = received(SignalKind::terminate(), true) => {}
            _ = received(SignalKind::hangup(), hangup) => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = hangup;
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

/// A size that may also be `none` (or 0): no limit, read as 0.
pub fn parse_limit(text: &str) -> Result<u64, String> {
    match text.trim() {
        "none" | "0" => Ok(0),
        text => parse_bytes(text),
    }
}

/// A limit as [`parse_limit`] reads it.
pub fn show_limit(bytes: u64) -> String {
    match bytes {
        0 => "none".into(),
        bytes => show_bytes(bytes),
    }
}

/// Parses a size in bytes for a flag: `1048576`, `64KiB`, `8MiB`, `1GiB` (or KB, MB, GB as
/// powers of 1000). Zero is refused: a size of nothing holds nothing.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let hint = "write e.g. 65536, 64KiB, 256MiB, 1GiB";
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size ({hint})"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => return Err(format!("unknown unit {other:?} in {text:?} ({hint})")),
    };
    match number.checked_mul(scale) {
        Some(0) => Err(format!("{text:?} is zero; a size must be at least 1 byte")),
        Some(bytes) => Ok(bytes),
        None => Err(format!("{text:?} is too large")),
    }
}

/// `bytes` as [`parse_bytes`] reads it, in the largest binary unit that holds it whole
/// (`256MiB`): how `--help` shows a default, written from the constant the config takes it from.
pub fn show_bytes(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Keeps a long-running process's memory to what it holds. glibc serves a block of 128 KiB or
/// more from its own mapping, unmapped when freed; but each time it frees such a block it
/// raises that threshold to the block's size (up to 32 MiB), so that later big buffers (a
/// job's results passing through, a large batch) come from the heap, which keeps the pages
/// they leave. Setting the threshold fixes it at 128 KiB. Call it first thing in `main`.
pub fn return_big_blocks_when_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets a parameter of glibc's allocator, called before any thread
    // is started; it has no memory-safety preconditions.
    unsafe {
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// A current-thread runtime: Ember's messaging is faster on one thread, and task work that
/// needs threads goes to tokio's blocking pool.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Runs `main` to its end on `runtime` as a task of the runtime's own, not as the future
/// `block_on` polls. A message that wakes a spawned task puts it on the run queue; one that
/// wakes the `block_on` future makes the current-thread scheduler poll the sockets once more
/// (a system call) before it runs: one more per message turn in a process whose loop is
/// driven by its messages. A panic in `main` goes on as a panic here.
pub fn run_as_task<F>(runtime: &tokio::runtime::Runtime, main: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    runtime.block_on(async move {
        match tokio::spawn(main).await {
            Ok(output) => output,
            // Not cancelled: the runtime is not shut down while `block_on` runs.
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    })
}

/// The checks every binary's tests make of its command line: clap's own (no flag clashes with
/// another, global ones included), and that `--help` explains every flag and subcommand.
pub fn check_command_line(command: clap::Command) {
    let missing = undocumented(&command);
    command.debug_assert();
    assert!(missing.is_empty(), "no help text: {missing:?}");
}

/// `command` without its flags' environment variables: a test's parse then reads the command
/// line alone, whatever EMBER_* variables the tests run with.
#[cfg(test)]
pub(crate) fn without_env(command: clap::Command) -> clap::Command {
    command.mut_args(|arg| arg.env(None::<&str>))
}

/// What a command line leaves unexplained in `--help`: every flag or argument of `command` and
/// of its subcommands, at any depth, without a help text, and every subcommand without one, each
/// as its path (`ember jobs --json`). Clap's own `--help` and `--version` are explained by clap.
pub fn undocumented(command: &clap::Command) -> Vec<String> {
    let mut missing = Vec::new();
    walk(command, command.get_name(), &mut missing);
    missing
}

fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "help" | "version") {
            continue;
        }
        if arg.get_help().is_none() && arg.get_long_help().is_none() {
            let name = match arg.get_long() {
                Some(long) => format!("--{long}"),
                None => format!("<{id}>"),
            };
            missing.push(format!("{path} {name}"));
        }
    }
    for sub in command.get_subcommands() {
        let sub_path = format!("{path} {}", sub.get_name());
        if sub.get_about().is_none() && sub.get_long_about().is_none() {
            missing.push(sub_path.clone());
        }
        walk(sub, &sub_path, missing);
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, run_as_task, runtime, show_bytes};

    #[test]
    fn a_main_run_as_a_task_is_a_task_of_its_own_and_gives_its_output_or_its_panic() {
        let runtime = runtime().unwrap();
        // `block_on`'s own future is no task of the runtime's; a spawned one is.
        assert!(runtime.block_on(async { tokio::task::try_id().is_none() }));
        assert!(run_as_task(&runtime, async {
            tokio::task::try_id().is_some()
        }));
        assert_eq!(run_as_task(&runtime, async { 7 }), 7);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_as_task(&runtime, async { panic!("the task's own panic") })
        }));
        let payload = panicked.expect_err("the panic goes on past run_as_task");
        assert_eq!(
            payload.downcast_ref::<&str>(),
            Some(&"the task's own panic")
        );
    }

    #[test]
    fn an_argument_without_help_is_found_at_any_depth() {
        use clap::{Arg, ArgAction, Command};
        let command = Command::new("tool")
            .arg(Arg::new("plain").long("plain").action(ArgAction::SetTrue))
            .arg(
                Arg::new("told")
                    .long("told")
                    .help("Does something.")
                    .action(ArgAction::SetTrue),
            )
            .subcommand(
                Command::new("inner")
                    .about("An inner command.")
                    .arg(Arg::new("json").long("json").action(ArgAction::SetTrue))
                    .arg(Arg::new("id").help("The id.")),
            )
            .subcommand(Command::new("bare"));
        assert_eq!(
            super::undocumented(&command),
            ["tool --plain", "tool inner --json", "tool bare"]
        );
    }

    #[test]
    fn sizes_parse_with_their_units_and_nonsense_is_refused() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        for bad in [
            "",
            "MiB",
            "12 parsecs",
            "0",
            "0MiB",
            "99999999999999999999GiB",
            "-1",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_shown_size_reads_back_as_itself() {
        assert_eq!(show_bytes(256 << 20), "256MiB");
        assert_eq!(show_bytes(3 << 30), "3GiB");
        assert_eq!(show_bytes(1536), "1536");
        for bytes in [1, 1024, 1536, 8 << 20, 64 << 20, (1 << 30) + (1 << 20)] {
            assert_eq!(parse_bytes(&show_bytes(bytes)), Ok(bytes));
        }
    }
}
