"""Reader for W&B transaction logs (`run-<id>.wandb`), with per-record error recovery.

The file is a LevelDB-style log (https://github.com/google/leveldb/blob/main/doc/log_format.md)
with a W&B file header in front::

    file   := header block*
    header := ident ":W&B" (4 bytes) | magic 0xBEE1 (uint16 LE) | version 0 (uint8)   -- 7 bytes
    block  := record* trailer?          -- 32 KiB; the header sits in the first block
    record := crc (uint32 LE) | length (uint16 LE) | type (uint8) | data[length]
    type   := FULL 1 | FIRST 2 | MIDDLE 3 | LAST 4
    trailer:= < 7 zero bytes that cannot hold a record header; the next record starts a block

W&B's CRC is the plain IEEE CRC-32 (zlib.crc32) of the type byte followed by the data (not
LevelDB's masked CRC-32C). A logical record is one FULL, or FIRST MIDDLE* LAST; its bytes are
a serialized `wandb.proto.wandb_internal_pb2.Record`.

Error recovery. Each physical record carries its own CRC, so nothing that fails the check is
trusted; what passes is. On a bad record we first try the record right after it (a flipped
CRC or data byte leaves the length intact), then resynchronise by scanning forward for the
next position that holds a record whose CRC checks out. Every skipped region is reported as a
`Problem` with its byte offset and length. A file that ends inside a record is `truncated`
(the writing process died): everything before it is read, nothing is reported as corrupt.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "BLOCK",
    "HEADER",
    "FILE_HEADER",
    "Problem",
    "WandbLogReader",
    "parse_record",
]

BLOCK = 32 * 1024  # LevelDB block size
HEADER = 7  # record header: crc u32, length u16, type u8
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
FILE_IDENT = b":W&B"
FILE_MAGIC = 0xBEE1
FILE_VERSION = 0
FILE_HEADER = struct.pack("<4sHB", FILE_IDENT, FILE_MAGIC, FILE_VERSION)  # 7 bytes
_HDR = struct.Struct("<IHB")
# CRC state after the type byte: crc32(data, _SEED[type]) == crc32(bytes([type]) + data)
_SEED = [zlib.crc32(bytes([t])) for t in range(256)]
_TYPE_BYTE = re.compile(rb"[\x01-\x04]")
_TYPE_NAMES = {FULL: "FULL", FIRST: "FIRST", MIDDLE: "MIDDLE", LAST: "LAST"}


@dataclass(frozen=True)
class Problem:
    """A region of the file that could not be read. `offset` and `length` are in bytes."""

    offset: int
    length: int
    reason: str

    def __str__(self) -> str:
        return f"byte {self.offset} (+{self.length}): {self.reason}"


@dataclass
class WandbLogReader:
    """Iterate the logical records of one `.wandb` file as `(offset, payload bytes)`.

    After iteration, `problems` lists the unreadable regions, `truncated` says whether the file
    ends inside a record (a crashed writer), `records` counts what was yielded and
    `bytes_read` is the offset the reader got to.

        reader = WandbLogReader(path)
        for offset, payload in reader:
            ...
        reader.problems, reader.truncated
    """

    path: Path
    problems: list[Problem] = field(default_factory=list)
    truncated: bool = False
    records: int = 0
    bytes_read: int = 0
    header_ok: bool = True

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such W&B run file")

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        self.problems, self.truncated, self.records = [], False, 0
        size = os.path.getsize(self.path)
        if size == 0:
            self.truncated = True  # created, never written: a run that died at once
            return
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            yield from self._scan(buf, size)

    # ---------------------------------------------------------------- scanning

    def _scan(self, buf, size: int) -> Iterator[tuple[int, bytes]]:
        head = bytes(buf[:HEADER])
        if head != FILE_HEADER:
            self.header_ok = False
            self.problems.append(
                Problem(0, min(HEADER, size), f"wrong W&B file header {_describe_header(head)}")
            )
            if size < HEADER:
                self.truncated = head == FILE_HEADER[: len(head)]
                return
        pos = HEADER
        frag: list[bytes] = []  # pieces of a FIRST..LAST record being assembled
        frag_start = -1
        unpack, crc32, full_seed = _HDR.unpack_from, zlib.crc32, _SEED[FULL]
        while pos < size:
            # fast path, nearly every record: a whole FULL record inside this block, CRC good
            block_end = pos - pos % BLOCK + BLOCK
            if not frag and pos + HEADER <= block_end and pos + HEADER <= size:
                crc, length, rtype = unpack(buf, pos)
                end = pos + HEADER + length
                if rtype == FULL and end <= block_end and end <= size:
                    data = buf[pos + HEADER : end]
                    if crc32(data, full_seed) == crc:
                        self.records += 1
                        self.bytes_read = end
                        yield pos, data
                        pos = end
                        continue
            # everything else: block trailers, fragments, damage, the end of the file
            left_in_block = BLOCK - pos % BLOCK
            if left_in_block < HEADER:  # block trailer: padding up to the next block
                pos += left_in_block
                continue
            if size - pos < HEADER:
                # a partial record header at the end: the writer died mid-write
                if any(buf[pos:size]):
                    self.truncated = True
                break
            crc, length, rtype = _HDR.unpack_from(buf, pos)
            end = pos + HEADER + length
            data = None
            if 1 <= rtype <= 4 and length <= left_in_block - HEADER:
                if end > size:
                    # a well-formed header whose data runs past EOF: torn final write
                    self.truncated = True
                    break
                data = buf[pos + HEADER : end]
                if zlib.crc32(data, _SEED[rtype]) != crc:
                    data = None
            elif (
                rtype == 0
                and length == 0
                and crc == 0
                and not buf[pos : min(size, pos + left_in_block)].strip(b"\0")
            ):
                # zeros to the end of the block: preallocated / padded space, not a record
                pos += left_in_block
                continue
            if data is None:
                if frag:  # the record being assembled cannot be completed
                    self.problems.append(
                        Problem(frag_start, pos - frag_start, "fragmented record cut short by corruption")
                    )
                    frag = []
                nxt = self._resync(buf, pos, size)
                reason = _why_invalid(buf, pos, size)
                self.problems.append(Problem(pos, nxt - pos, reason))
                pos = nxt
                continue
            if rtype == FULL:
                if frag:
                    self.problems.append(
                        Problem(frag_start, pos - frag_start, "FIRST record without LAST, dropped")
                    )
                    frag = []
                self.records += 1
                self.bytes_read = end
                yield pos, data
            elif rtype == FIRST:
                if frag:
                    self.problems.append(
                        Problem(frag_start, pos - frag_start, "FIRST record without LAST, dropped")
                    )
                frag, frag_start = [data], pos
            elif not frag:
                self.problems.append(
                    Problem(pos, end - pos, f"{_TYPE_NAMES[rtype]} record without a FIRST, dropped")
                )
            elif rtype == MIDDLE:
                frag.append(data)
            else:  # LAST
                frag.append(data)
                self.records += 1
                self.bytes_read = end
                yield frag_start, b"".join(frag)
                frag = []
            pos = end
        if frag:
            self.truncated = True  # a FIRST..MIDDLE chain that never got its LAST: torn write
        if not frag and not self.truncated:
            self.bytes_read = max(self.bytes_read, min(pos, size))

    @staticmethod
    def _valid_at(buf, pos: int, size: int) -> bool:
        """Does a physical record with a matching CRC start at `pos`?"""
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER or size - pos < HEADER:
            return False
        crc, length, rtype = _HDR.unpack_from(buf, pos)
        if not 1 <= rtype <= 4 or length > left_in_block - HEADER or pos + HEADER + length > size:
            return False
        return zlib.crc32(buf[pos + HEADER : pos + HEADER + length], _SEED[rtype]) == crc

    def _resync(self, buf, pos: int, size: int) -> int:
        """Offset of the next readable record after a bad one at `pos` (or EOF).

        First the spot right after the bad record (its length field is usually intact), then
        every later byte. Random bytes pass the type/length checks about 1 time in 100 and the
        CRC about 1 time in 4 billion, so the scan is cheap and does not invent records.
        """
        crc, length, rtype = _HDR.unpack_from(buf, pos) if size - pos >= HEADER else (0, 0, 0)
        left_in_block = BLOCK - pos % BLOCK
        if 1 <= rtype <= 4 and length <= left_in_block - HEADER:
            nxt = pos + HEADER + length
            if BLOCK - nxt % BLOCK < HEADER:
                nxt += BLOCK - nxt % BLOCK
            if nxt >= size or self._valid_at(buf, nxt, size):
                return min(nxt, size)
        # candidates: positions whose type byte (header offset 6) is 1..4
        m = _TYPE_BYTE.search(buf, pos + 1 + 6)
        while m is not None:
            p = m.start() - 6
            if BLOCK - p % BLOCK >= HEADER and self._valid_at(buf, p, size):
                return p
            m = _TYPE_BYTE.search(buf, m.start() + 1)
        return size


def _describe_header(head: bytes) -> str:
    if len(head) < HEADER:
        return f"(file is only {len(head)} bytes)"
    ident, magic, version = struct.unpack("<4sHB", head)
    bits = []
    if ident != FILE_IDENT:
        bits.append(f"ident {ident!r}, expected {FILE_IDENT!r}")
    if magic != FILE_MAGIC:
        bits.append(f"magic 0x{magic:04X}, expected 0x{FILE_MAGIC:04X}")
    if version != FILE_VERSION:
        bits.append(f"version {version}, expected {FILE_VERSION}")
    return "(" + "; ".join(bits) + ")"


def _why_invalid(buf, pos: int, size: int) -> str:
    if size - pos < HEADER:
        return "garbage at end of file"
    crc, length, rtype = _HDR.unpack_from(buf, pos)
    left = BLOCK - pos % BLOCK - HEADER
    if not 1 <= rtype <= 4:
        return f"bad record type {rtype}, skipped to the next readable record"
    if length > left:
        return f"record length {length} overruns its block ({left} bytes left), skipped to the next readable record"
    return f"record CRC mismatch ({_TYPE_NAMES[rtype]}, {length} bytes), skipped"


def parse_record(payload: bytes):
    """A logical record's bytes as a `wandb_internal_pb2.Record` (raises `DecodeError`)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rec = pb.Record()
    rec.ParseFromString(payload)
    return rec
