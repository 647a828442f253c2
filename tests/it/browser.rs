//! report.html in a real browser: headless Chromium opens a run's page and
//! a sweep's, and the test fails on any script error, unhandled rejection
//! or `console.error`, and on any chart whose SVG has no size or no drawn
//! data mark inside it.
//!
//! The page itself runs no script: the test injects two into a copy of it.
//! A head script records `window.onerror` (resource errors too, in the
//! capture phase), unhandled rejections and `console.error` calls; a script
//! run on `load` measures every `figure.chart` (its SVG's box, each `.mark`'s
//! bounding box, and that the box lies within the SVG's viewBox) and writes
//! a verdict into the DOM, which `chromium --dump-dom` prints, with the
//! width each table needs against the width it has (a 1,200 px window:
//! the ranks table must not scroll sideways).
//!
//! It needs Chromium, so it is ignored unless asked for, and says so:
//! `cargo test -- --include-ignored` (as `.ci/run` runs it, after
//! installing Debian's `chromium`) or `cargo test -- --ignored browser`
//! runs it, and then a missing Chromium is a failure. `PDSIM_CHROMIUM`
//! names another binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cli_report::{RUN_CHARTS, figures, run_with_html, tiny_sweep};
use crate::common::{outcome, pdsim, scratch_dir};

/// How long one page may take to load and be measured.
const TIMEOUT: Duration = Duration::from_secs(90);

/// Recorded before anything else on the page runs.
const HEAD_SCRIPT: &str = r#"<script>
window.__errors = [];
window.addEventListener('error', function (e) {
  var where = e.filename ? ' at ' + e.filename + ':' + e.lineno : '';
  var what = e.message || ('failed to load ' + ((e.target && (e.target.src || e.target.href)) || e.type));
  window.__errors.push('error: ' + what + where);
}, true);
window.addEventListener('unhandledrejection', function (e) {
  window.__errors.push('unhandled rejection: ' + e.reason);
});
(function () {
  var original = console.error;
  console.error = function () {
    window.__errors.push('console.error: ' + Array.prototype.join.call(arguments, ' '));
    return original.apply(console, arguments);
  };
})();
</script>"#;

/// Run once the page has loaded: one line per chart, then the errors.
const TAIL_SCRIPT: &str = r#"<script>
window.addEventListener('load', function () {
  var lines = [];
  var figs = document.querySelectorAll('figure.chart');
  for (var i = 0; i < figs.length; i++) {
    var f = figs[i], name = f.getAttribute('data-chart'), svg = f.querySelector('svg');
    if (!svg) { lines.push('FAIL ' + name + ' no svg'); continue; }
    var box = svg.getBoundingClientRect();
    if (!(box.width > 100 && box.height > 20)) { lines.push('FAIL ' + name + ' svg box ' + box.width + 'x' + box.height); continue; }
    var vb = svg.viewBox.baseVal, marks = svg.querySelectorAll('.mark'), drawn = 0, outside = 0;
    for (var k = 0; k < marks.length; k++) {
      var b = marks[k].getBBox();
      if (!(b.width > 0 || b.height > 0)) continue;
      if (b.x + b.width < vb.x || b.y + b.height < vb.y || b.x > vb.x + vb.width || b.y > vb.y + vb.height) { outside++; continue; }
      drawn++;
    }
    if (drawn === 0) { lines.push('FAIL ' + name + ' no drawn mark (' + marks.length + ' marks, ' + outside + ' outside)'); continue; }
    lines.push('OK ' + name + ' ' + drawn);
  }
  var tables = document.querySelectorAll('table[data-table]');
  for (var t = 0; t < tables.length; t++) {
    var holder = tables[t].parentElement;
    lines.push('TABLE ' + tables[t].getAttribute('data-table') + ' ' + holder.scrollWidth + ' ' + holder.clientWidth);
  }
  lines.push('ERRORS ' + window.__errors.length);
  for (var j = 0; j < window.__errors.length; j++) lines.push(window.__errors[j]);
  var v = document.createElement('pre');
  v.id = 'verdict';
  v.textContent = 'CHARTS ' + figs.length + '\n' + lines.join('\n') + '\nEND';
  document.body.appendChild(v);
});
</script>"#;

/// The Chromium to use: `PDSIM_CHROMIUM`, or the first of the usual names
/// on `PATH`.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PDSIM_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// The browser; the test was asked for, so a missing one is a failure.
fn browser() -> PathBuf {
    chromium().unwrap_or_else(|| {
        panic!("the browser test needs chromium on PATH (apt-get install chromium), or PDSIM_CHROMIUM naming one")
    })
}

/// A copy of `page` in `dir` with the two scripts injected.
fn instrumented(page: &Path, dir: &Path) -> PathBuf {
    let html = std::fs::read_to_string(page).unwrap();
    let head = html.find("<head>").expect("a <head>") + "<head>".len();
    let mut out = String::with_capacity(html.len() + 4096);
    out.push_str(&html[..head]);
    out.push('\n');
    out.push_str(HEAD_SCRIPT);
    let body_end = html.rfind("</body>").expect("a </body>");
    out.push_str(&html[head..body_end]);
    out.push_str(TAIL_SCRIPT);
    out.push_str(&html[body_end..]);
    let copy = dir.join("instrumented.html");
    std::fs::write(&copy, out).unwrap();
    copy
}

