# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A dump's operation lines straight into ``DumpRows``, in C.

``OperationDecoder.parse`` reads one line as the service writes it
(``{"action":"insert","rows":[["MQ==",null,...],...]}``), decodes each base64 value where it
stands and makes the column's value with the C API: ints, floats (read exactly, as strtod
reads them; FLOAT through a C float), ``bool``, ``str``, ``bytes``, ``date`` / ``datetime``
(naive, or aware in UTC), MariaDB's zero dates as their text, ``Decimal`` (made from its digits
as _decimal makes it); then each row's dict, a copy of one holding every column name with
None (the NULLs need nothing more). These are the objects the Python path (``json.loads``,
``binascii.a2b_base64``, then ``dump.value_decoder`` per column) makes of the same line.

A value in a form the fast paths do not read (``1e5`` for an INT, a ``T`` in a DATETIME, a
TIME, a UUID) is made by the column's Python decoder, as the Python path would make it.
Wherever the line could come out otherwise (JSON escapes or keys out of order, base64 that is
not canonical, a row of the wrong width, invalid UTF-8, a value its Python decoder refuses)
``parse`` returns None, and the caller parses the line in Python instead, which then gives its
rows or raises its error as before. ``tests/unit/test_dump_rows_decoder.py`` compares the two
on every type a dump holds.
"""

from cpython.datetime cimport date_new, datetime_new, import_datetime
from cpython.object cimport PyObject
from libc.math cimport isinf
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy

from mariadb_cdc_client.format._cavro cimport ascii_only, utf8_sequences_valid, utf8_valid
from mariadb_cdc_client.format cimport _cdecimal
from mariadb_cdc_client.format._ctext cimport date_text as _date, datetime_text as _datetime

import datetime
from decimal import Decimal

import_datetime()

cdef extern from *:
    """
    typedef unsigned __int128 dr_uint128;
    static inline int dr_leading_zeros(uint64_t w) { return __builtin_clzll(w); }
    """
    ctypedef unsigned long long dr_uint128
    int leading_zeros "dr_leading_zeros"(uint64_t w) noexcept

cdef extern from "Python.h":
    bint PyBytes_CheckExact(object o)
    char *PyBytes_AS_STRING(object o)
    Py_ssize_t PyBytes_GET_SIZE(object o)
    object PyBytes_FromStringAndSize(const char *s, Py_ssize_t size)
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void *PyUnicode_DATA(object o)
    object PyUnicode_DecodeASCII(const char *s, Py_ssize_t size, const char *errors)
    object PyLong_FromLongLong(long long v)
    object PyLong_FromString(const char *s, char **pend, int base)
    object PyFloat_FromDouble(double v)
    object PyDict_Copy(object d)
    int PyDict_SetItem(object d, object key, object value) except -1
    int PyList_Append(object l, object item) except -1

# Column operations (dump.py names them; keep in step).
cdef enum:
    D_INT = 1        # INT, LONG: int of the digits
    D_DECIMAL = 2    # Decimal of the text
    D_DOUBLE = 3     # float of the text
    D_FLOAT = 4      # float of the text, rounded to 32 bits
    D_BOOLEAN = 5    # anything but "0" is True
    D_STRING = 6     # the UTF-8 text (STRING, ENUM, NULL)
    D_BYTES = 7      # the bytes themselves
    D_DATE = 8       # date, or a zero date's text
    D_DATETIME = 9   # naive datetime, or a zero date's text
    D_TIMESTAMP = 10 # datetime in UTC, or a zero date's text
    D_CALL = 11      # the column's Python decoder (TIME, UUID)

cdef object FALLBACK = object()  # a value only the Python path may make: the line is its
cdef object UTC = datetime.timezone.utc
cdef object DECIMAL = Decimal

cdef uint8_t[256] BASE64  # a character's six bits; 64 for '=', 255 outside the alphabet
# A character's six bits already where they go in a quad's 24 (first character's highest),
# or bit 24 for anything but the 64 characters: a quad is four lookups ORed, checked once.
cdef uint32_t[256] QUAD0, QUAD1, QUAD2, QUAD3
cdef uint32_t NOT_BASE64 = 1 << 24


cdef void _fill_base64_table() noexcept:
    cdef int k
    cdef const char *alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    for k in range(256):
        BASE64[k] = 255
        QUAD0[k] = QUAD1[k] = QUAD2[k] = QUAD3[k] = NOT_BASE64
    for k in range(64):
        BASE64[<uint8_t>alphabet[k]] = k
        QUAD0[<uint8_t>alphabet[k]] = <uint32_t>k << 18
        QUAD1[<uint8_t>alphabet[k]] = <uint32_t>k << 12
        QUAD2[<uint8_t>alphabet[k]] = <uint32_t>k << 6
        QUAD3[<uint8_t>alphabet[k]] = <uint32_t>k
    BASE64[61] = 64  # '='


_fill_base64_table()


cdef struct Column:
    int op
    PyObject *name     # the row dict's key (the column's name)
    PyObject *decode   # the Python decoder (value_decoder) of the column


# -- the line's JSON ---------------------------------------------------------------------

cdef inline Py_ssize_t _space(const uint8_t *p, Py_ssize_t i, Py_ssize_t end) noexcept:
    """Past JSON's whitespace (the service writes none; json.loads would skip it)."""
    while i < end and (p[i] == 32 or p[i] == 9 or p[i] == 13 or p[i] == 10):
        i += 1
    return i


