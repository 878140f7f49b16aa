"""`observatory ingest`'s malloc settings: an 8 MB block freed stays in the heap for the next batch.

Each side runs in a child process (the settings are process-wide); glibc's `mallinfo2` tells
where a block came from (`hblkhd`: bytes in mmapped blocks) and what the heap keeps free.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = """
import ctypes, json, sys
from observatory.ingest.allocator import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
took = keep_freed_memory() if sys.argv[1] == "tuned" else None
p = libc.malloc(8 << 20)
mapped = libc.mallinfo2().hblkhd
libc.free(p)
print(json.dumps({"took": took, "mapped": mapped, "free_in_heap": libc.mallinfo2().fordblks}))
"""


def _child(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and mallinfo2")
def test_freed_blocks_stay_in_the_heap_only_with_the_settings():
    default, tuned = _child("default"), _child("tuned")
    assert default["mapped"] >= 8 << 20 and default["free_in_heap"] < 8 << 20  # mmapped, given back at free
    assert tuned["took"] is True
    assert tuned["mapped"] < 8 << 20 and tuned["free_in_heap"] >= 8 << 20  # from the heap, kept there
