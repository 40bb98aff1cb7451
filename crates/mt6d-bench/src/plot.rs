//! The figures of 000 Fig. 5.22-5.24 per topology (ICMP latency, ICMP loss, TCP throughput),
//! drawn with plotters from results.json as SVG and PNG, for the report and to put next to the
//! thesis's figures. Grouped bars: one group per test, one bar per scenario, in the same colour
//! for a scenario in every figure.
//!
//! Owns the drawing only: what a figure shows comes from the same JSON document as report.md,
//! through the accessors of [`crate::report`]. Text in the PNG is drawn with the Roboto subset
//! the crate embeds (fonts/README.md), so no system font is needed.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::backend::{BitMapBackend, RGBPixel};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::json::{Value, ValueExt};
use crate::report::{downloads, name, ping_tests_of, rows_of, test, topologies};

/// Width and height of every figure, in SVG user units and PNG pixels alike.
const SIZE: (u32, u32) = (1000, 480);
/// Room on the right for the legend.
const LEGEND_WIDTH: u32 = 170;
/// The family every text is drawn in; the embedded font is registered under it.
const FAMILY: &str = "sans-serif";
static FONT: &[u8] = include_bytes!("../fonts/Roboto-Regular-subset.ttf");

/// Each scenario's colour, the same in every figure (cf. the thesis: baseline grey, MT6D modes in
/// blues and greens, the WireGuard implementations apart).
const SCENARIO_COLORS: [(&str, RGBColor); 7] = [
    ("none", RGBColor(0x4d, 0x4d, 0x4d)),
    ("kernel-vxlan", RGBColor(0xa6, 0xa6, 0xa6)),
    ("mt6d-plain", RGBColor(0x1f, 0x77, 0xb4)),
    ("mt6d-auth", RGBColor(0x2c, 0xa0, 0x2c)),
    ("mt6d-encrypt", RGBColor(0xd6, 0x27, 0x28)),
    ("wireguard-go", RGBColor(0x94, 0x67, 0xbd)),
    ("boringtun", RGBColor(0xff, 0x7f, 0x0e)),
];
const OTHER_COLORS: [RGBColor; 6] = [
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
];

fn color(scenario: &str, index: usize) -> RGBColor {
    SCENARIO_COLORS
        .iter()
        .find(|(n, _)| *n == scenario)
        .map_or(OTHER_COLORS[index % OTHER_COLORS.len()], |(_, c)| *c)
}

/// One bar: its value and an optional (min, max) whisker.
type Bar = Option<(f64, Option<(f64, f64)>)>;

/// A grouped bar chart: one group per category, one bar per series, optional min-max whiskers.
#[derive(Debug)]
struct Chart {
    title: String,
    x_label: &'static str,
    y_label: &'static str,
    categories: Vec<String>,
    series: Vec<(String, Vec<Bar>)>,
    log: bool,
    /// Write each bar's value above it: for loss, where the values that matter are 0 and
    /// small, and a bar of height 0 is otherwise invisible.
    value_labels: bool,
}

/// Writes `TOPOLOGY-{latency,loss,throughput}.{svg,png}` for every topology in `doc` into
/// `out`, and returns the paths written.
pub fn write_figures(doc: &Value, out: &Path) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    for topo in topologies(doc) {
        let rows = rows_of(doc, &topo);
        for (kind, chart) in [
            ("latency", latency(&topo, &rows)),
            ("loss", loss(&topo, &rows)),
            ("throughput", throughput(&topo, &rows, doc)),
        ] {
            for (ext, bytes) in [("svg", chart.svg()?.into_bytes()), ("png", chart.png()?)] {
                let path = out.join(format!("{topo}-{kind}.{ext}"));
                std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
                written.push(path);
            }
        }
    }
    Ok(written)
}

