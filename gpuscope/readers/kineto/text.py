"""A trace's JSON text held so that what has been decoded can be let go of while the rest is.

A big file's text is decoded in pieces (parse.py); each piece's events become number columns
and its bytes are no longer read. In a bytearray they stay until the last piece is done, beside
the columns. Here the text lives in private anonymous memory whose pages are handed back to the
system (madvise MADV_DONTNEED) piece by piece, and, after the fork that decodes half of a file
in a second process, each process hands back the half the other decodes (the pages are
copy-on-write: a page goes when neither process maps it any longer).
"""

from __future__ import annotations

import mmap

#: texts from this size live in memory that can be let go of piece by piece
RELEASE_MIN_BYTES = 4 << 20


def text_buffer(size: int):
    """A writable buffer of `size` zero bytes: private anonymous memory (`let_go` works on it)
    from RELEASE_MIN_BYTES where the system can hand pages back, else a bytearray."""
    if size >= RELEASE_MIN_BYTES and hasattr(mmap, "MADV_DONTNEED"):
        try:
            return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        except (OSError, ValueError):
            pass
    return bytearray(size)


def let_go(text, lo: int, hi: int) -> None:
    """Hand back the whole pages of text[lo:hi] (read after this, they hold zeros): only where
    nothing reads those bytes again. Nothing happens to a buffer of another kind."""
    if not isinstance(text, mmap.mmap):
        return
    page = mmap.PAGESIZE
    lo, hi = -(-max(lo, 0) // page) * page, min(hi, len(text)) // page * page
    if hi > lo:
        try:
            text.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (OSError, ValueError):  # not allowed here: the pages stay until the text goes
            pass
