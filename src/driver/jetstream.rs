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

/// How long one ask waits before it is asked again, at first: a reply JetStream lost (two
/// drivers creating the same stream at once both go unanswered) costs this, not the request's
/// own timeout. It doubles with each ask, up to [`MOST_PATIENCE`].
const FIRST_PATIENCE: Duration = Duration::from_secs(2);
const MOST_PATIENCE: Duration = Duration::from_secs(8);

/// What `ask` gives, asked again while its error is `unanswered` or it gives nothing within
/// its patience, for up to `JETSTREAM_WAIT`; past that, the answer of one last ask.
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
    let (mut delay, mut patience) = (Duration::from_millis(100), FIRST_PATIENCE);
    while tokio::time::Instant::now() < deadline {
        let error = match tokio::time::timeout(patience, ask()).await {
            Ok(Err(error)) if unanswered(&error) => error.to_string(),
            Ok(answered) => return answered,
            Err(_) => format!("no answer within {patience:?}"),
        };
        warn!(error, what, retry_in = ?delay, "JetStream did not answer; asking again");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
        patience = (patience * 2).min(MOST_PATIENCE);
    }
    ask().await
}

/// Whether a JetStream request's error says it went unanswered, rather than refused.
fn unanswered(error: &str) -> bool {
    ["timed out", "temporarily unavailable", "no responders"]
        .iter()
        .any(|words| error.contains(words))
}

/// The JetStream error code the server answered with, beneath `error` however deep async-nats
/// wrapped it; `None` for an error that is not the server's answer (a timeout, no responders).
pub fn server_code(
    error: &(dyn std::error::Error + 'static),
) -> Option<async_nats::jetstream::ErrorCode> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(server) = error.downcast_ref::<async_nats::jetstream::Error>() {
            return Some(server.error_code());
        }
        cause = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[tokio::test(start_paused = true)]
    async fn an_ask_left_unanswered_is_asked_again_after_its_patience_not_its_timeout() {
        let asks = Cell::new(0);
        let started = tokio::time::Instant::now();
        // The first ask never answers (a reply lost); the second answers at once.
        let answered: Result<u32, String> = until_answered("test", || {
            asks.set(asks.get() + 1);
            let lost = asks.get() == 1;
            async move {
                if lost {
                    std::future::pending::<()>().await;
                }
                Ok(7)
            }
        })
        .await;
        assert_eq!((answered, asks.get()), (Ok(7), 2));
        assert_eq!(
            started.elapsed(),
            FIRST_PATIENCE + Duration::from_millis(100)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn asks_unanswered_past_the_wait_end_with_the_last_asks_answer() {
        let asks = Cell::new(0);
        let answered: Result<u32, String> = until_answered("test", || {
            asks.set(asks.get() + 1);
            async { Err("jetstream request timed out".to_string()) }
        })
        .await;
        assert_eq!(answered, Err("jetstream request timed out".into()));
        assert!(asks.get() > 3, "asked {} times", asks.get());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_not_asked_again() {
        let asks = Cell::new(0);
        let answered: Result<u32, String> = until_answered("test", || {
            asks.set(asks.get() + 1);
            async { Err("insufficient resources".to_string()) }
        })
        .await;
        assert_eq!(
            (answered, asks.get()),
            (Err("insufficient resources".into()), 1)
        );
    }
}
