//! How CommitServers talk: signed votes, certificates, and requests for certificates.
//!
//! Every message is one-way and best effort. The protocol tolerates loss (a vote is re-sent
//! while its block is undecided, a certificate is requested again), so a [`Transport`] never
//! blocks the node and a full [`Inbox`] drops instead of growing without bound.
//!
//! [`LocalNetwork`] connects the nodes of one process (tests, the demo) and can cut an
//! organization off; the gRPC transport of the services serves the same messages over sockets.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use chainify_core::tx::{Certificate, Vote};
use chainify_core::{BlockNumber, OrgId};
use tokio::sync::mpsc;

use crate::transfer::{StatePeer, StatePeers};

/// A message from another organization's CommitServer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerMessage {
    /// A signed vote.
    Vote(Vote),
    /// A certificate (answering a request, or a late vote).
    Certificate(Certificate),
    /// `from` asks for the certificate of `block`.
    CertificateRequest {
        /// Who asks (and gets the answer).
        from: OrgId,
        /// The block.
        block: BlockNumber,
    },
}

/// The sending side, as one organization sees it.
pub trait Transport: Send + Sync + std::fmt::Debug + 'static {
    /// Sends a vote to every other organization.
    fn send_vote(&self, vote: &Vote);
    /// Sends a certificate to one organization.
    fn send_certificate(&self, to: OrgId, certificate: &Certificate);
    /// Asks every other organization for the certificate of `block`.
    fn request_certificate(&self, block: BlockNumber);
}

/// The receiving side of a node: a bounded queue.
#[derive(Clone, Debug)]
pub struct Inbox {
    tx: mpsc::Sender<PeerMessage>,
    dropped: Arc<AtomicU64>,
}

