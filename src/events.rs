//! The listener bus: subscribing to a cluster's events and describing them in one line.

use crate::protocol::{decode, Event, TaskState};
use crate::subjects::Subjects;
use async_nats::{Client, Subscriber};
use futures::{Stream, StreamExt};

/// A subscription to every event of the cluster.
pub async fn subscribe(
    client: &Client,
    subjects: &Subjects,
) -> Result<Subscriber, async_nats::SubscribeError> {
    client.subscribe(subjects.events_all()).await
}

/// The subscription's events, decoded; each item keeps the raw payload for `--json` output.
/// An event from an older leadership than the newest heard from is left out (see
/// [`crate::epoch`]).
pub fn decoded(
    subscriber: Subscriber,
) -> impl Stream<Item = (bytes::Bytes, Result<Event, String>)> {
    let epochs = crate::epoch::Newest::new(crate::client::FAILOVER_PATIENCE);
    subscriber.filter_map(move |message| {
        let current = epochs.hears(&message);
        let event = decode::<Event>(&message.payload, usize::MAX).map_err(|e| e.to_string());
        std::future::ready(current.then_some((message.payload, event)))
    })
}

/// One readable line for an event.
pub fn describe(event: &Event) -> String {
    match event {
        Event::ExecutorTarget {
            target_executors,
            previous,
            reason,
            ..
        } => format!("executor target   {previous} -> {target_executors}: {reason}"),
        Event::ExecutorExcluded {
            executor_id,
            scope,
            job_id,
            index,
            reason,
            until_ms,
            ..
        } => format!(
            "executor excluded {executor_id} from {} until {}: {reason}",
            exclusion_target(*scope, *job_id, *index),
            crate::text::format_time(*until_ms)
        ),
        Event::ExecutorUnexcluded {
            executor_id,
            scope,
            job_id,
            index,
            reason,
            ..
        } => format!(
            "executor back     {executor_id} for {}: {reason}",
            exclusion_target(*scope, *job_id, *index)
        ),
        Event::ExecutorAdded {
            executor_id, info, ..
        } => format!(
            "executor added    {executor_id} at {} with {} cores",
            info.host_port, info.total_cores
        ),
        Event::ExecutorRemoved {
            executor_id,
            reason,
            ..
        } => {
            format!("executor removed  {executor_id}: {reason}")
        }
        Event::JobStart {
            job_id,
            name,
            tasks,
            ..
        } => {
            format!("job started       {job_id} {name:?} with {tasks} tasks")
        }
        Event::TaskStart { job_id, term, .. } => {
            format!(
                "tasks started     job {job_id}: {} launched{}",
                event.task_count(),
                of_term(*term)
            )
        }
        Event::TaskEnd { job_id, term, .. } => {
            let ok = event
                .ended()
                .filter(|(_, t)| t.state == TaskState::Finished)
                .count();
            let first_error = event.ended().find_map(|(_, t)| t.error.as_deref());
            let mut line = format!(
                "tasks ended       job {job_id}: {ok} finished, {} not{}",
                event.task_count() - ok,
                of_term(*term)
            );
            if let Some(error) = first_error {
                line.push_str(&format!(" (e.g. {error})"));
            }
            line
        }
        Event::JobEnd {
            job_id,
            state,
            succeeded,
            failed,
            killed,
            reason,
            ..
        } => {
            let mut line = format!(
                "job ended         {job_id} {state}: {succeeded} succeeded, {failed} failed, {killed} killed"
            );
            if let Some(reason) = reason {
                line.push_str(&format!(" ({reason})"));
            }
            line
        }
        Event::SpeculativeTaskStart {
            job_id,
            executor_id,
            index,
            attempt,
            copy_of,
            running_ms,
            threshold_ms,
            ..
        } => format!(
            "task speculated   job {job_id} task {index}: attempt {attempt} on {executor_id}, \
             beside attempt {copy_of} running {running_ms} ms (over {threshold_ms} ms)"
        ),
    }
}

/// What an exclusion covers, in words: "task 3 of job 7", "job 7" or "every job".
pub fn exclusion_target(
    scope: crate::protocol::ExclusionScope,
    job_id: Option<u64>,
    index: Option<u32>,
) -> String {
    use crate::protocol::ExclusionScope;
    let job = job_id.map_or_else(|| "?".to_string(), |id| id.to_string());
    match scope {
        ExclusionScope::Task => format!(
            "task {} of job {job}",
            index.map_or_else(|| "?".to_string(), |i| i.to_string())
        ),
        ExclusionScope::Job => format!("job {job}"),
        ExclusionScope::Cluster => "every job".into(),
    }
}

/// Which leadership's attempts a task event names, when a journal gives it one: two leaders'
/// attempts of a task may have the same number, never the same term.
fn of_term(term: u64) -> String {
    match term {
        0 => String::new(),
        term => format!(" (term {term})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ExecutorId;
    use crate::protocol::ExclusionScope;

    #[test]
    fn an_exclusion_and_its_end_read_as_one_line_each() {
        let executor_id = ExecutorId::parse("bad").unwrap();
        let excluded = Event::ExecutorExcluded {
            time_ms: 0,
            executor_id: executor_id.clone(),
            scope: ExclusionScope::Task,
            job_id: Some(7),
            index: Some(3),
            reason: "task 3 failed once on it".into(),
            until_ms: 3_600_000,
        };
        assert_eq!(
            describe(&excluded),
            "executor excluded bad from task 3 of job 7 until 1970-01-01T01:00:00Z: task 3 \
             failed once on it"
        );
        let back = Event::ExecutorUnexcluded {
            time_ms: 3_600_000,
            executor_id,
            scope: ExclusionScope::Cluster,
            job_id: None,
            index: None,
            reason: "excluded for 1h (--exclude-timeout), which has passed".into(),
        };
        assert_eq!(
            describe(&back),
            "executor back     bad for every job: excluded for 1h (--exclude-timeout), which \
             has passed"
        );
    }
}
