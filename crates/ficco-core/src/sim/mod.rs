//! The discrete-event simulator: a [`Plan`] and a [`HwProfile`] in, a
//! predicted [`Timeline`] out. It is the "system + network" layer in ASTRA-sim's
//! terms: one event queue over every rank, resources per GPU, and fluid rates
//! recomputed at every event.
//!
//! # What it models
//!
//! - **Ordering.** A task starts when its stream predecessor and its explicit
//!   dependencies (which may cross ranks) are done. NCCL tasks with the same
//!   group form one rendezvous: the transfer starts when every member's kernel
//!   is resident on its GPU, and all members end together.
//! - **SMs** (per GPU). A GEMM is a pool of tiles (see [`crate::sim::cost`]);
//!   whenever SMs are free it dispatches a wave of `min(free SMs, sm_target -
//!   SMs it holds, tiles left)` tiles, each held for one tile time. So wave
//!   and tile quantization fall out of the model, SMs freed mid-wave are
//!   taken at once by a GEMM with tiles left, and a second GEMM (another
//!   compute stream) only gets the SMs the first leaves in its tail. An NCCL
//!   kernel holds `nccl_sms` SMs from the moment it is resident until its
//!   collective ends (also while it waits for late peers). A reduce kernel
//!   takes up to `reduce.full_bw_sms` SMs and runs proportionally slower with
//!   fewer.
//! - **Priority** (in-order block dispatch). Kernels wanting SMs are served
//!   high-priority streams first, then in launch order; a normal-priority
//!   NCCL or reduce kernel that does not fit blocks those launched after it.
//!   So a normal-priority NCCL kernel launched while an earlier GEMM still
//!   has tiles to dispatch waits until the GEMM's last wave is dispatched
//!   (unless `sm_target` leaves it room), while one on a high-priority stream
//!   is resident at once, oversubscribing the SMs: the GEMM's later waves get
//!   fewer SMs.
//! - **Copy engines** (per GPU). A copy takes one of the issuing rank's copy
//!   engines (FIFO when all are busy) and no SMs.
//! - **NVLink** (full switch). Each GPU has an egress and an ingress capacity
//!   (`nvlink.usable_gbs`). Every transfer in flight (copy, collective, send/
//!   recv) is a flow with its own rate cap (copy-engine bandwidth, NCCL bus
//!   bandwidth); rates are max-min fair over the links, recomputed at every
//!   event. A transfer first spends its fixed latency, then moves its bytes.
//! - **Contention.** While any NCCL transfer runs on a GPU, its GEMM waves run
//!   `gemm_slowdown_nccl` times slower; while a copy reads or writes the GPU,
//!   `gemm_slowdown_copy` (the larger applies); while two GEMMs run on the
//!   GPU, also `gemm_slowdown_gemm` times slower. While a GEMM wave runs on one
//!   of its GPUs, an NCCL transfer's rate cap is divided by
//!   `nccl_slowdown_gemm` and a copy's by `copy_slowdown_gemm`.
//!
//! - **Signals** (plans from [`crate::plan::signal::with_signals`]). A
//!   Signal holds its stream for one NVLink latency (`nvlink.latency_us`, the
//!   flag write reaching the peer) and takes no SM, copy engine or bandwidth;
//!   a Wait takes no time and ends when its flag's Signal has (the Signal is
//!   one of its predecessors). Plans without signals simulate as before.
//!
//! - **Tile GEMMs** ([`crate::plan::TaskKind::TileGemm`], the `tile`
//!   granularity). One persistent launch: after its launch overhead it takes
//!   min(tiles, SM cap) SMs, as many as are free and more as they free up,
//!   and hands them tiles in the kernel's block order, one tile at a time per
//!   SM (the whole GEMM's tiles, spread evenly over its row blocks). A tile
//!   of a block whose wait flag is not yet signalled still takes its SM,
//!   which spins until the flag's Signal is done and then computes the tile;
//!   the SMs behind it take the next tiles, so a late block holds back only
//!   the SMs that reached it. A tile takes ficco's kernel's wave time
//!   ([`own`]) times the profile's `own_gemm.tile_slowdown` (and
//!   `tile_acc_slowdown` where it adds into a peer's buffer, `-acc`). When every tile of a block is done, the
//!   block's counter is signalled: a Wait on it ends then (not at the end of
//!   the GEMM). SMs with no tile left are freed at once (the kernel's tail).
//!   Contention applies to its tiles as to any GEMM wave.
//!
//! - **Resource controls** (the plan's [`crate::plan::Resources`] and GEMM
//!   fields). `-ctaN`: an NCCL kernel holds N SMs instead of `nccl_sms`, and
//!   its bandwidth cap scales by min(1, N / `nccl_sms`) (fewer channels move
//!   fewer bytes at once). `-gcN`: GEMMs get at most N SMs, and NCCL kernels
//!   run on the other partition, resident at once without taking SMs from
//!   the GEMM; a collective whose CTAs (`nccl.channels`) outnumber that
//!   partition's SMs runs in rounds, its bandwidth divided by their number.
//!   `-own`, `-smN`, `-occS` (the plan's GEMM engine is ficco's
//!   kernel): each GEMM is the cuBLASLt wave model scaled by ficco's measured
//!   time over cuBLASLt's on that shape ([`own`]), on a persistent grid
//!   (ficco's split-K fills the SMs of a short GEMM, like the profile's
//!   `full_grid`). `-occS` also multiplies by the stage count's
//!   slowdown, and NCCL kernels fit beside the GEMM's CTAs (the shared memory
//!   the fewer stages free), resident at once. Copy engines take no SMs under
//!   any control.
//!
//! A task that runs alone takes exactly its [`crate::sim::cost`] time, so the
//! sequential plan (one collective, then one GEMM) simulates to
//! `cost::problem_seq_ms`.
//!
//! Span starts are when the task begins to occupy its resource: a GEMM at
//! launch, a copy when it gets a copy engine, an NCCL kernel when it is
//! resident (so waiting for peers is inside its span), a reduce when it gets SMs.
//!
//! A plan in which some task can never start (a dependency cycle, or a
//! rendezvous a rank never reaches) is an [`Error::InvalidPlan`] naming it.

