/*
 * edgeport's thread pool for the 2022 libXNNPACK: the pthreadpool C ABI (create, destroy, threads count and the
 * parallelize_* entry points that library imports), written from the public API's semantics.
 *
 * Loaded (by edgeport_xnnpack._pool_loader) before libXNNPACK under the soname libpthreadpool.so.0, so that the
 * dynamic loader satisfies libXNNPACK's dependency with this object and binds its pthreadpool_* references here
 * (checked afterwards with edgeport_pool_binding, which reads libXNNPACK's relocated GOT entries). Nothing is
 * exported to the global symbol scope: other libraries in the process (torch's own pthreadpool) are untouched.
 *
 * Policy, aimed at a CPU that other processes share:
 *  - the caller always works: each thread owns a contiguous share of the items (thread t the t-th of `threads`
 *    equal ranges, the same share in every call, so consecutive operators find the rows they read in the cache of
 *    the core that wrote them), takes them one at a time from its front, then steals one at a time from the back
 *    of the others' shares; work that a worker has not started (it was never woken, or sits descheduled) is done
 *    by whoever is running, and the caller waits only for workers that joined the job and still hold an item;
 *  - workers spin for a bounded time (POOL_SPIN_NS) after a job, then park on a futex; the caller wakes them only
 *    when some are parked (PTHREADPOOL_FLAG_YIELD_WORKERS: park at once);
 *  - contention: when the caller had to wait for a joined worker much longer than the chunks take (the worker was
 *    preempted mid-chunk), the pool runs the next calls on the caller alone for a back-off period (20 ms, doubling
 *    up to 1.28 s while it keeps happening), then tries the workers again;
 *  - load: at most every LOAD_PERIOD_NS a call reads the machine's CPU time (the "cpu" line of /proc/stat) and
 *    this process's (CLOCK_PROCESS_CPUTIME_ID); over the window since the last read, the cores kept busy by other
 *    programs are the machine's busy share times the online CPUs minus this process's CPU time over the wall time,
 *    kept as a short average; the call then uses at most (online CPUs - others, rounded) threads: with one core of
 *    two busy the pool runs on the caller alone instead of waiting for a worker that shares a core, and returns to
 *    all threads when the other program stops (edgeport_pool_set_load_gauge: period, file, CPU count, for tests).
 *    CPU time, not the runnable count of /proc/loadavg, which an earlier version read: a sample of that count
 *    catches threads that run for microseconds (and this pool's own workers between a wake and a park), and on an
 *    idle 2-CPU host it took the second thread away from ~40% of the calls;
 *  - a parallelize call on a pool already running another call (another thread) or from inside a task runs on
 *    the calling thread instead of waiting; a single-item call always does.
 * Results do not depend on the split: every item is computed by one call of the task function.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#endif

#define EXPORT __attribute__((visibility("default")))
#define FLAG_DISABLE_DENORMALS 0x1u
#define FLAG_YIELD_WORKERS 0x2u
/* a worker's spin after a job before it parks: longer than the host steps between two parallel operators (a
   transformer encoder's batch-matmul host segments run 110-130 us on one thread); at 50 us a worker parked and was
   woken again within each run, and on a VM a wake of an idle vCPU costs tens of us: the encoder's warm call after
   an idle gap took 6.3 ms, 4.4 at 200 us (AMD EPYC VM, 2 threads; MobileNetV2 2.8 -> 2.0 ms) */
#define POOL_SPIN_NS 200000LL
#define WAIT_SPIN_NS 20000LL       /* the caller's spin for joined workers before it sleeps */
#define LATE_NS 200000LL           /* a wait this much longer than the chunks take: a worker was preempted */
#define BACKOFF_MIN_NS 20000000LL  /* solo period after the first late wait */
#define BACKOFF_MAX_NS 1280000000LL
#define LOAD_PERIOD_NS 50000000LL   /* how often a call re-reads the machine's CPU time (the window's length) */
#define LOAD_PATH "/proc/stat"
#define OPEN_BIT (1ull << 31)
#define ACTIVE_MASK (OPEN_BIT - 1)
#define MAX_THREADS 1024

typedef struct pool pool_t;

typedef struct {
    pool_t *pool;
    pthread_t thread;
} worker_t;

typedef struct {
    void *fn;
    void *ctx;
    int ndim, ntiled;
    size_t range[6], tile[6], count[6];
    size_t total;
    uint32_t flags;
} job_t;

/* one thread's share of a job's items: its owner claims `start` upwards, thieves claim `end` downwards; `left`
   (decremented by every claim, successful or not) keeps the two from overlapping */
typedef struct {
    _Atomic ptrdiff_t left;
    _Atomic size_t end;
    size_t start;
} __attribute__((aligned(64))) share_t;

