//! How a [`LedgerEntry`] is stored in an organization's ledger table and streamed by
//! `CommitService.GetLedger`: the protobuf `LedgerEntry`. The one encoder and decoder; readers
//! and writers of the ledger go through `chainify_node::ledger`.

use chainify_core::tx::LedgerEntry;
use prost::Message;

use crate::{ProtocolError, pb};

/// The stored bytes of `entry`.
pub fn encode(entry: &LedgerEntry) -> Vec<u8> {
    pb::LedgerEntry::from(entry).encode_to_vec()
}

/// The entry stored as `bytes`, or what is wrong with them.
pub fn decode(bytes: &[u8]) -> Result<LedgerEntry, ProtocolError> {
    let wire = pb::LedgerEntry::decode(bytes)
        .map_err(|e| ProtocolError::new("entry", format!("does not decode: {e}")))?;
    LedgerEntry::try_from(wire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_refused_with_a_reason() {
        let e = decode(&[0xff, 0x01, 0x02]).unwrap_err();
        assert!(e.to_string().contains("does not decode"), "{e}");
        let e = decode(&pb::LedgerEntry::default().encode_to_vec()).unwrap_err();
        assert!(e.to_string().contains("block"), "{e}");
    }
}
