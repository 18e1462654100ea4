"""Blocks of the documentation that code generates: the text between two marker lines
(docs/internals.md, "Generated blocks")."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def block(text: str, begin: str, end: str) -> str | None:
    """The block of ``text`` from ``begin`` to ``end``, markers included (None without them)."""
    start, stop = text.find(begin), text.find(end)
    return text[start : stop + len(end)] if 0 <= start < stop else None


def rewrite(path: Path, begin: str, end: str, content: str) -> None:
    """Replace the block of ``path`` with ``begin``, ``content`` and ``end`` on lines of their own."""
    text = path.read_text()
    old = block(text, begin, end)
    if old is None:
        raise SystemExit(f"{path} has no generated block ({begin!r} ... {end!r})")
    path.write_text(text.replace(old, f"{begin}\n{content.strip()}\n{end}"))


@dataclass(frozen=True)
class GeneratedBlock:
    """One generator's block: the page it lives in, its markers and the function making it."""

    page: Path
    begin: str
    end: str
    make: Callable[[], str]

    def current(self, text: str) -> str | None:
        """The block of ``text``, markers included (None when it has none)."""
        return block(text, self.begin, self.end)

    def expected(self) -> str:
        """The block as the generator makes it now, markers included."""
        return f"{self.begin}\n{self.make().strip()}\n{self.end}"

    def main(self, argv: list[str] | None = None) -> None:
        """Rewrite the block in the given page (default: :attr:`page`)."""
        args = argv if argv is not None else sys.argv[1:]
        rewrite(Path(args[0]) if args else self.page, self.begin, self.end, self.make())
