"""What the C extensions share to read values: the binlog's big- and little-endian integers
and fractional seconds (the service's ``store/_transcode.pyx`` and
``replication/_rowdecode.pyx``) and the proleptic Gregorian calendar (those two, the service's
``protocol/_jsonlines.pyx`` and the client's ``format/_records.pyx``). In the shared format
package, the one both sides may cimport. Inline functions only: no module of its own is built
or imported."""

from libc.stdint cimport int64_t, uint8_t, uint64_t


cdef inline uint64_t be(const uint8_t *p, int n) noexcept:
    """``n`` bytes (at most 8) big-endian."""
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v = (v << 8) | p[i]
    return v


cdef inline uint64_t le(const uint8_t *p, int n) noexcept:
    """``n`` bytes (at most 8) little-endian."""
    cdef uint64_t v = 0
    cdef int i
    for i in range(n - 1, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef inline int64_t frac_micros(const uint8_t *p, int fsp) noexcept:
    """Signed big-endian fractional seconds of (fsp + 1) // 2 bytes, as microseconds
    (``values.frac_micros``)."""
    cdef int n = (fsp + 1) // 2
    cdef int64_t v
    if n == 0:
        return 0
    v = <int64_t>be(p, n)
    if v >= (<int64_t>1 << (8 * n - 1)):
        v -= <int64_t>1 << (8 * n)
    if n == 1:
        return v * 10000
    if n == 2:
        return v * 100
    return v


cdef inline bint leap(int64_t year) noexcept:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


cdef inline bint valid_date(int64_t year, int64_t month, int64_t day) noexcept:
    """What ``datetime.date`` accepts."""
    if year < 1 or year > 9999 or month < 1 or month > 12 or day < 1:
        return False
    if month == 2:
        return day <= (29 if leap(year) else 28)
    return day <= (30 if month == 4 or month == 6 or month == 9 or month == 11 else 31)


cdef inline void civil(int64_t days, int64_t *year, int64_t *month, int64_t *day) noexcept:
    """H. Hinnant's civil_from_days: days since 1970-01-01 to a proleptic Gregorian date."""
    days += 719468
    cdef int64_t era = (days if days >= 0 else days - 146096) // 146097
    cdef int64_t doe = days - era * 146097
    cdef int64_t yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    cdef int64_t doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    cdef int64_t mp = (5 * doy + 2) // 153
    day[0] = doy - (153 * mp + 2) // 5 + 1
    month[0] = mp + 3 if mp < 10 else mp - 9
    year[0] = yoe + era * 400 + (1 if month[0] <= 2 else 0)
