"""Documents and docstrings describe the product as it is, in the present tense: no history
of its development ("this round", "round 3", "used to pass", "the machine was slower that
day", "measured here", dates of runs). The check reads the prose only: Markdown outside code
blocks and code spans, and Python comments and docstrings, so code (a Spark ``session``, an
ISO timestamp in an example) is never judged."""

from __future__ import annotations

import io
import os
import re
import tokenize
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

#: The usual phrasings of narration, each with an example it catches (the test below plants
#: every example, so a pattern that stops matching fails).
PHRASINGS: dict[str, str] = {
    r"\b(?:this|that|earlier|previous|last|next|second) round\b": "Until this round NAB measured 61.",
    r"\b(?:round|session) (?:\d+|one|two|three)\b": "Figures of round 4 below.",
    r"\b(?:development|working|earlier|previous) sessions?\b": "In an earlier session the job was slower.",
    r"\buntil (?:now|recently|today)\b": "Until now the gateway dropped them.",
    r"\b(?:as of|before|since) today\b": "Fixed as of today.",
    r"(?<!is )(?<!are )(?<!be )(?<!been )(?<!was )(?<!were )\bused to (?:be|pass|crash|take|cost|fail|raise|score|"
    r"make|run|give|wedge|alert|miss|reject|accept|count|report|recreate|drop|stall|need)\b": (
        "A type such as a:b used to pass the contract."
    ),
    r"\bthe machine was\b|\b(?:slower|faster|busier|loaded|quieter) that day\b": "The machine was slower that day.",
    r"\bwas (?:slower|faster|busier|quieter) (?:than|on|in|then)\b": "It was slower than on Monday.",
    r"\bwe (?:tried|measured|found|changed|added|removed|replaced|fixed|decided|saw)\b": "We tried three settings.",
    r"\bmeasured (?:here|today|then)\b": "Measured here: 2.2 times faster.",
    r"\b(?:on|of) the shared (?:\d-core )?machine\b": "18 us a reading on the shared 2-core machine.",
    r"\bother (?:developers|agents)\b|\bother work taking\b": "Other developers' load took the cores.",
    r"\b(?:on|since|until|as of|runs? of) 20[2-9]\d-\d\d-\d\d\b": "Three more runs on 2026-11-24.",
    r"\bformerly\b|\bformer (?:default|`)|\(former\b": "hst_ranked (former default) scores 58.",
    r"\b(?:before|after) the (?:fix|change|rewrite)\b": "Before the fix it raised 5 false alarms.",
    r"\b(?:as|than) before[.,;)]": "Recall is the same as before.",
    r"\bissue \d+\b|\bthe issue's\b": "Nothing is lost (issue 12).",
    r"\b(?:fell|rose|dropped|went|took [\w ]{0,30}?) from [\d.,]+ (?:to|->) [\d.,]+": (
        "The meters' false alarms fell from 1.60 to 0.75."
    ),
    r"\b(?:this|it|which|that) now (?:holds|works|passes|keeps|carries|stays)\b": "This now holds for event_data.",
}
NARRATION = re.compile("|".join(f"(?:{p})" for p in PHRASINGS), re.I)

#: Legitimate uses of the same words, which must not be flagged.
NOT_NARRATION = (
    "The job gets its Spark session from iotwatch.jvm.spark.",
    "The gateway resumes its persistent session after a restart.",
    "The seed is used to generate the same messages.",
    "Event time is after 2000-01-01.",
    "Round the value to 2 decimals.",
    "The mean reading interval over that day sets the half-lives.",
    "A coolant drift from 90 C to the sensor's 130 C raises the rule.",
    "A device no longer in the fleet loses its account.",
)

_FENCE = re.compile(r"^ *```.*?^ *```", re.M | re.S)
_CODE_SPAN = re.compile(r"``.*?``|`[^`\n]*`", re.S)
_SKIP_DIRS = {"node_modules", "site", "build", "dist", "__pycache__"}  # and hidden folders (.git, .venv)
#: NAB's own files, kept as published; this file, whose examples are narration on purpose.
_EXEMPT = ("evaluation/nab_sample", "tests/unit/repo/test_no_narration.py")


def markdown_prose(text: str) -> str:
    """``text`` with code blocks and code spans blanked (line numbers kept)."""
    text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def python_prose(text: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python source, each with its first line number."""
    found = []
    previous: tokenize.TokenInfo | None = None  # the last token that is not a line break or comment
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
            continue
        if token.type == tokenize.STRING and token.string.lstrip("rbuRBU")[:3] in ('"""', "'''"):
            if previous is None or previous.type in (tokenize.INDENT, tokenize.DEDENT) or previous.string == ":":
                found.append((token.start[0], markdown_prose(token.string)))
        if token.type not in (tokenize.NL, tokenize.NEWLINE):
            previous = token
    return found


def narration(path: Path, text: str) -> list[str]:
    """Each line of prose in ``text`` that narrates, as ``path:line: text``."""
    if path.suffix == ".md":
        pieces = [(1, markdown_prose(text))]
    else:
        pieces = python_prose(text)
    hits = []
    for first, piece in pieces:
        for offset, line in enumerate(piece.splitlines()):
            if NARRATION.search(line):
                hits.append(f"{path}:{first + offset}: {line.strip()}")
    return hits


def _files() -> list[Path]:
    files = []
    for folder, dirs, names in os.walk(REPO_ROOT):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")]
        for name in names:
            path = Path(folder) / name
            if path.suffix in (".md", ".py") and not str(path.relative_to(REPO_ROOT)).startswith(_EXEMPT):
                files.append(path)
    return files


def test_no_document_or_docstring_narrates_development() -> None:
    files = _files()
    assert len([f for f in files if f.suffix == ".md"]) > 10 and len(files) > 200
    hits = [hit for path in files for hit in narration(path.relative_to(REPO_ROOT), path.read_text())]
    assert not hits, "narration of development (describe the product now):\n" + "\n".join(hits)


@pytest.mark.parametrize("example", list(PHRASINGS.values()))
def test_a_planted_example_is_caught_in_markdown_and_in_a_docstring(example: str) -> None:
    assert narration(Path("planted.md"), f"# Page\n\nSome text.\n{example}\n")
    assert narration(Path("planted.py"), f'"""Module.\n\n{example}\n"""\n\nx = 1\n')
    assert narration(Path("planted.py"), f"x = 1  # {example}\n")


def test_code_and_legitimate_words_are_not_flagged() -> None:
    for sentence in NOT_NARRATION:
        assert not narration(Path("fine.md"), sentence), sentence
    assert not narration(Path("fine.md"), "```text\nThree more runs on 2026-11-24\n```\n`until now` in code\n")
    assert not narration(Path("fine.py"), 'label = "this round of the loop"\n')
