# cython: boundscheck=False, wraparound=False, cdivision=True
"""The row path of a dump in C: MySQL text-protocol row packets straight to the dump's row
form, ``["<base64>",null,...]`` (see cdcserver/dump/rawrows.py, which uses this when it is
built and falls back to its own Python otherwise; both give the same bytes)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.string cimport memcpy

cdef const char *_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

cdef enum:  # the same, for code without the GIL
    S_NEED_MORE = 0
    S_END = 1
    S_ERROR = 2
    S_LONG = 3
    S_FULL = 4

# What parse_rows stopped at
NEED_MORE = 0  # the buffer ends inside a packet
END = 1  # the result's EOF packet, at ``pos``
ERROR = 2  # an error packet, at ``pos``
LONG = 3  # a packet of 16 MiB or more starts at ``pos``: the caller joins it
FULL = 4  # ``batch`` rows were parsed (parse_rows)


cdef inline Py_ssize_t _encoded(Py_ssize_t n) nogil:
    return ((n + 2) // 3) * 4


cdef inline Py_ssize_t _base64(const unsigned char *src, Py_ssize_t n, char *out) nogil:
    cdef Py_ssize_t i = 0, o = 0
    cdef unsigned int v
    while i + 3 <= n:
        v = (src[i] << 16) | (src[i + 1] << 8) | src[i + 2]
        out[o] = _ALPHABET[(v >> 18) & 63]
        out[o + 1] = _ALPHABET[(v >> 12) & 63]
        out[o + 2] = _ALPHABET[(v >> 6) & 63]
        out[o + 3] = _ALPHABET[v & 63]
        i += 3
        o += 4
    if n - i == 1:
        v = src[i] << 16
        out[o] = _ALPHABET[(v >> 18) & 63]
        out[o + 1] = _ALPHABET[(v >> 12) & 63]
        out[o + 2] = 61  # '='
        out[o + 3] = 61
        o += 4
    elif n - i == 2:
        v = (src[i] << 16) | (src[i + 1] << 8)
        out[o] = _ALPHABET[(v >> 18) & 63]
        out[o + 1] = _ALPHABET[(v >> 12) & 63]
        out[o + 2] = _ALPHABET[(v >> 6) & 63]
        out[o + 3] = 61
        o += 4
    return o


cdef inline Py_ssize_t _length(const unsigned char *p, Py_ssize_t *pos) nogil:
    """A length-encoded column length at p[pos] (advancing pos past it); -1 for NULL,
    -2 for a malformed prefix."""
    cdef unsigned char first = p[pos[0]]
    cdef Py_ssize_t n
    cdef int i
    if first < 0xFB:
        pos[0] += 1
        return first
    if first == 0xFB:
        pos[0] += 1
        return -1
    if first == 0xFC:
        n = p[pos[0] + 1] | (p[pos[0] + 2] << 8)
        pos[0] += 3
        return n
    if first == 0xFD:
        n = p[pos[0] + 1] | (p[pos[0] + 2] << 8) | (p[pos[0] + 3] << 16)
        pos[0] += 4
        return n
    if first == 0xFE:
        n = 0
        for i in range(8):
            n |= (<Py_ssize_t>p[pos[0] + 1 + i]) << (8 * i)
        pos[0] += 9
        return n
    return -2


def encode_row(const unsigned char[:] payload, int columns):
    """One row packet's payload as the dump's row bytes."""
    cdef Py_ssize_t end = payload.shape[0]
    if end == 0:
        raise ValueError("an empty row packet")
    return _row(&payload[0], end, columns)


cdef bytes _row(const unsigned char *p, Py_ssize_t end, int columns):
    cdef Py_ssize_t consumed = 0
    cdef Py_ssize_t size = _row_size(p, end, columns, &consumed)
    if size == -1:
        raise ValueError(f"a result row ends before its {columns} columns")
    if size == -2:
        raise ValueError("a result row has a malformed column length")
    if size == -3:
        raise ValueError(f"a result row has {end - consumed} bytes after its {columns} "
                         "columns")
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    _write_row(p, columns, PyBytes_AS_STRING(out))
    return out


def parse_rows(const unsigned char[:] buf, Py_ssize_t pos, Py_ssize_t end, int columns,
               int batch, list rows):
    """Parse row packets from ``buf[pos:end]`` into ``rows`` until one of NEED_MORE, END,
    ERROR, LONG or FULL; returns (that, the position reached)."""
    cdef Py_ssize_t length
    cdef const unsigned char *p
    if end > buf.shape[0] or pos < 0 or pos > end:
        raise ValueError("parse_rows: a position outside the buffer")
    if end == 0:
        return NEED_MORE, pos
    p = &buf[0]
    while end - pos >= 4:
        length = p[pos] | (p[pos + 1] << 8) | (p[pos + 2] << 16)
        if end - pos - 4 < length:
            return NEED_MORE, pos
        if length == 0xFFFFFF:
            return LONG, pos
        if length > 0 and ((p[pos + 4] == 0xFE and length < 9) or p[pos + 4] == 0xFF):
            return (END if p[pos + 4] == 0xFE else ERROR), pos
        rows.append(_row(p + pos + 4, length, columns))
        pos += 4 + length
        if len(rows) >= batch:
            return FULL, pos
    return NEED_MORE, pos


cdef const char *_PREFIX = b'{"action":"insert","rows":['
cdef Py_ssize_t _PREFIX_LEN = 27
cdef const char *_SUFFIX = b"]}\n"


cdef Py_ssize_t _row_size(const unsigned char *p, Py_ssize_t end, int columns,
                          Py_ssize_t *consumed) nogil:
    """The size of a row packet's row form; -1 if it ends before its columns, -2 for a
    malformed length, -3 if bytes follow them (``consumed``: where its columns end)."""
    cdef Py_ssize_t pos = 0, size = 2, n
    cdef int c
    for c in range(columns):
        if pos >= end:
            return -1
        n = _length(p, &pos)
        if n == -2:
            return -2
        if n == -1:
            size += 4
        else:
            size += _encoded(n) + 2
            pos += n
        if c:
            size += 1
    consumed[0] = pos
    if pos != end:
        return -3
    return size


cdef Py_ssize_t _write_row(const unsigned char *p, int columns, char *w) nogil:
    cdef Py_ssize_t pos = 0, o = 0, n
    cdef int c
    w[o] = 91
    o += 1
    for c in range(columns):
        if c:
            w[o] = 44
            o += 1
        n = _length(p, &pos)
        if n == -1:
            memcpy(w + o, b"null", 4)
            o += 4
        else:
            w[o] = 34
            o += 1
            o += _base64(p + pos, n, w + o)
            w[o] = 34
            o += 1
            pos += n
    w[o] = 93
    return o + 1


def parse_lines(const unsigned char[:] buf, Py_ssize_t pos, Py_ssize_t end, int columns,
                int batch):
    """Every whole row packet in ``buf[pos:end]`` as insert lines of a dump
    (``{"action":"insert","rows":[...]}`` and a newline, at most ``batch`` rows each), all
    encoded into one bytes object without the GIL: returns (what it stopped at: NEED_MORE,
    END, ERROR or LONG; the position reached; the lines or None; their rows; the offset of
    the last row in them, which ends 3 bytes before their end)."""
    cdef Py_ssize_t length, at, size = 0, row, o, last = 0, consumed = 0
    cdef const unsigned char *p
    cdef Py_ssize_t count = 0
    cdef int state = S_NEED_MORE, in_line = 0
    cdef bint bad = False
    if end > buf.shape[0] or pos < 0 or pos > end:
        raise ValueError("parse_lines: a position outside the buffer")
    if end == 0 or batch < 1:
        return S_NEED_MORE, pos, None, 0, 0
    p = &buf[0]
    at = pos
    with nogil:
        while True:
            if end - at < 4:
                break
            length = p[at] | (p[at + 1] << 8) | (p[at + 2] << 16)
            if end - at - 4 < length:
                break
            if length == 0xFFFFFF:
                state = S_LONG
                break
            if length > 0 and ((p[at + 4] == 0xFE and length < 9) or p[at + 4] == 0xFF):
                state = S_END if p[at + 4] == 0xFE else S_ERROR
                break
            row = _row_size(p + at + 4, length, columns, &consumed)
            if row < 0:
                bad = True
                break
            if in_line == 0:
                size += _PREFIX_LEN + 3
            else:
                size += 1
            size += row
            in_line += 1
            if in_line == batch:
                in_line = 0
            count += 1
            at += 4 + length
    if bad:
        raise ValueError(f"a result row does not hold its {columns} columns")
    if count == 0:
        return state, at, None, 0, 0
    cdef bytes lines = PyBytes_FromStringAndSize(NULL, size)
    cdef char *w = PyBytes_AS_STRING(lines)
    cdef Py_ssize_t i
    with nogil:
        o = 0
        in_line = 0
        for i in range(count):
            length = p[pos] | (p[pos + 1] << 8) | (p[pos + 2] << 16)
            if in_line == 0:
                memcpy(w + o, _PREFIX, _PREFIX_LEN)
                o += _PREFIX_LEN
            else:
                w[o] = 44
                o += 1
            last = o
            o += _write_row(p + pos + 4, columns, w + o)
            pos += 4 + length
            in_line += 1
            if in_line == batch or i == count - 1:
                memcpy(w + o, _SUFFIX, 3)
                o += 3
                in_line = 0
    return state, at, lines, count, last
