//! `pdsim serve`: a live OpenAI-compatible endpoint whose timing is the
//! simulation's.
//!
//! Each HTTP request is a request of one running simulation of the
//! scenario's deployment (aggregated or P/D, with its router). The
//! simulated clock follows the wall clock (`--speed X`: X simulated seconds
//! per wall second) and each output token is sent when the wall clock
//! reaches its simulated time.
//!
//! - [`openai`]: request bodies (the prompt-length rule) and the JSON vLLM
//!   answers with.
//! - [`driver`]: the thread that owns the simulation ([`actors::sim::build_live`]).
//! - [`http`]: the axum routes and server-sent events.
//! - [`metrics`]: `/metrics` in Prometheus text with vLLM's names.
//!
//! Threads: the driver runs on its own thread (the simulation is not
//! `Send`, and a thread of its own wakes to the microsecond); HTTP runs on
//! a current-thread tokio runtime on the caller's thread. They talk over
//! channels: arrivals one way, each request's tokens and end the other.

pub mod driver;
pub mod http;
pub mod metrics;
pub mod openai;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use actors::sim::Deployment;

use crate::scenario::Scenario;
use driver::{Clock, Driver};
use metrics::Metrics;

/// How to serve.
#[derive(Clone, Debug)]
pub struct Options {
    /// The address to listen on.
    pub host: String,
    /// The port (0: any free port).
    pub port: u16,
    /// Simulated seconds per wall second.
    pub speed: f64,
    /// Write the arrivals as a Mooncake trace here.
    pub record: Option<PathBuf>,
    /// The model name served (default: the scenario's name).
    pub model_name: Option<String>,
}

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A scenario the engine refuses, a bad flag, an address that cannot be
    /// bound, a record file that cannot be made.
    #[error("{0}")]
    BadInput(String),
    /// pdsim failed.
    #[error("{0}")]
    Internal(String),
}

/// Serves `scenario` until `stop` is set (Ctrl-C) or SIGTERM comes;
/// `on_bound` is told the address bound before any request is taken.
///
/// # Errors
/// As [`ServeError`].
pub fn serve(
    scenario: &Scenario,
    options: &Options,
    stop: &'static AtomicBool,
    on_bound: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    if !(options.speed.is_finite() && options.speed > 0.0) {
        return Err(ServeError::BadInput(format!("--speed {}: must be a positive number", options.speed)));
    }
    let deployment = Deployment::build(scenario.model_spec(), scenario.deployment())
        .map_err(|e| ServeError::BadInput(format!("{}: {e}", scenario.source())))?;
    let record: Option<Box<dyn Write + Send>> = match &options.record {
        Some(path) => {
            let f =
                File::create(path).map_err(|e| ServeError::BadInput(format!("--record {}: {e}", path.display())))?;
            Some(Box::new(BufWriter::new(f)))
        }
        None => None,
    };
    let model = options.model_name.clone().unwrap_or_else(|| scenario.name().unwrap_or("pdsim").to_owned());
    let max_model_len = deployment.max_model_len().map(|t| t.get());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ServeError::Internal(format!("cannot start the runtime: {e}")))?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind((options.host.as_str(), options.port)))
        .map_err(|e| ServeError::BadInput(format!("cannot listen on {}:{}: {e}", options.host, options.port)))?;
    let addr = listener.local_addr().map_err(|e| ServeError::Internal(e.to_string()))?;

    let clock = Clock { start: Instant::now(), speed: options.speed };
    let metrics = Arc::new(Mutex::new(Metrics::default()));
    let (tx, rx) = mpsc::channel();
    let halt = Arc::new(AtomicBool::new(false));
    let driver = Driver {
        deployment,
        seed: scenario.seed(),
        clock,
        arrivals: rx,
        metrics: Arc::clone(&metrics),
        record,
        stop: Arc::clone(&halt),
    };
    let thread = std::thread::Builder::new()
        .name("pdsim-sim".into())
        .spawn(move || driver.run())
        .map_err(|e| ServeError::Internal(format!("cannot start the simulation thread: {e}")))?;
    let app = Arc::new(http::App { arrivals: Mutex::new(tx), metrics, model, max_model_len, clock });
    on_bound(addr);
    let served = runtime.block_on(async {
        let server = axum::serve(listener, http::router(app));
        tokio::select! {
            r = server.into_future() => r.map_err(|e| ServeError::Internal(format!("the server failed: {e}"))),
            () = stopped(stop) => Ok(()),
        }
    });
    halt.store(true, Ordering::Relaxed);
    // Streams still open end with the runtime.
    runtime.shutdown_timeout(Duration::from_millis(100));
    let driven = thread.join().map_err(|_| ServeError::Internal("the simulation thread panicked".into()))?;
    driven.map_err(|e| ServeError::BadInput(format!("--record: {e}")))?;
    served
}

/// Resolves once `stop` is set (the harness's Ctrl-C flag) or SIGTERM comes.
async fn stopped(stop: &AtomicBool) {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        #[cfg(unix)]
        if let Some(t) = term.as_mut() {
            tokio::select! {
                _ = t.recv() => return,
                () = tokio::time::sleep(Duration::from_millis(50)) => continue,
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