cdef inline Py_ssize_t _expect(const uint8_t *p, Py_ssize_t i, Py_ssize_t end,
                               const char *text, Py_ssize_t size) noexcept:
    """Past ``text`` (after any whitespace), or -1."""
    if i < 0:
        return -1
    i = _space(p, i, end)
    if end - i < size or memcmp(p + i, text, size) != 0:
        return -1
    return i + size


cdef Py_ssize_t _base64(const uint8_t *p, Py_ssize_t i, Py_ssize_t end, uint8_t *out,
                        Py_ssize_t *size) noexcept:
    """The base64 string from ``i`` (past its opening quote) into ``out``, its length in
    ``size``: past its closing quote, or -1 unless it is canonical (whole quads, padding only
    at the end), which ``a2b_base64`` reads the same way. Leftover bits of a padded quad are
    dropped, as a2b_base64 drops them."""
    cdef Py_ssize_t n = 0
    cdef uint8_t a, b, c
    cdef uint32_t quad, quad2
    while end - i >= 8:  # two quads a time: the usual value has several
        quad = QUAD0[p[i]] | QUAD1[p[i + 1]] | QUAD2[p[i + 2]] | QUAD3[p[i + 3]]
        quad2 = QUAD0[p[i + 4]] | QUAD1[p[i + 5]] | QUAD2[p[i + 6]] | QUAD3[p[i + 7]]
        if (quad | quad2) & NOT_BASE64:
            break
        out[n] = <uint8_t>(quad >> 16)
        out[n + 1] = <uint8_t>(quad >> 8)
        out[n + 2] = <uint8_t>quad
        out[n + 3] = <uint8_t>(quad2 >> 16)
        out[n + 4] = <uint8_t>(quad2 >> 8)
        out[n + 5] = <uint8_t>quad2
        n += 6
        i += 8
    while end - i >= 4:
        quad = QUAD0[p[i]] | QUAD1[p[i + 1]] | QUAD2[p[i + 2]] | QUAD3[p[i + 3]]
        if quad & NOT_BASE64:
            break
        out[n] = <uint8_t>(quad >> 16)
        out[n + 1] = <uint8_t>(quad >> 8)
        out[n + 2] = <uint8_t>quad
        n += 3
        i += 4
    if i < end and p[i] == 34:  # '"'
        size[0] = n
        return i + 1
    if end - i < 5 or p[i + 3] != 61 or p[i + 4] != 34:  # a padded quad, then '"'
        return -1
    a = BASE64[p[i]]
    b = BASE64[p[i + 1]]
    c = BASE64[p[i + 2]]
    if a >= 64 or b >= 64 or c == 255:
        return -1
    out[n] = <uint8_t>((a << 2) | (b >> 4))
    n += 1
    if c != 64:  # 'xyz=': two bytes
        out[n] = <uint8_t>((b << 4) | (c >> 2))
        n += 1
    size[0] = n
    return i + 5


