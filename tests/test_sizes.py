"""Counts as people read them: bytes with a unit beside a ``*_bytes`` metadata value, and a count
with its noun in the right number — "1 segment", never "1 segments" (issue 31: plural words right)."""

from __future__ import annotations

import pytest

from kts_assets.sizes import counted, human_bytes


@pytest.mark.parametrize("count, noun, plural, text", [
    (0, "segment", None, "0 segments"),
    (1, "segment", None, "1 segment"),
    (2, "segment", None, "2 segments"),
    (1, "entry", "entries", "1 entry"),
    (12_345, "entry", "entries", "12,345 entries"),
    (1, "byte", None, "1 byte"),
])
def test_a_count_takes_its_noun_in_the_right_number(count, noun, plural, text):
    assert counted(count, noun, plural) == text


@pytest.mark.parametrize("count, text", [(-1, "unknown"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                         (5 * 1024**3, "5.0 GiB")])
def test_bytes_are_shown_with_their_unit(count, text):
    assert human_bytes(count) == text
