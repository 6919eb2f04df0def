//! Where command output goes: stdout (a closed pipe is not an error), and
//! the per-scenario trace and SVG files, drawn by `ficco_core::report`.

use anyhow::{Context, Result};
use ficco_core::choose::explore::Explored;
use ficco_core::report::{self, TracePanel};
use ficco_core::Error;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes to stdout; a closed pipe (`ficco ... | head`) is not an error.
pub fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("cannot write to stdout"),
    }
}

/// Collapses a message onto one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Writes a file, naming it in the error; `-` is stdout. Prints
/// `ficco: wrote PATH` on stderr for every file written.
pub fn write_file(path: &Path, text: &str) -> Result<()> {
    if path.as_os_str() == "-" {
        return print(text);
    }
    std::fs::write(path, text)
        .map_err(|e| Error::Io(format!("cannot write '{}': {e}", path.display())))?;
    eprintln!("ficco: wrote {}", path.display());
    Ok(())
}

/// A scenario name as a file-name part: `[A-Za-z0-9._-]` kept, anything
/// else (`/`, spaces, `=`) replaced by `_`, and no `..`, so that the file
/// stays in the folder of the path given.
pub fn file_part(scenario: &str) -> String {
    let mut s: String = scenario
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    while s.contains("..") {
        s = s.replace("..", "_");
    }
    if s.is_empty() {
        s.push('_');
    }
    s
}

/// `out.json` → `out.SCENARIO.json` when several scenarios each write a
/// file, SCENARIO made safe by [`file_part`]; `-` (stdout) stays `-`.
pub fn per_scenario_path(path: &Path, scenario: &str, several: bool) -> PathBuf {
    if !several || path.as_os_str() == "-" {
        return path.to_path_buf();
    }
    let scenario = file_part(scenario);
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{scenario}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{scenario}"),
    };
    path.with_file_name(name)
}

/// Writes the Chrome trace and the SVG Gantt chart of `seq` and the best
/// schedule of one explored scenario, where asked.
pub fn write_timelines(
    trace: Option<&Path>,
    svg: Option<&Path>,
    ex: &Explored,
    several: bool,
) -> Result<()> {
    let Some(seq) = &ex.seq else { return Ok(()) };
    let seq_names = report::stream_names(&seq.plan);
    let seq_panel = TracePanel {
        title: "seq",
        timeline: &seq.timeline,
        stream_names: &seq_names,
    };
    let best_title;
    let best_names;
    let mut panels = vec![];
    if let Some(best) = ex.best.as_ref().filter(|b| b.plan.name != "seq") {
        best_title = format!("best {}", best.plan.name);
        best_names = report::stream_names(&best.plan);
        panels.push(TracePanel {
            title: &best_title,
            timeline: &best.timeline,
            stream_names: &best_names,
        });
    }
    let scenario = &ex.report.scenario;
    if let Some(path) = trace {
        // Best first (pid = rank), seq after (pid = 1000 + rank).
        let mut trace_panels = panels.clone();
        trace_panels.push(seq_panel);
        let trace = report::chrome_trace(&trace_panels);
        write_file(
            &per_scenario_path(path, scenario, several),
            &serde_json::to_string(&trace)?,
        )?;
    }
    if let Some(path) = svg {
        let mut svg_panels = vec![seq_panel];
        svg_panels.extend(panels);
        write_file(
            &per_scenario_path(path, scenario, several),
            &report::svg_gantt(&svg_panels),
        )?;
    }
    Ok(())
}
