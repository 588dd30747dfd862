# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Binlog row images straight to Avro, in C.

``Transcoder.rows`` reads a rows event's row images (the format ``rowcodec.py`` documents) and
writes the Avro encoding of each row's columns, creating no Python object per value. It handles
the column types whose Avro form is a plain function of their bytes; ``transcoder.py`` builds
its program and keeps every other table on the Python path. Wherever the Python decoder would
raise or produce a value that needs Python to render (an impossible date, invalid UTF-8, a
truncated row, a negative TIME) it returns None and the caller takes the Python path for the
whole event, so both paths give identical bytes and identical errors.

A column may carry a ``[capture]`` rule (``masking.py``), applied after the value is read and
checked as above: ``exclude`` writes nothing; ``hash`` writes the 64 hex digits of the
SHA-256 of the salt and the value's bytes (a text's UTF-8, a BINARY's padded bytes), as
``capture.hash_value``; ``mask:N`` writes the first N characters (bytes of binary data) and
``***``, as ``capture.mask_value``. SHA-256 is libcrypto's, which ``transcoder.py`` finds at run
time and hands over by address (``use_sha256``): no OpenSSL headers are needed to build this.

``records`` then prefixes each row's columns with the record's metadata fields.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from libc.stddef cimport size_t
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.errno cimport EINTR, errno
from libc.string cimport memcpy, memset
from posix.unistd cimport write
from cpython.exc cimport PyErr_CheckSignals, PyErr_SetFromErrno

from cdcserver._cbuffer cimport Out, reserve as _reserve
from mariadb_cdc_client.format._cvalues cimport be as _be, frac_micros as _frac_micros, le as _le
from mariadb_cdc_client.format._cvalues cimport valid_date as _valid_date
from mariadb_cdc_client.format._cavro cimport utf8_valid as _utf8_valid

# Column operations (transcoder.py names them; keep in step).
cdef enum:
    OP_INT8 = 1
    OP_UINT8 = 2
    OP_INT16 = 3
    OP_UINT16 = 4
    OP_INT24 = 5
    OP_UINT24 = 6
    OP_INT32 = 7
    OP_UINT32 = 8
    OP_INT64 = 9
    OP_UINT64 = 10     # BIGINT UNSIGNED: Avro decimal(20, 0)
    OP_FLOAT = 11
    OP_DOUBLE = 12
    OP_YEAR = 13
    OP_DECIMAL = 14    # a: digits of the leading group, b: full groups, c: digits of the last
    OP_UTF8 = 15       # a: bytes of the length prefix
    OP_BYTES = 16      # a: bytes of the length prefix
    OP_BINARY = 17     # a: bytes of the length prefix, b: the column's length (NUL padded)
    OP_CHARMAP = 18    # a: bytes of the length prefix; a single-byte character set
    OP_ENUM = 19       # a: bytes of the index
    OP_BIT_BOOL = 20   # a: bytes
    OP_BIT_LONG = 21   # a: bytes
    OP_BIT_U64 = 22    # a: bytes
    OP_DATE = 23
    OP_DATETIME2 = 24  # a: fractional-second precision
    OP_TIMESTAMP2 = 25 # a: fractional-second precision
    OP_TIME2 = 26      # a: fractional-second precision

# Column rules (transcoder.py names them): only the string operations hash or mask.
cdef enum:
    RULE_EXCLUDE = 1   # read and checked, not written
    RULE_HASH = 2      # the hex SHA-256 of the salt and the value
    RULE_MASK = 3      # keep: the characters (bytes, for binary data) kept before "***"

# libcrypto's SHA256_Init/_Update/_Final (use_sha256). The context is copied per value from
# the salt's, so it must be a plain struct: OpenSSL's SHA256_CTX (112 bytes) is, and fits.
cdef struct ShaCtx:
    uint64_t words[32]

ctypedef int (*ShaInit)(ShaCtx *ctx) noexcept nogil
ctypedef int (*ShaUpdate)(ShaCtx *ctx, const void *data, size_t n) noexcept nogil
ctypedef int (*ShaFinal)(uint8_t *digest, ShaCtx *ctx) noexcept nogil

cdef ShaInit _sha_init = NULL
cdef ShaUpdate _sha_update = NULL
cdef ShaFinal _sha_final = NULL
cdef char _HEX_PAIRS[512]  # each byte's two lowercase hex digits


