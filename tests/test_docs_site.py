"""The docs site as a reader sees it (issue 39): built by mkdocs as CI
builds it, each page rendered in headless Chromium at a laptop's width and
a phone's, served from 127.0.0.1. No line of a code block may be cut off
(hidden past the block's right edge, behind a scroll bar): the site wraps
long lines (docs/stylesheets/extra.css), and this measures what the theme
shows, not the Markdown."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.docs_examples import ROOT
from tests.servers import chromium

# Runs in every page once it has loaded: each code block whose text is wider
# than the block shows (scrollWidth past clientWidth), and the first of its
# lines longer than the characters that fit.
MEASURE = r"""
function cut(doc) {
  const found = [];
  doc.querySelectorAll('pre > code').forEach((code) => {
    if (code.scrollWidth <= code.clientWidth + 1) return;
    const probe = doc.createElement('span');
    probe.textContent = 'x'.repeat(100);
    code.appendChild(probe);
    const fit = Math.floor(code.clientWidth / (probe.getBoundingClientRect().width / 100)) - 2;
    probe.remove();
    const lines = code.textContent.split('\n').filter((line) => line.length > fit);
    found.push({lines: lines.length, first: lines[0] || code.textContent.slice(0, 80), fit: fit});
  });
  return found;
}
window.addEventListener('load', () => {
  const report = {};
  document.querySelectorAll('iframe').forEach((frame) => {
    report[frame.dataset.page] = cut(frame.contentDocument);
  });
  const out = document.createElement('pre');
  out.id = 'report';
  out.textContent = JSON.stringify(report);
  document.body.appendChild(out);
});
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr[-3000:]
    return out


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def pages(site: Path) -> list[str]:
    """Every page of the site, as its path under the site's root."""
    return sorted(str(p.relative_to(site)) for p in site.rglob("index.html") if "search" not in p.parts)


def rendered(site: Path, width: int, tmp_path: Path) -> dict[str, list[dict]]:
    """What MEASURE finds in each page, laid out ``width`` CSS pixels wide."""
    frames = "\n".join(
        f'<iframe data-page="{page}" src="/{page}" width="{width}" height="900"></iframe>' for page in pages(site)
    )
    (site / "cut-harness.html").write_text(
        f"<!doctype html><html><body>{frames}<script>{MEASURE}</script></body></html>"
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
        flags += [f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width + 40},900"]
        url = f"http://127.0.0.1:{server.server_address[1]}/cut-harness.html"
        dom = subprocess.run([chromium(), *flags, "--dump-dom", url], capture_output=True, text=True, timeout=180)
    finally:
        server.shutdown()
        server.server_close()
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="report">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stdout[-2000:]
    return json.loads(
        found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    )


@pytest.mark.parametrize("width", [1280, 390], ids=["laptop", "phone"])
def test_no_code_line_is_cut_off_in_the_rendered_site(site, width, tmp_path):
    report = rendered(site, width, tmp_path)
    assert len(report) >= 20, sorted(report)  # every page was measured
    cut = {page: blocks for page, blocks in report.items() if blocks}
    lines = sum(block["lines"] for blocks in cut.values() for block in blocks)
    assert not cut, f"{lines} code lines cut off at {width}px: " + json.dumps(cut, indent=1)[:3000]


def test_the_home_page_links_the_readme_and_the_install_page_both_in_the_site(site):
    home = (site / "index.html").read_text()
    assert 'href="readme/"' in home and 'href="install/"' in home
    readme = (site / "readme" / "index.html").read_text()
    # The README, whole, its links into docs/ pointing at the site's pages (mkdocs --strict checked them).
    assert "The two commands" in readme and "scripts/test.sh" in readme and 'href="../workers/"' in readme
    install = (site / "install" / "index.html").read_text()
    assert "cpu_torch.sh" in install and "requirements/test.lock" in install
