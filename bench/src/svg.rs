//! A benchmark's picture as one SVG file, drawn by hand (no plotting library): line charts of
//! series over time and horizontal bar charts, laid out in a grid of panels.

use std::fmt::Write as _;

/// Colours of successive series (colour-blind friendly).
const PALETTE: [&str; 8] = [
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000",
];
const PANEL_W: f64 = 560.0;
const PANEL_H: f64 = 300.0;
const MARGIN: f64 = 56.0;

/// One panel of the picture.
#[derive(Debug, Clone)]
pub enum Panel {
    /// Lines of (x, y) points.
    Lines {
        title: String,
        x_label: String,
        y_label: String,
        series: Vec<(String, Vec<(f64, f64)>)>,
        /// Vertical lines at these x with their labels (the end of the warm-up, a fault).
        markers: Vec<(f64, String)>,
    },
    /// Horizontal bars with a value each.
    Bars {
        title: String,
        unit: String,
        bars: Vec<(String, f64)>,
    },
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step for about `ticks` ticks up to `max`.
fn step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude)
}

fn number(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn lines(
    out: &mut String,
    (ox, oy): (f64, f64),
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    markers: &[(f64, String)],
) {
    let (w, h) = (PANEL_W - 2.0 * MARGIN, PANEL_H - 2.0 * MARGIN);
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let x_max = points.clone().map(|p| p.0).fold(0.0, f64::max).max(1e-9);
    let y_max = points.map(|p| p.1).fold(0.0, f64::max).max(1e-9);
    let (x_step, y_step) = (step(x_max, 6.0), step(y_max, 5.0));
    let (x_top, y_top) = (
        (x_max / x_step).ceil() * x_step,
        (y_max / y_step).ceil() * y_step,
    );
    let (left, top) = (ox + MARGIN, oy + MARGIN);
    let x = |v: f64| left + v / x_top * w;
    let y = |v: f64| top + h - v / y_top * h;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" class="title">{}</text>"#,
        left,
        oy + 24.0,
        escape(title)
    );
    let mut t = 0.0;
    while t <= y_top + y_step / 2.0 {
        let _ = writeln!(
            out,
            r#"<line x1="{left}" y1="{0}" x2="{1}" y2="{0}" class="grid"/><text x="{2}" y="{3}" class="tick" text-anchor="end">{4}</text>"#,
            y(t),
            left + w,
            left - 6.0,
            y(t) + 4.0,
            number(t)
        );
        t += y_step;
    }
    let mut t = 0.0;
    while t <= x_top + x_step / 2.0 {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" class="tick" text-anchor="middle">{}</text>"#,
            x(t),
            top + h + 16.0,
            number(t)
        );
        t += x_step;
    }
    let _ = writeln!(
        out,
        r#"<line x1="{left}" y1="{0}" x2="{1}" y2="{0}" class="axis"/><line x1="{left}" y1="{top}" x2="{left}" y2="{0}" class="axis"/>"#,
        top + h,
        left + w
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" class="label" text-anchor="middle">{}</text><text x="{}" y="{}" class="label" text-anchor="middle" transform="rotate(-90 {} {})">{}</text>"#,
        left + w / 2.0,
        top + h + 36.0,
        escape(x_label),
        ox + 14.0,
        top + h / 2.0,
        ox + 14.0,
        top + h / 2.0,
        escape(y_label)
    );
    // Labels stack upwards from the bottom so that close markers stay readable.
    for (i, (at, label)) in markers.iter().enumerate() {
        let _ = writeln!(
            out,
            r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1}" stroke="#999" stroke-dasharray="4 3"/><text x="{2:.1}" y="{3}" class="tick">{4}</text>"##,
            x(*at),
            top + h,
            x(*at) + 4.0,
            top + h - 6.0 - 12.0 * i as f64,
            escape(label)
        );
    }
    for (i, (name, points)) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let path: Vec<String> = points
            .iter()
            .map(|(px, py)| format!("{:.1},{:.1}", x(*px), y(*py)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.8"><title>{}</title></polyline>"#,
            path.join(" "),
            escape(name)
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" class="legend" fill="{colour}">{}</text>"#,
            left + w - 120.0,
            top + 14.0 + 14.0 * i as f64,
            escape(name)
        );
    }
}

