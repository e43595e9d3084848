/* How the OpenSHMEM C calls scale with use, in plain OpenSHMEM (build it with hmcc, or with
 * oshcc for OSHMEM): what a table of fixed sizes does not show.
 *
 *   hmcc -O2 -o scaling bench/oshmem/scaling.c && hmrun -n 2 -- ./scaling [--quick]
 *
 * PE 0 prints one line per measurement:
 *   - get 8 B from PE 1 cycling over k blocks of 64 B (k = 1, 4, 8, 16, 32): ns per get, the
 *     fastest of 3 passes;
 *   - shmem_malloc(4096) + shmem_free with nothing else live: ns per pair, the fastest of 3;
 *   - shmem_free of 50,000 blocks of 64 B, oldest first: µs per free;
 *   - resident memory (VmRSS) before and after 4,000,000 shmem_malloc(64) + shmem_free pairs.
 * --quick makes every count small (the bench smoke test: it runs, nothing about speed). */

#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static long resident_kib(void) {
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (status != NULL && fgets(line, sizeof line, status) != NULL)
        if (strncmp(line, "VmRSS:", 6) == 0) kib = atol(line + 6);
    if (status != NULL) fclose(status);
    return kib;
}

/* ns per 8-byte get from PE 1, cycling over `k` blocks (PE 0 times; PE 1 waits). */
static double gets_over_blocks(int k, long gets) {
    long *blocks[32];
    for (int b = 0; b < k; b++) {
        blocks[b] = shmem_malloc(64);
        *blocks[b] = b;
    }
    shmem_barrier_all();
    double best = 1e30;
    if (shmem_my_pe() == 0) {
        volatile long sink = 0;
        for (int pass = 0; pass < 3; pass++) {
            double start = now();
            for (long i = 0; i < gets; i++) {
                long value;
                shmem_getmem(&value, blocks[i % k], sizeof value, 1);
                sink += value;
            }
            double ns = (now() - start) / (double)gets * 1e9;
            if (ns < best) best = ns;
        }
    }
    shmem_barrier_all();
    for (int b = 0; b < k; b++) shmem_free(blocks[b]);
    return best;
}

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    long gets = quick ? 1000 : 5000000, pairs = quick ? 1000 : 200000;
    long live = quick ? 1000 : 50000, rss_pairs = quick ? 1000 : 4000000;
    shmem_init();
    int me = shmem_my_pe();
    if (shmem_n_pes() < 2) {
        if (me == 0) fprintf(stderr, "scaling: run it on 2 PEs (hmrun -n 2)\n");
        shmem_finalize();
        return 1;
    }

    int counts[] = {1, 4, 8, 16, 32};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        double ns = gets_over_blocks(counts[i], gets);
        if (me == 0) printf("get 8 B cycling over %d blocks: %.1f ns\n", counts[i], ns);
    }

    double best = 1e30;
    for (int pass = 0; pass < 3; pass++) {
        double start = now();
        for (long i = 0; i < pairs; i++) shmem_free(shmem_malloc(4096));
        double ns = (now() - start) / (double)pairs * 1e9;
        if (ns < best) best = ns;
    }
    if (me == 0) printf("malloc + free of 4 KiB, nothing else live: %.0f ns per pair\n", best);

    void **blocks = malloc((size_t)live * sizeof *blocks);
    for (long i = 0; i < live; i++) blocks[i] = shmem_malloc(64);
    double start = now();
    for (long i = 0; i < live; i++) shmem_free(blocks[i]);
    if (me == 0)
        printf("free of %ld live blocks, oldest first: %.2f us per free\n", live,
               (now() - start) / (double)live * 1e6);
    free(blocks);

    long before = resident_kib();
    for (long i = 0; i < rss_pairs; i++) shmem_free(shmem_malloc(64));
    long after = resident_kib();
    if (me == 0)
        printf("%ld malloc + free pairs: VmRSS %ld -> %ld kB (%+ld kB)\n", rss_pairs, before, after,
               after - before);

    shmem_finalize();
    return 0;
}
