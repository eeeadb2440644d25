//! Tests of the driver core, with no NATS and no clock: registration, the api, offers, status
//! updates and retries, and property tests that run random sequences of all of them against the
//! invariants. This module holds what they share: builders of requests, senders that check the
//! reply, readers of effects, and the invariant checks.

mod abandoned;
mod adoption;
mod allocation;
mod backoff;
mod dependencies;
mod exclusion;
mod gang;
mod gate;
mod jobs;
mod keys;
mod kills;
mod offers;
mod placement;
mod pools;
mod props;
mod registration;
mod resources;
mod restore;
mod retention;
mod retries;
mod speculation;
mod status;
mod tenants;
mod timeouts;

use super::jobs::TaskStatus;
use super::{Core, CoreConfig, Effect};
use crate::ids::{ExecutorId, InstanceId, JobId, TaskId};
use crate::protocol::{
    ApiReply, ApiRequest, Event, ExecutorMessage, ExecutorTasks, JobState, JobSummary,
    JournalRecord, RefusedStatus, RegisterExecutor, RegisterReply, ResultObject, ResultsPage,
    StatusReply, StatusUpdate, SubmitJob, TaskEnded, TaskOutcome, TaskSpec, TaskState,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

// ---------------------------------------------------------------------------------------------
// Building requests
// ---------------------------------------------------------------------------------------------

const DRIVER: u128 = 0xd71e;
const MAX_REPLY: usize = 1024 * 1024;

fn core_with(expect_executors: u64, max_reply_bytes: usize) -> Core {
    Core::new(CoreConfig {
        driver_instance: InstanceId::from_u128(DRIVER),
        epoch: 0,
        term: 0,
        expect_executors,
        max_reply_bytes,
        journal: false,
        results_bucket: false,
        retention: Default::default(),
    })
}

/// A core that keeps `jobs` finished jobs.
fn core_retaining(jobs: usize) -> Core {
    let mut core = journaled_core(0);
    core.config.retention.jobs = jobs;
    core
}

/// A core that emits journal records.
fn journaled_core(expect_executors: u64) -> Core {
    let mut core = new_core(expect_executors);
    core.config.journal = true;
    core
}

fn new_core(expect_executors: u64) -> Core {
    core_with(expect_executors, MAX_REPLY)
}

fn eid(id: &str) -> ExecutorId {
    ExecutorId::parse(id).expect("a valid executor id")
}

/// The instance of the process that owns `id` (stable, so a retry matches).
fn instance_of(id: &str) -> InstanceId {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u128, |h, b| {
        (h ^ u128::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    InstanceId::from_u128(hash)
}

fn registration(id: &str, cores: u32) -> RegisterExecutor {
    RegisterExecutor {
        executor_id: eid(id),
        instance_id: instance_of(id),
        host_port: format!("{id}.example:7078"),
        cores,
        log_urls: BTreeMap::new(),
        attributes: BTreeMap::new(),
        resources: Default::default(),
        held: Vec::new(),
        connection: None,
    }
}

/// The reply that accepts executor `id`.
fn registered(id: &str) -> RegisterReply {
    RegisterReply::RegisteredExecutor {
        executor_id: eid(id),
        driver_instance: InstanceId::from_u128(DRIVER),
        term: 0,
        adopted: Vec::new(),
    }
}

/// Registers `id` and returns what the registration caused.
fn add(core: &mut Core, id: &str, cores: u32, now: u64) -> Vec<Effect> {
    assert_eq!(
        core.register(id, registration(id, cores), now),
        registered(id)
    );
    core.take_effects()
}

fn noop() -> TaskSpec {
    TaskSpec::Handler {
        name: "noop".into(),
        arg: Value::Null,
    }
}

fn job(tasks: u32, cpus_per_task: u32, max_failures: u32) -> SubmitJob {
    SubmitJob {
        name: "test-job".into(),
        repeat: tasks,
        max_failures,
        cpus_per_task,
        ..SubmitJob::new(vec![noop()])
    }
}

/// Submits a job that must be accepted; its effects stay queued.
fn submit(core: &mut Core, submit: SubmitJob, now: u64) -> JobId {
    match core.api(ApiRequest::SubmitJob(submit), now) {
        ApiReply::JobAccepted { job_id } => job_id,
        other => panic!("submission refused: {other:?}"),
    }
}

/// Submits a job that must be accepted and returns the launches it caused.
fn start(core: &mut Core, submission: SubmitJob, now: u64) -> (JobId, Vec<Launch>) {
    let job_id = submit(core, submission, now);
    let effects = core.take_effects();
    check_effects(core, &effects);
    (job_id, launches(&effects))
}

fn update(task_id: TaskId, attempt: u32, state: TaskState) -> StatusUpdate {
    StatusUpdate {
        task_id,
        attempt,
        state,
        result: None,
        error: None,
        result_object: None,
        no_retry: false,
    }
}

fn finished(task_id: TaskId, attempt: u32) -> StatusUpdate {
    update(task_id, attempt, TaskState::Finished)
}

fn finished_with(task_id: TaskId, attempt: u32, result: Value) -> StatusUpdate {
    StatusUpdate {
        result: Some(result),
        ..finished(task_id, attempt)
    }
}

fn failed(task_id: TaskId, attempt: u32, error: &str) -> StatusUpdate {
    StatusUpdate {
        error: Some(error.into()),
        ..update(task_id, attempt, TaskState::Failed)
    }
}

fn killed(task_id: TaskId, attempt: u32) -> StatusUpdate {
    update(task_id, attempt, TaskState::Killed)
}

// ---------------------------------------------------------------------------------------------
// Sending requests and reading replies
// ---------------------------------------------------------------------------------------------

/// The acknowledgement of a batch whose `accepted` updates all counted.
fn ack(accepted: u32) -> StatusReply {
    StatusReply::StatusAck {
        accepted,
        refused: vec![],
        launch: vec![],
    }
}

/// Hands `core` a status batch from executor `from` on `subject`'s subject. Tasks that came
/// back with the acknowledgement are put among the effects where the `LaunchTasks` they
/// replace would have been, so tests read every launch in one place.
fn send_status(
    core: &mut Core,
    subject: &str,
    from: &str,
    updates: Vec<StatusUpdate>,
    now: u64,
) -> StatusReply {
    let mut reply = core.status_updates(subject, &eid(from), updates, now);
    if let StatusReply::StatusAck { launch, .. } = &mut reply {
        if !launch.is_empty() {
            let to = eid(from);
            let at = core
                .effects
                .iter()
                .position(|effect| match effect {
                    Effect::Send { to: other, .. } => *other > to,
                    Effect::Publish(event) | Effect::PublishToTenant { event, .. } => {
                        matches!(event, Event::TaskStart { .. })
                    }
                    Effect::Journal(_)
                    | Effect::StoreResult { .. }
                    | Effect::PinResults { .. }
                    | Effect::UnpinResults { .. }
                    | Effect::Release { .. } => false,
                })
                .unwrap_or(core.effects.len());
            let tasks = std::mem::take(launch);
            let driver_instance = Some(core.config.driver_instance);
            let message = ExecutorMessage::LaunchTasks {
                tasks,
                driver_instance,
            };
            core.effects.insert(at, Effect::Send { to, message });
        }
    }
    reply
}

/// Sends `updates` from executor `from` on its own subject; the batch must be acknowledged.
fn status(
    core: &mut Core,
    from: &str,
    updates: Vec<StatusUpdate>,
    now: u64,
) -> (u32, Vec<RefusedStatus>) {
    match send_status(core, from, from, updates, now) {
        StatusReply::StatusAck {
            accepted, refused, ..
        } => (accepted, refused),
        other => panic!("status batch not acknowledged: {other:?}"),
    }
}

/// Sends `updates` from `from`, expecting every one to be accepted, and returns the effects,
/// checked.
fn report(core: &mut Core, from: &str, updates: Vec<StatusUpdate>, now: u64) -> Vec<Effect> {
    let n = updates.len() as u32;
    assert_eq!(status(core, from, updates, now), (n, vec![]));
    let effects = core.take_effects();
    check_effects(core, &effects);
    effects
}

/// The core's effects, with its journal records moved to `journal`.
fn take_journal(core: &mut Core, journal: &mut Vec<JournalRecord>) -> Vec<Effect> {
    let mut effects = core.take_effects();
    effects.retain(|effect| match effect {
        Effect::Journal(record) => {
            journal.push(record.clone());
            false
        }
        _ => true,
    });
    effects
}

/// `core`'s snapshot as one record of one part.
fn snapshot_record(core: &Core, n: u128, time_ms: u64) -> JournalRecord {
    let (ids, records) = core.snapshot();
    JournalRecord::SnapshotPart {
        snapshot: uuid::Uuid::from_u128(n),
        part: 0,
        parts: 1,
        time_ms,
        next_job: ids.next_job,
        next_task: ids.next_task,
        records,
    }
}

/// A fresh core restored from `journal`, each record replayed `times` over.
fn restored(journal: &[JournalRecord], times: usize) -> Core {
    restored_keeping(
        journal,
        times,
        crate::driver::core::DEFAULT_RETAIN_JOBS as usize,
    )
}

/// A fresh core keeping `jobs` finished jobs, restored from `journal` as [`restored`] does.
fn restored_keeping(journal: &[JournalRecord], times: usize, jobs: usize) -> Core {
    let mut core = core_retaining(jobs);
    for record in journal {
        for _ in 0..times {
            core.replay(record.clone())
                .expect("a record the core wrote replays");
        }
    }
    core.resume(0);
    assert_eq!(core.take_effects(), vec![], "a replay sends nothing");
    core
}

/// Runs `f`, which must change nothing and send nothing, and returns its answer.
fn unchanged<T>(core: &mut Core, f: impl FnOnce(&mut Core) -> T) -> T {
    // Any message from an executor, even a refused one, says it lives.
    let registry = |core: &Core| {
        let mut snapshot = core.executors_snapshot();
        for executor in &mut snapshot.executors {
            executor.last_seen_ms = 0;
        }
        snapshot
    };
    let print = fingerprint(core);
    let snapshot = registry(core);
    let out = f(core);
    assert_eq!(core.take_effects(), vec![], "it sent something");
    assert_eq!(registry(core), snapshot);
    assert_eq!(fingerprint(core), print, "it changed the state");
    out
}

fn summary(core: &mut Core, job_id: JobId) -> JobSummary {
    match core.api(ApiRequest::GetJob { job_id }, 0) {
        ApiReply::Job { job } => job,
        other => panic!("no summary for job {job_id}: {other:?}"),
    }
}

fn list_jobs(core: &mut Core) -> Vec<JobSummary> {
    match core.api(ApiRequest::list_jobs(), 0) {
        ApiReply::Jobs { jobs, .. } => jobs,
        other => panic!("ListJobs did not list jobs: {other:?}"),
    }
}

fn results(core: &mut Core, job_id: JobId, offset: u32, limit: u32) -> ResultsPage {
    let request = ApiRequest::GetResults {
        job_id,
        offset,
        limit,
    };
    match core.api(request, 0) {
        ApiReply::Results(page) => page,
        other => panic!("no results for job {job_id}: {other:?}"),
    }
}

/// The outcome of task `index` of job `job_id`, as the results api shows it.
fn outcome(core: &mut Core, job_id: JobId, index: u32) -> TaskOutcome {
    let page = results(core, job_id, index, 1);
    assert_eq!(page.results.len(), 1, "job {job_id} has no task {index}");
    page.results.into_iter().next().unwrap()
}

fn free(core: &Core, id: &str) -> u32 {
    core.executors()[&eid(id)].free_cores
}

fn api_error(reply: ApiReply) -> String {
    match reply {
        ApiReply::Error { message } => message,
        other => panic!("expected an error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Reading effects
// ---------------------------------------------------------------------------------------------

/// One `LaunchTasks`: the executor, and the (task id, index, attempt) of each task.
type Launch = (String, Vec<(TaskId, u32, u32)>);

/// The `LaunchTasks` in `effects`.
fn launches(effects: &[Effect]) -> Vec<Launch> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send {
                to,
                message: ExecutorMessage::LaunchTasks { tasks, .. },
            } => Some((
                to.to_string(),
                tasks
                    .iter()
                    .map(|t| (t.task_id, t.index, t.attempt))
                    .collect(),
            )),
            _ => None,
        })
        .collect()
}

/// The `KillTask`s in `effects`: (executor, task id, attempt, reason). Each must name the
/// driver instance that sent it.
fn kill_tasks(effects: &[Effect]) -> Vec<(String, TaskId, u32, String)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send {
                to,
                message:
                    ExecutorMessage::KillTask {
                        task_id,
                        attempt,
                        reason,
                        driver_instance,
                    },
            } => {
                assert!(
                    driver_instance.is_some(),
                    "a KillTask without driver_instance"
                );
                Some((to.to_string(), *task_id, *attempt, reason.clone()))
            }
            _ => None,
        })
        .collect()
}

