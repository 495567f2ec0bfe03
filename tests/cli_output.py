"""What a person reads in a command's output, whatever the terminal's width.

Typer draws a usage error in a rich panel that wraps at the terminal's width (80 columns without a
terminal), so a phrase can be split across lines and panel borders; `plain` joins it back.
"""
from __future__ import annotations

import re

_BORDERS = re.compile(r"[\u2500-\u257f]")  # box-drawing characters


def plain(output: str) -> str:
    """The output's words separated by single spaces, box borders removed."""
    return " ".join(_BORDERS.sub(" ", output).split())