cdef object _action(const uint8_t *p, Py_ssize_t n):
    """The action's text: the usual ones shared, anything else as json.loads reads it."""
    if n == 6 and memcmp(p, b"insert", 6) == 0:
        return "insert"
    if n == 6 and memcmp(p, b"update", 6) == 0:
        return "update"
    if n == 6 and memcmp(p, b"delete", 6) == 0:
        return "delete"
    if not utf8_valid(p, n):
        return FALLBACK
    return PyUnicode_DecodeUTF8(<const char *>p, n, NULL)


# -- values ------------------------------------------------------------------------------

cdef inline bint _digits(const uint8_t *p, Py_ssize_t n) noexcept:
    """One or more ASCII digits, nothing else."""
    cdef Py_ssize_t i
    if n < 1:
        return False
    for i in range(n):
        if not 48 <= p[i] <= 57:
            return False
    return True


cdef object _int(const uint8_t *p, Py_ssize_t n):
    """``int(raw)`` of ``-?[0-9]+``; None for other text (``+1``, ``1_0``, spaces)."""
    cdef Py_ssize_t i, start = 1 if n > 0 and p[0] == 45 else 0  # '-'
    cdef int64_t v = 0
    if not _digits(p + start, n - start):
        return None
    if n - start > 18:  # maybe beyond int64: p is NUL-terminated. Below 640 digits no
        # limit of int's string conversion (sys.set_int_max_str_digits) can refuse it
        return PyLong_FromString(<const char *>p, NULL, 10) if n - start < 640 else None
    for i in range(start, n):
        v = v * 10 + (p[i] - 48)
    return PyLong_FromLongLong(-v if start else v)


cdef object _float(const uint8_t *p, Py_ssize_t n, bint single):
    """``float(raw)`` (``single``: then through struct's ``<f``) of a number as MariaDB prints
    one, ``-?[0-9]+(\\.[0-9]+)?([eE][+-]?[0-9]+)?`` of up to 19 significant digits; None for
    any other text (``inf``, spaces, more digits, a result past the normal doubles), or a
    FLOAT struct would refuse (too large)."""
    cdef uint64_t w
    cdef int64_t q
    cdef double d
    cdef float f
    if not _float_parts(p, n, &w, &q) or not _eisel_lemire(w, q, p[0] == 45, &d):
        return None
    if not single:
        return PyFloat_FromDouble(d)
    f = <float>d
    if isinf(f):
        return None  # struct.pack raises OverflowError: as Python has it
    return PyFloat_FromDouble(<double>f)


cdef bint _float_parts(const uint8_t *p, Py_ssize_t n, uint64_t *w, int64_t *q) noexcept:
    """The text as ``w * 10 ** q``: False unless it has MariaDB's form and ``w`` takes every
    significant digit."""
    cdef Py_ssize_t i = 1 if n > 0 and p[0] == 45 else 0, start, significant = 0, fraction = 0
    cdef int exponent = 0, exponent_digits = 0
    cdef bint negative_exponent = False
    w[0] = 0
    start = i
    while i < n and 48 <= p[i] <= 57:
        if significant or p[i] != 48:
            significant += 1
            w[0] = w[0] * 10 + (p[i] - 48)
        i += 1
    if i == start:
        return False
    if i < n and p[i] == 46:  # '.'
        i += 1
        start = i
        while i < n and 48 <= p[i] <= 57:
            if significant or p[i] != 48:
                significant += 1
                w[0] = w[0] * 10 + (p[i] - 48)
            i += 1
        fraction = i - start
        if fraction == 0:
            return False
    if i < n and (p[i] == 101 or p[i] == 69):  # 'e', 'E'
        i += 1
        if i < n and (p[i] == 43 or p[i] == 45):
            negative_exponent = p[i] == 45
            i += 1
        while i < n and 48 <= p[i] <= 57 and exponent_digits < 4:
            exponent = exponent * 10 + (p[i] - 48)
            exponent_digits += 1
            i += 1
        if exponent_digits == 0:
            return False
    q[0] = (-exponent if negative_exponent else exponent) - fraction
    return i == n and significant <= 19


