"""What a reader sees, checked in headless Chromium: the site's math and notebook 02's sliders.

    python scripts/check_browser.py --site build/html --screenshots build/browser

(``make check-browser`` runs it; it needs the site of ``make notebooks``.) playwright drives
the system's ``chromium`` (``apt-get install chromium``; playwright's own browser download is
not used). Two parts:

1. The site, served from 127.0.0.1, at 1 and 2 device pixels per CSS pixel (a standard and a
   high-density screen: :data:`SCALES`): on every page, once MathJax has typeset it,

   * no formula is a TeX error (``mjx-merror``) or shows a stray backslash;
   * no glyph of a formula lies outside the box that clips it (e.g. a ``^\\top`` above the top
     row of an ``align*`` block, cut by the formula's container);
   * every ``\\mathbf`` formula draws with MathJax's bold font (``MJXTEX-B``, loaded), every
     ``\\mathbb`` one with its blackboard font (``MJXTEX-A``, loaded), so a bold vector never
     reads as an italic scalar;
   * in every ``align``/``aligned`` block, the second column starts at the same x in every row
     (the ``=`` signs line up);
   * no printed output (a cell's text) is wider than its box: the failure names the page and
     the first characters of the first line that does not fit;
   * no request goes to another host.

   The site must hold at least one formula of each kind. Each failure says at which scales it
   happens (``[1x]``, ``[1x, 2x]``). Screenshots, per scale: ``index@1x.png``, and the first
   display formula of each kind: ``math-bold@1x.png``, ``math-blackboard@1x.png``,
   ``math-aligned@1x.png`` (and ``@2x``).
2. Notebook 02 in JupyterLab (a copy, run from a temporary folder): run all cells, then the
   explorer's cell holds one figure (not two), its slider labels are not cut, and moving the
   ``A_log`` slider redraws the figure. Screenshots: ``lab-02-before.png``, ``lab-02-after.png``.

Exit status 1 with one line per failure; ``--skip-lab`` runs part 1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import os
import pathlib
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from build_site import folder_problem  # noqa: E402  (scripts/ is no package)

LOCAL_HOSTS = {"127.0.0.1", "localhost"}
NOTEBOOK_02 = ROOT / "notebooks" / "02_gating_and_decay.ipynb"

# run in the page once MathJax is done: one record per formula
MATH_PROBE = """
async () => {
  if (!window.MathJax || !MathJax.startup) return null;
  await MathJax.startup.promise;
  await document.fonts.ready;
  const loaded = new Set([...document.fonts].filter(f => f.status === "loaded")
                          .map(f => f.family.replace(/["']/g, "")));
  const records = [];
  let index = 0;
  for (const item of MathJax.startup.document.math) {
    const root = item.typesetRoot;
    if (!root) continue;
    root.setAttribute("data-probe", String(index));
    const families = new Set([...root.querySelectorAll("mjx-c")].map(
      c => getComputedStyle(c).fontFamily.split(",").map(s => s.trim().replace(/["']/g, ""))
           .filter(s => s !== "MJXZERO")[0]));
    const error = root.querySelector("mjx-merror");
    const rows = [...root.querySelectorAll("mjx-mtable mjx-mtr, mjx-mtable mjx-mlabeledtr")];
    // where a cell's content starts and ends (its strut excluded): in an align block the
    // first column ends at one x in every row and the second starts at one x
    const extent = cell => {
      const rects = [...cell.querySelectorAll("*")]
        .filter(e => e.tagName !== "MJX-TSTRUT" && e.tagName !== "MJX-TBSTRUT")
        .map(e => e.getBoundingClientRect()).filter(r => r.width > 0);
      return rects.length ? [Math.min(...rects.map(r => r.left)),
                             Math.max(...rects.map(r => r.right))] : null;
    };
    const ends = [], starts = [];
    for (const row of rows) {
      const cells = [...row.children].filter(c => c.tagName === "MJX-MTD");
      if (cells.length < 2) continue;
      const first = extent(cells[0]), second = extent(cells[1]);
      if (first) ends.push(first[1]);
      if (second) starts.push(second[0]);
    }
    // a glyph (its TeX box: MathJax pads each character to its height and depth) outside the
    // box that clips it: the nearest of the formula's container (MathJax's mjx-container
    // scrolls wide display math and hides what its height leaves out) and its ancestors
    // (div.math hides overflow) whose overflow is not visible; in px
    let clip = root;
    while (clip && getComputedStyle(clip).overflowX === "visible"
           && getComputedStyle(clip).overflowY === "visible") clip = clip.parentElement;
    let clipped = 0, clippedChar = null;
    if (clip) {
      const box = clip.getBoundingClientRect();
      const top = box.top + clip.clientTop, bottom = top + clip.clientHeight;
      for (const c of root.querySelectorAll("mjx-c")) {
        const r = c.getBoundingClientRect();
        if (!r.width || !r.height) continue;
        const out = Math.max(top - r.top, r.bottom - bottom);
        if (out > clipped) { clipped = out; clippedChar = c.className; }
      }
    }
    records.push({
      index: index++, tex: item.math, display: item.display,
      error: error ? (error.getAttribute("data-mjx-error") || error.textContent) : null,
      backslash: !!root.querySelector("mjx-c.mjx-c5C"),
      families: [...families], starts, ends, clipped, clippedChar,
    });
  }
  return {records, loaded: [...loaded]};
}
"""


# run in the page: every printed output (a cell's stream or text, myst-nb's `.cell_output pre`)
# whose lines are wider than its box, with the first line that does not fit
OUTPUT_PROBE = """
() => {
  const found = [];
  for (const pre of document.querySelectorAll(".cell_output pre")) {
    if (pre.scrollWidth <= pre.clientWidth + 1) continue;
    const lines = pre.textContent.split("\\n");
    const probe = document.createElement("span");  // the pre's own (monospace) font
    probe.style.position = "absolute";
    probe.textContent = "0".repeat(100);
    pre.appendChild(probe);
    const charWidth = probe.getBoundingClientRect().width / 100;
    probe.remove();
    const style = getComputedStyle(pre);
    const room = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const fits = Math.floor(room / charWidth);
    const wide = lines.filter(line => line.length > fits);
    found.push({width: pre.scrollWidth, box: pre.clientWidth, fits,
                lines: wide.length, first: (wide[0] || lines[0]).slice(0, 60)});
  }
  return found;
}
"""
# device pixel ratios the site is checked at: a standard screen and a high-density one (a
# glyph can be clipped at one and not the other: MathJax's boxes round to whole pixels)
SCALES = (1, 2)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _serve(folder: pathlib.Path):
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("no chromium found: apt-get install chromium (playwright drives it)")


def _remote(url: str) -> bool:
    parsed = urllib.parse.urlparse(url)
    return parsed.scheme in ("http", "https", "ws", "wss") and parsed.hostname not in LOCAL_HOSTS


def check_site(browser, site: pathlib.Path, shots: pathlib.Path) -> list[str]:
    """Part 1, at every scale of :data:`SCALES`; returns the failures."""
    failures: list[str] = []
    server = _serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    try:
        at: dict[str, list[int]] = {}  # failure -> the scales it happens at
        for scale in SCALES:
            kinds, found = _check_pages(browser, base, pages, shots, scale)
            missing = [kind for kind, count in kinds.items() if not count]
            found += [f"no {kind} formula found: nothing was checked" for kind in missing]
            for failure in found:
                at.setdefault(failure, []).append(scale)
            print(f"site at {scale}x: {len(pages)} pages; formulas checked: {kinds}")
        for failure, scales in at.items():
            failures.append(f"[{', '.join(f'{s}x' for s in scales)}] {failure}")
        # search works offline
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "search.html?q=delta", wait_until="load")
        page.wait_for_selector("#search-results li", timeout=20_000)
        page.close()
    finally:
        server.shutdown()
    return failures


def _check_pages(browser, base: str, pages: list[str], shots: pathlib.Path, scale: int):
    """Every page at ``scale`` device pixels per CSS pixel: ``(formulas checked by kind,
    failures)``. Screenshots get an ``@{scale}x`` suffix."""
    failures: list[str] = []
    kinds = {"bold": 0, "blackboard": 0, "aligned": 0}
    shot_taken: set[str] = set()
    page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=scale)
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    for name in pages:
        requested.clear()
        page.goto(base + name, wait_until="load")
        result = page.evaluate(MATH_PROBE)
        if name == "index.html":
            page.screenshot(path=shots / f"index@{scale}x.png", full_page=False)
        for url in requested:
            if _remote(url):
                failures.append(f"{name}: requested {url} from another host")
        for output in page.evaluate(OUTPUT_PROBE):
            failures.append(
                f"{name}: printed output {output['width']} px wide in a {output['box']} px box "
                f"({output['lines']} line(s) over the {output['fits']} characters that fit), "
                "first: "
                f"{output['first']!r}"
            )
        if not result:
            continue
        loaded = set(result["loaded"])
        for record in result["records"]:
            tex, where = record["tex"], f"{name}: ${record['tex'][:70]}$"
            if record["error"]:
                failures.append(f"{where}: TeX error {record['error']!r}")
            if record["backslash"] and "\\backslash" not in tex and "\\\\" not in tex:
                failures.append(f"{where}: shows a stray backslash")
            if record["clipped"] > 0.5:
                failures.append(
                    f"{where}: a glyph ({record['clippedChar']}) is clipped by "
                    f"{record['clipped']:.1f} px"
                )
            checks = []
            if "\\mathbf" in tex:
                checks.append(("bold", "MJXTEX-B"))
            if "\\mathbb" in tex:
                checks.append(("blackboard", "MJXTEX-A"))
            for kind, family in checks:
                kinds[kind] += 1
                if family not in record["families"] or family not in loaded:
                    failures.append(
                        f"{where}: not drawn in {family} (families {record['families']}, "
                        f"fonts loaded {sorted(loaded)})"
                    )
                elif kind not in shot_taken and record["display"]:
                    _shoot(page, record["index"], shots / f"math-{kind}@{scale}x.png")
                    shot_taken.add(kind)
            if "\\begin{align" in tex and len(record["starts"]) > 1:
                kinds["aligned"] += 1
                spread = max(
                    max(record[edge]) - min(record[edge])
                    for edge in ("starts", "ends")
                    if record[edge]
                )
                if spread > 0.5:
                    failures.append(f"{where}: columns off by {spread:.1f} px across rows")
                elif "aligned" not in shot_taken:
                    _shoot(page, record["index"], shots / f"math-aligned@{scale}x.png")
                    shot_taken.add("aligned")
    page.close()
    return kinds, failures


def _shoot(page, index: int, path: pathlib.Path) -> None:
    element = page.locator(f'[data-probe="{index}"]').first
    element.scroll_into_view_if_needed()
    element.screenshot(path=path)


@contextlib.contextmanager
def _jupyterlab(folder: pathlib.Path):
    """A JupyterLab server on ``folder``; yields its base URL with the token."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    command = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
        "--ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={folder}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")
    log = open(folder / "jupyterlab.log", "w")  # noqa: SIM115
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"JupyterLab did not start: {(folder / 'jupyterlab.log').read_text()}"
                    ) from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def check_lab(browser, shots: pathlib.Path, timeout_s: float) -> list[str]:
    """Part 2; returns the failures."""
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, _jupyterlab(pathlib.Path(tmp)) as (url, token):
        shutil.copy(NOTEBOOK_02, tmp)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/lab/tree/{NOTEBOOK_02.name}?token={token}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle'], "
                               ".jp-KernelStatus", timeout=60_000)  # fmt: skip
        time.sleep(2)  # the kernel connects
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()
        slider = page.locator(".widget-slider", has_text="A_log").first
        slider.wait_for(timeout=timeout_s * 1000)
        cell = page.locator(".jp-CodeCell", has=page.locator(".widget-slider")).first
        images = cell.locator(".jp-OutputArea img")
        images.first.wait_for(timeout=120_000)
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=shots / "lab-02-before.png")
        if images.count() != 1:
            failures.append(f"lab 02: the explorer's cell shows {images.count()} figures, not 1")
        for label in cell.locator(".widget-label").all():
            cut = label.evaluate("e => e.scrollWidth > e.clientWidth + 1")
            if cut:
                failures.append(f"lab 02: slider label {label.inner_text()!r} is cut")
        before = images.first.get_attribute("src")
        readout = slider.locator(".widget-readout")
        readout.click()
        page.keyboard.press("Control+A")
        page.keyboard.type("2.5")
        page.keyboard.press("Enter")
        deadline = time.monotonic() + 120
        after = before
        while time.monotonic() < deadline:
            current = cell.locator(".jp-OutputArea img")
            if current.count():
                after = current.first.get_attribute("src")
                if after and after != before:
                    break
            time.sleep(1)
        cell.screenshot(path=shots / "lab-02-after.png")
        if after == before:
            failures.append("lab 02: moving the A_log slider did not redraw the figure")
        else:
            print("lab 02: moving the A_log slider to 2.5 redrew the figure")
        page.close()
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=pathlib.Path, default=ROOT / "build" / "html")
    parser.add_argument("--screenshots", default=str(ROOT / "build" / "browser"))
    parser.add_argument("--skip-lab", action="store_true", help="check the site only")
    parser.add_argument(
        "--lab-timeout", type=float, default=600, help="seconds notebook 02 may take to run"
    )
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        parser.error(f"--site: no site in {str(args.site)!r}: run `make notebooks` first")
    problem = folder_problem(args.screenshots)
    if problem:
        parser.error(f"--screenshots: {problem}")
    if not args.lab_timeout > 0:
        parser.error(f"--lab-timeout must be > 0 seconds, got {args.lab_timeout}")
    args.screenshots = pathlib.Path(args.screenshots)
    from playwright.sync_api import sync_playwright

    args.screenshots.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        failures = check_site(browser, args.site, args.screenshots)
        if not args.skip_lab:
            failures += check_lab(browser, args.screenshots, args.lab_timeout)
        browser.close()
    for failure in failures:
        print("FAIL", failure)
    took = time.perf_counter() - start
    print(
        f"check-browser: {'ok' if not failures else f'{len(failures)} failures'} in {took:.0f} s;"
        f" screenshots in {args.screenshots}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
