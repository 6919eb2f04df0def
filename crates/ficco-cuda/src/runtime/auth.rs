//! Who may use a job's rendezvous store: the job secret every rank holds,
//! and the challenge and response that proves it on each store connection.
//!
//! The proof is mutual and the secret never crosses the wire. On connect
//! the server sends [`MAGIC`] and a fresh nonce `Ns`; the client answers
//! its own fresh nonce `Nc` and `HMAC-SHA256(secret, "ficco-store-v1
//! client" || Ns || Nc)`; the server checks it (in constant time) and
//! answers `HMAC-SHA256(secret, "ficco-store-v1 server" || Ns || Nc)`,
//! which the client checks. The two labels keep one side's answer from
//! being replayed as the other's; the fresh nonces keep an old exchange
//! from being replayed at all. Every frame has a fixed size, so nothing a
//! peer sends decides an allocation.
//!
//! Where the secret comes from ([`SecretSource`]), in order:
//! - `FICCO_JOB_SECRET` (64 hex digits, the same on every rank): `ficco
//!   --procs` draws one and gives it to its children, the Python path draws
//!   one on rank 0 and sends it through PyTorch's store, another launcher
//!   sets it;
//! - a job of one rank draws its own;
//! - a job whose ranks all run on one node: rank 0 draws one and writes it
//!   to a file of mode 0600 in a directory of mode 0700 that the user owns
//!   ([`secret_dir`]), which the others read (the same user is trusted
//!   anyway: see the README's "Security");
//! - a job over several nodes without a secret is refused
//!   ([`DistError::NoSecret`]): there is no channel to carry one that
//!   ficco could trust.

use super::{DistError, LaunchEnv};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Bytes of a job secret.
pub const SECRET_LEN: usize = 32;
/// Bytes of each side's nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// What a ficco store says first: a client that reads anything else is not
/// talking to a store of this protocol.
pub const MAGIC: [u8; 8] = *b"ficcoST1";

const CLIENT_LABEL: &[u8] = b"ficco-store-v1 client";
const SERVER_LABEL: &[u8] = b"ficco-store-v1 server";

/// The secret of one job (what every rank proves it knows). Its `Debug`
/// does not print it.
#[derive(Clone)]
pub struct JobSecret([u8; SECRET_LEN]);

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobSecret(..)")
    }
}

impl PartialEq for JobSecret {
    /// Constant time: a comparison must not tell how much of a guess was right.
    fn eq(&self, other: &Self) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl Eq for JobSecret {}

/// Fills `buf` from the kernel's random source (`getrandom(2)`).
pub fn random_bytes(buf: &mut [u8]) -> Result<(), DistError> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: a writable buffer of the length given.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(DistError::Io {
                what: "reading the OS random source (getrandom)".into(),
                source: e,
            });
        }
        done += n as usize;
    }
    Ok(())
}

impl JobSecret {
    /// A fresh secret from the OS random source.
    pub fn generate() -> Result<Self, DistError> {
        let mut b = [0u8; SECRET_LEN];
        random_bytes(&mut b)?;
        Ok(JobSecret(b))
    }

    /// The secret of 64 hex digits (surrounding white space ignored);
    /// `None` for anything else.
    pub fn from_hex(text: &str) -> Option<Self> {
        let t = text.trim().as_bytes();
        if t.len() != 2 * SECRET_LEN {
            return None;
        }
        let mut b = [0u8; SECRET_LEN];
        for (out, pair) in b.iter_mut().zip(t.chunks_exact(2)) {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            *out = (hi * 16 + lo) as u8;
        }
        Some(JobSecret(b))
    }