# 5 ** q for q in [SMALLEST_POWER, LARGEST_POWER] (beyond them a double is 0 or infinite), as
# the Eisel-Lemire algorithm uses it: normalised to 128 bits, the high word first; rounded up
# for negative q (truncated at 128 bits below 5 ** -27), truncated for positive q.
cdef enum:
    SMALLEST_POWER = -342
    LARGEST_POWER = 308
cdef uint64_t[2 * 651] POWERS_OF_FIVE


def _powers_of_five():
    """The table's words, made at import with Python's exact integers."""
    words = []
    for q in range(SMALLEST_POWER, LARGEST_POWER + 1):
        power = 5 ** abs(q)
        if q < 0:
            z = (power - 1).bit_length()  # the least z with 2 ** z >= 5 ** -q
            c = 2 ** (z + 127 if q >= -27 else 2 * z + 128) // power + 1
        else:
            c = power
        c = c << (128 - c.bit_length()) if c.bit_length() < 128 else c >> (c.bit_length() - 128)
        words += [c >> 64, c & (2 ** 64 - 1)]
    return words


for _k, _word in enumerate(_powers_of_five()):
    POWERS_OF_FIVE[_k] = _word


cdef bint _eisel_lemire(uint64_t w, int64_t q, bint negative, double *value) noexcept:
    """The double nearest ``w * 10 ** q`` (ties to even), as strtod rounds it: the
    Eisel-Lemire algorithm (D. Lemire, "Number Parsing at a Gigabyte per Second", 2021,
    sections 5 and 6; as in Rust's core::num::dec2flt), for an exact ``w``. False where it
    cannot tell (a product it approximated too coarsely), for subnormal and infinite results,
    and beyond the table."""
    cdef uint64_t hi, lo, second, mantissa, bits
    cdef dr_uint128 product
    cdef int lz, upperbit, shift
    cdef int64_t power2, index
    if w == 0:
        bits = (<uint64_t>negative) << 63
        memcpy(value, &bits, 8)
        return True
    if q < SMALLEST_POWER or q > LARGEST_POWER:
        return False
    lz = leading_zeros(w)
    w <<= lz
    index = 2 * (q - SMALLEST_POWER)
    product = <dr_uint128>w * POWERS_OF_FIVE[index]
    lo = <uint64_t>product
    hi = <uint64_t>(product >> 64)
    if hi & 0x1FF == 0x1FF:  # the bits below the 55 that count are all ones: look further
        second = <uint64_t>((<dr_uint128>w * POWERS_OF_FIVE[index + 1]) >> 64)
        lo += second
        if second > lo:
            hi += 1
    if lo == 0xFFFFFFFFFFFFFFFF and not -27 <= q <= 55:
        return False
    upperbit = <int>(hi >> 63)
    shift = upperbit + 9  # 64 - 52 explicit mantissa bits - 3
    mantissa = hi >> shift
    power2 = (((q * (152170 + 65536)) >> 16) + 63) + upperbit - lz + 1023
    if power2 <= 0:
        return False  # subnormal
    if lo <= 1 and -4 <= q <= 23 and mantissa & 3 == 1 and (mantissa << shift) == hi:
        mantissa &= ~(<uint64_t>1)  # exactly halfway: to even
    mantissa += mantissa & 1
    mantissa >>= 1
    if mantissa >= (<uint64_t>2) << 52:
        mantissa = (<uint64_t>1) << 52
        power2 += 1
    mantissa &= ~((<uint64_t>1) << 52)
    if power2 >= 0x7FF:
        return False  # infinite
    bits = mantissa | (<uint64_t>power2 << 52) | ((<uint64_t>negative) << 63)
    memcpy(value, &bits, 8)
    return True


