//! The simulator's event steps: launching tasks, sharing SMs, copy engines
//! and links among what runs, finishing what completes, and the deadlock
//! report. [`super::Sim::run`] drives them; the types are in [`super`].

use super::*;

impl<'a> Sim<'a> {
    /// Bytes a flow moves (its progress unit).
    pub(super) fn flow_work(&self, f: usize) -> f64 {
        self.flows[f].usage_work
    }

    pub(super) fn launch(&mut self, i: usize) {
        let r = self.nodes[i].rank;
        self.nodes[i].seq = self.next_seq;
        self.next_seq += 1;
        match self.nodes[i].work {
            Work::Tile(TileWork { launch_ms, .. }) | Work::Gemm { launch_ms, .. } => {
                self.nodes[i].state = State::Launching;
                self.nodes[i].start = self.now;
                self.timers
                    .push((self.now + launch_ms, TimerKind::GemmLaunched(i)));
            }
            Work::Copy { .. } => {
                self.nodes[i].state = State::Waiting;
                self.ce_wait[r].push_back(i);
                self.dirty[r] = true;
            }
            Work::Nccl { .. } | Work::Reduce { .. } => {
                self.nodes[i].state = State::Waiting;
                self.sm_wait[r].push(i);
                self.dirty[r] = true;
            }
            Work::Flag { ms, wait } => {
                self.nodes[i].state = State::Running;
                self.nodes[i].start = self.now;
                // A Wait's `ms` is when its flag is seen (absolute).
                let end = if wait {
                    ms.max(self.now)
                } else {
                    self.now + ms
                };
                self.timers.push((end, TimerKind::FlagDone(i)));
            }
        }
    }

    /// Hands free SMs and copy engines to waiting tasks on every dirty rank.
    pub(super) fn allocate(&mut self) {
        for r in 0..self.p {
            if !std::mem::take(&mut self.dirty[r]) {
                continue;
            }
            // Copy engines.
            while self.ce_busy[r] < self.hw.copy_engine.count {
                let Some(i) = self.ce_wait[r].pop_front() else {
                    break;
                };
                self.ce_busy[r] += 1;
                self.start_copy(i);
            }
            self.allocate_sms(r);
        }
    }

    /// Hands free SMs of rank `r` to waiting kernels: high-priority ones first,
    /// then in launch order. A GEMM takes as many SMs as it may for its
    /// undispatched tiles; a normal-priority NCCL or reduce kernel that does
    /// not fit blocks the kernels launched after it (in-order dispatch).
    pub(super) fn allocate_sms(&mut self, r: usize) {
        if self.sm_wait[r].is_empty() {
            return;
        }
        let sm = self.hw.sm_count;
        // High-priority kernels are resident at once only where GEMM blocks
        // end tile by tile; persistent GEMM blocks keep their SMs.
        let preempt = !self.hw.gemm.persistent;
        let nodes = &self.nodes;
        self.sm_wait[r].sort_by_key(|&i| (!nodes[i].hi, nodes[i].seq));
        let mut k = 0;
        while k < self.sm_wait[r].len() {
            let i = self.sm_wait[r][k];
            let free = sm.saturating_sub(self.held[r]);
            let hi = self.nodes[i].hi;
            // Whether the task leaves the queue, and whether later ones may pass it.
            let (leaves, blocks) = match self.nodes[i].work {
                Work::Gemm {
                    ref mut undispatched,
                    ref mut long_units,
                    unit_tiles,
                    cap,
                    wave_ms,
                    ref mut held,
                    ref mut waves,
                    ..
                } => {
                    let g = free.min(cap.saturating_sub(*held)).min(*undispatched);
                    if g > 0 {
                        *undispatched -= g;
                        *held += g;
                        self.held[r] += g;
                        // Longer blocks first, then the rest.
                        let gl = g.min(*long_units);
                        *long_units -= gl;
                        for (n, tiles) in [(gl, unit_tiles + 1), (g - gl, unit_tiles)] {
                            if n > 0 && tiles > 0 {
                                *waves += 1;
                                self.active.push(Active {
                                    kind: ActKind::Wave(i, n),
                                    remaining: wave_ms * tiles as f64,
                                    rate: 0.0,
                                });
                            }
                        }
                    }
                    (*undispatched == 0, false)
                }
                Work::Nccl { group } => {
                    let need = self.nccl_held();
                    if (hi && preempt) || free >= need {
                        self.held[r] += need;
                        self.nodes[i].state = State::Resident;
                        self.nodes[i].start = self.now;
                        self.groups[group].resident += 1;
                        if self.groups[group].resident == self.groups[group].members.len() {
                            self.start_group(group);
                        }
                        (true, false)
                    } else {
                        (false, true)
                    }
                }
                Work::Reduce { nominal_ms, .. } => {
                    let want = self.hw.reduce.full_bw_sms.min(sm);
                    let got = if hi && preempt { want } else { want.min(free) };
                    if got > 0 {
                        self.held[r] += got;
                        self.nodes[i].work = Work::Reduce {
                            nominal_ms,
                            sms: got,
                        };
                        self.nodes[i].state = State::Running;
                        self.nodes[i].start = self.now;
                        self.active.push(Active {
                            kind: ActKind::Reduce(i),
                            remaining: nominal_ms,
                            rate: 0.0,
                        });
                        (true, false)
                    } else {
                        (false, true)
                    }
                }
                Work::Tile(ref mut t) => {
                    // A kernel with every tile handed out needs no more SMs.
                    let left = t.pos < t.order.len();
                    let g = if left { free.min(t.want - t.held) } else { 0 };
                    t.held += g;
                    t.idle += g;
                    self.held[r] += g;
                    let full = t.held == t.want || !left;
                    self.dispatch_tiles(i);
                    (full, false)
                }
                Work::Copy { .. } => unreachable!("copies wait for copy engines"),
                Work::Flag { .. } => unreachable!("signals and waits take no SMs"),
            };
            if leaves {
                self.sm_wait[r].remove(k);
            } else {
                k += 1;
            }
            if blocks && !hi {
                break;
            }
        }
    }