    /// The 64 hex digits [`Self::from_hex`] reads (for a launcher's children).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn mac(
        &self,
        label: &[u8],
        server: &[u8; NONCE_LEN],
        client: &[u8; NONCE_LEN],
    ) -> Hmac<Sha256> {
        // HMAC takes a key of any length; 32 bytes cannot fail.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
        m.update(label);
        m.update(server);
        m.update(client);
        m
    }

    fn proof(&self, label: &[u8], s: &[u8; NONCE_LEN], c: &[u8; NONCE_LEN]) -> [u8; PROOF_LEN] {
        self.mac(label, s, c).finalize().into_bytes().into()
    }

    fn verify(&self, label: &[u8], s: &[u8; NONCE_LEN], c: &[u8; NONCE_LEN], p: &[u8]) -> bool {
        self.mac(label, s, c).verify_slice(p).is_ok()
    }
}

/// Why a store connection did not pass the challenge.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the peer does not speak ficco's store protocol (first bytes {0:02x?})")]
    NotAStore([u8; 8]),
    #[error("wrong proof of the job secret")]
    WrongProof,
    #[error("the connection ended or stalled during the challenge: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Random(String),
}

fn nonce() -> Result<[u8; NONCE_LEN], AuthError> {
    let mut n = [0u8; NONCE_LEN];
    random_bytes(&mut n).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(n)
}

/// The server's side of the challenge on a new connection (the caller
/// bounds its reads with a socket timeout): `Ok` once the client proved it
/// knows `secret` and got the server's proof back.
pub fn serve_challenge(
    conn: &mut (impl Read + Write),
    secret: &JobSecret,
) -> Result<(), AuthError> {
    let ns = nonce()?;
    let mut hello = [0u8; 8 + NONCE_LEN];
    hello[..8].copy_from_slice(&MAGIC);
    hello[8..].copy_from_slice(&ns);
    conn.write_all(&hello)?;
    let mut answer = [0u8; NONCE_LEN + PROOF_LEN];
    conn.read_exact(&mut answer)?;
    let (nc, proof) = answer.split_at(NONCE_LEN);
    let mut c = [0u8; NONCE_LEN];
    c.copy_from_slice(nc);
    if !secret.verify(CLIENT_LABEL, &ns, &c, proof) {
        return Err(AuthError::WrongProof);
    }
    conn.write_all(&secret.proof(SERVER_LABEL, &ns, &c))?;
    Ok(())
}

/// The client's side (the caller bounds its reads with a socket timeout):
/// `Ok` once the server accepted this proof and proved it knows `secret`
/// too, so a store of another job (or a stale secret) is told apart from
/// this job's.
pub fn answer_challenge(
    conn: &mut (impl Read + Write),
    secret: &JobSecret,
) -> Result<(), AuthError> {
    let mut hello = [0u8; 8 + NONCE_LEN];
    conn.read_exact(&mut hello)?;
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&hello[..8]);
    if magic != MAGIC {
        return Err(AuthError::NotAStore(magic));
    }
    let mut ns = [0u8; NONCE_LEN];
    ns.copy_from_slice(&hello[8..]);
    let nc = nonce()?;
    let mut answer = [0u8; NONCE_LEN + PROOF_LEN];
    answer[..NONCE_LEN].copy_from_slice(&nc);
    answer[NONCE_LEN..].copy_from_slice(&secret.proof(CLIENT_LABEL, &ns, &nc));
    conn.write_all(&answer)?;
    let mut proof = [0u8; PROOF_LEN];
    // A server that refused this proof closes the connection: read as EOF.
    conn.read_exact(&mut proof)?;
    if !secret.verify(SERVER_LABEL, &ns, &nc, &proof) {
        return Err(AuthError::WrongProof);
    }
    Ok(())
}

/// Where a rank takes the job secret from (see the module doc).
#[derive(Debug, Clone)]
pub enum SecretSource {
    /// Given (`FICCO_JOB_SECRET`, the Python path) or drawn by a job of one rank.
    Given(JobSecret),
    /// The node's secret file: rank 0 writes it, the others read it.
    NodeFile(PathBuf),
}

