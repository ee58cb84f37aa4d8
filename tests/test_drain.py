"""The bounded capture and the line decoder, without processes."""

from __future__ import annotations

from collections.abc import AsyncIterator

from hypothesis import given
from hypothesis import strategies as st

from trio_procown._drain import Capture, lines


def test_capture_under_limit_keeps_everything() -> None:
    """Below the limit the record is exactly what was appended."""
    cap = Capture(100)
    for chunk in (b"abc", b"", b"defg"):
        cap.append(chunk)
    assert cap.getvalue() == b"abcdefg"
    assert cap.dropped == 0


@given(st.lists(st.binary(max_size=50), max_size=40), st.integers(min_value=0, max_value=120))
def test_capture_keeps_head_and_tail_and_counts_drops(chunks: list[bytes], limit: int) -> None:
    """Whatever the chunking, the record is head + tail of the stream and drops are counted exactly."""
    cap = Capture(limit)
    for c in chunks:
        cap.append(c)
    data = b"".join(chunks)
    head_n = limit // 2
    tail_n = limit - head_n
    if len(data) <= limit:
        assert cap.getvalue() == data
    else:
        expected = data[:head_n] + (data[len(data) - tail_n :] if tail_n else b"")
        assert cap.getvalue() == expected
    assert cap.dropped == max(0, len(data) - limit)
    assert cap.total == len(data)


def test_read_from_reports_skipped_bytes() -> None:
    """A reader whose offset fell into the dropped middle skips to the tail and is told how much."""
    cap = Capture(4)
    cap.append(b"0123456789")
    offset, data, skipped = cap.read_from(0)
    assert (offset, data, skipped) == (2, b"01", 0)
    offset, data, skipped = cap.read_from(offset)
    assert (offset, data, skipped) == (10, b"89", 6)


async def _aiter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


async def test_lines_decode_characters_split_across_chunks() -> None:
    """A UTF-8 character split between two chunks comes out whole."""
    text = "héllo wörld\n€uro"
    raw = text.encode()
    split = raw.index("€".encode()) + 1  # inside the 3-byte euro sign
    got = [line async for line in lines(_aiter([raw[:split], raw[split:]]), "utf-8", "strict")]
    assert got == ["héllo wörld\n", "€uro"]


async def test_lines_without_trailing_newline() -> None:
    """The last line is yielded even without a newline; empty input yields nothing."""
    assert [x async for x in lines(_aiter([b"a\nb"]), "utf-8", "strict")] == ["a\n", "b"]
    assert [x async for x in lines(_aiter([]), "utf-8", "strict")] == []
