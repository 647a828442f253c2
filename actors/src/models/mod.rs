//! Layer 1, the model and the machine: a model's layers ([`arch`]), its
//! cache groups and the configuration gates ([`model`]), how its bytes
//! split across tensor-parallel ranks ([`tp`]), the GPU ([`hardware`]),
//! and what a step costs ([`steptime`]).

pub mod arch;
pub mod hardware;
pub mod model;
pub mod steptime;
pub mod tp;
