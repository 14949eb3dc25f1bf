//! HTTP health endpoints on the client port, as etcd serves them: `/health` (JSON, with a
//! linearizable check), `/livez` and `/readyz`.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use cairn_node::Engine;

async fn ready(engine: &Engine) -> Result<(), String> {
    if let Some(why) = engine.status().failure {
        return Err(why);
    }
    if engine.leader().is_none() {
        return Err("no leader".into());
    }
    match tokio::time::timeout(Duration::from_secs(1), engine.read_barrier()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out waiting for a linearizable read".into()),
    }
}

pub fn routes(engine: Arc<Engine>) -> Router {
    let e1 = engine.clone();
    let e2 = engine;
    Router::new()
        .route(
            "/health",
            get(move || {
                let engine = e1.clone();
                async move {
                    match ready(&engine).await {
                        Ok(()) => (StatusCode::OK, r#"{"health":"true","reason":""}"#.to_string()),
                        Err(why) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!(r#"{{"health":"false","reason":{why:?}}}"#),
                        ),
                    }
                }
            }),
        )
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let engine = e2.clone();
                async move {
                    match ready(&engine).await {
                        Ok(()) => (StatusCode::OK, "ok".to_string()),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}")),
                    }
                }
            }),
        )
}