mod backend;
pub use backend::Simulator;
pub mod calibrate;
pub mod cost;
pub mod own;
pub mod profile;
mod step;

use crate::error::{Error, Result};
use crate::plan::graph::Graph;
use crate::plan::{NcclOp, Plan, TaskId, TaskKind};
use crate::run::timeline::{Span, Timeline};
use crate::sim::profile::HwProfile;
use crate::space::{GemmEngine, Priority};
use std::collections::HashMap;

const EPS: f64 = 1e-12;

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Waiting for predecessors.
    Blocked,
    /// GEMM: launch overhead running (timer).
    Launching,
    /// Waiting for SMs (kernels) or a copy engine (copies).
    Waiting,
    /// NCCL kernel resident, waiting for the rendezvous or in it.
    Resident,
    /// Copy: latency phase or transfer.
    Moving,
    /// GEMM between or inside waves, reduce running.
    Running,
    Done,
}

#[derive(Debug, Clone)]
enum Work {
    Gemm {
        /// Blocks not yet given an SM: tiles, or with persistent kernels
        /// min(tiles, cap) blocks of `unit_tiles` (+1 for the first
        /// `long_units`) tiles each.
        undispatched: usize,
        /// Blocks (of those not dispatched) that compute one tile more.
        long_units: usize,
        /// Tiles per block.
        unit_tiles: usize,
        /// SM cap (`sm_target`, else every SM).
        cap: usize,
        /// Time of one tile on one SM, ms.
        wave_ms: f64,
        launch_ms: f64,
        /// SMs held now, over all waves in flight.
        held: usize,
        /// Waves in flight.
        waves: usize,
    },
    Copy {
        bytes: f64,
        src: usize,
        dst: usize,
    },
    Nccl {
        group: usize,
    },
    Reduce {
        nominal_ms: f64,
        sms: usize,
    },
    /// Signal (`ms`: the flag write's latency) or Wait (`ms`: when its flag
    /// is seen, `flag_wait_us` after its Signal; it ends then, or at once if
    /// it starts later): a timer, no resource.
    Flag {
        ms: f64,
        wait: bool,
    },
    Tile(TileWork),
}

