"""What the C extensions share: a growable output buffer and Python's UTF-8 validity rule."""

from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport realloc
from libc.string cimport memcpy


cdef struct Out:
    char *data
    Py_ssize_t size
    Py_ssize_t capacity


cdef inline int reserve(Out *out, Py_ssize_t extra) except -1:
    """Room for ``extra`` more bytes (the buffer doubles; the caller frees ``data``)."""
    cdef Py_ssize_t want = out.size + extra
    cdef Py_ssize_t capacity
    cdef char *grown
    if want <= out.capacity:
        return 0
    capacity = out.capacity * 2 if out.capacity else 65536
    while capacity < want:
        capacity *= 2
    grown = <char *>realloc(out.data, capacity)
    if grown == NULL:
        raise MemoryError()
    out.data = grown
    out.capacity = capacity
    return 0


cdef inline bint utf8_valid(const uint8_t *p, Py_ssize_t n) noexcept:
    """Python's strict UTF-8 decoder accepts exactly these sequences (RFC 3629: no overlong
    forms, no surrogates, nothing above U+10FFFF)."""
    cdef Py_ssize_t i = 0
    cdef uint8_t c, c1
    cdef uint64_t word
    while i < n:
        if i + 8 <= n:  # eight ASCII bytes at a time: most text is mostly ASCII
            memcpy(&word, p + i, 8)
            if (word & <uint64_t>0x8080808080808080) == 0:
                i += 8
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
