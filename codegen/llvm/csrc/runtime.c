/* The runtime of a compiled step (kiln_runtime.h is its ABI): the same
   source for every step, which it knows through the generated tables of
   kiln_program.h. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kiln_program.h"
#include "kiln_runtime.h"

#define tensors (kilnrt_program.tensors)
#define NTENSORS (kilnrt_program.ntensors)
#define NPARAMS (kilnrt_program.nparams)
#define NINPUTS (kilnrt_program.ninputs)
#define NRESULTS (kilnrt_program.nresults)
#define NKERNELS (kilnrt_program.nkernels)

const char *kiln_descriptor(void) { return kilnrt_program.descriptor; }

int kiln_count(void) { return NTENSORS; }
long long kiln_bytes(int i) { return i >= 0 && i < NTENSORS ? tensors[i].bytes : -1; }

int kiln_find(const char *name) {
	for (int i = 0; i < NTENSORS; i++)
		if (strcmp(tensors[i].name, name) == 0) return i;
	return -1;
}

/* The thread pool: one per process image of this runtime, made by the
   first kiln_create. kiln_parallel_for (which the compiled kernels call;
   the code Kiln emits holds a weak version that starts threads on every
   call) gives chunk t of [0, n) to thread t; the caller runs chunk 0.
   One parallel loop runs on the pool at a time; a loop started while the
   pool is busy, or from a pool thread, runs on its caller alone.

   A step runs many short parallel loops back to back, so waiting spins
   a little before it sleeps: a thread woken through a condition variable
   starts tens of microseconds late, longer than many kernels take. Pool
   threads spin for the next loop, and the caller for the pool's chunks,
   for POOL_SPIN_NS, then block. */
enum { MAX_THREADS = 256 };
#define POOL_SPIN_NS 50000LL
static struct {
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	int size; /* threads, the caller's included */
	void (*body)(void *, long long, long long, long long);
	void *ctx;
	long long n, threads;
	unsigned long gen;  /* atomic: a new loop is published by its increment */
	int pending;        /* atomic: pool threads that have not finished the loop */
	int sleepers;       /* under mu: pool threads blocked on go */
	int waiting;        /* under mu: the caller is blocked on done */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 1, NULL, NULL, 0, 0, 0, 0, 0, 0};
static pthread_mutex_t pool_busy = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static int pool_want = 1;
static __thread int pool_worker;

static long long pool_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* pool_spinning reports whether a spin that has gone round i times
   (deadline 0 before its first) may go on, pausing once. */
static int pool_spinning(unsigned i, long long *deadline) {
	if (i % 64 == 0) {
		long long now = pool_now();
		if (*deadline == 0) *deadline = now + POOL_SPIN_NS;
		else if (now > *deadline) return 0;
	}
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
	return 1;
}

static void *pool_thread(void *arg) {
	long long t = (long long)(intptr_t)arg;
	unsigned long seen = 0;
	pool_worker = 1;
	for (;;) {
		unsigned long g;
		long long deadline = 0;
		for (unsigned i = 0; (g = __atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE)) == seen && pool_spinning(i, &deadline); i++) {
		}
		if (g == seen) {
			pthread_mutex_lock(&pool.mu);
			pool.sleepers++;
			while ((g = __atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE)) == seen) pthread_cond_wait(&pool.go, &pool.mu);
			pool.sleepers--;
			pthread_mutex_unlock(&pool.mu);
		}
		seen = g;
		void (*body)(void *, long long, long long, long long) = pool.body;
		void *ctx = pool.ctx;
		long long n = pool.n, T = pool.threads;
		if (t < T) body(ctx, n * t / T, n * (t + 1) / T, t);
		if (__atomic_sub_fetch(&pool.pending, 1, __ATOMIC_ACQ_REL) == 0) {
			pthread_mutex_lock(&pool.mu);
			if (pool.waiting) pthread_cond_signal(&pool.done);
			pthread_mutex_unlock(&pool.mu);
		}
	}
	return NULL;
}

