//! Control-plane providers: each provider's own rules live in its own module.
//!
//! - [`opensandbox`]: a self-hosted OpenSandbox 1.1.1 server, over `opensandbox-api`.

pub mod opensandbox;
