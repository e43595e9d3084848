/* shmemx_restart_heap: the heap restarted with a new size (argv[1], MiB; from the 8 MiB the
 * test sets with SHMEM_SYMMETRIC_SIZE). Blocks kept with preserve hold their bytes (then
 * zeros where they grew), blocks without preserve and a second restart without preserve hold
 * zeros; global and static variables keep their values (also those a peer put there) and stay
 * symmetric (put, get and atomics on them after each restart); the heap really has the new
 * size; a request leaving a block out, or sizes that differ across PEs, are refused with -1 on
 * every PE and change nothing. */
#include <shmem.h>
#include <shmemx.h>
#include <string.h>

#include "check.h"

#define MIB (1024L * 1024L)
#define WORDS 1024
#define BIG (16 * 1024)

static long counter = 42;                   /* data */
static double initialised[4] = {1.5, 2.5, 3.5, 4.5};
int global_array[WORDS];                    /* bss */
static long from_peer[BIG];                 /* bss, 128 KiB: more than a few pages */

/* Every PE's bytes of a block: a pattern of the PE and the index. */
static unsigned char pattern(int pe, long i) { return (unsigned char)(pe * 31 + i * 7 + 1); }

/* The data and bss as this PE left them before the first restart (for PE `pe`'s values). */
static void check_statics(int round) {
    CHECK(counter == 42 + me + round * n);
    CHECK(initialised[0] == 1.5 && initialised[2] == 3.5 + me);
    for (int i = 0; i < WORDS; i++) CHECK(global_array[i] == me * 1000 + i);
    for (long i = 0; i < BIG; i++) CHECK(from_peer[i] == prev * 100000L + i);
}

/* RMA on the heap block `words` (WORDS ints) and on the statics after a restart. */
static void rma_after_restart(int *words, int round) {
    int source[WORDS];
    for (int i = 0; i < WORDS; i++) source[i] = -(me * 1000 + i);
    shmem_barrier_all(); /* every PE checked its own values before anyone writes */
    shmem_int_put(words, source, WORDS, next);
    shmem_int_put(global_array, source, WORDS, next);
    shmem_long_atomic_add(&counter, 1, 0);
    shmem_barrier_all();
    for (int i = 0; i < WORDS; i++) CHECK(words[i] == -(prev * 1000 + i));
    for (int i = 0; i < WORDS; i++) CHECK(global_array[i] == -(prev * 1000 + i));
    int got[WORDS];
    shmem_int_get(got, global_array, WORDS, prev); /* prev holds prev-1's values */
    CHECK(got[5] == -(((prev + n - 1) % n) * 1000 + 5));
    shmem_int_get(got, words, WORDS, next); /* next holds mine */
    for (int i = 0; i < WORDS; i++) CHECK(got[i] == -(me * 1000 + i));
    if (me == 0) CHECK(counter == 42 + round * n + n);
    CHECK(shmem_long_atomic_fetch(&counter, 0) == 42 + round * n + n);
    shmem_barrier_all();
    /* Back to the values check_statics expects (the counter of each PE as before plus n). */
    for (int i = 0; i < WORDS; i++) global_array[i] = me * 1000 + i;
    counter = 42 + me + (round + 1) * n;
    shmem_barrier_all();
}