impl SecretSource {
    /// The source for the rank `env` describes; an error for a job over
    /// several nodes without a secret, or a secret directory that is not
    /// private to this user.
    pub fn for_env(env: &LaunchEnv) -> Result<Self, DistError> {
        if let Some(s) = &env.secret {
            return Ok(SecretSource::Given(s.clone()));
        }
        if env.world_size == 1 {
            return Ok(SecretSource::Given(JobSecret::generate()?));
        }
        if env.local_world_size != env.world_size {
            return Err(DistError::NoSecret {
                why: format!(
                    "the job spans several nodes (LOCAL_WORLD_SIZE {} < WORLD_SIZE {}); set {} \
                     to the same 64 hex digits on every rank, e.g. from `openssl rand -hex 32`",
                    env.local_world_size,
                    env.world_size,
                    ficco_core::settings::JOB_SECRET
                ),
            });
        }
        let dir = secret_dir(|k| std::env::var_os(k))?;
        Ok(SecretSource::NodeFile(
            dir.join(format!("store-{}.secret", env.store_port)),
        ))
    }
}

/// The user's private directory for node secret files:
/// `$XDG_RUNTIME_DIR/ficco`, else `/tmp/ficco-UID`; made with mode 0700
/// when absent, refused when it is a link, another user's, or open to
/// others (someone could then read or plant the secret).
pub fn secret_dir(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<PathBuf, DistError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let dir = match get("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("ficco"),
        None => std::env::temp_dir().join(format!("ficco-{uid}")),
    };
    let io = |what: String| move |e: std::io::Error| DistError::Io { what, source: e };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(format!("creating {}", dir.display()))(e)),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(io(format!("reading {}", dir.display())))?;
    let bad = if !meta.file_type().is_dir() {
        Some("is not a directory (a link?)")
    } else if meta.uid() != uid {
        Some("belongs to another user")
    } else if meta.mode() & 0o077 != 0 {
        Some("is open to other users (it must be mode 0700)")
    } else {
        None
    };
    match bad {
        Some(why) => Err(DistError::NoSecret {
            why: format!(
                "{} {why}; set {} on every rank instead",
                dir.display(),
                ficco_core::settings::JOB_SECRET
            ),
        }),
        None => Ok(dir),
    }
}

/// Rank 0's side of a node secret file: writes a fresh secret (atomically,
/// mode 0600) and removes the file on drop, when the job ends.
pub struct NodeSecretFile {
    path: PathBuf,
}

impl NodeSecretFile {
    /// Writes `secret` to `path`, replacing any stale file of an earlier job.
    pub fn write(path: &Path, secret: &JobSecret) -> Result<Self, DistError> {
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let io = |what: String| move |e: std::io::Error| DistError::Io { what, source: e };
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(io(format!("creating {}", tmp.display())))?;
        f.write_all(secret.to_hex().as_bytes())
            .map_err(io(format!("writing {}", tmp.display())))?;
        drop(f);
        std::fs::rename(&tmp, path)
            .map_err(io(format!("moving the secret to {}", path.display())))?;
        Ok(NodeSecretFile {
            path: path.to_path_buf(),
        })
    }
}

