"""Text a user chose (a prompt, a URL, a setting's value) inside the markdown of a Prefect UI artifact, shown as
text and never read as markup: the one home of the escaping every report uses.

The UI renders artifact markdown, raw HTML included, so a prompt holding ``<img onerror=...>``, ``[a](http://x)``
or a ``|`` would otherwise inject a tag, a link or a table column. :func:`md_code` makes an inline code span (HTML
and markdown inside it are literal) safe in a table cell; :func:`md_text` escapes plain text.
"""

from __future__ import annotations

import re

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~])")


def md_text(text: object, one_line: bool = True) -> str:
    """``text`` as literal markdown text: markup characters (and so HTML's ``<``) backslash-escaped; on one line
    (newlines as ``\\n``) unless ``one_line`` is false (a caller that quotes each line itself)."""
    s = str(text)
    if one_line:
        s = s.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    return _MD_SPECIAL.sub(r"\\\1", s)


def md_code(text: object) -> str:
    """``text`` as an inline code span that is safe in a table cell: a fence longer than any run of backticks
    inside it, ``|`` escaped (GitHub's tables split cells on it even in code), newlines and tabs shown as
    ``\\n``/``\\t``."""
    s = str(text).replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t").replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"