static void pool_start(void) {
	int want = pool_want;
	if (want > MAX_THREADS) want = MAX_THREADS;
	pool.size = 1;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	for (int t = 1; t < want; t++) {
		pthread_t th;
		if (pthread_create(&th, &attr, pool_thread, (void *)(intptr_t)t) != 0) break;
		pool.size++;
	}
	pthread_attr_destroy(&attr);
}

void kiln_parallel_for(void (*body)(void *, long long, long long, long long), void *ctx, long long n, long long threads) {
	if (threads > n) threads = n;
	if (threads > pool.size) threads = pool.size;
	if (threads <= 1 || pool_worker || pthread_mutex_trylock(&pool_busy) != 0) {
		if (n > 0) body(ctx, 0, n, 0);
		return;
	}
	pool.body = body, pool.ctx = ctx, pool.n = n, pool.threads = threads;
	__atomic_store_n(&pool.pending, pool.size - 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&pool.gen, 1, __ATOMIC_RELEASE);
	pthread_mutex_lock(&pool.mu);
	if (pool.sleepers) pthread_cond_broadcast(&pool.go);
	pthread_mutex_unlock(&pool.mu);
	body(ctx, 0, n / threads, 0);
	long long deadline = 0;
	for (unsigned i = 0; __atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE) && pool_spinning(i, &deadline); i++) {
	}
	if (__atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE)) {
		pthread_mutex_lock(&pool.mu);
		pool.waiting = 1;
		while (__atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE)) pthread_cond_wait(&pool.done, &pool.mu);
		pool.waiting = 0;
		pthread_mutex_unlock(&pool.mu);
	}
	pthread_mutex_unlock(&pool_busy);
}

/* Kernel workspace: one block, grown to the largest request and kept
   (the emitted code's weak versions allocate and free it on every run).
   Runs take turns (run_lock), so they share it. */
static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;
static void *ws_block;
static long long ws_size;

void *kiln_ws_acquire(long long n) {
	if (n > ws_size) {
		void *p = realloc(ws_block, (size_t)n);
		if (!p) return NULL;
		ws_block = p, ws_size = n;
	}
	return ws_block;
}

void kiln_ws_release(void *p) { (void)p; }

/* The profile: each kernel's name, its bytes read and written and FLOPs
   (the cost model's), and, while profiling is on, its calls and seconds
   (the emitted code calls the hooks around every kernel; their weak
   versions do nothing). */
static int profiling;
static double *kernel_secs, kernel_t0;
static long long *kernel_calls;

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + 1e-9 * t.tv_nsec;
}

void kiln_profile_enter(long long k) {
	(void)k;
	if (profiling) kernel_t0 = now();
}

void kiln_profile_exit(long long k) {
	if (profiling && k >= 0 && k < NKERNELS) kernel_secs[k] += now() - kernel_t0, kernel_calls[k]++;
}

void kiln_profile(int on) {
	if (!kernel_secs) kernel_secs = calloc((size_t)NKERNELS + 1, sizeof *kernel_secs);
	if (!kernel_calls) kernel_calls = calloc((size_t)NKERNELS + 1, sizeof *kernel_calls);
	profiling = on && kernel_secs && kernel_calls;
	if (kernel_secs) memset(kernel_secs, 0, sizeof *kernel_secs * ((size_t)NKERNELS + 1));
	if (kernel_calls) memset(kernel_calls, 0, sizeof *kernel_calls * ((size_t)NKERNELS + 1));
}

int kiln_kernels(void) { return NKERNELS; }

int kiln_kernel(int k, const char **name, long long *bytes, long long *flops, long long *calls, double *seconds) {
	if (k < 0 || k >= NKERNELS) return -1;
	if (name) *name = kilnrt_program.kernels[k].name;
	if (bytes) *bytes = kilnrt_program.kernels[k].bytes;
	if (flops) *flops = kilnrt_program.kernels[k].flops;
	if (calls) *calls = kernel_calls ? kernel_calls[k] : 0;
	if (seconds) *seconds = kernel_secs ? kernel_secs[k] : 0;
	return 0;
}

