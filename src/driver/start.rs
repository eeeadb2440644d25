//! A leadership's start: the journal opened and, with a lease, led; the core replayed from it;
//! the driver's subscriptions and NATS service opened; the shell that will send for the core.

use super::admission::Admission;
use super::advisories::DISCONNECT_ADVISORIES;
use super::coalesce::TaskEvents;
use super::config::DriverConfig;
use super::core::{Core, CoreConfig};
use super::discovery::{self, ApiCounts, Identity};
use super::history::{self, Fill, History, Stamps};
use super::jetstream::until_answered;
use super::journal::{Journal, JournalError, Replayed, Tail};
use super::lease::{Lease, LeaseError, Tenure};
use super::results::ResultsBucket;
use super::shell::Shell;
use super::snapshots::Schedule;
use crate::connect::{flush, Unsent};
use crate::protocol::JournalRecord;
use crate::subjects::Subjects;
use crate::{now_ms, PAYLOAD_HEADROOM};
use async_nats::{Client, Subscriber};
use std::sync::Arc;
use tracing::{info, warn};

/// Why a driver could not start, or could not send its last messages.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("could not subscribe to {subject}: {source}")]
    Subscribe {
        subject: String,
        source: async_nats::SubscribeError,
    },
    #[error("could not send the driver's subscriptions to the NATS server ({0})")]
    NotSubscribed(Unsent),
    #[error("could not send the driver's last messages to the NATS server ({0}); they are lost")]
    LastMessages(Unsent),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("could not start the driver's NATS service (ember-driver): {0}")]
    Service(async_nats::Error),
    #[error("could not make the cluster's object store: {0}")]
    Objects(String),
}

impl DriverError {
    /// Whether `--replay-timeout` ran out: the leadership's mark or the replay took longer.
    pub(super) fn out_of_replay_time(&self) -> bool {
        matches!(
            self,
            DriverError::Journal(JournalError::ReplayTimeout(_) | JournalError::Lead(..))
        )
    }
}

/// The driver's subscriptions.
pub(super) struct Inputs {
    pub(super) register: Subscriber,
    pub(super) status: Subscriber,
    pub(super) heartbeat: Subscriber,
    /// Executors' reads of the results their tasks read.
    pub(super) results: Subscriber,
    /// The api's requests, from the service's endpoint.
    pub(super) api: async_nats::service::endpoint::Endpoint,
    /// The NATS service the api endpoint belongs to (`$SRV`).
    pub(super) service: async_nats::service::Service,
    /// Submissions whose objects were looked for in the store, back to be answered.
    pub(super) checked: tokio::sync::mpsc::UnboundedReceiver<super::objects::Checked>,
    /// The servers' disconnect advisories, unless `--disconnect-grace off`.
    pub(super) disconnects: Option<Subscriber>,
}

/// One run of a driver, through each time it stands by and leads again.
pub(super) struct Run {
    /// Names the run in the lease key, so that it takes at once a leadership it gave up
    /// itself.
    pub(super) id: uuid::Uuid,
    /// Whether the journal and its companions have opened: what fails after that is the
    /// server's answer, not the settings.
    pub(super) opened: bool,
    /// Whether it has led.
    pub(super) led: bool,
}

impl Default for Run {
    fn default() -> Self {
        Self {
            id: uuid::Uuid::new_v4(),
            opened: false,
            led: false,
        }
    }
}

