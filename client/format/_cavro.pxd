"""Reading Avro's binary encoding in C, shared by every extension that decodes stored blocks
(the service's JSON renderer, the Spark source's Arrow decoder) and those that check text
(the service's transcoder): a cursor over a block, Avro's zig-zag varint ``long``, and Python's
strict UTF-8 rule. Cython finds this file as ``mariadb_cdc_client/format/_cavro.pxd`` (setup.py
puts the package's folder, ``client/``, on its include path under that name); it holds only
inline functions, so no module of its own is built or imported.
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcpy


cdef struct Cursor:
    const uint8_t *p
    Py_ssize_t pos
    Py_ssize_t end
    bint bad


cdef inline int64_t read_long(Cursor *c) noexcept:
    """An Avro long (zig-zag varint); ``bad`` set if it runs past the data or 64 bits. Most
    are one byte (union branches, lengths of short text)."""
    cdef uint8_t b
    if c.pos < c.end:
        b = c.p[c.pos]
        if b < 0x80:
            c.pos += 1
            return <int64_t>(b >> 1) ^ -(<int64_t>(b & 1))
    return long_varint(c)


cdef inline int64_t long_varint(Cursor *c) noexcept:
    """A varint of several bytes (timestamps, sequences, microseconds): without a bounds
    check per byte where ten bytes remain, the most a long takes."""
    cdef uint64_t z = 0
    cdef int shift = 0, i
    cdef uint8_t b
    cdef const uint8_t *p = c.p + c.pos
    if c.end - c.pos >= 10:
        for i in range(10):
            b = p[i]
            z |= (<uint64_t>(b & 0x7F)) << (7 * i)
            if b < 0x80:
                if i == 9 and b > 1:  # past 64 bits
                    break
                c.pos += i + 1
                return <int64_t>(z >> 1) ^ -(<int64_t>(z & 1))
        c.bad = True
        return 0
    while True:
        if c.pos >= c.end or shift > 63 or (shift == 63 and c.p[c.pos] > 1):
            c.bad = True
            return 0
        b = c.p[c.pos]
        c.pos += 1
        z |= (<uint64_t>(b & 0x7F)) << shift
        if not b & 0x80:
            break
        shift += 7
    return <int64_t>(z >> 1) ^ -(<int64_t>(z & 1))


cdef inline const uint8_t *take(Cursor *c, Py_ssize_t n) noexcept:
    """The next ``n`` bytes; ``bad`` set (and NULL) if there are fewer."""
    cdef const uint8_t *at
    if c.bad or n < 0 or n > c.end - c.pos:
        c.bad = True
        return NULL
    at = c.p + c.pos
    c.pos += n
    return at


cdef inline bint utf8_valid(const uint8_t *p, Py_ssize_t n) noexcept:
    """Python's strict UTF-8 decoder accepts exactly these sequences (RFC 3629: no overlong
    forms, no surrogates, nothing above U+10FFFF), as Arrow's validation does. Most text
    is ASCII, which one pass over words tells."""
    return ascii_only(p, n) or utf8_sequences_valid(p, n)


cdef inline bint ascii_only(const uint8_t *p, Py_ssize_t n) noexcept:
    cdef uint64_t seen = 0, word
    cdef Py_ssize_t i = 0
    while i + 8 <= n:
        memcpy(&word, p + i, 8)
        seen |= word
        i += 8
    while i < n:
        seen |= p[i]
        i += 1
    return not seen & 0x8080808080808080ULL


cdef inline bint utf8_sequences_valid(const uint8_t *p, Py_ssize_t n) noexcept:
    """The strict check of text that is not all ASCII; its ASCII runs are skipped sixteen
    bytes at a time."""
    cdef Py_ssize_t i = 0
    cdef uint64_t word, word2
    cdef uint8_t c, c1
    while i < n:
        if i + 16 <= n:
            memcpy(&word, p + i, 8)
            memcpy(&word2, p + i + 8, 8)
            if not (word | word2) & 0x8080808080808080ULL:
                i += 16
                continue
        c = p[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2:
            return False
        if c < 0xE0:
            if i + 1 >= n or (p[i + 1] & 0xC0) != 0x80:
                return False
            i += 2
            continue
        if c < 0xF0:
            if i + 2 >= n:
                return False
            c1 = p[i + 1]
            if (c1 & 0xC0) != 0x80 or (p[i + 2] & 0xC0) != 0x80:
                return False
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return False
            i += 3
            continue
        if c > 0xF4 or i + 3 >= n:
            return False
        c1 = p[i + 1]
        if ((c1 & 0xC0) != 0x80 or (p[i + 2] & 0xC0) != 0x80
                or (p[i + 3] & 0xC0) != 0x80):
            return False
        if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
            return False
        i += 4
    return True