struct pool {
    size_t threads; /* including the caller */
    job_t job;      /* written by the caller before it publishes a new generation */
    /* gen << 32 | OPEN_BIT | joined workers: a worker joins only an open job of the generation it saw */
    _Atomic uint64_t state __attribute__((aligned(64)));
    _Atomic uint32_t wake_seq; /* futex: bumped with each generation */
    _Atomic uint32_t parked;   /* workers asleep on wake_seq */
    _Atomic uint32_t done_seq; /* futex: bumped when the last joined worker leaves a closed job */
    _Atomic int shutdown;
    pthread_mutex_t call_lock;
    int64_t solo_until, backoff;
    /* policy (edgeport_pool_set_policy): a worker's spin after a job, the first solo period after a late wait
       (0: never run solo) */
    _Atomic int64_t spin_ns;
    int64_t backoff_min_ns;
    share_t *shares; /* [threads] */
    /* load gauge (under call_lock): the file it reads (-1: off), when next, the CPUs it shares, the last read (the
       machine's busy and total ticks, this process's CPU ns, the wall clock; load_have: it is valid), the average
       number of cores other programs keep busy, the threads a call may use */
    int load_fd, load_online, load_have;
    int64_t load_period_ns, load_next_ns;
    uint64_t load_busy, load_total;
    int64_t load_cpu_ns, load_wall_ns;
    double load_others;
    size_t load_limit;
    _Atomic uint64_t n_load_solo, n_load_reads, n_load_limited;
    /* counters (edgeport_pool_stats) */
    _Atomic uint64_t n_calls, n_parallel, n_inline_busy, n_solo, n_late, n_joins, n_moved;
    _Atomic int caller_cpu; /* the CPU the caller of the current job ran on when it published it (-1: unknown) */
    pid_t owner;
    worker_t workers[];
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* -- denormals (PTHREADPOOL_FLAG_DISABLE_DENORMALS) ------------------------------------------------------- */
typedef struct {
    unsigned int mxcsr;
} fpu_state;

static inline fpu_state fpu_enter(uint32_t flags) {
    fpu_state s = {0};
#if defined(__x86_64__) || defined(__i386__)
    if (flags & FLAG_DISABLE_DENORMALS) {
        s.mxcsr = _mm_getcsr();
        _mm_setcsr(s.mxcsr | 0x8040u); /* FTZ | DAZ */
    }
#else
    (void)flags;
#endif
    return s;
}

static inline void fpu_leave(uint32_t flags, fpu_state s) {
#if defined(__x86_64__) || defined(__i386__)
    if (flags & FLAG_DISABLE_DENORMALS) _mm_setcsr(s.mxcsr);
#else
    (void)flags;
    (void)s;
#endif
}

/* -- running items ------------------------------------------------------------------------------------------ */
typedef void (*f1)(void *, size_t);
typedef void (*f2)(void *, size_t, size_t);
typedef void (*f3)(void *, size_t, size_t, size_t);
typedef void (*f4)(void *, size_t, size_t, size_t, size_t);
typedef void (*f5)(void *, size_t, size_t, size_t, size_t, size_t);
typedef void (*f6)(void *, size_t, size_t, size_t, size_t, size_t, size_t);
typedef void (*f7)(void *, size_t, size_t, size_t, size_t, size_t, size_t, size_t);
typedef void (*f8)(void *, size_t, size_t, size_t, size_t, size_t, size_t, size_t, size_t);

/* Item `index` of the flattened tile grid: the start of each dimension, then the extent of each tiled one (the
 * last `ntiled` dimensions), as the task signature of that parallelize_* function orders them. */
static void run_item(const job_t *p, size_t index) {
    size_t a[8];
    int d = p->ndim, t = p->ntiled;
    for (int i = d - 1; i >= 0; i--) {
        size_t c = index % p->count[i];
        index /= p->count[i];
        a[i] = c * p->tile[i];
    }
    for (int i = 0; i < t; i++) {
        int dim = d - t + i;
        size_t left = p->range[dim] - a[dim];
        a[d + i] = left < p->tile[dim] ? left : p->tile[dim];
    }
    void *c = p->ctx;
    switch (d + t) {
    case 1: ((f1)p->fn)(c, a[0]); break;
    case 2: ((f2)p->fn)(c, a[0], a[1]); break;
    case 3: ((f3)p->fn)(c, a[0], a[1], a[2]); break;
    case 4: ((f4)p->fn)(c, a[0], a[1], a[2], a[3]); break;
    case 5: ((f5)p->fn)(c, a[0], a[1], a[2], a[3], a[4]); break;
    case 6: ((f6)p->fn)(c, a[0], a[1], a[2], a[3], a[4], a[5]); break;
    case 7: ((f7)p->fn)(c, a[0], a[1], a[2], a[3], a[4], a[5], a[6]); break;
    default: ((f8)p->fn)(c, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]); break;
    }
}