fn bars(out: &mut String, (ox, oy): (f64, f64), title: &str, unit: &str, bars: &[(String, f64)]) {
    let left = ox + MARGIN + 70.0;
    let w = PANEL_W - MARGIN - 70.0 - 80.0;
    let top = oy + MARGIN;
    let max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9);
    let row = ((PANEL_H - 2.0 * MARGIN) / bars.len().max(1) as f64).min(28.0);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" class="title">{}</text>"#,
        ox + MARGIN,
        oy + 24.0,
        escape(title)
    );
    for (i, (name, value)) in bars.iter().enumerate() {
        let y = top + row * i as f64;
        let len = value / max * w;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" class="tick" text-anchor="end">{}</text><rect x="{left}" y="{}" width="{len:.1}" height="{}" fill="{}"/><text x="{}" y="{}" class="tick">{} {}</text>"#,
            left - 6.0,
            y + row * 0.65,
            escape(name),
            y + row * 0.15,
            row * 0.7,
            PALETTE[i % PALETTE.len()],
            left + len + 4.0,
            y + row * 0.65,
            number(*value),
            escape(unit)
        );
    }
}

/// The panels in a grid two wide, under a heading and a line of detail.
/// Characters of the 12 px description that fit the picture's width.
const DETAIL_CHARS: usize = 170;

/// `text` in lines of at most `max` characters, broken after commas where it can be.
fn wrap(text: &str, max: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for part in text.split_inclusive(", ") {
        let line = lines.last_mut().map_or(0, |l| l.chars().count());
        if line > 0 && line + part.chars().count() > max {
            lines.push(String::new());
        }
        if let Some(l) = lines.last_mut() {
            l.push_str(part);
        }
    }
    lines
}

pub fn render(heading: &str, detail: &str, panels: &[Panel]) -> String {
    let rows = panels.len().div_ceil(2).max(1);
    let detail = wrap(detail, DETAIL_CHARS);
    let top = 40.0 + 16.0 * detail.len() as f64;
    let (width, height) = (2.0 * PANEL_W, top + rows as f64 * PANEL_H);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"#
    );
    out.push_str(
        "<style>.title{font-size:15px;font-weight:bold}.tick{font-size:11px;fill:#333}.label{font-size:12px}.legend{font-size:12px}.grid{stroke:#e5e5e5}.axis{stroke:#333}</style>\n",
    );
    let _ = writeln!(
        out,
        r##"<rect width="{width}" height="{height}" fill="white"/><text x="16" y="24" font-size="17">{}</text>"##,
        escape(heading),
    );
    for (i, line) in detail.iter().enumerate() {
        let _ = writeln!(
            out,
            r##"<text x="16" y="{}" font-size="12" fill="#333">{}</text>"##,
            44 + 16 * i,
            escape(line.trim_end())
        );
    }
    for (i, panel) in panels.iter().enumerate() {
        let origin = ((i % 2) as f64 * PANEL_W, top + (i / 2) as f64 * PANEL_H);
        match panel {
            Panel::Lines {
                title,
                x_label,
                y_label,
                series,
                markers,
            } => lines(&mut out, origin, title, x_label, y_label, series, markers),
            Panel::Bars {
                title,
                unit,
                bars: b,
            } => bars(&mut out, origin, title, unit, b),
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_descriptions_wrap_after_commas() {
        let text =
            "3 organizations (postgres,mariadb,postgres), policy any-2, smallbank, 24 clients";
        assert_eq!(wrap(text, 200), [text]);
        let lines = wrap(text, 50);
        assert_eq!(lines.concat(), text);
        assert!(
            lines.len() > 1 && lines.iter().all(|l| l.chars().count() <= 50),
            "{lines:?}"
        );
        assert!(lines[0].ends_with(", "));
        // A part longer than a line stays whole.
        assert_eq!(wrap("abcdef", 3), ["abcdef"]);
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(step(10.0, 5.0), 2.0);
        assert_eq!(step(1234.0, 5.0), 250.0);
        assert_eq!(step(0.07, 5.0), 0.02);
    }

    #[test]
    fn a_picture_has_a_line_per_series_and_a_bar_per_value_and_escapes_text() {
        let svg = render(
            "bench <any-2>",
            "3 orgs",
            &[
                Panel::Lines {
                    title: "blocks".into(),
                    x_label: "s".into(),
                    y_label: "block".into(),
                    series: vec![
                        ("org1".into(), vec![(0.0, 0.0), (1.0, 10.0)]),
                        ("org2".into(), vec![(0.0, 0.0), (1.0, 8.0)]),
                    ],
                    markers: vec![(0.5, "warm-up ends".into()), (0.8, "org2 <crashed>".into())],
                },
                Panel::Bars {
                    title: "phases".into(),
                    unit: "ms".into(),
                    bars: vec![("execute".into(), 3.5), ("vote".into(), 12.0)],
                },
            ],
        );
        assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("stroke-dasharray").count(), 2);
        assert!(svg.contains("org2 &lt;crashed&gt;"));
        assert_eq!(svg.matches("<rect x=").count(), 2);
        assert!(svg.contains("bench &lt;any-2&gt;") && !svg.contains("<any-2>"));
        assert_eq!(svg.matches('<').count(), svg.matches('>').count());
    }
}
