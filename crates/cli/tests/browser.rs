//! `allocsim report` in a real browser: headless Chromium loads the page of every bundled
//! trace without a JavaScript error, and screenshots of a lab trace, a mid-run history and an
//! OOM trace show the timeline (counted in pixels, not read from the DOM).
//!
//! Needs `chromium` on the PATH (Debian's package; `.ci/run` installs it). Without it the test
//! says it was skipped, unless `ALLOCSIM_BROWSER_TESTS=require` (as in CI), where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()));
    if found.is_none() {
        let required = std::env::var("ALLOCSIM_BROWSER_TESTS").is_ok_and(|v| v == "require");
        assert!(!required, "ALLOCSIM_BROWSER_TESTS=require but no chromium on the PATH");
        // On the real stderr: libtest keeps what a passing test writes with `eprintln!`, and a
        // skip must show in the normal test output.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: the browser test needs chromium on the PATH (apt-get install chromium)"
        );
    }
    found
}

fn report(trace: &Path, out: &Path, extra: &[&str]) {
    let status = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .arg("report")
        .arg(trace)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .expect("running allocsim");
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
}

fn headless(browser: &str, args: &[String]) -> std::process::Output {
    // A profile of its own per call: two browsers on one profile do not both start.
    let profile = scratch();
    Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
        .arg("--virtual-time-budget=10000")
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .output()
        .expect("running chromium")
}

/// The page's `<body>` after its scripts ran.
fn body_after_load(browser: &str, page: &Path) -> String {
    let out = headless(browser, &["--dump-dom".into(), format!("file://{}", page.display())]);
    let dom = String::from_utf8_lossy(&out.stdout);
    let start = dom.find("<body").unwrap_or_else(|| panic!("no <body> for {}", page.display()));
    dom[start..dom[start..].find('>').map_or(dom.len(), |e| start + e + 1)].to_string()
}

fn bundled() -> Vec<PathBuf> {
    let mut traces = Vec::new();
    for dir in ["pytorch-2.11-h100", "pytorch-2.11-h100-extra", "pytorch-2.11-h100-user"] {
        for entry in std::fs::read_dir(root().join("traces").join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.to_string_lossy().ends_with(".pickle.gz") {
                traces.push(path);
            }
        }
    }
    traces.sort();
    traces
}

/// A directory of its own, removed when dropped.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("allocsim-browser-").tempdir().unwrap()
}

#[test]
fn every_bundled_trace_report_loads_without_errors() {
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let dir = scratch.path();
    let traces = bundled();
    assert_eq!(traces.len(), 38);
    let mut failures = Vec::new();
    for trace in &traces {
        let page = dir.join(format!("{}.html", trace.file_stem().unwrap().to_string_lossy()));
        report(trace, &page, &["--no-advice"]);
        let body = body_after_load(browser, &page);
        if !body.contains(r#"data-status="ready""#) || body.contains("data-errors") {
            failures.push(format!("{}: {body}", trace.display()));
        }
    }
    assert!(failures.is_empty(), "pages with errors:\n{}", failures.join("\n"));
}

