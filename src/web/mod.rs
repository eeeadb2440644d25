//! The driver's live web page (`ember-driver --http HOST:PORT`): a read-only view of the
//! executors, the jobs, one job's tasks and a timeline, kept live by server-sent events.
//!
//! The page never reads the driver's state itself. The actor that owns the core holds a
//! [`Link`]; the web server holds the other end, a [`Handle`]:
//!
//! - queries travel to the actor over an mpsc, each with a oneshot for its answer, and the
//!   actor answers them with the core's own api handling, between its other messages, only
//!   while it leads (a page of results stored in the results bucket is read there first);
//! - what the driver publishes on the listener bus goes to a `broadcast` of [`Notice`]s: the
//!   actor never waits on it, and a browser that falls behind loses notices (its stream says
//!   so, and the page fetches what it shows again);
//! - whether the driver leads goes to a `watch` of [`Status`].
//!
//! The server ([`serve`]) runs on a thread and a runtime of its own, so that serving pages
//! takes nothing from the actor's thread.

mod server;

pub use server::serve;

use crate::ids::{InstanceId, JobId};
use crate::protocol::{ApiReply, ApiRequest, Event, TaskState};
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

/// The port the page is suggested on (Spark's UI port).
pub const SUGGESTED_PORT: u16 = 4040;

/// How many queries may wait for the actor; past it the page is told the driver is busy.
const QUERIES_WAITING: usize = 16;

/// How many notices a browser may fall behind by before it loses some.
const NOTICES_BUFFERED: usize = 4096;

/// What the page asks the driver.
// Made once per page request and sent once, as the `ApiRequest` it holds.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Ask {
    /// A read-only api request: `ListExecutors`, `ListJobs`, `GetJob` or `GetResults`.
    Api(ApiRequest),
    /// The newest `limit` jobs before job `before` (0: the newest of all), newest first. The
    /// answer is `ApiReply::Jobs`, whose `next_job` names the `before` of the page after it.
    RecentJobs { before: JobId, limit: u32 },
}

/// A query and where its answer goes.
#[derive(Debug)]
pub struct Query {
    pub ask: Ask,
    pub answer: oneshot::Sender<Answer>,
}

/// The actor's answer to a query.
#[derive(Debug)]
pub struct Answer {
    pub reply: ApiReply,
    /// When the core answered (the driver's clock), for ages and durations.
    pub now_ms: u64,
}

/// Whether this driver leads, as the page shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Status {
    pub cluster: String,
    pub leading: bool,
    /// The epoch of the leadership (0 without a lease).
    pub epoch: u64,
    pub driver_instance: Option<InstanceId>,
    /// The object store as this driver's last sweep found it, while it leads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreFigures>,
}

/// The object store as a sweep found it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StoreFigures {
    pub objects: u64,
    pub bytes: u64,
    /// When the sweep listed it, in ms since the Unix epoch.
    pub at_ms: u64,
}

/// What the page hears of an event the driver published: executor and job events whole,
/// task events as counts (a job's tasks can be millions; the page asks for the ones it shows).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Notice {
    Event(Event),
    Tasks(TaskProgress),
}

/// The attempts one task event of a job started or ended, by state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "type")]
pub struct TaskProgress {
    pub time_ms: u64,
    pub job_id: JobId,
    pub started: u32,
    pub finished: u32,
    pub failed: u32,
    pub killed: u32,
    pub lost: u32,
}

impl Notice {
    /// What the page hears of `event`.
    pub fn of(event: &Event) -> Self {
        match event {
            Event::TaskStart {
                time_ms, job_id, ..
            } => Notice::Tasks(TaskProgress {
                time_ms: *time_ms,
                job_id: *job_id,
                started: event.task_count() as u32,
                ..TaskProgress::default()
            }),
            Event::TaskEnd {
                time_ms, job_id, ..
            } => {
                let mut progress = TaskProgress {
                    time_ms: *time_ms,
                    job_id: *job_id,
                    ..TaskProgress::default()
                };
                for (_, end) in event.ended() {
                    match end.state {
                        TaskState::Finished => progress.finished += 1,
                        TaskState::Failed => progress.failed += 1,
                        TaskState::Killed => progress.killed += 1,
                        TaskState::Lost => progress.lost += 1,
                        TaskState::Launching | TaskState::Running => {}
                    }
                }
                Notice::Tasks(progress)
            }
            other => Notice::Event(other.clone()),
        }
    }

    /// Whether it belongs on the timeline (executors added and removed, jobs started and
    /// ended), rather than being only progress.
    pub fn is_timeline(&self) -> bool {
        matches!(self, Notice::Event(_))
    }
}

/// The actor's end of the page's link. Cloning it shares the same channels.
#[derive(Debug, Clone)]
pub struct Link {
    /// Taken by the actor for as long as it leads.
    queries: Arc<tokio::sync::Mutex<mpsc::Receiver<Query>>>,
    notices: broadcast::Sender<Arc<Notice>>,
    status: Arc<watch::Sender<Status>>,
}

