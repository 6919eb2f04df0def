//! Device memory shared between the processes of one node (the VMM path of
//! the signal seam; see `crate::signal`): each rank creates physical memory
//! with `cuMemCreate` (POSIX-fd handle type), exports it as a file
//! descriptor, passes the descriptor to the node's other ranks
//! ([`super::fdpass`]), and each of them imports it, reserves an address
//! range, maps it and grants its own device access. Buffers and signal
//! flags both live in such memory when one process drives one GPU.
//!
//! Every step owns what it made: a [`SharedMem`] unmaps, frees its address
//! range and releases its handle on drop, also when a later step failed.

use super::{DistError, Rendezvous};
use crate::driver::cuda as cu;
use crate::error::{drv, CudaError, Result};
use crate::mem::DevicePtr;
use cudarc::driver::{sys, CudaContext};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// One VMM allocation mapped into this process, local or imported.
pub struct SharedMem {
    ctx: Arc<CudaContext>,
    handle: sys::CUmemGenericAllocationHandle,
    ptr: DevicePtr,
    bytes: usize,
    reserved: bool,
    mapped: bool,
}

// SAFETY: the handle and the mapping are process-wide driver objects; the
// struct only hands out addresses.
unsafe impl Send for SharedMem {}
// SAFETY: as above; no method mutates through `&self`.
unsafe impl Sync for SharedMem {}

/// `bytes` rounded up to the allocation granularity of `ordinal`.
pub fn rounded(ordinal: usize, bytes: usize) -> Result<usize> {
    let g = cu::mem_granularity(ordinal)?;
    Ok(bytes.max(1).div_ceil(g) * g)
}

impl SharedMem {
    /// New exportable memory of at least `bytes` on `ctx`'s device
    /// `ordinal` (rounded up to the granularity), mapped read-write for it.
    /// Contents are undefined.
    pub fn create(ctx: &Arc<CudaContext>, ordinal: usize, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let bytes = rounded(ordinal, bytes)?;
        let handle = cu::mem_create_fd_exportable(ordinal, bytes)?;
        Self::mapped(ctx, ordinal, handle, bytes)
    }

    /// Imports memory another process exported as `fd` (of `bytes`, the
    /// exporter's rounded size) and maps it for device `ordinal`.
    pub fn import(
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        fd: BorrowedFd<'_>,
        bytes: usize,
    ) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: an open descriptor; the driver validates what it names.
        let handle = unsafe { cu::mem_import_fd(fd.as_raw_fd()) }?;
        Self::mapped(ctx, ordinal, handle, bytes)
    }

    /// Reserves, maps and grants access; `handle` is owned from here (the
    /// partial value's drop undoes whatever succeeded).
    fn mapped(
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        handle: sys::CUmemGenericAllocationHandle,
        bytes: usize,
    ) -> Result<Self> {
        let mut m = SharedMem {
            ctx: ctx.clone(),
            handle,
            ptr: DevicePtr::NULL,
            bytes,
            reserved: false,
            mapped: false,
        };
        let align = cu::mem_granularity(ordinal)?;
        m.ptr = cu::mem_address_reserve(bytes, align)?;
        m.reserved = true;
        // SAFETY: the range was just reserved, of `bytes`; the handle is live
        // and its allocation is `bytes` (the caller's promise for imports,
        // checked by the driver against the allocation's size).
        unsafe { cu::mem_map(m.ptr, bytes, handle) }?;
        m.mapped = true;
        // SAFETY: just mapped.
        unsafe { cu::mem_set_access_rw(m.ptr, bytes, &[ordinal]) }?;
        Ok(m)
    }

    /// A new descriptor for this memory, to pass to another process.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        // SAFETY: a live handle created exportable (imports are not re-exported
        // by ficco, and the driver refuses if the type does not allow it).
        let fd = unsafe { cu::mem_export_fd(self.handle) }?;
        if fd < 0 {
            return Err(CudaError::Plan(format!(
                "cuMemExportToShareableHandle returned descriptor {fd}"
            )));
        }
        // SAFETY: the driver just opened this descriptor for us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The mapped size (a multiple of the granularity).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // Teardown errors cannot be reported; a context must be current.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: each step undone once, in reverse, only if it was done;
        // the owner synchronized the work that used the memory.
        unsafe {
            if self.mapped {
                cu::mem_unmap(self.ptr, self.bytes);
            }
            if self.reserved {
                cu::mem_address_free(self.ptr, self.bytes);
            }
            cu::mem_release(self.handle);
        }
    }
}

/// One buffer per rank of a node, each mapped in every local rank's
/// process: rank r's buffer is `ptr(r)` here.
pub struct SymmetricMem {
    own: SharedMem,
    /// By global rank: peers' buffers on this node, mapped here; `None` for
    /// this rank (see `own`) and for other nodes' ranks.
    peers: Vec<Option<SharedMem>>,
    rank: usize,
}

impl SymmetricMem {
    /// Every rank of the job calls this with the same `bytes` (checked):
    /// creates this rank's buffer on device `ordinal`, exchanges descriptors
    /// with the node's other ranks under `name`, and maps theirs.
    pub fn exchange(
        rv: &Rendezvous,
        name: &str,
        ctx: &Arc<CudaContext>,
        ordinal: usize,
        bytes: usize,
    ) -> Result<Self> {
        let sizes = rv.all_gather(&format!("symm/{name}/bytes"), &(bytes as u64).to_le_bytes())?;
        if let Some((r, _)) = sizes
            .iter()
            .enumerate()
            .find(|(_, s)| s.as_slice() != (bytes as u64).to_le_bytes())
        {
            return Err(DistError::Mismatch(format!(
                "symmetric buffer {name}: rank {} asks {bytes} bytes, rank {r} another size",
                rv.env.rank
            ))
            .into());
        }
        let own = SharedMem::create(ctx, ordinal, bytes)?;
        let fd = own.export_fd()?;
        let fds = super::fdpass::exchange(rv, &format!("symm.{name}"), fd.as_fd())?;
        let mut peers = Vec::with_capacity(fds.len());
        for fd in fds {
            peers.push(match fd {
                Some(fd) => Some(SharedMem::import(ctx, ordinal, fd.as_fd(), own.bytes())?),
                None => None,
            });
        }
        // Nobody may use (or unmap) a peer's buffer before all are mapped.
        rv.barrier(&format!("symm/{name}/mapped"))?;
        Ok(SymmetricMem {
            own,
            peers,
            rank: rv.env.rank,
        })
    }

    /// Rank `r`'s buffer as mapped in this process (None: another node).
    pub fn ptr(&self, r: usize) -> Option<DevicePtr> {
        if r == self.rank {
            return Some(self.own.ptr());
        }
        self.peers.get(r)?.as_ref().map(|m| m.ptr())
    }

    pub fn bytes(&self) -> usize {
        self.own.bytes()
    }
}
