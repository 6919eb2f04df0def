// ficco's Hopper (sm_90a) bf16 GEMM, compiled at run time by NVRTC.
// No CUDA headers: inline PTX and minimal typedefs only. See mod.rs for the
// design, the layouts and the hook semantics.
//
// C[M,N] (row-major, ldc) = A[M,K] (row-major, lda) * B[K,N] (row-major, ldb)
// (+ C when accumulating), f32 accumulation, bf16 out.
// Tile 128 x BN x 64 (BN = 256 or 128: two entry points); warpgroup 0
// produces (TMA), warpgroups 1 and 2 each compute 64 rows of the tile with
// wgmma m64nBNk16; in `ficco_hgemm_n128_pp` (ping-pong) each of them computes
// whole 128 x 128 tiles, the two taking tiles in turn. The `_c2` entries run
// in clusters of 2 CTAs that share B by TMA multicast. The `_grouped` entries
// run many GEMMs of one K and N (MoE experts) in one persistent launch
// (GroupTable). With the signal hook on whole cooperative tiles, threads 32
// and 64 of warpgroup 0 are the consumers' signal threads.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define BM 128
#define BK 64
#define STAGE_A (BM * BK * 2)

// A CUtensorMap: 128 opaque bytes, 128-byte aligned (CUDA 13).
struct __align__(128) TMap {
  u64 v[16];
};

// Launch parameters; mirrored by `KernelParams` in hgemm.rs (repr(C)).
struct Params {
  u64 c;             // output base (bf16)
  u64 ldc;           // elements
  u64 wait_flags;    // u32 per flag block, 0 = no wait hook
  u64 sig_counters;  // u32 per signal block, 0 = no signal hook
  u64 dest_table;    // u64 pointer per dest block (0 entry = C), 0 = no dest hook
  u64 dest_ld;       // elements
  u64 ws;            // split-K partials: f32, 64 KiB per (tile, half, split)
  u64 ws_tickets;    // u32 per (tile, half), zero between launches
  u64 dest_maps;     // TMap per dest block (TMA-store epilogue of the dest hook), 0 = none
  u32 m, n, k;
  u32 tiles_m, tiles_n;
  u32 stages;
  u32 tile_start;    // first M-block of the rotated M order
  u32 group_m;       // M-blocks per scheduling group (L2 reuse)
  u32 accumulate;    // C += A*B
  u32 wait_rows, wait_epoch;
  u32 sig_rows;
  u32 dest_rows;
  u32 dest_add;
  u32 splits;        // K splits per tile (1: none)
  u32 tma_store;     // epilogue through shared memory: 1 TMA stores (plain C),
                     // 2 16-byte thread stores (destination hook, no add),
                     // 3 TMA stores through each dest block's map (dest_maps)
  u32 sig_delay;     // k-blocks of the next unit issued before a deferred signal
  u32 dp_tiles;      // tiles 0..dp_tiles run unsplit, the rest split `splits` ways
};

// Grouped mode: one entry per group in global memory; mirrored by
// `GroupTableParams` in grouped.rs (repr(C)).
struct GroupTable {
  u64 maps;    // groups x 3 TMaps (A, B, C of each group), 128-byte aligned
  u64 first;   // groups + 1 u32: each group's first global tile, then the total
  u32 groups;
  u32 pad;
};

static __device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 r;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
               : "=r"(r) : "l"(p));
  return r;
}

static __device__ __forceinline__ u32 thread_x() {
  u32 r;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(r));
  return r;
}

static __device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

static __device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

static __device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

static __device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra.uni WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// 2-D TMA tile load completing on `bar`; c0 is the inner (contiguous) coordinate.
static __device__ __forceinline__ void tma_load_2d(u32 dst, const TMap* map, u32 bar, int c0,
                                                   int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"((u64)map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// The same load multicast to the CTAs of `mask` in the cluster: the box
// lands at offset `dst` of each one's shared memory and completes bytes on
// the mbarrier at offset `bar` of each.
static __device__ __forceinline__ void tma_load_2d_mc(u32 dst, const TMap* map, u32 bar, int c0,
                                                      int c1, u16 mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
      "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}

// Arrives on the mbarrier at offset `bar` of cluster CTA `cta`'s shared
// memory. Default (CTA-scope) semantics, as CUTLASS's cluster barriers: the
// arrival only says that this CTA's wgmma finished reading a stage (their
// wait returned), so there is nothing to publish; `.release.cluster` would
// put a GPU-wide MEMBAR before every arrival, on the consumers' critical path.
static __device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 cta) {
  asm volatile(
      "{ .reg .b32 ra;\n"
      "mapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n"
      "}" ::"r"(bar),
      "r"(cta)
      : "memory");
}

static __device__ __forceinline__ u32 cluster_ctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of the cluster (all of both CTAs) meets here.
static __device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// 2-D TMA tile store from shared memory (bulk group of the issuing thread).
static __device__ __forceinline__ void tma_store_2d(const TMap* map, u32 src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
          (u64)map),
      "r"(src), "r"(c0), "r"(c1)
      : "memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle.
static __device__ __forceinline__ u64 desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) |
         (1ull << 62);
}

static __device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
static __device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// Keeps the compiler from moving accumulator reads or writes across wgmma
// fences and waits (the asm operands alone do not express the async hazard).
template <int N>
static __device__ __forceinline__ void fence_acc(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
static __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// m64nNk16 wgmma: A K-major, B MN-major (trans-b = 1), both from
// shared-memory descriptors; d += A * B in f32.
static __device__ __forceinline__ void wgmma_256(float* d, u64 da, u64 db) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, 1, 1, 1, 0, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db));
}
static __device__ __forceinline__ void wgmma_128(float* d, u64 da, u64 db) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, 1, 1, 1, 0, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db));
}

// m64n64k16 (the 64 x 128 tile's warpgroups, 64 columns each).
static __device__ __forceinline__ void wgmma_64(float* d, u64 da, u64 db) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, 1, 1, 1, 0, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db));
}