impl Drop for NodeSecretFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Another rank's side: the secret in `path`, waiting up to `deadline`
/// for rank 0 to write it; the file must be this user's, mode 0600.
pub fn read_node_secret(path: &Path, deadline: Instant) -> Result<JobSecret, DistError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    loop {
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path);
        match opened {
            Ok(mut f) => {
                let meta = f.metadata().map_err(|e| DistError::Io {
                    what: format!("reading {}", path.display()),
                    source: e,
                })?;
                if meta.uid() != uid || meta.mode() & 0o077 != 0 {
                    return Err(DistError::NoSecret {
                        why: format!(
                            "{} is not private to this user (owner {}, mode {:o})",
                            path.display(),
                            meta.uid(),
                            meta.mode() & 0o777
                        ),
                    });
                }
                let mut text = String::new();
                // Bounded: a secret file is 64 bytes.
                let _ = (&mut f).take(256).read_to_string(&mut text);
                if let Some(s) = JobSecret::from_hex(&text) {
                    return Ok(s);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(DistError::Io {
                    what: format!("opening {}", path.display()),
                    source: e,
                })
            }
        }
        if Instant::now() >= deadline {
            return Err(DistError::NoSecret {
                why: format!(
                    "rank 0 did not write the node's secret file {} in time",
                    path.display()
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn secret(b: u8) -> JobSecret {
        JobSecret([b; SECRET_LEN])
    }

    /// Runs the server's side on one end of a socket pair and the client's
    /// on the other; both verdicts.
    fn meet(
        server: JobSecret,
        client: JobSecret,
    ) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let (mut a, mut b) = UnixStream::pair().expect("pair");
        let t = std::thread::spawn(move || {
            let r = serve_challenge(&mut a, &server);
            drop(a); // a refused client reads EOF
            r
        });
        let c = answer_challenge(&mut b, &client);
        (t.join().expect("server"), c)
    }

    #[test]
    fn the_same_secret_passes_both_ways() {
        let (s, c) = meet(secret(7), secret(7));
        assert!(s.is_ok() && c.is_ok(), "{s:?} {c:?}");
    }

    #[test]
    fn a_different_secret_fails_on_both_sides() {
        let (s, c) = meet(secret(7), secret(8));
        assert!(matches!(s, Err(AuthError::WrongProof)), "{s:?}");
        assert!(matches!(c, Err(AuthError::Io(_))), "{c:?}");
    }

    /// The server's answer is no proof for the client's label: a reflected
    /// answer is refused, and the secret is nowhere in what crosses.
    #[test]
    fn proofs_are_bound_to_their_side_and_never_carry_the_secret() {
        let s = secret(3);
        let (ns, nc) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let server_proof = s.proof(SERVER_LABEL, &ns, &nc);
        assert!(!s.verify(CLIENT_LABEL, &ns, &nc, &server_proof));
        assert!(s.verify(SERVER_LABEL, &ns, &nc, &server_proof));
        assert!(!s.verify(SERVER_LABEL, &nc, &ns, &server_proof));
        assert_ne!(&server_proof[..], &s.0[..]);
    }

    #[test]
    fn a_peer_that_is_not_a_store_is_named() {
        let (mut a, mut b) = UnixStream::pair().expect("pair");
        a.write_all(b"HTTP/1.1 200 OK\r\n\r\n-------------------------------")
            .expect("write");
        let e = answer_challenge(&mut b, &secret(1)).unwrap_err();
        assert!(matches!(e, AuthError::NotAStore(_)), "{e:?}");
    }

    #[test]
    fn hex_round_trips_and_anything_else_is_refused() {
        let s = JobSecret::generate().expect("random");
        assert_eq!(JobSecret::from_hex(&s.to_hex()), Some(s.clone()));
        assert_eq!(
            JobSecret::from_hex(&format!(" {}\n", s.to_hex())),
            Some(s.clone())
        );
        assert_ne!(JobSecret::generate().expect("random"), s);
        for bad in ["", "00", &"g".repeat(64), &"0".repeat(63), &"0".repeat(66)] {
            assert!(JobSecret::from_hex(bad).is_none(), "{bad:?}");
        }
        assert_eq!(format!("{s:?}"), "JobSecret(..)");
    }

    #[test]
    fn a_node_secret_file_is_private_read_back_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("ficco-auth-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("root");
        let rt = root.clone().into_os_string();
        let dir = secret_dir(|k| (k == "XDG_RUNTIME_DIR").then(|| rt.clone())).expect("dir");
        let mode = std::fs::metadata(&dir).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let path = dir.join("store-1.secret");
        let s = JobSecret::generate().expect("random");
        let file = NodeSecretFile::write(&path, &s).expect("write");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let deadline = Instant::now() + Duration::from_secs(1);
        assert_eq!(read_node_secret(&path, deadline).expect("read"), s);
        drop(file);
        assert!(!path.exists());
        assert!(matches!(
            read_node_secret(&path, Instant::now()),
            Err(DistError::NoSecret { .. })
        ));
        // A directory open to others is refused.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert!(matches!(
            secret_dir(|k| (k == "XDG_RUNTIME_DIR").then(|| rt.clone())),
            Err(DistError::NoSecret { .. })
        ));
        let _ = std::fs::remove_dir_all(&root);
    }
}
