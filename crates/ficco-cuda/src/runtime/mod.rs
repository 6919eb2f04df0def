//! One process per GPU: the rendezvous of the ranks of a job and the
//! memory they share.
//!
//! | module | role |
//! |---|---|
//! | [`mod@env`] | the launcher environment (`RANK`, `WORLD_SIZE`, ... as `torchrun` sets them) |
//! | [`auth`] | the job secret and the challenge every store connection passes |
//! | [`store`] | a TCP key-value store hosted by rank 0, every wait bounded, dead ranks detected |
//! | [`Rendezvous`] | joins the job: store, hostnames (one node or several), barriers, broadcast, the NCCL id |
//! | `nccl` | the NCCL unique id through the store; one communicator rank per process |
//! | [`fdpass`] | file descriptors between the processes of one node (`SCM_RIGHTS` over a Unix socket), from the job's processes only |
//! | [`shared`] | VMM device memory exported as a POSIX fd, imported and mapped by the node's other ranks |
//! | [`job`] | [`job::Job`]: a backend's rank of a job: shared arena and flags, its NCCL communicators, results exchanged |
//!
//! Design: nothing here waits without a bound. A rank that dies or never
//! arrives ends every other rank's next store wait with an error naming it
//! (the store notices the dead connection), and a rank 0 that dies ends the
//! others' waits with "store lost". Across nodes only the NCCL id crosses;
//! memory is shared only between the ranks of one node, which the hostnames
//! say.
//!
//! Security (the README's "Security" says the same for users): the store
//! listens on 127.0.0.1 when every rank is on one node, else on the
//! address `MASTER_ADDR` resolves to (`FICCO_STORE_BIND` overrides), and
//! serves only connections that prove they know the job secret; each rank
//! announces its pid in the store, and the descriptor sockets take
//! descriptors only from those pids under this user's uid.

pub mod auth;
pub mod env;
pub mod fdpass;
#[doc(hidden)]
pub mod fuzzing;
pub mod job;
pub(crate) mod nccl;
pub mod shared;
pub mod store;

pub use auth::JobSecret;
pub use env::LaunchEnv;
pub use store::{StoreClient, StoreServer};

use auth::{NodeSecretFile, SecretSource};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Default bound of every rendezvous wait (`FICCO_DIST_TIMEOUT_MS` overrides).
pub const DEFAULT_TIMEOUT: Duration =
    Duration::from_millis(ficco_core::settings::DEFAULT_DIST_TIMEOUT_MS);

pub use crate::error::DistError;

/// The bound of rendezvous waits: `FICCO_DIST_TIMEOUT_MS` or [`DEFAULT_TIMEOUT`].
pub fn timeout_from_env() -> Duration {
    Duration::from_millis(ficco_core::settings::Settings::current().dist_timeout_ms)
}

