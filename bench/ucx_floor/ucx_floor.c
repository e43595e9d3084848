/*
 * ucx_floor: the UCX route's rows as bare `ucp` loops between two processes, nothing of ours or
 * of OSHMEM's in between: the floor under `hm-bench shmem --transport ucx` and OSHMEM's `spml
 * ucx` on the same transport (issue 10; bench/findings.md, round 26).
 *
 * Build:  gcc -O2 -o target/ucx_floor bench/ucx_floor/ucx_floor.c -lucp -lucs
 * Run:    UCX_TLS=tcp,self target/ucx_floor ROW [--context oshmem|wakeup|ours] [--quick]
 *
 * The process forks; parent (PE 0) and child (PE 1) exchange worker addresses, heap addresses
 * and packed rkeys over a socketpair, then PE 0 times the row: 21 trials (11 for the 1 MiB rows)
 * of a fixed batch, median and min printed in nanoseconds per operation. Every wait busy-polls
 * `ucp_worker_progress`, as OSHMEM's do; PE 1 busy-polls while PE 0 times a one-sided row.
 *
 * Rows:
 *   signal      ping-pong, one way: a fetching swap on the peer's word, waited for, then a
 *               wait for the peer's swap (our `signal`: synchronous, applied when it returns)
 *   put_word    the same ping-pong with an 8-byte `ucp_put_nbx` not waited for (OSHMEM's
 *               `shmem_long_p`)
 *   get         get 8 B
 *   fetch_add   fetching add of 1 on the peer's word
 *   put_quiet   put 8 B + `ucp_worker_flush_nbx`
 *   put_1m      put 1 MiB + `ucp_worker_flush_nbx`
 *   get_1m      get 1 MiB
 *   all_to_all  both PEs at once: copy the own 1 MiB block, put the other to the peer, flush,
 *               then meet (an 8-byte put each way, each waiting for the other's)
 *   am_word     the put_word ping-pong with the 8-byte put as an active message (offset and
 *               value; the handler stores the value): the UCX route's message path over TCP
 *   am_quiet    an 8-byte put as an active message + a one-byte get from the peer (which it
 *               answers after the message): the message path's put + quiet
 *
 * The two am_ rows add the AM feature to either context.
 * --context ours makes the context and worker as `crate::sys::ucx` does: features RMA, AMO32,
 * AMO64, AM and WAKEUP (the event fd the progress thread sleeps on), a MULTI-thread worker and
 * UCX_USE_MT_MUTEX=y. The default is what OSHMEM's spml ucx asks for: RMA, AMO32, AMO64, a
 * single-thread worker. --context wakeup is OSHMEM's plus the WAKEUP feature alone: it puts the
 * transport's own epoll set (TCP's) into the worker's, so the kernel runs one more wake-up
 * callback for every message received (bench/findings.md, round 29). Endpoints have
 * peer-failure handling in all three (as ours). --quick: small
 * batches and 3 trials (checks that it works, not how fast; the smoke test).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define BIG (1 << 20)

/* The contexts of --context, in the order of `context_names`. */
enum context { OSHMEM, WAKEUP, OURS, CONTEXTS };
static const char *const context_names[CONTEXTS] = {"oshmem", "wakeup", "ours"};

/* The rows, in the order of `row_names` (resolved once, not per operation). */
enum row {
    SIGNAL,
    PUT_WORD,
    GET,
    FETCH_ADD,
    PUT_QUIET,
    PUT_1M,
    GET_1M,
    ALL_TO_ALL,
    AM_WORD,
    AM_QUIET,
    ROWS
};
static const char *row_names[ROWS] = {"signal",    "put_word", "get",    "fetch_add",
                                      "put_quiet", "put_1m",   "get_1m", "all_to_all",
                                      "am_word",   "am_quiet"};
#define MAX_TRIALS 21

/* PE heap: words at the start, then two 1 MiB blocks: the target of the peer's puts and gets,
 * and this PE's own block of an all-to-all. */
enum { WORD_SIGNAL = 0, WORD_STOP = 8, WORD_MEET = 16, BLOCK_OFFSET = 4096 };
static uint8_t heap[BLOCK_OFFSET + 2 * BIG] __attribute__((aligned(4096)));

