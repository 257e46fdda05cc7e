//! The suites every implementation of a port passes against real parts: [`storage`] for a
//! database engine's `Backend`, `orderer` for an `Orderer` (with the feature `testing`).

#[cfg(feature = "testing")]
pub mod orderer;
pub mod storage;
