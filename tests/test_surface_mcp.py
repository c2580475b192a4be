"""The daemon's own surface, through MCP: what a run writes is read with limits.

Files in a run's workspace are written by sandboxed code, and the MCP server runs in
the daemon: an image it inlines is read and decoded only within fixed bounds, so a
run cannot make the daemon read or allocate without limit."""

import asyncio
import time

from test_mcp import connect, images_of, session_id, text_of

BIG = 1000 * 1024 * 1024

PLOT_AND_SPARSE_PNGS = f"""
import matplotlib.pyplot as plt
plt.plot([1, 2, 3])
for i in range(4):
    with open(f"big{{i}}.png", "wb") as f:
        f.truncate({BIG})  # sparse: no workspace space used
"""


def test_huge_sparse_images_are_named_not_read(daemon):
    """Four sparse 1000 MiB .png files (which took the daemon to 2.5 GB and 25 s in
    one call) are left out by their size, with a note saying where to fetch them;
    the run's real figure is still shown."""
    before = daemon.rss_kib()

    async def go():
        async with connect(daemon, "http") as s:
            started = time.monotonic()
            r = await s.call_tool("run_python", {"code": PLOT_AND_SPARSE_PNGS})
            return r, time.monotonic() - started

    result, elapsed = asyncio.run(go())
    text = text_of(result)
    assert not result.is_error, text
    images = images_of(result)
    assert len(images) == 1, text  # the figure (figures come first)
    # Three of the big files are considered (4 images at most), each named with its URL.
    noted = [l for l in text.splitlines() if l.startswith("note: image big") and "larger than" in l]
    assert len(noted) == 3, text
    sid = session_id(result)
    assert all(f"/v1/sessions/{sid}/files/big" in l for l in noted), noted
    assert "more than 4 images" in text, text
    grown_mib = (daemon.rss_kib() - before) / 1024
    assert grown_mib < 64, f"the daemon grew by {grown_mib:.0f} MiB"
    assert elapsed < 20, f"the call took {elapsed:.1f} s"


def test_read_file_never_inlines_past_the_limit(daemon):
    """read_file refuses a file over the inline limit with artifact_too_large, and
    reads nothing of it (the daemon does not grow)."""
    async def go():
        async with connect(daemon, "http") as s:
            r = await s.call_tool("run_python", {"code": f"open('huge.bin', 'wb').truncate({BIG})"})
            sid = session_id(r)
            before = daemon.rss_kib()
            refused = await s.call_tool("read_file", {"session_id": sid, "path": "huge.bin"})
            return refused, before

    refused, before = asyncio.run(go())
    assert refused.is_error
    assert text_of(refused).startswith("error artifact_too_large: huge.bin is 1048576000 bytes"), text_of(refused)
    assert (daemon.rss_kib() - before) / 1024 < 64
