"""Sphinx configuration of the airflow-quota manual: Markdown pages (myst-parser) and a reference
generated from the code's docstrings (autodoc, napoleon) and the CLI's argparse parser."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Importing the Airflow layer imports Airflow, which writes an airflow.cfg into its home: keep it
# out of the user's ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-quota-docs-"))

project = "airflow-quota"
author = "the airflow-quota authors"
copyright = "the airflow-quota authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": True}

html_theme = "alabaster"
html_title = "airflow-quota"

# Import the Airflow layer once here, as Airflow expects to be imported, before autodoc imports
# its modules in its own way (Airflow's logging set-up builds pydantic models on first import).
import airflow_quota.executors.quota_executor  # noqa: E402
import airflow_quota.operators  # noqa: E402
import airflow_quota.sensors  # noqa: E402
import airflow_quota.triggers  # noqa: E402, F401


def _outside_links(app: Any, docname: str, source: list[str]) -> None:
    """A page's Markdown link to a Markdown file outside docs/ (BENCHMARKS.md, the shared specs)
    stays a relative path, so it works where the repository is browsed; in the site it becomes a
    download of that file (MyST's ``path:``), since Sphinx would look for a page of that name."""
    srcdir = Path(app.srcdir).resolve()
    here = (srcdir / docname).parent

    def link(match: re.Match[str]) -> str:
        target = (here / match[1]).resolve()
        if target.is_relative_to(srcdir):
            return match[0]
        return f"](path:{match[1]})"

    source[0] = re.sub(r"\]\((\.\./[^)#\s]+\.md)(#[^)]*)?\)", link, source[0])


def setup(app: Any) -> None:
    app.connect("source-read", _outside_links)
