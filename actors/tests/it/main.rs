//! Integration tests of the `actors` crate, linked once as one binary.

mod arch;
mod conformance;
mod gates;
mod handoff;
mod layers;
mod live;
mod model_files;
mod model_fixtures;
mod pinned;
mod rules_oracle;
mod rules_props;
mod sim;
mod validate;