def _float_of(bytes text, bint single=False):
    """The float this module makes of a value's text, or None (for the tests)."""
    return _float(<const uint8_t *><char *>text, len(text), single)


cdef object _called(object decode, const uint8_t *p, Py_ssize_t n):
    """The Python decoder's value; an error it raises is the Python path's to raise."""
    try:
        return decode(PyBytes_FromStringAndSize(<const char *>p, n))
    except Exception:
        return FALLBACK


cdef object _value(Column *col, const uint8_t *p, Py_ssize_t n):
    """The column's value of its (NUL-terminated) decoded bytes; FALLBACK where only the
    Python path may say."""
    cdef int op = col.op
    cdef object value = None
    if op == D_STRING:
        return _text(p, n)
    if op == D_INT:
        value = _int(p, n)
    elif op == D_DECIMAL:
        return _decimal(p, n)
    elif op == D_DOUBLE or op == D_FLOAT:
        value = _float(p, n, op == D_FLOAT)
    elif op == D_DATETIME or op == D_TIMESTAMP:
        value = _datetime(p, n, UTC if op == D_TIMESTAMP else None)
    elif op == D_BYTES:
        return PyBytes_FromStringAndSize(<const char *>p, n)
    elif op == D_BOOLEAN:
        return not (n == 1 and p[0] == 48)
    elif op == D_DATE:
        value = _date(p, n)
    if value is None:
        return _called(<object>col.decode, p, n)
    return value


cdef object _text(const uint8_t *p, Py_ssize_t n):
    """``raw.decode("utf-8")``: ASCII (one pass over words tells) copied into its str as it
    is, anything else checked and decoded; FALLBACK for invalid UTF-8 (decode raises
    UnicodeDecodeError: as Python has it)."""
    cdef object text
    if ascii_only(p, n):
        text = PyUnicode_New(n, 127)
        if n:
            memcpy(PyUnicode_DATA(text), p, n)
        return text
    if not utf8_sequences_valid(p, n):
        return FALLBACK
    return PyUnicode_DecodeUTF8(<const char *>p, n, NULL)


# -- Decimal -----------------------------------------------------------------------------

cdef int WORD_DIGITS = 19  # libmpdec's word holds 19 decimal digits


cdef object _decimal(const uint8_t *p, Py_ssize_t n):
    """``Decimal(raw.decode("ascii"))``: made directly, as _decimal makes it from the text,
    for MariaDB's ``-?[0-9]+(\\.[0-9]+)?`` of up to 38 significant digits (where the layout
    is verified), otherwise by Decimal itself; the error it raises is the Python path's."""
    cdef int significant = 0
    cdef Py_ssize_t fraction = 0, i
    if DECIMALS_MADE_DIRECTLY and _decimal_shape(p, n, &significant, &fraction):
        return _made_decimal(p, n, significant, fraction)
    for i in range(n):
        if p[i] >= 0x80:
            return FALLBACK  # decode("ascii") raises: as Python has it
    try:
        return DECIMAL(PyUnicode_DecodeASCII(<const char *>p, n, NULL))
    except Exception:
        return FALLBACK


cdef bint _decimal_shape(const uint8_t *p, Py_ssize_t n, int *significant,
                         Py_ssize_t *fraction) noexcept:
    """Whether the text is ``-?[0-9]+(\\.[0-9]+)?`` of up to two words of digits (38) from
    the first that is not 0 (the coefficient's); those after the point in ``fraction`` (the
    exponent's)."""
    cdef Py_ssize_t i, point = -1, digits = 0
    for i in range(1 if n > 0 and p[0] == 45 else 0, n):
        if 48 <= p[i] <= 57:
            digits += 1
            if significant[0] or p[i] != 48:
                significant[0] += 1
                if significant[0] > 2 * WORD_DIGITS:
                    return False
        elif p[i] == 46 and point < 0 and digits > 0:  # '.'
            point = i
        else:
            return False
    if digits == 0 or point == n - 1:
        return False
    fraction[0] = n - 1 - point if point >= 0 else 0
    return True


