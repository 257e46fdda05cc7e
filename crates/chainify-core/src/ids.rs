//! Identifier newtypes. They exist so that a block number is never passed where an org id is
//! expected, and so that their validity is checked once, when they enter the system.

use std::fmt;

use crate::Digest;

/// An organization of the network, numbered from 1 as in the network config and in explicit
/// agreement policies such as `[[1,2],[1,3]]`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct OrgId(pub u32);

/// The domain of the names the network's CA certifies participants under: no certificate may
/// name anything else in it.
pub const TLS_DOMAIN: &str = "chainify.internal";

/// The DNS name the network's CA certifies the orderer's endpoint under (in [`TLS_DOMAIN`]).
pub const ORDERER_TLS_NAME: &str = "orderer.chainify.internal";

impl OrgId {
    /// The DNS name the network's CA certifies this organization's endpoints under, whatever
    /// host they are reached at. Clients and peers check the server's certificate against this
    /// name, not the endpoint's host, so one organization's certificate cannot pass for
    /// another's (every certificate may also name `localhost`).
    pub fn tls_name(self) -> String {
        format!("org{}.{TLS_DOMAIN}", self.0)
    }
}

impl fmt::Display for OrgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "org{}", self.0)
    }
}

/// A block number. Block 1 is the first block; 0 denotes "before any block".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct BlockNumber(pub u64);

impl BlockNumber {
    /// The position before the first block.
    pub const GENESIS: BlockNumber = BlockNumber(0);

    /// The next block number.
    pub fn next(self) -> BlockNumber {
        BlockNumber(self.0 + 1)
    }
}

impl fmt::Display for BlockNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// A transaction id: SHA-256 of the proposal's canonical encoding without its signature.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TxId(pub Digest);

impl fmt::Display for TxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A client id as registered in the network config (non-empty, at most [`MAX_NAME_LEN`] bytes).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ClientId(String);

/// A network id (non-empty, at most [`MAX_NAME_LEN`] bytes).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct NetworkId(String);

/// Longest client or network id accepted, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// A name (client id, network id) was empty, too long or had control characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} is invalid: {problem}")]
pub struct InvalidName {
    /// Which kind of name.
    pub what: &'static str,
    /// The rejected value.
    pub value: String,
    /// Why it was rejected.
    pub problem: &'static str,
}

fn check_name(what: &'static str, value: &str) -> Result<(), InvalidName> {
    let problem = if value.is_empty() {
        "must not be empty"
    } else if value.len() > MAX_NAME_LEN {
        "longer than 128 bytes"
    } else if value.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(InvalidName {
        what,
        value: value.to_owned(),
        problem,
    })
}

macro_rules! name_newtype {
    ($ty:ident, $what:literal) => {
        impl $ty {
            /// Validates and wraps a name.
            pub fn new(value: impl Into<String>) -> Result<Self, InvalidName> {
                let value = value.into();
                check_name($what, &value)?;
                Ok($ty(value))
            }
            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_newtype!(ClientId, "client id");
name_newtype!(NetworkId, "network id");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(ClientId::new("alice").is_ok());
        let err = ClientId::new("").unwrap_err();
        assert_eq!(
            err.to_string(),
            "client id \"\" is invalid: must not be empty"
        );
        assert!(NetworkId::new("a\nb").is_err());
        assert!(NetworkId::new("x".repeat(129)).is_err());
        assert!(NetworkId::new("x".repeat(128)).is_ok());
    }
}