static __device__ __forceinline__ u32 ld_acquire_sys(u64 p) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Hook 4: loads each flag f0..f1 not yet seen ready (acquire, system scope:
// a copy engine's stream, the host or a peer sets it) and remembers flags
// 0..63 found at the epoch in `ready`. With `spin`, waits until every flag
// reached it (returns true); without, polls each once and says whether all
// had.
static __device__ __forceinline__ bool poll_flags(const Params& p, u32 f0, u32 f1, u64& ready,
                                                  bool spin) {
  for (u32 f = f0; f <= f1; ++f) {
    if (f < 64 && ((ready >> f) & 1)) continue;
    while ((int)(ld_acquire_sys(p.wait_flags + 4ull * f) - p.wait_epoch) < 0) {
      if (!spin) return false;
      __nanosleep(128);
    }
    if (f < 64) ready |= 1ull << f;
  }
  return true;
}

// A destination-table entry: written before the launch, read-only during
// it, so the loads of a thread's rows can all be in flight at once (a
// volatile load would order each after the previous one).
static __device__ __forceinline__ u64 ld_table(u64 p) {
  u64 v;
  asm("ld.global.nc.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}

static __device__ __forceinline__ void named_sync(u32 id, u32 count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

static __device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

static __device__ __forceinline__ float bf16_lo(u32 v) { return __uint_as_float(v << 16); }
static __device__ __forceinline__ float bf16_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }

// Walks `rows` row blocks of `tiles_n` N-blocks in groups of `gm` row
// blocks, each group column by column (L2 reuse of B): tile t -> (row block
// ml, N-block nb).
static __device__ __forceinline__ void group_walk(u32 t, u32 rows, u32 gm, u32 tiles_n, u32& ml,
                                                  u32& nb) {
  const u32 per_group = gm * tiles_n;
  const u32 g = t / per_group;
  const u32 first = g * gm;
  u32 gs = rows - first;
  if (gs > gm) gs = gm;
  const u32 r = t - g * per_group;
  ml = first + r % gs;
  nb = r / gs;
}

// Tile t of the persistent schedule -> (M-block, N-block): group_walk over
// groups of `group_m` M-blocks, the M order rotated to start at `tile_start`.
static __device__ __forceinline__ void tile_coords(const Params& p, u32 t, u32& mb, u32& nb) {
  u32 ml;
  group_walk(t, p.tiles_m, p.group_m, p.tiles_n, ml, nb);
  mb = ml + p.tile_start;
  if (mb >= p.tiles_m) mb -= p.tiles_m;
}

// Clusters of 2 (CL): unit t is a pair of M-blocks (2 q, 2 q + 1) of one
// N-block, walked as tile_coords walks M-blocks (groups of group_m / 2
// pairs), and cluster CTA `crank` takes M-block 2 q + crank, rotated like
// tile_coords. With an odd number of M-blocks the last pair's second has
// no rows: mb = tiles_m, whose loads read zeros (TMA fills out-of-bounds
// boxes) and whose epilogue and hooks skip every row (all >= M).
static __device__ __forceinline__ void pair_coords(const Params& p, u32 t, u32 crank, u32& mb,
                                                   u32& nb) {
  u32 q;
  group_walk(t, (p.tiles_m + 1) / 2, p.group_m / 2 > 0 ? p.group_m / 2 : 1, p.tiles_n, q, nb);
  const u32 ml = 2 * q + crank;
  if (ml >= p.tiles_m) {
    mb = p.tiles_m;
    return;
  }
  mb = ml + p.tile_start;
  if (mb >= p.tiles_m) mb -= p.tiles_m;
}

// Loads k-block kb of B (BK x BN at column n0) into stage B at `sb`,
// completing on `fb`. In a cluster of 2 (CL) each CTA loads half of the
// 64-column boxes and multicasts them to both: the pair shares its N-block.
template <int BN, bool CL>
static __device__ __forceinline__ void load_b(u32 sb, const TMap* bm, u32 fb, u32 n0, u32 kb,
                                              u32 crank) {
  if constexpr (CL) {
    constexpr u32 HALF = BN / 128;  // boxes per CTA
#pragma unroll
    for (u32 j = 0; j < HALF; ++j) {
      const u32 jj = crank * HALF + j;
      tma_load_2d_mc(sb + jj * (64 * BK * 2), bm, fb, (int)(n0 + 64 * jj), (int)(kb * BK),
                     (u16)3);
    }
  } else {
#pragma unroll
    for (u32 j = 0; j < BN / 64; ++j) {
      tma_load_2d(sb + j * (64 * BK * 2), bm, fb, (int)(n0 + 64 * j), (int)(kb * BK));
    }
  }
}

// Grouped mode: global tile t -> (group g, M-block, N-block of that group).
// `g` carries over between a thread's calls: its tiles only increase, so
// the scan over the prefix sums only moves forward (an empty group has no
// tiles: first[g + 1] == first[g] skips it). Within a group, tiles go as in
// tile_coords (groups of `group_m` M-blocks column by column, no rotation).
static __device__ __forceinline__ void group_tile(const GroupTable& gt, const Params& p, u32 t,
                                                  u32& g, u32& mb, u32& nb) {
  const u32* first = (const u32*)gt.first;
  while (t >= first[g + 1]) ++g;
  const u32 t0 = first[g];
  group_walk(t - t0, (first[g + 1] - t0) / p.tiles_n, p.group_m, p.tiles_n, mb, nb);
}

// Grouped mode: the tensor maps live in global memory, written by the host
// before the launch; a thread orders them before its first TMA use of them
// (the tensormap proxy acquires them, system scope for a host write). The
// empty bulk group after it keeps ptxas from dropping the fence (Triton
// emits the same pair); it waits only for this thread's earlier bulk
// stores to have read shared memory.
static __device__ __forceinline__ void tmap_acquire(const TMap* map) {
  asm volatile(
      "fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n"
      "cp.async.bulk.commit_group;\n"
      "cp.async.bulk.wait_group.read 0;" ::"l"((u64)map)
      : "memory");
}

// Hook 5: adds the weight of each of the `halves` 64-row half tiles from
// row `rlo` on (columns `c0` .. `c0 + width - 1`; their stores done by the
// whole warpgroup before a named barrier, or by this thread) to the counter
// of every signal block it overlaps, each add a system-scope release of
// those stores. The weight is the half tile's 64-column groups inside N, so
// a block's counter advances by (its 64-row groups) x ceil(N / 64) per
// launch whatever the tile (`signal_advance` in mod.rs), and the waiter
// waits for that. A last-arrival ticket would give a single increment per
// block instead, but its GPU-scope atomic round trip sits on the kernel's
// tail: about 1% of a one-wave launch on an H200 (gemm-bench, 2026-11-25).
// Every add is ordered after every earlier add's release (they are RMWs of
// one word), so a waiter that reads the final value has seen them all.
// Release only, no acquire: an acquire invalidates the SM's L1, which the
// other warpgroup may be using (prep_dest).
static __device__ __forceinline__ void signal_body(const Params& p, u32 rlo, u32 halves, u32 c0,
                                                   u32 width) {
  if (p.tma_store & 1) {
    // This thread issued the half tile's TMA stores (modes 1 and 3): wait
    // until they are performed, then order them (async proxy) before the
    // release below.
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
  }
  const u32 w = ((p.n - c0 < width ? p.n - c0 : width) + 63) / 64;
  for (u32 h = 0; h < halves; ++h, rlo += 64) {
    if (rlo >= p.m) break;
    const u32 rhi = (rlo + 64 < p.m ? rlo + 64 : p.m) - 1;
    for (u32 b = rlo / p.sig_rows; b <= rhi / p.sig_rows; ++b) {
      asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p.sig_counters + 4ull * b), "r"(w)
                   : "memory");
    }
  }
}

// signal_body out of line, for the consumer warpgroups (232 registers).
// The signal threads (producer warpgroup, 40 registers) inline it: one
// out-of-line body cannot serve both register budgets.
static __device__ __noinline__ void signal_half(const Params& p, u32 rlo, u32 halves, u32 c0,
                                                u32 width) {
  signal_body(p, rlo, halves, c0, width);
}

// Epilogue mode 2: the warpgroup's 64 x BN bf16 half tile, staged in shared
// memory as 128-byte-swizzled 64 x 64 boxes, goes to global memory in
// 16-byte chunks, a warp writing 4 full 128-byte row segments per store
// (the register epilogue writes 4-byte pieces of 8 rows). Rows may be
// redirected by the destination hook (overwrite only: an add would round
// twice); a row whose address is not 16-byte aligned is stored 4 bytes at a time.
template <int BN>
static __device__ __forceinline__ void staged_store(const Params& p, u32 wst, u32 rbase, u32 n0,
                                                    u32 lt) {
  const u32 j = lt & 7;  // 16-byte chunk of a 128-byte box row
  u64 rowp[4];
  bool rok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const u32 row = rbase + lt / 8 + 16 * i;
    rok[i] = row < p.m;
    rowp[i] = p.c + 2ull * ((u64)row * p.ldc);
    if (p.dest_table != 0 && rok[i]) {
      const u32 b = row / p.dest_rows;
      const u64 dp = ld_table(p.dest_table + 8ull * b);
      if (dp != 0) rowp[i] = dp + 2ull * ((u64)(row - b * p.dest_rows) * p.dest_ld);
    }
  }
#pragma unroll
  for (int b = 0; b < BN / 64; ++b) {
    const u32 col = n0 + 64 * b + 8 * j;  // N is a multiple of 8: a chunk is all in or all out
    if (col >= p.n) continue;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (!rok[i]) continue;
      const u32 r = lt / 8 + 16 * i;
      const u32 sa = wst + (u32)b * 8192u + r * 128u + ((j ^ (r & 7u)) << 4);
      u32 x0, x1, x2, x3;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3)
                   : "r"(sa)
                   : "memory");
      const u64 addr = rowp[i] + 2ull * col;
      if ((addr & 15ull) == 0) {
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(addr), "r"(x0), "r"(x1),
                     "r"(x2), "r"(x3)
                     : "memory");
      } else {
        asm volatile("st.global.b32 [%0], %1;" ::"l"(addr), "r"(x0) : "memory");
        asm volatile("st.global.b32 [%0], %1;" ::"l"(addr + 4), "r"(x1) : "memory");
        asm volatile("st.global.b32 [%0], %1;" ::"l"(addr + 8), "r"(x2) : "memory");
        asm volatile("st.global.b32 [%0], %1;" ::"l"(addr + 12), "r"(x3) : "memory");
      }
    }
  }
}

