//! File descriptors between the processes of one node: `SCM_RIGHTS`
//! messages over Unix-domain sockets (how PyTorch's symmetric memory passes
//! its CUDA allocation handles). The sockets are in Linux's abstract
//! namespace, so no file is left behind by a rank that dies.
//!
//! Anyone in the network namespace can connect to an abstract socket, so
//! both ends check who is on the other side (`SO_PEERCRED`, which the
//! kernel fills, not the peer): a receiver takes a descriptor only from a
//! process of this user whose pid a rank of the job announced in the store,
//! and only with that rank's tag; a connection from anything else is
//! logged and closed, and the receiver keeps waiting for the real peer
//! until its deadline. A sender gives its descriptor only to the process
//! its peer rank announced. The socket names carry a random token that
//! only the store's holders of the job secret can read.

use super::{DistError, Rendezvous};
use std::io::{IoSlice, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// Sends `fd` with an 8-byte `tag` (the sender's rank) over `sock`.
pub fn send_fd(sock: &UnixStream, tag: u64, fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let data = tag.to_le_bytes();
    let iov = [IoSlice::new(&data)];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    // u64 storage keeps the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds one cmsghdr with room for one int
    // (CMSG_SPACE above); CMSG_FIRSTHDR/CMSG_DATA stay inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(std::io::Error::other("no room for the SCM_RIGHTS header"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut libc::c_int, fd.as_raw_fd());
    }
    // SAFETY: a live socket and a fully initialised msghdr.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(std::io::Error::other("short SCM_RIGHTS message"));
    }
    Ok(())
}

/// Receives one descriptor and its tag (see [`send_fd`]); the descriptor is
/// owned (closed on drop) from here on.
pub fn recv_fd(sock: &UnixStream) -> std::io::Result<(u64, OwnedFd)> {
    let mut data = [0u8; 8];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: plain data; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: a live socket and a msghdr whose buffers are writable.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let controllen = (msg.msg_controllen as usize).min(space);
    let bytes: Vec<u8> = control
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .take(controllen)
        .collect();
    let parsed = scm_rights(&bytes);
    // Take ownership of every descriptor first, so each is closed on every
    // error and only the first is kept.
    let fds: Vec<OwnedFd> = parsed
        .fds
        .into_iter()
        // SAFETY: the kernel installed these descriptors in this process
        // for this message (SCM_RIGHTS), and nothing else owns them.
        .map(|raw| unsafe { OwnedFd::from_raw_fd(raw) })
        .collect();
    let fd = fds.into_iter().next();
    if parsed.malformed {
        return Err(std::io::Error::other("malformed control message"));
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(std::io::Error::other("SCM_RIGHTS message truncated"));
    }
    let fd = fd.ok_or_else(|| std::io::Error::other("message without a file descriptor"))?;
    if (n as usize) < data.len() {
        // The rest of the tag (a stream may split it).
        (&*sock).read_exact(&mut data[n as usize..])?;
    }
    Ok((u64::from_le_bytes(data), fd))
}

/// The descriptors of the `SCM_RIGHTS` messages in a control buffer, read
/// within its bounds whatever the headers claim; `malformed` when a header
/// claims more than the buffer holds (the walk stops there).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ScmRights {
    pub fds: Vec<RawFd>,
    pub malformed: bool,
}

/// Walks `control` as `recvmsg` fills it (what `CMSG_FIRSTHDR` and
/// `CMSG_NXTHDR` do, in safe bounds-checked code so that a fuzzer can feed
/// it anything): every descriptor of every `SCM_RIGHTS` message.
pub fn scm_rights(control: &[u8]) -> ScmRights {
    let word = std::mem::size_of::<usize>();
    let align = |n: usize| n.checked_add(word - 1).map(|v| v & !(word - 1));
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let mut out = ScmRights::default();
    let mut at = 0usize;
    while control.len().saturating_sub(at) >= hdr {
        // SAFETY: `hdr` bytes at `at` are inside `control` (checked above);
        // cmsghdr is plain data, read unaligned.
        let h: libc::cmsghdr = unsafe { std::ptr::read_unaligned(control[at..].as_ptr().cast()) };
        let len = h.cmsg_len as usize;
        if len < hdr || len > control.len() - at {
            out.malformed = true;
            break;
        }
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            let start = align(hdr).map_or(len, |d| at + d.min(len));
            out.fds.extend(
                control[start..at + len]
                    .chunks_exact(4)
                    .map(|c| RawFd::from_ne_bytes([c[0], c[1], c[2], c[3]])),
            );
        }
        match align(len) {
            Some(step) => at = at.saturating_add(step),
            None => break,
        }
    }
    out
}

