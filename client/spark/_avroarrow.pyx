# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Stored Avro blocks straight into Arrow column buffers, in C.

``BlockDecoder.decode`` walks the records of a chunk of null-codec blocks with a program that
``arrow.py`` builds from the version's schema and the query's, and writes each field's value
where Arrow keeps it: a validity bit, a fixed-width value (int32, int64, float, double, a
bit, a decimal128), or an int32 offset and the bytes (binary, string). No Python object is
made per value, and the buffers go to Arrow as they are (``pa.Array.from_buffers``, no copy).
Those are the arrays the Python path (cavro, then ``pa.array`` per column) builds from the
same records.

Wherever that could differ (malformed data, invalid UTF-8, a zero date the query refuses,
TIME text ``parse_time`` might read otherwise, a value outside its column's range) it returns
None, and the caller decodes the chunk in Python instead, which then gives its batch or
raises its error as before. ``tests/unit/test_spark_arrow_decoder.py`` compares the two on every
type the store writes.
"""

from cpython.buffer cimport PyBuffer_FillInfo
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_NoMemory
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject
from libc.stdint cimport INT32_MAX, INT32_MIN, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy

from mariadb_cdc_client.format._cavro cimport Cursor, read_long, take, utf8_valid

import pyarrow as pa

cdef extern from *:
    """
    typedef __int128 aa_int128;
    typedef unsigned __int128 aa_uint128;
    static inline int aa_mul_overflow(aa_int128 a, aa_int128 b, aa_int128 *product) {
        return __builtin_mul_overflow(a, b, product);
    }
    """
    ctypedef long long aa_int128
    ctypedef unsigned long long aa_uint128
    bint aa_mul_overflow(aa_int128 a, aa_int128 b, aa_int128 *product) noexcept

# Column operations (arrow.py names them; keep in step).
cdef enum:
    A_INT32 = 1           # Avro int or long to int32 (INT; DATE's days)
    A_INT64 = 2           # Avro int or long to int64 (LONG; DATETIME/TIMESTAMP/TIME micros)
    A_FLOAT32 = 3         # Avro float to float32
    A_FLOAT64_OF_FLOAT = 4  # Avro float to float64 (a query reading FLOAT as DOUBLE)
    A_FLOAT64 = 5         # Avro double to float64
    A_BOOLEAN = 6         # Avro boolean to a bit
    A_BINARY = 7          # Avro bytes to binary
    A_UTF8 = 8            # Avro string to string, its UTF-8 checked
    A_ENUM = 9            # Avro enum to string; extra: the symbols, UTF-8 encoded
    A_DECIMAL = 10        # Avro decimal bytes to decimal128; power: target scale - stored
    A_INT_DECIMAL = 11    # Avro int or long to decimal128; power: the target scale
    A_NULL = 12           # the union ["null"]: every value null
    A_VALUES = 13         # Avro bytes (or null) into a tuple; extra: the Python builder

# Union shapes (arrow.py names them; keep in step).
cdef enum:
    PLAIN = 0             # not a union (the metadata fields)
    NULLABLE = 1          # ["null", T], or ["null"]
    WITH_TEXT = 2         # ["null", T, "string"]: the string branch holds MariaDB's own text

# What the string branch of a WITH_TEXT column becomes (arrow.py names them; keep in step).
cdef enum:
    TEXT_REFUSED = 0      # nothing here: the Python path decides (ZeroDateError)
    TEXT_NULL = 1         # null (a zero date with zeroDates=null); its UTF-8 checked
    TEXT_TIME = 2         # MariaDB's TIME text, in microseconds (parse_time)

cdef int SYNC_SIZE = 16
cdef int MAX_POWER = 38   # 10 ** 38 is the largest power of ten in an int128


cdef struct Buf:
    char *data
    Py_ssize_t size
    Py_ssize_t capacity


cdef int _reserve(Buf *buf, Py_ssize_t extra) noexcept:
    """Room for ``extra`` more bytes (the buffer doubles); -1 with MemoryError set."""
    cdef Py_ssize_t capacity
    cdef char *grown
    if buf.size + extra <= buf.capacity:
        return 0
    capacity = buf.capacity * 2 if buf.capacity else 65536
    while capacity < buf.size + extra:
        capacity *= 2
    grown = <char *>realloc(buf.data, capacity)
    if grown == NULL:
        PyErr_NoMemory()
        return -1
    buf.data = grown
    buf.capacity = capacity
    return 0


cdef bint _unscaled(const uint8_t *p, Py_ssize_t n, aa_int128 *value) noexcept:
    """``int.from_bytes(p[:n], "big", signed=True)``; False beyond 128 bits."""
    cdef aa_uint128 u
    cdef uint8_t sign
    cdef Py_ssize_t i, skip = 0
    if n == 0:
        value[0] = 0
        return True
    sign = 0xFF if p[0] & 0x80 else 0
    if n > 16:  # only sign extension may precede the last 16 bytes
        skip = n - 16
        for i in range(skip):
            if p[i] != sign:
                return False
        if (p[skip] & 0x80) != (sign & 0x80):
            return False
    u = <aa_uint128>0 - 1 if sign else 0
    for i in range(skip, n):
        u = (u << 8) | p[i]
    value[0] = <aa_int128>u
    return True


cdef bint _number(const uint8_t *p, Py_ssize_t n, Py_ssize_t *at, int most,
                  int64_t *value) noexcept:
    """1 to ``most`` ASCII digits at ``at[0]``, as ``value``; ``at`` moves past them."""
    cdef Py_ssize_t i = at[0]
    cdef int64_t v = 0
    while i < n and i - at[0] < most and 48 <= p[i] <= 57:
        v = v * 10 + (p[i] - 48)
        i += 1
    if i == at[0] or (i < n and 48 <= p[i] <= 57):
        return False
    at[0] = i
    value[0] = v
    return True


cdef bint _time_micros(const uint8_t *p, Py_ssize_t n, int64_t *micros) noexcept:
    """``parse_time`` of MariaDB's TIME text ``[-]H:M:S[.F]`` (up to 9 digits of hours, 2 of
    minutes and of seconds; a fraction's first 6 digits count), in microseconds. False for any
    other text, which parse_time reads (or rejects) on the Python path."""
    cdef Py_ssize_t i = 0, digits = 0
    cdef int64_t sign = 1, hours = 0, minutes = 0, seconds = 0, fraction = 0
    if n and p[0] == 45:  # '-'
        sign = -1
        i = 1
    if not _number(p, n, &i, 9, &hours) or i >= n or p[i] != 58:  # ':'
        return False
    i += 1
    if not _number(p, n, &i, 2, &minutes) or i >= n or p[i] != 58:
        return False
    i += 1
    if not _number(p, n, &i, 2, &seconds):
        return False
    if i < n:
        if p[i] != 46 or i + 1 >= n:  # '.' and at least one digit
            return False
        i += 1
        while i < n:
            if not 48 <= p[i] <= 57:
                return False
            if digits < 6:
                fraction = fraction * 10 + (p[i] - 48)
                digits += 1
            i += 1
        while digits < 6:
            fraction *= 10
            digits += 1
    micros[0] = sign * (((hours * 60 + minutes) * 60 + seconds) * 1000000 + fraction)
    return True


cdef Py_ssize_t _record_count(const uint8_t *p, Py_ssize_t size, const uint8_t *sync
                              ) noexcept:
    """The records in a chunk of null-codec blocks; -1 unless it is whole blocks, each
    ending in ``sync`` (a record takes at least a byte: its metadata)."""
    cdef Cursor c
    cdef int64_t count, length
    cdef Py_ssize_t total = 0
    c.p = p
    c.pos = 0
    c.end = size
    c.bad = False
    while c.pos < c.end:
        count = read_long(&c)
        length = read_long(&c)
        if c.bad or count < 0 or length < count or length > c.end - c.pos - SYNC_SIZE:
            return -1
        c.pos += length
        if memcmp(p + c.pos, sync, SYNC_SIZE) != 0:
            return -1
        c.pos += SYNC_SIZE
        total += count
    return total


# -- columns -----------------------------------------------------------------------------
# The functions below return 1 for a value written, 0 where the Python path must take the
# chunk, or raise (memory ran out).

cdef struct Column:
    int op
    int shape
    int text
    aa_int128 factor          # A_DECIMAL, A_INT_DECIMAL: 10 ** power
    const char **symbols      # A_ENUM: each symbol's UTF-8 (bytes objects BlockDecoder keeps)
    Py_ssize_t *symbol_sizes
    Py_ssize_t nsymbols
    PyObject *collected       # A_VALUES, during a decode: the list of values (BlockDecoder's)
    Py_ssize_t nulls
    uint8_t *valid            # a bit per record, set when it is not null
    char *values              # fixed-width values, the bits of booleans, or int32 offsets
    Buf data                  # the bytes of binary and string values
    Py_ssize_t data_hint      # their size in the last chunk: the next one starts with room


cdef inline void _set_bit(uint8_t *bits, Py_ssize_t row) noexcept:
    bits[row >> 3] |= <uint8_t>(1 << (row & 7))


cdef inline bint _variable(int op) noexcept:
    return op == A_BINARY or op == A_UTF8 or op == A_ENUM


cdef Py_ssize_t _values_size(int op, Py_ssize_t rows) noexcept:
    """Bytes of a column's ``values`` buffer for ``rows`` records."""
    if op == A_INT32 or op == A_FLOAT32:
        return 4 * rows
    if op == A_INT64 or op == A_FLOAT64_OF_FLOAT or op == A_FLOAT64:
        return 8 * rows
    if op == A_DECIMAL or op == A_INT_DECIMAL:
        return 16 * rows
    if op == A_BOOLEAN:
        return (rows + 7) // 8
    if _variable(op):
        return 4 * (rows + 1)
    return 0


cdef inline int _field(Column *col, Cursor *c, Py_ssize_t row) except -1:
    cdef int64_t branch
    if col.shape != PLAIN:
        branch = read_long(c)
        if branch == 0:
            return _null(col, row)
        if branch == 2 and col.shape == WITH_TEXT:
            return _text(col, c, row)
        if branch != 1:
            return 0
    return _value(col, c, row)


cdef inline int _null(Column *col, Py_ssize_t row) except -1:
    col.nulls += 1
    if _variable(col.op):
        (<int32_t *>col.values)[row + 1] = <int32_t>col.data.size
    elif col.op == A_VALUES:
        return PyList_Append(<object>col.collected, None) + 1
    return 1


cdef int _text(Column *col, Cursor *c, Py_ssize_t row) except -1:
    """The string branch of a temporal column (MariaDB's zero dates and TIME text)."""
    cdef Py_ssize_t n = <Py_ssize_t>read_long(c)
    cdef const uint8_t *p = take(c, n)
    cdef int64_t micros = 0
    if c.bad:
        return 0
    if col.text == TEXT_NULL and utf8_valid(p, n):
        col.nulls += 1
        return 1
    if col.text == TEXT_TIME and _time_micros(p, n, &micros):
        (<int64_t *>col.values)[row] = micros
        _set_bit(col.valid, row)
        return 1
    return 0


cdef inline int _value(Column *col, Cursor *c, Py_ssize_t row) except -1:
    cdef int op = col.op
    cdef int64_t v
    cdef Py_ssize_t n
    cdef const uint8_t *p
    if op == A_INT64:
        v = read_long(c)
        if c.bad:
            return 0
        (<int64_t *>col.values)[row] = v
    elif op == A_UTF8 or op == A_BINARY:
        n = <Py_ssize_t>read_long(c)
        p = take(c, n)
        if c.bad or (op == A_UTF8 and not utf8_valid(p, n)):
            return 0
        return _append(col, p, n, row)
    elif op == A_INT32:
        v = read_long(c)
        if c.bad or not INT32_MIN <= v <= INT32_MAX:
            return 0
        (<int32_t *>col.values)[row] = <int32_t>v
    elif op == A_FLOAT64:
        p = take(c, 8)
        if c.bad:
            return 0
        memcpy(col.values + 8 * row, p, 8)
    else:
        return _other_value(col, c, row)
    _set_bit(col.valid, row)
    return 1


cdef int _other_value(Column *col, Cursor *c, Py_ssize_t row) except -1:
    """The operations less common than integers, text and doubles."""
    cdef int op = col.op
    cdef int64_t v
    cdef Py_ssize_t n
    cdef const uint8_t *p
    cdef float f
    cdef double d
    cdef aa_int128 unscaled = 0
    if op == A_DECIMAL or op == A_INT_DECIMAL:
        if op == A_INT_DECIMAL:
            unscaled = read_long(c)
        else:
            n = <Py_ssize_t>read_long(c)
            p = take(c, n)
            if c.bad or not _unscaled(p, n, &unscaled):
                return 0
        if c.bad or aa_mul_overflow(unscaled, col.factor, &unscaled):
            return 0
        memcpy(col.values + 16 * row, &unscaled, 16)  # Arrow's decimal128: native order
    elif op == A_ENUM:
        v = read_long(c)
        if c.bad or v < 0 or v >= col.nsymbols:
            return 0
        return _append(col, <const uint8_t *>col.symbols[v], col.symbol_sizes[v], row)
    elif op == A_FLOAT32 or op == A_FLOAT64_OF_FLOAT:
        p = take(c, 4)
        if c.bad:
            return 0
        if op == A_FLOAT32:
            memcpy(col.values + 4 * row, p, 4)
        else:
            memcpy(&f, p, 4)
            d = <double>f
            memcpy(col.values + 8 * row, &d, 8)
    elif op == A_BOOLEAN:
        p = take(c, 1)
        if c.bad or p[0] > 1:
            return 0
        if p[0]:
            _set_bit(<uint8_t *>col.values, row)
    elif op == A_VALUES:
        n = <Py_ssize_t>read_long(c)
        p = take(c, n)
        if c.bad:
            return 0
        value = PyBytes_FromStringAndSize(<const char *>p, n)
        return PyList_Append(<object>col.collected, value) + 1
    else:  # A_NULL: its union has no other branch
        return 0
    _set_bit(col.valid, row)
    return 1


cdef inline int _append(Column *col, const uint8_t *p, Py_ssize_t n, Py_ssize_t row
                        ) except -1:
    """A binary or string value: its bytes, its end offset and its validity bit; 0 past the
    2 GiB an int32 offset reaches."""
    if col.data.size + n > INT32_MAX:
        return 0
    if _reserve(&col.data, n) < 0:
        return -1
    memcpy(col.data.data + col.data.size, p, n)
    col.data.size += n
    (<int32_t *>col.values)[row + 1] = <int32_t>col.data.size
    _set_bit(col.valid, row)
    return 1


cdef int _read(Column *columns, int nfields, const uint8_t *p, Py_ssize_t size) except -1:
    """Every record of the (framing-checked) blocks; 0 where the Python path must take
    over."""
    cdef Cursor c
    cdef Py_ssize_t row = 0, count, length
    cdef int i, done
    c.p = p
    c.pos = 0
    c.bad = False
    while c.pos < size:
        c.end = size
        count = <Py_ssize_t>read_long(&c)
        length = <Py_ssize_t>read_long(&c)
        c.end = c.pos + length  # a record may not read into the next block
        while count > 0:
            for i in range(nfields):
                done = _field(&columns[i], &c, row)
                if done <= 0:
                    return done
            row += 1
            count -= 1
        if c.pos != c.end:
            return 0
        c.pos += SYNC_SIZE
    return 1


cdef class _Memory:
    """A buffer this module allocated, handed to Arrow without a copy: Arrow keeps this
    object while it uses the memory, and the memory is freed with it."""

    cdef char *data
    cdef Py_ssize_t size

    def __dealloc__(self):
        free(self.data)

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self.data, self.size, 1, flags)