// Mode 3: the thread that stores rows from `row` acquires their block's
// tensor map (written by the host: the tensormap proxy must acquire it)
// before its first use; `acquired` remembers blocks 0-63, so that a thread
// fences each map once per launch, not once per tile.
static __device__ __forceinline__ void acquire_map(const Params& p, u32 row, u64& acquired) {
  const u32 b = row / p.dest_rows;
  if (b < 64 && ((acquired >> b) & 1)) return;
  const TMap* map = (const TMap*)p.dest_maps + b;
  tmap_acquire(map);
  // Into the descriptor cache ahead of the stores (acquired ahead of them too).
  asm volatile("prefetch.tensormap [%0];" ::"l"((u64)map) : "memory");
  if (b < 64) acquired |= 1ull << b;
}

// Hook 6, ahead of the epilogue (called halfway through a unit's main
// loop, while the wgmma of earlier k-blocks run): in mode 3 the thread that
// will store the `HALVES` half tiles from row `rbase` (lt 0) acquires their
// blocks' tensor maps (earlier stores have long read their staging by
// then); in mode 2 each thread pulls the table entries of its rows into
// L1, so that the epilogue does not wait on them.
template <int HALVES>
static __device__ __forceinline__ void prep_dest(const Params& p, u32 rbase, u32 lt,
                                                 u64& acquired) {
  if (p.tma_store == 3) {
    if (lt != 0) return;
#pragma unroll
    for (int hf = 0; hf < HALVES; ++hf) {
      const u32 row = rbase + 64u * hf;
      if (row < p.m) acquire_map(p, row, acquired);
    }
  } else if (p.tma_store == 2) {
#pragma unroll
    for (int hf = 0; hf < HALVES; ++hf) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const u32 row = rbase + 64u * hf + lt / 8 + 16 * i;
        if (row < p.m) {
          u64 v;
          asm volatile("ld.global.nc.u64 %0, [%1];"
                       : "=l"(v)
                       : "l"(p.dest_table + 8ull * (row / p.dest_rows)));
        }
      }
    }
  }
}