/// A tile GEMM in flight (see the module doc).
#[derive(Debug, Clone)]
struct TileWork {
    /// Block indices in the kernel's order.
    order: Vec<usize>,
    /// Next position in `order` with tiles not yet handed to an SM.
    pos: usize,
    /// Per block: tiles not yet handed out, SMs spinning on its flag, tiles
    /// in flight, tiles done.
    undispatched: Vec<usize>,
    spinning: Vec<usize>,
    /// The blocks with SMs spinning on their flag (`spinning[b] > 0`).
    spin_list: Vec<usize>,
    done: Vec<usize>,
    tiles_per_block: usize,
    /// Per block: the node whose completion signals its wait flag.
    gate: Vec<Option<usize>>,
    /// SMs the kernel wants (min(tiles, cap)) and holds now.
    want: usize,
    held: usize,
    /// SMs held with no tile.
    idle: usize,
    /// Tile waves in flight.
    waves: usize,
    wave_ms: f64,
    launch_ms: f64,
}

#[derive(Debug, Clone)]
struct Node {
    rank: usize,
    index: usize,
    hi: bool,
    work: Work,
    preds_left: usize,
    /// Successors, each with the delay (ms) before this task's completion
    /// reaches it (a cross-rank dependency's flag, see `flag_wait_us`).
    succs: Vec<(usize, f64)>,
    state: State,
    start: f64,
    end: f64,
    /// Launch order among kernels of the rank (FIFO for SMs).
    seq: usize,
}

/// A transfer in flight.
#[derive(Debug, Clone)]
struct Flow {
    /// Tasks that end when the flow ends.
    members: Vec<usize>,
    /// (resource, bytes on it per byte of progress); resource r < P is
    /// egress of GPU r, P + r ingress of GPU r.
    usage: Vec<(usize, f64)>,
    /// Bytes to move per rank (the progress unit).
    usage_work: f64,
    /// Rate cap alone, bytes/ms.
    cap: f64,
    is_copy: bool,
    /// The rank whose copy engine runs it (copies only).
    issuer: Option<usize>,
    ranks: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ActKind {
    /// A GEMM's wave: (task, SMs it holds).
    Wave(usize, usize),
    /// Tiles of a tile GEMM's block: (task, block, SMs).
    Tile(usize, usize, usize),
    Reduce(usize),
    Flow(usize),
}

#[derive(Debug, Clone)]
struct Active {
    kind: ActKind,
    remaining: f64,
    rate: f64,
}

#[derive(Debug, Clone, Copy)]
enum TimerKind {
    GemmLaunched(usize),
    /// Latency phase of a flow is over: it starts moving bytes.
    FlowStarts(usize),
    /// A Signal or Wait is done.
    FlagDone(usize),
    /// A delayed dependency of the task reaches it.
    DepArrives(usize),
}

struct Group {
    members: Vec<usize>,
    resident: usize,
}

struct Sim<'a> {
    plan: &'a Plan,
    hw: &'a HwProfile,
    p: usize,
    nodes: Vec<Node>,
    now: f64,
    timers: Vec<(f64, TimerKind)>,
    active: Vec<Active>,
    flows: Vec<Flow>,
    groups: Vec<Group>,
    /// Per rank: SMs held (may exceed sm_count with high-priority kernels).
    held: Vec<usize>,
    ce_busy: Vec<usize>,
    /// Per rank: kernels waiting for SMs: NCCL and reduce kernels not yet
    /// resident, GEMMs with tiles not yet dispatched.
    sm_wait: Vec<Vec<usize>>,
    /// Per rank: copies waiting for a copy engine, first come first served.
    ce_wait: Vec<std::collections::VecDeque<usize>>,
    dirty: Vec<bool>,
    next_seq: usize,
    done: usize,
    /// SMs an NCCL kernel needs (`-ctaN`, else `nccl_sms`).
    nccl_need: usize,
    /// Whether NCCL kernels run beside the GEMMs' SMs (green split, or GEMMs with fewer stages: `-occS`).
    nccl_beside: bool,
    /// NCCL bandwidth factor of the CTA limit.
    nccl_scale: f64,
    /// A collective's bandwidth factor under a green-context split: one
    /// over the rounds its CTAs take on the communication partition's SMs.
    green_rounds_scale: f64,
    /// Per node: tile GEMM blocks (node, block) its completion makes ready.
    gates: Vec<Vec<(usize, usize)>>,
    /// (tile GEMM node, block) -> Wait nodes that end when the block is stored.
    block_waiters: HashMap<(usize, usize), Vec<usize>>,
}

