//! Layer 7, the actors of a deployment: the message enum ([`msg`]), the
//! ranks (`ranks`), the links (`link`) and the router ([`router`]).

pub(crate) mod link;
pub(crate) mod msg;
pub(crate) mod ranks;
pub mod router;
