//! The driver's requests, one handler each: who may be answered (see admission), the payload
//! decoded, the core asked, and the answer encoded for the shell to send.

use super::admission::Refusal;
use super::core::{Answer, Core, Requester};
use super::objects::Checked;
use super::outbox::{Output, ReplyTo, ServiceError};
use super::shell::Shell;
use crate::now_ms;
use crate::protocol::{
    decode, encode, ApiReply, ApiRequest, HeartbeatReply, HeartbeatRequest, RegisterReply,
    RegisterRequest, StatusReply, StatusRequest,
};
use crate::subjects::Subjects;
use crate::web::{self, Ask, Query};
use async_nats::Message;
use tracing::{debug, warn};

impl Shell {
    pub(super) fn on_register(&self, core: &mut Core, message: Message) -> Option<Output> {
        let claimed = Subjects::executor_id_of(&message.subject).to_string();
        let reply = self.admission.executor_reply(&message, &claimed)?;
        let answer = match decode::<RegisterRequest>(&message.payload, self.limit) {
            Ok(RegisterRequest::RegisterExecutor(request)) => {
                core.register(&claimed, request, now_ms())
            }
            Err(error) => {
                self.admission.refuse(Refusal::Undecodable);
                RegisterReply::RegisterExecutorFailed {
                    message: format!("could not decode RegisterExecutor: {error}"),
                }
            }
        };
        match &answer {
            RegisterReply::RegisteredExecutor { .. } => debug!(executor = %claimed, "registered"),
            RegisterReply::RegisterExecutorFailed { message } => {
                warn!(executor = %claimed, %message, "registration refused")
            }
        }
        Some(Output::ExecutorReply(reply, encode(&answer)))
    }

    pub(super) fn on_status(&self, core: &mut Core, message: Message) -> Option<Output> {
        let claimed = Subjects::executor_id_of(&message.subject).to_string();
        let reply = self.admission.executor_reply(&message, &claimed)?;
        let (executor_id, answer) = match decode::<StatusRequest>(&message.payload, self.limit) {
            Ok(request) => {
                let StatusRequest::StatusUpdates {
                    executor_id,
                    updates,
                    ..
                } = &request;
                self.metrics.status_batch(updates.len());
                let executor_id = executor_id.clone();
                let answer = core.status_request(&claimed, request, now_ms());
                (Some(executor_id), answer)
            }
            Err(error) => {
                self.admission.refuse(Refusal::Undecodable);
                let message = format!("could not decode StatusUpdates: {error}");
                (None, StatusReply::Error { message })
            }
        };
        if let StatusReply::StatusAck { refused, .. } = &answer {
            for r in refused {
                warn!(executor = %claimed, task = r.task_id, attempt = r.attempt, reason = %r.reason, "status refused");
            }
        }
        let payload = core.encode_status_reply(executor_id, answer);
        Some(Output::ExecutorReply(reply, payload))
    }

    pub(super) fn on_heartbeat(&self, core: &mut Core, message: Message) -> Option<Output> {
        let claimed = Subjects::executor_id_of(&message.subject).to_string();
        let reply = self.admission.executor_reply(&message, &claimed)?;
        let answer = match decode::<HeartbeatRequest>(&message.payload, self.limit) {
            Ok(request) => core.heartbeat(&claimed, request, now_ms()),
            Err(error) => {
                self.admission.refuse(Refusal::Undecodable);
                HeartbeatReply::Error {
                    message: format!("could not decode the heartbeat: {error}"),
                }
            }
        };
        Some(Output::ExecutorReply(reply, encode(&answer)))
    }

    /// An executor reads the results of a job its task reads (`GetResults`, and nothing
    /// else): answered as a client's read is, the results held in the bucket read off the loop.
    pub(super) fn on_results(&self, core: &mut Core, message: Message) -> Option<Output> {
        let claimed = Subjects::executor_id_of(&message.subject).to_string();
        let reply = self.admission.executor_reply(&message, &claimed)?;
        let answer = match decode::<ApiRequest>(&message.payload, self.limit) {
            Ok(request @ ApiRequest::GetResults { .. }) => core.answer(request, now_ms()),
            Ok(_) => Answer::Reply(ApiReply::Error {
                message: "an executor reads only results here (GetResults)".into(),
            }),
            Err(error) => {
                self.admission.refuse(Refusal::Undecodable);
                let message = format!("could not decode GetResults: {error}");
                Answer::Reply(ApiReply::Error { message })
            }
        };
        match answer {
            Answer::Reply(answer) => Some(Output::ExecutorReply(reply, encode(&answer))),
            Answer::Results(read) => {
                self.answer_executor_with_results(reply, read);
                None
            }
        }
    }