static inline int claim(share_t *r, int front, size_t *item) {
    if (atomic_load_explicit(&r->left, memory_order_relaxed) <= 0) return 0;
    if (atomic_fetch_sub_explicit(&r->left, 1, memory_order_relaxed) <= 0) return 0;
    *item = front ? r->start++ : atomic_fetch_sub_explicit(&r->end, 1, memory_order_relaxed) - 1;
    return 1;
}

/* Thread `tid`'s part of the job: its own share front to back, then the others' from their backs; returns the
 * number of items run. */
static size_t run_share(pool_t *p, size_t tid) {
    const job_t *job = &p->job;
    size_t done = 0, item, n = p->threads;
    while (claim(&p->shares[tid], 1, &item)) {
        run_item(job, item);
        done++;
    }
    for (size_t k = 1; k < n; k++) {
        share_t *r = &p->shares[(tid + k) % n];
        while (claim(r, 0, &item)) {
            run_item(job, item);
            done++;
        }
    }
    return done;
}

/* -- workers ------------------------------------------------------------------------------------------------ */
/* A woken worker that the kernel placed on the CPU its caller runs on cannot help (it only takes turns with the
 * caller, and its spin takes the caller's time): it moves itself to another CPU the process may use, by setting its
 * affinity to the allowed CPUs without this one (the kernel migrates it at once) and then back to the whole set
 * (it stays where it is). Seen on a 2-vCPU VM: after an idle gap, woken workers often stayed on the caller's vCPU
 * for milliseconds. 1 when it moved. */
static int move_off(int cpu) {
    cpu_set_t allowed, others;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || !CPU_ISSET(cpu, &allowed)) return 0;
    others = allowed;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0 || sched_setaffinity(0, sizeof others, &others) != 0) return 0;
    sched_setaffinity(0, sizeof allowed, &allowed);
    return 1;
}

static void *worker_main(void *arg) {
    pool_t *p = ((worker_t *)arg)->pool;
    size_t tid = (size_t)((worker_t *)arg - p->workers);
    uint32_t seen = atomic_load(&p->wake_seq);
    int yield = 0;
    for (;;) {
        /* wait for a new generation: bounded spin (none after a yield-workers job), then park */
        uint32_t w = atomic_load_explicit(&p->wake_seq, memory_order_acquire);
        if (w == seen) {
            int64_t until = yield ? 0 : now_ns() + atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
            unsigned spins = 0;
            while ((w = atomic_load_explicit(&p->wake_seq, memory_order_acquire)) == seen) {
                if (atomic_load_explicit(&p->shutdown, memory_order_relaxed)) return NULL;
                if ((++spins & 63) == 0 && now_ns() >= until) {
                    atomic_fetch_add(&p->parked, 1);
                    if (atomic_load(&p->wake_seq) == seen && !atomic_load(&p->shutdown)) futex_wait(&p->wake_seq, seen);
                    atomic_fetch_sub(&p->parked, 1);
                    spins = 0;
                    until = 0;
                } else {
                    CPU_RELAX();
                }
            }
        }
        seen = w;
        if (atomic_load(&p->shutdown)) return NULL;
        int cpu = sched_getcpu();
        if (cpu >= 0 && cpu == atomic_load_explicit(&p->caller_cpu, memory_order_relaxed) && move_off(cpu))
            atomic_fetch_add_explicit(&p->n_moved, 1, memory_order_relaxed);
        /* join the job of that generation if it is still open */
        uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
        int joined = 0;
        while ((uint32_t)(s >> 32) == w && (s & OPEN_BIT)) {
            if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acquire,
                                                      memory_order_acquire)) {
                joined = 1;
                break;
            }
        }
        if (!joined) {
            yield = 0;
            continue;
        }
        atomic_fetch_add_explicit(&p->n_joins, 1, memory_order_relaxed);
        uint32_t flags = p->job.flags;
        fpu_state f = fpu_enter(flags);
        run_share(p, tid);
        fpu_leave(flags, f);
        yield = (flags & FLAG_YIELD_WORKERS) != 0;
        s = atomic_fetch_sub_explicit(&p->state, 1, memory_order_acq_rel) - 1;
        if ((s & ACTIVE_MASK) == 0 && !(s & OPEN_BIT)) {
            atomic_fetch_add_explicit(&p->done_seq, 1, memory_order_release);
            futex_wake(&p->done_seq, 1);
        }
    }
}

