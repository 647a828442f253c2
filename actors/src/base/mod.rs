//! Layer 0, the words every other layer speaks: tokens, blocks, bytes and
//! bandwidth as types ([`units`]), cache keys ([`keys`]), the one error
//! type of a checked field ([`field`]), and a fast hash map for integer
//! keys (`fxmap`). Nothing here knows of models, requests or ranks.

pub(crate) mod field;
pub(crate) mod fxmap;
pub(crate) mod keys;
pub mod units;
