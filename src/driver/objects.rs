//! The driver's side of the object store: a submission that names objects is taken only once
//! each of them is there. The check reads the store off the actor's loop; the submission comes
//! back to the loop with its verdict, and is answered there as any request is: taken by the
//! core if its objects are all there, else refused with an answer that says which is missing,
//! changing nothing.

use super::core::{Answer, Core};
use crate::objects::{ObjectRef, Objects};
use crate::protocol::{ApiReply, ApiRequest};
use std::collections::BTreeSet;
use tokio::sync::mpsc;

/// A submission whose objects were looked for, back for the loop to answer.
pub(super) struct Checked {
    request: ApiRequest,
    reply: async_nats::service::Request,
    /// Why it is refused, if it is.
    refused: Option<String>,
}

/// What checks submissions' objects: the store, and where checked submissions go.
pub(super) struct Checks {
    objects: Option<Objects>,
    checked: mpsc::UnboundedSender<Checked>,
}

impl Checks {
    /// Checks against `objects` (none: the driver has no store), and the receiver of what
    /// was checked.
    pub(super) fn new(objects: Option<Objects>) -> (Self, mpsc::UnboundedReceiver<Checked>) {
        let (checked, receiver) = mpsc::unbounded_channel();
        (Self { objects, checked }, receiver)
    }
}

/// The objects a request names, if it is a submission that names any.
fn named(request: &ApiRequest) -> BTreeSet<ObjectRef> {
    match request {
        ApiRequest::SubmitJob(job) => job
            .tasks
            .iter()
            .flat_map(|spec| spec.objects())
            .cloned()
            .collect(),
        _ => BTreeSet::new(),
    }
}

impl Checks {
    /// Gives `request` back if it names no object, to be answered now; else looks for its
    /// objects off the loop, and it comes back through the receiver [`Checks::new`] gave.
    pub(super) fn check(
        &self,
        request: ApiRequest,
        reply: async_nats::service::Request,
    ) -> Option<(ApiRequest, async_nats::service::Request)> {
        let objects = named(&request);
        if objects.is_empty() {
            return Some((request, reply));
        }
        let (store, checked) = (self.objects.clone(), self.checked.clone());
        tokio::spawn(async move {
            let refused = match store {
                None => Some(NO_STORE.to_string()),
                Some(store) => match missing(&store, &objects).await {
                    Ok(None) => None,
                    Ok(Some(object)) => Some(format!("object {object} not found: put it again")),
                    Err(error) => Some(format!(
                        "could not look for the job's objects in the store ({error}); nothing \
                         was submitted"
                    )),
                },
            };
            let _ = checked.send(Checked {
                request,
                reply,
                refused,
            });
        });
        None
    }
}

impl Checked {
    /// The answer: the core's, as to any request, if the objects were all there; else the
    /// refusal. And where it goes.
    pub(super) fn answer(self, core: &mut Core) -> (Answer, async_nats::service::Request) {
        let answer = match self.refused {
            None => core.answer(self.request, crate::now_ms()),
            Some(message) => Answer::Reply(ApiReply::Error { message }),
        };
        (answer, self.reply)
    }
}

/// Why a submission that names objects is refused by a driver without a store.
const NO_STORE: &str = "this cluster has no object store: its driver runs without a journal \
                        (--journal off, or a server without JetStream), and tasks that name \
                        objects need one";

/// The first of `objects` the store does not hold, if any.
async fn missing(
    store: &Objects,
    objects: &BTreeSet<ObjectRef>,
) -> Result<Option<ObjectRef>, crate::objects::ObjectsError> {
    let stats = futures::future::join_all(objects.iter().map(|o| store.stat(o))).await;
    for (object, stat) in objects.iter().zip(stats) {
        if stat?.is_none() {
            return Ok(Some(object.clone()));
        }
    }
    Ok(None)
}
