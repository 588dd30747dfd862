"""MariaDB's date and datetime text (``YYYY-MM-DD``, ``YYYY-MM-DD HH:MM:SS[.f{1,6}]``) read in
C as ``date.fromisoformat`` / ``datetime.fromisoformat`` read it, shared by the client's
decoders (``_dumprows.pyx``: a dump's values; ``_records.pyx``: JSON mode's). Inline
functions only: no module of its own is built or imported."""

from cpython.datetime cimport date_new, datetime_new
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.stdint cimport uint8_t


cdef inline bint two_digits(const uint8_t *p, int *value) noexcept:
    if not (48 <= p[0] <= 57 and 48 <= p[1] <= 57):
        return False
    value[0] = (p[0] - 48) * 10 + (p[1] - 48)
    return True


cdef inline int civil(const uint8_t *p, int *year, int *month, int *day) noexcept:
    """``YYYY-MM-DD``: 1 for a real date, 0 for a zero or partial one (which
    ``fromisoformat`` refuses, so the text stays), -1 for any other text."""
    cdef int hi, lo, days
    if not (two_digits(p, &hi) and two_digits(p + 2, &lo) and p[4] == 45
            and two_digits(p + 5, month) and p[7] == 45 and two_digits(p + 8, day)):
        return -1
    year[0] = hi * 100 + lo
    if year[0] < 1 or not 1 <= month[0] <= 12:
        return 0
    if month[0] == 2:
        days = 29 if year[0] % 4 == 0 and (year[0] % 100 != 0 or year[0] % 400 == 0) else 28
    else:
        days = 30 if month[0] in (4, 6, 9, 11) else 31
    return 1 <= day[0] <= days


cdef inline object date_text(const uint8_t *p, Py_ssize_t n):
    """``date.fromisoformat`` of MariaDB's ``YYYY-MM-DD``, or its text for a zero date;
    None for any other text."""
    cdef int year, month, day, real
    if n != 10:
        return None
    real = civil(p, &year, &month, &day)
    if real < 0:
        return None
    if real == 0:
        return PyUnicode_DecodeASCII(<const char *>p, n, NULL)
    return date_new(year, month, day)


cdef inline object datetime_text(const uint8_t *p, Py_ssize_t n, object tz):
    """``datetime.fromisoformat`` of MariaDB's ``YYYY-MM-DD HH:MM:SS[.f{1,6}]`` (with
    ``tz``), or its text for a zero date; None for any other text."""
    cdef int year, month, day, real, hour, minute, second, micros = 0, k
    cdef Py_ssize_t digits = n - 20
    if n < 19 or n == 20 or n > 26:
        return None
    if not (p[10] == 32 and two_digits(p + 11, &hour) and p[13] == 58
            and two_digits(p + 14, &minute) and p[16] == 58 and two_digits(p + 17, &second)) \
            or (n > 20 and p[19] != 46):
        return None
    for k in range(digits):
        if not 48 <= p[20 + k] <= 57:
            return None
        micros = micros * 10 + (p[20 + k] - 48)
    real = civil(p, &year, &month, &day)
    if real < 0 or hour > 23 or minute > 59 or second > 59:
        return None
    if real == 0:
        return PyUnicode_DecodeASCII(<const char *>p, n, NULL)
    for k in range(digits, 6):
        micros *= 10
    return datetime_new(year, month, day, hour, minute, second, micros, tz)
