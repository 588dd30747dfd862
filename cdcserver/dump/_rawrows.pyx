# cython: boundscheck=False, wraparound=False, cdivision=True
"""The row path of a dump in C: MySQL text-protocol row packets straight to the dump's row
form, ``["<base64>",null,...]`` (see cdcserver/dump/rawrows.py, which uses this when it is
built and falls back to its own Python otherwise; both give the same bytes)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.errno cimport EINTR, errno
from libc.string cimport memcpy, memmove

from cdcserver cimport _cbase64


cdef extern from "<sys/socket.h>" nogil:
    ssize_t recv(int fd, void *buf, size_t n, int flags)

cdef enum:  # the same, for code without the GIL
    S_NEED_MORE = 0
    S_END = 1
    S_ERROR = 2
    S_LONG = 3
    S_FULL = 4
    S_OUT_FULL = 5
    S_CLOSED = 6
    S_RECV_FAILED = 7

# What parse_rows stopped at
NEED_MORE = 0  # the buffer ends inside a packet
END = 1  # the result's EOF packet, at ``pos``
ERROR = 2  # an error packet, at ``pos``
LONG = 3  # a packet of 16 MiB or more starts at ``pos``: the caller joins it
FULL = 4  # ``batch`` rows were parsed (parse_rows)
OUT_FULL = 5  # the next row does not fit in the output (encode_lines)


cdef inline Py_ssize_t _encoded(Py_ssize_t n) nogil:
    return _cbase64.encoded_size(n)


_cbase64.init()


def simd(enabled=None):
    """Whether long values are encoded with AVX2 (``enabled``: turn it on or off, for
    tests; on only where the CPU has it)."""
    return bool(_cbase64.simd(-1 if enabled is None else 1 if enabled else 0))


cdef inline Py_ssize_t _base64(const unsigned char *src, Py_ssize_t n, char *out) nogil:
    return _cbase64.encode(src, n, out)


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


cdef Py_ssize_t _write_checked(const unsigned char *p, Py_ssize_t end, int columns,
                               char *w) nogil:
    """One row packet's row form at ``w`` in one pass, every length checked against the
    packet's ``end``: the bytes written, or -1 if the packet does not hold exactly its
    columns. ``w`` has room for ``bound(end, columns)`` bytes, which no valid row passes."""
    cdef Py_ssize_t pos = 0, o = 1, n
    cdef unsigned char first
    cdef int c, i
    w[0] = 91
    for c in range(columns):
        if c:
            w[o] = 44
            o += 1
        if pos >= end:
            return -1
        first = p[pos]
        if first < 0xFB:
            n = first
            pos += 1
        elif first == 0xFB:
            memcpy(w + o, b"null", 4)
            o += 4
            pos += 1
            continue
        elif first == 0xFC:
            if end - pos < 3:
                return -1
            n = p[pos + 1] | (p[pos + 2] << 8)
            pos += 3
        elif first == 0xFD:
            if end - pos < 4:
                return -1
            n = p[pos + 1] | (p[pos + 2] << 8) | (p[pos + 3] << 16)
            pos += 4
        elif first == 0xFE:
            if end - pos < 9:
                return -1
            n = 0
            for i in range(8):
                n |= (<Py_ssize_t>p[pos + 1 + i]) << (8 * i)
            pos += 9
            if n < 0:
                return -1
        else:
            return -1
        if n > end - pos:
            return -1
        w[o] = 34
        o += 1
        o += _base64(p + pos, n, w + o)
        w[o] = 34
        o += 1
        pos += n
    if pos != end:
        return -1
    w[o] = 93
    return o + 1


cdef inline Py_ssize_t _bound(Py_ssize_t length, int columns) nogil:
    """At least the size of the row form of a row packet of ``length`` bytes: a value of n
    bytes takes at least n + 1 of the packet and at most 4 * (n + 2) / 3 + 3 of the row
    (quotes and comma), a NULL 1 and 5."""
    return length * 4 // 3 + 6 * columns + 8


def row_room(Py_ssize_t length, int columns):
    """The room encode_lines needs to take a row packet of ``length`` bytes (as the first
    row of its output)."""
    return _bound(length, columns) + _PREFIX_LEN + 3


cdef struct _Encoding:
    Py_ssize_t pos  # in the packets
    Py_ssize_t o  # in the output
    Py_ssize_t count  # rows encoded
    Py_ssize_t last  # where the last row starts in the output
    int in_line  # rows in the line being written (0: none open)


cdef int _encode(const unsigned char *p, Py_ssize_t end, int columns, int batch, char *w,
                 Py_ssize_t limit, _Encoding *e) nogil:
    """The whole row packets from p[e.pos] to p[end] into w[e.o:limit], as many as fit,
    the line left open: what it stopped at (S_NEED_MORE, S_END, S_ERROR, S_LONG,
    S_OUT_FULL), or -1 for a packet that does not hold its columns. Room for the open
    line's end (3 bytes) is always left."""
    cdef Py_ssize_t length, room, written, pos = e.pos
    while True:
        if end - pos < 4:
            e.pos = pos
            return S_NEED_MORE
        length = p[pos] | (p[pos + 1] << 8) | (p[pos + 2] << 16)
        if end - pos - 4 < length:
            e.pos = pos
            return S_NEED_MORE
        if length == 0xFFFFFF:
            e.pos = pos
            return S_LONG
        if length > 0 and ((p[pos + 4] == 0xFE and length < 9) or p[pos + 4] == 0xFF):
            e.pos = pos
            return S_END if p[pos + 4] == 0xFE else S_ERROR
        room = _bound(length, columns) + 3 + (_PREFIX_LEN if e.in_line == 0 else 1)
        if limit - e.o < room:
            e.pos = pos
            return S_OUT_FULL
        if e.in_line == 0:
            memcpy(w + e.o, _PREFIX, _PREFIX_LEN)
            e.o += _PREFIX_LEN
        else:
            w[e.o] = 44
            e.o += 1
        written = _write_checked(p + pos + 4, length, columns, w + e.o)
        if written < 0:
            e.pos = pos
            return -1
        e.last = e.o
        e.o += written
        e.count += 1
        e.in_line += 1
        pos += 4 + length
        if e.in_line == batch:
            memcpy(w + e.o, _SUFFIX, 3)
            e.o += 3
            e.in_line = 0


