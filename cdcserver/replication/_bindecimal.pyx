# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""MariaDB's binary DECIMAL (strings/decimal.cc, bin2decimal) to ``Decimal`` in C, for the row
decoder (``cdcserver/replication/rowcodec.py``): what ``values.DecimalFormat.decode`` makes
of the same bytes, without building an int and then text for ``Decimal`` to parse. Up to 38
digits, where ``_cdecimal.pxd``'s layout was verified at import; anything else (more digits,
a group out of range, a value of the wrong size) goes to ``DecimalFormat.decode``, which
gives its value or raises its error as before (tests/unit/test_binary_decimal.py compares the
two)."""

from libc.stdint cimport uint8_t, uint32_t, uint64_t

from mariadb_cdc_client.format cimport _cdecimal

from decimal import Decimal

cdef extern from *:
    """
    typedef unsigned __int128 bd_uint128;
    """
    ctypedef unsigned long long bd_uint128

cdef extern from "Python.h":
    char *PyBytes_AS_STRING(object o)
    Py_ssize_t PyBytes_GET_SIZE(object o)

cdef uint32_t[10] POWERS
POWERS[0] = 1
for _i in range(1, 10):
    POWERS[_i] = POWERS[_i - 1] * 10

DECIMAL = Decimal


cdef int _digits(bd_uint128 u) noexcept:
    cdef int n = 1
    while u >= 10:
        u //= 10
        n += 1
    return n


cdef class BinaryDecimal:
    """One DECIMAL(precision, scale) column's values: ``decoder(raw) -> Decimal``."""

    cdef int size
    cdef int scale
    cdef int ngroups
    cdef int[16] group_bytes
    cdef int[16] group_digits
    cdef bint direct
    cdef object python  # DecimalFormat.decode: the values this one leaves

    def __cinit__(self, int precision, int scale, tuple groups, object python):
        """``groups``: DecimalFormat.groups, (bytes, digits) from the most significant."""
        cdef int i
        self.scale = scale
        self.python = python
        self.ngroups = len(groups)
        self.direct = DIRECT and precision <= 38 and 0 <= scale <= precision \
            and self.ngroups <= 16
        self.size = 0
        for i in range(min(self.ngroups, 16)):
            self.group_bytes[i], self.group_digits[i] = groups[i]
            self.size += self.group_bytes[i]

    def __call__(self, bytes raw):
        cdef const uint8_t *p
        cdef uint8_t first, flip
        cdef uint32_t group
        cdef bd_uint128 u = 0
        cdef int i, k, at = 0
        cdef bint negative
        if not self.direct or PyBytes_GET_SIZE(raw) != self.size or self.size == 0:
            return self.python(raw)
        p = <const uint8_t *>PyBytes_AS_STRING(raw)
        negative = not (p[0] & 0x80)
        flip = 0xFF if negative else 0
        for i in range(self.ngroups):
            group = 0
            for k in range(self.group_bytes[i]):
                first = p[at] ^ flip
                if at == 0:
                    first ^= 0x80  # the sign bit
                group = (group << 8) | first
                at += 1
            if group >= POWERS[self.group_digits[i]]:
                return self.python(raw)  # not a group MariaDB writes
            u = u * POWERS[self.group_digits[i]] + group
        return _cdecimal.made(DECIMAL, <uint64_t>(u % _cdecimal.DECIMAL_RADIX),
                              <uint64_t>(u // _cdecimal.DECIMAL_RADIX), _digits(u),
                              -self.scale, negative and u != 0)


cdef bint _verified():
    if not _cdecimal.layout_fits(DECIMAL):
        return False
    try:
        for text in ("0.00", "-12.50", "7", "-9999999999999999999",
                     "12345678901234567890123.45", "-99999999999999999999999999999999999.999"):
            real = DECIMAL(text)
            if not _cdecimal.reads_as(real):
                return False
            sign, coefficient, exponent = real.as_tuple()
            u = int("".join(map(str, coefficient)))
            made = _cdecimal.made(DECIMAL, u % 10 ** 19, u // 10 ** 19, len(coefficient),
                                  exponent, sign)
            if made.as_tuple() != real.as_tuple() or made != real or hash(made) != hash(real):
                return False
    except Exception:  # noqa: BLE001 - any doubt: the Python path
        return False
    return True


cdef bint DIRECT = _verified()


def made_directly():
    """Whether this module makes Decimals itself (else every value goes to Python)."""
    return DIRECT