/// Simulates `plan` on `hw` and returns the predicted timeline.
pub fn simulate(plan: &Plan, hw: &HwProfile) -> Result<Timeline> {
    let mut sim = Sim::new(plan, hw)?;
    sim.run(plan)?;
    let spans = sim
        .nodes
        .iter()
        .map(|n| {
            let task = &plan.ranks[n.rank].tasks[n.index];
            Span {
                rank: n.rank,
                stream: task.stream,
                task: n.index,
                label: task.label.clone(),
                kind: task.kind.short().to_string(),
                start_ms: n.start,
                end_ms: n.end,
            }
        })
        .collect();
    Ok(Timeline {
        name: plan.name.clone(),
        spans,
        total_ms: 0.0,
    }
    .finish())
}

/// The predicted time of `plan` on `hw` alone: [`simulate`]'s `total_ms`,
/// without building the timeline's spans (tens of thousands of labels at
/// large GPU counts).
pub fn simulate_ms(plan: &Plan, hw: &HwProfile) -> Result<f64> {
    let mut sim = Sim::new(plan, hw)?;
    sim.run(plan)?;
    Ok(sim.nodes.iter().map(|n| n.end).fold(0.0, f64::max))
}

/// The simulator's work of a GEMM (or grouped GEMM) of cost `c` capped at
/// `cap` SMs: tiles, or with persistent kernels (`persistent`, or the
/// profile's cuBLASLt) blocks of several tiles.
fn gemm_work(hw: &HwProfile, c: &cost::GemmCost, cap: usize, persistent: bool) -> Work {
    let (units, unit_tiles, long_units) = if hw.gemm.persistent || persistent {
        if hw.gemm.full_grid && c.tiles < cap {
            // Every block runs the whole (one-wave) time.
            (cap, c.waves, 0)
        } else {
            let units = c.tiles.min(cap).max(1);
            (units, c.tiles / units, c.tiles % units)
        }
    } else {
        (c.tiles, 1, 0)
    };
    Work::Gemm {
        undispatched: units,
        long_units,
        unit_tiles,
        cap,
        wave_ms: c.effective_wave_ms(),
        launch_ms: c.launch_ms,
        held: 0,
        waves: 0,
    }
}

/// A collective's bandwidth factor under a green-context split (`-gcN`):
/// its kernel's CTAs (`-ctaN`, else the profile's `nccl.channels`), one per
/// SM, on the `sm_count - N` SMs of the communication partition. Where they
/// do not all fit at once, the kernel runs in rounds, and the ring's
/// channels wait for one another across ranks, so its bandwidth is one over
/// the rounds. Measured (4 H100s and 4 H200s, the concurrent suite): NCCL
/// 2.28's ring kernels have 24 CTAs, a `-gc112` split leaves 20 SMs, and
/// every `-gc112` NCCL schedule ran as slow as `-cta8` (half NCCL's
/// bandwidth), where the model without rounds predicted it near ideal.
fn green_rounds_scale(plan: &Plan, hw: &HwProfile) -> f64 {
    let (Some(green), Some(channels)) = (plan.resources.green_sms, hw.nccl.channels) else {
        return 1.0;
    };
    let partition = hw.sm_count.saturating_sub(green).max(1);
    let ctas = plan.resources.nccl_ctas.unwrap_or(channels).max(1);
    1.0 / ctas.div_ceil(partition) as f64
}

/// NCCL's "size" of a collective: the gathered buffer (all-gather), the
/// input (reduce-scatter) or the buffer (all-reduce), bytes.
fn nccl_size(op: &NcclOp) -> usize {
    match op {
        NcclOp::AllGather { recv, .. } | NcclOp::AllReduce { recv, .. } => recv.bytes(),
        NcclOp::ReduceScatter { send, .. } => send.bytes(),
        NcclOp::SendRecv { .. } => 0,
    }
}

