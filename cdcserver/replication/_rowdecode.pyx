# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Row images to tuples of Python values in C: what the decoder ``rowcodec.py`` generates
in Python for a table layout, read by a loop over per-column operations instead of Python
statements. ``rowcodec.c_decoder`` builds the operations; a column it has none for keeps the
layout on the Python decoder. Values that need more than the common case (a zero or invalid
date, a DECIMAL, a SET, a TIME, MariaDB's INET6) go to the column's Python function, given
the value's bytes, so every value is the one the Python decoder makes
(tests/unit/test_rowdecode.py compares the two on random and malformed images)."""

from cpython.datetime cimport (
    import_datetime,
    date_new,
    datetime_new,
)
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.float cimport PyFloat_FromDouble
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLongLong
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcpy, memset

from mariadb_cdc_client.format._cvalues cimport be as _be, civil as _civil, frac_micros as _frac_micros, le as _le
from mariadb_cdc_client.format._cvalues cimport valid_date as _valid_date

import_datetime()

cdef extern from "Python.h":
    object PyUnicode_Decode(const char *s, Py_ssize_t size, const char *encoding,
                            const char *errors)
    object PyObject_CallOneArg(object callable, object arg)

# Column operations (rowcodec.c_decoder names them; keep in step).
cdef enum:
    R_INT = 1          # size bytes little-endian; arg: 1 unsigned, 0 signed
    R_FLOAT = 2        # 4-byte float
    R_DOUBLE = 3       # 8-byte double
    R_YEAR = 4         # 1 byte: 1900 + it, 0 for 0
    R_FIXED_CALL = 5   # size bytes to arg(raw)
    R_TEXT = 6         # a length of size bytes, then the data; arg: codec name or None
    R_LEN_CALL = 7     # a length of size bytes, then arg(data)
    R_CHAR = 8         # as R_TEXT without codec, NUL-padded to arg[0]; arg[1](it) if set
    R_ENUM = 9         # size bytes: the label's number in arg (0 or out of range: "")
    R_DATE = 10        # 3 bytes; arg: the Python function of the raw bytes
    R_DATETIME2 = 11   # size bytes; arg: (fsp, the Python function)
    R_TIMESTAMP2 = 12  # size bytes; arg: (fsp, UTC, the Python function)
    R_NONE = 13        # no bytes: None



cdef struct Column:
    int op
    int size  # fixed size, or the length prefix's size
    int arg  # R_INT: unsigned; R_FLOAT/...: unused; R_CHAR: max length; R_*2: fsp
    bint nullable
    bint utf8  # R_TEXT: the codec is UTF-8


cdef class RowsDecoder:
    """``decoder(buf, pos, end) -> [tuple, ...]``: every row image in ``buf[pos:end]``."""

    cdef Column *columns
    cdef int width
    cdef tuple args  # per column: its Python argument (codec name, function, labels...)
    cdef list codecs  # per column: the codec name as bytes (kept alive for R_TEXT)
    cdef object utc

    def __cinit__(self, tuple ops, object utc):
        """``ops``: per present column, (op, size, arg, nullable) as rowcodec makes them."""
        cdef int i
        self.width = len(ops)
        self.columns = <Column *>PyMem_Malloc(max(self.width, 1) * sizeof(Column))
        if self.columns == NULL:
            raise MemoryError()
        memset(self.columns, 0, max(self.width, 1) * sizeof(Column))
        self.utc = utc
        args, codecs = [], []
        for i in range(self.width):
            op, size, arg, nullable = ops[i]
            self.columns[i].op = op
            self.columns[i].size = size
            self.columns[i].nullable = nullable
            codec = None
            if op == R_INT:
                self.columns[i].arg = 1 if arg else 0
            elif op == R_TEXT and arg is not None:
                codec = arg.encode("ascii")
                self.columns[i].utf8 = arg.lower().replace("_", "-") in ("utf-8", "utf8")
            elif op == R_CHAR:
                self.columns[i].arg = arg[0]
            elif op in (R_DATETIME2, R_TIMESTAMP2):
                self.columns[i].arg = arg[0]
            args.append(arg)
            codecs.append(codec)
        self.args = tuple(args)
        self.codecs = codecs

    def __dealloc__(self):
        PyMem_Free(self.columns)

    def __call__(self, const uint8_t[::1] buf, Py_ssize_t pos, Py_ssize_t end):
        cdef const uint8_t *p = &buf[0] if buf.shape[0] else NULL
        cdef Py_ssize_t nbytes = (self.width + 7) // 8
        cdef Py_ssize_t limit = buf.shape[0]
        cdef int i
        cdef list rows = []
        cdef const uint8_t *nulls
        cdef Column *c
        cdef bint null
        if end > limit or pos < 0:
            raise ValueError(f"row data ends at {end}, past the event's {limit} bytes")
        while pos < end:
            if pos + nbytes > end:
                raise ValueError(f"row data ends at {pos + nbytes}, event at {end}")
            nulls = p + pos
            pos += nbytes
            row = PyTuple_New(self.width)
            for i in range(self.width):
                c = &self.columns[i]
                null = c.nullable and (nulls[i >> 3] >> (i & 7)) & 1
                if null or c.op == R_NONE:
                    value = None
                else:
                    value = self._value(c, i, p, &pos, end)
                Py_INCREF(value)
                PyTuple_SET_ITEM(row, i, value)
            rows.append(row)
        if pos != end:
            raise ValueError(f"row data ends at {pos}, event at {end}")
        return rows

    cdef object _value(self, Column *c, int i, const uint8_t *p, Py_ssize_t *at,
                       Py_ssize_t end):
        cdef Py_ssize_t pos = at[0], n
        cdef int op = c.op, size = c.size
        cdef uint64_t u
        cdef int64_t s, packed, ymd, hms, year_month, seconds, micros, days
        cdef int64_t year, month, day, hour, minute, second
        cdef float f32
        cdef double f64
        if op == R_TEXT or op == R_LEN_CALL or op == R_CHAR:
            if pos + size > end:
                raise ValueError(f"a value's length runs past the row data at {end}")
            n = <Py_ssize_t>_le(p + pos, size)
            pos += size
            if n > end - pos:
                raise ValueError(f"a value of {n} bytes runs past the row data at {end}")
            at[0] = pos + n
            if op == R_TEXT:
                if self.codecs[i] is None:
                    return PyBytes_FromStringAndSize(<const char *>(p + pos), n)
                if c.utf8:
                    return PyUnicode_DecodeUTF8(<const char *>(p + pos), n, "strict")
                return PyUnicode_Decode(<const char *>(p + pos), n,
                                        <const char *>(<bytes>self.codecs[i]), "strict")
            if op == R_LEN_CALL:
                return PyObject_CallOneArg(self.args[i],
                                           PyBytes_FromStringAndSize(<const char *>(p + pos), n))
            return self._char(c, i, p + pos, n)
        if pos + size > end:
            raise ValueError(f"a value of {size} bytes runs past the row data at {end}")
        at[0] = pos + size
        p = p + pos
        if op == R_INT:
            u = _le(p, size)
            if c.arg:
                return PyLong_FromUnsignedLongLong(u)
            s = <int64_t>u
            if size < 8 and u >> (8 * size - 1):  # negative
                s -= (<int64_t>1) << (8 * size)
            return PyLong_FromLongLong(s)
        if op == R_DOUBLE:
            memcpy(&f64, p, 8)
            return PyFloat_FromDouble(f64)
        if op == R_FLOAT:
            memcpy(&f32, p, 4)
            return PyFloat_FromDouble(<double>f32)
        if op == R_YEAR:
            return p[0] + 1900 if p[0] else 0
        if op == R_ENUM:
            u = _le(p, size)
            labels = <tuple>self.args[i]
            return labels[u - 1] if 0 < u <= <uint64_t>len(labels) else ""
        if op == R_DATE:
            u = _le(p, 3)
            day, month, year = u & 31, (u >> 5) & 15, u >> 9
            if _valid_date(year, month, day):
                return date_new(year, month, day)
        elif op == R_DATETIME2:
            packed = <int64_t>_be(p, 5) - 0x8000000000
            micros = _frac_micros(p + 5, c.arg)
            ymd, hms = packed >> 17, packed & 0x1FFFF
            year_month, day = ymd >> 5, ymd & 31
            year, month = year_month // 13, year_month % 13
            hour, minute, second = hms >> 12, (hms >> 6) & 63, hms & 63
            if packed >= 0 and _valid_date(year, month, day) and hour <= 23 \
                    and minute <= 59 and second <= 59 and 0 <= micros < 1000000:
                return datetime_new(year, month, day, hour, minute, second, micros, None)
        elif op == R_TIMESTAMP2:
            seconds = <int64_t>_be(p, 4)
            micros = _frac_micros(p + 4, c.arg)
            if seconds and 0 <= micros < 1000000:
                days, seconds = seconds // 86400, seconds % 86400
                _civil(days, &year, &month, &day)
                return datetime_new(year, month, day, seconds // 3600, seconds // 60 % 60,
                                    seconds % 60, micros, self.utc)
        # R_FIXED_CALL, and what the fast paths above leave: the Python function
        return PyObject_CallOneArg(self._function(op, i),
                                   PyBytes_FromStringAndSize(<const char *>p, size))

    cdef object _function(self, int op, int i):
        arg = self.args[i]
        if op == R_DATETIME2:
            return arg[1]
        if op == R_TIMESTAMP2:
            return arg[2]
        return arg

    cdef object _char(self, Column *c, int i, const uint8_t *data, Py_ssize_t n):
        """CHAR/BINARY: the bytes NUL-padded to the column's length (bytes.ljust)."""
        cdef Py_ssize_t width = c.arg if c.arg > n else n
        value = PyBytes_FromStringAndSize(NULL, width)
        memcpy(<char *>(<bytes>value), data, n)
        memset(<char *>(<bytes>value) + n, 0, width - n)
        function = self.args[i][1]
        return value if function is None else PyObject_CallOneArg(function, value)