    pub(super) fn on_api(
        &self,
        core: &mut Core,
        request: async_nats::service::Request,
    ) -> Option<Output> {
        let message = &request.message;
        let executors = core.executors();
        if !self
            .admission
            .api_reply(message, |id| executors.contains_key(id))
        {
            return None;
        }
        let tenant = match tenant_of(message.headers.as_ref()) {
            Ok(tenant) => tenant,
            Err(message) => {
                self.admission.refuse(Refusal::Undecodable);
                let answer = Answer::Reply(ApiReply::Error { message });
                return Some(self.api_output(answer, Box::new(request)));
            }
        };
        let (answer, request) = match decode::<ApiRequest>(&message.payload, self.limit) {
            // A tenant's request is answered about its own jobs alone; it names no object, so
            // none is looked for.
            Ok(decoded) if let Some(tenant) = &tenant => {
                let requester = Requester::Tenant(tenant);
                (core.answer_for(requester, decoded, now_ms()), request)
            }
            Ok(ApiRequest::DeleteObject { object }) => {
                return self.on_delete_object(core, object, request);
            }
            Ok(decoded) => {
                let (decoded, request) = self.checks.check(decoded, request)?;
                (core.answer(decoded, now_ms()), request)
            }
            Err(error) => {
                self.admission.refuse(Refusal::Undecodable);
                let message = format!("could not decode the api request: {error}");
                (Answer::Reply(ApiReply::Error { message }), request)
            }
        };
        Some(self.api_output(answer, Box::new(request)))
    }

    /// `DeleteObject`: refused while a kept job uses the object, or a submission named it a
    /// moment ago; else deleted off the loop and answered once it is.
    fn on_delete_object(
        &self,
        core: &Core,
        object: crate::objects::ObjectRef,
        request: async_nats::service::Request,
    ) -> Option<Output> {
        let refusal = match self.checks.store() {
            None => Some(super::objects::NO_STORE.to_string()),
            Some(_) => core.delete_refusal(&object),
        }
        .or_else(|| {
            self.checks.named_lately(&object).then(|| {
                format!("object {object} was named by a submission a moment ago: try again later")
            })
        });
        if let Some(message) = refusal {
            return Some(self.api_output(
                Answer::Reply(ApiReply::Error { message }),
                Box::new(request),
            ));
        }
        let store = self.checks.store().cloned()?;
        self.answer_off_loop(Box::new(request), async move {
            match store.delete(&object).await {
                Ok(deleted) => ApiReply::ObjectDeleted { object, deleted },
                Err(error) => ApiReply::Error {
                    message: format!("could not delete object {object}: {error}"),
                },
            }
        });
        None
    }

    /// The leader sweeps the object store, sparing what the kept jobs use.
    pub(super) fn on_sweep(&self, core: &Core) {
        if let Some(sweeper) = &self.sweeper {
            sweeper.sweep(core.referenced_objects());
        }
    }

    /// A submission whose objects were looked for in the store, answered now.
    pub(super) fn on_checked(&self, core: &mut Core, checked: Checked) -> Option<Output> {
        let (answer, reply) = checked.answer(core);
        Some(self.api_output(answer, Box::new(reply)))
    }

    /// What answers an api request: the core's `answer`, sent to `reply` (after the results
    /// it names are read, if it names any).
    pub(super) fn api_output(&self, answer: Answer, reply: ReplyTo) -> Output {
        if matches!(answer, Answer::Reply(ApiReply::Error { .. })) {
            self.admission.api_error();
        }
        match answer {
            Answer::Reply(answer) => {
                Output::Reply(reply, encode(&answer), ServiceError::of(&answer))
            }
            Answer::Results(read) => Output::Results { reply, read },
        }
    }

