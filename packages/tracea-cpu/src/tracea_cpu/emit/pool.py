"""C source of Tracea's worker pool (one small shared library per process, :mod:`tracea_cpu.pool`) and the
client text every blocked library carries to use it.

Why a pool of its own. An OpenMP parallel region ends with a barrier: the calling thread returns only once
every thread of the team has *arrived*, even one that starts late and finds no work left. Right after a
NumPy call, OpenBLAS's workers spin on the cores for ~0.1 s; on the 16-core Xeon of the GPU machine one
Tracea worker then entered the region 4-12 ms late (woken onto a core a spinner held), every piece had been
taken by the others (its work: 0 us, theirs 2.4 ms), and the 1024^3 GEMM took 7.9 ms instead of 2.2 ms for
as long as OpenBLAS spun (``benchmarks/cpu/probes/region_start.py``). Drivers that hand their work out
from counters (``tr_drive_cols``) need no barrier: the work is done once every piece is, whoever took it.

The pool runs such a job: ``tr_pool_run(fn, ctx, nth)`` publishes ``fn(ctx, slot, nth)`` for ``nth``
participants, runs it as slot 0 on the calling thread, then *closes* the job and waits only for the
participants that joined before it closed (they are running pieces they claimed). A worker that wakes after
that finds the job closed (a generation number tells jobs apart) and goes back to waiting; nothing of the
finished call is touched. ``fn`` must therefore be written so that when it returns on the calling thread
no work is left unclaimed (the caller takes whatever the others have not: the column driver's stealing).

State: one 64-bit word, generation << 32 | open << 31 | active << 16 | joined. A worker joins with one
compare-and-swap that succeeds only while the word names its generation, the job is open and fewer than
``nth`` have joined (it takes slot = joined); it leaves by decrementing active. Idle workers spin until
``tp_spin_ns`` after the latest job ended (default 100 us: a model's next layer usually comes sooner;
short enough not to slow the next library's threads much), then sleep on a futex over the generation word;
the caller wakes two sleepers and each woken worker two more. One job at a time: a second
caller that finds the pool busy (another thread's call, or a call from inside a pool job) gets -1 and runs
its own OpenMP region as before. A forked child starts with no workers (``pthread_atfork``)."""

from __future__ import annotations

from .common import HEADER

