use super::*;
use ficco_core::plan::lower::lower;
use ficco_core::plan::BufferRole;
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::space::Schedule;

fn facts() -> CallFacts {
    CallFacts {
        sync: false,
        grows: false,
        cached: true,
        capable: true,
    }
}

#[test]
fn the_first_call_is_full_and_later_ones_fast_at_the_parity_of_the_last_full_run() {
    let mut e = Epoch::default();
    assert_eq!(e.path(facts()), Path::Full { quiet: false });
    e.after_full(1);
    assert_eq!(e.path(facts()), Path::Fast { parity: 1 });
    // A fast call leaves the banks as it found them (graph replays rely
    // on it), so every fast call runs at the same parity.
    e.after_fast();
    assert_eq!(e.path(facts()), Path::Fast { parity: 1 });
    e.after_fast();
    assert_eq!(e.path(facts()), Path::Fast { parity: 1 });
    // A full run of 3 iterations (a measurement) ends at parity 1.
    e.after_full(3);
    assert_eq!(e.path(facts()), Path::Fast { parity: 1 });
    e.after_full(2);
    assert_eq!(e.path(facts()), Path::Fast { parity: 0 });
}

#[test]
fn every_reason_for_the_full_path_takes_it_and_asks_for_quiet_after_fast_calls() {
    let mut e = Epoch::default();
    e.after_full(1);
    e.after_fast();
    for f in [
        CallFacts {
            sync: true,
            ..facts()
        },
        CallFacts {
            grows: true,
            ..facts()
        },
        CallFacts {
            cached: false,
            ..facts()
        },
        CallFacts {
            capable: false,
            ..facts()
        },
    ] {
        assert_eq!(e.path(f), Path::Full { quiet: true }, "{f:?}");
    }
    // After the quiet barrier and the full run: no quiet needed.
    e.quiet();
    assert!(!e.needs_quiet());
    e.after_full(1);
    assert_eq!(
        e.path(CallFacts {
            cached: false,
            ..facts()
        }),
        Path::Full { quiet: false }
    );
}

#[test]
fn a_failure_forgets_the_parity_until_a_full_run() {
    let mut e = Epoch::default();
    e.after_full(1);
    e.after_fast();
    e.failed();
    assert_eq!(e.path(facts()), Path::Full { quiet: true });
    e.quiet();
    e.after_full(1);
    assert_eq!(e.path(facts()), Path::Fast { parity: 1 });
}

fn plan(op: Op, m: usize, s: &str) -> Plan {
    let p = Problem::new(op, m, 512, 256, 2).expect("problem");
    lower(&p, &s.parse::<Schedule>().expect("schedule")).expect("lower")
}

#[test]
fn the_cache_keys_on_the_call_shape_and_forgets_everything_when_full() {
    let a = OpKey::of(&plan(Op::AgGemm, 1024, "shard-copy-ring"));
    let b = OpKey::of(&plan(Op::AgGemm, 2048, "shard-copy-ring"));
    let c = OpKey::of(&plan(Op::AgGemm, 1024, "fine2-copy-all"));
    let d = OpKey::of(&plan(Op::GemmRs, 1024, "shard-copy-ring"));
    assert_eq!(a, OpKey::of(&plan(Op::AgGemm, 1024, "shard-copy-ring")));
    let mut cache = OpCache::new(3);
    cache.insert(a.clone(), 1);
    cache.insert(b.clone(), 2);
    cache.insert(c.clone(), 3);
    assert_eq!(cache.get_mut(&a).copied(), Some(1));
    assert_eq!(cache.get_mut(&c).copied(), Some(3));
    assert!(!cache.contains(&d));
    // Replacing a shape keeps the others.
    cache.insert(b.clone(), 20);
    assert_eq!((cache.len(), cache.get_mut(&b).copied()), (3, Some(20)));
    // A fourth shape: everything goes, alike on every rank.
    cache.insert(d.clone(), 4);
    assert_eq!(cache.len(), 1);
    assert!(cache.contains(&d) && !cache.contains(&a));
}

