"""The repository stands alone: a clone with nothing beside it passes ``make test`` and its pages
link nothing outside it.

- no tracked text file names the folder that once sat beside the repository (the original spec,
  scenarios, trace and tools, now the project's own: docs/model.md, tests/scenarios,
  data/traces, benchmarks/congested.py);
- every relative link of README.md, CHANGELOG.md, BENCHMARKS.md and the manual's pages (docs/)
  leads to a file inside the repository, and every absolute link to an http(s) site.

The checks are functions of a root folder, so the tests below also show they catch a planted
reference and a planted bad link.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import ROOT, missing

OUTSIDE = "/".join(["..", "shared"])
"""The path the repository must not name, built so that this file does not contain it."""
NEEDLES = (OUTSIDE, '.parent / "' + 'shared"')
"""How a file would name it: as a path, or as Python code builds it beside the repository's root."""

FENCED = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HTML = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def tracked_files(root: Path) -> list[Path]:
    """The files git tracks under ``root`` that are on disk."""
    if not (root / ".git").exists():
        missing(f"{root} is not a git checkout: cannot list its tracked files")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    return [root / name for name in listed.split("\0") if name and (root / name).is_file()]


def files_naming(root: Path, files: list[Path], needles: tuple[str, ...] = NEEDLES) -> list[str]:
    """The text files among ``files`` (binary ones, holding a NUL byte, are left out) that
    contain one of ``needles``, relative to ``root``, each with the first line that does."""
    found = []
    wanted = [needle.encode() for needle in needles]
    for path in files:
        data = path.read_bytes()
        if b"\0" in data:
            continue
        hits = [data.index(needle) for needle in wanted if needle in data]
        if hits:
            line = data[: min(hits)].count(b"\n") + 1
            found.append(f"{path.relative_to(root).as_posix()}:{line}")
    return found


def pages(root: Path) -> list[Path]:
    """README.md, CHANGELOG.md and BENCHMARKS.md when present, and every page of docs/ (not
    the built site)."""
    top = [root / name for name in ("README.md", "CHANGELOG.md", "BENCHMARKS.md") if (root / name).is_file()]
    docs = sorted(p for p in (root / "docs").rglob("*.md") if "_build" not in p.relative_to(root).parts)
    return top + docs


def link_targets(text: str) -> list[str]:
    """The targets of a Markdown page's links and images (inline, reference definitions, HTML
    ``href`` / ``src``), leaving out what code blocks and code spans show."""
    prose = CODE_SPAN.sub("", FENCED.sub("", text))
    return [m.group(1) for pattern in (INLINE_LINK, REFERENCE, HTML) for m in pattern.finditer(prose)]


def bad_links(root: Path, page: Path) -> list[str]:
    """The links of ``page`` that lead outside ``root``, to no file, or to a site by another
    scheme than http(s), each as ``page: target (why)``."""
    problems = []
    root = root.resolve()
    name = page.resolve().relative_to(root).as_posix()
    for target in link_targets(page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://")):
            continue
        if target.startswith("#"):
            continue  # a section of the same page
        path = target.split("#", 1)[0].split("?", 1)[0]
        if SCHEME.match(target) or target.startswith("//"):
            problems.append(f"{name}: {target} (only http(s) sites may be linked absolutely)")
        elif path.startswith("/"):
            problems.append(f"{name}: {target} (an absolute path: link relative to the page)")
        else:
            resolved = (page.parent / path).resolve()
            if not resolved.is_relative_to(root):
                problems.append(f"{name}: {target} (outside the repository)")
            elif not resolved.exists():
                problems.append(f"{name}: {target} (no such file)")
    return problems


def test_no_tracked_file_names_the_folder_beside_the_repository() -> None:
    found = files_naming(ROOT, tracked_files(ROOT))
    assert not found, f"{len(found)} tracked file(s) name {OUTSIDE!r}: {found}"


def test_every_link_of_the_pages_stays_inside_the_repository() -> None:
    checked = pages(ROOT)
    assert ROOT / "README.md" in checked and ROOT / "docs" / "index.md" in checked
    problems = [problem for page in checked for problem in bad_links(ROOT, page)]
    assert not problems, f"{len(problems)} bad link(s):\n" + "\n".join(problems)


def test_the_checks_catch_a_planted_reference_and_planted_bad_links(tmp_path: Path) -> None:
    (tmp_path / "docs" / "img").mkdir(parents=True)
    (tmp_path / "docs" / "img" / "plot.png").write_bytes(b"\x89PNG\0")
    (tmp_path / "data.csv").write_text("a,b\n")
    (tmp_path / "tool.py").write_text(f"import pathlib\nSPEC = pathlib.Path(__file__).{NEEDLES[1]} / 'spec'\n")
    (tmp_path / "README.md").write_text(
        "[manual](docs/index.md) [data](data.csv) [site](https://example.org) [here](#usage)\n"
        f"[spec]({OUTSIDE}/spec/quota-model.md)\n"
        "`[shown, not linked](nowhere.md)`\n"
        "```\n[in a code block](nowhere.md)\n```\n"
    )
    (tmp_path / "docs" / "index.md").write_text(
        "![plot](img/plot.png) [readme](../README.md#usage)\n"
        "[gone](missing.md) [ftp](ftp://example.org/x) [root](/etc/passwd)\n"
        '[ref]: ../../outside.md\n<a href="img/none.png">x</a>\n'
    )
    readme = bad_links(tmp_path, tmp_path / "README.md")
    assert readme == [f"README.md: {OUTSIDE}/spec/quota-model.md (outside the repository)"]
    index = bad_links(tmp_path, tmp_path / "docs" / "index.md")
    assert [problem.split(" (")[0] for problem in index] == [
        "docs/index.md: missing.md",
        "docs/index.md: ftp://example.org/x",
        "docs/index.md: /etc/passwd",
        "docs/index.md: ../../outside.md",
        "docs/index.md: img/none.png",
    ]
    files = [tmp_path / name for name in ("README.md", "docs/index.md", "docs/img/plot.png", "data.csv", "tool.py")]
    assert files_naming(tmp_path, files) == ["README.md:2", "tool.py:2"]