cdef void _hex_pairs() noexcept:
    cdef const char *digits = b"0123456789abcdef"
    cdef int k
    for k in range(256):
        _HEX_PAIRS[2 * k] = digits[k >> 4]
        _HEX_PAIRS[2 * k + 1] = digits[k & 15]


_hex_pairs()

cdef int64_t _DAY_MICROS = 86400000000
cdef int64_t[10] _POW10 = [1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000,
                           1000000000]
cdef int[10] _DIG2BYTES = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]


cdef inline void _byte(Out *out, uint8_t b) noexcept:
    out.data[out.size] = <char>b
    out.size += 1


cdef inline void _varint(Out *out, uint64_t z) noexcept:
    while z > 0x7F:
        out.data[out.size] = <char>((z & 0x7F) | 0x80)
        out.size += 1
        z >>= 7
    out.data[out.size] = <char>z
    out.size += 1


cdef inline void _long(Out *out, int64_t v) noexcept:
    _varint(out, (<uint64_t>v << 1) ^ <uint64_t>(v >> 63))


cdef inline void _raw(Out *out, const uint8_t *p, Py_ssize_t n) noexcept:
    memcpy(out.data + out.size, p, n)
    out.size += n


cdef inline int _bit_length(uint64_t v) noexcept:
    cdef int n = 0
    while v:
        n += 1
        v >>= 1
    return n


cdef int _decimal_bytes(Out *out, uint64_t bits, bint negative) except -1:
    """Avro bytes: the shortest big-endian two's complement (encoder.decimal_bytes) of a
    value given as its 64 low bits and its sign: an int64 (``negative`` = v < 0) or a
    uint64 (``negative`` False), which may need a ninth byte."""
    cdef int size = _bit_length(~bits if negative else bits) // 8 + 1
    cdef int i
    _reserve(out, 16)
    _varint(out, <uint64_t>size << 1)
    for i in range(size - 1, -1, -1):
        _byte(out, <uint8_t>((bits >> (8 * i)) & 0xFF) if i < 8 else
              (0xFF if negative else 0))
    return 0


cdef inline int64_t _days(int64_t y, int64_t m, int64_t d) noexcept:
    """Days since 1970-01-01 in the proleptic Gregorian calendar (H. Hinnant's
    days_from_civil), as ``date.toordinal() - 719163``."""
    if m <= 2:
        y -= 1
    cdef int64_t era = y // 400
    cdef int64_t yoe = y - era * 400
    cdef int64_t mp = m - 3 if m > 2 else m + 9
    cdef int64_t doy = (153 * mp + 2) // 5 + d - 1
    cdef int64_t doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def use_sha256(size_t init, size_t update, size_t final):
    """Hash with the functions at these addresses (SHA256_Init, SHA256_Update, SHA256_Final
    of libcrypto; zeros: none, and no Transcoder with a hashed column can be made)."""
    global _sha_init, _sha_update, _sha_final
    _sha_init = <ShaInit>init
    _sha_update = <ShaUpdate>update
    _sha_final = <ShaFinal>final


def sha256(bytes salt, bytes data):
    """The SHA-256 digest of ``salt + data`` as the transcoder computes it (its check)."""
    cdef ShaCtx ctx
    cdef uint8_t digest[32]
    _sha_start(&ctx, salt)
    _sha_update(&ctx, PyBytes_AS_STRING(data), <size_t>PyBytes_GET_SIZE(data))
    _sha_final(digest, &ctx)
    return PyBytes_FromStringAndSize(<char *>digest, 32)


cdef int _sha_start(ShaCtx *ctx, bytes salt) except -1:
    """A context holding the salt."""
    if _sha_init == NULL or _sha_update == NULL or _sha_final == NULL:
        raise ValueError("no SHA-256 functions (use_sha256)")
    memset(ctx, 0, sizeof(ShaCtx))
    if not _sha_init(ctx) or not _sha_update(ctx, PyBytes_AS_STRING(salt),
                                              <size_t>PyBytes_GET_SIZE(salt)):
        raise ValueError("SHA-256 failed")
    return 0


cdef inline int _head(Out *out, Py_ssize_t n) except -1:
    """The union's first branch (string or bytes) and the length of a value of ``n`` bytes,
    with room for the value."""
    _reserve(out, n + 12)
    _byte(out, 2)
    _varint(out, <uint64_t>n << 1)
    return 0


