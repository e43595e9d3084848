/* Heap-to-heap RMA moves its bytes once: put, get, put_signal, their _nbi forms and the strided
 * iput/iget, with the local side in the symmetric heap or in the program's data and bss, move
 * exactly their length through the data plane and nothing through a private bounce copy (the
 * library's test-only counter, hmshmem_test_copy_count), and the bytes arrive right — also when
 * source and target overlap on this PE (as memmove would leave them). */
#include <shmem.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

/* Test-only, not in shmemx.h: the data plane's copy counter (0, or -1 when it counts nothing). */
int hmshmem_test_copy_count(uint64_t *moved, uint64_t *bounced);

#define MAX (1 << 20)
#define STATIC_BYTES 65536

static char static_src[STATIC_BYTES];        /* bss */
static char static_dst[2 * STATIC_BYTES];    /* bss */
static char static_scratch[STATIC_BYTES + 64]; /* bss */

static uint64_t moved_before, bounced_before;

/* Remembers the counter before a call. */
static void mark(void) { CHECK(hmshmem_test_copy_count(&moved_before, &bounced_before) == 0); }

/* Checks that the calls since mark() moved `bytes` and bounced none. */
static void moved_once(size_t bytes, const char *what, int line) {
    uint64_t moved, bounced;
    CHECK(hmshmem_test_copy_count(&moved, &bounced) == 0);
    if (moved - moved_before != bytes || bounced != bounced_before) {
        fprintf(stderr, "PE %d: line %d: %s of %zu bytes moved %llu and bounced %llu bytes\n",
                shmem_my_pe(), line, what, bytes, (unsigned long long)(moved - moved_before),
                (unsigned long long)(bounced - bounced_before));
        exit(2);
    }
}
#define ONCE(bytes, what) moved_once((bytes), (what), __LINE__)

static char byte_at(size_t i, int seed) { return (char)(i * 31 + (size_t)seed * 7 + 1); }

static void fill(char *p, size_t len, int seed) {
    for (size_t i = 0; i < len; i++) p[i] = byte_at(i, seed);
}

/* Checks that `p` holds `fill(_, len, seed)`'s bytes. */
static void holds(const char *p, size_t len, int seed, int line) {
    for (size_t i = 0; i < len; i++) {
        if (p[i] != byte_at(i, seed)) {
            fprintf(stderr, "PE %d: line %d: byte %zu of %zu is %d, not %d (seed %d)\n",
                    shmem_my_pe(), line, i, len, p[i], byte_at(i, seed), seed);
            exit(2);
        }
    }
}
#define HOLDS(p, len, seed) holds((p), (len), (seed), __LINE__)

/* Puts `len` bytes from `from` to `to` on this PE (they may overlap) and checks the result
 * against memmove's on a private copy of `whole` (the `whole_len` bytes holding both). */
static void overlapping_put(char *whole, size_t whole_len, char *to, const char *from,
                            size_t len, int get) {
    char *expected = malloc(whole_len);
    CHECK(expected != NULL);
    memcpy(expected, whole, whole_len);
    memmove(expected + (to - whole), expected + (from - whole), len);
    mark();
    if (get)
        shmem_getmem(to, from, len, me);
    else
        shmem_putmem(to, from, len, me);
    ONCE(len, get ? "an overlapping get" : "an overlapping put");
    shmem_quiet();
    for (size_t i = 0; i < whole_len; i++) {
        if (whole[i] != expected[i]) {
            fprintf(stderr, "PE %d: %s of %zu bytes from +%td to +%td: byte %zu is %d, not %d\n",
                    shmem_my_pe(), get ? "an overlapping get" : "an overlapping put", len,
                    from - whole, to - whole, i, whole[i], expected[i]);
            exit(2);
        }
    }
    free(expected);
}

