//! Layer 4, vLLM's rules, each in one named place that cites vLLM's file
//! and line: what a cache group holds for a step, the handoff's payload
//! and the source release ([`handoff`]).

pub mod handoff;
