//! Which surface a guest or a run belongs to, and which provider it ran on: the labels of every
//! figure, log line and usage record, from the metrics crate below this one
//! ([`crate::surface`] re-exports [`SurfaceKind`], [`crate::provider`] [`ProviderKind`]).

pub use sandbox_metrics::kind::{ProviderKind, SurfaceKind};
