//! A hand-written SVG plot: admitted rate per 100 ms bin for each strategy, against the ideal
//! limiter and the limit line, with fault intervals shaded.

use core::fmt::Write as _;

use crate::metrics::BIN_NANOS;
use crate::report::Report;

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 460.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 6] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#8c564b"];

/// The plot of `report` as an SVG document.
pub fn plot(report: &Report) -> String {
    let bins_per_s = 1e9 / BIN_NANOS as f64;
    let series: Vec<(String, Vec<f64>)> = report
        .strategies
        .iter()
        .map(|s| (s.strategy.clone(), s.admitted_bins.iter().map(|b| *b as f64 * bins_per_s).collect()))
        .collect();
    let ideal: Vec<f64> = report
        .strategies
        .first()
        .map(|s| s.ideal_bins.iter().map(|b| *b as f64 * bins_per_s).collect())
        .unwrap_or_default();
    let peak = series.iter().flat_map(|(_, v)| v).chain(&ideal).copied().fold(report.limit_per_s, f64::max);
    let frame = Frame { x_max: report.duration_s.max(1) as f64, y_max: nice_ceiling(peak * 1.05) };
    let mut svg = header(report);
    shade_faults(&mut svg, report, &frame);
    axes(&mut svg, &frame);
    for (index, (_, values)) in series.iter().enumerate() {
        polyline(&mut svg, &frame, values, COLORS[index % COLORS.len()], "");
    }
    polyline(&mut svg, &frame, &ideal, "#444444", "4 3");
    let y = frame.y(report.limit_per_s);
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#000" stroke-width="1.5" stroke-dasharray="8 4"/>"##,
        WIDTH - RIGHT
    );
    legend(&mut svg, &series);
    svg.push_str("</svg>\n");
    svg
}

struct Frame {
    x_max: f64,
    y_max: f64,
}

impl Frame {
    fn x(&self, seconds: f64) -> f64 {
        LEFT + seconds / self.x_max * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, rate: f64) -> f64 {
        HEIGHT - BOTTOM - rate / self.y_max * (HEIGHT - TOP - BOTTOM)
    }
}

fn header(report: &Report) -> String {
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#fff"/>
"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}: admitted rate per 100 ms (seed {})</text>"#,
        escape(&report.scenario),
        report.seed
    );
    svg
}

fn shade_faults(svg: &mut String, report: &Report, frame: &Frame) {
    for (label, start_ms, end_ms) in &report.fault_intervals_ms {
        let x0 = frame.x(*start_ms as f64 / 1000.0);
        let x1 = frame.x((*end_ms as f64 / 1000.0).min(frame.x_max));
        let _ = writeln!(
            svg,
            r##"<rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#f3e0e0"/><text x="{:.1}" y="{:.1}" fill="#a05050">{}</text>"##,
            (x1 - x0).max(0.0),
            HEIGHT - TOP - BOTTOM,
            x0 + 3.0,
            TOP + 14.0,
            escape(label)
        );
    }
}

fn axes(svg: &mut String, frame: &Frame) {
    let (x0, y0, x1) = (LEFT, HEIGHT - BOTTOM, WIDTH - RIGHT);
    let _ = writeln!(svg, r##"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#000"/>"##);
    let _ = writeln!(svg, r##"<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{y0}" stroke="#000"/>"##);
    let x_step = nice_step(frame.x_max / 10.0);
    for tick in ticks(frame.x_max, x_step) {
        let x = frame.x(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{:.1}" stroke="#000"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{tick}</text>"##,
            y0 + 5.0,
            y0 + 18.0
        );
    }
    let y_step = nice_step(frame.y_max / 6.0);
    for tick in ticks(frame.y_max, y_step) {
        let y = frame.y(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{tick}</text>"##,
            x0 - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">virtual time (s)</text>"#,
        (x0 + x1) / 2.0,
        HEIGHT - 12.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">admitted hits per second</text>"#,
        (TOP + y0) / 2.0
    );
}

fn polyline(svg: &mut String, frame: &Frame, values: &[f64], color: &str, dash: &str) {
    let bin_s = BIN_NANOS as f64 / 1e9;
    let mut points = String::new();
    for (index, value) in values.iter().enumerate() {
        let t = (index as f64 + 0.5) * bin_s;
        let _ = write!(points, "{:.1},{:.1} ", frame.x(t), frame.y(*value));
    }
    let _ = writeln!(
        svg,
        r#"<polyline fill="none" stroke="{color}" stroke-width="1.2" stroke-dasharray="{dash}" points="{}"/>"#,
        points.trim_end()
    );
}

fn legend(svg: &mut String, series: &[(String, Vec<f64>)]) {
    let x = WIDTH - RIGHT + 15.0;
    let mut y = TOP + 10.0;
    let mut entry = |svg: &mut String, label: &str, color: &str, dash: &str| {
        let _ = writeln!(
            svg,
            r#"<line x1="{x}" y1="{y}" x2="{:.1}" y2="{y}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 24.0,
            x + 30.0,
            y + 4.0,
            escape(label)
        );
        y += 20.0;
    };
    entry(svg, "limit L", "#000", "8 4");
    entry(svg, "ideal limiter", "#444444", "4 3");
    for (index, (name, _)) in series.iter().enumerate() {
        entry(svg, name, COLORS[index % COLORS.len()], "");
    }
}

/// Ticks `0, step, 2 step, …` up to `max`.
fn ticks(max: f64, step: f64) -> impl Iterator<Item = f64> {
    let count = (max / step).floor() as u64;
    (0..=count).map(move |i| i as f64 * step)
}

/// A round step (1, 2 or 5 × 10ⁿ) at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1e-9);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(10.0 * magnitude)
}

/// A round number at least `value`.
fn nice_ceiling(value: f64) -> f64 {
    let step = nice_step(value / 10.0);
    (value / step).ceil() * step
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