/// This machine's host name (the node identity of the rendezvous).
pub fn hostname() -> Result<String, DistError> {
    let mut buf = [0u8; 256];
    // SAFETY: a writable buffer of the length given.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return Err(DistError::Io {
            what: "gethostname".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Publishes this rank's host and pid and reads everybody's.
fn gather_hosts(
    store: &StoreClient,
    env: &LaunchEnv,
    host: &str,
) -> Result<(Vec<String>, Vec<u32>), DistError> {
    // The pid first: a rank that has every host has every pid too.
    store.set(
        &format!("pid/{}", env.rank),
        &std::process::id().to_le_bytes(),
    )?;
    store.set(&format!("host/{}", env.rank), host.as_bytes())?;
    let hosts = (0..env.world_size)
        .map(|r| {
            store
                .get(&format!("host/{r}"))
                .map(|h| String::from_utf8_lossy(&h).into_owned())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pids = (0..env.world_size)
        .map(|r| {
            let v = store.get(&format!("pid/{r}"))?;
            <[u8; 4]>::try_from(v.as_slice())
                .map(u32::from_le_bytes)
                .map_err(|_| DistError::Mismatch(format!("rank {r} announced a malformed pid")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((hosts, pids))
}

/// Where rank 0's store listens: `FICCO_STORE_BIND`, else 127.0.0.1 when
/// every rank is on this node, else the first address `MASTER_ADDR`
/// resolves to that is not a loopback one (other nodes must reach it);
/// never every interface unless the override says so.
pub fn store_bind_addr(env: &LaunchEnv) -> Result<SocketAddr, DistError> {
    if let Some(ip) = env.store_bind {
        return Ok(SocketAddr::new(ip, env.store_port));
    }
    if env.one_node() {
        return Ok(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), env.store_port));
    }
    let resolved: Vec<SocketAddr> = (env.master_addr.as_str(), env.store_port)
        .to_socket_addrs()
        .map_err(|e| DistError::Io {
            what: format!("resolving MASTER_ADDR {:?}", env.master_addr),
            source: e,
        })?
        .collect();
    resolved
        .iter()
        .find(|a| !a.ip().is_loopback())
        .copied()
        .ok_or_else(|| DistError::InvalidVar {
            var: "MASTER_ADDR",
            value: env.master_addr.clone(),
            why: "resolves to no address other nodes can reach (only loopback or none); \
                  set MASTER_ADDR to this node's address, or FICCO_STORE_BIND",
        })
}

/// Where the ranks reach the store: 127.0.0.1 (or the bind override) on
/// one node, whatever `MASTER_ADDR` names, else `MASTER_ADDR`.
pub fn store_connect_addr(env: &LaunchEnv) -> String {
    let port = env.store_port;
    match env.store_bind {
        _ if !env.one_node() => format!("{}:{port}", env.master_addr),
        Some(ip) if !ip.is_unspecified() => SocketAddr::new(ip, port).to_string(),
        _ => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port).to_string(),
    }
}

/// Connects to the store with the job's secret: rank 0 passes the secret
/// it drew or was given (`own`); the others take it from `source`, and
/// with a node secret file, read it again after a refusal (they may have
/// read a stale file of an earlier job before rank 0 replaced it).
fn connect_store(
    env: &LaunchEnv,
    timeout: Duration,
    source: &SecretSource,
    own: Option<&JobSecret>,
) -> Result<StoreClient, DistError> {
    let deadline = Instant::now() + timeout;
    let addr = store_connect_addr(env);
    loop {
        let secret = match (own, source) {
            (Some(s), _) | (None, SecretSource::Given(s)) => s.clone(),
            (None, SecretSource::NodeFile(p)) => auth::read_node_secret(p, deadline)?,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        match StoreClient::connect(&addr, env.rank, left.max(Duration::from_millis(1)), &secret) {
            Err(DistError::StoreAuth { .. })
                if own.is_none()
                    && matches!(source, SecretSource::NodeFile(_))
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(mut c) => {
                c.timeout = timeout;
                return Ok(c);
            }
            Err(e) => return Err(e),
        }
    }
}

/// See [`Rendezvous::fail`].
fn fail(store: &StoreClient, e: DistError) -> DistError {
    let secondary = matches!(
        e,
        DistError::PeerLost { .. } | DistError::PeerFailed { .. } | DistError::StoreLost { .. }
    );
    if !secondary {
        store.abort(&e.to_string());
    }
    e
}

/// A rank that joined its job: the store connection (and, on rank 0, the
/// store itself) and every rank's host.
pub struct Rendezvous {
    pub env: LaunchEnv,
    store: StoreClient,
    /// Rank r's host name.
    hosts: Vec<String>,
    /// Rank r's process id, as it announced it.
    pids: Vec<u32>,
    // Rank 0 of a job with a node secret file removes it at the end.
    _secret_file: Option<NodeSecretFile>,
    // Dropped last: the server outlives this rank's own client.
    _server: Option<StoreServer>,
}

impl Rendezvous {
    /// Joins the job described by `env`: rank 0 hosts the store (at
    /// [`store_bind_addr`], serving only holders of the job secret: see
    /// [`auth`]), every rank connects, publishes its host name and pid, and
    /// waits for everybody's, each wait bounded by `timeout`.
    pub fn join(env: LaunchEnv, timeout: Duration) -> Result<Self, DistError> {
        Self::join_as(env, timeout, &hostname()?)
    }

    /// [`Self::join`] with a given host name (tests stand in for nodes).
    pub fn join_as(env: LaunchEnv, timeout: Duration, host: &str) -> Result<Self, DistError> {
        let source = SecretSource::for_env(&env)?;
        let (server, secret_file, own) = if env.rank == 0 {
            let secret = match &source {
                SecretSource::Given(s) => s.clone(),
                SecretSource::NodeFile(_) => JobSecret::generate()?,
            };
            let server = StoreServer::bind(&store_bind_addr(&env)?.to_string(), secret.clone())?;
            // Written once the port is this job's, so the file at this
            // port's name is this job's too.
            let file = match &source {
                SecretSource::NodeFile(p) => Some(NodeSecretFile::write(p, &secret)?),
                SecretSource::Given(_) => None,
            };
            (Some(server), file, Some(secret))
        } else {
            (None, None, None)
        };
        let store = connect_store(&env, timeout, &source, own.as_ref())?;
        let (hosts, pids) = match gather_hosts(&store, &env, host) {
            Ok(h) => h,
            Err(e) => return Err(fail(&store, e)),
        };
        let rv = Rendezvous {
            env,
            store,
            hosts,
            pids,
            _secret_file: secret_file,
            _server: server,
        };
        // Everybody has every host before anybody may fail on them: a rank
        // that errors out below then cannot be mistaken for a death by a
        // rank still reading hosts.
        rv.barrier("hosts")?;
        let (env, hosts) = (&rv.env, &rv.hosts);
        let me = &hosts[env.rank];
        let local = hosts.iter().filter(|h| *h == me).count();
        if local != env.local_world_size {
            return Err(rv.fail(DistError::Mismatch(format!(
                "LOCAL_WORLD_SIZE is {} but {local} ranks report host {me:?}",
                env.local_world_size
            ))));
        }
        Ok(rv)
    }

    /// Passes `e` on after telling every other rank (their waits end with
    /// [`DistError::PeerFailed`] and this reason), unless `e` is itself
    /// another rank's failure or the store's.
    pub fn fail(&self, e: DistError) -> DistError {
        fail(&self.store, e)
    }

    /// The store (for keys of the caller's own protocol).
    pub fn store(&self) -> &StoreClient {
        &self.store
    }

    /// Rank r's host name.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Rank r's process id, as it announced it in the store.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// Whether every rank runs on this rank's host: copy-engine and fused
    /// schedules need it; NCCL schedules do not.
    pub fn single_node(&self) -> bool {
        self.hosts.iter().all(|h| *h == self.hosts[self.env.rank])
    }

    /// The global ranks on this rank's node, ascending.
    pub fn local_ranks(&self) -> Vec<usize> {
        let me = &self.hosts[self.env.rank];
        (0..self.hosts.len())
            .filter(|&r| self.hosts[r] == *me)
            .collect()
    }

    /// Waits until every rank reached the barrier `name` (each name once).
    pub fn barrier(&self, name: &str) -> Result<(), DistError> {
        self.barrier_inner(name).map_err(|e| self.fail(e))
    }

    fn barrier_inner(&self, name: &str) -> Result<(), DistError> {
        let key = format!("barrier/{name}");
        let n = self.store.add(&key, 1)?;
        if n == self.env.world_size as u64 {
            self.store.set(&format!("{key}/done"), &[])?;
        }
        self.store.get(&format!("{key}/done")).map(|_| ())
    }

    /// `root`'s bytes at every rank: `root` passes `Some`, the others `None`.
    pub fn broadcast(
        &self,
        name: &str,
        root: usize,
        value: Option<&[u8]>,
    ) -> Result<Vec<u8>, DistError> {
        let key = format!("bcast/{name}/{root}");
        if self.env.rank == root {
            let v = value.ok_or_else(|| {
                DistError::Mismatch(format!(
                    "broadcast {name}: the root rank {root} gave no value"
                ))
            })?;
            self.store.set(&key, v)?;
            return Ok(v.to_vec());
        }
        self.store.get(&key)
    }

    /// Every rank's bytes, by rank (each rank passes its own).
    pub fn all_gather(&self, name: &str, value: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        self.all_gather_inner(name, value).map_err(|e| self.fail(e))
    }

    fn all_gather_inner(&self, name: &str, value: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        self.store
            .set(&format!("gather/{name}/{}", self.env.rank), value)?;
        (0..self.env.world_size)
            .map(|r| self.store.get(&format!("gather/{name}/{r}")))
            .collect()
    }

    /// Leaves the job cleanly: a last barrier (so rank 0 keeps the store up
    /// until everybody is done with it), then goodbye.
    pub fn close(self) -> Result<(), DistError> {
        let r = self.barrier("close");
        self.store.bye();
        r
    }
}

/// Which GPUs the children of [`run_children`] see.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildGpus {
    /// Only the first GPU this process sees (`CUDA_VISIBLE_DEVICES`): for
    /// ranks that all run on GPU 0, whose driver then starts on one GPU,
    /// not on every GPU of the machine (on 4 GPUs each child otherwise pays
    /// for the other three, e.g. `info`'s contexts).
    First,
    /// Every GPU this process sees (ranks on GPUs of their own).
    All,
}

/// Runs this test binary again as the `world` ranks of a job on this
/// machine: each child runs only test `test` (exact name, `--include-ignored`
/// as GPU tests are ignored) with the launcher variables and `child_var=1`,
/// seeing the GPUs `gpus` says; children still running after `limit` are
/// killed. Returns the exit codes (`None`: killed or by a signal). Fails
/// when the binary has no test of that name.
#[cfg(test)]
pub(crate) fn run_children(
    test: &str,
    world: usize,
    child_var: &str,
    gpus: ChildGpus,
    limit: Duration,
) -> Vec<Option<i32>> {
    run_children_beside(test, world, child_var, gpus, limit, &Beside::default()).0
}

/// What a test starts beside the ranks of [`run_children_beside`].
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Beside<'a> {
    /// More variables for every rank.
    pub env: Vec<(&'static str, std::ffi::OsString)>,
    /// One more process, from the job's store port (a foreign process).
    pub process: Option<&'a dyn Fn(u16) -> std::process::Command>,
}

/// [`run_children`], with `beside` started too; also returns the extra
/// process's exit code (`None`: there was none, or it was still running
/// at the limit, or ended by a signal).
#[cfg(test)]
pub(crate) fn run_children_beside(
    test: &str,
    world: usize,
    child_var: &str,
    gpus: ChildGpus,
    limit: Duration,
    beside: &Beside<'_>,
) -> (Vec<Option<i32>>, Option<i32>) {
    use std::process::{Command, Stdio};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let exe = std::env::current_exe().expect("test binary");
    let secret = JobSecret::generate().expect("a job secret");
    // A child that matches no test exits 0 having run nothing: check the name
    // first (a module move once left a test passing without its ranks).
    let listed = Command::new(&exe)
        .args([test, "--exact", "--list"])
        .output()
        .expect("list the tests");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.lines().any(|l| l == format!("{test}: test")),
        "run_children: this binary has no test named '{test}':\n{listed}"
    );
    let mut kids: Vec<_> = (0..world)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.args([
                test,
                "--exact",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(LaunchEnv::vars_for(r, world, "127.0.0.1", port, &secret))
            .envs(beside.env.iter().map(|(k, v)| (k, v)))
            .env(child_var, "1")
            .env("FICCO_DIST_TIMEOUT_MS", "30000")
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
            if gpus == ChildGpus::First {
                let (var, first) = ficco_testkit::first_gpu_only();
                c.env(var, first);
            }
            c.spawn().expect("spawn a rank")
        })
        .collect();
    if let Some(make) = beside.process {
        let mut c = make(port);
        if gpus == ChildGpus::First {
            let (var, first) = ficco_testkit::first_gpu_only();
            c.env(var, first);
        }
        kids.push(c.spawn().expect("spawn the process beside the ranks"));
    }
    let t0 = std::time::Instant::now();
    let mut codes: Vec<Option<Option<i32>>> = vec![None; kids.len()];
    while codes.iter().any(|c| c.is_none()) && t0.elapsed() < limit {
        for (k, c) in kids.iter_mut().zip(codes.iter_mut()) {
            if c.is_none() {
                *c = k.try_wait().expect("try_wait").map(|s| s.code());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for k in kids.iter_mut() {
        let _ = k.kill();
        let _ = k.wait();
    }
    let mut codes: Vec<Option<i32>> = codes.into_iter().map(|c| c.flatten()).collect();
    let extra = if beside.process.is_some() {
        codes.pop().flatten()
    } else {
        None
    };
    (codes, extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_children_runs_the_named_test_and_refuses_an_unknown_name() {
        const CHILD: &str = "FICCO_TEST_RUN_CHILDREN_CHILD";
        if std::env::var_os(CHILD).is_some() {
            return; // a child: its run is the point
        }
        let me = "runtime::tests::run_children_runs_the_named_test_and_refuses_an_unknown_name";
        let codes = run_children(me, 2, CHILD, ChildGpus::All, Duration::from_secs(30));
        assert_eq!(codes, vec![Some(0), Some(0)]);
        let unknown = std::panic::catch_unwind(|| {
            run_children(
                "runtime::tests::no_such_test",
                1,
                CHILD,
                ChildGpus::All,
                Duration::from_secs(5),
            )
        });
        assert!(
            unknown.is_err(),
            "an unknown name must fail, not run nothing"
        );
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    }

    fn env(rank: usize, world: usize, local_world: usize, port: u16) -> LaunchEnv {
        LaunchEnv {
            rank,
            world_size: world,
            local_rank: rank % local_world,
            local_world_size: local_world,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            store_port: port,
            secret: JobSecret::from_hex(&"17".repeat(32)),
            // Nodes stood in for by threads: all on this machine.
            store_bind: Some(Ipv4Addr::LOCALHOST.into()),
        }
    }

    /// Four ranks as threads: hosts, barrier, broadcast of a 128-byte id
    /// (the NCCL unique id's size) and an all-gather, exactly.
    #[test]
    fn four_threads_rendezvous_and_exchange_exactly() {
        let port = free_port();
        let id: Vec<u8> = (0..128u32).map(|i| (i * 7 + 3) as u8).collect();
        let handles: Vec<_> = (0..4)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let rv = Rendezvous::join_as(env(r, 4, 4, port), Duration::from_secs(10), "n0")
                        .expect("join");
                    assert!(rv.single_node());
                    assert_eq!(rv.local_ranks(), vec![0, 1, 2, 3]);
                    rv.barrier("b1").expect("barrier");
                    let got = rv
                        .broadcast("nccl-id", 0, (r == 0).then_some(&id[..]))
                        .expect("bcast");
                    assert_eq!(got, id);
                    let all = rv.all_gather("ranks", &[r as u8; 3]).expect("gather");
                    assert_eq!(all, (0..4).map(|q| vec![q as u8; 3]).collect::<Vec<_>>());
                    rv.close().expect("close");
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank thread");
        }
    }

    /// Two "nodes" of two ranks: not single-node, local ranks per host.
    #[test]
    fn hostnames_split_the_job_into_nodes() {
        let port = free_port();
        let handles: Vec<_> = (0..4)
            .map(|r| {
                std::thread::spawn(move || {
                    let host = if r < 2 { "a" } else { "b" };
                    let rv = Rendezvous::join_as(env(r, 4, 2, port), Duration::from_secs(10), host)
                        .expect("join");
                    assert!(!rv.single_node());
                    let want = if r < 2 { vec![0, 1] } else { vec![2, 3] };
                    assert_eq!(rv.local_ranks(), want);
                    rv.close().expect("close");
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank thread");
        }
    }

    /// A rank that never arrives: the others fail within the bound, naming it.
    #[test]
    fn a_missing_rank_times_out_naming_it() {
        let port = free_port();
        let t0 = std::time::Instant::now();
        let handles: Vec<_> = (0..2)
            .map(|r| {
                std::thread::spawn(move || {
                    Rendezvous::join_as(env(r, 3, 3, port), Duration::from_millis(500), "n0").err()
                })
            })
            .collect();
        for h in handles {
            // Its own timeout, or the other rank's (which gave up first).
            let e = h.join().expect("rank thread").expect("an error");
            assert!(
                matches!(&e, DistError::Timeout { key, .. } if key == "host/2")
                    || matches!(&e, DistError::PeerFailed { rank: 0 | 1, .. }),
                "{e:?}"
            );
            assert!(e.to_string().contains("rank 2 never arrived"), "{e}");
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    /// LOCAL_WORLD_SIZE that does not match the hosts is refused.
    #[test]
    fn a_local_world_size_that_contradicts_the_hosts_is_an_error() {
        let port = free_port();
        let handles: Vec<_> = (0..2)
            .map(|r| {
                std::thread::spawn(move || {
                    Rendezvous::join_as(env(r, 2, 1, port), Duration::from_secs(5), "same").err()
                })
            })
            .collect();
        for h in handles {
            let e = h.join().expect("rank thread").expect("an error");
            let text = e.to_string();
            assert!(
                matches!(e, DistError::Mismatch(_) | DistError::PeerFailed { .. }),
                "{e:?}"
            );
            assert!(text.contains("LOCAL_WORLD_SIZE is 1 but 2 ranks"), "{text}");
        }
    }
}
