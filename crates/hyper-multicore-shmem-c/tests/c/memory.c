/* The symmetric heap: malloc, calloc, align, realloc, malloc_with_hints, the legacy forms,
 * size 0, a request the heap cannot hold, and data through every kind of block. */
#include <shmem.h>
#include <shmemx.h>
#include <stdint.h>
#include <string.h>

#include "check.h"

int main(void) {
    start();

    CHECK(shmem_malloc(0) == NULL);
    CHECK(shmem_malloc((size_t)1 << 40) == NULL);
    CHECK(shmemx_last_error() != NULL && strstr(shmemx_last_error(), "shmem_malloc") != NULL);

    int *zeros = shmem_calloc(100, sizeof(int));
    CHECK(zeros != NULL);
    for (int i = 0; i < 100; i++) CHECK(zeros[i] == 0);

    for (size_t alignment = 8; alignment <= ((size_t)2 << 20); alignment *= 16) {
        char *aligned = shmem_align(alignment, 40);
        CHECK(aligned != NULL && (uintptr_t)aligned % alignment == 0);
        shmem_putmem(aligned, "aligned", 8, next);
        shmem_barrier_all();
        CHECK(strcmp(aligned, "aligned") == 0);
        shmem_free(aligned);
    }

    long *grown = shmem_malloc(4 * sizeof(long));
    for (int i = 0; i < 4; i++) grown[i] = 10 * me + i;
    grown = shmem_realloc(grown, 1000 * sizeof(long));
    CHECK(grown != NULL);
    for (int i = 0; i < 4; i++) CHECK(grown[i] == 10 * me + i);
    shmem_long_p(&grown[999], me, next);
    shmem_barrier_all();
    CHECK(grown[999] == prev);
    grown = shmem_realloc(grown, 2 * sizeof(long));
    CHECK(grown[1] == 10 * me + 1);
    CHECK(shmem_realloc(grown, 0) == NULL);

    double *hinted = shmem_malloc_with_hints(8 * sizeof(double), SHMEM_MALLOC_ATOMICS_REMOTE);
    short *legacy = shmalloc(16 * sizeof(short));
    CHECK(hinted != NULL && legacy != NULL);
    shmem_double_p(&hinted[7], 0.5 * me, next);
    shmem_short_p(&legacy[15], (short)(-me), next);
    shmem_barrier_all();
    CHECK(hinted[7] == 0.5 * prev && legacy[15] == -prev);
    legacy = shrealloc(legacy, 32 * sizeof(short));
    CHECK(legacy[15] == -prev);
    void *aligned_legacy = shmemalign(4096, 10);
    CHECK(aligned_legacy != NULL && (uintptr_t)aligned_legacy % 4096 == 0);
    shfree(aligned_legacy);
    shfree(legacy);
    shmem_free(hinted);
    shmem_free(NULL);
    shmem_free(zeros);

    /* More blocks than the library keeps located at once, used in turn (a put to each, a get
     * from each, several rounds), one freed in the middle and its neighbours used again. */
    enum { BLOCKS = 40, ROUNDS = 3 };
    long *blocks[BLOCKS];
    for (int b = 0; b < BLOCKS; b++) {
        blocks[b] = shmem_malloc(2 * sizeof(long));
        CHECK(blocks[b] != NULL);
    }
    for (int round = 0; round < ROUNDS; round++) {
        for (int b = 0; b < BLOCKS; b++)
            shmem_long_p(&blocks[b][round % 2], 1000L * me + 10L * b + round, next);
        shmem_barrier_all();
        for (int b = 0; b < BLOCKS; b++) {
            CHECK(blocks[b][round % 2] == 1000L * prev + 10L * b + round);
            CHECK(shmem_long_g(&blocks[b][round % 2], next) == 1000L * me + 10L * b + round);
        }
        shmem_barrier_all();
    }
    shmem_free(blocks[BLOCKS / 2]);
    for (int b = BLOCKS / 2 - 1; b <= BLOCKS / 2 + 1; b += 2)
        CHECK(shmem_long_g(&blocks[b][0], me) == 1000L * prev + 10L * b + ROUNDS - 1);
    shmem_barrier_all();
    for (int b = 0; b < BLOCKS; b++)
        if (b != BLOCKS / 2) shmem_free(blocks[b]);
    PASS("memory");
    shmem_finalize();
    return 0;
}