fn events(effects: &[Effect]) -> Vec<Event> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Publish(event) => Some(event.clone()),
            _ => None,
        })
        .collect()
}

/// The kinds of the events in `effects`, in order.
fn event_kinds(effects: &[Effect]) -> Vec<&'static str> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Publish(event) => Some(event.kind()),
            _ => None,
        })
        .collect()
}

fn job_ends(effects: &[Effect]) -> Vec<Event> {
    events(effects)
        .into_iter()
        .filter(|e| matches!(e, Event::JobEnd { .. }))
        .collect()
}

/// The reason, failed and killed counts of the one `JobEnd` in `ends`, which failed its job.
fn one_failure(ends: &[Event]) -> (&str, u32, u32) {
    match ends {
        [Event::JobEnd {
            reason: Some(reason),
            failed,
            killed,
            ..
        }] => (reason, *failed, *killed),
        _ => panic!("one job should have failed: {ends:?}"),
    }
}

fn task_ends(effects: &[Effect]) -> Vec<TaskEnded> {
    events(effects)
        .iter()
        .flat_map(|e| e.ended().map(|(_, t)| t.clone()))
        .collect()
}

/// The one `TaskEnd` entry in `effects`, as (attempt, state, error).
fn the_task_end(effects: &[Effect]) -> (u32, TaskState, Option<String>) {
    match &task_ends(effects)[..] {
        [end] => (end.attempt, end.state, end.error.clone()),
        other => panic!("expected one TaskEnd entry, got {other:?}"),
    }
}

