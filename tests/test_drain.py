"""The bounded capture and the line decoder, without processes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio
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


@given(
    st.lists(st.tuples(st.binary(max_size=40), st.booleans()), max_size=40),
    st.integers(min_value=0, max_value=100),
)
def test_a_reader_following_the_writer_gets_the_stream_it_could_keep(
    steps: list[tuple[bytes, bool]], limit: int
) -> None:
    """Appends interleaved with reads (True: read after that append): each read returns exactly
    the stream's bytes from its offset that the record still holds, and counts the rest as
    skipped, wherever the offset falls among the tail's chunks."""
    cap = Capture(limit)
    stream = b""
    offset = 0
    seen = b""
    skipped_total = 0
    for chunk, read in [*steps, (b"", True)]:
        cap.append(chunk)
        stream += chunk
        if not read:
            continue
        while True:
            new_offset, data, skipped = cap.read_from(offset)
            assert stream[offset + skipped : new_offset] == data
            seen += data
            skipped_total += skipped
            offset = new_offset
            if not data:
                break
    assert offset == len(stream) or not stream
    assert len(seen) + skipped_total == len(stream)


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


@given(
    st.lists(st.text(alphabet="ab\né", max_size=30), max_size=12),
    st.data(),
    st.integers(min_value=1, max_value=6),
)
def test_lines_are_the_text_whatever_the_chunking_and_never_longer_than_the_bound(
    texts: list[str], data: st.DataObject, max_line: int
) -> None:
    """Bytes cut at arbitrary points (inside characters too) come out as the same text, in
    lines that end with their newline, except a piece of a line longer than `max_line` (exactly
    `max_line` characters, more of that line following) and the last line."""
    raw = "".join(texts).encode()
    cuts = sorted(data.draw(st.lists(st.integers(min_value=0, max_value=len(raw)), max_size=8)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]

    async def collect() -> list[str]:
        return [x async for x in lines(_aiter(chunks), "utf-8", "strict", max_line)]

    got = trio.run(collect)
    assert "".join(got) == raw.decode()
    for i, piece in enumerate(got):
        assert piece
        if piece.endswith("\n"):
            assert len(piece) <= max_line + 1
            assert "\n" not in piece[:-1]
        else:
            assert "\n" not in piece
            assert len(piece) == max_line or i == len(got) - 1


async def test_a_long_line_in_many_small_chunks_comes_out_whole() -> None:
    """A line arriving in 4 KiB pieces (a progress bar redrawn with carriage returns) is one
    line, below the default bound."""
    line = b"\r".join(b"%d%%" % n for n in range(100_000)) + b"\n"
    chunks = [line[i : i + 4096] for i in range(0, len(line), 4096)]
    assert [x async for x in lines(_aiter(chunks), "utf-8", "strict")] == [line.decode()]


# -- the teardown taking a pipe's end (Drain.take_eof) --------------------------------------


async def test_take_eof_reads_what_is_left_in_order_then_the_end() -> None:
    import os

    import trio
    import trio.testing

    from trio_procown._drain import Drain

    r, w = os.pipe()
    drain = Drain("stdout", r, 1 << 20)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain.run)
        os.write(w, b"early ")
        await trio.testing.wait_all_tasks_blocked()  # read "early ", then parked on the pipe
        assert drain._parked
        os.write(w, b"late")
        os.close(w)
        assert drain.take_eof() is False  # "late" was still there: appended, the end not seen yet
        assert drain.take_eof() is True
        assert drain.done.is_set()
        assert drain.eof
    # The reading task, woken by the close, ended without an error and without reading again.
    assert drain.capture.getvalue() == b"early late"


async def test_take_eof_leaves_a_pipe_with_a_writer_to_its_task() -> None:
    import os

    import trio
    import trio.testing

    from trio_procown._drain import Drain

    r, w = os.pipe()
    drain = Drain("stdout", r, 1 << 20)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain.run)
        await trio.testing.wait_all_tasks_blocked()
        assert drain.take_eof() is False  # nothing to read, the writer still open
        assert not drain.done.is_set()
        os.write(w, b"more")
        os.close(w)
        await drain.done.wait()
    assert drain.eof
    assert drain.capture.total == 4


async def test_take_eof_before_the_reading_task_first_ran() -> None:
    """A command over before its drain got a turn: the teardown takes the
    first chunk and then the end itself; the task, when it runs, reads on
    after that chunk or finds the drain done, and nothing is read twice."""
    import os

    import trio

    from trio_procown._drain import Drain

    r, w = os.pipe()
    drain = Drain("stdout", r, 1 << 20)
    os.write(w, b"all of it")
    os.close(w)
    assert drain.take_eof() is False  # the output, kept; the end left for later
    assert drain.take_eof() is True
    assert drain.done.is_set()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain.run)  # finds the drain done: returns at once
    assert drain.capture.getvalue() == b"all of it"


def test_take_eof_never_reads_while_the_task_is_between_reads() -> None:
    """A reading task that yielded after a chunk (begun, not parked on the
    pipe) reads again when it resumes, from the descriptor it holds: the
    teardown then leaves the pipe to it, never closing it under the task."""
    import os

    from trio_procown._drain import Drain

    r, w = os.pipe()
    drain = Drain("stdout", r, 1 << 20)
    os.close(w)
    drain._reading, drain._parked = True, False  # the task's state at its checkpoint after a chunk
    try:
        assert drain.take_eof() is False
        assert drain.fd == r
        assert not drain.done.is_set()
    finally:
        os.close(r)


async def test_commands_ending_at_once_lose_no_output_to_the_teardown_taking_the_end() -> None:
    """The teardown sees a pipe's end itself when the command has exited; the reading task may
    already be woken then: it must neither read a closed descriptor nor lose a byte."""
    import trio_procown

    for _ in range(150):
        result = await trio_procown.run_owned(["sh", "-c", "echo out; echo err >&2"], domain="process-group")
        assert (result.stdout, result.stderr, result.receipt.output) == (b"out\n", b"err\n", "complete")


async def test_a_drain_abandoned_before_its_task_first_ran_reads_nothing_and_ends() -> None:
    """abandon() before the reading task got a turn: the task, when it
    runs, reads nothing and ends at once; the pipe is closed and the record
    is empty (nothing was read, so nothing is kept or claimed)."""
    import os

    from trio_procown._drain import Drain

    r, w = os.pipe()
    try:
        drain = Drain("stdout", r, 1 << 20)
        os.write(w, b"never read")
        drain.abandon()
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain.run)
        assert drain.done.is_set()
        assert drain.abandoned
        assert drain.fd is None
        assert drain.capture.total == 0
    finally:
        os.close(w)


async def test_a_drain_paused_before_its_task_first_ran_reads_everything_when_run_again() -> None:
    """pause() before the reading task got a turn (a handoff at once)
    returns when that task has started and stopped without reading; run
    again, as in the new owner's nursery, the one task reads the whole
    stream, once, to its end."""
    import os

    from trio_procown._drain import Drain

    r, w = os.pipe()
    drain = Drain("stdout", r, 1 << 20)
    os.write(w, b"first ")
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain.run)
            await drain.pause()
        assert not drain.done.is_set()
        assert drain.capture.total == 0
        os.write(w, b"second")
        os.close(w)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain.run)
    assert drain.eof
    assert drain.capture.getvalue() == b"first second"
