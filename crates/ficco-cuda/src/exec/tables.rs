//! A tile GEMM's destination hook in device memory (`-acc`: the own block
//! stored straight into the output): per block the address it stores to,
//! and where they fit the same blocks as tensor maps. They hold operand
//! addresses, so they are built for one binding of the plan's buffers: once
//! per run on the full path ([`super::rank::Rank::tile_tables`]), once per
//! address set on the op path's fast calls (`super::op`).

use super::addr::view_addr;
use super::shared::TileTables;
use crate::error::Result;
use crate::hgemm::{Bf16, DestLayout, HopperGemm, TypedPtr};
use crate::mem::DevicePtr;
use ficco_core::plan::{RankPlan, TaskKind, TileGemm};
use ficco_core::problem::workload::ELEM_BYTES;

/// Bytes of one tensor map (and the alignment the kernel reads them at).
const MAP_BYTES: usize = 128;

/// A rank's tile tables as the bytes of one buffer: every task's tensor
/// maps first (128-byte aligned), then its address tables, and where each
/// task's start.
#[derive(Debug, Default)]
pub(crate) struct TableBytes {
    pub bytes: Vec<u8>,
    dest: Vec<Option<usize>>,
    maps: Vec<Option<usize>>,
}

impl TableBytes {
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The tables once the bytes are at `base` (256-byte aligned, as
    /// `cuMemAlloc` returns).
    pub fn at(&self, base: DevicePtr) -> TileTables {
        let place = |v: &[Option<usize>]| v.iter().map(|o| o.map(|b| base.offset(b))).collect();
        TileTables {
            dest: place(&self.dest),
            maps: place(&self.maps),
        }
    }
}

/// The [`TableBytes`] of `rp`'s tile GEMMs with a destination hook, for its
/// buffers bound at `ptrs`; tensor maps are encoded by the own GEMM of the
/// task's stream (`gemms`, loaded before). Empty when no tile GEMM has one.
pub(crate) fn tile_table_bytes(
    gemms: &[HopperGemm],
    rp: &RankPlan,
    ptrs: &[DevicePtr],
) -> Result<TableBytes> {
    let n = rp.tasks.len();
    let mut words: Vec<(usize, Vec<u64>)> = vec![];
    let mut maps: Vec<(usize, Vec<u8>)> = vec![];
    for (i, t) in rp.tasks.iter().enumerate() {
        let TaskKind::TileGemm(g) = &t.kind else {
            continue;
        };
        if g.dest.iter().all(Option::is_none) {
            continue;
        }
        let mut table = Vec::with_capacity(g.blocks());
        let mut ld = 0;
        for b in 0..g.blocks() {
            table.push(match g.dest.get(b).copied().flatten() {
                Some(v) => {
                    let (p, pitch) = view_addr(&rp.buffers, ptrs, &v, "tile gemm destination")?;
                    ld = pitch / ELEM_BYTES;
                    p.raw()
                }
                None => 0,
            });
        }
        if let (true, Some(kernel)) = (dest_maps_fit(rp, ptrs, g)?, gemms.get(t.stream)) {
            let (c, ldc) = view_addr(&rp.buffers, ptrs, &g.c, "tile gemm c")?;
            maps.push((
                i,
                kernel.dest_map_bytes(&DestLayout {
                    table: &table,
                    ld,
                    rows_per_block: g.block_rows as u32,
                    m: g.a.rows,
                    n: g.b.cols,
                    c: TypedPtr::<Bf16>::new(c.raw()),
                    ldc: ldc / ELEM_BYTES,
                })?,
            ));
        }
        words.push((i, table));
    }
    let mut out = TableBytes {
        bytes: vec![],
        dest: vec![None; n],
        maps: vec![None; n],
    };
    for (i, m) in maps {
        out.maps[i] = Some(out.bytes.len());
        out.bytes.extend_from_slice(&m);
        out.bytes
            .resize(out.bytes.len().next_multiple_of(MAP_BYTES), 0);
    }
    for (i, table) in words {
        out.dest[i] = Some(out.bytes.len());
        out.bytes.extend(table.iter().flat_map(|w| w.to_le_bytes()));
    }
    Ok(out)
}

/// The plan buffers `rp`'s destination tables name (a destination view's,
/// and C's where the blocks' maps may cover it): the addresses a set of
/// tables is built for.
pub(crate) fn table_buffers(rp: &RankPlan) -> Vec<usize> {
    let mut bufs: Vec<usize> = rp
        .tasks
        .iter()
        .filter_map(|t| match &t.kind {
            TaskKind::TileGemm(g) if g.dest.iter().any(Option::is_some) => Some(g),
            _ => None,
        })
        .flat_map(|g| g.dest.iter().flatten().map(|v| v.buf).chain([g.c.buf]))
        .collect();
    bufs.sort_unstable();
    bufs.dedup();
    bufs
}

/// Whether tile GEMM `g`'s destination blocks go out through tensor maps
/// ([`HopperGemm::dest_maps`], the kernel's TMA-store epilogue) rather than
/// 16-byte thread stores: a destination table without add, blocks of whole
/// 64-row halves, and C and every destination 16-byte aligned with rows a
/// multiple of 16 bytes apart. Tuning and running both ask, so the tuned
/// schedule is the one for the launch that runs.
pub(crate) fn dest_maps_fit(rp: &RankPlan, ptrs: &[DevicePtr], g: &TileGemm) -> Result<bool> {
    if g.dest_add
        || g.block_rows == 0
        || g.block_rows % 64 != 0
        || u32::try_from(g.block_rows).is_err()
        || g.dest.iter().all(Option::is_none)
    {
        return Ok(false);
    }
    let fits = |(p, pitch): (DevicePtr, usize)| p.is_aligned(16) && pitch % 16 == 0;
    if !fits(view_addr(&rp.buffers, ptrs, &g.c, "tile gemm c")?) {
        return Ok(false);
    }
    for v in g.dest.iter().flatten() {
        if !fits(view_addr(&rp.buffers, ptrs, v, "tile gemm destination")?) {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ficco_core::plan::lower::lower;
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::Schedule;

    fn plan(s: &str) -> ficco_core::plan::Plan {
        let p = Problem::new(Op::GemmRs, 1024, 256, 384, 2).expect("problem");
        lower(&p, &s.parse::<Schedule>().expect("schedule")).expect("lower")
    }

    fn ptrs(rp: &RankPlan) -> Vec<DevicePtr> {
        (0..rp.buffers.len())
            .map(|b| DevicePtr(0x1000_0000 + 0x100_0000 * b as u64))
            .collect()
    }

    /// `-acc`: the own block's rows go to the output, the peer's block to C
    /// (0 in the table); the tables name only the output and C, so calls
    /// with other inputs reuse them.
    #[test]
    fn acc_tables_name_the_own_blocks_output_rows() {
        let pl = plan("tile-copy-ring-acc");
        for (r, rp) in pl.ranks.iter().enumerate() {
            let at = ptrs(rp);
            let tb = tile_table_bytes(&[], rp, &at).expect("bytes");
            let (i, g) = rp
                .tasks
                .iter()
                .enumerate()
                .find_map(|(i, t)| match &t.kind {
                    TaskKind::TileGemm(g) => Some((i, g)),
                    _ => None,
                })
                .expect("a tile gemm");
            let tables = tb.at(DevicePtr(0x7000_0000));
            let off = tb.dest[i].expect("a table");
            assert_eq!(tables.dest[i], Some(DevicePtr(0x7000_0000 + off as u64)));
            assert!(
                tables.maps.iter().all(Option::is_none),
                "accumulating: no maps"
            );
            let words: Vec<u64> = tb.bytes[off..]
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            assert_eq!(words.len(), g.blocks());
            for (b, w) in words.iter().enumerate() {
                match g.dest[b] {
                    Some(v) => {
                        let (p, _) = view_addr(&rp.buffers, &at, &v, "dest").expect("view");
                        assert_eq!(*w, p.raw(), "rank {r} block {b}");
                    }
                    None => assert_eq!(*w, 0, "rank {r} block {b}"),
                }
            }
            let out = rp
                .buffer_with(ficco_core::plan::BufferRole::Output)
                .expect("output");
            let mut want = vec![out, g.c.buf];
            want.sort_unstable();
            want.dedup();
            assert_eq!(table_buffers(rp), want);
        }
        // Without `-acc`: nothing to build, nothing to key on.
        let plain = plan("tile-copy-ring");
        for rp in &plain.ranks {
            assert!(tile_table_bytes(&[], rp, &ptrs(rp))
                .expect("bytes")
                .is_empty());
            assert!(table_buffers(rp).is_empty());
        }
    }
}
