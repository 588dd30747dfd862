# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A block of stored Avro records straight to JSON lines, in C.

``BlockRenderer.render`` walks the records of one (decompressed) block with a program built
by ``render.py`` from the version's schema and writes each as the line ``compile_renderer``
would: the same keys, separators and value texts (``mariadb_cdc_client.format.schema.to_json_text``), without a
Python object per value. It returns None wherever it cannot be sure of that (malformed data,
invalid UTF-8, a value outside what the store writes), and the caller renders the block in
Python instead, which then reports the problem as before.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, strtod
from libc.string cimport memcpy, strlen

from cdcserver._cbuffer cimport Out, reserve as _reserve
from mariadb_cdc_client.format._cvalues cimport civil as _civil
from mariadb_cdc_client.format._cavro cimport Cursor, read_long, take, utf8_valid as _utf8_valid

cdef extern from "Python.h":
    char *PyOS_double_to_string(double val, char format_code, int precision, int flags,
                                int *ptype) except NULL
    int Py_DTSF_ADD_DOT_0

cdef extern from *:
    """
    typedef __int128 cdc_int128;
    typedef unsigned __int128 cdc_uint128;
    """
    ctypedef long long cdc_int128
    ctypedef unsigned long long cdc_uint128

# Value operations (render.py names them; keep in step).
cdef enum:
    R_LONG = 1
    R_ENUM = 2
    R_BOOLEAN = 3
    R_FLOAT = 4
    R_DOUBLE = 5
    R_DECIMAL = 6     # a: scale
    R_STRING = 7
    R_BYTES = 8
    R_UUID = 9
    R_DATE = 10
    R_DATETIME = 11   # a: fsp
    R_TIMESTAMP = 12  # a: fsp (rendered in UTC)
    R_TIME = 13       # a: fsp
    R_NULL = 14
    R_U64 = 15        # decimal(20,0): a number within int64, else a string of the digits
    R_DECIMAL_TEXT = 16  # a: scale; the decimal as a string
    R_YEAR = 17       # an int as a four-digit string
    R_UINT32 = 18     # a GTID's domain or server id: an int's 32 bits, unsigned
    R_UINT64 = 19     # a GTID's sequence: a long's 64 bits, unsigned

# Union shapes
cdef enum:
    PLAIN = 0         # not a union (the metadata fields)
    NULLABLE = 1      # ["null", T]
    WITH_TEXT = 2     # ["null", T, "string"]: the string branch holds MariaDB's own text

cdef int64_t _DAY_MICROS = 86400000000
cdef const char *_HEX = b"0123456789abcdef"
# What follows the backslash for each byte JSON escapes (json.encoder's ESCAPE_DCT): a short
# escape letter, 'u' for \u00XX, 0 for a byte written as it is.
cdef bytes _ESCAPES = bytes(
    ord({0x22: '"', 0x5C: "\\", 0x0A: "n", 0x0D: "r", 0x09: "t", 0x08: "b", 0x0C: "f"}.get(
        b, "u")) if b < 0x20 or b in (0x22, 0x5C) else 0 for b in range(256))
cdef const char *_ESCAPE = _ESCAPES
# The same, with { and } escaped too (the MaxScale dialect: gomaxscale counts braces).
cdef bytes _ESCAPES_BRACES = bytes(
    ord("u") if b in (0x7B, 0x7D) else _ESCAPES[b] for b in range(256))
cdef const char *_ESCAPE_BRACES = _ESCAPES_BRACES


cdef inline void _put(Out *out, const char *p, Py_ssize_t n) noexcept:
    memcpy(out.data + out.size, p, n)
    out.size += n


cdef inline void _char(Out *out, char c) noexcept:
    out.data[out.size] = c
    out.size += 1


cdef inline void _digits(Out *out, uint64_t v, int width) noexcept:
    """v in decimal, zero-padded to ``width`` digits."""
    cdef char buf[24]
    cdef int n = 0
    while True:
        buf[23 - n] = <char>(48 + v % 10)
        v //= 10
        n += 1
        if not v and n >= width:
            break
    _put(out, buf + 24 - n, n)