/// Opens the journal and replays it into a new core, then subscribes, and returns once the
/// subscriptions are on their way to the server.
pub(super) async fn start(
    client: &Client,
    config: &DriverConfig,
    run: &mut Run,
) -> Result<(Core, Inputs, Shell), DriverError> {
    let limit = client.server_info().max_payload.max(PAYLOAD_HEADROOM * 2);
    let subjects = config.subjects.clone();
    let journal = Journal::open(
        client,
        &subjects,
        config.journal,
        config.journal_max_age,
        config.replicas,
        config.metrics.journal.clone(),
    )
    .await?;
    // The journal's companions, made at once: a reply JetStream loses (as it does to two
    // drivers that create the same stream at the same moment) then costs one wait, not one
    // per stream.
    let (results, objects, lease) = match &journal {
        Some(journal) => {
            let context = journal.context();
            let (results, objects, lease, ()) = tokio::try_join!(
                async {
                    let bucket = ResultsBucket::open(
                        context,
                        &subjects,
                        config.results_max_age,
                        config.results_max_bytes,
                        journal.replicas,
                    );
                    Ok::<_, DriverError>(bucket.await?)
                },
                async {
                    let store = until_answered("the object store", || {
                        crate::objects::Objects::create(
                            context,
                            &subjects,
                            config.objects_max_bytes,
                            journal.replicas,
                        )
                    });
                    store.await.map_err(|e| DriverError::Objects(e.to_string()))
                },
                async {
                    let lease = Lease::open(
                        context,
                        &subjects,
                        config.lease,
                        journal.replicas,
                        config.connection_lost.clone(),
                    );
                    Ok(lease.await?)
                },
                async {
                    let history = history::open(
                        context,
                        &subjects,
                        config.events_max_age,
                        config.events_max_bytes,
                        journal.replicas,
                    );
                    Ok(history.await?)
                },
            )?;
            (Some(results), Some(objects), Some(lease))
        }
        None => (None, None, None),
    };
    run.opened = true;
    let driver_instance = uuid::Uuid::new_v4();
    let mut tenure = None;
    let mut history_after = None;
    let mut journal = journal;
    if let (Some(journal), Some(lease)) = (journal.as_mut(), lease) {
        let who = Identity {
            subjects: &subjects,
            driver_instance,
            leading: None,
        };
        let standby = discovery::standby(client, who)
            .await
            .map_err(DriverError::Service)?;
        let (unled, unled_seen) = tokio::sync::watch::channel(None);
        let taken = discovery::unavailable_while(
            client,
            &subjects,
            unled_seen,
            lease.acquire(driver_instance, run.id, &unled, config.disconnect_grace),
        )
        .await;
        discovery::stop(standby).await;
        let mark = JournalRecord::Leader {
            epoch: taken.epoch(),
            driver_instance,
            time_ms: now_ms(),
        };
        journal
            .lead(taken.guard().clone(), mark, config.replay_timeout)
            .await?;
        tenure = Some(taken);
        // Read before the journal: what the history holds up to there is all it will ever
        // hold of the predecessors' events, but for what this leader tells again.
        history_after = match history::last_stamp(journal.context(), &subjects).await {
            Ok(stamp) => stamp.map(|stamp| stamp.done),
            Err(error) => {
                warn!(%error, "the event history's end could not be read; events the last \
                      leader had not stored will not be told again");
                None
            }
        };
    }
    let epoch = tenure.as_ref().map_or(0, Tenure::epoch);
    let term = journal.as_ref().and_then(Journal::mark).unwrap_or(0);
    let new_core = || {
        let mut core = Core::new(CoreConfig {
            driver_instance,
            epoch,
            term,
            expect_executors: config.expect_executors,
            max_reply_bytes: limit - PAYLOAD_HEADROOM,
            journal: journal.is_some(),
            retention: config.retention,
            results_bucket: results.is_some(),
        });
        core.set_liveness(config.liveness.clone());
        core.set_scheduling(config.scheduling.clone());
        if let Some(allocation) = &config.allocation {
            core.set_allocation(allocation.clone());
        }
        if let Some(gate) = &config.start_gate {
            core.set_start_gate(gate.clone(), now_ms());
        }
        if let Some(exclusion) = &config.exclusion {
            core.set_exclusion(exclusion.clone());
        }
        core
    };
    let mut schedule = None;
    let mut fill = None;
    let core = match &journal {
        None => new_core(),
        Some(journal) => {
            let Replayed {
                core,
                restored,
                bytes,
                tail,
            } = journal
                .replay(new_core, limit, config.replay_timeout, history_after)
                .await?;
            info!(
                jobs = restored.jobs,
                running_jobs = restored.running_jobs,
                pending_tasks = restored.pending_tasks,
                bytes,
                "journal replayed"
            );
            if restored.incomplete_snapshot {
                warn!("the journal ends in a snapshot that was not finished; the records before it were used");
            }
            schedule = Some(Schedule::new(
                bytes,
                config.snapshot_after,
                config.journal_max_age,
            ));
            fill = history_after.and_then(|after| retell(&core, after, tail, &subjects, limit));
            core
        }
    };
    let api_counts = Arc::new(ApiCounts::default());
    let who = Identity {
        subjects: &subjects,
        driver_instance,
        leading: Some(tenure.as_ref().map_or(0, Tenure::epoch)),
    };
    let (service, api) = discovery::leading(client, who, api_counts.clone())
        .await
        .map_err(DriverError::Service)?;
    let (checks, checked) = super::objects::Checks::new(objects);
    let inputs = Inputs {
        register: subscribe(client, subjects.register_all()).await?,
        status: subscribe(client, subjects.status_all()).await?,
        heartbeat: subscribe(client, subjects.heartbeat_all()).await?,
        results: subscribe(client, subjects.results_all()).await?,
        api,
        service,
        checked,
        disconnects: match config.disconnect_grace {
            Some(_) => Some(subscribe(client, DISCONNECT_ADVISORIES.to_string()).await?),
            None => None,
        },
    };
    flush(client).await.map_err(DriverError::NotSubscribed)?;
    let history = tenure.as_ref().map(|tenure| {
        let guard = tenure.guard().clone();
        History::start(
            client,
            history::Writer {
                guard,
                driver_instance,
                stream: subjects.events_stream(),
            },
            fill,
        )
    });
    let stamps = Stamps::new(journal.as_ref().and_then(Journal::mark).unwrap_or(0));
    let sweeper = checks.sweeper(
        config.objects_max_age,
        tenure.as_ref().map(|t| t.guard().clone()),
        config.metrics.objects.clone(),
        config.web.clone(),
    );
    let shell = Shell {
        sweeper,
        history,
        stamps,
        headers: tenure
            .as_ref()
            .and_then(|t| crate::epoch::headers(t.epoch())),
        tenure,
        client: client.clone(),
        subjects,
        limit,
        task_events: TaskEvents::default(),
        admission: Admission::new(api_counts, config.metrics.clone()),
        metrics: config.metrics.clone(),
        web: config.web.clone(),
        journal,
        schedule,
        results,
        checks,
        ticked: false,
        offer_rounds: 0,
        releases: Vec::new(),
    };
    Ok((core, inputs, shell))
}

/// What a new leader tells again for the event history, if anything: the events of the
/// journal's `tail`, the records after the history's last complete write `after`.
fn retell(core: &Core, after: u64, tail: Tail, subjects: &Subjects, limit: usize) -> Option<Fill> {
    if tail.too_long {
        warn!("the event history is too far behind the journal to tell its events again");
        return None;
    }
    if tail.purged {
        warn!(
            "the journal was purged past the event history's end (a snapshot was taken); \
               events the last leader had not stored before it will not be told again"
        );
    }
    let events = core.retell(&tail.records);
    (!events.is_empty()).then(|| Fill {
        after,
        events,
        subjects: subjects.clone(),
        max_bytes: limit - PAYLOAD_HEADROOM,
    })
}

async fn subscribe(client: &Client, subject: String) -> Result<Subscriber, DriverError> {
    client
        .subscribe(subject.clone())
        .await
        .map_err(|source| DriverError::Subscribe { subject, source })
}
