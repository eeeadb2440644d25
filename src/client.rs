//! Jobs and queries for programs and the CLI: a thin typed wrapper over requests on the
//! driver's api subject.

use crate::epoch::{self, Newest};
use crate::ids::{ExecutorId, JobId};
use crate::protocol::{
    decode, encode, ApiReply, ApiRequest, Event, ExecutorsSnapshot, JobSummary, ResultObject,
    SubmitJob, TaskOutcome,
};
use crate::subjects::Subjects;
use crate::{PAYLOAD_HEADROOM, REQUEST_TIMEOUT};
use async_nats::Client;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// How often a waiting client asks for a job's progress (job.end events end the wait sooner).
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// How long a client waiting for a job goes on asking while no driver answers: time for a
/// standby driver to take over from a leader that died (its lease, and a replay).
pub const FAILOVER_PATIENCE: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no driver answers on {0} (is ember-driver running on this cluster?)")]
    NoDriver(String),
    #[error("answered by a driver of epoch {0}, which no longer leads")]
    Deposed(u64),
    #[error("the driver did not answer within {0:?}")]
    Timeout(Duration),
    #[error("NATS request failed: {0}")]
    Request(String),
    #[error("the driver said: {0}")]
    Driver(String),
    /// No driver could take the request, and nothing was done (`ApiReply::Unavailable`).
    #[error("{0}")]
    Unavailable(String),
    #[error("the request is {size} bytes, over the server's limit of {limit} bytes; raise max_payload in nats.conf or send fewer, smaller tasks (use `repeat` for identical ones)")]
    TooLarge { size: usize, limit: usize },
    #[error("unexpected answer from the driver: {0}")]
    Unexpected(String),
    #[error("could not subscribe to events: {0}")]
    Subscribe(String),
    #[error("this connection's inbox prefix is _INBOX.{executor}, the one executor {executor} uses, and the driver answers no api request whose reply lies under an executor's inbox; open a second connection, with client credentials and the default inbox prefix, for the api")]
    ExecutorInbox { executor: ExecutorId },
}

impl ClientError {
    /// Whether the request may be sent again in a moment and be answered then: no driver
    /// answered (a standby may be taking over), the one that did no longer leads, or none can
    /// take requests now.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::NoDriver(_)
                | ClientError::Timeout(_)
                | ClientError::Deposed(_)
                | ClientError::Unavailable(_)
        )
    }
}

/// Runs `attempt` again every [`POLL_INTERVAL`], for up to [`FAILOVER_PATIENCE`], while it
/// fails transiently ([`ClientError::is_transient`]): while a standby takes over, or no driver
/// can lead. Without `driver_seen`, finding no driver at all on the first try is final: the
/// cluster may have none.
async fn through_failover<T, F: std::future::Future<Output = Result<T, ClientError>>>(
    driver_seen: bool,
    mut attempt: impl FnMut() -> F,
) -> Result<T, ClientError> {
    let since = tokio::time::Instant::now();
    let mut first = true;
    loop {
        match attempt().await {
            Err(ClientError::NoDriver(subject)) if first && !driver_seen => {
                return Err(ClientError::NoDriver(subject))
            }
            Err(error) if error.is_transient() && since.elapsed() < FAILOVER_PATIENCE => {
                tokio::time::sleep(POLL_INTERVAL).await
            }
            answer => return answer,
        }
        first = false;
    }
}

/// A handle for talking to a cluster's driver.
#[derive(Debug, Clone)]
pub struct EmberClient {
    client: Client,
    subjects: Subjects,
    /// The newest leadership heard from: an answer or event of an older one is not taken.
    epochs: Arc<Newest>,
    /// The executor whose inbox prefix the connection has, if it has one's: every request is
    /// refused, since the driver would drop it without an answer.
    executor_inbox: Option<ExecutorId>,
}

impl EmberClient {
    /// A client of the driver of `subjects`' cluster over `client`. The connection must not
    /// have an executor's inbox prefix (`_INBOX.<id>`): the driver answers no api request whose
    /// reply lies there, so every request made through it fails with
    /// [`ClientError::ExecutorInbox`]. A program that runs an executor opens a second
    /// connection for the api.
    pub fn new(client: Client, subjects: Subjects) -> Self {
        let epochs = Arc::new(Newest::new(FAILOVER_PATIENCE));
        let executor_inbox = Subjects::executor_of_inbox(&client.new_inbox());
        Self {
            client,
            subjects,
            epochs,
            executor_inbox,
        }
    }