// Issues the TMA stores of `HALVES` staged 64-row halves (staging `wst`,
// rows from `rbase`, columns from `cbase0`) and commits them as one bulk
// group of the calling thread. Mode 1: C's map at the tile's rows. Mode 3:
// the destination block's map at the rows within the block (a 64-row half
// lies in one block: the host requires dest_rows % 64 == 0), acquired by
// this thread beforehand (prep_dest, or the signal thread itself).
template <int WN, int HALVES>
static __device__ __forceinline__ void tma_store_halves(const Params& p, const TMap* cm, u32 wst,
                                                        u32 rbase, u32 cbase0) {
  constexpr u32 HALF_BYTES = 64u * WN * 2u;
  const TMap* hm[HALVES];
  int hy[HALVES];
#pragma unroll
  for (int hf = 0; hf < HALVES; ++hf) {
    const u32 row = rbase + 64u * hf;
    hm[hf] = cm;
    hy[hf] = (int)row;
    if (p.tma_store == 3 && row < p.m) {
      const u32 b = row / p.dest_rows;
      hm[hf] = (const TMap*)p.dest_maps + b;
      hy[hf] = (int)(row - b * p.dest_rows);
    }
  }
#pragma unroll
  for (int hf = 0; hf < HALVES; ++hf) {
    // (Grouped mode has no p.m: the tensor map clips rows past M.)
    if (p.tma_store == 3 && rbase + 64u * hf >= p.m) continue;
#pragma unroll
    for (int b = 0; b < WN / 64; ++b) {
      tma_store_2d(hm[hf], wst + (u32)hf * HALF_BYTES + (u32)b * 8192u, (int)(cbase0 + 64 * b),
                   hy[hf]);
    }
  }
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// The epilogue of `HALVES` 64-row halves of one warpgroup's accumulators:
// half h is rows rbase + 64 h (accumulators d + h WN / 2, staging
// wst + h 64 WN 2 bytes), columns cbase0 ... cbase0 + WN - 1. Mode
// p.tma_store: 1 TMA stores, 2 staged 16-byte thread stores, 0 registers.
// `free_bar` != 0 (the signal thread's handoff): the staging buffer is free
// once that mbarrier completes phase `free_parity` (skipped when
// free_parity > 1: the first tile), and in modes 1 and 3 the TMA stores are
// left to the signal thread (the caller hands the tile over).
template <int WN, int HALVES>
static __device__ __forceinline__ void epilogue(const Params& p, const TMap* cm, float* d,
                                                u32 wst, u32 rbase, u32 cbase0, u32 lt, u32 cw,
                                                u32 free_bar = 0, u32 free_parity = 2) {
  constexpr u32 HALF_BYTES = 64u * WN * 2u;
  const u32 warp = lt / 32, lane = lt & 31;
  if (p.tma_store) {
    // Through shared memory: the outputs are written as bf16 into
    // 128-byte-swizzled 64 x 64 boxes (no bank conflicts), then one thread
    // stores them with TMA (rows >= M and columns >= N are clipped by the
    // tensor map) and moves on; the stores drain while the next tile's main
    // loop runs.
    if (free_bar != 0) {
      if (free_parity < 2) mbar_wait(free_bar, free_parity);
    } else if (lt == 0 && (p.tma_store & 1)) {
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
    named_sync(1 + cw, 128);
#pragma unroll
    for (int hf = 0; hf < HALVES; ++hf) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 rr = warp * 16 + lane / 4 + 8 * h;  // row in the half tile
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) {
          const u32 addr = wst + (u32)hf * HALF_BYTES + (u32)(j / 8) * 8192u + rr * 128u +
                           ((((u32)j & 7u) ^ (rr & 7u)) << 4) + 4u * (lane & 3);
          const float* dh = d + hf * (WN / 2);
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr),
                       "r"(pack_bf16x2(dh[4 * j + 2 * h], dh[4 * j + 2 * h + 1]))
                       : "memory");
        }
      }
    }
    if (p.tma_store != 2) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      named_sync(1 + cw, 128);
      if (lt == 0 && free_bar == 0) tma_store_halves<WN, HALVES>(p, cm, wst, rbase, cbase0);
    } else {
      // The next tile's staging writes wait at the barrier above until
      // every thread of this warpgroup has read this tile back.
      named_sync(1 + cw, 128);
#pragma unroll
      for (int hf = 0; hf < HALVES; ++hf) {
        staged_store<WN>(p, wst + (u32)hf * HALF_BYTES, rbase + 64u * hf, cbase0, lt);
      }
    }
    return;
  }
  // Registers -> global, bf16x2 per store, bounds-checked.
#pragma unroll
  for (int hf = 0; hf < HALVES; ++hf) {
    const float* dh = d + hf * (WN / 2);
    const u32 r0 = rbase + 64u * hf + warp * 16 + lane / 4;
    const u32 cbase = cbase0 + 2 * (lane & 3);
    u64 rowp[2];
    u32 radd[2];
    bool rok[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32 row = r0 + 8 * h;
      rok[h] = row < p.m;
      rowp[h] = p.c + 2ull * ((u64)row * p.ldc);
      radd[h] = p.accumulate;
      if (p.dest_table != 0 && rok[h]) {
        // Hook 6: this row's block may be stored through another pointer.
        const u32 b = row / p.dest_rows;
        const u64 dp = ld_table(p.dest_table + 8ull * b);
        if (dp != 0) {
          rowp[h] = dp + 2ull * ((u64)(row - b * p.dest_rows) * p.dest_ld);
          radd[h] = p.dest_add;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < WN / 8; ++j) {
      const u32 col = cbase + 8 * j;
      if (col < p.n) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (rok[h]) {
            const u64 addr = rowp[h] + 2ull * col;
            float lo = dh[4 * j + 2 * h], hi = dh[4 * j + 2 * h + 1];
            if (radd[h]) {
              u32 old;
              asm volatile("ld.global.b32 %0, [%1];" : "=r"(old) : "l"(addr) : "memory");
              lo += bf16_lo(old);
              hi += bf16_hi(old);
            }
            asm volatile("st.global.b32 [%0], %1;" ::"l"(addr), "r"(pack_bf16x2(lo, hi))
                         : "memory");
          }
        }
      }
    }
  }
}

extern __shared__ __align__(1024) unsigned char smem_raw[];

// Work unit u -> (tile t, split sp of ns, k-blocks kb0..kb1). The first
// `dp_tiles` units are whole tiles (full waves); each later tile is split
// `splits` ways (the last, partial wave). dp_tiles = 0: every tile split.
static __device__ __forceinline__ void unit_of(const Params& p, u32 u, u32 nk, u32& t, u32& sp,
                                               u32& ns, u32& kb0, u32& kb1) {
  if (u < p.dp_tiles) {
    t = u;
    sp = 0;
    ns = 1;
  } else {
    const u32 r = u - p.dp_tiles;
    const u32 q = r / p.splits;
    t = p.dp_tiles + q;
    sp = r - q * p.splits;
    ns = p.splits;
  }
  kb0 = sp * nk / ns;
  kb1 = (sp + 1) * nk / ns;
}

