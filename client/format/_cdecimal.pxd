"""Making ``decimal.Decimal`` objects in C without parsing text, shared by the client's
decoders (``_records.pyx``: a stream's Avro decimals and JSON numbers; ``_dumprows.pyx``: a
dump's decimal text). ``Decimal(text)`` costs about 0.2 us (argument parsing, then the
string), a third of a record's decoding.

The layout below is CPython's ``_decimal`` object (Modules/_decimal/_decimal.c, unchanged
since 3.3) and libmpdec's ``mpd_t`` on a 64-bit build. It is relied on only where
:func:`reads_as` confirmed it on Decimals ``_decimal`` itself made (read, never written),
and the Decimals made here then equal them digit for digit: each module checks that at
import and makes Decimals from their text otherwise. Inline functions only: no module of
its own is built or imported (setup.py puts ``client/`` on Cython's include path as
``mariadb_cdc_client``).
"""

from cpython.object cimport PyObject
from libc.stdint cimport uint8_t, uint64_t


cdef extern from *:
    """
    typedef struct {
        uint8_t flags;
        Py_ssize_t exp;
        Py_ssize_t digits;
        Py_ssize_t len;
        Py_ssize_t alloc;
        uint64_t *data;
    } cdec_mpd_t;
    typedef struct {
        PyObject_HEAD
        Py_hash_t hash;
        cdec_mpd_t dec;
        uint64_t data[4];
    } cdec_decimal;
    #define CDEC_MPD_NEG 1
    #define CDEC_MPD_STATIC 16
    #define CDEC_MPD_STATIC_DATA 32
    #define CDEC_RADIX 10000000000000000000ULL  /* libmpdec's word: 19 digits */
    static PyObject *cdec_alloc(PyObject *type) {
        return ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 0);
    }
    """
    ctypedef struct cdec_mpd_t:
        uint8_t flags
        Py_ssize_t exp
        Py_ssize_t digits
        Py_ssize_t len
        Py_ssize_t alloc
        uint64_t *data
    ctypedef struct cdec_decimal:
        Py_hash_t hash
        cdec_mpd_t dec
        uint64_t data[4]
    int MPD_NEG "CDEC_MPD_NEG"
    int MPD_STATIC "CDEC_MPD_STATIC"
    int MPD_STATIC_DATA "CDEC_MPD_STATIC_DATA"
    uint64_t DECIMAL_RADIX "CDEC_RADIX"
    object cdec_alloc(object type)


cdef inline bint layout_fits(object decimal_type) noexcept:
    """The object is the size this layout says, on a 64-bit build (the first checks)."""
    import sys
    return decimal_type.__basicsize__ == sizeof(cdec_decimal) and sys.maxsize == 2 ** 63 - 1


cdef inline object made(object decimal_type, uint64_t low, uint64_t high, int digits,
                        Py_ssize_t exponent, bint negative):
    """The Decimal ``(-1) ** negative * (high * 10 ** 19 + low) * 10 ** exponent`` as
    ``_decimal`` makes one (PyDecType_New, then its coefficient in words of 19 digits, the
    lowest first); ``digits``: the coefficient's (1 for zero)."""
    cdef cdec_decimal *d
    value = cdec_alloc(decimal_type)
    d = <cdec_decimal *><PyObject *>value
    d.hash = -1
    d.dec.flags = MPD_STATIC | MPD_STATIC_DATA | (MPD_NEG if negative else 0)
    d.dec.exp = exponent
    d.dec.digits = digits
    d.dec.len = 2 if high else 1
    d.dec.alloc = 4
    d.dec.data = d.data
    d.data[0] = low
    d.data[1] = high
    return value


cdef inline bint reads_as(object real) except -1:
    """Whether ``real``, a Decimal ``_decimal`` made (of at most 38 digits, its hash not yet
    taken), reads in memory as :func:`made` writes one: flags, exponent, digit count, words."""
    cdef cdec_decimal *d = <cdec_decimal *><PyObject *>real
    cdef Py_ssize_t i
    sign, coefficient, exponent = real.as_tuple()
    number = int("".join(map(str, coefficient)))
    words = (number % 10 ** 19, number // 10 ** 19)
    if d.hash != -1 or d.dec.flags != (MPD_STATIC | MPD_STATIC_DATA | (MPD_NEG if sign else 0)) \
            or d.dec.exp != exponent or d.dec.digits != len(coefficient) \
            or d.dec.len != (2 if words[1] else 1) or d.dec.alloc != 4 or d.dec.data != d.data:
        return False
    for i in range(d.dec.len):
        if d.data[i] != words[i]:
            return False
    return hash(real) == d.hash  # the cached hash is where it is read
