//! Layer 3, the statistics: instruments the layers above feed as things
//! happen ([`histogram`], [`timeline`], `bench`'s token windows) and what
//! is made of them at the end: the summary ([`summary`]), `vllm bench
//! serve`'s statistics ([`bench`]), the records ([`records`]), and the
//! SLOs they are judged by ([`slo`]). Nothing here imports what it
//! observes.

pub mod bench;
pub(crate) mod histogram;
pub mod records;
pub mod sketch;
pub(crate) mod slo;
pub(crate) mod summary;
pub(crate) mod timeline;