cdef object _handed_over(char **data, Py_ssize_t size):
    """A pa.Buffer of ``size`` bytes at ``data[0]``, which it now owns (``data[0]`` is
    cleared so that _release leaves it)."""
    cdef _Memory memory = _Memory.__new__(_Memory)
    memory.data = data[0] if data[0] != NULL else <char *>malloc(1)
    memory.size = size
    data[0] = NULL
    if memory.data == NULL:
        raise MemoryError()
    return pa.py_buffer(memory)


cdef class BlockDecoder:
    """The records of one table version's blocks to the Arrow arrays of its stored fields,
    one chunk at a time (its columns' buffers are reused: a partition reader's own)."""

    cdef int nfields
    cdef Column *columns
    cdef list types      # per field: the Arrow type of its array
    cdef list extras     # per field: enum symbols, the Python builder of A_VALUES, or None
    cdef list collected  # per field during decode: the values of A_VALUES, else None

    def __cinit__(self, list program):
        """``program``: per stored field, (op, union shape, text rule, power of ten, Arrow
        type, extra), as arrow.py builds it."""
        cdef int i
        self.nfields = len(program)
        self.columns = <Column *>calloc(self.nfields + 1, sizeof(Column))
        if self.columns == NULL:
            raise MemoryError()
        self.types = []
        self.extras = []
        self.collected = []
        for i in range(self.nfields):
            op, shape, text, power, arrow_type, extra = program[i]
            self._define(&self.columns[i], op, shape, text, power, extra)
            self.types.append(arrow_type)
            self.extras.append(extra)

    cdef int _define(self, Column *col, int op, int shape, int text, int power, object extra
                     ) except -1:
        cdef Py_ssize_t k
        if not 0 <= power <= MAX_POWER:
            raise ValueError(f"no int128 holds 10 ** {power}")
        col.op = op
        col.shape = shape
        col.text = text
        col.factor = 1
        for _ in range(power):
            col.factor *= 10
        if op == A_ENUM:
            symbols = <tuple>extra
            col.nsymbols = len(symbols)
            col.symbols = <const char **>calloc(col.nsymbols + 1, sizeof(char *))
            col.symbol_sizes = <Py_ssize_t *>calloc(col.nsymbols + 1, sizeof(Py_ssize_t))
            if col.symbols == NULL or col.symbol_sizes == NULL:
                raise MemoryError()
            for k in range(col.nsymbols):
                col.symbols[k] = PyBytes_AS_STRING(symbols[k])
                col.symbol_sizes[k] = PyBytes_GET_SIZE(symbols[k])
        return 0

    def __dealloc__(self):
        cdef int i
        if self.columns != NULL:
            self._release()
            for i in range(self.nfields):
                free(self.columns[i].symbols)
                free(self.columns[i].symbol_sizes)
            free(self.columns)

    def decode(self, const uint8_t[::1] data, bytes sync):
        """The arrays (one per stored field, in the schema's order) of every record in
        ``data`` (bytes, or a view of a receive buffer), null-codec blocks each followed by
        ``sync``; None when the Python path must decode them."""
        cdef Py_ssize_t size = data.shape[0]
        cdef const uint8_t *p = &data[0] if size else <const uint8_t *>b""
        cdef Py_ssize_t rows
        if PyBytes_GET_SIZE(sync) != SYNC_SIZE:
            return None
        rows = _record_count(p, size, <const uint8_t *>PyBytes_AS_STRING(sync))
        if rows < 0:
            return None
        try:
            self._allocate(rows)
            if not _read(self.columns, self.nfields, p, size):
                return None
            return [self._array(i, rows) for i in range(self.nfields)]
        finally:
            self._release()

    cdef int _allocate(self, Py_ssize_t rows) except -1:
        cdef Column *col
        cdef int i
        self.collected = []
        for i in range(self.nfields):
            col = &self.columns[i]
            col.nulls = 0
            col.valid = <uint8_t *>calloc((rows + 7) // 8 + 1, 1)
            col.values = <char *>calloc(_values_size(col.op, rows) + 1, 1)
            if col.valid == NULL or col.values == NULL:
                raise MemoryError()
            if _variable(col.op) and col.data_hint:  # not doubling its way there again
                if _reserve(&col.data, col.data_hint + col.data_hint // 8) < 0:
                    return -1
            values = [] if col.op == A_VALUES else None
            self.collected.append(values)
            col.collected = <PyObject *>values
        return 0

    cdef void _release(self) noexcept:
        cdef Column *col
        cdef int i
        for i in range(self.nfields):
            col = &self.columns[i]
            free(col.valid)
            free(col.values)
            free(col.data.data)
            col.valid = NULL
            col.values = NULL
            col.data.data = NULL
            col.data.size = col.data.capacity = 0
            col.collected = NULL
        self.collected = []

    cdef object _array(self, int i, Py_ssize_t rows):
        cdef Column *col = &self.columns[i]
        arrow_type = self.types[i]
        if col.op == A_VALUES:
            return self.extras[i](tuple(self.collected[i]))
        if col.op == A_NULL:
            return pa.nulls(rows, arrow_type)
        valid = _handed_over(<char **>&col.valid, (rows + 7) // 8) if col.nulls else None
        buffers = [valid, _handed_over(&col.values, _values_size(col.op, rows))]
        if _variable(col.op):
            col.data_hint = col.data.size
            buffers.append(_handed_over(&col.data.data, col.data.size))
        return pa.Array.from_buffers(arrow_type, rows, buffers, null_count=col.nulls)
