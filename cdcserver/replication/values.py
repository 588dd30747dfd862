"""Decoders for the binlog's value formats that need more than a ``struct`` unpack.

Formats: MySQL ``sql-common/my_time.cc`` (``my_*_packed_from_binary``), ``strings/decimal.cc``
(``bin2decimal``) and MariaDB ``sql/field.cc``. Each function takes the raw bytes of one value and
returns the plain Python value documented in ``protocol.md``; values the Python types cannot hold
(zero dates, ``2020-00-00``) come back as MariaDB's own text for them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal

from mariadb_cdc_client.format.compiled import compiled_module

# DECIMAL values made in C (cdcserver/replication/_bindecimal.pyx): the same Decimals
_bindecimal = compiled_module("cdcserver.replication._bindecimal")

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def frac_bytes(fsp: int) -> int:
    """Bytes of fractional seconds stored for a TIME2/DATETIME2/TIMESTAMP2 of precision fsp."""
    return (fsp + 1) // 2


def frac_micros(raw: bytes, fsp: int) -> int:
    """Fractional seconds (signed big-endian, in units of 10^-(2*bytes)) as microseconds."""
    if fsp == 0:
        return 0
    value = int.from_bytes(raw, "big", signed=True)
    return value * (10_000, 100, 1)[frac_bytes(fsp) - 1]


def zero_text(date_part: str, fsp: int, with_time: bool) -> str:
    text = date_part + (" 00:00:00" if with_time and " " not in date_part else "")
    return text + ("." + "0" * fsp if fsp and with_time else "")


def _date_text(year: int, month: int, day: int) -> str:
    return f"{year:04d}-{month:02d}-{day:02d}"


def date_from_int(value: int) -> dt.date | str:
    """DATE: 3 bytes little-endian, day in bits 0-4, month 5-8, year from bit 9."""
    day, month, year = value & 31, (value >> 5) & 15, value >> 9
    if month > 12:
        raise ValueError(f"impossible DATE {year}-{month}-{day}")
    try:
        return dt.date(year, month, day)
    except ValueError:
        return _date_text(year, month, day)


def datetime2(raw: bytes, fsp: int) -> dt.datetime | str:
    """DATETIME2: 5 bytes big-endian (offset 2^39), then fractional seconds."""
    packed = int.from_bytes(raw[:5], "big") - 0x8000000000
    micros = frac_micros(raw[5:], fsp)
    ymd, hms = packed >> 17, packed & 0x1FFFF
    year_month, day = ymd >> 5, ymd & 31
    year, month = divmod(year_month, 13)
    hour, minute, second = hms >> 12, (hms >> 6) & 63, hms & 63
    return _datetime_or_text(year, month, day, hour, minute, second, micros, fsp)


def datetime_v1(value: int) -> dt.datetime | str:
    """Old DATETIME: 8 bytes little-endian holding the decimal number YYYYMMDDhhmmss."""
    date_part, time_part = divmod(value, 1_000_000)
    year, rest = divmod(date_part, 10_000)
    month, day = divmod(rest, 100)
    hour, rest = divmod(time_part, 10_000)
    minute, second = divmod(rest, 100)
    return _datetime_or_text(year, month, day, hour, minute, second, 0, 0)


def _datetime_or_text(year: int, month: int, day: int, hour: int, minute: int, second: int,
                      micros: int, fsp: int) -> dt.datetime | str:
    if month > 12 or day > 31 or hour > 23 or minute > 59 or second > 59:
        # Zero parts are MariaDB's; these are not: the bytes were read with the wrong layout.
        raise ValueError(f"impossible DATETIME {year}-{month}-{day} {hour}:{minute}:{second}")
    try:
        return dt.datetime(year, month, day, hour, minute, second, micros)
    except ValueError:
        text = f"{_date_text(year, month, day)} {hour:02d}:{minute:02d}:{second:02d}"
        return text + (f".{micros:06d}"[: fsp + 1] if fsp else "")


# MariaDB's own fractional temporal formats, used by columns created before 10.1.2 or with
# mysql56_temporal_format=OFF (sql/field.cc, Field_*_hires). The table map gives no precision
# for them; it comes from the schema history.
DATETIME_HIRES_BYTES = (5, 6, 6, 7, 7, 7, 8)
TIME_HIRES_BYTES = (3, 4, 4, 5, 5, 5, 6)
SEC_PART_BYTES = (0, 1, 1, 2, 2, 3, 3)
_TIME_ZERO_POINT = (838 * 3600 + 59 * 60 + 59 + 1) * 1_000_000  # TIME_MAX_VALUE_SECONDS + 1


def datetime_hires(raw: bytes, fsp: int) -> dt.datetime | str:
    """pack_time(): (((((year*13+month)*32+day)*24+hour)*60+minute)*60+second)*10^6+micros,
    divided by 10^(6-fsp), big-endian."""
    packed = int.from_bytes(raw, "big") * 10 ** (6 - fsp)
    rest, micros = divmod(packed, 1_000_000)
    rest, second = divmod(rest, 60)
    rest, minute = divmod(rest, 60)
    rest, hour = divmod(rest, 24)
    rest, day = divmod(rest, 32)
    year, month = divmod(rest, 13)
    return _datetime_or_text(year, month, day, hour, minute, second, micros, fsp)


def time_hires(raw: bytes, fsp: int) -> dt.timedelta:
    """The signed pack_time() of the time, divided by 10^(6-fsp), plus a zero point."""
    shift = 10 ** (6 - fsp)
    packed = (int.from_bytes(raw, "big") - _TIME_ZERO_POINT // shift) * shift
    return dt.timedelta(microseconds=packed)


def timestamp_hires(raw: bytes, fsp: int) -> dt.datetime | str:
    """4 bytes big-endian seconds, then the fraction divided by 10^(6-fsp), big-endian."""
    seconds = int.from_bytes(raw[:4], "big")
    micros = int.from_bytes(raw[4:], "big") * 10 ** (6 - fsp)
    if seconds == 0 and micros == 0:
        return zero_text("0000-00-00", fsp, True)
    return EPOCH + dt.timedelta(seconds=seconds, microseconds=micros)


def timestamp2(raw: bytes, fsp: int) -> dt.datetime | str:
    """TIMESTAMP2: 4 bytes big-endian seconds since the epoch (UTC), then fractions.
    0 is MariaDB's zero timestamp, rendered ``0000-00-00 00:00:00``."""
    seconds = int.from_bytes(raw[:4], "big")
    micros = frac_micros(raw[4:], fsp)
    if seconds == 0 and micros == 0:
        return zero_text("0000-00-00", fsp, True)
    return EPOCH + dt.timedelta(seconds=seconds, microseconds=micros)


