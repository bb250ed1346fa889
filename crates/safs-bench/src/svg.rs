//! A small hand-written SVG line chart: log or linear axes, one polyline per
//! series, a legend. Enough for "per-file µs against N", nothing more.
//! Missing points (a size that failed) break the line instead of joining
//! its neighbours; where a line stops for good, a mark says why (ENOSPC).

use std::fmt::Write as _;

/// One line of the chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub color: String,
    /// SVG `stroke-dasharray`, empty for a solid line.
    pub dash: String,
    /// (x, y) in data units; `None` for y means "no value here".
    pub points: Vec<(f64, Option<f64>)>,
    /// Where the line stops and why: (x, y) of its last point, and the
    /// reason (an errno), drawn beside it.
    pub stop: Option<(f64, f64, String)>,
}

#[derive(Clone, Debug)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    pub y_log: bool,
    /// Explicit x ticks (value, label); empty: powers of ten or 1-2-5 steps.
    pub x_ticks: Vec<(f64, String)>,
    pub series: Vec<Series>,
}

/// Colours for targets, in `--targets` order (colour-blind-safe Okabe–Ito).
pub const PALETTE: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
];
/// Dash patterns for the cases drawn per target.
pub const DASHES: [&str; 4] = ["", "7 4", "2 3", "9 3 2 3"];

const W: f64 = 900.0;
const H: f64 = 540.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c => o.push(c),
        }
    }
    o
}

/// One axis: data range → pixel range.
struct Axis {
    log: bool,
    lo: f64,
    hi: f64,
}

impl Axis {
    fn new(values: impl Iterator<Item = f64>, log: bool) -> Axis {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            (lo, hi) = (1.0, 10.0);
        }
        if log {
            lo = 10f64.powf(lo.log10().floor());
            hi = 10f64.powf(hi.log10().ceil());
            if hi <= lo {
                hi = lo * 10.0;
            }
        } else {
            lo = lo.min(0.0);
            if hi <= lo {
                hi = lo + 1.0;
            }
            let step = nice_step(hi - lo);
            hi = (hi / step).ceil() * step;
        }
        Axis { log, lo, hi }
    }

    /// 0..1 along the axis.
    fn frac(&self, v: f64) -> f64 {
        if self.log {
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let mut t = Vec::new();
            let mut v = self.lo;
            while v <= self.hi * 1.000_001 {
                t.push(v);
                v *= 10.0;
            }
            t
        } else {
            let step = nice_step(self.hi - self.lo);
            let mut t = Vec::new();
            let mut v = self.lo;
            while v <= self.hi + step * 1e-6 {
                t.push(v);
                v += step;
            }
            t
        }
    }
}

