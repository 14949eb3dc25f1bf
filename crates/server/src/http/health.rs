//! `/health`, `/livez` and `/readyz` as etcd 3.5 answers them.
//!
//! `/health` is JSON: an active alarm (unless named in `?exclude=`) makes it
//! `{"health":"false","reason":"ALARM NOSPACE"}`, then no leader (unless `?serializable=true`)
//! `RAFT NO LEADER`, then a failed read `RANGE ERROR:...`, each with 503. `/livez` and `/readyz`
//! are Kubernetes-style check lists answering `ok`, with `?verbose` listing each check,
//! `?exclude=NAME` skipping one, and `/readyz/NAME` running one alone.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Router;
use cairn_kv::{AlarmType, RangeRequest};
use cairn_node::Engine;

/// How long a health read may take before the check fails.
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// `/health` answers so far, healthy and not: etcd's `etcd_server_health_success` and
/// `etcd_server_health_failures`.
pub(crate) static HEALTH_SUCCESS: AtomicU64 = AtomicU64::new(0);
pub(crate) static HEALTH_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Every value of the query parameter `name` (`?exclude=A&exclude=B`), empty ones left out.
fn query_values(query: Option<&str>, name: &str) -> BTreeSet<String> {
    let pairs = query.into_iter().flat_map(|q| q.split('&'));
    pairs
        .filter_map(|p| p.split_once('=').or(Some((p, ""))))
        .filter(|(k, v)| *k == name && !v.is_empty())
        .map(|(_, v)| v.to_string())
        .collect()
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn has_flag(query: Option<&str>, name: &str) -> bool {
    query.into_iter().flat_map(|q| q.split('&')).any(|p| p.split('=').next() == Some(name))
}

/// etcd's health read: one key, keys only, linearizable unless `serializable`.
async fn read_check(engine: &Engine, serializable: bool) -> Result<(), String> {
    if let Some(why) = engine.status().failure {
        return Err(format!("storage failure: {why}"));
    }
    let req =
        RangeRequest { limit: 1, keys_only: true, serializable, ..RangeRequest::key("health") };
    match tokio::time::timeout(READ_TIMEOUT, engine.range(req)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out waiting for a read".into()),
    }
}

/// etcd's `checkAlarms`, `checkLeader` then `checkAPI`: the first failure's reason.
async fn health_reason(
    engine: &Engine,
    excluded: &BTreeSet<String>,
    serializable: bool,
) -> Option<String> {
    let alarms = engine.raised_alarms();
    if let Some(a) = alarms.iter().find(|a| !excluded.contains(a.alarm.name())) {
        return Some(match a.alarm {
            AlarmType::NoSpace => "ALARM NOSPACE".into(),
            AlarmType::Corrupt => "ALARM CORRUPT".into(),
            AlarmType::None => "ALARM UNKNOWN".into(),
        });
    }
    if !serializable && engine.leader().is_none() {
        return Some("RAFT NO LEADER".into());
    }
    read_check(engine, serializable).await.err().map(|e| format!("RANGE ERROR:{e}"))
}

/// `/health`: 200 with `{"health":"true","reason":""}`, or 503 with the reason (and, as Go's
/// `http.Error` writes it, a trailing newline).
pub(super) fn health(engine: Arc<Engine>) -> MethodRouter {
    get(move |RawQuery(query): RawQuery| {
        let engine = engine.clone();
        async move {
            let q = query.as_deref();
            let serializable = query_values(q, "serializable").contains("true");
            let reason = health_reason(&engine, &query_values(q, "exclude"), serializable).await;
            let count = if reason.is_none() { &HEALTH_SUCCESS } else { &HEALTH_FAILURES };
            count.fetch_add(1, Ordering::Relaxed);
            match reason {
                None => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    r#"{"health":"true","reason":""}"#.to_string(),
                ),
                Some(reason) => {
                    tracing::warn!("serving /health false: {reason}");
                    let body = format!(r#"{{"health":"false","reason":{}}}"#, json_string(&reason));
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                        format!("{body}\n"),
                    )
                }
            }
        }
    })
}