/* -- the load gauge ------------------------------------------------------------------------------------------- */
/* The machine's CPU ticks from the first line of a /proc/stat file ("cpu  user nice system idle iowait irq softirq
 * steal guest guest_nice"): busy = user + nice + system + irq + softirq, total = busy + idle + iowait + steal (guest
 * time is already part of user). 0, or -1 when the file cannot be read or does not start like that. */
static int read_ticks(int fd, uint64_t *busy, uint64_t *total) {
    char buf[256];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return -1;
    buf[n] = 0;
    if (strncmp(buf, "cpu ", 4) != 0) return -1;
    uint64_t v[8] = {0};
    char *s = buf + 4;
    int got = 0;
    for (; got < 8; got++) {
        while (*s == ' ') s++;
        if (*s < '0' || *s > '9') break;
        char *end;
        v[got] = strtoull(s, &end, 10);
        s = end;
    }
    if (got < 4) return -1;
    *busy = v[0] + v[1] + v[2] + v[5] + v[6];
    *total = *busy + v[3] + v[4] + v[7];
    return 0;
}

static int64_t process_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Re-read the machine's CPU time (at most once per period) and set how many threads the next calls may use: the
 * cores busy over the window since the last read (online CPUs x busy ticks / all ticks) minus this process's CPU
 * time over the same wall time are other programs' cores. A window in which the file's ticks did not advance (a
 * period shorter than a tick) keeps the last read as the start of the next one. */
static void gauge_update(pool_t *p, int64_t now) {
    p->load_next_ns = now + p->load_period_ns;
    uint64_t busy, total;
    int64_t cpu = process_cpu_ns();
    atomic_fetch_add_explicit(&p->n_load_reads, 1, memory_order_relaxed);
    if (read_ticks(p->load_fd, &busy, &total) != 0 || cpu < 0) return; /* unreadable: keep the last limit */
    int have = p->load_have;
    uint64_t d_busy = busy - p->load_busy, d_total = total - p->load_total;
    int64_t d_cpu = cpu - p->load_cpu_ns, d_wall = now - p->load_wall_ns;
    if (have && (busy < p->load_busy || total < p->load_total || d_busy > d_total)) have = 0; /* counters reset */
    if (have && (d_total == 0 || d_wall <= 0)) return;
    p->load_busy = busy;
    p->load_total = total;
    p->load_cpu_ns = cpu;
    p->load_wall_ns = now;
    p->load_have = 1;
    if (!have) return;
    double others = (double)p->load_online * (double)d_busy / (double)d_total - (double)d_cpu / (double)d_wall;
    if (others < 0) others = 0;
    p->load_others = 0.5 * p->load_others + 0.5 * others; /* one busy window does not take a thread away */
    double room = (double)p->load_online - p->load_others + 0.5;
    size_t limit = room < 1.0 ? 1 : (size_t)room;
    p->load_limit = limit < p->threads ? limit : p->threads;
}

/* -- the caller's side ---------------------------------------------------------------------------------------- */
static void run_inline(const job_t *job) {
    fpu_state f = fpu_enter(job->flags);
    for (size_t i = 0; i < job->total; i++) run_item(job, i);
    fpu_leave(job->flags, f);
}