cdef inline void _signed(Out *out, int64_t v) noexcept:
    if v < 0:
        _char(out, b'-')
        _digits(out, <uint64_t>0 - <uint64_t>v, 1)
    else:
        _digits(out, <uint64_t>v, 1)


cdef int _json_string(Out *out, const uint8_t *p, Py_ssize_t n, const char *table) except -1:
    """A JSON string as json.dumps(ensure_ascii=False) writes it (``table``: _ESCAPE, or
    _ESCAPE_BRACES for the MaxScale dialect, which also writes an r that would end "err" in
    the text written, in any case, as ``\\u0072``: MaxScale's clients take a reply holding
    those letters for an error); 0 if not UTF-8."""
    cdef Py_ssize_t i
    cdef uint8_t b
    cdef char escape
    cdef bint maxscale = table == _ESCAPE_BRACES
    if not _utf8_valid(p, n):
        return 0
    _reserve(out, 6 * n + 2)
    _char(out, b'"')
    for i in range(n):
        b = p[i]
        escape = table[b]
        # what was written before (the quote at least): "er", of letters or an escape's hex
        if maxscale and (b | 0x20) == 0x72 and (out.data[out.size - 1] | 0x20) == 0x72 \
                and (out.data[out.size - 2] | 0x20) == 0x65:
            escape = b'u'
        if not escape:
            _char(out, <char>b)
            continue
        _char(out, b'\\')
        _char(out, escape)
        if escape == b'u':
            _put(out, b"00", 2)
            _char(out, _HEX[b >> 4])
            _char(out, _HEX[b & 15])
    _char(out, b'"')
    return 1


cdef inline void _fraction(Out *out, int64_t micros, int fsp) noexcept:
    """``f".{micros:06d}"[: fsp + 1] if fsp``"""
    cdef char buf[6]
    cdef int i
    if not fsp:
        return
    for i in range(5, -1, -1):
        buf[i] = <char>(48 + micros % 10)
        micros //= 10
    _char(out, b'.')
    _put(out, buf, fsp if fsp <= 6 else 6)


cdef int _date(Out *out, int64_t days) except -1:
    """``date.isoformat()`` of a day count since 1970-01-01; 0 outside years 1..9999."""
    cdef int64_t year, month, day
    _civil(days, &year, &month, &day)
    if year < 1 or year > 9999:
        return 0
    _reserve(out, 12)
    _digits(out, <uint64_t>year, 4)
    _char(out, b'-')
    _digits(out, <uint64_t>month, 2)
    _char(out, b'-')
    _digits(out, <uint64_t>day, 2)
    return 1


cdef int _moment(Out *out, int64_t micros, int fsp, bint utc) except -1:
    """A local-timestamp-micros (or, with ``utc``, timestamp-micros) value as datetime_text,
    quoted; 0 outside datetime's years 1..9999."""
    cdef int64_t days = micros // _DAY_MICROS if micros >= 0 else -(
        (-micros + _DAY_MICROS - 1) // _DAY_MICROS)
    _reserve(out, 40)
    _char(out, b'"')
    if not _date(out, days):
        return 0
    _char(out, b' ')
    _clock(out, micros - days * _DAY_MICROS, fsp)
    if utc:
        _put(out, b"+00:00", 6)
    _char(out, b'"')
    return 1


