//! The page's HTTP server (axum): the page's own files, embedded in the binary, a JSON view of
//! what the driver holds, answered by the actor through the [`Handle`], and `/api/events`, a
//! stream of server-sent events fed by the broadcast of notices.

use super::{Answer, Ask, Handle, Notice, Status};
use crate::ids::JobId;
use crate::protocol::{ApiReply, ApiRequest, ResultsPage, TaskOutcome};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::Stream;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::oneshot;
use tracing::{info, warn};

/// How long the page waits for the driver to answer a query.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// How many executor and job events the timeline keeps.
const TIMELINE: usize = 500;
/// The most executors, jobs or tasks one request of the page returns.
const MAX_PAGE: u32 = 1000;
/// How much of a task's result the page shows.
const PREVIEW_CHARS: usize = 200;

/// The page's files, built into the binary.
const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");
const FAVICON_SVG: &str = include_str!("assets/favicon.svg");

/// What every handler shares.
struct Web {
    handle: Handle,
    /// The last executor and job events, oldest first, for a page that opens later.
    timeline: Mutex<VecDeque<Arc<Notice>>>,
}

/// Serves the page on `addr` from a thread of its own, for as long as the process runs;
/// returns the address it listens on (the port chosen, for port 0).
pub fn serve(addr: SocketAddr, handle: Handle) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("ember-web".into())
        .spawn(move || runtime.block_on(run(listener, handle)))?;
    info!(%local, "serving the web page at http://{local}/");
    Ok(local)
}

async fn run(listener: std::net::TcpListener, handle: Handle) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => return warn!(%error, "the web page cannot listen"),
    };
    let web = Arc::new(Web {
        timeline: Mutex::new(VecDeque::new()),
        handle,
    });
    tokio::spawn(keep_timeline(web.clone()));
    if let Err(error) = axum::serve(listener, router(web)).await {
        warn!(%error, "the web page stopped serving");
    }
}

fn router(web: Arc<Web>) -> Router {
    Router::new()
        .route("/", get(|| file("text/html; charset=utf-8", INDEX_HTML)))
        .route("/app.js", get(|| file("text/javascript", APP_JS)))
        .route("/style.css", get(|| file("text/css", STYLE_CSS)))
        .route("/favicon.svg", get(|| file("image/svg+xml", FAVICON_SVG)))
        .route("/api/status", get(status))
        .route("/api/executors", get(executors))
        .route("/api/jobs", get(jobs))
        .route("/api/jobs/{job_id}", get(job))
        .route("/api/jobs/{job_id}/tasks", get(tasks))
        .route("/api/timeline", get(timeline))
        .route("/api/events", get(events))
        .with_state(web)
}

/// One of the page's files, which may run no script and load nothing from elsewhere.
async fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// Keeps the last [`TIMELINE`] executor and job events.
async fn keep_timeline(web: Arc<Web>) {
    let mut notices = web.handle.notices.subscribe();
    loop {
        match notices.recv().await {
            Ok(notice) if notice.is_timeline() => {
                let mut timeline = web.timeline.lock().unwrap_or_else(|e| e.into_inner());
                if timeline.len() == TIMELINE {
                    timeline.pop_front();
                }
                timeline.push_back(notice);
            }
            Ok(_) => {}
            Err(RecvError::Lagged(lost)) => warn!(lost, "the web page's timeline missed events"),
            Err(RecvError::Closed) => return,
        }
    }
}

/// Why the page got no data.
enum Failure {
    StandingBy,
    Busy,
    NoAnswer,
    Refused(String),
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            Failure::StandingBy => (
                StatusCode::SERVICE_UNAVAILABLE,
                "this driver stands by; the leading driver's page shows the cluster".to_string(),
            ),
            Failure::Busy => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the driver has too many page requests waiting; try again".to_string(),
            ),
            Failure::NoAnswer => (
                StatusCode::GATEWAY_TIMEOUT,
                format!("the driver did not answer within {ANSWER_TIMEOUT:?}"),
            ),
            Failure::Refused(message) => (StatusCode::NOT_FOUND, message),
        };
        (status, Json(serde_json::json!({ "error": message }))).into_response()
    }
}

impl Web {
    /// Asks the actor, if this driver leads.
    async fn ask(&self, ask: Ask) -> Result<Answer, Failure> {
        if !self.handle.status.borrow().leading {
            return Err(Failure::StandingBy);
        }
        let (answer, answered) = oneshot::channel();
        let query = super::Query { ask, answer };
        self.handle
            .queries
            .try_send(query)
            .map_err(|_| Failure::Busy)?;
        match tokio::time::timeout(ANSWER_TIMEOUT, answered).await {
            Ok(Ok(answer)) => match answer.reply {
                ApiReply::Error { message } => Err(Failure::Refused(message)),
                _ => Ok(answer),
            },
            // Dropped unanswered: the driver stopped leading meanwhile.
            Ok(Err(_)) => Err(Failure::StandingBy),
            Err(_) => Err(Failure::NoAnswer),
        }
    }
}

/// A JSON answer with the driver's clock beside it.
#[derive(Serialize)]
struct Timed<T> {
    now_ms: u64,
    #[serde(flatten)]
    body: T,
}

