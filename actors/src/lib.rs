//! The P/D serving domain.
pub mod model;
pub mod rules;
pub mod units;