int main(void) {
    start();
    if (hmshmem_test_copy_count(NULL, NULL) != 0) {
        fprintf(stderr, "libhmshmem counts no copies: build it as the tests need it, with the "
                        "runtime's fault-injection feature (cargo build --workspace)\n");
        exit(2);
    }
    char *src = shmem_malloc(MAX);
    char *dst = shmem_malloc(2 * MAX);
    char *got = shmem_malloc(2 * MAX);
    char *scratch = shmem_malloc(MAX + 64);
    uint64_t *sig = shmem_calloc(1, sizeof(uint64_t));
    CHECK(src && dst && got && scratch && sig);
    uint64_t signals = 0;
    size_t sizes[] = {1, 8, 13, 100, 4096, 65537, MAX};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t len = sizes[s];
        fill(src, len, me);
        shmem_barrier_all();

        /* put and get, blocking and _nbi; put_signal and its _nbi form. */
        mark();
        shmem_putmem(dst, src, len, next);
        ONCE(len, "shmem_putmem");
        shmem_barrier_all();
        HOLDS(dst, len, prev);
        mark();
        shmem_getmem(got, src, len, next);
        ONCE(len, "shmem_getmem");
        HOLDS(got, len, next);
        memset(got, 0, len);
        mark();
        shmem_getmem_nbi(got, src, len, next);
        ONCE(len, "shmem_getmem_nbi");
        shmem_quiet();
        HOLDS(got, len, next);
        shmem_barrier_all();
        memset(dst, 0, len);
        shmem_barrier_all();
        mark();
        shmem_putmem_nbi(dst, src, len, next);
        ONCE(len, "shmem_putmem_nbi");
        shmem_quiet();
        shmem_barrier_all();
        HOLDS(dst, len, prev);
        memset(dst, 0, len);
        shmem_barrier_all();
        mark();
        shmem_putmem_signal(dst, src, len, sig, 1, SHMEM_SIGNAL_ADD, next);
        ONCE(len, "shmem_putmem_signal");
        signals += 1;
        shmem_signal_wait_until(sig, SHMEM_CMP_EQ, signals);
        HOLDS(dst, len, prev);
        shmem_barrier_all();
        memset(dst, 0, len);
        shmem_barrier_all();
        mark();
        shmem_putmem_signal_nbi(dst, src, len, sig, 1, SHMEM_SIGNAL_ADD, next);
        ONCE(len, "shmem_putmem_signal_nbi");
        shmem_quiet();
        signals += 1;
        shmem_signal_wait_until(sig, SHMEM_CMP_EQ, signals);
        HOLDS(dst, len, prev);
        shmem_barrier_all();

        /* The same address on both sides, the common SHMEM idiom. */
        mark();
        shmem_putmem(src, src, len, me);
        ONCE(len, "a put of an array onto itself");
        HOLDS(src, len, me);

        /* Strided: every other long of `src` to every third of `dst`, and back into `got`. */
        size_t elements = len / 16;
        if (elements > 0) {
            memset(dst, 0, 2 * MAX);
            shmem_barrier_all();
            mark();
            shmem_long_iput((long *)dst, (const long *)src, 3, 2, elements, next);
            ONCE(elements * sizeof(long), "shmem_long_iput");
            shmem_barrier_all();
            for (size_t i = 0; i < elements; i++) {
                char expected[sizeof(long)];
                for (size_t b = 0; b < sizeof(long); b++)
                    expected[b] = byte_at(16 * i + b, prev);
                CHECK(memcmp(dst + 24 * i, expected, sizeof(long)) == 0);
                CHECK(((long *)dst)[3 * i + 1] == 0 && ((long *)dst)[3 * i + 2] == 0);
            }
            memset(got, 0, 2 * MAX);
            mark();
            shmem_long_iget((long *)got, (const long *)src, 3, 2, elements, next);
            ONCE(elements * sizeof(long), "shmem_long_iget");
            for (size_t i = 0; i < elements; i++) {
                char expected[sizeof(long)];
                for (size_t b = 0; b < sizeof(long); b++)
                    expected[b] = byte_at(16 * i + b, next);
                CHECK(memcmp(got + 24 * i, expected, sizeof(long)) == 0);
                CHECK(((long *)got)[3 * i + 1] == 0);
            }
            shmem_barrier_all();
        }

        /* Overlapping source and target on this PE, both ways, in the heap. */
        if (len < MAX) {
            fill(scratch, len + 64, me + 3);
            overlapping_put(scratch, len + 64, scratch + 16, scratch, len, 0);
            overlapping_put(scratch, len + 64, scratch, scratch + 16, len, 0);
            overlapping_put(scratch, len + 64, scratch + 7, scratch, len, 1);
            overlapping_put(scratch, len + 64, scratch, scratch + 7, len, 1);
        }
        shmem_barrier_all();
    }

    /* Global and static variables (symmetric: mapped onto the heap) as the local side. */
    fill(static_src, STATIC_BYTES, me + 5);
    shmem_barrier_all();
    mark();
    shmem_putmem(dst, static_src, STATIC_BYTES, next);
    ONCE(STATIC_BYTES, "a put from a static array");
    mark();
    shmem_putmem(static_dst + STATIC_BYTES, static_src, STATIC_BYTES, next);
    ONCE(STATIC_BYTES, "a put from a static array into a static array");
    mark();
    shmem_getmem(static_dst, static_src, STATIC_BYTES, next);
    ONCE(STATIC_BYTES, "a get into a static array");
    HOLDS(static_dst, STATIC_BYTES, next + 5);
    shmem_barrier_all();
    HOLDS(dst, STATIC_BYTES, prev + 5);
    HOLDS(static_dst + STATIC_BYTES, STATIC_BYTES, prev + 5);
    shmem_barrier_all();
    fill(static_scratch, sizeof static_scratch, me + 9);
    overlapping_put(static_scratch, sizeof static_scratch, static_scratch + 8, static_scratch,
                    STATIC_BYTES, 0);
    overlapping_put(static_scratch, sizeof static_scratch, static_scratch, static_scratch + 3,
                    STATIC_BYTES, 1);

    shmem_barrier_all();
    shmem_free(sig);
    shmem_free(scratch);
    shmem_free(got);
    shmem_free(dst);
    shmem_free(src);
    PASS("rma_one_copy");
    shmem_finalize();
    return 0;
}
