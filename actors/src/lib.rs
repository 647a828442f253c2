//! The P/D serving domain of pdsim, on the `sim-core` engine.
//!
//! - [`units`], [`model`], [`rules`]: tokens, blocks and bytes as types; cache
//!   groups and the configuration gates; the grouped transfer rules of vLLM's
//!   NIXL connector.
//! - [`config`], [`workload`]: what a simulation runs (the deployment, the
//!   request stream); [`validate`]: every check of a deployment.
//! - [`sim`]: builds a deployment and runs it: [`router`], [`ranks`]
//!   (prefill, decode, aggregated) over a [`scheduler`] each (which owns the
//!   rank's KV pool),
//!   [`link`]s, exchanging [`msg::Msg`]; [`metrics`] summarises, [`bench`](mod@bench)
//!   in `vllm bench serve`'s terms.
pub mod arch;
pub mod bench;
pub mod config;
mod fxmap;
pub mod hardware;
pub mod link;
pub mod metrics;
pub mod model;
pub mod msg;
pub mod ranks;
pub mod records;
pub mod request;
pub mod router;
pub mod rules;
pub mod scheduler;
pub mod sim;
pub mod sketch;
pub mod steps;
pub mod steptime;
pub mod tp;
pub mod units;
pub mod validate;
pub mod workload;