#[test]
fn every_operator_plan_is_fast_capable_tile_included() {
    assert!(fast_capable(&plan(Op::AgGemm, 1024, "shard-copy-ring")));
    assert!(fast_capable(&plan(Op::GemmRs, 1024, "fine2-copy-all")));
    assert!(fast_capable(&plan(Op::GemmAr, 1024, "fine2-nccl-ring")));
    // Tile GEMMs take their flags and operands as launch arguments, and
    // `-acc`'s destination table is kept per address set.
    for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
        for s in ["tile-copy-ring", "tile-copy-all"] {
            assert!(fast_capable(&plan(op, 1024, s)), "{op:?} {s}");
        }
    }
    assert!(fast_capable(&plan(Op::GemmRs, 1024, "tile-copy-ring-acc")));
    assert!(fast_capable(&plan(Op::GemmAr, 1024, "tile-copy-all-acc")));
}

/// Distinct fake device addresses for every rank's plan buffers.
fn fake_arena(p: &Plan) -> Vec<Vec<DevicePtr>> {
    p.ranks
        .iter()
        .enumerate()
        .map(|(q, rp)| {
            (0..rp.buffers.len())
                .map(|b| DevicePtr(0x1000_0000 * (q as u64 + 1) + 0x10_0000 * b as u64))
                .collect()
        })
        .collect()
}

/// Rank 0's A, B and output as caller memory at 0xa000, 0xb000, 0xc000.
fn caller_operands(p: &Plan) -> Vec<Operand> {
    let rp = &p.ranks[0];
    [
        (BufferRole::InputA, 0xa000),
        (BufferRole::InputB, 0xb000),
        (BufferRole::Output, 0xc000),
    ]
    .into_iter()
    .map(|(role, addr)| Operand {
        role,
        addr,
        bytes: rp
            .buffer_with(role)
            .map(|b| rp.buffers[b].bytes())
            .expect("buffer"),
        shared: None,
        gathered: false,
    })
    .collect()
}

#[test]
fn operands_bind_in_place_or_copy_as_the_plan_uses_them() {
    let p = plan(Op::AgGemm, 1024, "shard-copy-ring");
    let uses = ficco_core::plan::validate::buffer_use(&p);
    let arena = fake_arena(&p);
    let rp = &p.ranks[0];
    let ops = caller_operands(&p);
    let got = bind_operands(&p, 0, &uses, arena.clone(), &ops).expect("binds");
    // Only this rank reads its shard (it pushes it to its peers): the
    // caller's memory itself, no copy in. B is rank-local too.
    let a = rp.buffer_with(BufferRole::InputA).expect("a");
    assert_eq!(got.ptrs[0][a], DevicePtr(0xa000));
    assert!(got.copy_in.is_empty() && got.copy_out.is_empty());
    let b = rp.buffer_with(BufferRole::InputB).expect("b");
    assert_eq!(got.ptrs[0][b], DevicePtr(0xb000));
    // gemm-ar on the copy engines: peers push into this rank's output,
    // so the output is the plan's own buffer, copied out after the call.
    let ar = plan(Op::GemmAr, 1024, "fine2-copy-all");
    let ar_uses = ficco_core::plan::validate::buffer_use(&ar);
    let out = ar.ranks[0].buffer_with(BufferRole::Output).expect("out");
    let ar_arena = fake_arena(&ar);
    let ar_ops = caller_operands(&ar);
    let got_ar = bind_operands(&ar, 0, &ar_uses, ar_arena.clone(), &ar_ops).expect("binds");
    assert_eq!(
        got_ar.copy_out,
        vec![(DevicePtr(0xc000), ar_arena[0][out], ar_ops[2].bytes)]
    );
    // Shared operands: every rank's in place (every call ends at a
    // barrier, so the caller may overwrite them once its stream resumes).
    let mut shared = ops.clone();
    shared[0].shared = Some(vec![DevicePtr(0x5000), DevicePtr(0x6000)]);
    let got = bind_operands(&p, 0, &uses, arena, &shared).expect("binds");
    assert!(got.copy_in.is_empty());
    assert_eq!(got.ptrs[0][a], DevicePtr(0x5000));
    assert_eq!(got.ptrs[1][a], DevicePtr(0x6000));
    // A wrong size is an error, not a silent overrun.
    let mut bad = ops.to_vec();
    bad[1].bytes += 2;
    let arena2 = vec![vec![DevicePtr(0x100); 8]; 2];
    assert!(bind_operands(&p, 0, &uses, arena2, &bad).is_err());
}