    /// Answers a query of the web page from `core`, as the api answers the same request. Only
    /// read-only requests are taken: the page changes nothing. A page of results stored in the
    /// results bucket is read there, off the actor's loop, before it is answered.
    pub(super) fn on_query(&self, core: &mut Core, query: Query) -> Option<Output> {
        let Query { ask, answer } = query;
        if answer.is_closed() {
            // Whoever asked has given up (a timeout, a closed page): nothing to compute.
            return None;
        }
        let now_ms = now_ms();
        let reply = match ask {
            Ask::Api(
                request @ (ApiRequest::ListExecutors { .. }
                | ApiRequest::ListJobs { .. }
                | ApiRequest::GetJob { .. }
                | ApiRequest::GetResults { .. }),
            ) => core.answer(request, now_ms),
            Ask::Api(_) => Answer::Reply(ApiReply::Error {
                message: "the web page only reads".into(),
            }),
            Ask::RecentJobs { before, limit } => {
                Answer::Reply(core.recent_jobs(before, limit, now_ms))
            }
        };
        let reply = match reply {
            Answer::Reply(reply) => reply,
            Answer::Results(read) => match self.results.clone() {
                Some(results) => {
                    tokio::spawn(async move {
                        let reply = results.fill(read, usize::MAX).await;
                        let _ = answer.send(web::Answer { reply, now_ms });
                    });
                    return None;
                }
                // No bucket to read from: the page as the core has it, never no answer.
                None => ApiReply::Results(read.page),
            },
        };
        let _ = answer.send(web::Answer { reply, now_ms });
        None
    }
}

/// The header in which a NATS server names the account a request comes from, when it crossed
/// an import of the api into another account.
const REQUEST_INFO: &str = "Nats-Request-Info";

/// The tenant `message` comes from: the account its `Nats-Request-Info` header names, or none
/// for a request of the cluster's own account, which crossed no import. A header that cannot be
/// read, or more than one, is refused rather than taken for the cluster's own account.
fn tenant_of(headers: Option<&async_nats::HeaderMap>) -> Result<Option<String>, String> {
    #[derive(serde::Deserialize)]
    struct RequestInfo {
        acc: String,
    }
    let Some(headers) = headers else {
        return Ok(None);
    };
    let infos: Vec<_> = headers.get_all(REQUEST_INFO).collect();
    let info = match infos.as_slice() {
        [] => return Ok(None),
        [info] => info.as_str(),
        _ => {
            return Err(format!(
                "a request with more than one {REQUEST_INFO} header"
            ))
        }
    };
    match serde_json::from_str::<RequestInfo>(info) {
        // The account names the subjects its events are told on.
        Ok(info) if Subjects::is_token(&info.acc) => Ok(Some(info.acc)),
        Ok(info) if !info.acc.is_empty() => Err(format!(
            "the account {:?} cannot be a tenant: a tenant's account name must be one subject \
             token (no '.', '*', '>' or spaces)",
            info.acc
        )),
        _ => Err(format!(
            "could not read the account in the {REQUEST_INFO} header"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::tenant_of;
    use async_nats::HeaderMap;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("Ember-Epoch", "3");
        for value in values {
            headers.append("Nats-Request-Info", *value);
        }
        headers
    }

    #[test]
    fn the_tenant_is_the_account_the_servers_header_names_and_a_bad_header_is_refused() {
        assert_eq!(tenant_of(None), Ok(None));
        assert_eq!(tenant_of(Some(&headers(&[]))), Ok(None));
        let one = headers(&[r#"{"acc":"EMBER_c_TENANT_acme","rtt":"1ms"}"#]);
        assert_eq!(
            tenant_of(Some(&one)),
            Ok(Some("EMBER_c_TENANT_acme".into()))
        );
        for bad in [&["not json"][..], &[r#"{"acc":""}"#], &[r#"{"user":"x"}"#]] {
            let refused = tenant_of(Some(&headers(bad))).unwrap_err();
            assert!(
                refused.starts_with("could not read the account"),
                "{refused}"
            );
        }
        let dotted = headers(&[r#"{"acc":"a.b"}"#]);
        assert!(tenant_of(Some(&dotted))
            .unwrap_err()
            .contains("must be one subject token"));
        let two = headers(&[r#"{"acc":"a"}"#, r#"{"acc":"b"}"#]);
        assert!(tenant_of(Some(&two)).unwrap_err().contains("more than one"));
    }
}