cdef inline void _close_line(char *w, _Encoding *e) nogil:
    if e.in_line:
        memcpy(w + e.o, _SUFFIX, 3)
        e.o += 3
        e.in_line = 0


def encode_lines(const unsigned char[:] buf, Py_ssize_t pos, Py_ssize_t end, int columns,
                 int batch, unsigned char[:] out, Py_ssize_t at, Py_ssize_t limit):
    """The whole row packets in ``buf[pos:end]`` as insert lines of a dump (as parse_lines),
    encoded into ``out[at:limit]`` in one pass without the GIL, as many as fit: returns
    (what it stopped at: NEED_MORE, END, ERROR, LONG or OUT_FULL, the next row not fitting;
    the position reached in ``buf``; the end of what it wrote in ``out``; the rows; the
    offset in ``out`` of the last row, which ends 3 bytes before that end). A row that
    does not fit in an empty output needs ``row_room`` of it."""
    cdef _Encoding e
    cdef int state
    if end > buf.shape[0] or pos < 0 or pos > end:
        raise ValueError("encode_lines: a position outside the buffer")
    if limit > out.shape[0] or at < 0 or at > limit:
        raise ValueError("encode_lines: a position outside the output")
    if end == 0 or batch < 1:
        return S_NEED_MORE, pos, at, 0, at
    if out.shape[0] == 0:
        raise ValueError("encode_lines: no output buffer")
    e.pos, e.o, e.count, e.last, e.in_line = pos, at, 0, at, 0
    with nogil:
        state = _encode(&buf[0], end, columns, batch, <char *>&out[0], limit, &e)
        _close_line(<char *>&out[0], &e)
    if state < 0:
        raise ValueError(f"a result row does not hold its {columns} columns")
    return state, e.pos, e.o, e.count, e.last


CLOSED = 6  # receive_lines: the connection was closed
RECV_FAILED = 7  # receive_lines: recv() failed (the errno is returned)


def receive_lines(int fd, unsigned char[:] buf, Py_ssize_t pos, Py_ssize_t end, int columns,
                  int batch, unsigned char[:] out, Py_ssize_t at, Py_ssize_t limit,
                  Py_ssize_t want):
    """encode_lines, receiving more packets from ``fd`` (a blocking socket) into ``buf`` as
    the ones it holds are encoded, all without the GIL, until ``want`` bytes were written
    to ``out`` (or the result ends, a row does not fit, a packet needs Python: a LONG one,
    or one longer than ``buf``, which comes back as NEED_MORE with ``buf`` full). What is
    left unparsed in ``buf`` is moved to its front before each receive. Returns (what it
    stopped at: as encode_lines, or CLOSED, or RECV_FAILED; the position reached in
    ``buf``; the end of its data; the end of what it wrote in ``out``; the rows; the offset
    of the last row in ``out``; the errno of a failed receive, 0 else). Lines run across
    receives, up to ``batch`` rows."""
    cdef _Encoding e
    cdef int state = S_NEED_MORE, err = 0
    cdef Py_ssize_t cap = buf.shape[0], got
    cdef unsigned char *p
    cdef char *w
    if end > cap or pos < 0 or pos > end or cap == 0:
        raise ValueError("receive_lines: a position outside the buffer")
    if limit > out.shape[0] or at < 0 or at > limit or out.shape[0] == 0:
        raise ValueError("receive_lines: a position outside the output")
    if batch < 1:
        raise ValueError("receive_lines: batch must be positive")
    p = &buf[0]
    w = <char *>&out[0]
    e.pos, e.o, e.count, e.last, e.in_line = pos, at, 0, at, 0
    with nogil:
        while True:
            state = _encode(p, end, columns, batch, w, limit, &e)
            if state != S_NEED_MORE or e.o - at >= want:
                break
            if e.pos:
                memmove(p, p + e.pos, end - e.pos)
                end -= e.pos
                e.pos = 0
            if end == cap:  # a packet longer than the buffer
                break
            got = recv(fd, p + end, cap - end, 0)
            if got > 0:
                end += got
                continue
            if got == 0:
                state = S_CLOSED
            elif errno == EINTR:  # Python's signal handlers run before the next call
                pass
            else:
                state = S_RECV_FAILED
                err = errno
            break
        _close_line(w, &e)
    if state < 0:
        raise ValueError(f"a result row does not hold its {columns} columns")
    return state, e.pos, end, e.o, e.count, e.last, err
