"""The documentation site: `mkdocs build --strict` (every page in the nav, every link and anchor
resolving) and the README's first screen (its links into docs/, its test command = what CI runs)."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=300)


def test_site_builds_strict_without_a_warning(tmp_path: Path) -> None:
    built = _mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    assert "WARNING" not in built.stderr, built.stderr[-3000:]
    assert (tmp_path / "site" / "guide" / "build" / "index.html").is_file()
    # README.md is outside the site: its anchors into docs/ are checked against the built pages.
    readme = (ROOT / "README.md").read_text()
    for link in _LINK.findall(readme):
        if link.startswith("docs/") and "#" in link:
            page, anchor = link.removeprefix("docs/").split("#")
            html = tmp_path / "site" / (page.removesuffix(".md").removesuffix("index") + "/index.html").lstrip("/")
            assert f'id="{anchor}"' in html.read_text(), link


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """The site's settings catch what they promise: a missing page and a missing anchor each fail it."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "docs_slugs.py", tmp_path / "scripts" / "docs_slugs.py")  # the anchors' hook
    with (tmp_path / "docs" / "design.md").open("a") as page:
        page.write("\n[a page](no-such-page.md) and [an anchor](gpu.md#no-such-anchor)\n")
    built = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stderr and "no-such-anchor" in built.stderr, built.stderr[-3000:]


def test_readme_links_into_docs_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    links = [link for link in _LINK.findall(readme) if "://" not in link]
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if not (ROOT / link.split("#")[0]).exists()]
    assert not missing, missing


def _readme_test_command() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Tests \(what `\.ci/run` runs[^\n]*\n\n```bash\n([^\n]+)\n```", readme)
    assert block, "README's first screen lost its test command (.ci/run and CI run it)"
    return shlex.split(block.group(1))


def test_readme_test_command_is_what_ci_runs() -> None:
    """.ci/run runs the README's test command; it may only add report flags after it (--durations)."""
    readme = _readme_test_command()
    ci_lines = [line.strip().rstrip("\\").strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [shlex.split(line) for line in ci_lines if "-m pytest" in line and not line.startswith("#")]
    assert len(commands) == 1, commands
    ran = commands[0]
    assert ran[:len(readme)] == readme, (ran, readme)
    assert all(extra.startswith("--durations") for extra in ran[len(readme):]), ran
    assert (ROOT / "docs" / "setup.md").read_text().count(" ".join(readme)) == 1


# Paths the docs name that are not files of this repository, with the reason.
NOT_OURS = {
    ".ci/stubs": "made by scripts/setup.sh, git-ignored",
    "calibration/tokens/eval.npz": "an example inside an error message",
    "docs/operators.md": "onnx-tensorrt's operator list, not ours",
    "docs/introduction/compatibility.md": "the Triton server repository's compatibility page, not ours",
}
_REPO_PATH = re.compile(r"(?<![\w/.-])((?:pipeline|scripts|tests|\.ci|calibration|docs)/[\w.*/-]*)")
_MODULE = re.compile(r"(?<![\w/.-])pipeline(?:\.\w+)+")


def _doc_texts() -> dict[str, str]:
    return {str(page.relative_to(ROOT)): page.read_text() for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = sorted({(page, path) for page, text in _doc_texts().items() for match in _REPO_PATH.finditer(text)
                      if (path := match[1].rstrip(".,:;/")) not in NOT_OURS and not list(ROOT.glob(path))})
    assert not missing, missing


def test_every_module_and_name_the_docs_give_exists() -> None:
    """`pipeline.stages.tf2onnx_run`, `pipeline.core.errors.PipelineError`: the module file, and the name defined in it."""
    wrong = []
    for page, text in _doc_texts().items():
        # pipeline.toml: the config file's name; *__mutmut_N: mutmut's names of mutants (docs/mutation.md)
        for dotted in sorted(d for d in set(_MODULE.findall(text)) - {"pipeline.toml"} if "__mutmut_" not in d):
            parts = dotted.split(".")
            for k in range(len(parts), 0, -1):
                base = ROOT.joinpath(*parts[:k])
                source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
                if source.is_file():
                    rest = parts[k:]
                    if rest and not re.search(rf"^(class|def) {rest[0]}\b|^{rest[0]}\s*[:=]", source.read_text(), re.M):
                        wrong.append((page, dotted))
                    break
    assert not wrong, wrong


def _table(text: str, header: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(header)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_readme_first_screen_matches_the_site() -> None:
    """The README's first screen is repeated on the site (README.md is outside it): the same words,
    diagram and command table, so the two cannot drift apart."""
    readme = (ROOT / "README.md").read_text()
    intro = readme.split("## Start here", 1)[0].replace("](docs/", "](")
    assert intro in (ROOT / "docs" / "index.md").read_text()
    header = "| command | what it does | writes (default `--workdir build`) |"
    assert _table(readme, header) == _table((ROOT / "docs" / "guide" / "index.md").read_text(), header)
    from pipeline.cli import make_parser

    commands = next(action for action in make_parser()._actions if isinstance(action, argparse._SubParsersAction)).choices
    rows = [row.split("`")[1].split()[0] for row in _table(readme, header)[2:]]
    assert sorted(rows) == sorted(commands), "the command table has one row per command"