    pub(super) fn start_copy(&mut self, i: usize) {
        let Work::Copy { bytes, src, dst } = self.nodes[i].work else {
            unreachable!()
        };
        self.nodes[i].state = State::Moving;
        self.nodes[i].start = self.now;
        let p = self.p;
        let pull = src != self.nodes[i].rank;
        let (lat, gbs) = cost::copy_params(self.hw, pull);
        let (usage, cap) = if src == dst {
            (
                Vec::new(),
                cost::bytes_per_ms(gbs.min(self.hw.hbm_gbs / 2.0)),
            )
        } else {
            (vec![(src, 1.0), (p + dst, 1.0)], cost::bytes_per_ms(gbs))
        };
        let f = self.flows.len();
        self.flows.push(Flow {
            members: vec![i],
            usage,
            usage_work: bytes,
            cap,
            is_copy: true,
            // Only pushes to a peer share the fan-out limit: local copies stay
            // in HBM, and concurrent pulls measured at full speed (run 3).
            issuer: (src != dst && !pull).then_some(src),
            ranks: if src == dst {
                vec![src]
            } else {
                vec![src, dst]
            },
        });
        self.timers.push((self.now + lat, TimerKind::FlowStarts(f)));
    }

    pub(super) fn start_group(&mut self, g: usize) {
        let members = self.groups[g].members.clone();
        let p = self.p;
        let gpus = members.len();
        let hw = self.hw;
        let mut usage = Vec::new();
        let mut ranks = Vec::new();
        let (work, cap, lat_ms);
        let first = &self.nodes[members[0]];
        let first_op = self.op_of(first.rank, first.index);
        match first_op.collective() {
            Some(coll) => {
                let g2 = gpus.max(2);
                work = first_op.bytes_sent(g2) as f64;
                let size = nccl_size(first_op);
                let (l, bw) = cost::collective_protocol(hw, coll, size, g2);
                cap = bw * self.green_rounds_scale;
                lat_ms = l;
                for &m in &members {
                    let r = self.nodes[m].rank;
                    usage.push((r, 1.0));
                    usage.push((p + r, 1.0));
                    ranks.push(r);
                }
            }
            None => {
                let mut sent = vec![0.0; p];
                let mut recv = vec![0.0; p];
                // Fewest peers any rank talks to (the per-peer limit).
                let mut peers = usize::MAX;
                for &m in &members {
                    let r = self.nodes[m].rank;
                    ranks.push(r);
                    if let NcclOp::SendRecv { sends, recvs } = self.op_of(r, self.nodes[m].index) {
                        sent[r] += sends.iter().map(|(_, v)| v.bytes() as f64).sum::<f64>();
                        recv[r] += recvs.iter().map(|(_, v)| v.bytes() as f64).sum::<f64>();
                        let mut qs: Vec<usize> = sends.iter().map(|(q, _)| *q).collect();
                        qs.sort_unstable();
                        qs.dedup();
                        peers = peers.min(qs.len().max(1));
                    }
                }
                let w = sent
                    .iter()
                    .chain(recv.iter())
                    .fold(0.0f64, |a, &b| a.max(b));
                work = w;
                let (lat_us, peer_gbs) = hw.p2p(p);
                let per_peer = peer_gbs.map_or(f64::INFINITY, |g| g * peers.min(p) as f64);
                cap = cost::bytes_per_ms(hw.nccl.p2p_bus_gbs.min(per_peer));
                lat_ms = lat_us * 1e-3;
                if w > 0.0 {
                    for r in 0..p {
                        if sent[r] > 0.0 {
                            usage.push((r, sent[r] / w));
                        }
                        if recv[r] > 0.0 {
                            usage.push((p + r, recv[r] / w));
                        }
                    }
                }
            }
        }
        ranks.sort_unstable();
        ranks.dedup();
        let f = self.flows.len();
        self.flows.push(Flow {
            members,
            usage,
            usage_work: work,
            cap: cap * self.nccl_scale,
            is_copy: false,
            issuer: None,
            ranks,
        });
        self.timers
            .push((self.now + lat_ms, TimerKind::FlowStarts(f)));
    }

