# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The rows of a databus ``RowsEvent`` in C: ``["<base64>",null,...],[...]``, each value's
text as ``Databus.value_encoders`` gives it, base64-encoded, the rows joined with commas.

Ints, text, binary values, naive datetimes (fsp 0, 3 or 6), floats (``repr``) and Decimals
(``format(value, "f")``, read from ``_decimal``'s own object where ``_cdecimal.pxd``'s layout
was verified at import) are written here; any other value (an ENUM's index, a zero date held
as text, a Decimal of over 38 digits, ...) through its
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

from cpython.object cimport PyObject
from libc.stdint cimport uint64_t

from cdcserver cimport _cbase64
from cdcserver._cbuffer cimport Out, reserve as _reserve
from mariadb_cdc_client.format cimport _cdecimal

from decimal import Decimal

import_datetime()

cdef extern from "Python.h":
    object PyBytes_FromStringAndSize(const char *s, Py_ssize_t size)
    char *PyBytes_AS_STRING(object o)
    Py_ssize_t PyBytes_GET_SIZE(object o)
    const char *PyUnicode_AsUTF8AndSize(object o, Py_ssize_t *size) except NULL
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1
    char *PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int *ptype) except NULL
    int Py_DTSF_ADD_DOT_0
    void PyMem_Free(void *p)
    double PyFloat_AS_DOUBLE(object o)

cdef extern from *:
    """
    typedef unsigned __int128 db_uint128;
    """
    ctypedef unsigned long long db_uint128

# Column operations (databus.py names them; keep in step).
cdef enum:
    D_CALL = 0       # the column's Python encoder
    D_INT = 1        # an int: its digits
    D_TEXT = 2       # a str: its UTF-8
    D_BYTES = 3      # bytes as they are
    D_DATETIME0 = 4  # a naive datetime: YYYY-MM-DD HH:MM:SS
    D_DATETIME3 = 5  # ... .fff
    D_DATETIME6 = 6  # ... .ffffff
    D_DOUBLE = 7     # a float: its repr
    D_DECIMAL = 8    # a Decimal: format(value, "f")

DECIMAL = Decimal
cdef int DECIMAL_FLAGS = _cdecimal.MPD_STATIC | _cdecimal.MPD_STATIC_DATA | _cdecimal.MPD_NEG


cdef bint _decimals_readable():
    """Whether Decimals can be read in place (_cdecimal.pxd's layout, checked on Decimals
    ``_decimal`` made itself); else they go to their Python encoder."""
    if not _cdecimal.layout_fits(DECIMAL):
        return False
    try:
        for text in ("0.00", "-12.50", "7", "-9999999999999999999", "1E+3",
                     "12345678901234567890123.45", "-99999999999999999999999999999999999.999"):
            if not _cdecimal.reads_as(DECIMAL(text)):
                return False
    except Exception:  # noqa: BLE001 - any doubt: the Python path
        return False
    return True


cdef bint DECIMALS_READABLE = _decimals_readable()

_cbase64.init()


def simd(enabled=None):
    """Whether long values are encoded with AVX2 (``enabled``: turn it on or off, for
    tests; on only where the CPU has it)."""
    return bool(_cbase64.simd(-1 if enabled is None else 1 if enabled else 0))


cdef int _base64(Out *out, const unsigned char *src, Py_ssize_t n) except -1:
    """``"<base64 of src>"``."""
    _reserve(out, _cbase64.encoded_size(n) + 2)
    out.data[out.size] = 34
    out.size += 1 + _cbase64.encode(src, n, out.data + out.size + 1)
    out.data[out.size] = 34
    out.size += 1
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
    cdef char text[96]
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
    elif op == D_DOUBLE and type(value) is float:
        return _double(out, PyFloat_AS_DOUBLE(value))
    elif op == D_DECIMAL and type(value) is DECIMAL and DECIMALS_READABLE:
        if _decimal_text(value, text, &n):
            return _base64(out, <const unsigned char *>text, n)
    elif op >= D_DATETIME0 and op <= D_DATETIME6 and PyDateTime_CheckExact(value):
        if _datetime_text(value, op, text, &n):
            return _base64(out, <const unsigned char *>text, n)
    encoded = encoder(value)
    return _base64(out, <const unsigned char *>PyBytes_AS_STRING(encoded),
                   PyBytes_GET_SIZE(encoded))


cdef int _double(Out *out, double value) except -1:
    """``repr(value)``: the shortest text that reads back as the same double."""
    cdef char *text = PyOS_double_to_string(value, b"r", 0, Py_DTSF_ADD_DOT_0, NULL)
    cdef Py_ssize_t n = 0
    try:
        while text[n]:
            n += 1
        return _base64(out, <const unsigned char *>text, n)
    finally:
        PyMem_Free(text)


cdef bint _decimal_text(object value, char *text, Py_ssize_t *n) noexcept:
    """``format(value, "f")`` into ``text`` (64 bytes) for a finite Decimal of at most 38
    digits and an exponent from -38 to 0; False for any other (its Python encoder writes it)."""
    cdef _cdecimal.cdec_decimal *d = <_cdecimal.cdec_decimal *><PyObject *>value
    cdef db_uint128 u
    cdef char digits[40]
    cdef Py_ssize_t count = 0, at = 0, point, i
    if d.dec.flags & ~DECIMAL_FLAGS or d.dec.len > 2 or d.dec.len < 1 \
            or d.dec.exp > 0 or d.dec.exp < -38:
        return False
    u = d.dec.data[0]
    if d.dec.len == 2:
        u += <db_uint128>d.dec.data[1] * _cdecimal.DECIMAL_RADIX
    while True:  # the coefficient's digits, backwards
        digits[39 - count] = <char>(48 + <int>(u % 10))
        u //= 10
        count += 1
        if u == 0:
            break
    if count > 38:
        return False
    if d.dec.flags & _cdecimal.MPD_NEG:
        text[at] = 45
        at += 1
    point = count + d.dec.exp  # digits before the point (none: "0." and zeros first)
    if point <= 0:
        text[at] = 48
        text[at + 1] = 46
        at += 2
        for i in range(-point):
            text[at] = 48
            at += 1
        memcpy(text + at, digits + 40 - count, count)
        at += count
    else:
        memcpy(text + at, digits + 40 - count, point)
        at += point
        if point < count:
            text[at] = 46
            memcpy(text + at + 1, digits + 40 - count + point, count - point)
            at += 1 + count - point
    n[0] = at
    return True


cdef int _signed(Out *out, char *text, Py_ssize_t n, bint negative) except -1:
    """An int's digits (the last ``n`` bytes of ``text``), with its sign."""
    if negative:
        text[31 - n] = 45
        n += 1
    return _base64(out, <const unsigned char *>(text + 32 - n), n)


def rows_json(list rows, tuple ops, tuple encoders):
    """``[...],[...]``: each row (a tuple of values, one per column) as a JSON array of its
    values' base64, or null; None for a row of another width or a table of over 512
    columns (the Python path decides)."""
    cdef Out out
    cdef Py_ssize_t r, i, width = len(ops)
    cdef tuple row
    cdef int[512] codes
    if len(encoders) != width:
        raise ValueError("one encoder per column")
    if width > 512:
        return None  # a table this wide (MariaDB allows 4,096 columns): the Python path
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
