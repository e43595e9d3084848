/* Reductions: every operator over every type the standard lists for it (the generated X-macro
 * lists), out of place and in place, on SHMEM_TEAM_WORLD and on split teams (the even PEs and
 * the odd PEs at once); the legacy *_to_all forms on every PE and on active sets of some PEs
 * (the even and the odd PEs, logPE_stride 1) with one pSync reused by every call; the C11
 * type-generic forms. The expected results are computed here in C's own arithmetic (complex
 * products included). long double (reduced by moving raw values and combining them in C) is
 * also checked with values whose sums, products and order double could not tell apart. */
#include <complex.h>
#include <shmem.h>

#include "check.h"

#define LEN 6
#define MAX_PES 8

/* A set of PEs a reduction runs over: its team (team forms) or its active set (legacy forms),
 * and its world PEs in order. */
struct set {
    shmem_team_t team;
    int start, log_stride, size;
    int pes[MAX_PES];
};

static long pSync[SHMEM_REDUCE_SYNC_SIZE];
/* Symmetric source and destination, large enough for LEN elements of any type. */
static void *src, *dst;
static _Alignas(16) unsigned char work[16 * (LEN + SHMEM_REDUCE_MIN_WRKDATA_SIZE)];

/* PE pe's element i: small integers (products of four stay exact everywhere), with an
 * imaginary part for complex types. */
#define IMAG(T, pe, i)                                                                         \
    _Generic((T)0, float _Complex: (float)((pe) % 2 - (i)) * I,                                \
             double _Complex: (double)((pe) % 2 - (i)) * I, default: 0)
#define VALUE(T, pe, i) ((T)((T)(((pe) * 3 + (i)) % 7 + 1) + IMAG(T, pe, i)))

#define CALL_team(N, OP, d, s) CHECK(shmem_##N##_##OP##_reduce(set->team, d, s, LEN) == 0)
#define CALL_legacy(N, OP, d, s)                                                               \
    shmem_##N##_##OP##_to_all(d, s, LEN, set->start, set->log_stride, set->size,              \
                              (void *)work, pSync)

/* The FORM reduction OP of this PE's values, checked against COMBINE folded over the set's PEs
 * in order; then the same in place. */
#define REDUCE_CASE(FORM, T, N, OP, COMBINE)                                                   \
    do {                                                                                       \
        T *s = src, *d = dst;                                                                  \
        for (int i = 0; i < LEN; i++) s[i] = VALUE(T, me, i);                                  \
        CALL_##FORM(N, OP, d, s);                                                              \
        for (int i = 0; i < LEN; i++) {                                                        \
            T acc = VALUE(T, set->pes[0], i);                                                  \
            for (int k = 1; k < set->size; k++) {                                              \
                T v = VALUE(T, set->pes[k], i);                                                \
                acc = (T)(COMBINE);                                                            \
            }                                                                                  \
            CHECK(d[i] == acc);                                                                \
        }                                                                                      \
        CALL_##FORM(N, OP, s, s);                                                              \
        for (int i = 0; i < LEN; i++) CHECK(s[i] == d[i]);                                     \
    } while (0)

#define AND (acc & v)
#define OR (acc | v)
#define XOR (acc ^ v)
#define MIN (v < acc ? v : acc)
#define MAX (v > acc ? v : acc)
#define SUM (acc + v)
#define PROD (acc * v)

/* One function per form, operator class and type: FORM_CLASS_TYPENAME(set). */
#define BITWISE_FN(FORM, T, N)                                                                 \
    static void FORM##_bitwise_##N(const struct set *set) {                                    \
        REDUCE_CASE(FORM, T, N, and, AND);                                                     \
        REDUCE_CASE(FORM, T, N, or, OR);                                                       \
        REDUCE_CASE(FORM, T, N, xor, XOR);                                                     \
    }
#define MINMAX_FN(FORM, T, N)                                                                  \
    static void FORM##_minmax_##N(const struct set *set) {                                     \
        REDUCE_CASE(FORM, T, N, min, MIN);                                                     \
        REDUCE_CASE(FORM, T, N, max, MAX);                                                     \
    }
#define ARITH_FN(FORM, T, N)                                                                   \
    static void FORM##_arith_##N(const struct set *set) {                                      \
        REDUCE_CASE(FORM, T, N, sum, SUM);                                                     \
        REDUCE_CASE(FORM, T, N, prod, PROD);                                                   \
    }
#define TEAM_BITWISE(T, N, A) BITWISE_FN(team, T, N)
#define TEAM_MINMAX(T, N, A) MINMAX_FN(team, T, N)
#define TEAM_ARITH(T, N, A) ARITH_FN(team, T, N)
#define LEGACY_BITWISE(T, N, A) BITWISE_FN(legacy, T, N)
#define LEGACY_MINMAX(T, N, A) MINMAX_FN(legacy, T, N)
#define LEGACY_ARITH(T, N, A) ARITH_FN(legacy, T, N)
HMSHMEM_REDUCE_BITWISE_TYPES(TEAM_BITWISE, _)
HMSHMEM_REDUCE_MINMAX_TYPES(TEAM_MINMAX, _)
HMSHMEM_REDUCE_ARITH_TYPES(TEAM_ARITH, _)
HMSHMEM_TO_ALL_BITWISE_TYPES(LEGACY_BITWISE, _)
HMSHMEM_TO_ALL_MINMAX_TYPES(LEGACY_MINMAX, _)
HMSHMEM_TO_ALL_ARITH_TYPES(LEGACY_ARITH, _)

