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
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

from mariadb_cdc_client.format._cavro cimport Cursor, read_long, take

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

cdef extern from *:
    """
    /* CPython's _decimal object (Modules/_decimal/_decimal.c, unchanged since 3.3) and
       libmpdec's mpd_t, as _decimal_layout_verified() checks them on real Decimals */
    typedef struct {
        uint8_t flags;
        Py_ssize_t exp;
        Py_ssize_t digits;
        Py_ssize_t len;
        Py_ssize_t alloc;
        uint64_t *data;
    } rd_mpd_t;
    typedef struct {
        PyObject_HEAD
        Py_hash_t hash;
        rd_mpd_t dec;
        uint64_t data[4];
    } rd_decimal;
    #define RD_MPD_NEG 1
    #define RD_MPD_STATIC 16
    #define RD_MPD_STATIC_DATA 32
    static PyObject *rd_alloc(PyObject *type) {
        return ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 0);
    }
    """
    ctypedef struct rd_mpd_t:
        uint8_t flags
        Py_ssize_t exp
        Py_ssize_t digits
        Py_ssize_t len
        Py_ssize_t alloc
        uint64_t *data
    ctypedef struct rd_decimal:
        Py_hash_t hash
        rd_mpd_t dec
        uint64_t data[4]
    int MPD_NEG "RD_MPD_NEG"
    int MPD_STATIC "RD_MPD_STATIC"
    int MPD_STATIC_DATA "RD_MPD_STATIC_DATA"
    object rd_alloc(object type)

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


cdef inline void _civil(int64_t days, int64_t *year, int *month, int *day) noexcept:
    """The proleptic Gregorian date ``days`` after 1970-01-01 (Howard Hinnant's
    civil_from_days)."""
    cdef int64_t z = days + 719468
    cdef int64_t era = (z if z >= 0 else z - 146096) // 146097
    cdef int64_t doe = z - era * 146097
    cdef int64_t yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    cdef int64_t doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    cdef int64_t mp = (5 * doy + 2) // 153
    day[0] = <int>(doy - (153 * mp + 2) // 5 + 1)
    month[0] = <int>(mp + 3 if mp < 10 else mp - 9)
    year[0] = yoe + era * 400 + (1 if month[0] <= 2 else 0)


cdef inline bint _days_in_range(int64_t days) noexcept:
    """``days`` after 1970-01-01 is a date of years 1 to 9999, which Python holds."""
    return -DAYS_0001_TO_1970 <= days <= 2932896


cdef object _date(int64_t days):
    cdef int64_t year
    cdef int month, day
    if not _days_in_range(days):
        return FALLBACK
    _civil(days, &year, &month, &day)
    return date_new(<int>year, month, day)


cdef object _datetime(int64_t micros, object tz):
    """``epoch + timedelta(microseconds=micros)``, naive or in ``tz``."""
    cdef int64_t days = micros // MICROS_PER_DAY
    cdef int64_t rest, year
    cdef int month, day
    if micros % MICROS_PER_DAY < 0:  # C division truncates; Python's floors
        days -= 1
    rest = micros - days * MICROS_PER_DAY
    if not _days_in_range(days):
        return FALLBACK
    _civil(days, &year, &month, &day)
    return datetime_new(<int>year, month, day, <int>(rest // MICROS_PER_HOUR),
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
    """The Decimal as _decimal itself makes one (PyDecType_New, then its coefficient in
    libmpdec's words of 19 digits), without parsing text."""
    cdef uint64_t low = <uint64_t>(u % DEC_RADIX), high = <uint64_t>(u // DEC_RADIX)
    cdef int digits = _digits(low) if high == 0 else 19 + _digits(high)
    cdef rd_decimal *made
    if digits > precision:
        return FALLBACK
    value = rd_alloc(DECIMAL)
    made = <rd_decimal *><PyObject *>value
    made.hash = -1
    made.dec.flags = MPD_STATIC | MPD_STATIC_DATA | (MPD_NEG if negative else 0)
    made.dec.exp = -scale
    made.dec.digits = digits
    made.dec.len = 1 if high == 0 else 2
    made.dec.alloc = 4
    made.dec.data = made.data
    made.data[0] = low
    made.data[1] = high
    return value


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

# (text, negative, exponent, digits, words): Decimals _decimal makes from text, whose memory
# must read as _made_decimal writes it
_PROBES = (("0.00", False, -2, 1, (0,)), ("-12.50", True, -2, 4, (1250,)),
           ("7", False, 0, 1, (7,)), ("-9999999999999999999", True, 0, 19,
                                      (9999999999999999999,)),
           ("12345678901234567890123.45", False, -2, 25, (1234567890123456789012345 % 10**19,
                                                          1234567890123456789012345 // 10**19)),
           ("-99999999999999999999999999999999999.999", True, -3, 38,
            ((10**38 - 1) % 10**19, (10**38 - 1) // 10**19)))


cdef bint _decimal_layout_verified():
    """Whether Decimal objects are laid out as rd_decimal says, read (never written) from
    Decimals _decimal made, and whether one made here then equals them."""
    cdef rd_decimal *d
    cdef int i
    if DECIMAL.__basicsize__ != sizeof(rd_decimal) or \
            sys.maxsize != 2**63 - 1:
        return False
    for text, negative, exponent, digits, words in _PROBES:
        real = DECIMAL(text)
        d = <rd_decimal *><PyObject *>real
        if d.hash != -1 or d.dec.flags != (MPD_STATIC | MPD_STATIC_DATA |
                                           (MPD_NEG if negative else 0)):
            return False
        if d.dec.exp != exponent or d.dec.digits != digits or d.dec.len != len(words) \
                or d.dec.alloc != 4 or d.dec.data != d.data:
            return False
        for i in range(len(words)):
            if d.data[i] != words[i]:
                return False
        if d.hash != -1 or hash(real) != d.hash:  # the cached hash is where it is read
            return False
    return True


cdef bint DECIMAL_LAYOUT_VERIFIED = _decimal_layout_verified()


def _decimals_made_here_equal_real_ones() -> bool:
    """For the tests (and a check at import): every probe made by _made_decimal is the real
    Decimal, digit for digit."""
    for text, _, _, _, _ in _PROBES:
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
        return (<object>col.text)(text)

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
            return text if text is FALLBACK else (<object>col.extra)(text)
        return FALLBACK  # R_NULL's only branch is null