static ucp_worker_h worker;
static ucp_ep_h ep;
static ucp_rkey_h rkey;
static uint64_t peer_base;
static int me, link_fd, quick;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void die(const char *what, const char *why) {
    fprintf(stderr, "ucx_floor (PE %d): %s: %s\n", me, what, why);
    exit(1);
}

static void check(ucs_status_t status, const char *what) {
    if (status != UCS_OK) die(what, ucs_status_string(status));
}

static void write_all(const void *data, size_t len) {
    for (size_t done = 0; done < len;) {
        ssize_t n = write(link_fd, (const char *)data + done, len - done);
        if (n <= 0) die("write to the peer", "failed");
        done += (size_t)n;
    }
}

static void read_all(void *data, size_t len) {
    for (size_t done = 0; done < len;) {
        ssize_t n = read(link_fd, (char *)data + done, len - done);
        if (n <= 0) die("read from the peer", "the peer is gone");
        done += (size_t)n;
    }
}

/* Sends `len` bytes and receives the peer's (at most `cap`); returns the peer's length. */
static size_t swap_blob(const void *mine, size_t len, void *theirs, size_t cap) {
    uint64_t n = len, m;
    write_all(&n, sizeof n);
    write_all(mine, len);
    read_all(&m, sizeof m);
    if (m > cap) die("exchange", "the peer's blob is too large");
    read_all(theirs, m);
    return m;
}

/* Both PEs meet over the socketpair, progressing meanwhile (the peer may need our progress). */
static void meet(void) {
    char byte = 0;
    write_all(&byte, 1);
    while (recv(link_fd, &byte, 1, MSG_DONTWAIT) != 1) ucp_worker_progress(worker);
}

static void wait_for(ucs_status_ptr_t request, const char *what) {
    if (request == NULL) return;
    if (UCS_PTR_IS_ERR(request)) die(what, ucs_status_string(UCS_PTR_STATUS(request)));
    while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
    check(ucp_request_check_status(request), what);
    ucp_request_free(request);
}

static volatile uint64_t *word(size_t index) { return (volatile uint64_t *)(heap + 8 * index); }
static uint64_t peer_word(size_t index) { return peer_base + 8 * index; }

static void flush(void) {
    ucp_request_param_t param = {0};
    wait_for(ucp_worker_flush_nbx(worker, &param), "ucp_worker_flush_nbx");
}

static void put(const void *source, size_t len, uint64_t remote, int waited) {
    ucp_request_param_t param = {0};
    ucs_status_ptr_t request = ucp_put_nbx(ep, source, len, remote, rkey, &param);
    if (waited) {
        wait_for(request, "ucp_put_nbx");
    } else if (UCS_PTR_IS_PTR(request)) {
        ucp_request_free(request); /* completes on its own; a later flush covers it */
    } else if (UCS_PTR_IS_ERR(request)) {
        die("ucp_put_nbx", ucs_status_string(UCS_PTR_STATUS(request)));
    }
}

/* The am_ rows' message: the heap offset and the value to store there. */
#define PUT_MESSAGE 1

static ucs_status_t on_put_message(void *arg, const void *header, size_t header_length, void *data,
                                   size_t length, const ucp_am_recv_param_t *param) {
    (void)arg, (void)header, (void)header_length, (void)param;
    uint64_t offset_and_value[2];
    if (length != sizeof offset_and_value) return UCS_OK;
    memcpy(offset_and_value, data, sizeof offset_and_value);
    if (offset_and_value[0] <= sizeof heap - 8)
        *(volatile uint64_t *)(heap + offset_and_value[0]) = offset_and_value[1];
    return UCS_OK;
}

/* Sends the am_ rows' message (eager; the message is copied out before the call returns). */
static void put_message(uint64_t offset, uint64_t value) {
    static uint64_t offset_and_value[2];
    offset_and_value[0] = offset;
    offset_and_value[1] = value;
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_AM_SEND_FLAG_EAGER};
    wait_for(ucp_am_send_nbx(ep, PUT_MESSAGE, NULL, 0, offset_and_value, sizeof offset_and_value,
                             &param),
             "ucp_am_send_nbx");
}

