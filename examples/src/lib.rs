//! The example order service's events, and (with the publish and consume paths) the
//! service, relay and consumer built on them.

pub mod consumer_process;
pub mod events;
pub mod orders;
pub mod projection;
pub mod relay_process;
pub mod service_process;
