# cython: boundscheck=False, wraparound=False
"""Kafka's partitioner hash (the Java client's Utils.murmur2, seed 0x9747b28c) in C: the
same numbers as aiokafka.partitioner.murmur2, which cdcserver/sinks/kafka/partitioner.py
uses where this is not built (tests/unit/test_kafka_partitioner.py compares them)."""

from libc.stdint cimport uint32_t


def murmur2(bytes key not None) -> int:
    """The 32-bit hash of ``key``, unsigned (as aiokafka's; Java's int has the same bits)."""
    cdef const unsigned char *data = key
    cdef Py_ssize_t length = len(key), i, i4
    cdef uint32_t m = 0x5bd1e995, h = 0x9747b28c ^ <uint32_t>length, k
    cdef Py_ssize_t length4 = length // 4, rest
    for i in range(length4):
        i4 = i * 4
        k = data[i4] | (<uint32_t>data[i4 + 1] << 8) | (<uint32_t>data[i4 + 2] << 16) | \
            (<uint32_t>data[i4 + 3] << 24)
        k *= m
        k ^= k >> 24
        k *= m
        h *= m
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= <uint32_t>data[(length & ~3) + 2] << 16
    if rest >= 2:
        h ^= <uint32_t>data[(length & ~3) + 1] << 8
    if rest >= 1:
        h ^= data[length & ~3]
        h *= m
    h ^= h >> 13
    h *= m
    h ^= h >> 15
    return h