def timestamp_v1(seconds: int) -> dt.datetime | str:
    if seconds == 0:
        return "0000-00-00 00:00:00"
    return EPOCH + dt.timedelta(seconds=seconds)


def time2(raw: bytes, fsp: int) -> dt.timedelta:
    """TIME2: 3 bytes big-endian (offset 2^23) of hours/minutes/seconds, then fractions.
    Negative values store the fraction reversed for sort order (my_time_packed_from_binary)."""
    fb = frac_bytes(fsp)
    if fb == 3:
        packed = int.from_bytes(raw[:6], "big") - 0x800000000000
    else:
        intpart = int.from_bytes(raw[:3], "big") - 0x800000
        frac = int.from_bytes(raw[3 : 3 + fb], "big") if fb else 0
        if intpart < 0 and frac:
            intpart += 1
            frac -= 0x100 if fb == 1 else 0x10000
        packed = (intpart << 24) + frac * (10_000 if fb == 1 else 100)
    sign = -1 if packed < 0 else 1
    packed = abs(packed)
    hms, micros = packed >> 24, packed & 0xFFFFFF
    hours, minutes, seconds = (hms >> 12) & 0x3FF, (hms >> 6) & 63, hms & 63
    return sign * dt.timedelta(hours=hours, minutes=minutes, seconds=seconds,
                               microseconds=micros)


def time_v1(value: int) -> dt.timedelta:
    """Old TIME: 3 bytes little-endian signed, the decimal number HHMMSS."""
    sign = -1 if value < 0 else 1
    hours, rest = divmod(abs(value), 10_000)
    minutes, seconds = divmod(rest, 100)
    return sign * dt.timedelta(hours=hours, minutes=minutes, seconds=seconds)


