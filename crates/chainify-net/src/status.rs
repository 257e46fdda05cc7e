//! Every gRPC status chainify's servers answer with is chosen here: the code for each kind of
//! refusal or failure, with a text that names the field, client, statement, block or key.
//!
//! | What | Code | Client's move |
//! |---|---|---|
//! | malformed or missing field, wrong network, SQL outside the portable subset | `INVALID_ARGUMENT` | fix the request |
//! | unknown client or organization, bad signature | `UNAUTHENTICATED` | fix the key |
//! | missing grant, a peer not allowed to ask | `PERMISSION_DENIED` | ask for the grant |
//! | replay: nonce used or forgotten, transaction in the ledger | `ALREADY_EXISTS` | use a fresh nonce |
//! | too much under way | `RESOURCE_EXHAUSTED` | retry later |
//! | an endorser rejected it, a request that cannot be served in this state | `FAILED_PRECONDITION` | do not retry as is |
//! | endorsers, the orderer, the database or a peer unavailable | `UNAVAILABLE` | retry |
//! | not agreed within the wait | `DEADLINE_EXCEEDED` | ask `TxStatus` later |
//! | a service this server does not run | `UNIMPLEMENTED` | ask another component |
//! | a bug | `INTERNAL` | report it |

use std::fmt::Display;

use chainify_node::{OffloadError, Refusal, ServeError};
use chainify_proto::ProtocolError;
use chainify_storage::{DbErrorKind, StorageError};
use tonic::Status;

/// The status of a refused proposal.
pub(crate) fn refused(refusal: Refusal) -> Status {
    let message = refusal.to_string();
    match refusal {
        Refusal::Malformed(_) | Refusal::WrongNetwork { .. } | Refusal::Invalid(_) => {
            Status::invalid_argument(message)
        }
        Refusal::Unauthenticated(_) => Status::unauthenticated(message),
        Refusal::PermissionDenied(_) => Status::permission_denied(message),
        Refusal::Replay(_) => Status::already_exists(message),
        Refusal::Overloaded { .. }
        | Refusal::OverloadedFrom { .. }
        | Refusal::OverloadedClient { .. }
        | Refusal::Busy(_) => Status::resource_exhausted(message),
        Refusal::RejectedBy(_) => Status::failed_precondition(message),
        Refusal::NotEndorsed(_) | Refusal::Unavailable { .. } => Status::unavailable(message),
    }
}

/// A malformed message, naming the field.
pub(crate) fn malformed(field: &str, e: &ProtocolError) -> Status {
    Status::invalid_argument(e.clone().within(field).to_string())
}

/// A required field that is absent.
pub(crate) fn missing(field: &str) -> Status {
    Status::invalid_argument(format!("{field}: missing"))
}

/// A field of the wrong length.
pub(crate) fn wrong_length(field: &str, expected: usize, got: usize) -> Status {
    Status::invalid_argument(format!("{field}: expected {expected} bytes, got {got}"))
}

/// A request outside what the server accepts (too large, a block out of range, an analysis
/// error in a query), described by `problem`.
pub(crate) fn invalid(problem: impl Display) -> Status {
    Status::invalid_argument(problem.to_string())
}

/// A query's analysis: a refusal of its SQL, or (`SQL010`) an analysis that could not run here
/// now, which is worth trying again.
pub(crate) fn analysis(e: chainify_sql::AnalysisError) -> Status {
    if e.kind == chainify_sql::RejectKind::Unavailable {
        Status::unavailable(e.to_string())
    } else {
        invalid(e)
    }
}

/// A sender that is not who it claims, or not signed.
pub(crate) fn unauthenticated(problem: impl Display) -> Status {
    Status::unauthenticated(problem.to_string())
}

/// An authenticated sender that may not ask this.
pub(crate) fn permission_denied(problem: impl Display) -> Status {
    Status::permission_denied(problem.to_string())
}

/// Too many requests of this kind under way.
pub(crate) fn busy(problem: impl Display) -> Status {
    Status::resource_exhausted(problem.to_string())
}

/// A request this server cannot serve in its present state.
pub(crate) fn precondition(problem: impl Display) -> Status {
    Status::failed_precondition(problem.to_string())
}

/// Something the server needs failed while `what`: the request may be retried.
pub(crate) fn unavailable(what: impl Display, e: impl Display) -> Status {
    Status::unavailable(format!("{what}: {e}"))
}