static uint64_t fetching(ucp_atomic_op_t op, uint64_t value, uint64_t remote) {
    static uint64_t operand, reply;
    operand = value;
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER,
        .datatype = ucp_dt_make_contig(sizeof(uint64_t)),
        .reply_buffer = &reply,
    };
    wait_for(ucp_atomic_op_nbx(ep, op, &operand, 1, remote, rkey, &param), "ucp_atomic_op_nbx");
    return reply;
}

static void get(void *destination, size_t len, uint64_t remote) {
    ucp_request_param_t param = {0};
    wait_for(ucp_get_nbx(ep, destination, len, remote, rkey, &param), "ucp_get_nbx");
}

/* One operation of a one-sided row, issued by PE 0. */
static void one_sided(enum row row, uint64_t i) {
    static uint64_t value;
    static uint8_t big[BIG];
    value = i;
    if (row == GET) {
        get(&value, sizeof value, peer_word(WORD_SIGNAL));
    } else if (row == FETCH_ADD) {
        fetching(UCP_ATOMIC_OP_ADD, 1, peer_word(WORD_SIGNAL));
    } else if (row == PUT_QUIET) {
        put(&value, sizeof value, peer_word(WORD_SIGNAL), 1);
        flush();
    } else if (row == AM_QUIET) {
        static uint8_t probe;
        put_message(8 * WORD_SIGNAL, value);
        get(&probe, 1, peer_base);
    } else if (row == PUT_1M) {
        put(big, BIG, peer_base + BLOCK_OFFSET, 1);
        flush();
    } else {
        get(big, BIG, peer_base + BLOCK_OFFSET);
    }
}

