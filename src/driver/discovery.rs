//! The driver as a NATS micro service, so that standard NATS tooling finds it: every driver of
//! every cluster answers `$SRV.PING`, `$SRV.INFO` and `$SRV.STATS` (also under
//! `.ember-driver` and `.ember-driver.<id>`), with its cluster, its driver instance, whether it
//! leads and its epoch in the metadata. A standby runs the service without endpoints; the
//! leader's has one, `api`, on the api's documented subject, through which every api request
//! is taken and answered, so its request count and processing time (from arrival to the
//! answer leaving, journal wait included) are the api's own.
//!
//! An api request the driver refuses in its answer (`ApiReply::Error`) is still an answer on
//! the wire, not a service error, so it counts among the requests; the endpoint's `data`
//! counts those answers and the requests dropped without one.

use crate::subjects::Subjects;
use async_nats::service::{Service, ServiceExt};
use async_nats::Client;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use uuid::Uuid;

/// The service's name: `$SRV.PING.ember-driver` finds every driver.
pub const NAME: &str = "ember-driver";

/// The api's endpoint name in `$SRV.INFO` and `$SRV.STATS`.
pub const API_ENDPOINT: &str = "api";

/// What the api endpoint counts beside the service's own figures, shown as its `data`.
#[derive(Debug, Default)]
pub struct ApiCounts {
    /// Answers that were an `Error` (an undecodable request, an unknown job, ...).
    pub errors: AtomicU64,
    /// Requests dropped without an answer: no reply subject.
    pub no_reply: AtomicU64,
    /// Requests dropped without an answer: a reply subject the driver may not answer into.
    pub foreign_reply: AtomicU64,
}

impl ApiCounts {
    fn data(&self) -> serde_json::Value {
        serde_json::json!({
            "error_answers": self.errors.load(Relaxed),
            "dropped_no_reply": self.no_reply.load(Relaxed),
            "dropped_foreign_reply": self.foreign_reply.load(Relaxed),
        })
    }
}

/// Who a driver is, as its service says.
pub struct Identity<'a> {
    pub subjects: &'a Subjects,
    pub driver_instance: Uuid,
    /// The leadership's epoch, or none while it stands by.
    pub leading: Option<u64>,
}

impl Identity<'_> {
    fn metadata(&self) -> HashMap<String, String> {
        let cluster = self.subjects.prefix().trim_start_matches("ember.");
        let mut metadata = HashMap::from([
            ("cluster".to_string(), cluster.to_string()),
            ("driver_instance".into(), self.driver_instance.to_string()),
            ("leader".into(), self.leading.is_some().to_string()),
            ("pid".into(), std::process::id().to_string()),
        ]);
        if let Some(epoch) = self.leading {
            metadata.insert("epoch".into(), epoch.to_string());
        }
        metadata
    }
}

/// Starts the service of a driver that stands by: it answers discovery, and nothing else.
pub async fn standby(client: &Client, who: Identity<'_>) -> Result<Service, async_nats::Error> {
    client
        .service_builder()
        .description("Ember's driver, standing by")
        .metadata(who.metadata())
        .start(NAME, env!("CARGO_PKG_VERSION"))
        .await
}

/// Starts the leader's service, and its api endpoint on the api's subject.
pub async fn leading(
    client: &Client,
    who: Identity<'_>,
    counts: Arc<ApiCounts>,
) -> Result<(Service, async_nats::service::endpoint::Endpoint), async_nats::Error> {
    let api = who.subjects.api();
    let service = client
        .service_builder()
        .description("Ember's driver, leading its cluster")
        .metadata(who.metadata())
        .stats_handler(move |_endpoint, _stats| counts.data())
        .start(NAME, env!("CARGO_PKG_VERSION"))
        .await?;
    // A queue group of this leadership's own: a leader whose host was cut off stays subscribed
    // in its server's eyes until the server's pings give it up (minutes, by default), and in a
    // group shared with its successor it would take its share of the requests, unanswered.
    // Each in a group of its own, every leader gets every request and only a live one answers.
    let endpoint = service
        .endpoint_builder()
        .name(API_ENDPOINT)
        .queue_group(who.driver_instance)
        .add(api)
        .await?;
    Ok((service, endpoint))
}

/// Runs `until` to its end and returns what it returns; meanwhile, whenever `unled` says why
/// no driver can lead, answers every api request with [`ApiReply::Unavailable`] saying so, so
/// that clients learn that nothing was done and that they may send it again, rather than
/// waiting out their timeout. The api is subscribed only while that lasts: a standby behind a
/// leader never sees its requests.
///
/// [`ApiReply::Unavailable`]: crate::protocol::ApiReply::Unavailable
pub async fn unavailable_while<T>(
    client: &Client,
    subjects: &Subjects,
    mut unled: tokio::sync::watch::Receiver<Option<String>>,
    until: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(until);
    // The api's requests and since when no driver can lead, while that lasts.
    let mut api: Option<(async_nats::Subscriber, tokio::time::Instant)> = None;
    loop {
        let request = async {
            match api.as_mut() {
                Some((requests, _)) => requests.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            done = &mut until => return done,
            changed = unled.changed() => {
                if changed.is_err() {
                    // The lease no longer says: wait for `until` alone.
                    return until.await;
                }
                let reason = unled.borrow_and_update().clone();
                api = match (reason, api.take()) {
                    (Some(reason), None) => {
                        tracing::warn!(%reason, "no driver can lead: the server refuses the \
                            lease's writes; answering api requests with Unavailable");
                        match client.subscribe(subjects.api()).await {
                            Ok(requests) => Some((requests, tokio::time::Instant::now())),
                            Err(error) => {
                                tracing::warn!(%error, "could not subscribe to the api");
                                None
                            }
                        }
                    }
                    (None, Some(_)) => {
                        tracing::info!("the lease may be written again");
                        None
                    }
                    (_, same) => same,
                };
            }
            Some(request) = request => {
                let (Some(reply), Some((_, since))) = (request.reply, &api) else {
                    continue;
                };
                let reason = unled.borrow().clone().unwrap_or_default();
                let lasted = match since.elapsed().as_secs() {
                    0 => String::new(),
                    secs => format!(", for {secs} s now"),
                };
                let answer = crate::protocol::ApiReply::Unavailable {
                    message: format!(
                        "no driver of cluster {} can lead: the NATS server refuses to store \
                         the leader's lease ({reason}){lasted}; nothing was done: send the \
                         request again once the server's JetStream store takes writes",
                        subjects.prefix().trim_start_matches("ember."),
                    ),
                };
                let payload = crate::protocol::encode(&answer);
                let mut headers = async_nats::HeaderMap::new();
                super::outbox::ServiceError::add_for(&answer, &mut headers);
                if let Err(error) = client.publish_with_headers(reply, headers, payload).await {
                    tracing::warn!(%error, "could not answer an api request");
                }
            }
        }
    }
}

/// Stops a service, logging rather than failing: it only stops answering discovery.
pub async fn stop(service: Service) {
    if let Err(error) = service.stop().await {
        tracing::warn!(%error, "could not stop the driver's NATS service");
    }
}
