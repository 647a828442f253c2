//! Layer 3, the statistics: instruments the layers above feed as things
//! happen (histograms, timelines, token windows) and what is made of them
//! at the end (the summary, `vllm bench serve`'s statistics, the records).
//! Nothing here imports what it observes.

pub mod bench;
pub mod metrics;
pub mod records;
