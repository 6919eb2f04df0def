//! File descriptors between the processes of one node: `SCM_RIGHTS`
//! messages over Unix-domain sockets (how PyTorch's symmetric memory passes
//! its CUDA allocation handles). The sockets are in Linux's abstract
//! namespace, so no file is left behind by a rank that dies.

use super::{DistError, Rendezvous};
use std::io::{IoSlice, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
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
    // Take ownership of any descriptor first, so it is closed on every error.
    let mut fd: Option<OwnedFd> = None;
    // SAFETY: the kernel filled `control` up to msg_controllen; the CMSG
    // macros walk only inside it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::c_int);
                if fd.is_none() {
                    fd = Some(OwnedFd::from_raw_fd(raw));
                } else {
                    drop(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
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
    let token = rv.broadcast(
        &format!("fd/{name}/token"),
        0,
        (me == 0).then(|| job_token().into_bytes()).as_deref(),
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
    let (got, sent) = std::thread::scope(|s| {
        let sender = s.spawn(|| -> std::io::Result<()> {
            for &q in &peers {
                let a = SocketAddr::from_abstract_name(sock_name(q).as_bytes())?;
                let c = UnixStream::connect_addr(&a)?;
                send_fd(&c, me as u64, fd)?;
            }
            Ok(())
        });
        let got = accept_all(&listener, peers.len(), deadline);
        let sent = sender
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("fd sender thread panicked")));
        (got, sent)
    });
    let got = got.map_err(io(format!("rank {me} receiving descriptors")))?;
    sent.map_err(io(format!("rank {me} sending its descriptor")))?;
    let mut out: Vec<Option<OwnedFd>> = (0..rv.env.world_size).map(|_| None).collect();
    for (tag, fd) in got {
        if let Some(slot) = out.get_mut(tag as usize) {
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

/// Accepts `n` connections and one descriptor from each before `deadline`.
fn accept_all(
    listener: &UnixListener,
    n: usize,
    deadline: Instant,
) -> std::io::Result<Vec<(u64, OwnedFd)>> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        match listener.accept() {
            Ok((c, _)) => {
                c.set_nonblocking(false)?;
                let left = deadline.saturating_duration_since(Instant::now());
                c.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
                got.push(recv_fd(&c)?);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "{} of {n} local peers sent their descriptor in time",
                            got.len()
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

/// A name unique to this job's run: rank 0's pid and clock.
fn job_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::LaunchEnv;
    use std::io::Write;
    use std::os::fd::AsFd;

    /// A file with `text`, as an owned descriptor.
    fn file_with(text: &str) -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "ficco-fdpass-{}-{}",
            std::process::id(),
            job_token()
        ));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("temp file");
        let _ = std::fs::remove_file(&path);
        f.write_all(text.as_bytes()).expect("write");
        f
    }

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
        let f = file_with("over the wire");
        send_fd(&a, 42, f.as_fd()).expect("send");
        let (tag, fd) = recv_fd(&b).expect("recv");
        assert_eq!(tag, 42);
        assert_ne!(fd.as_raw_fd(), f.as_raw_fd());
        assert_eq!(read_all(fd), "over the wire");
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
                    };
                    let rv = Rendezvous::join_as(env, Duration::from_secs(10), "n0").expect("join");
                    let f = file_with(&format!("rank {r}"));
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
