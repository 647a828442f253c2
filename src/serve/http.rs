//! The HTTP routes (axum): the OpenAI-compatible endpoints, streamed as
//! vLLM streams them (server-sent events, `data: {json}` per chunk, ending
//! with `data: [DONE]`), `/v1/models`, `/health` and `/metrics`.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream;
use serde_json::{Value, json};
use sim_core::SimTime;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::driver::{Arrival, Clock, Event};
use super::metrics::Metrics;
use super::openai::{self, Ask, Head, Kind};

/// What every handler shares.
pub struct App {
    /// Where requests go to the driver.
    pub arrivals: Mutex<Sender<Arrival>>,
    /// What `/metrics` shows.
    pub metrics: Arc<Mutex<Metrics>>,
    /// The served model's name.
    pub model: String,
    /// The deployment's `max_model_len`, if limited.
    pub max_model_len: Option<u64>,
    /// The clock map.
    pub clock: Clock,
}

/// The routes.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics))
        .with_state(app)
}

fn error(status: u16, message: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, axum::Json(openai::error_body(status, message))).into_response()
}

async fn models(State(app): State<Arc<App>>) -> Response {
    let created = unix_now();
    let mut card = json!({"id": app.model, "object": "model", "created": created, "owned_by": "pdsim",
        "root": app.model, "parent": null, "permission": []});
    if let Some(m) = app.max_model_len {
        card["max_model_len"] = json!(m);
    }
    axum::Json(json!({"object": "list", "data": [card]})).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let text = app.metrics.lock().expect("metrics").text(&app.model);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    serve(app, Kind::Completion, &headers, &body).await
}

async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    serve(app, Kind::Chat, &headers, &body).await
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One request: read, handed to the driver, answered whole or streamed.
async fn serve(app: Arc<App>, kind: Kind, headers: &HeaderMap, body: &[u8]) -> Response {
    let refuse = |status: u16, message: &str| {
        app.metrics.lock().expect("metrics").refused += 1;
        error(status, message)
    };
    let parsed: openai::Body = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => return refuse(400, &format!("the request body is not valid: {e}")),
    };
    // (A header that is not text is no integer: vLLM keeps the body's.)
    let priority_header = headers.get("x-vllm-priority").and_then(|v| v.to_str().ok());
    let ask = match openai::read(kind, &parsed, priority_header, app.max_model_len) {
        Ok(a) => a,
        Err(r) => return refuse(r.status, &r.message),
    };
    let (tx, mut rx) = unbounded_channel();
    let arrival =
        Arrival { stamp: Instant::now(), prompt: ask.prompt, output: ask.output, priority: ask.priority, events: tx };
    if app.arrivals.lock().expect("arrivals").send(arrival).is_err() {
        return error(503, "the simulation has stopped");
    }
    let (id, arrival) = match rx.recv().await {
        Some(Event::Admitted { id, at }) => (id, at),
        Some(Event::Refused(m)) => return refuse(400, &m),
        _ => return error(503, "the simulation has stopped"),
    };
    let head = Head::new(kind, id, unix_now(), &app.model);
    let times = Times { id, arrival, first: None };
    if ask.stream { streamed(app, head, ask, times, rx) } else { whole(head, ask, times, rx).await }
}

/// A request's simulated times, for the `pdsim` field pdsim adds to a
/// whole response and to a stream's usage chunk (clients ignore fields
/// they do not know): what `pdsim run` reports for the same arrivals.
struct Times {
    id: u64,
    arrival: SimTime,
    first: Option<SimTime>,
}

impl Times {
    fn json(&self, finished: SimTime) -> Value {
        json!({"request_id": self.id, "arrival_ns": self.arrival.as_nanos(),
            "first_token_ns": self.first.map(SimTime::as_nanos), "finished_ns": finished.as_nanos()})
    }
}

/// A response sent once the request ends.
async fn whole(head: Head, ask: Ask, mut times: Times, mut rx: UnboundedReceiver<Event>) -> Response {
    let mut count = 0;
    while let Some(e) = rx.recv().await {
        match e {
            Event::Token { at } => {
                times.first.get_or_insert(at);
                count += 1;
            }
            Event::Ended { failure: None, at } => {
                let mut body = head.whole(ask.prompt, count);
                body["pdsim"] = times.json(at);
                return axum::Json(body).into_response();
            }
            Event::Ended { failure: Some(reason), .. } => return error(500, &format!("the request failed: {reason}")),
            _ => {}
        }
    }
    error(503, "the simulation has stopped")
}

fn sse(v: &Value) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, v).expect("JSON values serialize");
    out.extend_from_slice(b"\n\n");
    out
}

const DONE: &[u8] = b"data: [DONE]\n\n";

/// The state of one stream.
struct Streaming {
    app: Arc<App>,
    head: Head,
    ask: Ask,
    rx: UnboundedReceiver<Event>,
    times: Times,
    /// [`Head::token_template`].
    template: (String, String),
    sent: u64,
    over: bool,
}

impl Streaming {
    /// Appends what `event` sends to `out`.
    fn write(&mut self, event: Event, out: &mut Vec<u8>) {
        match event {
            Event::Token { at } => {
                if self.sent == 0 && self.head.kind == Kind::Chat {
                    out.extend(sse(&self.head.role_chunk()));
                }
                if self.sent + 1 == self.ask.output {
                    out.extend(sse(&self.head.token_chunk(self.sent, true)));
                } else {
                    // (Filler words need no JSON escape.)
                    let (before, after) = &self.template;
                    out.extend_from_slice(before.as_bytes());
                    out.push(b'"');
                    out.extend_from_slice(openai::token_text(self.sent).as_bytes());
                    out.push(b'"');
                    out.extend_from_slice(after.as_bytes());
                }
                self.sent += 1;
                self.times.first.get_or_insert(at);
                let late = Instant::now().saturating_duration_since(self.app.clock.wall(at));
                self.app.metrics.lock().expect("metrics").added.observe(late.as_secs_f64());
            }
            Event::Ended { failure, at } => {
                match failure {
                    None if self.ask.include_usage => {
                        let mut chunk = self.head.usage_chunk(self.ask.prompt, self.sent);
                        chunk["pdsim"] = self.times.json(at);
                        out.extend(sse(&chunk));
                    }
                    None => {}
                    Some(reason) => {
                        let body = openai::error_body(500, &format!("the request failed: {reason}"));
                        out.extend(sse(&json!({ "error": body })));
                    }
                }
                out.extend_from_slice(DONE);
                self.over = true;
            }
            Event::Admitted { .. } | Event::Refused(_) => {}
        }
    }
}

/// Server-sent events: each token's chunk when the driver hands it over
/// (at its simulated time on the wall clock), then the usage chunk if asked
/// and `[DONE]`.
fn streamed(app: Arc<App>, head: Head, ask: Ask, times: Times, rx: UnboundedReceiver<Event>) -> Response {
    let template = head.token_template();
    let state = Streaming { app, head, ask, rx, times, template, sent: 0, over: false };
    let chunks = stream::unfold(state, |mut s| async move {
        if s.over {
            return None;
        }
        let mut out = Vec::new();
        let Some(first) = s.rx.recv().await else {
            s.over = true;
            return Some((Ok::<_, std::convert::Infallible>(Bytes::from_static(DONE)), s));
        };
        s.write(first, &mut out);
        // What else is due already goes in the same write.
        while !s.over {
            let Ok(next) = s.rx.try_recv() else { break };
            s.write(next, &mut out);
        }
        Some((Ok(Bytes::from(out)), s))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(chunks))
        .expect("a valid response")
}