/// Something the server needs failed (the error says what): the request may be retried.
pub(crate) fn failed(e: impl Display) -> Status {
    Status::unavailable(e.to_string())
}

/// A query the database refused (its text is the client's to fix) or could not run.
pub(crate) fn query_failed(e: StorageError) -> Status {
    match e {
        StorageError::Query(_) => Status::invalid_argument(e.to_string()),
        // What the engine said, without the database's address: the statement's fault, or
        // the database's (busy, unreachable: worth trying again).
        StorageError::Database { during, source, .. } => {
            let message = format!("{during}: {source}");
            match source.kind {
                DbErrorKind::Statement => Status::invalid_argument(message),
                DbErrorKind::Transient | DbErrorKind::Connection => Status::unavailable(message),
            }
        }
        StorageError::QueryTimeout { .. } | StorageError::QueryTooLarge { .. } => {
            Status::resource_exhausted(e.to_string())
        }
        other => Status::unavailable(other.to_string()),
    }
}

/// A state-transfer request this organization cannot serve: one for what is not on offer is
/// the asker's to fix; a failure of its own database, ledger or shutdown may pass.
pub(crate) fn serve_failed(e: ServeError) -> Status {
    match e {
        ServeError::Refused(_) => Status::failed_precondition(e.to_string()),
        ServeError::Local(_) | ServeError::Stopping(_) => Status::unavailable(e.to_string()),
    }
}

/// The server is going away.
pub(crate) fn shutting_down() -> Status {
    Status::unavailable("the organization is shutting down")
}

/// A wait ran out.
pub(crate) fn deadline(problem: impl Display) -> Status {
    Status::deadline_exceeded(problem.to_string())
}

/// A service this server does not run.
pub(crate) fn not_served(problem: impl Display) -> Status {
    Status::unimplemented(problem.to_string())
}

/// A bug (a task that panicked).
pub(crate) fn internal(what: impl Display, e: impl Display) -> Status {
    Status::internal(format!("{what}: {e}"))
}

