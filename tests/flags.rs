//! Bad duration flags: each binary refuses them with a message naming the flag and the limit,
//! and exits with clap's usage code (2), without a panic and before it connects anywhere.

mod common;

use common::within;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A URL nothing listens on: a binary that got past its flags fails here, not with code 2.
const NOWHERE: &str = "nats://127.0.0.1:1";

fn run(binary: &str, args: &[&str]) -> Output {
    let started = Instant::now();
    let out = Command::new(binary)
        .args(["--nats-url", NOWHERE])
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{binary} {args:?} took too long"
    );
    out
}

fn assert_refused(binary: &str, args: &[&str], flag: &str, says: &str) {
    let out = run(binary, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{binary} {args:?}: {stderr}");
    assert!(
        !stderr.contains("panicked"),
        "{binary} {args:?} panicked: {stderr}"
    );
    assert!(
        stderr.contains(flag),
        "{binary} {args:?} does not name {flag}: {stderr}"
    );
    assert!(
        stderr.contains(says),
        "{binary} {args:?} does not say {says:?}: {stderr}"
    );
}

const DRIVER: &str = env!("CARGO_BIN_EXE_ember-driver");
const EXECUTOR: &str = env!("CARGO_BIN_EXE_ember-executor");
const EMBER: &str = env!("CARGO_BIN_EXE_ember");

#[test]
fn a_zero_interval_is_refused_with_a_message() {
    let zero = "zero";
    assert_refused(
        DRIVER,
        &["--revive-interval", "0s"],
        "--revive-interval",
        zero,
    );
    assert_refused(
        EXECUTOR,
        &["--heartbeat-interval", "0s"],
        "--heartbeat-interval",
        zero,
    );
    assert_refused(
        DRIVER,
        &["--executor-timeout", "0ms"],
        "--executor-timeout",
        zero,
    );
    assert_refused(
        EXECUTOR,
        &["--driver-timeout", "0s"],
        "--driver-timeout",
        zero,
    );
    assert_refused(
        DRIVER,
        &["--replay-timeout", "0s"],
        "--replay-timeout",
        zero,
    );
    assert_refused(
        EMBER,
        &["submit", "--timeout", "0s", "--", "true"],
        "--timeout",
        zero,
    );
}

#[test]
fn an_absurd_duration_is_refused_naming_the_cap() {
    let absurd = "500000000years";
    for (binary, flag, cap) in [
        (DRIVER, "--revive-interval", "1day"),
        (DRIVER, "--executor-timeout", "1day"),
        (DRIVER, "--no-executors-timeout", "1day"),
        (DRIVER, "--journal-max-age", "1year"),
        (DRIVER, "--results-max-age", "1year"),
        (DRIVER, "--replay-timeout", "1day"),
        (EXECUTOR, "--heartbeat-interval", "1day"),
        (EXECUTOR, "--register-timeout", "1day"),
        (EXECUTOR, "--driver-timeout", "1day"),
        (EXECUTOR, "--decommission-timeout", "1day"),
    ] {
        assert_refused(binary, &[flag, absurd], flag, cap);
    }
    assert_refused(
        EMBER,
        &["submit", "--timeout", absurd, "--", "true"],
        "--timeout",
        "1day",
    );
}

#[test]
fn a_duration_within_its_limits_passes_the_flags() {
    // Past the flags, the binary meets the missing server: exit 1, not 2.
    let out = run(
        DRIVER,
        &["--revive-interval", "250ms", "--journal-max-age", "30days"],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(
        EXECUTOR,
        &["--heartbeat-interval", "1s", "--decommission-timeout", "0s"],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--replay-timeout` bounds a starting driver's leadership mark and replay: one too short for
/// a round trip to the server stops the driver with an error that names the flag.
#[tokio::test]
async fn a_driver_that_cannot_replay_in_time_names_the_replay_timeout() {
    let server = ember::server::NatsServer::start_with_jetstream(&[]).expect("start nats-server");
    // Bounded: a driver that took the lead after all would serve until stopped (and is killed
    // when the timed-out wait drops it).
    let driver = tokio::process::Command::new(DRIVER)
        .args(["--nats-url", &server.url(), "--cluster", "replay-timeout"])
        .args(["--journal", "on", "--replay-timeout", "1ns"])
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = within(Duration::from_secs(60), driver).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("within 1ns (--replay-timeout)")
            || stderr.contains("longer than 1ns (--replay-timeout)"),
        "{stderr}"
    );
}