static void parallelize(pool_t *p, void *fn, void *ctx, int ndim, int ntiled, const size_t *range,
                        const size_t *tile, uint32_t flags) {
    size_t total = 1;
    for (int i = 0; i < ndim; i++) {
        if (range[i] == 0) return;
    }
    job_t local; /* an inline run's job (the pool's own is in use, or there is no pool) */
    int owned = p != NULL && p->threads > 1 && pthread_mutex_trylock(&p->call_lock) == 0;
    job_t *job = owned ? &p->job : &local;
    job->fn = fn;
    job->ctx = ctx;
    job->ndim = ndim;
    job->ntiled = ntiled;
    job->flags = flags;
    for (int i = 0; i < ndim; i++) {
        size_t t = tile[i] ? tile[i] : 1;
        job->range[i] = range[i];
        job->tile[i] = t;
        job->count[i] = (range[i] + t - 1) / t;
        total *= job->count[i];
    }
    job->total = total;
    if (!owned) {
        if (p != NULL && p->threads > 1) atomic_fetch_add_explicit(&p->n_inline_busy, 1, memory_order_relaxed);
        run_inline(job);
        return;
    }
    atomic_fetch_add_explicit(&p->n_calls, 1, memory_order_relaxed);
    if (total > 1 && p->load_fd >= 0) {
        int64_t now = now_ns();
        if (now >= p->load_next_ns) gauge_update(p, now);
    }
    size_t use = p->load_fd >= 0 && p->load_limit < p->threads ? p->load_limit : p->threads;
    if (total <= 1 || use <= 1 || (p->solo_until && now_ns() < p->solo_until)) {
        if (total > 1) atomic_fetch_add_explicit(use <= 1 ? &p->n_load_solo : &p->n_solo, 1, memory_order_relaxed);
        run_inline(job);
        pthread_mutex_unlock(&p->call_lock);
        return;
    }
    atomic_fetch_add_explicit(&p->n_parallel, 1, memory_order_relaxed);
    if (use < p->threads) atomic_fetch_add_explicit(&p->n_load_limited, 1, memory_order_relaxed);
    for (size_t t = 0, n = p->threads; t < n; t++) { /* the first `use` threads get equal shares, the rest none */
        size_t q = total / use, rem = total % use;
        size_t b = t < use ? t * q + (t < rem ? t : rem) : total, e = t < use ? b + q + (t < rem) : total;
        p->shares[t].start = b;
        atomic_store_explicit(&p->shares[t].end, e, memory_order_relaxed);
        atomic_store_explicit(&p->shares[t].left, (ptrdiff_t)(e - b), memory_order_relaxed);
    }
    atomic_store_explicit(&p->caller_cpu, sched_getcpu(), memory_order_relaxed);
    uint64_t gen = (atomic_load_explicit(&p->state, memory_order_relaxed) >> 32) + 1;
    /* publish: the generation (low 32 bits of it) is what workers wait on */
    atomic_store_explicit(&p->state, ((gen & 0xFFFFFFFFull) << 32) | OPEN_BIT, memory_order_release);
    atomic_store(&p->wake_seq, (uint32_t)gen); /* seq_cst: pairs with the workers' parked count */
    if (atomic_load(&p->parked)) {
        size_t want = total - 1 < use - 1 ? total - 1 : use - 1;
        futex_wake(&p->wake_seq, (int)want);
    }
    fpu_state f = fpu_enter(flags);
    int64_t w0 = now_ns();
    size_t mine = run_share(p, 0);
    int64_t w1 = now_ns();
    fpu_leave(flags, f);
    /* close the job to late joiners, then wait for the workers that joined */
    uint64_t s = atomic_fetch_and_explicit(&p->state, ~OPEN_BIT, memory_order_acq_rel) & ~OPEN_BIT;
    int64_t waited = 0;
    if (s & ACTIVE_MASK) {
        int64_t until = w1 + WAIT_SPIN_NS;
        unsigned spins = 0;
        for (;;) {
            uint32_t d = atomic_load_explicit(&p->done_seq, memory_order_acquire);
            if ((atomic_load_explicit(&p->state, memory_order_acquire) & ACTIVE_MASK) == 0) break;
            if ((++spins & 63) == 0 && now_ns() >= until) {
                futex_wait(&p->done_seq, d);
            } else {
                CPU_RELAX();
            }
        }
        waited = now_ns() - w1;
    }
    /* contention: a wait far longer than a sixteenth of the job (per thread) takes means a worker was preempted */
    size_t part = total / (p->threads * 8);
    int64_t per_part = mine ? (w1 - w0) / (int64_t)mine * (int64_t)(part ? part : 1) : 0;
    if (waited > LATE_NS + 4 * per_part) {
        atomic_fetch_add_explicit(&p->n_late, 1, memory_order_relaxed);
        if (p->backoff_min_ns) {
            p->backoff = p->backoff ? (p->backoff * 2 < BACKOFF_MAX_NS ? p->backoff * 2 : BACKOFF_MAX_NS)
                                    : p->backoff_min_ns;
            p->solo_until = now_ns() + p->backoff;
        }
    } else if (p->solo_until) {
        p->solo_until = 0; /* a clean parallel call after a solo period: back to normal, remember half */
        p->backoff /= 2;
        if (p->backoff < p->backoff_min_ns) p->backoff = 0;
    }
    pthread_mutex_unlock(&p->call_lock);
}

