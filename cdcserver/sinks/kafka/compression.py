"""Batches compressed as Kafka's own Java client compresses them by default.

aiokafka compresses ``lz4`` with LZ4's high-compression coder at level 9 (it reads Kafka's
``compression.lz4.level`` default, 9, as a level for LZ4HC) and ``gzip`` at level 9. Kafka's
Java client, which Kafka Connect and every JVM producer use, takes the default lz4 level as
LZ4's *fast* coder (``Lz4BlockOutputStream``: ``level == defaultLevel() ? fastCompressor() :
highCompressor(level)``) and gzip at ``Deflater``'s default (6). On this service's messages
(JSON, Avro) LZ4HC costs ten times the CPU of the fast coder for batches about 4% smaller,
and the producer compresses on the event loop's thread: at full speed lz4 took a sixth of it.

:func:`install` gives aiokafka's record-batch builders (the compiled one and the Python one)
the Java client's defaults. The framing stays aiokafka's (KIP-57: independent blocks, no
content checksum), so any consumer reads the batches as before. Zstandard (level 3) and snappy
are already as Java's.
"""

from __future__ import annotations

import gzip
import importlib
import io
import logging
from typing import Any

log = logging.getLogger(__name__)

LZ4_FAST = 0  # LZ4 frame preferences: levels below 3 are the fast coder (LZ4_compress_fast)
GZIP_LEVEL = 6  # java.util.zip.Deflater.DEFAULT_COMPRESSION
_BUILDERS = ("aiokafka.record._crecords.default_records", "aiokafka.record.default_records")
_installed = False


def lz4_encode(payload: Any, level: int = 9) -> bytes:
    """Kafka's lz4 framing (independent blocks, no content checksum), LZ4's fast coder.
    (``level``: aiokafka's call passes its 9, which the Java client's default means.)"""
    import cramjam

    compressor = cramjam.lz4.Compressor(level=LZ4_FAST, content_checksum=False,
                                        block_linked=False)
    compressor.compress(payload)
    return bytes(compressor.finish())


def gzip_encode(payload: Any, compresslevel: int | None = None) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="w", compresslevel=GZIP_LEVEL) as gzipper:
        gzipper.write(payload)
    return buffer.getvalue()


def install() -> None:
    """The encoders above, in the modules aiokafka's batch builders call them from (once)."""
    global _installed
    if _installed:
        return
    for name in _BUILDERS:
        try:
            module = importlib.import_module(name)
        except ImportError:  # no compiled builder on this platform
            continue
        for attribute, encoder in (("lz4_encode", lz4_encode), ("gzip_encode", gzip_encode)):
            if hasattr(module, attribute):
                setattr(module, attribute, encoder)
            else:  # another aiokafka: its own coder stays, slower, still correct
                log.warning("kafka: %s has no %s; batches are compressed by aiokafka's",
                            name, attribute)
    _installed = True