/// `compare --html` loads without errors, and its panels draw each column's reserved line and
/// the OOM marks (counted in pixels).
#[test]
fn the_comparison_page_draws_its_panels() {
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let dir = scratch.path();
    let page = dir.join("compare.html");
    let trace = root().join("traces/pytorch-2.11-h100/synthetic_oom.pickle.gz");
    let out = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .args(["compare", trace.to_str().unwrap(), "--policy", "pytorch,bfc", "--no-capacity"])
        .args(["--device-total", "3GiB", "--html", page.to_str().unwrap()])
        .output()
        .expect("running allocsim");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let body = body_after_load(browser, &page);
    assert!(body.contains(r#"data-status="ready""#) && !body.contains("data-errors"), "{body}");
    let shot = dir.join("compare.png");
    let url = format!("file://{}", page.display());
    headless(
        browser,
        &["--window-size=1200,900".into(), format!("--screenshot={}", shot.display()), url],
    );
    let counts = colours(&shot);
    let n = |c: &str| counts.get(&hex(c)).copied().unwrap_or(0);
    // pytorch's panel is red, bfc's green (compare.js); both OOM on 3 GiB.
    assert!(n("#d62728") > 200 && n("#2ca02c") > 200, "{} {}", n("#d62728"), n("#2ca02c"));
    assert!(n("#c800c8") > 200, "OOM marks: {}", n("#c800c8"));
}

/// Pixels of each colour in a screenshot.
fn colours(png_path: &Path) -> std::collections::HashMap<[u8; 3], u64> {
    let decoder = png::Decoder::new(std::fs::File::open(png_path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let step = info.color_type.samples();
    let mut counts = std::collections::HashMap::new();
    for px in buf[..info.buffer_size()].chunks(step) {
        *counts.entry([px[0], px[1], px[2]]).or_insert(0) += 1;
    }
    counts
}

fn hex(c: &str) -> [u8; 3] {
    let v = u32::from_str_radix(c.trim_start_matches('#'), 16).unwrap();
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

#[test]
fn screenshots_show_the_timeline() {
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let dir = scratch.path();
    let traces = root().join("traces");
    let cases = [
        ("lab", traces.join("pytorch-2.11-h100/gpt2_train.pickle.gz"), false),
        ("mid-run", traces.join("pytorch-2.11-h100-user/d_gpt2_blog.pickle.gz"), false),
        ("OOM", traces.join("pytorch-2.11-h100-user/c_train_oom.pickle.gz"), true),
    ];
    // The band colours, the reserved line, the grey of the other allocations, the OOM
    // mark (report.js).
    // (Not the first, #1f77b4: the segment map's allocated blocks share it.)
    let bands: Vec<[u8; 3]> = [
        "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff9896", "#98df8a",
        "#c5b0d5", "#c49c94", "#aec7e8", "#dbdb8d", "#9edae5",
    ]
    .map(hex)
    .to_vec();
    let (reserved, grey, oom) = (hex("#d62728"), hex("#cfcfcf"), hex("#c800c8"));
    for (what, trace, has_oom) in cases {
        let page = dir.join(format!("{what}.html"));
        report(&trace, &page, &["--no-advice"]);
        // Hovering the middle of the chart, near the bottom, names an allocation or the grey
        // band (report.js does it for `#selftest`).
        let page_url = format!("file://{}", page.display());
        let dom = headless(browser, &["--dump-dom".into(), format!("{page_url}#selftest")]);
        let dom = String::from_utf8_lossy(&dom.stdout);
        let hover = dom.split("data-hover=\"").nth(1).and_then(|h| h.split('"').next());
        let hover = hover.unwrap_or_else(|| panic!("{what}: no hover text"));
        assert!(hover.starts_with("op ") && hover.contains("allocated"), "{what}: {hover}");
        assert!(hover.contains(" at 0x") || hover.contains("grey:"), "{what}: {hover}");
        let shot = dir.join(format!("{what}.png"));
        let out = headless(
            browser,
            &[
                "--window-size=1400,900".into(),
                format!("--screenshot={}", shot.display()),
                page_url,
            ],
        );
        assert!(shot.exists(), "{what}: no screenshot: {}", String::from_utf8_lossy(&out.stderr));
        let counts = colours(&shot);
        let n = |c: &[u8; 3]| counts.get(c).copied().unwrap_or(0);
        let band_pixels: u64 = bands.iter().map(n).sum();
        // The chart is 420 px high and about 1300 wide. Thirteen of the fourteen band colours
        // (not the one the segment map shares) cover 7,820 to 18,740 of its pixels in the
        // three, the grey band 14,108 to 16,704: the stack fills 4 to 6 % of the chart.
        assert!(band_pixels > 4_000, "{what}: {band_pixels} pixels of band colours");
        assert!(n(&reserved) > 300, "{what}: {} pixels of the reserved line", n(&reserved));
        assert!(n(&grey) + band_pixels > 15_000, "{what}: the stack is too thin");
        assert_eq!(n(&oom) > 100, has_oom, "{what}: {} pixels of OOM marks", n(&oom));
    }
}

/// Strings that break a page that escapes too little: `<!--<script>` inside the data's
/// `<script>` element keeps it open to the page's end (issue 50: the page stayed blank), the
/// others end it or open markup. Each `pwned` marks the body if it ever runs.
const HOSTILE: [&str; 5] = [
    "<!--<script>",
    "</script>",
    "<script>document.body.dataset.pwned=1</script>",
    "\"'><img src=x onerror=\"document.body.dataset.pwned=2\">",
    "line\u{2028}separators\u{2029}",
];

/// A snapshot of allocations whose frames, compile context and user metadata are the hostile
/// strings, written under a hostile file name (it becomes the page's title).
fn hostile_snapshot(dir: &Path) -> PathBuf {
    hostile_snapshot_of(dir, "", 40)
}

/// [`hostile_snapshot`] of `count` allocations, its file name ending in `suffix`.
fn hostile_snapshot_of(dir: &Path, suffix: &str, count: i64) -> PathBuf {
    use allocsim_trace::pickle::Value;
    let frames: Vec<Value> = HOSTILE
        .iter()
        .map(|s| {
            Value::str_dict([
                ("filename", Value::str(&format!("{s}.py"))),
                ("name", Value::str(s)),
                ("line", Value::Int(1)),
            ])
        })
        .collect();
    let entries: Vec<Value> = (0..count)
        .map(|i| {
            Value::str_dict([
                ("action", Value::str("alloc")),
                ("addr", Value::Int(0x7f00_0000_0000 + (i << 24))),
                ("size", Value::Int(1 << 24)),
                ("stream", Value::Int(0)),
                ("frames", Value::list(frames.clone())),
                ("time_us", Value::Int(i)),
                ("compile_context", Value::str(HOSTILE[3])),
                ("user_metadata", Value::str(&HOSTILE.concat())),
            ])
        })
        .collect();
    let root = Value::str_dict([
        ("segments", Value::list(vec![])),
        ("device_traces", Value::list(vec![Value::list(entries)])),
    ]);
    let path = dir.join(format!("<!--<script>'\"><img src=x onerror=alert(1)>{suffix}.pickle"));
    std::fs::write(&path, allocsim_trace::pickle::to_vec(&root).unwrap()).unwrap();
    path
}

/// Issue 50, item 7: with every hostile string in frames, annotations and the file name, the
/// report page loads (`data-status="ready"`, no script error), runs none of them, and its
/// tooltip shows them as text.
#[test]
fn a_report_of_hostile_strings_loads_and_shows_them_as_text() {
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let trace = hostile_snapshot(scratch.path());
    let page = scratch.path().join("hostile.html");
    report(&trace, &page, &["--no-advice"]);
    let body = body_after_load(browser, &page);
    assert!(body.contains(r#"data-status="ready""#), "{body}");
    assert!(!body.contains("data-errors") && !body.contains("pwned"), "{body}");
    let url = format!("file://{}#selftest", page.display());
    let dom = headless(browser, &["--dump-dom".into(), url]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    let start = dom.find("<body").expect("a body");
    let body = &dom[start..start + dom[start..].find('>').unwrap()];
    assert!(body.contains(r#"data-status="ready""#) && !body.contains("data-pwned"), "{body}");
    // The tooltip is text: the strings are in it, as characters (the DOM dump escapes `&`,
    // `"` and, in newer Chromium, `<` and `>` in attribute values).
    let hover = body.split("data-hover=\"").nth(1).expect("a hover text");
    for word in ["!--", "/script", "dataset.pwned=1", "onerror=", "line\u{2028}separators"] {
        assert!(hover.contains(word), "{word:?} not in the tooltip: {hover}");
    }
    // The page's title and heading show the file name as text.
    assert!(dom.contains("<title>allocsim report: &lt;!--&lt;script&gt;"), "{dom:.3000}");
    assert!(!dom.contains("<img"), "an element was made of a string:\n{dom:.3000}");
}

/// `allocsim diff --html` (a page of A, B and the change).
fn diff_page(a: &Path, b: &Path, page: &Path, extra: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .arg("diff")
        .arg(a)
        .arg(b)
        .args(extra)
        .arg("--html")
        .arg(page)
        .output()
        .expect("running allocsim");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The diff page of a recording against its what-if loads without errors, draws A's reserved
/// line (red) and B's (green), counted in pixels, and lists the stack groups.
#[test]
fn the_diff_page_draws_both_timelines() {
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let dir = scratch.path();
    let page = dir.join("diff.html");
    let gpt2 = root().join("traces/pytorch-2.11-h100/gpt2_train.pickle.gz");
    diff_page(&gpt2, &gpt2, &page, &["--b-alloc-conf", "expandable_segments:True"]);
    let url = format!("file://{}", page.display());
    let dom = headless(browser, &["--dump-dom".into(), url.clone()]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    let start = dom.find("<body").expect("a body");
    let body = &dom[start..start + dom[start..].find('>').unwrap()];
    assert!(body.contains(r#"data-status="ready""#) && !body.contains("data-errors"), "{body}");
    assert!(dom.contains(r#"<table id="groups">"#) && dom.contains("adam.py"), "{dom:.3000}");
    assert!(dom.contains("The two op streams are the same throughout."), "{dom:.3000}");
    let shot = dir.join("diff.png");
    headless(
        browser,
        &["--window-size=1200,1000".into(), format!("--screenshot={}", shot.display()), url],
    );
    let counts = colours(&shot);
    let n = |c: &str| counts.get(&hex(c)).copied().unwrap_or(0);
    assert!(n("#d62728") > 200 && n("#2ca02c") > 200, "{} {}", n("#d62728"), n("#2ca02c"));
}

/// A diff page of the hostile snapshot against a recording: its strings (stack groups, the
/// parting op's stack, the file name in the title) are text, and none of them runs.
#[test]
fn a_diff_page_of_hostile_strings_shows_them_as_text() {
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let trace = hostile_snapshot(scratch.path());
    let gpt2 = root().join("traces/pytorch-2.11-h100/gpt2_train.pickle.gz");
    let page = scratch.path().join("hostile-diff.html");
    diff_page(&trace, &gpt2, &page, &["--no-capacity"]);
    let dom = headless(browser, &["--dump-dom".into(), format!("file://{}", page.display())]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    let start = dom.find("<body").expect("a body");
    let body = &dom[start..start + dom[start..].find('>').unwrap()];
    assert!(body.contains(r#"data-status="ready""#), "{body}");
    assert!(!body.contains("data-errors") && !body.contains("pwned"), "{body}");
    assert!(!dom.contains("<img"), "an element was made of a string:\n{dom:.3000}");
    assert!(dom.contains("<title>allocsim diff: &lt;!--&lt;script&gt;"), "{dom:.3000}");
    // The frames, as text in the stack groups and at the parting op.
    let groups = dom.split(r#"<table id="groups">"#).nth(1).expect("the stack groups");
    assert!(groups.contains("document.body.dataset.pwned=1"), "{groups:.3000}");
    let parting = dom.split(r#"id="parting""#).nth(1).expect("the parting op");
    assert!(parting.contains("onerror="), "{parting:.3000}");
}

/// The report's table of settings (`advise`, on by default) loads without errors and shows
/// each setting's headroom over the offline placement.
#[test]
fn the_reports_settings_table_shows_the_headroom() {
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let page = scratch.path().join("gpt2.html");
    report(&root().join("traces/pytorch-2.11-h100/gpt2_train.pickle.gz"), &page, &[]);
    let body = body_after_load(browser, &page);
    assert!(body.contains(r#"data-status="ready""#) && !body.contains("data-errors"), "{body}");
    let out = headless(browser, &["--dump-dom".into(), format!("file://{}", page.display())]);
    let dom = String::from_utf8_lossy(&out.stdout);
    let table = dom.split(r#"<div id="advice">"#).nth(1).expect("the settings table");
    assert!(table.contains(">headroom</th>"), "{table}");
    // Eight settings, each with a percentage in its headroom cell.
    let rows: Vec<&str> = table.split("<tr><td>").skip(1).take(8).collect();
    assert_eq!(rows.len(), 8, "{table}");
    for row in rows {
        let cells: Vec<&str> = row.split("</td><td>").collect();
        assert!(cells[5].ends_with('%'), "headroom cell of {row}");
    }
}

/// Issue 52: the page of a run of more than a million ops (a live workload, built at test
/// time) holds every allocation and loads; zoomed into a thousandth of the run, hovering names
/// the allocation under the cursor, alive at the op it shows, with where it was allocated and
/// freed; the whole run's view does too.
#[test]
fn a_report_of_a_million_ops_zooms_to_single_allocations() {
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let page = scratch.path().join("million.html");
    report(Path::new("workload:transformer-train?steps=600"), &page, &["--no-advice"]);
    let html = std::fs::read_to_string(&page).unwrap();
    let data = html.split(r#"<script type="application/json" id="data">"#).nth(1).unwrap();
    let data: serde_json::Value =
        serde_json::from_str(data.split("</script>").next().unwrap()).expect("the page's data");
    assert!(data["ops"].as_u64().unwrap() >= 1_000_000, "{}", data["ops"]);
    let url = format!("file://{}", page.display());
    for hash in ["#selftest", "#selftest-zoom"] {
        let dom = headless(browser, &["--dump-dom".into(), format!("{url}{hash}")]);
        let dom = String::from_utf8_lossy(&dom.stdout);
        let start = dom.find("<body").expect("a body");
        let body = &dom[start..start + dom[start..].find('>').unwrap()];
        assert!(body.contains(r#"data-status="ready""#) && !body.contains("data-errors"), "{body}");
        let attr = |name: &str| {
            let after = body.split(&format!("{name}=\"")).nth(1)?;
            after.split('"').next().map(str::to_string)
        };
        let drawn: u64 = attr("data-drawn").expect("data-drawn").parse().unwrap();
        assert!(drawn > 0, "{hash}: nothing drawn one by one");
        // "op X ...: ... <b>SIZE</b> at 0xADDR: allocated at op A, freed at op B; ..."
        let hover = attr("data-hover").unwrap_or_else(|| panic!("{hash}: no hover: {body}"));
        let number_after = |text: &str, word: &str| -> Option<u64> {
            let rest = text.split(word).nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        };
        let op = number_after(&hover, "op ").expect("the column's op");
        let allocated = number_after(&hover, "allocated at op ").expect("an allocation");
        assert!(allocated <= op, "{hash}: {hover}");
        if let Some(freed) = number_after(&hover, "freed at op ") {
            assert!(op < freed, "{hash}: {hover}");
        }
        if hash == "#selftest-zoom" {
            let zoom = attr("data-zoom").expect("the zoomed range");
            let range: Vec<f64> = zoom.split(' ').map(|v| v.parse().unwrap()).collect();
            let ops = data["ops"].as_f64().unwrap();
            assert!(range[1] - range[0] < ops / 500.0, "{zoom}");
            assert!(range[0] <= op as f64 && (op as f64) < range[1] + 1.0, "{zoom}: {hover}");
        }
    }
}

/// A trace with no entry makes a page that loads (empty columns, no view to zoom into).
#[test]
fn a_report_of_an_empty_trace_loads() {
    use allocsim_trace::pickle::Value;
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let trace = scratch.path().join("empty.pickle");
    let root = Value::str_dict([
        ("segments", Value::list(vec![])),
        ("device_traces", Value::list(vec![Value::list(vec![])])),
    ]);
    std::fs::write(&trace, allocsim_trace::pickle::to_vec(&root).unwrap()).unwrap();
    let page = scratch.path().join("empty.html");
    report(&trace, &page, &["--no-advice"]);
    let body = body_after_load(browser, &page);
    assert!(body.contains(r#"data-status="ready""#) && !body.contains("data-errors"), "{body}");
}

/// A thousand OOMs (`d_gpt2_blog` on a 6 GiB card) are marked along the top, close ones as
/// one with their count, and leave the bands visible (counted in pixels).
#[test]
fn a_thousand_oom_marks_leave_the_bands_visible() {
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let page = scratch.path().join("ooms.html");
    let trace = root().join("traces/pytorch-2.11-h100-user/d_gpt2_blog.pickle.gz");
    report(&trace, &page, &["--no-advice", "--device-total", "6GiB"]);
    let html = std::fs::read_to_string(&page).unwrap();
    let data = html.split(r#"<script type="application/json" id="data">"#).nth(1).unwrap();
    let data: serde_json::Value =
        serde_json::from_str(data.split("</script>").next().unwrap()).unwrap();
    let ooms = data["ooms"].as_array().unwrap().len();
    assert!(ooms >= 1000, "{ooms} OOMs");
    let shot = scratch.path().join("ooms.png");
    let url = format!("file://{}", page.display());
    headless(
        browser,
        &["--window-size=1400,900".into(), format!("--screenshot={}", shot.display()), url],
    );
    let counts = colours(&shot);
    let n = |c: &str| counts.get(&hex(c)).copied().unwrap_or(0);
    let bands: u64 =
        ["#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"].iter().map(|c| n(c)).sum();
    // Marks are there, in fewer pixels than one an OOM (a tick each, as before, took 20; a
    // line each would cover the chart), and the bands show.
    assert!(n("#c800c8") > 100, "OOM marks: {}", n("#c800c8"));
    assert!(n("#c800c8") < ooms as u64, "OOM marks: {} pixels for {ooms}", n("#c800c8"));
    assert!(bands > 4_000, "{bands} pixels of band colours");
}

/// `allocsim report` on a job of `ranks`, written to `page`.
fn job_page(ranks: &[PathBuf], page: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_allocsim"))
        .arg("report")
        .args(ranks)
        .arg("-o")
        .arg(page)
        .output()
        .expect("running allocsim");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The page's data element, held to what the report_page fuzz target holds the single
/// report's to: no markup in it (no `<`, `>`, `&` or line separator), and it parses.
fn page_data(page: &str) -> serde_json::Value {
    let open = r#"<script type="application/json" id="data">"#;
    let start = page.find(open).expect("a data element") + open.len();
    let text = &page[start..start + page[start..].find("</script>").expect("its end")];
    assert!(!text.contains(['<', '>', '&', '\u{2028}', '\u{2029}']), "markup in the data");
    serde_json::from_str(text).expect("the data parses")
}

/// The value of the body's `data-NAME` attribute.
fn data_attr<'b>(body: &'b str, name: &str) -> Option<&'b str> {
    let at = body.find(&format!("data-{name}=\""))? + name.len() + 7;
    body[at..].split('"').next()
}

/// An `x0 x1` range read from a body attribute.
fn range(text: &str) -> (f64, f64) {
    let mut it = text.split(' ').map(|v| v.parse::<f64>().expect("a number"));
    (it.next().unwrap(), it.next().unwrap())
}

/// The FSDP2 job's ranks, recorded on two H200s.
fn fsdp2_ranks() -> Vec<PathBuf> {
    let dir = root().join("traces/pytorch-2.11-h200-ranks");
    let mut ranks: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("fsdp2_rank") && name.ends_with(".pickle.gz")
        })
        .collect();
    ranks.sort();
    assert!(ranks.len() >= 2, "the FSDP2 recordings are missing");
    ranks
}

/// The job page of the FSDP2 recordings draws one timeline per rank, every one over the same
/// range of the shared time axis; a zoom in the first panel and a pan in the last move every
/// one to the same range; the
/// deciding rank's reserved line is red, the other's blue (counted in pixels).
#[test]
fn the_job_page_draws_one_timeline_per_rank_aligned_and_zoomed_together() {
    let Some(browser) = chromium() else { return };
    let scratch = scratch();
    let page = scratch.path().join("fsdp2_job.html");
    let ranks = fsdp2_ranks();
    job_page(&ranks, &page);
    let data = page_data(&std::fs::read_to_string(&page).unwrap());
    let panels = data["timelines"]["panels"].as_array().unwrap();
    assert_eq!(panels.len(), ranks.len());
    assert_eq!(data["timelines"]["x"], "time_us", "every rank has its entries' times");
    // Aligned on the job's first entry: some rank starts at 0, none before.
    let starts: Vec<f64> = panels.iter().map(|p| p["x"][0].as_f64().unwrap()).collect();
    assert!(starts.iter().all(|&s| s >= 0.0) && starts.contains(&0.0), "{starts:?}");

    let url = format!("file://{}", page.display());
    for (hash, zoomed) in [("", false), ("#selftest-zoom", true)] {
        let dom = headless(browser, &["--dump-dom".into(), format!("{url}{hash}")]);
        let dom = String::from_utf8_lossy(&dom.stdout);
        let start = dom.find("<body").expect("a body");
        let body = &dom[start..start + dom[start..].find('>').unwrap()];
        assert!(body.contains(r#"data-status="ready""#) && !body.contains("data-errors"), "{body}");
        assert_eq!(data_attr(body, "panels"), Some(ranks.len().to_string().as_str()), "{body}");
        let full = range(data_attr(body, "full").expect("the shared range"));
        let ranges: Vec<(f64, f64)> =
            data_attr(body, "ranges").expect("the ranges").split(';').map(range).collect();
        assert_eq!(ranges.len(), ranks.len(), "{body}");
        assert!(ranges.iter().all(|r| *r == ranges[0]), "{hash}: not one range: {ranges:?}");
        let (a, b) = ranges[0];
        if zoomed {
            // Zoomed into the middle half in the first panel, panned on in the last.
            let (q, w) = ((full.1 - full.0) / 4.0, b - a);
            assert!(a > full.0 + q && b < full.1, "{hash}: {:?} in {full:?}", ranges[0]);
            assert!((w - 2.0 * q).abs() < 1e-6 * w, "{hash}: the pan kept the width: {w}");
        } else {
            assert_eq!(ranges[0], full, "{hash}");
        }
    }
    let shot = scratch.path().join("job.png");
    headless(
        browser,
        &["--window-size=1200,1400".into(), format!("--screenshot={}", shot.display()), url],
    );
    let counts = colours(&shot);
    let n = |c: &str| counts.get(&hex(c)).copied().unwrap_or(0);
    assert!(n("#d62728") > 200 && n("#1f77b4") > 200, "{} {}", n("#d62728"), n("#1f77b4"));
}

/// A job of two hostile snapshots (the second holds more, so where it differs lists the
/// hostile frames): the page's data holds no markup, and in the browser every string (file
/// names in the title, the table and the panels' titles, the frames) is text and none runs.
#[test]
fn a_job_page_of_hostile_strings_shows_them_as_text() {
    let scratch = scratch();
    let ranks = [
        hostile_snapshot_of(scratch.path(), "_rank0", 40),
        hostile_snapshot_of(scratch.path(), "_rank1", 60),
    ];
    let page = scratch.path().join("hostile-job.html");
    job_page(&ranks, &page);
    let text = std::fs::read_to_string(&page).unwrap();
    let data = page_data(&text);
    assert_eq!(data["job"]["deciding_rank"], 1);
    assert!(!data["job"]["differs"]["stacks"].as_array().unwrap().is_empty());
    let title = text.split("<title>").nth(1).and_then(|t| t.split("</title>").next()).unwrap();
    assert!(!title.contains(['<', '>']), "the title is not plain text: {title}");
    let Some(browser) = chromium() else { return };
    let dom = headless(browser, &["--dump-dom".into(), format!("file://{}", page.display())]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    let start = dom.find("<body").expect("a body");
    let body = &dom[start..start + dom[start..].find('>').unwrap()];
    assert!(body.contains(r#"data-status="ready""#), "{body}");
    assert!(!body.contains("data-errors") && !body.contains("pwned"), "{body}");
    assert!(!dom.contains("<img"), "an element was made of a string:\n{dom:.3000}");
    assert!(dom.contains("<title>allocsim report: job of 2 ranks: &lt;!--&lt;script&gt;"));
    let differs = dom.split(r#"<table id="differs">"#).nth(1).expect("where rank 1 differs");
    assert!(differs.contains("document.body.dataset.pwned=1"), "{differs:.3000}");
    let panel = dom.split(r#"class="panel-title">"#).nth(1).expect("a panel's title");
    assert!(panel.starts_with("rank 0 (&lt;!--&lt;script&gt;"), "{panel:.300}");
}
