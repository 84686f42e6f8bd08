"""MkDocs hooks: the pages link the repository's own files (kept results under
`results/`, source files, the package READMEs' folders) with relative paths that work on
a clone; the site gets a copy of each linked file under `repo/` and the links are
rewritten to it. A link to a file that does not exist stays as written, so the strict
build reports it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

LINK = re.compile(r"(\]\(|src=\")([^)\"\s#]+)(#[^)\"\s]*)?")
PREFIX = "repo"


def _outside_targets(md_path: Path, docs_dir: Path, root: Path) -> dict[str, Path]:
    """Relative link targets of one page that leave docs/ and name a file of the repository."""
    out: dict[str, Path] = {}
    for match in LINK.finditer(md_path.read_text(encoding="utf-8")):
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            continue
        resolved = (md_path.parent / target).resolve()
        if resolved.is_file() and root in resolved.parents and docs_dir not in resolved.parents:
            out[target] = resolved
    return out


def on_files(files: Files, config) -> Files:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    added: set[Path] = set()
    for md in sorted(docs_dir.rglob("*.md")):
        for resolved in _outside_targets(md, docs_dir, root).values():
            if resolved in added:
                continue
            added.add(resolved)
            rel = resolved.relative_to(root).as_posix()
            files.append(File.generated(config, f"{PREFIX}/{rel}", abs_src_path=str(resolved)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    page_path = docs_dir / page.file.src_uri
    page_dir = Path(page.file.src_uri).parent

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        resolved = (page_path.parent / target).resolve()
        if not (resolved.is_file() and root in resolved.parents and docs_dir not in resolved.parents):
            return match.group(0)
        copy = Path(PREFIX) / resolved.relative_to(root)
        new = os.path.relpath(copy, page_dir).replace(os.sep, "/")
        return f"{match.group(1)}{new}{match.group(3) or ''}"

    return LINK.sub(rewrite, markdown)
