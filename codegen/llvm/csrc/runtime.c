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
	/* Into the step's own buffer: a data input bound to the caller's
	   memory is unbound, never written through. */
	memcpy(s->own[i], src, (size_t)bytes);
	if (tensors[i].kind == 1) s->iv[tensors[i].slot] = s->own[i];
	return 0;
}

int kiln_get(kiln_step *s, int i, void *dst, long long bytes) {
	if (i < 0 || i >= NTENSORS) return fail(s, "no tensor %d", i);
	if (bytes != tensors[i].bytes) return fail(s, "%s holds %lld bytes, not %lld", tensors[i].name, tensors[i].bytes, bytes);
	void *p = kiln_data(s, i);
	if (!p) return fail(s, "result %s is not made before the first run", tensors[i].name);
	memcpy(dst, p, (size_t)bytes);
	return 0;
}

int kiln_bind(kiln_step *s, int i, void *data) {
	if (i < 0 || i >= NTENSORS || tensors[i].kind != 1) return fail(s, "tensor %d is not a data input", i);
	s->iv[tensors[i].slot] = data ? data : s->own[i];
	return 0;
}

/* Checkpoints: an uncompressed zip archive of .npy members. */
static unsigned crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static void crc_init(void) {
	for (unsigned n = 0; n < 256; n++) {
		unsigned c = n;
		for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
		crc_table[n] = c;
	}
}
static unsigned crc32(unsigned crc, const unsigned char *p, size_t n) {
	crc = ~crc;
	while (n--) crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

/* kilnrt_npy_header writes t's .npy header (version 1, padded to a
   multiple of 64 bytes) to h, which holds KILN_NPY_HEADER_MAX bytes, and
   returns its length, or -1 when the shape does not fit. */
int kilnrt_npy_header(const kiln_tensor_info *t, unsigned char *h) {
	char shape[640], dict[800];
	size_t at = 0;
	shape[0] = 0;
	for (int i = 0; i < t->rank; i++) {
		int w = snprintf(shape + at, sizeof shape - at, i ? ", %lld" : "%lld", t->shape[i]);
		if (w < 0 || (size_t)w >= sizeof shape - at) return -1;
		at += (size_t)w;
	}
	if (t->rank == 1) {
		if (at + 2 > sizeof shape) return -1;
		shape[at++] = ',', shape[at] = 0;
	}
	int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", t->descr, shape);
	if (n < 0 || (size_t)n >= sizeof dict) return -1;
	int pad = (64 - (10 + n + 1) % 64) % 64;
	memcpy(h, "\x93NUMPY\x01\x00", 8);
	int hl = n + pad + 1;
	h[8] = hl & 0xff, h[9] = hl >> 8;
	memcpy(h + 10, dict, (size_t)n);
	memset(h + 10 + n, ' ', (size_t)pad);
	h[10 + n + pad] = '\n';
	return 10 + hl;
}

static void put16(unsigned char *b, unsigned v) { b[0] = v & 0xff, b[1] = (v >> 8) & 0xff; }
static void put32(unsigned char *b, unsigned long long v) { for (int i = 0; i < 4; i++) b[i] = (v >> (8 * i)) & 0xff; }
static void put64(unsigned char *b, unsigned long long v) { for (int i = 0; i < 8; i++) b[i] = (v >> (8 * i)) & 0xff; }
static unsigned long long get(const unsigned char *b, int n) {
	unsigned long long v = 0;
	for (int i = n - 1; i >= 0; i--) v = v << 8 | b[i];
	return v;
}

int kiln_save(kiln_step *s, const char *path) {
	pthread_once(&crc_once, crc_init);
	char tmp[4200];
	if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return fail(s, "path too long");
	FILE *f = fopen(tmp, "wb");
	if (!f) return fail(s, "cannot write %s: %s", tmp, strerror(errno));
	/* Every member carries zip64 sizes and offsets (numpy reads them), so
	   that no size needs a second layout. */
	unsigned long long *offsets = calloc((size_t)NPARAMS + 1, sizeof *offsets), *sizes = calloc((size_t)NPARAMS + 1, sizeof *sizes);
	unsigned *crcs = calloc((size_t)NPARAMS + 1, sizeof *crcs);
	unsigned long long at = 0;
	int ok = offsets && sizes && crcs;
	for (int i = 0; ok && i < NPARAMS; i++) {
		const kiln_tensor_info *t = &tensors[i];
		unsigned char h[KILN_NPY_HEADER_MAX];
		int hl = kilnrt_npy_header(t, h);
		if (hl < 0) {
			ok = 0;
			break;
		}
		const void *data = s->pv[t->slot];
		unsigned crc = crc32(crc32(0, h, (size_t)hl), data, (size_t)t->bytes);
		char name[4200];
		int nl = snprintf(name, sizeof name, "%s.npy", t->name);
		if (nl < 0 || nl >= (int)sizeof name || nl > 65535) {
			ok = 0; /* a name no zip entry holds */
			break;
		}
		unsigned char lh[30], ex[20];
		put32(lh, 0x04034b50), put16(lh + 4, 45), put16(lh + 6, 0), put16(lh + 8, 0), put16(lh + 10, 0), put16(lh + 12, 0x21);
		put32(lh + 14, crc), put32(lh + 18, 0xffffffffu), put32(lh + 22, 0xffffffffu), put16(lh + 26, (unsigned)nl), put16(lh + 28, 20);
		put16(ex, 1), put16(ex + 2, 16), put64(ex + 4, (unsigned long long)(hl + t->bytes)), put64(ex + 12, (unsigned long long)(hl + t->bytes));
		offsets[i] = at, sizes[i] = (unsigned long long)(hl + t->bytes), crcs[i] = crc;
		ok = ok && fwrite(lh, 1, 30, f) == 30 && fwrite(name, 1, (size_t)nl, f) == (size_t)nl && fwrite(ex, 1, 20, f) == 20 &&
		     fwrite(h, 1, (size_t)hl, f) == (size_t)hl && fwrite(data, 1, (size_t)t->bytes, f) == (size_t)t->bytes;
		at += 30 + (unsigned long long)nl + 20 + sizes[i];
	}
	unsigned long long cd = at;
	for (int i = 0; ok && i < NPARAMS; i++) {
		char name[4200];
		int nl = snprintf(name, sizeof name, "%s.npy", tensors[i].name); /* fits: checked above */
		unsigned char ch[46], ex[28];
		memset(ch, 0, sizeof ch);
		put32(ch, 0x02014b50), put16(ch + 4, 45), put16(ch + 6, 45), put16(ch + 14, 0x21), put32(ch + 16, crcs[i]);
		put32(ch + 20, 0xffffffffu), put32(ch + 24, 0xffffffffu), put16(ch + 28, (unsigned)nl), put16(ch + 30, 28), put32(ch + 42, 0xffffffffu);
		put16(ex, 1), put16(ex + 2, 24), put64(ex + 4, sizes[i]), put64(ex + 12, sizes[i]), put64(ex + 20, offsets[i]);
		ok = ok && fwrite(ch, 1, 46, f) == 46 && fwrite(name, 1, (size_t)nl, f) == (size_t)nl && fwrite(ex, 1, 28, f) == 28;
		at += 46 + (unsigned long long)nl + 28;
	}
	unsigned char z[56], loc[20], end[22];
	memset(z, 0, sizeof z), memset(end, 0, sizeof end);
	put32(z, 0x06064b50), put64(z + 4, 44), put16(z + 12, 45), put16(z + 14, 45);
	put64(z + 24, NPARAMS), put64(z + 32, NPARAMS), put64(z + 40, at - cd), put64(z + 48, cd);
	put32(loc, 0x07064b50), put32(loc + 4, 0), put64(loc + 8, at), put32(loc + 16, 1);
	put32(end, 0x06054b50), put16(end + 8, 0xffff), put16(end + 10, 0xffff), put32(end + 12, 0xffffffffu), put32(end + 16, 0xffffffffu);
	ok = ok && fwrite(z, 1, 56, f) == 56 && fwrite(loc, 1, 20, f) == 20 && fwrite(end, 1, 22, f) == 22;
	free(offsets), free(sizes), free(crcs);
	if (fclose(f) != 0 || !ok) {
		remove(tmp);
		return fail(s, "cannot write %s: %s", tmp, strerror(errno));
	}
	if (rename(tmp, path) != 0) {
		remove(tmp);
		return fail(s, "cannot write %s: %s", path, strerror(errno));
	}
	return 0;
}

/* header_value returns the text after 'key': in the .npy header h, or
   NULL when the key is missing or appears twice. */
static const char *header_value(const char *h, const char *key) {
	const char *p = strstr(h, key);
	if (!p || strstr(p + 1, key)) return NULL;
	p = strchr(p + strlen(key), ':');
	if (!p) return NULL;
	for (p++; *p == ' '; p++) {
	}
	return p;
}

/* load_member checks the .npy image of b[0:n] against t and copies its
   data to dst. */
static int load_member(kiln_step *s, const kiln_tensor_info *t, const unsigned char *b, unsigned long long n, void *dst) {
	if (n < 10 || memcmp(b, "\x93NUMPY", 6) != 0 || (b[6] != 1 && b[6] != 2)) return fail(s, "%s.npy is not a .npy image", t->name);
	unsigned long long hl = b[6] == 1 ? get(b + 8, 2) : get(b + 8, 4), start = b[6] == 1 ? 10 : 12;
	if (start + hl > n) return fail(s, "%s.npy: truncated header", t->name);
	char h[4096];
	if (hl >= sizeof h) return fail(s, "%s.npy: header too long", t->name);
	memcpy(h, b + start, (size_t)hl);
	h[hl] = 0;
	const char *d = header_value(h, "'descr'"), *o = header_value(h, "'fortran_order'"), *sh = header_value(h, "'shape'");
	size_t dl = strlen(t->descr);
	if (!d || d[0] != '\'' || strncmp(d + 1, t->descr, dl) != 0 || d[1 + dl] != '\'') return fail(s, "%s.npy: wrong dtype (want %s)", t->name, t->descr);
	if (!o || strncmp(o, "False", 5) != 0) return fail(s, "%s.npy: Fortran order is not supported", t->name);
	if (!sh || *sh != '(') return fail(s, "%s.npy: no shape", t->name);
	sh++;
	for (int i = 0; i < t->rank; i++) {
		char *e;
		long long v = strtoll(sh, &e, 10);
		if (e == sh || v != t->shape[i]) return fail(s, "%s.npy: wrong shape", t->name);
		for (sh = e; *sh == ',' || *sh == ' '; sh++) {
		}
	}
	if (*sh != ')') return fail(s, "%s.npy: wrong shape", t->name);
	if (n - start - hl != (unsigned long long)t->bytes) return fail(s, "%s.npy: %llu data bytes, want %lld", t->name, n - start - hl, t->bytes);
	memcpy(dst, b + start + hl, (size_t)t->bytes);
	return 0;
}

/* fits reports whether n bytes from offset at lie within size bytes,
   without overflow (offsets come from the file). */
static int fits(unsigned long long at, unsigned long long n, long size) {
	return size >= 0 && at <= (unsigned long long)size && n <= (unsigned long long)size - at;
}

int kiln_load(kiln_step *s, const char *path) {
	FILE *f = fopen(path, "rb");
	if (!f) return fail(s, "cannot open %s: %s", path, strerror(errno));
	unsigned char *all = NULL;
	long size = -1;
	if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
	if (size > 0 && fseek(f, 0, SEEK_SET) == 0 && (all = malloc((size_t)size)) && fread(all, 1, (size_t)size, f) != (size_t)size) {
		free(all);
		all = NULL;
	}
	fclose(f);
	if (!all) return fail(s, "cannot read %s", path);
	int rc = 0;
	void **staged = calloc((size_t)NPARAMS + 1, sizeof *staged);
	if (!staged) {
		free(all);
		return fail(s, "out of memory");
	}
	/* The end record, then the central directory (zip64 where marked). */
	long e = -1;
	for (long i = size - 22; i >= 0 && i >= size - 65557; i--)
		if (get(all + i, 4) == 0x06054b50) { e = i; break; }
	unsigned long long count = 0, cd = 0;
	if (e < 0) rc = fail(s, "%s is not an .npz (zip) archive", path);
	else {
		count = get(all + e + 10, 2), cd = get(all + e + 16, 4);
		if (count == 0xffff || cd == 0xffffffffu) {
			unsigned long long z;
			if (e < 20 || get(all + e - 20, 4) != 0x07064b50 || !fits(z = get(all + e - 12, 8), 56, size) || get(all + z, 4) != 0x06064b50)
				rc = fail(s, "%s: bad zip64 archive", path);
			else count = get(all + z + 32, 8), cd = get(all + z + 48, 8);
		}
	}
	unsigned long long p = cd;
	for (unsigned long long k = 0; rc == 0 && k < count; k++) {
		if (!fits(p, 46, size) || get(all + p, 4) != 0x02014b50) { rc = fail(s, "%s: bad central directory", path); break; }
		unsigned method = (unsigned)get(all + p + 10, 2), nl = (unsigned)get(all + p + 28, 2), xl = (unsigned)get(all + p + 30, 2), cl = (unsigned)get(all + p + 32, 2);
		unsigned long long csize = get(all + p + 20, 4), off = get(all + p + 42, 4), usize = get(all + p + 24, 4);
		unsigned crc = (unsigned)get(all + p + 16, 4);
		if (!fits(p, 46ULL + nl + xl + cl, size)) { rc = fail(s, "%s: bad central directory", path); break; }
		const unsigned char *name = all + p + 46, *x = name + nl;
		for (unsigned i = 0; i + 4 <= xl;) { /* zip64 extra: the fields that overflowed, in order */
			unsigned id = (unsigned)get(x + i, 2), len = (unsigned)get(x + i + 2, 2), j = i + 4;
			if (i + 4 + len > xl) break;
			if (id == 1) {
				if (usize == 0xffffffffu && j + 8 <= i + 4 + len) usize = get(x + j, 8), j += 8;
				if (csize == 0xffffffffu && j + 8 <= i + 4 + len) csize = get(x + j, 8), j += 8;
				if (off == 0xffffffffu && j + 8 <= i + 4 + len) off = get(x + j, 8);
			}
			i += 4 + len;
		}
		p += 46 + nl + xl + cl;
		if (nl < 5 || memcmp(name + nl - 4, ".npy", 4) != 0) continue;
		int ti = -1;
		for (int i = 0; i < NPARAMS; i++)
			if (strlen(tensors[i].name) == nl - 4 && memcmp(tensors[i].name, name, nl - 4) == 0) ti = i;
		if (ti < 0) continue; /* not this step's */
		if (method != 0 || csize != usize) { rc = fail(s, "%s: member %s.npy is compressed (write it with numpy.savez)", path, tensors[ti].name); break; }
		if (!fits(off, 30, size) || get(all + off, 4) != 0x04034b50) { rc = fail(s, "%s: bad local header of %s.npy", path, tensors[ti].name); break; }
		unsigned long long data = off + 30 + get(all + off + 26, 2) + get(all + off + 28, 2);
		if (!fits(data, csize, size)) { rc = fail(s, "%s: %s.npy is truncated", path, tensors[ti].name); break; }
		pthread_once(&crc_once, crc_init);
		if (crc32(0, all + data, (size_t)csize) != crc) { rc = fail(s, "%s: %s.npy fails its CRC check", path, tensors[ti].name); break; }
		free(staged[ti]); /* numpy keeps the last of two members with one name */
		staged[ti] = malloc((size_t)(tensors[ti].bytes ? tensors[ti].bytes : 1));
		if (!staged[ti]) { rc = fail(s, "out of memory"); break; }
		rc = load_member(s, &tensors[ti], all + data, csize, staged[ti]);
	}
	for (int i = 0; rc == 0 && i < NPARAMS; i++)
		if (!staged[i]) rc = fail(s, "%s has no member %s.npy", path, tensors[i].name);
	for (int i = 0; i < NPARAMS; i++) {
		if (rc == 0) memcpy(s->pv[tensors[i].slot], staged[i], (size_t)tensors[i].bytes);
		free(staged[i]);
	}
	free(staged);
	free(all);
	return rc;
}
