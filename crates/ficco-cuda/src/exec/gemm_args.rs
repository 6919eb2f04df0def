//! From plan GEMM tasks to the launch arguments of ficco's own kernels:
//! plain GEMMs ([`own_gemm_args`]), grouped GEMMs ([`own_grouped_args`],
//! and the route between the grouped kernel and a cuBLASLt loop,
//! [`GroupedRoute`]) and tile GEMMs with their flag, counter and destination
//! hooks ([`tile_gemm_args`]). Pure argument building on device addresses:
//! the rank prepares launches with it, the issue path launches them.

use crate::error::{CudaError, Result};
use crate::hgemm::grouped::{grouped_supported, Group, GroupedArgs};
use crate::hgemm::{
    DestHook, GemmArgs, Hooks, Occupancy, SignalHook, TypedPtr, WaitHook, BLOCK_M, GROUP_M,
};
use crate::mem::DevicePtr;
use crate::signal::SET;
use ficco_core::plan::TileGemm;
use ficco_core::problem::workload::ELEM_BYTES;

/// The launch of ficco's own GEMM for (m, n, k) on views given as (address,
/// pitch in bytes) of A, B and C: the SM budget is the task's SM limit
/// (`-smN`, or the green context's SMs), the stages its `-occS`.
pub(crate) fn own_gemm_args(
    (m, n, k): (usize, usize, usize),
    [(pa, lda), (pb, ldb), (pc, ldc)]: [(DevicePtr, usize); 3],
    accumulate: bool,
    sm_target: Option<usize>,
    stages: Option<usize>,
) -> Result<GemmArgs> {
    let small = |v: usize, what: &str| {
        u32::try_from(v)
            .map_err(|_| CudaError::Plan(format!("ficco's own GEMM: {what} {v} too large")))
    };
    let mut hooks = Hooks {
        sm_budget: sm_target.map(|s| small(s, "SM budget")).transpose()?,
        ..Hooks::default()
    };
    if let Some(st) = stages {
        hooks.occupancy = Occupancy {
            stages: small(st, "stage count")?,
            extra_smem: 0,
        };
    }
    Ok(GemmArgs {
        m,
        n,
        k,
        a: TypedPtr::new(pa.raw()),
        lda: lda / ELEM_BYTES,
        b: TypedPtr::new(pb.raw()),
        ldb: ldb / ELEM_BYTES,
        c: TypedPtr::new(pc.raw()),
        ldc: ldc / ELEM_BYTES,
        accumulate,
        hooks,
    })
}

/// Non-empty groups from which `auto` takes the grouped kernel: the core's
/// threshold, so the simulator models the route the executor takes.
pub const GROUPED_MIN_GROUPS: usize = ficco_core::sim::cost::GROUPED_KERNEL_MIN_GROUPS;

/// How grouped GEMM tasks run: `FICCO_GROUPED` (`auto`, the default; `own`,
/// ficco's grouped kernel wherever it supports the groups; or `loop`, the
/// cuBLASLt loop always, to compare them in one run).
pub use ficco_core::settings::Grouped as GroupedRoute;

/// Whether a supported task with `non_empty` non-empty groups runs on the
/// grouped kernel under `route`.
pub fn takes_kernel(route: GroupedRoute, non_empty: usize) -> bool {
    match route {
        GroupedRoute::Auto => non_empty >= GROUPED_MIN_GROUPS,
        GroupedRoute::Own => true,
        GroupedRoute::Loop => false,
    }
}

/// One group of a grouped GEMM task: (rows, cols) of A, (rows, cols) of B,
/// and (address, pitch in bytes) of A, B and C.
pub(crate) type GroupViews = ((usize, usize), (usize, usize), [(DevicePtr, usize); 3]);

