//! The P/D serving domain.
