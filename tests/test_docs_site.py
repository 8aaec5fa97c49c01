"""The docs as a reader meets them: on the built site at a 1280 px window (no code block or table cut
at the right, checked in headless Chromium), and on GitHub (every `#anchor` is one GitHub makes from
a heading); pages that speak of the product, not of the project's issue numbers; an index that
reaches every page and every measured table."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.docs_slugs import github_slug
from tests.conftest import ROOT
from tests.reports.test_report_html import CHROMIUM, chromium_installed  # noqa: F401 (the fixture, used by name)

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]*)\)")
_FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _heading_text(markdown: str) -> str:
    """A heading's text as GitHub renders it: links become their text, code and emphasis marks go."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    return re.sub(r"[`*]", "", text).strip()


def _anchors(page: Path) -> list[str]:
    """The anchors GitHub gives ``page``: one per heading, and explicit ``id="..."`` in HTML."""
    lines = _prose(page.read_text())
    slugs = [github_slug(_heading_text(m[1])) for line in lines if (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line))]
    return slugs + [m for line in lines for m in re.findall(r"<a [^>]*id=\"([^\"]+)\"", line)]


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Memory (`--max-memory-gib`, default 2)", "memory---max-memory-gib-default-2"),
    ("Serving: shared memory, the backend's transport, and a server that survives",
     "serving-shared-memory-the-backends-transport-and-a-server-that-survives"),
    ("The model zoo (tests/zoo)", "the-model-zoo-testszoo"),
    ("gRPC load vs perf_analyzer", "grpc-load-vs-perf_analyzer"),
    ("Measured on an NVIDIA H200 (2026-12-01)", "measured-on-an-nvidia-h200-2026-12-01"),
    ("FP32 × INT8 → served", "fp32--int8--served"),
    ("[Dynamic axes](x.md): profiles", "dynamic-axes-profiles"),
])  # fmt: skip
def test_github_slug_rule(heading: str, anchor: str) -> None:
    """GitHub's rule (github-slugger), as GitHub shows these headings' anchors; the site uses the same."""
    assert github_slug(_heading_text(heading)) == anchor


def test_every_anchor_is_one_github_makes() -> None:
    """A link ``page.md#anchor`` in docs/ or README.md names a heading by GitHub's rule, so it works there;
    the site makes its anchors by the same rule (scripts/docs_slugs.py) and `mkdocs build --strict` checks
    them on the site (tests/test_docs.py). A heading that occurs twice on a page gets different suffixes on
    the two (GitHub -1, the site _1), so no link may point at one."""
    wrong = []
    for page in PAGES:
        for link in _LINK.findall("\n".join(_prose(page.read_text()))):
            target, _, anchor = link.partition("#")
            if not anchor or "://" in target:
                continue
            document = (page.parent / target).resolve() if target else page
            if document.suffix != ".md" or not document.is_file():
                wrong.append((str(page.relative_to(ROOT)), link, "not a page"))
                continue
            anchors = _anchors(document)
            if anchors.count(anchor) != 1:
                wrong.append((str(page.relative_to(ROOT)), link, f"{anchors.count(anchor)} headings with that anchor"))
    assert not wrong, wrong


def test_a_wrong_anchor_is_caught() -> None:
    """The check above sees a link made by Markdown's rule instead of GitHub's."""
    assert "memory-max-memory-gib-default-2" not in _anchors(ROOT / "docs" / "guide" / "build.md")
    assert "memory---max-memory-gib-default-2" in _anchors(ROOT / "docs" / "guide" / "build.md")


_HISTORY = re.compile(r"issue \d+|\(issue|issue #\d+|the review's|this session|what issue", re.I)


