//! The lfx whole-flow executor's semantics (`LANGFLOW_EXECUTOR_KIND=createos`), as plain Rust
//! over `sandbox-core`, with no Python and no lfx.
//!
//! An entire flow runs in one fresh CreateOS guest: [`Executor::start`] creates the guest
//! (reaper-guarded), uploads the guest runner ([`runner::SOURCE`], a Python script embedded in
//! this crate) and dispatches it at once as a streaming exec under `timeout(1)`, so the guest
//! imports lfx while the host reads the egress back and completes and uploads the job document
//! ([`job::FlowRequest::job`]; [`Executor::start_with`] takes the request's [`job::RunHead`]
//! first and the rest as it is ready). Each run measures its phases ([`timings`]). [`FlowRun::next`] yields each
//! vertex the moment its frame arrives ([`frames`]: the host's own bounds on everything the
//! guest sends, checked before anything is built; log lines for everything that is not a frame) and ends with the run's outputs; the guest is destroyed on completion,
//! on an error, and when the consumer stops early ([`FlowRun::close`], or dropping the run).
//! What the host resolved for the flow (variable values, the chat session and its history,
//! uploaded files) travels in the job and the uploads ([`job`]); the chat messages the flow
//! stores come back as [`Event::Message`], for the caller's message store.
//! Settings are the executor's own `CREATEOS_EXECUTOR_*` ([`settings`]); [`template`] works out
//! what a flow's guest image needs and bakes it as a CreateOS template.

pub mod chunks;
mod error;
mod flow_run;
pub mod frames;
pub mod job;
mod prepared;
pub mod runner;
pub mod settings;
mod start;
pub mod template;
pub mod timings;
mod warm;
pub mod withhold;

pub use error::ExecutorError;
pub use flow_run::{Event, FlowRun};
pub use frames::{Bound, FrameLimits, Payload};
pub use job::{FlowRequest, Mode, RunHead};
pub use prepared::Plan;
pub use start::{
    DEFAULT_MAX_FRAME_BYTES, EnvLookup, Executor, ExecutorOptions, OPENSANDBOX_DEFAULT_SIZE,
};
pub use timings::Timings;