#define RUN_TEAM_BITWISE(T, N, SET) team_bitwise_##N(SET);
#define RUN_TEAM_MINMAX(T, N, SET) team_minmax_##N(SET);
#define RUN_TEAM_ARITH(T, N, SET) team_arith_##N(SET);
#define RUN_LEGACY_BITWISE(T, N, SET) legacy_bitwise_##N(SET);
#define RUN_LEGACY_MINMAX(T, N, SET) legacy_minmax_##N(SET);
#define RUN_LEGACY_ARITH(T, N, SET) legacy_arith_##N(SET);

/* Every team form and every legacy form on `set`. */
static void every_reduction(const struct set *set) {
    HMSHMEM_REDUCE_BITWISE_TYPES(RUN_TEAM_BITWISE, set)
    HMSHMEM_REDUCE_MINMAX_TYPES(RUN_TEAM_MINMAX, set)
    HMSHMEM_REDUCE_ARITH_TYPES(RUN_TEAM_ARITH, set)
    HMSHMEM_TO_ALL_BITWISE_TYPES(RUN_LEGACY_BITWISE, set)
    HMSHMEM_TO_ALL_MINMAX_TYPES(RUN_LEGACY_MINMAX, set)
    HMSHMEM_TO_ALL_ARITH_TYPES(RUN_LEGACY_ARITH, set)
}

/* The set of PEs first, first + 2, ... (`size` of them), with its team split from the world
 * (collective: every PE calls it, members and others alike). */
static struct set strided(int first, int size) {
    struct set set = {SHMEM_TEAM_INVALID, first, 1, size, {0}};
    for (int k = 0; k < size; k++) set.pes[k] = first + 2 * k;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, first, 2, size, NULL, 0, &set.team) == 0);
    return set;
}

int main(void) {
    start();
    CHECK(n <= MAX_PES);
    for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; i++) pSync[i] = SHMEM_SYNC_VALUE;
    src = shmem_malloc(16 * LEN);
    dst = shmem_malloc(16 * LEN);
    CHECK(src != NULL && dst != NULL);

    struct set world = {SHMEM_TEAM_WORLD, 0, 0, n, {0}};
    for (int k = 0; k < n; k++) world.pes[k] = k;
    every_reduction(&world);
    shmem_barrier_all();

    /* The even PEs and the odd PEs, each reducing on its own at the same time. */
    struct set even = strided(0, (n + 1) / 2);
    if (n >= 2) {
        struct set odd = strided(1, n / 2);
        every_reduction(me % 2 == 0 ? &even : &odd);
        if (me % 2 == 1) shmem_team_destroy(odd.team);
    } else {
        every_reduction(&even);
    }
    if (me % 2 == 0) shmem_team_destroy(even.team);
    shmem_barrier_all();

    /* The type-generic forms select the typed call from the destination's type. */
    int *ints = src, *int_sums = dst;
    ints[0] = me + 1;
    CHECK(shmem_sum_reduce(SHMEM_TEAM_WORLD, int_sums, ints, 1) == 0);
    CHECK(int_sums[0] == n * (n + 1) / 2);
    unsigned char *bytes = src, *xored = dst;
    bytes[0] = (unsigned char)(1u << me);
    CHECK(shmem_xor_reduce(SHMEM_TEAM_WORLD, xored, bytes, 1) == 0);
    CHECK(xored[0] == (unsigned char)((1u << n) - 1));
    double *doubles = src, *maxima = dst;
    doubles[0] = -(double)me;
    CHECK(shmem_max_reduce(SHMEM_TEAM_WORLD, maxima, doubles, 1) == 0);
    CHECK(maxima[0] == 0.0);
    float _Complex *complexes = src, *product = dst;
    complexes[0] = I;
    CHECK(shmem_prod_reduce(SHMEM_TEAM_WORLD, product, complexes, 1) == 0);
    float _Complex expected = 1;
    for (int k = 0; k < n; k++) expected *= I;
    CHECK(product[0] == expected);

    /* long double at its own precision: 1 + k * 2^-60 differ below double's 53 bits. */
    long double *extended = src, *combined = dst;
    const long double tiny = 0x1p-60L;
    for (int i = 0; i < 3; i++) extended[i] = 1.0L + (long double)(me + 1 + i) * tiny;
    CHECK(shmem_sum_reduce(SHMEM_TEAM_WORLD, combined, extended, 3) == 0);
    for (int i = 0; i < 3; i++) {
        long double sum = 0.0L;
        for (int k = 0; k < n; k++) sum += 1.0L + (long double)(k + 1 + i) * tiny;
        CHECK(combined[i] == sum && (n == 1 || combined[i] != (long double)n));
    }
    CHECK(shmem_longdouble_max_reduce(SHMEM_TEAM_WORLD, combined, extended, 3) == 0);
    CHECK(combined[0] == 1.0L + (long double)n * tiny);
    CHECK(shmem_min_reduce(SHMEM_TEAM_WORLD, combined, extended, 3) == 0);
    CHECK(combined[2] == 1.0L + 3.0L * tiny);
    for (int i = 0; i < 3; i++) extended[i] = 1.0L + (long double)(me + 1) * 0x1p-31L;
    CHECK(shmem_prod_reduce(SHMEM_TEAM_WORLD, combined, extended, 3) == 0);
    long double extended_product = 1.0L;
    double double_product = 1.0;
    for (int k = 0; k < n; k++) {
        extended_product *= 1.0L + (long double)(k + 1) * 0x1p-31L;
        double_product *= 1.0 + (double)(k + 1) * 0x1p-31;
    }
    CHECK(combined[1] == extended_product);
    CHECK(n == 1 || combined[1] != (long double)double_product);
    shmem_longdouble_sum_to_all(combined, extended, 3, 0, 0, n, (long double *)work, pSync);
    CHECK(combined[2] > (long double)n);

    shmem_barrier_all();
    shmem_free(dst);
    shmem_free(src);
    PASS("reductions");
    shmem_finalize();
    return 0;
}