// The next slot of the stage ring (the phase flips at each wrap).
static __device__ __forceinline__ void next_stage(u32& stage, u32& phase, u32 stages) {
  if (++stage == stages) {
    stage = 0;
    phase ^= 1;
  }
}

// A consumer is done reading a stage: arrive on its empty barrier, and in a
// cluster (CL) on the peer CTA's too (its multicasts fill this stage here).
template <bool CL>
static __device__ __forceinline__ void release_stage(u32 bar, u32 crank) {
  mbar_arrive(bar);
  if constexpr (CL) mbar_arrive_cluster(bar, crank ^ 1u);
}

// M64: 64-row tiles (for small M); the two consumer warpgroups split the
// tile's BN columns instead of its rows (each 64 x BN/2). Hooks that assume
// 128-row blocks are off in this mode (checked by the host).
// GROUPED: the tiles of every group of `gt` (p.tiles_m is the groups' total
// M-blocks); each tile's maps come from the table instead of amap, bmap and
// cmap (unused). The host allows only the TMA-store epilogue, no hooks and
// no K split.
// PP: ping-pong. Each consumer warpgroup computes whole 128 x BN tiles (two
// wgmma of 64 rows per k16 step), the two taking the CTA's tiles in turn:
// while one runs its main loop, the other runs its epilogue, so the tensor
// cores idle only while the producer is behind. Each stage is consumed by one
// warpgroup; a turn barrier per warpgroup orders their main loops (tile i+1's
// may start once tile i's last k-block is issued), which also keeps every
// parity wait at most one phase ahead of its barrier. The host allows every
// hook but no K split.
// CL: clusters of 2 CTAs along M (compile-time cluster dims, so the grid is
// even). The two take the two M-blocks of a pair of tiles of one N-block
// (pair_coords) and share its B: each loads half of every B stage and
// multicasts it to both (load_b). A stage is refilled only once both CTAs'
// consumers have released it, so each consumer arrives on its own CTA's
// empty barrier and on the peer's (their counts double). Every CTA of a
// cluster walks the same units, so their rings stay in step. No K split
// and no wait hook (the host refuses both): a CTA whose rows are ready could
// otherwise stall behind its peer's flag.
template <int BN, bool M64, bool GROUPED = false, bool PP = false, bool CL = false>
static __device__ __forceinline__ void hgemm_body(const TMap& amap, const TMap& bmap,
                                                  const TMap& cmap, const Params& p,
                                                  const GroupTable* gt = nullptr) {
  constexpr u32 TBM = M64 ? 64u : (u32)BM;  // rows per tile
  constexpr int WN = M64 ? BN / 2 : BN;       // columns per consumer warpgroup
  constexpr u32 STAGE_AT = TBM * BK * 2;
  constexpr u32 STAGE_B = BK * BN * 2;
  constexpr u32 STAGE_BYTES = STAGE_AT + STAGE_B;
  constexpr int NACC = WN / 2;           // accumulators per thread
  constexpr u64 SLOT = 64ull * BN * 4;   // split-K partial of one half tile
  const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  // Epilogue staging (through shared memory): each consumer warpgroup's
  // rows (64, 128 in ping-pong) x BN.
  constexpr u32 STG_WG = (PP ? 128u : 64u) * BN * 2u;
  const u32 stg = base + p.stages * STAGE_BYTES;
  const u32 full = stg + (p.tma_store ? 2u * STG_WG : 0u);  // stages x u64
  const u32 empty = full + 8 * p.stages;           // stages x u64
  const u32 tid = thread_x();
  const u32 wg = tid / 128;
  const u32 tiles = (CL ? (p.tiles_m + 1) / 2 : p.tiles_m) * p.tiles_n;
  const u32 units = p.dp_tiles + (tiles - p.dp_tiles) * p.splits;
  // A cluster walks units as one CTA would: the first is its index, the
  // step the number of clusters.
  const u32 crank = CL ? cluster_ctarank() : 0u;
  const u32 ufirst = CL ? blockIdx.x / 2 : blockIdx.x;
  const u32 ustep = CL ? gridDim.x / 2 : gridDim.x;
  const u32 flag_slot = empty + 8 * p.stages;      // 2 x u32: split-K "last" flags
  const u32 turn = flag_slot + 8;                  // ping-pong: 2 x u64, one per consumer
  // Signal threads (below): per consumer warpgroup a "staged" and a "free"
  // mbarrier (4 x u64), then its handed-over tile's first row and column.
  const u32 sigbar = turn + 16;
  const u32 sigslot = sigbar + 32;
  // The signal hook on whole cooperative tiles: each consumer warpgroup
  // hands its stored (or, in the TMA modes, staged) half tile to a thread of
  // the producer warpgroup (thread 32 + 32 cw), which issues the TMA stores,
  // waits for them and sends the signal, so that neither the wait nor the
  // fences and atomics of the signal stall the warpgroup's wgmma. (With a K
  // split only the last split stores a tile, which the signal thread cannot
  // know ahead: the warpgroup signals itself, deferred.)
  const bool sig_thread = !PP && !GROUPED && p.sig_counters != 0 && p.splits == 1;
  const u32 nk = (p.k + BK - 1) / BK;

  if (tid == 0) {
    for (u32 s = 0; s < p.stages; ++s) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, (PP ? 1 : 2) * (CL ? 2 : 1));
    }
    if (PP) {
      mbar_init(turn, 1);
      mbar_init(turn + 8, 1);
    }
    if (sig_thread) {
      for (u32 i = 0; i < 4; ++i) mbar_init(sigbar + 8 * i, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // The peer's barriers must be initialized before this CTA's loads and
  // arrivals reach them.
  if constexpr (CL) {
    cluster_sync();
  } else {
    __syncthreads();
  }

  if (wg == 0) {
    // Producer warpgroup: one thread issues every TMA load.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      if constexpr (!GROUPED) {
        // Fetch the descriptors while the barriers settle (first loads wait less).
        asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&amap) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&bmap) : "memory");
        // C's too, where the epilogue stores through it (mode 1; the host
        // passes zeros otherwise): its first use is on the kernel's tail.
        if (p.tma_store == 1) asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&cmap) : "memory");
      }
      u32 stage = 0, phase = 0;
      u32 grp = 0, fenced = 0xffffffffu;  // grouped mode: current and acquired group
      u64 wait_ready = 0;  // hook 4: flags 0..63 already seen at the epoch
      for (u32 u = ufirst; u < units; u += ustep) {
        u32 t, sp, ns, kb0, kb1;
        unit_of(p, u, nk, t, sp, ns, kb0, kb1);
        u32 mb, nb;
        const TMap* am = &amap;
        const TMap* bm = &bmap;
        if constexpr (GROUPED) {
          group_tile(*gt, p, t, grp, mb, nb);
          am = (const TMap*)gt->maps + 3 * grp;
          bm = am + 1;
          if (grp != fenced) {
            tmap_acquire(am);
            tmap_acquire(bm);
            fenced = grp;
          }
        } else if constexpr (CL) {
          pair_coords(p, t, crank, mb, nb);
        } else {
          tile_coords(p, t, mb, nb);
        }
        const u32 m0 = mb * TBM, n0 = nb * BN;
        u32 kb = kb0;
        if (p.wait_flags != 0) {
          // Hook 4: wait until every flag covering this tile's A rows reached
          // the epoch. A flag seen ready stays ready for the launch: the
          // first 64 are remembered, so later tiles of those rows skip the
          // load and the fence.
          const u32 f0 = m0 / p.wait_rows;
          const u32 f1 = ((m0 + TBM < p.m ? m0 + TBM : p.m) - 1) / p.wait_rows;
          bool ready = true;
          for (u32 f = f0; f <= f1 && ready; ++f) ready = f < 64 && ((wait_ready >> f) & 1);
          if (!ready) {
            // B does not depend on the flags. The first stage's B goes out
            // before one poll of the flags, so that their round trip overlaps
            // it; flags already set then cost one round trip, and the stages
            // after it load A and B together, as without the hook. Flags not
            // set yet: the other stages' B loads go out too (reserving those
            // stages) before the spin, and their A loads after it.
            const u32 pre = kb1 - kb0 < p.stages ? kb1 - kb0 : p.stages;
            u32 s = stage, ph = phase, b_ahead = 0;  // stages whose B went out
            bool set = false;
            do {
              mbar_wait(empty + 8 * s, ph ^ 1);
              const u32 fb = full + 8 * s;
              mbar_expect_tx(fb, STAGE_BYTES);
              load_b<BN, CL>(base + s * STAGE_BYTES + STAGE_AT, bm, fb, n0, kb0 + b_ahead, crank);
              next_stage(s, ph, p.stages);
              if (++b_ahead == 1) set = poll_flags(p, f0, f1, wait_ready, false);
            } while (b_ahead < pre && !set);
            if (!set) poll_flags(p, f0, f1, wait_ready, true);
            // The flag's writer published A through the generic proxy; TMA
            // reads through the async proxy.
            asm volatile("fence.proxy.async.global;" ::: "memory");
            for (u32 i = 0; i < b_ahead; ++i, ++kb) {
              tma_load_2d(base + stage * STAGE_BYTES, am, full + 8 * stage, (int)(kb * BK),
                          (int)m0);
              next_stage(stage, phase, p.stages);
            }
          }
        }
        for (; kb < kb1; ++kb) {
          mbar_wait(empty + 8 * stage, phase ^ 1);
          const u32 fb = full + 8 * stage;
          mbar_expect_tx(fb, STAGE_BYTES);
          const u32 sa = base + stage * STAGE_BYTES;
          tma_load_2d(sa, am, fb, (int)(kb * BK), (int)m0);
          load_b<BN, CL>(sa + STAGE_AT, bm, fb, n0, kb, crank);
          next_stage(stage, phase, p.stages);
        }
      }
    } else if (sig_thread && (tid == 32 || tid == 64)) {
      // Signal thread of consumer warpgroup cw: one handover per unit (no
      // K split), in the warpgroup's order.
      const u32 cw = tid / 32 - 1;
      const u32 staged = sigbar + 8 * cw, freed = sigbar + 16 + 8 * cw;
      u32 j = 0;
      u64 acquired = 0;  // dest maps this thread fenced
      for (u32 u = ufirst; u < units; u += ustep, ++j) {
        mbar_wait(staged, j & 1);
        u32 rbase, cbase0;
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
                     : "=r"(rbase), "=r"(cbase0)
                     : "r"(sigslot + 8 * cw)
                     : "memory");
        if (p.tma_store & 1) {
          if (p.tma_store == 3 && rbase < p.m) acquire_map(p, rbase, acquired);
          tma_store_halves<M64 ? BN / 2 : BN, 1>(p, &cmap, stg + cw * (64u * (M64 ? BN / 2 : BN) * 2u),
                                                 rbase, cbase0);
          asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        }
        mbar_arrive(freed);
        // (signal_half waits for this thread's TMA stores to be performed.)
        if (rbase < p.m) signal_body(p, rbase, 1, cbase0, M64 ? BN / 2 : BN);
      }
    }
  } else if constexpr (PP) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const u32 cw = wg - 1;     // consumer index: takes the CTA's units cw, cw + 2, ...
    const u32 lt = tid & 127;  // thread in warpgroup
    float d[BN];               // two 64-row halves of BN / 2 accumulators
    u64 acquired = 0;          // dest maps this thread fenced (lt 0)
    for (u32 i = cw, u = ufirst + cw * ustep; u < units; i += 2, u += 2 * ustep) {
      // Whole tiles (no K split): unit u is tile u, and the CTA's i-th unit
      // occupies k-blocks i nk .. (i + 1) nk - 1 of the stage ring.
      u32 mb, nb;
      if constexpr (CL) {
        pair_coords(p, u, crank, mb, nb);
      } else {
        tile_coords(p, u, mb, nb);
      }
      const u32 m0 = mb * BM, n0 = nb * BN;
      const u32 pos = i * nk;
      u32 stage = pos % p.stages, phase = (pos / p.stages) & 1;
#pragma unroll
      for (int x = 0; x < BN; ++x) d[x] = 0.0f;
      fence_acc<BN>(d);
      // This warpgroup's turn: the other has issued its previous tile's main loop.
      if (i > 0) mbar_wait(turn + 8 * cw, ((i - 1) / 2) & 1);
      u32 prev = 0;
      for (u32 kb = 0; kb < nk; ++kb) {
        mbar_wait(full + 8 * stage, phase);
        const u32 sa = base + stage * STAGE_BYTES;
        const u32 sb = sa + STAGE_AT;
        wgmma_fence();
#pragma unroll
        for (u32 ks = 0; ks < BK / 16; ++ks) {
          const u64 db = desc(sb + ks * 2048, 64 * BK * 2, 1024);
          wgmma_128(d, desc(sa + ks * 32, 16, 1024), db);
          wgmma_128(d + BN / 2, desc(sa + 64 * BK * 2 + ks * 32, 16, 1024), db);
        }
        wgmma_commit();
        if (p.dest_table != 0 && kb == nk / 2) prep_dest<2>(p, m0, lt, acquired);
        if (kb > 0) {
          wgmma_wait<1>();
          if (lt == 0) release_stage<CL>(empty + 8 * prev, crank);
        }
        prev = stage;
        next_stage(stage, phase, p.stages);
      }
      // Every k-block of this tile is issued: the other warpgroup's turn.
      if (lt == 0) mbar_arrive(turn + 8 * (1 - cw));
      wgmma_wait<0>();
      fence_acc<BN>(d);
      if (lt == 0) release_stage<CL>(empty + 8 * prev, crank);
      epilogue<BN, 2>(p, &cmap, d, stg + cw * STG_WG, m0, n0, lt, cw);
      if (p.sig_counters != 0) {
        // Hook 5, right away: the other warpgroup's main loop runs meanwhile.
        named_sync(1 + cw, 128);
        if (lt == 0) signal_half(p, m0, 2, n0, BN);
      }
    }
    // Shared memory must outlive the TMA stores that read it.
    if (lt == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const u32 cw = wg - 1;       // consumer index: rows 64*cw .. of the tile
    const u32 lt = tid & 127;    // thread in warpgroup
    u32 stage = 0, phase = 0;
    float d[NACC];
    constexpr u32 NONE = 0xffffffffu;
    u32 pend = NONE;  // first row of a stored half tile whose signal is due
    u32 pend_col = 0;  // and its first column
    u32 nsig = 0;     // half tiles handed to the signal thread
    u64 acquired = 0;  // dest maps this thread fenced (lt 0)
    u32 grp = 0, fenced = NONE;  // grouped mode: current and acquired group
    for (u32 u = ufirst; u < units; u += ustep) {
      u32 t, sp, ns, kb0, kb1;
      unit_of(p, u, nk, t, sp, ns, kb0, kb1);
      u32 mb, nb;
      const TMap* cm = &cmap;
      if constexpr (GROUPED) {
        group_tile(*gt, p, t, grp, mb, nb);
        cm = (const TMap*)gt->maps + 3 * grp + 2;
        // Only thread 0 of the warpgroup issues the C stores.
        if (lt == 0 && grp != fenced) {
          tmap_acquire(cm);
          fenced = grp;
        }
      } else if constexpr (CL) {
        pair_coords(p, t, crank, mb, nb);
      } else {
        tile_coords(p, t, mb, nb);
      }
      const u32 m0 = mb * TBM, n0 = nb * BN;
      // This warpgroup's first output row and column.
      const u32 rbase = M64 ? m0 : m0 + cw * 64;
      const u32 cbase0 = M64 ? n0 + cw * (u32)WN : n0;
#pragma unroll
      for (int i = 0; i < NACC; ++i) d[i] = 0.0f;
      fence_acc<NACC>(d);
      u32 prev = 0;
      for (u32 kb = kb0; kb < kb1; ++kb) {
        mbar_wait(full + 8 * stage, phase);
        const u32 sa = base + stage * STAGE_BYTES + (M64 ? 0u : cw * (64 * BK * 2));
        const u32 sb =
            base + stage * STAGE_BYTES + STAGE_AT + (M64 ? cw * (u32)(WN / 64) * (64 * BK * 2) : 0u);
        wgmma_fence();
#pragma unroll
        for (u32 ks = 0; ks < BK / 16; ++ks) {
          // A: K-major, 8-row groups 1024 B apart, k16 step = 32 B inside the swizzle atom.
          // B: MN-major, 64-column atoms 8 KiB apart (LBO), 8-k groups 1024 B apart (SBO),
          //    k16 step = 16 rows of 128 B.
          const u64 da = desc(sa + ks * 32, 16, 1024);
          const u64 db = desc(sb + ks * 2048, 64 * BK * 2, 1024);
          if constexpr (WN == 256) {
            wgmma_256(d, da, db);
          } else if constexpr (WN == 128) {
            wgmma_128(d, da, db);
          } else {
            wgmma_64(d, da, db);
          }
        }
        wgmma_commit();
        // A deferred signal goes out `sig_delay` k-blocks into the next unit
        // (or at its last k-block): by then the stores it publishes have
        // drained, so its wait and fence do not hold up the warpgroup's wgmma.
        if (pend != NONE && (kb - kb0 >= p.sig_delay || kb + 1 == kb1)) {
          if (lt == 0) signal_half(p, pend, 1, pend_col, WN);
          pend = NONE;
        }
        if (p.dest_table != 0 && kb == kb0 + (kb1 - kb0) / 2 && !(sig_thread && p.tma_store == 3)) {
          prep_dest<1>(p, rbase, lt, acquired);
        }
        if (kb > kb0) {
          wgmma_wait<1>();
          if (lt == 0) release_stage<CL>(empty + 8 * prev, crank);
        }
        prev = stage;
        next_stage(stage, phase, p.stages);
      }
      wgmma_wait<0>();
      fence_acc<NACC>(d);
      if (lt == 0) release_stage<CL>(empty + 8 * prev, crank);

      if (ns > 1) {
        // Split-K: publish this split's partial, count it; the last split of
        // this (tile, half) sums all partials in split order (deterministic)
        // and runs the epilogue.
        if (rbase >= p.m) continue;  // no rows in this half
        const u64 slot = (u64)(t - p.dp_tiles) * 2 + cw;  // split tiles only
        const u64 wsb = p.ws + slot * ns * SLOT;
        const u64 mine = wsb + (u64)sp * SLOT + 16ull * lt;
#pragma unroll
        for (int q = 0; q < NACC / 4; ++q) {
          asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(mine + 2048ull * q),
                       "f"(d[4 * q]), "f"(d[4 * q + 1]), "f"(d[4 * q + 2]), "f"(d[4 * q + 3])
                       : "memory");
        }
        named_sync(1 + cw, 128);
        if (lt == 0) {
          const u64 tk = p.ws_tickets + 4ull * slot;
          u32 old;
          asm volatile("fence.acq_rel.gpu;" ::: "memory");
          asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(tk) : "memory");
          const u32 last = old + 1 == ns;
          if (last) asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(tk) : "memory");
          asm volatile("st.shared.u32 [%0], %1;" ::"r"(flag_slot + 4 * cw), "r"(last) : "memory");
        }
        named_sync(1 + cw, 128);
        u32 last;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(last) : "r"(flag_slot + 4 * cw) : "memory");
        if (!last) continue;
        // Every split (this one too) is read back from the workspace, in
        // split order, so the sum does not depend on which split came last.
