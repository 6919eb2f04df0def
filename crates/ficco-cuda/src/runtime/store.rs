//! A small TCP key-value store for the rendezvous, hosted by rank 0 at
//! `MASTER_ADDR:MASTER_PORT` (the role of PyTorch's `TCPStore`).
//!
//! Every operation has a deadline, so nothing waits forever: a `get` waits
//! for its key at most its timeout. The server also notices a rank that
//! disconnects without saying goodbye (it died) and answers every waiting
//! and later `get` with [`DistError::PeerLost`] naming that rank; a server
//! that dies shows up at every client as a closed connection
//! ([`DistError::StoreLost`]). So a rank that dies or never arrives ends
//! every other rank with an error within the timeout.
//!
//! Who may connect: every connection first passes the job secret's
//! challenge ([`super::auth`]); one that fails it is logged with its
//! address and closed, and nothing else is served to it (no key, no abort),
//! while the job goes on.
//!
//! Wire format (after the challenge): frames of a one-byte opcode, then
//! length-prefixed fields (u32 little-endian lengths, u64 numbers); one
//! thread per connection on the server, requests answered in order.

use super::auth::{answer_challenge, serve_challenge, JobSecret};
use super::DistError;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const OP_HELLO: u8 = 0;
const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_BYE: u8 = 3;
const OP_ADD: u8 = 4;
const OP_ABORT: u8 = 5;

const REPLY_OK: u8 = 0;
const REPLY_TIMEOUT: u8 = 1;
const REPLY_LOST: u8 = 2;
const REPLY_ABORTED: u8 = 3;

/// Keys and values larger than this are refused (a corrupt or foreign peer).
pub const MAX_FIELD: u32 = 1 << 20;

