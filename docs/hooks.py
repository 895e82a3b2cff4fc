"""MkDocs hooks: publish ``benchmarks/latest/`` on the Performance page, and show the
docstrings' Sphinx roles as plain code.

The benchmark results live outside ``docs/`` (``tools/bench.py`` writes them), and which
ops have results changes with every benchmark run. So the page is filled at build time from
whatever ``benchmarks/latest/`` holds: each op's table (its ``.md``), plot (``.png``) and raw
JSON. A checkout without results builds too (the page says so), and nothing here can leave a
link dangling, which matters because the site is built with ``--strict``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

PAGE = "performance.md"
MARKER = "<!-- latest-results -->"
PREFIX = "benchmarks/latest"
# The docstrings cross-reference with Sphinx roles (:class:`~a.B`), which Markdown renders as
# ":class:" followed by code; keep the code, and with "~" only the last dotted name.
ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([^<]*)</code>")


def _latest(config: Any) -> Path:
    return Path(config.config_file_path).parent / PREFIX


def on_files(files: Files, config: Any) -> Files:
    """Copy the plots and JSON of ``benchmarks/latest/`` into the site."""
    latest = _latest(config)
    if latest.is_dir():
        for p in sorted(latest.iterdir()):
            if p.suffix in (".png", ".json") and p.is_file():
                files.append(File.generated(config, f"{PREFIX}/{p.name}", abs_src_path=str(p)))
    return files


def _section(latest: Path, stem: str) -> list[str]:
    table = (latest / f"{stem}.md").read_text().splitlines()
    title = table[0].lstrip("#").strip() if table and table[0].startswith("#") else ""
    out = [f"## {stem}", ""]
    if title:
        out += [f"*{title}*", ""]
    if (latest / f"{stem}.png").is_file():
        out += [f"![{stem}]({PREFIX}/{stem}.png)", ""]
    if (latest / f"{stem}.json").is_file():
        out += [f"Raw results: [{stem}.json]({PREFIX}/{stem}.json).", ""]
    body = table[1:] if title else table
    # The tables' own headings sit below this section's.
    return out + [("##" + line if line.startswith("#") else line) for line in body] + [""]


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Replace the marker on the Performance page with one section per op."""
    if page.file.src_uri != PAGE or MARKER not in markdown:
        return markdown
    latest = _latest(config)
    stems = sorted(p.stem for p in latest.glob("*.md")) if latest.is_dir() else []
    if not stems:
        text = f"This checkout has no results in `{PREFIX}/`; `tools/bench.py` writes them."
    else:
        text = "\n".join(line for stem in stems for line in _section(latest, stem))
    return markdown.replace(MARKER, text)


def _role(m: re.Match[str]) -> str:
    name = m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)
    return f"<code>{name}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """Drop the Sphinx role prefixes from rendered docstrings."""
    return ROLE.sub(_role, html)
