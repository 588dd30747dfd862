"""What the service's C extensions share: a growable output buffer (reading Avro and the
UTF-8 rule are the format's: ``client/format/_cavro.pxd``)."""

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
