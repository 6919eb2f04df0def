//! `ficco gemm-bench`: ficco's own Hopper GEMM beside cuBLASLt (autotuned and
//! default heuristic) on one GPU, over 8192³ and every whole and chunk GEMM
//! the core lowers for a suite, plus the cost of each kernel hook. ficco's
//! kernel appears twice: the chooser's schedule, and the autotuned one the
//! executor launches (`auto` columns, timed in the same rounds). A table
//! like nccl-tests for people (rows as they are measured), `--json` for
//! machines; `--list` prints the shapes without a GPU.
//!
//! `--grouped` measures ficco's grouped GEMM (one launch over every expert)
//! against the loop of cuBLASLt calls instead, on the MoE presets' expert
//! GEMMs ([`ficco_cuda::hgemm::bench::grouped`]).

use crate::args::VerboseArg;
use crate::output::{print, write_file};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use ficco_cuda::hgemm::bench::{self, BenchConfig, BenchShape, Event};
use std::path::PathBuf;

#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct GemmBenchArgs {
    /// Suite whose GEMMs are measured (whole per-rank GEMMs and the chunk
    /// GEMMs of its shard, bulk, fine2, fine4 and fine8 schedules).
    #[arg(long, default_value = "suites/llama3.toml")]
    suite: PathBuf,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file (the table still goes to stdout).
    #[arg(long, value_name = "FILE.json", conflicts_with = "json")]
    save: Option<PathBuf>,
    /// Timed runs per engine and shape (the median is reported).
    #[arg(long, default_value_t = 25)]
    iters: i64,
    /// Warm-up runs per engine and shape.
    #[arg(long, default_value_t = 5)]
    warmup: i64,
    /// Measure only the first N shapes (8192³ is first).
    #[arg(long)]
    max_shapes: Option<i64>,
    /// Skip the hook-cost rows.
    #[arg(long)]
    no_hooks: bool,
    /// Time only the chooser's schedule of ficco's kernel, not the other
    /// tile widths and K splits (the `best` columns then repeat it).
    #[arg(long)]
    no_variants: bool,
    /// GPU to run on.
    #[arg(long, default_value_t = 0)]
    device: i64,
    /// List the shapes and where they come from; measure nothing (no GPU needed).
    #[arg(long)]
    list: bool,
    /// Measure ficco's grouped GEMM against a loop of cuBLASLt calls on the
    /// expert GEMMs of the MoE presets (mixtral-8x7b, qwen3-30b-a3b,
    /// deepseek-v2-lite; 4096 and 16384 tokens; skew none and heavy)
    /// instead of the suite's shapes.
    #[arg(long)]
    grouped: bool,
    /// With --grouped: GPUs the routing spreads the experts over; the
    /// busiest rank's experts are measured (1: every expert).
    #[arg(long, default_value_t = 1, requires = "grouped")]
    gpus: i64,
    #[command(flatten)]
    pub verbose: VerboseArg,
}

/// A measurement's failure: no usable GPU (with what `--list` shows
/// instead, `listed`), or the error of `what`.
fn failed(e: ficco_cuda::CudaError, what: &str, listed: &str) -> anyhow::Error {
    if ficco_cuda::open::is_unavailable(&e) {
        let hint = super::tried_hint(&e)
            .map(|h| format!("; {h}"))
            .unwrap_or_default();
        anyhow!(
            "gemm-bench needs a GPU: {} (it measures on the device; --list shows the {listed}{hint})",
            super::gpu_reason(&e)
        )
    } else {
        anyhow!("{what} failed: {e}")
    }
}