impl<'a> Sim<'a> {
    fn new(plan: &'a Plan, hw: &'a HwProfile) -> Result<Self> {
        let p = plan.ranks.len();
        let mut offset = Vec::with_capacity(p);
        let mut total = 0;
        for rp in &plan.ranks {
            offset.push(total);
            total += rp.tasks.len();
        }
        let mut nodes = Vec::with_capacity(total);
        let mut group_ix: HashMap<usize, usize> = HashMap::new();
        let mut groups: Vec<Group> = Vec::new();
        for (rank, rp) in plan.ranks.iter().enumerate() {
            for (index, task) in rp.tasks.iter().enumerate() {
                let stream = rp.streams.get(task.stream).ok_or_else(|| {
                    Error::InvalidPlan(format!(
                        "task '{}' (rank {rank}, index {index}) is on stream {} but rank {rank} has {} streams",
                        task.label,
                        task.stream,
                        rp.streams.len()
                    ))
                })?;
                let work = match &task.kind {
                    TaskKind::Gemm {
                        a,
                        b,
                        sm_target,
                        occupancy,
                        ..
                    } => {
                        let green = plan.resources.green_sms.unwrap_or(hw.sm_count);
                        let cap = sm_target
                            .unwrap_or(hw.sm_count)
                            .min(green)
                            .clamp(1, hw.sm_count);
                        let own = plan.resources.gemm == GemmEngine::Own;
                        let c = if own {
                            own::gemm_cost(hw, a.rows, a.cols, b.cols, cap, *occupancy)
                        } else {
                            cost::gemm_cost(hw, a.rows, a.cols, b.cols, cap)
                        };
                        // ficco's grid is persistent too, and its split-K
                        // (chosen to fill the waves) spreads a short GEMM over
                        // every SM it may use, as the profile says of cuBLASLt.
                        gemm_work(hw, &c, cap, own)
                    }
                    TaskKind::GroupedGemm { groups, sm_target } => {
                        let green = plan.resources.green_sms.unwrap_or(hw.sm_count);
                        let cap = sm_target
                            .unwrap_or(hw.sm_count)
                            .min(green)
                            .clamp(1, hw.sm_count);
                        let shapes: Vec<(usize, usize, usize)> = groups
                            .iter()
                            .map(|g| (g.a.rows, g.a.cols, g.b.cols))
                            .collect();
                        let c = cost::grouped_cost(hw, &shapes, cap);
                        gemm_work(hw, &c, cap, false)
                    }
                    TaskKind::Copy { src, dst } => {
                        if src.rank >= p || dst.rank >= p || (src.rank != rank && dst.rank != rank)
                        {
                            return Err(Error::InvalidPlan(format!(
                                "copy '{}' on rank {rank} must read or write rank {rank} (src rank {}, dst rank {}, {p} ranks)",
                                task.label, src.rank, dst.rank
                            )));
                        }
                        Work::Copy {
                            bytes: src.view.bytes() as f64,
                            src: src.rank,
                            dst: dst.rank,
                        }
                    }
                    TaskKind::Nccl { group, .. } => {
                        let gi = *group_ix.entry(*group).or_insert_with(|| {
                            groups.push(Group {
                                members: Vec::new(),
                                resident: 0,
                            });
                            groups.len() - 1
                        });
                        groups[gi].members.push(nodes.len());
                        Work::Nccl { group: gi }
                    }
                    TaskKind::Reduce { srcs, dst } => Work::Reduce {
                        nominal_ms: cost::reduce_ms(hw, srcs.len(), dst.bytes()),
                        sms: 0,
                    },
                    TaskKind::Signal { .. } => Work::Flag {
                        ms: hw.nvlink.latency_us / 1000.0,
                        wait: false,
                    },
                    TaskKind::Wait { .. } => Work::Flag {
                        ms: 0.0,
                        wait: true,
                    },
                    TaskKind::TileGemm(g) => {
                        let green = plan.resources.green_sms.unwrap_or(hw.sm_count);
                        let cap = g
                            .sm_target
                            .unwrap_or(hw.sm_count)
                            .min(green)
                            .clamp(1, hw.sm_count);
                        // ficco's own kernel, with its hooks' cost.
                        let mut c = own::gemm_cost(hw, g.a.rows, g.a.cols, g.b.cols, cap, None);
                        c.wave_ms *= hw.own_gemm.tile_slowdown
                            * if g.dest_add {
                                hw.own_gemm.tile_acc_slowdown
                            } else {
                                1.0
                            };
                        let blocks = g.blocks().max(1);
                        let tiles_per_block = c.tiles.div_ceil(blocks).max(1);
                        Work::Tile(TileWork {
                            order: g.order().collect(),
                            pos: 0,
                            undispatched: vec![tiles_per_block; blocks],
                            spinning: vec![0; blocks],
                            spin_list: vec![],
                            done: vec![0; blocks],
                            tiles_per_block,
                            gate: vec![None; blocks],
                            want: (tiles_per_block * blocks).min(cap),
                            held: 0,
                            idle: 0,
                            waves: 0,
                            wave_ms: c.effective_wave_ms(),
                            launch_ms: c.launch_ms,
                        })
                    }
                };
                nodes.push(Node {
                    rank,
                    index,
                    hi: stream.priority == Priority::High,
                    work,
                    preds_left: 0,
                    succs: Vec::new(),
                    state: State::Blocked,
                    start: f64::NAN,
                    end: f64::NAN,
                    seq: 0,
                });
            }
        }
        // Stream order and explicit dependencies; flags through tile GEMM
        // blocks are per block (gates and block waiters), not whole-task edges.
        let graph = Graph::new(plan)?;
        let node_of = |id: TaskId| offset[id.rank] + id.index;
        let mut gates: Vec<Vec<(usize, usize)>> = vec![vec![]; total];
        let mut block_waiters: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
        let mut via_block = std::collections::HashSet::new();
        for l in crate::plan::signal::flag_links(plan)? {
            let (sig, wait) = (node_of(l.signal), node_of(l.wait));
            if let Some(b) = l.wait_block {
                gates[sig].push((wait, b));
                if let Work::Tile(t) = &mut nodes[wait].work {
                    t.gate[b] = Some(sig);
                }
                via_block.insert((sig, wait));
            } else if let Some(b) = l.signal_block {
                block_waiters.entry((sig, b)).or_default().push(wait);
                nodes[wait].preds_left += 1;
                via_block.insert((sig, wait));
            }
        }
        let mut preds: Vec<usize> = Vec::new();
        for (rank, rp) in plan.ranks.iter().enumerate() {
            for index in 0..rp.tasks.len() {
                let v = graph.node(TaskId { rank, index });
                let me = offset[rank] + index;
                preds.clear();
                preds.extend(graph.stream_pred(v));
                preds.extend_from_slice(graph.deps(v));
                preds.extend(
                    graph
                        .flag_preds(v)
                        .iter()
                        .filter(|&&u| !via_block.contains(&(u, v))),
                );
                preds.sort_unstable();
                preds.dedup();
                nodes[me].preds_left += preds.len();
                for &pr in &preds {
                    // A plain dependency on another rank's task runs as the
                    // GPU executor runs it (`plan::signal`): a flag written
                    // over NVLink, then the waiting stream's wake-up.
                    let delay = match hw.nvlink.flag_wait_us {
                        Some(w) if nodes[pr].rank != rank && graph.deps(v).contains(&pr) => {
                            (hw.nvlink.latency_us + w) / 1000.0
                        }
                        _ => 0.0,
                    };
                    nodes[pr].succs.push((me, delay));
                }
            }
        }
        // The producer's stream writes each such flag after the task (one
        // per consumer rank), holding that stream for the write's latency.
        if hw.nvlink.flag_wait_us.is_some() {
            let mut stream_next = vec![None; total];
            for v in 0..total {
                if let Some(u) = graph.stream_pred(v) {
                    stream_next[u] = Some(v);
                }
            }
            // Graph nodes are the simulator's nodes (rank-major order).
            for me in 0..total {
                let rank = nodes[me].rank;
                let mut to: Vec<usize> = nodes[me]
                    .succs
                    .iter()
                    .filter(|&&(s, d)| d > 0.0 && nodes[s].rank != rank)
                    .map(|&(s, _)| nodes[s].rank)
                    .collect();
                to.sort_unstable();
                to.dedup();
                if to.is_empty() {
                    continue;
                }
                let hold = to.len() as f64 * hw.nvlink.latency_us / 1000.0;
                let next = stream_next[me];
                for e in nodes[me].succs.iter_mut() {
                    if Some(e.0) == next {
                        e.1 = e.1.max(hold);
                    }
                }
            }
        }
        Ok(Sim {
            plan,
            hw,
            p,
            nodes,
            now: 0.0,
            timers: Vec::new(),
            active: Vec::new(),
            flows: Vec::new(),
            groups,
            held: vec![0; p],
            ce_busy: vec![0; p],
            sm_wait: vec![Vec::new(); p],
            ce_wait: vec![std::collections::VecDeque::new(); p],
            dirty: vec![false; p],
            next_seq: 0,
            done: 0,
            nccl_need: plan
                .resources
                .nccl_ctas
                .unwrap_or(hw.nccl_sms)
                .clamp(1, hw.sm_count),
            nccl_beside: plan.resources.green_sms.is_some()
                || plan.ranks.iter().flat_map(|r| &r.tasks).any(|t| {
                    matches!(
                        t.kind,
                        TaskKind::Gemm {
                            occupancy: Some(_),
                            ..
                        }
                    )
                }),
            nccl_scale: plan
                .resources
                .nccl_ctas
                .map_or(1.0, |n| (n as f64 / hw.nccl_sms.max(1) as f64).min(1.0)),
            green_rounds_scale: green_rounds_scale(plan, hw),
            gates,
            block_waiters,
        })
    }