impl Inbox {
    /// A queue of `capacity` messages and its receiving end.
    pub fn new(capacity: usize) -> (Inbox, mpsc::Receiver<PeerMessage>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Inbox {
                tx,
                dropped: Arc::new(AtomicU64::new(0)),
            },
            rx,
        )
    }

    /// Queues a message; false (and counted) when the queue is full or the node stopped.
    pub fn deliver(&self, message: PeerMessage) -> bool {
        let ok = self.tx.try_send(message).is_ok();
        if !ok {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Messages dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Messages waiting to be handled.
    pub fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

#[derive(Debug, Default)]
struct Hub {
    inboxes: BTreeMap<OrgId, Inbox>,
    cut_off: BTreeSet<OrgId>,
    /// What each organization serves to state transfers.
    states: BTreeMap<OrgId, Arc<dyn StatePeer>>,
}

/// The in-process network between the nodes of one process.
#[derive(Clone, Debug, Default)]
pub struct LocalNetwork {
    hub: Arc<Mutex<Hub>>,
}

impl LocalNetwork {
    /// An empty network.
    pub fn new() -> LocalNetwork {
        LocalNetwork::default()
    }

    /// Connects `org`'s inbox (replacing an earlier one, as after a restart).
    pub fn join(&self, org: OrgId, inbox: Inbox) {
        self.lock().inboxes.insert(org, inbox);
    }

    /// Disconnects `org` (it crashed or stopped).
    pub fn leave(&self, org: OrgId) {
        let mut hub = self.lock();
        hub.inboxes.remove(&org);
        hub.states.remove(&org);
    }

    /// Makes `org`'s state available to the others' state transfers.
    pub fn serve_state(&self, org: OrgId, state: Arc<dyn StatePeer>) {
        self.lock().states.insert(org, state);
    }

    /// What `org` serves to state transfers now.
    pub fn state_of(&self, org: OrgId) -> Option<Arc<dyn StatePeer>> {
        self.lock().states.get(&org).cloned()
    }

    /// The organizations `org` may transfer state from: every other one serving, unless a
    /// partition separates them.
    pub fn state_peers(&self, org: OrgId) -> Arc<dyn StatePeers> {
        Arc::new(LocalStatePeers {
            me: org,
            network: self.clone(),
        })
    }

    /// Drops every message from and to `org` until [`LocalNetwork::heal`].
    pub fn partition(&self, org: OrgId) {
        self.lock().cut_off.insert(org);
    }

    /// Ends `org`'s partition.
    pub fn heal(&self, org: OrgId) {
        self.lock().cut_off.remove(&org);
    }

    /// The transport `org` sends through.
    pub fn transport(&self, org: OrgId) -> Arc<dyn Transport> {
        Arc::new(LocalTransport {
            me: org,
            network: self.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hub> {
        self.hub.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn send(&self, from: OrgId, to: Option<OrgId>, message: &PeerMessage) {
        let hub = self.lock();
        if hub.cut_off.contains(&from) {
            return;
        }
        for (org, inbox) in &hub.inboxes {
            let wanted = to.map_or(*org != from, |to| *org == to);
            if wanted && !hub.cut_off.contains(org) {
                inbox.deliver(message.clone());
            }
        }
    }
}

#[derive(Debug)]
struct LocalStatePeers {
    me: OrgId,
    network: LocalNetwork,
}

impl StatePeers for LocalStatePeers {
    fn peers(&self) -> Vec<Arc<dyn StatePeer>> {
        let hub = self.network.lock();
        if hub.cut_off.contains(&self.me) {
            return Vec::new();
        }
        hub.states
            .iter()
            .filter(|(org, _)| **org != self.me && !hub.cut_off.contains(*org))
            .map(|(_, s)| s.clone())
            .collect()
    }
}

#[derive(Debug)]
struct LocalTransport {
    me: OrgId,
    network: LocalNetwork,
}

impl Transport for LocalTransport {
    fn send_vote(&self, vote: &Vote) {
        self.network
            .send(self.me, None, &PeerMessage::Vote(vote.clone()));
    }

    fn send_certificate(&self, to: OrgId, certificate: &Certificate) {
        self.network.send(
            self.me,
            Some(to),
            &PeerMessage::Certificate(certificate.clone()),
        );
    }

    fn request_certificate(&self, block: BlockNumber) {
        self.network.send(
            self.me,
            None,
            &PeerMessage::CertificateRequest {
                from: self.me,
                block,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use chainify_core::crypto::SigningKey;
    use chainify_core::{Digest, NetworkId};

    use super::*;

    fn vote(org: u32) -> Vote {
        Vote::new_signed(
            NetworkId::new("n").expect("name"),
            BlockNumber(0),
            Digest::of(b"h"),
            OrgId(org),
            &SigningKey::from_seed(&[1; 32]),
        )
    }

    #[test]
    fn votes_reach_every_other_org_unless_partitioned() {
        let net = LocalNetwork::new();
        let mut rx = BTreeMap::new();
        for o in 1..=3 {
            let (inbox, r) = Inbox::new(8);
            net.join(OrgId(o), inbox);
            rx.insert(o, r);
        }
        net.transport(OrgId(1)).send_vote(&vote(1));
        assert!(rx.get_mut(&1).unwrap().try_recv().is_err(), "not to itself");
        for o in [2, 3] {
            assert_eq!(
                rx.get_mut(&o).unwrap().try_recv().ok(),
                Some(PeerMessage::Vote(vote(1)))
            );
        }
        net.partition(OrgId(3));
        net.transport(OrgId(1)).send_vote(&vote(1));
        net.transport(OrgId(3)).send_vote(&vote(3));
        assert!(rx.get_mut(&2).unwrap().try_recv().is_ok());
        assert!(rx.get_mut(&2).unwrap().try_recv().is_err(), "3 is cut off");
        assert!(
            rx.get_mut(&3).unwrap().try_recv().is_err(),
            "3 hears nothing"
        );
        net.heal(OrgId(3));
        net.transport(OrgId(2)).request_certificate(BlockNumber(4));
        assert_eq!(
            rx.get_mut(&3).unwrap().try_recv().ok(),
            Some(PeerMessage::CertificateRequest {
                from: OrgId(2),
                block: BlockNumber(4)
            })
        );
    }

    #[test]
    fn a_full_inbox_drops_and_counts() {
        let (inbox, _rx) = Inbox::new(1);
        assert!(inbox.deliver(PeerMessage::Vote(vote(1))));
        assert!(!inbox.deliver(PeerMessage::Vote(vote(2))));
        assert_eq!(inbox.dropped(), 1);
    }
}