#pragma unroll
        for (int i = 0; i < NACC; ++i) d[i] = 0.0f;
        for (u32 j = 0; j < ns; ++j) {
          const u64 src = wsb + (u64)j * SLOT + 16ull * lt;
#pragma unroll
          for (int q = 0; q < NACC / 4; ++q) {
            float v0, v1, v2, v3;
            asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(v0), "=f"(v1), "=f"(v2), "=f"(v3)
                         : "l"(src + 2048ull * q)
                         : "memory");
            d[4 * q] += v0;
            d[4 * q + 1] += v1;
            d[4 * q + 2] += v2;
            d[4 * q + 3] += v3;
          }
        }
      }

      if (sig_thread) {
        // Hand the half tile to this warpgroup's signal thread (it stores
        // it in the TMA modes); the staging buffer is free again once that
        // thread has read it.
        epilogue<WN, 1>(p, cm, d, stg + cw * (64u * WN * 2u), rbase, cbase0, lt, cw,
                        sigbar + 16 + 8 * cw, nsig > 0 ? (nsig - 1) & 1 : 2);
        named_sync(1 + cw, 128);
        if (lt == 0) {
          // The slot is free once the signal thread took the previous
          // handover (the staging wait above covers it, but the register
          // epilogue has none).
          if (nsig > 0) mbar_wait(sigbar + 16 + 8 * cw, (nsig - 1) & 1);
          asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(sigslot + 8 * cw), "r"(rbase),
                       "r"(cbase0)
                       : "memory");
          mbar_arrive(sigbar + 8 * cw);
        }
        ++nsig;
        continue;
      }
      epilogue<WN, 1>(p, cm, d, stg + cw * (64u * WN * 2u), rbase, cbase0, lt, cw);

      if (p.sig_counters != 0) {
        // Hook 5: every thread's stores of this half tile are issued; the
        // count itself is deferred until the next unit's first wgmma is in
        // flight (or the loop ends), when the stores have drained and the
        // fence costs little.
        named_sync(1 + cw, 128);
        const u32 rlo = rbase;
        if (rlo < p.m) {
          pend = rlo;
          pend_col = cbase0;
        }
      }
    }
    if (pend != NONE && lt == 0) signal_half(p, pend, 1, pend_col, WN);
    // Shared memory must outlive the TMA stores that read it.
    if (lt == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  // The peer may still arrive on this CTA's barriers: neither leaves first.
  if constexpr (CL) cluster_sync();
}