class DecimalFormat:
    """The binary layout of a DECIMAL(precision, scale) (strings/decimal.cc, bin2decimal):
    groups of 9 digits in 4 big-endian bytes, a shorter leading/trailing group, the sign bit
    flipped, and every byte inverted when negative."""

    __slots__ = ("exponent", "groups", "scale", "sign_bit", "size")

    def __init__(self, precision: int, scale: int) -> None:
        intg = precision - scale
        intg0, intg0x = divmod(intg, 9)
        frac0, frac0x = divmod(scale, 9)
        # (bytes, digits) from the most significant group on
        groups = [(_DIG2BYTES[intg0x], intg0x)] if intg0x else []
        groups += [(4, 9)] * (intg0 + frac0)
        if frac0x:
            groups.append((_DIG2BYTES[frac0x], frac0x))
        self.groups = tuple(groups)
        self.size = sum(b for b, _ in groups)
        self.scale = scale
        self.sign_bit = 1 << (self.size * 8 - 1)
        self.exponent = f"E-{scale}" if scale else ""

    def unscaled(self, raw: bytes) -> int:
        """The value times 10^scale, as an exact signed integer."""
        bits = self.size * 8
        n = int.from_bytes(raw, "big")
        negative = not n & self.sign_bit
        n ^= self.sign_bit
        if negative:
            n ^= (1 << bits) - 1
        value = 0
        for nbytes, digits in self.groups:
            bits -= nbytes * 8
            value = value * 10**digits + ((n >> bits) & ((1 << (nbytes * 8)) - 1))
        return -value if negative else value

    def decode(self, raw: bytes) -> Decimal:
        # Built from text so no decimal context (28 digits by default) can round it.
        return Decimal(f"{self.unscaled(raw)}{self.exponent}")


def decimal_decoder(precision: int, scale: int) -> Callable[[bytes], Decimal]:
    """A DECIMAL(precision, scale) column's ``raw -> Decimal``: the compiled decoder where it
    is built (it gives what :meth:`DecimalFormat.decode` gives, and hands it what it does not
    take), else that method."""
    fmt = DecimalFormat(precision, scale)
    if _bindecimal is None:
        return fmt.decode
    decode: Callable[[bytes], Decimal] = _bindecimal.BinaryDecimal(precision, scale, fmt.groups,
                                                                   fmt.decode)
    return decode


def set_labels(bits: int, labels: tuple[str, ...]) -> str:
    """A SET value as MariaDB prints it: the chosen labels in definition order, comma-joined."""
    return ",".join(label for i, label in enumerate(labels) if bits >> i & 1)


def enum_label(index: int, labels: tuple[str, ...]) -> str:
    """An ENUM value; index 0 is the empty "invalid value" string MariaDB stores for errors."""
    return labels[index - 1] if 0 < index <= len(labels) else ""


def inet4_text(raw: bytes) -> str:
    return ".".join(str(b) for b in raw)


def inet6_text(raw: bytes) -> str:
    """INET6 as MariaDB prints it (sql/plugin/type_inet, Inet6::to_string): the longest run of
    zero groups, even a single one, becomes ``::`` (the first run wins a tie), and an
    IPv4-compatible (``::a.b.c.d``) or IPv4-mapped (``::ffff:a.b.c.d``) address ends in dotted
    IPv4."""
    words = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, 16, 2)]
    gap_pos, gap_len, run_pos, run_len = -1, -1, -1, -1
    for i, word in enumerate(words):
        if word:
            if run_pos >= 0 and run_len > gap_len:
                gap_pos, gap_len = run_pos, run_len
            run_pos, run_len = -1, -1
        elif run_pos >= 0:
            run_len += 1
        else:
            run_pos, run_len = i, 1
    if run_pos >= 0 and run_len > gap_len:
        gap_pos, gap_len = run_pos, run_len
    out = []
    i = 0
    while i < 8:
        if gap_pos == i:
            out.append("::" if i == 0 else ":")
            i += gap_len
            continue
        if i == 6 and gap_pos == 0 and (gap_len == 6 or (gap_len == 5 and words[5] == 0xFFFF)):
            return "".join(out) + inet4_text(raw[12:])
        out.append(f"{words[i]:x}" + (":" if i != 7 else ""))
        i += 1
    return "".join(out)


def uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
