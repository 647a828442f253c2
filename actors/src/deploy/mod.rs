//! Layer 8, a deployment as data and as a running simulation: its
//! configuration ([`config`]) and checks ([`validate`]), the wiring and
//! the run ([`sim`]), and one rank's scheduler stepped alone ([`steps`]).

pub mod config;
pub mod sim;
pub mod steps;
pub mod validate;

#[cfg(test)]
mod tests;