/// A 1-2-5 step giving about 5 to 10 ticks over `span`.
fn nice_step(span: f64) -> f64 {
    let raw = span / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// Tick label: 1, 32, 1k, 64k, 1M; small values keep their decimals.
pub fn tick_label(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 && (v / 1e6).fract() == 0.0 {
        format!("{}M", v / 1e6)
    } else if a >= 1e3 && (v / 1e3).fract() == 0.0 {
        format!("{}k", v / 1e3)
    } else if a >= 1.0 || a == 0.0 {
        format!("{}", (v * 100.0).round() / 100.0)
    } else {
        format!("{v:.2}")
    }
}

impl Chart {
    pub fn render(&self) -> String {
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0));
        let ys = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().filter_map(|p| p.1));
        let xa = Axis::new(xs, self.x_log);
        let ya = Axis::new(ys, self.y_log);
        let pw = W - LEFT - RIGHT;
        let ph = H - TOP - BOTTOM;
        let px = |x: f64| LEFT + xa.frac(x) * pw;
        let py = |y: f64| TOP + (1.0 - ya.frac(y)) * ph;

        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#,
            LEFT + pw / 2.0,
            escape(&self.title)
        );
        // Grid and ticks.
        let x_ticks: Vec<(f64, String)> = if self.x_ticks.is_empty() {
            xa.ticks().into_iter().map(|t| (t, tick_label(t))).collect()
        } else {
            self.x_ticks.clone()
        };
        for (t, label) in x_ticks {
            let x = px(t);
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + ph,
                TOP + ph + 16.0,
                escape(&label)
            );
        }
        for t in ya.ticks() {
            let y = py(t);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                escape(&tick_label(t))
            );
        }
        let _ = writeln!(
            s,
            r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + pw / 2.0,
            H - 18.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            escape(&self.y_label)
        );

        // Lines: one polyline per unbroken run of points.
        for ser in &self.series {
            let dash = if ser.dash.is_empty() {
                String::new()
            } else {
                format!(r#" stroke-dasharray="{}""#, escape(&ser.dash))
            };
            let mut run: Vec<(f64, f64)> = Vec::new();
            let flush = |run: &mut Vec<(f64, f64)>, s: &mut String| {
                if run.is_empty() {
                    return;
                }
                let pts: Vec<String> = run.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
                let _ = writeln!(
                    s,
                    r#"<polyline fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"#,
                    escape(&ser.color),
                    pts.join(" ")
                );
                for (x, y) in run.iter() {
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{}"/>"#,
                        escape(&ser.color)
                    );
                }
                run.clear();
            };
            for (x, y) in &ser.points {
                match y {
                    Some(y) if y.is_finite() && (!self.y_log || *y > 0.0) => {
                        run.push((px(*x), py(*y)));
                    }
                    _ => flush(&mut run, &mut s),
                }
            }
            flush(&mut run, &mut s);
            if let Some((x, y, why)) = &ser.stop {
                if y.is_finite() && (!self.y_log || *y > 0.0) {
                    let (cx, cy) = (px(*x), py(*y));
                    let _ = writeln!(
                        s,
                        r#"<text x="{:.1}" y="{:.1}" font-size="11" fill="{}">✕ {}</text>"#,
                        cx + 6.0,
                        cy - 6.0,
                        escape(&ser.color),
                        escape(why)
                    );
                }
            }
        }

        // Legend.
        let lx = W - RIGHT + 16.0;
        for (i, ser) in self.series.iter().enumerate() {
            let y = TOP + 8.0 + i as f64 * 18.0;
            let dash = if ser.dash.is_empty() {
                String::new()
            } else {
                format!(r#" stroke-dasharray="{}""#, escape(&ser.dash))
            };
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 28.0,
                escape(&ser.color),
                lx + 34.0,
                y + 4.0,
                escape(&ser.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart() -> Chart {
        Chart {
            title: "per-file µs <T1>".into(),
            x_label: "value size (bytes)".into(),
            y_label: "µs per file".into(),
            x_log: true,
            y_log: true,
            x_ticks: vec![(1.0, "1".into()), (65536.0, "64 Ki".into())],
            series: vec![
                Series {
                    name: "ext4 set".into(),
                    color: PALETTE[0].into(),
                    dash: String::new(),
                    points: vec![
                        (1.0, Some(2.0)),
                        (32.0, Some(3.0)),
                        (4096.0, None),
                        (65536.0, Some(50.0)),
                    ],
                    stop: None,
                },
                Series {
                    name: "safs & co".into(),
                    color: PALETTE[1].into(),
                    dash: DASHES[1].into(),
                    points: vec![(1.0, Some(20.0)), (65536.0, Some(400.0))],
                    stop: None,
                },
            ],
        }
    }

    #[test]
    fn renders_well_formed_svg() {
        let s = chart().render();
        assert!(s.starts_with("<svg ") && s.ends_with("</svg>\n"));
        // The gap splits the first series into two runs.
        assert_eq!(s.matches("<polyline").count(), 3);
        assert_eq!(s.matches("<circle").count(), 5);
        assert!(s.contains("&lt;T1&gt;") && s.contains("safs &amp; co"));
        assert!(s.contains(r#"stroke-dasharray="7 4""#));
        assert!(s.contains(">64 Ki</text>"));
        // Every coordinate lies inside the picture.
        for cap in s.split("points=\"").skip(1) {
            for pair in cap.split('"').next().unwrap().split(' ') {
                let (x, y) = pair.split_once(',').unwrap();
                let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
                assert!((0.0..=W).contains(&x) && (0.0..=H).contains(&y), "{x},{y}");
            }
        }
    }

    #[test]
    fn axes_and_labels() {
        let a = Axis::new([3.0, 700.0].into_iter(), true);
        assert_eq!((a.lo, a.hi), (1.0, 1000.0));
        assert_eq!(a.ticks().len(), 4);
        let l = Axis::new([0.5, 7.3].into_iter(), false);
        assert_eq!(l.lo, 0.0);
        assert!(l.hi >= 7.3);
        assert_eq!(tick_label(1000.0), "1k");
        assert_eq!(tick_label(65536.0), "65536");
        assert_eq!(tick_label(1_000_000.0), "1M");
        assert_eq!(tick_label(0.25), "0.25");
        assert_eq!(escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&apos;");
    }

    #[test]
    fn empty_chart_still_renders() {
        let c = Chart {
            series: vec![],
            ..chart()
        };
        assert!(c.render().contains("</svg>"));
    }
}
