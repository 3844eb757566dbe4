//! Baking a guest image for a flow (placeholder).
