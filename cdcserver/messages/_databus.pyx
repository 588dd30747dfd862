# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The rows of a databus ``RowsEvent`` in C: ``["<base64>",null,...],[...]``, each value's
text as ``Databus.value_encoders`` gives it, base64-encoded, the rows joined with commas.

Ints, text, binary values and naive datetimes (fsp 0, 3 or 6) are written here; any other
value (a Decimal, a float, an ENUM's index, a zero date held as text, ...) through its
column's Python encoder, so every byte is the one ``Databus.row_event``'s Python path writes
(tests/unit/test_databus_rows.py compares the two).
"""

from cpython.datetime cimport (
    PyDateTime_CheckExact,
    datetime_tzinfo,
    import_datetime,
    PyDateTime_GET_YEAR, PyDateTime_GET_MONTH, PyDateTime_GET_DAY,
    PyDateTime_DATE_GET_HOUR, PyDateTime_DATE_GET_MINUTE, PyDateTime_DATE_GET_SECOND,
    PyDateTime_DATE_GET_MICROSECOND,
)
from libc.stdlib cimport free
from libc.string cimport memcpy

from cdcserver._cbuffer cimport Out, reserve as _reserve

import_datetime()

cdef extern from "Python.h":
    object PyBytes_FromStringAndSize(const char *s, Py_ssize_t size)
    char *PyBytes_AS_STRING(object o)
    Py_ssize_t PyBytes_GET_SIZE(object o)
    const char *PyUnicode_AsUTF8AndSize(object o, Py_ssize_t *size) except NULL
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1

# Column operations (databus.py names them; keep in step).
cdef enum:
    D_CALL = 0       # the column's Python encoder
    D_INT = 1        # an int: its digits
    D_TEXT = 2       # a str: its UTF-8
    D_BYTES = 3      # bytes as they are
    D_DATETIME0 = 4  # a naive datetime: YYYY-MM-DD HH:MM:SS
    D_DATETIME3 = 5  # ... .fff
    D_DATETIME6 = 6  # ... .ffffff

cdef const char *ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


cdef int _base64(Out *out, const unsigned char *src, Py_ssize_t n) except -1:
    """``"<base64 of src>"``."""
    cdef Py_ssize_t i = 0, o
    cdef unsigned int v
    _reserve(out, ((n + 2) // 3) * 4 + 2)
    o = out.size
    out.data[o] = 34
    o += 1
    while i + 3 <= n:
        v = (src[i] << 16) | (src[i + 1] << 8) | src[i + 2]
        out.data[o] = ALPHABET[(v >> 18) & 63]
        out.data[o + 1] = ALPHABET[(v >> 12) & 63]
        out.data[o + 2] = ALPHABET[(v >> 6) & 63]
        out.data[o + 3] = ALPHABET[v & 63]
        i += 3
        o += 4
    if n - i == 1:
        v = src[i] << 16
        out.data[o] = ALPHABET[(v >> 18) & 63]
        out.data[o + 1] = ALPHABET[(v >> 12) & 63]
        out.data[o + 2] = 61
        out.data[o + 3] = 61
        o += 4
    elif n - i == 2:
        v = (src[i] << 16) | (src[i + 1] << 8)
        out.data[o] = ALPHABET[(v >> 18) & 63]
        out.data[o + 1] = ALPHABET[(v >> 12) & 63]
        out.data[o + 2] = ALPHABET[(v >> 6) & 63]
        out.data[o + 3] = 61
        o += 4
    out.data[o] = 34
    out.size = o + 1
    return 0


cdef inline void _digits(char *at, int value, int width) noexcept:
    cdef int k
    for k in range(width - 1, -1, -1):
        at[k] = <char>(48 + value % 10)
        value //= 10


cdef bint _datetime_text(object value, int op, char *text, Py_ssize_t *n) except -1:
    """A naive datetime's text (``isoformat(" ", ...)``); False for one with a zone."""
    if datetime_tzinfo(value) is not None:
        return False
    _digits(text, PyDateTime_GET_YEAR(value), 4)
    text[4] = 45
    _digits(text + 5, PyDateTime_GET_MONTH(value), 2)
    text[7] = 45
    _digits(text + 8, PyDateTime_GET_DAY(value), 2)
    text[10] = 32
    _digits(text + 11, PyDateTime_DATE_GET_HOUR(value), 2)
    text[13] = 58
    _digits(text + 14, PyDateTime_DATE_GET_MINUTE(value), 2)
    text[16] = 58
    _digits(text + 17, PyDateTime_DATE_GET_SECOND(value), 2)
    n[0] = 19
    if op == D_DATETIME3:
        text[19] = 46
        _digits(text + 20, PyDateTime_DATE_GET_MICROSECOND(value) // 1000, 3)
        n[0] = 23
    elif op == D_DATETIME6:
        text[19] = 46
        _digits(text + 20, PyDateTime_DATE_GET_MICROSECOND(value), 6)
        n[0] = 26
    return True


cdef int _value(Out *out, int op, object value, object encoder) except -1:
    cdef char text[32]
    cdef Py_ssize_t n = 0
    cdef long long number
    cdef unsigned long long magnitude
    cdef int overflow = 0
    cdef const char *utf8
    cdef bint negative
    if op == D_INT and type(value) is int:
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow:
            negative = number < 0
            magnitude = <unsigned long long>(-(number + 1)) + 1 if negative else \
                <unsigned long long>number
            while True:  # digits backwards from the end of ``text``
                text[31 - n] = <char>(48 + magnitude % 10)
                magnitude //= 10
                n += 1
                if magnitude == 0:
                    break
            return _signed(out, text, n, negative)
    elif op == D_TEXT and type(value) is str:
        utf8 = PyUnicode_AsUTF8AndSize(value, &n)
        return _base64(out, <const unsigned char *>utf8, n)
    elif op == D_BYTES and type(value) is bytes:
        return _base64(out, <const unsigned char *>PyBytes_AS_STRING(value),
                       PyBytes_GET_SIZE(value))
    elif op >= D_DATETIME0 and PyDateTime_CheckExact(value):
        if _datetime_text(value, op, text, &n):
            return _base64(out, <const unsigned char *>text, n)
    encoded = encoder(value)
    return _base64(out, <const unsigned char *>PyBytes_AS_STRING(encoded),
                   PyBytes_GET_SIZE(encoded))


cdef int _signed(Out *out, char *text, Py_ssize_t n, bint negative) except -1:
    """An int's digits (the last ``n`` bytes of ``text``), with its sign."""
    if negative:
        text[31 - n] = 45
        n += 1
    return _base64(out, <const unsigned char *>(text + 32 - n), n)


def rows_json(list rows, tuple ops, tuple encoders):
    """``[...],[...]``: each row (a tuple of values, one per column) as a JSON array of its
    values' base64, or null; None for a row of another width (the Python path decides)."""
    cdef Out out
    cdef Py_ssize_t r, i, width = len(ops)
    cdef tuple row
    cdef int[512] codes
    if width > 512 or len(encoders) != width:
        raise ValueError("a row layout this encoder does not take")
    for i in range(width):
        codes[i] = ops[i]
    out.data = NULL
    out.size = out.capacity = 0
    try:
        for r in range(len(rows)):
            row = <tuple>rows[r]
            if len(row) != width:
                return None  # the Python path decides
            _reserve(&out, 2)
            if r:
                out.data[out.size] = 44
                out.size += 1
            out.data[out.size] = 91  # '['
            out.size += 1
            for i in range(width):
                if i:
                    _reserve(&out, 1)
                    out.data[out.size] = 44
                    out.size += 1
                value = row[i]
                if value is None:
                    _reserve(&out, 4)
                    memcpy(out.data + out.size, b"null", 4)
                    out.size += 4
                else:
                    _value(&out, codes[i], value, encoders[i])
            _reserve(&out, 1)
            out.data[out.size] = 93  # ']'
            out.size += 1
        return PyBytes_FromStringAndSize(out.data, out.size)
    finally:
        free(out.data)