/// How long a new connection may take to answer the challenge (a silent
/// one then loses its thread, not the job's time).
const CHALLENGE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct State {
    map: HashMap<String, Vec<u8>>,
    /// The first rank that disconnected without saying goodbye.
    lost: Option<usize>,
    /// The first rank that gave up, and why.
    aborted: Option<(usize, String)>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Open client connections that passed the challenge.
    clients: std::sync::atomic::AtomicUsize,
    secret: JobSecret,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock means a connection thread panicked; the map is
        // still consistent (every update is one insert), so keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long a closing server waits for its clients to disconnect.
pub const LINGER: Duration = Duration::from_secs(2);

/// The store's server (rank 0 runs it). On drop it stops accepting and
/// waits up to [`LINGER`] for the other ranks to disconnect, so the answers
/// it already gave (say, "rank 2 died") reach them before rank 0's process
/// goes away and they would only see the store lost.
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl StoreServer {
    /// Listens on `addr` (port 0 picks a free one: see [`Self::addr`]),
    /// serving only connections that prove they know `secret`.
    pub fn bind(addr: &str, secret: JobSecret) -> Result<Self, DistError> {
        let listener = TcpListener::bind(addr).map_err(|e| DistError::Io {
            what: format!(
                "binding the rendezvous store at {addr}{}",
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    " (the port is taken: set FICCO_STORE_PORT to a free one, the same on every rank)"
                } else {
                    ""
                }
            ),
            source: e,
        })?;
        let local = listener.local_addr().map_err(|e| DistError::Io {
            what: "reading the store's address".into(),
            source: e,
        })?;
        listener.set_nonblocking(true).map_err(|e| DistError::Io {
            what: "setting the store listener non-blocking".into(),
            source: e,
        })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            clients: std::sync::atomic::AtomicUsize::new(0),
            secret,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let shared2 = shared.clone();
        let accept = std::thread::Builder::new()
            .name("ficco-store".into())
            .spawn(move || accept_loop(listener, shared2, stop2))
            .map_err(|e| DistError::Io {
                what: "starting the store thread".into(),
                source: e,
            })?;
        Ok(StoreServer {
            addr: local,
            stop,
            accept: Some(accept),
            shared,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let t0 = Instant::now();
        while self.shared.clients.load(Ordering::Acquire) > 0 && t0.elapsed() < LINGER {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                let shared = shared.clone();
                // A connection that cannot get a thread is dropped; its
                // client sees the store lost, a clear error.
                let _ = std::thread::Builder::new()
                    .name("ficco-store-conn".into())
                    .spawn(move || serve(conn, &shared));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Challenges one connection, then serves it until it says goodbye or
/// disconnects; one that fails the challenge is logged and closed.
fn serve(mut conn: TcpStream, shared: &Shared) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_nodelay(true);
    let peer = conn
        .peer_addr()
        .map_or_else(|_| "an unknown address".to_string(), |a| a.to_string());
    let passed = conn
        .set_read_timeout(Some(CHALLENGE_TIMEOUT))
        .map_err(super::auth::AuthError::Io)
        .and_then(|()| serve_challenge(&mut conn, &shared.secret))
        .and_then(|()| {
            conn.set_read_timeout(None)
                .map_err(super::auth::AuthError::Io)
        });
    if let Err(e) = passed {
        eprintln!("ficco: warning: the rendezvous store refused a connection from {peer}: {e}");
        return;
    }
    shared.clients.fetch_add(1, Ordering::AcqRel);
    serve_requests(conn, shared);
    shared.clients.fetch_sub(1, Ordering::AcqRel);
}

/// One request of the wire format (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// The client's rank.
    Hello(u64),
    Set(Vec<u8>, Vec<u8>),
    /// Add a number to a key's u64 value, reply with the sum.
    Add(Vec<u8>, u64),
    /// Wait at most this many ms for the key.
    Get(Vec<u8>, u64),
    /// The client's rank gives up, and why.
    Abort(Vec<u8>),
    Bye,
}

impl Request {
    /// The frame of this request: what [`read_request`] reads.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![];
        match self {
            Request::Hello(r) => {
                out.push(OP_HELLO);
                out.extend_from_slice(&r.to_le_bytes());
            }
            Request::Set(k, v) => {
                out.push(OP_SET);
                field(&mut out, k);
                field(&mut out, v);
            }
            Request::Add(k, n) | Request::Get(k, n) => {
                out.push(if matches!(self, Request::Add(..)) {
                    OP_ADD
                } else {
                    OP_GET
                });
                field(&mut out, k);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Request::Abort(why) => {
                out.push(OP_ABORT);
                field(&mut out, why);
            }
            Request::Bye => out.push(OP_BYE),
        }
        out
    }
}

/// Reads one request. `Ok(None)`: the connection closed between requests;
/// an error: a truncated frame, an unknown opcode or a field over
/// [`MAX_FIELD`] (refused before anything is allocated for it).
pub(crate) fn read_request(r: &mut impl Read) -> std::io::Result<Option<Request>> {
    let Ok(op) = read_u8(r) else {
        return Ok(None);
    };
    Ok(Some(match op {
        OP_HELLO => Request::Hello(read_u64(r)?),
        OP_SET => Request::Set(read_bytes(r)?, read_bytes(r)?),
        OP_ADD => Request::Add(read_bytes(r)?, read_u64(r)?),
        OP_GET => Request::Get(read_bytes(r)?, read_u64(r)?),
        OP_ABORT => Request::Abort(read_bytes(r)?),
        OP_BYE => Request::Bye,
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("unknown store opcode {op}"),
            ))
        }
    }))
}