    /// The cluster's object store, which a driver with a journal makes: put what tasks read
    /// there, and name it in their specs by the [`crate::objects::ObjectRef`] a put returns.
    pub async fn objects(&self) -> Result<crate::objects::Objects, crate::objects::ObjectsError> {
        let context = async_nats::jetstream::new(self.nats().clone());
        crate::objects::Objects::open(&context, &self.subjects).await
    }

    pub fn nats(&self) -> &Client {
        &self.client
    }

    /// Sends one api request and returns the driver's answer; `Error` answers become errors.
    pub async fn call(&self, request: &ApiRequest) -> Result<ApiReply, ClientError> {
        if let Some(executor) = &self.executor_inbox {
            return Err(ClientError::ExecutorInbox {
                executor: executor.clone(),
            });
        }
        let payload = encode(request);
        let limit = self
            .client
            .server_info()
            .max_payload
            .saturating_sub(PAYLOAD_HEADROOM);
        if payload.len() > limit {
            return Err(ClientError::TooLarge {
                size: payload.len(),
                limit,
            });
        }
        let subject = self.subjects.api();
        let reply = tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.client.request(subject.clone(), payload),
        )
        .await
        .map_err(|_| ClientError::Timeout(REQUEST_TIMEOUT))?
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::NoResponders => ClientError::NoDriver(subject),
            async_nats::RequestErrorKind::TimedOut => ClientError::Timeout(REQUEST_TIMEOUT),
            _ => ClientError::Request(e.to_string()),
        })?;
        let answer = decode::<ApiReply>(&reply.payload, usize::MAX);
        // Said by a standby, which has no epoch: it did nothing, whoever leads.
        if let Ok(ApiReply::Unavailable { message }) = answer {
            return Err(ClientError::Unavailable(message));
        }
        if !self.epochs.hears(&reply) {
            return Err(ClientError::Deposed(epoch::of(&reply)));
        }
        match answer {
            Ok(ApiReply::Error { message }) => Err(ClientError::Driver(message)),
            Ok(answer) => Ok(answer),
            Err(e) => Err(ClientError::Unexpected(e.to_string())),
        }
    }

    /// The whole registry and its totals, fetched page by page.
    pub async fn executors(&self) -> Result<ExecutorsSnapshot, ClientError> {
        let mut snapshot = self.executors_page(0, None).await?;
        while let Some(offset) = snapshot.next_offset.take() {
            let page = self.executors_page(offset, None).await?;
            snapshot.executors.extend(page.executors);
            snapshot.next_offset = page.next_offset.filter(|next| *next > offset);
        }
        Ok(snapshot)
    }

    /// One page of the registry (`limit` 0: the totals alone).
    pub async fn executors_page(
        &self,
        offset: u32,
        limit: Option<u32>,
    ) -> Result<ExecutorsSnapshot, ClientError> {
        match self
            .call(&ApiRequest::ListExecutors { offset, limit })
            .await?
        {
            ApiReply::Executors(snapshot) => Ok(snapshot),
            other => Err(unexpected(other)),
        }
    }

    /// Submits a job; the driver accepts it at once and queues it.
    ///
    /// The submission carries a submission id (a new one, unless `job` has one), so it is
    /// safe to send again: while the answer is a transient error other than the first try's
    /// finding no driver at all, it is sent again for up to [`FAILOVER_PATIENCE`], and a
    /// driver that took it already (whose answer was lost with its leadership, say) answers
    /// with the job it made.
    pub async fn submit(&self, mut job: SubmitJob) -> Result<JobId, ClientError> {
        job.submission_id
            .get_or_insert_with(|| uuid::Uuid::new_v4().simple().to_string());
        let request = ApiRequest::SubmitJob(job);
        through_failover(false, || async {
            match self.call(&request).await? {
                ApiReply::JobAccepted { job_id } => Ok(job_id),
                other => Err(unexpected(other)),
            }
        })
        .await
    }

    pub async fn job(&self, job_id: JobId) -> Result<JobSummary, ClientError> {
        match self.call(&ApiRequest::GetJob { job_id }).await? {
            ApiReply::Job { job } => Ok(job),
            other => Err(unexpected(other)),
        }
    }

    /// Every job, in submission order, fetched page by page.
    pub async fn jobs(&self) -> Result<Vec<JobSummary>, ClientError> {
        let mut all = Vec::new();
        let mut from_job = 0;
        loop {
            match self
                .call(&ApiRequest::ListJobs {
                    offset: 0,
                    limit: None,
                    from_job,
                })
                .await?
            {
                ApiReply::Jobs { jobs, next_job, .. } => {
                    all.extend(jobs);
                    match next_job {
                        Some(next) if next > from_job => from_job = next,
                        _ => return Ok(all),
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Kills job `job_id`. A kill is safe to send again (a killed job answers as the kill
    /// did), so it is sent again through a failover as [`Self::submit`] is.
    pub async fn kill(&self, job_id: JobId) -> Result<(), ClientError> {
        through_failover(false, || async {
            match self.call(&ApiRequest::KillJob { job_id }).await? {
                ApiReply::JobKilled { .. } => Ok(()),
                other => Err(unexpected(other)),
            }
        })
        .await
    }

    /// Kills task `index` of job `job_id` ([`ApiRequest::KillJobTask`]); with `retry` its
    /// running attempt is stopped and it runs again. Returns the attempt told to stop, none if
    /// the task was waiting (it has ended KILLED).
    pub async fn kill_task(
        &self,
        job_id: JobId,
        index: u32,
        retry: bool,
    ) -> Result<Option<u32>, ClientError> {
        let request = ApiRequest::KillJobTask {
            job_id,
            index,
            retry,
        };
        match self.call(&request).await? {
            ApiReply::TaskKilled { attempt, .. } => Ok(attempt),
            other => Err(unexpected(other)),
        }
    }

    /// Tells executor `executor_id` (or, with `None`, every executor) to decommission; returns
    /// how many were told.
    pub async fn stop_executors(
        &self,
        executor_id: Option<ExecutorId>,
    ) -> Result<u32, ClientError> {
        let request = match executor_id {
            Some(executor_id) => ApiRequest::StopExecutor { executor_id },
            None => ApiRequest::StopAllExecutors,
        };
        match self.call(&request).await? {
            ApiReply::Stopping { executors } => Ok(executors),
            other => Err(unexpected(other)),
        }
    }

    /// The driver's scheduling mode (`fifo` or `fair`) and its pools ([`ApiRequest::ListPools`]).
    pub async fn pools(&self) -> Result<(String, Vec<crate::protocol::PoolSummary>), ClientError> {
        match self.call(&ApiRequest::ListPools).await? {
            ApiReply::Pools { scheduling, pools } => Ok((scheduling, pools)),
            other => Err(unexpected(other)),
        }
    }

    /// Sets the limits of concurrency key `key` ([`ApiRequest::SetKeyLimits`]; neither limit
    /// clears them) and returns the key as it stands.
    pub async fn set_key_limits(
        &self,
        key: &str,
        limits: crate::protocol::KeyLimits,
    ) -> Result<crate::protocol::KeySummary, ClientError> {
        let request = ApiRequest::SetKeyLimits {
            key: key.to_string(),
            limits,
        };
        match self.call(&request).await? {
            ApiReply::Keys { mut keys } if keys.len() == 1 => Ok(keys.remove(0)),
            other => Err(unexpected(other)),
        }
    }

    /// Every concurrency key with limits or with an open job that names it
    /// ([`ApiRequest::ListKeys`]).
    pub async fn keys(&self) -> Result<Vec<crate::protocol::KeySummary>, ClientError> {
        match self.call(&ApiRequest::ListKeys).await? {
            ApiReply::Keys { keys } => Ok(keys),
            other => Err(unexpected(other)),
        }
    }

    /// Releases executor `executor_id` if it is idle ([`ApiRequest::ReleaseExecutor`]): an
    /// error says it runs tasks, or is not registered.
    pub async fn release_executor(&self, executor_id: ExecutorId) -> Result<(), ClientError> {
        match self
            .call(&ApiRequest::ReleaseExecutor { executor_id })
            .await?
        {
            ApiReply::Stopping { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Every task's outcome, in index order, fetched page by page; a result too large for one
    /// message is read from the object store into `result` (its `result_object` stays).
    pub async fn results(&self, job_id: JobId) -> Result<Vec<TaskOutcome>, ClientError> {
        let mut all = Vec::new();
        let mut offset = 0;
        loop {
            let request = ApiRequest::GetResults {
                job_id,
                offset,
                limit: 10_000,
            };
            let ApiReply::Results(page) = self.call(&request).await? else {
                return Err(ClientError::Unexpected("not a page of results".into()));
            };
            for mut outcome in page.results {
                if let Some(object) = &outcome.result_object {
                    match self.result_from_store(object).await {
                        Ok(result) => outcome.result = Some(result),
                        // One result out of reach says so in its outcome rather than failing
                        // the whole read.
                        Err(error) => outcome.error = Some(error.to_string()),
                    }
                }
                all.push(outcome);
            }
            match page.next_offset {
                Some(next) if next > offset => offset = next,
                _ => return Ok(all),
            }
        }
    }

    /// A result its executor put in the object store, read (checked against its name) and
    /// decoded.
    pub async fn result_from_store(
        &self,
        object: &ResultObject,
    ) -> Result<serde_json::Value, ClientError> {
        let unexpected = |e: String| ClientError::Unexpected(e);
        let store = self
            .objects()
            .await
            .map_err(|e| unexpected(e.to_string()))?;
        let json = store
            .get_bytes(&object.object)
            .await
            .map_err(|e| unexpected(format!("could not read the result: {e}")))?;
        serde_json::from_slice(&json)
            .map_err(|e| unexpected(format!("the result's object is not JSON: {e}")))
    }

    /// A job's summary, asked again while no driver answers (a standby taking over from a
    /// leader that died), for up to [`FAILOVER_PATIENCE`].
    pub async fn job_through_failover(&self, job_id: JobId) -> Result<JobSummary, ClientError> {
        through_failover(true, || self.job(job_id)).await
    }

    /// Submits a job and waits for its end, calling `progress` with each summary seen.
    pub async fn run_job(
        &self,
        job: SubmitJob,
        progress: impl FnMut(&JobSummary),
    ) -> Result<JobSummary, ClientError> {
        // Subscribed before the submission, so the job's end cannot slip past.
        let ends = self.job_ends().await?;
        let job_id = self.submit(job).await?;
        self.wait_on(ends, job_id, progress).await
    }

    /// Waits for job `job_id` to end, calling `progress` with each summary seen, through a
    /// failover to a standby driver.
    pub async fn wait(
        &self,
        job_id: JobId,
        progress: impl FnMut(&JobSummary),
    ) -> Result<JobSummary, ClientError> {
        let ends = self.job_ends().await?;
        self.wait_on(ends, job_id, progress).await
    }

    async fn job_ends(&self) -> Result<async_nats::Subscriber, ClientError> {
        self.client
            .subscribe(self.subjects.event("job.end"))
            .await
            .map_err(|e| ClientError::Subscribe(e.to_string()))
    }

    async fn wait_on(
        &self,
        mut ends: async_nats::Subscriber,
        job_id: JobId,
        mut progress: impl FnMut(&JobSummary),
    ) -> Result<JobSummary, ClientError> {
        let mut poll = tokio::time::interval(POLL_INTERVAL);
        loop {
            tokio::select! {
                Some(message) = ends.next() => {
                    if !self.epochs.hears(&message) {
                        continue;
                    }
                    if let Ok(Event::JobEnd { job_id: id, .. }) = decode::<Event>(&message.payload, usize::MAX) {
                        if id == job_id {
                            let summary = self.job_through_failover(job_id).await?;
                            progress(&summary);
                            return Ok(summary);
                        }
                    }
                }
                _ = poll.tick() => {
                    let summary = self.job_through_failover(job_id).await?;
                    progress(&summary);
                    if summary.state.is_ended() {
                        return Ok(summary);
                    }
                }
            }
        }
    }
}

fn unexpected(reply: ApiReply) -> ClientError {
    ClientError::Unexpected(
        String::from_utf8_lossy(&encode(&reply))
            .chars()
            .take(200)
            .collect(),
    )
}
