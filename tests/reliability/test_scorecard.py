"""The scorecard shows every bad input as text: no raw control character reaches the markdown file."""

from __future__ import annotations

from tests.reliability.scorecard import _md


def test_a_cell_holds_no_control_character_and_no_table_pipe():
    cell = _md("art\x00x|y\n\x1b[31m\x9b")
    assert cell == "art\\x00x\\|y \\x1b[31m\\x9b"
    assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in cell)
