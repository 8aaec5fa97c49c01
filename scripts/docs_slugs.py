"""The docs site's heading anchors, made as GitHub makes them (mkdocs.yml names this file as a hook),
so that a link ``page.md#anchor`` lands on the same heading on the built site and on GitHub.

GitHub's rule (github-slugger): the heading's text, lowercased; ASCII punctuation other than ``-``
and ``_`` and non-ASCII symbols dropped; every space becomes ``-`` (runs are kept, so
"Memory (--max-memory-gib, default 2)" is ``memory---max-memory-gib-default-2``). Markdown's own
rule would collapse the run to "memory-max-memory-gib-default-2", which GitHub does not have.
tests/test_docs_site.py checks every anchor in docs/ and README.md against this rule.
"""

from __future__ import annotations

import unicodedata
from typing import Any


def github_slug(text: str, separator: str = "-") -> str:
    """The anchor GitHub gives a heading whose text is ``text`` (``separator``: Markdown's toc passes it; unused)."""
    kept = []
    for char in text.strip().lower():
        if char == " ":
            kept.append("-")
        elif char in "-_" or (char.isascii() and char.isalnum()):
            kept.append(char)
        elif not char.isascii() and unicodedata.category(char)[0] in "LNM":  # letters, digits, marks; not symbols
            kept.append(char)
    return "".join(kept)


def on_config(config: Any, **kwargs: Any) -> Any:
    """mkdocs hook: the toc extension slugs headings with :func:`github_slug`."""
    config["mdx_configs"].setdefault("toc", {})["slugify"] = github_slug
    return config