cdef inline Py_ssize_t _utf8_prefix(const uint8_t *data, Py_ssize_t n, Py_ssize_t chars
                                    ) noexcept:
    """The bytes of the first ``chars`` characters of valid UTF-8 text."""
    cdef Py_ssize_t k
    if chars >= n:
        return n
    for k in range(n):
        if (data[k] & 0xC0) != 0x80:  # a character starts
            if chars == 0:
                return k
            chars -= 1
    return n


cdef inline Py_ssize_t _charmap_size(const uint8_t *table, const uint8_t *data, Py_ssize_t n
                                     ) noexcept:
    """The UTF-8 bytes of ``n`` characters of a single-byte set; -1 when one has none. The
    table has 256 entries of 4 bytes: the UTF-8 length (0: undecodable), then up to 3 bytes."""
    cdef Py_ssize_t k, size = 0
    for k in range(n):
        if table[4 * data[k]] == 0:
            return -1
        size += table[4 * data[k]]
    return size


cdef inline void _charmap(Out *out, const uint8_t *table, const uint8_t *data, Py_ssize_t n
                          ) noexcept:
    cdef Py_ssize_t k
    cdef const uint8_t *entry
    for k in range(n):
        entry = table + 4 * data[k]
        _raw(out, entry + 1, entry[0])


