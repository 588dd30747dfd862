"""Base64 in C, shared by the service's extensions that write it (a dump's rows:
``dump/_rawrows.pyx``; a databus message's rows: ``messages/_databus.pyx``): three bytes at
a time as two 12-bit halves looked up in a table of pairs, and a value of 32 bytes or more
mostly 24 bytes at a time with AVX2 where the compiler and the CPU have it. Inline C only:
each extension that cimports it has its own copy, set up by :func:`init` at its import."""


cdef extern from *:
    """
    /* Base64 of 24 bytes at a time with AVX2 (W. Mula and D. Lemire's method, as in
       aklomp/base64, BSD-2-Clause): where the compiler and the CPU have it, for values of
       32 bytes or more; the rest of a value is encoded by _base64 below. */
    #include <stddef.h>
    #include <string.h>
    #if defined(__GNUC__) && defined(__x86_64__)
    #include <immintrin.h>
    #define CDC_HAVE_AVX2_CODE 1
    __attribute__((target("avx2")))
    static inline __m256i cdc_enc_reshuffle(const __m256i input) {
        const __m256i in = _mm256_shuffle_epi8(input, _mm256_set_epi8(
            10, 11, 9, 10, 7, 8, 6, 7, 4, 5, 3, 4, 1, 2, 0, 1,
            14, 15, 13, 14, 11, 12, 10, 11, 8, 9, 7, 8, 5, 6, 4, 5));
        const __m256i t0 = _mm256_and_si256(in, _mm256_set1_epi32(0x0FC0FC00));
        const __m256i t1 = _mm256_mulhi_epu16(t0, _mm256_set1_epi32(0x04000040));
        const __m256i t2 = _mm256_and_si256(in, _mm256_set1_epi32(0x003F03F0));
        const __m256i t3 = _mm256_mullo_epi16(t2, _mm256_set1_epi32(0x01000010));
        return _mm256_or_si256(t1, t3);
    }
    __attribute__((target("avx2")))
    static inline __m256i cdc_enc_translate(const __m256i in) {
        const __m256i lut = _mm256_setr_epi8(
            65, 71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 0, 0,
            65, 71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 0, 0);
        __m256i indices = _mm256_subs_epu8(in, _mm256_set1_epi8(51));
        const __m256i mask = _mm256_cmpgt_epi8(in, _mm256_set1_epi8(25));
        indices = _mm256_sub_epi8(indices, mask);
        return _mm256_add_epi8(in, _mm256_shuffle_epi8(lut, indices));
    }
    /* Encodes the first 24 * r bytes of src[0:n] (n >= 32; r = (n - 4) / 24, so that no
       load passes src + n) to out; returns r. */
    __attribute__((target("avx2")))
    static Py_ssize_t cdc_b64_avx2(const unsigned char *src, Py_ssize_t n, char *out) {
        Py_ssize_t rounds = (n - 4) / 24, r;
        __m256i v = _mm256_loadu_si256((const __m256i *)src);
        v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6));
        _mm256_storeu_si256((__m256i *)out, cdc_enc_translate(cdc_enc_reshuffle(v)));
        for (r = 1; r < rounds; r++) {  /* loads from 4 bytes before the next 24 */
            v = _mm256_loadu_si256((const __m256i *)(src + 24 * r - 4));
            _mm256_storeu_si256((__m256i *)(out + 32 * r),
                                cdc_enc_translate(cdc_enc_reshuffle(v)));
        }
        return rounds;
    }
    static int cdc_cpu_has_avx2(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2");
    }
    #else
    #define CDC_HAVE_AVX2_CODE 0
    static Py_ssize_t cdc_b64_avx2(const unsigned char *src, Py_ssize_t n, char *out) {
        return 0;
    }
    static int cdc_cpu_has_avx2(void) { return 0; }
    #endif

    static const char cdc_b64_alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    static char cdc_b64_pairs[8192];  /* the two digits of every 12-bit value */
    static int cdc_b64_use_avx2 = 0;
    static void cdc_b64_init(void) {
        int v;
        for (v = 0; v < 4096; v++) {
            cdc_b64_pairs[2 * v] = cdc_b64_alphabet[v >> 6];
            cdc_b64_pairs[2 * v + 1] = cdc_b64_alphabet[v & 63];
        }
        cdc_b64_use_avx2 = cdc_cpu_has_avx2();
    }
    static int cdc_b64_simd(int enabled) {  /* -1: unchanged */
        if (enabled >= 0) cdc_b64_use_avx2 = enabled && cdc_cpu_has_avx2();
        return cdc_b64_use_avx2;
    }
    /* src[0:n] as base64 (with '=' padding) at out; returns the bytes written. */
    static inline Py_ssize_t cdc_b64_encode(const unsigned char *src, Py_ssize_t n, char *out) {
        Py_ssize_t i = 0, o = 0, rounds;
        unsigned int v;
        if (n >= 32 && cdc_b64_use_avx2) {
            rounds = cdc_b64_avx2(src, n, out);
            i = 24 * rounds;
            o = 32 * rounds;
        }
        for (; i + 3 <= n; i += 3, o += 4) {
            v = ((unsigned int)src[i] << 16) | ((unsigned int)src[i + 1] << 8) | src[i + 2];
            memcpy(out + o, &cdc_b64_pairs[2 * (v >> 12)], 2);
            memcpy(out + o + 2, &cdc_b64_pairs[2 * (v & 0xFFF)], 2);
        }
        if (n - i == 1) {
            v = (unsigned int)src[i] << 16;
            out[o] = cdc_b64_alphabet[(v >> 18) & 63];
            out[o + 1] = cdc_b64_alphabet[(v >> 12) & 63];
            out[o + 2] = '=';
            out[o + 3] = '=';
            o += 4;
        } else if (n - i == 2) {
            v = ((unsigned int)src[i] << 16) | ((unsigned int)src[i + 1] << 8);
            out[o] = cdc_b64_alphabet[(v >> 18) & 63];
            out[o + 1] = cdc_b64_alphabet[(v >> 12) & 63];
            out[o + 2] = cdc_b64_alphabet[(v >> 6) & 63];
            out[o + 3] = '=';
            o += 4;
        }
        return o;
    }
    """
    void cdc_b64_init() nogil
    int cdc_b64_simd(int enabled) nogil
    Py_ssize_t cdc_b64_encode(const unsigned char *src, Py_ssize_t n, char *out) nogil


cdef inline Py_ssize_t encoded_size(Py_ssize_t n) nogil:
    """The base64 of ``n`` bytes: its length."""
    return ((n + 2) // 3) * 4


cdef inline void init() noexcept nogil:
    cdc_b64_init()


cdef inline Py_ssize_t encode(const unsigned char *src, Py_ssize_t n, char *out) noexcept nogil:
    """``src[0:n]`` as base64 at ``out`` (room for ``encoded_size(n)``); the bytes written."""
    return cdc_b64_encode(src, n, out)


cdef inline bint simd(int enabled) noexcept nogil:
    """Whether long values use AVX2 (``enabled``: 1 on, where the CPU has it; 0 off;
    -1 unchanged)."""
    return cdc_b64_simd(enabled)
