//! JetStream requests asked again while they go unanswered: a clustered server's JetStream
//! answers only once its nodes have elected leaders, and a busy one may time out. A refusal
//! comes back at once.

use std::time::Duration;
use tracing::warn;

/// How long the driver waits for JetStream to answer at start: a clustered server's
/// JetStream answers only once its nodes have elected a leader.
pub const JETSTREAM_WAIT: Duration = Duration::from_secs(30);

/// What `ask` gives, asked again while JetStream does not answer it (a cluster still electing
/// its leaders, or busy), for up to `JETSTREAM_WAIT`.
pub async fn until_answered<T, E, F>(what: &str, ask: impl FnMut() -> F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    retry_while(what, |error: &E| unanswered(&error.to_string()), ask).await
}

/// What `ask` gives, asked again while its error is `unanswered`, for up to `JETSTREAM_WAIT`.
pub async fn retry_while<T, E, F>(
    what: &str,
    unanswered: impl Fn(&E) -> bool,
    mut ask: impl FnMut() -> F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + JETSTREAM_WAIT;
    let mut delay = Duration::from_millis(100);
    loop {
        match ask().await {
            Err(error) if unanswered(&error) && tokio::time::Instant::now() < deadline => {
                warn!(%error, what, retry_in = ?delay, "JetStream did not answer; asking again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            answered => return answered,
        }
    }
}

/// Whether a JetStream request's error says it went unanswered, rather than refused.
fn unanswered(error: &str) -> bool {
    ["timed out", "temporarily unavailable", "no responders"]
        .iter()
        .any(|words| error.contains(words))
}