cdef int _text(Out *out, bytes text) except -1:
    """The union's string branch (index 2) holding ``text``."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(text)
    _reserve(out, n + 12)
    _byte(out, 4)
    _varint(out, <uint64_t>n << 1)
    _raw(out, <const uint8_t *>PyBytes_AS_STRING(text), n)
    return 0


cdef class Transcoder:
    """Row images of one table layout to the Avro encoding of their columns."""

    cdef int ncols
    cdef int bitmap_bytes
    cdef int *ops
    cdef int *a
    cdef int *b
    cdef int *c
    cdef bint *nullable
    cdef int *rules
    cdef Py_ssize_t *keep
    cdef list extras  # per column: ENUM labels (encoded) or a character set's table
    cdef ShaCtx salted  # for hashed columns: the SHA-256 context after the salt
    cdef ShaUpdate sha_update  # the functions it was made with (use_sha256 may change)
    cdef ShaFinal sha_final

    def __cinit__(self, list program, bytes salt=None):
        """``program``: per column of the row image, (op, nullable, a, b, c, extra, rule,
        keep) as ``transcoder._step`` makes it; ``salt``: the hash's, if a column has one."""
        cdef int i, n = len(program)
        self.ncols = n
        self.bitmap_bytes = (n + 7) // 8
        self.ops = <int *>malloc(sizeof(int) * (n + 1))
        self.a = <int *>malloc(sizeof(int) * (n + 1))
        self.b = <int *>malloc(sizeof(int) * (n + 1))
        self.c = <int *>malloc(sizeof(int) * (n + 1))
        self.nullable = <bint *>malloc(sizeof(bint) * (n + 1))
        self.rules = <int *>malloc(sizeof(int) * (n + 1))
        self.keep = <Py_ssize_t *>malloc(sizeof(Py_ssize_t) * (n + 1))
        if (self.ops == NULL or self.a == NULL or self.b == NULL or self.c == NULL
                or self.nullable == NULL or self.rules == NULL or self.keep == NULL):
            raise MemoryError()
        self.extras = []
        for i in range(n):
            op, nullable, a, b, c, extra, rule, keep = program[i]
            self.ops[i] = op
            self.nullable[i] = nullable
            self.a[i] = a
            self.b[i] = b
            self.c[i] = c
            self.extras.append(extra)
            self.rules[i] = rule
            self.keep[i] = keep
            if (rule == RULE_HASH or rule == RULE_MASK) and not (
                    OP_UTF8 <= op <= OP_CHARMAP):
                raise ValueError("only strings are hashed or masked")
            if rule == RULE_HASH:
                if not salt:
                    raise ValueError("a hashed column without a salt")
                _sha_start(&self.salted, salt)
                self.sha_update = _sha_update
                self.sha_final = _sha_final

    def __dealloc__(self):
        free(self.ops)
        free(self.a)
        free(self.b)
        free(self.c)
        free(self.nullable)
        free(self.rules)
        free(self.keep)

    def rows(self, buf, Py_ssize_t pos, Py_ssize_t end):
        """``(columns, ends)`` for the row images in ``buf[pos:end]``: the rows' Avro column
        encodings back to back and, as little-endian uint32s, where each row's ends. None when
        an image needs the Python path."""
        cdef const uint8_t[::1] view = buf
        cdef Out out
        cdef Out ends
        cdef int ok
        if end > view.shape[0] or pos < 0 or pos > end:
            return None
        if pos == end:
            return (b"", b"")
        out.data = NULL
        out.size = out.capacity = 0
        ends.data = NULL
        ends.size = ends.capacity = 0
        try:
            ok = self._rows(&view[0], pos, end, &out, &ends)
            if not ok:
                return None
            return (PyBytes_FromStringAndSize(out.data, out.size),
                    PyBytes_FromStringAndSize(ends.data, ends.size))
        finally:
            free(out.data)
            free(ends.data)

    cdef int _rows(self, const uint8_t *p, Py_ssize_t pos, Py_ssize_t end, Out *out,
                   Out *ends) except -1:
        cdef const uint8_t *null_bytes
        cdef int i
        cdef uint32_t row_end
        cdef Py_ssize_t kept
        while pos < end:
            if pos + self.bitmap_bytes > end:
                return 0
            null_bytes = p + pos
            pos += self.bitmap_bytes
            for i in range(self.ncols):
                if self.nullable[i] and (null_bytes[i >> 3] >> (i & 7)) & 1:
                    if self.rules[i] != RULE_EXCLUDE:
                        _reserve(out, 1)
                        _byte(out, 0)
                    continue
                kept = out.size
                pos = self._column(i, p, pos, end, out)
                if pos < 0:
                    return 0
                if self.rules[i] == RULE_EXCLUDE:  # read and checked, not written
                    out.size = kept
            _reserve(ends, 4)
            row_end = <uint32_t>out.size
            memcpy(ends.data + ends.size, &row_end, 4)
            ends.size += 4
        return pos == end

    cdef Py_ssize_t _column(self, int i, const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                            Out *out) except -2:
        """Append column i's union branch and value; the position after it, or -1 when the
        value needs the Python path."""
        cdef int op = self.ops[i]
        cdef int a = self.a[i]
        cdef int64_t v
        cdef uint64_t u
        cdef Py_ssize_t n
        _reserve(out, 32)
        if op <= OP_INT64:
            if op == OP_INT8 or op == OP_UINT8:
                n = 1
            elif op == OP_INT16 or op == OP_UINT16:
                n = 2
            elif op == OP_INT24 or op == OP_UINT24:
                n = 3
            elif op == OP_INT32 or op == OP_UINT32:
                n = 4
            else:
                n = 8
            if pos + n > end:
                return -1
            u = _le(p + pos, <int>n)
            if op % 2 == 1 and n < 8 and u >> (8 * n - 1):  # signed and negative
                v = <int64_t>u - (<int64_t>1 << (8 * n))
            else:
                v = <int64_t>u
            _byte(out, 2)
            _long(out, v)
            return pos + n
        if op == OP_UINT64:
            if pos + 8 > end:
                return -1
            _byte(out, 2)
            _decimal_bytes(out, _le(p + pos, 8), False)
            return pos + 8
        if op == OP_FLOAT or op == OP_DOUBLE:
            n = 4 if op == OP_FLOAT else 8
            if pos + n > end:
                return -1
            _byte(out, 2)
            _raw(out, p + pos, n)
            return pos + n
        if op == OP_YEAR:
            if pos + 1 > end:
                return -1
            v = p[pos]
            _byte(out, 2)
            _long(out, v + 1900 if v else 0)
            return pos + 1
        if op == OP_DECIMAL:
            return self._decimal(i, p, pos, end, out)
        if op == OP_UTF8 or op == OP_BYTES or op == OP_BINARY or op == OP_CHARMAP:
            return self._string(i, p, pos, end, out)
        if op == OP_ENUM:
            if pos + a > end:
                return -1
            v = <int64_t>_le(p + pos, a)
            labels = <tuple>self.extras[i]
            label = <bytes>(labels[v - 1] if 0 < v <= len(labels) else b"\x00")
            n = PyBytes_GET_SIZE(label)
            _reserve(out, n + 1)
            _byte(out, 2)
            _raw(out, <const uint8_t *>PyBytes_AS_STRING(label), n)
            return pos + a
        if op == OP_BIT_BOOL or op == OP_BIT_LONG or op == OP_BIT_U64:
            if pos + a > end:
                return -1
            u = _be(p + pos, a)
            _byte(out, 2)
            if op == OP_BIT_BOOL:
                _byte(out, 1 if u else 0)
            elif op == OP_BIT_LONG:
                _long(out, <int64_t>u)
            else:
                _decimal_bytes(out, u, False)
            return pos + a
        if op == OP_DATE:
            return self._date(p, pos, end, out)
        if op == OP_DATETIME2:
            return self._datetime2(a, p, pos, end, out)
        if op == OP_TIMESTAMP2:
            return self._timestamp2(a, p, pos, end, out)
        if op == OP_TIME2:
            return self._time2(a, p, pos, end, out)
        return -1

    cdef Py_ssize_t _decimal(self, int i, const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                             Out *out) except -2:
        """DECIMAL of at most 18 digits (DecimalFormat.unscaled, exactly)."""
        cdef int lead = self.a[i], full = self.b[i], last = self.c[i]
        cdef int size = _DIG2BYTES[lead] + 4 * full + _DIG2BYTES[last]
        cdef uint8_t raw[32]
        cdef bint negative
        cdef int k, at = 0
        cdef uint64_t group
        cdef int64_t value = 0
        if pos + size > end or size > 32:
            return -1
        memcpy(raw, p + pos, size)
        negative = not (raw[0] & 0x80)
        raw[0] ^= 0x80
        if negative:
            for k in range(size):
                raw[k] ^= 0xFF
        if lead:
            group = _be(raw, _DIG2BYTES[lead])
            if group >= <uint64_t>_POW10[lead]:
                return -1
            value = <int64_t>group
            at = _DIG2BYTES[lead]
        for k in range(full):
            group = _be(raw + at, 4)
            if group >= 1000000000:
                return -1
            value = value * 1000000000 + <int64_t>group
            at += 4
        if last:
            group = _be(raw + at, _DIG2BYTES[last])
            if group >= <uint64_t>_POW10[last]:
                return -1
            value = value * _POW10[last] + <int64_t>group
        _byte(out, 2)
        value = -value if negative else value
        _decimal_bytes(out, <uint64_t>value, value < 0)
        return pos + size

    cdef Py_ssize_t _string(self, int i, const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                            Out *out) except -2:
        """CHAR, VARCHAR, TEXT, BINARY, BLOB: read and checked as the Python decoder does,
        then written under the column's rule."""
        cdef int op = self.ops[i]
        cdef int prefix = self.a[i]
        cdef int rule = self.rules[i]
        cdef Py_ssize_t n, padded, size = 0
        cdef const uint8_t *data
        cdef const uint8_t *table = NULL
        if pos + prefix > end:
            return -1
        n = <Py_ssize_t>_le(p + pos, prefix)
        pos += prefix
        if n > end - pos:
            return -1
        data = p + pos
        if op == OP_UTF8:
            if not _utf8_valid(data, n):
                return -1
        elif op == OP_CHARMAP:
            table = <const uint8_t *>PyBytes_AS_STRING(<bytes>self.extras[i])
            size = _charmap_size(table, data, n)
            if size < 0:
                return -1
        if rule == RULE_EXCLUDE:
            return pos + n
        if rule == RULE_HASH:
            self._hash(i, data, n, table, out)
        elif rule == RULE_MASK:
            self._mask(i, data, n, table, out)
        elif op == OP_CHARMAP:
            _head(out, size)
            _charmap(out, table, data, n)
        else:
            padded = self.b[i] if self.b[i] > n else n  # BINARY(b): NUL padded
            _head(out, padded)
            _raw(out, data, n)
            memset(out.data + out.size, 0, padded - n)
            out.size += padded - n
        return pos + n

    cdef int _hash(self, int i, const uint8_t *data, Py_ssize_t n, const uint8_t *table,
                   Out *out) except -1:
        """The 64 hex digits of SHA-256(salt + the value): a text's UTF-8, BINARY's padded
        bytes."""
        cdef ShaCtx ctx
        cdef uint8_t digest[32]
        cdef uint8_t chunk[1024]
        cdef const uint8_t *entry
        cdef Py_ssize_t k = 0, at, pad = self.b[i] - n
        memcpy(&ctx, &self.salted, sizeof(ShaCtx))
        if table != NULL:  # a single-byte set, to UTF-8 a chunk at a time
            while k < n:
                at = 0
                while k < n and at <= 1024 - 3:
                    entry = table + 4 * data[k]
                    memcpy(chunk + at, entry + 1, 3)
                    at += entry[0]
                    k += 1
                self.sha_update(&ctx, chunk, <size_t>at)
        else:
            self.sha_update(&ctx, data, <size_t>n)
            if pad > 0:
                memset(chunk, 0, 1024)
            while pad > 0:  # BINARY's NUL padding
                self.sha_update(&ctx, chunk, <size_t>(pad if pad < 1024 else 1024))
                pad -= 1024
        self.sha_final(digest, &ctx)
        _head(out, 64)
        for k in range(32):
            memcpy(out.data + out.size + 2 * k, _HEX_PAIRS + 2 * digest[k], 2)
        out.size += 64
        return 0

    cdef int _mask(self, int i, const uint8_t *data, Py_ssize_t n, const uint8_t *table,
                   Out *out) except -1:
        """The first ``keep`` characters (bytes, for binary data, BINARY's padding
        included), then ``***``."""
        cdef int op = self.ops[i]
        cdef Py_ssize_t keep = self.keep[i]
        cdef Py_ssize_t cut, copied, padded
        cdef const char *tail = b"***"
        if op == OP_UTF8:
            cut = _utf8_prefix(data, n, keep)
            _head(out, cut + 3)
            _raw(out, data, cut)
        elif op == OP_CHARMAP:
            cut = keep if keep < n else n
            _head(out, _charmap_size(table, data, cut) + 3)
            _charmap(out, table, data, cut)
        else:
            padded = self.b[i] if self.b[i] > n else n
            cut = keep if keep < padded else padded
            copied = cut if cut < n else n
            _head(out, cut + 3)
            _raw(out, data, copied)
            memset(out.data + out.size, 0, cut - copied)
            out.size += cut - copied
        _raw(out, <const uint8_t *>tail, 3)
        return 0

    cdef Py_ssize_t _date(self, const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                          Out *out) except -2:
        cdef uint64_t v
        cdef int64_t day, month, year
        if pos + 3 > end:
            return -1
        v = _le(p + pos, 3)
        day, month, year = v & 31, (v >> 5) & 15, v >> 9
        if month > 12:
            return -1
        if _valid_date(year, month, day):
            _byte(out, 2)
            _long(out, _days(year, month, day))
        else:
            _text(out, f"{year:04d}-{month:02d}-{day:02d}".encode())
        return pos + 3

    cdef Py_ssize_t _datetime2(self, int fsp, const uint8_t *p, Py_ssize_t pos,
                               Py_ssize_t end, Out *out) except -2:
        cdef Py_ssize_t size = 5 + (fsp + 1) // 2
        cdef int64_t packed, ymd, hms, year_month, year, month, day, hour, minute, second
        cdef int64_t micros
        if pos + size > end:
            return -1
        packed = <int64_t>_be(p + pos, 5) - 0x8000000000
        micros = _frac_micros(p + pos + 5, fsp)
        if packed < 0 or micros < 0 or micros > 999999:
            return -1
        ymd, hms = packed >> 17, packed & 0x1FFFF
        year_month, day = ymd >> 5, ymd & 31
        year, month = year_month // 13, year_month % 13
        hour, minute, second = hms >> 12, (hms >> 6) & 63, hms & 63
        if month > 12 or day > 31 or hour > 23 or minute > 59 or second > 59:
            return -1
        if _valid_date(year, month, day):
            _byte(out, 2)
            _long(out, ((_days(year, month, day) * 86400 + hour * 3600 + minute * 60 + second)
                        * 1000000 + micros))
        else:
            text = f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"
            if fsp:
                text += f".{micros:06d}"[: fsp + 1]
            _text(out, text.encode())
        return pos + size

    cdef Py_ssize_t _timestamp2(self, int fsp, const uint8_t *p, Py_ssize_t pos,
                                Py_ssize_t end, Out *out) except -2:
        cdef Py_ssize_t size = 4 + (fsp + 1) // 2
        cdef int64_t seconds, micros
        if pos + size > end:
            return -1
        seconds = <int64_t>_be(p + pos, 4)
        micros = _frac_micros(p + pos + 4, fsp)
        if seconds == 0 and micros == 0:
            _text(out, (b"0000-00-00 00:00:00" + (b"." + b"0" * fsp if fsp else b"")))
        else:
            _byte(out, 2)
            _long(out, seconds * 1000000 + micros)
        return pos + size

    cdef Py_ssize_t _time2(self, int fsp, const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                           Out *out) except -2:
        """TIME2 within 0..24h (values.time2, then the encoder's ``0 <= t < DAY`` test);
        anything else takes the Python path for its text form."""
        cdef int fb = (fsp + 1) // 2
        cdef int64_t packed, intpart, frac, hms, micros, t
        if pos + 3 + fb > end:
            return -1
        if fb == 3:
            packed = <int64_t>_be(p + pos, 6) - 0x800000000000
        else:
            intpart = <int64_t>_be(p + pos, 3) - 0x800000
            frac = <int64_t>_be(p + pos + 3, fb) if fb else 0
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x100 if fb == 1 else 0x10000
            packed = intpart * (1 << 24) + frac * (10000 if fb == 1 else 100)
        if packed < 0:
            return -1
        hms, micros = packed >> 24, packed & 0xFFFFFF
        t = ((((hms >> 12) & 0x3FF) * 60 + ((hms >> 6) & 63)) * 60 + (hms & 63)) * 1000000
        t += micros
        if t >= _DAY_MICROS:
            return -1
        _byte(out, 2)
        _long(out, t)
        return pos + 3 + fb