int main(int argc, char **argv) {
    start();
    CHECK(argc == 2);
    long new_mib = atol(argv[1]);
    CHECK(new_mib > 8);

    /* Data and bss written by this PE and by a peer. */
    counter = 42 + me;
    initialised[2] = 3.5 + me;
    for (int i = 0; i < WORDS; i++) global_array[i] = me * 1000 + i;
    long *mine = malloc(BIG * sizeof(long));
    for (long i = 0; i < BIG; i++) mine[i] = me * 100000L + i;
    shmem_barrier_all();
    shmem_long_put(from_peer, mine, BIG, next);
    free(mine);

    /* Three blocks: kept and grown, kept and shrunk, not kept. */
    int *grown = shmem_malloc(WORDS * sizeof(int));
    unsigned char *shrunk = shmem_malloc(100);
    long *dropped = shmem_malloc(16 * sizeof(long));
    CHECK(grown && shrunk && dropped);
    for (int i = 0; i < WORDS; i++) grown[i] = me * 7000 + i;
    for (long i = 0; i < 100; i++) shrunk[i] = pattern(me, i);
    for (int i = 0; i < 16; i++) dropped[i] = -1 - i;
    shmem_barrier_all();
    check_statics(0);
    /* The 8 MiB heap cannot hold (new size - 4 MiB). */
    CHECK(shmem_malloc((size_t)(new_mib - 4) * MIB) == NULL);

    /* Refused before any teardown: a block left out. Nothing changes. */
    shmemx_heap_replacement_t partial[2] = {
        {grown, 2 * WORDS * sizeof(int), 1, NULL},
        {shrunk, 50, 1, NULL},
    };
    CHECK(shmemx_restart_heap((size_t)new_mib * MIB, partial, 2) == -1);
    CHECK(shmemx_last_error() != NULL && strstr(shmemx_last_error(), "shmemx_restart_heap"));
    CHECK(partial[0].replaced == NULL);
    CHECK(grown[WORDS - 1] == me * 7000 + WORDS - 1 && shrunk[99] == pattern(me, 99));
    check_statics(0);
    /* Refused too: sizes that differ across PEs (the same verdict on every PE). */
    if (n > 1) {
        shmemx_heap_replacement_t uneven[3] = {
            {grown, (size_t)(me + 1) * 64, 1, NULL},
            {shrunk, 50, 1, NULL},
            {dropped, 16 * sizeof(long), 0, NULL},
        };
        CHECK(shmemx_restart_heap((size_t)new_mib * MIB, uneven, 3) == -1);
        CHECK(strstr(shmemx_last_error(), "differ"));
        CHECK(grown[0] == me * 7000 && dropped[15] == -16);
    }

    /* The restart, keeping two blocks. */
    shmemx_heap_replacement_t blocks[3] = {
        {grown, 2 * WORDS * sizeof(int), 1, NULL},
        {shrunk, 50, 1, NULL},
        {dropped, 16 * sizeof(long), 0, NULL},
    };
    CHECK(shmemx_restart_heap((size_t)new_mib * MIB, blocks, 3) == 0);
    grown = blocks[0].replaced;
    shrunk = blocks[1].replaced;
    dropped = blocks[2].replaced;
    CHECK(grown && shrunk && dropped);
    for (int i = 0; i < WORDS; i++) CHECK(grown[i] == me * 7000 + i);
    for (int i = WORDS; i < 2 * WORDS; i++) CHECK(grown[i] == 0);
    for (long i = 0; i < 50; i++) CHECK(shrunk[i] == pattern(me, i));
    for (int i = 0; i < 16; i++) CHECK(dropped[i] == 0);
    check_statics(0);
    /* Every PE kept the same: a peer's copy reads the same way. */
    CHECK(shmem_int_g(&grown[3], next) == next * 7000 + 3);
    CHECK(shmem_uchar_g(&shrunk[49], prev) == pattern(prev, 49));
    CHECK(shmem_long_g(&from_peer[BIG - 1], next) == me * 100000L + BIG - 1);
    rma_after_restart(grown, 0);
    check_statics(1);

    /* The heap has the new size now. */
    void *large = shmem_malloc((size_t)(new_mib - 4) * MIB);
    CHECK(large != NULL);

    /* Back to 8 MiB, keeping nothing of the heap: zeros; the statics are kept all the same. */
    for (int i = 0; i < 16; i++) dropped[i] = 5;
    shmem_barrier_all();
    shmemx_heap_replacement_t again[4] = {
        {grown, WORDS * sizeof(int), 0, NULL},
        {shrunk, 50, 0, NULL},
        {dropped, 16 * sizeof(long), 0, NULL},
        {large, 4096, 0, NULL},
    };
    CHECK(shmemx_restart_heap(8 * MIB, again, 4) == 0);
    grown = again[0].replaced;
    for (int i = 0; i < WORDS; i++) CHECK(grown[i] == 0);
    for (long i = 0; i < 50; i++) CHECK(((unsigned char *)again[1].replaced)[i] == 0);
    for (int i = 0; i < 16; i++) CHECK(((long *)again[2].replaced)[i] == 0);
    for (int i = 0; i < 1024; i++) CHECK(((int *)again[3].replaced)[i] == 0);
    check_statics(1);
    rma_after_restart(grown, 1);
    check_statics(2);
    CHECK(shmem_malloc((size_t)(new_mib - 4) * MIB) == NULL);

    for (int i = 0; i < 4; i++) shmem_free(again[i].replaced);
    PASS("restart_heap");
    shmem_finalize();
    return 0;
}