/// The grouped launch of ficco's kernel for a grouped GEMM's groups given
/// as (rows, cols) of A and B and (address, pitch in bytes) of A, B and C,
/// with the task's SM target as the SM budget; `None` when the groups do
/// not share K and N or the kernel does not support them (alignment,
/// leading dimensions: [`crate::hgemm::grouped::grouped_supported`]).
pub(crate) fn own_grouped_args(
    groups: &[GroupViews],
    sm_target: Option<usize>,
) -> Option<GroupedArgs> {
    let &((_, k), (_, n), _) = groups.first()?;
    let mut out = Vec::with_capacity(groups.len());
    for &((m, gk), (bk, gn), [(pa, lda), (pb, ldb), (pc, ldc)]) in groups {
        if gk != k || bk != k || gn != n {
            return None;
        }
        let pitch = |p: usize| (p % ELEM_BYTES == 0).then_some(p / ELEM_BYTES);
        out.push(Group {
            m,
            a: TypedPtr::new(pa.raw()),
            lda: pitch(lda)?,
            b: TypedPtr::new(pb.raw()),
            ldb: pitch(ldb)?,
            c: TypedPtr::new(pc.raw()),
            ldc: pitch(ldc)?,
        });
    }
    grouped_supported(n, k, &out).ok()?;
    Some(GroupedArgs {
        n,
        k,
        groups: out,
        sm_budget: sm_target.map(|s| u32::try_from(s).unwrap_or(u32::MAX)),
        tile_n: None,
    })
}

/// Device addresses a tile GEMM launch reads its hooks from: the first
/// block's wait flag and signal counter, and (table, pitch in bytes) of the
/// destination table.
pub(crate) struct TileFlags {
    pub wait: Option<DevicePtr>,
    pub signal: Option<DevicePtr>,
    pub dest: Option<(DevicePtr, usize)>,
    /// The destination table's blocks as tensor maps
    /// ([`crate::hgemm::DestHook::maps`]), where [`super::rank::dest_maps_fit`].
    pub dest_maps: Option<DevicePtr>,
}

/// M-blocks per scheduling group of a tile GEMM with blocks of `block_rows`
/// rows: the most, up to the kernel's [`GROUP_M`], that divides a block's
/// M-blocks, so that no group mixes two flag blocks. The kernel walks a
/// group column by column and each CTA takes its units in order, so with
/// mixed groups a CTA could hold a tile of an early block behind one of a
/// late block that spins on its flag; on 2 GPUs with `-acc` the early
/// (peer) blocks feed, through the peer's pushes, the flags that the late
/// (own) blocks of both GEMMs wait on: a cycle. With whole blocks per group
/// every unit of an earlier block comes before every unit of a later one.
pub(crate) fn tile_group_m(block_rows: usize) -> u32 {
    if block_rows % BLOCK_M != 0 {
        return 1;
    }
    let per_block = block_rows / BLOCK_M;
    (1..=GROUP_M as usize)
        .rev()
        .find(|d| per_block % d == 0)
        .unwrap_or(1) as u32
}