/// A grouped bar chart of any figures (the server bench's), written as `NAME.svg` and
/// `NAME.png` into `out`: one group per category, one bar per series (`None`: no bar).
#[allow(clippy::too_many_arguments)] // one figure's whole description, named at the call
pub fn write_bars(
    out: &Path,
    name: &str,
    title: String,
    x_label: &'static str,
    y_label: &'static str,
    categories: Vec<String>,
    series: Vec<(String, Vec<Option<f64>>)>,
    log: bool,
) -> Result<Vec<PathBuf>, String> {
    let chart = Chart {
        title,
        x_label,
        y_label,
        categories,
        series: series
            .into_iter()
            .map(|(n, v)| (n, v.into_iter().map(|x| x.map(|x| (x, None))).collect()))
            .collect(),
        log,
        value_labels: false,
    };
    let mut written = Vec::new();
    for (ext, bytes) in [("svg", chart.svg()?.into_bytes()), ("png", chart.png()?)] {
        let path = out.join(format!("{name}.{ext}"));
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Registers the embedded font with plotters once per process; every figure needs it.
fn font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(FAMILY, FontStyle::Normal, FONT)
                .map_err(|_| "the embedded figure font does not parse".to_string())
        })
        .clone()
}

fn err(e: impl std::fmt::Display) -> String {
    format!("drawing a figure: {e}")
}

impl Chart {
    fn svg(&self) -> Result<String, String> {
        font()?;
        let mut text = String::new();
        {
            let root = SVGBackend::with_string(&mut text, SIZE).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(err)?;
        }
        Ok(text)
    }

    fn png(&self) -> Result<Vec<u8>, String> {
        font()?;
        let (w, h) = SIZE;
        let mut rgb = vec![0u8; w as usize * h as usize * 3];
        {
            let backend =
                BitMapBackend::<RGBPixel>::with_buffer_and_format(&mut rgb, SIZE).map_err(err)?;
            let root = backend.into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(err)?;
        }
        let mut png = Vec::new();
        let mut encoder = png::Encoder::new(&mut png, w, h);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(err)?;
        writer.write_image_data(&rgb).map_err(err)?;
        writer.finish().map_err(err)?;
        Ok(png)
    }

    /// Every value a bar or whisker reaches.
    fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.series.iter().flat_map(|(_, v)| {
            v.iter()
                .flatten()
                .flat_map(|(x, wk)| [Some(*x), wk.map(|w| w.0), wk.map(|w| w.1)])
                .flatten()
        })
    }

    /// The y axis: its range in drawing units (log10 of the value on a log chart), the ticks
    /// in those units, and how a tick's value reads.
    fn y_axis(&self) -> (f64, f64, Vec<f64>) {
        let max = self.values().fold(0.0f64, f64::max);
        if self.log {
            let min_pos = self
                .values()
                .filter(|x| *x > 0.0)
                .fold(f64::INFINITY, f64::min);
            let lo = if min_pos.is_finite() {
                min_pos.log10().floor()
            } else {
                -2.0
            };
            let hi = max.log10().ceil().max(lo + 1.0);
            // Decades: integers between lo and hi.
            let ticks = (0..)
                .map(|i| lo + f64::from(i))
                .take_while(|t| *t <= hi + 1e-9)
                .collect();
            (lo, hi, ticks)
        } else {
            let hi = nice_max(max);
            (0.0, hi, (0..=5).map(|i| hi * f64::from(i) / 5.0).collect())
        }
    }

    /// A value in drawing units.
    fn to_y(&self, v: f64, lo: f64) -> f64 {
        if self.log {
            if v > 0.0 {
                v.log10().max(lo)
            } else {
                lo
            }
        } else {
            v
        }
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let (plot_area, legend_area) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let (lo, hi, y_ticks) = self.y_axis();
        let n_cat = self.categories.len().max(1);
        let x_ticks: Vec<f64> = (0..n_cat).map(|i| i as f64 + 0.5).collect();
        let log = self.log;
        let x_fmt = |x: &f64| {
            let i = x.floor();
            if i >= 0.0 {
                self.categories.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        let y_fmt = |y: &f64| {
            if log {
                short(10f64.powf(*y))
            } else {
                short(*y)
            }
        };
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(&self.title, (FAMILY, 18))
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(
                Axis {
                    range: 0.0..n_cat as f64,
                    ticks: x_ticks,
                },
                Axis {
                    range: lo..hi,
                    ticks: y_ticks,
                },
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .bold_line_style(BLACK.mix(0.15))
            .light_line_style(TRANSPARENT)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 14))
            .x_desc(self.x_label)
            .y_desc(self.y_label)
            .draw()
            .map_err(err)?;

        let n_ser = self.series.len().max(1) as f64;
        let bar = 0.8 / n_ser;
        let na = TextStyle::from((FAMILY, 10))
            .color(&RGBColor(0x99, 0x99, 0x99))
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        let value = TextStyle::from((FAMILY, 11)).pos(Pos::new(HPos::Center, VPos::Bottom));
        for (si, (scenario, bars)) in self.series.iter().enumerate() {
            let c = color(scenario, si);
            for (ci, b) in bars.iter().enumerate() {
                let x0 = ci as f64 + 0.1 + bar * si as f64;
                let x1 = x0 + bar * 0.92;
                let cx = (x0 + x1) / 2.0;
                match b {
                    Some((v, whisker)) => {
                        let top = self.to_y(*v, lo);
                        chart
                            .draw_series([Rectangle::new([(x0, lo), (x1, top)], c.filled())])
                            .map_err(err)?;
                        if self.value_labels {
                            chart
                                .draw_series([Text::new(short(*v), (cx, top), &value)])
                                .map_err(err)?;
                        }
                        if let Some((min, max)) = whisker {
                            chart
                                .draw_series([ErrorBar::new_vertical(
                                    cx,
                                    self.to_y(*min, lo),
                                    top,
                                    self.to_y(*max, lo),
                                    BLACK.stroke_width(1),
                                    6,
                                )])
                                .map_err(err)?;
                        }
                    }
                    None => {
                        chart
                            .draw_series([Text::new("n/a", (cx, lo + (hi - lo) * 0.01), &na)])
                            .map_err(err)?;
                    }
                }
            }
        }

        self.draw_legend(&legend_area)
    }

    /// The legend, beside the plot, where it covers no bar.
    fn draw_legend<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let label = TextStyle::from((FAMILY, 14)).pos(Pos::new(HPos::Left, VPos::Center));
        for (si, (scenario, _)) in self.series.iter().enumerate() {
            let y = 60 + 24 * si as i32;
            area.draw(&Rectangle::new(
                [(4, y - 7), (18, y + 7)],
                color(scenario, si).filled(),
            ))
            .map_err(err)?;
            area.draw(&Text::new(scenario.as_str(), (26, y), &label))
                .map_err(err)?;
        }
        Ok(())
    }
}

