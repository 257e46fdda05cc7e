//! Which connections a gRPC server keeps.
//!
//! A socket costs a file descriptor whether or not its client ever speaks: a client that opens
//! connections and leaves them idle would otherwise run the process out of descriptors, and
//! then every service on it stops accepting (the other organizations' votes too) while the
//! accept loop spins on the error. [`Incoming`] keeps at most [`ConnectionLimits::total`]
//! connections, at most [`ConnectionLimits::per_address`] from one IP address (an IPv6 /64
//! counts as one address: a host gets a whole prefix), so one client's flood leaves room for
//! everyone else; a connection over a limit is closed as soon as it is accepted. The other
//! organizations' addresses ([`ConnectionLimits::peers`]) do not count toward the total, so
//! clients from many addresses cannot lock the peers out. A failed accept (out of
//! descriptors) pauses accepting briefly instead of retrying at once.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use chainify_core::OrgId;
use chainify_core::config::NetworkConfig;
use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};
use tracing::warn;

/// How many connections a server keeps at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// In all, the peers' aside: well under the units' 65 536 descriptors, with five servers
    /// a process.
    pub total: usize,
    /// From one IP address: more than a devnet's 512 benchmark clients on one host.
    pub per_address: usize,
    /// The other organizations' addresses: outside `total` (each still within
    /// `per_address`).
    pub peers: Vec<IpAddr>,
    /// How long a connection may send nothing before it is closed. Servers ping every
    /// connection's peer over HTTP/2 (`KEEPALIVE_INTERVAL`) and a live peer answers, so only a
    /// connection that never finished its handshake, or whose peer stopped, goes this quiet.
    pub idle: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            total: 8192,
            per_address: 1024,
            peers: Vec::new(),
            idle: CONNECTION_IDLE,
        }
    }
}

/// [`ConnectionLimits::idle`] by default: four HTTP/2 ping intervals.
pub const CONNECTION_IDLE: Duration = Duration::from_secs(120);

impl ConnectionLimits {
    /// The default limits, with the addresses of `network`'s organizations other than `me`
    /// (every one for `None`: the orderer) as peers, their endpoints' host names resolved now.
    /// A name that does not resolve is left out, with a warning: its organization's
    /// connections then count toward the total like a client's.
    pub async fn for_network(network: &NetworkConfig, me: Option<OrgId>) -> ConnectionLimits {
        let lookups = network
            .orgs
            .values()
            .filter(|o| Some(o.id) != me)
            .flat_map(|org| [&org.chainify_endpoint, &org.commit_endpoint].map(|e| (org.id, e)))
            .map(|(org, endpoint)| resolve(org, endpoint));
        let mut peers: Vec<IpAddr> = futures_util::future::join_all(lookups)
            .await
            .into_iter()
            .flatten()
            .collect();
        peers.sort_unstable();
        peers.dedup();
        ConnectionLimits {
            peers,
            ..ConnectionLimits::default()
        }
    }
}

/// How long resolving one peer's endpoint may take at start.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The addresses `org`'s `endpoint` resolves to; none, with a warning, if it does not within
/// [`RESOLVE_TIMEOUT`].
async fn resolve(org: OrgId, endpoint: &str) -> Vec<IpAddr> {
    let problem =
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host(endpoint)).await {
            Ok(Ok(found)) => return found.map(|a| a.ip()).collect(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {RESOLVE_TIMEOUT:?}"),
        };
    warn!(%org, %endpoint, %problem, "cannot resolve a peer's endpoint; its connections count as a client's");
    Vec::new()
}

/// `ip` itself, an IPv4-mapped IPv6 address as its IPv4 address.
fn plain(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// The address a client's `ip` counts as: for IPv6 its /64 (a host gets a whole prefix).
pub(crate) fn counted_as(ip: IpAddr) -> IpAddr {
    match plain(ip) {
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(v6) & !((1u128 << 64) - 1),
        )),
        v4 => v4,
    }
}

/// Places by address within [`ConnectionLimits`], for connections and for anything else a
/// client holds open (commit streams). Cloning shares them.
#[derive(Clone, Debug)]
pub(crate) struct AddressLimiter {
    counts: Arc<Counts>,
}