def records(bytearray out, bytes head, bytes tail_even, bytes tail_odd, bytes columns,
            bytes ends, int64_t event_no):
    """Append one Avro record per row: ``head`` (domain, server_id, sequence), the event
    number, the tail (timestamp, event_type; even and odd rows differ for updates) and the
    row's columns. Returns the next event number."""
    cdef Py_ssize_t count = PyBytes_GET_SIZE(ends) // 4
    cdef Py_ssize_t nhead = PyBytes_GET_SIZE(head)
    cdef Py_ssize_t ntail0 = PyBytes_GET_SIZE(tail_even), ntail1 = PyBytes_GET_SIZE(tail_odd)
    cdef Py_ssize_t ncols = PyBytes_GET_SIZE(columns)
    cdef Py_ssize_t start = PyByteArray_GET_SIZE(out)
    cdef Py_ssize_t bound = count * (nhead + 10 + max(ntail0, ntail1)) + ncols
    cdef const uint8_t *cols = <const uint8_t *>PyBytes_AS_STRING(columns)
    cdef const char *e = PyBytes_AS_STRING(ends)
    cdef uint32_t row_start = 0, row_end = 0
    cdef Py_ssize_t r
    cdef Out w
    PyByteArray_Resize(out, start + bound)
    w.data = PyByteArray_AS_STRING(out)
    w.size = start
    w.capacity = start + bound
    for r in range(count):
        memcpy(&row_end, e + 4 * r, 4)
        if row_end < row_start or row_end > ncols:
            PyByteArray_Resize(out, start)
            raise ValueError("row ends out of order")
        _raw(&w, <const uint8_t *>PyBytes_AS_STRING(head), nhead)
        _long(&w, event_no)
        event_no += 1
        if r & 1:
            _raw(&w, <const uint8_t *>PyBytes_AS_STRING(tail_odd), ntail1)
        else:
            _raw(&w, <const uint8_t *>PyBytes_AS_STRING(tail_even), ntail0)
        _raw(&w, cols + row_start, row_end - row_start)
        row_start = row_end
    PyByteArray_Resize(out, w.size)
    return event_no


def write_all(int fd, const unsigned char[::1] data):
    """``os.write`` until every byte is written, keeping the GIL. A block's write to the page
    cache takes microseconds; ``os.write`` releases the GIL for it and then waits to get it
    back from the replicator thread, which keeps it for up to the switch interval (5 ms):
    a sixth of the event loop's time in the profile of a catch-up."""
    cdef Py_ssize_t done = 0
    cdef Py_ssize_t size = data.shape[0]
    cdef ssize_t written
    while done < size:
        written = write(fd, &data[done], size - done)
        if written < 0:
            if errno == EINTR:
                PyErr_CheckSignals()
                continue
            PyErr_SetFromErrno(OSError)
        done += written
