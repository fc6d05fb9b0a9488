"""mkdocs hook (mkdocs.yml, ``hooks:``): the repository's README as a page
of the site, ``readme.md``, so that the home page links it and a reader of
the site sees the install, the two commands and the walk without leaving it.

The README's links go into ``docs/`` (``docs/workers.md``), as GitHub shows
them from the repository's root; in the site those pages sit at its root
(``workers.md``), so the prefix is dropped. mkdocs --strict then checks every
link and anchor of it like any page's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files


def readme_page(text: str) -> str:
    """The README's Markdown with its ``docs/`` links pointing into the site."""
    return re.sub(r"\]\(docs/", "](", text)


def on_files(files: Files, config: Any) -> Files:
    readme = Path(config.config_file_path).parent / "README.md"
    files.append(File.generated(config, "readme.md", content=readme_page(readme.read_text())))
    return files
