//! `gemm_bench`: ficco's Hopper GEMM vs cuBLASLt (autotuned and default
//! heuristic) on GPU 0, over the whole and chunk GEMMs of a suite, plus the
//! cost of each hook.
//!
//! ```text
//! gemm_bench [--suite suites/llama3.toml] [--json OUT.json] [--iters N] [--warmup N]
//!            [--max-shapes N] [--no-hooks]
//! ```

use ficco_cuda::hgemm::bench::{suite_shapes, summarize, Bench, BenchConfig, BenchShape};
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gemm_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut suite = "suites/llama3.toml".to_string();
    let mut json: Option<String> = None;
    let mut cfg = BenchConfig::default();
    let mut max_shapes = usize::MAX;
    let mut hooks = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--suite" => suite = val("--suite")?,
            "--json" => json = Some(val("--json")?),
            "--iters" => cfg.iters = val("--iters")?.parse()?,
            "--warmup" => cfg.warmup = val("--warmup")?.parse()?,
            "--max-shapes" => max_shapes = val("--max-shapes")?.parse()?,
            "--no-hooks" => hooks = false,
            "-h" | "--help" => {
                println!("gemm_bench [--suite FILE] [--json OUT] [--iters N] [--warmup N] [--max-shapes N] [--no-hooks]");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    ficco_cuda::loader::require()?;
    let text = std::fs::read_to_string(&suite).map_err(|e| format!("{suite}: {e}"))?;
    let mut shapes = suite_shapes(&text, &suite)?;
    // The acceptance shape of the issue, first.
    shapes.insert(
        0,
        BenchShape {
            m: 8192,
            n: 8192,
            k: 8192,
            kind: "square",
            uses: vec!["8192^3".into()],
        },
    );
    shapes.truncate(max_shapes);
    let ctx = cudarc::driver::CudaContext::new(0)?;
    let name = ctx.name().unwrap_or_default();
    let mut bench = Bench::new(&ctx, cfg)?;
    let ci = bench.gemm().compile_info().clone();
    println!(
        "# device: {name}, {} SMs; ficco hgemm cubin: {:.1} ms ({:?}, NVRTC {}.{}){}",
        bench.gemm().sms(),
        ci.ms,
        ci.cache,
        ci.nvrtc.0,
        ci.nvrtc.1,
        ci.path
            .as_ref()
            .map(|p| format!(", {}", p.display()))
            .unwrap_or_default()
    );
    println!(
        "# {} shapes from {suite}; median of {} after {} warm-up; ratio = ficco time / cuBLASLt time",
        shapes.len(),
        cfg.iters,
        cfg.warmup
    );
    println!(
        "#{:>7} {:>6} {:>6} {:>6} {:>7} | {:>8} {:>7} | {:>8} {:>7} | {:>8} {:>7} | {:>6} {:>6} | {:>8} {:>8}",
        "M", "N", "K", "kind", "tile/S", "ficco ms", "TFLOP/s", "tuned ms", "TFLOP/s", "dflt ms", "TFLOP/s",
        "r_tun", "r_dflt", "err", "err_dflt"
    );
    let mut rows = vec![];
    for s in &shapes {
        let r = bench.shape(s)?;
        println!(
            " {:>7} {:>6} {:>6} {:>6} {:>7} | {:>8.4} {:>7.1} | {:>8.4} {:>7.1} | {:>8.4} {:>7.1} | {:>6.3} {:>6.3} | {:>8.1e} {:>8.1e}",
            r.m, r.n, r.k, r.kind, format!("{}/{}", r.tile_n.cols(), r.splits), r.ficco_ms, r.ficco_tflops, r.tuned_ms, r.tuned_tflops,
            r.default_ms, r.default_tflops, r.ratio_tuned, r.ratio_default, r.rel_err,
            r.default_rel_err
        );
        rows.push(r);
    }
    let summary = summarize(&rows);
    let mut hook_rows = vec![];
    if hooks {
        println!("# hook costs (cost = time / plain - 1; err vs the plain launch's output)");
        println!(
            "#{:>7} {:>6} {:>6} {:>32} | {:>8} {:>7} | {:>7} | {:>8}",
            "M", "N", "K", "setting", "ms", "TFLOP/s", "cost", "err"
        );
        for (m, n, k) in [(8192, 8192, 8192), (2048, 14336, 4096), (1024, 4096, 7168)] {
            for h in bench.hook_costs(m, n, k)? {
                println!(
                    " {:>7} {:>6} {:>6} {:>32} | {:>8.4} {:>7.1} | {:>+7.3} | {:>8.1e}",
                    h.m, h.n, h.k, h.setting, h.ms, h.tflops, h.cost, h.rel_err
                );
                hook_rows.push(h);
            }
        }
    }
    println!(
        "# summary: {} shapes, geomean ficco/tuned {:.3}, ficco/default {:.3}, worst ficco/tuned {:.3} ({}), chunk time ficco/tuned {:.3}, max rel err {:.1e}",
        summary.shapes,
        summary.geomean_ratio_tuned,
        summary.geomean_ratio_default,
        summary.worst_ratio_tuned,
        summary.worst_shape,
        summary.chunk_time_ratio,
        summary.max_rel_err
    );
    if let Some(path) = json {
        let doc = serde_json::json!({
            "device": name,
            "sms": bench.gemm().sms(),
            "compile": ci,
            "config": cfg,
            "suite": suite,
            "rows": rows,
            "hooks": hook_rows,
            "summary": summary,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
        println!("# wrote {path}");
    }
    Ok(())
}