impl AddressLimiter {
    pub(crate) fn new(mut limits: ConnectionLimits) -> AddressLimiter {
        limits.peers = limits.peers.into_iter().map(plain).collect();
        AddressLimiter {
            counts: Arc::new(Counts {
                limits,
                open: Mutex::default(),
            }),
        }
    }

    /// A place for one more from `ip`, given back when dropped; `None` over a limit.
    pub(crate) fn admit(&self, ip: IpAddr) -> Option<Slot> {
        self.counts.admit(ip)
    }

    /// Places held now by a client at `ip` (counted as [`counted_as`]).
    pub(crate) fn open_from(&self, ip: IpAddr) -> usize {
        let open = self
            .counts
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.0.get(&counted_as(ip)).copied().unwrap_or(0)
    }

    /// Places held now, the peers' aside.
    pub(crate) fn open(&self) -> usize {
        self.counts
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
    }
}

/// How long accepting pauses after an accept failed for the process (no descriptor left).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The connections `listener` accepts, each with `TCP_NODELAY`, within `limits`. Without the
/// option a reply written in two segments (HTTP/2 data, then trailers) waits for the peer's
/// delayed ACK, about 40 ms on Linux: a whole execution or vote call's worth, measured on the
/// devnet. tonic ignores `Server::tcp_nodelay` for an incoming stream it is handed, hence the
/// option is set here.
pub fn incoming_within(listener: TcpListener, limits: ConnectionLimits) -> Incoming {
    Incoming {
        inner: TcpIncoming::from(listener).with_nodelay(Some(true)),
        places: AddressLimiter::new(limits),
        paused: None,
    }
}

/// [`incoming_within`] the default limits.
pub fn incoming(listener: TcpListener) -> Incoming {
    incoming_within(listener, ConnectionLimits::default())
}

/// Accepted connections within limits (see the module's documentation).
pub struct Incoming {
    inner: TcpIncoming,
    places: AddressLimiter,
    paused: Option<Pin<Box<Sleep>>>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("limits", &self.places.counts.limits)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Counts {
    limits: ConnectionLimits,
    /// Open connections by address, and in all.
    open: Mutex<(HashMap<IpAddr, usize>, usize)>,
}

impl Counts {
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        // A peer by its exact address, counted apart from its prefix: a neighbour in a shared
        // IPv6 /64 is a client, and cannot use up the peer's places.
        let exact = plain(ip);
        let peer = self.limits.peers.contains(&exact);
        let ip = if peer { exact } else { counted_as(ip) };
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let (by_address, total) = &mut *open;
        let from = by_address.entry(ip).or_default();
        if (!peer && *total >= self.limits.total) || *from >= self.limits.per_address {
            if *from == 0 {
                by_address.remove(&ip);
            }
            return None;
        }
        *from += 1;
        if !peer {
            *total += 1;
        }
        Some(Slot {
            counts: self.clone(),
            ip,
            peer,
        })
    }
}

/// An admitted connection's place; given back when the connection is dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    counts: Arc<Counts>,
    /// As counted: a peer's exact address, a client's [`counted_as`].
    ip: IpAddr,
    /// Outside the total.
    peer: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .counts
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (by_address, total) = &mut *open;
        if !self.peer {
            *total = total.saturating_sub(1);
        }
        if let Some(from) = by_address.get_mut(&self.ip) {
            *from -= 1;
            if *from == 0 {
                by_address.remove(&self.ip);
            }
        }
    }
}

impl Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(pause) = &mut self.paused {
                ready!(pause.as_mut().poll(cx));
                self.paused = None;
            }
            let stream = match ready!(Pin::new(&mut self.inner).poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(stream)) => stream,
                Some(Err(e)) => {
                    // Out of descriptors, most likely: accepting again at once fails again.
                    warn!(error = %e, "accepting a connection failed; pausing {ACCEPT_PAUSE:?}");
                    self.paused = Some(Box::pin(tokio::time::sleep(ACCEPT_PAUSE)));
                    continue;
                }
            };
            let Ok(peer) = stream.peer_addr() else {
                continue;
            };
            // Over a limit: dropped here, which closes it.
            if let Some(slot) = self.places.admit(peer.ip()) {
                let idle = self.places.counts.limits.idle;
                return Poll::Ready(Some(Ok(Conn {
                    stream,
                    _slot: slot,
                    idle,
                    last_read: Instant::now(),
                    quiet: Box::pin(tokio::time::sleep(idle)),
                })));
            }
        }
    }
}

