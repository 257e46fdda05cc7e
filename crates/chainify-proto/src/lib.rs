//! chainify's wire protocol: prost messages and tonic services generated from `proto/` (package
//! `chainify.v1`), the encoded file descriptor set for gRPC reflection, and the conversions between
//! wire messages and `chainify-core` domain types.
//!
//! Conversions ([`convert`]) run once, on receive: `TryFrom<pb::X> for Y` validates required
//! fields, sizes and ranges and yields a [`ProtocolError`] naming the field by its dotted path
//! (`proposal.transaction.statements[2].params[0].decimal`), which servers map to
//! `Status::invalid_argument`. Sending uses the infallible `From<&Y> for pb::X`. Core crates never
//! import this crate.
//!
//! Where it sits: directly above `chainify-core`, with no I/O of its own (it generates the tonic
//! stubs but opens no connection). Used by the SDK (`chainify-client`), `chainify-orderer` (the
//! Kafka log's entries), `chainify-node` (ledger entries), `chainify-net` and the binary.

pub mod convert;
pub mod ledger;

pub use convert::ProtocolError;

#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all
)]
pub mod pb {
    //! Generated code for package `chainify.v1`.
    tonic::include_proto!("chainify.v1");
}

/// The encoded `FileDescriptorSet` of every file under `proto/`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/chainify_descriptor.bin"));