pub fn run(args: GemmBenchArgs) -> Result<()> {
    let count = |what: &str, v: i64, min: i64| -> Result<usize> {
        if v < min {
            bail!("{what} must be at least {min}, got {v}");
        }
        Ok(v as usize)
    };
    let cfg = BenchConfig {
        iters: count("--iters", args.iters, 1)?,
        warmup: count("--warmup", args.warmup, 0)?,
        variants: !args.no_variants,
    };
    let device = count("--device", args.device, 0)?;
    if args.grouped {
        return grouped(&args, cfg, device, count("--gpus", args.gpus, 1)?);
    }
    let suite = ficco_core::problem::suite::load(&args.suite)?;
    let mut shapes = bench::bench_shapes(&suite.scenarios);
    if let Some(n) = args.max_shapes {
        shapes.truncate(count("--max-shapes", n, 1)?);
    }
    if args.list {
        return print(&list(&shapes, &args.suite.display().to_string()));
    }
    // Fail before any GPU work on an unwritable output.
    if let Some(dir) = args
        .save
        .as_ref()
        .and_then(|p| p.parent())
        .filter(|d| !d.as_os_str().is_empty() && !d.is_dir())
    {
        bail!("cannot write the report: no directory '{}'", dir.display());
    }
    let suite_name = args.suite.display().to_string();
    let table = !args.json;
    let mut printed: Result<()> = Ok(());
    let mut on = |e: Event<'_>| {
        let text = match e {
            Event::Loaded {
                device,
                sms,
                clusters,
                compile,
            } => bench::table_header(
                device,
                sms,
                clusters,
                compile,
                shapes.len(),
                &suite_name,
                cfg,
            ),
            Event::Row(i, n, r) => {
                if !table {
                    eprintln!("[{}/{n}] {}x{}x{}", i + 1, r.m, r.n, r.k);
                }
                bench::table_row(r)
            }
            Event::Hooks(h) => {
                if !table {
                    if let Some(r) = h.first() {
                        eprintln!("hooks {}x{}x{}", r.m, r.n, r.k);
                    }
                }
                bench::hook_table(h)
            }
        };
        if table && printed.is_ok() {
            printed = print(&text);
        }
    };
    let report = bench::run(device, &suite_name, &shapes, cfg, !args.no_hooks, &mut on)
        .map_err(|e| failed(e, "gemm-bench", "shapes"))?;
    printed?;
    let json = serde_json::to_string_pretty(&report)? + "\n";
    if args.json {
        return print(&json);
    }
    print(&bench::table_footer(&report.summary, &report.hooks))?;
    if let Some(p) = &args.save {
        write_file(p, &json).with_context(|| "the table above is complete".to_string())?;
    }
    Ok(())
}

/// `--grouped`: the grouped kernel against the cuBLASLt loop.
fn grouped(args: &GemmBenchArgs, cfg: BenchConfig, device: usize, gpus: usize) -> Result<()> {
    use ficco_cuda::hgemm::bench::grouped::{self as g, GroupedEvent};
    let mut cases = g::grouped_cases(gpus)?;
    if let Some(n) = args.max_shapes {
        if n < 1 {
            bail!("--max-shapes must be at least 1, got {n}");
        }
        cases.truncate(n as usize);
    }
    if args.list {
        return print(&g::grouped_list(&cases));
    }
    if let Some(dir) = args
        .save
        .as_ref()
        .and_then(|p| p.parent())
        .filter(|d| !d.as_os_str().is_empty() && !d.is_dir())
    {
        bail!("cannot write the report: no directory '{}'", dir.display());
    }
    let table = !args.json;
    let mut printed: Result<()> = Ok(());
    let mut on = |e: GroupedEvent<'_>| {
        let text = match e {
            GroupedEvent::Loaded {
                device,
                sms,
                compile,
            } => g::grouped_header(device, sms, compile, cases.len(), gpus, cfg),
            GroupedEvent::Row(i, n, r) => {
                if !table {
                    eprintln!("[{}/{n}] {}", i + 1, r.scenario);
                }
                g::grouped_table_row(r)
            }
        };
        if table && printed.is_ok() {
            printed = print(&text);
        }
    };
    let report = g::run_grouped(device, gpus, &cases, cfg, &mut on)
        .map_err(|e| failed(e, "gemm-bench --grouped", "cases"))?;
    printed?;
    let json = serde_json::to_string_pretty(&report)? + "\n";
    if args.json {
        return print(&json);
    }
    print(&g::grouped_footer(&report.summary))?;
    if let Some(p) = &args.save {
        write_file(p, &json).with_context(|| "the table above is complete".to_string())?;
    }
    Ok(())
}

/// The shapes as a table: M, N, K, kind, uses, and the first use.
fn list(shapes: &[BenchShape], suite: &str) -> String {
    let mut s = format!(
        "# {} GEMM shapes of gemm-bench: 8192^3 and every whole and chunk GEMM of {suite}\n",
        shapes.len()
    );
    s += &format!(
        "#{:>6} {:>6} {:>6} {:>11} {:>5}  {}\n",
        "M", "N", "K", "kind", "uses", "first use"
    );
    for b in shapes {
        s += &format!(
            " {:>6} {:>6} {:>6} {:>11} {:>5}  {}\n",
            b.m,
            b.n,
            b.k,
            b.kind,
            b.uses.len(),
            b.uses.first().map(String::as_str).unwrap_or("")
        );
    }
    s
}