/// The credentials the kernel recorded for the other end of `sock`
/// (`SO_PEERCRED`: the peer's pid and uid when it connected or listened).
pub fn peer_cred(sock: &UnixStream) -> std::io::Result<libc::ucred> {
    // SAFETY: ucred is plain data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a live socket and a writable ucred of the length given.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred)
}

/// This process's effective uid (what `SO_PEERCRED` reports for it).
fn my_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether a connection from `(pid, uid)` may send a descriptor: the same
/// uid as this process, and a pid announced by a rank still awaited
/// (`pending`: rank and its announced pid).
pub fn admit(pid: i32, uid: u32, my_uid: u32, pending: &[(usize, u32)]) -> Result<(), String> {
    if uid != my_uid {
        return Err(format!("uid {uid} is not this job's ({my_uid})"));
    }
    if !pending.iter().any(|&(_, p)| i64::from(p) == i64::from(pid)) {
        return Err(format!("pid {pid} is no awaited rank of this job"));
    }
    Ok(())
}

/// The rank a descriptor with `tag` from `pid` counts for: a rank still
/// awaited that announced exactly that pid (several ranks may share one
/// process when threads stand in for ranks).
pub fn rank_of(tag: u64, pid: i32, pending: &[(usize, u32)]) -> Result<usize, String> {
    pending
        .iter()
        .find(|&&(r, p)| r as u64 == tag && i64::from(p) == i64::from(pid))
        .map(|&(r, _)| r)
        .ok_or_else(|| format!("tag {tag} is not a rank that pid {pid} announced"))
}

/// Each local rank's descriptor at every local rank: this rank passes its
/// own `fd`; the result has, for every global rank on this node other than
/// this one, its descriptor (a duplicate owned by this process), and `None`
/// for this rank and for ranks of other nodes. `name` keeps concurrent
/// exchanges apart; every rank of the job calls it (a job-wide barrier).
pub fn exchange(
    rv: &Rendezvous,
    name: &str,
    fd: BorrowedFd<'_>,
) -> Result<Vec<Option<OwnedFd>>, DistError> {
    let deadline = Instant::now() + rv.store().timeout;
    let me = rv.env.rank;
    let token = if me == 0 { Some(job_token()?) } else { None };
    let token = rv.broadcast(
        &format!("fd/{name}/token"),
        0,
        token.as_ref().map(|t| t.as_bytes()),
    )?;
    let token = String::from_utf8_lossy(&token).into_owned();
    let sock_name = |r: usize| format!("ficco.{token}.{name}.{r}");
    let io = |what: String| move |e: std::io::Error| DistError::Io { what, source: e };
    let addr = SocketAddr::from_abstract_name(sock_name(me).as_bytes())
        .map_err(io(format!("naming the socket of rank {me}")))?;
    let listener = UnixListener::bind_addr(&addr)
        .map_err(io(format!("binding the fd socket of rank {me}")))?;
    listener
        .set_nonblocking(true)
        .map_err(io("a non-blocking fd socket".into()))?;
    rv.barrier(&format!("fd/{name}/bound"))?;
    let peers: Vec<usize> = rv.local_ranks().into_iter().filter(|&r| r != me).collect();
    let pids = rv.pids();
    let expected: Vec<(usize, u32)> = peers.iter().map(|&q| (q, pids[q])).collect();
    let (got, sent) = std::thread::scope(|s| {
        let sender = s.spawn(|| -> std::io::Result<()> {
            for &q in &peers {
                let a = SocketAddr::from_abstract_name(sock_name(q).as_bytes())?;
                let c = UnixStream::connect_addr(&a)?;
                // Whoever listens under rank q's name must be rank q's process.
                let cred = peer_cred(&c)?;
                admit(cred.pid, cred.uid, my_uid(), &[(q, pids[q])]).map_err(|why| {
                    std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!("the socket of rank {q} is held by another process: {why}"),
                    )
                })?;
                send_fd(&c, me as u64, fd)?;
            }
            Ok(())
        });
        let got = accept_all(&listener, &expected, deadline);
        let sent = sender
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("fd sender thread panicked")));
        (got, sent)
    });
    let got = got.map_err(io(format!("rank {me} receiving descriptors")))?;
    sent.map_err(io(format!("rank {me} sending its descriptor")))?;
    let mut out: Vec<Option<OwnedFd>> = (0..rv.env.world_size).map(|_| None).collect();
    for (r, fd) in got {
        if let Some(slot) = out.get_mut(r) {
            *slot = Some(fd);
        }
    }
    for &q in &peers {
        if out.get(q).is_none_or(|f| f.is_none()) {
            return Err(DistError::Mismatch(format!(
                "rank {me} did not receive the descriptor of local rank {q}"
            )));
        }
    }
    // Nobody drops its listener before every peer has connected to it.
    rv.barrier(&format!("fd/{name}/done"))?;
    Ok(out)
}