/// Work `what` handed to an [`Offload`](chainify_node::Offload) that gave no result: its queue
/// was full (retry later), or the work stopped (a bug).
pub(crate) fn offloaded(what: impl Display, e: OffloadError) -> Status {
    match e {
        OffloadError::Busy(_) => busy(format!("{what}: {e}")),
        OffloadError::Stopped(_) => internal(what, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chainify_core::{Digest, OrgId, TxId};
    use chainify_node::{Replay, Unauthenticated};
    use tonic::Code;

    #[test]
    fn a_state_request_not_on_offer_is_a_precondition_and_a_local_failure_may_pass() {
        let refused = serve_failed(ServeError::Refused("not on offer".into()));
        assert_eq!(
            (refused.code(), refused.message()),
            (Code::FailedPrecondition, "not on offer")
        );
        let storage = serve_failed(ServeError::from(StorageError::Checkpoint("gone".into())));
        assert_eq!(
            (storage.code(), storage.message()),
            (Code::Unavailable, "checkpoint: gone")
        );
    }

    #[test]
    fn an_analysis_that_could_not_run_is_worth_retrying_and_every_other_refusal_is_not() {
        for kind in chainify_sql::RejectKind::ALL {
            let status = analysis(chainify_sql::AnalysisError {
                statement: 1,
                kind,
                reason: "why".into(),
            });
            let code = if kind == chainify_sql::RejectKind::Unavailable {
                Code::Unavailable
            } else {
                Code::InvalidArgument
            };
            assert_eq!(
                (status.code(), status.message()),
                (code, "statement 1: why")
            );
        }
    }

    #[test]
    fn a_failed_query_is_the_statement_s_fault_or_worth_retrying_and_never_names_the_database() {
        let failure = |kind| {
            query_failed(StorageError::Database {
                url: "postgres://chainify@db.internal:5432/org1".into(),
                during: "running a query".into(),
                source: chainify_storage::DbError {
                    kind,
                    code: Some("40001".into()),
                    message: "could not serialize".into(),
                },
            })
        };
        for (kind, code) in [
            (DbErrorKind::Statement, Code::InvalidArgument),
            (DbErrorKind::Transient, Code::Unavailable),
            (DbErrorKind::Connection, Code::Unavailable),
        ] {
            let status = failure(kind);
            assert_eq!(status.code(), code, "{kind:?}");
            assert!(status.message().contains("could not serialize"), "{status}");
            assert!(!status.message().contains("db.internal"), "{status}");
        }
        let timeout = query_failed(StorageError::QueryTimeout {
            limit: std::time::Duration::from_secs(10),
        });
        assert_eq!(timeout.code(), Code::ResourceExhausted);
        assert!(timeout.message().contains("query_timeout"), "{timeout}");
        let too_large = query_failed(StorageError::QueryTooLarge { limit: 32 << 20 });
        assert_eq!(too_large.code(), Code::ResourceExhausted);
        assert!(
            too_large.message().contains("33554432 bytes (32 MiB)")
                && too_large.message().contains("max_query_answer_bytes"),
            "{too_large}"
        );
    }

    /// An answer within `max_query_answer_bytes`, as `row_bytes` counts it, fits the gRPC
    /// message it travels in: no value or row takes more on the wire than it is counted for.
    #[test]
    fn an_answer_counted_within_its_bound_fits_its_message() {
        use chainify_core::{Decimal, Value};
        use chainify_proto::pb;
        use prost::Message;
        let values = [
            Value::Null,
            Value::Int(i64::MIN),
            Value::Int(i64::MAX),
            Value::Decimal(Decimal::new(-1, 38).expect("a decimal")),
            Value::Decimal(Decimal::new(-(10i128.pow(38) - 1), 0).expect("a decimal")),
            Value::Decimal(Decimal::new(-(10i128.pow(38) - 1), 38).expect("a decimal")),
            Value::Text(String::new()),
            Value::Text("x".repeat(1 << 20)),
            Value::Bool(true),
            Value::Bytes(vec![0xff; 300]),
        ];
        for v in &values {
            let row = [v.clone()];
            let wire = pb::QueryResponse {
                rows: vec![pb::Row {
                    values: vec![pb::Value::from(v)],
                }],
                ..Default::default()
            };
            assert!(
                wire.encoded_len() <= chainify_storage::row_bytes(&row),
                "{v:?}: {} bytes on the wire, counted {}",
                wire.encoded_len(),
                chainify_storage::row_bytes(&row)
            );
        }
        let all = values.to_vec();
        let wire = pb::Row {
            values: all.iter().map(pb::Value::from).collect(),
        };
        assert!(wire.encoded_len() + 6 <= chainify_storage::row_bytes(&all));
        // The default answer leaves room in a message.
        const { assert!(chainify_storage::MAX_ANSWER_BYTES <= crate::org::MAX_MESSAGE / 2) };
    }

    #[test]
    fn each_refusal_has_its_code_and_keeps_its_text() {
        let tx = TxId(Digest::of(b"t"));
        let failure = |rejected| chainify_node::admission::EndorseFailure {
            org: OrgId(2),
            reason: "down".into(),
            rejected,
        };
        let cases = [
            (Refusal::malformed("proposal", "bad"), Code::InvalidArgument),
            (
                Refusal::WrongNetwork {
                    proposal: "a".into(),
                    this: "b".into(),
                },
                Code::InvalidArgument,
            ),
            (
                Unauthenticated::NotAPeer { from: 7 }.into(),
                Code::Unauthenticated,
            ),
            (Replay::InLedger(tx).into(), Code::AlreadyExists),
            (
                Refusal::Overloaded {
                    org: OrgId(1),
                    in_flight: 3,
                },
                Code::ResourceExhausted,
            ),
            (
                Refusal::OverloadedFrom {
                    org: OrgId(1),
                    address: std::net::IpAddr::from([10, 0, 0, 1]),
                    in_flight: 3,
                },
                Code::ResourceExhausted,
            ),
            (
                Refusal::OverloadedClient {
                    org: OrgId(1),
                    client: "client1".into(),
                    in_flight: 3,
                },
                Code::ResourceExhausted,
            ),
            (Refusal::Busy("a queue".into()), Code::ResourceExhausted),
            (
                Refusal::RejectedBy(vec![failure(true)]),
                Code::FailedPrecondition,
            ),
            (
                Refusal::NotEndorsed(vec![failure(false)]),
                Code::Unavailable,
            ),
            (
                Refusal::unavailable("the orderer", "gone"),
                Code::Unavailable,
            ),
        ];
        for (refusal, code) in cases {
            let text = refusal.to_string();
            let status = refused(refusal);
            assert_eq!(status.code(), code, "{text}");
            assert_eq!(status.message(), text);
        }
    }
}