# Compiled on its own (tracea_cpu.pool), after common.HEADER (tr_now_ns, tr_cpu_relax).
_POOL_BODY = r"""
#include <pthread.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>

typedef void (*tp_fn_t)(void *ctx, int slot, int nslots);

#define TP_MAX_WORKERS 1023
#define TP_OPEN (1ULL << 31)
#define TP_ONE_ACTIVE (1ULL << 16)
#define TP_FIELD 0x7fffULL
#define TP_TAIL_NS 1000000L

static int tp_busy;              /* a job is being run (one at a time) */
static int tp_workers;           /* threads started */
static int tp_atfork_done;
static uint32_t tp_gen;          /* futex word: the generation of the latest job */
static int tp_sleepers;          /* workers in (or entering) FUTEX_WAIT */
static uint64_t tp_state;        /* gen << 32 | open << 31 | active << 16 | joined */
static long tp_spin_ns = 100000;
static long tp_last_end;         /* tr_now_ns() when the latest job ended */
static tp_fn_t tp_fn;
static void *tp_ctx;
static int tp_nth;
static pthread_mutex_t tp_grow = PTHREAD_MUTEX_INITIALIZER;

/* Wait for a generation other than `seen`: spin until tp_spin_ns after the later of this worker's own
   arrival here and the end of the latest job, and while the job it left is still running (up to
   TP_TAIL_NS), so that a worker done early spins through the job's tail and the caller's gap before its
   next call, not just its own idle time; then sleep on the futex. A worker woken
   from the futex wakes up to two more sleepers (a wake tree: the caller makes one cheap call instead of
   waking every worker itself, which on a busy host had it preempted for milliseconds mid-syscall). */
static uint32_t tp_wait_job(uint32_t seen) {
    long t0 = tr_now_ns();
    for (int i = 1;; i++) {
        uint32_t g = __atomic_load_n(&tp_gen, __ATOMIC_ACQUIRE);
        if (g != seen) return g;
        if (i & 63) { tr_cpu_relax(); continue; }
        long end = __atomic_load_n(&tp_last_end, __ATOMIC_RELAXED), from = end > t0 ? end : t0, now = tr_now_ns();
        if (now - from < __atomic_load_n(&tp_spin_ns, __ATOMIC_RELAXED)) continue;
        if (__atomic_load_n(&tp_busy, __ATOMIC_RELAXED) && now - t0 < TP_TAIL_NS) continue;
        __atomic_add_fetch(&tp_sleepers, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&tp_gen, __ATOMIC_SEQ_CST) == seen)
            syscall(SYS_futex, &tp_gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        __atomic_sub_fetch(&tp_sleepers, 1, __ATOMIC_SEQ_CST);
        g = __atomic_load_n(&tp_gen, __ATOMIC_ACQUIRE);
        if (g != seen) {
            if (__atomic_load_n(&tp_sleepers, __ATOMIC_SEQ_CST) > 0 && (__atomic_load_n(&tp_state, __ATOMIC_ACQUIRE) & TP_OPEN))
                syscall(SYS_futex, &tp_gen, FUTEX_WAKE_PRIVATE, 2, NULL, NULL, 0);
            return g;
        }
        t0 = tr_now_ns();
    }
}

static void *tp_worker(void *arg) {
    uint32_t seen = (uint32_t)(uintptr_t)arg;
    for (;;) {
        uint32_t g = tp_wait_job(seen);
        seen = g;
        uint64_t s = __atomic_load_n(&tp_state, __ATOMIC_ACQUIRE);
        for (;;) {
            if ((uint32_t)(s >> 32) != g || !(s & TP_OPEN)) break;  /* finished or not ours: wait again */
            int joined = (int)(s & TP_FIELD);
            if (joined >= tp_nth) break;  /* (written before the job's state was published) */
            if (__atomic_compare_exchange_n(&tp_state, &s, s + TP_ONE_ACTIVE + 1, 0, __ATOMIC_ACQUIRE,
                                            __ATOMIC_ACQUIRE)) {
                tp_fn(tp_ctx, joined, tp_nth);
                __atomic_sub_fetch(&tp_state, TP_ONE_ACTIVE, __ATOMIC_RELEASE);
                break;
            }
        }
    }
    return NULL;
}
static void tp_after_fork_child(void) {
    /* The child has only the forking thread: no workers, no job in flight. */
    tp_workers = 0;
    tp_busy = 0;
    tp_sleepers = 0;
    tp_state = 0;
    pthread_mutex_init(&tp_grow, NULL);
}

/* Start workers until there are `want` (fewer if the system refuses threads); returns how many there are. */
static int tp_ensure(int want) {
    if (want > TP_MAX_WORKERS) want = TP_MAX_WORKERS;
    if (__atomic_load_n(&tp_workers, __ATOMIC_ACQUIRE) >= want) return tp_workers;
    pthread_mutex_lock(&tp_grow);
    if (!tp_atfork_done) {
        pthread_atfork(NULL, NULL, tp_after_fork_child);
        tp_atfork_done = 1;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (tp_workers < want) {
        pthread_t th;
        uintptr_t g = __atomic_load_n(&tp_gen, __ATOMIC_ACQUIRE);
        if (pthread_create(&th, &attr, tp_worker, (void *)g)) break;
        __atomic_add_fetch(&tp_workers, 1, __ATOMIC_RELEASE);
    }
    pthread_attr_destroy(&attr);
    pthread_mutex_unlock(&tp_grow);
    return tp_workers;
}

/* Run fn(ctx, slot, n) on up to nth participants, the caller as slot 0 (see the module doc). Returns 0 once
   fn has returned on the caller and on every participant that joined; -1 (nothing run) when the pool is
   busy or no worker can be started: the caller then runs the work some other way. */
int tr_pool_run(tp_fn_t fn, void *ctx, int nth) {
    if (nth < 2) { fn(ctx, 0, 1); return 0; }
    if (__atomic_exchange_n(&tp_busy, 1, __ATOMIC_ACQUIRE)) return -1;
    int have = tp_ensure(nth - 1);
    if (have < 1) { __atomic_store_n(&tp_busy, 0, __ATOMIC_RELEASE); return -1; }
    if (nth > have + 1) nth = have + 1;
    tp_fn = fn;
    tp_ctx = ctx;
    tp_nth = nth;
    uint32_t g = tp_gen + 1;
    __atomic_store_n(&tp_state, ((uint64_t)g << 32) | TP_OPEN | 1, __ATOMIC_RELEASE);
    __atomic_store_n(&tp_gen, g, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&tp_sleepers, __ATOMIC_SEQ_CST))  /* (the woken wake more: tp_wait_job) */
        syscall(SYS_futex, &tp_gen, FUTEX_WAKE_PRIVATE, 2, NULL, NULL, 0);
    fn(ctx, 0, nth);
    __atomic_and_fetch(&tp_state, ~TP_OPEN, __ATOMIC_ACQ_REL);
    for (int i = 1; (__atomic_load_n(&tp_state, __ATOMIC_ACQUIRE) >> 16) & TP_FIELD; i++) {
        tr_cpu_relax();
        if (i > 4096) sched_yield();
    }
    __atomic_store_n(&tp_last_end, tr_now_ns(), __ATOMIC_RELAXED);
    __atomic_store_n(&tp_busy, 0, __ATOMIC_RELEASE);
    return 0;
}

/* How long idle workers spin before sleeping (nanoseconds, >= 0). */
void tr_pool_set_spin(long ns) { __atomic_store_n(&tp_spin_ns, ns < 0 ? 0 : ns, __ATOMIC_RELAXED); }

/* Threads started so far (for tests and `tracea doctor`). */
int tr_pool_workers(void) { return __atomic_load_n(&tp_workers, __ATOMIC_ACQUIRE); }
"""

#: C source of the pool library (``#define _GNU_SOURCE`` first: ``syscall`` and the futex constants)
POOL_SOURCE = "#define _GNU_SOURCE\n" + HEADER + _POOL_BODY

# In every blocked library: the pool's entry point, set by the loader (tr_set_pool); null = OpenMP only.
POOL_CLIENT = r"""
typedef void (*tr_pool_fn)(void *ctx, int slot, int nslots);
typedef int (*tr_pool_run_t)(tr_pool_fn fn, void *ctx, int nth);
static tr_pool_run_t tr_pool_run_p = 0;
/* Set (or clear, with 0) the worker pool this library's counter-driven drivers run on (tracea_cpu.pool). */
void tr_set_pool(void *run) { __atomic_store_n(&tr_pool_run_p, (tr_pool_run_t)run, __ATOMIC_RELEASE); }
/* Run fn on the pool when one is set and free; returns 0 when it ran, -1 when the caller must run it. */
static inline int tr_pool_try(tr_pool_fn fn, void *ctx, int nth) {
    tr_pool_run_t run = __atomic_load_n(&tr_pool_run_p, __ATOMIC_ACQUIRE);
    return run && nth > 1 ? run(fn, ctx, nth) : -1;
}
"""