#[derive(Deserialize)]
struct Paging {
    #[serde(default)]
    offset: u32,
    limit: Option<u32>,
    /// For jobs: the page of jobs older than this one.
    #[serde(default)]
    before: JobId,
}

impl Paging {
    fn limit(&self, default: u32) -> u32 {
        self.limit.unwrap_or(default).clamp(1, MAX_PAGE)
    }
}

async fn status(State(web): State<Arc<Web>>) -> Json<Status> {
    Json(web.handle.status.borrow().clone())
}

async fn executors(
    State(web): State<Arc<Web>>,
    Query(paging): Query<Paging>,
) -> Result<Response, Failure> {
    let limit = Some(paging.limit(500));
    let ask = Ask::Api(ApiRequest::ListExecutors {
        offset: paging.offset,
        limit,
    });
    timed(web.ask(ask).await?)
}

async fn jobs(
    State(web): State<Arc<Web>>,
    Query(paging): Query<Paging>,
) -> Result<Response, Failure> {
    let limit = paging.limit(50);
    let before = paging.before;
    timed(web.ask(Ask::RecentJobs { before, limit }).await?)
}

async fn job(State(web): State<Arc<Web>>, Path(job_id): Path<JobId>) -> Result<Response, Failure> {
    timed(web.ask(Ask::Api(ApiRequest::GetJob { job_id })).await?)
}

async fn tasks(
    State(web): State<Arc<Web>>,
    Path(job_id): Path<JobId>,
    Query(paging): Query<Paging>,
) -> Result<Response, Failure> {
    let limit = paging.limit(100);
    let ask = Ask::Api(ApiRequest::GetResults {
        job_id,
        offset: paging.offset,
        limit,
    });
    let answer = web.ask(ask).await?;
    let ApiReply::Results(page) = answer.reply else {
        return Err(Failure::Refused("no results page".into()));
    };
    Ok(Json(Timed {
        now_ms: answer.now_ms,
        body: preview(page),
    })
    .into_response())
}

/// `page` with each result cut to a preview: the page shows a glance, not the data.
fn preview(mut page: ResultsPage) -> ResultsPage {
    for outcome in &mut page.results {
        shorten(outcome);
    }
    page
}

fn shorten(outcome: &mut TaskOutcome) {
    let Some(result) = outcome.result.take() else {
        return;
    };
    let text = result.to_string();
    outcome.result = Some(match text.char_indices().nth(PREVIEW_CHARS) {
        Some((cut, _)) => serde_json::Value::String(format!("{}…", &text[..cut])),
        None => result,
    });
}

fn timed(answer: Answer) -> Result<Response, Failure> {
    let body = Timed {
        now_ms: answer.now_ms,
        body: answer.reply,
    };
    Ok(Json(body).into_response())
}

async fn timeline(State(web): State<Arc<Web>>) -> Json<Vec<Arc<Notice>>> {
    let timeline = web.timeline.lock().unwrap_or_else(|e| e.into_inner());
    Json(timeline.iter().cloned().collect())
}

/// The live stream: `status` first and whenever it changes (the leadership, the store's figures), a `notice` for each
/// event the driver publishes, and `resync` when this stream fell behind and lost some.
async fn events(
    State(web): State<Arc<Web>>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let notices = web.handle.notices.subscribe();
    let mut status = web.handle.status.clone();
    status.mark_changed();
    let stream =
        futures::stream::unfold((notices, status), |(mut notices, mut status)| async move {
            let event = tokio::select! {
                biased;
                changed = status.changed() => {
                    changed.ok()?;
                    let now = status.borrow_and_update().clone();
                    sse("status", &now)
                }
                notice = notices.recv() => match notice {
                    Ok(notice) => sse("notice", &notice),
                    Err(RecvError::Lagged(lost)) => sse("resync", &lost),
                    Err(RecvError::Closed) => return None,
                },
            };
            Some((Ok(event), (notices, status)))
        });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

fn sse(name: &str, data: &impl Serialize) -> SseEvent {
    SseEvent::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|_| SseEvent::default().event("resync").data("0"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::TaskState;

    fn outcome(result: serde_json::Value) -> TaskOutcome {
        TaskOutcome {
            index: 0,
            task_id: 1,
            state: TaskState::Finished,
            attempts: 1,
            executor_id: None,
            result: Some(result),
            error: None,
            result_object: None,
            started_ms: None,
            duration_ms: None,
        }
    }

    #[test]
    fn a_long_result_is_cut_to_a_preview_and_a_short_one_kept() {
        let mut long = outcome(serde_json::json!({ "stdout": "é".repeat(500) }));
        shorten(&mut long);
        let text = long.result.unwrap();
        let text = text.as_str().unwrap();
        assert_eq!(text.chars().count(), PREVIEW_CHARS + 1);
        assert!(text.ends_with('…'));
        let mut short = outcome(serde_json::json!({ "exit_code": 0 }));
        shorten(&mut short);
        assert_eq!(short.result.unwrap(), serde_json::json!({ "exit_code": 0 }));
    }
}