/// The checks `/livez` and `/readyz` run, by name, as etcd registers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    DataCorruption,
    SerializableRead,
    LinearizableRead,
}

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::DataCorruption => "data_corruption",
            Check::SerializableRead => "serializable_read",
            Check::LinearizableRead => "linearizable_read",
        }
    }

    async fn run(self, engine: &Engine) -> Result<(), String> {
        match self {
            Check::DataCorruption => {
                if engine.raised_alarms().iter().any(|a| a.alarm == AlarmType::Corrupt) {
                    return Err("alarm activated: CORRUPT".into());
                }
                Ok(())
            }
            Check::SerializableRead => read_check(engine, true).await,
            Check::LinearizableRead => read_check(engine, false).await,
        }
    }
}

const LIVEZ: &[Check] = &[Check::SerializableRead];
const READYZ: &[Check] = &[Check::DataCorruption, Check::SerializableRead, Check::LinearizableRead];

/// Runs `checks`: `ok` (after each check's line with `?verbose`), or 503 with every line.
async fn run_checks(engine: &Engine, checks: &[Check], query: Option<&str>) -> Response {
    let mut lines = String::new();
    let mut failed = false;
    for check in checks {
        match check.run(engine).await {
            Ok(()) => lines.push_str(&format!("[+]{} ok\n", check.name())),
            Err(e) => {
                failed = true;
                lines.push_str(&format!("[-]{} failed: {e}\n", check.name()));
            }
        }
    }
    if failed {
        tracing::error!("health check failed: {}", lines.trim_end());
        return (StatusCode::SERVICE_UNAVAILABLE, lines).into_response();
    }
    let body = if has_flag(query, "verbose") { lines + "ok\n" } else { "ok\n".to_string() };
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

/// `root` (`/livez` or `/readyz`) running `checks` less those excluded, and `root/NAME`
/// running one.
fn check_routes(root: &str, engine: Arc<Engine>, checks: &'static [Check]) -> Router {
    let all = engine.clone();
    let every = get(move |RawQuery(query): RawQuery| {
        let engine = all.clone();
        async move {
            let excluded = query_values(query.as_deref(), "exclude");
            let chosen: Vec<Check> =
                checks.iter().copied().filter(|c| !excluded.contains(c.name())).collect();
            run_checks(&engine, &chosen, query.as_deref()).await
        }
    });
    let one = get(move |Path(name): Path<String>, RawQuery(query): RawQuery| {
        let engine = engine.clone();
        async move {
            match checks.iter().find(|c| c.name() == name) {
                Some(c) => run_checks(&engine, &[*c], query.as_deref()).await,
                None => (StatusCode::NOT_FOUND, "404 page not found\n").into_response(),
            }
        }
    });
    Router::new().route(root, every).route(&format!("{root}/{{name}}"), one)
}

/// `/livez` and `/readyz`.
pub(super) fn probe_routes(engine: Arc<Engine>) -> Router {
    check_routes("/livez", engine.clone(), LIVEZ).merge(check_routes("/readyz", engine, READYZ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_take_every_non_empty_value() {
        let q = Some("exclude=NOSPACE&exclude=&serializable=true&exclude=CORRUPT");
        let got: Vec<String> = query_values(q, "exclude").into_iter().collect();
        assert_eq!(got, ["CORRUPT", "NOSPACE"]);
        assert!(query_values(None, "exclude").is_empty());
        assert!(has_flag(Some("verbose"), "verbose"));
        assert!(has_flag(Some("a=1&verbose="), "verbose"));
        assert!(!has_flag(Some("verbosely=1"), "verbose"));
        assert_eq!(json_string("a\"b\\c\n"), r#""a\"b\\c\u000a""#);
    }
}