fn serve_requests(mut conn: TcpStream, shared: &Shared) {
    let mut rank: Option<usize> = None;
    let clean = loop {
        let req = match read_request(&mut conn) {
            Ok(Some(req)) => req,
            Ok(None) | Err(_) => break false,
        };
        let key = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
        let ok = match req {
            Request::Hello(r) => {
                rank = usize::try_from(r).ok();
                true
            }
            Request::Set(k, v) => {
                shared.lock().map.insert(key(&k), v);
                shared.changed.notify_all();
                conn.write_all(&[REPLY_OK]).is_ok()
            }
            Request::Add(k, by) => {
                let n = {
                    let mut st = shared.lock();
                    let k = key(&k);
                    let cur = st.map.get(&k).map(|v| decode_u64(v)).unwrap_or(0);
                    let n = cur.wrapping_add(by);
                    st.map.insert(k, n.to_le_bytes().to_vec());
                    n
                };
                shared.changed.notify_all();
                let mut out = vec![REPLY_OK];
                out.extend_from_slice(&n.to_le_bytes());
                conn.write_all(&out).is_ok()
            }
            Request::Get(k, ms) => {
                let wait = Duration::from_millis(ms);
                let reply = wait_key(shared, &key(&k), wait);
                conn.write_all(&reply).is_ok()
            }
            Request::Abort(why) => {
                let r = rank.unwrap_or(usize::MAX);
                shared
                    .lock()
                    .aborted
                    .get_or_insert((r, String::from_utf8_lossy(&why).into_owned()));
                shared.changed.notify_all();
                true
            }
            Request::Bye => break true,
        };
        if !ok {
            break false;
        }
    };
    if !clean {
        if let Some(r) = rank {
            let mut st = shared.lock();
            st.lost.get_or_insert(r);
            drop(st);
            shared.changed.notify_all();
        }
    }
}