/// The web server's end of the link.
#[derive(Debug, Clone)]
pub struct Handle {
    queries: mpsc::Sender<Query>,
    notices: broadcast::Sender<Arc<Notice>>,
    status: watch::Receiver<Status>,
}

/// A new link between a driver of `cluster` and its page.
pub fn link(cluster: &str) -> (Link, Handle) {
    let (queries_in, queries_out) = mpsc::channel(QUERIES_WAITING);
    let (notices, _) = broadcast::channel(NOTICES_BUFFERED);
    let (status_in, status_out) = watch::channel(Status {
        cluster: cluster.to_string(),
        ..Status::default()
    });
    let link = Link {
        queries: Arc::new(tokio::sync::Mutex::new(queries_out)),
        notices: notices.clone(),
        status: Arc::new(status_in),
    };
    let handle = Handle {
        queries: queries_in,
        notices,
        status: status_out,
    };
    (link, handle)
}

/// The queries of one leadership: held by the actor while it leads.
pub type Queries = tokio::sync::OwnedMutexGuard<mpsc::Receiver<Query>>;

impl Link {
    /// The queries, for the actor that starts to lead; none if another actor of this process
    /// already holds them (one link serves one driver).
    pub fn queries(&self) -> Option<Queries> {
        self.queries.clone().try_lock_owned().ok()
    }

    /// The driver leads, in `epoch`, as `driver_instance`.
    pub fn leading(&self, epoch: u64, driver_instance: InstanceId) {
        self.status.send_modify(|status| {
            status.leading = true;
            status.epoch = epoch;
            status.driver_instance = Some(driver_instance);
        });
    }

    /// The driver stands by (or stops).
    pub fn standing_by(&self) {
        self.status.send_modify(|status| {
            status.leading = false;
            status.epoch = 0;
            status.driver_instance = None;
            status.store = None;
        });
    }

    /// What the leader's sweep found in the object store.
    pub fn store(&self, figures: StoreFigures) {
        self.status
            .send_modify(|status| status.store = Some(figures));
    }

    /// Tells the page of an event the driver published. Never waits: with no page listening
    /// it costs a check.
    pub fn published(&self, event: &Event) {
        if self.notices.receiver_count() > 0 {
            let _ = self.notices.send(Arc::new(Notice::of(event)));
        }
    }
}

/// The next query of a leadership's `queries`; never, without them or once the server is
/// gone.
pub async fn next_query(queries: &mut Option<Queries>) -> Query {
    if let Some(queries) = queries {
        if let Some(query) = queries.recv().await {
            return query;
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ExecutorId;
    use crate::protocol::{ExecutorTasks, TaskEnded};

    fn ended(task_id: u64, state: TaskState) -> TaskEnded {
        TaskEnded {
            task_id,
            index: task_id as u32,
            attempt: 0,
            state,
            duration_ms: 5,
            error: None,
        }
    }

    #[test]
    fn a_task_end_is_heard_as_counts_by_state() {
        let executor = ExecutorId::parse("exec-1").unwrap();
        let event = Event::TaskEnd {
            time_ms: 9,
            job_id: 3,
            executors: vec![ExecutorTasks {
                executor_id: executor,
                tasks: vec![
                    ended(1, TaskState::Finished),
                    ended(2, TaskState::Finished),
                    ended(3, TaskState::Failed),
                    ended(4, TaskState::Lost),
                ],
            }],
            term: 0,
        };
        let notice = Notice::of(&event);
        assert!(!notice.is_timeline());
        let json = serde_json::to_value(&notice).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "TaskProgress", "time_ms": 9, "job_id": 3, "started": 0,
                "finished": 2, "failed": 1, "killed": 0, "lost": 1})
        );
    }

    #[test]
    fn executor_and_job_events_are_heard_whole() {
        let event = Event::JobStart {
            time_ms: 1,
            job_id: 2,
            name: "x".into(),
            tasks: 10,
        };
        let notice = Notice::of(&event);
        assert!(notice.is_timeline());
        assert_eq!(
            serde_json::to_value(&notice).unwrap(),
            serde_json::to_value(&event).unwrap()
        );
    }

    #[tokio::test]
    async fn one_actor_at_a_time_holds_the_queries() {
        let (link, _handle) = link("c");
        let first = link.queries();
        assert!(first.is_some());
        assert!(link.queries().is_none());
        drop(first);
        assert!(link.queries().is_some());
    }

    #[tokio::test]
    async fn the_status_follows_the_leadership() {
        let (link, handle) = link("c");
        assert!(!handle.status.borrow().leading);
        let instance = uuid::Uuid::new_v4();
        link.leading(7, instance);
        assert_eq!(handle.status.borrow().epoch, 7);
        assert!(handle.status.borrow().leading);
        link.standing_by();
        assert!(!handle.status.borrow().leading);
        assert_eq!(handle.status.borrow().cluster, "c");
    }
}
