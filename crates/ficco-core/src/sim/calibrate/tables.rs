//! nccl-tests-like text tables of a characterization: decomposition loss,
//! contention loss, every communication curve, and the fit.

use super::{Characterization, SplitDim, Traffic, Victim};
use std::fmt::Write as _;

/// nccl-tests-like text tables of everything measured.
pub fn tables(ch: &Characterization) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# ficco characterize on {}{} ({:.1} s)",
        ch.device,
        if ch.options.quick { ", quick" } else { "" },
        ch.elapsed_s
    );
    let _ = writeln!(t, "#\n# Decomposition loss: c pieces back to back on GPU 0, time / whole GEMM (K: partial products only, their sum not timed)");
    let chunks: Vec<usize> = {
        let mut c: Vec<usize> = ch
            .decomposition
            .iter()
            .flat_map(|s| s.splits.iter().map(|x| x.chunks))
            .collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    let mut h = format!(
        "# {:>6} {:>6} {:>6} {:>5} {:>9} {:>7}",
        "M", "K", "N", "split", "whole", "TFLOP/s"
    );
    for c in &chunks {
        h += &format!(" {:>6}", format!("c={c}"));
    }
    let _ = writeln!(t, "{h}");
    let mut u = format!(
        "# {:>6} {:>6} {:>6} {:>5} {:>9} {:>7}",
        "", "", "", "", "(ms)", ""
    );
    for _ in &chunks {
        u += &format!(" {:>6}", "(x)");
    }
    let _ = writeln!(t, "{u}");
    for s in &ch.decomposition {
        for d in SplitDim::ALL {
            let mut line = format!(
                "  {:>6} {:>6} {:>6} {:>5} {:>9.4} {:>7.0}",
                s.m,
                s.k,
                s.n,
                d.name(),
                s.whole_ms,
                s.whole_tflops
            );
            for c in &chunks {
                match s.splits.iter().find(|x| x.split == d && x.chunks == *c) {
                    Some(x) => line += &format!(" {:>6.3}", x.ratio),
                    None => line += &format!(" {:>6}", "-"),
                }
            }
            let _ = writeln!(t, "{line}");
        }
    }
    let _ = writeln!(
        t,
        "#\n# Contention loss: median victim task beside the other stream / alone"
    );
    let _ = writeln!(
        t,
        "# {:>6} {:>15} {:>4} {:>17} {:>10} {:>9} {:>9} {:>8}",
        "victim", "traffic", "P", "gemm MxKxN", "comm", "alone", "beside", "slowdown"
    );
    let _ = writeln!(
        t,
        "# {:>6} {:>15} {:>4} {:>17} {:>10} {:>9} {:>9} {:>8}",
        "", "", "", "", "(B)", "(ms)", "(ms)", "(x)"
    );
    for c in &ch.contention {
        let _ = writeln!(
            t,
            "  {:>6} {:>15} {:>4} {:>17} {:>10} {:>9.4} {:>9.4} {:>8.3}",
            match c.victim {
                Victim::Gemm => "gemm",
                Victim::Comm => "comm",
            },
            c.traffic.name(),
            c.gpus,
            format!("{}x{}x{}", c.gemm[0], c.gemm[1], c.gemm[2]),
            c.comm_bytes,
            c.alone_ms,
            c.together_ms,
            c.slowdown
        );
    }
    let mut keys: Vec<(Traffic, usize, usize)> = vec![];
    for p in &ch.curves {
        if !keys.contains(&(p.traffic, p.gpus, p.peers)) {
            keys.push((p.traffic, p.gpus, p.peers));
        }
    }
    for (tr, g, pe) in keys {
        let _ = writeln!(
            t,
            "#\n# {} on {} GPUs{}",
            tr.name(),
            g,
            if tr == Traffic::Copy {
                format!(", pull into GPU 0 from {pe} peer(s) at once")
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            t,
            "# {:>12} {:>10} {:>9} {:>9}",
            "size", "time", "algbw", "busbw"
        );
        let _ = writeln!(
            t,
            "# {:>12} {:>10} {:>9} {:>9}",
            "(B)", "(us)", "(GB/s)", "(GB/s)"
        );
        for p in ch
            .curves
            .iter()
            .filter(|p| p.traffic == tr && p.gpus == g && p.peers == pe)
        {
            let _ = writeln!(
                t,
                "  {:>12} {:>10.1} {:>9.1} {:>9.1}",
                p.bytes,
                p.time_ms * 1e3,
                p.algbw_gbs,
                p.busbw_gbs
            );
        }
    }
    if let Some(f) = &ch.fit {
        let _ = writeln!(
            t,
            "#\n# Fitted (time = latency + bytes / bw; collectives on bus bytes)"
        );
        let _ = writeln!(
            t,
            "# {:>15} {:>4} {:>5} {:>9} {:>9} {:>8}",
            "traffic", "P", "peers", "bw", "latency", "rms err"
        );
        let _ = writeln!(
            t,
            "# {:>15} {:>4} {:>5} {:>9} {:>9} {:>8}",
            "", "", "", "(GB/s)", "(us)", "(rel)"
        );
        for c in &f.curves {
            let _ = writeln!(
                t,
                "  {:>15} {:>4} {:>5} {:>9.1} {:>9.1} {:>8.3}",
                c.traffic.name(),
                c.gpus,
                c.peers,
                c.bw_gbs,
                c.latency_us,
                c.rms_rel_err
            );
        }
        if let Some(g) = &f.gemm {
            let _ = writeln!(
                t,
                "# GEMM: sustained {:.1} TFLOP/s, k_overhead {:.1} (RMS log error {:.3}; base profile {:.3}; {} samples)",
                g.sustained_tflops, g.k_overhead, g.rms_log_err_fit, g.rms_log_err_base, g.samples
            );
        }
        let c = &f.contention;
        let _ = writeln!(
            t,
            "# contention: gemm_slowdown_nccl {:.3} (raw {}), gemm_slowdown_copy {:.3}, nccl_slowdown_gemm {:.3}, copy_slowdown_gemm {:.3}",
            c.gemm_slowdown_nccl,
            f.gemm_slowdown_nccl_raw.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into()),
            c.gemm_slowdown_copy,
            c.nccl_slowdown_gemm,
            c.copy_slowdown_gemm
        );
    }
    t
}