/// Opens `page` in headless Chromium and returns the verdict's lines.
fn verdict(browser: &Path, page: &Path, work: &Path) -> Vec<String> {
    let profile = work.join("profile");
    std::fs::create_dir_all(&profile).unwrap();
    let dom_path = work.join("dom.html");
    let dom = std::fs::File::create(&dom_path).unwrap();
    let log = std::fs::File::create(work.join("chromium.log")).unwrap();
    let url = format!("file://{}", page.canonicalize().unwrap().display());
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--window-size=1200,2000",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(dom)
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", browser.display()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish {} within {TIMEOUT:?}", page.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&dom_path).unwrap();
    let log = std::fs::read_to_string(work.join("chromium.log")).unwrap_or_default();
    assert!(status.success(), "chromium failed ({status}) on {}: {log}", page.display());
    let start = text.find("<pre id=\"verdict\">").unwrap_or_else(|| {
        panic!("no verdict in the DOM of {} (did the load handler run?); chromium said: {log}", page.display())
    });
    let rest = &text[start + "<pre id=\"verdict\">".len()..];
    let end = rest.find("</pre>").expect("the verdict is closed");
    let lines: Vec<String> = rest[..end]
        .lines()
        .map(|l| l.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&amp;", "&"))
        .collect();
    assert_eq!(lines.last().map(String::as_str), Some("END"), "{lines:?}");
    lines
}

/// Checks a page: no error, every chart drawn, and as many charts as the
/// file holds.
fn check_page(browser: &Path, page: &Path, name: &str) -> Vec<String> {
    let work = scratch_dir(name);
    let html = std::fs::read_to_string(page).unwrap();
    let expected: Vec<String> = figures(&html).into_iter().map(|f| f.0).collect();
    let lines = verdict(browser, &instrumented(page, &work), &work);
    assert_eq!(lines[0], format!("CHARTS {}", expected.len()), "{lines:?}");
    let fails: Vec<&String> = lines.iter().filter(|l| l.starts_with("FAIL")).collect();
    assert!(fails.is_empty(), "{name}: charts that did not render: {fails:?}");
    let errors_at = lines.iter().position(|l| l.starts_with("ERRORS ")).unwrap();
    assert_eq!(lines[errors_at], "ERRORS 0", "{name}: the page logged errors: {:?}", &lines[errors_at..]);
    let ok: Vec<String> =
        lines.iter().filter_map(|l| l.strip_prefix("OK ")).map(|l| l.rsplit_once(' ').unwrap().0.to_owned()).collect();
    assert_eq!(ok, expected, "{name}: every chart measured, in order");
    ok
}

#[test]
#[ignore = "needs chromium: cargo test -- --include-ignored runs it (as CI does)"]
fn report_pages_render_in_headless_chromium() {
    let browser = browser();
    let started = Instant::now();
    // A run: P/D, a multi-group model, every file.
    let run = run_with_html("glm-5.3-flash-1p1d.toml", "browser-run", &[]);
    let drawn = check_page(&browser, &run.join("report.html"), "browser-run-page");
    for want in RUN_CHARTS {
        assert!(drawn.iter().any(|d| d == want), "{want} not drawn: {drawn:?}");
    }
    // At 1,200 px the ranks table (six cache groups a rank) fits its
    // column: no sideways scrolling.
    let work = scratch_dir("browser-run-tables");
    let lines = verdict(&browser, &instrumented(&run.join("report.html"), &work), &work);
    let ranks = lines.iter().find(|l| l.starts_with("TABLE ranks ")).unwrap_or_else(|| panic!("{lines:?}"));
    let w: Vec<u64> = ranks.split(' ').skip(2).map(|x| x.parse().unwrap()).collect();
    assert!(w[0] <= w[1], "the ranks table needs {} px of its {} px: {ranks}", w[0], w[1]);
    // A sweep.
    let sweep = tiny_sweep("browser-sweep");
    let (code, _, stderr) = outcome(&pdsim(&["report", sweep.to_str().unwrap(), "--quiet"]));
    assert_eq!(code, 0, "{stderr}");
    let drawn = check_page(&browser, &sweep.join("report.html"), "browser-sweep-page");
    assert!(drawn.iter().any(|d| d == "mean_ttft_ms@decode.count"), "{drawn:?}");
    // A sweep point's page, from its report.json alone.
    let point = sweep.join("points").join("count=1,rate_per_s=2.0,seed=1");
    let (code, _, stderr) = outcome(&pdsim(&["report", point.to_str().unwrap(), "--quiet"]));
    assert_eq!(code, 0, "{stderr}");
    let drawn = check_page(&browser, &point.join("report.html"), "browser-point-page");
    assert!(drawn.iter().any(|d| d == "latency_stats") && drawn.len() >= 5, "{drawn:?}");
    // The instrumentation itself works: a page with an error fails.
    let work = scratch_dir("browser-canary");
    let canary = work.join("canary.html");
    std::fs::write(
        &canary,
        "<!DOCTYPE html>\n<html><head><title>x</title></head><body><figure class=\"chart\" data-chart=\"empty\"><svg viewBox=\"0 0 10 10\"></svg></figure><script>console.error('boom')</script></body></html>\n",
    )
    .unwrap();
    let lines = verdict(&browser, &instrumented(&canary, &work), &work);
    assert!(lines.iter().any(|l| l.starts_with("FAIL empty")), "{lines:?}");
    assert!(lines.iter().any(|l| l == "ERRORS 1") && lines.iter().any(|l| l == "console.error: boom"), "{lines:?}");
    eprintln!("browser test: two pages and a canary in {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
#[ignore = "needs chromium: cargo test -- --include-ignored runs it (as CI does)"]
fn plan_page_renders_in_headless_chromium() {
    let browser = browser();
    let out = crate::cli_plan::plan("llama-8b-aggregated-wins.toml", "browser-plan", &["--quiet"]);
    let drawn = check_page(&browser, &out.join("plan.html"), "browser-plan-page");
    assert_eq!(drawn, vec!["frontier".to_owned(), "rate-by-gpus".to_owned()]);
}