    pub(super) fn op_of(&self, rank: usize, index: usize) -> &'a NcclOp {
        match &self.plan.ranks[rank].tasks[index].kind {
            TaskKind::Nccl { op, .. } => op,
            _ => unreachable!("group members are NCCL tasks"),
        }
    }

    pub(super) fn finish(&mut self, k: ActKind) {
        match k {
            ActKind::Wave(i, g) => {
                let r = self.nodes[i].rank;
                let Work::Gemm {
                    undispatched,
                    ref mut held,
                    ref mut waves,
                    ..
                } = self.nodes[i].work
                else {
                    unreachable!()
                };
                *held -= g;
                *waves -= 1;
                let finished = undispatched == 0 && *waves == 0;
                self.held[r] -= g;
                self.dirty[r] = true;
                if finished {
                    self.complete(i);
                }
            }
            ActKind::Tile(i, b, n) => {
                let per_block = {
                    let Work::Tile(t) = &mut self.nodes[i].work else {
                        unreachable!()
                    };
                    t.done[b] += n;
                    t.idle += n;
                    t.waves -= 1;
                    (t.done[b] == t.tiles_per_block).then_some(b)
                };
                if let Some(b) = per_block {
                    for w in self.block_waiters.remove(&(i, b)).unwrap_or_default() {
                        self.nodes[w].preds_left -= 1;
                        if self.nodes[w].preds_left == 0 {
                            self.launch(w);
                        }
                    }
                }
                self.dispatch_tiles(i);
            }
            ActKind::Reduce(i) => {
                let r = self.nodes[i].rank;
                if let Work::Reduce { sms, .. } = self.nodes[i].work {
                    self.held[r] -= sms;
                }
                self.dirty[r] = true;
                self.complete(i);
            }
            ActKind::Flow(f) => {
                let members = std::mem::take(&mut self.flows[f].members);
                let is_copy = self.flows[f].is_copy;
                for m in members {
                    let r = self.nodes[m].rank;
                    if is_copy {
                        self.ce_busy[r] -= 1;
                    } else {
                        self.held[r] -= self.nccl_held();
                    }
                    self.dirty[r] = true;
                    self.complete(m);
                }
            }
        }
    }

    /// Hands a running tile GEMM's idle SMs the next tiles in block order
    /// (spinning on blocks whose flag is not yet signalled), starts spinning
    /// SMs of blocks that became ready, frees SMs with no tile left, and
    /// completes the GEMM when every tile is done.
    pub(super) fn dispatch_tiles(&mut self, i: usize) {
        if self.nodes[i].state != State::Running {
            return;
        }
        let r = self.nodes[i].rank;
        // Out of its node while it changes, so that the gates' nodes can be
        // read; only the spinning blocks and those handed out are looked at
        // (every block at every call was quadratic at large GPU counts).
        let mut t = match std::mem::replace(
            &mut self.nodes[i].work,
            Work::Flag {
                ms: 0.0,
                wait: false,
            },
        ) {
            Work::Tile(t) => t,
            other => {
                self.nodes[i].work = other;
                return;
            }
        };
        let nodes = &self.nodes;
        let open = |g: Option<usize>| g.is_none_or(|s| nodes[s].state == State::Done);
        let mut start: Vec<(usize, usize)> = vec![];
        // Spinning blocks whose flag is now set, in block order.
        t.spin_list.sort_unstable();
        let mut still = Vec::with_capacity(t.spin_list.len());
        for &b in &t.spin_list {
            if open(t.gate[b]) {
                start.push((b, std::mem::take(&mut t.spinning[b])));
            } else {
                still.push(b);
            }
        }
        t.spin_list = still;
        while t.idle > 0 && t.pos < t.order.len() {
            let b = t.order[t.pos];
            let n = t.idle.min(t.undispatched[b]);
            t.idle -= n;
            t.undispatched[b] -= n;
            if open(t.gate[b]) {
                start.push((b, n));
            } else {
                if t.spinning[b] == 0 && n > 0 {
                    t.spin_list.push(b);
                }
                t.spinning[b] += n;
            }
            if t.undispatched[b] == 0 {
                t.pos += 1;
            }
        }
        let wave_ms = t.wave_ms;
        t.waves += start.len();
        let mut freed = 0;
        if t.pos == t.order.len() {
            // Nothing left to hand out: idle CTAs exit.
            freed = std::mem::take(&mut t.idle);
            t.held -= freed;
        }
        let finished = t.pos == t.order.len() && t.waves == 0 && t.held == 0;
        self.nodes[i].work = Work::Tile(t);
        for (b, n) in start {
            self.active.push(Active {
                kind: ActKind::Tile(i, b, n),
                remaining: wave_ms,
                rate: 0.0,
            });
        }
        if freed > 0 {
            self.held[r] -= freed;
            self.dirty[r] = true;
        }
        if finished {
            self.complete(i);
        }
    }

    pub(super) fn complete(&mut self, i: usize) {
        self.nodes[i].state = State::Done;
        self.nodes[i].end = self.now;
        self.done += 1;
        for (g, _) in std::mem::take(&mut self.gates[i]) {
            self.dispatch_tiles(g);
        }
        let succs = std::mem::take(&mut self.nodes[i].succs);
        if let Work::Flag { wait: false, .. } = self.nodes[i].work {
            // A Signal: its Waits end when the flag is seen, `flag_wait_us`
            // from now (at once if they reach it later).
            let seen = self.now + self.hw.nvlink.flag_wait_us.unwrap_or(0.0) / 1000.0;
            for &(s, _) in &succs {
                if let Work::Flag {
                    ref mut ms,
                    wait: true,
                } = self.nodes[s].work
                {
                    *ms = ms.max(seen);
                }
            }
        }
        for &(s, delay) in &succs {
            if delay > 0.0 {
                self.timers
                    .push((self.now + delay, TimerKind::DepArrives(s)));
            } else {
                self.release(s);
            }
        }
        self.nodes[i].succs = succs;
    }

    /// One of `s`'s predecessors is done: launches it when it was the last.
    pub(super) fn release(&mut self, s: usize) {
        self.nodes[s].preds_left -= 1;
        if self.nodes[s].preds_left == 0 {
            self.launch(s);
        }
    }

    /// Recomputes every active rate: GEMM waves from contention, reduces from
    /// their SMs, flows by max-min fair sharing of NVLink.
    pub(super) fn update_rates(&mut self) {
        let p = self.p;
        let c = &self.hw.contention;
        let mut gemm_on = vec![false; p];
        // Per rank: a GEMM running (its task), and whether a second one is.
        let mut gemm_task: Vec<Option<usize>> = vec![None; p];
        let mut two_gemms = vec![false; p];
        let mut nccl_on = vec![false; p];
        let mut copy_on = vec![false; p];
        for a in &self.active {
            match a.kind {
                ActKind::Wave(i, _) | ActKind::Tile(i, _, _) => {
                    let r = self.nodes[i].rank;
                    gemm_on[r] = true;
                    match gemm_task[r] {
                        None => gemm_task[r] = Some(i),
                        Some(j) if j != i => two_gemms[r] = true,
                        _ => {}
                    }
                }
                ActKind::Flow(f) => {
                    let fl = &self.flows[f];
                    for &r in &fl.ranks {
                        if fl.is_copy {
                            copy_on[r] = true;
                        } else {
                            nccl_on[r] = true;
                        }
                    }
                }
                ActKind::Reduce(_) => {}
            }
        }
        // Flow caps under contention.
        let mut flow_ix: Vec<usize> = Vec::new();
        let mut caps: Vec<f64> = Vec::new();
        for (ai, a) in self.active.iter().enumerate() {
            if let ActKind::Flow(f) = a.kind {
                let fl = &self.flows[f];
                let slowed = fl.ranks.iter().any(|&r| gemm_on[r]);
                let div = match (slowed, fl.is_copy) {
                    (false, _) => 1.0,
                    (true, true) => c.copy_slowdown_gemm,
                    (true, false) => c.nccl_slowdown_gemm,
                };
                flow_ix.push(ai);
                caps.push(fl.cap / div);
            }
        }
        let rates = self.water_fill(&flow_ix, &caps);
        for (j, &ai) in flow_ix.iter().enumerate() {
            self.active[ai].rate = rates[j];
        }
        let full = self.hw.reduce.full_bw_sms as f64;
        for a in &mut self.active {
            match a.kind {
                ActKind::Wave(i, _) | ActKind::Tile(i, _, _) => {
                    let r = self.nodes[i].rank;
                    let mut s: f64 = 1.0;
                    if nccl_on[r] {
                        s = s.max(c.gemm_slowdown_nccl);
                    }
                    if copy_on[r] {
                        s = s.max(c.gemm_slowdown_copy);
                    }
                    if two_gemms[r] {
                        s *= c.gemm_slowdown_gemm;
                    }
                    a.rate = 1.0 / s;
                }
                ActKind::Reduce(i) => {
                    if let Work::Reduce { sms, .. } = self.nodes[i].work {
                        a.rate = (sms as f64 / full).min(1.0);
                    }
                }
                ActKind::Flow(_) => {}
            }
        }
    }

    /// Max-min fair rates (bytes/ms) of the flows at `flow_ix` (indices into
    /// `active`) with rate caps `caps`, over every GPU's egress and ingress.
    pub(super) fn water_fill(&self, flow_ix: &[usize], caps: &[f64]) -> Vec<f64> {
        let n = flow_ix.len();
        let mut rate = vec![0.0; n];
        if n == 0 {
            return rate;
        }
        let p = self.p;
        let link = cost::bytes_per_ms(self.hw.nvlink.usable_gbs);
        // Resources: egress (r), ingress (P + r), and the copy engines of
        // rank r together (2P + r), bounded only while two or more of its
        // copies move bytes (`copy_engine.fanout_gbs`).
        let mut residual = vec![link; 2 * p];
        let flow_of = |j: usize| -> &Flow {
            let ActKind::Flow(f) = self.active[flow_ix[j]].kind else {
                unreachable!()
            };
            &self.flows[f]
        };
        let mut issued = vec![0usize; p];
        for j in 0..n {
            if let Some(r) = flow_of(j).issuer {
                issued[r] += 1;
            }
        }
        let fanout = self.hw.copy_engine.fanout_gbs.map(cost::bytes_per_ms);
        residual.extend(issued.iter().map(|&k| match fanout {
            Some(bw) if k >= 2 => bw,
            _ => f64::INFINITY,
        }));
        let mut frozen = vec![false; n];
        let usage = |j: usize| {
            let fl = flow_of(j);
            fl.usage
                .iter()
                .copied()
                .chain(fl.issuer.map(|r| (2 * p + r, 1.0)))
        };
        let mut load = vec![0.0; 3 * p];
        loop {
            load.iter_mut().for_each(|x| *x = 0.0);
            let mut any = false;
            let mut delta = f64::INFINITY;
            for j in 0..n {
                if frozen[j] {
                    continue;
                }
                any = true;
                delta = delta.min(caps[j] - rate[j]);
                for (res, coef) in usage(j) {
                    load[res] += coef;
                }
            }
            if !any {
                break;
            }
            for res in 0..load.len() {
                if load[res] > 0.0 && residual[res].is_finite() {
                    delta = delta.min(residual[res] / load[res]);
                }
            }
            let delta = delta.max(0.0);
            for res in 0..load.len() {
                residual[res] -= delta * load[res];
            }
            for j in 0..n {
                if frozen[j] {
                    continue;
                }
                rate[j] += delta;
                let saturated = usage(j).any(|(res, _)| residual[res] <= link * 1e-9);
                if rate[j] >= caps[j] * (1.0 - 1e-12) || saturated {
                    frozen[j] = true;
                }
            }
        }
        rate
    }

    pub(super) fn deadlock(&self, plan: &Plan) -> Error {
        let stuck = self
            .nodes
            .iter()
            .find(|n| n.state == State::Resident)
            .or_else(|| self.nodes.iter().find(|n| n.state != State::Done))
            .expect("not all done");
        let task = &plan.ranks[stuck.rank].tasks[stuck.index];
        let why = match stuck.state {
            State::Resident => {
                "its NCCL rendezvous never completes: some rank's matching task never becomes ready"
            }
            State::Blocked => "it waits on tasks that never finish (a dependency cycle)",
            _ => "the resources it waits for are never released",
        };
        Error::InvalidPlan(format!(
            "deadlock at {:.4} ms: task '{}' (rank {}, index {}) can never finish: {}",
            self.now, task.label, stuck.rank, stuck.index, why
        ))
    }
}