/// Accepts one descriptor from each rank of `expected` (rank, announced
/// pid) before `deadline`, by rank; connections from other processes, with
/// a wrong tag or a broken message are logged and closed.
fn accept_all(
    listener: &UnixListener,
    expected: &[(usize, u32)],
    deadline: Instant,
) -> std::io::Result<Vec<(usize, OwnedFd)>> {
    let mut pending = expected.to_vec();
    let mut got = Vec::with_capacity(expected.len());
    while !pending.is_empty() {
        match listener.accept() {
            Ok((c, _)) => match take_one(&c, &pending, deadline) {
                Ok((r, fd)) => {
                    pending.retain(|&(q, _)| q != r);
                    got.push((r, fd));
                }
                Err(why) => {
                    eprintln!("ficco: warning: a descriptor socket refused a connection: {why}")
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = pending.iter().map(|&(r, _)| r).collect();
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "{} of {} local peers sent their descriptor in time (missing ranks {missing:?})",
                            got.len(),
                            expected.len()
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The rank and descriptor of one accepted connection, or why it is refused.
fn take_one(
    c: &UnixStream,
    pending: &[(usize, u32)],
    deadline: Instant,
) -> Result<(usize, OwnedFd), String> {
    let cred = peer_cred(c).map_err(|e| format!("no peer credentials: {e}"))?;
    let who = format!("pid {} uid {}", cred.pid, cred.uid);
    // Checked before reading anything, so a foreign process cannot make
    // this rank wait on it.
    admit(cred.pid, cred.uid, my_uid(), pending).map_err(|e| format!("{who}: {e}"))?;
    let setup = c.set_nonblocking(false).and_then(|()| {
        let left = deadline.saturating_duration_since(Instant::now());
        c.set_read_timeout(Some(left.max(Duration::from_millis(1))))
    });
    setup.map_err(|e| format!("{who}: {e}"))?;
    let (tag, fd) = recv_fd(c).map_err(|e| format!("{who}: {e}"))?;
    let r = rank_of(tag, cred.pid, pending).map_err(|e| format!("{who}: {e}"))?;
    Ok((r, fd))
}

/// A name unique to this job's run, that nobody outside the job can
/// guess: 128 random bits.
fn job_token() -> Result<String, DistError> {
    let mut b = [0u8; 16];
    super::auth::random_bytes(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::LaunchEnv;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// The file's text, read at offset 0 (`pread`: the descriptors of one
    /// file share its offset, and other ranks read it concurrently).
    fn read_all(fd: OwnedFd) -> String {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::from(fd);
        let mut buf = [0u8; 256];
        let n = f.read_at(&mut buf, 0).expect("read");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn a_descriptor_crosses_a_socket_pair_with_its_tag() {
        let (a, b) = UnixStream::pair().expect("pair");
        let f = ficco_testkit::unlinked_file("over the wire");
        send_fd(&a, 42, f.as_fd()).expect("send");
        let (tag, fd) = recv_fd(&b).expect("recv");
        assert_eq!(tag, 42);
        assert_ne!(fd.as_raw_fd(), f.as_raw_fd());
        assert_eq!(read_all(fd), "over the wire");
    }

    /// A control buffer as `recvmsg` fills it: one `SCM_RIGHTS` message
    /// per entry of `msgs`, with those descriptors (raw numbers only).
    fn control_of(msgs: &[Vec<RawFd>]) -> Vec<u8> {
        let word = std::mem::size_of::<usize>();
        let hdr = std::mem::size_of::<libc::cmsghdr>();
        let mut out = vec![];
        for fds in msgs {
            let len = hdr + 4 * fds.len();
            // SAFETY: cmsghdr is plain data.
            let mut h: libc::cmsghdr = unsafe { std::mem::zeroed() };
            h.cmsg_len = len as _;
            h.cmsg_level = libc::SOL_SOCKET;
            h.cmsg_type = libc::SCM_RIGHTS;
            // SAFETY: reading the bytes of a plain-data value.
            let bytes: [u8; std::mem::size_of::<libc::cmsghdr>()] =
                unsafe { std::mem::transmute(h) };
            out.extend_from_slice(&bytes);
            fds.iter()
                .for_each(|f| out.extend_from_slice(&f.to_ne_bytes()));
            out.resize(out.len().div_ceil(word) * word, 0);
        }
        out
    }

    proptest::proptest! {
        /// Every descriptor of every message is found, in order.
        #[test]
        fn control_messages_round_trip(
            msgs in proptest::collection::vec(proptest::collection::vec(0..4096i32, 0..5), 0..4)
        ) {
            let parsed = scm_rights(&control_of(&msgs));
            proptest::prop_assert!(!parsed.malformed);
            proptest::prop_assert_eq!(parsed.fds, msgs.concat());
        }

        /// A truncated buffer yields only descriptors that were in it, in
        /// order, and never more than the bytes could hold.
        #[test]
        fn truncated_control_yields_a_prefix(
            msgs in proptest::collection::vec(proptest::collection::vec(0..4096i32, 1..5), 1..4),
            cut in 0usize..200,
        ) {
            let full = control_of(&msgs);
            let cut = cut.min(full.len());
            let parsed = scm_rights(&full[..cut]);
            let all = msgs.concat();
            proptest::prop_assert!(parsed.fds.len() <= cut / 4);
            proptest::prop_assert_eq!(&parsed.fds[..], &all[..parsed.fds.len()]);
        }

        /// Arbitrary bytes (huge lengths, unknown levels and types) never
        /// panic and never yield more descriptors than the bytes hold.
        #[test]
        fn arbitrary_control_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let parsed = scm_rights(&bytes);
            proptest::prop_assert!(parsed.fds.len() <= bytes.len() / 4);
        }

        /// Only a pending rank's own pid under this uid is admitted, and its
        /// tag must be a rank that pid announced.
        #[test]
        fn only_announced_pids_with_their_ranks_tag_are_taken(
            pid in 1i32..100, uid in 0u32..3, tag in 0u64..6,
        ) {
            let pending = [(1usize, 10u32), (2, 20), (3, 20)];
            let admitted = admit(pid, uid, 1, &pending).is_ok();
            proptest::prop_assert_eq!(admitted, uid == 1 && (pid == 10 || pid == 20));
            let rank = rank_of(tag, pid, &pending).ok();
            let want = match (pid, tag) {
                (10, 1) => Some(1),
                (20, 2) => Some(2),
                (20, 3) => Some(3),
                _ => None,
            };
            proptest::prop_assert_eq!(rank, want);
        }
    }

    #[test]
    fn a_header_that_claims_more_than_the_buffer_is_malformed() {
        let mut c = control_of(&[vec![7, 8]]);
        // cmsg_len is the first field: claim 4 GiB.
        let word = std::mem::size_of::<usize>();
        c[..word].copy_from_slice(&(u32::MAX as usize).to_ne_bytes());
        let parsed = scm_rights(&c);
        assert!(parsed.malformed && parsed.fds.is_empty(), "{parsed:?}");
    }

    #[test]
    fn a_message_without_a_descriptor_is_an_error() {
        let (a, b) = UnixStream::pair().expect("pair");
        (&a).write_all(&7u64.to_le_bytes()).expect("plain write");
        assert!(recv_fd(&b).is_err());
    }

    /// Three ranks as threads: each gets the other two ranks' files.
    #[test]
    fn three_ranks_exchange_their_descriptors() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let handles: Vec<_> = (0..3usize)
            .map(|r| {
                std::thread::spawn(move || {
                    let env = LaunchEnv {
                        rank: r,
                        world_size: 3,
                        local_rank: r,
                        local_world_size: 3,
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                        store_port: port,
                        secret: crate::runtime::JobSecret::from_hex(&"17".repeat(32)),
                        store_bind: None,
                    };
                    let rv = Rendezvous::join_as(env, Duration::from_secs(10), "n0").expect("join");
                    let f = ficco_testkit::unlinked_file(&format!("rank {r}"));
                    let got = exchange(&rv, "t", f.as_fd()).expect("exchange");
                    assert_eq!(got.len(), 3);
                    for (q, fd) in got.into_iter().enumerate() {
                        match fd {
                            None => assert_eq!(q, r),
                            Some(fd) => assert_eq!(read_all(fd), format!("rank {q}")),
                        }
                    }
                    rv.close().expect("close");
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank");
        }
    }
}