cdef inline void _clock(Out *out, int64_t micros, int fsp) noexcept:
    cdef int64_t seconds = micros // 1000000
    _digits(out, <uint64_t>(seconds // 3600), 2)
    _char(out, b':')
    _digits(out, <uint64_t>(seconds % 3600 // 60), 2)
    _char(out, b':')
    _digits(out, <uint64_t>(seconds % 60), 2)
    _fraction(out, micros % 1000000, fsp)


cdef int _decimal(Out *out, const uint8_t *p, Py_ssize_t n, int scale) except -1:
    """format(Decimal(unscaled).scaleb(-scale), "f"); 0 beyond 16 bytes."""
    cdef cdc_int128 v = 0
    cdef cdc_uint128 u
    cdef char buf[48]
    cdef int len_ = 0, i
    if n < 1 or n > 16:
        return 0
    v = -1 if p[0] & 0x80 else 0
    for i in range(n):
        v = (v << 8) | p[i]
    u = <cdc_uint128>(-v) if v < 0 else <cdc_uint128>v
    while u or len_ <= scale:
        buf[47 - len_] = <char>(48 + <int>(u % 10))
        u //= 10
        len_ += 1
    _reserve(out, 52)
    if v < 0:
        _char(out, b'-')
    _put(out, buf + 48 - len_, len_ - scale)
    if scale:
        _char(out, b'.')
        _put(out, buf + 48 - scale, scale)
    return 1


cdef inline bint _within_int64(const uint8_t *p, Py_ssize_t n) noexcept:
    """Whether a big-endian two's-complement integer of ``n`` bytes fits in int64."""
    cdef Py_ssize_t i
    cdef uint8_t sign
    if n <= 8:
        return True
    sign = 0xFF if p[0] & 0x80 else 0
    for i in range(n - 8):
        if p[i] != sign:
            return False
    return (p[n - 8] & 0x80) == (sign & 0x80)


cdef int _float32(Out *out, const uint8_t *p) except -1:
    """mariadb_cdc_client.format.schema.float32_text: the shortest %g that reads back as the same float32."""
    cdef float f
    cdef double d
    cdef char *text
    cdef int digits
    cdef Py_ssize_t n
    memcpy(&f, p, 4)
    d = <double>f
    if d != d or d == 1.0 / 0.0 or d == -1.0 / 0.0:
        return 0  # float32_text raises for these: the Python path says so
    for digits in range(1, 10):
        text = PyOS_double_to_string(d, b'g', digits, 0, NULL)
        try:
            if <float>strtod(text, NULL) == f:
                n = <Py_ssize_t>strlen(text)
                _reserve(out, n)
                _put(out, text, n)
                return 1
        finally:
            PyMem_Free(text)
    text = PyOS_double_to_string(d, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
    try:
        n = <Py_ssize_t>strlen(text)
        _reserve(out, n)
        _put(out, text, n)
    finally:
        PyMem_Free(text)
    return 1


cdef int _skip(int op, int union, Cursor *c) noexcept:
    """Past one field's value: 1, or 0 at a value the store does not write."""
    cdef int64_t branch
    if union != PLAIN:
        branch = read_long(c)
        if c.bad:
            return 0
        if branch == 0:
            return 1
        if branch == 2 and union == WITH_TEXT:
            take(c, <Py_ssize_t>read_long(c))
            return not c.bad
        if branch != 1:
            return 0
    if op == R_NULL:
        return 1
    if op == R_BOOLEAN:
        take(c, 1)
    elif op == R_FLOAT:
        take(c, 4)
    elif op == R_DOUBLE:
        take(c, 8)
    elif op in (R_DECIMAL, R_STRING, R_BYTES, R_UUID, R_U64, R_DECIMAL_TEXT):
        take(c, <Py_ssize_t>read_long(c))
    else:  # varints: LONG, ENUM, DATE, DATETIME, TIMESTAMP, TIME, YEAR
        read_long(c)
    return not c.bad


cdef class BlockRenderer:
    """The records of one table version's blocks to JSON lines."""

    cdef int nfields
    cdef int *ops
    cdef int *unions
    cdef int *args
    cdef list prefixes  # bytes: '{"name": ' or ', "name": '
    cdef list symbols   # per field: rendered enum symbols, or None
    cdef const char *escapes  # how strings are escaped

    def __cinit__(self, list program, bint braces=False):
        cdef int i, n = len(program)
        self.nfields = n
        self.ops = <int *>malloc(sizeof(int) * (n + 1))
        self.unions = <int *>malloc(sizeof(int) * (n + 1))
        self.args = <int *>malloc(sizeof(int) * (n + 1))
        if self.ops == NULL or self.unions == NULL or self.args == NULL:
            raise MemoryError()
        self.escapes = _ESCAPE_BRACES if braces else _ESCAPE
        self.prefixes = []
        self.symbols = []
        for i in range(n):
            op, union, arg, prefix, symbols = program[i]
            self.ops[i] = op
            self.unions[i] = union
            self.args[i] = arg
            self.prefixes.append(prefix)
            self.symbols.append(symbols)

    def __dealloc__(self):
        free(self.ops)
        free(self.unions)
        free(self.args)

    def render(self, bytes data, Py_ssize_t count):
        """The JSON lines of the ``count`` records in ``data`` (a block's decompressed
        records), or None when the Python renderer must do it."""
        cdef Out out
        cdef Cursor c
        cdef Py_ssize_t r
        cdef int i
        out.data = NULL
        out.size = out.capacity = 0
        c.p = <const uint8_t *>PyBytes_AS_STRING(data)
        c.pos = 0
        c.end = PyBytes_GET_SIZE(data)
        c.bad = False
        try:
            for r in range(count):
                for i in range(self.nfields):
                    if not self._field(i, &c, &out) or c.bad:
                        return None
                _reserve(&out, 2)
                _put(&out, b"}\n", 2)
            if c.pos != c.end:
                return None
            return PyBytes_FromStringAndSize(out.data, out.size)
        finally:
            free(out.data)

    def slices(self, bytes data, Py_ssize_t count, tuple names, tuple symbols):
        """Each record's metadata (the first fields, ``names``: integers, the last of them an
        enum of ``symbols``) as a dict, with the offset where the record ends in ``data``;
        the columns are skipped, not rendered. None when the Python path must read them."""
        cdef Cursor c
        cdef Py_ssize_t r
        cdef int i, nmeta = len(names)
        cdef int64_t v
        cdef dict metadata
        cdef list out = []
        if nmeta < 1 or nmeta > self.nfields:
            return None
        for i in range(nmeta):
            if self.unions[i] != PLAIN or not (self.ops[i] == R_ENUM if i == nmeta - 1 else
                                               self.ops[i] in (R_LONG, R_UINT32, R_UINT64)):
                return None
        c.p = <const uint8_t *>PyBytes_AS_STRING(data)
        c.pos = 0
        c.end = PyBytes_GET_SIZE(data)
        c.bad = False
        for r in range(count):
            metadata = {}
            for i in range(nmeta):
                v = read_long(&c)
                if c.bad:
                    return None
                if i < nmeta - 1:
                    if self.ops[i] == R_UINT32:
                        metadata[names[i]] = <uint32_t>v
                    elif self.ops[i] == R_UINT64:
                        metadata[names[i]] = <uint64_t>v
                    else:
                        metadata[names[i]] = v
                elif 0 <= v < len(symbols):
                    metadata[names[i]] = symbols[v]
                else:
                    return None
            for i in range(nmeta, self.nfields):
                if not _skip(self.ops[i], self.unions[i], &c):
                    return None
            out.append((metadata, c.pos))
        if c.pos != c.end:
            return None
        return out

    cdef int _field(self, int i, Cursor *c, Out *out) except -1:
        cdef bytes prefix = <bytes>self.prefixes[i]
        cdef int union = self.unions[i]
        cdef int64_t branch = 1
        cdef Py_ssize_t n
        cdef const uint8_t *p
        _reserve(out, PyBytes_GET_SIZE(prefix) + 48)
        _put(out, PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix))
        if union != PLAIN:
            branch = read_long(c)
            if branch == 0:
                _put(out, b"null", 4)
                return 1
            if branch == 2 and union == WITH_TEXT:
                n = <Py_ssize_t>read_long(c)
                p = take(c, n)
                return 0 if c.bad else _json_string(out, p, n, self.escapes)
            if branch != 1:
                return 0
        return self._value(i, c, out)

    cdef int _value(self, int i, Cursor *c, Out *out) except -1:
        cdef int op = self.ops[i]
        cdef int arg = self.args[i]
        cdef int64_t v
        cdef Py_ssize_t n, k
        cdef const uint8_t *p
        cdef char *text
        cdef double d
        if op == R_LONG:
            _signed(out, read_long(c))
            return 1
        if op == R_UINT32:
            _digits(out, <uint64_t>(<uint32_t>read_long(c)), 1)
            return 1
        if op == R_UINT64:
            _digits(out, <uint64_t>read_long(c), 1)
            return 1
        if op == R_STRING:
            n = <Py_ssize_t>read_long(c)
            p = take(c, n)
            return 0 if c.bad else _json_string(out, p, n, self.escapes)
        if op == R_DECIMAL:
            n = <Py_ssize_t>read_long(c)
            p = take(c, n)
            return 0 if c.bad else _decimal(out, p, n, arg)
        if op == R_DOUBLE:
            p = take(c, 8)
            if c.bad:
                return 0
            memcpy(&d, p, 8)
            text = PyOS_double_to_string(d, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
            try:
                n = <Py_ssize_t>strlen(text)
                _reserve(out, n)
                _put(out, text, n)
            finally:
                PyMem_Free(text)
            return 1
        if op == R_DATETIME or op == R_TIMESTAMP:
            v = read_long(c)
            return 0 if c.bad else _moment(out, v, arg, op == R_TIMESTAMP)
        if op == R_ENUM:
            v = read_long(c)
            symbols = <tuple>self.symbols[i]
            if c.bad or v < 0 or v >= len(symbols):
                return 0
            symbol = <bytes>symbols[v]
            _reserve(out, PyBytes_GET_SIZE(symbol))
            _put(out, PyBytes_AS_STRING(symbol), PyBytes_GET_SIZE(symbol))
            return 1
        if op == R_BOOLEAN:
            p = take(c, 1)
            if c.bad or p[0] > 1:
                return 0
            _put(out, b"true" if p[0] else b"false", 4 if p[0] else 5)
            return 1
        if op == R_FLOAT:
            p = take(c, 4)
            return 0 if c.bad else _float32(out, p)
        if op == R_BYTES:
            n = <Py_ssize_t>read_long(c)
            p = take(c, n)
            if c.bad:
                return 0
            _reserve(out, 2 * n + 2)
            _char(out, b'"')
            for k in range(n):
                out.data[out.size] = _HEX[p[k] >> 4]
                out.data[out.size + 1] = _HEX[p[k] & 15]
                out.size += 2
            _char(out, b'"')
            return 1
        if op == R_UUID:
            n = <Py_ssize_t>read_long(c)
            p = take(c, n)
            if c.bad or n != 36:
                return 0
            for k in range(36):  # canonical lowercase text only: str(UUID(text)) is itself
                if k in (8, 13, 18, 23):
                    if p[k] != 45:
                        return 0
                elif not (48 <= p[k] <= 57 or 97 <= p[k] <= 102):
                    return 0
            _reserve(out, 38)
            out.data[out.size] = b'"'
            memcpy(out.data + out.size + 1, p, 36)
            out.data[out.size + 37] = b'"'
            out.size += 38
            return 1
        if op == R_DATE:
            v = read_long(c)
            if c.bad:
                return 0
            _char(out, b'"')
            if not _date(out, v):
                return 0
            _char(out, b'"')
            return 1
        if op == R_TIME:
            v = read_long(c)
            if c.bad or v < 0 or v >= _DAY_MICROS:
                return 0
            _char(out, b'"')
            _clock(out, v, arg)
            _char(out, b'"')
            return 1
        if op == R_NULL:
            _put(out, b"null", 4)
            return 1
        if op == R_U64:
            n = <Py_ssize_t>read_long(c)
            p = take(c, n)
            if c.bad:
                return 0
            if _within_int64(p, n):
                return _decimal(out, p, n, 0)
            _char(out, b'"')
            if not _decimal(out, p, n, 0):
                return 0
            _char(out, b'"')
            return 1
        if op == R_DECIMAL_TEXT:
            n = <Py_ssize_t>read_long(c)
            p = take(c, n)
            if c.bad:
                return 0
            _char(out, b'"')
            if not _decimal(out, p, n, arg):
                return 0
            _char(out, b'"')
            return 1
        if op == R_YEAR:
            v = read_long(c)
            if c.bad or v < 0 or v > 9999:
                return 0
            _reserve(out, 6)
            _char(out, b'"')
            _digits(out, <uint64_t>v, 4)
            _char(out, b'"')
            return 1
        return 0
