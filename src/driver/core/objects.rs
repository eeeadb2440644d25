//! What the core knows of the object store: which objects each job it keeps refers to. A
//! job's tasks name objects in their specs (inputs, pickles), and a command's result names the
//! objects its outputs went into; the job keeps all of them, and the leader's sweep deletes
//! only objects no kept job refers to (`driver::objects`).

use super::jobs::TaskStatus;
use super::Core;
use crate::ids::JobId;
use crate::objects::ObjectRef;
use crate::protocol::{ApiReply, ObjectUse, TaskSpec, MAX_OBJECTS_ASKED, MAX_OBJECT_JOBS_LISTED};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The objects a command task's `result` names: the values of its `outputs`, which its
/// executor stored. Other tasks' results name none the driver keeps.
fn outputs(spec: &TaskSpec, result: Option<&Value>) -> Vec<ObjectRef> {
    if !matches!(spec, TaskSpec::Command { .. }) {
        return Vec::new();
    }
    let Some(outputs) = result
        .and_then(|r| r.get("outputs"))
        .and_then(Value::as_object)
    else {
        return Vec::new();
    };
    let mut refs: Vec<ObjectRef> = outputs
        .values()
        .filter_map(|v| ObjectRef::parse(v.as_str()?).ok())
        .collect();
    refs.sort();
    refs.dedup();
    refs
}

impl Core {
    /// Keeps the objects the result of task `index` names, once the task has ended for good;
    /// a retried attempt's outputs are not kept (the sweep deletes them in time).
    pub(super) fn keep_outputs(&mut self, job_id: JobId, index: u32, result: Option<&Value>) {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        let settled = matches!(
            job.tasks[index].status,
            TaskStatus::Finished | TaskStatus::Failed
        );
        let named = outputs(job.spec(index), result);
        if settled && !named.is_empty() {
            job.outputs.insert(index, named);
        } else {
            job.outputs.remove(&index);
        }
    }

    /// Every object a kept job refers to: what the leader's sweep spares.
    pub fn referenced_objects(&self) -> BTreeSet<ObjectRef> {
        self.jobs
            .values()
            .flat_map(|job| job.objects())
            .cloned()
            .collect()
    }

    /// For each of `objects`, the ids of the kept jobs that refer to it, in id order.
    pub(super) fn users_of(&self, objects: &[ObjectRef]) -> Vec<Vec<JobId>> {
        let mut users: BTreeMap<&ObjectRef, Vec<JobId>> =
            objects.iter().map(|o| (o, Vec::new())).collect();
        for (id, job) in &self.jobs {
            for object in job.objects() {
                if let Some(jobs) = users.get_mut(object) {
                    if jobs.last() != Some(id) {
                        jobs.push(*id);
                    }
                }
            }
        }
        objects.iter().map(|o| users[o].clone()).collect()
    }

    /// The answer to `ObjectUses`: for each of `objects`, the kept jobs that refer to it.
    pub(super) fn object_uses_of(&self, objects: &[ObjectRef]) -> ApiReply {
        if objects.len() > MAX_OBJECTS_ASKED {
            return ApiReply::Error {
                message: format!(
                    "ObjectUses asks about {} objects; ask about at most {MAX_OBJECTS_ASKED} at a \
                     time",
                    objects.len()
                ),
            };
        }
        let uses = objects
            .iter()
            .zip(self.users_of(objects))
            .map(|(object, jobs)| ObjectUse {
                object: object.clone(),
                jobs: jobs.iter().take(MAX_OBJECT_JOBS_LISTED).copied().collect(),
                jobs_count: jobs.len() as u32,
            })
            .collect();
        ApiReply::ObjectUses { uses }
    }

    /// Why `object` may not be deleted: a kept job refers to it. None if it may be.
    pub fn delete_refusal(&self, object: &ObjectRef) -> Option<String> {
        let users = self.users_of(std::slice::from_ref(object)).pop()?;
        if users.is_empty() {
            return None;
        }
        let mut jobs: Vec<String> = users
            .iter()
            .take(MAX_OBJECT_JOBS_LISTED)
            .map(JobId::to_string)
            .collect();
        if users.len() > MAX_OBJECT_JOBS_LISTED {
            jobs.push(format!("and {} more", users.len() - MAX_OBJECT_JOBS_LISTED));
        }
        Some(format!(
            "object {object} is used by kept job{} {}: it is deleted once no kept job uses it \
             (--retain-jobs, --objects-max-age)",
            if users.len() == 1 { "" } else { "s" },
            jobs.join(", ")
        ))
    }

    /// The core's answer to `DeleteObject`, which only a driver with a store carries out (the
    /// shell takes it before the core does): refused either way.
    pub(super) fn refuse_delete(&self, object: &ObjectRef) -> ApiReply {
        let message = self
            .delete_refusal(object)
            .unwrap_or_else(|| "this driver has no object store to delete from".to_string());
        ApiReply::Error { message }
    }
}