#[test]
fn a_gathered_a_is_copied_out_or_bound_in_place_with_the_own_shard_from_a() {
    // Copy engines: peers push into this rank's gathered buffer, so it is
    // copied out around rank 1's own rows, which come from its A.
    let p = plan(Op::AgGemm, 1024, "shard-copy-ring");
    let uses = ficco_core::plan::validate::buffer_use(&p);
    let arena = fake_arena(&p);
    let ag = p.ranks[1]
        .buffers
        .iter()
        .position(|b| b.name == ficco_core::plan::lower::GATHERED_A)
        .expect("ag");
    let bytes = p.ranks[1].buffers[ag].bytes();
    let half = bytes / 2;
    let mut ops = caller_operands(&p);
    ops.push(Operand {
        role: BufferRole::Scratch,
        addr: 0xd000,
        bytes,
        shared: None,
        gathered: true,
    });
    let got = bind_operands(&p, 1, &uses, arena.clone(), &ops).expect("binds");
    let src = arena[1][ag];
    assert_eq!(
        got.copy_out,
        vec![
            (DevicePtr(0xd000), src, half),
            (DevicePtr(0xd000 + half as u64), DevicePtr(0xa000), half),
        ]
    );
    // NCCL: only this rank writes it, so the plan gathers into the caller's
    // buffer itself; the own rows still come from A.
    let n = plan(Op::AgGemm, 1024, "shard-nccl-ring");
    let n_uses = ficco_core::plan::validate::buffer_use(&n);
    let mut n_ops = caller_operands(&n);
    n_ops.push(Operand {
        bytes,
        ..ops[3].clone()
    });
    let got = bind_operands(&n, 0, &n_uses, fake_arena(&n), &n_ops).expect("binds");
    let n_ag = n.ranks[0]
        .buffers
        .iter()
        .position(|b| b.name == ficco_core::plan::lower::GATHERED_A)
        .expect("ag");
    assert_eq!(got.ptrs[0][n_ag], DevicePtr(0xd000));
    assert_eq!(
        got.copy_out,
        vec![(DevicePtr(0xd000), DevicePtr(0xa000), half)]
    );
    // Another op has no gathered A; a wrong size is refused.
    let rs = plan(Op::GemmRs, 1024, "shard-copy-ring");
    let mut rs_ops = caller_operands(&rs);
    rs_ops.push(ops[3].clone());
    let rs_uses = ficco_core::plan::validate::buffer_use(&rs);
    assert!(bind_operands(&rs, 0, &rs_uses, fake_arena(&rs), &rs_ops).is_err());
    ops[3].bytes += 2;
    assert!(bind_operands(&p, 1, &uses, arena, &ops).is_err());
}