extern "C" __global__ void __launch_bounds__(384, 1)
    ficco_hgemm_n256(const __grid_constant__ TMap amap, const __grid_constant__ TMap bmap,
                     const __grid_constant__ TMap cmap,
                     const __grid_constant__ Params p) {
  hgemm_body<256, false>(amap, bmap, cmap, p);
}

extern "C" __global__ void __launch_bounds__(384, 1)
    ficco_hgemm_n128(const __grid_constant__ TMap amap, const __grid_constant__ TMap bmap,
                     const __grid_constant__ TMap cmap,
                     const __grid_constant__ Params p) {
  hgemm_body<128, false>(amap, bmap, cmap, p);
}

// Ping-pong 128 x 128 tiles: each consumer warpgroup computes whole tiles.
extern "C" __global__ void __launch_bounds__(384, 1)
    ficco_hgemm_n128_pp(const __grid_constant__ TMap amap, const __grid_constant__ TMap bmap,
                        const __grid_constant__ TMap cmap,
                        const __grid_constant__ Params p) {
  hgemm_body<128, false, false, true>(amap, bmap, cmap, p);
}

// Clusters of 2 along M sharing B (multicast): 128 x 256 tiles.
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1)
    ficco_hgemm_n256_c2(const __grid_constant__ TMap amap, const __grid_constant__ TMap bmap,
                        const __grid_constant__ TMap cmap,
                        const __grid_constant__ Params p) {
  hgemm_body<256, false, false, false, true>(amap, bmap, cmap, p);
}