/// An accepted connection, holding its place within the limits until it is dropped, and
/// closed (its reads fail) once it has sent nothing for [`ConnectionLimits::idle`].
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    _slot: Slot,
    idle: Duration,
    last_read: Instant,
    /// Fires at the earliest the connection can have been quiet for `idle`; moved on
    /// lazily, when it fires, rather than at every read.
    quiet: Pin<Box<Sleep>>,
}

impl Conn {
    /// The socket.
    pub fn get_ref(&self) -> &TcpStream {
        &self.stream
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.last_read = Instant::now();
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                while this.quiet.as_mut().poll(cx).is_ready() {
                    let until = this.last_read + this.idle;
                    if Instant::now() >= until {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("the connection sent nothing for {:?}", this.idle),
                        )));
                    }
                    this.quiet.as_mut().reset(until.into());
                }
                Poll::Pending
            }
            done => done,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpSocket;

    async fn connect_from(source: [u8; 4], to: std::net::SocketAddr) -> TcpStream {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind((IpAddr::from(source), 0).into())
            .expect("a loopback source address");
        socket.connect(to).await.expect("connects")
    }

    /// Whether the server closed `client`'s connection (it reads the end, or a reset).
    async fn closed(client: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_secs(5), client.read(&mut byte)).await {
            Ok(Ok(0) | Err(_)) => true,
            Ok(Ok(_)) | Err(_) => false,
        }
    }

    /// A connection that sends nothing is closed after `idle`; one that sends now and then is
    /// not, however long it lives.
    #[tokio::test]
    async fn a_quiet_connection_is_closed_and_a_talking_one_kept() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("bound");
        // Writes 20 times as often as the limit: a slow machine cannot make it look quiet.
        let idle = Duration::from_secs(2);
        let mut accepted = incoming_within(
            listener,
            ConnectionLimits {
                idle,
                ..ConnectionLimits::default()
            },
        );
        let mut talking = connect_from([127, 0, 0, 1], addr).await;
        let mut served = accepted.next().await.expect("a connection").expect("kept");
        let talker = tokio::spawn(async move {
            for _ in 0..10 {
                talking.write_all(b"x").await.expect("writes");
                tokio::time::sleep(idle / 20).await;
            }
            talking
        });
        let mut byte = [0u8; 1];
        for _ in 0..10 {
            assert_eq!(
                served.read(&mut byte).await.expect("kept while it talks"),
                1
            );
        }
        let _talking = talker.await.expect("talker");
        // Now quiet: the next read fails once `idle` has passed.
        let quiet = served.read(&mut byte).await;
        assert_eq!(
            quiet.expect_err("a quiet connection was kept").kind(),
            io::ErrorKind::TimedOut
        );
    }

    /// The peers are the other organizations' endpoints, resolved; one whose name does not
    /// resolve is left out (its connections count as a client's), and start-up goes on.
    #[tokio::test]
    async fn peers_are_the_other_organizations_resolved_addresses() {
        use chainify_core::config::{NetworkBuilder, PortPlan};
        use chainify_core::crypto::SigningKey;
        let mut b = NetworkBuilder::new("net", "any-2", PortPlan { base: 7010 });
        for (i, host) in [
            (1u8, "127.0.0.7"),
            (2, "127.0.0.8"),
            (3, "no-such-host.invalid"),
        ] {
            b.org(&SigningKey::from_seed(&[i; 32]).public_key(), host);
        }
        let network = b.config("network.toml").expect("network");
        let limits = ConnectionLimits::for_network(&network, Some(OrgId(1))).await;
        assert_eq!(limits.peers, [IpAddr::from([127, 0, 0, 8])]);
        let orderer = ConnectionLimits::for_network(&network, None).await;
        assert_eq!(
            orderer.peers,
            [IpAddr::from([127, 0, 0, 7]), IpAddr::from([127, 0, 0, 8])]
        );
    }

    #[test]
    fn an_ipv6_prefix_counts_as_one_address() {
        let places = AddressLimiter::new(ConnectionLimits {
            total: 100,
            per_address: 2,
            peers: vec!["2001:db8:0:9::1".parse().expect("ip")],
            idle: CONNECTION_IDLE,
        });
        let a: IpAddr = "2001:db8::1".parse().expect("ip");
        let b: IpAddr = "2001:db8::ffff:1:2:3".parse().expect("ip");
        let _one = places.admit(a).expect("a place");
        let _two = places.admit(b).expect("a place");
        assert!(places.admit("2001:db8::42".parse().expect("ip")).is_none());
        assert!(
            places
                .admit("2001:db8:0:1::1".parse().expect("ip"))
                .is_some()
        );
        // An IPv4-mapped address is its IPv4 address.
        let v4 = places.admit(IpAddr::from([10, 0, 0, 1])).expect("a place");
        let _mapped = places.admit("::ffff:10.0.0.1".parse().expect("ip"));
        assert!(places.admit(IpAddr::from([10, 0, 0, 1])).is_none());
        drop(v4);
        // The peer's exact address is outside the total; a neighbour in its /64 is a client,
        // counted apart, and cannot use up the peer's places.
        let total = || places.counts.open.lock().expect("lock").1;
        let before = total();
        let _p = places
            .admit("2001:db8:0:9::1".parse().expect("ip"))
            .expect("a place");
        assert_eq!(total(), before, "the peer is outside the total");
        let neighbour: IpAddr = "2001:db8:0:9::77".parse().expect("ip");
        let _n1 = places.admit(neighbour).expect("a place");
        let _n2 = places.admit(neighbour).expect("a place");
        assert!(places.admit(neighbour).is_none());
        assert_eq!(total(), before + 2, "a neighbour counts toward the total");
        let _p2 = places
            .admit("2001:db8:0:9::1".parse().expect("ip"))
            .expect("the peer keeps its own places");
    }

    #[tokio::test]
    async fn one_address_cannot_take_every_place_and_a_closed_connection_frees_its_own() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("bound");
        let mut accepted = incoming_within(
            listener,
            ConnectionLimits {
                total: 3,
                per_address: 2,
                peers: vec![IpAddr::from([127, 0, 0, 9])],
                idle: CONNECTION_IDLE,
            },
        );
        let _a1 = connect_from([127, 0, 0, 1], addr).await;
        let first = accepted.next().await.expect("a connection").expect("kept");
        assert!(
            first.get_ref().nodelay().expect("readable option"),
            "an accepted connection must have TCP_NODELAY: replies in two segments wait ~40 ms"
        );
        let _a2 = connect_from([127, 0, 0, 1], addr).await;
        let _second = accepted.next().await.expect("a connection").expect("kept");
        // A third from the same address is closed; one from another address is kept.
        let mut a3 = connect_from([127, 0, 0, 1], addr).await;
        let _b1 = connect_from([127, 0, 0, 2], addr).await;
        let other = accepted.next().await.expect("a connection").expect("kept");
        assert_eq!(
            other.get_ref().peer_addr().expect("peer").ip(),
            IpAddr::from([127, 0, 0, 2])
        );
        assert!(
            closed(&mut a3).await,
            "a third connection from one address was kept"
        );
        // Three in all: a fourth address is refused too (and nothing is accepted meanwhile).
        let mut c1 = connect_from([127, 0, 0, 3], addr).await;
        let nothing = tokio::time::timeout(Duration::from_millis(300), accepted.next()).await;
        assert!(nothing.is_err(), "a connection over the total was kept");
        assert!(
            closed(&mut c1).await,
            "a connection over the total was kept open"
        );
        // A peer's address is outside the total (within its own per-address limit).
        let _p1 = connect_from([127, 0, 0, 9], addr).await;
        let peer = accepted.next().await.expect("a connection").expect("kept");
        assert_eq!(
            peer.get_ref().peer_addr().expect("peer").ip(),
            IpAddr::from([127, 0, 0, 9])
        );
        // Closing one of the first address's connections frees a place for it.
        drop(first);
        let _a4 = connect_from([127, 0, 0, 1], addr).await;
        let again = accepted.next().await.expect("a connection").expect("kept");
        assert_eq!(
            again.get_ref().peer_addr().expect("peer").ip(),
            IpAddr::from([127, 0, 0, 1])
        );
    }
}