/// The barrier banks' words as the fast steps use them, under every
/// interleaving a seeded scheduler finds: a word is never set while still
/// set (a lost signal), each wait passes on its own call's signal (no stale
/// one), nothing deadlocks, and after any number of calls the banks are as
/// the last full run left them (so a captured call replays).
#[test]
fn fast_calls_keep_the_barrier_banks_in_step_under_every_interleaving() {
    #[derive(Clone, Copy)]
    enum B {
        WaitPeers,
        SignalEnd,
        WaitAllEnded,
        SignalDone,
    }
    let steps = [B::WaitPeers, B::SignalEnd, B::WaitAllEnded, B::SignalDone];
    for world in 2..=4usize {
        for seed in 0..400u64 {
            let calls = 5usize;
            // bank[b][r][q]: rank q's word in rank r's bank b, with the call
            // that set it. Bank 0 is preset (the last full run's end).
            let mut bank = vec![vec![vec![None::<i64>; world]; world]; 2];
            for (r, words) in bank[0].iter_mut().enumerate() {
                for (q, w) in words.iter_mut().enumerate() {
                    if q != r {
                        *w = Some(-1);
                    }
                }
            }
            let (wait_bank, end_bank) = (0, 1);
            let mut pc = vec![0usize; world];
            let total = calls * steps.len();
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            loop {
                let runnable: Vec<usize> = (0..world)
                    .filter(|&r| {
                        if pc[r] >= total {
                            return false;
                        }
                        let call = (pc[r] / steps.len()) as i64;
                        let peers = (0..world).filter(move |&q| q != r);
                        match steps[pc[r] % steps.len()] {
                            B::WaitPeers => peers.clone().all(|q| bank[wait_bank][r][q].is_some()),
                            B::WaitAllEnded => {
                                peers.clone().all(|q| bank[end_bank][r][q] == Some(call))
                            }
                            _ => true,
                        }
                    })
                    .collect();
                if runnable.is_empty() {
                    assert!(
                        pc.iter().all(|&p| p == total),
                        "deadlock at {pc:?} (P={world}, seed {seed})"
                    );
                    break;
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let r = runnable[(rng % runnable.len() as u64) as usize];
                let call = (pc[r] / steps.len()) as i64;
                for q in (0..world).filter(|&q| q != r) {
                    match steps[pc[r] % steps.len()] {
                        B::WaitPeers => {
                            assert_eq!(bank[wait_bank][r][q], Some(call - 1), "stale end signal");
                            bank[wait_bank][r][q] = None;
                        }
                        B::WaitAllEnded => bank[end_bank][r][q] = None,
                        B::SignalEnd => {
                            assert_eq!(bank[end_bank][q][r], None, "lost end signal");
                            bank[end_bank][q][r] = Some(call);
                        }
                        B::SignalDone => {
                            assert_eq!(bank[wait_bank][q][r], None, "lost done signal");
                            bank[wait_bank][q][r] = Some(call);
                        }
                    }
                }
                pc[r] += 1;
            }
            for (r, (waits, ends)) in bank[wait_bank].iter().zip(&bank[end_bank]).enumerate() {
                for q in (0..world).filter(|&q| q != r) {
                    assert_eq!(waits[q], Some(calls as i64 - 1));
                    assert_eq!(ends[q], None);
                }
            }
        }
    }
}

#[test]
fn a_call_graph_is_captured_at_the_second_call_at_an_address_set_and_replayed_after() {
    let mut g: CallGraphs<&str> = CallGraphs::new(2);
    let (x, y, z) = (vec![1, 2, 3], vec![1, 2, 4], vec![9]);
    assert_eq!(g.action(x.clone()), Seen::First);
    assert_eq!(g.action(x.clone()), Seen::Again);
    g.insert(x.clone(), "graph x");
    assert_eq!(g.action(x.clone()), Seen::Replay(&"graph x"));
    // Another address set is counted on its own.
    assert_eq!(g.action(y.clone()), Seen::First);
    assert_eq!(g.action(x.clone()), Seen::Replay(&"graph x"));
    // Full (x's graph, y seen once): a third set takes y's place, never
    // a graph's (nothing waits for graphs in flight, nothing is freed).
    assert_eq!(g.action(z.clone()), Seen::First);
    assert_eq!(g.action(z.clone()), Seen::Again);
    g.insert(z.clone(), "graph z");
    assert_eq!(g.action(y.clone()), Seen::First);
    assert_eq!(
        g.action(y),
        Seen::First,
        "full of graphs: y is not recorded"
    );
    assert_eq!(g.action(x), Seen::Replay(&"graph x"));
    assert_eq!(g.action(z), Seen::Replay(&"graph z"));
}

#[test]
fn captures_stop_where_they_do_not_pay_back_and_resume_once_replays_catch_up() {
    let mut g: CallGraphs<u64> = CallGraphs::new(1000);
    // Operands that move every other call: each address set seen twice.
    let mut captured = 0;
    for set in 0..20u64 {
        for _ in 0..2 {
            if g.action(vec![set]) == Seen::Again {
                g.insert(vec![set], set);
                captured += 1;
            }
        }
    }
    assert_eq!(
        captured, FREE_CAPTURES,
        "captures beyond the free ones must pay back"
    );
    // Replays of the graphs made pay them back, and capturing resumes.
    for _ in 0..FREE_CAPTURES * PAYBACK {
        assert!(matches!(g.action(vec![0]), Seen::Replay(_)));
    }
    assert_eq!(g.action(vec![19]), Seen::Again);
}

#[test]
fn the_graph_key_names_every_address_the_call_uses() {
    let b = Bound {
        ptrs: vec![
            vec![DevicePtr(0x10), DevicePtr(0x20)],
            vec![DevicePtr(0x30)],
        ],
        copy_in: vec![(DevicePtr(0x40), DevicePtr(0x50), 8)],
        copy_out: vec![(DevicePtr(0x60), DevicePtr(0x70), 16)],
    };
    assert_eq!(
        b.where_key(),
        vec![0x10, 0x20, 0x30, 0x40, 0x50, 8, 0x60, 0x70, 16]
    );
    let mut moved = b.clone();
    moved.copy_in[0].1 = DevicePtr(0x58);
    assert_ne!(moved.where_key(), b.where_key());
}
