//! Layer 2, what is served: a request as it is specified and as it moves
//! through the deployment ([`request`]), and the streams of them a
//! simulation pulls ([`workload`]), with the prefix ids that name shared
//! content.

pub mod request;
pub mod workload;