// Clusters of 2 along M sharing B (multicast): ping-pong 128 x 128 tiles.
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1)
    ficco_hgemm_n128_pp_c2(const __grid_constant__ TMap amap, const __grid_constant__ TMap bmap,
                           const __grid_constant__ TMap cmap,
                           const __grid_constant__ Params p) {
  hgemm_body<128, false, false, true, true>(amap, bmap, cmap, p);
}

// 64 x 256 tiles: each consumer warpgroup computes 64 x 128 (wgmma m64n128k16).
extern "C" __global__ void __launch_bounds__(384, 1)
    ficco_hgemm_n256_m64(const __grid_constant__ TMap amap, const __grid_constant__ TMap bmap,
                         const __grid_constant__ TMap cmap,
                         const __grid_constant__ Params p) {
  hgemm_body<256, true>(amap, bmap, cmap, p);
}

// 64 x 128 tiles: each consumer warpgroup computes 64 x 64 (wgmma m64n64k16).
extern "C" __global__ void __launch_bounds__(384, 1)
    ficco_hgemm_n128_m64(const __grid_constant__ TMap amap, const __grid_constant__ TMap bmap,
                         const __grid_constant__ TMap cmap,
                         const __grid_constant__ Params p) {
  hgemm_body<128, true>(amap, bmap, cmap, p);
}

// Grouped mode (GroupTable): every group's tiles in one persistent launch.
// amap, bmap and cmap are unused (the host passes zeros): each group's maps
// are in the table.
extern "C" __global__ void __launch_bounds__(384, 1)
    ficco_hgemm_n256_grouped(const __grid_constant__ TMap amap, const __grid_constant__ TMap bmap,
                             const __grid_constant__ TMap cmap,
                             const __grid_constant__ Params p,
                             const __grid_constant__ GroupTable g) {
  hgemm_body<256, false, true>(amap, bmap, cmap, p, &g);
}

extern "C" __global__ void __launch_bounds__(384, 1)
    ficco_hgemm_n128_grouped(const __grid_constant__ TMap amap, const __grid_constant__ TMap bmap,
                             const __grid_constant__ TMap cmap,
                             const __grid_constant__ Params p,
                             const __grid_constant__ GroupTable g) {
  hgemm_body<128, false, true>(amap, bmap, cmap, p, &g);
}
