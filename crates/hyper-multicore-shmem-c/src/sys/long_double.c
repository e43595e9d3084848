/* The combining step of libhmshmem's long double reductions (src/collectives.rs moves the
 * values; this combines them). It is C because long double is the platform C compiler's type
 * -- x87 80-bit extended precision on x86-64, IEEE binary128 on aarch64 -- with no arithmetic in
 * Rust. Written for this project. */
#include <float.h>
#include <stddef.h>
#include <string.h>

_Static_assert(sizeof(long double) == 16, "libhmshmem moves long double as 16 bytes");

#if LDBL_MANT_DIG == 64
/* x87 extended precision: sign, exponent and 64-bit significand in 10 bytes; 6 bytes padding. */
#define VALUE_BYTES 10
#else
#define VALUE_BYTES sizeof(long double)
#endif

/* The operators, as src/sys/long_double.rs numbers them. */
enum hmshmem_long_double_op {
    HMSHMEM_LONG_DOUBLE_SUM = 0,
    HMSHMEM_LONG_DOUBLE_PROD = 1,
    HMSHMEM_LONG_DOUBLE_MIN = 2,
    HMSHMEM_LONG_DOUBLE_MAX = 3,
};

/* dest[i] = parts[0][i] OP parts[1][i] OP ... OP parts[members - 1][i] for i < nreduce, folded
 * left to right (the team's order, so every member computes the same bits); `parts` holds the
 * members' `nreduce` values one member after the other. min and max keep the first of equal
 * values and, as C's comparisons do, never pick a NaN that comes later. Returns 0, or -1 for an
 * unknown operator (nothing written). Unaligned buffers are fine (values are copied). */
int hmshmem_long_double_combine(int op, unsigned char *dest, const unsigned char *parts,
                                size_t members, size_t nreduce) {
    if (op < HMSHMEM_LONG_DOUBLE_SUM || op > HMSHMEM_LONG_DOUBLE_MAX) return -1;
    const size_t size = sizeof(long double);
    for (size_t i = 0; i < nreduce; i++) {
        long double acc;
        memcpy(&acc, parts + i * size, size);
        for (size_t m = 1; m < members; m++) {
            long double value;
            memcpy(&value, parts + (m * nreduce + i) * size, size);
            switch (op) {
            case HMSHMEM_LONG_DOUBLE_SUM: acc = acc + value; break;
            case HMSHMEM_LONG_DOUBLE_PROD: acc = acc * value; break;
            case HMSHMEM_LONG_DOUBLE_MIN: acc = value < acc ? value : acc; break;
            default: acc = value > acc ? value : acc; break;
            }
        }
        /* Only the value's bytes, the padding zeroed: every member's result has the same bytes. */
        unsigned char bytes[sizeof(long double)] = {0};
        memcpy(bytes, &acc, VALUE_BYTES);
        memcpy(dest + i * size, bytes, size);
    }
    return 0;
}