/// The `JobEnd` of a job that failed at `time_ms` with these counts.
fn job_failed(time_ms: u64, job_id: JobId, counts: (u32, u32, u32), reason: &str) -> Event {
    let (succeeded, failed, killed) = counts;
    Event::JobEnd {
        time_ms,
        job_id,
        state: JobState::Failed,
        succeeded,
        failed,
        killed,
        reason: Some(reason.into()),
    }
}

/// The `JobEnd` of a job of `tasks` tasks that succeeded at `time_ms`.
fn job_succeeded(time_ms: u64, job_id: JobId, tasks: u32) -> Event {
    Event::JobEnd {
        time_ms,
        job_id,
        state: JobState::Succeeded,
        succeeded: tasks,
        failed: 0,
        killed: 0,
        reason: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Checks of the whole state
// ---------------------------------------------------------------------------------------------

/// Every piece of state that a refused or repeated request must leave alone (everything but
/// `last_seen_ms`, which any message from an executor refreshes, and the effect queue).
fn fingerprint(core: &Core) -> String {
    let mut s = String::new();
    for (id, e) in &core.executors {
        let mut running: Vec<_> = e.running.iter().collect();
        running.sort();
        writeln!(
            s,
            "executor {id} {} free={} at={} {:?} running={running:?}",
            e.instance_id, e.free_cores, e.registered_at_ms, e.info
        )
        .unwrap();
    }
    writeln!(
        s,
        "totals {} {} queue={:?} next={} {} first_tasks={:?}",
        core.total_cores,
        core.pending_executors,
        core.queue,
        core.next_job,
        core.next_task,
        core.first_tasks
    )
    .unwrap();
    for job in core.jobs.values() {
        let mut past: Vec<_> = job.past_attempts.iter().collect();
        past.sort();
        let results: BTreeMap<_, _> = job.results.iter().collect();
        let errors: BTreeMap<_, _> = job.errors.iter().collect();
        writeln!(
            s,
            "job {:?} tasks={:?} pending={:?} past={past:?} results={results:?} errors={errors:?}",
            job.summary(),
            job.tasks.iter().collect::<Vec<_>>(),
            job.tasks.waiting_order(usize::MAX).collect::<Vec<_>>()
        )
        .unwrap();
    }
    s
}

/// The attempts the core thinks are running: (executor, task id, attempt), sorted.
fn running_attempts(core: &Core) -> Vec<(ExecutorId, TaskId, u32)> {
    let mut out: Vec<_> = core
        .executors
        .iter()
        .flat_map(|(id, e)| e.running.iter().map(move |(t, a)| (id.clone(), *t, *a)))
        .collect();
    out.sort();
    out
}

/// The invariants that hold after every request.
fn check_invariants(core: &Core) {
    check_executors(core);
    check_retention(core);
    let queue: Vec<JobId> = core.queue.iter().copied().collect();
    // The queue holds exactly the active jobs with tasks waiting to be offered.
    let offerable: BTreeSet<JobId> = core
        .jobs
        .values()
        .filter(|job| job.is_active() && job.tasks.has_waiting())
        .map(|job| job.id)
        .collect();
    assert_eq!(
        queue.iter().copied().collect::<BTreeSet<_>>(),
        offerable,
        "the queue and the jobs with tasks to offer"
    );
    assert_eq!(
        queue.len(),
        offerable.len(),
        "a job queued twice: {queue:?}"
    );
    assert!(
        queue
            .windows(2)
            .all(|w| core.queue_key(w[0]) < core.queue_key(w[1])),
        "the queue is not in priority, then submission order: {queue:?}"
    );
    core.check_pools();
    check_keys(core);
    let keyed = core.jobs.values().filter(|job| job.submission_id.is_some());
    assert_eq!(keyed.count(), core.submissions.len(), "submission ids");
    for (&job_id, job) in &core.jobs {
        assert_eq!(job.id, job_id);
        if let Some(key) = &job.submission_id {
            assert_eq!(
                core.submissions.get(key),
                Some(&job_id),
                "submission id {key}"
            );
        }
        check_job_counts(job);
        check_job_tasks(core, job);
        placement::check_placement(core, job);
        match job.state {
            JobState::Waiting => dependencies::check_waiting(core, job, &queue),
            JobState::Running => {
                // A running job's KILLED tasks were killed by request, one at a time.
                assert_eq!(job.failed, 0, "job {job_id}");
                assert!(job.ended_at_ms.is_none() && job.reason.is_none());
                assert!(
                    job.succeeded + job.killed < job.len(),
                    "job {job_id} is done but still runs"
                );
                if job.tasks.has_waiting() {
                    assert!(
                        queue.contains(&job_id),
                        "job {job_id} has waiting tasks but is not in the queue"
                    );
                }
            }
            JobState::Succeeded => {
                assert_eq!(job.succeeded, job.len(), "job {job_id}");
                assert!(job.reason.is_none());
            }
            JobState::Failed => {
                let reason = job.reason.as_deref().unwrap_or_default();
                // A job no executor may run fails with no task failed if the task it could
                // not run had never run.
                // A job after one that did not succeed fails without running anything.
                if reason.contains("which this job runs after") {
                    assert_eq!((job.succeeded, job.failed), (0, 0), "job {job_id}");
                } else if reason.starts_with("the job passed its deadline") {
                    // Its tasks were stopped, not failed.
                } else if reason.contains("did not start within the queue timeout") {
                    assert_eq!(job.failed, 1, "job {job_id}");
                } else {
                    assert!(
                        job.failed >= 1 || reason.contains("cannot run anywhere"),
                        "job {job_id} failed with no failed task"
                    );
                    assert!(reason.contains("last error:"), "job {job_id}: {reason}");
                }
            }
            JobState::Killed => {
                assert_eq!(job.failed, 0, "job {job_id}");
                let reason = job.reason.as_deref().unwrap_or_default();
                assert!(
                    reason == "killed by request"
                        || reason.contains("killed by request; the other"),
                    "job {job_id}: {reason}"
                );
            }
        }
        if job.state.is_ended() {
            assert!(job.ended_at_ms.is_some(), "job {job_id}");
            assert!(
                !job.tasks.has_waiting(),
                "job {job_id} ended with waiting tasks"
            );
            assert!(!queue.contains(&job_id), "job {job_id} ended but is queued");
        }
    }
}

/// Each concurrency key counts the attempts of its jobs that run on registered executors,
/// speculative copies among them, and no more than its `max_concurrent` of them.
fn check_keys(core: &Core) {
    let mut running: BTreeMap<&str, u32> = BTreeMap::new();
    for data in core.executors.values() {
        for task_id in data.running.keys() {
            let (job_id, _) = core
                .locate(*task_id)
                .expect("a running attempt's job is kept");
            if let Some(key) = &core.jobs[&job_id].concurrency_key {
                *running.entry(key).or_default() += 1;
            }
        }
    }
    let counted = core.keys.running_counts();
    let counts: BTreeMap<&str, u32> = counted.iter().map(|(k, (n, _))| (*k, *n)).collect();
    assert_eq!(counts, running, "what the keys count as running");
    for (key, (n, max)) in counted {
        if let Some(max) = max {
            assert!(n <= max, "key {key} runs {n}, past its {max}");
        }
    }
}

/// The finished jobs held are those kept (at most the limit, oldest end first) and those past
/// it that wait for their last attempts; none runs; the next job id is past every job's.
fn check_retention(core: &Core) {
    let finished: BTreeSet<JobId> = core
        .jobs
        .values()
        .filter(|job| job.state.is_ended())
        .map(|job| job.id)
        .collect();
    let kept: BTreeSet<JobId> = core
        .ended
        .iter()
        .chain(&core.forgetting)
        .chain(&core.held)
        .copied()
        .collect();
    assert_eq!(finished, kept, "finished jobs and the retention's lists");
    assert_eq!(
        kept.len(),
        core.ended.len() + core.forgetting.len() + core.held.len()
    );
    assert!(core.ended.len() <= core.config.retention.jobs.max(1));
    // An open job's upstreams are counted, and nothing else: a job past the limit is held
    // only while an open job runs after it.
    let mut readers: std::collections::HashMap<JobId, u32> = Default::default();
    for job in core.jobs.values().filter(|job| job.is_open()) {
        for up in &job.after {
            *readers.entry(*up).or_default() += 1;
        }
    }
    assert_eq!(readers, core.readers, "the open jobs' upstreams");
    // What an open job's python tasks read is pinned.
    if core.config.results_bucket {
        for job in core.jobs.values().filter(|job| job.is_open()) {
            for up in job.reads_results_of() {
                let pin = core.jobs.get(&up).map(|up| up.pin);
                assert!(
                    matches!(pin, None | Some(super::Pin::Pinned)),
                    "job {} reads job {up}'s results, {pin:?}",
                    job.id
                );
            }
        }
    }
    for id in &core.held {
        assert!(
            core.readers.contains_key(id),
            "job {id} is held for no reader"
        );
    }
    for id in &core.forgetting {
        assert!(
            core.jobs[id].attempts_out(),
            "job {id} waits to be forgotten for nothing"
        );
    }
    if let Some(last) = core.jobs.keys().next_back() {
        assert!(*last < core.next_job);
    }
    let mut all = 0;
    for job in core.jobs.values() {
        let held: u64 = job
            .results
            .values()
            .map(|v| serde_json::to_vec(v).unwrap().len() as u64)
            .sum();
        // Results too large for a message are objects, counted against the job's cap but
        // not held; with a bucket, so are the results in it.
        let objects: u64 = job.result_objects.values().map(|o| o.bytes).sum();
        if core.config.results_bucket {
            assert!(
                job.result_bytes >= held + objects,
                "job {}'s result bytes",
                job.id
            );
        } else {
            assert_eq!(
                job.result_bytes,
                held + objects,
                "job {}'s result bytes",
                job.id
            );
        }
        assert!(!job.results_dropped || job.results.is_empty());
        assert_eq!(job.held_bytes, held, "job {}'s held result bytes", job.id);
        all += held;
    }
    assert_eq!(
        core.result_bytes, all,
        "the results' bytes, all jobs together"
    );
}

/// Each executor's free cores and running attempts agree with the tasks, and the totals with
/// the executors.
fn check_executors(core: &Core) {
    let mut total = 0u64;
    for (id, e) in &core.executors {
        total += u64::from(e.info.total_cores);
        assert!(
            e.free_cores <= e.info.total_cores,
            "executor {id}: free {} > total {}",
            e.free_cores,
            e.info.total_cores
        );
        let mut used = 0u64;
        // Every attempt that holds resources runs here, and holds what its job asks for.
        let holders = e.resources.audit();
        for (task_id, held) in &holders {
            let (job_id, _) = core.locate(*task_id).expect("a holder of a known task");
            assert!(
                e.running.contains_key(task_id),
                "{id}: {task_id} holds but does not run"
            );
            assert_eq!(
                held, &core.jobs[&job_id].resources,
                "{id}: what {task_id} holds"
            );
        }
        for (&task_id, &attempt) in &e.running {
            let (job_id, index) = core
                .locate(task_id)
                .unwrap_or_else(|| panic!("executor {id} runs unknown task {task_id}"));
            let job = &core.jobs[&job_id];
            let record = &job.tasks[index];
            // A speculative copy, or the loser of a pair, runs beside the task's own attempt.
            let other = job.speculation.as_ref().and_then(|s| s.other(index));
            match other {
                Some((other, executor, losing)) if other == attempt && executor == id => {
                    if !losing {
                        assert_eq!(record.status, TaskStatus::Running, "{task_id} on {id}");
                        assert_ne!(record.executor.as_ref(), Some(id), "a copy elsewhere");
                    }
                }
                _ => {
                    assert_eq!(record.status, TaskStatus::Running, "task {task_id} on {id}");
                    assert_eq!(record.attempts, attempt + 1, "task {task_id} on {id}");
                    assert_eq!(record.executor.as_ref(), Some(id), "task {task_id}");
                }
            }
            used += u64::from(job.cpus_per_task);
            if !job.resources.is_empty() {
                assert!(
                    holders.contains_key(&task_id),
                    "{id}: {task_id} holds nothing"
                );
            }
        }
        // Abandoned handlers hold cores too: their own once their attempts have ended, and
        // their attempts' until then.
        for a in &e.abandoned {
            let running = e.running.get(&a.task_id) == Some(&a.attempt);
            assert_eq!(a.counted, !running, "{id}: abandoned {a:?}");
            if a.counted {
                used += u64::from(a.cpus);
            }
        }
        assert_eq!(
            u64::from(e.free_cores) + used,
            u64::from(e.info.total_cores),
            "executor {id}: free cores do not match the attempts it runs and the handlers it abandoned"
        );
    }
    assert_eq!(core.total_cores, total, "total_cores");
    assert_eq!(
        core.executors_snapshot().registered_executors,
        core.executors.len() as u64
    );
}

/// A job's counters match its task records, and its queue of waiting tasks their states.
fn check_job_counts(job: &super::Job) {
    let job_id = job.id;
    let count = |s: TaskStatus| job.tasks.iter().filter(|r| r.status == s).count() as u32;
    assert_eq!(
        job.succeeded,
        count(TaskStatus::Finished),
        "job {job_id} succeeded"
    );
    assert_eq!(job.failed, count(TaskStatus::Failed), "job {job_id} failed");
    assert_eq!(job.killed, count(TaskStatus::Killed), "job {job_id} killed");
    assert_eq!(
        job.running,
        count(TaskStatus::Running),
        "job {job_id} running"
    );
    // A pending task waits for cores or rests out a retry backoff.
    assert_eq!(
        job.tasks.waiting() + job.tasks.resting(),
        count(TaskStatus::Pending),
        "job {job_id} pending"
    );
    for (index, _) in job.tasks.resting_until() {
        assert_eq!(
            job.tasks[index].status,
            TaskStatus::Pending,
            "job {job_id} rests {index}"
        );
    }
    let waiting: Vec<u32> = job.tasks.waiting_order(usize::MAX).collect();
    let pending: BTreeSet<u32> = waiting.iter().copied().collect();
    assert_eq!(
        pending.len(),
        waiting.len(),
        "job {job_id}: a task is pending twice"
    );
    for &index in &pending {
        assert_eq!(job.tasks[index].status, TaskStatus::Pending);
    }
    assert_eq!(
        job.succeeded
            + job.failed
            + job.killed
            + job.running
            + job.tasks.waiting()
            + job.tasks.resting(),
        job.len(),
        "job {job_id}: the counts do not add up"
    );
}

/// Each task's failures stay within the budget, and a running task runs where it says.
fn check_job_tasks(core: &Core, job: &super::Job) {
    for (index, record) in job.tasks.iter().enumerate() {
        let task_id = job.first_task + index as u64;
        assert!(record.failures <= job.max_failures, "task {task_id}");
        assert!(record.failures <= record.attempts, "task {task_id}");
        if record.status == TaskStatus::Running {
            let executor = record
                .executor
                .as_ref()
                .expect("a running task has an executor");
            assert_eq!(
                core.executors[executor].running.get(&task_id),
                Some(&(record.attempts - 1)),
                "task {task_id} runs on {executor} but the executor does not know it"
            );
        }
        // A task fails when it has used up its attempts, when no executor may run it
        // (exclusion on failure), when its result cannot be kept (running it again would
        // make the same result), when it did not start in time, or when its own code said
        // its failure is final.
        let unschedulable = job.reason.as_deref().is_some_and(|r| {
            r.contains("cannot run anywhere")
                || r.contains("the task's result of")
                || r.contains("did not start within the queue timeout")
        }) || job
            .errors
            .get(&(index as u32))
            .is_some_and(|e| e.contains("(not retried:"));
        if record.status == TaskStatus::Failed && !unschedulable {
            assert_eq!(record.failures, job.max_failures, "task {task_id}");
        }
    }
}

/// Checks what one request asked to send: at most one `LaunchTasks` per executor, each launch
/// running where it was sent and announced by a `TaskStart`, and each `KillTask` aimed at a
/// running attempt of an ended job.
fn check_effects(core: &Core, effects: &[Effect]) {
    let mut launched = BTreeSet::new();
    let mut receivers = BTreeSet::new();
    for effect in effects {
        let Effect::Send { to, message } = effect else {
            continue;
        };
        match message {
            ExecutorMessage::LaunchTasks {
                tasks,
                driver_instance,
            } => {
                assert_eq!(
                    *driver_instance,
                    Some(core.config.driver_instance),
                    "a launch must say which driver sent it"
                );
                assert!(
                    receivers.insert(to.clone()),
                    "two LaunchTasks to {to} in one round"
                );
                assert!(!tasks.is_empty(), "an empty LaunchTasks to {to}");
                for t in tasks {
                    let (job_id, index) = core.locate(t.task_id).expect("launched task is known");
                    let job = &core.jobs[&job_id];
                    assert_eq!(
                        (t.job_id, t.index, t.cpus),
                        (job_id, index, job.cpus_per_task)
                    );
                    let handed: BTreeMap<String, u32> = t
                        .resources
                        .iter()
                        .map(|(name, addresses)| (name.clone(), addresses.len() as u32))
                        .collect();
                    assert_eq!(handed, job.resources, "what task {} was handed", t.task_id);
                    assert_eq!(core.executors[to].running.get(&t.task_id), Some(&t.attempt));
                    assert!(
                        !core.excluded(job_id, Some(index), to),
                        "task {index} of job {job_id} launched on {to}, which is excluded from it"
                    );
                    assert!(launched.insert((to.clone(), t.task_id, t.attempt)));
                }
            }
            ExecutorMessage::KillTask {
                task_id, attempt, ..
            } => {
                // An ended job's attempts are killed, and one task's by request.
                let (job_id, _) = core.locate(*task_id).expect("killed task is known");
                let job = &core.jobs[&job_id];
                assert!(
                    !job.is_active()
                        || job
                            .tasks
                            .launched()
                            .iter()
                            .any(|r| r.status == TaskStatus::Running),
                    "KillTask for a running job with nothing running"
                );
                assert_eq!(
                    core.executors[to].running.get(task_id),
                    Some(attempt),
                    "KillTask to {to} for task {task_id} attempt {attempt} that does not run there"
                );
            }
            ExecutorMessage::StopExecutor { .. } => {
                assert!(
                    core.executors.contains_key(to),
                    "StopExecutor to unknown {to}"
                );
            }
            ExecutorMessage::Leading { .. } => panic!("the core sends no Leading: the shell does"),
        }
    }
    let started: BTreeSet<_> = events(effects)
        .iter()
        .flat_map(|e| {
            e.started()
                .map(|(executor, t)| (executor.clone(), t.task_id, t.attempt))
        })
        .collect();
    assert_eq!(launched, started, "LaunchTasks and TaskStart disagree");
}