/// A linear axis whose ticks are exactly the values given: the middle of each group of bars
/// on x, whole decades or five even steps on y. (plotters' own `with_key_points` has no label
/// formatter for f64 axes in 0.3.7.)
#[derive(Debug, Clone)]
struct Axis {
    range: Range<f64>,
    ticks: Vec<f64>,
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let frac = if span > 0.0 {
            (value - self.range.start) / span
        } else {
            0.0
        };
        // Pixel coordinates: the float-to-int cast saturates, which is what a bar far off
        // the chart should do.
        limit.0 + (f64::from(limit.1 - limit.0) * frac).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

fn nice_max(x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|v| *v >= x)
        .unwrap_or(10.0 * p)
}

fn short(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        // 0.001, 0.01, 0.1 on the latency decades; no trailing zeros.
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

/// 000 Fig. 5.22: average round-trip time of each ping test, whiskers from min to max.
fn latency(topo: &str, rows: &[&Value]) -> Chart {
    let tests = ping_tests_of(rows);
    Chart {
        title: format!("{topo}: ICMP latency, average with min-max (cf. 000 Fig. 5.22)"),
        x_label: "ping test (64-byte echoes)",
        y_label: "round-trip time, ms (log scale)",
        categories: tests.iter().map(|t| t.to_string()).collect(),
        series: rows
            .iter()
            .map(|r| {
                let v = tests
                    .iter()
                    .map(|t| {
                        Some((
                            test(r, t, "rtt_avg_ms")?,
                            Some((test(r, t, "rtt_min_ms")?, test(r, t, "rtt_max_ms")?)),
                        ))
                    })
                    .collect();
                (name(r).to_string(), v)
            })
            .collect(),
        log: true,
        value_labels: false,
    }
}

/// 000 Fig. 5.23: the share of echoes lost in each ping test.
fn loss(topo: &str, rows: &[&Value]) -> Chart {
    let tests = ping_tests_of(rows);
    Chart {
        title: format!("{topo}: ICMP packet loss (cf. 000 Fig. 5.23)"),
        x_label: "ping test (64-byte echoes)",
        y_label: "echoes lost, % of sent",
        categories: tests.iter().map(|t| t.to_string()).collect(),
        series: rows
            .iter()
            .map(|r| {
                (
                    name(r).to_string(),
                    tests
                        .iter()
                        .map(|t| test(r, t, "loss_percent").map(|v| (v, None)))
                        .collect(),
                )
            })
            .collect(),
        log: false,
        value_labels: true,
    }
}

/// 000 Fig. 5.24: HTTP download rates (curl's MB/s times 8) and iperf3 TCP, in one unit.
fn throughput(topo: &str, rows: &[&Value], doc: &Value) -> Chart {
    let mut cats: Vec<(String, String, &str, f64)> = downloads(doc)
        .into_iter()
        .map(|t| (t.clone(), t, "mbyte_per_s", 8.0))
        .collect();
    for (label, t) in [
        ("TCP 1 stream", "iperf_tcp_1"),
        ("TCP 4 streams", "iperf_tcp_4"),
    ] {
        cats.push((label.into(), t.into(), "mbit_per_s", 1.0));
    }
    Chart {
        title: format!("{topo}: TCP throughput, HTTP downloads and iperf3 (cf. 000 Fig. 5.24)"),
        x_label: "HTTP download size (curl) and iperf3 TCP streams",
        y_label: "throughput, Mbit/s",
        categories: cats.iter().map(|c| c.0.clone()).collect(),
        series: rows
            .iter()
            .map(|r| {
                (
                    name(r).to_string(),
                    cats.iter()
                        .map(|(_, t, k, m)| test(r, t, k).map(|v| (v * m, None)))
                        .collect(),
                )
            })
            .collect(),
        log: false,
        value_labels: false,
    }
}

/// Renders every figure of a results.json that `mt6d bench` wrote, next to it; for figures of
/// a run made before a change to the drawing, and for looking at one without root.
pub fn redraw(results: &Path) -> Result<Vec<PathBuf>, String> {
    let text =
        std::fs::read_to_string(results).map_err(|e| format!("{}: {e}", results.display()))?;
    let doc = Value::parse(&text).map_err(|e| format!("{}: {e}", results.display()))?;
    let dir = results.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    write_figures(&doc, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small results document in the shape the bench writes: two scenarios, one not
    /// available, one test missing from one row.
    fn synthetic() -> Value {
        let text = r#"{
          "profile": {"name": "quick",
                      "downloads": [{"test": "http_500k"}, {"test": "http_1M"}]},
          "rows": [
            {"topology": "switched", "scenario": "none", "available": true, "tests": {
               "ping_std": {"rtt_min_ms": 0.05, "rtt_avg_ms": 0.08, "rtt_max_ms": 0.2, "loss_percent": 0.0},
               "ping_flood_10k": {"rtt_min_ms": 0.04, "rtt_avg_ms": 0.06, "rtt_max_ms": 1.5, "loss_percent": 0.0},
               "http_500k": {"mbyte_per_s": 120.0}, "http_1M": {"mbyte_per_s": 250.0},
               "iperf_tcp_1": {"mbit_per_s": 11000.0}, "iperf_tcp_4": {"mbit_per_s": 12500.0}}},
            {"topology": "switched", "scenario": "mt6d-encrypt", "available": true, "tests": {
               "ping_std": {"rtt_min_ms": 0.2, "rtt_avg_ms": 3.1, "rtt_max_ms": 80.0, "loss_percent": 0.0},
               "ping_flood_10k": {"rtt_min_ms": 0.1, "rtt_avg_ms": 0.15, "rtt_max_ms": 2.0, "loss_percent": 0.01},
               "http_500k": {"mbyte_per_s": 90.0},
               "iperf_tcp_1": {"mbit_per_s": 4200.0}, "iperf_tcp_4": {"mbit_per_s": 5100.0}}},
            {"topology": "switched", "scenario": "boringtun", "available": false,
             "reason": "not available: boringtun-cli not found"}
          ]}"#;
        Value::parse(text).expect("the synthetic document parses")
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mt6d-bench-plot-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn every_figure_renders_as_svg_and_png() {
        let dir = tempdir("synthetic");
        let written = write_figures(&synthetic(), &dir).expect("figures render");
        assert_eq!(written.len(), 6, "3 figures x SVG and PNG for one topology");
        for kind in ["latency", "loss", "throughput"] {
            let svg = std::fs::read_to_string(dir.join(format!("switched-{kind}.svg")))
                .expect("the SVG was written");
            assert!(svg.trim_start().starts_with("<svg"), "{kind}: not an SVG");
            assert!(svg.trim_end().ends_with("</svg>"), "{kind}: SVG not closed");
            assert_eq!(svg.matches("<svg").count(), svg.matches("</svg>").count());
            // The legend names every scenario, the axes say what they show.
            for scenario in ["none", "mt6d-encrypt", "boringtun"] {
                assert!(svg.contains(scenario), "{kind}: legend lacks {scenario}");
            }
            assert!(svg.contains("<rect"), "{kind}: no bars");
            let png = std::fs::read(dir.join(format!("switched-{kind}.png"))).expect("PNG");
            assert!(
                png.starts_with(b"\x89PNG\r\n\x1a\n"),
                "{kind}: no PNG signature"
            );
            // IHDR: width and height as drawn.
            assert_eq!(&png[12..16], b"IHDR");
            assert_eq!(&png[16..20], &SIZE.0.to_be_bytes());
            assert_eq!(&png[20..24], &SIZE.1.to_be_bytes());
            assert!(
                png.len() > 5_000,
                "{kind}: PNG suspiciously small ({} B)",
                png.len()
            );
        }
        let latency = std::fs::read_to_string(dir.join("switched-latency.svg")).expect("SVG");
        assert!(latency.contains("round-trip time, ms (log scale)"));
        assert!(latency.contains("ping_flood_10k"));
        let throughput = std::fs::read_to_string(dir.join("switched-throughput.svg")).expect("SVG");
        assert!(throughput.contains("throughput, Mbit/s"));
        assert!(throughput.contains("TCP 4 streams"));
        // mt6d-encrypt has no http_1M and boringtun has nothing: both say so.
        assert!(throughput.contains("n/a"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The PNG has text in it: the embedded font draws glyphs, so the image holds more than
    /// the bars' few colours, white and the grid.
    #[test]
    fn the_png_carries_text_drawn_with_the_embedded_font() {
        let chart = loss("switched", &rows_of(&synthetic(), "switched"));
        let png = chart.png().expect("renders");
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let mut reader = decoder.read_info().expect("a PNG the decoder reads");
        let mut rgb = vec![0; reader.output_buffer_size().expect("size")];
        reader.next_frame(&mut rgb).expect("one frame");
        // Antialiased glyphs leave many grey levels; bars and grid alone leave a handful.
        let mut greys: Vec<u8> = rgb
            .chunks(3)
            .filter(|p| p[0] == p[1] && p[1] == p[2])
            .map(|p| p[0])
            .collect();
        greys.sort_unstable();
        greys.dedup();
        assert!(
            greys.len() > 50,
            "only {} grey levels: no text drawn?",
            greys.len()
        );
    }

    #[test]
    fn the_committed_full_run_redraws() {
        let results = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/results/2026-11-21-full/results.json"
        );
        let dir = tempdir("full");
        std::fs::copy(results, dir.join("results.json")).expect("copy results.json");
        let written = redraw(&dir.join("results.json")).expect("redraws");
        assert_eq!(written.len(), 18, "3 topologies x 3 figures x 2 formats");
        for p in &written {
            assert!(std::fs::metadata(p).expect("written").len() > 1_000);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn log_axis_spans_whole_decades_and_reads_as_values() {
        let chart = latency("switched", &rows_of(&synthetic(), "switched"));
        let (lo, hi, ticks) = chart.y_axis();
        assert_eq!((lo, hi), (-2.0, 2.0), "0.04 ms .. 80 ms");
        assert_eq!(ticks, vec![-2.0, -1.0, 0.0, 1.0, 2.0]);
        assert_eq!(short(10f64.powf(-2.0)), "0.01");
        assert_eq!(short(10f64.powf(2.0)), "100");
    }
}