/* One round trip of a ping-pong row, or one all-to-all; both PEs run it. */
static void both(enum row row, uint64_t i) {
    static uint64_t value;
    static uint8_t source[2 * BIG];
    value = i;
    if (row == ALL_TO_ALL) {
        /* Into the registered heap, whose address UCX holds: the copy cannot be optimized out. */
        memcpy(heap + BLOCK_OFFSET + BIG, source + (size_t)me * BIG, BIG);
        put(source + (size_t)(1 - me) * BIG, BIG, peer_base + BLOCK_OFFSET, 1);
        flush();
        put(&value, sizeof value, peer_word(WORD_MEET), 1);
        while (*word(WORD_MEET) < i) ucp_worker_progress(worker);
        return;
    }
    int as_put = row == PUT_WORD, as_message = row == AM_WORD;
    if (me == 1) {
        while (*word(WORD_SIGNAL) != i) ucp_worker_progress(worker);
    }
    if (as_message) {
        put_message(8 * WORD_SIGNAL, value);
    } else if (as_put) {
        put(&value, sizeof value, peer_word(WORD_SIGNAL), 0);
    } else {
        fetching(UCP_ATOMIC_OP_SWAP, i, peer_word(WORD_SIGNAL));
    }
    if (me == 0) {
        while (*word(WORD_SIGNAL) != i) ucp_worker_progress(worker);
    }
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void run(enum row row, enum context kind) {
    int messages = row == AM_WORD || row == AM_QUIET, ours = kind == OURS;
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AMO32 | UCP_FEATURE_AMO64 |
                    (ours || messages ? UCP_FEATURE_AM : 0) |
                    (kind != OSHMEM ? UCP_FEATURE_WAKEUP : 0),
    };
    ucp_config_t *config;
    ucp_context_h context;
    check(ucp_config_read(NULL, NULL, &config), "ucp_config_read");
    if (ours) check(ucp_config_modify(config, "USE_MT_MUTEX", "y"), "ucp_config_modify");
    check(ucp_init(&params, config, &context), "ucp_init");
    ucp_config_release(config);
    ucp_worker_params_t worker_params = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = ours ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SINGLE,
    };
    check(ucp_worker_create(context, &worker_params, &worker), "ucp_worker_create");
    if (messages) {
        ucp_am_handler_param_t handler = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB,
            .id = PUT_MESSAGE,
            .cb = on_put_message,
        };
        check(ucp_worker_set_am_recv_handler(worker, &handler), "ucp_worker_set_am_recv_handler");
    }
    ucp_mem_map_params_t map = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = heap,
        .length = sizeof heap,
    };
    ucp_mem_h memory;
    check(ucp_mem_map(context, &map, &memory), "ucp_mem_map");

    void *packed;
    size_t packed_len, address_len;
    ucp_address_t *address;
    static char peer_address[1 << 16], peer_rkey[1 << 16];
    check(ucp_rkey_pack(context, memory, &packed, &packed_len), "ucp_rkey_pack");
    check(ucp_worker_get_address(worker, &address, &address_len), "ucp_worker_get_address");
    uint64_t base = (uint64_t)(uintptr_t)heap;
    swap_blob(address, address_len, peer_address, sizeof peer_address);
    swap_blob(packed, packed_len, peer_rkey, sizeof peer_rkey);
    swap_blob(&base, sizeof base, &peer_base, sizeof peer_base);
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (ucp_address_t *)peer_address,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
    };
    check(ucp_ep_create(worker, &ep_params, &ep), "ucp_ep_create");
    check(ucp_ep_rkey_unpack(ep, peer_rkey, &rkey), "ucp_ep_rkey_unpack");

    int ping_pong = row == SIGNAL || row == PUT_WORD || row == AM_WORD;
    int together = ping_pong || row == ALL_TO_ALL;
    int bulk = row == PUT_1M || row == GET_1M || row == ALL_TO_ALL;
    uint64_t batch = quick ? (bulk ? 5 : 200) : (bulk ? 200 : 20000);
    int trials = quick ? 3 : bulk ? 11 : MAX_TRIALS;
    double per_op[MAX_TRIALS];
    uint64_t next = 0;

    /* Warm-up: wire the endpoint up and fault every page in. */
    one_sided(PUT_1M, 0);
    meet();
    for (int t = 0; t < trials; t++) {
        meet();
        double start = now_ns();
        if (together) {
            for (uint64_t i = 0; i < batch; i++) both(row, ++next);
        } else if (me == 0) {
            for (uint64_t i = 0; i < batch; i++) one_sided(row, i);
            static uint64_t stop;
            stop = t + 1;
            put(&stop, sizeof stop, peer_word(WORD_STOP), 1);
            flush();
        } else {
            while (*word(WORD_STOP) != (uint64_t)t + 1) ucp_worker_progress(worker);
        }
        per_op[t] = (now_ns() - start) / (double)batch / (ping_pong ? 2.0 : 1.0);
    }
    qsort(per_op, trials, sizeof per_op[0], compare);
    if (me == 0) {
        printf("{\"op\":\"%s\",\"layer\":\"ucx-floor\",\"context\":\"%s\",\"median_ns\":%.1f,"
               "\"min_ns\":%.1f,\"trials\":%d,\"batch_ops\":%llu}\n",
               row_names[row], context_names[kind], per_op[trials / 2], per_op[0], trials,
               (unsigned long long)batch);
    }
    meet();
    ucp_rkey_destroy(rkey);
    ucp_request_param_t close = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
    wait_for(ucp_ep_close_nbx(ep, &close), "ucp_ep_close_nbx");
    ucp_rkey_buffer_release(packed);
    ucp_worker_release_address(worker, address);
    ucp_mem_unmap(context, memory);
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
}

int main(int argc, char **argv) {
    enum row row = ROWS;
    enum context kind = OSHMEM;
    int usage = argc < 2;
    for (int i = 0; argc > 1 && i < ROWS; i++)
        if (!strcmp(argv[1], row_names[i])) row = (enum row)i;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--context") && i + 1 < argc) {
            kind = CONTEXTS;
            for (int k = 0; k < CONTEXTS; k++)
                if (!strcmp(argv[i + 1], context_names[k])) kind = (enum context)k;
            usage |= kind == CONTEXTS;
            i++;
        } else {
            usage = 1;
        }
    }
    if (row == ROWS || usage) {
        fprintf(stderr,
                "usage: ucx_floor ROW [--context oshmem|wakeup|ours] [--quick]\n"
                "ROW: signal, put_word, get, fetch_add, put_quiet, put_1m, get_1m, all_to_all, "
                "am_word, am_quiet\n");
        return 2;
    }
    int link[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, link) != 0) die("socketpair", "failed");
    pid_t child = fork();
    if (child < 0) die("fork", "failed");
    me = child == 0;
    link_fd = link[me];
    close(link[1 - me]);
    run(row, kind);
    if (child > 0) {
        int status;
        if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status))
            die("PE 1", "did not exit cleanly");
    }
    return 0;
}
