/* Linked statically against libhmshmem.a (with the flags of `pkg-config --static --libs
 * hmshmem`): the heap, RMA, atomics, a reduction and the barrier work; global variables are
 * not symmetric then (the library's own state lies in the data it would remap), and the
 * library says so. */
#include <shmem.h>
#include <shmemx.h>
#include <string.h>

#include "check.h"

static long not_symmetric;

int main(void) {
    start();
    long *words = shmem_malloc(4 * sizeof(long));
    long *sum = shmem_malloc(sizeof(long));
    CHECK(words && sum);
    words[0] = 0;
    shmem_barrier_all();
    shmem_long_p(&words[1], me + 10, next);
    shmem_long_atomic_add(&words[0], me + 1, 0);
    shmem_barrier_all();
    CHECK(words[1] == prev + 10 && shmem_long_g(&words[1], next) == me + 10);
    if (me == 0) CHECK(words[0] == (long)n * (n + 1) / 2);
    words[2] = me;
    shmem_long_sum_reduce(SHMEM_TEAM_WORLD, sum, &words[2], 1);
    CHECK(*sum == (long)n * (n - 1) / 2);
    CHECK(shmem_addr_accessible(&not_symmetric, me) == 0);
    CHECK(shmemx_last_error() && strstr(shmemx_last_error(), "linked statically"));
    shmem_free(sum);
    shmem_free(words);
    PASS("static_link");
    shmem_finalize();
    return 0;
}