    /// SMs an NCCL kernel takes from the rank's shared pool.
    fn nccl_held(&self) -> usize {
        if self.nccl_beside {
            0
        } else {
            self.nccl_need
        }
    }

    fn run(&mut self, plan: &Plan) -> Result<()> {
        for i in 0..self.nodes.len() {
            if self.nodes[i].preds_left == 0 {
                self.launch(i);
            }
        }
        loop {
            self.allocate();
            if self.done == self.nodes.len() {
                return Ok(());
            }
            self.update_rates();
            // Next event.
            let mut t_next = f64::INFINITY;
            for &(t, _) in &self.timers {
                t_next = t_next.min(t);
            }
            for a in &self.active {
                if a.rate > 0.0 {
                    t_next = t_next.min(self.now + a.remaining / a.rate);
                }
            }
            if !t_next.is_finite() {
                // Work pending but no finite next event: an overflowing time
                // (extreme profile or shape values) rather than a stuck plan.
                let overflow = !self.now.is_finite()
                    || self.timers.iter().any(|&(t, _)| !t.is_finite())
                    || self.active.iter().any(|a| {
                        !a.remaining.is_finite()
                            || (a.rate > 0.0 && !(a.remaining / a.rate).is_finite())
                    });
                if overflow {
                    return Err(Error::Profile(format!(
                        "hardware profile '{}' gives times beyond any finite value for this plan \
                         (an extreme bandwidth, latency or size)",
                        self.hw.name
                    )));
                }
                return Err(self.deadlock(plan));
            }
            let t_next = t_next.max(self.now);
            let dt = t_next - self.now;
            self.now = t_next;
            // Fluid progress and completions.
            let mut finished: Vec<ActKind> = Vec::new();
            let now = self.now;
            self.active.retain_mut(|a| {
                if a.rate > 0.0 && a.remaining / a.rate <= dt + EPS * now.max(1.0) {
                    finished.push(a.kind);
                    false
                } else {
                    a.remaining -= a.rate * dt;
                    true
                }
            });
            let mut fired: Vec<TimerKind> = Vec::new();
            self.timers.retain(|&(t, k)| {
                if t <= now + EPS * now.max(1.0) {
                    fired.push(k);
                    false
                } else {
                    true
                }
            });
            for k in fired {
                match k {
                    TimerKind::GemmLaunched(i) => {
                        let r = self.nodes[i].rank;
                        self.nodes[i].state = State::Running;
                        self.sm_wait[r].push(i);
                        self.dirty[r] = true;
                    }
                    TimerKind::FlowStarts(f) => {
                        let remaining = self.flow_work(f);
                        self.active.push(Active {
                            kind: ActKind::Flow(f),
                            remaining,
                            rate: 0.0,
                        });
                    }
                    TimerKind::FlagDone(i) => self.complete(i),
                    TimerKind::DepArrives(s) => self.release(s),
                }
            }
            for k in finished {
                self.finish(k);
            }
        }
    }
}