def test_no_page_names_an_issue_or_narrates_the_work() -> None:
    """`grep -riE "issue [0-9]+" docs README.md` finds nothing, nor phrases that tell how the work went."""
    found = [(str(page.relative_to(ROOT)), n, line.strip()) for page in PAGES
             for n, line in enumerate(page.read_text().splitlines(), 1) if _HISTORY.search(line)]
    assert not found, found
    grep = subprocess.run(["grep", "-riE", "issue [0-9]+", "docs", "README.md"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert grep.returncode == 1 and grep.stdout == "", grep.stdout


def _nav_pages() -> list[str]:
    import yaml

    def pages(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [p for value in node.values() for p in pages(value)]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        return []

    config = (ROOT / "mkdocs.yml").read_text()
    nav = yaml.safe_load(config[config.index("\nnav:"):])["nav"]
    return pages(nav)


def test_the_home_page_links_every_top_level_page() -> None:
    linked = {link.split("#")[0] for link in _LINK.findall((ROOT / "docs" / "index.md").read_text())}
    top = [page for page in _nav_pages() if "/" not in page and page != "index.md"]
    assert len(top) >= 10
    assert not [page for page in top if page not in linked], linked


_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def test_results_indexes_every_page_with_a_measured_table() -> None:
    """A page with a table and a measurement date is linked from results.md's index (its first table)."""
    results = (ROOT / "docs" / "results.md").read_text()
    index = results.split("\n## ", 1)[0]
    linked = {link.split("#")[0] for link in _LINK.findall(index)}
    measured = [str(page.relative_to(ROOT / "docs")) for page in sorted((ROOT / "docs").rglob("*.md"))
                if page.name != "results.md" and _DATE.search(page.read_text()) and re.search(r"^\|.*\|$", page.read_text(), re.M)]
    assert {"serving.md", "keras-hub.md", "mutation.md", "gpu.md"} <= set(measured)
    assert not [page for page in measured if page not in linked], (measured, linked)


# What the page test runs in each page: every `pre`, code block and table, and whether it is cut.
_PROBE = """
<script>
window.addEventListener('load', () => {
  const scrolls = (e) => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  const scrollbar = (e) => { const s = getComputedStyle(e);
    return e.offsetHeight - e.clientHeight - parseFloat(s.borderTopWidth) - parseFloat(s.borderBottomWidth); };
  const width = document.documentElement.clientWidth;
  const items = [];
  for (const el of document.querySelectorAll('.rst-content pre, .rst-content pre > code, .rst-content table')) {
    const right = el.getBoundingClientRect().right;
    let verdict = 'fits';
    if (el.scrollWidth > el.clientWidth + 1) verdict = !scrolls(el) ? 'spills' : scrollbar(el) > 0 ? 'scrolls' : 'scrolls, no scrollbar';
    let box = el;
    for (let up = el.parentElement; up && up !== document.body && verdict !== 'spills'; up = up.parentElement) {
      const edge = up.getBoundingClientRect().right;
      if (scrolls(up)) { if (right > edge + 1) verdict = scrollbar(up) > 0 ? 'scrolls in its wrapper' : 'cut (wrapper, no scrollbar)'; box = up; break; }
      if (getComputedStyle(up).overflowX !== 'visible' && right > edge + 1) { verdict = 'cut by ' + up.className; break; }
    }
    if (box.getBoundingClientRect().right > width + 1) verdict = 'beyond the window';
    items.push({tag: el.tagName, verdict, scrollWidth: el.scrollWidth, clientWidth: el.clientWidth, text: el.textContent.trim().slice(0, 50)});
  }
  const content = document.querySelector('.wy-nav-content').getBoundingClientRect();
  const out = document.createElement('output');
  out.id = 'fit-report';
  out.textContent = JSON.stringify({width, content_right: content.right, items});
  document.body.appendChild(out);
});
</script>
"""


def _page_report(page: Path, work: Path) -> dict:
    probed = page.with_name("probed.html")
    probed.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    assert CHROMIUM is not None
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--window-size=1280,900",
         "--disable-background-networking", "--disable-component-update", f"--user-data-dir={work / 'profile'}",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=3000", "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<output id="fit-report">(.*?)</output>', proc.stdout, re.S)
    assert found, proc.stdout[-2000:]
    return json.loads(html.unescape(found[1]))


@pytest.mark.slow
@pytest.mark.usefixtures("chromium_installed")
def test_code_and_tables_are_not_cut_at_1280_px(tmp_path: Path) -> None:
    """The built site (mkdocs build --strict) at a 1280 px window: on the home page, the build guide and
    the results page every `pre`, code block and table fits its box (scrollWidth <= clientWidth) or
    scrolls inside a box that fits the window and draws its scrollbar; and the text column reaches the
    window's right side (the theme alone stopped it at 800 px, leaving a third of the window empty)."""
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                            "--site-dir", str(site)], capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    for page in ["index.html", "guide/build/index.html", "results/index.html"]:
        report = _page_report(site / page, tmp_path)
        assert len(report["items"]) >= 2, (page, report)
        cut = [item for item in report["items"] if item["verdict"] not in ("fits", "scrolls", "scrolls in its wrapper")]
        assert not cut, (page, cut)
        assert report["content_right"] >= report["width"] - 2, (page, report["content_right"], report["width"])
        fitting = [item for item in report["items"] if item["verdict"] == "fits"]
        assert len(fitting) >= 0.8 * len(report["items"]), (page, report["items"])