/* -- the pthreadpool API ------------------------------------------------------------------------------------- */
EXPORT pool_t *pthreadpool_create(size_t threads) {
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (size_t)n : 1;
    }
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    pool_t *p = calloc(1, sizeof(pool_t) + sizeof(worker_t) * threads);
    if (!p) return NULL;
    p->threads = threads;
    p->owner = getpid();
    p->spin_ns = POOL_SPIN_NS;
    p->caller_cpu = -1;
    p->backoff_min_ns = BACKOFF_MIN_NS;
    p->shares = aligned_alloc(64, sizeof(share_t) * threads);
    if (!p->shares) {
        free(p);
        return NULL;
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    p->load_online = online > 0 ? (int)online : 1;
    p->load_fd = threads > 1 ? open(LOAD_PATH, O_RDONLY | O_CLOEXEC) : -1;
    p->load_period_ns = LOAD_PERIOD_NS;
    memset(p->shares, 0, sizeof(share_t) * threads);
    pthread_mutex_init(&p->call_lock, NULL);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* workers never take the process's signals */
    size_t started = 1;
    for (; started < threads; started++) {
        p->workers[started].pool = p;
        if (pthread_create(&p->workers[started].thread, NULL, worker_main, &p->workers[started]) != 0) break;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (started < threads) { /* could not start them all: run with those that did start */
        p->threads = started;
    }
    p->load_limit = p->threads;
    if (p->load_fd >= 0) gauge_update(p, now_ns()); /* the first window starts here */
    return p;
}

EXPORT size_t pthreadpool_get_threads_count(pool_t *p) { return p ? p->threads : 1; }

EXPORT void pthreadpool_destroy(pool_t *p) {
    if (!p) return;
    if (p->load_fd >= 0) close(p->load_fd);
    if (p->owner != getpid()) { /* a forked child: no workers, and the lock may be a copy held by a parent thread */
        free(p->shares);
        free(p);
        return;
    }
    pthread_mutex_lock(&p->call_lock); /* a running call finishes first */
    atomic_store(&p->shutdown, 1);
    atomic_fetch_add(&p->wake_seq, 1);
    futex_wake(&p->wake_seq, MAX_THREADS);
    for (size_t i = 1; i < p->threads; i++) pthread_join(p->workers[i].thread, NULL);
    pthread_mutex_unlock(&p->call_lock);
    pthread_mutex_destroy(&p->call_lock);
    free(p->shares);
    free(p);
}

#define R(...) (const size_t[]){__VA_ARGS__}

EXPORT void pthreadpool_parallelize_1d(pool_t *p, void *fn, void *ctx, size_t i, uint32_t flags) {
    parallelize(p, fn, ctx, 1, 0, R(i), R(1), flags);
}
EXPORT void pthreadpool_parallelize_1d_tile_1d(pool_t *p, void *fn, void *ctx, size_t i, size_t ti, uint32_t flags) {
    parallelize(p, fn, ctx, 1, 1, R(i), R(ti), flags);
}
EXPORT void pthreadpool_parallelize_2d(pool_t *p, void *fn, void *ctx, size_t i, size_t j, uint32_t flags) {
    parallelize(p, fn, ctx, 2, 0, R(i, j), R(1, 1), flags);
}
EXPORT void pthreadpool_parallelize_2d_tile_1d(pool_t *p, void *fn, void *ctx, size_t i, size_t j, size_t tj,
                                               uint32_t flags) {
    parallelize(p, fn, ctx, 2, 1, R(i, j), R(1, tj), flags);
}
EXPORT void pthreadpool_parallelize_2d_tile_2d(pool_t *p, void *fn, void *ctx, size_t i, size_t j, size_t ti,
                                               size_t tj, uint32_t flags) {
    parallelize(p, fn, ctx, 2, 2, R(i, j), R(ti, tj), flags);
}
EXPORT void pthreadpool_parallelize_3d(pool_t *p, void *fn, void *ctx, size_t i, size_t j, size_t k, uint32_t flags) {
    parallelize(p, fn, ctx, 3, 0, R(i, j, k), R(1, 1, 1), flags);
}
EXPORT void pthreadpool_parallelize_3d_tile_2d(pool_t *p, void *fn, void *ctx, size_t i, size_t j, size_t k,
                                               size_t tj, size_t tk, uint32_t flags) {
    parallelize(p, fn, ctx, 3, 2, R(i, j, k), R(1, tj, tk), flags);
}
EXPORT void pthreadpool_parallelize_4d(pool_t *p, void *fn, void *ctx, size_t i, size_t j, size_t k, size_t l,
                                       uint32_t flags) {
    parallelize(p, fn, ctx, 4, 0, R(i, j, k, l), R(1, 1, 1, 1), flags);
}
EXPORT void pthreadpool_parallelize_4d_tile_2d(pool_t *p, void *fn, void *ctx, size_t i, size_t j, size_t k,
                                               size_t l, size_t tk, size_t tl, uint32_t flags) {
    parallelize(p, fn, ctx, 4, 2, R(i, j, k, l), R(1, 1, tk, tl), flags);
}
EXPORT void pthreadpool_parallelize_5d(pool_t *p, void *fn, void *ctx, size_t i, size_t j, size_t k, size_t l,
                                       size_t m, uint32_t flags) {
    parallelize(p, fn, ctx, 5, 0, R(i, j, k, l, m), R(1, 1, 1, 1, 1), flags);
}
EXPORT void pthreadpool_parallelize_5d_tile_2d(pool_t *p, void *fn, void *ctx, size_t i, size_t j, size_t k,
                                               size_t l, size_t m, size_t tl, size_t tm, uint32_t flags) {
    parallelize(p, fn, ctx, 5, 2, R(i, j, k, l, m), R(1, 1, 1, tl, tm), flags);
}
EXPORT void pthreadpool_parallelize_6d_tile_2d(pool_t *p, void *fn, void *ctx, size_t i, size_t j, size_t k,
                                               size_t l, size_t m, size_t n, size_t tm, size_t tn, uint32_t flags) {
    parallelize(p, fn, ctx, 6, 2, R(i, j, k, l, m, n), R(1, 1, 1, 1, tm, tn), flags);
}

/* -- edgeport's own entry points ------------------------------------------------------------------------------ */

/* Counters of a pool: calls, parallel calls, calls run inline because the pool was busy (another thread or a
 * nested call), calls run solo (contention back-off), late waits (contention detected), worker joins. */
EXPORT void edgeport_pool_stats(pool_t *p, uint64_t out[6]) {
    if (!p) {
        memset(out, 0, 6 * sizeof(uint64_t));
        return;
    }
    out[0] = atomic_load(&p->n_calls);
    out[1] = atomic_load(&p->n_parallel);
    out[2] = atomic_load(&p->n_inline_busy);
    out[3] = atomic_load(&p->n_solo);
    out[4] = atomic_load(&p->n_late);
    out[5] = atomic_load(&p->n_joins);
}

/* move_off for the calling thread (the tests check the move itself: a worker meets that case only when the
 * kernel places it so). */
EXPORT int edgeport_pool_move_off(int cpu) { return cpu >= 0 && sched_getcpu() == cpu ? move_off(cpu) : 0; }

/* Workers that found themselves on their caller's CPU and moved off it (see move_off). */
EXPORT uint64_t edgeport_pool_moved(pool_t *p) { return p ? atomic_load(&p->n_moved) : 0; }

/* Set a pool's policy (edgeport_xnnpack.native.ThreadPool.set_policy): a worker's spin after a job before it parks
 * (ns, 0..1e9) and the first solo period after a late wait (ns, 0: never go solo, else 1e6..1e9). Returns 0, or -1
 * (nothing changed) for a value out of range. Takes the call lock: never changes a running call's parameters. */
EXPORT int edgeport_pool_set_policy(pool_t *p, int64_t spin_ns, int64_t backoff_min_ns) {
    if (!p || spin_ns < 0 || spin_ns > 1000000000LL || backoff_min_ns < 0 || backoff_min_ns > 1000000000LL
            || (backoff_min_ns && backoff_min_ns < 1000000LL))
        return -1;
    pthread_mutex_lock(&p->call_lock);
    atomic_store(&p->spin_ns, spin_ns);
    p->backoff_min_ns = backoff_min_ns;
    if (!backoff_min_ns) p->solo_until = p->backoff = 0;
    pthread_mutex_unlock(&p->call_lock);
    return 0;
}

/* Set a pool's load gauge (edgeport_xnnpack.native.ThreadPool.set_load_gauge): re-read `path` (NULL:
 * /proc/stat) at most every `period_ns` (0: off, the pool always offers all its threads; else 1e5..1e10), as
 * sharing `online` CPUs with the machine (0: the online CPU count). Returns 0, or -1 (nothing changed) for a value
 * out of range or a file that cannot be opened. Takes the call lock. */
EXPORT int edgeport_pool_set_load_gauge(pool_t *p, int64_t period_ns, const char *path, int online) {
    if (!p || period_ns < 0 || period_ns > 10000000000LL || (period_ns && period_ns < 100000LL) || online < 0
            || online > 1000000)
        return -1;
    int fd = -1;
    if (period_ns && p->threads > 1) {
        fd = open(path ? path : LOAD_PATH, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -1;
    }
    long sys_online = sysconf(_SC_NPROCESSORS_ONLN);
    pthread_mutex_lock(&p->call_lock);
    if (p->load_fd >= 0) close(p->load_fd);
    p->load_fd = fd;
    p->load_period_ns = period_ns;
    p->load_next_ns = 0;
    p->load_others = 0;
    p->load_have = 0;
    p->load_online = online ? online : (sys_online > 0 ? (int)sys_online : 1);
    p->load_limit = p->threads;
    if (fd >= 0) gauge_update(p, now_ns());
    pthread_mutex_unlock(&p->call_lock);
    return 0;
}

/* The load gauge's counters and state: calls run on the caller alone because of the load, calls run on fewer
 * threads than the pool has, reads of the load file, the threads the next call may use, and 1000 x the average
 * number of cores other programs keep busy. */
EXPORT void edgeport_pool_load_stats(pool_t *p, uint64_t out[5]) {
    if (!p) {
        memset(out, 0, 5 * sizeof(uint64_t));
        return;
    }
    pthread_mutex_lock(&p->call_lock);
    out[0] = atomic_load(&p->n_load_solo);
    out[1] = atomic_load(&p->n_load_limited);
    out[2] = atomic_load(&p->n_load_reads);
    out[3] = p->load_fd >= 0 ? p->load_limit : p->threads;
    out[4] = (uint64_t)(p->load_others * 1000.0 + 0.5);
    pthread_mutex_unlock(&p->call_lock);
}

static const struct {
    const char *name;
    void *fn;
} EXPORTS[] = {
    {"pthreadpool_create", (void *)pthreadpool_create},
    {"pthreadpool_destroy", (void *)pthreadpool_destroy},
    {"pthreadpool_get_threads_count", (void *)pthreadpool_get_threads_count},
    {"pthreadpool_parallelize_1d", (void *)pthreadpool_parallelize_1d},
    {"pthreadpool_parallelize_1d_tile_1d", (void *)pthreadpool_parallelize_1d_tile_1d},
    {"pthreadpool_parallelize_2d", (void *)pthreadpool_parallelize_2d},
    {"pthreadpool_parallelize_2d_tile_1d", (void *)pthreadpool_parallelize_2d_tile_1d},
    {"pthreadpool_parallelize_2d_tile_2d", (void *)pthreadpool_parallelize_2d_tile_2d},
    {"pthreadpool_parallelize_3d", (void *)pthreadpool_parallelize_3d},
    {"pthreadpool_parallelize_3d_tile_2d", (void *)pthreadpool_parallelize_3d_tile_2d},
    {"pthreadpool_parallelize_4d", (void *)pthreadpool_parallelize_4d},
    {"pthreadpool_parallelize_4d_tile_2d", (void *)pthreadpool_parallelize_4d_tile_2d},
    {"pthreadpool_parallelize_5d", (void *)pthreadpool_parallelize_5d},
    {"pthreadpool_parallelize_5d_tile_2d", (void *)pthreadpool_parallelize_5d_tile_2d},
    {"pthreadpool_parallelize_6d_tile_2d", (void *)pthreadpool_parallelize_6d_tile_2d},
};

static void append(char *buf, size_t len, const char *text) {
    size_t used = strlen(buf);
    if (used + 1 < len) snprintf(buf + used, len - used, "%s%s", used ? ", " : "", text);
}

/* Where the library opened as `handle` (dlopen) resolved its pthreadpool_* references: returns how many of them
 * point at this object's functions, or -1 when the relocation tables cannot be read; `bad` receives the names of
 * those that do not (and the object they point into). Reads the GOT slots the loader filled (the library must
 * have been opened with RTLD_NOW). */
EXPORT int edgeport_pool_binding(void *handle, char *bad, size_t bad_len) {
    struct link_map *lm = NULL;
    if (bad_len) bad[0] = 0;
#if !defined(__LP64__)
    return -1; /* 64-bit ELF (RELA tables) only */
#endif
    if (!handle || dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_ld) return -1;
    uintptr_t base = lm->l_addr;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    uintptr_t tables[2] = {0, 0};
    size_t sizes[2] = {0, 0};
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        uintptr_t v = d->d_un.d_ptr;
        uintptr_t addr = v < base ? v + base : v; /* glibc relocates these entries in place; others may not */
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)addr; break;
        case DT_STRTAB: strtab = (const char *)addr; break;
        case DT_JMPREL: tables[0] = addr; break;
        case DT_PLTRELSZ: sizes[0] = d->d_un.d_val; break;
        case DT_RELA: tables[1] = addr; break;
        case DT_RELASZ: sizes[1] = d->d_un.d_val; break;
        default: break;
        }
    }
    if (!symtab || !strtab) return -1;
    int ours = 0;
    for (int t = 0; t < 2; t++) {
        const ElfW(Rela) *r = (const ElfW(Rela) *)tables[t];
        for (size_t i = 0; r && i < sizes[t] / sizeof(ElfW(Rela)); i++) {
            size_t sym = ELF64_R_SYM(r[i].r_info);
            if (sym == 0) continue;
            const char *name = strtab + symtab[sym].st_name;
            if (strncmp(name, "pthreadpool_", 12) != 0) continue;
            void *target = *(void **)(base + r[i].r_offset);
            void *expected = NULL;
            for (size_t k = 0; k < sizeof(EXPORTS) / sizeof(EXPORTS[0]); k++) {
                if (strcmp(EXPORTS[k].name, name) == 0) expected = EXPORTS[k].fn;
            }
            if (expected && target == expected) {
                ours++;
                continue;
            }
            Dl_info info;
            char text[512];
            const char *where = dladdr(target, &info) && info.dli_fname ? info.dli_fname : "?";
            snprintf(text, sizeof text, "%s -> %s%s", name, where, expected ? "" : " (not implemented here)");
            append(bad, bad_len, text);
        }
    }
    return ours;
}
