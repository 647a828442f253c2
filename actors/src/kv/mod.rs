//! Layer 5, the KV cache of one rank: one block budget shared by every
//! cache group, a prefix cache with LRU eviction.

mod keymap;
mod lru;
mod pool;

pub(crate) use pool::{Alloc, ConnectorHit, KvPool, MAX_GROUPS};
