//! Timelines as an SVG Gantt chart ([`svg_gantt`]): the same
//! [`TracePanel`]s as the Chrome trace, on one time axis, colored by task
//! kind.

use super::{ms, TracePanel};
use std::fmt::Write as _;

/// Fill color of a task kind in the SVG.
pub fn kind_color(kind: &str) -> &'static str {
    match kind {
        "gemm" => "#4e79a7",
        "copy" => "#f28e2b",
        "all-gather" => "#59a14f",
        "reduce-scatter" => "#b07aa1",
        "all-reduce" => "#e15759",
        "send-recv" => "#76b7b2",
        "reduce" => "#9c755f",
        "signal" => "#ff9da7",
        "wait" => "#edc948",
        _ => "#bab0ac",
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A tick step of 1, 2 or 5 times a power of ten giving about `n` ticks over `range`.
fn tick_step(range: f64, n: f64) -> f64 {
    if range.is_nan() || range <= 0.0 {
        return 1.0;
    }
    let raw = range / n;
    let pow = 10f64.powf(raw.log10().floor());
    let m = raw / pow;
    pow * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// An SVG Gantt chart: one panel per timeline, one row per rank and stream,
/// all panels on the same time axis (ticks in ms), colored by task kind, with
/// a legend.
pub fn svg_gantt(panels: &[TracePanel]) -> String {
    const WIDTH: f64 = 1200.0;
    const LEFT: f64 = 150.0;
    const RIGHT: f64 = 20.0;
    const ROW: f64 = 18.0;
    const TITLE: f64 = 22.0;
    const AXIS: f64 = 26.0;
    const LEGEND: f64 = 30.0;
    let t_max = panels
        .iter()
        .map(|p| {
            p.timeline
                .spans
                .iter()
                .map(|s| s.end_ms)
                .fold(p.timeline.total_ms, f64::max)
        })
        .fold(0.0, f64::max);
    let t_max = if t_max > 0.0 { t_max } else { 1.0 };
    let step = tick_step(t_max, 8.0);
    let axis_end = (t_max / step).ceil() * step;
    let plot_w = WIDTH - LEFT - RIGHT;
    let x = |t: f64| LEFT + t / axis_end * plot_w;
    let decimals = (-step.log10().floor()).max(0.0) as usize;

    let mut body = String::new();
    let mut y = 10.0;
    let mut kinds: Vec<String> = vec![];
    for panel in panels {
        let rows = panel.rows();
        let _ = writeln!(
            body,
            r#"<text x="10" y="{:.1}" font-weight="bold">{} ({} ms)</text>"#,
            y + 15.0,
            xml_escape(panel.title),
            ms(panel.timeline.total_ms)
        );
        y += TITLE;
        let top = y;
        for (i, &(rank, stream)) in rows.iter().enumerate() {
            let ry = top + i as f64 * ROW;
            if i % 2 == 0 {
                let _ = writeln!(
                    body,
                    r##"<rect x="{LEFT}" y="{ry:.1}" width="{plot_w}" height="{ROW}" fill="#f4f4f4"/>"##
                );
            }
            let _ = writeln!(
                body,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">r{rank} {}</text>"#,
                LEFT - 6.0,
                ry + 13.0,
                xml_escape(&panel.stream_name(rank, stream))
            );
        }
        for s in &panel.timeline.spans {
            let Some(i) = rows.iter().position(|&r| r == (s.rank, s.stream)) else {
                continue;
            };
            if !kinds.contains(&s.kind) {
                kinds.push(s.kind.clone());
            }
            let x0 = x(s.start_ms);
            let w = (x(s.end_ms) - x0).max(0.5);
            let _ = writeln!(
                body,
                r##"<rect x="{x0:.2}" y="{:.1}" width="{w:.2}" height="{:.1}" fill="{}" stroke="#fff" stroke-width="0.5"><title>{} [{}] r{} {:.4}–{:.4} ms</title></rect>"##,
                top + i as f64 * ROW + 2.0,
                ROW - 4.0,
                kind_color(&s.kind),
                xml_escape(&s.label),
                xml_escape(&s.kind),
                s.rank,
                s.start_ms,
                s.end_ms
            );
        }
        y = top + rows.len() as f64 * ROW;
        // Axis under each panel.
        let _ = writeln!(
            body,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#333"/>"##,
            LEFT + plot_w
        );
        let ticks = (axis_end / step).round() as usize;
        for t in 0..=ticks {
            let tv = t as f64 * step;
            let tx = x(tv);
            let _ = writeln!(
                body,
                r##"<line x1="{tx:.2}" y1="{top:.1}" x2="{tx:.2}" y2="{:.1}" stroke="#ccc" stroke-width="0.5"/><text x="{tx:.2}" y="{:.1}" text-anchor="middle" font-size="10">{tv:.decimals$}</text>"##,
                y + 4.0,
                y + 15.0
            );
        }
        let _ = writeln!(
            body,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="10">ms</text>"#,
            LEFT + plot_w,
            y + 24.0
        );
        y += AXIS;
    }
    // Legend.
    let ly = y + 8.0;
    for (i, kind) in kinds.iter().enumerate() {
        let lx = LEFT + i as f64 * 120.0;
        let _ = writeln!(
            body,
            r#"<rect x="{lx:.1}" y="{ly:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            kind_color(kind),
            lx + 16.0,
            ly + 10.0,
            xml_escape(kind)
        );
    }
    let height = y + LEGEND;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {WIDTH} {height:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{body}</svg>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(0.8, 8.0), 0.1);
        assert_eq!(tick_step(3.0, 8.0), 0.5);
        assert_eq!(tick_step(13.0, 8.0), 2.0);
    }
}