struct kiln_step {
	void *arena;
	void **own;              /* each argument's own buffer */
	void **pv, **iv, **ov;   /* the entry point's params, inputs and outputs */
	char err[512];
};

static int fail(kiln_step *s, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->err, sizeof s->err, fmt, ap);
	va_end(ap);
	return -1;
}

const char *kiln_error(kiln_step *s) { return s ? s->err : "no step"; }

static void *aligned(long long n) {
	void *p = NULL;
	if (posix_memalign(&p, 64, (size_t)((n + 63) / 64 * 64 + 64)) != 0) return NULL;
	memset(p, 0, (size_t)((n + 63) / 64 * 64 + 64));
	return p;
}

/* drop_pages lets the kernel reclaim the whole pages of an embedded
   initial value once copied: they are the program file's, read again if
   ever touched, and would otherwise stay resident beside the copy. */
static void drop_pages(const void *p, long long n) {
	long page = sysconf(_SC_PAGESIZE);
	if (page <= 0) return;
	uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page, hi = ((uintptr_t)p + (uintptr_t)n) / (uintptr_t)page * (uintptr_t)page;
	if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* fill writes the elem bytes at value over all n bytes of dst, doubling
   what is written with each copy. */
static void fill(void *dst, const void *value, long long elem, long long n) {
	char *d = dst;
	if (n <= 0 || elem <= 0) return;
	memcpy(d, value, (size_t)(elem < n ? elem : n));
	for (long long done = elem; done < n; done *= 2) memcpy(d + done, d, (size_t)(done < n - done ? done : n - done));
}

void kiln_destroy(kiln_step *s) {
	if (!s) return;
	for (int i = 0; s->own && i < NPARAMS + NINPUTS; i++) free(s->own[i]);
	free(s->own), free(s->pv), free(s->iv), free(s->ov);
	free(s->arena);
	free(s);
}

kiln_step *kiln_create(int threads) {
	if (threads <= 0) {
		long c = sysconf(_SC_NPROCESSORS_ONLN);
		threads = c > 0 ? (int)c : 1;
	}
	/* More than the machine's memory would only be found out page by page
	   (the allocation succeeds where memory is overcommitted). */
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	long long need = kilnrt_program.arena_bytes;
	for (int i = 0; i < NPARAMS + NINPUTS; i++) need += tensors[i].bytes;
	if (pages > 0 && page > 0 && need / page > pages) return NULL;
	pool_want = threads;
	pthread_once(&pool_once, pool_start);
	kiln_step *s = calloc(1, sizeof *s);
	if (!s) return NULL;
	s->arena = aligned(kilnrt_program.arena_bytes);
	s->own = calloc((size_t)(NPARAMS + NINPUTS) + 1, sizeof *s->own);
	s->pv = calloc((size_t)NPARAMS + 1, sizeof *s->pv);
	s->iv = calloc((size_t)NINPUTS + 1, sizeof *s->iv);
	s->ov = calloc((size_t)NRESULTS + 1, sizeof *s->ov);
	if (!s->arena || !s->own || !s->pv || !s->iv || !s->ov) {
		kiln_destroy(s);
		return NULL;
	}
	for (int i = 0; i < NPARAMS + NINPUTS; i++) {
		const kiln_tensor_info *t = &tensors[i];
		s->own[i] = aligned(t->bytes);
		if (!s->own[i]) {
			kiln_destroy(s);
			return NULL;
		}
		if (t->init && t->splat) {
			fill(s->own[i], t->init, t->elem_bytes, t->bytes);
		} else if (t->init) {
			memcpy(s->own[i], t->init, (size_t)t->bytes);
			drop_pages(t->init, t->bytes);
		}
		if (t->kind == 0) s->pv[t->slot] = s->own[i];
		else s->iv[t->slot] = s->own[i];
	}
	return s;
}

int kiln_run(kiln_step *s) {
	pthread_mutex_lock(&run_lock);
	int status = kilnrt_entry(s->arena, s->pv, s->iv, s->ov);
	pthread_mutex_unlock(&run_lock);
	if (status != 0) {
		/* The results are not this run's (the arena holds a part of it):
		   kiln_data and kiln_get refuse them until a run succeeds. */
		memset(s->ov, 0, sizeof *s->ov * ((size_t)NRESULTS + 1));
	}
	if (status == kilnrt_program.status_index_out_of_range) return fail(s, "index out of range: a gather index or a cross-entropy label lies outside its dimension");
	if (status != 0) return fail(s, "the step failed (status %d)", status);
	return 0;
}

void *kiln_data(kiln_step *s, int i) {
	if (i < 0 || i >= NTENSORS) return NULL;
	const kiln_tensor_info *t = &tensors[i];
	return t->kind == 0 ? s->pv[t->slot] : t->kind == 1 ? s->iv[t->slot] : s->ov[t->slot];
}

int kiln_set(kiln_step *s, int i, const void *src, long long bytes) {
	if (i < 0 || i >= NPARAMS + NINPUTS) return fail(s, "tensor %d is not an argument", i);
	if (bytes != tensors[i].bytes) return fail(s, "%s holds %lld bytes, not %lld", tensors[i].name, tensors[i].bytes, bytes);
	if (tensors[i].kind == 0) {
		/* A parameter or state: into the memory the step uses for it,
		   its own or the memory it shares (kiln_bind). */
		memcpy(s->pv[tensors[i].slot], src, (size_t)bytes);
		return 0;
	}
	/* Into the step's own buffer: a data input bound to the caller's
	   memory is unbound, never written through. */
	memcpy(s->own[i], src, (size_t)bytes);
	s->iv[tensors[i].slot] = s->own[i];
	return 0;
}

int kiln_get(kiln_step *s, int i, void *dst, long long bytes) {
	if (i < 0 || i >= NTENSORS) return fail(s, "no tensor %d", i);
	if (bytes != tensors[i].bytes) return fail(s, "%s holds %lld bytes, not %lld", tensors[i].name, tensors[i].bytes, bytes);
	void *p = kiln_data(s, i);
	if (!p) return fail(s, "result %s is not made: no run has succeeded since the step was made or a run failed", tensors[i].name);
	memcpy(dst, p, (size_t)bytes);
	return 0;
}

int kiln_bind(kiln_step *s, int i, void *data) {
	if (i < 0 || i >= NPARAMS + NINPUTS) return fail(s, "tensor %d is not an argument", i);
	const kiln_tensor_info *t = &tensors[i];
	if (t->kind == 1) {
		s->iv[t->slot] = data ? data : s->own[i];
		return 0;
	}
	/* A parameter or state: the step reads and updates the caller's
	   memory (another step's, a framework's tensor), and its own buffer
	   is freed; unbound, it gets a buffer of its own again, holding the
	   values it had in the shared memory. */
	if (data) {
		if (s->own[i]) free(s->own[i]);
		s->own[i] = NULL;
		s->pv[t->slot] = data;
		return 0;
	}
	if (!s->own[i]) {
		void *own = aligned(t->bytes);
		if (!own) return fail(s, "out of memory for %s", t->name);
		memcpy(own, s->pv[t->slot], (size_t)t->bytes);
		s->own[i] = own;
	}
	s->pv[t->slot] = s->own[i];
	return 0;
}

int kiln_save(kiln_step *s, const char *path) { return kilnrt_save(s->pv, path, s->err, sizeof s->err); }

int kiln_load(kiln_step *s, const char *path) { return kilnrt_load(s->pv, path, s->err, sizeof s->err); }