cdef object _made_decimal(const uint8_t *p, Py_ssize_t n, int significant,
                          Py_ssize_t fraction):
    """The Decimal as _decimal itself makes one (PyDecType_New, then the coefficient in
    libmpdec's words of 19 digits, the lowest first), of text ``_decimal_shape`` took."""
    cdef uint64_t high = 0, low = 0
    cdef int k = 0
    cdef Py_ssize_t i
    for i in range(1 if p[0] == 45 else 0, n):
        if p[i] == 46 or (k == 0 and p[i] == 48):
            continue
        if k < significant - WORD_DIGITS:
            high = high * 10 + (p[i] - 48)
        else:
            low = low * 10 + (p[i] - 48)
        k += 1
    return _cdecimal.made(DECIMAL, low, high, significant if significant else 1, -fraction,
                          p[0] == 45)


# Decimals _decimal makes of text, whose memory must read as _made_decimal writes it: zeros
# with and without a sign or fraction, leading zeros, one word, two words, 38 digits.
_PROBES = ("0", "0.00", "-0.00", "-0", "7", "-12.50", "0.05", "007.50", "12345.67",
           "9999999999999999999", "-10000000000000000000", "18446744073709551615",
           "12345678901234567890123.45", "0.0000000000000000000000012",
           "-99999999999999999999999999999999999.999")


cdef bint _decimal_layout_matches(object text) except -1:
    """Whether a Decimal _decimal made of ``text`` reads as _cdecimal.made writes one, and
    the one made here is that Decimal, digit for digit."""
    cdef bytes encoded = text.encode()
    cdef int significant = 0
    cdef Py_ssize_t fraction = 0
    real = DECIMAL(text)
    if not _cdecimal.reads_as(real) or \
            not _decimal_shape(encoded, len(encoded), &significant, &fraction):
        return False
    made = _made_decimal(encoded, len(encoded), significant, fraction)
    return (type(made) is DECIMAL and made.as_tuple() == real.as_tuple() and str(made) == str(real)
            and made == real and hash(made) == hash(real))


cdef bint _decimals_verified():
    if not _cdecimal.layout_fits(DECIMAL):
        return False
    try:
        return all(_decimal_layout_matches(text) for text in _PROBES)
    except Exception:  # any doubt: Decimals of their text
        return False


cdef bint DECIMALS_MADE_DIRECTLY = _decimals_verified()


def decimals_made_directly():
    """Whether Decimals are made directly (the layout verified) or by Decimal of the text."""
    return DECIMALS_MADE_DIRECTLY


def _decimal_of(bytes text):
    """The Decimal this module makes of a value's text, or None (for the tests)."""
    value = _decimal(<const uint8_t *><char *>text, len(text))
    return None if value is FALLBACK else value


# -- the decoder -------------------------------------------------------------------------

