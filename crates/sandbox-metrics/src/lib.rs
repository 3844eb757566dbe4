//! What every guest and run of a process did, for metrics and usage records: the
//! [`observe::Observation`] each sandbox-core session keeps (native [`observe::Counters`] and
//! a registered [`observe::Observer`]), the [`observe::Event`]s the lifecycle emits, the
//! [`kind`] labels every figure carries (which surface, which provider) and this [`host`]'s
//! name. Below sandbox-core, which re-exports it as `sandbox_core::observe` and
//! `sandbox_core::kind`: counting imports nothing of the policy or the lifecycle.

pub mod host;
pub mod kind;
pub mod observe;
