# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A stream's Avro records straight into the library's typed ``ChangeRecord`` objects, in C.

``RecordDecoder.decode`` walks the records of one block with a program that ``stream.py``
builds from the table version's schema, and makes each value with the C API: ints, floats,
``str``, ``bytes``, ``Decimal`` (from its digits), ``date`` / ``datetime`` (naive, or aware in
UTC) / ``timedelta`` (from Avro's days and microseconds), enum symbols; then the record
itself, whose slots it fills directly (``ChangeRecord`` is a slotted dataclass). These are the
objects the Python path (fastavro, then ``from_avro_value`` and ``unsigned_metadata``) makes
from the same bytes.

Wherever that could differ (malformed data, invalid UTF-8, a date outside ``datetime``'s
years, a decimal with more digits than its precision, which fastavro would round) it returns
None, and the caller decodes the block in Python instead, which then gives its records or
raises its error as before. ``tests/unit/test_records_decoder.py`` compares the two on every
type the store writes.
"""

from cpython.datetime cimport date_new, datetime_new, import_datetime, timedelta_new
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from libc.math cimport HUGE_VAL, HUGE_VALF
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memchr, memcmp, memcpy

from mariadb_cdc_client.format._cavro cimport Cursor, read_long, take
from mariadb_cdc_client.format cimport _cdecimal, _ctext
from mariadb_cdc_client.format._cvalues cimport civil as _civil

import datetime
import sys

import_datetime()

cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member
    object PyType_GenericAlloc(PyTypeObject *type, Py_ssize_t nitems)
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)
    object PyUnicode_FromStringAndSize(const char *s, Py_ssize_t size)
    object PyBytes_FromStringAndSize(const char *s, Py_ssize_t size)
    char *PyBytes_AS_STRING(object o)
    object PyLong_FromLongLong(long long v)
    object PyLong_FromUnsignedLongLong(unsigned long long v)
    object PyFloat_FromDouble(double v)

cdef extern from *:
    """
    typedef __int128 rd_int128;
    typedef unsigned __int128 rd_uint128;
    """
    ctypedef long long rd_int128
    ctypedef unsigned long long rd_uint128

# Column operations (stream.py names them; keep in step).
cdef enum:
    R_INT = 1        # Avro int or long to int
    R_FLOAT = 2      # Avro float (32 bits) to float
    R_DOUBLE = 3     # Avro double to float
    R_BOOLEAN = 4    # Avro boolean to bool
    R_STRING = 5     # Avro string to str
    R_BYTES = 6      # Avro bytes to bytes
    R_ENUM = 7       # Avro enum to its symbol; extra: the symbols
    R_DECIMAL = 8    # Avro bytes decimal to Decimal; extra: (scale, precision)
    R_DATE = 9       # Avro int date to date
    R_DATETIME = 10  # Avro long local-timestamp-micros to a naive datetime
    R_TIMESTAMP = 11 # Avro long timestamp-micros to a datetime in UTC
    R_TIME = 12      # Avro long time-micros to timedelta
    R_UUID = 13      # Avro string uuid to uuid.UUID; extra: the UUID class
    R_NULL = 14      # the union ["null"]: every value None

# Union shapes (stream.py names them; keep in step).
cdef enum:
    PLAIN = 0        # not a union
    NULLABLE = 1     # ["null", T]
    WITH_TEXT = 2    # ["null", T, "string"]: the string branch holds MariaDB's own text

# The record's slots, in ChangeRecord's order (stream.py passes their names).
cdef enum:
    S_DATABASE, S_TABLE, S_VERSION, S_DOMAIN, S_SERVER_ID, S_SEQUENCE, S_EVENT_NUMBER, \
        S_TIMESTAMP, S_EVENT_TYPE, S_VALUES, S_REPAIR, NSLOTS

cdef extern from *:
    """
    /* constants the compiler divides by with a multiplication */
    #define RD_MICROS_PER_DAY 86400000000LL
    #define RD_MICROS_PER_HOUR 3600000000LL
    #define RD_MICROS_PER_MINUTE 60000000LL
    #define RD_MICROS_PER_SECOND 1000000LL
    #define RD_DAYS_0001_TO_1970 719162LL  /* date(1970, 1, 1).toordinal() - 1 */
    #define RD_DEC_RADIX 10000000000000000000ULL  /* libmpdec's word: 19 digits */
    """
    int64_t MICROS_PER_DAY "RD_MICROS_PER_DAY"
    int64_t MICROS_PER_HOUR "RD_MICROS_PER_HOUR"
    int64_t MICROS_PER_MINUTE "RD_MICROS_PER_MINUTE"
    int64_t MICROS_PER_SECOND "RD_MICROS_PER_SECOND"
    int64_t DAYS_0001_TO_1970 "RD_DAYS_0001_TO_1970"
    uint64_t DEC_RADIX "RD_DEC_RADIX"

cdef object FALLBACK = object()  # a value the Python path must make
cdef object UTC = datetime.timezone.utc
cdef bint LITTLE_ENDIAN = sys.byteorder == "little"


cdef struct Column:
    int op
    int shape
    int scale
    int precision
    PyObject *key      # the column's name in ``values``
    PyObject *extra    # R_ENUM: tuple of symbols; R_UUID: the class
    PyObject *text     # WITH_TEXT: called on the string branch's text, or NULL (kept as str)


cdef inline bint _days_in_range(int64_t days) noexcept:
    """``days`` after 1970-01-01 is a date of years 1 to 9999, which Python holds."""
    return -DAYS_0001_TO_1970 <= days <= 2932896


cdef object _date(int64_t days):
    cdef int64_t year, month, day
    if not _days_in_range(days):
        return FALLBACK
    _civil(days, &year, &month, &day)
    return date_new(<int>year, <int>month, <int>day)


cdef object _datetime(int64_t micros, object tz):
    """``epoch + timedelta(microseconds=micros)``, naive or in ``tz``."""
    cdef int64_t days = micros // MICROS_PER_DAY
    cdef int64_t rest, year, month, day
    if micros % MICROS_PER_DAY < 0:  # C division truncates; Python's floors
        days -= 1
    rest = micros - days * MICROS_PER_DAY
    if not _days_in_range(days):
        return FALLBACK
    _civil(days, &year, &month, &day)
    return datetime_new(<int>year, <int>month, <int>day, <int>(rest // MICROS_PER_HOUR),
                        <int>(rest // MICROS_PER_MINUTE % 60),
                        <int>(rest // MICROS_PER_SECOND % 60),
                        <int>(rest % MICROS_PER_SECOND), tz)


cdef uint64_t[20] POWERS_OF_TEN
POWERS_OF_TEN[0] = 1
for _i in range(1, 20):
    POWERS_OF_TEN[_i] = POWERS_OF_TEN[_i - 1] * 10


cdef inline int _digits(uint64_t word) noexcept:
    """How many decimal digits ``word`` has (1 for 0)."""
    cdef int n = 1
    while n < 20 and word >= POWERS_OF_TEN[n]:
        n += 1
    return n


cdef object _decimal(const uint8_t *p, Py_ssize_t n, int scale, int precision, object dec):
    """Avro's big-endian two's complement unscaled value as ``Decimal``: the same sign,
    digits and exponent as ``create_decimal(unscaled).scaleb(-scale)`` while the digits fit
    the precision (otherwise fastavro rounds: the Python path)."""
    cdef rd_uint128 u = 0
    cdef bint negative
    cdef Py_ssize_t k
    if n > 16:  # beyond 38 digits: DECIMAL(39..65, s)
        return _long_decimal(PyBytes_FromStringAndSize(<const char *>p, n), scale, precision,
                             dec)
    negative = n > 0 and p[0] & 0x80
    for k in range(n):
        u = (u << 8) | p[k]
    if negative:
        if n < 16:
            u |= (<rd_uint128>0 - 1) << (8 * n)  # sign extension
        u = (<rd_uint128>0) - u
    if scale < 0 or scale > 40:
        return FALLBACK
    if u >= (<rd_uint128>DEC_RADIX) * DEC_RADIX:  # 39 digits
        return _long_decimal(PyBytes_FromStringAndSize(<const char *>p, n), scale, precision,
                             dec)
    if DECIMAL_LAYOUT_VERIFIED and dec is DECIMAL:
        return _made_decimal(u, negative, scale, precision)
    return _decimal_from_text(u, negative, scale, precision, dec)


cdef object _made_decimal(rd_uint128 u, bint negative, int scale, int precision):
    """The Decimal of the unscaled value, made directly (``_cdecimal.made``)."""
    cdef uint64_t low = <uint64_t>(u % DEC_RADIX), high = <uint64_t>(u // DEC_RADIX)
    cdef int digits = _digits(low) if high == 0 else 19 + _digits(high)
    if digits > precision:
        return FALLBACK
    return _cdecimal.made(DECIMAL, low, high, digits, -scale, negative)


cdef object _decimal_from_text(rd_uint128 u, bint negative, int scale, int precision,
                               object dec):
    cdef char digits[48]
    cdef char text[56]
    cdef int ndigits = 0, length = 0, i
    while u:
        digits[ndigits] = <char>(48 + <int>(u % 10))
        u //= 10
        ndigits += 1
    if ndigits == 0:
        digits[0] = 48
        ndigits = 1
    if ndigits > precision:
        return FALLBACK
    if negative:
        text[length] = 45  # '-'
        length += 1
    if scale:
        while ndigits <= scale:  # at least one digit before the point
            digits[ndigits] = 48
            ndigits += 1
    for i in range(ndigits - 1, -1, -1):
        text[length] = digits[i]
        length += 1
        if i == scale and scale:
            text[length] = 46  # '.'
            length += 1
    return dec(PyUnicode_FromStringAndSize(text, length))


cdef object _long_decimal(bytes unscaled_bytes, int scale, int precision, object dec):
    unscaled = int.from_bytes(unscaled_bytes, "big", signed=True)
    digits = str(abs(unscaled))
    if len(digits) > precision or scale < 0:
        return FALLBACK
    if scale:
        digits = digits.rjust(scale + 1, "0")
        digits = digits[:-scale] + "." + digits[-scale:]
    return dec(("-" if unscaled < 0 else "") + digits)


DECIMAL = __import__("decimal").Decimal

# Decimals _decimal makes of text: zeros, one word, two words, 38 digits
_PROBES = ("0.00", "-12.50", "7", "-9999999999999999999", "12345678901234567890123.45",
           "-99999999999999999999999999999999999.999")


cdef bint _decimal_layout_verified():
    """Whether Decimals _decimal makes read as _cdecimal.made writes them (read, never
    written)."""
    if not _cdecimal.layout_fits(DECIMAL):
        return False
    for text in _PROBES:
        if not _cdecimal.reads_as(DECIMAL(text)):
            return False
    return True


cdef bint DECIMAL_LAYOUT_VERIFIED = _decimal_layout_verified()


def _decimals_made_here_equal_real_ones() -> bool:
    """For the tests (and a check at import): every probe made by _made_decimal is the real
    Decimal, digit for digit."""
    for text in _PROBES:
        real = DECIMAL(text)
        sign, coefficient, exponent = real.as_tuple()
        unscaled = int("".join(map(str, coefficient))) * (-1 if sign else 1)
        made = _decimal_of(unscaled, -exponent)
        if made is FALLBACK or made.as_tuple() != real.as_tuple() or str(made) != text \
                or hash(made) != hash(real) or made != real:
            return False
    return True


def _decimal_of(object unscaled, int scale):
    """The Decimal this module makes of an unscaled value (for the tests)."""
    cdef bytes data = unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)
    return _decimal(<const uint8_t *><char *>data, len(data), scale, 65, DECIMAL)


try:
    if DECIMAL_LAYOUT_VERIFIED and not _decimals_made_here_equal_real_ones():
        DECIMAL_LAYOUT_VERIFIED = False
except Exception:  # noqa: BLE001 - any doubt: Decimals from their text
    DECIMAL_LAYOUT_VERIFIED = False


def decimals_made_directly() -> bool:
    """Whether Decimals are made directly (the layout verified) or from their text."""
    return DECIMAL_LAYOUT_VERIFIED


cdef class RecordDecoder:
    """One table version's records, block by block, as ``ChangeRecord`` objects."""

    cdef int ncolumns
    cdef Column *columns
    cdef list keep          # the objects the columns point to
    cdef object record_class  # ChangeRecord
    cdef Py_ssize_t offsets[NSLOTS]
    cdef object database, table, version
    cdef tuple event_types
    cdef object decimal

    def __cinit__(self, type record, tuple slots, str database, str table, int version,
                  tuple event_types, list program, object decimal):
        """``slots``: ChangeRecord's slot names in field order; ``event_types``: the enum's
        symbols; ``program``: per column (op, union shape, column name, extra, text call,
        scale, precision), as stream.py builds it; ``decimal``: the Decimal class."""
        cdef int i
        if len(slots) != NSLOTS:
            raise ValueError("not a ChangeRecord layout this decoder knows")
        for i in range(NSLOTS):
            descriptor = record.__dict__[slots[i]]
            if type(descriptor).__name__ != "member_descriptor":
                raise ValueError(f"ChangeRecord.{slots[i]} is not a slot")
            self.offsets[i] = (<PyMemberDescrObject *>descriptor).d_member.offset
        self.record_class = record
        self.database, self.table, self.version = database, table, version
        self.event_types = event_types
        self.decimal = decimal
        self.keep = []
        self.ncolumns = len(program)
        self.columns = <Column *>calloc(self.ncolumns + 1, sizeof(Column))
        if self.columns == NULL:
            raise MemoryError()
        for i in range(self.ncolumns):
            op, shape, key, extra, text, scale, precision = program[i]
            self.keep.append((key, extra, text))
            self.columns[i].op = op
            self.columns[i].shape = shape
            self.columns[i].scale = scale
            self.columns[i].precision = precision
            self.columns[i].key = <PyObject *>key
            self.columns[i].extra = <PyObject *>extra
            self.columns[i].text = NULL if text is None else <PyObject *>text

    def __dealloc__(self):
        free(self.columns)

    def decode(self, const uint8_t[::1] data, Py_ssize_t count):
        """The ``count`` records at the start of ``data`` (a block's decoded bytes); None
        when the Python path must decode them."""
        cdef Cursor c
        cdef Py_ssize_t i
        if not LITTLE_ENDIAN:
            return None
        c.p = &data[0] if data.shape[0] else <const uint8_t *>b""
        c.pos = 0
        c.end = data.shape[0]
        c.bad = False
        records = []
        for i in range(count):
            record = self._record(&c)
            if record is None:
                return None
            records.append(record)
        return records

    cdef object _record(self, Cursor *c):
        cdef int64_t domain = read_long(c)
        cdef int64_t server_id = read_long(c)
        cdef int64_t sequence = read_long(c)
        cdef int64_t event_number = read_long(c)
        cdef int64_t timestamp = read_long(c)
        cdef int64_t event_type = read_long(c)
        cdef int i
        if c.bad or not 0 <= event_type < len(self.event_types):
            return None
        values = {}
        for i in range(self.ncolumns):
            value = self._field(&self.columns[i], c)
            if value is FALLBACK:
                return None
            values[<object>self.columns[i].key] = value
        if c.bad:
            return None
        return self._make(
            domain & 0xFFFFFFFF if domain < 0 else domain,
            server_id & 0xFFFFFFFF if server_id < 0 else server_id,
            PyLong_FromUnsignedLongLong(<uint64_t>sequence) if sequence < 0
            else PyLong_FromLongLong(sequence),
            event_number, timestamp, self.event_types[event_type], values)

    def record(self, object domain, object server_id, object sequence, object event_number,
               object timestamp, object event_type, object values, object repair):
        """A ChangeRecord of this version from values decoded elsewhere (JSON mode): the
        same object as ``ChangeRecord(...)``, made in a fraction of its __init__'s time."""
        return self._make(domain, server_id, sequence, event_number, timestamp, event_type,
                          values, repair)

    cdef object _make(self, object domain, object server_id, object sequence,
                      object event_number, object timestamp, object event_type,
                      object values, object repair=None):
        """A ChangeRecord, its slots filled as its __init__ would."""
        cdef PyObject *made
        record = PyType_GenericAlloc(<PyTypeObject *>self.record_class, 0)
        made = <PyObject *>record
        self._set(made, S_DATABASE, self.database)
        self._set(made, S_TABLE, self.table)
        self._set(made, S_VERSION, self.version)
        self._set(made, S_DOMAIN, domain)
        self._set(made, S_SERVER_ID, server_id)
        self._set(made, S_SEQUENCE, sequence)
        self._set(made, S_EVENT_NUMBER, event_number)
        self._set(made, S_TIMESTAMP, timestamp)
        self._set(made, S_EVENT_TYPE, event_type)
        self._set(made, S_VALUES, values)
        self._set(made, S_REPAIR, repair)
        return record

    cdef inline void _set(self, PyObject *made, int slot, object value) noexcept:
        Py_INCREF(value)
        (<PyObject **>((<char *>made) + self.offsets[slot]))[0] = <PyObject *>value

    cdef object _field(self, Column *col, Cursor *c):
        cdef int64_t branch
        if col.shape != PLAIN:
            branch = read_long(c)
            if c.bad:
                return FALLBACK
            if branch == 0:
                return None
            if branch == 2 and col.shape == WITH_TEXT:
                return self._text(col, c)
            if branch != 1:
                return FALLBACK
        return self._value(col, c)

    cdef object _text(self, Column *col, Cursor *c):
        """The string branch: MariaDB's own text of a zero date or a TIME out of range."""
        text = self._string(c)
        if text is FALLBACK or col.text == NULL:
            return text
        try:
            return (<object>col.text)(text)
        except Exception:  # noqa: BLE001 - the Python path raises it, after reading the record
            return FALLBACK

    cdef object _string(self, Cursor *c):
        cdef Py_ssize_t n = <Py_ssize_t>read_long(c)
        cdef const uint8_t *p = take(c, n)
        if c.bad:
            return FALLBACK
        try:
            return PyUnicode_DecodeUTF8(<const char *>p, n, NULL)
        except UnicodeDecodeError:
            return FALLBACK  # the Python path raises its own error

    cdef object _value(self, Column *col, Cursor *c):
        cdef int op = col.op
        cdef int64_t v
        cdef Py_ssize_t n
        cdef const uint8_t *p
        cdef float f
        cdef double d
        if op == R_INT:
            v = read_long(c)
            return FALLBACK if c.bad else PyLong_FromLongLong(v)
        if op == R_STRING:
            return self._string(c)
        if op == R_DECIMAL:
            n = <Py_ssize_t>read_long(c)
            p = take(c, n)
            if c.bad:
                return FALLBACK
            return _decimal(p, n, col.scale, col.precision, self.decimal)
        if op == R_DATETIME or op == R_TIMESTAMP or op == R_TIME or op == R_DATE:
            v = read_long(c)
            if c.bad:
                return FALLBACK
            if op == R_DATETIME:
                return _datetime(v, None)
            if op == R_TIMESTAMP:
                return _datetime(v, UTC)
            if op == R_DATE:
                return _date(v)
            if not 0 <= v < MICROS_PER_DAY:
                return FALLBACK
            return timedelta_new(0, <int>(v // MICROS_PER_SECOND), <int>(v % MICROS_PER_SECOND))
        if op == R_DOUBLE or op == R_FLOAT:
            p = take(c, 8 if op == R_DOUBLE else 4)
            if c.bad:
                return FALLBACK
            if op == R_DOUBLE:
                memcpy(&d, p, 8)
            else:
                memcpy(&f, p, 4)
                d = f
            return PyFloat_FromDouble(d)
        if op == R_BYTES:
            n = <Py_ssize_t>read_long(c)
            p = take(c, n)
            return FALLBACK if c.bad else PyBytes_FromStringAndSize(<const char *>p, n)
        if op == R_ENUM:
            v = read_long(c)
            symbols = <tuple>col.extra
            if c.bad or not 0 <= v < len(symbols):
                return FALLBACK
            return symbols[v]
        if op == R_BOOLEAN:
            p = take(c, 1)
            if c.bad or p[0] > 1:
                return FALLBACK
            return p[0] == 1
        if op == R_UUID:
            text = self._string(c)
            if text is FALLBACK:
                return text
            try:
                return (<object>col.extra)(text)
            except Exception:  # noqa: BLE001 - as above
                return FALLBACK
        return FALLBACK  # R_NULL's only branch is null


# -- JSON mode ---------------------------------------------------------------------------

# What a JSON value becomes, per column (stream.py names them; keep in step).
cdef enum:
    J_INT = 1        # an integer: int
    J_BOOLEAN = 2    # true / false: bool
    J_STRING = 3     # a string: str
    J_DECIMAL = 4    # a number: Decimal of its text
    J_DOUBLE = 5     # a number: float
    J_FLOAT = 6      # a number: float, through a 32-bit float
    J_BYTES = 7      # a hex string: bytes
    J_DATETIME = 8   # a string: naive datetime, if it is one MariaDB prints
    J_TIMESTAMP = 9  # a string: datetime in UTC, if it ends +00:00
    J_DATE = 10      # a string: date
    J_CALL = 11      # a string: the Python conversion (TIME, UUID, ...)

cdef enum:
    T_NULL = 1
    T_TRUE = 2
    T_FALSE = 3
    T_NUMBER = 4
    T_STRING = 5



cdef struct Token:
    int kind
    const uint8_t *p    # a number's text, or a string's bytes (unescaped when ``escaped``)
    Py_ssize_t n
    bint integer        # a number without fraction or exponent


cdef struct JsonColumn:
    int op
    const char *key     # the field's name (Avro names need no escaping)
    Py_ssize_t key_size
    PyObject *column    # its name in ``values``
    PyObject *call      # J_CALL, and any string a fast path does not read: the Python rule


cdef inline Py_ssize_t _space(const uint8_t *p, Py_ssize_t i, Py_ssize_t end) noexcept:
    while i < end and (p[i] == 32 or p[i] == 9 or p[i] == 13):
        i += 1
    return i


cdef inline int _hex(uint8_t c) noexcept:
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


cdef class JsonRecordDecoder:
    """One version's JSON-mode record lines as ``ChangeRecord`` objects, the lines parsed in
    C. A line it does not read exactly as ``json.loads(line, parse_float=Decimal)`` and
    ``from_json_value`` would (a schema, an error line, a key out of the schema's order, a
    repair's extra key, a lone surrogate, a number where a string belongs) stops it there
    and is left to the Python path."""

    cdef RecordDecoder maker
    cdef int ncolumns
    cdef JsonColumn *columns
    cdef list keep
    cdef tuple event_types
    cdef tuple event_bytes   # their UTF-8, to compare with a line's bytes
    cdef char *scratch       # a string's bytes with its escapes undone
    cdef Py_ssize_t scratch_size

    def __cinit__(self, RecordDecoder maker, tuple event_types, list program):
        """``program``: per column (op, key bytes, column name, Python conversion)."""
        cdef int i
        self.maker = maker
        self.event_types = event_types
        self.event_bytes = tuple(symbol.encode() for symbol in event_types)
        self.keep = []
        self.ncolumns = len(program)
        self.columns = <JsonColumn *>calloc(self.ncolumns + 1, sizeof(JsonColumn))
        if self.columns == NULL:
            raise MemoryError()
        for i in range(self.ncolumns):
            op, key, column, call = program[i]
            self.keep.append((key, column, call))
            self.columns[i].op = op
            self.columns[i].key = <const char *>(<bytes>key)
            self.columns[i].key_size = len(key)
            self.columns[i].column = <PyObject *>column
            self.columns[i].call = <PyObject *>call

    def __dealloc__(self):
        free(self.columns)
        free(self.scratch)

    def decode(self, const uint8_t[::1] data, Py_ssize_t pos):
        """(records, position): the record lines of ``data`` from ``pos`` on, up to the
        first line left to Python (its start) or the end of the last whole line."""
        cdef const uint8_t *p = &data[0] if data.shape[0] else <const uint8_t *>b""
        cdef Py_ssize_t size = data.shape[0], end
        cdef const uint8_t *newline
        records = []
        while pos < size:
            newline = <const uint8_t *>memchr(p + pos, 10, size - pos)
            if newline == NULL:
                break
            end = newline - p
            record = self._line(p, pos, end)
            if record is None:
                break
            records.append(record)
            pos = end + 1
        return records, pos

    cdef object _line(self, const uint8_t *p, Py_ssize_t i, Py_ssize_t end):
        cdef Token token
        cdef int64_t metadata[5]
        cdef int k
        i = _space(p, i, end)
        if i >= end or p[i] != 123:  # '{'
            return None
        i += 1
        for k in range(5):
            i = self._key(p, i, end, METADATA_KEYS[k], METADATA_SIZES[k], k == 0)
            if i < 0:
                return None
            i = self._token(p, i, end, &token)
            if i < 0 or token.kind != T_NUMBER or not token.integer or \
                    not _small_int(token.p, token.n, &metadata[k]):
                return None
        i = self._key(p, i, end, b"event_type", 10, False)
        if i < 0:
            return None
        i = self._token(p, i, end, &token)
        if i < 0 or token.kind != T_STRING:
            return None
        event_type = self._event_type(&token)
        if event_type is None:
            return None
        values = {}
        for k in range(self.ncolumns):
            i = self._key(p, i, end, self.columns[k].key, self.columns[k].key_size, False)
            if i < 0:
                return None
            i = self._token(p, i, end, &token)
            if i < 0:
                return None
            value = self._value(&self.columns[k], &token)
            if value is FALLBACK:
                return None
            values[<object>self.columns[k].column] = value
        i = _space(p, i, end)
        if i >= end or p[i] != 125 or _space(p, i + 1, end) != end:  # '}' and nothing after
            return None
        return self.maker._make(metadata[0], metadata[1], metadata[2], metadata[3],
                                metadata[4], event_type, values)

    cdef object _event_type(self, Token *token):
        cdef Py_ssize_t k
        cdef bytes encoded
        for k in range(len(self.event_bytes)):
            encoded = <bytes>self.event_bytes[k]
            if len(encoded) == token.n and memcmp(<const char *>encoded, token.p, token.n) == 0:
                return self.event_types[k]
        return None

    cdef Py_ssize_t _key(self, const uint8_t *p, Py_ssize_t i, Py_ssize_t end,
                         const char *key, Py_ssize_t size, bint first) noexcept:
        """Past ``"key":`` (after a ``,`` unless it is the first), or -1."""
        i = _space(p, i, end)
        if not first:
            if i >= end or p[i] != 44:  # ','
                return -1
            i = _space(p, i + 1, end)
        if i + size + 2 > end or p[i] != 34 or p[i + size + 1] != 34 or \
                memcmp(p + i + 1, key, size) != 0:
            return -1
        i = _space(p, i + size + 2, end)
        if i >= end or p[i] != 58:  # ':'
            return -1
        return _space(p, i + 1, end)

    cdef Py_ssize_t _token(self, const uint8_t *p, Py_ssize_t i, Py_ssize_t end,
                           Token *token) except -2:
        """The value at ``i``: its kind and text; -1 for one left to Python."""
        cdef Py_ssize_t start = i
        cdef uint8_t c
        if i >= end:
            return -1
        c = p[i]
        if c == 34:
            return self._string(p, i + 1, end, token)
        if c == 110 and end - i >= 4 and memcmp(p + i, b"null", 4) == 0:
            token.kind = T_NULL
            return i + 4
        if c == 116 and end - i >= 4 and memcmp(p + i, b"true", 4) == 0:
            token.kind = T_TRUE
            return i + 4
        if c == 102 and end - i >= 5 and memcmp(p + i, b"false", 5) == 0:
            token.kind = T_FALSE
            return i + 5
        # -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
        token.integer = True
        if i < end and p[i] == 45:
            i += 1
        if i >= end or not 48 <= p[i] <= 57:
            return -1
        if p[i] == 48:
            i += 1
        else:
            while i < end and 48 <= p[i] <= 57:
                i += 1
        if i < end and p[i] == 46:
            token.integer = False
            i += 1
            if i >= end or not 48 <= p[i] <= 57:
                return -1
            while i < end and 48 <= p[i] <= 57:
                i += 1
        if i < end and (p[i] == 101 or p[i] == 69):
            token.integer = False
            i += 1
            if i < end and (p[i] == 43 or p[i] == 45):
                i += 1
            if i >= end or not 48 <= p[i] <= 57:
                return -1
            while i < end and 48 <= p[i] <= 57:
                i += 1
        token.kind = T_NUMBER
        token.p = p + start
        token.n = i - start
        return i

    cdef Py_ssize_t _string(self, const uint8_t *p, Py_ssize_t i, Py_ssize_t end,
                            Token *token) except -2:
        """A string's bytes (its escapes undone into the scratch buffer); -1 for one left to
        Python (a lone surrogate, a control character)."""
        cdef Py_ssize_t start = i, n = 0
        cdef uint8_t c
        cdef uint32_t u, low
        while i < end and p[i] != 34 and p[i] != 92 and p[i] >= 32:
            i += 1
        if i < end and p[i] == 34:  # no escapes: the bytes as they are
            token.kind = T_STRING
            token.p = p + start
            token.n = i - start
            return i + 1
        if self._reserve(end - start) < 0:
            return -2
        memcpy(self.scratch, p + start, i - start)
        n = i - start
        while i < end:
            c = p[i]
            if c == 34:
                token.kind = T_STRING
                token.p = <const uint8_t *>self.scratch
                token.n = n
                return i + 1
            if c < 32:
                return -1
            if c != 92:
                self.scratch[n] = <char>c
                n += 1
                i += 1
                continue
            if i + 1 >= end:
                return -1
            c = p[i + 1]
            i += 2
            if c == 117:  # \uXXXX
                if not _hex4(p, i, end, &u):
                    return -1
                i += 4
                if 0xD800 <= u <= 0xDBFF:
                    if not (i + 1 < end and p[i] == 92 and p[i + 1] == 117
                            and _hex4(p, i + 2, end, &low) and 0xDC00 <= low <= 0xDFFF):
                        return -1
                    i += 6
                    u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00)
                elif 0xDC00 <= u <= 0xDFFF:
                    return -1
                n += _utf8_encode(u, self.scratch + n)
                continue
            self.scratch[n] = <char>_escaped(c)
            if self.scratch[n] == 0:
                return -1
            n += 1
        return -1

    cdef int _reserve(self, Py_ssize_t size) except -1:
        if size + 8 > self.scratch_size:
            free(self.scratch)
            self.scratch_size = size + 8 + (size >> 2)
            self.scratch = <char *>malloc(self.scratch_size)
            if self.scratch == NULL:
                self.scratch_size = 0
                raise MemoryError()
        return 0

    cdef object _value(self, JsonColumn *col, Token *token):
        cdef int op = col.op
        if token.kind == T_NULL:
            return None
        if token.kind == T_STRING:
            text = _text(token)
            if text is FALLBACK or op == J_STRING:
                return text
            if op == J_BYTES:
                return _hex_bytes(token)
            if op == J_DATETIME or op == J_TIMESTAMP:
                value = _datetime_text(token, op == J_TIMESTAMP)
            elif op == J_DATE:
                value = _date_text(token)
            else:
                value = FALLBACK
            if value is not FALLBACK:
                return value
            if op == J_INT or op == J_BOOLEAN or op == J_DECIMAL or op == J_DOUBLE \
                    or op == J_FLOAT:
                return FALLBACK  # a string where a number belongs: as Python has it
            try:
                return (<object>col.call)(text)
            except Exception:  # noqa: BLE001 - Python's error, or its syntax error first
                return FALLBACK
        if token.kind == T_TRUE or token.kind == T_FALSE:
            if op == J_BOOLEAN or op == J_INT or op == J_STRING:
                return token.kind == T_TRUE
            return FALLBACK
        return _number(op, token)


cdef const char *METADATA_KEYS[5]
cdef Py_ssize_t METADATA_SIZES[5]
METADATA_KEYS[:] = [b"domain", b"server_id", b"sequence", b"event_number", b"timestamp"]
METADATA_SIZES[:] = [6, 9, 8, 12, 9]


cdef inline bint _hex4(const uint8_t *p, Py_ssize_t i, Py_ssize_t end, uint32_t *u) noexcept:
    cdef int k, h
    if i + 4 > end:
        return False
    u[0] = 0
    for k in range(4):
        h = _hex(p[i + k])
        if h < 0:
            return False
        u[0] = (u[0] << 4) | <uint32_t>h
    return True


cdef inline int _utf8_encode(uint32_t u, char *out) noexcept:
    if u < 0x80:
        out[0] = <char>u
        return 1
    if u < 0x800:
        out[0] = <char>(0xC0 | (u >> 6))
        out[1] = <char>(0x80 | (u & 0x3F))
        return 2
    if u < 0x10000:
        out[0] = <char>(0xE0 | (u >> 12))
        out[1] = <char>(0x80 | ((u >> 6) & 0x3F))
        out[2] = <char>(0x80 | (u & 0x3F))
        return 3
    out[0] = <char>(0xF0 | (u >> 18))
    out[1] = <char>(0x80 | ((u >> 12) & 0x3F))
    out[2] = <char>(0x80 | ((u >> 6) & 0x3F))
    out[3] = <char>(0x80 | (u & 0x3F))
    return 4


cdef inline uint8_t _escaped(uint8_t c) noexcept:
    """The character of ``\\c``; 0 for an escape JSON does not have."""
    if c == 34 or c == 92 or c == 47:
        return c
    if c == 110:
        return 10
    if c == 116:
        return 9
    if c == 114:
        return 13
    if c == 98:
        return 8
    if c == 102:
        return 12
    return 0


cdef object _text(Token *token):
    try:
        return PyUnicode_DecodeUTF8(<const char *>token.p, token.n, NULL)
    except UnicodeDecodeError:
        return FALLBACK  # json.loads refuses the line


cdef bint _small_int(const uint8_t *p, Py_ssize_t n, int64_t *value) noexcept:
    """An integer's text of up to 18 digits."""
    cdef Py_ssize_t i = 0
    cdef int64_t v = 0
    cdef bint negative = n > 0 and p[0] == 45
    if negative:
        i = 1
    if n - i > 18 or n - i < 1:
        return False
    while i < n:
        v = v * 10 + (p[i] - 48)
        i += 1
    value[0] = -v if negative else v
    return True


cdef object _number(int op, Token *token):
    cdef int64_t v
    cdef double d
    cdef float f
    if op == J_INT:
        if not token.integer:
            return FALLBACK  # json gives a Decimal: as Python has it
        if _small_int(token.p, token.n, &v):
            return PyLong_FromLongLong(v)
        try:
            return int(PyUnicode_FromStringAndSize(<const char *>token.p, token.n))
        except ValueError:  # past int's digit limit: as Python has it
            return FALLBACK
    if op == J_DECIMAL:
        return _decimal_text(token)
    if token.integer and token.n > 300:
        return FALLBACK  # float(int) refuses what float(text) makes infinite
    if op == J_DOUBLE or op == J_FLOAT:
        text = PyUnicode_FromStringAndSize(<const char *>token.p, token.n)
        d = float(text)
        if op == J_DOUBLE:
            return PyFloat_FromDouble(d)
        f = <float>d
        if f != f or ((f == HUGE_VALF or f == -HUGE_VALF) and d == d and
                      d != HUGE_VAL and d != -HUGE_VAL):
            return FALLBACK  # struct.pack refuses it: as Python has it
        return PyFloat_FromDouble(<double>f)
    return FALLBACK


cdef object _decimal_text(Token *token):
    """``Decimal(text)`` of a JSON number, made directly for plain ``[-]digits[.digits]``
    of up to 38 digits."""
    cdef const uint8_t *p = token.p
    cdef Py_ssize_t i = 0, n = token.n
    cdef rd_uint128 u = 0
    cdef int digits = 0, scale = 0
    cdef bint negative = n > 0 and p[0] == 45, point = False
    if negative:
        i = 1
    if DECIMAL_LAYOUT_VERIFIED:
        while i < n:
            if p[i] == 46:
                point = True
            elif 48 <= p[i] <= 57:
                if digits or p[i] != 48:
                    digits += 1
                u = u * 10 + (p[i] - 48)
                if point:
                    scale += 1
            else:
                break
            i += 1
        if i == n and digits <= 38 and scale <= 40 and not (negative and u == 0):
            return _made_decimal(u, negative, scale, 1000)
    if token.integer and n == 2 and negative and p[1] == 48:
        return FALLBACK  # json reads -0 as the int 0, and Decimal(0) has no sign
    return DECIMAL(PyUnicode_FromStringAndSize(<const char *>p, n))


cdef object _hex_bytes(Token *token):
    cdef Py_ssize_t k
    cdef int hi, lo
    cdef char *out
    if token.n % 2:
        return FALLBACK
    value = PyBytes_FromStringAndSize(NULL, token.n // 2)
    out = PyBytes_AS_STRING(value)
    for k in range(token.n // 2):
        hi = _hex(token.p[2 * k])
        lo = _hex(token.p[2 * k + 1])
        if hi < 0 or lo < 0:
            return FALLBACK
        out[k] = <char>((hi << 4) | lo)
    return value


cdef object _date_text(Token *token):
    value = _ctext.date_text(token.p, token.n)
    return FALLBACK if value is None else value


cdef object _datetime_text(Token *token, bint utc):
    """MariaDB's datetime text (then ``+00:00`` if ``utc``), as ``datetime.fromisoformat``
    reads it; anything else (a zero TIMESTAMP, another zone) is left to it."""
    cdef Py_ssize_t n = token.n
    if utc:
        if n < 25 or memcmp(token.p + n - 6, b"+00:00", 6) != 0:
            return FALLBACK
        n -= 6
    value = _ctext.datetime_text(token.p, n, UTC if utc else None)
    return FALLBACK if value is None or (utc and type(value) is str) else value
