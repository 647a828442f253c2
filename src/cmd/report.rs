//! `pdsim report DIR`: write `report.html` for a run folder (`report.json`,
//! with `requests.csv` and `timeline.csv` when there) or a sweep folder
//! (`sweep.csv`); see `pdsim::html`.

use std::path::PathBuf;

use pdsim::html;

use super::{CmdError, emit};

/// Arguments of `pdsim report`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The folder `pdsim run` or `pdsim sweep` wrote.
    pub dir: PathBuf,
    /// Where to write the page (default: DIR/report.html).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Renders and writes the page, then says where it went.
pub fn run(args: &Args) -> Result<(), CmdError> {
    let (page, path) = html::write(&args.dir, args.out.as_deref())?;
    if !args.quiet {
        emit(&written_line(&page, &path))?;
    }
    Ok(())
}

/// `wrote out/x/report.html (run report: 17 charts, 312 KB; no timeline.csv)`.
pub fn written_line(page: &html::Page, path: &std::path::Path) -> String {
    let kind = match page.kind() {
        html::Kind::Run => "run",
        html::Kind::Sweep => "sweep",
    };
    let missing =
        if page.missing().is_empty() { String::new() } else { format!("; no {}", page.missing().join(", no ")) };
    format!(
        "wrote        {} ({kind} report: {} charts, {} KB{missing})\n",
        path.display(),
        page.charts(),
        page.html().len().div_ceil(1024)
    )
}