/// The launch of ficco's own GEMM for tile GEMM `g` on views given as
/// (address, pitch in bytes) of A, B and C, with at most `sm_cap` CTAs.
/// Block flags and counters are one word per `block_rows` rows; the
/// kernel's M order starts at the first block's first M-block
/// ([`BLOCK_M`] rows).
pub(crate) fn tile_gemm_args(
    g: &TileGemm,
    [(pa, lda), (pb, ldb), (pc, ldc)]: [(DevicePtr, usize); 3],
    flags: TileFlags,
    sm_cap: u32,
) -> Result<GemmArgs> {
    let small = |v: usize, what: &str| {
        u32::try_from(v).map_err(|_| CudaError::Plan(format!("tile GEMM: {what} {v} too large")))
    };
    let rows = small(g.block_rows.max(1), "block rows")?;
    let budget = match g.sm_target {
        Some(t) => small(t, "SM budget")?.min(sm_cap),
        None => sm_cap,
    };
    let hooks = Hooks {
        sm_budget: Some(budget.max(1)),
        group_m: Some(tile_group_m(g.block_rows)),
        m_start_block: small(g.first_block * g.block_rows / BLOCK_M, "first block")?,
        wait: flags.wait.map(|f| WaitHook {
            flags: TypedPtr::new(f.raw()),
            rows_per_flag: rows,
            epoch: SET,
        }),
        signal: flags.signal.map(|f| SignalHook {
            counters: TypedPtr::new(f.raw()),
            rows_per_counter: rows,
        }),
        dest: flags.dest.map(|(t, pitch)| DestHook {
            table: TypedPtr::new(t.raw()),
            ld: pitch / ELEM_BYTES,
            rows_per_block: rows,
            add: g.dest_add,
            maps: flags.dest_maps.map(|m| TypedPtr::new(m.raw())),
        }),
        ..Hooks::default()
    };
    Ok(GemmArgs {
        m: g.a.rows,
        n: g.b.cols,
        k: g.a.cols,
        a: TypedPtr::new(pa.raw()),
        lda: lda / ELEM_BYTES,
        b: TypedPtr::new(pb.raw()),
        ldb: ldb / ELEM_BYTES,
        c: TypedPtr::new(pc.raw()),
        ldc: ldc / ELEM_BYTES,
        accumulate: false,
        hooks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grouped_route_takes_the_kernel_from_its_threshold() {
        assert!(takes_kernel(GroupedRoute::Auto, GROUPED_MIN_GROUPS));
        assert!(!takes_kernel(GroupedRoute::Auto, GROUPED_MIN_GROUPS - 1));
        assert!(takes_kernel(GroupedRoute::Own, 1));
        assert!(!takes_kernel(GroupedRoute::Loop, 128));
    }

    #[test]
    fn own_grouped_args_take_supported_groups_only() {
        let p = DevicePtr;
        // Two experts of K = 256, N = 512 (pitches in bytes), one empty.
        let g = |m: usize, at: u64| {
            (
                (m, 256),
                (256, 512),
                [
                    (p(0x10000 + at), 512),
                    (p(0x20000 + at), 1024),
                    (p(0x30000 + at), 1024),
                ],
            )
        };
        let groups = [g(300, 0), g(0, 0x1000), g(5, 0x2000)];
        let a = own_grouped_args(&groups, Some(66)).expect("supported");
        assert_eq!(
            (a.n, a.k, a.sm_budget, a.tile_n),
            (512, 256, Some(66), None)
        );
        assert_eq!(a.groups.len(), 3);
        assert_eq!(
            a.groups[2],
            Group {
                m: 5,
                a: TypedPtr::new(0x12000),
                lda: 256,
                b: TypedPtr::new(0x22000),
                ldb: 512,
                c: TypedPtr::new(0x32000),
                ldc: 512,
            }
        );
        assert!(own_grouped_args(&[], None).is_none());
        // Different N across groups: the loop.
        let mut other = groups;
        other[1].1 .1 = 256;
        assert!(own_grouped_args(&other, None).is_none());
        // A C row not 16-byte aligned (pitch 1028 bytes): the loop.
        let mut odd = groups;
        odd[2].2[2].1 = 1028;
        assert!(own_grouped_args(&odd, None).is_none());
        // An A view starting 8 bytes off: the loop.
        let mut off = groups;
        off[0].2[0].0 = p(0x10008);
        assert!(own_grouped_args(&off, None).is_none());
    }

    #[test]
    fn own_gemm_args_carry_views_budget_and_stages() {
        let p = DevicePtr;
        // Pitches in bytes: A rows of 1024 bf16, B 512, C 768 (a wider buffer).
        let args = own_gemm_args(
            (64, 512, 256),
            [(p(0x1000), 2048), (p(0x2000), 1024), (p(0x3000), 1536)],
            true,
            Some(116),
            Some(2),
        )
        .unwrap();
        assert_eq!((args.m, args.n, args.k), (64, 512, 256));
        assert_eq!((args.lda, args.ldb, args.ldc), (1024, 512, 768));
        assert_eq!(
            (args.a.addr(), args.b.addr(), args.c.addr()),
            (0x1000, 0x2000, 0x3000)
        );
        assert!(args.accumulate);
        assert_eq!(args.hooks.sm_budget, Some(116));
        assert_eq!(args.hooks.occupancy.stages, 2);
        assert_eq!(args.hooks.occupancy.extra_smem, 0);
        // No limits: the kernel's defaults (every SM, the most stages).
        let plain = own_gemm_args(
            (8, 8, 8),
            [(p(0x1000), 16), (p(0x2000), 16), (p(0x3000), 16)],
            false,
            None,
            None,
        )
        .unwrap();
        assert_eq!(plain.hooks, Hooks::default());
        assert!(own_gemm_args(
            (8, 8, 8),
            [(p(0), 16), (p(0), 16), (p(0), 16)],
            false,
            Some(usize::MAX),
            None
        )
        .is_err());
    }

    /// A tile GEMM's launch: block flags and counters one word per block,
    /// epoch SET, the M order from the first block's first M-block, the SM
    /// budget capped at the device share, destinations at one pitch.
    #[test]
    fn tile_gemm_args_carry_flags_order_budget_and_destinations() {
        use ficco_core::plan::{TileGemm, View};
        let p = DevicePtr;
        let g = TileGemm {
            a: View::whole(0, 2048, 256),
            b: View::whole(1, 256, 512),
            c: View::whole(2, 2048, 512),
            block_rows: 256,
            first_block: 3,
            wait: Some(4),
            signal: Some(0),
            dest: vec![],
            dest_add: true,
            sm_target: Some(100),
        };
        let views = [(p(0x1000), 512), (p(0x2000), 1024), (p(0x3000), 1024)];
        let flags = || TileFlags {
            wait: Some(p(0x40)),
            signal: Some(p(0x80)),
            dest: Some((p(0x9000), 2048)),
            dest_maps: Some(p(0xa000)),
        };
        let args = tile_gemm_args(&g, views, flags(), 66).unwrap();
        assert_eq!((args.m, args.n, args.k), (2048, 512, 256));
        assert_eq!((args.lda, args.ldb, args.ldc), (256, 512, 512));
        assert!(!args.accumulate);
        let h = args.hooks;
        // Block 3 of 256 rows starts at M-block 6 of 128 rows; groups of
        // 2 M-blocks are whole blocks.
        assert_eq!(h.m_start_block, 6);
        assert_eq!(h.group_m, Some(2));
        assert_eq!(h.sm_budget, Some(66));
        let w = h.wait.unwrap();
        assert_eq!((w.flags.addr(), w.rows_per_flag, w.epoch), (0x40, 256, SET));
        let s = h.signal.unwrap();
        assert_eq!((s.counters.addr(), s.rows_per_counter), (0x80, 256));
        let d = h.dest.unwrap();
        assert_eq!(
            (d.table.addr(), d.ld, d.rows_per_block, d.add),
            (0x9000, 1024, 256, true)
        );
        assert_eq!(d.maps.map(|m| m.addr()), Some(0xa000));
        // Under the cap, the task's own budget; without one, the cap.
        let args = tile_gemm_args(&g, views, flags(), 132).unwrap();
        assert_eq!(args.hooks.sm_budget, Some(100));
        let free = TileGemm {
            sm_target: None,
            wait: None,
            signal: None,
            ..g
        };
        let none = TileFlags {
            wait: None,
            signal: None,
            dest: None,
            dest_maps: None,
        };
        let args = tile_gemm_args(&free, views, none, 132).unwrap();
        assert_eq!(args.hooks.sm_budget, Some(132));
        assert_eq!(
            (args.hooks.wait, args.hooks.signal, args.hooks.dest),
            (None, None, None)
        );
    }

    /// Scheduling groups never straddle two flag blocks.
    #[test]
    fn tile_groups_are_whole_blocks() {
        assert_eq!(tile_group_m(128), 1);
        assert_eq!(tile_group_m(512), 4);
        assert_eq!(tile_group_m(2048), 16);
        assert_eq!(tile_group_m(3 * 128), 3);
        assert_eq!(tile_group_m(40 * 128), 10);
        assert_eq!(tile_group_m(4096), 16);
        assert_eq!(tile_group_m(200), 1);
        for rows in (1..=64).map(|b| b * 128) {
            let g = tile_group_m(rows) as usize;
            assert!(g >= 1 && g <= GROUP_M as usize && (rows / 128) % g == 0);
        }
    }
}