/// The reply to a `get`: the value, a timeout, or the rank that was lost.
fn wait_key(shared: &Shared, key: &str, timeout: Duration) -> Vec<u8> {
    let deadline = Instant::now() + timeout;
    let mut st = shared.lock();
    loop {
        // An abort ends the job: every later wait fails, even for a key
        // that exists. A lost rank only fails waits that cannot complete
        // (it may have died after its last contribution).
        if let Some((r, why)) = &st.aborted {
            let mut out = vec![REPLY_ABORTED];
            out.extend_from_slice(&(*r as u64).to_le_bytes());
            out.extend_from_slice(&(why.len() as u32).to_le_bytes());
            out.extend_from_slice(why.as_bytes());
            return out;
        }
        if let Some(v) = st.map.get(key) {
            let mut out = vec![REPLY_OK];
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
            return out;
        }
        if let Some(r) = st.lost {
            let mut out = vec![REPLY_LOST];
            out.extend_from_slice(&(r as u64).to_le_bytes());
            return out;
        }
        let now = Instant::now();
        if now >= deadline {
            return vec![REPLY_TIMEOUT];
        }
        st = shared
            .changed
            .wait_timeout(st, deadline - now)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}

fn decode_u64(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[..n].copy_from_slice(&v[..n]);
    u64::from_le_bytes(b)
}

fn read_u8(r: &mut impl Read) -> std::io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_bytes(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let n = read_u32(r)?;
    if n > MAX_FIELD {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "store field too large",
        ));
    }
    let mut v = vec![0u8; n as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn field(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Reads a reply off the connection.
type ReadReply<'a> = dyn FnMut(&mut TcpStream) -> std::io::Result<()> + 'a;

/// A rank's connection to the store.
pub struct StoreClient {
    conn: Mutex<TcpStream>,
    addr: String,
    /// Default wait of [`Self::get`].
    pub timeout: Duration,
}

impl StoreClient {
    /// Connects to the store at `addr` as `rank`, retrying until `timeout`
    /// (rank 0 may not be listening yet), and answers its challenge with
    /// `secret` ([`DistError::StoreAuth`] when the two do not share it).
    /// `timeout` is also the default wait of every `get`.
    pub fn connect(
        addr: &str,
        rank: usize,
        timeout: Duration,
        secret: &JobSecret,
    ) -> Result<Self, DistError> {
        let deadline = Instant::now() + timeout;
        let conn = loop {
            let last = match addr.to_socket_addrs() {
                Ok(addrs) => {
                    let mut last = None;
                    for a in addrs {
                        let left = deadline.saturating_duration_since(Instant::now());
                        match TcpStream::connect_timeout(&a, left.max(Duration::from_millis(1))) {
                            Ok(c) => return Self::hello(c, addr, rank, timeout, secret),
                            Err(e) => last = Some(e.to_string()),
                        }
                    }
                    last.unwrap_or_else(|| "the address resolves to nothing".into())
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                break last;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        Err(DistError::StoreUnreachable {
            addr: addr.to_string(),
            waited_ms: timeout.as_millis() as u64,
            last: conn,
        })
    }

    fn hello(
        mut conn: TcpStream,
        addr: &str,
        rank: usize,
        timeout: Duration,
        secret: &JobSecret,
    ) -> Result<Self, DistError> {
        let _ = conn.set_nodelay(true);
        let auth = |e: super::auth::AuthError| DistError::StoreAuth {
            addr: addr.to_string(),
            why: e.to_string(),
        };
        conn.set_read_timeout(Some(CHALLENGE_TIMEOUT))
            .map_err(|e| auth(e.into()))?;
        answer_challenge(&mut conn, secret).map_err(auth)?;
        let c = StoreClient {
            conn: Mutex::new(conn),
            addr: addr.to_string(),
            timeout,
        };
        c.send(&Request::Hello(rank as u64).encode(), None)?;
        Ok(c)
    }

    fn lost(&self, e: std::io::Error) -> DistError {
        DistError::StoreLost {
            addr: self.addr.clone(),
            source: e,
        }
    }

    /// Sends `msg`; with `reply`, reads the answer under a socket timeout of
    /// `wait` plus a margin (a hung server is an error too).
    fn send(
        &self,
        msg: &[u8],
        reply: Option<(Duration, &mut ReadReply<'_>)>,
    ) -> Result<(), DistError> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.write_all(msg).map_err(|e| self.lost(e))?;
        if let Some((wait, read)) = reply {
            conn.set_read_timeout(Some(wait + Duration::from_secs(5)))
                .map_err(|e| self.lost(e))?;
            read(&mut conn).map_err(|e| self.lost(e))?;
        }
        Ok(())
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), DistError> {
        let msg = Request::Set(key.as_bytes().to_vec(), value.to_vec()).encode();
        let mut status = 0u8;
        self.send(
            &msg,
            Some((self.timeout, &mut |c: &mut TcpStream| {
                status = read_u8(c)?;
                Ok(())
            })),
        )?;
        match status {
            REPLY_OK => Ok(()),
            s => Err(self.lost(bad_reply(s))),
        }
    }

    /// Adds `by` to the counter at `key` (absent = 0) and returns the sum.
    pub fn add(&self, key: &str, by: u64) -> Result<u64, DistError> {
        let msg = Request::Add(key.as_bytes().to_vec(), by).encode();
        let mut got = (0u8, 0u64);
        self.send(
            &msg,
            Some((self.timeout, &mut |c: &mut TcpStream| {
                got.0 = read_u8(c)?;
                got.1 = read_u64(c)?;
                Ok(())
            })),
        )?;
        match got.0 {
            REPLY_OK => Ok(got.1),
            s => Err(self.lost(bad_reply(s))),
        }
    }

    /// The value of `key`, waiting for it up to the default timeout.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, DistError> {
        self.get_within(key, self.timeout)
    }

    /// The value of `key`, waiting for it up to `wait`.
    pub fn get_within(&self, key: &str, wait: Duration) -> Result<Vec<u8>, DistError> {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        let msg = Request::Get(key.as_bytes().to_vec(), ms).encode();
        let mut status = 0u8;
        let mut value = vec![];
        let mut lost = 0u64;
        let mut why = vec![];
        self.send(
            &msg,
            Some((wait, &mut |c: &mut TcpStream| {
                status = read_u8(c)?;
                match status {
                    REPLY_OK => value = read_bytes(c)?,
                    REPLY_LOST => lost = read_u64(c)?,
                    REPLY_ABORTED => {
                        lost = read_u64(c)?;
                        why = read_bytes(c)?;
                    }
                    _ => {}
                }
                Ok(())
            })),
        )?;
        match status {
            REPLY_OK => Ok(value),
            REPLY_TIMEOUT => Err(DistError::Timeout {
                key: key.to_string(),
                waited_ms: wait.as_millis() as u64,
            }),
            REPLY_LOST => Err(DistError::PeerLost {
                rank: lost as usize,
                key: key.to_string(),
            }),
            REPLY_ABORTED => Err(DistError::PeerFailed {
                rank: lost as usize,
                reason: String::from_utf8_lossy(&why).into_owned(),
            }),
            s => Err(self.lost(bad_reply(s))),
        }
    }

    /// Tells every rank that this one gives up and why: their waits end
    /// with [`DistError::PeerFailed`] carrying `reason` (the first abort
    /// wins). Best effort: the store may already be gone.
    pub fn abort(&self, reason: &str) {
        let _ = self.send(&Request::Abort(reason.as_bytes().to_vec()).encode(), None);
    }

    /// Says goodbye: the server stops watching this rank, so closing the
    /// connection now is not taken for a death.
    pub fn bye(&self) {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let _ = conn.write_all(&Request::Bye.encode());
    }
}

fn bad_reply(s: u8) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("unexpected store reply {s}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::auth::{NONCE_LEN, PROOF_LEN};
    use proptest::prelude::*;

    fn key() -> JobSecret {
        JobSecret::from_hex(&"5a".repeat(32)).expect("hex")
    }

    fn server() -> (StoreServer, String) {
        let s = StoreServer::bind("127.0.0.1:0", key()).expect("bind");
        let a = s.addr().to_string();
        (s, a)
    }

    /// A client of the test store (its secret).
    fn connect(addr: &str, rank: usize, t: Duration) -> Result<StoreClient, DistError> {
        StoreClient::connect(addr, rank, t, &key())
    }

    /// A raw connection that passed the challenge (to send hand-made frames).
    fn raw_client(addr: &str) -> TcpStream {
        let mut raw = TcpStream::connect(addr).expect("raw client");
        raw.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        answer_challenge(&mut raw, &key()).expect("challenge");
        raw
    }

    fn request() -> impl Strategy<Value = Request> {
        let bytes = || proptest::collection::vec(any::<u8>(), 0..64);
        prop_oneof![
            any::<u64>().prop_map(Request::Hello),
            (bytes(), bytes()).prop_map(|(k, v)| Request::Set(k, v)),
            (bytes(), any::<u64>()).prop_map(|(k, n)| Request::Add(k, n)),
            (bytes(), any::<u64>()).prop_map(|(k, n)| Request::Get(k, n)),
            bytes().prop_map(Request::Abort),
            Just(Request::Bye),
        ]
    }

    proptest! {
        /// Every request the client sends is read back as itself, and every
        /// shorter prefix of its frame is an error (or, empty, a closed
        /// connection), never a different request.
        #[test]
        fn frames_round_trip_and_truncations_are_errors(req in request()) {
            let frame = req.encode();
            let got = read_request(&mut frame.as_slice()).expect("a whole frame");
            prop_assert_eq!(got, Some(req));
            for cut in 0..frame.len() {
                match read_request(&mut &frame[..cut]) {
                    Ok(None) => prop_assert_eq!(cut, 0),
                    Ok(Some(r)) => prop_assert!(false, "prefix {} read as {:?}", cut, r),
                    Err(_) => {}
                }
            }
        }

        /// Arbitrary bytes never panic the parser, and no field over
        /// MAX_FIELD is accepted.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            crate::runtime::fuzzing::store_frames(&bytes);
            let mut r = bytes.as_slice();
            while let Ok(Some(req)) = read_request(&mut r) {
                let longest = match &req {
                    Request::Set(k, v) => k.len().max(v.len()),
                    Request::Add(k, _) | Request::Get(k, _) | Request::Abort(k) => k.len(),
                    _ => 0,
                };
                prop_assert!(longest <= MAX_FIELD as usize);
            }
        }
    }

    #[test]
    fn a_huge_length_is_refused_before_anything_is_allocated() {
        // OP_SET with a 4 GiB key length and no data.
        let mut frame = vec![OP_SET];
        frame.extend_from_slice(&u32::MAX.to_le_bytes());
        let e = read_request(&mut frame.as_slice()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        let e = read_request(&mut [42u8].as_slice()).unwrap_err();
        assert!(e.to_string().contains("unknown store opcode 42"), "{e}");
    }

    /// A client's wait of u64::MAX ms (a bug or a foreign client) is served:
    /// the server's deadline arithmetic must not overflow or panic on it.
    #[test]
    fn the_longest_wait_a_client_can_ask_for_is_served() {
        let (_s, addr) = server();
        let a = connect(&addr, 0, Duration::from_secs(5)).expect("a");
        a.set("k", b"v").expect("set");
        let mut raw = raw_client(&addr);
        raw.write_all(&Request::Get(b"k".to_vec(), u64::MAX).encode())
            .expect("send");
        let mut status = [0u8; 1];
        raw.read_exact(&mut status)
            .expect("a reply, not a closed connection");
        assert_eq!(status[0], REPLY_OK);
        assert_eq!(read_bytes(&mut raw).expect("value"), b"v");
    }

    /// A connection that sends garbage or nothing, before or after the
    /// challenge, does not stop the others.
    #[test]
    fn a_bad_client_does_not_stop_the_others() {
        let (_s, addr) = server();
        let mut silent = TcpStream::connect(&addr).expect("silent");
        let mut garbage = TcpStream::connect(&addr).expect("garbage");
        garbage.write_all(&[0xff, 1, 2, 3]).expect("garbage");
        let _ = silent.write_all(&[OP_SET, 0xff, 0xff]);
        let mut proven = raw_client(&addr);
        proven
            .write_all(&[OP_SET, 0xff, 0xff])
            .expect("a truncated frame");
        let a = connect(&addr, 0, Duration::from_secs(5)).expect("a");
        let b = connect(&addr, 1, Duration::from_secs(5)).expect("b");
        a.set("k", b"value").expect("set");
        assert_eq!(b.get("k").expect("get"), b"value");
    }

    /// A client with another secret is refused before any operation: it
    /// gets an error naming the store, its abort reaches nobody, and the
    /// ranks that hold the secret go on.
    #[test]
    fn a_client_without_the_secret_is_refused_and_cannot_abort() {
        let (_s, addr) = server();
        let a = connect(&addr, 0, Duration::from_secs(5)).expect("a");
        let other = JobSecret::from_hex(&"a5".repeat(32)).expect("hex");
        match StoreClient::connect(&addr, 1, Duration::from_secs(5), &other) {
            Err(DistError::StoreAuth { addr: at, .. }) => assert_eq!(at, addr),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a client with another secret was served"),
        }
        // A raw connection that skips the challenge and sends an abort and a
        // set as its "answer" (exactly the answer's 64 bytes, so the server
        // reads them as one).
        let mut raw = TcpStream::connect(&addr).expect("raw");
        let mut frames = Request::Abort(b"evil".to_vec()).encode();
        frames.extend(Request::Set(b"k".to_vec(), b"evil".to_vec()).encode());
        frames.resize(NONCE_LEN + PROOF_LEN, 0);
        raw.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut hello = [0u8; 8 + NONCE_LEN];
        raw.read_exact(&mut hello).expect("the challenge");
        raw.write_all(&frames).expect("send");
        let mut rest = vec![];
        let _ = raw.read_to_end(&mut rest);
        assert!(
            rest.is_empty(),
            "the server answered a failed proof: {rest:?}"
        );
        // The job goes on: no abort, no key set by the intruder.
        a.set("k", b"good").expect("set");
        assert_eq!(a.get("k").expect("get"), b"good");
        assert!(matches!(
            a.get_within("absent", Duration::from_millis(100)),
            Err(DistError::Timeout { .. })
        ));
    }

    #[test]
    fn set_then_get_and_get_waits_for_a_later_set() {
        let (_s, addr) = server();
        let a = connect(&addr, 0, Duration::from_secs(5)).expect("a");
        let b = connect(&addr, 1, Duration::from_secs(5)).expect("b");
        a.set("k", b"value").expect("set");
        assert_eq!(b.get("k").expect("get"), b"value");
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            a.set("late", &[1, 2, 3]).expect("set late");
            a
        });
        assert_eq!(b.get("late").expect("waited"), vec![1, 2, 3]);
        let a = t.join().expect("thread");
        assert_eq!(a.add("n", 2).expect("add"), 2);
        assert_eq!(b.add("n", 5).expect("add"), 7);
        a.bye();
        b.bye();
    }

    #[test]
    fn a_missing_key_times_out_within_its_bound() {
        let (_s, addr) = server();
        let a = connect(&addr, 0, Duration::from_secs(5)).expect("a");
        let t0 = Instant::now();
        match a.get_within("never", Duration::from_millis(200)) {
            Err(DistError::Timeout { key, waited_ms }) => {
                assert_eq!((key.as_str(), waited_ms), ("never", 200));
            }
            other => panic!("{other:?}"),
        }
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(3),
            "{took:?}"
        );
    }

    #[test]
    fn a_rank_that_disconnects_without_bye_fails_every_waiter() {
        let (_s, addr) = server();
        let a = connect(&addr, 0, Duration::from_secs(5)).expect("a");
        let dying = connect(&addr, 3, Duration::from_secs(5)).expect("dying");
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(dying);
        });
        let t0 = Instant::now();
        match a.get_within("from-3", Duration::from_secs(30)) {
            Err(DistError::PeerLost { rank, key }) => {
                assert_eq!((rank, key.as_str()), (3, "from-3"))
            }
            other => panic!("{other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        t.join().expect("thread");
        // A clean goodbye is not a death.
        let (_s2, addr2) = server();
        let c = connect(&addr2, 0, Duration::from_secs(5)).expect("c");
        let d = connect(&addr2, 1, Duration::from_secs(5)).expect("d");
        d.bye();
        drop(d);
        assert!(matches!(
            c.get_within("x", Duration::from_millis(300)),
            Err(DistError::Timeout { .. })
        ));
    }

    #[test]
    fn an_abort_ends_every_wait_with_the_reason() {
        let (_s, addr) = server();
        let a = connect(&addr, 0, Duration::from_secs(5)).expect("a");
        let b = connect(&addr, 2, Duration::from_secs(5)).expect("b");
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            b.abort("out of memory");
            b
        });
        match a.get_within("never", Duration::from_secs(30)) {
            Err(DistError::PeerFailed { rank, reason }) => {
                assert_eq!((rank, reason.as_str()), (2, "out of memory"))
            }
            other => panic!("{other:?}"),
        }
        let b = t.join().expect("thread");
        // Later waits fail at once, even for keys that exist.
        b.set("k", b"v").expect("set");
        assert!(matches!(
            a.get("k"),
            Err(DistError::PeerFailed { rank: 2, .. })
        ));
    }

    #[test]
    fn a_stopped_store_is_unreachable_within_the_bound() {
        let (s, addr) = server();
        let a = connect(&addr, 1, Duration::from_secs(5)).expect("a");
        drop(s);
        // The accept thread is gone but the connection thread still serves;
        // a fresh client finds nobody listening.
        let t0 = Instant::now();
        match connect(&addr, 2, Duration::from_millis(300)) {
            Err(DistError::StoreUnreachable { waited_ms, .. }) => assert_eq!(waited_ms, 300),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("connected to a stopped store"),
        }
        assert!(t0.elapsed() < Duration::from_secs(3));
        a.bye();
    }
}