cdef class OperationDecoder:
    """One dump's operation lines as ``DumpRows``, each line parsed in C, or None for a line
    left to the Python path."""

    cdef int ncolumns
    cdef Column *columns
    cdef list keep          # the names and decoders the columns point to
    cdef dict template      # every column name with None: each row starts as its copy
    cdef object rows_type   # DumpRows (passed in: dump.py imports this module)
    cdef uint8_t *scratch   # a value's decoded bytes, NUL-terminated
    cdef Py_ssize_t scratch_size
    cdef bint busy          # in parse (the scratch is in use)

    def __cinit__(self, list program, object rows_type):
        """``program``: per column (op, name, Python decoder), in the rows' order."""
        cdef int i
        self.rows_type = rows_type
        self.keep = []
        self.template = {}
        self.ncolumns = len(program)
        self.columns = <Column *>malloc((self.ncolumns + 1) * sizeof(Column))
        if self.columns == NULL:
            raise MemoryError()
        for i in range(self.ncolumns):
            op, name, decode = program[i]
            self.keep.append((name, decode))
            self.template[name] = None
            self.columns[i].op = op
            self.columns[i].name = <PyObject *>name
            self.columns[i].decode = <PyObject *>decode

    def __dealloc__(self):
        free(self.columns)
        free(self.scratch)

    def parse(self, object line):
        """The line's ``DumpRows``, or None for the Python path to parse it (also when
        another thread is in here: a Python decoder or Decimal may let it in)."""
        if not PyBytes_CheckExact(line) or self.busy:
            return None
        self._reserve(PyBytes_GET_SIZE(line))
        self.busy = True
        try:
            return self._operation(<const uint8_t *>PyBytes_AS_STRING(line),
                                   PyBytes_GET_SIZE(line))
        finally:
            self.busy = False

    cdef object _operation(self, const uint8_t *p, Py_ssize_t end):
        """``{"action":"...","rows":[...]}``, with any whitespace json.loads skips."""
        cdef Py_ssize_t i, start
        i = _expect(p, 0, end, b"{", 1)
        i = _expect(p, i, end, b'"action"', 8)
        i = _expect(p, i, end, b":", 1)
        i = _expect(p, i, end, b'"', 1)
        if i < 0:
            return None
        start = i
        while i < end and p[i] != 34 and p[i] != 92 and p[i] >= 32:  # to '"', no escapes
            i += 1
        if i >= end or p[i] != 34:
            return None
        action = _action(p + start, i - start)
        if action is FALLBACK:
            return None
        i = _expect(p, i + 1, end, b",", 1)
        i = _expect(p, i, end, b'"rows"', 6)
        i = _expect(p, i, end, b":", 1)
        rows = []
        i = self._rows(p, i, end, rows)
        i = _expect(p, i, end, b"}", 1)
        if i < 0 or _space(p, i, end) != end:
            return None
        return self.rows_type(action, rows)

    cdef int _reserve(self, Py_ssize_t size) except -1:
        """Room for any value of a line of ``size`` bytes (its base64 is longer)."""
        if size + 1 > self.scratch_size:
            free(self.scratch)
            self.scratch_size = size + 1 + (size >> 2)
            self.scratch = <uint8_t *>malloc(self.scratch_size)
            if self.scratch == NULL:
                self.scratch_size = 0
                raise MemoryError()
        return 0

    cdef Py_ssize_t _rows(self, const uint8_t *p, Py_ssize_t i, Py_ssize_t end,
                          list rows) except -2:
        """The ``[[...],...]`` at ``i`` into ``rows``: past it, or -1."""
        i = _expect(p, i, end, b"[", 1)
        if i < 0:
            return -1
        i = _space(p, i, end)
        if i < end and p[i] == 93:  # ']': no rows
            return i + 1
        while True:
            i = _expect(p, i, end, b"[", 1)
            if i < 0:
                return -1
            row = self._row(p, &i, end)
            if row is None:
                return -1
            PyList_Append(rows, row)
            i = _space(p, i, end)
            if i >= end:
                return -1
            if p[i] == 93:
                return i + 1
            if p[i] != 44:  # ','
                return -1
            i += 1

    cdef dict _row(self, const uint8_t *p, Py_ssize_t *at, Py_ssize_t end):
        """The row from ``at[0]`` (past its ``[``) to past its ``]``; None unless it is a
        value (base64 or null) per column."""
        cdef dict row = PyDict_Copy(self.template)
        cdef Py_ssize_t i = at[0], n = 0
        cdef int k
        cdef Column *col
        for k in range(self.ncolumns):
            i = _space(p, i, end)
            if k:
                if i >= end or p[i] != 44:  # ','
                    return None
                i = _space(p, i + 1, end)
            if i >= end:
                return None
            if p[i] == 34:  # '"'
                i = _base64(p, i + 1, end, self.scratch, &n)
                if i < 0:
                    return None
                self.scratch[n] = 0
                col = &self.columns[k]
                value = _value(col, self.scratch, n)
                if value is FALLBACK:
                    return None
                PyDict_SetItem(row, <object>col.name, value)
            elif end - i >= 4 and memcmp(p + i, b"null", 4) == 0:
                i += 4  # the template's None
            else:
                return None
        i = _expect(p, i, end, b"]", 1)
        if i < 0:
            return None
        at[0] = i
        return row
